# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The offline c128 ops' params (decode, extend: one layout), filled from a call's arguments (each judged by the
shared reader, pydsa/_read.pyx, which raises the error naming a wrong one), and launched from the C stack."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uintptr_t
from libc.string cimport memset

from pydsa._read cimport *
from pydsa._fill_store cimport cache_apart, ring_store

from pydsa.errors import ArgumentTypeError, ArgumentValueError

cdef extern from "dsa_kernels.h":  # this family's params, as the header lays them out
    int DSA_STRUCT_C128_OFFLINE_PARAMS
    ctypedef struct dsa_c128_offline_params:
        uint32_t struct_size
        uint32_t flags
        int32_t device
        int32_t head_dim
        int32_t ring_dtype
        int32_t ring_size
        void* ring
        int64_t ring_rows
        const float* kv_score
        const float* ape
        float* out
        int64_t batch_size
        int64_t num_tokens
        const void* decode_records
        const void* compress
        const void* write
        int64_t num_compress
        int64_t num_write
        const int32_t* seq_lens
        const int32_t* slots
        const void* store
        const int64_t* cache_slots
        uint32_t* error_count

cdef int OP_DECODE = declare_op("c128_offline_decode", "dsa_c128_offline_decode", DSA_STRUCT_C128_OFFLINE_PARAMS,
                                sizeof(dsa_c128_offline_params))
cdef int OP_EXTEND = declare_op("c128_offline_extend", "dsa_c128_offline_extend", DSA_STRUCT_C128_OFFLINE_PARAMS,
                                sizeof(dsa_c128_offline_params))

cdef enum:
    WINDOW = 128  # rows of a chunk, and of a ring page


cdef class C128Ring:
    """The state of an offline c128 layer, described once: its ring of raw input rows (fp32 or bf16 [rows, 2D],
    rows a multiple of 128 (pages of 128 rows), contiguous, on the host or a CUDA device), its ape (fp32 [128, D] on
    the ring's device) and an optional store (a pydsa.KVCache of layout "v4" on that device). D is 128, 256 or 512.

    ring_size=R (a multiple of 128 dividing the ring's rows; 128 unless given) is the geometry of pydsa's
    request-scoped ring: request slot s owns rows s*R .. s*R+R-1, position p at row s*R + p % R; the decode by
    seq_lens= and slots= and pyplan.plan_c128_offline's extends address it. Records (sglang's) carry their own rows.

    Everything is judged and read when the ring is made (a wrong one raises, naming it); each call then reads only
    its own tensors. They are read-only attributes: a C128Ring stands for these buffers, whatever they hold."""

    cdef readonly object ring, ape, store
    cdef readonly int head_dim, ring_size
    cdef readonly int64_t num_slots
    cdef int32_t dev, ring_dtype
    cdef void* ring_data
    cdef int64_t ring_rows
    cdef const float* ape_data
    cdef const void* store_address
    cdef list views  # DLPack views of arrays of another framework, alive as long as the ring

    def __init__(self, ring, ape, *, store=None, ring_size=WINDOW):
        cdef RawRing r
        cdef list views = []
        raw_ring(ring, ape, 2, WINDOW, WINDOW, "pages of a chunk's rows", &r, views)
        self.store_address = NULL
        if store is not None:
            ring_store(store, &r, 2, WINDOW, "v4", &self.store_address)
        int_arg(ring_size, "ring_size", WINDOW, 2 ** 24, " (rows per request slot, a multiple of 128)")
        if ring_size % WINDOW or r.rows % ring_size:
            raise ArgumentValueError("ring_size", f"ring_size is {ring_size}; expected a multiple of 128 that divides "
                                                  f"the ring's {r.rows} rows (num_slots * ring_size)")
        self.ring, self.ape, self.store, self.head_dim = ring, ape, store, <int>r.head_dim
        self.dev = r.dev
        self.ring_dtype = DSA_STATE_BFLOAT16 if r.dtype == BF16 else DSA_STATE_FLOAT32
        self.ring_data = r.data
        self.ring_rows = r.rows
        self.ape_data = r.ape
        self.views = views
        self.ring_size = ring_size
        self.num_slots = self.ring_rows // ring_size

    def __repr__(self):
        return (f"C128Ring(D={self.head_dim}, ring={tuple(self.ring.shape)} {self.ring.dtype}, ring_size={self.ring_size}, "
                f"num_slots={self.num_slots}, store={self.store!r})")


