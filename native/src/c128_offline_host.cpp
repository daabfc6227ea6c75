// Host backend of the offline c128 ops: the kernels' arithmetic (c128_offline_math.h), one record at a time,
// every compress record of a call before any write record; what runs when device == DSA_DEVICE_HOST.
#include "c128_offline_host.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "c128_offline_math.h"
#include "store_host.h"

namespace dsa {
namespace {

void count(const dsa_c128_offline_params& p) {
  if (p.error_count != nullptr) ++*p.error_count;
}

// The call's ring with its element type, and a chunk's window: row j's kv and score halves, widened into
// `rows` when they come from the ring, or pointing into the input.
template <typename S>
struct Ring {
  const dsa_c128_offline_params& p;
  int D;
  std::vector<float> rows;
  const float* kv[kOfflineWindow] = {};
  const float* score[kOfflineWindow] = {};

  explicit Ring(const dsa_c128_offline_params& params) : p(params), D(params.head_dim) {}

  S* row(int64_t r) const { return static_cast<S*>(p.ring) + r * 2 * D; }

  void write_row(int64_t ring_row, int64_t input_row) const {
    const float* in = p.kv_score + input_row * 2 * D;
    S* to = row(ring_row);
    for (int e = 0; e < 2 * D; ++e) narrow(in[e], &to[e]);
  }

  void from_ring(int j, int64_t ring_row) {
    if (rows.empty()) rows.resize((size_t)kOfflineWindow * 2 * D);  // on the first closing row of the call
    const S* r = row(ring_row);
    float* w = rows.data() + j * 2 * D;
    for (int e = 0; e < 2 * D; ++e) w[e] = widen(r[e]);
    kv[j] = w, score[j] = w + D;
  }

  void from_input(int j, int64_t input_row) {
    const float* r = p.kv_score + input_row * 2 * D;
    kv[j] = r, score[j] = r + D;
  }

  // The chunk closed at seq_len (a multiple of 128) from the window as resolved: to out row `out_row`, stored at
  // the cache slot of row `slot_row`, rotary row seq_len - 128.
  void close(uint32_t seq_len, int64_t out_row, int64_t slot_row, std::vector<float>& x) const {
    for (int d = 0; d < D; ++d) {
      float a[kOfflineBlocks][kOfflineBlockRows], z[kOfflineBlocks][kOfflineBlockRows];
      for (int j = 0; j < kOfflineWindow; ++j) {
        a[j / kOfflineBlockRows][j % kOfflineBlockRows] = kv[j][d];
        z[j / kOfflineBlockRows][j % kOfflineBlockRows] = score[j][d] + p.ape[j * D + d];
      }
      x[d] = offline_channel(a, z);
    }
    if (p.out != nullptr) std::memcpy(p.out + out_row * D, x.data(), sizeof(float) * D);
    if (p.store != nullptr)
      host_store_entry(x.data(), D, *p.store, p.cache_slots[slot_row], (int64_t)seq_len - kOfflineWindow,
                       p.error_count);
  }
};

template <typename S>
void decode_all(const dsa_c128_offline_params& p) {
  Ring<S> ring(p);
  std::vector<float> x(p.head_dim);
  for (int64_t b = 0; b < p.batch_size; ++b) {
    C4DecodeRecord r;
    if (p.decode_records != nullptr) {
      std::memcpy(&r, p.decode_records + b, sizeof(r));
    } else {
      if (p.seq_lens[b] <= 0 || p.slots[b] < 0) continue;
      r = offline_decode_record(p.seq_lens[b], p.slots[b], p.ring_size);
    }
    if (r.seq_len == 0u || r.seq_len > 0x7FFFFFFFu) continue;  // padding
    if (r.write_row < 0 || r.write_row >= p.ring_rows) {
      count(p);
      continue;
    }
    ring.write_row(r.write_row, b);
    if (!closes_chunk(r.seq_len)) continue;
    if (!page_ok(r.current_group, p.ring_rows)) {
      count(p);
      continue;
    }
    for (int j = 0; j < kOfflineWindow; ++j) ring.from_ring(j, (int64_t)r.current_group * kOfflineWindow + j);
    ring.close(r.seq_len, b, b, x);
  }
}

template <typename S>
void extend_all(const dsa_c128_offline_params& p) {
  Ring<S> ring(p);
  std::vector<float> x(p.head_dim);
  for (int64_t i = 0; i < p.num_compress; ++i) {
    const dsa_c4_compress_record& r = p.compress[i];
    if (r.seq_len == kC4Padding) continue;
    const int64_t ragged = r.ragged_id;
    if (!offline_compress_fits(r.seq_len, ragged, r.ring_rows, r.current_group, p.num_tokens, p.ring_rows)) {
      count(p);
      continue;
    }
    for (int j = 0; j < kOfflineWindow; ++j) {
      if (j < r.ring_rows)
        ring.from_ring(j, (int64_t)r.current_group * kOfflineWindow + j);
      else
        ring.from_input(j, ragged - (kOfflineWindow - 1) + j);
    }
    ring.close(r.seq_len, i, ragged, x);
  }
  for (int64_t i = 0; i < p.num_write; ++i) {
    const dsa_c4_write_record& w = p.write[i];
    if (w.ragged_id == kC4Padding) continue;
    if ((int64_t)w.ragged_id >= p.num_tokens || w.ring_row < 0 || w.ring_row >= p.ring_rows) {
      count(p);
      continue;
    }
    ring.write_row(w.ring_row, w.ragged_id);
  }
}

}  // namespace

void host_c128_offline_decode(const dsa_c128_offline_params& p) {
  if (p.ring_dtype == DSA_STATE_BFLOAT16)
    decode_all<Bf16>(p);
  else
    decode_all<float>(p);
}

void host_c128_offline_extend(const dsa_c128_offline_params& p) {
  if (p.ring_dtype == DSA_STATE_BFLOAT16)
    extend_all<Bf16>(p);
  else
    extend_all<float>(p);
}

}  // namespace dsa
