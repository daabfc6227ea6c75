# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The store family: a layer's cache described once (KVCache, whose dsa_kv_cache every storing op points at), the
judge of a store argument the other fillers share, and the standalone store's params, filled from a call's arguments
(each judged by the shared reader, pydsa/_read.pyx, which raises the error naming a wrong one), and launched."""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uintptr_t

from pydsa._read cimport *

from pydsa import _tensors
from pydsa._abi import lib
from pydsa.errors import ArgumentTypeError, ArgumentValueError, int_argument, records_ahead_argument, bool_argument

cdef extern from "dsa_kernels.h":  # this family's params, as the header lays them out
    int DSA_STRUCT_KV_STORE_PARAMS
    int DSA_FLAG_RECORDS_AHEAD
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

declare_struct("kv_cache", DSA_STRUCT_KV_CACHE, sizeof(dsa_kv_cache))

LAYOUTS = {"v4": DSA_CACHE_V4, "indexer": DSA_CACHE_INDEXER}


cdef int _page_size(page_size) except -1:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= 1024 \
            or page_size & (page_size - 1):
        raise ArgumentValueError("page_size", f"page_size must be a power of two in 1..1024 (got {page_size!r})")
    return 0


def kv_page_bytes(head_dim=512, page_size=2):
    """Bytes of one cache page: page_size entries of D + 64 data bytes and a scale row of 8 bytes
    per 512 channels, padded to a multiple of D + 64 (D = 512, page 2: 1728)."""
    _page_size(page_size)
    n = lib.dsa_kv_page_bytes(int_argument(head_dim, "head_dim", 128, 2 ** 16, " (a multiple of 64)"), page_size)
    if n <= 0:
        raise ArgumentValueError("head_dim", f"head_dim must be a multiple of 64 >= 128 and page_size >= 1 (got {head_dim}, {page_size})")
    return n


def indexer_page_bytes(head_dim=128, page_size=64):
    """Bytes of one page of the c4 indexer's cache: page_size entries of 128 fp8 codes and a 4-byte fp32
    scale (page 64: 8448)."""
    _page_size(page_size)
    n = lib.dsa_indexer_page_bytes(int_argument(head_dim, "head_dim", 128, 128, " (the indexer's D)"), page_size)
    if n <= 0:
        raise ArgumentValueError("head_dim", f"head_dim must be 128 and page_size >= 1 for an indexer cache (got {head_dim}, "
                                 f"{page_size})")
    return n


cdef class KVCache:
    """One layer's paged cache and what storing into it needs, checked once.

    cache: uint8 [num_pages, kv_page_bytes(D, page_size)] (or any contiguous uint8 tensor of whole
    pages); norm_weight: float32 [D]; rotary: float32 [num_positions, 64], (cos, sin) of pair l at
    columns 2l, 2l+1 (complex64 [num_positions, 32] is taken through view_as_real); page_size: a
    power of two in 1..1024; eps: the RMSNorm epsilon. Cache slot `loc` is entry loc % page_size of page
    loc // page_size.

    dcp=(world, rank): this cache is rank `rank`'s share of a cache sharded over `world` GPUs
    (decode-context parallelism): the entry of slot `loc` is written here only when loc % world == rank,
    at local slot loc // world; slots other ranks own are skipped silently, as negative ones are. Every
    storing op honors it on the GPU and the host backend.

    layout="indexer": the c4 indexer's cache (D = 128; docs/spec.md, "The stores of a c4 layer"): an entry is the
    normed vector with its last 64 channels rotated (fp32), Hadamard-transformed, as 128 fp8 e4m3 codes
    with one fp32 scale; a page holds page_size entries' codes, then their scales (indexer_page_bytes).
    Only the c4 ops store into it.

    Everything is judged and read when the cache is made (a wrong argument raises, naming it); its attributes
    are read-only: a KVCache stands for these buffers, whatever they hold. `address` is its dsa_kv_cache's."""

    def __init__(self, cache, norm_weight, rotary, *, page_size, eps=1e-6, dcp=(1, 0), layout="v4"):
        cdef Arg c, w, r
        if layout not in LAYOUTS:
            raise ArgumentValueError("layout", f"layout must be 'v4' or 'indexer' (got {layout!r})")
        _page_size(page_size)
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0.0 <= float(eps) < float("inf"):
            raise ArgumentValueError("eps", f"eps must be a finite number >= 0 (got {eps!r})")
        try:
            world, rank = (int(dcp[0]), int(dcp[1])) if len(dcp) == 2 else (None, None)
        except (TypeError, ValueError):
            world = rank = None
        if world is None or world < 1 or not 0 <= rank < world or world >= 2 ** 31:
            raise ArgumentValueError("dcp", f"dcp must be (world, rank) with world >= 1 and 0 <= rank < world (got {dcp!r})")
        cache, norm_weight = _tensors.as_tensor(cache, "cache"), _tensors.as_tensor(norm_weight, "norm_weight")
        rotary = _tensors.as_tensor(rotary, "rotary")
        if norm_weight.dim() != 1:
            raise ArgumentValueError("norm_weight", f"norm_weight must be a 1-D float32 tensor [D] (got shape {tuple(norm_weight.shape)})")
        d = norm_weight.shape[0]
        if layout == "indexer":
            if d != 128:
                raise ArgumentValueError("norm_weight", f"norm_weight has {d} channels; an indexer cache needs D = 128")
            page = indexer_page_bytes(d, page_size)
        else:
            page = kv_page_bytes(d, page_size) if d >= 128 and d % 64 == 0 else None
        if page is None:
            raise ArgumentValueError("norm_weight", f"norm_weight has {d} channels; a store needs D a multiple of 64, >= 128")
        if rotary.is_complex():
            rotary = _tensors.real_pairs(rotary)
        dev = _tensors.device_index(cache)
        read(cache, &c, "cache", None)
        if c.dtype != U8:
            raise ArgumentValueError("cache", f"cache must be a uint8 tensor (got {cache.dtype})")
        if not c.contiguous:
            raise ArgumentValueError("cache", f"cache must be contiguous (got shape {tuple(cache.shape)}, strides {cache.stride()})")
        numel = cache.numel()
        if numel % page != 0 or numel == 0:
            raise ArgumentValueError("cache", f"cache holds {numel} bytes; a cache for D = {d}, page_size {page_size} is whole "
                             f"{page}-byte pages (the D comes from norm_weight's {d} channels)")
        if rotary.dim() != 2:
            raise ArgumentValueError("rotary", "rotary must be a 2-D float32 tensor [num_positions, 64]")
        tensor(norm_weight, &w, "norm_weight", F32, dev, 1, d, ANY, None)
        tensor(rotary, &r, "rotary", F32, dev, 2, ANY, 64, None)
        disjoint(&c, numel, "cache", &w, d * 4, "norm_weight")  # the store writes the cache as it reads them
        disjoint(&c, numel, "cache", &r, r.shape[0] * 64 * 4, "rotary")
        self.s.struct_size = sizeof(dsa_kv_cache)
        self.s.layout = LAYOUTS[layout]
        self.s.cache = <uint8_t*>c.data
        self.s.num_pages = numel // page
        self.s.page_size = page_size
        self.s.eps = float(eps)
        self.s.norm_weight = <const float*>w.data
        self.s.rotary = <const float*>r.data
        self.s.num_positions = r.shape[0]
        self.s.dcp_world, self.s.dcp_rank = world, rank
        self.cache, self.norm_weight, self.rotary = cache, norm_weight, rotary
        self.head_dim, self.page_size, self.page_bytes = d, page_size, page
        self.num_pages, self.eps, self.device = self.s.num_pages, float(eps), dev
        self.dcp = (world, rank)
        self.layout = layout

    @property
    def address(self):
        """The address of this cache's dsa_kv_cache (host memory, valid while the KVCache lives)."""
        return <uintptr_t>&self.s

    def __repr__(self):
        dcp = f", dcp={self.dcp}" if self.dcp[0] > 1 else ""
        return (f"KVCache(D={self.head_dim}, pages={self.num_pages} x {self.page_size}, "
                f"{self.page_bytes} B/page, device={self.cache.device}{dcp})")


