// The 16-byte request and segment records (dsa_request_records, docs/spec.md, records): a decode's request
// records and a prefill's segment records, with their slots resolved from req_pool_indices, in one launch;
// GPU and host backend.
#include <algorithm>
#include <cstdint>

#include "cuda_launch.cuh"
#include "inline_records.cuh"
#include "launch_policy.h"

DSA_DECLARE_STRUCT(DSA_STRUCT_RECORDS_PARAMS, dsa_request_records_params);

namespace dsa {
namespace {

// One 16-byte record as four little-endian words; both backends build them here.
struct Record {
  uint32_t w[4];
};

DSA_HD Record decode_record(int64_t seq_len, int64_t rid, int64_t offset) {
  const uint32_t slot = (uint32_t)(rid + offset);
  return Record{{(uint32_t)seq_len, slot, slot, 0xFFFFFFFFu}};
}

DSA_HD Record prefill_record(const dsa_segment& s, int64_t rid, int64_t offset) {
  return Record{{s.position + 1, s.ragged_id | (s.window_len << 16), (uint32_t)(rid + offset), (uint32_t)rid}};
}

DSA_HD Record padding_record() { return Record{{0xFFFFFFFFu, 0u, 0xFFFFFFFFu, 0xFFFFFFFFu}}; }

DSA_HD void put(uint8_t* rows, int64_t row, const Record& r) {
  uint32_t* at = reinterpret_cast<uint32_t*>(rows + row * 16);
  at[0] = r.w[0], at[1] = r.w[1], at[2] = r.w[2], at[3] = r.w[3];
}

// The per-request part (slots, and a decode's records) and a prefill's padding rows: item i of
// max(B, padding rows).
DSA_HD void request_item(const dsa_request_records_params& p, int64_t i) {
  if (i < p.batch_size) {
    const int64_t rid = p.req_pool_indices[i];
    if (p.slots != nullptr) p.slots[i] = (int32_t)(rid + p.state_slot_offset);
    if (p.load_slots != nullptr) p.load_slots[i] = (int32_t)rid;
    if (p.kind == DSA_RECORDS_DECODE) {
      int64_t seq = p.seq_lens[i];
      if (seq < 0 || seq > INT32_MAX) {  // the 32-bit record would wrap it: padding, counted
        seq = 0;
        if (p.error_count != nullptr) {
#if defined(__CUDA_ARCH__)
          atomicAdd(p.error_count, 1u);
#else
          ++*p.error_count;
#endif
        }
      }
      put(p.plan_d, i, decode_record(seq, rid, p.state_slot_offset));
      if (p.seq_lens_out != nullptr) p.seq_lens_out[i] = (int32_t)seq;
    }
  }
  if (p.kind == DSA_RECORDS_PREFILL) {
    const int64_t pad_c = p.compress_rows - p.num_compress;
    if (i < pad_c) put(p.plan_c, p.num_compress + i, padding_record());
    if (i < p.write_rows - p.num_write) put(p.plan_w, p.num_write + i, padding_record());
  }
}

DSA_HD int64_t request_items(const dsa_request_records_params& p) {
  if (p.kind == DSA_RECORDS_DECODE) return p.batch_size;
  const int64_t pad_c = p.compress_rows - p.num_compress, pad_w = p.write_rows - p.num_write;
  const int64_t pad = pad_c > pad_w ? pad_c : pad_w;
  return p.batch_size > pad ? p.batch_size : pad;
}

// A prefill's records travel inside the launch (SegmentBlock, DSA_UPLOAD_RECORDS at most per launch):
// record j of the launch is plan record first + j, compress records first, then write records.

struct PlanLaunch {
  dsa_request_records_params p;  // pointers on the device; `compress` / `write` unused here
  int64_t first;             // plan index of the launch's first record
  int32_t count;             // records in this launch
  int32_t requests;          // 1: this launch also writes the per-request part
};

// One item per thread, kRecordsThreads to a block; a grid of fewer blocks than the items need strides over them (the
// shape: launch_policy.h).
template <int kRecords>
__global__ void __launch_bounds__(kRecordsThreads)
    records_kernel(const __grid_constant__ PlanLaunch a, const __grid_constant__ SegmentBlock<kRecords> records) {
  wait_for_producers();
  allow_dependents();
  const dsa_request_records_params& p = a.p;
  const int64_t requests = a.requests ? request_items(p) : 0;
  const int64_t items = a.count > requests ? a.count : requests;
  for (int64_t i = (int64_t)blockIdx.x * kRecordsThreads + threadIdx.x; i < items;
       i += (int64_t)gridDim.x * kRecordsThreads) {
    if (i < a.count) {
      const int64_t j = a.first + i;
      const dsa_segment& s = records.r[i];
      const Record r = prefill_record(s, p.req_pool_indices[s.batch_id], p.state_slot_offset);
      j < p.num_compress ? put(p.plan_c, j, r) : put(p.plan_w, j - p.num_compress, r);
    }
    if (a.requests) request_item(p, i);
  }
}

cudaError_t launch_plan(const PlanLaunch& a, cudaStream_t stream, bool pdl) {
  const int64_t items = std::max<int64_t>(a.count, a.requests ? request_items(a.p) : 0);
  const unsigned grid = (unsigned)records_blocks(items);
  return with_records<DSA_UPLOAD_RECORDS>(
      a.count,
      [&](int64_t i) {
        const int64_t j = a.first + i;
        return plan_record(a.p.compress, a.p.write, a.p.num_compress, j);
      },
      [&](const auto& records) {
        constexpr int k = std::decay_t<decltype(records)>::kSize;
        return launch(records_kernel<k>, grid, kRecordsThreads, stream, pdl ? kLaunchPdl : 0u, a, records);
      });
}

dsa_status check_records(const dsa_request_records_params& p, const char* op) {
  for (const bool compress : {true, false}) {
    const dsa_segment* list = compress ? p.compress : p.write;
    const int64_t n = compress ? p.num_compress : p.num_write;
    for (int64_t i = 0; i < n; ++i) {
      const dsa_segment& s = list[i];
      if ((int64_t)s.batch_id >= p.batch_size || s.ragged_id > 0xFFFFu || s.window_len < 1 || s.window_len > DSA_CHUNK)
        return fail(DSA_STATUS_INVALID_ARGUMENT,
                    "%s: %s record %lld {ragged_id %u, batch_id %u, position %u, window_len %u}: the records need "
                    "batch_id < batch_size (%lld), a ragged row below 65536 and window_len 1..128",
                    op, compress ? "compress" : "write", (long long)i, s.ragged_id, s.batch_id, s.position,
                    s.window_len, (long long)p.batch_size);
    }
  }
  return DSA_STATUS_OK;
}

dsa_status check_plan(const dsa_request_records_params& p, const char* op) {
  if (p.kind != DSA_RECORDS_DECODE && p.kind != DSA_RECORDS_PREFILL)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: kind is %d; expected %d (decode) or %d (prefill)", op, p.kind,
                DSA_RECORDS_DECODE, DSA_RECORDS_PREFILL);
  if (p.batch_size < 0 || p.state_slot_offset < 0 || p.state_slot_offset > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: batch_size and state_slot_offset must be >= 0 (offset <= %d; got "
                "%lld, %lld)", op, INT32_MAX, (long long)p.batch_size, (long long)p.state_slot_offset);
  if (p.batch_size > 0 && (p.req_pool_indices == nullptr || (p.slots == nullptr && p.kind == DSA_RECORDS_PREFILL)))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: req_pool_indices (and a prefill plan's slots) must be non-null", op);
  const void* rows[] = {p.slots, p.load_slots, p.plan_d, p.seq_lens_out, p.plan_c, p.plan_w};
  for (const void* r : rows)
    if (!aligned(r, 4)) return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: every output must be 4-byte aligned", op);
  if (p.kind == DSA_RECORDS_DECODE) {
    if (p.batch_size > 0 && (p.seq_lens == nullptr || p.plan_d == nullptr))
      return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: a decode plan needs seq_lens and plan_d", op);
    return DSA_STATUS_OK;
  }
  if (p.num_compress < 0 || p.num_write < 0 || p.compress_rows < p.num_compress || p.write_rows < p.num_write)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: need 0 <= num_compress <= compress_rows and 0 <= num_write <= "
                "write_rows (got %lld, %lld, %lld, %lld)", op, (long long)p.num_compress, (long long)p.compress_rows,
                (long long)p.num_write, (long long)p.write_rows);
  if ((p.num_compress > 0 && p.compress == nullptr) || (p.num_write > 0 && p.write == nullptr) ||
      (p.compress_rows > 0 && p.plan_c == nullptr) || (p.write_rows > 0 && p.plan_w == nullptr))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: a record list or plan tensor with rows is null", op);
  return check_records(p, op);
}

struct RecordsChecked {
  bool nothing = false;
};

// The host backend: every record, then every request's part, on the caller's thread.
void host_records(const dsa_request_records_params& p) {
  const int64_t records = p.kind == DSA_RECORDS_PREFILL ? p.num_compress + p.num_write : 0;
  for (int64_t j = 0; j < records; ++j) {
    const dsa_segment& s = plan_record(p.compress, p.write, p.num_compress, j);
    const Record r = prefill_record(s, p.req_pool_indices[s.batch_id], p.state_slot_offset);
    j < p.num_compress ? put(p.plan_c, j, r) : put(p.plan_w, j - p.num_compress, r);
  }
  for (int64_t i = 0, n = request_items(p); i < n; ++i) request_item(p, i);
}

dsa_status records_device(const dsa_request_records_params& p, const RecordsChecked&, int, cudaStream_t s,
                          const char* op) {
  const int64_t records = p.kind == DSA_RECORDS_PREFILL ? p.num_compress + p.num_write : 0;
  PlanLaunch a = {p, 0, 0, 1};
  do {  // at least one launch: the per-request part
    a.count = (int32_t)std::min<int64_t>(DSA_UPLOAD_RECORDS, records - a.first);
    const bool pdl = (p.flags & DSA_FLAG_PDL) || a.first > 0;
    DSA_TRY(launch_status(launch_plan(a, s, pdl), op));
    a.requests = 0;
    a.first += a.count;
  } while (a.first < records);
  return DSA_STATUS_OK;
}

}  // namespace
}  // namespace dsa

extern "C" dsa_status dsa_request_records(const dsa_request_records_params* params, void* stream) {
  using namespace dsa;
  return dispatch<RecordsChecked>(
      params, stream, "dsa_request_records",
      [](const dsa_request_records_params& p, const char* op, RecordsChecked*) { return check_plan(p, op); },
      host_records, records_device);
}
