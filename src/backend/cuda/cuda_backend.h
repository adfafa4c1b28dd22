// The CUDA backend's entry points (only in builds with KETTLE_HAVE_CUDA).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace kettle {

int cuda_device_count();  // 0 when no driver or no device
// The backend on device `ordinal`; batch_invariant and fp8: BackendOptions'.
std::unique_ptr<Backend> make_cuda_backend(int ordinal, bool batch_invariant, Fp8Compute fp8);

}  // namespace kettle
