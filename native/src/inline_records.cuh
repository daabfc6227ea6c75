// Plan records carried inside a launch's parameters (a host plan's segment records, the upload's, the request
// records' prefill rows): blocks of records by value, and the host's choice of the smallest block that holds them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dsa_kernels.h"
#include "host_device.h"

namespace dsa {

constexpr int kSmallInline = 16;  // records carried by the launch of a small host plan (prefill, upload)

// Plan records inside a launch's parameters: a host plan travels this way (no copy, no staging
// memory, nothing on the host outlives the call). Blocks of 16, 256 or 1024 records: on the H200 a
// launch costs the same up to 4.6 KB of parameters and 0.7-1.0 us more at 16 KB (docs/performance.md,
// "c128 prefill"). kRecords 0: none (a kernel that reads its records from device memory).
template <int kRecords>
struct SegmentBlock {
  static constexpr int kSize = kRecords > 0 ? kRecords : 1;
  dsa_segment r[kSize];
};

// Record j of a plan's two lists read as one: its compress records first, then its write records.
template <typename T>
DSA_HD T& plan_record(T* compress, T* write, int64_t num_compress, int64_t j) {
  return j < num_compress ? compress[j] : write[j - num_compress];
}

// The smallest block of kSmallInline, DSA_INLINE_RECORDS or kLargest records that holds `count`,
// filled with record(i) for i < count; returns launch(block).
template <int kLargest, typename Record, typename Launch>
cudaError_t with_records(int64_t count, Record&& record, Launch&& launch) {
  auto fill = [&](auto& block) {
    for (int64_t i = 0; i < count; ++i) block.r[i] = record(i);
    return launch(block);
  };
  if (count <= kSmallInline) {
    SegmentBlock<kSmallInline> block;
    return fill(block);
  }
  if constexpr (kLargest > DSA_INLINE_RECORDS) {
    if (count > DSA_INLINE_RECORDS) {
      SegmentBlock<kLargest> block;
      return fill(block);
    }
  }
  SegmentBlock<DSA_INLINE_RECORDS> block;
  return fill(block);
}

}  // namespace dsa
