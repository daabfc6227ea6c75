// The offline c128 compressor (docs/spec.md, "The offline c128 compressor"): the closing kernel (a decode's ring
// write and chunk entry, an extend's compress pass; the store fused) and the entry points (check, then host or
// device). An extend's write pass is the c4 write pass over rows of two D-wide parts (c4_device.cuh).
#include <cooperative_groups.h>
#include <type_traits>

#include "c128_offline_host.h"
#include "c128_offline_math.h"
#include "c4_device.cuh"
#include "checks.h"

DSA_DECLARE_STRUCT(DSA_STRUCT_C128_OFFLINE_PARAMS, dsa_c128_offline_params);

namespace dsa {
namespace {

struct OfflineLaunch {
  void* ring;
  int64_t ring_rows;
  const float* kv_score;
  const float* ape;
  float* out;
  int32_t head_dim;
  int32_t ring_size;        // the request-scoped decode
  int64_t count;            // decode: requests; compress: records
  int64_t num_tokens;       // compress: input rows
  const void* records;      // decode or compress records (null in the request-scoped decode)
  const int32_t* seq_lens;
  const int32_t* slots;
  uint32_t* error_count;
  int32_t stores;           // 1: store every closed chunk
  int32_t reserved;
  StoreLaunch store;
};

enum OfflineMode { kDecodeRecords, kDecodeRequests, kCompress };

// What a closing row is: the closing length, the new token's ring row (decode), the page its window rows come
// from, how many of them (0 .. ring_rows - 1; a decode reads all 128), the closing token's input row.
struct OfflineRow {
  uint32_t seq_len;
  int32_t write_row;
  int32_t page;
  int ring_rows;
  int64_t ragged;
};

// Record (or request) i of the launch; false: nothing to do (padding, a request not held here).
template <int kMode>
__device__ __forceinline__ bool offline_row(const OfflineLaunch& p, int64_t i, OfflineRow* r) {
  if constexpr (kMode == kCompress) {
    const int4 q = __ldg(reinterpret_cast<const int4*>(p.records) + i);
    if ((uint32_t)q.x == kC4Padding) return false;
    *r = OfflineRow{(uint32_t)q.x, -1, q.w, (int)((uint32_t)q.y >> 16), (int64_t)((uint32_t)q.y & 0xFFFFu)};
    return true;
  } else {
    C4DecodeRecord d;
    if constexpr (kMode == kDecodeRecords) {
      d = load_decode_record(p.records, i);
    } else {
      const int32_t seq = __ldg(p.seq_lens + i), slot = __ldg(p.slots + i);
      if (seq <= 0 || slot < 0) return false;
      d = offline_decode_record(seq, slot, p.ring_size);
    }
    if (d.seq_len == 0u || d.seq_len > 0x7FFFFFFFu) return false;
    *r = OfflineRow{d.seq_len, d.write_row, d.current_group, kOfflineWindow, i};
    return true;
  }
}

// The row form's helpers. A decode's new row is written by the `writer` threads (VEC channels from ch each), then
// the row goes on where it closes a chunk the ring holds; a compress record goes on where it fits the call. False:
// nothing more to do (a row that does not fit is counted once, by `first`).
template <typename S, int kMode, int VEC>
__device__ __forceinline__ bool offline_row_fits(const OfflineLaunch& p, const OfflineRow& r, int ch, bool writer,
                                                 bool first) {
  bool fits;
  if constexpr (kMode != kCompress) {
    if (r.write_row < 0 || r.write_row >= p.ring_rows) {
      if (first) count_error(p.error_count);
      return false;
    }
    if (writer) {
      const float* in = p.kv_score + r.ragged * 2 * p.head_dim + ch;
      const Lanes<VEC> half[2] = {load_lanes<VEC>(in), load_lanes<VEC>(in + p.head_dim)};
      ring_store<S, VEC, 2>(static_cast<S*>(p.ring), r.write_row, p.head_dim, ch, half);
    }
    if (!closes_chunk(r.seq_len)) return false;
    fits = page_ok(r.page, p.ring_rows);
  } else {
    fits = offline_compress_fits(r.seq_len, r.ragged, r.ring_rows, r.page, p.num_tokens, p.ring_rows);
  }
  if (!fits && first) count_error(p.error_count);
  return fits;
}

template <int VEC>
struct WindowRow {
  Lanes<VEC> value, score;
};

// Where a closing row's window rows are read from: kRowsAny, the ring's page (a decode) or, a compress record's rows
// past ring_rows, the call's input rows; kRowsInput, the input rows only (a compress record with ring_rows 0).
enum WindowRows { kRowsAny, kRowsInput };
template <int kRows>
using RowsFrom = std::integral_constant<int, kRows>;

// Row j of a closing row's window, this thread's VEC channels from ch (kRows: WindowRows).
template <typename S, int kMode, int VEC, int kRows>
__device__ __forceinline__ WindowRow<VEC> window_row(const OfflineLaunch& p, const OfflineRow& r, int j, int ch) {
  const int D = p.head_dim;
  WindowRow<VEC> w;
  if constexpr (kRows == kRowsInput) {
    const float* at = p.kv_score + (r.ragged - (kOfflineWindow - 1) + j) * 2 * D + ch;
    w.value = load_lanes<VEC>(at), w.score = load_lanes<VEC>(at + D);
  } else if constexpr (kMode == kCompress && std::is_same<S, Bf16>::value) {  // rows of either width, no branch
    const bool ring = j < r.ring_rows;
    const Bf16* ring_at = static_cast<const Bf16*>(p.ring) + ((int64_t)r.page * kOfflineWindow + j) * 2 * D + ch;
    const float* input_at = p.kv_score + (r.ragged - (kOfflineWindow - 1) + j) * 2 * D + ch;
    w.value = load_state_or_lanes<VEC>(ring, ring_at, input_at);
    w.score = load_state_or_lanes<VEC>(ring, ring_at + D, input_at + D);
  } else if (kMode != kCompress || j < r.ring_rows) {
    const S* at = static_cast<const S*>(p.ring) + ((int64_t)r.page * kOfflineWindow + j) * 2 * D + ch;
    w.value = load_state<VEC, S>(at), w.score = load_state<VEC, S>(at + D);
  } else {
    const float* at = p.kv_score + (r.ragged - (kOfflineWindow - 1) + j) * 2 * D + ch;
    w.value = load_lanes<VEC>(at), w.score = load_lanes<VEC>(at + D);
  }
  return w;
}

// Runs `read` (a window's loop, taking a RowsFrom) for the row's window: a bf16 ring's extend reads a record the
// input holds whole (ring_rows 0) from the input alone, without the ring's predicated load a row; every other row
// as kRowsAny.
template <typename S, int kMode, typename Read>
__device__ __forceinline__ void with_window_rows(const OfflineRow& r, Read&& read) {
  if constexpr (kMode == kCompress && std::is_same<S, Bf16>::value) {
    if (r.ring_rows == 0) {
      read(RowsFrom<kRowsInput>{});
      return;
    }
  }
  read(RowsFrom<kRowsAny>{});
}

// The store of the row's vector aimed (its cache slot, rotary row, norm weights and rotary pairs of this thread's
// 2 channels from ch), the loads issued before the window's.
__device__ __forceinline__ void aim_offline_store(const OfflineLaunch& p, const OfflineRow& r, int ch,
                                                  StoreOperands<2>& o) {
  const int64_t loc = __ldg(p.store.cache_slots + r.ragged), pos = (int64_t)r.seq_len - kOfflineWindow;
  load_weights<2>(o, p.store, ch);
  load_rotary<2>(o, p.store, p.head_dim, ch, pos);
  aim_store<2>(o, p.store, loc, pos, p.head_dim);
}

// The blocks of one closing row form a thread-block cluster (sm_90 and later; the entry points refuse older
// devices): a barrier over the cluster, after which every block's shared memory written before it is visible
// to all, and another block's shared memory.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#endif
}

__device__ __forceinline__ const float* cluster_shared(float* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  return p;
#endif
}

// Why the store is finished by the cluster's first block: the store's RMSNorm needs all D channels, each slice's
// block holds 64. A second launch would need `out` (optional here) or a scratch buffer; a last-block counter a
// scratch buffer that is zeroed and reset. The cluster needs neither: the first block reads the other blocks'
// slices from their shared memory and runs the standalone store's epilogue (store.cuh) over the whole vector,
// so fused and standalone stores stay one code. Two cluster barriers: the slices written, then read.
// The slice form reads its window and writes its row in its own lines, not through the row form's helpers above:
// written through them its code grew and its small-B cells ran 3-16 % slower (docs/performance.md); a bf16 ring's
// extend alone reads its rows through window_row (its rows of either width without a branch).
template <typename S, int kMode, int VEC>
__global__ void __launch_bounds__(offline_slice_threads(VEC))
    offline_slice_kernel(const __grid_constant__ OfflineLaunch p) {
  constexpr int kLanes = kOfflineSlice / VEC;
  static_assert(offline_slice_threads(VEC) == kOfflineBlocks * kLanes, "a lane group a window block");
  __shared__ __align__(16) float block_max[kOfflineBlocks][kOfflineSlice];
  __shared__ __align__(16) float block_num[kOfflineBlocks][kOfflineSlice];
  __shared__ __align__(16) float block_den[kOfflineBlocks][kOfflineSlice];
  __shared__ __align__(16) float slice[kOfflineSlice];
  const int D = p.head_dim, slices = D / kOfflineSlice;
  const unsigned rank = blockIdx.x % (unsigned)slices;  // clusters run along x: a row's slices are its blocks
  const int64_t i = blockIdx.x / (unsigned)slices;
  // kLanes lanes per window block (VEC channels each), one window block of 8 rows each
  const int blk = (int)threadIdx.x / kLanes, lane = (int)threadIdx.x % kLanes;
  const int ch = (int)rank * kOfflineSlice + VEC * lane;
  wait_for_producers();
  allow_dependents();
  // A decode's new row (its slice, by the last window block's lanes) is read in the record's trip: its address
  // is the request's.
  constexpr int kLastBlock = kOfflineBlocks - 1;
  Lanes<VEC> half[2];
  if (kMode != kCompress && blk == kLastBlock) {
    const float* in = p.kv_score + i * 2 * D + ch;
    half[0] = load_lanes<VEC>(in), half[1] = load_lanes<VEC>(in + D);
  }
  OfflineRow r;
  if (!offline_row<kMode>(p, i, &r)) return;
  const bool first = rank == 0 && threadIdx.x == 0;  // counts a skipped row once
  S* ring = static_cast<S*>(p.ring);
  bool own = false;  // the new row is the window's last row, summed from the last window block's lanes' registers
  if constexpr (kMode != kCompress) {
    if (r.write_row < 0 || r.write_row >= p.ring_rows) {
      if (first) count_error(p.error_count);
      return;
    }
    if (blk == kLastBlock) ring_store<S, VEC, 2>(ring, r.write_row, D, ch, half);
    if (!closes_chunk(r.seq_len)) return;
    if (!page_ok(r.page, p.ring_rows)) {
      if (first) count_error(p.error_count);
      return;
    }
    // The closing token is its page's last row (position 128n + 127) unless a record says otherwise; then the new
    // row as written (a bf16 ring rounds it) is read back below, by whichever lanes hold it.
    own = r.write_row == (int64_t)r.page * kOfflineWindow + (kOfflineWindow - 1);
    if (!own) __syncthreads();
  } else if (!offline_compress_fits(r.seq_len, r.ragged, r.ring_rows, r.page, p.num_tokens, p.ring_rows)) {
    if (first) count_error(p.error_count);
    return;
  }
  // The loads-first form (launch_policy.h, offline_loads_first; an extend over an fp32 ring): the storing threads'
  // cache slot, norm weights and rotary pairs leave with the window, not after the cluster's two barriers (one
  // trip at the end of the chain), and every window row's loads before any sum on them (summed as loaded, each
  // row's sums waited for its loads before the next row's left: one trip a row in the SASS).
  constexpr bool kFirst = offline_loads_first(std::is_same<S, Bf16>::value, kMode == kCompress);
  const bool storer = kFirst && p.stores && rank == 0 && (int)threadIdx.x < D / 2;
  int64_t early_loc = 0;
  StoreOperands<2> early;
  if (storer) {
    early_loc = __ldg(p.store.cache_slots + r.ragged);
    load_weights<2>(early, p.store, 2 * (int)threadIdx.x);
    load_rotary<2>(early, p.store, D, 2 * (int)threadIdx.x, (int64_t)r.seq_len - kOfflineWindow);
  }
  // this thread sums window rows 8 blk .. 8 blk + 7 of its VEC channels (window_math.h's block)
  float kv[VEC][kOfflineBlockRows], z[VEC][kOfflineBlockRows];
  if constexpr (kFirst) {  // a window row from the ring or the input, one load either way
    Lanes<VEC> bias[kOfflineBlockRows], value[kOfflineBlockRows], score[kOfflineBlockRows];
#pragma unroll
    for (int k = 0; k < kOfflineBlockRows; ++k) {
      const int j = blk * kOfflineBlockRows + k;
      bias[k] = load_lanes<VEC>(p.ape + j * D + ch);
      const S* ring_at = ring + ((int64_t)r.page * kOfflineWindow + j) * 2 * D + ch;
      const float* input_at = p.kv_score + (r.ragged - (kOfflineWindow - 1) + j) * 2 * D + ch;
      const float* at = j < r.ring_rows ? ring_at : input_at;
      value[k] = load_state<VEC, float>(at), score[k] = load_state<VEC, float>(at + D);
    }
#pragma unroll
    for (int k = 0; k < kOfflineBlockRows; ++k)
#pragma unroll
      for (int c = 0; c < VEC; ++c) kv[c][k] = value[k].v[c], z[c][k] = score[k].v[c] + bias[k].v[c];
  } else {
    const auto read_window = [&](auto rows) {
#pragma unroll
      for (int k = 0; k < kOfflineBlockRows; ++k) {
        const int j = blk * kOfflineBlockRows + k;
        const Lanes<VEC> bias = load_lanes<VEC>(p.ape + j * D + ch);
        Lanes<VEC> value, score;
        if (kMode != kCompress && own && blk == kLastBlock && k == kOfflineBlockRows - 1) {
#pragma unroll
          for (int c = 0; c < VEC; ++c) value.v[c] = as_stored<S>(half[0].v[c]), score.v[c] = as_stored<S>(half[1].v[c]);
        } else if constexpr (decltype(rows)::value == kRowsInput || (kMode == kCompress && std::is_same<S, Bf16>::value)) {
          const WindowRow<VEC> row = window_row<S, kMode, VEC, decltype(rows)::value>(p, r, j, ch);
          value = row.value, score = row.score;
        } else if (kMode != kCompress || j < r.ring_rows) {
          const S* at = ring + ((int64_t)r.page * kOfflineWindow + j) * 2 * D + ch;
          value = load_state<VEC, S>(at), score = load_state<VEC, S>(at + D);
        } else {
          const float* at = p.kv_score + (r.ragged - (kOfflineWindow - 1) + j) * 2 * D + ch;
          value = load_lanes<VEC>(at), score = load_lanes<VEC>(at + D);
        }
#pragma unroll
        for (int c = 0; c < VEC; ++c) kv[c][k] = value.v[c], z[c][k] = score.v[c] + bias.v[c];
      }
    };
    with_window_rows<S, kMode>(r, read_window);
  }
  WindowSum w[VEC];
#pragma unroll
  for (int c = 0; c < VEC; ++c) w[c] = window_sum(kv[c], z[c], 0);
  const int at = VEC * lane;
#pragma unroll
  for (int c = 0; c < VEC; ++c)
    block_max[blk][at + c] = w[c].max, block_num[blk][at + c] = w[c].num, block_den[blk][at + c] = w[c].den;
  __syncthreads();
  if ((int)threadIdx.x < kOfflineSlice) {  // a channel a thread: its 16 blocks merged in order
    const int c = (int)threadIdx.x;
    WindowSum blocks[kOfflineBlocks];
#pragma unroll
    for (int b = 0; b < kOfflineBlocks; ++b) blocks[b] = WindowSum{block_max[b][c], block_num[b][c], block_den[b][c]};
    const float x = window_value(merge_windows(blocks));
    slice[c] = x;
    if (p.out != nullptr) p.out[i * D + (int)rank * kOfflineSlice + c] = x;
  }
  if (!p.stores) return;  // the same for every block of the cluster: none waits at a barrier below
  cluster_sync();
  const bool storing = rank == 0 && (int)threadIdx.x < D / 2;
  float x[2];
  if (storing) {
    const int c = 2 * (int)threadIdx.x;
    const float* from = cluster_shared(slice, (unsigned)(c / kOfflineSlice)) + c % kOfflineSlice;
    x[0] = from[0], x[1] = from[1];
  }
  cluster_sync();  // every slice read: the other blocks may leave
  if (!storing) return;
  const int c = 2 * (int)threadIdx.x;
  const int64_t pos = (int64_t)r.seq_len - kOfflineWindow;
  int64_t loc = early_loc;
  StoreOperands<2> o = early;
  if constexpr (!kFirst) {
    loc = __ldg(p.store.cache_slots + (kMode == kCompress ? r.ragged : i));
    load_weights<2>(o, p.store, c);
    load_rotary<2>(o, p.store, D, c, pos);
  }
  aim_store<2>(o, p.store, loc, pos, D);
  store_vector<2>(p.store, x, o, D, c, D / 2, p.error_count, 0);
}

// The row form (launch_policy.h): one block of kOfflineRowThreads threads per closing row: kOfflineRowGroups
// groups of kOfflineMaxDim / 4 lanes (4 channels a lane, 16-byte loads; at D < 512 the lanes past D / 4 read
// channels 0..3 and drop them), group g summing window blocks g, g + 4, g + 8, g + 12 of its channels (8 rows
// each), so a block keeps four times the bytes in flight of a thread a channel. Each block's sums go to shared
// memory as they are made (offline_row_shared(D) bytes, no register held across the window), and thread c merges
// channel c's 16 in block order (the slice form's arithmetic: both forms give the same bits); the vector passes
// through shared memory to the D / 2 storing threads.
template <typename S, int kMode>
__global__ void __launch_bounds__(kOfflineRowThreads, kOfflineRowBlocksPerSm)
    offline_row_kernel(const __grid_constant__ OfflineLaunch p) {
  constexpr int VEC = 4, kGroups = kOfflineRowGroups, kLanes = kOfflineMaxDim / VEC;
  constexpr bool kWideSums = offline_row_wide_sums(std::is_same<S, Bf16>::value, kMode == kCompress);
  static_assert(kOfflineRowThreads == kGroups * kLanes, "a group of lanes covers the largest D");
  extern __shared__ __align__(16) float sums[];  // [max | num | den][block][channel]
  const int D = p.head_dim, tid = (int)threadIdx.x;
  const int group = tid / kLanes, lane_ch = VEC * (tid % kLanes);
  const bool lanes = lane_ch < D;  // D < 512 leaves lanes idle: they read channels 0.. too, and drop what they sum
  const int ch = lanes ? lane_ch : 0;
  const int64_t i = blockIdx.x;
  wait_for_producers();
  allow_dependents();
  OfflineRow r;
  if (!offline_row<kMode>(p, i, &r)) return;
  // the last group sums the window's last block, where a decode's new row usually is: it writes the row
  constexpr int kLast = kGroups - 1;
  if (!offline_row_fits<S, kMode, VEC>(p, r, ch, lanes && group == kLast, tid == 0)) return;
  if constexpr (kMode != kCompress) {
    // the new row as written (a bf16 ring rounds it), read by the lanes whose block holds it: the writers' own
    // unless a record puts it elsewhere than its page's last row
    if (r.write_row != (int64_t)r.page * kOfflineWindow + (kOfflineWindow - 1)) __syncthreads();
  }
  const bool storing = p.stores && tid < D / 2;
  StoreOperands<2> o;
  if (storing) aim_offline_store(p, r, 2 * tid, o);
  float* const at_max = sums;
  float* const at_num = sums + kOfflineBlocks * D;
  float* const at_den = sums + 2 * kOfflineBlocks * D;
  const auto sum_window = [&](auto rows) {
#pragma unroll
    for (int k = 0; k < kOfflineBlocks / kGroups; ++k) {
      const int b = k * kGroups + group;
      float kv[VEC][kOfflineBlockRows], z[VEC][kOfflineBlockRows];
#pragma unroll
      for (int q = 0; q < kOfflineBlockRows; ++q) {
        const int j = b * kOfflineBlockRows + q;
        const WindowRow<VEC> row = window_row<S, kMode, VEC, decltype(rows)::value>(p, r, j, ch);
        const Lanes<VEC> bias = load_lanes<VEC>(p.ape + j * D + ch);
#pragma unroll
        for (int c = 0; c < VEC; ++c) kv[c][q] = row.value.v[c], z[c][q] = row.score.v[c] + bias.v[c];
      }
      if (!lanes) continue;
      if constexpr (kWideSums) {  // a block's sums as three 16-byte shared stores (4-byte ones conflict four ways)
        float4 m, n, d;
        float* const mv = &m.x;
        float* const nv = &n.x;
        float* const dv = &d.x;
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
          const WindowSum w = window_sum(kv[c], z[c], 0);
          mv[c] = w.max, nv[c] = w.num, dv[c] = w.den;
        }
        *reinterpret_cast<float4*>(at_max + b * D + ch) = m;
        *reinterpret_cast<float4*>(at_num + b * D + ch) = n;
        *reinterpret_cast<float4*>(at_den + b * D + ch) = d;
      } else {
#pragma unroll
        for (int c = 0; c < VEC; ++c) {
          const WindowSum w = window_sum(kv[c], z[c], 0);
          at_max[b * D + ch + c] = w.max, at_num[b * D + ch + c] = w.num, at_den[b * D + ch + c] = w.den;
        }
      }
    }
  };
  with_window_rows<S, kMode>(r, sum_window);
  __syncthreads();
  float x = 0.0f;
  if (tid < D) {
    WindowSum blocks[kOfflineBlocks];
#pragma unroll
    for (int b = 0; b < kOfflineBlocks; ++b)
      blocks[b] = WindowSum{at_max[b * D + tid], at_num[b * D + tid], at_den[b * D + tid]};
    x = window_value(merge_windows(blocks));
    if (p.out != nullptr) p.out[i * D + tid] = x;
  }
  if (!p.stores) return;
  __syncthreads();  // every block sum read: the vector takes their place
  if (tid < D) sums[tid] = x;
  __syncthreads();
  if (!storing) return;
  const float pair[2] = {sums[2 * tid], sums[2 * tid + 1]};
  store_vector<2>(p.store, pair, o, D, 2 * tid, D / 2, p.error_count, 0);
}

