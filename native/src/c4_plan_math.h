// Arithmetic of the c4 plans (docs/spec.md, "c4 plans"), shared verbatim by the planning kernels and the host
// backend: the ring row of a position from the engine's tables, a decode record, and what one ragged row of an
// extend contributes. Table values are data: every read through one is bounds-checked first; every value
// computed from one is 64-bit two's complement (it may wrap). A ring row outside 0..2^31 - 1 becomes -1 (a record
// the ops skip and count), never its low 32 bits (another request's rows); positions keep their low 32 bits.
#pragma once

#include <cstdint>

#include "dsa_kernels.h"
#include "host_device.h"
#include "int_math.h"

namespace dsa {

DSA_HD int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
DSA_HD int64_t wrap_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
DSA_HD int64_t wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
// Floor division and modulo by m >= 1.
DSA_HD int64_t floor_div(int64_t a, int64_t m) {
  const int64_t q = a / m;
  return a % m != 0 && a < 0 ? q - 1 : q;
}
DSA_HD int64_t floor_mod(int64_t a, int64_t m) {
  const int64_t r = a % m;
  return r < 0 ? r + m : r;
}
DSA_HD int32_t low32(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }

// Request b's length (seq_lens or extend_lens, int64 or int32 as the params say).
DSA_HD int64_t plan_length(const void* lengths, int32_t is_int32, int64_t b) {
  return is_int32 ? (int64_t) static_cast<const int32_t*>(lengths)[b] : static_cast<const int64_t*>(lengths)[b];
}

// The ring row of a position, in the steps of its table reads (each -1 where the tables address none), so that
// a caller of two positions issues each table's two reads together: where req_to_token holds position `pos` of
// request row `rid`; the token there; its state slot; the slot's ring row. Or, with request-scoped rings, the
// row without reads.
DSA_HD int64_t token_index(const dsa_c4_plan_params& p, int64_t rid, int64_t pos) {
  return rid < 0 || rid >= p.token_rows || pos < 0 || pos >= p.token_cols ? -1 : rid * p.token_stride + pos;
}
DSA_HD int64_t token_at(const dsa_c4_plan_params& p, int64_t at) { return at < 0 ? -1 : p.req_to_token[at]; }
DSA_HD int64_t slot_of(const dsa_c4_plan_params& p, int64_t token) {
  return token < 0 || token >= p.num_full ? -1 : p.full_to_state[token];
}
// A ring row as a record holds it: -1 unless it fits 31 bits.
DSA_HD int64_t record_row(int64_t row) { return row >= 0 && row <= 0x7FFFFFFF ? row : -1; }
DSA_HD int64_t slot_ring_row(const dsa_c4_plan_params& p, int64_t slot) {
  if (slot < 0) return -1;
  if (slot <= 0x7FFFFFFF)  // the usual case, in 32-bit division (the same quotient; a 64-bit one is far slower on a GPU)
    return record_row(wrap_add(wrap_mul(quot_u32((uint32_t)slot, (uint32_t)p.swa_page_size), p.ring_size),
                               rem_u32((uint32_t)slot, (uint32_t)p.ring_size)));
  const int64_t page = slot / p.swa_page_size;  // past 2^31 its row is too (and its product could wrap)
  return page > 0x7FFFFFFF ? -1 : record_row(page * p.ring_size + slot % p.ring_size);
}
DSA_HD int64_t scoped_ring_row(const dsa_c4_plan_params& p, int64_t rid, int64_t pos) {
  if (rid < 0 || rid > 0x7FFFFFFF) return -1;  // past 2^31 its rows are too (and the product could wrap)
  const int64_t within = pos >= 0 && pos <= 0x7FFFFFFF ? (int64_t)rem_u32((uint32_t)pos, (uint32_t)p.ring_size)
                                                       : floor_mod(pos, p.ring_size);
  return record_row(rid * p.ring_size + within);
}

// The ring rows of positions a and b of request row rid (-1 for one not wanted: its tables are not read): each
// table's two reads issued together (a decode record's chain is then three dependent reads: its length and
// request row, the tokens, the slots).
struct RingRows {
  int64_t a, b;
};
DSA_HD RingRows plan_ring_rows(const dsa_c4_plan_params& p, int64_t rid, int64_t a, int64_t b, bool want_a = true,
                               bool want_b = true) {
  if (p.use_req_ring)
    return RingRows{want_a ? scoped_ring_row(p, rid, a) : -1, want_b ? scoped_ring_row(p, rid, b) : -1};
  const int64_t token_a = token_at(p, want_a ? token_index(p, rid, a) : -1);
  const int64_t token_b = token_at(p, want_b ? token_index(p, rid, b) : -1);
  const int64_t slot_a = slot_of(p, token_a), slot_b = slot_of(p, token_b);
  return RingRows{slot_ring_row(p, slot_a), slot_ring_row(p, slot_b)};
}

// The decode record of request b: the new token's row and group, the previous quartet's group. A length
// past a record's 31 bits is a record the ops skip and count (seq_len 2^31 - 1 closes nothing, its rows
// -1), never one wrapped into a padding record that nothing counts or into a real length. The length and
// the request row are read together, and the tables read before that test (their reads are bounds-checked):
// a branch on the length between them would make them two trips.
DSA_HD dsa_c4_decode_record plan_decode_record(const dsa_c4_plan_params& p, int64_t b) {
  const int64_t seq = plan_length(p.seq_lens, p.seq_lens_int32, b), rid = p.req_pool_indices[b];
  const int64_t last = wrap_sub(seq, 1);
  const int64_t p1 = last > 0 ? last : 0, p0 = p1 > 4 ? p1 - 4 : 0;
  const RingRows rows = plan_ring_rows(p, rid, p1, p0);
  if (seq > 0x7FFFFFFF) return dsa_c4_decode_record{0x7FFFFFFFu, -1, -1, -1};
  return dsa_c4_decode_record{(uint32_t)low32(seq > 0 ? seq : 0), low32(rows.a), low32(floor_div(rows.b, 4)),
                              low32(floor_div(rows.a, 4))};
}

// Ragged rows a request's extend covers: its extend length, a negative one counted as 0, clipped to the rows.
DSA_HD int64_t plan_extent(const dsa_c4_plan_params& p, int64_t b) {
  const int64_t e = plan_length(p.extend_lens, p.extend_lens_int32, b);
  return e < 0 ? 0 : e < p.num_tokens ? e : p.num_tokens;
}

constexpr int kPlanWindow = 8;  // an entry's window: positions 4n - 4 .. 4n + 3
DSA_HD dsa_c4_compress_record padding_compress() { return dsa_c4_compress_record{0xFFFFFFFFu, 0, 0, -1, -1}; }
DSA_HD dsa_c4_write_record padding_write() { return dsa_c4_write_record{0xFFFFFFFFu, -1}; }

// What a request's extend needs of its lengths: the position of its first new token (seq - extend, wrapping),
// the first position its ring keeps (the last complete quartet and the open one, or the last R - 6 with a ring
// of R > 8 rows: speculative drafts) and its request row.
struct PlanRequest {
  int64_t pos0, first_kept, rid;
};

DSA_HD PlanRequest plan_request(const dsa_c4_plan_params& p, int64_t b) {
  const int64_t seq = plan_length(p.seq_lens, p.seq_lens_int32, b);
  const int64_t pad = p.ring_size > kPlanWindow ? p.ring_size - kPlanWindow + 2 : 0;
  const int64_t by_quartet = wrap_sub(wrap_mul(floor_div(seq, 4), 4), 4), by_pad = wrap_sub(seq, pad);
  return PlanRequest{wrap_sub(seq, plan_length(p.extend_lens, p.extend_lens_int32, b)),
                     by_quartet < by_pad ? by_quartet : by_pad, p.req_pool_indices[b]};
}

// Floor division and modulo by a page of m >= 1 positions, in 32 bits where x fits them (the same values).
DSA_HD int64_t page_div(int64_t x, int64_t m) {
  return x >= 0 && x <= 0x7FFFFFFF ? (int64_t)quot_u32((uint32_t)x, (uint32_t)m) : floor_div(x, m);
}
DSA_HD int64_t page_mod(int64_t x, int64_t m) {
  return x >= 0 && x <= 0x7FFFFFFF ? (int64_t)rem_u32((uint32_t)x, (uint32_t)m) : floor_mod(x, m);
}

// Whether position pos closes an entry, and whether the ring keeps it (page-scoped rings also keep the last 4
// positions of every page).
DSA_HD bool plan_closes(int64_t pos) { return ((uint64_t)pos & 3u) == 3u; }
DSA_HD bool plan_kept(const dsa_c4_plan_params& p, const PlanRequest& r, int64_t pos) {
  return pos >= r.first_kept || (!p.use_req_ring && page_mod(pos, p.swa_page_size) >= p.swa_page_size - 4);
}

// How many of a request's first m new tokens (0 <= m <= 2^17) close an entry, and how many the ring keeps: the
// counts of the predicates above over positions pos0 .. pos0 + m - 1 (wrapping), in closed form, so that a
// block can number its records without walking the rows before it. The positions are one increasing run, or
// two where they wrap past 2^63 - 1.
DSA_HD int64_t plan_closes_before(const PlanRequest& r, int64_t m) {
  const int64_t first = (int64_t)((3u - (uint64_t)r.pos0) & 3u);  // the first token that closes
  return m > first ? (m - 1 - first) / 4 + 1 : 0;
}

// Kept positions in [a, b] (a <= b, b - a < 2^17, no wrap).
DSA_HD int64_t plan_kept_run(const dsa_c4_plan_params& p, const PlanRequest& r, int64_t a, int64_t b) {
  const int64_t f = r.first_kept;
  const int64_t above = f <= a ? b - a + 1 : f > b ? 0 : (int64_t)((uint64_t)b - (uint64_t)f) + 1;
  if (p.use_req_ring || f <= a) return above;
  // below first_kept, the last min(4, P) positions of each page of P
  const int64_t page = p.swa_page_size, tail = page < 4 ? page : 4, from = page - tail;
  const int64_t e = f > b ? b : f - 1;
  const int64_t ma = page_mod(a, page), me = page_mod(e, page);
  const int64_t upto_e = me >= from ? me - from + 1 : 0, upto_a = ma >= from ? ma - from + 1 : 0;
  return above + (page_div(e, page) - page_div(a, page)) * tail + upto_e - upto_a + (ma >= from ? 1 : 0);
}

DSA_HD int64_t plan_kept_before(const dsa_c4_plan_params& p, const PlanRequest& r, int64_t m) {
  if (m <= 0) return 0;
  const int64_t last = wrap_add(r.pos0, m - 1);
  if (last >= r.pos0) return plan_kept_run(p, r, r.pos0, last);
  return plan_kept_run(p, r, r.pos0, INT64_MAX) + plan_kept_run(p, r, INT64_MIN, last);
}

// What ragged row t, token j (>= 0) of request b's extend, contributes: a compress record when it closes an
// entry, a write record when it is kept in the ring.
struct PlanToken {
  bool closes, kept;
  dsa_c4_compress_record compress;
  dsa_c4_write_record write;
};

DSA_HD PlanToken plan_token(const dsa_c4_plan_params& p, const PlanRequest& r, int64_t t, int64_t b, int64_t j) {
  const int64_t pos = wrap_add(r.pos0, j);
  PlanToken k;
  k.closes = plan_closes(pos);
  k.kept = plan_kept(p, r, pos);
  const int ring_rows = j + 1 < kPlanWindow ? kPlanWindow - (int)(j + 1) : 0;
  const bool from_ring = k.closes && ring_rows > 0;
  const int64_t before = wrap_sub(pos, 4);
  const RingRows rows = plan_ring_rows(p, r.rid, pos, before > 0 ? before : 0, k.kept || from_ring, from_ring);
  const int64_t row = rows.a, previous = rows.b;
  k.compress = dsa_c4_compress_record{(uint32_t)low32(wrap_add(pos, 1)), (uint16_t)t, (uint16_t)ring_rows,
                                      ring_rows > 0 ? low32(floor_div(previous, 4)) : -1,
                                      ring_rows > 0 ? low32(floor_div(row, 4)) : (int32_t)b};
  k.write = dsa_c4_write_record{(uint32_t)t, low32(row)};
  return k;
}

}  // namespace dsa
