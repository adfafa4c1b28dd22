// BackendArray<T>: an owning array in a backend's memory (host memory on the
// CPU, device memory on the GPU): the forward's scratch and the KV cache.
#pragma once

#include <cstddef>
#include <utility>

#include "backend/backend.h"

namespace kettle {

template <typename T>
class BackendArray {
 public:
  BackendArray() = default;
  BackendArray(Backend& backend, size_t count) : backend_(&backend), count_(count) {
    if (count > 0) data_ = static_cast<T*>(backend.allocate(count * sizeof(T)));
  }
  BackendArray(BackendArray&& other) noexcept { *this = std::move(other); }
  BackendArray& operator=(BackendArray&& other) noexcept {
    if (this != &other) {
      reset();
      backend_ = std::exchange(other.backend_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  BackendArray(const BackendArray&) = delete;
  BackendArray& operator=(const BackendArray&) = delete;
  ~BackendArray() { reset(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  void reset() {
    if (data_ != nullptr) backend_->release(data_, count_ * sizeof(T));
    data_ = nullptr;
    count_ = 0;
  }

  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace kettle
