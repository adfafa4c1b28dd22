// make_backend: the one place a device name becomes a Backend. The CUDA
// backend exists only in builds made where nvcc was found (KETTLE_HAVE_CUDA).
#include "backend/backend.h"

#include <charconv>

#include "util/error.h"

#ifdef KETTLE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace kettle {

bool cuda_available() {
#ifdef KETTLE_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

Linear Backend::resident_linear(const Linear& linear) {
  const auto own = [&](const Tensor& t) { return t.empty() ? t : resident(t); };
  Linear r = linear;
  r.weight = own(linear.weight);
  r.bias = own(linear.bias);
  r.affine.scales = own(linear.affine.scales);
  r.affine.biases = own(linear.affine.biases);
  return r;
}

namespace {

// "cuda:N" → N; "cuda" → the options' ordinal.
int cuda_ordinal(const std::string& device, int otherwise) {
  if (device == "cuda") return otherwise;
  int n = -1;
  const char* first = device.data() + 5;
  const auto [end, error] = std::from_chars(first, device.data() + device.size(), n);
  if (error != std::errc() || end != device.data() + device.size() || n < 0)
    fail(ErrorCategory::kInvalidArgument, "unknown device '{}': expected cpu, cuda, cuda:N or auto", device);
  return n;
}

}  // namespace

Fp8Compute parse_fp8_compute(const std::string& name) {
  if (name == "auto") return Fp8Compute::kAuto;
  if (name == "fp8") return Fp8Compute::kFp8;
  if (name == "bf16") return Fp8Compute::kBf16;
  fail(ErrorCategory::kInvalidArgument, "--fp8-compute '{}': expected auto, fp8 or bf16", name);
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  const std::string& device = options.device;
  if (device.empty() || device == "auto") {
    BackendOptions chosen = options;
    chosen.device = cuda_available() ? "cuda" : "cpu";
    return make_backend(chosen);
  }
  if (device == "cpu") {
    if (options.fp8 == Fp8Compute::kFp8)
      fail(ErrorCategory::kInvalidArgument, "--fp8-compute fp8: the CPU has no FP8 kernels (auto or bf16 widen FP8 "
           "weights to bf16 there)");
    return make_cpu_backend(options.threads);
  }
  if (device == "cuda" || device.starts_with("cuda:")) {
    const int ordinal = cuda_ordinal(device, options.device_ordinal);
#ifdef KETTLE_HAVE_CUDA
    const int count = cuda_device_count();
    if (count == 0) fail(ErrorCategory::kInvalidArgument, "--device {}: no CUDA device is present", device);
    if (ordinal >= count)
      fail(ErrorCategory::kInvalidArgument, "--device {}: this machine has {} CUDA device(s)", device, count);
    return make_cuda_backend(ordinal, options.batch_invariant, options.fp8);
#else
    (void)ordinal;
    fail(ErrorCategory::kInvalidArgument, "--device {}: this kettle was built without CUDA (no nvcc at build time)",
         device);
#endif
  }
  fail(ErrorCategory::kInvalidArgument, "unknown device '{}': expected cpu, cuda, cuda:N or auto", device);
}

std::unique_ptr<Backend> make_backend(const std::string& device, int n_threads) {
  BackendOptions options;
  options.device = device;
  options.threads = n_threads;
  return make_backend(options);
}

std::vector<Backend*> backend_pointers(const std::vector<std::unique_ptr<Backend>>& backends) {
  std::vector<Backend*> out;
  for (const auto& b : backends) out.push_back(b.get());
  return out;
}

}  // namespace kettle
