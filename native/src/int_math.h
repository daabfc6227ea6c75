// Integer arithmetic both backends share (host_device.h's DSA_HD).
#pragma once

#include <cstdint>

#include "host_device.h"

namespace dsa {

// a / m and a % m for m >= 1, by a shift and a mask where m is a power of two (an engine's page and ring sizes
// are): a 32-bit division is a chain of some twenty instructions on a GPU, on the critical path of a plan or of
// a request-scoped ring row.
DSA_HD uint32_t log2_u32(uint32_t m) {
#if defined(__CUDA_ARCH__)
  return (uint32_t)(__ffs((int)m) - 1);
#else
  return (uint32_t)__builtin_ctz(m);
#endif
}
DSA_HD uint32_t quot_u32(uint32_t a, uint32_t m) { return (m & (m - 1)) == 0 ? a >> log2_u32(m) : a / m; }
DSA_HD uint32_t rem_u32(uint32_t a, uint32_t m) { return (m & (m - 1)) == 0 ? a & (m - 1) : a % m; }

}  // namespace dsa
