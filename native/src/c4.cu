// The ratio-4 compressor (docs/spec.md, "The ratio-4 compressor"): decode, extend and verify kernels, both
// compressors of a layer in each launch, the stores fused; the entry points (check, then host or device).
#include <algorithm>
#include <type_traits>

#include "c4_device.cuh"
#include "checks.h"
#include "c4_host.h"

DSA_DECLARE_STRUCT(DSA_STRUCT_C4_PARAMS, dsa_c4_params);

namespace dsa {
namespace {

// What this thread's part of a store reads besides the vector (norm weights; rotary pairs in the rope
// lanes) and where it writes: in a narrow launch as soon as the slot `loc` and rotary row `pos` are known
// (the loads in flight while the window is read), in a wide one after the window (C4Form::kAimsEarly).
template <int VEC>
__device__ __forceinline__ void aim_c4_store(const C4Thread& t, StoreOperands<VEC>& o, int64_t loc, int64_t pos) {
  const C4Side& c = *t.c;
  if (c.store_kind == 0) return;
  load_weights<VEC>(o, c.store, t.ch);
  load_rotary<VEC>(o, c.store, t.D, t.ch, pos);
  if (c.store_kind == 1 + DSA_CACHE_V4) aim_store<VEC>(o, c.store, loc, pos, t.D);
  else aim_indexer_store<VEC>(o, c.store, loc, pos);
}

// The entry closed with window values kv, logits z (this thread's VEC channels): written to `out` row
// `out_row` and, in a storing launch (kStore), stored at cache slot `loc`, rotary row `pos` (o aimed there
// already in a narrow launch).
template <bool kStore, int VEC>
__device__ __forceinline__ void close_entry(const C4Thread& t, const float (&kv)[kC4Window][VEC],
                                            const float (&z)[kC4Window][VEC], int first, int64_t out_row,
                                            StoreOperands<VEC>& o, int64_t loc, int64_t pos, uint32_t* error_count) {
  const C4Side& c = *t.c;
  Lanes<VEC> v;
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    float a[kC4Window], b[kC4Window];
#pragma unroll
    for (int j = 0; j < kC4Window; ++j) a[j] = kv[j][k], b[j] = z[j][k];
    v.v[k] = c4_channel(a, b, first);
  }
  if (c.out != nullptr) store_lanes<VEC>(c.out + out_row * t.D + t.ch, v);
  if constexpr (!kStore) return;
  if constexpr (!C4Form<VEC>::kAimsEarly) aim_c4_store<VEC>(t, o, loc, pos);
  if (c.store_kind == 1 + DSA_CACHE_V4) store_vector<VEC>(c.store, v.v, o, t.D, t.ch, t.lanes, error_count, t.row);
  else if (c.store_kind == 1 + DSA_CACHE_INDEXER) indexer_store<VEC>(c.store, v.v, o, t.ch, error_count, t.row);
}

// The closing row's window lines into L2 ahead of the wait (a hint: L2 is where the producer's writes land,
// so nothing read later is stale): the lanes at each 128-byte line's start, value and score of 8 rows.
template <typename S>
__device__ __forceinline__ void prefetch_window(const C4Side& c, const C4DecodeRecord& r, int D, int ch) {
  constexpr int kLine = 128 / sizeof(S);  // elements of a 128-byte line
  if ((ch & (kLine - 1)) != 0 || !group_ok(r.current_group, c.ring_rows)) return;
  const bool overlap = r.seq_len > (uint32_t)kC4Quartet && group_ok(r.previous_group, c.ring_rows);
  const S* ring = static_cast<const S*>(c.ring);
#pragma unroll
  for (int j = 0; j < kC4Window; ++j) {
    if (j < 4 && !overlap) continue;
    const S* at = ring + (4 * (int64_t)(j < 4 ? r.previous_group : r.current_group) + (j & 3)) * 4 * D + ch +
                  (j < 4 ? 0 : D);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
    asm volatile("prefetch.global.L2 [%0];" ::"l"(at + 2 * D));
  }
}

// A closing decode row's entry once its checks passed: the store's slot and operands, then the window as
// read(j, bias, value, score) gives it (from memory or from registers), then the entry.
template <int VEC, bool kStore, typename Read>
__device__ __forceinline__ void close_decode_row(const C4Launch& p, const C4Thread& t, const C4DecodeRecord& r,
                                                 bool ahead, int64_t loc, Read&& read) {
  const C4Side& c = *t.c;
  const bool overlap = r.seq_len > kC4Quartet;
  StoreOperands<VEC> o;
  if (kStore && c.store_kind && !ahead) loc = __ldg(c.store.cache_slots + t.i);
  const int64_t pos = (int64_t)r.seq_len - kC4Quartet;
  if constexpr (kStore && C4Form<VEC>::kAimsEarly) aim_c4_store<VEC>(t, o, loc, pos);
  float kv[kC4Window][VEC], z[kC4Window][VEC];
#pragma unroll
  for (int j = 0; j < kC4Window; ++j) {
    if (j < 4 && !overlap) continue;
    Lanes<VEC> bias, value, score;
    read(j, bias, value, score);
#pragma unroll
    for (int k = 0; k < VEC; ++k) kv[j][k] = value.v[k], z[j][k] = score.v[k] + bias.v[k];
  }
  close_entry<kStore>(t, kv, z, overlap ? 0 : 4, t.i, o, loc, pos, p.error_count);
}

// How the window-first form holds a ring row from its load to the entry: an fp32 ring's as floats; a bf16 ring's
// as the words loaded, widened at the entry (widened where loaded, each row's conversion consumed its loads inside
// the row's branch, so the next row's left only once they landed: one memory trip a row, measured 30 % slower).
template <int VEC, typename S>
using HeldRow = std::conditional_t<std::is_same<S, float>::value, Lanes<VEC>, Words<VEC, S>>;
template <int VEC, typename S>
__device__ __forceinline__ HeldRow<VEC, S> hold_row(const S* at) {
  if constexpr (std::is_same<S, float>::value) return load_state<VEC, S>(at);
  else return load_words<VEC, S>(at);
}
template <int VEC, typename S>
__device__ __forceinline__ Lanes<VEC> held_lanes(const HeldRow<VEC, S>& h) {
  if constexpr (std::is_same<S, float>::value) return h;
  else return widen_words<VEC, S>(h);
}

// A decode row in the window-first form (C4Form::window_first): the record's checks become flags, and a closing
// row's window rows and ape rows are loaded before any exit or store of the row, so the loads leave together with
// (or right behind) the record's and a closing row's chain is two memory trips (record, window), not three
// (record, input row, then the window the row's store held back); a row that closes nothing loads none of them.
// Wherever the window names the token's own row, its values come from registers as stored (a bf16 ring rounds
// them), which is what writing first and reading back gives for any record. Then the checks, the row's write and
// the entry, as the plain form.
template <typename S, int kMode, int VEC, bool kStore>
__device__ __forceinline__ void decode_window_first(const C4Launch& p, const C4Thread& t, const Lanes<VEC> (&half)[4],
                                                    C4DecodeRecord r, bool ahead, int64_t loc) {
  const C4Side& c = *t.c;
  const int D = t.D, ch = t.ch;
  bool live;
  if constexpr (kMode == kC4Records) {
    if (!ahead) r = load_decode_record(p.records, t.i);
    live = r.seq_len != 0u && r.seq_len <= 0x7FFFFFFFu;
  } else {
    const int32_t seq = __ldg(p.seq_lens + t.i), slot = __ldg(p.slots + t.i);
    live = seq > 0 && slot >= 0;
    r = c4_decode_record(live ? seq : 1, live ? slot : 0, p.ring_size);  // its arithmetic wants seq >= 1
  }
  const bool row_ok = r.write_row >= 0 && r.write_row < c.ring_rows;
  const bool overlap = r.seq_len > kC4Quartet;
  const bool groups_ok = group_ok(r.current_group, c.ring_rows) && (!overlap || group_ok(r.previous_group, c.ring_rows));
  const bool closing = live && row_ok && r.seq_len % kC4Quartet == 0u && groups_ok;
  const S* ring = static_cast<const S*>(c.ring);
  HeldRow<VEC, S> value[kC4Window], score[kC4Window];
  Lanes<VEC> bias[kC4Window];
  bool own[kC4Window];
#pragma unroll
  for (int j = 0; j < kC4Window; ++j) {
    const int64_t row = 4 * (int64_t)(j < 4 ? r.previous_group : r.current_group) + (j & 3);
    own[j] = row == r.write_row;
    if (closing) {  // a row that closes nothing reads nothing more: its exit would wait for the loads
      bias[j] = load_lanes<VEC>(c.ape + j * D + ch);
      if ((j >= 4 || overlap) && !own[j]) {
        const S* at = ring + row * 4 * D + ch + (j < 4 ? 0 : D);
        value[j] = hold_row<VEC, S>(at), score[j] = hold_row<VEC, S>(at + 2 * D);
      }
    }
  }
  if (!live) return;  // padding
  if (!row_ok) {
    if (ch == 0) count_error(p.error_count);
    return;
  }
  ring_store<S, VEC, 4>(static_cast<S*>(c.ring), r.write_row, D, ch, half);
  if (r.seq_len % kC4Quartet != 0) return;
  if (!groups_ok) {
    if (ch == 0) count_error(p.error_count);
    return;
  }
  close_decode_row<VEC, kStore>(p, t, r, ahead, loc, [&](int j, Lanes<VEC>& b, Lanes<VEC>& v, Lanes<VEC>& sc) {
    b = bias[j];
    if (own[j]) {
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        v.v[k] = as_stored<S>(half[j < 4 ? 0 : 1].v[k]), sc.v[k] = as_stored<S>(half[j < 4 ? 2 : 3].v[k]);
    } else {
      v = held_lanes<VEC, S>(value[j]), sc = held_lanes<VEC, S>(score[j]);
    }
  });
}

// Decode: one request per row of lanes; its token's row is written, and a closing token's entry is
// computed from the ring's 8 rows (the token's own from registers when it is the current group's last row,
// as written: a bf16 ring rounds it). kStore: whether a compressor of the launch stores (a launch without
// stores is compiled without their code).
template <typename S, int kMode, int VEC, bool kStore>
__global__ void __launch_bounds__(C4Form<VEC>::kThreads) c4_decode_kernel(const __grid_constant__ C4Launch p) {
  const C4Thread t = c4_thread<VEC>(p);
  const C4Side& c = *t.c;
  const int D = t.D, ch = t.ch;
  C4DecodeRecord r{};
  int64_t loc = 0;
  bool ahead = false;
  if constexpr (kMode == kC4Records) {
    // The caller's promise (records_ahead): the records and cache slots were written before the launch ahead
    // of this one began, so they are read while it finishes, with the closing row's slot and its window's
    // lines (into L2 where it pays, below: the ring itself may still be written by that launch, so it is read
    // after the wait).
    // The branch on the record keeps the reads ahead of the wait in the SASS (a predicated load is not).
    ahead = p.records_ahead != 0 && t.i < p.count;
    if (ahead) {
      r = load_decode_record(p.records, t.i);
      if (r.seq_len % kC4Quartet == 0u && r.seq_len - 1u < 0x7FFFFFFFu) {
        if (kStore && c.store_kind) loc = __ldg(c.store.cache_slots + t.i);
        // Measured (docs/performance.md, P35): the prefetch speeds the storeless launches and those of up to 128
        // rows (VEC 2), and slows a storing launch of more rows (B = 256 / 1024: 6-14 % on the plugin's route).
        if constexpr (!kStore || VEC == 2) prefetch_window<S>(c, r, D, ch);
      }
    }
  }
  wait_for_producers();
  allow_dependents();
  if (t.i >= p.count) return;
  const float* in = c.kv_score + t.i * 4 * D + ch;
  Lanes<VEC> half[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) half[h] = load_lanes<VEC>(in + h * D);
  if constexpr (C4Form<VEC>::window_first(sizeof(S), kStore)) {
    decode_window_first<S, kMode, VEC, kStore>(p, t, half, r, ahead, loc);
    return;
  }
  if constexpr (kMode == kC4Records) {
    if (!ahead) r = load_decode_record(p.records, t.i);
  } else {
    const int32_t seq = __ldg(p.seq_lens + t.i), slot = __ldg(p.slots + t.i);
    if (seq <= 0 || slot < 0) return;
    r = c4_decode_record(seq, slot, p.ring_size);
  }
  if (r.seq_len == 0u || r.seq_len > 0x7FFFFFFFu) return;  // padding
  if (r.write_row < 0 || r.write_row >= c.ring_rows) {
    if (ch == 0) count_error(p.error_count);
    return;
  }
  S* ring = static_cast<S*>(c.ring);
  ring_store<S, VEC, 4>(ring, r.write_row, D, ch, half);
  if (r.seq_len % kC4Quartet != 0) return;
  const bool overlap = r.seq_len > kC4Quartet;
  if (!group_ok(r.current_group, c.ring_rows) || (overlap && !group_ok(r.previous_group, c.ring_rows))) {
    if (ch == 0) count_error(p.error_count);
    return;
  }
  close_decode_row<VEC, kStore>(p, t, r, ahead, loc, [&](int j, Lanes<VEC>& bias, Lanes<VEC>& value, Lanes<VEC>& score) {
    bias = load_lanes<VEC>(c.ape + j * D + ch);
    if (j == kC4Window - 1 && r.write_row == 4 * r.current_group + 3) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) value.v[k] = as_stored<S>(half[1].v[k]), score.v[k] = as_stored<S>(half[3].v[k]);
    } else {
      const int64_t row = 4 * (int64_t)(j < 4 ? r.previous_group : r.current_group) + (j & 3);
      const S* at = ring + row * 4 * D + ch + (j < 4 ? 0 : D);
      value = load_state<VEC, S>(at), score = load_state<VEC, S>(at + 2 * D);
    }
  });
}

