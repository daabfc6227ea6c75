// c128 prefill (docs/spec.md, "Prefill"): the segment kernel, its tile layouts, the launch policy
// (below, the one place it is written) and the entry point.
#include <cooperative_groups.h>

#include <vector>

#include "c128_checks.h"
#include "c128_host.h"
#include "device.cuh"
#include "inline_records.cuh"
#include "store.cuh"

DSA_DECLARE_STRUCT(DSA_STRUCT_PREFILL_PARAMS, dsa_c128_prefill_params);

namespace dsa {
namespace {

namespace cg = cooperative_groups;

constexpr int kPrefillWarps = kPrefillThreads / 32;
constexpr int kVec = kPrefillVec;  // prefill channels per thread: one 16-byte access (launch_policy.h)
constexpr int kBatch = 4;          // prefill tokens per thread whose loads are in flight together

// ---------------------------------------------------------------------------------------------
// Prefill: one work item = one segment x one tile of channels, taken by one block of 256
// threads laid out as `lanes` threads across the tile (4 channels each, one 16-byte access) by
// 256 / lanes token rows. Row r folds tokens r, r + rows, ... in batches of kBatch whose loads
// are all issued before any arithmetic (a row with at most one token takes it as its partial).
// The rows then combine in two reductions instead of pairwise online merges: the channel maximum
// over all rows (shuffles within a warp, shared memory across the 8 warps), then each row's sums
// rescaled to it once and added. Wide tiles (32 lanes = 128 channels, 8 rows) keep the per-token
// work lowest for large plans; smaller ones (down to 2 lanes = 8 channels, 128 rows) spread a
// small plan over many blocks, so a segment's 128 tokens are loaded in one round trip.
//
// Plans come from device memory (grid-stride over the records) or from host memory inside the
// launch parameters (DSA_FLAG_HOST_PLAN: up to DSA_INLINE_RECORDS per launch, longest items first,
// see pack_records). A launch takes
// compress records first, then write records; compress items only read state, write items store
// it after every compress read (docs/spec.md, prefill). Two ways to keep that order:
//   one launch      both lists in a cooperative grid (all blocks resident together): a block
//                   arrives at a grid barrier once it has no compress-item state read left (at
//                   once if it has none) and waits on it only before its first state store.
//                   Compress blocks never wait, so nothing can deadlock. Eager calls of host
//                   plans whose items fit one wave (prefill_at_once).
//   split           host plans with more compress records that start a chunk than continue one:
//                   the continuing compress records (the only state reads), then every other
//                   record in one launch whose write items wait for the first before their first
//                   state store (kSyncBeforeStore); one launch when none continues (prefill_split).
//   two passes      otherwise: the compress pass, then the write pass in stream order (below).
// Ordering between launches (all in one stream):
//   kSyncAtStart     the op's first launch with nothing of this op before it: wait for the
//                    producers, then let dependents start (a cooperative launch lets them start
//                    only as its blocks exit, so a dependent grid never holds the SMs its
//                    barrier is waiting for).
//   kSyncBeforeStore the write pass right behind the compress pass (or a split plan's second
//                    launch right behind its first), launched with PDL: it starts as soon as the
//                    launch before passed its wait (so the producers' writes are visible), computes
//                    alongside it and waits for it only before its first state store.
//   kSyncChained     a further launch of the same pass (a long host plan), launched with PDL: its
//                    predecessor had passed its wait when it started, so it reads at once; it
//                    waits at exit, so the launches of a pass complete in order.
// Every block waits exactly once (at the latest at exit).

enum PrefillSync : int32_t { kSyncAtStart = 0, kSyncBeforeStore = 1, kSyncChained = 2 };

// Lists a launch takes (a kernel template argument, so single-pass kernels carry no barrier):
// one, both with the grid barrier (cooperative), or both ordered by the launch before (kSplit).
enum PrefillPasses : int { kCompressPass = 1, kWritePass = 2, kBothPasses = 3, kSplitPass = 4 };

// The prefill kernel's parameters, ordered by first use: what a block reads before its first loads
// (its sync, record counts, head size, the slot lists and the token pointer) in the first 48 bytes,
// which share one constant-cache line with the bytes before the parameter space on sm_90; the rest
// a host-plan launch reads in the next 64 bytes; device-plan fields and the error counter after.
// With InlineRecords' packing, against the ABI struct followed by the launch fields and a separate
// array of list positions (docs/performance.md, "c128 prefill").
struct PrefillLaunch {
  int32_t sync;                 // PrefillSync
  int32_t head_dim;
  int64_t num_compress;         // records of this launch in each list (device plans: capacities,
  int64_t num_write;            // capped by counts); inline: compress records, then write records
  const int32_t* load_indices;  // never null (the ABI's null stands for indices)
  const int32_t* indices;
  const float* kv_score;
  const float* ape;
  void* state;
  float* out;
  int64_t num_tokens;
  int64_t batch_size;
  int64_t num_slots;
  int64_t first_record;         // index of the launch's first compress record (compact output row)
  int32_t out_layout;
  int32_t lanes_log2;           // log2 of the threads across a tile (host)
  const dsa_segment* compress;  // device records (kInline == 0)
  const dsa_segment* write;
  const int64_t* counts;        // device plans only
  uint32_t* error_count;
  int32_t device;               // host
};

// A host plan's records in the launch parameters (SegmentBlock). Each record carries its position in its list
// (its compact output row; records are reordered) in the upper 16 bits of window_len, so a block
// finds both in the one 16-byte record it reads; a window past 16 bits is stored as 0xFFFF, which
// still fails segment_ok, and sentinels are stored unchanged (pack_records). A separate array of
// positions cost each block a second parameter read (another constant-cache line); reading it only
// for compact output instead gained as much on small plans but made the wide and cooperative
// kernels spill (128 x 1K +11%).
template <int kInline>
using InlineRecords = SegmentBlock<kInline>;

// kBatch tokens of one thread: every load issued before any is used.
struct TokenGroup {
  float score[kVec][kBatch];  // biased, base 2
  float kv[kVec][kBatch];
};

// Token j of a segment (kVec channels from `ch`): kv, and its score biased and in base 2.
__device__ __forceinline__ void load_token(float (&kv)[kVec], float (&score)[kVec], const PrefillLaunch& p,
                                           int64_t first_row, int first_in_chunk, int ch, int j) {
  const int D = p.head_dim;
  const float* token = p.kv_score + (first_row + j) * 2 * D + ch;
  const Lanes<kVec> x = load_lanes<kVec>(token), t = load_lanes<kVec>(token + D);
  const Lanes<kVec> bias = load_lanes<kVec>(p.ape + (int64_t)(first_in_chunk + j) * D + ch);
#pragma unroll
  for (int i = 0; i < kVec; ++i) kv[i] = x.v[i], score[i] = to_log2(t.v[i] + bias.v[i]);
}

__device__ __forceinline__ void load_group(TokenGroup& g, const PrefillLaunch& p, int64_t first_row,
                                           int first_in_chunk, int ch, int t0, int rows, int n) {
#pragma unroll
  for (int u = 0; u < kBatch; ++u) {
    const int j = t0 + u * rows;
    if (j < n) {
      float kv[kVec], score[kVec];
      load_token(kv, score, p, first_row, first_in_chunk, ch, j);
#pragma unroll
      for (int i = 0; i < kVec; ++i) g.kv[i][u] = kv[i], g.score[i][u] = score[i];
    }
  }
}

__device__ __forceinline__ void fold_group(Partial (&part)[kVec], const TokenGroup& g, int t0, int rows_log2, int n) {
  const int count = min(kBatch, (n - t0 + (1 << rows_log2) - 1) >> rows_log2);
#pragma unroll
  for (int i = 0; i < kVec; ++i) part[i] = absorb(part[i], g.score[i], g.kv[i], count);
}

// 4 tokens per load batch at 4 blocks per SM: occupancy wins (docs/performance.md, "c128 prefill").
template <int kPasses, int kInline, typename S, int kLanesLog2>
__global__ void __launch_bounds__(kPrefillThreads, kPrefillBlocksPerSm)
    c128_prefill_kernel(const __grid_constant__ PrefillLaunch a, const __grid_constant__ InlineRecords<kInline> inline_records) {
  __shared__ float part_max[kPrefillWarps][32 * kVec];
  __shared__ float part_sum[kPrefillWarps][32 * kVec];
  __shared__ float part_acc[kPrefillWarps][32 * kVec];
  __shared__ float tile_max[32 * kVec];

  const PrefillLaunch& p = a;
  bool waited = false;
  if (a.sync == kSyncAtStart) {
    wait_for_producers();
    waited = true;
  }
  if (a.sync != kSyncBeforeStore && kPasses != kBothPasses) allow_dependents();
  const int D = p.head_dim;
  constexpr int lanes_log2 = kLanesLog2;
  constexpr int lanes = 1 << lanes_log2;
  constexpr int rows = kPrefillThreads >> lanes_log2;
  constexpr int tile_width = lanes * kVec;
  const int tiles = D / tile_width;
  const int lane = threadIdx.x % lanes, row = threadIdx.x / lanes;
  const int warp = threadIdx.x / 32, warp_lane = threadIdx.x % 32;
  // A host plan's launch holds at most DSA_INLINE_RECORDS records: its item indices fit 32 bits.
  using Index = std::conditional_t<(kInline > 0), int32_t, int64_t>;
  Index num_compress = (Index)a.num_compress, num_write = (Index)a.num_write;
  if constexpr (kInline == 0) {
    if (p.counts != nullptr) {
      num_compress = max((int64_t)0, min(num_compress, p.counts[0]));
      num_write = max((int64_t)0, min(num_write, p.counts[1]));
    }
  }
  const int32_t* load_indices = p.load_indices;
  S* const state = static_cast<S*>(p.state);
  const Index items = (num_compress + num_write) * tiles;
  // Combined launch: 0 before this block arrives at the grid barrier, 1 arrived, 2 released. A
  // block arrives once it will read no more state for a compress item: at its first write item,
  // at its last compress item (at the start if that one reads no state, else as soon as the read
  // has landed, before the reductions) or at exit. The token matters to thread 0 only.
  [[maybe_unused]] int barrier = 0;
  __shared__ cg::grid_group::arrival_token barrier_token;
  [[maybe_unused]] const Index compress_items = num_compress * tiles;
  [[maybe_unused]] auto arrive = [&] {
    const cg::grid_group::arrival_token token = cg::this_grid().barrier_arrive();
    if (threadIdx.x == 0) barrier_token = token;
    barrier = 1;
  };

  for (Index item = blockIdx.x; item < items; item += gridDim.x) {
    // Record r of the launch: compress records first, then write records.
    const Index r = items <= INT32_MAX ? (Index)((uint32_t)item / (uint32_t)tiles) : item / tiles;  // 32-bit when it can
    const int tile = (int)(item - r * tiles);
    const bool write = kPasses == kBothPasses || kPasses == kSplitPass ? r >= num_compress : kPasses == kWritePass;
    if constexpr (kPasses == kBothPasses) {
      if (write && barrier == 0) arrive();
    }
    dsa_segment seg = kInline > 0 ? inline_records.r[r] : write ? a.write[r - num_compress] : a.compress[r];
    [[maybe_unused]] uint32_t inline_row = 0;  // a host-plan record's list position (InlineRecords)
    if (is_sentinel(seg)) continue;
    if constexpr (kInline > 0) inline_row = seg.window_len >> 16, seg.window_len &= 0xFFFFu;
    const bool report = tile == 0 && threadIdx.x == 0;
    if (!segment_ok(seg, !write, p.num_tokens, p.batch_size)) {
      if (report) count_error(p.error_count);
      continue;
    }
    const int n = (int)seg.window_len;
    const int first_in_chunk = (int)(seg.position % DSA_CHUNK) - n + 1;
    const bool continues = first_in_chunk != 0;
    [[maybe_unused]] const bool last_compress = !write && item + gridDim.x >= compress_items;
    if constexpr (kPasses == kBothPasses) {
      if (last_compress && !continues && barrier == 0) arrive();
    }
    // Slot reads are issued here and checked after the token loads, so both are in flight together.
    const int32_t load_slot = continues ? load_indices[seg.batch_id] : 0;
    const int32_t store_slot = write ? p.indices[seg.batch_id] : 0;

    const int ch = tile * tile_width + lane * kVec;
    const int64_t first_row = (int64_t)seg.ragged_id - n + 1;
    Partial part[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) part[i] = empty_partial();
    if (n <= rows) {  // at most one token per thread: its partial is the token itself
      if (row < n) {
        float kv[kVec], score[kVec];
        load_token(kv, score, p, first_row, first_in_chunk, ch, row);
#pragma unroll
        for (int i = 0; i < kVec; ++i) part[i] = partial_of(score[i], kv[i]);
      }
    } else {
      for (int t0 = row; t0 < n; t0 += rows * kBatch) {
        TokenGroup g;
        load_group(g, p, first_row, first_in_chunk, ch, t0, rows, n);
        fold_group(part, g, t0, 8 - lanes_log2, n);
      }
    }
    if ((continues && load_slot < 0) || (write && store_slot < 0)) continue;  // not held on this GPU, uncounted
    if ((continues && !slot_ok(load_slot, p.num_slots)) || (write && !slot_ok(store_slot, p.num_slots))) {
      if (report) count_error(p.error_count);
      continue;  // uniform: every thread read the same slots
    }
    const bool merger = threadIdx.x < tile_width;
    const int c = tile * tile_width + threadIdx.x;
    float prior_m = 0.0f, prior_s = 0.0f, prior_k = 0.0f;
    if (continues && merger) {
      const S* prior = state + (int64_t)load_slot * 3 * D + c;
      prior_m = widen(prior[0]), prior_s = widen(prior[D]), prior_k = widen(prior[2 * D]);
    }
    if constexpr (kPasses == kBothPasses) {
      if (last_compress && barrier == 0) {
        asm volatile("" ::"f"(prior_m), "f"(prior_s), "f"(prior_k));  // the prior state has landed
        arrive();
      }
    }
    // The tile's channel maxima over all rows: rows of one warp differ in the lane bits above
    // lanes_log2 (shuffles), the warps meet in shared memory.
    float top[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) top[i] = part[i].max;
#pragma unroll
    for (int offset = lanes; offset < 32; offset <<= 1)
#pragma unroll
      for (int i = 0; i < kVec; ++i) top[i] = fmaxf(top[i], __shfl_xor_sync(0xFFFFFFFFu, top[i], offset));
    if (warp_lane < lanes)
#pragma unroll
      for (int i = 0; i < kVec; ++i) part_max[warp][lane * kVec + i] = top[i];
    __syncthreads();
    if (a.sync == kSyncBeforeStore && !waited) {  // every compress-pass read of state is done
      wait_for_producers();
      waited = true;
      allow_dependents();
    }
#pragma unroll
    for (int w = 0; w < kPrefillWarps; ++w)
#pragma unroll
      for (int i = 0; i < kVec; ++i) top[i] = fmaxf(top[i], part_max[w][lane * kVec + i]);
    // Every row's partial rescaled to the common maximum; then plain sums.
    float sum[kVec], acc[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float scale = exp2_(part[i].max - top[i]);
      sum[i] = part[i].sum * scale, acc[i] = part[i].acc * scale;
    }
#pragma unroll
    for (int offset = lanes; offset < 32; offset <<= 1)
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        sum[i] += __shfl_xor_sync(0xFFFFFFFFu, sum[i], offset);
        acc[i] += __shfl_xor_sync(0xFFFFFFFFu, acc[i], offset);
      }
    if (warp_lane < lanes) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        part_sum[warp][lane * kVec + i] = sum[i];
        part_acc[warp][lane * kVec + i] = acc[i];
        if (warp == 0) tile_max[lane * kVec + i] = top[i];
      }
    }
    __syncthreads();
    Partial total = empty_partial();
    if (merger) {
      const int t = threadIdx.x;
      total = Partial{tile_max[t], 0.0f, 0.0f};
#pragma unroll
      for (int w = 0; w < kPrefillWarps; ++w) total.sum += part_sum[w][t], total.acc += part_acc[w][t];
      if (continues) total = merge(from_state(prior_m, prior_s, prior_k), total);
    }
    if constexpr (kPasses == kBothPasses) {
      if (write && barrier == 1) {  // every block has done its compress reads
        cg::this_grid().barrier_wait(cg::grid_group::arrival_token(barrier_token));
        barrier = 2;
      }
    }
    if (merger) {
      if (write) {
        S* to = state + (int64_t)store_slot * 3 * D + c;
        narrow(state_max(total), to);
        narrow(total.sum, to + D);
        narrow(mean_of(total), to + 2 * D);
      } else {
        const int64_t row = kInline > 0 ? (int64_t)inline_row : r;
        const int64_t out_row = p.out_layout == DSA_OUT_COMPACT ? a.first_record + row : (int64_t)seg.ragged_id;
        p.out[out_row * D + c] = mean_of(total);
      }
    }
  }
  if constexpr (kPasses == kBothPasses) {
    if (barrier == 0) cg::this_grid().barrier_arrive();
  }
  if (!waited) {
    wait_for_producers();
    if (a.sync == kSyncBeforeStore) allow_dependents();
  }
}

