// The host backend of the c128 ops (device == DSA_DEVICE_HOST): the same results as the kernels, on the
// calling thread, for arguments the entry points have checked.
#pragma once

#include <cstdint>

#include "dsa_kernels.h"

namespace dsa {

void host_decode(const dsa_c128_decode_params& p);
void host_prefill(const dsa_c128_prefill_params& p);
void host_verify(const dsa_c128_verify_params& p);
void host_commit(const dsa_c128_commit_params& p);

}  // namespace dsa
