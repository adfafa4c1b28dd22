// An owning, 64-byte aligned host array (activations, scratch, synthetic weights).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace kettle {

template <typename T>
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t count) { resize(count); }

  void resize(size_t count) {
    if (count == count_) return;
    data_.reset();
    count_ = count;
    if (count == 0) return;
    size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) throw std::bad_alloc();
    data_.reset(static_cast<T*>(p));
  }

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return count_; }
  T& operator[](size_t i) { return data_.get()[i]; }
  const T& operator[](size_t i) const { return data_.get()[i]; }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t count_ = 0;
};

}  // namespace kettle
