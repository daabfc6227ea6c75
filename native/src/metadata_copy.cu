// Fused DSA metadata copy (docs/spec.md, metadata copy): one source set into K destination sets in one launch.
// The host turns the fields into a short list of 2-D row copies ("jobs"); the kernel spreads the
// rows, cut into fixed tiles, over the grid and stores each loaded vector to every destination.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common.h"
#include "cuda_launch.cuh"
#include "launch_policy.h"

DSA_DECLARE_STRUCT(DSA_STRUCT_METADATA_SOURCES, dsa_metadata_sources);
DSA_DECLARE_STRUCT(DSA_STRUCT_METADATA_DESTINATION, dsa_metadata_destination);
DSA_DECLARE_STRUCT(DSA_STRUCT_METADATA_PARAMS, dsa_metadata_copy_params);

namespace dsa {
namespace {

// int32 per tile: `unroll` int4 per thread of a block of `block` threads (the shapes: launch_policy.h).
__host__ __device__ constexpr int64_t tile_elements(int block, int unroll) { return (int64_t)block * 4 * unroll; }
static_assert(tile_elements(kCopyNarrowThreads, kCopyNarrowUnroll) == tile_elements(kCopyThreads, kCopySmallUnroll),
              "narrow blocks take the small tiles");
constexpr int kMaxJobs = 9;

// A job's kernel fields, for plans whose jobs carry kDst destinations: 1, 2 or 3 (the count known
// at compile time, the parameters only as large as they need to be) or 0 (up to
// DSA_MAX_DESTINATIONS, the count read at run time).
template <int kDst>
struct CopyJob {
  static constexpr int kSlots = kDst > 0 ? kDst : DSA_MAX_DESTINATIONS;
  uint32_t div_mul, div_shift;  // row of a local tile: quotient(local, div_mul, div_shift)
  int64_t tiles_per_row;  // ceil(width / tile elements)
  const int32_t* src;
  int64_t src_stride;     // elements between source rows
  int64_t width;          // elements copied per row
  int32_t* dst[kSlots];
  int64_t dst_stride[kSlots];
};

// Kernel parameters live in constant memory, fetched on first use. What routes a block to its job
// (the tile ranges, 32-bit: a launch has fewer than 2^31 tiles) fills the first 48 bytes, which
// share one constant-cache line with the bytes before the parameter space. The job with the most
// tiles, when every row of it is 16-byte aligned at the source and at each destination, is
// repeated at fixed offsets ("direct"): its blocks copy without finding their job or checking
// alignment. Every other block compares its tile with the job boundaries, then reads its job.
// (Finding the job first, then checking alignment, was slower: docs/performance.md.)
template <int kDst>
struct CopyPlan {
  uint32_t first_tile[kMaxJobs + 1];  // job j covers tiles [first_tile[j], first_tile[j + 1])
  uint32_t direct_first, direct_end;  // the direct job's tiles (an empty range when there is none)
  int32_t num_jobs;
  int32_t num_dst;
  CopyJob<kDst> direct;
  CopyJob<kDst> job[kMaxJobs];
  __host__ __device__ int destinations() const { return kDst > 0 ? kDst : num_dst; }
};

// The host's view: the plan with every destination slot, and each job's row count.
struct Jobs {
  CopyPlan<0> plan;
  int64_t rows[kMaxJobs];
};

// A job's fields, and the plan, for a launch whose K destinations are kDst.
template <int kDst>
CopyJob<kDst> job_for(const CopyJob<0>& from, int destinations) {
  CopyJob<kDst> to;
  std::memset(&to, 0, sizeof to);
  to.src = from.src, to.src_stride = from.src_stride, to.width = from.width, to.tiles_per_row = from.tiles_per_row;
  to.div_mul = from.div_mul, to.div_shift = from.div_shift;
  for (int k = 0; k < destinations; ++k) to.dst[k] = from.dst[k], to.dst_stride[k] = from.dst_stride[k];
  return to;
}
template <int kDst>
CopyPlan<kDst> plan_for(const CopyPlan<0>& all) {
  CopyPlan<kDst> p;
  std::memset(&p, 0, sizeof p);
  p.num_jobs = all.num_jobs, p.num_dst = all.num_dst;
  p.direct_first = all.direct_first, p.direct_end = all.direct_end;
  p.direct = job_for<kDst>(all.direct, p.destinations());
  std::memcpy(p.first_tile, all.first_tile, sizeof p.first_tile);
  for (int j = 0; j < all.num_jobs; ++j) p.job[j] = job_for<kDst>(all.job[j], p.destinations());
  return p;
}

// n / d for 32-bit n with d's multiplier and shift from divisor_of (round-up method: the 33-bit sum
// of the high product and n, shifted). A block finds its tile's row with it before its first load;
// the compiled division there (no integer divide instruction: a sequence of dependent steps) cost
// more.
__device__ __forceinline__ uint32_t quotient(uint32_t n, uint32_t mul, uint32_t shift) {
  return (uint32_t)(((uint64_t)__umulhi(mul, n) + n) >> shift);
}

// Multiplier and shift for dividing by d (1 <= d < 2^32): shift = ceil(log2 d),
// mul = floor(2^32 (2^shift - d) / d) + 1.
void divisor_of(uint32_t d, uint32_t* mul, uint32_t* shift) {
  uint32_t l = 0;
  while ((UINT64_C(1) << l) < d) ++l;
  *mul = (uint32_t)((((UINT64_C(1) << 32) * ((UINT64_C(1) << l) - d)) / d) + 1);
  *shift = l;
}

// Copies elements [0, n) of one row slice (n <= one tile) to destinations [k_begin, k_end), with
// 16-byte accesses when the source and those destinations share one alignment (known to be 16
// bytes when kAligned), else with 4-byte accesses.
template <int kBlock, int kUnroll, bool kAligned, int kDst>
__device__ __forceinline__ void copy_span(const CopyJob<kDst>& job, int64_t row, int64_t col, int n,
                                          int k_begin, int k_end) {
  const int32_t* src = job.src + row * job.src_stride + col;
  const uintptr_t misalignment = kAligned ? 0 : (uintptr_t)src & 15;
  bool vectorizable = (misalignment & 3) == 0;
  if (!kAligned)
    for (int k = k_begin; k < k_end; ++k)
      vectorizable &= ((uintptr_t)(job.dst[k] + row * job.dst_stride[k] + col) & 15) == misalignment;
  const int head = kAligned ? 0 : vectorizable ? std::min(n, (int)(((16 - misalignment) & 15) / 4)) : n;
  const int vectors = vectorizable ? (n - head) >> 2 : 0;
  const int tail_begin = head + vectors * 4;

  // Scalar head (or the whole span when not vectorizable) and tail.
  for (int i0 = threadIdx.x; !kAligned && i0 < head; i0 += kBlock * kUnroll) {
    int32_t v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (i0 + u * kBlock < head) v[u] = __ldg(src + i0 + u * kBlock);
    for (int k = k_begin; k < k_end; ++k) {
      int32_t* dst = job.dst[k] + row * job.dst_stride[k] + col;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i0 + u * kBlock < head) dst[i0 + u * kBlock] = v[u];
    }
  }
  if (!vectorizable) return;
  const int4* src4 = reinterpret_cast<const int4*>(src + head);
  for (int i0 = threadIdx.x; i0 < vectors; i0 += kBlock * kUnroll) {
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (i0 + u * kBlock < vectors) v[u] = __ldg(src4 + i0 + u * kBlock);
    for (int k = k_begin; k < k_end; ++k) {
      int4* dst4 = reinterpret_cast<int4*>(job.dst[k] + row * job.dst_stride[k] + col + head);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i0 + u * kBlock < vectors) dst4[i0 + u * kBlock] = v[u];
    }
  }
  const int i = tail_begin + threadIdx.x;
  if (i < n) {
    const int32_t v = __ldg(src + i);
    for (int k = k_begin; k < k_end; ++k) job.dst[k][row * job.dst_stride[k] + col + i] = v;
  }
}

