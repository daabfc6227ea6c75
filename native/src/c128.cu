// Online c128 compression (SPEC 1): decode and prefill, CUDA kernels and the host backend.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "c128_math.h"
#include "common.h"
#include "cuda_launch.cuh"

namespace dsa {
namespace {

constexpr int kDecodeThreads = 128;
constexpr int kPrefillWarps = 8;
constexpr int kPrefillThreads = kPrefillWarps * 32;
constexpr int kPrefillBlocksPerSm = 4;

// VEC consecutive channels per thread, moved with one VEC*4-byte access.
template <int VEC>
struct Lanes {
  float v[VEC];
};
template <int VEC>
__device__ __forceinline__ Lanes<VEC> load_lanes(const float* p) {
  Lanes<VEC> r;
  if constexpr (VEC == 4) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(p));
    r.v[0] = x.x, r.v[1] = x.y, r.v[2] = x.z, r.v[3] = x.w;
  } else {
    const float2 x = __ldg(reinterpret_cast<const float2*>(p));
    r.v[0] = x.x, r.v[1] = x.y;
  }
  return r;
}
// State may be written by this launch (another segment's slot), so it bypasses the read-only path.
template <int VEC>
__device__ __forceinline__ Lanes<VEC> load_state(const float* p) {
  Lanes<VEC> r;
  if constexpr (VEC == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p);
    r.v[0] = x.x, r.v[1] = x.y, r.v[2] = x.z, r.v[3] = x.w;
  } else {
    const float2 x = *reinterpret_cast<const float2*>(p);
    r.v[0] = x.x, r.v[1] = x.y;
  }
  return r;
}
template <int VEC>
__device__ __forceinline__ void store_lanes(float* p, const Lanes<VEC>& r) {
  if constexpr (VEC == 4)
    *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  else
    *reinterpret_cast<float2*>(p) = make_float2(r.v[0], r.v[1]);
}

__device__ __forceinline__ void count_error(uint32_t* error_count) {
  if (error_count != nullptr) atomicAdd(error_count, 1u);
}

// ---------------------------------------------------------------------------------------------
// Decode: D / VEC threads per request, one token each.

template <int VEC>
__global__ void __launch_bounds__(kDecodeThreads)
    c128_decode_kernel(const __grid_constant__ dsa_c128_decode_params p) {
  wait_for_producers();
  const int D = p.head_dim;
  const int lanes_per_request = D / VEC;
  const int64_t thread = (int64_t)blockIdx.x * kDecodeThreads + threadIdx.x;
  const int64_t b = thread / lanes_per_request;
  if (b >= p.batch_size) return;
  const int ch = (int)(thread - b * lanes_per_request) * VEC;
  const int32_t seq_len = __ldg(p.seq_lens + b);
  const int32_t slot = __ldg(p.indices + b);
  allow_dependents();
  if (seq_len <= 0) return;  // padding row of a CUDA-graph batch
  if (!slot_ok(slot, p.num_slots)) {
    if (ch == 0) count_error(p.error_count);
    return;
  }
  const int c = (seq_len - 1) % DSA_CHUNK;
  const float* token = p.kv_score + b * 2 * D + ch;
  float* state = p.state + (int64_t)slot * 3 * D + ch;
  const Lanes<VEC> kv = load_lanes<VEC>(token), score = load_lanes<VEC>(token + D);
  const Lanes<VEC> bias = load_lanes<VEC>(p.ape + (int64_t)c * D + ch);
  Lanes<VEC> m, s, k;
  if (c != 0) m = load_state<VEC>(state), s = load_state<VEC>(state + D), k = load_state<VEC>(state + 2 * D);
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const float t[1] = {to_log2(score.v[i] + bias.v[i])}, v[1] = {kv.v[i]};
    const Partial r = c == 0 ? partial_of(t[0], v[0]) : absorb(from_state(m.v[i], s.v[i], k.v[i]), t, v, 1);
    m.v[i] = state_max(r), s.v[i] = r.sum, k.v[i] = mean_of(r);
  }
  if (c == DSA_CHUNK - 1) {
    store_lanes<VEC>(p.out + b * D + ch, k);
  } else {
    store_lanes<VEC>(state, m);
    store_lanes<VEC>(state + D, s);
    store_lanes<VEC>(state + 2 * D, k);
  }
}