cdef int _fill(dsa_c128_offline_params* p, bint extend, ring_, kv_score, out, records, write, seq_lens, slots,
               ring_size, cache_slots, uint32_t flags, error_count, list keep) except -1:
    cdef Arg kv, o, rc, wr, sl, sx, cs, held
    cdef uint32_t* errors
    memset(p, 0, sizeof(dsa_c128_offline_params))
    p.struct_size = sizeof(dsa_c128_offline_params)
    if type(ring_) is not C128Ring:
        raise ArgumentTypeError("ring", f"ring must be a pydsa.C128Ring (got {type(ring_).__name__})")
    cdef C128Ring ring = <C128Ring>ring_
    cdef int32_t dev = ring.dev
    cdef int64_t d = ring.head_dim
    tensor(kv_score, &kv, "kv_score", F32, dev, 2, ANY, 2 * d, keep)
    cdef int64_t rows = kv.shape[0], out_rows = rows
    if extend:
        tensor(records, &rc, "plan[0]", U8, dev, 2, ANY, 16, keep)
        tensor(write, &wr, "plan[1]", U8, dev, 2, ANY, 8, keep)
        p.compress, p.write = rc.data, wr.data
        p.num_compress, p.num_write = rc.shape[0], wr.shape[0]
        if rows == 0 and (p.num_compress or p.num_write):
            raise ArgumentValueError("kv_score", f"kv_score has no rows but the plan holds {p.num_compress} compress "
                                                 f"and {p.num_write} write records, each reading an input row")
        p.num_tokens = rows
        out_rows = p.num_compress
    elif records is None:
        if seq_lens is None or slots is None:
            missing = "seq_lens" if seq_lens is None else "slots"
            raise ArgumentValueError(missing, f"{missing} is None: c128_offline_decode needs records= (uint8 [B, 16]) or "
                                              f"seq_lens= and slots= over the ring's request-scoped slots")
        if ring_size is not None and (type(ring_size) is not int or ring_size != ring.ring_size):
            raise ArgumentValueError("ring_size", f"ring_size is {ring_size!r} but the ring has ring_size {ring.ring_size} "
                                                  f"(the ring owns its geometry: leave ring_size out, or pass its own)")
        vector(seq_lens, &sl, "seq_lens", I32, dev, rows, keep, "B: the rows of kv_score")
        vector(slots, &sx, "slots", I32, dev, rows, keep, "B: the rows of kv_score")
        distinct_slots(&sl, &sx, rows, 1)
        p.seq_lens, p.slots = <const int32_t*>sl.data, <const int32_t*>sx.data
    elif seq_lens is not None or slots is not None:
        raise ArgumentValueError("records", "records= and seq_lens=/slots= are two ways to give the rows: pass one")
    elif ring_size is not None:
        raise ArgumentValueError("ring_size", "ring_size is given with records=: records carry their ring rows")
    else:
        tensor(records, &rc, "records", U8, dev, 2, rows, 16, keep, "B: the rows of kv_score")
        p.decode_records = rc.data
    cdef int64_t ring_bytes = ring.ring_rows * 2 * d * (2 if ring.ring_dtype == DSA_STATE_BFLOAT16 else 4)
    apart_from_ring(kv.data, rows * 2 * d * 4, "kv_score", ring.ring_data, ring_bytes, "ring")
    o.data = NULL
    if out is not None:
        rows_of = "the rows of plan[0], one per compress record" if extend else "B: the rows of kv_score"
        tensor(out, &o, "out", F32, dev, 2, out_rows, d, keep, rows_of)
        disjoint(&o, out_rows * d * 4, "out", &kv, rows * 2 * d * 4, "kv_score")
        held.data, held.dev = <char*>ring.ring_data, dev
        disjoint(&o, out_rows * d * 4, "out", &held, ring_bytes, "ring.ring")
        held.data = <char*>ring.ape_data
        disjoint(&o, out_rows * d * 4, "out", &held, WINDOW * d * 4, "ring.ape")
    # the store's cache apart from this call's input and out (its ring and ape: when the ring was described)
    cache_apart(ring.store, kv.data, rows * 2 * d * 4, "ring.store.cache", "kv_score")
    cache_apart(ring.store, o.data, out_rows * d * 4, "ring.store.cache", "out")
    if ring.store_address != NULL:
        if cache_slots is None:
            raise ArgumentValueError("cache_slots", "cache_slots is None but the ring has a store: give an int64 tensor "
                                                    "with one cache slot per row of kv_score")
        vector(cache_slots, &cs, "cache_slots", I64, dev, rows, keep, "one cache slot per row of kv_score")
        cache_apart(ring.store, cs.data, rows * 8, "ring.store.cache", "cache_slots")
        p.cache_slots = <const int64_t*>cs.data
    elif cache_slots is not None:
        raise ArgumentValueError("cache_slots", "cache_slots is given but the ring has no store")
    error_counter(error_count, dev, &errors, keep)
    p.flags, p.device, p.head_dim = flags, dev, <int32_t>d
    p.ring_dtype, p.ring_size, p.ring, p.ring_rows = ring.ring_dtype, ring.ring_size, ring.ring_data, ring.ring_rows
    p.kv_score, p.ape, p.out = <const float*>kv.data, ring.ape_data, <float*>o.data
    p.batch_size = 0 if extend else rows
    p.store = ring.store_address
    p.error_count = errors
    return 0


