// Host backend of the c128 ops: the kernels' arithmetic (c128_math.h), one token at a time,
// compress list before write list; what runs when device == DSA_DEVICE_HOST. A closed vector is stored by the
// store's host backend (store_host.cpp).
#include "c128_host.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bf16.h"
#include "c128_math.h"
#include "store_host.h"

namespace dsa {

namespace {

// What happens to a vector an op closes: copied to its `out` row (when out is given) and stored into
// the cache (when the op has a store), at the op's cache slot of that row.
struct Closer {
  int D;
  const dsa_kv_cache* store;
  const int64_t* cache_slots;
  float* out;
  uint32_t* error_count;
  void operator()(const float* vector, int64_t row, int64_t first_position, int64_t out_row) const {
    if (out != nullptr) std::memcpy(out + out_row * D, vector, sizeof(float) * D);
    if (store != nullptr) host_store_vector(vector, D, *store, cache_slots[row], first_position, error_count);
  }
};

template <typename S>
void host_decode(const dsa_c128_decode_params& p) {
  const int D = p.head_dim;
  std::vector<float> vector(D);
  const Closer closed{D, p.store, p.cache_slots, p.out, p.error_count};
  // DSA_FLAG_DECODE_RECORDS: {seq_len, slot, load slot, unused} per request at `indices`
  const bool records = (p.flags & DSA_FLAG_DECODE_RECORDS) != 0;
  for (int64_t b = 0; b < p.batch_size; ++b) {
    const int32_t* r = records ? p.indices + 4 * b : nullptr;
    const int32_t seq_len = records ? r[0] : p.seq_lens[b], slot = records ? r[1] : p.indices[b];
    const int32_t load_slot = records ? r[2] : p.load_indices != nullptr ? p.load_indices[b] : slot;
    if (seq_len <= 0) continue;
    const int c = (seq_len - 1) % DSA_CHUNK;
    if (slot < 0 || (c != 0 && load_slot < 0)) continue;  // not held here: skipped, uncounted
    if (!slot_ok(slot, p.num_slots) || (c != 0 && !slot_ok(load_slot, p.num_slots))) {
      if (p.error_count) ++*p.error_count;
      continue;
    }
    const float* token = p.kv_score + b * 2 * D;
    S* state = static_cast<S*>(p.state) + (int64_t)slot * 3 * D;
    const S* prior = static_cast<const S*>(p.state) + (int64_t)load_slot * 3 * D;
    for (int d = 0; d < D; ++d) {
      const float t = to_log2(token[D + d] + p.ape[(int64_t)c * D + d]);
      float m = 0.0f, s = 0.0f, k = 0.0f;
      if (c != 0) m = widen(prior[d]), s = widen(prior[D + d]), k = widen(prior[2 * D + d]);
      const Partial r = token_into_state(m, s, k, t, token[d], c);
      if (c == DSA_CHUNK - 1) {
        vector[d] = mean_of(r);
      } else {
        narrow(state_max(r), &state[d]), narrow(r.sum, &state[D + d]), narrow(mean_of(r), &state[2 * D + d]);
      }
    }
    if (c == DSA_CHUNK - 1) closed(vector.data(), b, seq_len - DSA_CHUNK, b);
  }
}

template <typename S>
void host_prefill_pass(const dsa_c128_prefill_params& p, bool write_pass, std::vector<Partial>& scratch) {
  const int D = p.head_dim;
  const dsa_segment* list = write_pass ? p.write : p.compress;
  int64_t count = write_pass ? p.write_capacity : p.compress_capacity;
  if (p.counts != nullptr) count = std::max<int64_t>(0, std::min(count, p.counts[write_pass ? 1 : 0]));
  const int32_t* load_indices = p.load_indices != nullptr ? p.load_indices : p.indices;
  S* const state = static_cast<S*>(p.state);
  std::vector<float> vector(D);
  const Closer closed{D, p.store, p.cache_slots, p.out, p.error_count};
  for (int64_t r = 0; r < count; ++r) {
    const dsa_segment seg = list[r];
    if (is_sentinel(seg)) continue;
    if (!segment_ok(seg, !write_pass, p.num_tokens, p.batch_size)) {
      if (p.error_count) ++*p.error_count;
      continue;
    }
    const int n = (int)seg.window_len;
    const int first_in_chunk = (int)(seg.position % DSA_CHUNK) - n + 1;
    const bool continues = first_in_chunk != 0;
    const int32_t load_slot = continues ? load_indices[seg.batch_id] : 0;
    const int32_t store_slot = write_pass ? p.indices[seg.batch_id] : 0;
    if ((continues && load_slot < 0) || (write_pass && store_slot < 0)) continue;  // not held here, uncounted
    if ((continues && !slot_ok(load_slot, p.num_slots)) || (write_pass && !slot_ok(store_slot, p.num_slots))) {
      if (p.error_count) ++*p.error_count;
      continue;
    }
    const int64_t first_row = (int64_t)seg.ragged_id - n + 1;
    std::vector<Partial>& total = scratch;
    total.assign(D, empty_partial());
    for (int j = 0; j < n; ++j) {  // tokens outer, channels inner: rows are read in order
      const float* token = p.kv_score + (first_row + j) * 2 * D;
      const float* bias = p.ape + (int64_t)(first_in_chunk + j) * D;
      for (int d = 0; d < D; ++d) {
        const float t[1] = {to_log2(token[D + d] + bias[d])}, v[1] = {token[d]};
        total[d] = absorb(total[d], t, v, 1);
      }
    }
    const int64_t out_row = p.out_layout == DSA_OUT_COMPACT ? r : (int64_t)seg.ragged_id;
    for (int d = 0; d < D; ++d) {
      Partial result = total[d];
      if (continues) {
        const S* prior = state + (int64_t)load_slot * 3 * D + d;
        result = merge(from_state(widen(prior[0]), widen(prior[D]), widen(prior[2 * D])), result);
      }
      if (write_pass) {
        S* to = state + (int64_t)store_slot * 3 * D + d;
        narrow(state_max(result), to), narrow(result.sum, to + D), narrow(mean_of(result), to + 2 * D);
      } else {
        vector[d] = mean_of(result);
      }
    }
    if (!write_pass) closed(vector.data(), seg.ragged_id, (int64_t)seg.position - (DSA_CHUNK - 1), out_row);
  }
}

template <typename S>
void host_verify(const dsa_c128_verify_params& p) {
  const int D = p.head_dim, V = p.num_drafts;
  std::vector<float> vector(D);
  const Closer closed{D, p.store, p.cache_slots, p.out, p.error_count};
  S* const state = static_cast<S*>(p.state);
  const bool fp32_between = (p.flags & DSA_FLAG_VERIFY_FP32_BETWEEN_DRAFTS) != 0;
  for (int64_t b = 0; b < p.batch_size; ++b) {
    const int32_t seq = p.seq_lens[b], load_slot = p.indices[b], bank = p.bank_indices[b];
    const int32_t v = p.verify_lens != nullptr ? p.verify_lens[b] : V;
    if (seq < 0) continue;
    const int c0 = seq % DSA_CHUNK;
    if (bank < 0 || (c0 != 0 && load_slot < 0)) continue;
    if (v < 0 || v > V || (c0 != 0 && load_slot >= p.num_slots) || bank + (int64_t)v * p.bank_stride >= p.num_slots) {
      if (p.error_count) ++*p.error_count;
      continue;
    }
    for (int d = 0; d < D; ++d) {
      float m = 0.0f, s = 0.0f, k = 0.0f;
      if (c0 != 0) {
        const S* prior = state + (int64_t)load_slot * 3 * D + d;
        m = widen(prior[0]), s = widen(prior[D]), k = widen(prior[2 * D]);
        S* entry = state + (int64_t)bank * 3 * D + d;
        if (bank != load_slot) narrow(m, entry), narrow(s, entry + D), narrow(k, entry + 2 * D);
      }
      for (int j = 0; j < v; ++j) {
        const int c = (seq + j) % DSA_CHUNK;
        const float* token = p.kv_score + (b * V + j) * 2 * D;
        const Partial r = token_into_state(m, s, k, to_log2(token[D + d] + p.ape[(int64_t)c * D + d]), token[d], c);
        m = state_max(r), s = r.sum, k = mean_of(r);
        if (!fp32_between) m = as_stored<S>(m), s = as_stored<S>(s);
        if (c == DSA_CHUNK - 1) {
          vector[d] = k;
        } else {
          S* entry = state + (bank + (j + 1) * p.bank_stride) * 3 * D + d;
          narrow(m, entry), narrow(s, entry + D), narrow(k, entry + 2 * D);
          if (!fp32_between) k = as_stored<S>(k);
        }
      }
    }
    const int close = DSA_CHUNK - 1 - c0;  // the draft that closes the chunk, if any (V < 128)
    if (close < v) closed(vector.data(), b * V + close, (int64_t)seq + close - (DSA_CHUNK - 1), b * V + close);
  }
}

template <typename S>
void host_commit_copy(const dsa_c128_commit_params& p) {
  const int D = p.head_dim;
  for (int64_t b = 0; b < p.batch_size; ++b) {
    const int32_t seq = p.seq_lens[b], main = p.indices[b], bank = p.bank_indices[b];
    const int32_t v = p.verify_lens != nullptr ? p.verify_lens[b] : p.num_drafts;
    if (seq < 0) continue;
    if (v < 0 || v > p.num_drafts) {
      if (p.error_count) ++*p.error_count;
      continue;
    }
    const int32_t a = std::min(std::max(p.accepted[b], 0), v);
    if (a == 0 || ((int64_t)seq + a) % DSA_CHUNK == 0 || main < 0 || bank < 0) continue;
    const int64_t from = bank + a * p.bank_stride;
    if (main >= p.num_slots || from >= p.num_slots) {
      if (p.error_count) ++*p.error_count;
      continue;
    }
    for (int32_t layer = 0; layer < p.num_layers; ++layer) {
      S* const state = static_cast<S*>(p.states[layer]);
      std::memmove(state + (int64_t)main * 3 * D, state + from * 3 * D, sizeof(S) * 3 * D);
    }
  }
}

void host_commit_slots(const dsa_c128_commit_params& p) {
  for (int64_t b = 0; b < p.batch_size; ++b) {
    const int32_t seq = p.seq_lens[b], v = p.verify_lens != nullptr ? p.verify_lens[b] : p.num_drafts;
    if (seq < 0) continue;
    if (v < 0 || v > p.num_drafts) {
      if (p.error_count) ++*p.error_count;
      continue;
    }
    int64_t slot = accepted_slot(seq, p.accepted[b], v, p.indices[b], p.bank_indices[b], p.bank_stride);
    if (slot >= p.num_slots) {
      if (p.error_count) ++*p.error_count;
      slot = -1;
    }
    p.load_indices[b] = (int32_t)slot;
  }
}

}  // namespace

void host_decode(const dsa_c128_decode_params& p) {
  p.state_dtype == DSA_STATE_BFLOAT16 ? host_decode<Bf16>(p) : host_decode<float>(p);
}

void host_prefill(const dsa_c128_prefill_params& p) {
  std::vector<Partial> scratch;
  for (bool write_pass : {false, true})
    p.state_dtype == DSA_STATE_BFLOAT16 ? host_prefill_pass<Bf16>(p, write_pass, scratch)
                                        : host_prefill_pass<float>(p, write_pass, scratch);
}

void host_verify(const dsa_c128_verify_params& p) {
  p.state_dtype == DSA_STATE_BFLOAT16 ? host_verify<Bf16>(p) : host_verify<float>(p);
}

void host_commit(const dsa_c128_commit_params& p) {
  if (p.num_layers == 0) host_commit_slots(p);
  else if (p.state_dtype == DSA_STATE_BFLOAT16) host_commit_copy<Bf16>(p);
  else host_commit_copy<float>(p);
}

}  // namespace dsa
