// The KV-cache store as a device epilogue: the threads of one request (or one vector) hold its D
// channels, VEC consecutive ones each, and write its cache entry together. Used by the standalone
// store and by every kernel that closes a chunk (decode, verify), so fused and standalone stores
// are one code and give the same bytes.
#pragma once

#include "device.cuh"
#include "store_math.h"

namespace dsa {

constexpr int kStoreMaxRows = 4;      // requests per block that may store (threadIdx.y)
constexpr int kStoreMaxGroups = 64;   // D / 64 up to 4096 channels

// The store's parameters inside a kernel launch (from dsa_kv_cache and the op's slots).
struct StoreLaunch {
  uint8_t* cache;
  const int64_t* cache_slots;  // per row of the op
  const float* norm_weight;    // [D]
  const float* rotary;         // [num_positions, 64]
  int64_t num_positions;
  int64_t capacity;            // num_pages * page_size
  int64_t page_stride;         // bytes per page
  float eps;
  int32_t page_log2;
  int32_t dcp_world;           // decode-context-parallel ownership (store_check)
  int32_t dcp_rank;
  int32_t layout;              // DSA_CACHE_V4 or DSA_CACHE_INDEXER
};

// Host side: checks a dsa_kv_cache for head dim D and fills `out` (cache_slots left to the caller).
// `layout` is the layout the op stores (DSA_CACHE_V4 for every c128 op; the c4 indexer's DSA_CACHE_INDEXER);
// `name` is the cache's argument name in the op's messages.
dsa_status store_launch(const dsa_kv_cache* cache, const int64_t* cache_slots, int head_dim, int device,
                        const char* op, StoreLaunch* out, int32_t layout = DSA_CACHE_V4, const char* name = "store");

// A storing prefill's store on the GPU, launched with PDL behind the prefill's own launches: the
// vector of each of its first num_compress compress records, from `out` (compact row, or the record's
// ragged row), at cache slot cache_slots[ragged row] with rotary row position - 127. A host plan's
// records travel in the launches; a device plan's are read in place (capped by its counts). Records
// the prefill skipped are skipped here too, uncounted.
dsa_status store_prefill_vectors(const dsa_c128_prefill_params& p, const StoreLaunch& st, int64_t num_compress,
                                 cudaStream_t stream, const char* op);

#if defined(__CUDACC__)
// Always true for a launch from store_launch (non-null slots, page_log2 >= 0). A storing kernel tests
// it before its grid-dependency wait: the test reads the store's parameters, so the constant lines
// they sit in are fetched while the kernel waits (the compiler otherwise places a parameter read at
// its first use, after the wait; docs/performance.md, "c128 decode").
__device__ __forceinline__ bool store_params_ready(const StoreLaunch& st) {
  return st.cache_slots != nullptr && st.page_log2 >= 0;
}

// Blocks until the warps of request row `row` (lanes threads) reach it; one warp syncs itself. Barrier
// ids are immediates (row r: barrier r, row 0 on barrier 0 with a thread count): a register id makes
// ptxas reserve all 16 of a block's barriers, which held a storing kernel to 4 blocks per SM (1.9 waves
// at B = 1024; docs/performance.md, "c128 decode").
__device__ __forceinline__ void request_barrier(int row, int lanes) {
  static_assert(kStoreMaxRows == 4, "one immediate barrier id per request row");
  if (lanes <= 32) {
    __syncwarp();
  } else if (lanes == (int)(blockDim.x * blockDim.y)) {  // the block is one request row
    __syncthreads();
  } else if (row == 0) {
    asm volatile("bar.sync 0, %0;" ::"r"(lanes) : "memory");
  } else if (row == 1) {
    asm volatile("bar.sync 1, %0;" ::"r"(lanes) : "memory");
  } else if (row == 2) {
    asm volatile("bar.sync 2, %0;" ::"r"(lanes) : "memory");
  } else {
    asm volatile("bar.sync 3, %0;" ::"r"(lanes) : "memory");
  }
}

// The group sums of one request added left to right (store_math.h's order). Up to 8 groups (D <= 512)
// in two 16-byte shared reads issued together, then the adds; more groups continue four at a time.
__device__ __forceinline__ float groups_total(const float* sums, int groups) {
  const float4* q = reinterpret_cast<const float4*>(sums);
  const float4 a = q[0], b = groups > 4 ? q[1] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float total = v[0];
#pragma unroll
  for (int g = 1; g < 8; ++g)
    if (g < groups) total = add_rn(total, v[g]);
  for (int g = 8; g < groups; g += 4) {
    const float4 c = q[g / 4];
    total = add_rn(total, c.x);
    if (g + 1 < groups) total = add_rn(total, c.y);
    if (g + 2 < groups) total = add_rn(total, c.z);
    if (g + 3 < groups) total = add_rn(total, c.w);
  }
  return total;
}

template <int VEC>
__device__ __forceinline__ void load_floats(float (&v)[VEC], const float* p) {
  const Lanes<VEC> x = load_lanes<VEC>(p);
#pragma unroll
  for (int i = 0; i < VEC; ++i) v[i] = x.v[i];
}

// What a storing thread reads besides its vector, issued as early as the kernel knows the rotary
// row: the norm weights of its channels and, in the rope tail, its (cos, sin) pairs of row `pos`
// (a row outside the table is not read; store_vector skips it).
template <int VEC>
struct StoreOperands {
  float w[VEC];
  float rot[VEC] = {};  // read only in the rope lanes of a stored row
  int check = kStoreSkip;    // aim_store: what the store does with the vector
  uint8_t* data = nullptr;   // and where its entry's data and scale rows are (check == kStoreWrite)
  uint8_t* scale = nullptr;
};

// Resolves the vector's cache slot `loc` (the op's slot) and rotary row `pos`: whether the vector is
// written and where. Called as soon as both are known, ahead of the vector's arithmetic, so the
// slot's checks and its 64-bit offsets are computed while the kernel waits on memory, not after the
// vector (docs/performance.md, "c128 decode").
template <int VEC>
__device__ __forceinline__ void aim_store(StoreOperands<VEC>& o, const StoreLaunch& st, int64_t loc, int64_t pos, int D) {
  o.check = store_check(&loc, st.capacity, pos, st.num_positions, st.dcp_world, st.dcp_rank);
  if (o.check == kStoreWrite) {
    const EntryOffsets at = entry_offsets(loc, st.page_log2, st.page_stride, D);
    o.data = st.cache + at.data, o.scale = st.cache + at.scale;
  }
}

// The largest of the non-negative v over each group of kGroupLanes consecutive lanes, in every lane:
// one integer warp reduction per group of the warp (for non-negative floats the order of the bits is
// the order of the values), all with the full mask, so every lane of the warp must call it.
template <int kGroupLanes>
__device__ __forceinline__ float group_max(float v) {
  static_assert(kGroupLanes == 8 || kGroupLanes == 16 || kGroupLanes == 32, "groups of 8, 16 or 32 lanes");
  const uint32_t bits = float_bits(v);
  const int mine = (int)(threadIdx.x % 32) / kGroupLanes;
  uint32_t r = 0;
#pragma unroll
  for (int g = 0; g < 32 / kGroupLanes; ++g) {
    const uint32_t m = __reduce_max_sync(0xFFFFFFFFu, mine == g ? bits : 0u);
    if (mine == g) r = m;
  }
  return bits_float(r);
}

template <int VEC>
__device__ __forceinline__ void load_weights(StoreOperands<VEC>& o, const StoreLaunch& st, int ch) {
  load_floats<VEC>(o.w, st.norm_weight + ch);
}

// VEC floats from p where `pred` holds (else v unchanged), as one predicated load instead of a branch
// around the load (in the decode the branch, divergent in the rope warp, let dependent arithmetic in
// ahead of it; docs/performance.md, "c128 decode"). p need not be a valid address where pred is false.
template <int VEC>
__device__ __forceinline__ void load_floats_if(bool pred, float (&v)[VEC], const float* p) {
  static_assert(VEC == 2 || VEC == 4 || VEC == 8, "pairs of channels per thread");
  const uint32_t on = pred;
  if constexpr (VEC == 2) {
    asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %3, 0;\n @q ld.global.nc.v2.f32 {%0, %1}, [%2];\n}"
        : "+f"(v[0]), "+f"(v[1]) : "l"(p), "r"(on));
  } else {
#pragma unroll
    for (int i = 0; i < VEC; i += 4)
      asm volatile("{\n .reg .pred q;\n setp.ne.u32 q, %5, 0;\n @q ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];\n}"
          : "+f"(v[i]), "+f"(v[i + 1]), "+f"(v[i + 2]), "+f"(v[i + 3]) : "l"(p + i), "r"(on));
  }
}