cdef int _launch(int op, const dsa_c128_offline_params* p, stream) except -1:
    cdef int status = launch(op, p, p.device, stream)
    if status:
        raise_status(status)
    return 0


def c128_offline_decode(ring, kv_score, *, records=None, seq_lens=None, slots=None, ring_size=None, out=None,
                        cache_slots=None, stream=None, pdl=None, error_count=None):
    """One decode step of an offline c128 layer (sglang's default c128 compressor): kv_score [B, 2D] holds each
    request's new token [kv | score]. Its row goes to the ring; a request whose length (with the token) is a
    multiple of 128 closes its chunk: the softmax over the chunk's 128 ring rows (the new one as written: a bf16
    ring rounds it) of score + ape[j] weighting kv, written to out [B, D] (optional) and stored at cache_slots[b]
    (int64 [B]) into the ring's store, rotary row seq_len - 128. One launch.

    Rows: records= (uint8 [B, 16], sglang's decode records: seq_len, write row, unused, the page of 128 rows the
    chunk lives in; seq_len 0 is padding), or seq_lens= (int32 [B], with the new token; <= 0 padding) and slots=
    (int32 [B]; negative: not held here; live slots distinct) over the ring's request-scoped slots (a ring_size=
    given here must be the ring's). Records are data: one outside the ring is skipped and counted in error_count.
    B = 0 does nothing."""
    cdef dsa_c128_offline_params p
    _fill(&p, extend=False, ring_=ring, kv_score=kv_score, out=out, records=records, write=None, seq_lens=seq_lens,
          slots=slots, ring_size=ring_size, cache_slots=cache_slots, flags=pdl_flag(pdl), error_count=error_count,
          keep=None)
    _launch(OP_DECODE, &p, stream)


def c128_offline_extend(ring, kv_score, plan, *, out=None, cache_slots=None, stream=None, pdl=None, error_count=None):
    """New tokens of an offline c128 layer at ragged rows of kv_score [N, 2D] (N <= 65536; prefill, chunked
    prefill, an extend after a cached prefix): plan = (compress uint8 [C, 16], write uint8 [W, 8]) on the ring's
    device, sglang's records or pyplan.plan_c128_offline's (whose plan carries the ring it was made for: it must be
    this ring, and N its num_tokens). Compress record i closes a chunk: window row j from the ring's page when
    j < its ring rows, else from input row ragged - 127 + j; out [C, D] row i (optional) and stored at
    cache_slots[its ragged row] (int64 [N]). Then each write record copies its input row into the ring: every ring
    read of the call comes before any ring write. Numpy records are a host plan, checked before anything runs (one
    that does not fit fails the call, naming it); record tensors are data, skipped and counted."""
    cdef dsa_c128_offline_params p
    try:
        compress, write = plan
    except (TypeError, ValueError):
        raise ArgumentTypeError("plan", f"plan must be a pair (compress uint8 [C, 16], write uint8 [W, 8]) (got "
                                        f"{type(plan).__name__})") from None
    if type(ring) is C128Ring:
        plan_geometry(plan, WINDOW, "ring", (<C128Ring>ring).ring_size, (<C128Ring>ring).num_slots, kv_score)
    host_plan = DSA_FLAG_HOST_PLAN if is_ndarray(compress) and is_ndarray(write) else 0
    _fill(&p, extend=True, ring_=ring, kv_score=kv_score, out=out, records=compress, write=write, seq_lens=None,
          slots=None, ring_size=None, cache_slots=cache_slots, flags=pdl_flag(pdl) | host_plan,
          error_count=error_count, keep=None)
    _launch(OP_EXTEND, &p, stream)