// Tile layouts (prefill_lanes_log2) and the route of a call's records (prefill_route): launch_policy.h.

// Host plans launch one block per item (the hardware hands the next item to whichever SM frees
// first, which balances segments of unequal length); device plans are sized from their capacity,
// so their grid is capped at the resident blocks and strides over the records actually present.
// A cooperative launch is capped the same way; one larger than the device holds at once (its
// occupancy, queried once per device) is refused here with cudaErrorCooperativeLaunchTooLarge
// before anything is launched.
template <int kPasses, int kInline, typename S, int kLanesLog2>
cudaError_t launch_layout(const PrefillLaunch& a, const InlineRecords<kInline>& records, int64_t items, int sms,
                          cudaStream_t stream, bool pdl) {
  const auto kernel = c128_prefill_kernel<kPasses, kInline, S, kLanesLog2>;
  constexpr bool cooperative = kPasses == kBothPasses;
  const int64_t resident = (int64_t)sms * kPrefillBlocksPerSm;
  const int64_t grid = std::max<int64_t>(1, kInline > 0 && !cooperative ? items : std::min(items, resident));
  if (cooperative) {
    static int fit_cache[kMaxDevices] = {};  // blocks resident at once; -1: no cooperative launch
    int fit = __atomic_load_n(&fit_cache[a.device], __ATOMIC_RELAXED);
    if (fit == 0) {
      int cooperative = 0, per_sm = 0;
      if (cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, a.device) != cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kPrefillThreads, 0) != cudaSuccess)
        return cudaGetLastError();
      fit = cooperative && per_sm > 0 ? per_sm * sms : -1;
      __atomic_store_n(&fit_cache[a.device], fit, __ATOMIC_RELAXED);
    }
    if (grid > fit) return cudaErrorCooperativeLaunchTooLarge;
  }
  return launch(kernel, (unsigned)grid, kPrefillThreads, stream, (pdl ? kLaunchPdl : 0u) | (cooperative ? kLaunchCooperative : 0u),
                a, records);
}

