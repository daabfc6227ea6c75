// The bf16 element (a state or ring element, a quantized value before its fp8 code) as raw bits, and its
// widening and rounding, shared verbatim by the CUDA kernels and the host backend so both round alike.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

#include "host_device.h"

namespace dsa {

// bf16 state elements (docs/spec.md, the state, output layouts), as raw bits so the GPU and the host backend round with the
// same integer arithmetic: widening is exact, narrowing rounds to nearest even (NaN stays NaN).
struct Bf16 {
  uint16_t bits;
};

DSA_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

DSA_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

DSA_HD float widen(float x) { return x; }
DSA_HD float widen(Bf16 x) { return bits_float((uint32_t)x.bits << 16); }

DSA_HD void narrow(float x, float* to) { *to = x; }
// On the GPU one cvt.rn.bf16.f32 (docs/performance.md, "Decode"); the host rounds the same way,
// NaN included (the canonical 0x7FFF).
DSA_HD void narrow(float x, Bf16* to) {
#if defined(__CUDA_ARCH__)
  to->bits = __bfloat16_as_ushort(__float2bfloat16_rn(x));
#else
  uint32_t u = float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    to->bits = 0x7FFFu;
    return;
  }
  u += 0x7FFFu + ((u >> 16) & 1u);
  to->bits = (uint16_t)(u >> 16);
#endif
}

// A value as a state slot of element type S holds it: bf16 rounds to nearest even, float is exact.
template <typename S>
DSA_HD float as_stored(float x) {
  S y;
  narrow(x, &y);
  return widen(y);
}

}  // namespace dsa
