# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The c4 ops' params (decode, extend, verify: one layout), filled from a call's arguments (each judged by
the shared reader, pydsa/_read.pyx, which raises the error naming a wrong one), and launched: on the C
stack for a one-shot call, into the params of its prepared form (C4Decode: the reader's Prepared). Each kind
(decode, extend, verify) has its fill, over one reader of the call's two sides (main's and the indexer's)."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uintptr_t
from libc.string cimport memset

from pydsa._read cimport *
from pydsa._fill_store cimport cache_apart, caches_apart, ring_store

from pydsa.errors import ArgumentTypeError, ArgumentValueError, records_ahead_argument, bool_argument

cdef extern from "dsa_kernels.h":  # this family's params, as the header lays them out
    int DSA_STRUCT_C4_PARAMS
    int DSA_FLAG_C4_REJECT_ALL
    int DSA_FLAG_RECORDS_AHEAD
    ctypedef struct dsa_c4_compressor:
        int32_t head_dim
        int32_t reserved
        void* ring
        int64_t ring_rows
        const float* kv_score
        const float* ape
        float* out
        const void* store
    ctypedef struct dsa_c4_params:
        uint32_t struct_size
        uint32_t flags
        int32_t device
        int32_t num_compressors
        int32_t ring_dtype
        int32_t ring_size
        int64_t batch_size
        int64_t num_tokens
        const void* decode_records
        const void* compress
        const void* write
        int64_t num_compress
        int64_t num_write
        const int32_t* seq_lens
        const int32_t* slots
        int32_t num_drafts
        int32_t reserved
        const int64_t* cache_slots
        uint32_t* error_count
        dsa_c4_compressor compressors[2]

cdef enum:
    APE_ROWS = 8  # a c4 compressor's ape: [8, D], a window's 8 rows

cdef int OP_C4_DECODE = declare_op("c4_decode", "dsa_c4_decode", DSA_STRUCT_C4_PARAMS, sizeof(dsa_c4_params))
cdef int OP_C4_EXTEND = declare_op("c4_extend", "dsa_c4_extend", DSA_STRUCT_C4_PARAMS, sizeof(dsa_c4_params))
cdef int OP_C4_VERIFY = declare_op("c4_verify", "dsa_c4_verify", DSA_STRUCT_C4_PARAMS, sizeof(dsa_c4_params))
cdef int[3] _C4_OPS = [OP_C4_DECODE, OP_C4_EXTEND, OP_C4_VERIFY]


cdef enum:
    DECODE = 0
    EXTEND = 1
    VERIFY = 2


cdef class C4Compressor:
    """One compressor of a c4 layer, described once: its ring (fp32 or bf16 [rows, 4D], rows a multiple of 4,
    contiguous, on the host or a CUDA device), its ape (fp32 [8, D] on the ring's device: rows 0..3 bias the
    A halves, 4..7 the B halves) and an optional store (a KVCache on that device: layout "v4" for the main
    compressor, "indexer" for the indexer's). D is 128, 256 or 512.

    ring_size=R makes the ring pydsa's request-scoped one: request slot s owns rows s*R .. s*R+R-1, the
    ring's rows are num_slots * R (R a multiple of 4, >= 8), and the ops that address the ring by request
    (c4_decode with seq_lens=/slots=, c4_verify, an extend planned by pyplan.plan_c4) take R from here.
    Without it the ring is addressed only by records (sglang's page-scoped rings).

    Everything is judged and read when the compressor is made (a wrong one raises, naming it); each call
    then reads only its own tensors. They are read-only attributes: a compressor stands for these buffers,
    whatever they hold."""

    cdef readonly object ring, ape, store
    cdef readonly int head_dim
    cdef readonly object ring_size, num_slots  # None for a ring addressed by records only
    cdef int32_t dev, ring_dtype, rows_per_slot  # rows_per_slot: R, or 0
    cdef void* ring_data
    cdef int64_t ring_rows
    cdef const float* ape_data
    cdef const void* store_address
    cdef list views  # DLPack views of arrays of another framework, alive as long as the compressor

    def __init__(self, ring, ape, *, store=None, ring_size=None):
        cdef RawRing r
        cdef list views = []
        raw_ring(ring, ape, 4, APE_ROWS, 4, "groups of a quartet", &r, views)
        self.store_address = NULL
        if store is not None:
            ring_store(store, &r, 4, APE_ROWS, None, &self.store_address)
        self.ring, self.ape, self.store, self.head_dim = ring, ape, store, <int>r.head_dim
        self.dev = r.dev
        self.ring_dtype = DSA_STATE_BFLOAT16 if r.dtype == BF16 else DSA_STATE_FLOAT32
        self.ring_data = r.data
        self.ring_rows = r.rows
        self.ape_data = r.ape
        self.views = views
        self.rows_per_slot = 0
        self.ring_size = self.num_slots = None
        if ring_size is not None:
            int_arg(ring_size, "ring_size", 8, 2 ** 20, " (a multiple of 4: rows per request slot)")
            if ring_size % 4 or self.ring_rows % ring_size:
                raise ArgumentValueError("ring_size", f"ring_size is {ring_size}; expected a multiple of 4 that divides "
                                                      f"the ring's {self.ring_rows} rows (num_slots * ring_size)")
            self.rows_per_slot = ring_size
            self.ring_size, self.num_slots = ring_size, self.ring_rows // ring_size

    def __repr__(self):
        geometry = "" if self.ring_size is None else f", ring_size={self.ring_size}, num_slots={self.num_slots}"
        return (f"C4Compressor(D={self.head_dim}, ring={tuple(self.ring.shape)} {self.ring.dtype}{geometry}, "
                f"store={self.store!r})")


cdef object _device(int32_t dev):
    return "cpu" if dev < 0 else f"cuda:{dev}"


cdef int _sides_apart(const dsa_c4_compressor* m, str main_kv, str kv_name, const void* out,
                      const void* ring, const void* ape, const void* kv, int64_t d, int64_t ring_bytes, int64_t rows,
                      int64_t out_rows, int64_t elt, int32_t dev) except -1:
    """The indexer's out (`out`) apart from main's ring, ape, input (named main_kv) and out, and main's out apart
    from the indexer's ring, ape and input (`ring`, `ape`, `kv` named kv_name; D = d): the error naming both, else 0."""
    cdef Arg a, b
    a.dev = b.dev = dev
    cdef int64_t md = m.head_dim
    if out != NULL:
        a.data = <char*>out
        b.data = <char*>m.ring
        disjoint(&a, out_rows * d * 4, "indexer_out", &b, m.ring_rows * 4 * md * elt, "main.ring")
        b.data = <char*>m.ape
        disjoint(&a, out_rows * d * 4, "indexer_out", &b, APE_ROWS * md * 4, "main.ape")
        b.data = <char*>m.kv_score
        disjoint(&a, out_rows * d * 4, "indexer_out", &b, rows * 4 * md * 4, main_kv)
        b.data = <char*>m.out
        disjoint(&a, out_rows * d * 4, "indexer_out", &b, out_rows * md * 4, "out")
    if m.out != NULL:
        a.data = <char*>m.out
        b.data = <char*>ring
        disjoint(&a, out_rows * md * 4, "out", &b, ring_bytes, "indexer.ring")
        b.data = <char*>ape
        disjoint(&a, out_rows * md * 4, "out", &b, APE_ROWS * d * 4, "indexer.ape")
        b.data = <char*>kv
        disjoint(&a, out_rows * md * 4, "out", &b, rows * 4 * d * 4, kv_name)
    return 0


cdef int _caches_apart(C4Compressor main, C4Compressor indexer, const dsa_c4_compressor* m, const void* indexer_kv,
                       const void* indexer_out, int64_t rows, int64_t out_rows, int64_t elt, str kv_name) except -1:
    """Each store apart from the other side's ring, ape, input and out (m: main's side), the two caches apart."""
    cdef int64_t md = main.head_dim, xd = indexer.head_dim
    cache_apart(main.store, indexer_out, out_rows * xd * 4, "main.store.cache", "indexer_out")
    cache_apart(main.store, indexer.ring_data, indexer.ring_rows * 4 * xd * elt, "main.store.cache", "indexer.ring")
    cache_apart(main.store, indexer.ape_data, APE_ROWS * xd * 4, "main.store.cache", "indexer.ape")
    cache_apart(main.store, indexer_kv, rows * 4 * xd * 4, "main.store.cache", kv_name)
    cache_apart(indexer.store, m.out, out_rows * md * 4, "indexer.store.cache", "out")
    cache_apart(indexer.store, main.ring_data, main.ring_rows * 4 * md * elt, "indexer.store.cache", "main.ring")
    cache_apart(indexer.store, main.ape_data, APE_ROWS * md * 4, "indexer.store.cache", "main.ape")
    cache_apart(indexer.store, m.kv_score, rows * 4 * md * 4, "indexer.store.cache",
                "kv_score" if kv_name == "indexer_kv_score" else "drafts")
    return caches_apart(indexer.store, main.store, "indexer.store.cache", "main.store.cache")


cdef int _side(dsa_c4_params* p, int k, object comp_, str name, kv_score, const Arg* input, str kv_name, out,
               str out_name, int64_t rows, int64_t out_rows, list keep, str rows_of, str out_rows_of,
               object p_main) except -1:
    """Compressor k of the call (`name`: main or indexer): its described ring, ape and store, and this call's
    input and output (which must not share memory with the input or the ring). `input`: the input as the call
    already read and judged it (main's, by _begin), or NULL: kv_score is read here."""
    cdef Arg kv, o, ring_arg
    cdef int32_t dev = p.device
    if type(comp_) is not C4Compressor:
        raise ArgumentTypeError(name, f"{name} must be a pydsa.C4Compressor (got {type(comp_).__name__})")
    cdef C4Compressor comp = <C4Compressor>comp_
    if keep is not None:
        keep.append(comp)
    if comp.dev != dev:
        raise ArgumentValueError(name, f"{name}'s ring is on {_device(comp.dev)} but {kv_name} is on {_device(dev)}")
    if k == 0:
        p.ring_dtype = comp.ring_dtype
    elif comp.ring_dtype != p.ring_dtype:
        raise ArgumentValueError("indexer", f"indexer.ring is {comp.ring.dtype}; both compressors' rings must have "
                                            f"one dtype (main.ring's)")
    if k == 1 and comp_ is p_main:
        raise ArgumentValueError("indexer", "indexer is main: one compressor cannot be both sides of a call (its "
                                            "ring and cache would be written twice, a race on the GPU)")
    if k == 1 and comp.rows_per_slot != (<C4Compressor>p_main).rows_per_slot:
        raise ArgumentValueError("indexer", f"indexer.ring_size is {comp.ring_size} but main.ring_size is "
                                            f"{(<C4Compressor>p_main).ring_size}: both rings serve the same requests")
    if input == NULL:
        tensor(kv_score, &kv, kv_name, F32, dev, 2, rows, 4 * comp.head_dim, keep, rows_of)
        input = &kv
    cdef int64_t elt = 2 if comp.ring_dtype == DSA_STATE_BFLOAT16 else 4  # both rings' (one dtype, judged above)
    cdef int64_t ring_bytes = comp.ring_rows * 4 * comp.head_dim * elt, input_bytes = rows * 4 * comp.head_dim * 4
    apart_from_ring(input.data, input_bytes, kv_name, comp.ring_data, ring_bytes, name)
    if k == 1:  # each input apart from the other compressor's ring too
        apart_from_ring(input.data, input_bytes, kv_name, p.compressors[0].ring,
                        p.compressors[0].ring_rows * 4 * p.compressors[0].head_dim * elt, "main")
        apart_from_ring(p.compressors[0].kv_score, rows * 4 * p.compressors[0].head_dim * 4,
                        "drafts" if kv_name == "indexer_drafts" else "kv_score", comp.ring_data, ring_bytes,
                        "indexer")
    o.data = NULL
    if out is not None:
        tensor(out, &o, out_name, F32, dev, 2, out_rows, comp.head_dim, keep, out_rows_of)
        disjoint(&o, out_rows * comp.head_dim * 4, out_name, input, rows * 4 * comp.head_dim * 4, kv_name)
        ring_arg.data = <char*>comp.ring_data
        ring_arg.dev = comp.dev
        # the names as literals: nothing is formatted on a call that passes
        disjoint(&o, out_rows * comp.head_dim * 4, out_name, &ring_arg, ring_bytes,
                 "main.ring" if k == 0 else "indexer.ring")
        ring_arg.data = <char*>comp.ape_data
        disjoint(&o, out_rows * comp.head_dim * 4, out_name, &ring_arg, APE_ROWS * comp.head_dim * 4,
                 "main.ape" if k == 0 else "indexer.ape")
    cdef str cache_name = "main.store.cache" if k == 0 else "indexer.store.cache"  # its ring and ape: judged when made
    cache_apart(comp.store, input.data, input_bytes, cache_name, kv_name)
    cache_apart(comp.store, o.data, out_rows * comp.head_dim * 4, cache_name, out_name)
    if k == 1:  # each side's out and cache apart from everything of the other side the call reads or writes
        _sides_apart(&p.compressors[0], main_kv="kv_score" if kv_name == "indexer_kv_score" else "drafts",
                     kv_name=kv_name, out=o.data, ring=comp.ring_data, ape=comp.ape_data, kv=input.data,
                     d=comp.head_dim, ring_bytes=ring_bytes, rows=rows, out_rows=out_rows, elt=elt, dev=dev)
        _caches_apart(<C4Compressor>p_main, comp, &p.compressors[0], indexer_kv=input.data, indexer_out=o.data,
                      rows=rows, out_rows=out_rows, elt=elt, kv_name=kv_name)
    p.compressors[k].head_dim = comp.head_dim
    p.compressors[k].reserved = 0
    p.compressors[k].ring = comp.ring_data
    p.compressors[k].ring_rows = comp.ring_rows
    p.compressors[k].kv_score = <const float*>input.data
    p.compressors[k].ape = comp.ape_data
    p.compressors[k].out = <float*>o.data
    p.compressors[k].store = comp.store_address
    return 0


cdef int32_t _request_ring(object main, object ring_size, str op) except -1:
    """R of pydsa's request-scoped ring, as main owns it; a call's ring_size, when given, must agree."""
    cdef C4Compressor m = <C4Compressor>main
    if m.rows_per_slot == 0:
        raise ArgumentValueError("main", f"main was made without ring_size: {op} over pydsa's request-scoped ring needs "
                                         f"C4Compressor(ring, ape, ring_size=R), the rows each request slot owns")
    if ring_size is not None and (type(ring_size) is not int or ring_size != m.rows_per_slot):
        raise ArgumentValueError("ring_size", f"ring_size is {ring_size!r} but main's ring has ring_size {m.ring_size} "
                                              f"(the ring owns its geometry: leave ring_size out, or pass its own)")
    return m.rows_per_slot


cdef int _refuse_compressors(int kind, main, indexer, indexer_kv_score, indexer_out) except -1:
    """Cold: the error naming what _begin refuses (kept apart so that _begin stays small enough to inline)."""
    if type(main) is not C4Compressor:
        raise ArgumentTypeError("main", f"main must be a pydsa.C4Compressor (got {type(main).__name__})")
    if (indexer is None) != (indexer_kv_score is None):
        given = "indexer_drafts" if kind == VERIFY else "indexer_kv_score"
        missing, other = (given, "indexer") if indexer_kv_score is None else ("indexer", given)
        raise ArgumentValueError(missing, f"{missing} is None but {other} is given: the indexer and its input go "
                                          f"together, give both or neither")
    raise ArgumentValueError("indexer_out", "indexer_out is given without indexer=")


cdef inline int64_t _begin(dsa_c4_params* p, int kind, main, kv_score, Arg* kv, indexer, indexer_kv_score,
                           indexer_out, list keep) except -1:
    """The call's compressors and main's input: main a C4Compressor, the indexer and its input given together
    (indexer_out only with them), kv_score (drafts for a verify) fp32 [rows, 4D] on main's device, read into `kv`
    (main's side takes it from there); its rows."""
    memset(p, 0, sizeof(dsa_c4_params))
    p.struct_size = sizeof(dsa_c4_params)
    if (type(main) is not C4Compressor or (indexer is None) != (indexer_kv_score is None)
            or (indexer is None and indexer_out is not None)):
        return _refuse_compressors(kind, main, indexer, indexer_kv_score, indexer_out)
    p.device = (<C4Compressor>main).dev
    tensor(kv_score, kv, "kv_score" if kind != VERIFY else "drafts", F32, p.device, 2, ANY,
           4 * (<C4Compressor>main).head_dim, keep)
    return kv.shape[0]


cdef int _refuse_cache_slots(bint stored) except -1:
    """Cold: the error naming cache_slots, given when no compressor has a store (`stored` false) or missing
    when one has (kept apart so that _sides stays small enough to inline)."""
    if stored:
        raise ArgumentValueError("cache_slots", "cache_slots is None but a compressor has a store: give an int64 "
                                                "tensor with one cache slot per row")
    raise ArgumentValueError("cache_slots", "cache_slots is given but neither compressor has a store")


cdef inline int _sides(dsa_c4_params* p, int kind, main, kv_score, const Arg* kv, out, indexer, indexer_kv_score,
                       indexer_out, cache_slots, int64_t rows, int64_t out_rows, list keep) except -1:
    """Both sides of the call (main's, its input `kv` as _begin read it, and the indexer's when given) over `rows`
    input rows and `out_rows` output rows, and the cache slots every stored row takes (given exactly when a
    compressor has a store)."""
    cdef Arg cs
    # where each size comes from, for the messages of a size that disagrees (plain literals: no work per call)
    rows_of = "the rows of drafts" if kind == VERIFY else "the rows of kv_score"
    out_rows_of = "the rows of plan[0], one per compress record" if kind == EXTEND else rows_of
    _side(p, k=0, comp_=main, name="main", kv_score=kv_score, input=kv,
          kv_name="kv_score" if kind != VERIFY else "drafts", out=out, out_name="out", rows=rows, out_rows=out_rows,
          keep=keep, rows_of=rows_of, out_rows_of=out_rows_of, p_main=main)
    p.num_compressors = 1
    if indexer is not None:
        _side(p, k=1, comp_=indexer, name="indexer", kv_score=indexer_kv_score, input=NULL,
              kv_name="indexer_kv_score" if kind != VERIFY else "indexer_drafts", out=indexer_out,
              out_name="indexer_out", rows=rows, out_rows=out_rows, keep=keep, rows_of=rows_of,
              out_rows_of=out_rows_of, p_main=main)
        p.num_compressors = 2
    cdef bint stored = p.compressors[0].store != NULL or (indexer is not None and p.compressors[1].store != NULL)
    if stored != (cache_slots is not None):
        return _refuse_cache_slots(stored)
    if stored:
        vector(cache_slots, &cs, "cache_slots", I64, p.device, rows, keep, "one cache slot per row of kv_score")
        cache_apart((<C4Compressor>main).store, cs.data, rows * 8, "main.store.cache", "cache_slots")
        cache_apart(indexer and (<C4Compressor>indexer).store, cs.data, rows * 8, "indexer.store.cache", "cache_slots")
        p.cache_slots = <const int64_t*>cs.data
    return 0


cdef inline int _end(dsa_c4_params* p, uint32_t flags, error_count, list keep) except -1:
    """The call's launch flags and error counter."""
    cdef uint32_t* errors
    error_counter(error_count, p.device, &errors, keep)
    p.flags = flags
    p.error_count = errors
    return 0


cdef int _decode(dsa_c4_params* p, main, kv_score, indexer, indexer_kv_score, records, seq_lens, slots, ring_size,
                 out, indexer_out, cache_slots, pdl, error_count, list keep, records_ahead=False) except -1:
    """The decode's one fill: judges every argument (a wrong one raises, naming it) and fills the params at `p`,
    appending to `keep` (a prepared call's, or None) what they point into."""
    cdef Arg kv, rc, sl, sx
    cdef uint32_t flags = pdl_flag(pdl)
    if records_ahead_argument(records_ahead, records):
        flags |= DSA_FLAG_RECORDS_AHEAD
    cdef int64_t rows = _begin(p, kind=DECODE, main=main, kv_score=kv_score, kv=&kv, indexer=indexer,
                               indexer_kv_score=indexer_kv_score, indexer_out=indexer_out, keep=keep)
    if records is None:
        if seq_lens is None or slots is None:
            missing = "seq_lens" if seq_lens is None else "slots"
            raise ArgumentValueError(missing, f"{missing} is None: c4_decode needs records= (uint8 [B, 16]) or "
                                              f"seq_lens= and slots= over main's request-scoped ring")
        p.ring_size = _request_ring(main, ring_size, "c4_decode")
    elif seq_lens is not None or slots is not None:
        raise ArgumentValueError("records", "records= and seq_lens=/slots= are two ways to give the rows: pass one")
    elif ring_size is not None:
        raise ArgumentValueError("ring_size", "ring_size is given with records=: records carry their ring rows")
    _sides(p, kind=DECODE, main=main, kv_score=kv_score, kv=&kv, out=out, indexer=indexer,
           indexer_kv_score=indexer_kv_score, indexer_out=indexer_out, cache_slots=cache_slots, rows=rows,
           out_rows=rows, keep=keep)
    p.batch_size = rows
    if records is not None:
        tensor(records, &rc, "records", U8, p.device, 2, rows, 16, keep)
        p.decode_records = rc.data
    else:
        vector(seq_lens, &sl, "seq_lens", I32, p.device, rows, keep, "B: the rows of kv_score")
        vector(slots, &sx, "slots", I32, p.device, rows, keep, "B: the rows of kv_score")
        distinct_slots(&sl, &sx, rows, 1)
        p.seq_lens = <const int32_t*>sl.data
        p.slots = <const int32_t*>sx.data
    return _end(p, flags, error_count, keep)


cdef int _extend(dsa_c4_params* p, main, kv_score, plan, indexer, indexer_kv_score, out, indexer_out, cache_slots,
                 pdl, error_count) except -1:
    """The extend's one fill: judges every argument (a wrong one raises, naming it) and fills the params at `p`."""
    cdef Arg kv, rc, wr
    try:
        compress, write = plan
    except (TypeError, ValueError):
        raise ArgumentTypeError("plan", f"plan must be a pair (compress uint8 [C, 16], write uint8 [W, 8]) (got "
                                        f"{type(plan).__name__})") from None
    if type(main) is C4Compressor:
        plan_geometry(plan, 4, "main", (<C4Compressor>main).ring_size, (<C4Compressor>main).num_slots, kv_score)
    # numpy records are pyplan's host plan: checked by the library before anything runs (one that does not
    # fit fails the call, naming it); record tensors are data, skipped and counted
    cdef uint32_t flags = pdl_flag(pdl) | (DSA_FLAG_HOST_PLAN if is_ndarray(compress) and is_ndarray(write) else 0)
    cdef int64_t rows = _begin(p, kind=EXTEND, main=main, kv_score=kv_score, kv=&kv, indexer=indexer,
                               indexer_kv_score=indexer_kv_score, indexer_out=indexer_out, keep=None)
    tensor(compress, &rc, "plan[0]", U8, p.device, 2, ANY, 16, None)
    tensor(write, &wr, "plan[1]", U8, p.device, 2, ANY, 8, None)
    p.compress = rc.data
    p.write = wr.data
    p.num_compress = rc.shape[0]
    p.num_write = wr.shape[0]
    if rows == 0 and (p.num_compress or p.num_write):
        raise ArgumentValueError("kv_score", f"kv_score has no rows but the plan holds {p.num_compress} compress and "
                                             f"{p.num_write} write records, each reading an input row")
    p.num_tokens = rows
    _sides(p, kind=EXTEND, main=main, kv_score=kv_score, kv=&kv, out=out, indexer=indexer,
           indexer_kv_score=indexer_kv_score, indexer_out=indexer_out, cache_slots=cache_slots, rows=rows,
           out_rows=p.num_compress, keep=None)
    return _end(p, flags, error_count, None)


cdef int _verify(dsa_c4_params* p, main, drafts, seq_lens, slots, num_drafts, ring_size, indexer, indexer_drafts,
                 out, indexer_out, cache_slots, reject_all, pdl, error_count) except -1:
    """The verify's one fill: judges every argument (a wrong one raises, naming it) and fills the params at `p`."""
    cdef Arg kv, sl, sx
    cdef int64_t b
    bool_argument(reject_all, "reject_all")
    cdef uint32_t flags = pdl_flag(pdl) | (DSA_FLAG_C4_REJECT_ALL if reject_all else 0)
    cdef int64_t rows = _begin(p, kind=VERIFY, main=main, kv_score=drafts, kv=&kv, indexer=indexer,
                               indexer_kv_score=indexer_drafts, indexer_out=indexer_out, keep=None)
    int_arg(num_drafts, "num_drafts", 1, 16, "")
    p.num_drafts = num_drafts
    p.ring_size = _request_ring(main, ring_size, "c4_verify")
    # seq_lens' rows are the batch the drafts' rows must fill; read and judged once, and the drafts held to it
    # before the arguments sized by the drafts (out, cache_slots) are, so a short drafts is named, not its out
    read(seq_lens, &sl, "seq_lens", None)
    judge(seq_lens, &sl, name="seq_lens", dtype=I32, dev=p.device, ndim=1, d0=ANY, d1=ANY)
    b = sl.shape[0]
    if rows != b * p.num_drafts:
        raise ArgumentValueError("drafts", f"drafts has {rows} rows; expected batch_size * num_drafts = {b} * "
                                           f"{num_drafts} (batch_size: the rows of seq_lens, one committed length per "
                                           f"request)")
    _sides(p, kind=VERIFY, main=main, kv_score=drafts, kv=&kv, out=out, indexer=indexer,
           indexer_kv_score=indexer_drafts, indexer_out=indexer_out, cache_slots=cache_slots, rows=rows,
           out_rows=rows, keep=None)
    vector(slots, &sx, "slots", I32, p.device, b, None)
    distinct_slots(&sl, &sx, b, 0)
    p.batch_size = b
    p.seq_lens = <const int32_t*>sl.data
    p.slots = <const int32_t*>sx.data
    return _end(p, flags, error_count, None)


def c4_decode(main, kv_score, *, indexer=None, indexer_kv_score=None, records=None, seq_lens=None,
              slots=None, ring_size=None, out=None, indexer_out=None, cache_slots=None, stream=None, pdl=None,
              error_count=None, records_ahead=False):
    """One decode step of a c4 layer: kv_score [B, 4D] (and indexer_kv_score [B, 4 * 128]) hold each
    request's new token. Its row goes to the ring; a request whose length (with the token) is a multiple
    of 4 closes an entry: written to out [B, D] (optional) and stored at cache_slots[b] (int64 [B]) into
    each compressor's store, rotary row seq_len - 4. One launch for both compressors.

    Rows: records= (uint8 [B, 16], sglang's decode records: seq_len, write row, previous and current
    group; seq_len 0 is padding), or seq_lens= (int32 [B], with the new token; <= 0 padding) and slots=
    (int32 [B]; negative: not held here; live slots distinct) over main's request-scoped ring (made with
    ring_size=; a ring_size= given here must agree). B = 0 does nothing.

    records_ahead=True (with records=): the caller's promise that the records and cache_slots were written
    before the launch ahead of this call on its stream began (a step's plan made before the layer's GEMMs); with
    PDL the kernel then reads them while that launch finishes."""
    cdef dsa_c4_params p
    _decode(&p, main=main, kv_score=kv_score, indexer=indexer, indexer_kv_score=indexer_kv_score, records=records,
            seq_lens=seq_lens, slots=slots, ring_size=ring_size, out=out, indexer_out=indexer_out,
            cache_slots=cache_slots, pdl=pdl, error_count=error_count, keep=None, records_ahead=records_ahead)
    _launch(&p, DECODE, stream)


cdef class C4Decode(Prepared):
    """A c4 decode with its arguments checked once (c4_decode's but the stream: CUDA-graph replay, or a step loop
    over fixed buffers): launch() runs it again on the same tensors, whatever they hold then."""

    __signature__ = prepared_signature(c4_decode)

    def __init__(self, main, kv_score, *, indexer=None, indexer_kv_score=None, records=None, seq_lens=None,
                 slots=None, ring_size=None, out=None, indexer_out=None, cache_slots=None, pdl=None,
                 error_count=None, records_ahead=False):
        cdef dsa_c4_params* p = <dsa_c4_params*>self.room(OP_C4_DECODE)
        _decode(p, main=main, kv_score=kv_score, indexer=indexer, indexer_kv_score=indexer_kv_score, records=records,
                seq_lens=seq_lens, slots=slots, ring_size=ring_size, out=out, indexer_out=indexer_out,
                cache_slots=cache_slots, pdl=pdl, error_count=error_count, keep=self.keep, records_ahead=records_ahead)
        self.bound(p.device)


def c4_extend(main, kv_score, plan, *, indexer=None, indexer_kv_score=None, out=None, indexer_out=None,
              cache_slots=None, stream=None, pdl=None, error_count=None):
    """New tokens of a c4 layer at ragged rows of kv_score [N, 4D] (N <= 65536): plan = (compress uint8
    [C, 16], write uint8 [W, 8]) on the op's device (sglang's records, or pyplan.plan_c4's, whose plan
    carries the ring it was made for: it must be main's, and N its num_tokens). Compress
    record i closes an entry: out [C, D] row i (optional) and stored at cache_slots[its ragged row]
    (int64 [N]); then each write record copies its input row into the ring."""
    cdef dsa_c4_params p
    _extend(&p, main=main, kv_score=kv_score, plan=plan, indexer=indexer, indexer_kv_score=indexer_kv_score, out=out,
            indexer_out=indexer_out, cache_slots=cache_slots, pdl=pdl, error_count=error_count)
    _launch(&p, EXTEND, stream)


def c4_verify(main, drafts, seq_lens, slots, *, num_drafts, ring_size=None, indexer=None, indexer_drafts=None,
              out=None, indexer_out=None, cache_slots=None, reject_all=False, stream=None, pdl=None,
              error_count=None):
    """V = num_drafts drafts per request over main's request-scoped ring (C4Compressor(..., ring_size=R); a
    ring_size= given here must agree): drafts [B * V, 4D], draft j of request b at row b * V + j, at
    position seq_lens[b] + j (seq_lens int32 [B]: committed length; < 0 padding; slots int32 [B], live ones
    distinct). Entries the drafts close go to out [B * V, D] at the closing draft's row and are stored at
    cache_slots[that row]; every draft's row is written to the ring. No commit: the next decode or extend
    starts at the first rejected position and overwrites the rejected rows. V is at most
    c4_max_drafts(main.ring_size, reject_all=...); a larger V is refused, naming the bound."""
    cdef dsa_c4_params p
    _verify(&p, main=main, drafts=drafts, seq_lens=seq_lens, slots=slots, num_drafts=num_drafts, ring_size=ring_size,
            indexer=indexer, indexer_drafts=indexer_drafts, out=out, indexer_out=indexer_out, cache_slots=cache_slots,
            reject_all=reject_all, pdl=pdl, error_count=error_count)
    _launch(&p, VERIFY, stream)


cdef int _launch(const dsa_c4_params* p, int kind, stream) except -1:
    cdef int status = launch(_C4_OPS[kind], p, p.device, stream)
    if status:
        raise_status(status)
    return 0
