// KvCache growth: capacity doubles, old rows are copied once.
#include "model/kv_cache.h"

#include <algorithm>

namespace kettle {

void KvCache::reserve(int64_t tokens) {
  if (tokens <= capacity_) return;
  int64_t capacity = std::max<int64_t>({tokens, capacity_ * 2, 256});
  for (auto* buffers : {&k_, &v_}) {
    for (auto& buffer : *buffers) {
      BackendArray<float> grown(*backend_, static_cast<size_t>(capacity * kv_size_));
      if (length_ > 0) backend_->copy(grown.data(), buffer.data(), static_cast<size_t>(length_ * kv_size_) * sizeof(float));
      buffer = std::move(grown);
    }
  }
  capacity_ = capacity;
}

}  // namespace kettle