// ---- checks and launches ----------------------------------------------------------------------------

// A host plan (DSA_FLAG_HOST_PLAN: records in host memory) is checked before anything runs: a record that is
// not padding and does not fit this call fails the call, naming it. Records of other origins are data.
dsa_status check_offline_host_plan(const dsa_c128_offline_params& p, const char* op) {
  if (!(p.flags & DSA_FLAG_HOST_PLAN)) return DSA_STATUS_OK;
  for (int64_t i = 0; i < p.num_compress; ++i) {
    const dsa_c4_compress_record& r = p.compress[i];
    if (r.seq_len != kC4Padding &&
        !offline_compress_fits(r.seq_len, r.ragged_id, r.ring_rows, r.current_group, p.num_tokens, p.ring_rows))
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: compress record %lld {seq_len %u, ragged_id %u, ring_rows %u, "
                  "page %d} does not fit this call (%lld input rows, a ring of %lld rows): a plan made for other "
                  "inputs?", op, (long long)i, r.seq_len, (unsigned)r.ragged_id, (unsigned)r.ring_rows,
                  r.current_group, (long long)p.num_tokens, (long long)p.ring_rows);
  }
  for (int64_t i = 0; i < p.num_write; ++i) {
    const dsa_c4_write_record& w = p.write[i];
    if (w.ragged_id != kC4Padding &&
        ((int64_t)w.ragged_id >= p.num_tokens || w.ring_row < 0 || w.ring_row >= p.ring_rows))
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: write record %lld {ragged_id %u, ring_row %d} does not fit this "
                  "call (%lld input rows, a ring of %lld rows): a plan made for other inputs?", op, (long long)i,
                  w.ragged_id, w.ring_row, (long long)p.num_tokens, (long long)p.ring_rows);
  }
  return DSA_STATUS_OK;
}

