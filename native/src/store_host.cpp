// Host backend of the stores (device == DSA_DEVICE_HOST): the kernels' arithmetic (store_math.h), in its
// order; the standalone store and the epilogue of every storing host op, both layouts (DSA_CACHE_V4, the c4
// indexer's DSA_CACHE_INDEXER).
#include "store_host.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "store_math.h"

namespace dsa {

// The cache entry of vector x [D] at slot `loc`, rotary row `pos` (store_math.h, in its order).
void host_store_vector(const float* x, int D, const dsa_kv_cache& c, int64_t loc, int64_t pos, uint32_t* error_count) {
  const int check = store_check(&loc, c.num_pages * c.page_size, pos, c.num_positions, c.dcp_world, c.dcp_rank);
  if (check != kStoreWrite) {
    if (check == kStoreCount && error_count != nullptr) ++*error_count;
    return;
  }
  const int groups = D / kStoreGroup;
  float total = 0.0f;
  for (int g = 0; g < groups; ++g) {
    float p[kStoreGroup / 2];
    for (int i = 0; i < kStoreGroup / 2; ++i) p[i] = pair_square(x[g * kStoreGroup + 2 * i], x[g * kStoreGroup + 2 * i + 1]);
    for (int offset = 1; offset < kStoreGroup / 2; offset <<= 1) {
      float q[kStoreGroup / 2];
      for (int i = 0; i < kStoreGroup / 2; ++i) q[i] = add_rn(p[i], p[i ^ offset]);
      std::memcpy(p, q, sizeof(p));
    }
    total = g == 0 ? p[0] : add_rn(total, p[0]);
  }
  const float r = rms_factor(total, D, c.eps);
  const EntryOffsets at = entry_offsets(loc, page_log2_of(c.page_size), page_bytes(D, c.page_size), D);
  uint8_t* const data = c.cache + at.data;
  for (int g = 0; g + 1 < groups; ++g) {
    float y[kStoreGroup], amax = 0.0f;
    for (int i = 0; i < kStoreGroup; ++i) {
      const int d = g * kStoreGroup + i;
      y[i] = bf16_rounded(normed(x[d], r, c.norm_weight[d]));
      amax = fmaxf(amax, fabsf(y[i]));
    }
    const uint32_t e = scale_exponent(amax);
    const float inv = inverse_scale(e);
    for (int i = 0; i < kStoreGroup; ++i) data[g * kStoreGroup + i] = (uint8_t)fp8_e4m3(y[i] * inv);
    c.cache[at.scale + g] = (uint8_t)e;
  }
  const int tail = D - kStoreGroup;
  const float* rot = c.rotary + pos * kStoreGroup;
  for (int i = 0; i < kStoreGroup; i += 2) {
    float a, b;
    rotate(normed(x[tail + i], r, c.norm_weight[tail + i]), normed(x[tail + i + 1], r, c.norm_weight[tail + i + 1]),
           rot[i], rot[i + 1], &a, &b);
    Bf16 ab[2];
    narrow(a, &ab[0]), narrow(b, &ab[1]);
    std::memcpy(data + tail + 2 * i, ab, sizeof(ab));
  }
}

// The indexer's cache entry of x [128] at slot `loc`, rotary row `pos` (store_math.h, in its order).
void host_indexer_store(const float* x, const dsa_kv_cache& c, int64_t loc, int64_t pos, uint32_t* error_count) {
  const int check = store_check(&loc, c.num_pages * c.page_size, pos, c.num_positions, c.dcp_world, c.dcp_rank);
  if (check != kStoreWrite) {
    if (check == kStoreCount && error_count != nullptr) ++*error_count;
    return;
  }
  constexpr int D = kIndexerDim, kLanes = D / 4;
  float s[kLanes], t[kLanes];
  for (int l = 0; l < kLanes; ++l) s[l] = lane_squares(x[4 * l], x[4 * l + 1], x[4 * l + 2], x[4 * l + 3]);
  for (int m = 16; m >= 1; m >>= 1) {
    for (int l = 0; l < kLanes; ++l) t[l] = add_rn(s[l], s[l ^ m]);
    std::memcpy(s, t, sizeof(s));
  }
  const float r = rms_factor(s[0], D, c.eps);
  float y[D], z[D];
  for (int e = 0; e < D; ++e) y[e] = normed(x[e], r, c.norm_weight[e]);
  const float* rot = c.rotary + pos * kStoreGroup;
  for (int i = 0; i < kStoreGroup; i += 2) {
    const int e = D - kStoreGroup + i;
    rotate(y[e], y[e + 1], rot[i], rot[i + 1], &z[0], &z[1]);
    y[e] = z[0], y[e + 1] = z[1];
  }
  for (int k = 0; k < 7; ++k) {
    const int bit = 1 << k;
    for (int e = 0; e < D; ++e) z[e] = hadamard_pair(y[e], y[e ^ bit], (e & bit) != 0);
    std::memcpy(y, z, sizeof(y));
  }
  float amax = 0.0f;
  for (int e = 0; e < D; ++e) y[e] = mul_rn(y[e], kHadamardScale), amax = fmaxf(amax, fabsf(y[e]));
  const float scale = indexer_scale(amax), inv = reciprocal_rn(scale);
  const EntryOffsets at = indexer_offsets(loc, page_log2_of(c.page_size), D);
  for (int e = 0; e < D; ++e) c.cache[at.data + e] = (uint8_t)fp8_e4m3(mul_rn(y[e], inv));
  std::memcpy(c.cache + at.scale, &scale, sizeof(scale));
}

void host_store_entry(const float* x, int D, const dsa_kv_cache& c, int64_t loc, int64_t pos, uint32_t* error_count) {
  if (c.layout == DSA_CACHE_INDEXER)
    host_indexer_store(x, c, loc, pos, error_count);
  else
    host_store_vector(x, D, c, loc, pos, error_count);
}

void host_store(const dsa_kv_store_params& p) {
  const bool records = (p.flags & (DSA_FLAG_STORE_DECODE_RECORDS | DSA_FLAG_STORE_EXTEND_RECORDS)) != 0;
  const bool extend = (p.flags & DSA_FLAG_STORE_EXTEND_RECORDS) != 0;
  for (int64_t v = 0; v < p.num_vectors; ++v) {
    int64_t loc = records ? -1 : p.cache_slots[v];
    int32_t pos = records ? 0 : p.positions[v];
    if (records) {
      const int row = record_row(p.records, extend, v, p.cache_slots, p.num_cache_slots, p.ratio ? p.ratio : DSA_CHUNK,
                                 &loc, &pos);
      if (row != kStoreWrite) {
        if (row == kStoreCount && p.error_count != nullptr) ++*p.error_count;
        continue;
      }
    }
    host_store_entry(p.vectors + v * p.head_dim, p.head_dim, *p.cache, loc, pos, p.error_count);
  }
}

}  // namespace dsa
