// The online softmax of one channel (docs/spec.md, the per-token update): partial sums in base 2 with their own
// maximum, folded token by token or merged, and the mean that ends them; shared verbatim by the CUDA kernels and
// the host backend so both compute the same function (the c128 compression, the raw rings' windows).
#pragma once

#include <cmath>

#include "host_device.h"

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

}  // namespace dsa