enum OfflineOp { kOpDecode, kOpExtend };

struct OfflineChecked {
  bool nothing = false;
  StoreLaunch store = {};
};

// The fields both ops read: D, the ring, the input, the store.
dsa_status check_offline_ring(const dsa_c128_offline_params& p, bool nothing, const char* op, OfflineChecked* checked) {
  const int D = p.head_dim;
  if (D != 128 && D != 256 && D != 512)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: head_dim is %d; expected 128, 256 or 512", op, D);
  if (p.ring_dtype != DSA_STATE_FLOAT32 && p.ring_dtype != DSA_STATE_BFLOAT16)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: ring_dtype is %d; expected %d (float32) or %d (bfloat16)", op,
                p.ring_dtype, DSA_STATE_FLOAT32, DSA_STATE_BFLOAT16);
  if (p.ring == nullptr || p.ape == nullptr)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: ring and ape must be non-null", op);
  if (p.kv_score == nullptr && !nothing)  // an empty call may come with an empty (null) input
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: kv_score must be non-null", op);
  if (p.ring_rows < kOfflineWindow || p.ring_rows % kOfflineWindow != 0 || p.ring_rows > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: ring_rows is %lld; expected a multiple of 128 in 128..2^31-1", op,
                (long long)p.ring_rows);
  if (p.device != DSA_DEVICE_HOST &&
      (!aligned(p.ring, 16) || !aligned(p.kv_score, 16) || !aligned(p.ape, 16) || !aligned(p.out, 16)))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: on the GPU, ring, kv_score, ape and out must be 16-byte aligned", op);
  if (p.store != nullptr && !nothing) {  // an empty call's cache_slots may be null (nothing is stored)
    if (p.cache_slots == nullptr) return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: a store needs cache_slots", op);
    DSA_TRY(store_launch(p.store, p.cache_slots, D, p.device, op, &checked->store));
  } else if (p.store != nullptr) {
    DSA_TRY(check_struct(p.store, op));
  }
  return DSA_STATUS_OK;
}

