// Arithmetic of the KV-cache stores (docs/spec.md, "The store", "The stores of a c4 layer"), shared verbatim by the CUDA
// kernels and the host backend, so that both produce the same bytes: RMSNorm, the bf16 rounding of the
// quantized part, power-of-two ("ue8m0") scales per 64 values, fp8 e4m3 codes, the rotation of the
// rope tail, and the paged cache layout (DSA_CACHE_V4); the c4 indexer's store (DSA_CACHE_INDEXER).
//
// The norm's sum of squares has one defined order, whatever the thread layout that computes it:
// pair sums p_i = x_{2i+1}^2 + x_{2i}^2 (one fma), a butterfly tree over the 32 pairs of each
// 64-channel group (pair offsets 1, 2, 4, 8, 16), then the group sums added left to right.
#pragma once

#include <cmath>

#include "bf16.h"
#include "dsa_kernels.h"

namespace dsa {

constexpr int kStoreGroup = 64;     // channels per fp8 scale, and the rope tail's width
constexpr float kFp8Max = 448.0f;   // largest finite e4m3 value
constexpr float kScaleFloor = 1e-4f;

DSA_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

DSA_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// x_b^2 + x_a^2 of one channel pair (a = even channel, b = odd), rounded once after the add.
DSA_HD float pair_square(float a, float b) { return fmaf(b, b, mul_rn(a, a)); }

// The mean of the squares, sum / D correctly rounded. For a power-of-two D it is the product by
// 2^-log2(D): exact scaling, so the same bits as the division (both round the same real number
// once), without the division's instruction sequence on the GPU.
DSA_HD float mean_square(float sum_of_squares, int head_dim) {
  if ((head_dim & (head_dim - 1)) == 0) return mul_rn(sum_of_squares, bits_float((254u - (float_bits((float)head_dim) >> 23)) << 23));
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(sum_of_squares, (float)head_dim);
#else
  return sum_of_squares / (float)head_dim;
#endif
}

// 1 / sqrt(mean + eps), correctly rounded at every step on both backends.
DSA_HD float rms_factor(float sum_of_squares, int head_dim, float eps) {
  const float mean = mean_square(sum_of_squares, head_dim);
#if defined(__CUDA_ARCH__)
  return __frcp_rn(__fsqrt_rn(__fadd_rn(mean, eps)));
#else
  return 1.0f / sqrtf(mean + eps);
#endif
}

// The normed value y = x * r * w.
DSA_HD float normed(float x, float r, float w) { return mul_rn(mul_rn(x, r), w); }

// y rounded to bf16 and widened back (round to nearest even).
DSA_HD float bf16_rounded(float y) { return as_stored<Bf16>(y); }

// The biased exponent byte of the scale of a group whose largest |bf16 value| is amax: the smallest
// power of two 2^k >= s, s = max(amax, 1e-4) / 448 rounded to float. Computed from a = max(amax,
// 1e-4) without dividing: s <= 2^k exactly when a <= 448 * 2^k (no float lies between 448 * 2^k and
// the midpoint above it), and 448 = 1.75 * 2^8, so k is a's exponent - 8, plus one when a's
// significand exceeds 1.75. Checked against the division for every float a (an infinite a gives 255,
// as the division does).
DSA_HD uint32_t scale_exponent(float amax) {
  const uint32_t u = float_bits(fmaxf(amax, kScaleFloor));
  if (u >= 0x7F800000u) return 0xFFu;
  return (u >> 23) - 8u + ((u & 0x7FFFFFu) > 0x600000u);
}

// 1 / scale for a scale exponent byte (exact: a power of two).
DSA_HD float inverse_scale(uint32_t exponent) { return bits_float((254u - exponent) << 23); }

// fp8 e4m3 code of v, saturated to +-448 (NaN saturates too), rounded to nearest even.
DSA_HD uint32_t fp8_e4m3(float v) {
  const float c = fmaxf(fminf(v, kFp8Max), -kFp8Max);
  const uint32_t sign = (float_bits(c) >> 24) & 0x80u;
  const float a = fabsf(c);
  if (a < 0.015625f) {  // below 2^-6: subnormal codes, steps of 2^-9
#if defined(__CUDA_ARCH__)
    return sign | (uint32_t)__float2int_rn(a * 512.0f);
#else
    return sign | (uint32_t)(int32_t)rintf(a * 512.0f);
#endif
  }
  uint32_t u = float_bits(a);
  u += 0x7FFFFu + ((u >> 20) & 1u);  // round the mantissa to 3 bits, nearest even
  return sign | ((u >> 20) - (120u << 3));
}

// The fp8 e4m3 codes of (lo, hi) as one 16-bit pair, lo in the low byte. sm_89 and later convert
// with one cvt.rn.satfinite.e4m3x2.f32 after the same clamp (so NaN gives 448's code, as above):
// round to nearest even with e4m3's subnormals, as fp8_e4m3 (the GPU-against-host byte tests cover
// every binade and the subnormal codes and their ties).
DSA_HD uint32_t fp8_e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"
      : "=h"(pair)
      : "f"(fmaxf(fminf(hi, kFp8Max), -kFp8Max)), "f"(fmaxf(fminf(lo, kFp8Max), -kFp8Max)));
  return pair;
