// Host backend of the c4 ops: the kernels' arithmetic (c4_math.h), one record at a time, every
// compress record of a call before any write record; what runs when device == DSA_DEVICE_HOST.
#include "c4_host.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "c4_math.h"
#include "store_host.h"

namespace dsa {
namespace {

// One compressor of a call, with its ring's element type.
template <typename S>
struct Side {
  const dsa_c4_compressor& c;
  const dsa_c4_params& p;
  int D;

  S* row(int64_t r) const { return static_cast<S*>(c.ring) + r * 4 * D; }

  void write_row(int64_t ring_row, int64_t input_row) const {
    const float* in = c.kv_score + input_row * 4 * D;
    S* to = row(ring_row);
    for (int e = 0; e < 4 * D; ++e) narrow(in[e], &to[e]);
  }

  // Entry closed at seq_len (a multiple of 4): window row j's kv and score halves at kv[j], score[j]
  // (from the ring or the input, as the caller resolved them), to out row `out_row`, stored at the cache
  // slot of row `slot_row`.
  void close(uint32_t seq_len, const float* const (&kv)[kC4Window], const float* const (&score)[kC4Window],
             int64_t out_row, int64_t slot_row, std::vector<float>& x) const {
    const int first = seq_len > (uint32_t)kC4Quartet ? 0 : 4;
    for (int d = 0; d < D; ++d) {
      float a[kC4Window] = {}, z[kC4Window] = {};
      for (int j = first; j < kC4Window; ++j) a[j] = kv[j][d], z[j] = score[j][d] + c.ape[j * D + d];
      x[d] = c4_channel(a, z, first);
    }
    if (c.out != nullptr) std::memcpy(c.out + out_row * D, x.data(), sizeof(float) * D);
    if (c.store == nullptr) return;
    const int64_t loc = p.cache_slots[slot_row], pos = (int64_t)seq_len - kC4Quartet;
    host_store_entry(x.data(), D, *c.store, loc, pos, p.error_count);
  }
};

void count(const dsa_c4_params& p) {
  if (p.error_count != nullptr) ++*p.error_count;
}

// Window row j (0..7) of an entry: its kv half and score half, widened to floats in `buf` when it comes
// from the ring, or pointing into the input.
template <typename S>
struct Window {
  std::vector<float> buf[kC4Window];
  const float* kv[kC4Window] = {};
  const float* score[kC4Window] = {};