cdef int store_of(object store, int32_t dev, int64_t d, str layout, str dev_of, str d_of,
                  const void** address) except -1:
    if type(store) is not KVCache:
        raise ArgumentTypeError("store", f"store must be a pydsa.KVCache (got {type(store).__name__})")
    cdef KVCache kv = <KVCache>store
    if layout is not None and kv.layout != layout:
        raise ArgumentValueError("store", f"store has layout {kv.layout!r}; this ring stores into a {layout!r} cache")
    if kv.head_dim != d:
        raise ArgumentValueError("store", f"store is for D = {kv.head_dim} but {d_of} {d}")
    if kv.device != dev:
        raise ArgumentValueError("store", f"store's cache is on {kv.cache.device} but {dev_of} "
                                          f"{_tensors.device_name(dev)}")
    address[0] = <const void*>&kv.s
    return 0


cdef int cache_apart(object store, const void* data, int64_t nbytes, str name, str what) except -1:
    """A store's cache (a KVCache, or None: nothing to judge) apart from a buffer its launch reads or writes
    (`what`): the store writes the cache while the launch's other threads read or write that buffer, in an order no
    caller controls. The error names `name` (the cache as the call sees it)."""
    if store is None:
        return 0
    if type(store) is not KVCache:  # judged by the caller first (store_of); never cast unjudged
        raise ArgumentTypeError("store", f"store must be a pydsa.KVCache (got {type(store).__name__})")
    cdef KVCache kv = <KVCache>store
    if overlap(kv.s.cache, kv.num_pages * kv.page_bytes, data, nbytes):
        raise ArgumentValueError(name, f"{name} shares memory with {what}, which the launch reads or writes while the "
                                       f"store writes the cache: give the cache memory of its own")
    return 0