// A host plan's records of one list into the launch parameters from position `at`, longest items
// first: the hardware hands out blocks in about index order, so short items fill the last wave
// instead of long ones trailing it. An item's length is counted in dependent memory round trips:
// the token batches of one row (kBatch tokens each), plus one for the prior state of a segment
// that continues a chunk. Counting sort, stable; sentinels last (docs/performance.md, "c128 prefill").
// Takes list[0, n), or with `pick` the records list[pick[0, n)] (a split plan's launches).
template <int kInline>
void pack_records(InlineRecords<kInline>& records, const dsa_segment* list, const uint16_t* pick, int64_t n, int64_t at,
                  int lanes_log2) {
  constexpr int kKeys = 8;
  const int rows_log2 = 8 - lanes_log2;
  uint8_t key[kInline];
  int64_t first[kKeys] = {};
  auto at_list = [&](int64_t i) -> int64_t { return pick != nullptr ? pick[i] : i; };  // record i's list position
  for (int64_t i = 0; i < n; ++i) {
    const dsa_segment& g = list[at_list(i)];
    int k = 0;
    if (!is_sentinel(g)) {
      const int64_t per_row = ((int64_t)g.window_len + (1 << rows_log2) - 1) >> rows_log2;
      k = (int)std::min<int64_t>(kKeys - 1, (per_row + kBatch - 1) / kBatch + segment_continues(g));
    }
    key[i] = (uint8_t)k;
    ++first[k];
  }
  for (int k = kKeys - 1; k >= 0; --k) {  // descending keys: key k starts after every larger key
    const int64_t count = first[k];
    first[k] = at;
    at += count;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t from = at_list(i);
    const int64_t j = first[key[i]]++;
    records.r[j] = list[from];
    if (!is_sentinel(list[from])) records.r[j].window_len = std::min<uint32_t>(list[from].window_len, 0xFFFFu) | (uint32_t)from << 16;
  }
}

