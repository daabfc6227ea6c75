// The c4 plans (docs/spec.md, "c4 plans"): a step's decode records, or an extend's compress and write records,
// built from the engine's tables in one launch; the host backend beside them; the entry points (check, then host
// or device). The arithmetic of each record is c4_plan_math.h's, on both backends.
#include <algorithm>

#include "c4_plan_math.h"
#include "cuda_launch.cuh"
#include "launch_policy.h"

DSA_DECLARE_STRUCT(DSA_STRUCT_C4_PLAN_PARAMS, dsa_c4_plan_params);

namespace dsa {
namespace {

__device__ __forceinline__ void put(dsa_c4_decode_record* at, const dsa_c4_decode_record& r) {
  *reinterpret_cast<int4*>(at) = make_int4((int)r.seq_len, r.write_row, r.previous_group, r.current_group);
}
__device__ __forceinline__ void put(dsa_c4_compress_record* at, const dsa_c4_compress_record& r) {
  *reinterpret_cast<int4*>(at) = make_int4((int)r.seq_len, (int)((uint32_t)r.ragged_id | (uint32_t)r.ring_rows << 16),
                                           r.previous_group, r.current_group);
}
__device__ __forceinline__ void put(dsa_c4_write_record* at, const dsa_c4_write_record& r) {
  *reinterpret_cast<int2*>(at) = make_int2((int)r.ragged_id, r.ring_row);
}

__global__ void __launch_bounds__(kC4PlanThreads) c4_plan_decode_kernel(const __grid_constant__ dsa_c4_plan_params p) {
  const int64_t first = (int64_t)blockIdx.x * kC4PlanThreads + threadIdx.x;
  if (first >= p.batch_size) return;  // a thread with no request reads nothing the launch before wrote
  wait_for_producers();
  allow_dependents();
  for (int64_t b = first; b < p.batch_size; b += (int64_t)gridDim.x * kC4PlanThreads)
    put(p.plan_d + b, plan_decode_record(p, b));
}

// A run of requests' ragged rows, compress records and write records.
struct PlanCounts {
  int32_t rows, closes, kept;
  __device__ __forceinline__ PlanCounts& operator+=(const PlanCounts& o) {
    rows += o.rows, closes += o.closes, kept += o.kept;
    return *this;
  }
};

__device__ __forceinline__ PlanCounts shfl_up(const PlanCounts& x, int d) {
  return PlanCounts{__shfl_up_sync(0xFFFFFFFFu, x.rows, d), __shfl_up_sync(0xFFFFFFFFu, x.closes, d),
                    __shfl_up_sync(0xFFFFFFFFu, x.kept, d)};
}

// The inclusive prefix of x over a warp.
__device__ __forceinline__ PlanCounts warp_prefix(PlanCounts x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const PlanCounts y = shfl_up(x, d);
    if (lane >= d) x += y;
  }
  return x;
}

// The exclusive prefix of x over the block (kC4PlanExtendThreads threads) and the block's total; every thread
// calls it. `warps`: kC4PlanExtendThreads / 32 + 1 entries of shared memory, free again when it returns.
__device__ __forceinline__ PlanCounts block_prefix(const PlanCounts& x, PlanCounts* warps, PlanCounts* total) {
  constexpr int kWarps = kC4PlanExtendThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const PlanCounts in = warp_prefix(x);
  if (lane == 31) warps[warp] = in;
  __syncthreads();
  if (warp == 0) {
    const PlanCounts w = lane < kWarps ? warps[lane] : PlanCounts{0, 0, 0};
    const PlanCounts wi = warp_prefix(w);
    if (lane < kWarps) warps[lane] = PlanCounts{wi.rows - w.rows, wi.closes - w.closes, wi.kept - w.kept};
    if (lane == kWarps - 1) warps[kWarps] = wi;
  }
  __syncthreads();
  const PlanCounts before = warps[warp];
  *total = warps[kWarps];
  __syncthreads();
  return PlanCounts{before.rows + in.rows - x.rows, before.closes + in.closes - x.closes,
                    before.kept + in.kept - x.kept};
}

// Each block writes the records of its kC4PlanExtendRows ragged rows. Every block counts the rows and records
// of every request (kC4PlanRequestsPerThread requests a thread, a chunk of the block's at a time; the counts
// are c4_plan_math.h's closed forms, so no block waits for another), keeps the chunk's ends and first record
// numbers in shared memory, and numbers each of its rows' records from its request's first ones. Every list
// is in request and position order, then padding to num_tokens rows: the block writes the padding rows that
// fall among its own.
__global__ void __launch_bounds__(kC4PlanExtendThreads)
    c4_plan_extend_kernel(const __grid_constant__ dsa_c4_plan_params p) {
  constexpr int kThreads = kC4PlanExtendThreads, kPer = kC4PlanRequestsPerThread, kChunk = kThreads * kPer;
  static_assert(kThreads % 32 == 0 && kThreads / 32 <= 32, "block_prefix's layout");
  __shared__ int32_t ends[kChunk], first_c[kChunk], first_w[kChunk];
  __shared__ PlanCounts warps[kThreads / 32 + 1];
  __shared__ int32_t full[3];  // the records of the first n rows, once a request reaches row n: {found, c, w}
  wait_for_producers();
  allow_dependents();
  const int tid = threadIdx.x;
  const int64_t n = p.num_tokens;
  const int64_t r0 = (int64_t)blockIdx.x * kC4PlanExtendRows, r1 = std::min<int64_t>(n, r0 + kC4PlanExtendRows);
  if (tid == 0) full[0] = 0;
  int64_t start = 0, nc = 0, nw = 0;  // the chunk's first row and the records before it
  for (int64_t c0 = 0; c0 < p.batch_size && start < n; c0 += kChunk) {
    const int count = (int)std::min<int64_t>(kChunk, p.batch_size - c0);
    PlanCounts mine[kPer], sum{0, 0, 0};
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int at = tid * kPer + i;
      mine[i] = PlanCounts{0, 0, 0};
      if (at >= count) continue;
      const PlanRequest r = plan_request(p, c0 + at);
      const int64_t e = plan_extent(p, c0 + at);
      mine[i] = PlanCounts{(int32_t)e, (int32_t)plan_closes_before(r, e), (int32_t)plan_kept_before(p, r, e)};
      sum += mine[i];
    }
    PlanCounts total, at = block_prefix(sum, warps, &total);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int k = tid * kPer + i;
      if (k >= count) continue;
      const int64_t s = start + at.rows;
      ends[k] = (int32_t)std::min<int64_t>(s + mine[i].rows, n);
      first_c[k] = (int32_t)(nc + at.closes), first_w[k] = (int32_t)(nw + at.kept);
      if (s < n && s + mine[i].rows >= n) {  // the request holding row n - 1: the lists' lengths
        const PlanRequest r = plan_request(p, c0 + k);
        full[0] = 1, full[1] = first_c[k] + (int32_t)plan_closes_before(r, n - s);
        full[2] = first_w[k] + (int32_t)plan_kept_before(p, r, n - s);
      }
      at += mine[i];
    }
    __syncthreads();
    const int64_t last = ends[count - 1];
    for (int64_t t = std::max(start, r0) + tid; t < std::min(last, r1); t += kThreads) {
      int lo = 0, hi = count - 1;  // the first request whose end lies past t
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (ends[mid] > t) hi = mid; else lo = mid + 1;
      }
      const int64_t b = c0 + lo, j = t - (lo > 0 ? ends[lo - 1] : start);
      const PlanRequest r = plan_request(p, b);
      const PlanToken k = plan_token(p, r, t, b, j);
      if (k.closes) put(p.plan_c + first_c[lo] + plan_closes_before(r, j), k.compress);
      if (k.kept) put(p.plan_w + first_w[lo] + plan_kept_before(p, r, j), k.write);
    }
    start = last, nc += total.closes, nw += total.kept;
    __syncthreads();  // the next chunk rewrites ends
  }
  __syncthreads();
  const int64_t all_c = full[0] ? full[1] : nc, all_w = full[0] ? full[2] : nw;
  for (int64_t r = std::max(all_c, r0) + tid; r < r1; r += kThreads) put(p.plan_c + r, padding_compress());
  for (int64_t r = std::max(all_w, r0) + tid; r < r1; r += kThreads) put(p.plan_w + r, padding_write());
}

