// Device helpers every op family's kernels use: vector loads and stores of channels and of state or ring
// elements (float or bf16), the error counter; and, on the host, a policy shape as a launch's grid and block and
// the refusal of a shape too large for one launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "bf16.h"
#include "common.h"
#include "cuda_launch.cuh"
#include "launch_policy.h"

namespace dsa {

// VEC consecutive channels per thread as floats.
template <int VEC>
struct Lanes {
  float v[VEC];
};
// kv_score and ape are never written by the op: read-only path.
template <int VEC>
__device__ __forceinline__ Lanes<VEC> load_lanes(const float* p) {
  Lanes<VEC> r;
  if constexpr (VEC == 8) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(p)), y = __ldg(reinterpret_cast<const float4*>(p) + 1);
    r.v[0] = x.x, r.v[1] = x.y, r.v[2] = x.z, r.v[3] = x.w, r.v[4] = y.x, r.v[5] = y.y, r.v[6] = y.z, r.v[7] = y.w;
  } else if constexpr (VEC == 4) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(p));
    r.v[0] = x.x, r.v[1] = x.y, r.v[2] = x.z, r.v[3] = x.w;
  } else if constexpr (VEC == 2) {
    const float2 x = __ldg(reinterpret_cast<const float2*>(p));
    r.v[0] = x.x, r.v[1] = x.y;
  } else {
    r.v[0] = __ldg(p);
  }
  return r;
}
// VEC state elements (float or Bf16) moved as one access.
template <typename S, int VEC>
struct alignas(sizeof(S) * VEC) Pack {
  S e[VEC];
};
// VEC state elements as loaded: whole 32-bit words, so holding them costs no instruction (a Pack of bf16 pairs
// would be split into halves where it is assigned).
template <int VEC, typename S>
struct Words {
  static constexpr int kWords = (int)sizeof(Pack<S, VEC>) / 4;
  static_assert(kWords >= 1 && kWords <= 4, "one vector access of 4 to 16 bytes");
  uint32_t w[kWords];
};
// State may be written by this launch (another segment's slot), so its loads (load_words, load_state) bypass the
// read-only path.
template <int VEC, typename S>
__device__ __forceinline__ Words<VEC, S> load_words(const S* p) {
  Words<VEC, S> r;
  constexpr int n = Words<VEC, S>::kWords;
  if constexpr (n == 4) {
    const uint4 x = *reinterpret_cast<const uint4*>(p);
    r.w[0] = x.x, r.w[1] = x.y, r.w[2] = x.z, r.w[3] = x.w;
  } else if constexpr (n == 2) {
    const uint2 x = *reinterpret_cast<const uint2*>(p);
    r.w[0] = x.x, r.w[1] = x.y;
  } else {
    r.w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
  return r;
}
template <int VEC, typename S>
__device__ __forceinline__ Lanes<VEC> widen_words(const Words<VEC, S>& x) {
  Pack<S, VEC> e;
  static_assert(sizeof(e) == sizeof(x.w), "the words are the pack");
  memcpy(&e, x.w, sizeof(e));
  Lanes<VEC> r;
#pragma unroll
  for (int i = 0; i < VEC; ++i) r.v[i] = widen(e.e[i]);
  return r;
}
template <int VEC, typename S>
__device__ __forceinline__ Lanes<VEC> load_state(const S* p) {
  const Pack<S, VEC> x = *reinterpret_cast<const Pack<S, VEC>*>(p);
  Lanes<VEC> r;
#pragma unroll
  for (int i = 0; i < VEC; ++i) r.v[i] = widen(x.e[i]);
  return r;
}
// VEC (2 or 4) channels of a row from a bf16 ring (`from_state`: 2 VEC bytes) or from the op's fp32 input (4 VEC
// bytes, read-only path), chosen without a branch: both loads are predicated into the same words and the channels
// picked from them. (A branch between the two widths, one each window row, made ptxas issue each row's loads only
// after the previous row's had landed: a memory trip a row.) Volatile, with memory: kept after the kernel's
// grid-dependency wait by the compiler, not only by its operands' dependence on what was read after it (sm_90 SASS
// the same either way).
template <int VEC>
__device__ __forceinline__ Lanes<VEC> load_state_or_lanes(bool from_state, const Bf16* state, const float* input) {
  static_assert(VEC == 2 || VEC == 4, "8 or 16 bytes of input");
  uint32_t w[VEC];
#if defined(__CUDA_ARCH__)
  if constexpr (VEC == 4) {
    asm volatile("{\n\t.reg .pred s;\n\tsetp.ne.u32 s, %4, 0;\n\t"
        "@s ld.global.v2.u32 {%0, %1}, [%5];\n\t"
        "@!s ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%6];\n\t}"
        : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
        : "r"((uint32_t)from_state), "l"(state), "l"(input)
        : "memory");
  } else {
    asm volatile("{\n\t.reg .pred s;\n\tsetp.ne.u32 s, %2, 0;\n\t"
        "@s ld.global.u32 %0, [%3];\n\t"
        "@!s ld.global.nc.v2.u32 {%0, %1}, [%4];\n\t}"
        : "=r"(w[0]), "=r"(w[1])
        : "r"((uint32_t)from_state), "l"(state), "l"(input)
        : "memory");
  }
#else
  for (int i = 0; i < VEC; ++i) w[i] = 0u;  // device code only
#endif
  Lanes<VEC> r;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const uint32_t bf16 = (i & 1) ? (w[i / 2] & 0xFFFF0000u) : (w[i / 2] << 16);
    r.v[i] = bits_float(from_state ? bf16 : w[i]);
  }
  return r;
}
template <int VEC, typename S>
__device__ __forceinline__ void store_state(S* p, const Lanes<VEC>& r) {
  Pack<S, VEC> x;
#pragma unroll
  for (int i = 0; i < VEC; ++i) narrow(r.v[i], &x.e[i]);
  *reinterpret_cast<Pack<S, VEC>*>(p) = x;
}
template <int VEC>
__device__ __forceinline__ void store_lanes(float* p, const Lanes<VEC>& r) {
  if constexpr (VEC == 8) {
    store_state<4, float>(p, reinterpret_cast<const Lanes<4>&>(r.v[0]));
    store_state<4, float>(p + 4, reinterpret_cast<const Lanes<4>&>(r.v[4]));
  } else {
    store_state<VEC, float>(p, r);
  }
}

__device__ __forceinline__ void count_error(uint32_t* error_count) {
  if (error_count != nullptr) atomicAdd(error_count, 1u);
}

// A policy shape (launch_policy.h) as the launch's grid and block.
inline dim3 grid_of(const Shape& s) { return dim3((unsigned)s.grid_x, (unsigned)s.grid_y, (unsigned)s.grid_z); }
inline dim3 block_of(const Shape& s) { return dim3((unsigned)s.block_x, (unsigned)s.block_y); }

// A shape too large for one launch (request_grid's fits false), refused naming the sizes.
inline dsa_status too_large(const char* op) {
  return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size or head_dim too large for one launch", op);
}

}  // namespace dsa
