// Per-channel online-softmax arithmetic of the c128 compression (docs/spec.md, the per-token update), shared verbatim by
// the CUDA kernels and the host backend so both compute the same function.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

#include "dsa_kernels.h"

#if defined(__CUDACC__)
#define DSA_HD __host__ __device__ __forceinline__
#else
#define DSA_HD inline
#endif

namespace dsa {

// Scores are carried in base 2 (score * log2(e)) so every exponential is one exp2_, a single
// hardware instruction on the GPU; exp2(a*log2e - b*log2e) == exp(a - b) up to rounding.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

DSA_HD float to_log2(float biased_score) { return biased_score * kLog2e; }

// 2^x. On the GPU one MUFU.EX2 that flushes subnormal results to zero (weights below 2^-126 of
// the largest are dropped; the host keeps them, a difference far below fp32 rounding of the sums).
DSA_HD float exp2_(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// A partial softmax over some tokens of one channel, in unnormalized form:
// max = largest biased score (base 2), sum = sum exp2(score - max), acc = sum kv * exp2(score - max).
struct Partial {
  float max;
  float sum;
  float acc;
};

DSA_HD Partial partial_of(float score, float kv) { return Partial{score, 1.0f, kv}; }

DSA_HD Partial empty_partial() { return Partial{-INFINITY, 0.0f, 0.0f}; }

// Folds `count` tokens (count >= 1) whose scores share one local max into `p`; one rescale of p.
template <int N>
DSA_HD Partial absorb(Partial p, const float (&score)[N], const float (&kv)[N], int count) {
  float m = score[0];
#pragma unroll
  for (int i = 1; i < N; ++i)
    if (i < count) m = fmaxf(m, score[i]);
  const float M = fmaxf(p.max, m);
  const float scale = exp2_(p.max - M);
  float sum = p.sum * scale, acc = p.acc * scale;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i < count) {
      const float e = exp2_(score[i] - M);
      sum += e;
      acc = fmaf(kv[i], e, acc);
    }
  }
  return Partial{M, sum, acc};
}

// One token folded into `p` with a single exponential: whichever of the two maxima is smaller is
// scaled by 2^-|difference|. Same value as absorb(p, {score}, {kv}, 1) up to rounding. Written with
// selects, not branches: the side that is scaled differs from channel to channel, and branches on it
// diverged within every warp (docs/performance.md, "Decode"). The new score above the old maximum:
// (score, s e + 1, acc e + kv); else (max, s + e, kv e + acc), each rounded once.
DSA_HD Partial absorb_one(Partial p, float score, float kv) {
  const float d = score - p.max, e = exp2_(-fabsf(d));
  const bool up = d > 0.0f;
  return Partial{up ? score : p.max, fmaf(p.sum, up ? e : 1.0f, up ? 1.0f : e), fmaf(up ? p.acc : kv, e, up ? kv : p.acc)};
}

// An empty partial (no tokens yet) has sum 0 and max -inf; merging with it returns the other side.
DSA_HD Partial merge(Partial a, Partial b) {
  if (b.sum == 0.0f) return a;
  if (a.sum == 0.0f) return b;
  const float M = fmaxf(a.max, b.max);
  const float ea = exp2_(a.max - M), eb = exp2_(b.max - M);
  return Partial{M, a.sum * ea + b.sum * eb, a.acc * ea + b.acc * eb};
}

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

// A slot's stored state (m in natural units, s, k the normalized mean) as a Partial, and back.
DSA_HD Partial from_state(float m, float s, float k) { return Partial{to_log2(m), s, k * s}; }

DSA_HD float state_max(Partial p) { return p.max * kLn2; }

// One token (biased score t in base 2, value kv) at in-chunk position c into a stored state
// (m, s, k): the decode's arithmetic (docs/spec.md, the per-token update), which a verify repeats draft by draft so that a
// request's state never depends on whether its tokens were verified or decoded. c == 0 starts
// fresh and ignores the state.
DSA_HD Partial token_into_state(float m, float s, float k, float t, float kv, int c) {
  return c == 0 ? partial_of(t, kv) : absorb_one(from_state(m, s, k), t, kv);
}

// On the GPU a fast division, acc times the approximate reciprocal (2 ulp): the same bits as
// __fdividef for every divisor from 2^-126 up, in two instructions instead of its six (no rescue of
// subnormal divisors: every sum this library produces is >= 1).
DSA_HD float mean_of(Partial p) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(p.sum));
  return p.acc * r;
#else
  return p.acc / p.sum;
#endif
}
// Speculative decoding (docs/spec.md, speculative decoding): the slot that holds a request's state once `accepted` of its
// `drafts` drafts (clamped to 0..drafts) are accepted after `seq` committed tokens: bank entry a,
// or `load` (the verify's source, any slot) when seq + a is a chunk end and the next token starts
// fresh. A negative bank base stays negative (the state is not held on this GPU).
DSA_HD int64_t accepted_slot(int32_t seq, int32_t accepted, int32_t drafts, int32_t load, int32_t bank,
                             int64_t stride) {
  const int32_t a = accepted < 0 ? 0 : accepted > drafts ? drafts : accepted;
  if (((int64_t)seq + a) % DSA_CHUNK == 0) return load;
  return bank < 0 ? -1 : bank + a * stride;
}

// A plan record is usable when it lies inside the input and inside one chunk, and its chunk
// position matches the list it came from. Sentinels are recognised separately.
DSA_HD bool is_sentinel(const dsa_segment& s) {
  return s.ragged_id == DSA_SEGMENT_SENTINEL && s.batch_id == DSA_SEGMENT_SENTINEL &&
         s.position == DSA_SEGMENT_SENTINEL && s.window_len == DSA_SEGMENT_SENTINEL;
}

DSA_HD bool segment_ok(const dsa_segment& s, bool closes_chunk, int64_t num_tokens,
                       int64_t batch_size) {
  const uint32_t in_chunk = s.position % DSA_CHUNK;
  return s.window_len >= 1 && s.window_len <= in_chunk + 1 && (int64_t)s.ragged_id < num_tokens &&
         s.ragged_id + 1 >= s.window_len && (int64_t)s.batch_id < batch_size &&
         (closes_chunk ? in_chunk == DSA_CHUNK - 1 : in_chunk < DSA_CHUNK - 1);
}

// A record that starts mid-chunk: it merges the state of its chunk's earlier tokens (read from the
// request's load slot). For usable records, the same as first_in_chunk != 0 in the kernels.
DSA_HD bool segment_continues(const dsa_segment& s) { return s.position % DSA_CHUNK + 1 != s.window_len; }

DSA_HD bool slot_ok(int32_t slot, int64_t num_slots) { return slot >= 0 && slot < num_slots; }
// The same for a slot count already checked to be 1..INT32_MAX (the decode kernel's): one unsigned compare.
DSA_HD bool slot_ok(int32_t slot, uint32_t slot_count) { return (uint32_t)slot < slot_count; }

}  // namespace dsa
