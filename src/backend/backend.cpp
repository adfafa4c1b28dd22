// make_backend: the one place a device name becomes a Backend. The CUDA
// backend exists only in builds made where nvcc was found (KETTLE_HAVE_CUDA).
#include "backend/backend.h"

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

std::unique_ptr<Backend> make_backend(const std::string& device, int n_threads) {
  if (device.empty() || device == "auto") return make_backend(cuda_available() ? "cuda" : "cpu", n_threads);
  if (device == "cpu") return make_cpu_backend(n_threads);
  if (device == "cuda") {
#ifdef KETTLE_HAVE_CUDA
    if (cuda_device_count() == 0) fail(ErrorCategory::kInvalidArgument, "--device cuda: no CUDA device is present");
    return make_cuda_backend();
#else
    fail(ErrorCategory::kInvalidArgument, "--device cuda: this kettle was built without CUDA (no nvcc at build time)");
#endif
  }
  fail(ErrorCategory::kInvalidArgument, "unknown device '{}': expected cpu, cuda or auto", device);
}

std::vector<Backend*> backend_pointers(const std::vector<std::unique_ptr<Backend>>& backends) {
  std::vector<Backend*> out;
  for (const auto& b : backends) out.push_back(b.get());
  return out;
}

}  // namespace kettle