// The entry a compress record closes (seq_len = closing position + 1; window rows 0 .. ring_rows - 1 from the
// ring, the rest from input rows ragged - 7 + j), written to `out` row out_row and stored at the cache slot of
// input row `ragged` (kStore as the decode's). A record that does not fit the call is skipped and counted.
template <typename S, int VEC, bool kStore>
__device__ __forceinline__ void compress_entry(const C4Launch& p, const C4Thread& t, uint32_t seq_len, int64_t ragged,
                                               int ring_rows, int32_t previous, int32_t current, int64_t out_row) {
  const C4Side& c = *t.c;
  const int D = t.D, ch = t.ch;
  if (!compress_fits(seq_len, ragged, ring_rows, previous, current, p.num_tokens, c.ring_rows)) {
    if (ch == 0) count_error(p.error_count);
    return;
  }
  StoreOperands<VEC> o;
  const int64_t loc = kStore && c.store_kind ? __ldg(c.store.cache_slots + ragged) : 0;
  const int64_t pos = (int64_t)seq_len - kC4Quartet;
  const bool overlap = seq_len > (uint32_t)kC4Quartet;
  const S* ring = static_cast<const S*>(c.ring);
  // Every window row's loads leave before any arithmetic on them or on the slot (the store's aim): summed as they
  // came, each row's sums waited for its loads before the next row's left (SASS: a memory trip a row). A row from
  // the ring is held as loaded (HeldRow); over an fp32 ring a row from the input shares its registers (one load
  // from either address).
  constexpr bool kFloatRing = std::is_same<S, float>::value;
  Lanes<VEC> bias[kC4Window];
  HeldRow<VEC, S> held_value[kC4Window], held_score[kC4Window];
  Lanes<VEC> input_value[kC4Window], input_score[kC4Window];  // a bf16 ring's input rows
#pragma unroll
  for (int j = 0; j < kC4Window; ++j) {
    if (j < 4 && !overlap) continue;
    bias[j] = load_lanes<VEC>(c.ape + j * D + ch);
    const int offset = j < 4 ? 0 : D;
    const S* ring_at = ring + (4 * (int64_t)(j < 4 ? previous : current) + (j & 3)) * 4 * D + ch + offset;
    const float* input_at = c.kv_score + (ragged - (kC4Window - 1) + j) * 4 * D + ch + offset;
    if constexpr (kFloatRing) {
      const float* at = j < ring_rows ? ring_at : input_at;
      held_value[j] = load_state<VEC, float>(at), held_score[j] = load_state<VEC, float>(at + 2 * D);
    } else if (j < ring_rows) {
      held_value[j] = hold_row<VEC, S>(ring_at), held_score[j] = hold_row<VEC, S>(ring_at + 2 * D);
    } else {
      input_value[j] = load_lanes<VEC>(input_at), input_score[j] = load_lanes<VEC>(input_at + 2 * D);
    }
  }
  if constexpr (kStore && C4Form<VEC>::kAimsEarly) aim_c4_store<VEC>(t, o, loc, pos);
  float kv[kC4Window][VEC], z[kC4Window][VEC];
#pragma unroll
  for (int j = 0; j < kC4Window; ++j) {
    if (j < 4 && !overlap) continue;
    const bool from_ring = kFloatRing || j < ring_rows;
    const Lanes<VEC> value = from_ring ? held_lanes<VEC, S>(held_value[j]) : input_value[j];
    const Lanes<VEC> score = from_ring ? held_lanes<VEC, S>(held_score[j]) : input_score[j];
#pragma unroll
    for (int k = 0; k < VEC; ++k) kv[j][k] = value.v[k], z[j][k] = score.v[k] + bias[j].v[k];
  }
  close_entry<kStore>(t, kv, z, overlap ? 0 : 4, out_row, o, loc, pos, p.error_count);
}