// Copies tile `local` of `job` (its row from the multiplier, its columns from the remainder) to
// destinations [k_begin, k_end). kAligned: the direct job (every row aligned).
template <int kBlock, int kUnroll, bool kAligned, int kDst>
__device__ __forceinline__ void copy_tile(const CopyJob<kDst>& job, uint32_t local, int k_begin, int k_end) {
  constexpr int64_t kTileElements = tile_elements(kBlock, kUnroll);
  const uint32_t row = quotient(local, job.div_mul, job.div_shift);
  const int64_t col = (int64_t)(local - row * (uint32_t)job.tiles_per_row) * kTileElements;
  const int64_t remaining = job.width - col;
  copy_span<kBlock, kUnroll, kAligned>(job, row, col, (int)(remaining < kTileElements ? remaining : kTileElements),
                                       k_begin, k_end);
}

// Each block takes work items of the grid stride: a tile, or with kPerDst a tile and one of its
// kDst destinations (item = tile * kDst + destination).
template <int kBlock, int kUnroll, int kDst, bool kPerDst>
__global__ void __launch_bounds__(kBlock) metadata_copy_kernel(const __grid_constant__ CopyPlan<kDst> plan) {
  wait_for_producers();
  allow_dependents();
  constexpr unsigned kPerTile = kPerDst ? kDst : 1;  // work items per tile
  // The host repeats the total after the last job; per destination only while items <= SMs.
  const uint32_t items = plan.first_tile[kMaxJobs] * kPerTile;
  uint32_t item = blockIdx.x;  // the grid never exceeds the items: no check before the first
  do {
    const uint32_t tile = kPerDst ? item / kPerTile : item;
    const int k_begin = kPerDst ? (int)(item - tile * kPerTile) : 0;
    const int k_end = kPerDst ? k_begin + 1 : plan.destinations();
    if (tile - plan.direct_first < plan.direct_end - plan.direct_first) {  // the direct job (CopyPlan)
      copy_tile<kBlock, kUnroll, true>(plan.direct, tile - plan.direct_first, k_begin, k_end);
      item += gridDim.x;
      continue;
    }
    // The tile's job: compares against every job boundary at fixed parameter offsets, all issued
    // at once (a search loop, or a switch reading the job's fields, was slower).
    int j = 0;
    uint32_t first = 0;
#pragma unroll
    for (int k = 1; k < kMaxJobs; ++k)
      if (plan.first_tile[k] <= tile) j = k, first = plan.first_tile[k];
    copy_tile<kBlock, kUnroll, false>(plan.job[j], tile - first, k_begin, k_end);
    item += gridDim.x;
  } while (item < items);
}

