// Launch plumbing for the .cu op families: current-device guard and launches with optional
// programmatic dependent launch.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>
#include <utility>

#include "common.h"

namespace dsa {

// Makes `device` current for the lifetime of the guard; restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = previous_;
    cudaGetDevice(&now);
    if (now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Launch modes, or-ed: programmatic dependent launch (the kernel may start before the previous
// one in the stream ends; it waits in wait_for_producers) and cooperative launch (every block
// resident at once, so blocks may wait on each other; the grid must fit the device).
constexpr unsigned kLaunchPdl = 1u, kLaunchCooperative = 2u;

// (launch_shared: with `shared` bytes of dynamic shared memory a block)
template <typename... Params, typename... Args>
cudaError_t launch_shared(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                          unsigned mode, Args&&... args) {
  cudaLaunchAttribute attributes[2];
  unsigned n = 0;
  if (mode & kLaunchPdl) {
    attributes[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (mode & kLaunchCooperative) {
    attributes[n].id = cudaLaunchAttributeCooperative;
    attributes[n++].val.cooperative = 1;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = n;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, unsigned mode,
                   Args&&... args) {
  return launch_shared(kernel, grid, block, 0, stream, mode, std::forward<Args>(args)...);
}

// Every entry point is its argument check, then host or device:
//   check(p, op, &checked)              judges every field (DSA_STATUS_OK, or the error naming the field) and
//                                       fills what both backends need; checked.nothing: an empty call, done;
//   host(p) or host(p, checked)         the host backend, for host memory, on the caller's thread;
//   device(p, checked, sms, stream, op) the device's own checks and the launches (shapes from
//                                       launch_policy.h), with p.device made current.
// Each op's Checked holds `bool nothing = false` and whatever its check hands on (store launches, ...),
// initialized by its own member initializers (a large one, the metadata copy's jobs, is left to its check).
template <typename Checked, typename Params, typename Check, typename Host, typename Device>
dsa_status dispatch(const Params* params, void* stream, const char* op, Check&& check, Host&& host, Device&& device) {
  DSA_TRY(check_struct(params, op));
  const Params& p = *params;
  Checked checked;
  DSA_TRY(check(p, op, &checked));
  if (checked.nothing) return ok();
  if (p.device == DSA_DEVICE_HOST) {
    if constexpr (std::is_invocable_v<Host&, const Params&, const Checked&>)
      host(p, checked);
    else
      host(p);
    return ok();
  }
  int sms = 0;
  DSA_TRY(check_device(p.device, op, &sms));
  DeviceGuard guard(p.device);
  DSA_TRY(device(p, checked, sms, (cudaStream_t)stream, op));
  return ok();  // a successful call clears the thread's last error, on either backend
}

inline dsa_status launch_status(cudaError_t err, const char* op) {
  if (err == cudaSuccess) return DSA_STATUS_OK;
  return fail(DSA_STATUS_CUDA_ERROR, "%s: kernel launch failed: %s", op, cudaGetErrorString(err));
}

// Every kernel calls this before its first global read: with PDL, data written by the previous
// kernel in the stream is visible only after it. Without PDL it returns at once.
__device__ __forceinline__ void wait_for_producers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel in the stream start its launch; its own wait still sees our writes.
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

}  // namespace dsa
