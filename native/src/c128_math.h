// Arithmetic of the c128 ops (docs/spec.md), shared verbatim by the CUDA kernels and the host backend: a slot's
// stored state as an online-softmax partial (online_softmax.h) and the per-token update into it, the slot a
// verify's accepted drafts leave, and the rules of the prefill plan's segment records.
#pragma once

#include <cstdint>

#include "dsa_kernels.h"
#include "online_softmax.h"

namespace dsa {

// A slot's stored state (m in natural units, s, k the normalized mean) as a Partial, and back.
DSA_HD Partial from_state(float m, float s, float k) { return Partial{to_log2(m), s, k * s}; }

DSA_HD float state_max(Partial p) { return p.max * kLn2; }

// One token (biased score t in base 2, value kv) at in-chunk position c into a stored state
// (m, s, k): the decode's arithmetic (docs/spec.md, the per-token update), which a verify repeats draft by draft so that a
// request's state never depends on whether its tokens were verified or decoded. c == 0 starts
// fresh and ignores the state.
DSA_HD Partial token_into_state(float m, float s, float k, float t, float kv, int c) {
  return c == 0 ? partial_of(t, kv) : absorb_one(from_state(m, s, k), t, kv);
}

// Speculative decoding (docs/spec.md, speculative decoding): the slot that holds a request's state once `accepted` of its
// `drafts` drafts (clamped to 0..drafts) are accepted after `seq` committed tokens: bank entry a,
// or `load` (the verify's source, any slot) when seq + a is a chunk end and the next token starts
// fresh. A negative bank base stays negative (the state is not held on this GPU).
DSA_HD int64_t accepted_slot(int32_t seq, int32_t accepted, int32_t drafts, int32_t load, int32_t bank,
                             int64_t stride) {
  const int32_t a = accepted < 0 ? 0 : accepted > drafts ? drafts : accepted;
  if (((int64_t)seq + a) % DSA_CHUNK == 0) return load;
  return bank < 0 ? -1 : bank + a * stride;
}

// A plan record is usable when it lies inside the input and inside one chunk, and its chunk
// position matches the list it came from. Sentinels are recognised separately.
DSA_HD bool is_sentinel(const dsa_segment& s) {
  return s.ragged_id == DSA_SEGMENT_SENTINEL && s.batch_id == DSA_SEGMENT_SENTINEL &&
         s.position == DSA_SEGMENT_SENTINEL && s.window_len == DSA_SEGMENT_SENTINEL;
}

DSA_HD bool segment_ok(const dsa_segment& s, bool closes_chunk, int64_t num_tokens,
                       int64_t batch_size) {
  const uint32_t in_chunk = s.position % DSA_CHUNK;
  return s.window_len >= 1 && s.window_len <= in_chunk + 1 && (int64_t)s.ragged_id < num_tokens &&
         s.ragged_id + 1 >= s.window_len && (int64_t)s.batch_id < batch_size &&
         (closes_chunk ? in_chunk == DSA_CHUNK - 1 : in_chunk < DSA_CHUNK - 1);
}

// A record that starts mid-chunk: it merges the state of its chunk's earlier tokens (read from the
// request's load slot). For usable records, the same as first_in_chunk != 0 in the kernels.
DSA_HD bool segment_continues(const dsa_segment& s) { return s.position % DSA_CHUNK + 1 != s.window_len; }

DSA_HD bool slot_ok(int32_t slot, int64_t num_slots) { return slot >= 0 && slot < num_slots; }
// The same for a slot count already checked to be 1..INT32_MAX (the decode kernel's): one unsigned compare.
DSA_HD bool slot_ok(int32_t slot, uint32_t slot_count) { return (uint32_t)slot < slot_count; }

}  // namespace dsa