void host_copy(const Jobs& jobs) {
  const CopyPlan<0>& plan = jobs.plan;
  for (int j = 0; j < plan.num_jobs; ++j) {
    const CopyJob<0>& job = plan.job[j];
    for (int64_t r = 0; r < jobs.rows[j]; ++r)
      for (int k = 0; k < plan.num_dst; ++k)
        std::memcpy(job.dst[k] + r * job.dst_stride[k], job.src + r * job.src_stride,
                    (size_t)job.width * sizeof(int32_t));
  }
}

// ---------------------------------------------------------------------------------------------
// Validation and job list.

const char* const kOp = "dsa_metadata_copy";

using DestinationMember = int32_t* dsa_metadata_destination::*;

// One field: which source, which destination member, its copy shape and the capacity it needs.
struct Field {
  const char* name;
  const int32_t* src;
  DestinationMember dst;
  int64_t offset;  // first element copied (1 for the cu_seqlens arrays)
  int64_t rows, width;
  int64_t src_stride;
};

dsa_status check_capacity(int k, const char* name, int64_t have, int64_t need) {
  if (need > have)
    return fail(DSA_STATUS_CAPACITY, "%s: destinations[%d].%s holds %lld elements but %lld are copied",
                kOp, k, name, (long long)have, (long long)need);
  return DSA_STATUS_OK;
}