// The rotary pairs of row `pos` for the rope lanes, where `wanted` (a row outside the table is not
// read; store_vector skips it).
template <int VEC>
__device__ __forceinline__ void load_rotary(StoreOperands<VEC>& o, const StoreLaunch& st, int D, int ch, int64_t pos,
                                            bool wanted = true) {
  const bool rope = ch >= D - kStoreGroup;
  load_floats_if<VEC>(wanted && rope && pos >= 0 && pos < st.num_positions, o.rot,
                      st.rotary + (pos * kStoreGroup + (ch - (D - kStoreGroup))));
}

// Writes the cache entry of vector x (this thread's VEC channels from `ch`; o: its loaded operands,
// aimed by aim_store). Every thread of the request row calls it, after the same aim_store; `lanes` =
// D / VEC threads, a multiple of 32, consecutive in the block; `row` (< kStoreMaxRows) names the request
// row among the block's.
template <int VEC>
__device__ __forceinline__ void store_vector(const StoreLaunch& st, const float (&x)[VEC], const StoreOperands<VEC>& o,
                                             int D, int ch, int lanes, uint32_t* error_count,
                                             int row = (int)threadIdx.y) {
  static_assert(VEC == 2 || VEC == 4 || VEC == 8, "pairs of channels per thread");
  __shared__ __align__(16) float group_sums[kStoreMaxRows][kStoreMaxGroups];
  constexpr int kGroupLanes = kStoreGroup / VEC;
  if (o.check != kStoreWrite) {
    if (o.check == kStoreCount && ch == 0) count_error(error_count);
    return;
  }
  const int group = ch / kStoreGroup;
  const bool rope = ch >= D - kStoreGroup;
  // Sum of squares in the defined order: pairs, the tree inside the thread, the tree across the
  // group's lanes, then the groups left to right.
  float p[VEC / 2];
#pragma unroll
  for (int i = 0; i < VEC / 2; ++i) p[i] = pair_square(x[2 * i], x[2 * i + 1]);
#pragma unroll
  for (int step = 1; step < VEC / 2; step <<= 1)
#pragma unroll
    for (int i = 0; i < VEC / 2; i += 2 * step) p[i] = add_rn(p[i], p[i + step]);
  float sum = p[0];
#pragma unroll
  for (int offset = 1; offset < kGroupLanes; offset <<= 1) sum = add_rn(sum, __shfl_xor_sync(0xFFFFFFFFu, sum, offset));
  if (threadIdx.x % kGroupLanes == 0) group_sums[row][group] = sum;
  request_barrier(row, lanes);
  const float total = groups_total(group_sums[row], D / kStoreGroup);
  const float r = rms_factor(total, D, st.eps);
  float y[VEC], q[VEC];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) y[i] = normed(x[i], r, o.w[i]), q[i] = bf16_rounded(y[i]), amax = fmaxf(amax, fabsf(q[i]));
  // Every lane takes part (the rope lanes' group maximum is not used).
  amax = group_max<kGroupLanes>(amax);
  if (rope) {  // a whole group: the rotated tail as bf16
    Pack<Bf16, VEC> out;
#pragma unroll
    for (int i = 0; i < VEC; i += 2) {
      float a, b;
      rotate(y[i], y[i + 1], o.rot[i], o.rot[i + 1], &a, &b);
      narrow(a, &out.e[i]), narrow(b, &out.e[i + 1]);
    }
    *reinterpret_cast<Pack<Bf16, VEC>*>(o.data + (D - kStoreGroup) + 2 * (ch - (D - kStoreGroup))) = out;
  } else {
    const uint32_t e = scale_exponent(amax);
    const float inv = inverse_scale(e);
    Pack<uint16_t, VEC / 2> codes;
#pragma unroll
    for (int i = 0; i < VEC; i += 2) codes.e[i / 2] = (uint16_t)fp8_e4m3x2(q[i] * inv, q[i + 1] * inv);
    *reinterpret_cast<Pack<uint16_t, VEC / 2>*>(o.data + ch) = codes;
    if (threadIdx.x % kGroupLanes == 0) o.scale[group] = (uint8_t)e;
  }
}
// Aims the indexer's store of a vector at cache slot `loc`, rotary row `pos` (o's weights and rotary
// pairs loaded by the caller, as for store_vector).
template <int VEC>
__device__ __forceinline__ void aim_indexer_store(StoreOperands<VEC>& o, const StoreLaunch& st, int64_t loc, int64_t pos) {
  o.check = store_check(&loc, st.capacity, pos, st.num_positions, st.dcp_world, st.dcp_rank);
  if (o.check == kStoreWrite) {
    const EntryOffsets at = indexer_offsets(loc, st.page_log2, kIndexerDim);
    o.data = st.cache + at.data, o.scale = st.cache + at.scale;
  }
}

