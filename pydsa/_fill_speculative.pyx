# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The c128 verify's and commit's params, filled from a call's arguments (each judged by the shared
reader, pydsa/_read.pyx, which raises the error naming a wrong one), and launched: on the C stack for a one-shot
call, into the params of its prepared form (C128Verify, C128Commit: the reader's Prepared)."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uintptr_t
from libc.stdlib cimport malloc, free

from pydsa._read cimport *
from pydsa._fill_c128 cimport fill_head
from pydsa._fill_store cimport state_store_apart, store_arg

from pydsa.errors import ArgumentTypeError, ArgumentValueError, bool_argument

cdef extern from "dsa_kernels.h":  # this family's params: the fields this file touches (the header lays them out)
    int DSA_STRUCT_VERIFY_PARAMS
    int DSA_STRUCT_COMMIT_PARAMS
    int DSA_FLAG_VERIFY_FP32_BETWEEN_DRAFTS
    ctypedef struct dsa_c128_verify_params:
        int32_t device  # of the head (c128_head in _fill_c128.pxd, written by fill_head)
        int32_t num_drafts
        int32_t state_dtype
        void* state
        const float* kv_score
        float* out
        const float* ape
        const int32_t* seq_lens
        const int32_t* verify_lens
        const int32_t* indices
        const int32_t* bank_indices
        int64_t bank_stride
        uint32_t* error_count
        const void* store
        const int64_t* cache_slots
    ctypedef struct dsa_c128_commit_params:
        int32_t device  # of the head (c128_head in _fill_c128.pxd, written by fill_head)
        int32_t num_drafts
        int32_t state_dtype
        const int32_t* seq_lens
        const int32_t* accepted
        const int32_t* verify_lens
        const int32_t* indices
        const int32_t* bank_indices
        int64_t bank_stride
        int32_t* load_indices
        int32_t num_layers
        int32_t reserved
        void* const* states
        uint32_t* error_count

cdef int OP_VERIFY = declare_op("verify", "dsa_c128_verify", DSA_STRUCT_VERIFY_PARAMS, sizeof(dsa_c128_verify_params))
cdef int OP_COMMIT = declare_op("commit", "dsa_c128_commit", DSA_STRUCT_COMMIT_PARAMS, sizeof(dsa_c128_commit_params))


cdef enum:
    MAX_DRAFTS = 16
    STACK_LAYERS = 256  # a one-shot copying commit's layer pointers live on the C stack up to this many


def c128_verify(state, kv_score, out, ape, indices, seq_lens, bank_indices, *, bank_stride=1, verify_lens=None,
                store=None, cache_slots=None, stream=None, pdl=None, error_count=None, round_between_drafts=True):
    """Runs each request's drafts through the decode arithmetic (docs/spec.md, speculative decoding) and stores the state after
    every draft prefix in the bank; main slots are never written.

    state [S,1,3D] f32 or bf16 (the bank is slots of it); kv_score [B*V,2D] f32, draft j of request b
    at row b*V+j (V = rows / B, 1..16); out [B*V,D] f32 or None: a chunk closed by draft j goes to row
    b*V+j, other rows untouched; ape [128,D]; indices [B] int32: slot holding the state after seq
    tokens (read when seq is not a multiple of 128); seq_lens [B] int32: committed length before the
    drafts (< 0: padding; 0: a request with no committed tokens); bank_indices [B] int32: slot of bank
    entry 0, entry j at + j*bank_stride; verify_lens [B] int32: drafts of each request (0..V), default V.
    store: a pydsa.KVCache that the vector a draft closes is stored into, at cache_slots[b*V+j] (int64
    [B*V]); an engine ignores the entries of rejected drafts. Nothing with B == 0 rows.
    round_between_drafts False (bf16 state only): the running state stays fp32 from draft to draft,
    each bank entry rounded once, as sglang 0.5.23 keeps it; by default it is rounded as a decode's
    store rounds it, so a verified token leaves exactly the state a decoded one would."""
    cdef dsa_c128_verify_params p
    if _verify(&p, state=state, kv_score=kv_score, out=out, ape=ape, indices=indices, seq_lens=seq_lens,
               bank_indices=bank_indices, bank_stride=bank_stride, verify_lens=verify_lens, store=store,
               cache_slots=cache_slots, pdl=pdl, error_count=error_count,
               round_between_drafts=round_between_drafts, keep=None):
        return
    cdef int status = launch(OP_VERIFY, &p, p.device, stream)
    if status:
        raise_status(status)


cdef class C128Verify(Prepared):
    """A validated verify over fixed buffers (c128_verify's arguments but the stream); launch() re-runs it
    (CUDA-graph capture or replay)."""

    __signature__ = prepared_signature(c128_verify)

    def __init__(self, state, kv_score, out, ape, indices, seq_lens, bank_indices, *, bank_stride=1,
                 verify_lens=None, store=None, cache_slots=None, pdl=None, error_count=None,
                 round_between_drafts=True):
        cdef dsa_c128_verify_params* p = <dsa_c128_verify_params*>self.room(OP_VERIFY)
        _verify(p, state=state, kv_score=kv_score, out=out, ape=ape, indices=indices, seq_lens=seq_lens,
                bank_indices=bank_indices, bank_stride=bank_stride, verify_lens=verify_lens, store=store,
                cache_slots=cache_slots, pdl=pdl, error_count=error_count,
                round_between_drafts=round_between_drafts, keep=self.keep)
        self.bound(p.device)


cdef int _verify(dsa_c128_verify_params* p, state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride,
                 verify_lens, store, cache_slots, pdl, error_count, round_between_drafts, list keep) except -1:
    """The verify's one fill: judges every argument (a wrong one raises, naming it) and fills the params at `p`,
    appending to `keep` (a prepared call's; None for a one-shot call) what they point into. 1: a one-shot call
    with B = 0, nothing to do (nothing filled)."""
    cdef Arg st, kv, o, ap, ix, sl, bk, vl
    cdef const void* store_address
    cdef const int64_t* slots
    cdef int32_t sdt
    cdef uint32_t* errors
    cdef uint32_t flags = pdl_flag(pdl)
    bool_argument(round_between_drafts, "round_between_drafts")
    state_arg(state, &st, &sdt, "state", keep)
    if not round_between_drafts:
        if sdt != DSA_STATE_BFLOAT16:
            raise ArgumentValueError("round_between_drafts", f"round_between_drafts=False applies to a bf16 state only "
                                     f"(state is {state.dtype}: its running state is fp32 already)")
        flags |= DSA_FLAG_VERIFY_FP32_BETWEEN_DRAFTS
    cdef int32_t dev = st.dev
    cdef int64_t d = st.shape[2] // 3
    tensor(seq_lens, &sl, "seq_lens", I32, dev, 1, ANY, ANY, keep)
    cdef int64_t b = sl.shape[0]
    if b == 0 and keep is None:  # a one-shot call with nothing to do
        return 1
    tensor(kv_score, &kv, "kv_score", F32, dev, 2, ANY, 2 * d, keep)
    cdef int64_t rows = kv.shape[0]
    if b == 0 or rows % b != 0 or not 1 <= rows // b <= MAX_DRAFTS:
        raise ArgumentValueError("kv_score", f"kv_score must have B * V rows with B = seq_lens.shape[0] = {b} and V in 1..{MAX_DRAFTS} "
                         f"(got {rows} rows)")
    cdef int64_t v = rows // b
    o.data = NULL
    if out is not None:
        tensor(out, &o, "out", F32, dev, 2, rows, d, keep, "B * V: the rows of kv_score")
    tensor(ape, &ap, "ape", F32, dev, 2, DSA_CHUNK, d, keep)
    vector(indices, &ix, "indices", I32, dev, b, keep, "B: the length of seq_lens")
    vector(bank_indices, &bk, "bank_indices", I32, dev, b, keep, "B: the length of seq_lens")
    int_arg(bank_stride, "bank_stride", 1, 2**31 - 1, "")
    optional_vector(verify_lens, &vl, "verify_lens", dev, b, keep, "B: the length of seq_lens")
    error_counter(error_count, dev, &errors, keep)
    store_arg(store, cache_slots, dev, d, rows, &store_address, &slots, keep)
    state_store_apart(store, &st, sdt, kv=&kv, kv_rows=rows, ap=&ap, o=&o, out_rows=rows, d=d)
    fill_head(p, struct_size=sizeof(dsa_c128_verify_params), flags=flags, device=dev, head_dim=d,
              num_slots=st.shape[0], batch_size=b)
    p.num_drafts = <int32_t>v
    p.state_dtype = sdt
    p.state = st.data
    p.kv_score = <const float*>kv.data
    p.out = <float*>o.data
    p.ape = <const float*>ap.data
    p.seq_lens = <const int32_t*>sl.data
    p.verify_lens = <const int32_t*>vl.data
    p.indices = <const int32_t*>ix.data
    p.bank_indices = <const int32_t*>bk.data
    p.bank_stride = <int64_t>bank_stride
    p.error_count = errors
    p.store = store_address
    p.cache_slots = slots
    return 0


def c128_commit(seq_lens, accepted, indices, bank_indices, *, num_drafts, bank_stride=1, verify_lens=None,
                load_indices=None, num_slots=2**31 - 1, states=None, stream=None, pdl=False, error_count=None):
    """Commits the accepted drafts of a verify step (docs/spec.md, speculative decoding), with no host synchronization.

    seq_lens, indices, bank_indices, bank_stride, verify_lens: as given to c128_verify; accepted [B]
    int32: drafts accepted (clamped to 0..v_b). Either load_indices [B] int32 (may be `indices`
    itself): written with the slot holding each request's state after seq + a_b tokens, for every
    layer at once (num_slots: rows of the state buffers, for the range check); or states, a list of
    state buffers alike: the accepted bank entry is copied onto indices[b] in every one, in one
    launch per 64 layers."""
    cdef dsa_c128_commit_params p
    cdef void* stack[STACK_LAYERS]  # a copying commit's layer pointers, on the heap past STACK_LAYERS
    cdef void** table = stack
    cdef int64_t capacity = STACK_LAYERS
    cdef int status
    if (type(states) is list or type(states) is tuple) and len(states) > STACK_LAYERS:
        capacity = len(states)
        table = <void**>malloc(capacity * sizeof(void*))
        if table == NULL:
            raise MemoryError()
    try:
        _commit(&p, layers=table, capacity=capacity, seq_lens=seq_lens, accepted=accepted, indices=indices,
                bank_indices=bank_indices, num_drafts=num_drafts, bank_stride=bank_stride, verify_lens=verify_lens,
                load_indices=load_indices, num_slots=num_slots, states=states, pdl=pdl, error_count=error_count,
                keep=None)
        status = launch(OP_COMMIT, &p, p.device, stream)
    finally:
        if table != stack:
            free(table)
    if status:
        raise_status(status)


cdef class C128Commit(Prepared):
    """A validated commit over fixed buffers (c128_commit's arguments but the stream); launch() re-runs it,
    e.g. inside the CUDA graph of a speculative step."""

    __signature__ = prepared_signature(c128_commit)

    def __init__(self, seq_lens, accepted, indices, bank_indices, *, num_drafts, bank_stride=1, verify_lens=None,
                 load_indices=None, num_slots=2**31 - 1, states=None, pdl=False, error_count=None):
        cdef dsa_c128_commit_params* p = <dsa_c128_commit_params*>self.room(OP_COMMIT)
        cdef int64_t n = len(states) if isinstance(states, (list, tuple)) else 0
        layers = bytearray(max(1, n) * sizeof(void*))  # a copying commit's layer pointers, alive with the call
        self.keep.append(layers)
        _commit(p, layers=<void**><char*>layers, capacity=n, seq_lens=seq_lens, accepted=accepted, indices=indices,
                bank_indices=bank_indices, num_drafts=num_drafts, bank_stride=bank_stride, verify_lens=verify_lens,
                load_indices=load_indices, num_slots=num_slots, states=states, pdl=pdl, error_count=error_count,
                keep=self.keep)
        self.bound(p.device)


cdef int _commit(dsa_c128_commit_params* p, void** layers, int64_t capacity, seq_lens, accepted, indices,
                 bank_indices, num_drafts, bank_stride, verify_lens, load_indices, num_slots, states, pdl,
                 error_count, list keep) except -1:
    """The commit's one fill, either form: load_indices (the slots to resolve; num_slots bounds them) or states
    (a list of state buffers alike, their pointers written into layers[capacity]). Judges every argument (a
    wrong one raises, naming it) and fills the params at `p`, appending to `keep` (a prepared call's, or None)
    what they point into."""
    cdef Arg sl, ac, ix, bk, ld, vl, st, first
    cdef uint32_t* errors
    cdef int32_t sdt = 0, first_sdt = 0
    cdef int64_t slots = 0, d = 0, layers_n = 0, i
    cdef uint32_t flags = pdl_flag(pdl)
    int_arg(num_drafts, "num_drafts", 1, MAX_DRAFTS, "")
    read(seq_lens, &sl, "seq_lens", keep)
    if sl.ndim != 1:
        raise ArgumentValueError("seq_lens", f"seq_lens must have shape [B] (got {[sl.shape[i] for i in range(sl.ndim)]})")
    cdef int32_t dev = sl.dev
    cdef int64_t b = sl.shape[0]
    judge(seq_lens, &sl, "seq_lens", I32, dev, 1, b, ANY)  # read above
    vector(accepted, &ac, "accepted", I32, dev, b, keep, "B: the length of seq_lens")
    vector(indices, &ix, "indices", I32, dev, b, keep, "B: the length of seq_lens")
    vector(bank_indices, &bk, "bank_indices", I32, dev, b, keep, "B: the length of seq_lens")
    optional_vector(verify_lens, &vl, "verify_lens", dev, b, keep)
    int_arg(bank_stride, "bank_stride", 1, 2**31 - 1, "")
    error_counter(error_count, dev, &errors, keep)
    if (load_indices is None) == (states is None):
        raise ArgumentValueError("load_indices" if load_indices is None else "states",
                                 f"{'load_indices' if load_indices is None else 'states'}: give exactly one of "
                                 f"load_indices (the slots to resolve) and states (the layers to copy)")
    ld.data = NULL
    if states is None:
        vector(load_indices, &ld, "load_indices", I32, dev, b, keep)
        int_arg(num_slots, "num_slots", 1, 2**31 - 1, " with load_indices")
        slots = num_slots
    else:
        if type(states) is not list and type(states) is not tuple:
            raise ArgumentTypeError("states", f"states must be a list of state buffers (got {type(states).__name__})")
        layers_n = len(states)
        if layers_n < 1:
            raise ArgumentValueError("states", "states must hold at least one state buffer")
        if layers_n > capacity:
            raise ArgumentValueError("states", f"states holds {layers_n} buffers but this call has room for {capacity}")
        for i in range(layers_n):
            state_arg(states[i], &st, &sdt, f"states[{i}]", keep)
            if st.dev != dev:
                raise ArgumentValueError("states", f"states[{i}] is on {states[i].device} but seq_lens is on {seq_lens.device}")
            if i == 0:
                slots, d, first_sdt = st.shape[0], st.shape[2] // 3, sdt
            elif st.shape[0] != slots or st.shape[2] != 3 * d or sdt != first_sdt:
                shapes = sorted({str((tuple(t.shape), t.dtype)) for t in states})
                raise ValueError(f"every state buffer in states must have one shape and dtype (got {shapes})")
            layers[i] = st.data  # the call's own table (nothing launches from it after an error)
    fill_head(p, struct_size=sizeof(dsa_c128_commit_params), flags=flags, device=dev, head_dim=d, num_slots=slots,
              batch_size=b)
    p.num_drafts = <int32_t>num_drafts
    p.state_dtype = first_sdt
    p.seq_lens = <const int32_t*>sl.data
    p.accepted = <const int32_t*>ac.data
    p.verify_lens = <const int32_t*>vl.data
    p.indices = <const int32_t*>ix.data
    p.bank_indices = <const int32_t*>bk.data
    p.bank_stride = <int64_t>bank_stride
    p.load_indices = <int32_t*>ld.data
    p.num_layers = <int32_t>layers_n
    p.reserved = 0
    p.states = layers if layers_n > 0 else NULL
    p.error_count = errors
    return 0