// Cuts job j's rows into tiles of `elements`, after the tiles of jobs 0..j-1; false when the
// launch would reach 2^31 tiles (each row is at least one: 2^31 rows or 16 TB of full tiles, far
// beyond any batch's metadata).
bool tile_job(Jobs& jobs, int j, int64_t elements) {
  CopyPlan<0>& plan = jobs.plan;
  CopyJob<0>& job = plan.job[j];
  job.tiles_per_row = (job.width + elements - 1) / elements;
  if (jobs.rows[j] >= INT32_MAX / job.tiles_per_row) return false;
  const int64_t end = plan.first_tile[j] + jobs.rows[j] * job.tiles_per_row;
  if (end >= INT32_MAX) return false;
  plan.first_tile[j + 1] = (uint32_t)end;
  return true;
}

// The fields only the kernel reads, for the final tiling: the total repeated in every first_tile
// entry after the last job (the kernel reads it from first_tile[kMaxJobs] and finds a tile's job
// without num_jobs), every job's row multiplier and the direct job.
void set_device_fields(Jobs& jobs) {
  CopyPlan<0>& plan = jobs.plan;
  for (int k = plan.num_jobs + 1; k <= kMaxJobs; ++k) plan.first_tile[k] = plan.first_tile[plan.num_jobs];
  int most = 0;
  for (int j = 0; j < plan.num_jobs; ++j) {
    CopyJob<0>& job = plan.job[j];
    divisor_of((uint32_t)job.tiles_per_row, &job.div_mul, &job.div_shift);  // < 2^31 (tile_job)
    if (plan.first_tile[j + 1] - plan.first_tile[j] > plan.first_tile[most + 1] - plan.first_tile[most]) most = j;
  }
  const CopyJob<0>& job = plan.job[most];
  const bool strided = jobs.rows[most] > 1;  // its strides matter
  bool direct = aligned(job.src, 16) && (!strided || job.src_stride % 4 == 0);
  for (int k = 0; k < plan.num_dst; ++k) direct &= aligned(job.dst[k], 16) && (!strided || job.dst_stride[k] % 4 == 0);
  plan.direct_first = plan.direct_end = 0;
  if (direct) {
    plan.direct = job;
    plan.direct_first = plan.first_tile[most], plan.direct_end = plan.first_tile[most + 1];
  }
}

// Appends a job in small tiles; false when the launch would reach 2^31 tiles.
bool add_job(Jobs& jobs, const int32_t* src, int64_t src_stride, int64_t rows, int64_t width) {
  const int j = jobs.plan.num_jobs++;
  CopyJob<0>& job = jobs.plan.job[j];
  job.src = src;
  job.src_stride = src_stride;
  job.width = width;
  jobs.rows[j] = rows;
  return tile_job(jobs, j, tile_elements(kCopyThreads, kCopySmallUnroll));
}

