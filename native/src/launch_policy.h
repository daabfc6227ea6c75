// Launch policy: every launch-shape choice of the GPU backend, as pure functions of an op's params and the
// device's multiprocessor count. Host code with no CUDA in it: the entry points call these, and
// tests/test_policy.py compiles them alone and checks them from a table. The figures behind each choice are in
// docs/performance.md, by op.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common.h"
#include "dsa_kernels.h"

namespace dsa {

constexpr int kDecodeThreads = 128;  // the per-request kernels' column tile (threads of one request row)
// A plain decode grid under this many blocks per SM lets the next kernel launch (PDL) once its first loads are
// issued; a larger one lets it launch only as its blocks finish (measured at 1 / 32 / 256 / 512 / 1024 blocks
// on 132 SMs, the crossing lies between 256 and 512). The same count decides the storing decode's width.
constexpr int kLateDependentsBlocksPerSm = 3;
// The storing decode releases its dependents early up to this many blocks per SM (its 1024-block grid at
// B = 1024 fits one wave on 132 SMs: the next layer's blocks take the free slots and wait there, so a step of
// layers back to back no longer pays each launch after the last block; docs/performance.md, "c128 decode").
constexpr int kStoringEarlyDependentsBlocksPerSm = 9;
constexpr int kC4MaxDim = 512;       // c4 kernels: a block is one D = 512 row, kC4MaxDim / VEC threads
constexpr int kC4WriteChannels = 4;  // VEC of the c4 write kernel (an extend's ring writes)
constexpr int64_t kC4NarrowRows = 128;  // c4 decode / compress rows up to which a thread holds 2 channels
constexpr int kPrefillThreads = 256;  // a prefill block: `lanes` threads across a tile by 256 / lanes token rows
constexpr int kPrefillBlocksPerSm = 4;
constexpr int kPrefillVec = 4;       // prefill channels per thread: one 16-byte access
// Prefill tile layouts: lanes_log2 of the threads sharing one segment's channels.
constexpr int kTiny = 1, kNarrow = 2, kMid = 4, kWide = 5;

// The empty kernel that measures a launch (dsa_empty_launch): one warp.
constexpr int kProbeThreads = 32;

// A launch's grid (x, y, z) and block (x, y); fits false: too large for one launch.
struct Shape {
  int64_t grid_x = 0;
  int grid_y = 0, grid_z = 0, block_x = 0, block_y = 0;
  bool fits = false;
  int64_t blocks() const { return grid_x * grid_y * grid_z; }
};

// The geometry of the per-request kernels (decode, verify, copying commit, store): D / vec threads per
// request in column tiles of at most max_lanes (grid y), as many requests per block as fill
// kDecodeThreads threads (block y), `layers` along grid z.
inline Shape request_grid(int head_dim, int vec, int64_t batch_size, int layers, int max_lanes = kDecodeThreads) {
  Shape s;
  const int lanes = head_dim / vec;
  const int tiles = (lanes + max_lanes - 1) / max_lanes;
  const int tile_lanes = (lanes + tiles - 1) / tiles;
  const int rows = (int)std::max<int64_t>(1, std::min<int64_t>(kDecodeThreads / tile_lanes, batch_size));
  s.grid_x = (batch_size + rows - 1) / rows;
  s.grid_y = tiles, s.grid_z = layers, s.block_x = tile_lanes, s.block_y = rows;
  s.fits = batch_size <= INT32_MAX && tiles <= 65535;
  return s;
}

// Channels per thread of a storing kernel, and whether D / vec threads of one request fit a block in
// whole warps: 4 with 16-byte aligned buffers and D a multiple of 128, else 2 (8-byte alignment), 0: none.
inline int store_vector_width(int head_dim, int aligned_vec) {
  return aligned_vec >= 4 && head_dim % 128 == 0 ? 4 : aligned_vec >= 2 ? 2 : 0;
}

// ---- c128 ops --------------------------------------------------------------------------------------
// Bytes of a state element.
inline int state_bytes(int32_t state_dtype) { return state_dtype == DSA_STATE_BFLOAT16 ? 2 : 4; }

// Channels per access the buffers allow: 4 (16-byte float accesses), 2 (8-byte) or 0.
template <typename P>
int vector_width(const P& p) {
  const int sb = state_bytes(p.state_dtype);
  const void* floats[] = {p.kv_score, p.out, p.ape};
  for (int vec : {4, 2}) {
    bool ok = aligned(p.state, vec * sb);
    for (const void* b : floats) ok = ok && aligned(b, vec * 4);
    if (ok) return vec;
  }
  return 0;
}

// ---- c128 decode ----------------------------------------------------------------------------------
// Channels per thread: the widest the buffers allow (4, 16-byte accesses), 8 for large bf16-state batches
// (state accesses stay 16 bytes wide). A storing decode keeps a request's channels in one block: 4 per
// thread, or 2 (D / 2 threads per request) for a batch that leaves the GPU half idle (more warps per SM
// for the same bytes). store_ok false: a storing decode needs 16-byte aligned buffers and D <= 512;
// fits false: too large for one launch.
constexpr int kStoringDecodeMaxThreads = 2 * kDecodeThreads;  // one request's D / 2 threads, D <= 512
struct DecodeShape {
  int vec = 0;
  Shape shape;
  bool early_dependents = false;
  bool store_ok = true;
  bool fits = false;
};

inline DecodeShape decode_shape(const dsa_c128_decode_params& p, int sms) {
  DecodeShape d;
  const int vec4 = vector_width(p);
  const bool bf16 = p.state_dtype == DSA_STATE_BFLOAT16;
  d.vec = bf16 && vec4 == 4 && aligned(p.state, 16) && p.head_dim % 8 == 0 && p.batch_size >= 4096 ? 8 : vec4;
  int max_lanes = kDecodeThreads;
  if (p.store != nullptr) {
    const bool wide = p.batch_size < (int64_t)kLateDependentsBlocksPerSm * sms;
    d.vec = store_vector_width(p.head_dim, vec4);
    if (wide && d.vec == 4 && p.head_dim / 2 <= kStoringDecodeMaxThreads) d.vec = 2;
    if (d.vec == 0 || p.head_dim / d.vec > (d.vec == 2 ? kStoringDecodeMaxThreads : kDecodeThreads)) {
      d.store_ok = false;
      return d;
    }
    if (d.vec == 2) max_lanes = kStoringDecodeMaxThreads;
  }
  if (d.vec == 0) return d;
  d.shape = request_grid(p.head_dim, d.vec, p.batch_size, 1, max_lanes);
  const int early = p.store != nullptr ? kStoringEarlyDependentsBlocksPerSm : kLateDependentsBlocksPerSm;
  d.early_dependents = d.shape.blocks() < (int64_t)early * sms;
  d.fits = d.shape.fits;
  return d;
}

// ---- c128 verify ----------------------------------------------------------------------------------
// Channels per thread by batch size: small batches are bound by each thread's serial chain of drafts (one
// channel), large ones by requests in flight (2, or 4 with a bf16 state). A storing verify keeps a request in
// one block (D / vec threads, at most 512). store_ok false: a storing verify needs 8-byte aligned buffers and
// D <= 1024; fits false: too large for one launch.
constexpr int kVerifyStoreMaxThreads = 512;  // a storing verify's block: one request's D / vec threads
struct VerifyShape {
  int vec = 0;
  Shape shape;
  bool store_ok = true;
  bool fits = false;
};

inline VerifyShape verify_shape(const dsa_c128_verify_params& p) {
  VerifyShape v;
  const bool bf16 = p.state_dtype == DSA_STATE_BFLOAT16;
  const int aligned_vec = vector_width(p);
  v.vec = p.batch_size < 128 ? 1 : std::min(aligned_vec, bf16 ? 4 : 2);
  if (p.store != nullptr) {
    v.vec = store_vector_width(p.head_dim, p.batch_size < 128 ? std::min(aligned_vec, 2) : aligned_vec);
    if (v.vec == 0 || p.head_dim / v.vec > kVerifyStoreMaxThreads) {
      v.store_ok = false;
      return v;
    }
  }
  if (v.vec == 0) return v;
  v.shape = request_grid(p.head_dim, v.vec, p.batch_size, 1, p.store != nullptr ? p.head_dim / v.vec : kDecodeThreads);
  v.fits = v.shape.fits;
  return v;
}

// Drafts a verify thread loads at a time (its first batch with the request's length and slots, each later one
// while the previous is folded in): 8 where a thread holds few channels (one; two in a storing verify, whose
// request fills one block), else 4.
constexpr int verify_draft_batch(int vec, bool store) { return vec == 1 || (store && vec == 2) ? 8 : 4; }

// ---- c128 commit ----------------------------------------------------------------------------------
// The slot-resolving commit (load_indices, no state copied): one request per thread, kCommitThreads to a block, a
// block per kCommitThreads requests, so a step of 1024 requests spreads over 8 multiprocessors (a request is a
// few independent table reads and one store: latency, not bandwidth). A batch of 0 launches nothing (the call
// does nothing); check_speculative's batch_size <= INT32_MAX keeps the grid within one launch.
constexpr int kCommitThreads = 128;

inline int64_t commit_slots_blocks(int64_t batch_size) {
  return (batch_size + kCommitThreads - 1) / kCommitThreads;
}

// The copying commit copies 4 channels per thread when every layer's state is 16-byte aligned, else 2.
inline int commit_copy_vector_width(const dsa_c128_commit_params& p) {
  const int sb = p.state_dtype == DSA_STATE_BFLOAT16 ? 2 : 4;
  for (int32_t i = 0; i < p.num_layers; ++i)
    if (!aligned(p.states[i], 4 * sb)) return 2;
  return 4;
}

// ---- the standalone store -------------------------------------------------------------------------
// One request row per D / vec threads; fits false: the vectors are not 8-byte aligned. The largest block is one
// request row of the largest D (4096 at 4 channels a thread): the kernel's launch bound.
constexpr int kStoreMaxThreads = 1024;
inline Shape store_shape(int head_dim, const float* vectors, int64_t count, int* vec) {
  *vec = store_vector_width(head_dim, aligned(vectors, 16) ? 4 : aligned(vectors, 8) ? 2 : 0);
  if (*vec == 0) return Shape{};
  return request_grid(head_dim, *vec, count, 1, head_dim / *vec);
}

// ---- c128 prefill ---------------------------------------------------------------------------------
// Work items (blocks' worth of work) of `records` segments in the layout lanes_log2.
inline int64_t layout_items(int64_t records, int head_dim, int lanes_log2) {
  return records * (head_dim / (kPrefillVec << lanes_log2));
}

// Tile layout for a pass of `records` segments, from the blocks (items) each layout gives:
//   tiny   (2 threads x 4 = 8 channels, 128 token rows)  while 16-channel tiles leave half the SMs idle;
//   narrow (4 threads = 16 channels, 64 rows)            while 64-channel tiles leave half the SMs idle;
//   wide   (32 threads = 128 channels, 8 rows)           once its items fill 1.5 x the resident blocks;
//   mid    (16 threads = 64 channels, 16 rows)           between.
// Small tiles load a segment in one or two round trips over many SMs; wide ones do the least work per token.
inline int prefill_lanes_log2(int64_t records, int head_dim, int sms) {
  auto items = [&](int lanes_log2) { return layout_items(records, head_dim, lanes_log2); };
  if (items(kNarrow) < sms / 2) return kTiny;
  if (items(kMid) < sms / 2) return kNarrow;
  if (head_dim % (kPrefillVec << kWide) == 0 && 2 * items(kWide) >= 3 * (int64_t)sms * kPrefillBlocksPerSm)
    return kWide;
  return kMid;
}

// The layout of both lists in one cooperative launch, or -1 when its items do not fit the blocks resident at
// once even in the wide layout (a layout wider than the one chosen has fewer, larger items).
inline int prefill_at_once_lanes(int64_t records, int head_dim, int sms) {
  const int64_t resident = (int64_t)sms * kPrefillBlocksPerSm;
  int lanes = prefill_lanes_log2(records, head_dim, sms);
  if (layout_items(records, head_dim, lanes) > resident && head_dim % (kPrefillVec << kWide) == 0) lanes = kWide;
  return layout_items(records, head_dim, lanes) > resident ? -1 : lanes;
}

// Compress records a split launch scans for the ones that continue a chunk (list positions fit 16 bits).
constexpr int64_t kMaxScan = 2 * DSA_INLINE_RECORDS;

// How a prefill's records launch:
//   at once  - both lists in one cooperative launch: eager calls (not captured) of host plans whose records fit
//              one launch and whose items fit the resident blocks, without DSA_FLAG_NO_COOPERATIVE;
//   split    - host plans in two launches split by state reads (the compress records that continue a chunk,
//              then every other record), when the records that start a chunk outnumber those that continue
//              one, the compress list is at most kMaxScan records and each launch's records fit one launch;
//   passes   - the compress pass, then the write pass (device plans, larger plans, and the rest).
// num_continuing: the compress records that continue a chunk (a host plan's scan; -1 when not scanned).
enum PrefillRoute { kPrefillAtOnce, kPrefillSplit, kPrefillPasses };

// cooperative: a cooperative launch may be taken (no DSA_FLAG_NO_COOPERATIVE, the stream not capturing).
inline PrefillRoute prefill_route(const dsa_c128_prefill_params& p, int64_t num_compress, int64_t num_write,
                                  int64_t num_continuing, int sms, bool cooperative) {
  if (num_compress <= 0 || num_write <= 0 || !(p.flags & DSA_FLAG_HOST_PLAN)) return kPrefillPasses;
  const int64_t records = num_compress + num_write;
  if (cooperative && records <= DSA_INLINE_RECORDS &&
      prefill_at_once_lanes(records, p.head_dim, sms) >= 0)
    return kPrefillAtOnce;
  if (num_continuing < 0 || num_compress > kMaxScan) return kPrefillPasses;
  const int64_t num_fresh = num_compress - num_continuing;
  if (num_fresh <= num_continuing || num_continuing > DSA_INLINE_RECORDS || num_fresh + num_write > DSA_INLINE_RECORDS)
    return kPrefillPasses;
  return kPrefillSplit;
}

// ---- plan upload ----------------------------------------------------------------------------------
// dsa_c128_upload_plan: one record per thread, kUploadThreads to a block; a launch carries at most
// DSA_UPLOAD_RECORDS (1024) records in its parameters, so at most 8 blocks. At least one block: a call's first
// launch writes the plan's counts even for an empty plan.
constexpr int kUploadThreads = 128;

inline int upload_blocks(int count) { return std::max(1, (count + kUploadThreads - 1) / kUploadThreads); }

// ---- request and segment records ------------------------------------------------------------------
// dsa_request_records: one item per thread (a record carried in the launch; a request's slots and decode record; a
// padding row), kRecordsThreads to a block, at most kRecordsMaxBlocks blocks, beyond which threads loop over the
// items (as the c4 decode plan's do). At least one block: every call launches, even one with nothing to write
// (a batch of 0), and a grid of no blocks is not a launch.
constexpr int kRecordsThreads = 128;
constexpr int64_t kRecordsMaxBlocks = 4096;

inline int64_t records_blocks(int64_t items) {
  return std::clamp<int64_t>((items + kRecordsThreads - 1) / kRecordsThreads, 1, kRecordsMaxBlocks);
}

// ---- metadata copy ---------------------------------------------------------------------------------
// 128 threads per block, tiles of an unroll of int4 per thread. Small tiles spread a small copy over more SMs;
// large ones cut the per-tile work of a large copy. Small tiles go to blocks of 64 threads x 8 int4 (narrow
// blocks) once there are more than 1.5 tiles per SM, up to 16 blocks per SM (figures: docs/performance.md,
// "Fused metadata copy"). Large tiles begin at 2 x 8 small tiles per SM.
constexpr int kCopyThreads = 128, kCopyNarrowThreads = 64;
constexpr int kCopySmallUnroll = 4, kCopyNarrowUnroll = 8, kCopyLargeUnroll = 8;
constexpr int kCopyBlocksPerSm = 8, kCopyLargeBlocksPerSm = 16;

// Large tiles once the small ones would number over 2 per resident block.
inline bool copy_large_tiles(int64_t small_tiles, int sms) { return small_tiles >= 2 * (int64_t)sms * kCopyBlocksPerSm; }

// How a copy of `tiles` tiles to num_dst destinations (0: a count known at run time) launches:
//   per destination - K = 2 or 3 destinations of small tiles at most one block per SM when each block takes one
//                     tile and one destination: K blocks a tile (each reads its source, from L2 after the first),
//                     the copy on K times as many SMs;
//   large           - large tiles in blocks of kCopyThreads;
//   narrow          - small tiles in narrow blocks, past 1.5 tiles per SM;
//   small           - small tiles in blocks of kCopyThreads.
// With more tiles than the per-destination form takes, one block per tile storing to every destination is faster:
// the extra source reads cost more than the extra blocks gain (docs/performance.md). Grid: at most
// kCopyLargeBlocksPerSm blocks per SM, blocks striding over the tiles.
enum CopyForm { kCopyPerDestination, kCopyLarge, kCopyNarrow, kCopySmall };

struct CopyShape {
  CopyForm form = kCopySmall;
  int64_t grid = 0;
  int block = 0;
};

inline CopyShape copy_shape(int64_t tiles, int num_dst, bool large, int sms) {
  if ((num_dst == 2 || num_dst == 3) && !large && tiles * num_dst <= sms)  // (large tiles start far above one per SM)
    return CopyShape{kCopyPerDestination, tiles * num_dst, kCopyThreads};
  const int64_t grid = std::min<int64_t>(tiles, (int64_t)sms * kCopyLargeBlocksPerSm);
  if (large) return CopyShape{kCopyLarge, grid, kCopyThreads};
  if (2 * tiles > 3 * (int64_t)sms) return CopyShape{kCopyNarrow, grid, kCopyNarrowThreads};
  return CopyShape{kCopySmall, grid, kCopyThreads};
}

// ---- c4 -------------------------------------------------------------------------------------------
// Channels per thread of a c4 decode or compress launch of `count` rows: 2 where few rows leave the GPU
// waiting on one row's latency (twice the threads per row, half the serial work and registers each, the
// store's operands read before the window), 4 where many rows close at once and the narrower form's
// extra instructions and exchanges cost more (docs/performance.md, "c4 layers").
inline int c4_channels(int64_t count) { return count <= kC4NarrowRows ? 2 : 4; }

// The form of a c4 kernel with VEC channels per thread: threads per block (one row of the largest D), and
// whether it reads its store's operands before the window (the latency of a lone closing row) or after it
// (registers held across the window loads cost more when many rows close).
template <int VEC>
struct C4Form {
  static_assert(VEC == 2 || VEC == 4, "c4_channels picks 2 or 4");
  static constexpr int kThreadsLog2 = VEC == 2 ? 8 : 7;  // kC4MaxDim / VEC threads (kC4MaxDim is 512)
  static constexpr int kThreads = 1 << kThreadsLog2;
  static constexpr bool kAimsEarly = VEC == 2;
  // Whether a decode over a ring of state_bytes-byte values issues its window's loads before any exit or store
  // of the row: one memory trip fewer on a closing row's chain (the record, then the window), for more registers
  // held across the loads (a bf16 ring's rows held as the words loaded). Measured (docs/performance.md, "c4
  // layers"): 4-9 % off the decode at B <= 32 over either ring. In a 4-lane launch (136-153 registers a thread
  // against 88-100) only without stores: the storeless compress 9-22 % faster at B = 256 / 1024 random, where a
  // storing launch of 256 rows lost 13 % with every row closing and one of 1024 3-10 %.
  static constexpr bool window_first(int state_bytes, bool stores) {
    return (state_bytes == 4 || state_bytes == 2) && (VEC == 2 || !stores);
  }
  static_assert(kThreads == kC4MaxDim / VEC, "a block holds one row of the largest D");
};
// The host's reading of the same form (the launch's block size).
inline int c4_block_threads(int vec) { return vec == 2 ? C4Form<2>::kThreads : C4Form<4>::kThreads; }

// Blocks for `count` rows of a compressor of head_dim D, VEC channels per thread: D / VEC threads a row,
// c4_block_threads(VEC) a block.
inline int64_t c4_blocks(int head_dim, int vec, int64_t count) {
  const int rows = c4_block_threads(vec) / (head_dim / vec);
  return (count + rows - 1) / rows;
}

// ---- c4 plans -------------------------------------------------------------------------------------
// The decode plan: one request per thread, 128 to a block, so a step of 1024 requests spreads over 8
// multiprocessors (each record is two dependent table reads: latency, not bandwidth). The extend plan: a block
// per kC4PlanExtendRows ragged rows (a target verify of 1024 requests x 4 drafts: 8 blocks), each counting
// every request's rows and records (kC4PlanRequestsPerThread a thread, 2048 a pass) to number its own.
constexpr int kC4PlanThreads = 128;
constexpr int kC4PlanExtendThreads = 512;
constexpr int kC4PlanRequestsPerThread = 4;
constexpr int64_t kC4PlanExtendRows = 512;
constexpr int64_t kC4PlanMaxBlocks = 4096;  // beyond this, threads loop over requests

inline int64_t c4_plan_extend_blocks(int64_t num_tokens) {
  return std::max<int64_t>(1, (num_tokens + kC4PlanExtendRows - 1) / kC4PlanExtendRows);
}

inline int64_t c4_plan_decode_blocks(int64_t batch_size) {
  return std::clamp<int64_t>((batch_size + kC4PlanThreads - 1) / kC4PlanThreads, 1, kC4PlanMaxBlocks);
}

// ---- offline c128 ---------------------------------------------------------------------------------
// A closing row (a decode request, a compress record) reads 128 ring or input rows of 2 D values (512 KiB at
// D = 512 in fp32). Two forms:
// - the slice form, for few rows: one block per 64-channel slice of D streams it (16 groups of 16 lanes, group g
//   summing rows 8g .. 8g+7 of the slice, 4 channels a lane: 16-byte loads of 256-byte row slices, two rows a
//   warp instruction, 64 KiB per block), so a lone
//   closing row is spread over D / 64 SMs; the slices of a row form one thread-block cluster, whose first block
//   gathers the vector from the others' shared memory for the store (its RMSNorm needs all D channels);
// - the row form, from kOfflineExtendRowsFrom / kOfflineDecodeRowsFrom rows: one block of 512 threads per row (4
//   groups of 128 lanes, 4 channels a lane; at D < 512 only D / 4 lanes of each group sum, the others' loads go to
//   channels 0..3 and are dropped; group g sums window blocks g, g + 4, g + 8, g + 12; thread c merges channel c's 16
//   block sums from shared memory),
//   finishing the store inside the block. Enough rows fill the GPU without spreading
//   one over SMs, and a launch of D / 64-block clusters costs more to schedule than the spread gains (the slice
//   form's decode, with 512-thread blocks, ran 1.8x slower than another kernel of the same grid, block and
//   registers without clusters at B = 1024).
//   Measured both ways (docs/performance.md, "The offline c128 compressor", round 9, D = 512): an extend's rows
//   all close, and every extend of 64 records or more ran as fast or faster as rows (64 and 155 records:
//   1.00-1.41x), the one of a record 2x slower; a decode's requests mostly close nothing, its closing rows on one SM
//   each in the row form (one SM streams a lone row's 512 KiB at about 65 GB/s, the slice form D / 64 SMs): B = 32
//   ran 1.1-1.9x slower as rows, B = 256 and 1024 faster (round 3; this form 4-16 % faster again). So an extend
//   takes the row form from kOfflineExtendRowsFrom records, a decode from kOfflineDecodeRowsFrom requests (33-63
//   records and 33-255 requests not measured with this form).
//   The slice form's 4 channels a lane ran 1.02-1.48x the pace of 2 in the decode cells
//   and fp32 extends, and 4-13 % slower in a bf16 ring's long extends (docs/performance.md, round 7).
constexpr int kOfflineSlice = 64;     // channels per block (one store group)
constexpr int kOfflineMaxDim = 512;   // the largest D
// Channels per lane of the slice form: 4 (16-byte loads), but 2 in a bf16 ring's extend, whose compress records
// read most of their window from the fp32 input and ran 4-13 % slower with 4.
constexpr int offline_slice_vec(bool bf16_ring, bool extend) { return bf16_ring && extend ? 2 : 4; }
// Whether the slice form issues its store's operands and all its window loads before any sum (one memory trip
// fewer at each end of a closing row's chain): measured (docs/performance.md, "The offline c128 compressor") 5-12 %
// off an fp32 ring's extends; a bf16 ring's extend went from 62 to 81 registers a thread, one 512-thread block an
// SM where there were two (31-35 % slower), and the decodes at B = 32 closing 25-34 % slower.
constexpr bool offline_loads_first(bool bf16_ring, bool extend) { return !bf16_ring && extend; }
// Threads of a slice block: the 16 window blocks of 8 rows, a lane group of kOfflineSlice / vec lanes each.
constexpr int offline_slice_threads(int vec) { return 16 * (kOfflineSlice / vec); }
static_assert(kOfflineMaxDim / 2 <= offline_slice_threads(4), "a slice block holds the store's D / 2 threads");
// The row form stores each window block's sums to shared memory as 16-byte stores (4-byte ones conflict four ways
// on the banks), but in an fp32 ring's extend: measured (docs/performance.md, round 10) 7-9 % off the fp32 decodes'
// random-length cells, 2 % off the bf16 ones, and 1.6-2.6 % onto the fp32 extends of 64-155 records.
constexpr bool offline_row_wide_sums(bool bf16_ring, bool extend) { return bf16_ring || !extend; }
constexpr int64_t kOfflineExtendRowsFrom = 64;
constexpr int64_t kOfflineDecodeRowsFrom = 256;
// The row form's block: kOfflineRowGroups groups of kOfflineMaxDim / 4 lanes (4 channels each; D / 4 of them sum).
constexpr int kOfflineRowGroups = 4;
constexpr int kOfflineRowThreads = kOfflineRowGroups * kOfflineMaxDim / 4;
// One block an SM (128 registers a thread for its window's 16-byte loads in flight; the launch bound as measured).
constexpr int kOfflineRowBlocksPerSm = 1;
// Its shared memory: each of the 16 window blocks' (max, num, den) of every channel.
constexpr int offline_row_shared(int head_dim) { return 3 * 16 * head_dim * (int)sizeof(float); }

inline int offline_slices(int head_dim) { return head_dim / kOfflineSlice; }
inline bool offline_row_form(int64_t count, bool extend) {
  return count >= (extend ? kOfflineExtendRowsFrom : kOfflineDecodeRowsFrom);
}
// Blocks of one closing row's cluster: D / 64 in the slice form, 1 (no cluster) in the row form.
inline int offline_cluster(int head_dim, int64_t count, bool extend) {
  return offline_row_form(count, extend) ? 1 : offline_slices(head_dim);
}

// Blocks of a closing launch over `count` rows; fits false: too many.
inline Shape offline_shape(int head_dim, int64_t count, bool extend, int vec = 4) {
  Shape s;
  const bool rows = offline_row_form(count, extend);
  s.grid_x = rows ? count : count * offline_slices(head_dim);
  s.grid_y = s.grid_z = 1, s.block_x = rows ? kOfflineRowThreads : offline_slice_threads(vec), s.block_y = 1;
  s.fits = s.grid_x <= INT32_MAX;
  return s;
}

}  // namespace dsa