  void from_ring(const Side<S>& s, int j, int64_t ring_row) {
    const S* r = s.row(ring_row);
    const int D = s.D, half = j < 4 ? 0 : D;
    buf[j].resize(2 * D);
    for (int d = 0; d < D; ++d) buf[j][d] = widen(r[half + d]), buf[j][D + d] = widen(r[2 * D + half + d]);
    kv[j] = buf[j].data(), score[j] = buf[j].data() + D;
  }
  void from_input(const Side<S>& s, int j, int64_t input_row) {
    const float* r = s.c.kv_score + input_row * 4 * s.D;
    const int half = j < 4 ? 0 : s.D;
    kv[j] = r + half, score[j] = r + 2 * s.D + half;
  }
};

template <typename S>
void decode_side(const dsa_c4_params& p, const dsa_c4_compressor& c) {
  const Side<S> side{c, p, c.head_dim};
  std::vector<float> x(c.head_dim);
  Window<S> w;
  for (int64_t b = 0; b < p.batch_size; ++b) {
    C4DecodeRecord r;
    if (p.decode_records != nullptr) {
      std::memcpy(&r, p.decode_records + b, sizeof(r));
    } else {
      if (p.seq_lens[b] <= 0 || p.slots[b] < 0) continue;
      r = c4_decode_record(p.seq_lens[b], p.slots[b], p.ring_size);
    }
    if (r.seq_len == 0u || r.seq_len > 0x7FFFFFFFu) continue;
    if (r.write_row < 0 || r.write_row >= c.ring_rows) {
      count(p);
      continue;
    }
    side.write_row(r.write_row, b);
    if (r.seq_len % kC4Quartet != 0) continue;
    const bool overlap = r.seq_len > (uint32_t)kC4Quartet;
    if (!group_ok(r.current_group, c.ring_rows) || (overlap && !group_ok(r.previous_group, c.ring_rows))) {
      count(p);
      continue;
    }
    for (int j = overlap ? 0 : 4; j < kC4Window; ++j)
      w.from_ring(side, j, 4 * (int64_t)(j < 4 ? r.previous_group : r.current_group) + (j & 3));
    side.close(r.seq_len, w.kv, w.score, b, b, x);
  }
}

// A compress pass over `n` records given by record(i, &seq_len, &ragged, &ring_rows, &previous, &current)
// (false: nothing to do), outputs at out_row(i, ragged).
template <typename S, typename Record, typename OutRow>
void compress_side(const dsa_c4_params& p, const dsa_c4_compressor& c, int64_t n, int64_t num_tokens, Record&& record,
                   OutRow&& out_row) {
  const Side<S> side{c, p, c.head_dim};
  std::vector<float> x(c.head_dim);
  Window<S> w;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t seq_len;
    int64_t ragged;
    int ring_rows;
    int32_t previous, current;
    if (!record(i, &seq_len, &ragged, &ring_rows, &previous, &current)) continue;
    if (!compress_fits(seq_len, ragged, ring_rows, previous, current, num_tokens, c.ring_rows)) {
      count(p);
      continue;
    }
    const int first = seq_len > (uint32_t)kC4Quartet ? 0 : 4;
    for (int j = first; j < kC4Window; ++j) {
      if (j < ring_rows)
        w.from_ring(side, j, 4 * (int64_t)(j < 4 ? previous : current) + (j & 3));
      else
        w.from_input(side, j, ragged - (kC4Window - 1) + j);
    }
    side.close(seq_len, w.kv, w.score, out_row(i, ragged), ragged, x);
  }
}

template <typename S, typename Row>
void write_side(const dsa_c4_params& p, const dsa_c4_compressor& c, int64_t n, int64_t num_tokens, Row&& row) {
  const Side<S> side{c, p, c.head_dim};
  for (int64_t i = 0; i < n; ++i) {
    int64_t ragged, ring_row;
    if (!row(i, &ragged, &ring_row)) continue;
    if (ragged >= num_tokens || ring_row < 0 || ring_row >= c.ring_rows) {
      count(p);
      continue;
    }
    side.write_row(ring_row, ragged);
  }
}

template <typename S>
void extend_all(const dsa_c4_params& p) {
  auto record = [&](int64_t i, uint32_t* seq_len, int64_t* ragged, int* ring_rows, int32_t* previous,
                    int32_t* current) {
    const dsa_c4_compress_record& r = p.compress[i];
    if (r.seq_len == kC4Padding) return false;
    *seq_len = r.seq_len, *ragged = r.ragged_id, *ring_rows = r.ring_rows;
    *previous = r.previous_group, *current = r.current_group;
    return true;
  };
  auto row = [&](int64_t i, int64_t* ragged, int64_t* ring_row) {
    if (p.write[i].ragged_id == kC4Padding) return false;
    *ragged = p.write[i].ragged_id, *ring_row = p.write[i].ring_row;
    return true;
  };
  for (int k = 0; k < p.num_compressors; ++k)
    compress_side<S>(p, p.compressors[k], p.num_compress, p.num_tokens, record,
                     [](int64_t i, int64_t) { return i; });
  for (int k = 0; k < p.num_compressors; ++k) write_side<S>(p, p.compressors[k], p.num_write, p.num_tokens, row);
}

template <typename S>
void verify_all(const dsa_c4_params& p) {
  const int32_t V = p.num_drafts;
  const int64_t n = p.batch_size * V;
  auto record = [&](int64_t i, uint32_t* seq_len, int64_t* ragged, int* ring_rows, int32_t* previous,
                    int32_t* current) {
    const int64_t b = i / V;
    const int32_t j = (int32_t)(i % V), seq = p.seq_lens[b], slot = p.slots[b];
    if (seq < 0 || slot < 0) return false;
    const C4CompressRecord r = c4_draft_record(seq, j, slot, p.ring_size, V, b);
    if (r.seq_len == kC4Padding) return false;
    *seq_len = r.seq_len, *ragged = i, *ring_rows = r.ring_rows;
    *previous = r.previous_group, *current = r.current_group;
    return true;
  };
  auto row = [&](int64_t i, int64_t* ragged, int64_t* ring_row) {
    const int64_t b = i / V;
    const int32_t seq = p.seq_lens[b], slot = p.slots[b];
    if (seq < 0 || slot < 0) return false;
    *ragged = i, *ring_row = request_ring_row(slot, p.ring_size, seq + i % V);
    return true;
  };
  for (int k = 0; k < p.num_compressors; ++k)
    compress_side<S>(p, p.compressors[k], n, n, record, [](int64_t, int64_t ragged) { return ragged; });
  for (int k = 0; k < p.num_compressors; ++k) write_side<S>(p, p.compressors[k], n, n, row);
}

}  // namespace

void host_c4_decode(const dsa_c4_params& p) {
  for (int k = 0; k < p.num_compressors; ++k) {
    if (p.ring_dtype == DSA_STATE_BFLOAT16)
      decode_side<Bf16>(p, p.compressors[k]);
    else
      decode_side<float>(p, p.compressors[k]);
  }
}

void host_c4_extend(const dsa_c4_params& p) {
  if (p.ring_dtype == DSA_STATE_BFLOAT16)
    extend_all<Bf16>(p);
  else
    extend_all<float>(p);
}

void host_c4_verify(const dsa_c4_params& p) {
  if (p.ring_dtype == DSA_STATE_BFLOAT16)
    verify_all<Bf16>(p);
  else
    verify_all<float>(p);
}

}  // namespace dsa