dsa_status build_plan(const dsa_metadata_copy_params& p, Jobs& jobs) {
  CopyPlan<0>& plan = jobs.plan;
  if (p.mode < DSA_MODE_DECODE || p.mode > DSA_MODE_DRAFT_EXTEND)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: mode is %d; expected 0 (DECODE), 1 (TARGET_VERIFY) or 2 (DRAFT_EXTEND)", kOp, p.mode);
  if (p.num_destinations < 1 || p.num_destinations > DSA_MAX_DESTINATIONS || p.destinations == nullptr)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_destinations is %d; expected 1..%d with a non-null destinations array",
                kOp, p.num_destinations, DSA_MAX_DESTINATIONS);
  const bool decode = p.mode == DSA_MODE_DECODE;
  const int64_t sizes[] = {p.bs, p.page_rows, p.page_width, p.expanded, p.real_cols, p.metadata_size};
  for (int64_t s : sizes)
    if (s < 0)
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: bs, page_rows, page_width, expanded, real_cols and metadata_size must be >= 0", kOp);
  if (decode && p.page_rows != p.bs)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: DECODE copies bs = %lld page-table rows but page_rows is %lld", kOp,
                (long long)p.bs, (long long)p.page_rows);
  const dsa_metadata_sources& s = p.src;
  const bool real = s.real_page_table != nullptr;
  const bool flashmla = s.num_splits != nullptr;
  if (flashmla != (s.flashmla_metadata != nullptr))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: the FlashMLA group needs both src.num_splits and src.flashmla_metadata, or neither", kOp);
  const int64_t n = decode ? p.bs : p.expanded;
  const Field fields[] = {
      {"cache_seqlens", s.cache_seqlens, &dsa_metadata_destination::cache_seqlens, 0, 1, p.bs, 0},
      {"cu_seqlens_k", s.cu_seqlens_k, &dsa_metadata_destination::cu_seqlens_k, 1, 1, p.bs, 0},
      {"page_table", s.page_indices, &dsa_metadata_destination::page_table, 0, p.page_rows, p.page_width, p.page_width},
      {"seqlens_expanded", decode ? nullptr : s.seqlens_expanded, &dsa_metadata_destination::seqlens_expanded, 0, decode ? 0 : 1, p.expanded, 0},
      {"dsa_cache_seqlens", s.dsa_cache_seqlens, &dsa_metadata_destination::dsa_cache_seqlens, 0, 1, n, 0},
      {"dsa_cu_seqlens_k", s.dsa_cu_seqlens_k, &dsa_metadata_destination::dsa_cu_seqlens_k, 1, 1, n, 0},
      {"real_page_table", s.real_page_table, &dsa_metadata_destination::real_page_table, 0, real ? p.page_rows : 0, p.real_cols, p.real_cols},
      {"num_splits", s.num_splits, &dsa_metadata_destination::num_splits, 0, flashmla ? 1 : 0, n + 1, 0},
      {"flashmla_metadata", s.flashmla_metadata, &dsa_metadata_destination::flashmla_metadata, 0, flashmla ? 1 : 0, p.metadata_size, 0},
  };
  std::memset(&jobs, 0, sizeof(jobs));
  plan.num_dst = p.num_destinations;
  for (const Field& f : fields) {
    if (f.rows == 0 || f.width == 0) continue;
    if (f.src == nullptr)
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: src.%s is null but %lld x %lld elements are to be copied", kOp,
                  f.name, (long long)f.rows, (long long)f.width);
    const int job = plan.num_jobs;
    if (!add_job(jobs, f.src + f.offset, f.src_stride, f.rows, f.width))
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: %s is too large to copy in one launch", kOp, f.name);
    for (int k = 0; k < p.num_destinations; ++k) {
      const dsa_metadata_destination& d = p.destinations[k];
      int32_t* dst = d.*(f.dst);
      if (dst == nullptr)
        return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: destinations[%d].%s is null but the field is copied", kOp, k, f.name);
      int64_t stride = 0;
      if (f.dst == &dsa_metadata_destination::page_table) {
        DSA_TRY(check_capacity(k, "page_table rows", d.page_table_rows, f.rows));
        DSA_TRY(check_capacity(k, "page_table columns", d.page_table_cols, f.width));
        if (d.page_table_stride < d.page_table_cols)
          return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: destinations[%d].page_table_stride %lld < page_table_cols %lld", kOp, k,
                      (long long)d.page_table_stride, (long long)d.page_table_cols);
        stride = d.page_table_stride;
      } else if (f.dst == &dsa_metadata_destination::real_page_table) {
        DSA_TRY(check_capacity(k, "real_page_table rows", d.real_page_table_rows, f.rows));
        DSA_TRY(check_capacity(k, "real_page_table columns", d.real_page_table_cols, f.width));
        if (d.real_page_table_stride < d.real_page_table_cols)
          return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: destinations[%d].real_page_table_stride %lld < real_page_table_cols %lld", kOp, k,
                      (long long)d.real_page_table_stride, (long long)d.real_page_table_cols);
        stride = d.real_page_table_stride;
      } else {
        const int64_t have = f.dst == &dsa_metadata_destination::cache_seqlens       ? d.cache_seqlens_len
                             : f.dst == &dsa_metadata_destination::cu_seqlens_k      ? d.cu_seqlens_k_len
                             : f.dst == &dsa_metadata_destination::seqlens_expanded  ? d.seqlens_expanded_len
                             : f.dst == &dsa_metadata_destination::dsa_cache_seqlens ? d.dsa_cache_seqlens_len
                             : f.dst == &dsa_metadata_destination::dsa_cu_seqlens_k  ? d.dsa_cu_seqlens_k_len
                             : f.dst == &dsa_metadata_destination::num_splits        ? d.num_splits_len
                                                                                     : d.flashmla_metadata_len;
        DSA_TRY(check_capacity(k, f.name, have, f.offset + f.width));
      }
      plan.job[job].dst[k] = dst + f.offset;
      plan.job[job].dst_stride[k] = stride;
    }
  }
  return DSA_STATUS_OK;
}

