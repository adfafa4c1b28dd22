// Host memory available now (free RAM, without what is already mapped).
#pragma once

#include <cstddef>

namespace kettle {

size_t available_memory_bytes();

}  // namespace kettle
