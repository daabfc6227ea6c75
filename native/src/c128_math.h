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

// A partial softmax over some tokens of one channel, in unnormalized form:
// max = largest biased score, sum = sum exp(score - max), acc = sum kv * exp(score - max).
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
  const float scale = expf(p.max - M);
  float sum = p.sum * scale, acc = p.acc * scale;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i < count) {
      const float e = expf(score[i] - M);
      sum += e;
      acc = fmaf(kv[i], e, acc);
    }
  }
  return Partial{M, sum, acc};
}

DSA_HD Partial merge(Partial a, Partial b) {
  const float M = fmaxf(a.max, b.max);
  const float ea = expf(a.max - M), eb = expf(b.max - M);
  return Partial{M, a.sum * ea + b.sum * eb, a.acc * ea + b.acc * eb};
}

// A slot's stored state (m, s, k) with k the normalized mean, as a Partial.
DSA_HD Partial from_state(float m, float s, float k) { return Partial{m, s, k * s}; }

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
