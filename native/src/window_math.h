// The window softmax of the raw-ring compressors (the c4 entries, the offline c128 chunks), shared verbatim by
// their CUDA kernels and host backends: per channel, the softmax over a window of rows of the biased scores z
// weighting the values kv. A window is summed in blocks of rows, each block to its largest logit; blocks are
// merged in order; one division ends it.
#pragma once

#include "online_softmax.h"

namespace dsa {

// One channel's unnormalized softmax over some rows: the largest logit, the sum of kv * e and of e, with
// e = 2^((z - max) * log2 e) (on the GPU one ex2.approx).
struct WindowSum {
  float max;
  float num;
  float den;
};

// Rows first .. N-1 of a block of N (kv[j], z[j]): one max over the logits, then the weighted sum and the sum
// of weights in row order.
template <int N>
DSA_HD WindowSum window_sum(const float (&kv)[N], const float (&z)[N], int first) {
  float m = z[N - 1];
#pragma unroll
  for (int j = 0; j < N - 1; ++j)
    if (j >= first) m = fmaxf(m, z[j]);
  float num = 0.0f, den = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    if (j >= first) {
      const float e = exp2_((z[j] - m) * kLog2e);
      num = fmaf(e, kv[j], num);
      den += e;
    }
  }
  return WindowSum{m, num, den};
}

// P blocks of one window merged in block order: each rescaled to the window's largest logit M by
// 2^((max_i - M) * log2 e), its sums added with one fma each.
template <int P>
DSA_HD WindowSum merge_windows(const WindowSum (&w)[P]) {
  float M = w[0].max;
#pragma unroll
  for (int i = 1; i < P; ++i) M = fmaxf(M, w[i].max);
  float num = 0.0f, den = 0.0f;
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const float s = exp2_((w[i].max - M) * kLog2e);
    num = fmaf(w[i].num, s, num);
    den = fmaf(w[i].den, s, den);
  }
  return WindowSum{M, num, den};
}

// The window's value num / den (on the GPU the approximate division).
DSA_HD float window_value(const WindowSum& w) {
#if defined(__CUDA_ARCH__)
  return __fdividef(w.num, w.den);
#else
  return w.num / w.den;
#endif
}

}  // namespace dsa
