// The host backend of the offline c128 ops (device == DSA_DEVICE_HOST): the kernels' arithmetic
// (c128_offline_math.h) on the calling thread, for arguments the entry points have checked.
#pragma once

#include "dsa_kernels.h"

namespace dsa {

void host_c128_offline_decode(const dsa_c128_offline_params& p);
void host_c128_offline_extend(const dsa_c128_offline_params& p);

}  // namespace dsa