#else
  return fp8_e4m3(lo) | (fp8_e4m3(hi) << 8);
#endif
}

// One rope pair (a, b) rotated by (cos, sin): (a c - b s, a s + b c).
DSA_HD void rotate(float a, float b, float c, float s, float* x, float* y) {
  *x = fmaf(a, c, -mul_rn(b, s));
  *y = fmaf(a, s, mul_rn(b, c));
}

// Cache layout: an entry is (D - 64) fp8 bytes then 64 bf16 (D + 64 data bytes) and one scale row
// of D / 64 - 1 exponent bytes padded to a multiple of 8 (never written past the scales). A page
// holds page_size data rows, then their scale rows, padded to a multiple of the data row.
DSA_HD int64_t entry_data_bytes(int head_dim) { return head_dim + kStoreGroup; }
DSA_HD int64_t entry_scale_bytes(int head_dim) { return ((head_dim / kStoreGroup + 7) / 8) * 8; }
DSA_HD int64_t page_bytes(int head_dim, int64_t page_size) {
  const int64_t row = entry_data_bytes(head_dim);
  return (page_size * (row + entry_scale_bytes(head_dim)) + row - 1) / row * row;
}

// log2 of a power-of-two page size (checked by store_launch).
DSA_HD int page_log2_of(int64_t page_size) {
  int log2 = 0;
  while (((int64_t)1 << log2) < page_size) ++log2;
  return log2;
}

// Byte offsets of cache slot `loc`'s data row and scale row (page_size = 1 << page_log2).
struct EntryOffsets {
  int64_t data;
  int64_t scale;
};
DSA_HD EntryOffsets entry_offsets(int64_t loc, int page_log2, int64_t page_stride, int head_dim) {
  const int64_t page = loc >> page_log2, entry = loc & ((int64_t{1} << page_log2) - 1);
  const int64_t base = page * page_stride;
  return EntryOffsets{base + entry * entry_data_bytes(head_dim),
                      base + (entry_data_bytes(head_dim) << page_log2) + entry * entry_scale_bytes(head_dim)};
}

// What a store does with the slot of a vector: write it, skip it silently (negative: not held on
// this GPU) or skip and count it (past the cache, or a rotary row outside the table).
enum StoreCheck : int { kStoreWrite = 0, kStoreSkip = 1, kStoreCount = 2 };

