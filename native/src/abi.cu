// Library-wide entry points: versions, status strings, last error, struct sizes, devices.
#include <cuda_runtime.h>

#include <cstdio>
#include <mutex>

#include "common.h"
#include "cuda_launch.cuh"
#include "launch_policy.h"

#ifndef DSA_VERSION_STRING
#define DSA_VERSION_STRING "0.0.0"
#endif
#ifndef DSA_CUDA_ARCHITECTURES
#define DSA_CUDA_ARCHITECTURES ""
#endif

namespace dsa {

namespace {
thread_local char last_error[512] = "";
int sm_count_cache[kMaxDevices] = {};
std::once_flag device_count_once;
int device_count_value = 0;
}  // namespace

// Zero before any constructor runs (constant initialization), so declarations in any order build it.
const DeclaredStruct* declared_structs = nullptr;

DeclaredStruct::DeclaredStruct(dsa_struct_id id_, size_t size_) : id(id_), size(size_), next(declared_structs) {
  declared_structs = this;
}

dsa_status fail(dsa_status status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(last_error, sizeof(last_error), fmt, args);
  va_end(args);
  return status;
}

dsa_status ok() {
  last_error[0] = '\0';
  return DSA_STATUS_OK;
}

static int device_count() {
  std::call_once(device_count_once, [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    device_count_value = n;
  });
  return device_count_value;
}

dsa_status check_device(int32_t device, const char* op, int* num_sms) {
  const int count = device_count();
  if (count == 0)
    return fail(DSA_STATUS_NO_DEVICE, "%s: device %d requested but no CUDA device is available",
                op, device);
  if (device < 0 || device >= count || device >= kMaxDevices)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: device is %d; expected -1 (host) or 0..%d", op,
                device, count - 1);
  int sms = __atomic_load_n(&sm_count_cache[device], __ATOMIC_RELAXED);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return fail(DSA_STATUS_CUDA_ERROR, "%s: cannot query device %d", op, device);
    }
    __atomic_store_n(&sm_count_cache[device], sms, __ATOMIC_RELAXED);
  }
  *num_sms = sms;
  return DSA_STATUS_OK;
}

__global__ void empty_kernel() {}

}  // namespace dsa

extern "C" {

dsa_status dsa_empty_launch(int32_t device, void* stream) {
  int sms = 0;
  DSA_TRY(dsa::check_device(device, "dsa_empty_launch", &sms));
  dsa::DeviceGuard guard(device);
  DSA_TRY(dsa::launch_status(dsa::launch(dsa::empty_kernel, 1, dsa::kProbeThreads, (cudaStream_t)stream, 0u), "dsa_empty_launch"));
  return dsa::ok();
}


int32_t dsa_abi_version(void) { return DSA_ABI_VERSION; }

const char* dsa_version_string(void) { return DSA_VERSION_STRING; }

const char* dsa_cuda_architectures(void) { return DSA_CUDA_ARCHITECTURES; }

int32_t dsa_device_count(void) { return dsa::device_count(); }

int32_t dsa_cuda_runtime_version(void) { return CUDART_VERSION; }

int32_t dsa_driver_version(void) {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) {
    cudaGetLastError();
    version = 0;
  }
  return version;
}

const char* dsa_last_error(void) { return dsa::last_error; }

const char* dsa_status_string(dsa_status status) {
  switch (status) {
    case DSA_STATUS_OK: return "ok";
    case DSA_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case DSA_STATUS_ABI_MISMATCH: return "ABI mismatch";
    case DSA_STATUS_CAPACITY: return "capacity exceeded";
    case DSA_STATUS_CUDA_ERROR: return "CUDA error";
    case DSA_STATUS_NO_DEVICE: return "no CUDA device";
  }
  return "unknown status";
}

size_t dsa_struct_size(dsa_struct_id id) {
  for (const dsa::DeclaredStruct* s = dsa::declared_structs; s != nullptr; s = s->next)
    if (s->id == id) return s->size;
  return 0;
}

}  // extern "C"