cdef int caches_apart(object store, object other, str name, str what) except -1:
    """Two stores of one launch (c4's two compressors) apart: each writes its cache."""
    if other is None:
        return 0
    if type(other) is not KVCache:
        raise ArgumentTypeError("store", f"store must be a pydsa.KVCache (got {type(other).__name__})")
    cdef KVCache kv = <KVCache>other
    return cache_apart(store, kv.s.cache, kv.num_pages * kv.page_bytes, name, what)


cdef int state_store_apart(object store, const Arg* st, int32_t sdt, const Arg* kv, int64_t kv_rows, const Arg* ap,
                      const Arg* o, int64_t out_rows, int64_t d) except -1:
    """An online c128 op's store (a KVCache judged by store_arg, or None) apart from the state, input, ape and out
    its launch reads and writes."""
    if store is None:
        return 0
    cdef int64_t state_bytes = st.shape[0] * st.shape[1] * st.shape[2] * (2 if sdt == DSA_STATE_BFLOAT16 else 4)
    cache_apart(store, st.data, state_bytes, "store.cache", "state")
    cache_apart(store, kv.data, kv_rows * 2 * d * 4, "store.cache", "kv_score")
    cache_apart(store, ap.data, DSA_CHUNK * d * 4, "store.cache", "ape")
    return cache_apart(store, o.data, out_rows * d * 4, "store.cache", "out")


cdef int ring_store(object store, const RawRing* r, int parts, int64_t ape_rows, str layout,
                    const void** address) except -1:
    """A raw ring's store (store_of's judgement, on the ring's device and D), whose cache shares no memory with the
    ring or the ape (judged once, when the description is made)."""
    store_of(store, r.dev, r.head_dim, layout, "the ring is on", "the ring's D is", address)
    cache_apart(store, r.data, r.rows * parts * r.head_dim * (2 if r.dtype == BF16 else 4), "store.cache", "the ring")
    cache_apart(store, r.ape, ape_rows * r.head_dim * 4, "store.cache", "ape")
    return 0


cdef int store_arg(object store, object cache_slots, int32_t dev, int64_t d, int64_t rows, const void** address,
                   const int64_t** slots, list keep) except -1:
    cdef Arg cs
    address[0] = NULL
    slots[0] = NULL
    if store is None:
        if cache_slots is not None:
            raise ArgumentValueError("cache_slots", "cache_slots is given without store=")
        return 0
    store_of(store, dev, d, None, "the other tensors are on", "the op's head dim is", address)
    if keep is not None:
        keep.append(store)
    if cache_slots is None:
        raise ArgumentValueError("cache_slots", "cache_slots is None but store= is given: give an int64 tensor with one "
                                                "cache slot per row")
    vector(cache_slots, &cs, "cache_slots", I64, dev, rows, keep, "one cache slot per row of kv_score")
    cache_apart(store, cs.data, rows * 8, "store.cache", "cache_slots")
    slots[0] = <const int64_t*>cs.data
    return 0


cdef int OP_STORE = declare_op("store", "dsa_kv_store", DSA_STRUCT_KV_STORE_PARAMS, sizeof(dsa_kv_store_params))