// Extend compress pass: one compress record per row of lanes; entry i written to `out` row i.
template <typename S, int VEC, bool kStore>
__global__ void __launch_bounds__(C4Form<VEC>::kThreads) c4_compress_kernel(const __grid_constant__ C4Launch p) {
  const C4Thread t = c4_thread<VEC>(p);
  wait_for_producers();
  allow_dependents();
  if (t.i >= p.count) return;
  const int4 q = __ldg(reinterpret_cast<const int4*>(p.records) + t.i);
  if ((uint32_t)q.x == kC4Padding) return;
  compress_entry<S, VEC, kStore>(p, t, (uint32_t)q.x, (uint32_t)q.y & 0xFFFFu, (int)((uint32_t)q.y >> 16), q.z, q.w,
                                 t.i);
}

// Verify in one launch: a row of lanes per draft (request i / V, draft i % V), the entry it closes, then its
// input row into the ring. A thread reads and writes only its own channels of a ring row, so its program order
// is the order of its reads and writes; and a draft's row lands on a row that an entry of the same verify
// reads only for draft R - 7 when V = R - 6 (its position seq + R - 7 shares the row of seq - 7, in draft 0's
// window when draft 0 closes: c4_max_drafts): draft 0's thread writes that row, after its entry.
template <typename S, int VEC, bool kStore>
__global__ void __launch_bounds__(C4Form<VEC>::kThreads) c4_verify_kernel(const __grid_constant__ C4Launch p) {
  const C4Thread t = c4_thread<VEC>(p);
  wait_for_producers();
  allow_dependents();
  if (t.i >= p.count) return;
  const int64_t b = t.i / p.num_drafts;
  const int32_t j = (int32_t)(t.i - b * p.num_drafts);
  const int32_t seq = __ldg(p.seq_lens + b), slot = __ldg(p.slots + b);
  if (seq < 0 || slot < 0) return;  // a request not held here
  const C4CompressRecord r = c4_draft_record(seq, j, slot, p.ring_size, p.num_drafts, b);
  // The input rows this draft writes are read with its window, ahead of the entry (read after it, they were one
  // more memory trip at the end of the chain); written after it, as before.
  const int32_t late = p.ring_size - 7;
  const bool second = j == 0 && late < p.num_drafts;
  Lanes<VEC> own[4], other[4];
  load_input_row<VEC, 4>(p, t, t.i, own);
  if (second) load_input_row<VEC, 4>(p, t, t.i + late, other);
  if (r.seq_len != kC4Padding)
    compress_entry<S, VEC, kStore>(p, t, r.seq_len, t.i, r.ring_rows, r.previous_group, r.current_group, t.i);
  if (j != late) put_ring_row<S, VEC, 4>(p, t, t.i, request_ring_row(slot, p.ring_size, (int64_t)seq + j), own);
  if (second)
    put_ring_row<S, VEC, 4>(p, t, t.i + late, request_ring_row(slot, p.ring_size, (int64_t)seq + late), other);
}

