# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The standalone store's params, filled from a call's arguments (each judged by the shared reader,
pydsa/_read.pyx, which raises the error naming a wrong one), and launched."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uintptr_t

from pydsa._read cimport *

from pydsa.errors import ArgumentTypeError, ArgumentValueError

cdef extern from "dsa_kernels.h":  # this family's params, as the header lays them out
    int DSA_STRUCT_KV_STORE_PARAMS
    ctypedef struct dsa_kv_store_params:
        uint32_t struct_size
        uint32_t flags
        int32_t device
        int32_t head_dim
        int64_t num_vectors
        const float* vectors
        const int32_t* positions
        const int64_t* cache_slots
        const void* cache
        uint32_t* error_count
        const int32_t* records
        int64_t num_cache_slots
        int32_t ratio
        int32_t reserved

cdef int OP_STORE = declare_op("store", "dsa_kv_store", DSA_STRUCT_KV_STORE_PARAMS, sizeof(dsa_kv_store_params))


def kv_store(vectors, positions, cache_slots, cache, *, records=None, extend=False, ratio=None, stream=None, pdl=None,
             error_count=None):
    """Stores vectors [N, D] float32 into `cache` (a pydsa.KVCache): vector i at cache slot cache_slots[i]
    (int64 [N]; negative: skipped; past the cache: skipped and counted) with rotary row positions[i]
    (int32 [N], its chunk's first position; outside the table: skipped and counted).

    With records (uint8 [M, 16], M <= N: sglang 0.5.23's plan records) and positions None, vector i's
    position and slot come from records[i] (docs/spec.md, the store): decode records (extend False) store
    row i when its seq_len is a positive multiple of 128, at cache_slots[i]; extend records store every
    record but padding, at cache_slots[its ragged row]; the position is seq_len - 128. The records do not
    say which layer made them, so records= needs ratio=: 128 for a c128 layer's records, 4 for a c4
    layer's (decode rows stored when seq_len is a positive multiple of 4; position seq_len - 4).

    A cache of layout "indexer" takes the c4 indexer's store (D = 128)."""
    if records is None:
        if ratio is not None:
            raise ArgumentValueError("ratio", f"ratio is given without records= (it says what the records' layer is; "
                                              f"got {ratio!r})")
        ratio = 128
    elif type(ratio) is not int or (ratio != 4 and ratio != 128):
        raise ArgumentValueError("ratio", f"records= needs ratio=: 128 (a c128 layer's records) or 4 (a c4 layer's); "
                                          f"the records do not say which (got {ratio!r})")
    cdef int status = _store(vectors, positions, cache_slots, cache, records, extend, ratio, stream, pdl_flag(pdl),
                             error_count)
    if status:
        raise_status(status)


cdef int _store(vectors, positions, cache_slots, cache, records, extend, int32_t ratio, stream, uint32_t flags,
                error_count) except? -9:
    """The store's fill: judges every argument (a wrong one raises, naming it), fills the params and launches
    them (the library's status). With records, positions and slots come from them."""
    cdef dsa_kv_store_params p
    cdef Arg v, ps, cs, rc
    cdef uint32_t* errors
    if extend is not True and extend is not False:
        raise ArgumentTypeError("extend", f"extend must be a bool (got {extend!r})")
    if not is_store(cache):
        raise ArgumentTypeError("cache", f"cache must be a pydsa.KVCache (got {type(cache).__name__})")
    cdef int32_t dev = cache.device
    cdef int64_t d = cache.head_dim
    tensor(vectors, &v, "vectors", F32, dev, 2, ANY, d, None)
    cdef int64_t n = v.shape[0]
    ps.data = NULL
    rc.data = NULL
    if records is None:
        vector(positions, &ps, "positions", I32, dev, n, None, "N: the rows of vectors")
        vector(cache_slots, &cs, "cache_slots", I64, dev, n, None, "N: the rows of vectors")
    else:  # request or segment records, uint8 [M, 16]: the first M vectors; cache_slots of any length
        if positions is not None:
            raise ArgumentValueError("positions", "positions must be None with records (the records give each vector's position)")
        tensor(records, &rc, "records", U8, dev, 2, ANY, 16, None)
        if rc.shape[0] > n:
            raise ArgumentValueError("records", f"records has {rc.shape[0]} rows but vectors only {n}")
        tensor(cache_slots, &cs, "cache_slots", I64, dev, 1, ANY, ANY, None)
        n = rc.shape[0]
        flags |= DSA_FLAG_STORE_EXTEND_RECORDS if extend else DSA_FLAG_STORE_DECODE_RECORDS
    error_counter(error_count, dev, &errors, None)
    p.struct_size = sizeof(dsa_kv_store_params)
    p.flags = flags
    p.device = dev
    p.head_dim = <int32_t>d
    p.num_vectors = n
    p.vectors = <const float*>v.data
    p.positions = <const int32_t*>ps.data
    p.cache_slots = <const int64_t*>cs.data
    p.cache = <const void*><uintptr_t>cache.address
    p.error_count = errors
    p.records = <const int32_t*>rc.data
    p.num_cache_slots = cs.shape[0] if records is not None else n
    p.ratio = ratio
    p.reserved = 0
    return launch(OP_STORE, &p, p.device, stream)
