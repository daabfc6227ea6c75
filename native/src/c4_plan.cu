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
  wait_for_producers();
  allow_dependents();
  for (int64_t b = (int64_t)blockIdx.x * kC4PlanThreads + threadIdx.x; b < p.batch_size;
       b += (int64_t)gridDim.x * kC4PlanThreads)
    put(p.plan_d + b, plan_decode_record(p, b));
}

// The exclusive prefix sum of x over the block (kC4PlanExtendThreads threads) and the block's total; every
// thread calls it. `warps`: 33 ints of shared memory, free again when it returns.
__device__ __forceinline__ int32_t block_prefix(int32_t x, int32_t* warps, int32_t* total) {
  constexpr int kWarps = kC4PlanExtendThreads / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int32_t in = x;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int32_t y = __shfl_up_sync(0xFFFFFFFFu, in, d);
    if (lane >= d) in += y;
  }
  if (lane == 31) warps[warp] = in;
  __syncthreads();
  if (warp == 0) {
    const int32_t w = lane < kWarps ? warps[lane] : 0;
    int32_t wi = w;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t y = __shfl_up_sync(0xFFFFFFFFu, wi, d);
      if (lane >= d) wi += y;
    }
    warps[lane] = wi - w;
    if (lane == 31) warps[32] = wi;
  }
  __syncthreads();
  const int32_t before = warps[warp] + in - x;
  *total = warps[32];
  __syncthreads();
  return before;
}

// One block walks the ragged rows in order, kC4PlanExtendThreads requests' ends at a time (the rows their
// extends cover, clipped to num_tokens); each row finds its request among them by binary search, and the
// records are numbered by a running count over the rows. Then the padding rows.
__global__ void __launch_bounds__(kC4PlanExtendThreads)
    c4_plan_extend_kernel(const __grid_constant__ dsa_c4_plan_params p) {
  constexpr int kThreads = kC4PlanExtendThreads, kPer = kC4PlanTokensPerThread;
  static_assert(kThreads % 32 == 0 && kThreads / 32 <= 32 && kThreads * kPer < 65536,
                "block_prefix's layout; 16-bit counts per pass");
  __shared__ int64_t ends[kThreads];
  __shared__ int32_t warps[33];
  wait_for_producers();
  allow_dependents();
  const int tid = threadIdx.x;
  const int64_t n = p.num_tokens;
  int64_t base = 0, nc = 0, nw = 0;  // first row of this window's requests; records so far
  for (int64_t w0 = 0; w0 < p.batch_size && base < n; w0 += kThreads) {
    const int count = (int)std::min<int64_t>(kThreads, p.batch_size - w0);
    const int32_t extent = tid < count ? (int32_t)plan_extent(p, w0 + tid) : 0;
    int32_t total;
    const int32_t before = block_prefix(extent, warps, &total);
    if (tid < count) ends[tid] = std::min<int64_t>(base + before + extent, n);
    __syncthreads();
    const int64_t last = ends[count - 1];
    for (int64_t t0 = base; t0 < last; t0 += kThreads * kPer) {
      PlanToken k[kPer];
      int32_t found = 0;  // closing rows | kept rows << 16
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int64_t t = t0 + (int64_t)tid * kPer + i;
        k[i].closes = k[i].kept = false;
        if (t >= last) continue;
        int lo = 0, hi = count;  // the first request whose end lies past t
        while (lo < hi) {
          const int mid = (lo + hi) >> 1;
          if (ends[mid] > t) hi = mid; else lo = mid + 1;
        }
        k[i] = plan_token(p, t, w0 + lo, t - (lo > 0 ? ends[lo - 1] : base));
        found += (k[i].closes ? 1 : 0) + (k[i].kept ? 1 << 16 : 0);
      }
      int32_t pass;
      const int32_t at = block_prefix(found, warps, &pass);
      int64_t c = nc + (at & 0xFFFF), w = nw + (at >> 16);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        if (k[i].closes) put(p.plan_c + c++, k[i].compress);
        if (k[i].kept) put(p.plan_w + w++, k[i].write);
      }
      nc += pass & 0xFFFF, nw += pass >> 16;
    }
    base = last;
    __syncthreads();  // the next window rewrites ends
  }
  for (int64_t r = nc + tid; r < n; r += kThreads) put(p.plan_c + r, padding_compress());
  for (int64_t r = nw + tid; r < n; r += kThreads) put(p.plan_w + r, padding_write());
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

void host_plan_extend(const dsa_c4_plan_params& p) {
  const int64_t n = p.num_tokens;
  int64_t start = 0, nc = 0, nw = 0;
  for (int64_t b = 0; b < p.batch_size && start < n; ++b) {
    const int64_t end = std::min(start + plan_extent(p, b), n);
    for (int64_t t = start; t < end; ++t) {
      const PlanToken k = plan_token(p, t, b, t - start);
      if (k.closes) p.plan_c[nc++] = k.compress;
      if (k.kept) p.plan_w[nw++] = k.write;
    }
    start = end;
  }
  std::fill(p.plan_c + nc, p.plan_c + n, padding_compress());
  std::fill(p.plan_w + nw, p.plan_w + n, padding_write());
}

unsigned launch_mode(const dsa_c4_plan_params& p) { return (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u; }

dsa_status plan_decode_device(const dsa_c4_plan_params& p, const PlanChecked&, int, cudaStream_t s, const char* op) {
  const dim3 grid((unsigned)c4_plan_decode_blocks(p.batch_size));
  return launch_status(launch(c4_plan_decode_kernel, grid, dim3(kC4PlanThreads), s, launch_mode(p), p), op);
}

dsa_status plan_extend_device(const dsa_c4_plan_params& p, const PlanChecked&, int, cudaStream_t s, const char* op) {
  return launch_status(launch(c4_plan_extend_kernel, dim3(kC4PlanExtendBlocks), dim3(kC4PlanExtendThreads), s, launch_mode(p), p), op);
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