// One launch over `a`'s records: a host plan's compress records, then its write records, go into
// the launch parameters.
// `pick`: the positions of the launch's compress records in `compress` (null: the first ones).
template <int kPasses, int kInline, typename S>
cudaError_t launch_prefill(const PrefillLaunch& a, const dsa_segment* compress, const uint16_t* pick,
                           const dsa_segment* write, int sms, cudaStream_t stream, bool pdl) {
  InlineRecords<kInline> records;
  if constexpr (kInline > 0) {
    pack_records(records, compress, pick, a.num_compress, 0, a.lanes_log2);
    pack_records(records, write, nullptr, a.num_write, a.num_compress, a.lanes_log2);
  } else {
    records.r[0] = dsa_segment{};  // unused: device plans read `a.compress` and `a.write`
  }
  const int64_t items = layout_items(a.num_compress + a.num_write, a.head_dim, a.lanes_log2);
  switch (a.lanes_log2) {
    case kTiny: return launch_layout<kPasses, kInline, S, kTiny>(a, records, items, sms, stream, pdl);
    case kNarrow: return launch_layout<kPasses, kInline, S, kNarrow>(a, records, items, sms, stream, pdl);
    case kMid: return launch_layout<kPasses, kInline, S, kMid>(a, records, items, sms, stream, pdl);
    default: return launch_layout<kPasses, kInline, S, kWide>(a, records, items, sms, stream, pdl);
  }
}