struct PlanChecked {
  bool nothing = false;
};

dsa_status check_plan(const dsa_c4_plan_params& p, bool extend, const char* op, PlanChecked* checked) {
  if (p.batch_size < 0 || p.batch_size > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size is %lld; expected 0..2^31-1", op, (long long)p.batch_size);
  if (p.swa_page_size < 1 || p.ring_size < 1)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: swa_page_size is %d and ring_size %d; both must be >= 1", op,
                p.swa_page_size, p.ring_size);
  if ((p.use_req_ring | p.seq_lens_int32 | p.extend_lens_int32) & ~1)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: use_req_ring, seq_lens_int32 and extend_lens_int32 must be 0 or 1 "
                "(got %d, %d, %d)", op, p.use_req_ring, p.seq_lens_int32, p.extend_lens_int32);
  if (p.token_rows < 0 || p.token_cols < 0 || p.token_stride < 0 || p.num_full < 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: token_rows, token_cols, token_stride and num_full must be >= 0 (got "
                "%lld, %lld, %lld, %lld)", op, (long long)p.token_rows, (long long)p.token_cols,
                (long long)p.token_stride, (long long)p.num_full);
  if (!p.use_req_ring && ((p.token_rows > 0 && p.token_cols > 0 && p.req_to_token == nullptr) ||
                          (p.num_full > 0 && p.full_to_state == nullptr)))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: a page-scoped plan reads req_to_token and full_to_state: they must "
                "be non-null when not empty", op);
  if (p.batch_size > 0 && (p.req_pool_indices == nullptr || p.seq_lens == nullptr ||
                           (extend && p.extend_lens == nullptr) || (!extend && p.plan_d == nullptr)))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: req_pool_indices, seq_lens%s must be non-null when batch_size > 0",
                op, extend ? " and extend_lens" : " and plan_d");
  if (extend && (p.num_tokens < 0 || p.num_tokens > 65536))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_tokens is %lld; expected 0..65536 (16-bit ragged rows)", op,
                (long long)p.num_tokens);
  if (extend && p.num_tokens > 0 && (p.plan_c == nullptr || p.plan_w == nullptr))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: plan_c and plan_w must be non-null when num_tokens > 0", op);
  const int lengths = p.seq_lens_int32 ? 4 : 8, extends = p.extend_lens_int32 ? 4 : 8;
  if (!aligned(p.req_pool_indices, 8) || !aligned(p.req_to_token, 4) || !aligned(p.full_to_state, 8) ||
      !aligned(p.seq_lens, lengths) || !aligned(p.extend_lens, extends))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: every table must be aligned to its element size", op);
  if (!aligned(p.plan_d, 16) || !aligned(p.plan_c, 16) || !aligned(p.plan_w, 8))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: plan_d and plan_c must be 16-byte aligned, plan_w 8-byte", op);
  checked->nothing = extend ? p.num_tokens == 0 : p.batch_size == 0;
  return DSA_STATUS_OK;
}