// ---- checks and launches ----------------------------------------------------------------------------

// A host plan (DSA_FLAG_HOST_PLAN: pyplan's records, in host memory) is checked before anything runs: a
// record that is not padding and does not fit this call (outside its input rows or either compressor's
// ring) fails the call, naming it. Records of other origins are data: skipped and counted.
dsa_status check_c4_host_plan(const dsa_c4_params& p, const char* op) {
  if (!(p.flags & DSA_FLAG_HOST_PLAN)) return DSA_STATUS_OK;
  for (int64_t i = 0; i < p.num_compress; ++i) {
    const dsa_c4_compress_record& r = p.compress[i];
    if (r.seq_len == kC4Padding) continue;
    for (int k = 0; k < p.num_compressors; ++k)
      if (!compress_fits(r.seq_len, r.ragged_id, r.ring_rows, r.previous_group, r.current_group, p.num_tokens,
                         p.compressors[k].ring_rows))
        return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: compress record %lld {seq_len %u, ragged_id %u, ring_rows %u, "
                    "previous_group %d, current_group %d} does not fit this call (%lld input rows, compressors[%d]'s "
                    "ring of %lld rows): a plan made for other inputs?", op, (long long)i, r.seq_len,
                    (unsigned)r.ragged_id, (unsigned)r.ring_rows, r.previous_group, r.current_group,
                    (long long)p.num_tokens, k, (long long)p.compressors[k].ring_rows);
  }
  for (int64_t i = 0; i < p.num_write; ++i) {
    const dsa_c4_write_record& w = p.write[i];
    if (w.ragged_id == kC4Padding) continue;
    for (int k = 0; k < p.num_compressors; ++k)
      if ((int64_t)w.ragged_id >= p.num_tokens || w.ring_row < 0 || w.ring_row >= p.compressors[k].ring_rows)
        return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: write record %lld {ragged_id %u, ring_row %d} does not fit this "
                    "call (%lld input rows, compressors[%d]'s ring of %lld rows): a plan made for other inputs?", op,
                    (long long)i, w.ragged_id, w.ring_row, (long long)p.num_tokens, k,
                    (long long)p.compressors[k].ring_rows);
  }
  return DSA_STATUS_OK;
}

