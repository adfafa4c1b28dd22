// The CUDA backend's entry points (only in builds with KETTLE_HAVE_CUDA).
#pragma once

#include <memory>

#include "backend/backend.h"

namespace kettle {

int cuda_device_count();  // 0 when no driver or no device
std::unique_ptr<Backend> make_cuda_backend();

}  // namespace kettle