// ---------------------------------------------------------------------------------------------
// Prefill: one work item = one segment x one tile of 32*VEC channels, taken by the 8 warps of a
// block. Warp w folds tokens w, w+8, ... in batches whose loads are all issued before any
// arithmetic (16 floats of kv and score per thread in flight); the 8 partials then merge through
// shared memory. VEC = 2 (64-channel tiles) doubles the items for small plans; VEC = 4 halves
// the load instructions for large ones.
// The compress pass (kWrite = false) only reads state; the write pass is a later launch in the
// same stream. When it directly follows the compress pass (kAfterCompress), it is launched with
// programmatic dependent launch: it starts as soon as the compress pass has passed its own wait
// (so everything written before the compress pass is visible), computes its segments alongside
// it, and waits for the compress pass to complete only before its first state store.

// kBatch tokens of one warp: every load issued before any is used.
template <int VEC, int kBatch>
struct TokenGroup {
  float score[VEC][kBatch];  // biased, base 2
  float kv[VEC][kBatch];
};

template <int VEC, int kBatch>
__device__ __forceinline__ void load_group(TokenGroup<VEC, kBatch>& g, const dsa_c128_prefill_params& p,
                                           int64_t first_row, int first_in_chunk, int ch, int t0, int n) {
  const int D = p.head_dim;
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int j = t0 + u * kPrefillWarps;
    if (j < n) {
      const float* token = p.kv_score + (first_row + j) * 2 * D + ch;
      const Lanes<VEC> x = load_lanes<VEC>(token), t = load_lanes<VEC>(token + D);
      const Lanes<VEC> bias = load_lanes<VEC>(p.ape + (int64_t)(first_in_chunk + j) * D + ch);
#pragma unroll
      for (int i = 0; i < VEC; ++i) g.kv[i][u] = x.v[i], g.score[i][u] = to_log2(t.v[i] + bias.v[i]);
    }
  }
}

template <int VEC, int kBatch>
__device__ __forceinline__ void fold_group(Partial (&part)[VEC], const TokenGroup<VEC, kBatch>& g, int t0, int n) {
  const int count = min(kBatch, (n - t0 + kPrefillWarps - 1) / kPrefillWarps);
#pragma unroll
  for (int i = 0; i < VEC; ++i) part[i] = absorb(part[i], g.score[i], g.kv[i], count);
}