// Request row `row`'s floats of shared scratch for the indexer store's exchanges across warps (one
// array per kernel: 64 for the squares, 128 for the Hadamard stage, 64 for the largest magnitude).
__device__ __forceinline__ float* indexer_scratch(int row) {
  __shared__ float scratch[kStoreMaxRows][2 * kIndexerDim];
  return scratch[row];
}

// The values of the thread `offset` lanes away (lane ^ offset) among the kLanes threads of request row
// `row`: a shuffle inside a warp, through shared memory across the row's warps (`region`: this exchange's
// own floats of the row's scratch, so no exchange waits for another's reads).
template <int kLanes, int N>
__device__ __forceinline__ void partner_values(float (&v)[N], float (&out)[N], int lane, int offset, int row,
                                               int region) {
  if (offset < 32) {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = __shfl_xor_sync(0xFFFFFFFFu, v[k], offset);
  } else {
    float* mine = indexer_scratch(row) + region;
#pragma unroll
    for (int k = 0; k < N; ++k) mine[k * kLanes + lane] = v[k];
    request_barrier(row, kLanes);
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = mine[k * kLanes + (lane ^ offset)];
  }
}

// The indexer's store of x (this thread's VEC of the 128 channels, from ch; the vector's 128 / VEC threads
// consecutive: one warp for VEC = 4, two for VEC = 2, request row `row` of the block), aimed by
// aim_indexer_store: docs/spec.md, "c4 stores" (store_math.h states the order of every operation; it does
// not depend on VEC).
template <int VEC>
__device__ __forceinline__ void indexer_store(const StoreLaunch& st, const float (&x)[VEC], const StoreOperands<VEC>& o,
                                              int ch, uint32_t* error_count, int row = 0) {
  static_assert(VEC == 2 || VEC == 4, "2 or 4 channels per thread");
  constexpr int kLanes = kIndexerDim / VEC, kQuadShift = VEC == 4 ? 0 : 1;  // thread = quad << kQuadShift | half
  if (o.check != kStoreWrite) {
    if (o.check == kStoreCount && ch == 0) count_error(error_count);
    return;
  }
  const int lane = ch / VEC;
  // The squares of the quad (channels 4q .. 4q + 3) in order, then the butterfly over quads 16, 8, 4, 2, 1.
  float sum[1];
  if constexpr (VEC == 4) {
    sum[0] = lane_squares(x[0], x[1], x[2], x[3]);
  } else {
    const float a = __shfl_xor_sync(0xFFFFFFFFu, x[0], 1), b = __shfl_xor_sync(0xFFFFFFFFu, x[1], 1);
    sum[0] = (lane & 1) ? lane_squares(a, b, x[0], x[1]) : lane_squares(x[0], x[1], a, b);
  }
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) {
    float other[1];
    partner_values<kLanes, 1>(sum, other, lane, m << kQuadShift, row, 0);
    sum[0] = add_rn(sum[0], other[0]);
  }
  const float r = rms_factor(sum[0], kIndexerDim, st.eps);
  float y[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) y[k] = normed(x[k], r, o.w[k]);
  if (ch >= kIndexerDim - kStoreGroup) {
#pragma unroll
    for (int k = 0; k < VEC; k += 2) rotate(y[k], y[k + 1], o.rot[k], o.rot[k + 1], &y[k], &y[k + 1]);
  }
  // Hadamard stages over element bits 0 .. 6 in order: the bits below VEC inside the thread, the rest
  // across threads (thread offset 2^bit / VEC).