def kv_store(vectors, positions, cache_slots, cache, *, records=None, extend=False, ratio=None, stream=None, pdl=None,
             error_count=None, records_ahead=False):
    """Stores vectors [N, D] float32 into `cache` (a pydsa.KVCache): vector i at cache slot cache_slots[i]
    (int64 [N]; negative: skipped; past the cache: skipped and counted) with rotary row positions[i]
    (int32 [N], its chunk's first position; outside the table: skipped and counted).

    With records (uint8 [M, 16], M <= N: sglang 0.5.23's plan records) and positions None, vector i's
    position and slot come from records[i] (docs/spec.md, the store): decode records (extend False) store
    row i when its seq_len is a positive multiple of 128, at cache_slots[i]; extend records store every
    record but padding, at cache_slots[its ragged row]; the position is seq_len - 128. The records do not
    say which layer made them, so records= needs ratio=: 128 for a c128 layer's records, 4 for a c4
    layer's (decode rows stored when seq_len is a positive multiple of 4; position seq_len - 4).

    A cache of layout "indexer" takes the c4 indexer's store (D = 128).

    records_ahead=True (with records=): the caller's promise that the records and cache_slots were written
    before the launch ahead of this call on its stream began; with PDL the kernel then reads them, and the
    cache's norm weights and rotary pairs, while that launch finishes."""
    records_ahead = records_ahead_argument(records_ahead, records)
    if records is None:
        if ratio is not None:
            raise ArgumentValueError("ratio", f"ratio is given without records= (it says what the records' layer is; "
                                              f"got {ratio!r})")
        ratio = 128
    elif type(ratio) is not int or (ratio != 4 and ratio != 128):
        raise ArgumentValueError("ratio", f"records= needs ratio=: 128 (a c128 layer's records) or 4 (a c4 layer's); "
                                          f"the records do not say which (got {ratio!r})")
    cdef int status = _store(vectors, positions=positions, cache_slots=cache_slots, cache=cache, records=records,
                             extend=extend, ratio=ratio, stream=stream,
                             flags=pdl_flag(pdl) | (DSA_FLAG_RECORDS_AHEAD if records_ahead else 0),
                             error_count=error_count)
    if status:
        raise_status(status)


cdef int _store(vectors, positions, cache_slots, cache, records, extend, int32_t ratio, stream, uint32_t flags,
                error_count) except? -9:
    """The store's fill: judges every argument (a wrong one raises, naming it), fills the params and launches
    them (the library's status). With records, positions and slots come from them."""
    cdef dsa_kv_store_params p
    cdef Arg v, ps, cs, rc
    cdef uint32_t* errors
    bool_argument(extend, "extend")
    if type(cache) is not KVCache:
        raise ArgumentTypeError("cache", f"cache must be a pydsa.KVCache (got {type(cache).__name__})")
    cdef KVCache kv = <KVCache>cache
    cdef int32_t dev = kv.device
    cdef int64_t d = kv.head_dim
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
    # the cache apart from what the store reads (vectors, positions, slots, records)
    cache_apart(cache, v.data, v.shape[0] * d * 4, "cache", "vectors")
    cache_apart(cache, ps.data, n * 4, "cache", "positions")
    cache_apart(cache, cs.data, cs.shape[0] * 8, "cache", "cache_slots")
    cache_apart(cache, rc.data, n * 16, "cache", "records")
    error_counter(error_count, dev, &errors, None)
    p.struct_size = sizeof(dsa_kv_store_params)
    p.flags = flags
    p.device = dev
    p.head_dim = <int32_t>d
    p.num_vectors = n
    p.vectors = <const float*>v.data
    p.positions = <const int32_t*>ps.data
    p.cache_slots = <const int64_t*>cs.data
    p.cache = <const void*>&kv.s
    p.error_count = errors
    p.records = <const int32_t*>rc.data
    p.num_cache_slots = cs.shape[0] if records is not None else n
    p.ratio = ratio
    p.reserved = 0
    return launch(OP_STORE, &p, p.device, stream)


def buffer_key(t):
    """pydsa.buffer_key(t): what identifies a tensor's memory as pydsa reads it, for a cache of pydsa objects made
    from an engine's buffers (pydsa.sglang's memo keys by it): its address, device, dtype, contiguity and shape, so a
    view of the same address in another dtype, shape or layout is another key (read as the ops read their tensors,
    a few times quicker than torch's attributes). A tensor pydsa cannot read raises, naming t."""
    cdef Arg a
    read(t, &a, "t", None)
    if a.ndim > 3:  # the shape whole
        return (<uintptr_t>a.data, a.dev, a.dtype, a.contiguous, tuple([a.shape[i] for i in range(a.ndim)]))
    # one int for dtype, rank, contiguity and device; the shape padded to three: a tuple of five ints
    cdef int64_t code = <int64_t>a.dtype | (<int64_t>a.ndim << 24) | (<int64_t>a.contiguous << 28) | \
        (<int64_t>(a.dev + 2) << 32)
    return (<uintptr_t>a.data, code, a.shape[0] if a.ndim > 0 else -1, a.shape[1] if a.ndim > 1 else -1,
            a.shape[2] if a.ndim > 2 else -1)