// The position and cache slot of vector i of a store that reads request or segment records
// (DSA_FLAG_STORE_*_RECORDS): kStoreWrite with *loc and *pos set, kStoreSkip (a decode row that closes
// no chunk, an extend padding record) or kStoreCount (a slot index past num_slots, or an extend
// record too short to close a chunk). Records and slot indices are data.
// `ratio`: tokens per entry (128, or 4 for a c4 layer's records).
DSA_HD int record_row(const int32_t* records, bool extend, int64_t i, const int64_t* slots, int64_t num_slots,
                      uint32_t ratio, int64_t* loc, int32_t* pos) {
  const uint32_t seq = (uint32_t)records[4 * i];
  int64_t at = i;
  if (extend) {
    if (seq == 0xFFFFFFFFu) return kStoreSkip;
    if (seq < ratio) return kStoreCount;
    at = (uint32_t)records[4 * i + 1] & 0xFFFFu;
  } else if (seq == 0u || seq % ratio != 0u || seq > 0x7FFFFFFFu) {
    return kStoreSkip;
  }
  if (at >= num_slots) return kStoreCount;
  *loc = slots[at];
  *pos = (int32_t)(seq - ratio);
  return kStoreWrite;
}
// *loc: the op's cache slot in, the local slot to write out (decode-context-parallel ownership: a slot
// another rank owns is skipped silently, as a negative one; world <= 1 owns every slot).
DSA_HD int store_check(int64_t* loc, int64_t capacity, int64_t position, int64_t num_positions, int32_t world,
                       int32_t rank) {
  if (*loc < 0) return kStoreSkip;
  if (world > 1) {
    if (*loc % world != rank) return kStoreSkip;
    *loc /= world;
  }
  return *loc < capacity && position >= 0 && position < num_positions ? kStoreWrite : kStoreCount;
}

constexpr int kIndexerDim = 128;  // the indexer store's Hadamard transform size
constexpr float kHadamardScale = 0.08838834764831845f;  // fp32(1 / sqrt(128)), 0x3DB504F3

// ---- the indexer store --------------------------------------------------------------------------
// Per lane l of 32 (4 channels 4l .. 4l+3): sum of squares fma(x3, x3, fma(x2, x2, fma(x1, x1, x0 x0))),
// a butterfly over lanes (xor 16, 8, 4, 2, 1), the RMS factor of store_math.h; y = x r w; the pairs of
// dims 64..127 rotated in fp32; the Hadamard transform as 7 butterfly stages over the element index's
// bits 0..6 (bit k of e clear: x[e] + x[e | 2^k], set: x[e & ~2^k] - x[e]), times fp32(1 / sqrt(128));
// scale = max(amax, 1e-4) / 448 (a plain fp32), codes = e4m3(h * (1 / scale)).

DSA_HD float lane_squares(float x0, float x1, float x2, float x3) {
  return fmaf(x3, x3, fmaf(x2, x2, fmaf(x1, x1, mul_rn(x0, x0))));
}

// One Hadamard butterfly: element e's new value from its own and its partner's (e ^ 2^k).
DSA_HD float hadamard_pair(float mine, float partner, bool high) {
  return high ? add_rn(partner, -mine) : add_rn(mine, partner);
}

DSA_HD float indexer_scale(float amax) {
  const float a = fmaxf(amax, kScaleFloor);
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, kFp8Max);
#else
  return a / kFp8Max;
#endif
}

DSA_HD float reciprocal_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(x);
#else
  return 1.0f / x;
#endif
}

// Indexer layout: a page holds page_size entries of D fp8 codes, then their fp32 scales.
DSA_HD int64_t indexer_page_bytes(int head_dim, int64_t page_size) { return page_size * (head_dim + 4); }

DSA_HD EntryOffsets indexer_offsets(int64_t loc, int page_log2, int head_dim) {
  const int64_t page_size = int64_t{1} << page_log2;
  const int64_t page = loc >> page_log2, entry = loc & (page_size - 1);
  const int64_t base = page * indexer_page_bytes(head_dim, page_size);
  return EntryOffsets{base + entry * head_dim, base + page_size * head_dim + 4 * entry};
}

// Bytes of one page of a cache of `layout`.
DSA_HD int64_t cache_page_bytes(int32_t layout, int head_dim, int64_t page_size) {
  return layout == DSA_CACHE_INDEXER ? indexer_page_bytes(head_dim, page_size) : page_bytes(head_dim, page_size);
}

}  // namespace dsa