dsa_status check_offline(const dsa_c128_offline_params& p, OfflineOp kind, const char* op, OfflineChecked* checked) {
  const bool nothing = kind == kOpExtend ? p.num_compress == 0 && p.num_write == 0 : p.batch_size == 0;
  DSA_TRY(check_offline_ring(p, nothing, op, checked));
  const bool gpu = p.device != DSA_DEVICE_HOST;
  if (kind == kOpDecode) {
    if (p.batch_size < 0 || p.batch_size > INT32_MAX)
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size is %lld; expected 0..%d", op, (long long)p.batch_size,
                  INT32_MAX);
    if (p.decode_records == nullptr && !nothing) {  // the request-scoped ring
      if (p.ring_size < kOfflineWindow || p.ring_size % kOfflineWindow != 0 || p.ring_rows % p.ring_size != 0)
        return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: ring_size is %d; expected a multiple of 128 dividing ring_rows "
                    "(%lld): a request-scoped ring holds num_slots * ring_size rows", op, p.ring_size,
                    (long long)p.ring_rows);
      if (p.seq_lens == nullptr || p.slots == nullptr)
        return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: seq_lens and slots must be non-null (or decode_records given)",
                    op);
    }
    if (gpu && !aligned(p.decode_records, 16))
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: on the GPU, decode_records must be 16-byte aligned", op);
  } else {
    DSA_TRY(check_extend_lists(p.num_tokens, p.num_compress, p.num_write, p.compress, p.write, p.flags, gpu, op));
    DSA_TRY(check_offline_host_plan(p, op));
  }
  if (!offline_shape(p.head_dim, kind == kOpExtend ? p.num_compress : p.batch_size, kind == kOpExtend).fits)
    return too_large(op);
  checked->nothing = nothing;
  return DSA_STATUS_OK;
}