enum C4Op { kOpDecode, kOpExtend, kOpVerify };

// What the check hands on: each compressor's store launch and store kind.
struct C4Checked {
  bool nothing = false;
  StoreLaunch stores[2] = {};
  int kinds[2] = {0, 0};
};

dsa_status check_c4(const dsa_c4_params& p, C4Op kind, const char* op, C4Checked* checked) {
  StoreLaunch (&stores)[2] = checked->stores;
  int (&kinds)[2] = checked->kinds;
  const bool nothing = kind == kOpExtend ? p.num_compress == 0 && p.num_write == 0 : p.batch_size == 0;
  if (p.num_compressors < 1 || p.num_compressors > 2)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_compressors is %d; expected 1 or 2", op, p.num_compressors);
  if (p.ring_dtype != DSA_STATE_FLOAT32 && p.ring_dtype != DSA_STATE_BFLOAT16)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: ring_dtype is %d; expected %d (float32) or %d (bfloat16)", op,
                p.ring_dtype, DSA_STATE_FLOAT32, DSA_STATE_BFLOAT16);
  const bool gpu = p.device != DSA_DEVICE_HOST;
  bool any_store = false;
  for (int k = 0; k < p.num_compressors; ++k) {
    const dsa_c4_compressor& c = p.compressors[k];
    const int D = c.head_dim;
    if (D != 128 && D != 256 && D != 512)
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: compressors[%d].head_dim is %d; expected 128, 256 or 512", op, k, D);
    if (c.ring == nullptr || c.ape == nullptr)
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: compressors[%d].ring and .ape must be non-null", op, k);
    if (c.kv_score == nullptr && !nothing)  // an empty batch may come with an empty (null) input
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: compressors[%d].kv_score must be non-null", op, k);
    if (c.ring_rows < 4 || c.ring_rows % 4 != 0 || c.ring_rows > INT32_MAX)
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: compressors[%d].ring_rows is %lld; expected a multiple of 4 in "
                  "4..2^31-1", op, k, (long long)c.ring_rows);
    if (gpu && (!aligned(c.ring, 16) || !aligned(c.kv_score, 16) || !aligned(c.ape, 16) || !aligned(c.out, 16)))
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: on the GPU, compressors[%d].ring, .kv_score, .ape and .out must be "
                  "16-byte aligned", op, k);
    kinds[k] = 0;
    if (c.store != nullptr) {
      DSA_TRY(check_struct(c.store, op));
      const int32_t layout = c.store->layout;
      if (layout != DSA_CACHE_V4 && layout != DSA_CACHE_INDEXER)
        return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: compressors[%d].store.layout is %d; expected %d (DSA_CACHE_V4) or "
                    "%d (DSA_CACHE_INDEXER)", op, k, layout, DSA_CACHE_V4, DSA_CACHE_INDEXER);
      const char* names[2] = {"compressors[0].store", "compressors[1].store"};
      if (!nothing)  // an empty batch's cache_slots may be null (nothing is stored)
        DSA_TRY(store_launch(c.store, p.cache_slots, D, p.device, op, &stores[k], layout, names[k]));
      kinds[k] = 1 + layout;
      any_store = true;
    }
  }
  if (any_store && p.cache_slots == nullptr && !nothing)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: a store needs cache_slots", op);
  // an empty decode's records may be null: it addresses nothing, by records or by requests
  const bool requests = kind == kOpVerify || (kind == kOpDecode && p.decode_records == nullptr && !nothing);
  if (p.batch_size < 0 || p.batch_size > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size is %lld; expected 0..%d", op, (long long)p.batch_size,
                INT32_MAX);
  if (requests) {
    if (p.ring_size < 8 || p.ring_size % 4 != 0)
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: ring_size is %d; expected a multiple of 4, >= 8", op, p.ring_size);
    if (p.batch_size > 0 && (p.seq_lens == nullptr || p.slots == nullptr))
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: seq_lens and slots must be non-null (or decode_records given)", op);
    for (int k = 0; k < p.num_compressors; ++k)
      if (p.compressors[k].ring_rows % p.ring_size != 0)
        return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: compressors[%d].ring_rows is %lld, not a multiple of ring_size %d: "
                    "a request-scoped ring holds num_slots * ring_size rows", op, k,
                    (long long)p.compressors[k].ring_rows, p.ring_size);
  }
  if (kind == kOpVerify) {
    const int32_t most = c4_max_drafts(p.ring_size, (p.flags & DSA_FLAG_C4_REJECT_ALL) != 0);
    if (p.num_drafts < 1 || p.num_drafts > most)
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_drafts is %d; a ring of %d rows serves 1..%d drafts (R - %d: "
                  "more would overwrite rows the next step reads)", op, p.num_drafts, p.ring_size, most,
                  (p.flags & DSA_FLAG_C4_REJECT_ALL) ? 7 : 6);
    if (p.batch_size * p.num_drafts > INT32_MAX)
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size * num_drafts exceeds 2^31-1", op);
  }
  if (kind == kOpExtend) {
    DSA_TRY(check_extend_lists(p.num_tokens, p.num_compress, p.num_write, p.compress, p.write, p.flags, gpu, op));
    DSA_TRY(check_c4_host_plan(p, op));
  }
  if (kind == kOpDecode && gpu && !aligned(p.decode_records, 16))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: on the GPU, decode_records must be 16-byte aligned", op);
  checked->nothing = nothing;
  return DSA_STATUS_OK;
}

