// Argument checks shared by the c128 ops (host code): alignment, head size, slots, state dtype, host plans.
#pragma once

#include <algorithm>
#include <cstdint>

#include "c128_math.h"
#include "common.h"
#include "launch_policy.h"

namespace dsa {

// The state's layout fields every c128 op shares (the copying commit too).
inline dsa_status check_state_layout(int head_dim, int32_t state_dtype, const char* op) {
  if (head_dim <= 0 || head_dim % 64 != 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: head_dim is %d; expected a positive multiple of 64", op, head_dim);
  if (state_dtype != DSA_STATE_FLOAT32 && state_dtype != DSA_STATE_BFLOAT16)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: state_dtype is %d; expected %d (float32) or %d (bfloat16)", op,
                state_dtype, DSA_STATE_FLOAT32, DSA_STATE_BFLOAT16);
  return DSA_STATUS_OK;
}

template <typename P>
dsa_status check_common(const P& p, const char* op) {
  DSA_TRY(check_state_layout(p.head_dim, p.state_dtype, op));
  if (p.num_slots <= 0 || p.num_slots > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_slots is %lld; expected 1..%d", op,
                (long long)p.num_slots, INT32_MAX);
  if (p.state == nullptr || p.ape == nullptr || p.indices == nullptr || p.kv_score == nullptr)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: state, kv_score, ape and indices must be non-null", op);
  if (vector_width(p) == 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT,
                "%s: kv_score, out and ape must be 8-byte aligned float32 buffers and state %d-byte aligned", op,
                2 * state_bytes(p.state_dtype));
  return DSA_STATUS_OK;
}

template <typename P>
dsa_status check_speculative(const P& p, const char* op) {
  if (p.num_drafts < 1 || p.num_drafts > DSA_MAX_DRAFTS)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_drafts is %d; expected 1..%d", op, p.num_drafts, DSA_MAX_DRAFTS);
  if ((p.bank_stride) < 1 || (p.bank_stride) > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: bank_stride is %lld; expected 1..%d", op, (long long)p.bank_stride,
                INT32_MAX);
  if (p.batch_size > 0 && (p.seq_lens == nullptr || p.bank_indices == nullptr))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: seq_lens and bank_indices must be non-null", op);
  if (p.batch_size > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size is %lld; expected at most %d", op,
                (long long)p.batch_size, INT32_MAX);
  return DSA_STATUS_OK;
}

// A host plan (DSA_FLAG_HOST_PLAN: records in host memory, read during the call) is checked before
// anything runs: a record that is not a sentinel and breaks the segment rules for this call (outside
// its num_tokens rows or batch_size requests, longer than its chunk allows, or not closing its chunk
// as its list requires) fails the call, naming it; so does a plan whose records cover fewer requests than
// batch_size (every request of a plan has at least one segment: a plan made for the first requests of a
// batch would leave the others unwritten). Device plans' records are data, skipped and counted.
inline dsa_status check_host_plan(const dsa_c128_prefill_params& p, const char* op) {
  if (!(p.flags & DSA_FLAG_HOST_PLAN)) return DSA_STATUS_OK;
  int64_t requests = 0;  // 1 + the largest batch_id of the plan's records
  for (const bool compress : {true, false}) {
    const dsa_segment* list = compress ? p.compress : p.write;
    int64_t count = compress ? p.compress_capacity : p.write_capacity;
    if (p.counts != nullptr) count = std::max<int64_t>(0, std::min(count, p.counts[compress ? 0 : 1]));
    for (int64_t i = 0; i < count; ++i) {
      const dsa_segment& s = list[i];
      if (is_sentinel(s)) continue;
      if (segment_ok(s, compress, p.num_tokens, p.batch_size)) {
        requests = std::max<int64_t>(requests, (int64_t)s.batch_id + 1);
        continue;
      }
      return fail(DSA_STATUS_INVALID_ARGUMENT,
                  "%s: %s record %lld {ragged_id %u, batch_id %u, position %u, window_len %u} does not fit this "
                  "call (%lld tokens, %lld requests; a %s record %s its chunk, 1 <= window_len <= position %% 128 + 1, "
                  "ragged_id + 1 >= window_len): a plan made for other inputs?",
                  op, compress ? "compress" : "write", (long long)i, s.ragged_id, s.batch_id, s.position,
                  s.window_len, (long long)p.num_tokens, (long long)p.batch_size, compress ? "compress" : "write",
                  compress ? "closes" : "ends before the end of");
    }
  }
  if (requests < p.batch_size)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: the plan's records cover %lld requests but batch_size (the length of "
                "indices) is %lld: a plan made for other inputs?", op, (long long)requests, (long long)p.batch_size);
  return DSA_STATUS_OK;
}

}  // namespace dsa
