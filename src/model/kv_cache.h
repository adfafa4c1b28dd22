// KvCache: one sequence's keys and values, contiguous per layer, in the
// backend's memory (f32). The server batches many of them (one per running
// sequence) and keeps finished ones in the prefix cache (src/kv/); a paged
// block pool shared by sequences is still to come (issue 7).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend_array.h"

namespace kettle {

class KvCache {
 public:
  KvCache(Backend& backend, int64_t n_layers, int64_t kv_size)
      : backend_(&backend), kv_size_(kv_size), k_(static_cast<size_t>(n_layers)), v_(static_cast<size_t>(n_layers)) {}

  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  int64_t kv_size() const { return kv_size_; }
  int64_t n_layers() const { return static_cast<int64_t>(k_.size()); }
  // Bytes one position takes across every layer (f32 keys and values).
  static size_t bytes_per_position(int64_t n_layers, int64_t kv_size) {
    return static_cast<size_t>(n_layers) * static_cast<size_t>(kv_size) * sizeof(float) * 2;
  }
  void set_length(int64_t length) { length_ = length; }

  // Makes room for `tokens` positions, keeping what is there. Buffers move only when
  // the capacity grows (it doubles), so a recorded decode step stays valid between.
  void reserve(int64_t tokens);

  float* keys(int64_t layer) { return k_[static_cast<size_t>(layer)].data(); }    // [capacity, kv_size]
  float* values(int64_t layer) { return v_[static_cast<size_t>(layer)].data(); }  // [capacity, kv_size]

 private:
  Backend* backend_;
  int64_t kv_size_;
  int64_t length_ = 0;
  int64_t capacity_ = 0;
  std::vector<BackendArray<float>> k_, v_;
};

}  // namespace kettle
