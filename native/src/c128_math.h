// Per-channel online-softmax arithmetic of the c128 compression (SPEC 1.1), shared verbatim by
// the CUDA kernels and the host backend so both compute the same function.
#pragma once

#include <cmath>
#include <cstdint>

#include "dsa_kernels.h"

#if defined(__CUDACC__)
#define DSA_HD __host__ __device__ __forceinline__
#else
#define DSA_HD inline
#endif

namespace dsa {

// Scores are carried in base 2 (score * log2(e)) so every exponential is one exp2f, a single
// hardware instruction on the GPU; exp2(a*log2e - b*log2e) == exp(a - b) up to rounding.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

DSA_HD float to_log2(float biased_score) { return biased_score * kLog2e; }

// A partial softmax over some tokens of one channel, in unnormalized form:
// max = largest biased score (base 2), sum = sum exp2(score - max), acc = sum kv * exp2(score - max).
struct Partial {
  float max;
  float sum;
  float acc;
};

DSA_HD Partial partial_of(float score, float kv) { return Partial{score, 1.0f, kv}; }

// Folds `count` tokens (count >= 1) whose scores share one local max into `p`; one rescale of p.
template <int N>
DSA_HD Partial absorb(Partial p, const float (&score)[N], const float (&kv)[N], int count) {
  float m = score[0];
#pragma unroll
  for (int i = 1; i < N; ++i)
    if (i < count) m = fmaxf(m, score[i]);
  const float M = fmaxf(p.max, m);
  const float scale = exp2f(p.max - M);
  float sum = p.sum * scale, acc = p.acc * scale;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i < count) {
      const float e = exp2f(score[i] - M);
      sum += e;
      acc = fmaf(kv[i], e, acc);
    }
  }
  return Partial{M, sum, acc};
}

DSA_HD Partial merge(Partial a, Partial b) {
  const float M = fmaxf(a.max, b.max);
  const float ea = exp2f(a.max - M), eb = exp2f(b.max - M);
  return Partial{M, a.sum * ea + b.sum * eb, a.acc * ea + b.acc * eb};
}

// A slot's stored state (m in natural units, s, k the normalized mean) as a Partial, and back.
DSA_HD Partial from_state(float m, float s, float k) { return Partial{to_log2(m), s, k * s}; }

DSA_HD float state_max(Partial p) { return p.max * kLn2; }

DSA_HD float mean_of(Partial p) { return p.acc / p.sum; }

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

DSA_HD bool slot_ok(int32_t slot, int64_t num_slots) { return slot >= 0 && slot < num_slots; }

}  // namespace dsa
