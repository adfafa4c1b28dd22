// KvCache: one sequence's keys and values, contiguous per layer. (The paged,
// shared block pool of src/kv/ replaces it for serving many sequences.)
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/host_buffer.h"

namespace kettle {

class KvCache {
 public:
  KvCache(int64_t n_layers, int64_t kv_size) : kv_size_(kv_size), k_(static_cast<size_t>(n_layers)), v_(static_cast<size_t>(n_layers)) {}

  int64_t length() const { return length_; }
  int64_t kv_size() const { return kv_size_; }
  void set_length(int64_t length) { length_ = length; }

  // Makes room for `tokens` positions, keeping what is there.
  void reserve(int64_t tokens);

  float* keys(int64_t layer) { return k_[static_cast<size_t>(layer)].data(); }    // [capacity, kv_size]
  float* values(int64_t layer) { return v_[static_cast<size_t>(layer)].data(); }  // [capacity, kv_size]

 private:
  int64_t kv_size_;
  int64_t length_ = 0;
  int64_t capacity_ = 0;
  std::vector<HostBuffer<float>> k_, v_;
};

}  // namespace kettle
