// The plan upload (dsa_c128_upload_plan): a host plan into a device plan buffer, the records
// carried in kernel launches.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cuda_launch.cuh"
#include "inline_records.cuh"
#include "launch_policy.h"

DSA_DECLARE_STRUCT(DSA_STRUCT_PLAN_UPLOAD_PARAMS, dsa_plan_upload_params);

namespace dsa {
namespace {

// ---- plan upload -----------------------------------------------------------------------------
// A host plan into a device plan buffer, the records carried in the launch parameters
// (SegmentBlock): stream order is the only synchronization.

struct UploadLaunch {
  dsa_segment* compress;  // destination lists
  dsa_segment* write;
  int64_t* counts;        // set by the first launch of a call, null in the others
  int64_t num_compress;   // the plan's compress records (indices >= it go to the write list)
  int64_t num_write;
  int64_t first;          // plan index of the launch's first record (compress records, then write)
  int32_t count;          // records in this launch
};

// One record per thread, kUploadThreads to a block (the shape: launch_policy.h).
template <int kRecords>
__global__ void __launch_bounds__(kUploadThreads)
    upload_plan_kernel(const __grid_constant__ UploadLaunch a, const __grid_constant__ SegmentBlock<kRecords> records) {
  const int i = blockIdx.x * kUploadThreads + threadIdx.x;
  if (i < a.count) {
    const int64_t j = a.first + i;
    plan_record(a.compress, a.write, a.num_compress, j) = records.r[i];
  }
  if (i == 0 && a.counts != nullptr) a.counts[0] = a.num_compress, a.counts[1] = a.num_write;
}

cudaError_t launch_upload(const UploadLaunch& a, const dsa_segment* compress, const dsa_segment* write,
                          cudaStream_t stream) {
  const unsigned grid = (unsigned)upload_blocks(a.count);
  return with_records<DSA_UPLOAD_RECORDS>(
      a.count,
      [&](int64_t i) { return plan_record(compress, write, a.num_compress, a.first + i); },
      [&](const auto& records) {
        constexpr int k = std::decay_t<decltype(records)>::kSize;
        return launch(upload_plan_kernel<k>, grid, kUploadThreads, stream, 0u, a, records);
      });
}

struct UploadChecked {
  bool nothing = false;
};

dsa_status check_upload(const dsa_plan_upload_params& p, const char* op, UploadChecked*) {
  if (p.num_compress < 0 || p.num_write < 0 || p.compress_capacity < 0 || p.write_capacity < 0)
    return fail(DSA_STATUS_INVALID_ARGUMENT,
                "%s: num_compress, num_write, compress_capacity and write_capacity must be >= 0 (got %lld, %lld, "
                "%lld, %lld)", op, (long long)p.num_compress, (long long)p.num_write,
                (long long)p.compress_capacity, (long long)p.write_capacity);
  if (p.num_compress > p.compress_capacity)
    return fail(DSA_STATUS_CAPACITY, "%s: num_compress is %lld but compress_capacity is %lld", op,
                (long long)p.num_compress, (long long)p.compress_capacity);
  if (p.num_write > p.write_capacity)
    return fail(DSA_STATUS_CAPACITY, "%s: num_write is %lld but write_capacity is %lld", op,
                (long long)p.num_write, (long long)p.write_capacity);
  if (p.device_counts == nullptr) return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: device_counts is null", op);
  if (p.num_compress > 0 && (p.compress == nullptr || p.device_compress == nullptr))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_compress is %lld but compress or device_compress is null", op,
                (long long)p.num_compress);
  if (p.num_write > 0 && (p.write == nullptr || p.device_write == nullptr))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_write is %lld but write or device_write is null", op,
                (long long)p.num_write);
  return DSA_STATUS_OK;
}

// The host backend: the records and counts copied into the (host) buffer.
void host_upload(const dsa_plan_upload_params& p) {
  if (p.num_compress > 0) std::memcpy(p.device_compress, p.compress, p.num_compress * sizeof(dsa_segment));
  if (p.num_write > 0) std::memcpy(p.device_write, p.write, p.num_write * sizeof(dsa_segment));
  p.device_counts[0] = p.num_compress, p.device_counts[1] = p.num_write;
}

dsa_status upload_device(const dsa_plan_upload_params& p, const UploadChecked&, int, cudaStream_t s, const char* op) {
  const int64_t total = p.num_compress + p.num_write;
  UploadLaunch a = {p.device_compress, p.device_write, p.device_counts, p.num_compress, p.num_write, 0, 0};
  do {  // at least one launch: the counts are written even for an empty plan
    a.count = (int32_t)std::min<int64_t>(DSA_UPLOAD_RECORDS, total - a.first);
    DSA_TRY(launch_status(launch_upload(a, p.compress, p.write, s), op));
    a.counts = nullptr;
    a.first += a.count;
  } while (a.first < total);
  return DSA_STATUS_OK;
}

}  // namespace
}  // namespace dsa

extern "C" dsa_status dsa_c128_upload_plan(const dsa_plan_upload_params* params, void* stream) {
  using namespace dsa;
  return dispatch<UploadChecked>(params, stream, "dsa_c128_upload_plan", check_upload,
                                 host_upload,
                                 upload_device);
}
