// Host prefill planner (docs/spec.md, the plan): the C entry point over the segment rules of
// plan_rules.h (which the Cython planner shares), with the library's checks and messages.
#include <cstdint>

#include "common.h"
#include "plan_rules.h"

DSA_DECLARE_STRUCT(DSA_STRUCT_SEGMENT, dsa_segment);
DSA_DECLARE_STRUCT(DSA_STRUCT_PLAN_PARAMS, dsa_plan_params);

namespace {

constexpr int64_t kChunk = DSA_CHUNK;
constexpr int64_t kMaxCoordinate = DSA_PLAN_MAX_COORDINATE;

// Validates every request and counts the records the plan needs; writes nothing.
dsa_status count_segments(const dsa_plan_params& p, int64_t* num_compress, int64_t* num_write) {
  const char* op = "dsa_c128_plan_prefill";
  if (p.batch_size < 0)
    return dsa::fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size is %lld; expected >= 0", op,
                     (long long)p.batch_size);
  if (p.batch_size > 0 && (p.seq_lens == nullptr || p.extend_lens == nullptr))
    return dsa::fail(DSA_STATUS_INVALID_ARGUMENT, "%s: seq_lens and extend_lens must be non-null",
                     op);
  if (p.num_tokens < 0 || p.num_tokens > kMaxCoordinate)
    return dsa::fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_tokens is %lld; expected 0..%lld", op,
                     (long long)p.num_tokens, (long long)kMaxCoordinate);
  int64_t total = 0, compress = 0, write = 0, b = 0;
  switch (dsa_plan_count(p.seq_lens, p.extend_lens, p.batch_size, &total, &compress, &write, &b)) {
    case DSA_PLAN_BAD_SEQ:
      return dsa::fail(DSA_STATUS_INVALID_ARGUMENT, "%s: seq_lens[%lld] is %lld; expected 0..%lld", op, (long long)b,
                       (long long)p.seq_lens[b], (long long)kMaxCoordinate);
    case DSA_PLAN_BAD_EXTEND:
      return dsa::fail(DSA_STATUS_INVALID_ARGUMENT, "%s: extend_lens[%lld] is %lld; expected 1..seq_lens[%lld] = %lld",
                       op, (long long)b, (long long)p.extend_lens[b], (long long)b, (long long)p.seq_lens[b]);
    case DSA_PLAN_TOO_MANY:
      return dsa::fail(DSA_STATUS_INVALID_ARGUMENT, "%s: sum of extend_lens exceeds %lld at request %lld", op,
                       (long long)kMaxCoordinate, (long long)b);
    default:
      break;
  }
  if (p.graph_mode ? total > p.num_tokens : total != p.num_tokens)
    return dsa::fail(DSA_STATUS_INVALID_ARGUMENT, "%s: sum of extend_lens is %lld but num_tokens is %lld (%s)",
                     op, (long long)total, (long long)p.num_tokens,
                     p.graph_mode ? "graph mode needs num_tokens >= the sum" : "they must be equal");
  if (compress > p.compress_capacity || (compress > 0 && p.compress == nullptr))
    return dsa::fail(DSA_STATUS_CAPACITY,
                     "%s: the plan needs %lld compress records but compress_capacity is %lld", op,
                     (long long)compress, (long long)p.compress_capacity);
  if (write > p.write_capacity || (write > 0 && p.write == nullptr))
    return dsa::fail(DSA_STATUS_CAPACITY,
                     "%s: the plan needs %lld write records but write_capacity is %lld", op,
                     (long long)write, (long long)p.write_capacity);
  if (p.graph_mode && ((p.compress_capacity > 0 && p.compress == nullptr) ||
                       (p.write_capacity > 0 && p.write == nullptr)))
    return dsa::fail(DSA_STATUS_INVALID_ARGUMENT, "%s: graph mode needs both record arrays", op);
  *num_compress = compress;
  *num_write = write;
  return DSA_STATUS_OK;
}

}  // namespace

extern "C" int64_t dsa_c128_compress_capacity(int64_t num_tokens, int64_t batch_size) {
  if (num_tokens < 0 || batch_size < 0) return 0;
  return num_tokens / kChunk + batch_size;
}

extern "C" dsa_status dsa_c128_plan_prefill(const dsa_plan_params* params) {
  DSA_TRY(dsa::check_struct(params, "dsa_c128_plan_prefill"));
  const dsa_plan_params& p = *params;
  int64_t num_compress = 0, num_write = 0;
  DSA_TRY(count_segments(p, &num_compress, &num_write));

  int64_t c = 0, w = 0;
  dsa_plan_cut(p.seq_lens, p.extend_lens, p.batch_size, p.graph_mode != 0, p.compress, p.compress_capacity, p.write,
               p.write_capacity, &c, &w);
  if (p.num_compress) *p.num_compress = c;
  if (p.num_write) *p.num_write = w;
  return dsa::ok();
}