// The host backend: the same records, one request or ragged row at a time.
void host_plan_decode(const dsa_c4_plan_params& p) {
  for (int64_t b = 0; b < p.batch_size; ++b) p.plan_d[b] = plan_decode_record(p, b);
}

// Records numbered as the device numbers them: each request's first ones from the closed-form counts of the
// requests before it, each row's from its request's.
void host_plan_extend(const dsa_c4_plan_params& p) {
  const int64_t n = p.num_tokens;
  int64_t start = 0, nc = 0, nw = 0, all_c = -1, all_w = -1;
  for (int64_t b = 0; b < p.batch_size && start < n; ++b) {
    const PlanRequest r = plan_request(p, b);
    const int64_t e = plan_extent(p, b), end = std::min(start + e, n);
    for (int64_t t = start; t < end; ++t) {
      const PlanToken k = plan_token(p, r, t, b, t - start);
      if (k.closes) p.plan_c[nc + plan_closes_before(r, t - start)] = k.compress;
      if (k.kept) p.plan_w[nw + plan_kept_before(p, r, t - start)] = k.write;
    }
    if (start + e >= n) all_c = nc + plan_closes_before(r, n - start), all_w = nw + plan_kept_before(p, r, n - start);
    nc += plan_closes_before(r, e), nw += plan_kept_before(p, r, e), start = end;
  }
  std::fill(p.plan_c + (all_c >= 0 ? all_c : nc), p.plan_c + n, padding_compress());
  std::fill(p.plan_w + (all_w >= 0 ? all_w : nw), p.plan_w + n, padding_write());
}

unsigned launch_mode(const dsa_c4_plan_params& p) { return (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u; }

dsa_status plan_decode_device(const dsa_c4_plan_params& p, const PlanChecked&, int, cudaStream_t s, const char* op) {
  const dim3 grid((unsigned)c4_plan_decode_blocks(p.batch_size));
  return launch_status(launch(c4_plan_decode_kernel, grid, dim3(kC4PlanThreads), s, launch_mode(p), p), op);
}

dsa_status plan_extend_device(const dsa_c4_plan_params& p, const PlanChecked&, int, cudaStream_t s, const char* op) {
  const dim3 grid((unsigned)c4_plan_extend_blocks(p.num_tokens));
  return launch_status(launch(c4_plan_extend_kernel, grid, dim3(kC4PlanExtendThreads), s, launch_mode(p), p), op);
}

}  // namespace
}  // namespace dsa

extern "C" dsa_status dsa_c4_plan_decode(const dsa_c4_plan_params* params, void* stream) {
  using namespace dsa;
  return dispatch<PlanChecked>(
      params, stream, "dsa_c4_plan_decode",
      [](const dsa_c4_plan_params& p, const char* op, PlanChecked* c) { return check_plan(p, false, op, c); },
      host_plan_decode, plan_decode_device);
}

extern "C" dsa_status dsa_c4_plan_extend(const dsa_c4_plan_params* params, void* stream) {
  using namespace dsa;
  return dispatch<PlanChecked>(
      params, stream, "dsa_c4_plan_extend",
      [](const dsa_c4_plan_params& p, const char* op, PlanChecked* c) { return check_plan(p, true, op, c); },
      host_plan_extend, plan_extend_device);
}
