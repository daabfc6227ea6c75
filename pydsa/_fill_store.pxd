# The store family's objects other fillers take: a layer's cache (KVCache, its dsa_kv_cache made once) and the
# judge of a store argument (pydsa/_fill_store.pyx). A filler of an op that stores cimports these.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

from pydsa._read cimport Arg, RawRing

cdef extern from "dsa_kernels.h":
    int DSA_STRUCT_KV_CACHE
    int DSA_CACHE_V4
    int DSA_CACHE_INDEXER
    ctypedef struct dsa_kv_cache:
        uint32_t struct_size
        int32_t layout
        uint8_t* cache
        int64_t num_pages
        int32_t page_size
        float eps
        const float* norm_weight
        const float* rotary
        int64_t num_positions
        int32_t dcp_world
        int32_t dcp_rank

cdef class KVCache:
    cdef dsa_kv_cache s  # the descriptor every storing op points at (host memory, alive with the object)
    cdef readonly object cache, norm_weight, rotary, layout, dcp
    cdef readonly int32_t device
    cdef readonly int head_dim, page_size
    cdef readonly int64_t page_bytes, num_pages
    cdef readonly double eps

# A store argument (a KVCache of D = d on device dev; of `layout` when given, "v4" or "indexer") as its descriptor's
# address, or the error naming `store`. dev_of / d_of say what the call's device and D are ("the ring is on", "the
# ring's D is").
cdef int store_of(object store, int32_t dev, int64_t d, str layout, str dev_of, str d_of,
                  const void** address) except -1
# A store's cache (a KVCache or None) apart from a buffer of its launch (`what`), or two stores' caches apart:
# else the error naming `name`.
cdef int cache_apart(object store, const void* data, int64_t nbytes, str name, str what) except -1
cdef int caches_apart(object store, object other, str name, str what) except -1
# An online c128 op's store (decode, prefill, verify) apart from its state, input, ape and out (store.cache).
cdef int state_store_apart(object store, const Arg* st, int32_t sdt, const Arg* kv, int64_t kv_rows, const Arg* ap,
                           const Arg* o, int64_t out_rows, int64_t d) except -1
# A raw ring's store (c4, offline c128): store_of's judgement on the ring's device and D, and its cache apart from
# the ring and the ape ([ape_rows, D] fp32), else the error naming store (store.cache).
cdef int ring_store(object store, const RawRing* r, int parts, int64_t ape_rows, str layout,
                    const void** address) except -1
# A call's optional store and its int64 cache_slots [rows]: the descriptor's address and the slots (both null
# without a store), or the error naming the wrong one; a prepared call's `keep` gets the store and the slots.
cdef int store_arg(object store, object cache_slots, int32_t dev, int64_t d, int64_t rows, const void** address,
                   const int64_t** slots, list keep) except -1