template <int kPasses, typename S>
cudaError_t launch_inline(const PrefillLaunch& a, const dsa_segment* compress, const dsa_segment* write, int sms,
                          cudaStream_t stream, bool pdl, const uint16_t* pick = nullptr) {
  return a.num_compress + a.num_write <= kSmallInline
             ? launch_prefill<kPasses, kSmallInline, S>(a, compress, pick, write, sms, stream, pdl)
             : launch_prefill<kPasses, DSA_INLINE_RECORDS, S>(a, compress, pick, write, sms, stream, pdl);
}

// The kernel's parameters from the ABI struct; the caller sets the launch's records, sync and layout.
PrefillLaunch prefill_launch(const dsa_c128_prefill_params& p) {
  PrefillLaunch a = {};
  a.head_dim = p.head_dim;
  a.load_indices = p.load_indices != nullptr ? p.load_indices : p.indices;
  a.indices = p.indices;
  a.kv_score = p.kv_score;
  a.ape = p.ape;
  a.num_tokens = p.num_tokens;
  a.batch_size = p.batch_size;
  a.num_slots = p.num_slots;
  a.state = p.state;
  a.counts = (p.flags & DSA_FLAG_HOST_PLAN) ? nullptr : p.counts;  // a host plan's counts are read on the host
  a.out = p.out;
  a.error_count = p.error_count;
  a.out_layout = p.out_layout;
  a.device = p.device;
  return a;
}

