// Arithmetic of the offline c128 compressor (docs/spec.md, "The offline c128 compressor"), shared verbatim by
// the CUDA kernels and the host backend: the 128-row window softmax of one channel, the ring's addressing by
// pages of 128 rows, and which records fit a call. The records are the c4 formats (c4_math.h), a group being
// a page of 128 rows.
#pragma once

#include "c4_math.h"

namespace dsa {

constexpr int kOfflineWindow = DSA_CHUNK;  // rows of a chunk's window, and of a ring page
constexpr int kOfflineBlockRows = 8;       // rows summed to one block's largest logit (window_math.h)
constexpr int kOfflineBlocks = kOfflineWindow / kOfflineBlockRows;

// The softmax order of one channel of a chunk (window rows j = 0..127: kv[j], biased logit z[j] = score + ape[j]):
// 16 blocks of 8 consecutive rows, each summed to its own largest logit (window_sum), merged in block order
// (merge_windows), one division. On the GPU a lane group (slice form) or a thread (row form) sums each block; the
// host runs the same steps.
DSA_HD float offline_channel(const float (&kv)[kOfflineBlocks][kOfflineBlockRows],
                             const float (&z)[kOfflineBlocks][kOfflineBlockRows]) {
  WindowSum blocks[kOfflineBlocks];
  for (int b = 0; b < kOfflineBlocks; ++b) blocks[b] = window_sum(kv[b], z[b], 0);
  return window_value(merge_windows(blocks));
}

// The page (128 rows) holding ring row `row` as the records hold it, or -1 where it cannot be one.
DSA_HD int32_t ring_page(int64_t row) {
  return row >= 0 && row <= 0x7FFFFFFF ? (int32_t)(row / kOfflineWindow) : -1;
}

// Whether page `page` lies inside a ring of ring_rows rows.
DSA_HD bool page_ok(int32_t page, int64_t ring_rows) {
  return page >= 0 && ((int64_t)page + 1) * kOfflineWindow <= ring_rows;
}

// Whether a token of length seq_len (with it) closes a chunk.
DSA_HD bool closes_chunk(uint32_t seq_len) {
  return seq_len != 0u && seq_len <= 0x7FFFFFFFu && seq_len % kOfflineWindow == 0u;
}

// The decode record of a request-scoped ring (slot's R rows, R a multiple of 128; seq_len >= 1): the new token's
// row and the page of its chunk, each -1 where the slot's rows pass 2^31 - 1 (then skipped and counted).
DSA_HD C4DecodeRecord offline_decode_record(int32_t seq_len, int32_t slot, int32_t ring_size) {
  const int64_t p = seq_len - 1;
  return C4DecodeRecord{(uint32_t)seq_len, ring_index(request_ring_row(slot, ring_size, p)), -1,
                        ring_page(request_ring_row(slot, ring_size, p - p % kOfflineWindow))};
}

// Whether a compress record fits the call: a closing position, its input rows inside the input (the closing
// row always: its cache slot is read), its page inside the ring where rows are read from it. Records are data:
// one that does not fit is skipped and counted.
DSA_HD bool offline_compress_fits(uint32_t seq_len, int64_t ragged, int ring_rows, int32_t page, int64_t num_tokens,
                                  int64_t ring_size_rows) {
  if (!closes_chunk(seq_len) || ring_rows > kOfflineWindow) return false;
  if (ragged >= num_tokens || ragged - (kOfflineWindow - 1) + ring_rows < 0) return false;
  return ring_rows == 0 || page_ok(page, ring_size_rows);
}

}  // namespace dsa