#pragma unroll
  for (int bit = 1; bit < VEC; bit <<= 1) {
    float z[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) z[k] = hadamard_pair(y[k], y[k ^ bit], k & bit);
#pragma unroll
    for (int k = 0; k < VEC; ++k) y[k] = z[k];
  }
#pragma unroll
  for (int offset = 1; offset < kLanes; offset <<= 1) {
    float other[VEC];
    partner_values<kLanes, VEC>(y, other, lane, offset, row, kIndexerDim / 2);
#pragma unroll
    for (int k = 0; k < VEC; ++k) y[k] = hadamard_pair(y[k], other[k], lane & offset);
  }
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < VEC; ++k) y[k] = mul_rn(y[k], kHadamardScale), amax = fmaxf(amax, fabsf(y[k]));
  float most[1] = {group_max<32>(amax)};
  if constexpr (kLanes > 32) {
    float other[1];
    partner_values<kLanes, 1>(most, other, lane, 32, row, 3 * kIndexerDim / 2);
    most[0] = fmaxf(most[0], other[0]);
  }
  const float scale = indexer_scale(most[0]), inv = reciprocal_rn(scale);
  if constexpr (VEC == 4) {
    *reinterpret_cast<uint32_t*>(o.data + ch) = fp8_e4m3x2(mul_rn(y[0], inv), mul_rn(y[1], inv)) |
                                                (fp8_e4m3x2(mul_rn(y[2], inv), mul_rn(y[3], inv)) << 16);
  } else {
    *reinterpret_cast<uint16_t*>(o.data + ch) = (uint16_t)fp8_e4m3x2(mul_rn(y[0], inv), mul_rn(y[1], inv));
  }
  if (ch == 0) *reinterpret_cast<float*>(o.scale) = scale;
}

#endif

}  // namespace dsa