// Launches one pass over `count` records of one list (a device list: one launch; a host list: one
// launch per DSA_INLINE_RECORDS, chained).
template <bool kWrite, typename S>
dsa_status prefill_pass(const dsa_c128_prefill_params& p, int64_t count, PrefillSync first_sync, int sms,
                        cudaStream_t stream, const char* op) {
  const bool host_plan = p.flags & DSA_FLAG_HOST_PLAN;
  constexpr int kPasses = kWrite ? kWritePass : kCompressPass;
  const dsa_segment* list = kWrite ? p.write : p.compress;
  PrefillLaunch a = prefill_launch(p);
  a.lanes_log2 = prefill_lanes_log2(count, p.head_dim, sms);
  const bool pdl = (p.flags & DSA_FLAG_PDL) || first_sync == kSyncBeforeStore;
  if (!host_plan) {
    (kWrite ? a.write : a.compress) = list;
    (kWrite ? a.num_write : a.num_compress) = count;
    a.sync = first_sync;
    return launch_status(launch_prefill<kPasses, 0, S>(a, nullptr, nullptr, nullptr, sms, stream, pdl), op);
  }
  for (int64_t first = 0; first < count; first += DSA_INLINE_RECORDS) {
    (kWrite ? a.num_write : a.num_compress) = std::min<int64_t>(DSA_INLINE_RECORDS, count - first);
    a.first_record = first;
    a.sync = first == 0 ? first_sync : kSyncChained;
    const dsa_segment* part = list + first;
    DSA_TRY(launch_status(launch_inline<kPasses, S>(a, kWrite ? nullptr : part, kWrite ? part : nullptr, sms,
                                                            stream, first == 0 ? pdl : true), op));
  }
  return DSA_STATUS_OK;
}

