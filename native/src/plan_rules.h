/* The prefill planner's segment rules (docs/spec.md, the plan), in one place: the library's C entry
 * point (plan.cpp) and the Cython planner (pyplan/_plan.pyx) both cut plans with these two functions.
 * Plain C99, static inline: each caller compiles them into its own loop. */
#ifndef DSA_PLAN_RULES_H
#define DSA_PLAN_RULES_H

#include <stdint.h>

#include "dsa_kernels.h"

/* Positions and ragged rows are stored as uint32 with 0xFFFFFFFF reserved for the sentinel. */
#define DSA_PLAN_MAX_COORDINATE 0xFFFFFFFELL
#define DSA_PLAN_CHUNK_LOG2 7

/* What dsa_plan_count found wrong with request *bad. */
enum dsa_plan_problem {
  DSA_PLAN_VALID = 0,
  DSA_PLAN_BAD_SEQ = 1,      /* seq_lens[b] outside 0..DSA_PLAN_MAX_COORDINATE */
  DSA_PLAN_BAD_EXTEND = 2,   /* extend_lens[b] outside 1..seq_lens[b] */
  DSA_PLAN_TOO_MANY = 3      /* the extends' sum passes DSA_PLAN_MAX_COORDINATE at request b */
};

/* Validates requests 0..B-1 and counts the plan's tokens and records; writes no record. Returns a
 * dsa_plan_problem (and the request in *bad). Coordinates are checked non-negative before any
 * arithmetic on them, so dividing by 128 is a shift. */
static inline int dsa_plan_count(const int64_t* seq, const int64_t* ext, int64_t batch, int64_t* total,
                                 int64_t* num_compress, int64_t* num_write, int64_t* bad) {
  int64_t t = 0, c = 0, w = 0, b;
  for (b = 0; b < batch; ++b) {
    const int64_t s = seq[b], e = ext[b];
    *bad = b;
    if (s < 0 || s > DSA_PLAN_MAX_COORDINATE) return DSA_PLAN_BAD_SEQ;
    if (e <= 0 || e > s) return DSA_PLAN_BAD_EXTEND;
    t += e;
    if (t > DSA_PLAN_MAX_COORDINATE) return DSA_PLAN_TOO_MANY;
    c += (s >> DSA_PLAN_CHUNK_LOG2) - ((s - e) >> DSA_PLAN_CHUNK_LOG2);
    w += (s & (DSA_CHUNK - 1)) != 0;
  }
  *total = t, *num_compress = c, *num_write = w;
  return DSA_PLAN_VALID;
}

/* Cuts valid requests (dsa_plan_count) into records: per request the segment to the end of the
 * prefix's chunk (or to seq_len), then whole chunks, then the trailing partial chunk; closing
 * segments into `compress`, trailing ones into `write`, in (request, position) order. With
 * graph != 0 the lists are padded with sentinels to their capacities. The capacities must hold the
 * counted records. */
static inline void dsa_plan_cut(const int64_t* seq, const int64_t* ext, int64_t batch, int graph, dsa_segment* compress,
                                int64_t compress_capacity, dsa_segment* write, int64_t write_capacity,
                                int64_t* num_compress, int64_t* num_write) {
  int64_t c = 0, w = 0, ragged = 0, b, i;
  dsa_segment seg;
  for (b = 0; b < batch; ++b) {
    const int64_t s = seq[b], prefix = s - ext[b];
    const int64_t base = ragged - prefix - 1; /* the segment ending at position p - 1 has ragged_id base + p */
    const int64_t full_end = s & ~(int64_t)(DSA_CHUNK - 1);
    int64_t end = ((prefix >> DSA_PLAN_CHUNK_LOG2) + 1) << DSA_PLAN_CHUNK_LOG2;
    if (end > s) end = s;
    seg.batch_id = (uint32_t)b;
    seg.ragged_id = (uint32_t)(base + end);
    seg.position = (uint32_t)(end - 1);
    seg.window_len = (uint32_t)(end - prefix);
    if ((end & (DSA_CHUNK - 1)) == 0)
      compress[c++] = seg;
    else
      write[w++] = seg;
    seg.window_len = DSA_CHUNK;
    while (end < full_end) {
      end += DSA_CHUNK;
      seg.ragged_id = (uint32_t)(base + end);
      seg.position = (uint32_t)(end - 1);
      compress[c++] = seg;
    }
    if (end < s) {
      seg.ragged_id = (uint32_t)(base + s);
      seg.position = (uint32_t)(s - 1);
      seg.window_len = (uint32_t)(s - end);
      write[w++] = seg;
    }
    ragged += ext[b];
  }
  if (graph) {
    seg.ragged_id = seg.batch_id = seg.position = seg.window_len = DSA_SEGMENT_SENTINEL;
    for (i = c; i < compress_capacity; ++i) compress[i] = seg;
    for (i = w; i < write_capacity; ++i) write[i] = seg;
  }
  *num_compress = c, *num_write = w;
}

#endif /* DSA_PLAN_RULES_H */