// Measured on the H200 (1 x 32K / 1 x 128K tokens, fraction of copy bandwidth): 4 tokens per
// batch at 4 blocks per SM 0.84 / 0.93; 8 tokens at 2 blocks 0.63 / 0.67; two 4-token batches in
// flight at 2 blocks 0.70 / 0.74; 2 tokens at 6 blocks (spilling) 0.71 / 0.85. Occupancy wins.
template <bool kWrite, int VEC, bool kAfterCompress>
__global__ void __launch_bounds__(kPrefillThreads, kPrefillBlocksPerSm)
    c128_prefill_kernel(const __grid_constant__ dsa_c128_prefill_params p) {
  constexpr int kTile = 32 * VEC;
  constexpr int kBatch = 16 / VEC;
  __shared__ float part_max[kPrefillWarps][kTile];
  __shared__ float part_sum[kPrefillWarps][kTile];
  __shared__ float part_acc[kPrefillWarps][kTile];

  if constexpr (!kAfterCompress) wait_for_producers();
  if constexpr (!kWrite) allow_dependents();
  const int D = p.head_dim;
  const int tiles = D / kTile;
  const dsa_segment* list = kWrite ? p.write : p.compress;
  int64_t count = kWrite ? p.write_capacity : p.compress_capacity;
  if (p.counts != nullptr) count = max((int64_t)0, min(count, p.counts[kWrite ? 1 : 0]));
  const int32_t* load_indices = p.load_indices != nullptr ? p.load_indices : p.indices;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t items = count * tiles;

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t r = item / tiles;
    const int tile = (int)(item - r * tiles);
    const dsa_segment seg = list[r];
    if (is_sentinel(seg)) continue;
    const bool report = tile == 0 && threadIdx.x == 0;
    if (!segment_ok(seg, !kWrite, p.num_tokens, p.batch_size)) {
      if (report) count_error(p.error_count);
      continue;
    }
    const int n = (int)seg.window_len;
    const int first_in_chunk = (int)(seg.position % DSA_CHUNK) - n + 1;
    const bool continues = first_in_chunk != 0;
    const int32_t load_slot = continues ? load_indices[seg.batch_id] : 0;
    const int32_t store_slot = kWrite ? p.indices[seg.batch_id] : 0;

    const int ch = tile * kTile + lane * VEC;
    const int64_t first_row = (int64_t)seg.ragged_id - n + 1;
    Partial part[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) part[i] = Partial{-INFINITY, 0.0f, 0.0f};
    for (int t0 = warp; t0 < n; t0 += kPrefillWarps * kBatch) {
      TokenGroup<VEC, kBatch> g;
      load_group(g, p, first_row, first_in_chunk, ch, t0, n);
      fold_group(part, g, t0, n);
    }
    if ((continues && !slot_ok(load_slot, p.num_slots)) || (kWrite && !slot_ok(store_slot, p.num_slots))) {
      if (report) count_error(p.error_count);
      continue;  // uniform: every thread read the same slots
    }
    const bool merger = threadIdx.x < kTile;
    const int c = tile * kTile + threadIdx.x;
    float prior_m = 0.0f, prior_s = 0.0f, prior_k = 0.0f;
    if (continues && merger) {
      const float* prior = p.state + (int64_t)load_slot * 3 * D + c;
      prior_m = prior[0], prior_s = prior[D], prior_k = prior[2 * D];
    }
    if (warp < n) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        part_max[warp][lane * VEC + i] = part[i].max;
        part_sum[warp][lane * VEC + i] = part[i].sum;
        part_acc[warp][lane * VEC + i] = part[i].acc;
      }
    }
    __syncthreads();
    if constexpr (kAfterCompress) wait_for_producers();  // every compress-pass read of state is done
    if (merger) {
      const int t = threadIdx.x;
      Partial total{part_max[0][t], part_sum[0][t], part_acc[0][t]};
      for (int w = 1; w < min(kPrefillWarps, n); ++w)
        total = merge(total, Partial{part_max[w][t], part_sum[w][t], part_acc[w][t]});
      if (continues) total = merge(from_state(prior_m, prior_s, prior_k), total);
      if (kWrite) {
        float* state = p.state + (int64_t)store_slot * 3 * D + c;
        state[0] = state_max(total);
        state[D] = total.sum;
        state[2 * D] = mean_of(total);
      } else {
        p.out[(int64_t)seg.ragged_id * D + c] = mean_of(total);
      }
    }
    __syncthreads();
  }
  if constexpr (kWrite) allow_dependents();
}

// ---------------------------------------------------------------------------------------------
// Host backend: the same arithmetic, one token at a time, compress list before write list.

void host_decode(const dsa_c128_decode_params& p) {
  const int D = p.head_dim;
  for (int64_t b = 0; b < p.batch_size; ++b) {
    const int32_t seq_len = p.seq_lens[b], slot = p.indices[b];
    if (seq_len <= 0) continue;
    if (!slot_ok(slot, p.num_slots)) {
      if (p.error_count) ++*p.error_count;
      continue;
    }
    const int c = (seq_len - 1) % DSA_CHUNK;
    const float* token = p.kv_score + b * 2 * D;
    float* state = p.state + (int64_t)slot * 3 * D;
    for (int d = 0; d < D; ++d) {
      const float t[1] = {to_log2(token[D + d] + p.ape[(int64_t)c * D + d])}, v[1] = {token[d]};
      const Partial r = c == 0 ? partial_of(t[0], v[0])
                               : absorb(from_state(state[d], state[D + d], state[2 * D + d]), t, v, 1);
      if (c == DSA_CHUNK - 1) {
        p.out[b * D + d] = mean_of(r);
      } else {
        state[d] = state_max(r), state[D + d] = r.sum, state[2 * D + d] = mean_of(r);
      }
    }
  }
}