// Both lists in one cooperative launch (prefill_route's "at once", layout prefill_at_once_lanes): returns
// false, with nothing launched, when the device refuses a cooperative grid of that size.
template <typename S>
bool prefill_at_once(const dsa_c128_prefill_params& p, int64_t num_compress, int64_t num_write, int sms,
                     cudaStream_t stream, dsa_status* status, const char* op) {
  PrefillLaunch a = prefill_launch(p);
  a.lanes_log2 = prefill_at_once_lanes(num_compress + num_write, p.head_dim, sms);
  a.num_compress = num_compress, a.num_write = num_write;
  a.sync = kSyncAtStart;
  const cudaError_t err = launch_inline<kBothPasses, S>(a, p.compress, p.write, sms, stream, p.flags & DSA_FLAG_PDL);
  if (err == cudaErrorCooperativeLaunchTooLarge || err == cudaErrorNotSupported) {
    cudaGetLastError();
    return false;
  }
  *status = launch_status(err, op);
  return true;
}

// Whether `stream` is capturing a graph (a graph pays the launch cost once: no cooperative launch); true when
// the runtime cannot say.
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return capture != cudaStreamCaptureStatusNone;
}

// A host plan's compress records split into those that continue a chunk and those that start one (list
// positions); the count of continuing ones.
int64_t split_scan(const dsa_c128_prefill_params& p, int64_t num_compress, uint16_t* continuing, uint16_t* fresh) {
  int64_t num_continuing = 0, num_fresh = 0;
  for (int64_t i = 0; i < num_compress; ++i) {
    const dsa_segment& g = p.compress[i];
    const bool continues = !is_sentinel(g) && segment_continues(g);
    continuing[num_continuing] = fresh[num_fresh] = (uint16_t)i;
    num_continuing += continues, num_fresh += !continues;
  }
  return num_continuing;
}

// Host plans with both lists in two launches split by state reads rather than by list: first the
// compress records that continue a chunk (the only reads of state that a write record's store must
// follow), then every other record, write records included, launched with PDL: its blocks start as
// the first launch's blocks pass their wait, and wait for that launch to complete only before their
// first state store (kSyncBeforeStore). So the write records wait for the short continuing records
// only, not for the whole compress list; without continuing records the plan is one launch that
// waits for nothing more (when it applies: prefill_route; figures: docs/performance.md, "c128 prefill").
static_assert(kMaxScan <= 0xFFFF, "list positions must fit 16 bits below 0xFFFF");

template <typename S>
dsa_status prefill_split(const dsa_c128_prefill_params& p, int64_t num_continuing, const uint16_t* continuing,
                         const uint16_t* fresh, int64_t num_fresh, int64_t num_write, int sms, cudaStream_t stream,
                         const char* op) {
  PrefillLaunch a = prefill_launch(p);
  if (num_continuing > 0) {
    a.num_compress = num_continuing;
    a.lanes_log2 = prefill_lanes_log2(num_continuing, p.head_dim, sms);
    a.sync = kSyncAtStart;
    DSA_TRY(launch_status(launch_inline<kCompressPass, S>(a, p.compress, nullptr, sms, stream, p.flags & DSA_FLAG_PDL,
                                                          continuing), op));
  }
  a.num_compress = num_fresh, a.num_write = num_write;
  a.lanes_log2 = prefill_lanes_log2(num_fresh + num_write, p.head_dim, sms);
  a.sync = num_continuing > 0 ? kSyncBeforeStore : kSyncAtStart;
  return launch_status(launch_inline<kSplitPass, S>(a, p.compress, p.write, sms, stream,
                                                    num_continuing > 0 || (p.flags & DSA_FLAG_PDL), fresh), op);
}