// Thread-block clusters came with sm_90: an older device is refused by name (cached per device).
dsa_status check_clusters(int device, const char* op) {
  static int majors[kMaxDevices] = {};
  int major = __atomic_load_n(&majors[device], __ATOMIC_RELAXED);
  if (major == 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      cudaGetLastError();
      return fail(DSA_STATUS_CUDA_ERROR, "%s: cannot query device %d", op, device);
    }
    __atomic_store_n(&majors[device], major, __ATOMIC_RELAXED);
  }
  if (major < 9)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: device %d is sm_%d0-class; the offline c128 ops need sm_90 or newer "
                "(thread-block clusters)", op, device, major);
  return DSA_STATUS_OK;
}

// The row form's shared memory (over the default 48 KiB at D = 512), allowed once per instance and device (the
// flags are the instance's own: every instance has the one function-pointer type); again: allowed anew (a context
// made since, as after a device reset, has lost it).
template <typename S, int kMode>
dsa_status offline_row_shared_memory(int device, bool again, const char* op) {
  static int allowed[kMaxDevices] = {};
  if (!again && __atomic_load_n(&allowed[device], __ATOMIC_ACQUIRE)) return DSA_STATUS_OK;
  const int bytes = offline_row_shared(kOfflineMaxDim);
  const cudaError_t err =
      cudaFuncSetAttribute(offline_row_kernel<S, kMode>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return fail(DSA_STATUS_CUDA_ERROR, "%s: device %d cannot give the offline row form %d bytes of shared memory: %s",
                op, device, bytes, cudaGetErrorString(err));
  }
  __atomic_store_n(&allowed[device], 1, __ATOMIC_RELEASE);
  return DSA_STATUS_OK;
}
static_assert(offline_row_shared(1) == 3 * kOfflineBlocks * (int)sizeof(float), "(max, num, den) of each window block");

