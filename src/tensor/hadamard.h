// The Walsh–Hadamard transform of a power-of-two run, in place and unnormalised
// (v ← H v, H Sylvester's ±1 matrix: H[i][j] = (−1)^popcount(i & j)), for host and
// device alike: the KV cache's value rotation (tensor/kv_codec.h, float) and the
// weight rotation of `convert --rotate-weights` (model/rotate_weights.cpp, double).
#pragma once

#include "util/host_device.h"

namespace kettle {

template <typename T>
KETTLE_HD void walsh_hadamard(T* v, int n) {
  for (int len = 1; len < n; len <<= 1)
    for (int i = 0; i < n; i += 2 * len)
      for (int j = i; j < i + len; ++j) {
        const T a = v[j], b = v[j + len];
        v[j] = a + b;
        v[j + len] = a - b;
      }
}

}  // namespace kettle
