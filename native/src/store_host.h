// The host backend of the stores (device == DSA_DEVICE_HOST): the same bytes as the kernels, on the calling
// thread, for arguments the entry points have checked.
#pragma once

#include <cstdint>

#include "dsa_kernels.h"

namespace dsa {

void host_store(const dsa_kv_store_params& p);
// One vector x [D] into a DSA_CACHE_V4 cache (the epilogue of every storing host op).
void host_store_vector(const float* x, int D, const dsa_kv_cache& c, int64_t loc, int64_t pos, uint32_t* error_count);
// One vector x [128] into a DSA_CACHE_INDEXER cache.
void host_indexer_store(const float* x, const dsa_kv_cache& c, int64_t loc, int64_t pos, uint32_t* error_count);
// Either, by the cache's layout.
void host_store_entry(const float* x, int D, const dsa_kv_cache& c, int64_t loc, int64_t pos, uint32_t* error_count);

}  // namespace dsa
