// CudaBackend's device memory: allocation (freed blocks reused first in, first
// out), pinned staging for small copies, resident weights (bf16 matrices, f32
// vectors), the copy-bandwidth probe, grow-only workspaces.
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"

namespace kettle {

// Freed blocks are kept per size and handed out again first in, first out: a KV
// cache freed and made again gets the same addresses in the same order, so its
// recorded decode step matches again.
void* CudaBackend::allocate(size_t bytes) {
  bytes = round_up(bytes);
  auto& list = free_[bytes];
  if (!list.empty()) {
    void* p = list.front();
    list.pop_front();
    return p;
  }
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

// Large buffers (a KV pool that grew) go back to the driver at once: their size does
// not come again, and holding them would double the pool's footprint.
void CudaBackend::release(void* data, size_t bytes) {
  if (data == nullptr) return;
  if (bytes >= kReturnedBytes) {
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    check(cudaFree(data), "cudaFree");
    return;
  }
  free_[round_up(bytes)].push_back(data);
}

size_t CudaBackend::free_memory() {
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

size_t CudaBackend::total_memory() {
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return total;
}

// Small copies (a step's token ids and positions, its logits or next id) go through
// pinned memory, so they are true async DMAs rather than staged pageable copies.
void CudaBackend::to_device(void* dst, const void* src, size_t bytes) {
  if (bytes <= kPinnedBytes / 4) {
    if (pinned_used_ + bytes > kPinnedBytes) {
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // earlier copies have left
      pinned_used_ = 0;
    }
    char* slot = pinned_ + pinned_used_;
    std::memcpy(slot, src, bytes);
    pinned_used_ += round_up(bytes);
    check(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (to device)");
    return;
  }
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (to device)");
}

void CudaBackend::to_host(void* dst, const void* src, size_t bytes) {
  if (bytes <= kPinnedBytes) {
    check(cudaMemcpyAsync(pinned_out_, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (to host)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    std::memcpy(dst, pinned_out_, bytes);
  } else {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (to host)");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  pinned_used_ = 0;  // the stream is idle: every staged upload has landed
  timer_.restart();
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync (device)");
}

Tensor CudaBackend::resident(const Tensor& weight) {
  if (weight.empty()) return weight;
  const ResidentKey key{weight.data, weight.dtype, weight.numel(), fingerprint(weight)};
  auto it = resident_.find(key);
  if (it != resident_.end()) {
    Tensor view = it->second;
    view.shape = weight.shape;
    return view;
  }
  if (!dtype_is_float(weight.dtype))
    fail(ErrorCategory::kUnsupported, "cuda: a weight of packed {} codes (shape {}) has no CUDA kernel; the model "
         "runner dequantizes quantized projections for this backend", dtype_name(weight.dtype), shape_string(weight.shape));
  // Matrices in bf16 (the GEMV/GEMM operand); vectors (norms, biases) in f32.
  const bool matrix = weight.rank() >= 2;
  const DType dtype = matrix ? DType::kBF16 : DType::kF32;
  const size_t count = static_cast<size_t>(weight.numel());
  void* device = nullptr;
  check(cudaMalloc(&device, count * dtype_size(dtype)), "cudaMalloc (weights)");
  if (weight.dtype == dtype) {
    check(cudaMemcpy(device, weight.data, count * dtype_size(dtype), cudaMemcpyHostToDevice), "cudaMemcpy (weights)");
  } else {
    std::vector<uint16_t> bits;
    std::vector<float> values(count);
    for (size_t i = 0; i < count; ++i) values[i] = element(weight, i);
    if (matrix) {
      bits.resize(count);
      for (size_t i = 0; i < count; ++i) bits[i] = f32_to_bf16(values[i]);
      check(cudaMemcpy(device, bits.data(), count * 2, cudaMemcpyHostToDevice), "cudaMemcpy (weights)");
    } else {
      check(cudaMemcpy(device, values.data(), count * 4, cudaMemcpyHostToDevice), "cudaMemcpy (weights)");
    }
  }
  Tensor copy{device, dtype, weight.shape};
  resident_.emplace(key, copy);
  return copy;
}

double CudaBackend::measure_copy_bandwidth() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc (copy test)");
  check(cudaMalloc(&b, bytes), "cudaMalloc (copy test)");
  check(cudaMemsetAsync(a, 1, bytes, stream_), "cudaMemset");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) copy(b, a, bytes);  // warm-up
  const int reps = 20;
  cudaEventRecord(start, stream_);
  for (int i = 0; i < reps; ++i) copy(i % 2 ? a : b, i % 2 ? b : a, bytes);
  cudaEventRecord(stop, stream_);
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) * reps / (ms / 1e3);  // read + write
}

// FNV-1a over up to 256 bytes at each end of the tensor.
uint64_t CudaBackend::fingerprint(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  const size_t bytes = t.nbytes(), edge = std::min<size_t>(bytes, 256);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < edge; ++i) h = (h ^ p[i]) * 1099511628211ull;
  for (size_t i = bytes - edge; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

float CudaBackend::element(const Tensor& t, size_t i) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  switch (t.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p + i * 4, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t b;
      std::memcpy(&b, p + i * 2, 2);
      return f16_to_f32(b);
    }
    case DType::kBF16: {
      uint16_t b;
      std::memcpy(&b, p + i * 2, 2);
      return bf16_to_f32(b);
    }
    case DType::kU32:  // resident() refuses packed codes and FP8 before reading an element
    case DType::kF8E4M3:
      break;
  }
  return 0.0f;
}

// A workspace at least `bytes` long. Growing it frees the old one, which recorded
// steps may point at, so they are dropped (never while recording: the first, eager
// run of every step sizes its workspaces).
void* CudaBackend::grow(Workspace& w, size_t bytes) {
  if (bytes <= w.bytes) return w.data;
  if (capturing_) fail(ErrorCategory::kInternal, "cuda: a workspace grew while recording a step");
  check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  drop_graphs();
  cudaFree(w.data);
  w.bytes = round_up(std::max(bytes, w.bytes * 2));
  check(cudaMalloc(&w.data, w.bytes), "cudaMalloc (workspace)");
  return w.data;
}

}  // namespace kettle
