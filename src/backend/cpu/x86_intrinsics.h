// <immintrin.h> for the per-ISA kernels. GCC 12 flags the _mm512_undefined_*
// pass-through inside its own intrinsic headers as uninitialised (GCC bug
// 105593); the warning is silenced for the header only.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
