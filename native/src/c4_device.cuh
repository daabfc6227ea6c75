// Device code of the raw rings (docs/spec.md, "The ring"): a c4 launch's compressors, the mapping of threads to
// rows and channels, ring row stores and the write pass, which the offline c128 extend shares (same write
// records, rows of 2 D-wide parts instead of 4).
#pragma once

#include "device.cuh"
#include "c4_math.h"
#include "store.cuh"

namespace dsa {
namespace {

// One compressor inside a launch.
struct C4Side {
  int32_t head_dim;
  int32_t store_kind;  // 0: none, 1 + DSA_CACHE_V4 or 1 + DSA_CACHE_INDEXER
  void* ring;
  int64_t ring_rows;
  const float* kv_score;
  const float* ape;
  float* out;
  StoreLaunch store;
};

struct C4Launch {
  C4Side side[2];
  uint32_t blocks0;     // blocks of compressor 0; the rest are compressor 1's
  int32_t ring_size;    // request-scoped modes
  int32_t num_drafts;   // verify
  uint32_t records_ahead;  // DSA_FLAG_RECORDS_AHEAD: decode records read before the wait for the producers
  int64_t count;        // decode: requests; extend: records of the pass; verify: B * V
  int64_t num_tokens;   // input rows
  const void* records;  // decode / compress / write records (null in the request-scoped modes)
  const int32_t* seq_lens;
  const int32_t* slots;
  uint32_t* error_count;
};

enum C4Mode { kC4Records, kC4Requests };

// This thread's compressor, request row and channels (VEC consecutive ones): compressor 0 owns the first
// blocks0 blocks.
struct C4Thread {
  const C4Side* c;
  int D, lanes, row, ch;
  int64_t i;  // record / request index
};

// Decode record i of a record list (seq_len, write row, previous and current group: docs/spec.md, records), one
// 16-byte load; the c4 decode's and the offline c128 decode's.
__device__ __forceinline__ C4DecodeRecord load_decode_record(const void* records, int64_t i) {
  const int4 q = __ldg(reinterpret_cast<const int4*>(records) + i);
  return C4DecodeRecord{(uint32_t)q.x, q.y, q.z, q.w};
}

template <int VEC>
__device__ __forceinline__ C4Thread c4_thread(const C4Launch& p) {
  constexpr int kBlockLog2 = C4Form<VEC>::kThreadsLog2;  // rows per block: the block >> log2(lanes)
  C4Thread t;
  const bool second = blockIdx.x >= p.blocks0;
  t.c = &p.side[second ? 1 : 0];
  t.D = t.c->head_dim;
  t.lanes = t.D / VEC;  // a power of two (D is 128, 256 or 512), so the mapping below is shifts and masks
  const int shift = 31 - __clz(t.lanes);
  t.row = (int)threadIdx.x >> shift;
  t.ch = ((int)threadIdx.x & (t.lanes - 1)) * VEC;
  t.i = ((int64_t)(blockIdx.x - (second ? p.blocks0 : 0)) << (kBlockLog2 - shift)) + t.row;
  return t;
}

// This thread's VEC channels of each of a ring row's kHalves D-wide parts (a row is kHalves * D elements).
template <typename S, int VEC, int kHalves>
__device__ __forceinline__ void ring_store(S* ring, int64_t row, int D, int ch, const Lanes<VEC> (&half)[kHalves]) {
  S* at = ring + row * kHalves * D + ch;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) store_state<VEC, S>(at + h * D, half[h]);
}

// Input row `ragged` into ring row `row`, this thread's VEC channels of each of its kHalves D-wide parts (4 for
// a c4 row [kv_A | kv_B | score_A | score_B], 2 for an offline c128 row [kv | score]); a row outside the input
// or the ring is skipped and counted.
// (split: load_input_row where the row is read, put_ring_row where it is written; a row outside the input is
// not read.)
template <int VEC, int kHalves>
__device__ __forceinline__ void load_input_row(const C4Launch& p, const C4Thread& t, int64_t ragged,
                                               Lanes<VEC> (&half)[kHalves]) {
  if (ragged >= p.num_tokens) return;
  const float* in = t.c->kv_score + ragged * kHalves * t.D + t.ch;
#pragma unroll
  for (int h = 0; h < kHalves; ++h) half[h] = load_lanes<VEC>(in + h * t.D);
}
template <typename S, int VEC, int kHalves>
__device__ __forceinline__ void put_ring_row(const C4Launch& p, const C4Thread& t, int64_t ragged, int64_t row,
                                             const Lanes<VEC> (&half)[kHalves]) {
  const C4Side& c = *t.c;
  if (ragged >= p.num_tokens || row < 0 || row >= c.ring_rows) {
    if (t.ch == 0) count_error(p.error_count);
    return;
  }
  ring_store<S, VEC, kHalves>(static_cast<S*>(c.ring), row, t.D, t.ch, half);
}
template <typename S, int VEC, int kHalves>
__device__ __forceinline__ void write_ring_row(const C4Launch& p, const C4Thread& t, int64_t ragged, int64_t row) {
  Lanes<VEC> half[kHalves];
  load_input_row<VEC, kHalves>(p, t, ragged, half);
  put_ring_row<S, VEC, kHalves>(p, t, ragged, row, half);
}

// Extend write pass: one write record per row of lanes (the offline c128 extend takes the same records).
template <typename S, int kHalves = 4>
__global__ void __launch_bounds__(C4Form<kC4WriteChannels>::kThreads) c4_write_kernel(const __grid_constant__ C4Launch p) {
  constexpr int VEC = kC4WriteChannels;
  const C4Thread t = c4_thread<VEC>(p);
  wait_for_producers();
  allow_dependents();
  if (t.i >= p.count) return;
  const int2 q = __ldg(reinterpret_cast<const int2*>(p.records) + t.i);
  if ((uint32_t)q.x == kC4Padding) return;
  write_ring_row<S, VEC, kHalves>(p, t, (uint32_t)q.x, q.y);
}

}  // namespace
}  // namespace dsa