C4Launch c4_launch(const dsa_c4_params& p, const StoreLaunch (&stores)[2], const int (&kinds)[2]) {
  C4Launch a = {};
  for (int k = 0; k < p.num_compressors; ++k) {
    const dsa_c4_compressor& c = p.compressors[k];
    a.side[k] = C4Side{c.head_dim, kinds[k], c.ring, c.ring_rows, c.kv_score, c.ape, c.out, stores[k]};
  }
  a.ring_size = p.ring_size, a.num_drafts = p.num_drafts, a.num_tokens = p.num_tokens;
  a.seq_lens = p.seq_lens, a.slots = p.slots, a.error_count = p.error_count;
  a.records_ahead = (p.flags & DSA_FLAG_RECORDS_AHEAD) != 0;
  return a;
}

// Blocks for `count` rows of each compressor, VEC channels per thread; a.count and a.blocks0 set.
dim3 c4_grid(const dsa_c4_params& p, C4Launch& a, int64_t count, int vec) {
  a.count = count;
  int64_t blocks = 0;
  for (int k = 0; k < p.num_compressors; ++k) {
    const int64_t n = c4_blocks(p.compressors[k].head_dim, vec, count);
    if (k == 0) a.blocks0 = (uint32_t)n;
    blocks += n;
  }
  if (p.num_compressors == 1) a.blocks0 = (uint32_t)blocks;
  return dim3((unsigned)blocks);
}

