// The host backend of the c4 ops (device == DSA_DEVICE_HOST): the kernels' arithmetic (c4_math.h) on the
// calling thread, for arguments the entry points have checked.
#pragma once

#include "dsa_kernels.h"

namespace dsa {

void host_c4_decode(const dsa_c4_params& p);
void host_c4_extend(const dsa_c4_params& p);
void host_c4_verify(const dsa_c4_params& p);

}  // namespace dsa
