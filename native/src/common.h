// Internal helpers shared by the op families: error reporting, argument checks, device guard,
// launching with optional PDL. Nothing here is exported.
#pragma once

#include <cstdarg>
#include <cstdint>

#include "dsa_kernels.h"

namespace dsa {

// Records a sentence for dsa_last_error() on this thread and returns `status`.
dsa_status fail(dsa_status status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// Clears the thread's last error; returns DSA_STATUS_OK.
dsa_status ok();

// A params struct is accepted when struct_size is exactly the size this library was built with.
template <typename T>
inline dsa_status check_struct(const T* p, const char* op) {
  if (p == nullptr) return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: params is null", op);
  if (p->struct_size != sizeof(T))
    return fail(DSA_STATUS_ABI_MISMATCH,
                "%s: params.struct_size is %u but this library (ABI %d) expects %zu; rebuild the "
                "caller against this dsa_kernels.h",
                op, p->struct_size, DSA_ABI_VERSION, sizeof(T));
  return DSA_STATUS_OK;
}

#define DSA_TRY(expr)                          \
  do {                                         \
    const dsa_status dsa_try_status_ = (expr); \
    if (dsa_try_status_ != DSA_STATUS_OK) return dsa_try_status_; \
  } while (0)

// Whether `ptr` is a multiple of `bytes` (host-side choice of vector widths).
inline bool aligned(const void* ptr, int bytes) { return (uintptr_t)ptr % bytes == 0; }

// The params structs of the C ABI, each declared by the op family that owns it (DSA_DECLARE_STRUCT in its
// source file, once): dsa_struct_size() answers from this list, built as the library loads.
struct DeclaredStruct {
  DeclaredStruct(dsa_struct_id id, size_t size);
  dsa_struct_id id;
  size_t size;
  const DeclaredStruct* next;
};
extern const DeclaredStruct* declared_structs;
#define DSA_DECLARE_STRUCT(id, type) static const ::dsa::DeclaredStruct dsa_declared_##id(id, sizeof(type))

// Devices the library serves (ids 0 .. kMaxDevices - 1); per-device caches are this long.
constexpr int kMaxDevices = 64;

// Checks `device` names a usable CUDA device (for device calls) and returns its multiprocessor
// count through `num_sms` (cached per device).
dsa_status check_device(int32_t device, const char* op, int* num_sms);

}  // namespace dsa
