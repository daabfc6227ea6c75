// Host prefill planner (docs/spec.md, the plan): cuts each request's new tokens [prefix, seq_len) at multiples
// of 128 into compress segments (closing a chunk) and at most one trailing write segment.
#include <cstdint>

#include "common.h"

namespace {

constexpr int64_t kChunk = DSA_CHUNK;
// Positions and ragged rows are stored as uint32 with 0xFFFFFFFF reserved for the sentinel.
constexpr int64_t kMaxCoordinate = 0xFFFFFFFELL;

// Chunk index and offset of a coordinate already validated non-negative: unsigned arithmetic, so
// the division by 128 is a shift without the sign fix of a signed one.
inline int64_t chunk_of(int64_t v) { return (int64_t)((uint64_t)v / kChunk); }
inline bool inside_chunk(int64_t v) { return (uint64_t)v % kChunk != 0; }

const dsa_segment kSentinel = {DSA_SEGMENT_SENTINEL, DSA_SEGMENT_SENTINEL, DSA_SEGMENT_SENTINEL,
                               DSA_SEGMENT_SENTINEL};

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
  int64_t total = 0, compress = 0, write = 0;
  for (int64_t b = 0; b < p.batch_size; ++b) {
    const int64_t seq = p.seq_lens[b], extend = p.extend_lens[b];
    if (seq < 0 || seq > kMaxCoordinate)
      return dsa::fail(DSA_STATUS_INVALID_ARGUMENT,
                       "%s: seq_lens[%lld] is %lld; expected 0..%lld", op, (long long)b,
                       (long long)seq, (long long)kMaxCoordinate);
    if (extend <= 0 || extend > seq)
      return dsa::fail(DSA_STATUS_INVALID_ARGUMENT,
                       "%s: extend_lens[%lld] is %lld; expected 1..seq_lens[%lld] = %lld", op,
                       (long long)b, (long long)extend, (long long)b, (long long)seq);
    total += extend;
    if (total > kMaxCoordinate)
      return dsa::fail(DSA_STATUS_INVALID_ARGUMENT,
                       "%s: sum of extend_lens exceeds %lld at request %lld", op,
                       (long long)kMaxCoordinate, (long long)b);
    compress += chunk_of(seq) - chunk_of(seq - extend);
    write += inside_chunk(seq);
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

  int64_t c = 0, w = 0, ragged = 0;
  for (int64_t b = 0; b < p.batch_size; ++b) {
    const int64_t seq = p.seq_lens[b], prefix = seq - p.extend_lens[b];
    // The first segment runs to the end of the prefix's chunk or to seq_len; then whole chunks;
    // then the trailing partial chunk.
    int64_t end = (chunk_of(prefix) + 1) * kChunk;
    if (end > seq) end = seq;
    const dsa_segment first = {(uint32_t)(ragged + end - 1 - prefix), (uint32_t)b, (uint32_t)(end - 1),
                               (uint32_t)(end - prefix)};
    if (!inside_chunk(end))
      p.compress[c++] = first;
    else
      p.write[w++] = first;
    for (const int64_t full_end = chunk_of(seq) * kChunk; end < full_end;) {
      end += kChunk;
      p.compress[c++] = {(uint32_t)(ragged + end - 1 - prefix), (uint32_t)b, (uint32_t)(end - 1), (uint32_t)kChunk};
    }
    if (end < seq)
      p.write[w++] = {(uint32_t)(ragged + seq - 1 - prefix), (uint32_t)b, (uint32_t)(seq - 1), (uint32_t)(seq - end)};
    ragged += p.extend_lens[b];
  }
  if (p.graph_mode) {
    for (int64_t i = c; i < p.compress_capacity; ++i) p.compress[i] = kSentinel;
    for (int64_t i = w; i < p.write_capacity; ++i) p.write[i] = kSentinel;
  }
  if (p.num_compress) *p.num_compress = c;
  if (p.num_write) *p.num_write = w;
  return dsa::ok();
}
