#include "util/system_memory.h"

#include <unistd.h>

namespace kettle {

size_t available_memory_bytes() {
  return static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace kettle