OfflineLaunch offline_launch(const dsa_c128_offline_params& p, const OfflineChecked& c) {
  OfflineLaunch a = {};
  a.ring = p.ring, a.ring_rows = p.ring_rows, a.kv_score = p.kv_score, a.ape = p.ape, a.out = p.out;
  a.head_dim = p.head_dim, a.ring_size = p.ring_size, a.num_tokens = p.num_tokens;
  a.seq_lens = p.seq_lens, a.slots = p.slots, a.error_count = p.error_count;
  a.stores = p.store != nullptr, a.store = c.store;
  return a;
}

// The closing kernel over `count` rows in the form launch_policy.h picks: clusters of D / 64 blocks (the slice
// form), or a block a row (the row form).
template <typename S, int kMode>
dsa_status launch_closing(const dsa_c128_offline_params& p, OfflineLaunch a, int64_t count, const void* records,
                          cudaStream_t stream, const char* op) {
  constexpr int kVec = offline_slice_vec(std::is_same<S, Bf16>::value, kMode == kCompress);
  a.count = count, a.records = records;
  constexpr bool kExtend = kMode == kCompress;
  const Shape shape = offline_shape(p.head_dim, count, kExtend, kVec);
  const unsigned mode = (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u;
  if (offline_row_form(count, kExtend)) {
    DSA_TRY((offline_row_shared_memory<S, kMode>(p.device, false, op)));
    const auto go = [&] {
      return launch_shared(offline_row_kernel<S, kMode>, grid_of(shape), block_of(shape),
                           offline_row_shared(p.head_dim), stream, mode, a);
    };
    cudaError_t err = go();
    if (err == cudaErrorInvalidValue) {  // the allowance lost with its context: allowed anew, tried once more
      cudaGetLastError();
      DSA_TRY((offline_row_shared_memory<S, kMode>(p.device, true, op)));
      err = go();
    }
    return launch_status(err, op);
  }
  cudaLaunchAttribute attributes[2];
  unsigned n = 0;
  attributes[n].id = cudaLaunchAttributeClusterDimension;
  attributes[n++].val.clusterDim = {(unsigned)offline_cluster(p.head_dim, count, kExtend), 1, 1};
  if (mode & kLaunchPdl) {
    attributes[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid_of(shape), config.blockDim = block_of(shape), config.stream = stream;
  config.attrs = attributes, config.numAttrs = n;
  return launch_status(cudaLaunchKernelEx(&config, offline_slice_kernel<S, kMode, kVec>, a), op);
}

// The write pass: the c4 write kernel over one ring of rows [kv | score].
template <typename S>
dsa_status launch_writes(const dsa_c128_offline_params& p, cudaStream_t stream, const char* op) {
  C4Launch a = {};
  a.side[0] = C4Side{p.head_dim, 0, p.ring, p.ring_rows, p.kv_score, p.ape, nullptr, StoreLaunch{}};
  const int64_t blocks = c4_blocks(p.head_dim, kC4WriteChannels, p.num_write);
  a.blocks0 = (uint32_t)blocks, a.count = p.num_write, a.num_tokens = p.num_tokens;
  a.records = p.write, a.error_count = p.error_count;
  const unsigned mode = (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u;
  return launch_status(launch(c4_write_kernel<S, 2>, dim3((unsigned)blocks),
                              dim3(c4_block_threads(kC4WriteChannels)), stream, mode, a), op);
}

template <typename S>
dsa_status offline_decode(const dsa_c128_offline_params& p, const OfflineLaunch& a, cudaStream_t s, const char* op) {
  if (p.decode_records != nullptr) return launch_closing<S, kDecodeRecords>(p, a, p.batch_size, p.decode_records, s, op);
  return launch_closing<S, kDecodeRequests>(p, a, p.batch_size, nullptr, s, op);
}

// The compress pass, then the write pass, in stream order.
template <typename S>
dsa_status offline_extend(const dsa_c128_offline_params& p, const OfflineLaunch& a, cudaStream_t s, const char* op) {
  if (p.num_compress > 0) DSA_TRY((launch_closing<S, kCompress>(p, a, p.num_compress, p.compress, s, op)));
  if (p.num_write > 0) DSA_TRY(launch_writes<S>(p, s, op));
  return DSA_STATUS_OK;
}

// Both entry points: dispatch (check, then host or device) with the op's kind; `device(p, launch, stream)` runs
// the launches with the ring's element type.
template <typename Device>
dsa_status offline_entry(const dsa_c128_offline_params* params, void* stream, OfflineOp kind, const char* op,
                         void (*host)(const dsa_c128_offline_params&), Device&& device) {
  return dispatch<OfflineChecked>(
      params, stream, op,
      [kind](const dsa_c128_offline_params& p, const char* name, OfflineChecked* c) {
        return check_offline(p, kind, name, c);
      },
      host,
      [&device](const dsa_c128_offline_params& p, const OfflineChecked& c, int, cudaStream_t s, const char* name) {
        DSA_TRY(check_clusters(p.device, name));
        return device(p, offline_launch(p, c), s);
      });
}

}  // namespace
}  // namespace dsa

extern "C" dsa_status dsa_c128_offline_decode(const dsa_c128_offline_params* params, void* stream) {
  using namespace dsa;
  const char* op = "dsa_c128_offline_decode";
  return offline_entry(params, stream, kOpDecode, op, host_c128_offline_decode,
                       [op](const dsa_c128_offline_params& p, const OfflineLaunch& a, cudaStream_t s) {
                         if (p.ring_dtype == DSA_STATE_BFLOAT16) return offline_decode<Bf16>(p, a, s, op);
                         return offline_decode<float>(p, a, s, op);
                       });
}

extern "C" dsa_status dsa_c128_offline_extend(const dsa_c128_offline_params* params, void* stream) {
  using namespace dsa;
  const char* op = "dsa_c128_offline_extend";
  return offline_entry(params, stream, kOpExtend, op, host_c128_offline_extend,
                       [op](const dsa_c128_offline_params& p, const OfflineLaunch& a, cudaStream_t s) {
                         if (p.ring_dtype == DSA_STATE_BFLOAT16) return offline_extend<Bf16>(p, a, s, op);
                         return offline_extend<float>(p, a, s, op);
                       });
}