template <typename Kernel>
cudaError_t run(Kernel kernel, int vec, dim3 grid, cudaStream_t s, unsigned mode, const C4Launch& a) {
  return launch(kernel, grid, dim3(c4_block_threads(vec)), s, mode, a);
}

// Calls f(S{}, VEC{}) with the ring's element type S and the channels per thread VEC
// (std::integral_constant) of a launch: the kernel instance to run.
template <typename F>
cudaError_t with_kind(bool bf16, int vec, F&& f) {
  using Two = std::integral_constant<int, 2>;
  using Four = std::integral_constant<int, 4>;
  if (bf16) return vec == 2 ? f(Bf16{}, Two{}) : f(Bf16{}, Four{});
  return vec == 2 ? f(float{}, Two{}) : f(float{}, Four{});
}

// Calls f(std::bool_constant<stores>): whether a compressor of the launch stores.
template <typename F>
cudaError_t with_stores(const int (&kinds)[2], F&& f) {
  return kinds[0] != 0 || kinds[1] != 0 ? f(std::true_type{}) : f(std::false_type{});
}

// Calls f(S{}, VEC{}, kStore{}) for a launch's kernel instance: its ring's element type, channels per thread and
// whether it stores (with_kind, then with_stores).
template <typename F>
cudaError_t with_instance(bool bf16, int vec, const int (&kinds)[2], F&& f) {
  return with_kind(bf16, vec, [&](auto e, auto v) { return with_stores(kinds, [&](auto st) { return f(e, v, st); }); });
}

