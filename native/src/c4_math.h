// Arithmetic of the ratio-4 compressor (docs/spec.md, "The ratio-4 compressor"), shared verbatim by the CUDA
// kernels and the host backend: the 8-term window softmax of one channel, the ring's record formats and
// addressing (the indexer's store lives with the other store in store_math.h).
#pragma once

#include "int_math.h"
#include "store_math.h"
#include "window_math.h"

namespace dsa {

constexpr int kC4Window = 8;      // positions an entry covers: the previous quartet (A) and its own (B)
constexpr int kC4Quartet = 4;     // stride: entry n closes at position 4n + 3

// One channel of entry n: kv[j], biased logit z[j] for window row j (rows 0..3: the A halves of the
// previous quartet, 4..7: the B halves of the entry's own); rows below `first` are absent (4 for entry 0).
// The window is one block (window_math.h): one max over the logits, exponentials in base 2, the weighted
// sum and the sum of weights in row order, one division (on the GPU the approximate one).
DSA_HD float c4_channel(const float (&kv)[kC4Window], const float (&z)[kC4Window], int first) {
  return window_value(window_sum(kv, z, first));
}

// ---- records (little-endian; docs/spec.md, "The ring") ----------------------------------------

// Decode: one per request. seq_len counts the new token; groups are 4-row units of the ring.
struct C4DecodeRecord {
  uint32_t seq_len;
  int32_t write_row;       // ring row of the new token
  int32_t previous_group;  // ring group of the quartet before the new token's
  int32_t current_group;   // ring group of the new token's quartet
};

// Extend, one per entry closed: seq_len = closing position + 1; window rows 0 .. ring_rows - 1 come
// from the ring, the rest from the call's input rows ragged_id - 7 + i.
struct C4CompressRecord {
  uint32_t seq_len;
  uint16_t ragged_id;
  uint16_t ring_rows;
  int32_t previous_group;
  int32_t current_group;
};

// Extend, one per input row kept in the ring.
struct C4WriteRecord {
  uint32_t ragged_id;
  int32_t ring_row;
};

constexpr uint32_t kC4Padding = 0xFFFFFFFFu;

// The ring row of position p of a request-scoped ring (slot's R rows), in 64 bits: a slot past the ring
// gives a row past the ring, which the ops skip and count (never narrowed into another slot's rows). A
// position of 31 bits takes the 32-bit remainder (a shift and a mask for a power-of-two R), the same value.
DSA_HD int64_t request_ring_row(int32_t slot, int32_t ring_size, int64_t p) {
  const int64_t within = p >= 0 && p <= 0x7FFFFFFF ? (int64_t)rem_u32((uint32_t)p, (uint32_t)ring_size) : p % ring_size;
  return (int64_t)slot * ring_size + within;
}

// A ring row as the records hold it (int32), or -1 where it cannot be one: the checks then skip and count.
DSA_HD int32_t ring_index(int64_t row) { return row >= 0 && row <= 0x7FFFFFFF ? (int32_t)row : -1; }
DSA_HD int32_t ring_group(int64_t row) { return row >= 0 && row <= 0x7FFFFFFF ? (int32_t)(row / 4) : -1; }

// A decode record for a request-scoped ring (seq_len >= 1).
DSA_HD C4DecodeRecord c4_decode_record(int32_t seq_len, int32_t slot, int32_t ring_size) {
  const int64_t p = seq_len - 1, q = p >= kC4Quartet ? p - kC4Quartet : 0;
  const int64_t row = request_ring_row(slot, ring_size, p);
  return C4DecodeRecord{(uint32_t)seq_len, ring_index(row), ring_group(request_ring_row(slot, ring_size, q)),
                        ring_group(row)};
}

// The compress record of draft j of a verify (committed length seq, slot's ring), or a padding record
// when draft j closes no entry.
DSA_HD C4CompressRecord c4_draft_record(int32_t seq, int32_t j, int32_t slot, int32_t ring_size, int32_t num_drafts,
                                        int64_t b) {
  const int64_t p = (int64_t)seq + j;
  if ((p + 1) % kC4Quartet != 0) return C4CompressRecord{kC4Padding, 0, 0, -1, -1};
  const int64_t q = p >= kC4Quartet ? p - kC4Quartet : 0;
  const int ring_rows = kC4Window - (j + 1 < kC4Window ? j + 1 : kC4Window);
  return C4CompressRecord{(uint32_t)(p + 1), (uint16_t)(b * num_drafts + j), (uint16_t)ring_rows,
                          ring_group(request_ring_row(slot, ring_size, q)),
                          ring_group(request_ring_row(slot, ring_size, p))};
}

// Whether ring group g (rows 4g .. 4g+3) lies inside a ring of ring_rows rows.
DSA_HD bool group_ok(int32_t g, int64_t ring_rows) { return g >= 0 && (int64_t)g * 4 < ring_rows; }

// Whether a compress record fits the call: a closing position, its input rows inside the input, its
// ring groups inside the ring where read. Records are data: one that does not fit is skipped and counted.
DSA_HD bool compress_fits(uint32_t seq_len, int64_t ragged, int ring_rows, int32_t previous, int32_t current,
                          int64_t num_tokens, int64_t ring_size_rows) {
  if (seq_len < (uint32_t)kC4Quartet || seq_len % kC4Quartet != 0 || seq_len > 0x7FFFFFFFu || ring_rows > kC4Window)
    return false;
  const int first = seq_len > (uint32_t)kC4Quartet ? 0 : 4;
  const int from_input = ring_rows > first ? ring_rows : first;
  if (ragged >= num_tokens || (from_input < kC4Window && ragged - (kC4Window - 1) + from_input < 0)) return false;
  if (first == 0 && ring_rows > 0 && !group_ok(previous, ring_size_rows)) return false;
  return ring_rows <= 4 || group_ok(current, ring_size_rows);
}

// The largest V a verify over a ring of R rows serves without overwriting a row the next step reads:
// the next extend starts at L >= seq (>= seq + 1 when the first draft is always accepted) and reads
// positions from 4 floor(L / 4) - 4 >= L - 7; the verify's last write, position seq + V - 1, lands on
// the row of position seq + V - 1 - R, which must lie below L - 7.
DSA_HD int32_t c4_max_drafts(int32_t ring_size, bool zero_acceptance) {
  const int32_t v = ring_size - (zero_acceptance ? 7 : 6);
  return v < 0 ? 0 : v;
}

}  // namespace dsa