void host_prefill_pass(const dsa_c128_prefill_params& p, bool write_pass, std::vector<Partial>& scratch) {
  const int D = p.head_dim;
  const dsa_segment* list = write_pass ? p.write : p.compress;
  int64_t count = write_pass ? p.write_capacity : p.compress_capacity;
  if (p.counts != nullptr) count = std::max<int64_t>(0, std::min(count, p.counts[write_pass ? 1 : 0]));
  const int32_t* load_indices = p.load_indices != nullptr ? p.load_indices : p.indices;
  for (int64_t r = 0; r < count; ++r) {
    const dsa_segment seg = list[r];
    if (is_sentinel(seg)) continue;
    if (!segment_ok(seg, !write_pass, p.num_tokens, p.batch_size)) {
      if (p.error_count) ++*p.error_count;
      continue;
    }
    const int n = (int)seg.window_len;
    const int first_in_chunk = (int)(seg.position % DSA_CHUNK) - n + 1;
    const bool continues = first_in_chunk != 0;
    const int32_t load_slot = continues ? load_indices[seg.batch_id] : 0;
    const int32_t store_slot = write_pass ? p.indices[seg.batch_id] : 0;
    if ((continues && !slot_ok(load_slot, p.num_slots)) || (write_pass && !slot_ok(store_slot, p.num_slots))) {
      if (p.error_count) ++*p.error_count;
      continue;
    }
    const int64_t first_row = (int64_t)seg.ragged_id - n + 1;
    std::vector<Partial>& total = scratch;
    total.assign(D, Partial{-INFINITY, 0.0f, 0.0f});
    for (int j = 0; j < n; ++j) {  // tokens outer, channels inner: rows are read in order
      const float* token = p.kv_score + (first_row + j) * 2 * D;
      const float* bias = p.ape + (int64_t)(first_in_chunk + j) * D;
      for (int d = 0; d < D; ++d) {
        const float t[1] = {to_log2(token[D + d] + bias[d])}, v[1] = {token[d]};
        total[d] = absorb(total[d], t, v, 1);
      }
    }
    for (int d = 0; d < D; ++d) {
      Partial result = total[d];
      if (continues) {
        const float* prior = p.state + (int64_t)load_slot * 3 * D + d;
        result = merge(from_state(prior[0], prior[D], prior[2 * D]), result);
      }
      if (write_pass) {
        float* state = p.state + (int64_t)store_slot * 3 * D + d;
        state[0] = state_max(result), state[D] = result.sum, state[2 * D] = mean_of(result);
      } else {
        p.out[(int64_t)seg.ragged_id * D + d] = mean_of(result);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Argument checks shared by both ops.

bool aligned(const void* ptr, int bytes) { return ((uintptr_t)ptr % bytes) == 0; }

// Channels per thread: 4 when D and every float buffer allow 16-byte accesses, else 2.
template <typename P>
dsa_status pick_vector_width(const P& p, const char* op, int* vec) {
  const void* buffers[] = {p.state, p.kv_score, p.out, p.ape};
  bool by16 = p.head_dim % 128 == 0, by8 = true;
  for (const void* b : buffers) by16 = by16 && aligned(b, 16), by8 = by8 && aligned(b, 8);
  if (!by8)
    return fail(DSA_STATUS_INVALID_ARGUMENT,
                "%s: state, kv_score, out and ape must be 8-byte aligned float32 buffers", op);
  *vec = by16 ? 4 : 2;
  return DSA_STATUS_OK;
}

dsa_status check_common(int32_t head_dim, int64_t num_slots, const float* state, const float* ape,
                        const int32_t* indices, const char* op) {
  if (head_dim <= 0 || head_dim % 64 != 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: head_dim is %d; expected a positive multiple of 64",
                op, head_dim);
  if (num_slots <= 0 || num_slots > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_slots is %lld; expected 1..%d", op,
                (long long)num_slots, INT32_MAX);
  if (state == nullptr || ape == nullptr || indices == nullptr)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: state, ape and indices must be non-null", op);
  return DSA_STATUS_OK;
}

}  // namespace
}  // namespace dsa

extern "C" dsa_status dsa_c128_decode(const dsa_c128_decode_params* params, void* stream) {
  using namespace dsa;
  const char* op = "dsa_c128_decode";
  DSA_TRY(check_struct(params, op));
  const dsa_c128_decode_params& p = *params;
  if (p.batch_size < 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size is %lld; expected >= 0", op, (long long)p.batch_size);
  if (p.batch_size == 0) return ok();
  DSA_TRY(check_common(p.head_dim, p.num_slots, p.state, p.ape, p.indices, op));
  if (p.kv_score == nullptr || p.out == nullptr || p.seq_lens == nullptr)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: kv_score, out and seq_lens must be non-null", op);
  int vec = 0;
  DSA_TRY(pick_vector_width(p, op, &vec));
  if (p.device == DSA_DEVICE_HOST) {
    host_decode(p);
    return ok();
  }
  int sms = 0;
  DSA_TRY(check_device(p.device, op, &sms));
  const int64_t threads = p.batch_size * (p.head_dim / vec);
  const int64_t blocks = (threads + kDecodeThreads - 1) / kDecodeThreads;
  if (blocks > INT32_MAX) return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size too large", op);
  DeviceGuard guard(p.device);
  const bool pdl = p.flags & DSA_FLAG_PDL;
  const cudaError_t err =
      vec == 4 ? launch(c128_decode_kernel<4>, (unsigned)blocks, kDecodeThreads, (cudaStream_t)stream, pdl, p)
               : launch(c128_decode_kernel<2>, (unsigned)blocks, kDecodeThreads, (cudaStream_t)stream, pdl, p);
  DSA_TRY(launch_status(err, op));
  return ok();
}

extern "C" dsa_status dsa_c128_prefill(const dsa_c128_prefill_params* params, void* stream) {
  using namespace dsa;
  const char* op = "dsa_c128_prefill";
  DSA_TRY(check_struct(params, op));
  const dsa_c128_prefill_params& p = *params;
  if (p.batch_size < 0 || p.num_tokens < 0 || p.compress_capacity < 0 || p.write_capacity < 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT,
                "%s: batch_size, num_tokens, compress_capacity and write_capacity must be >= 0 "
                "(got %lld, %lld, %lld, %lld)", op, (long long)p.batch_size, (long long)p.num_tokens,
                (long long)p.compress_capacity, (long long)p.write_capacity);
  if ((p.compress_capacity > 0 && p.compress == nullptr) || (p.write_capacity > 0 && p.write == nullptr))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: a record list with non-zero capacity is null", op);
  if (p.compress_capacity + p.write_capacity == 0 || p.batch_size == 0 || p.num_tokens == 0) return ok();
  DSA_TRY(check_common(p.head_dim, p.num_slots, p.state, p.ape, p.indices, op));
  if (p.kv_score == nullptr || p.out == nullptr)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: kv_score and out must be non-null", op);
  int vec = 0;
  DSA_TRY(pick_vector_width(p, op, &vec));
  if (p.device == DSA_DEVICE_HOST) {
    std::vector<Partial> scratch;
    host_prefill_pass(p, false, scratch);
    host_prefill_pass(p, true, scratch);
    return ok();
  }
  int sms = 0;
  DSA_TRY(check_device(p.device, op, &sms));
  DeviceGuard guard(p.device);
  // 128-channel tiles when the plan has enough items to fill the GPU with them, else 64.
  const bool wide = p.head_dim % 128 == 0 && vec == 4 &&
                    std::max(p.compress_capacity, p.write_capacity) * (p.head_dim / 128) >= (int64_t)sms * kPrefillBlocksPerSm;
  const int tiles = p.head_dim / (wide ? 128 : 64);
  const bool pdl = p.flags & DSA_FLAG_PDL;
  const int64_t resident = (int64_t)sms * kPrefillBlocksPerSm;
  cudaStream_t s = (cudaStream_t)stream;
  if (p.compress_capacity > 0) {
    const unsigned grid = (unsigned)std::min(p.compress_capacity * tiles, resident);
    auto kernel = wide ? c128_prefill_kernel<false, 4, false> : c128_prefill_kernel<false, 2, false>;
    DSA_TRY(launch_status(launch(kernel, grid, kPrefillThreads, s, pdl, p), op));
  }
  if (p.write_capacity > 0) {
    const unsigned grid = (unsigned)std::min(p.write_capacity * tiles, resident);
    const bool overlap = p.compress_capacity > 0;
    auto kernel = overlap ? (wide ? c128_prefill_kernel<true, 4, true> : c128_prefill_kernel<true, 2, true>)
                          : (wide ? c128_prefill_kernel<true, 4, false> : c128_prefill_kernel<true, 2, false>);
    DSA_TRY(launch_status(launch(kernel, grid, kPrefillThreads, s, overlap || pdl, p), op));
  }
  return ok();
}