// The extend's compress pass, then its write pass (both compressors in each), in stream order.
dsa_status launch_passes(const dsa_c4_params& p, const int (&kinds)[2], C4Launch a, cudaStream_t s, const char* op) {
  const unsigned mode = (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u;
  const bool bf16 = p.ring_dtype == DSA_STATE_BFLOAT16;
  if (p.num_compress > 0) {
    a.records = p.compress;
    const int vec = c4_channels(p.num_compress);
    const dim3 grid = c4_grid(p, a, p.num_compress, vec);
    DSA_TRY(launch_status(with_instance(bf16, vec, kinds, [&](auto e, auto v, auto st) {
      return run(c4_compress_kernel<decltype(e), decltype(v)::value, decltype(st)::value>, vec, grid, s, mode, a);
    }), op));
  }
  if (p.num_write > 0) {
    a.records = p.write;
    const dim3 grid = c4_grid(p, a, p.num_write, kC4WriteChannels);
    DSA_TRY(launch_status(with_kind(bf16, kC4WriteChannels, [&](auto e, auto) {
      return run(c4_write_kernel<decltype(e)>, kC4WriteChannels, grid, s, mode, a);
    }), op));
  }
  return ok();
}

// Each op's check: the family's check with the op's kind.
template <C4Op kKind>
dsa_status check_c4_op(const dsa_c4_params& p, const char* op, C4Checked* checked) {
  return check_c4(p, kKind, op, checked);
}

// The decode on the device: one launch over the batch's requests (by records or by request), both
// compressors in it.
dsa_status c4_decode_device(const dsa_c4_params& p, const C4Checked& c, int, cudaStream_t s, const char* op) {
  C4Launch a = c4_launch(p, c.stores, c.kinds);
  a.records = p.decode_records;
  const int vec = c4_channels(p.batch_size);
  const dim3 grid = c4_grid(p, a, p.batch_size, vec);
  const unsigned mode = (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u;
  const bool bf16 = p.ring_dtype == DSA_STATE_BFLOAT16, records = p.decode_records != nullptr;
  const cudaError_t err = with_instance(bf16, vec, c.kinds, [&](auto e, auto v, auto st) {
    using S = decltype(e);
    constexpr int VEC = decltype(v)::value;
    constexpr bool kStore = decltype(st)::value;
    return records ? run(c4_decode_kernel<S, kC4Records, VEC, kStore>, VEC, grid, s, mode, a)
                   : run(c4_decode_kernel<S, kC4Requests, VEC, kStore>, VEC, grid, s, mode, a);
  });
  DSA_TRY(launch_status(err, op));
  return ok();
}

// The extend on the device: its compress records, then its write records.
dsa_status c4_extend_device(const dsa_c4_params& p, const C4Checked& c, int, cudaStream_t s, const char* op) {
  return launch_passes(p, c.kinds, c4_launch(p, c.stores, c.kinds), s, op);
}

// The verify on the device: one launch over the batch's drafts, each request's drafts as its input rows.
dsa_status c4_verify_device(const dsa_c4_params& p, const C4Checked& c, int, cudaStream_t s, const char* op) {
  C4Launch a = c4_launch(p, c.stores, c.kinds);
  const int64_t rows = p.batch_size * p.num_drafts;
  a.num_tokens = rows;
  const int vec = c4_channels(rows);
  const dim3 grid = c4_grid(p, a, rows, vec);
  const unsigned mode = (p.flags & DSA_FLAG_PDL) ? kLaunchPdl : 0u;
  DSA_TRY(launch_status(with_instance(p.ring_dtype == DSA_STATE_BFLOAT16, vec, c.kinds, [&](auto e, auto v, auto st) {
    return run(c4_verify_kernel<decltype(e), decltype(v)::value, decltype(st)::value>, vec, grid, s, mode, a);
  }), op));
  return ok();
}

}  // namespace
}  // namespace dsa

extern "C" int32_t dsa_c4_max_drafts(int32_t ring_size, int32_t zero_acceptance) {
  if (ring_size < 8 || ring_size % 4 != 0) return 0;
  const int32_t v = dsa::c4_max_drafts(ring_size, zero_acceptance != 0);
  return v < DSA_MAX_DRAFTS ? v : DSA_MAX_DRAFTS;
}

extern "C" dsa_status dsa_c4_decode(const dsa_c4_params* params, void* stream) {
  using namespace dsa;
  return dispatch<C4Checked>(params, stream, "dsa_c4_decode", check_c4_op<kOpDecode>,
                             host_c4_decode,
                             c4_decode_device);
}

extern "C" dsa_status dsa_c4_extend(const dsa_c4_params* params, void* stream) {
  using namespace dsa;
  return dispatch<C4Checked>(params, stream, "dsa_c4_extend", check_c4_op<kOpExtend>,
                             host_c4_extend,
                             c4_extend_device);
}

extern "C" dsa_status dsa_c4_verify(const dsa_c4_params* params, void* stream) {
  using namespace dsa;
  return dispatch<C4Checked>(params, stream, "dsa_c4_verify", check_c4_op<kOpVerify>,
                             host_c4_verify,
                             c4_verify_device);
}
