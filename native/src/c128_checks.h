// Argument checks shared by the c128 ops (host code): alignment, head size, slots, state dtype.
#pragma once

#include <cstdint>

#include "common.h"

namespace dsa {

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

template <typename P>
dsa_status check_common(const P& p, const char* op) {
  if (p.head_dim <= 0 || p.head_dim % 64 != 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: head_dim is %d; expected a positive multiple of 64",
                op, p.head_dim);
  if (p.num_slots <= 0 || p.num_slots > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_slots is %lld; expected 1..%d", op,
                (long long)p.num_slots, INT32_MAX);
  if (p.state_dtype != DSA_STATE_FLOAT32 && p.state_dtype != DSA_STATE_BFLOAT16)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: state_dtype is %d; expected %d (float32) or %d (bfloat16)", op,
                p.state_dtype, DSA_STATE_FLOAT32, DSA_STATE_BFLOAT16);
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
  if (p.bank_stride < 1 || p.bank_stride > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: bank_stride is %lld; expected 1..%d", op, (long long)p.bank_stride,
                INT32_MAX);
  if (p.batch_size > 0 && (p.seq_lens == nullptr || p.bank_indices == nullptr))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: seq_lens and bank_indices must be non-null", op);
  if (p.batch_size > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size is %lld; expected at most %d", op,
                (long long)p.batch_size, INT32_MAX);
  return DSA_STATUS_OK;
}

}  // namespace dsa
