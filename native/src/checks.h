// Argument checks that more than one op family makes (host code), with one set of messages.
#pragma once

#include <cstdint>

#include "common.h"

namespace dsa {

// The checks of an extend's record lists that both raw-ring families make (c4, offline c128: the same record
// formats): the counts, the lists present and aligned where their counts say, a host plan on the host only.
inline dsa_status check_extend_lists(int64_t num_tokens, int64_t num_compress, int64_t num_write, const void* compress,
                                     const void* write, uint32_t flags, bool gpu, const char* op) {
  if (num_tokens < 0 || num_tokens > 65536)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_tokens is %lld; expected 0..65536 (16-bit ragged rows)", op,
                (long long)num_tokens);
  if (num_compress < 0 || num_compress > INT32_MAX || num_write < 0 || num_write > INT32_MAX)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: num_compress is %lld and num_write %lld; expected 0..2^31-1", op,
                (long long)num_compress, (long long)num_write);
  if ((num_compress > 0 && compress == nullptr) || (num_write > 0 && write == nullptr))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: compress and write must be non-null when their counts are", op);
  if (gpu && (!aligned(compress, 16) || !aligned(write, 8)))
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: on the GPU, compress must be 16-byte and write 8-byte aligned", op);
  if ((flags & DSA_FLAG_HOST_PLAN) && gpu)
    return fail(DSA_STATUS_INVALID_ARGUMENT, "%s: a host plan (DSA_FLAG_HOST_PLAN) runs on the host backend only; "
                "copy its records to the device for a GPU call", op);
  return DSA_STATUS_OK;
}

}  // namespace dsa