// The prefill's launches on the route launch_policy.h picks (one, a split or two passes), then for a storing
// prefill the store of the compress records' vectors from out, launched with PDL (store_prefill_vectors). A
// store inside the compress pass was slower: docs/performance.md, "c128 prefill".
template <typename S>
dsa_status prefill_device(const dsa_c128_prefill_params& p, int sms, cudaStream_t stream, const char* op,
                          const StoreLaunch* store) {
  const bool host_plan = p.flags & DSA_FLAG_HOST_PLAN;
  int64_t num_compress = p.compress_capacity, num_write = p.write_capacity;
  if (host_plan && p.counts != nullptr) {
    num_compress = std::max<int64_t>(0, std::min(num_compress, p.counts[0]));
    num_write = std::max<int64_t>(0, std::min(num_write, p.counts[1]));
  }
  PrefillRoute route = prefill_route(p, num_compress, num_write, -1, sms, !(p.flags & DSA_FLAG_NO_COOPERATIVE));
  dsa_status status = DSA_STATUS_OK;
  if (route == kPrefillAtOnce &&
      (capturing(stream) || !prefill_at_once<S>(p, num_compress, num_write, sms, stream, &status, op)))
    route = prefill_route(p, num_compress, num_write, -1, sms, false);
  uint16_t continuing[kMaxScan], fresh[kMaxScan];
  int64_t num_continuing = -1;
  if (route == kPrefillPasses && host_plan && num_write > 0 && num_compress > 0 && num_compress <= kMaxScan) {
    num_continuing = split_scan(p, num_compress, continuing, fresh);
    route = prefill_route(p, num_compress, num_write, num_continuing, sms, false);
  }
  if (route == kPrefillAtOnce) {
    DSA_TRY(status);
  } else if (route == kPrefillSplit) {
    DSA_TRY(prefill_split<S>(p, num_continuing, continuing, fresh, num_compress - num_continuing, num_write, sms,
                             stream, op));
  } else {
    if (num_compress > 0) DSA_TRY((prefill_pass<false, S>(p, num_compress, kSyncAtStart, sms, stream, op)));
    if (num_write > 0)
      DSA_TRY((prefill_pass<true, S>(p, num_write, num_compress > 0 ? kSyncBeforeStore : kSyncAtStart, sms, stream, op)));
  }
  if (store != nullptr && num_compress > 0) DSA_TRY(store_prefill_vectors(p, *store, num_compress, stream, op));
  return DSA_STATUS_OK;
}

struct PrefillChecked {
  bool nothing = false;
  StoreLaunch store = {};
};

dsa_status check_prefill(const dsa_c128_prefill_params& p, const char* op, PrefillChecked* c) {
  if (p.batch_size < 0 || p.num_tokens < 0 || p.compress_capacity < 0 || p.write_capacity < 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT,
                "%s: batch_size, num_tokens, compress_capacity and write_capacity must be >= 0 "
                "(got %lld, %lld, %lld, %lld)", op, (long long)p.batch_size, (long long)p.num_tokens,
                (long long)p.compress_capacity, (long long)p.write_capacity);
  if ((p.compress_capacity > 0 && p.compress == nullptr) || (p.write_capacity > 0 && p.write == nullptr))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: a record list with non-zero capacity is null", op);
  if (p.out_layout != DSA_OUT_RAGGED && p.out_layout != DSA_OUT_COMPACT)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: out_layout is %d; expected %d (ragged) or %d (compact)", op,
                p.out_layout, DSA_OUT_RAGGED, DSA_OUT_COMPACT);
  if (p.compress_capacity + p.write_capacity == 0 || p.batch_size == 0 || p.num_tokens == 0)
    return c->nothing = true, DSA_STATUS_OK;
  DSA_TRY(check_common(p, op));
  DSA_TRY(check_host_plan(p, op));
  if (p.out == nullptr && p.store == nullptr && p.compress_capacity > 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: out is null but the plan has compress records", op);
  if (p.store != nullptr) DSA_TRY(store_launch(p.store, p.cache_slots, p.head_dim, p.device, op, &c->store));
  return DSA_STATUS_OK;
}

dsa_status prefill_on_device(const dsa_c128_prefill_params& p, const PrefillChecked& c, int sms, cudaStream_t s,
                             const char* op) {
  if (p.store != nullptr && p.out == nullptr && p.compress_capacity > 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: out is null; a storing prefill on the GPU writes its vectors to out "
                "and stores them from there", op);
  if (vector_width(p) != 4)
    return fail(DSA_STATUS_INVALID_ARGUMENT,
                "%s: on the GPU, kv_score, out and ape must be 16-byte aligned and state %d-byte aligned", op,
                4 * state_bytes(p.state_dtype));
  const StoreLaunch* store = p.store != nullptr ? &c.store : nullptr;
  return p.state_dtype == DSA_STATE_BFLOAT16 ? prefill_device<Bf16>(p, sms, s, op, store)
                                             : prefill_device<float>(p, sms, s, op, store);
}

}  // namespace
}  // namespace dsa

extern "C" dsa_status dsa_c128_prefill(const dsa_c128_prefill_params* params, void* stream) {
  using namespace dsa;
  return dispatch<PrefillChecked>(params, stream, "dsa_c128_prefill", check_prefill,
                                  host_prefill,
                                  prefill_on_device);
}