// One launch of `plan` in the form its tiles take (copy_shape).
template <int kDst>
cudaError_t launch_copy(const CopyPlan<kDst>& plan, bool large, int sms, cudaStream_t stream, unsigned mode) {
  const CopyShape shape = copy_shape(plan.first_tile[plan.num_jobs], kDst, large, sms);
  const unsigned grid = (unsigned)shape.grid;
  if constexpr (kDst == 2 || kDst == 3) {
    if (shape.form == kCopyPerDestination)
      return launch(metadata_copy_kernel<kCopyThreads, kCopySmallUnroll, kDst, true>, grid, shape.block, stream, mode,
                    plan);
  }
  if (shape.form == kCopyLarge)
    return launch(metadata_copy_kernel<kCopyThreads, kCopyLargeUnroll, kDst, false>, grid, shape.block, stream, mode,
                  plan);
  if (shape.form == kCopyNarrow)
    return launch(metadata_copy_kernel<kCopyNarrowThreads, kCopyNarrowUnroll, kDst, false>, grid, shape.block, stream,
                  mode, plan);
  return launch(metadata_copy_kernel<kCopyThreads, kCopySmallUnroll, kDst, false>, grid, shape.block, stream, mode,
                plan);
}

// What the check hands on: the copy jobs built from the params.
struct MetadataChecked {
  bool nothing = false;
  Jobs jobs;  // filled by build_plan, then tiled in place by the device launch
};

dsa_status check_metadata(const dsa_metadata_copy_params& p, const char*, MetadataChecked* c) {
  if (p.bs == 0) return c->nothing = true, DSA_STATUS_OK;
  DSA_TRY(build_plan(p, c->jobs));
  c->nothing = c->jobs.plan.num_jobs == 0;
  return DSA_STATUS_OK;
}

dsa_status metadata_device(const dsa_metadata_copy_params& p, MetadataChecked& c, int sms, cudaStream_t s,
                           const char* op) {
  Jobs& jobs = c.jobs;
  const CopyPlan<0>& plan = jobs.plan;
  const bool large = copy_large_tiles(plan.first_tile[plan.num_jobs], sms);
  if (large)  // fewer tiles than the small ones: cannot fail
    for (int j = 0; j < plan.num_jobs; ++j) tile_job(jobs, j, tile_elements(kCopyThreads, kCopyLargeUnroll));
  set_device_fields(jobs);
  const unsigned mode = (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u;
  // In the layout for its destination count (plan_for: K = 1, 2, 3; any count: the plan as built).
  const cudaError_t err = plan.num_dst == 1   ? launch_copy(plan_for<1>(plan), large, sms, s, mode)
                          : plan.num_dst == 2 ? launch_copy(plan_for<2>(plan), large, sms, s, mode)
                          : plan.num_dst == 3 ? launch_copy(plan_for<3>(plan), large, sms, s, mode)
                                              : launch_copy(plan, large, sms, s, mode);
  return launch_status(err, op);
}

}  // namespace
}  // namespace dsa

extern "C" dsa_status dsa_metadata_copy(const dsa_metadata_copy_params* params, void* stream) {
  using namespace dsa;
  return dispatch<MetadataChecked>(params, stream, kOp, check_metadata,
                                   [](const dsa_metadata_copy_params&, const MetadataChecked& c) { host_copy(c.jobs); },
                                   metadata_device);
}
