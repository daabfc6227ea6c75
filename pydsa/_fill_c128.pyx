# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The c128 decode's and prefill's params, filled from a call's arguments (each judged by the shared
reader, pydsa/_read.pyx, which raises the error naming a wrong one), and launched: on the C stack for
a one-shot call, into the params of its prepared form (C128Decode, C128Prefill: the reader's Prepared);
and a DevicePlan's upload."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uintptr_t

from pydsa._read cimport *
from pydsa._fill_store cimport state_store_apart, store_arg

import numpy as np

import pyplan
from pydsa import _tensors
from pydsa.errors import ArgumentTypeError, ArgumentValueError, bool_argument

cdef extern from "dsa_kernels.h":  # this family's params: the fields this file touches (the header lays them out)
    int DSA_STRUCT_DECODE_PARAMS
    int DSA_STRUCT_PREFILL_PARAMS
    int DSA_STRUCT_PLAN_UPLOAD_PARAMS
    int DSA_FLAG_NO_COOPERATIVE
    ctypedef struct dsa_c128_decode_params:
        int32_t device  # of the head (c128_head in _fill_c128.pxd, written by fill_head)
        void* state
        const float* kv_score
        float* out
        const float* ape
        const int32_t* indices
        const int32_t* seq_lens
        uint32_t* error_count
        int32_t state_dtype
        int32_t reserved
        const int32_t* load_indices
        const void* store
        const int64_t* cache_slots
    ctypedef struct dsa_c128_prefill_params:
        int32_t device  # of the head (c128_head in _fill_c128.pxd, written by fill_head)
        int64_t num_tokens
        void* state
        const float* kv_score
        float* out
        const float* ape
        const int32_t* indices
        const int32_t* load_indices
        const dsa_segment* compress
        const dsa_segment* write
        int64_t compress_capacity
        int64_t write_capacity
        const int64_t* counts
        uint32_t* error_count
        int32_t state_dtype
        int32_t out_layout
        const void* store
        const int64_t* cache_slots
    ctypedef struct dsa_plan_upload_params:
        uint32_t struct_size
        int32_t device
        const dsa_segment* compress
        const dsa_segment* write
        int64_t num_compress
        int64_t num_write
        dsa_segment* device_compress
        dsa_segment* device_write
        int64_t compress_capacity
        int64_t write_capacity
        int64_t* device_counts

cdef int OP_DECODE = declare_op("decode", "dsa_c128_decode", DSA_STRUCT_DECODE_PARAMS, sizeof(dsa_c128_decode_params))
cdef int OP_PREFILL = declare_op("prefill", "dsa_c128_prefill", DSA_STRUCT_PREFILL_PARAMS,
                                 sizeof(dsa_c128_prefill_params))
cdef int OP_UPLOAD = declare_op("upload", "dsa_c128_upload_plan", DSA_STRUCT_PLAN_UPLOAD_PARAMS,
                                sizeof(dsa_plan_upload_params))



# ---- decode -----------------------------------------------------------------------------------

def c128_decode(state, kv_score, out, ape, indices, seq_lens, *, load_indices=None, store=None, cache_slots=None,
                stream=None, pdl=None, error_count=None):
    """One new token per request (docs/spec.md, decode). state [S,1,3D] f32 or bf16, kv_score [B,2D] f32,
    out [B,D] f32 (rows of requests that close a chunk are written), ape [128,D] f32, indices [B]
    int32 (one slot per live row: two rows updating one slot race on the GPU), seq_lens [B] int32
    (<= 0: padding); or, with seq_lens None, `indices` holds one 16-byte record per request, int32
    [B, 4] or uint8 [B, 16]: {seq_len, slot, load slot, unused} (sglang 0.5.23's decode plan records,
    read in place). load_indices [B] int32: the slot each request's state is read from (e.g. the
    accepted bank entry that c128_commit resolved; negative: not held on this GPU, skipped); the
    new state is stored into `indices`. Default: `indices`. store: a pydsa.KVCache that every closed
    vector is also stored into, at cache_slots[b] (int64 [B]); `out` may then be None. pdl: None
    launches with programmatic dependent launch where every compiled architecture supports it."""
    cdef dsa_c128_decode_params p
    _decode(&p, state=state, kv_score=kv_score, out=out, ape=ape, indices=indices, seq_lens=seq_lens,
            load_indices=load_indices, store=store, cache_slots=cache_slots, pdl=pdl, error_count=error_count,
            keep=None)
    cdef int status = launch(OP_DECODE, &p, p.device, stream)
    if status:
        raise_status(status)


cdef class C128Decode(Prepared):
    """A validated decode call over fixed buffers (c128_decode's arguments but the stream); launch() re-runs it
    (e.g. for CUDA-graph capture or replay) with no re-validation. Contents of the buffers may change between
    launches."""

    __signature__ = prepared_signature(c128_decode)

    def __init__(self, state, kv_score, out, ape, indices, seq_lens, *, load_indices=None, store=None,
                 cache_slots=None, pdl=None, error_count=None):
        cdef dsa_c128_decode_params* p = <dsa_c128_decode_params*>self.room(OP_DECODE)
        _decode(p, state=state, kv_score=kv_score, out=out, ape=ape, indices=indices, seq_lens=seq_lens,
                load_indices=load_indices, store=store, cache_slots=cache_slots, pdl=pdl, error_count=error_count,
                keep=self.keep)
        self.bound(p.device)


cdef int _decode(dsa_c128_decode_params* p, state, kv_score, out, ape, indices, seq_lens, load_indices, store,
                 cache_slots, pdl, error_count, list keep) except -1:
    """The decode's one fill: judges every argument (a wrong one raises, naming it) and fills the params at `p`,
    appending to `keep` (a prepared call's, or None) what they point into."""
    cdef Arg st, kv, o, ap, ix, sl, lx
    cdef int32_t sdt
    cdef uint32_t* errors
    cdef const void* store_address
    cdef const int64_t* slots
    cdef uint32_t flags = pdl_flag(pdl)
    state_arg(state, &st, &sdt, "state", keep)
    cdef int32_t dev = st.dev
    cdef int64_t d = st.shape[2] // 3
    tensor(kv_score, &kv, "kv_score", F32, dev, 2, ANY, 2 * d, keep)
    cdef int64_t b = kv.shape[0]
    store_arg(store, cache_slots, dev, d, b, &store_address, &slots, keep)
    o.data = NULL
    if not (out is None and store is not None):
        tensor(out, &o, "out", F32, dev, 2, b, d, keep, "B: the rows of kv_score")
        disjoint(&o, b * d * 4, "out", &kv, b * 2 * d * 4, "kv_score")
    tensor(ape, &ap, "ape", F32, dev, 2, DSA_CHUNK, d, keep)
    state_store_apart(store, &st, sdt, kv=&kv, kv_rows=b, ap=&ap, o=&o, out_rows=b, d=d)
    lx.data = NULL
    sl.data = NULL
    if seq_lens is None:  # indices: one 16-byte record per request (int32 [B, 4] or uint8 [B, 16])
        if load_indices is not None:
            raise ArgumentValueError("load_indices", "load_indices must be None when seq_lens is None (the records in `indices` carry the "
                             "load slots)")
        read(indices, &ix, "indices", keep)
        if ix.ndim != 2:
            raise ArgumentTypeError("seq_lens", f"seq_lens must be an int32 [{b}] tensor; it may be None only when indices holds one "
                            f"record per request (int32 [B, 4] or uint8 [B, 16]), got indices of shape "
                            f"{[ix.shape[i] for i in range(ix.ndim)]}")
        if ix.dtype == U8:  # read above: judged here
            judge(indices, &ix, "indices", U8, dev, 2, b, 16, "B: the rows of kv_score")
        else:
            judge(indices, &ix, "indices (records: int32 [B, 4] or uint8 [B, 16])", I32, dev, 2, b, 4, "B: the rows of kv_score")
        flags |= DSA_FLAG_DECODE_RECORDS
    else:
        vector(indices, &ix, "indices", I32, dev, b, keep, "B: the rows of kv_score")
        vector(seq_lens, &sl, "seq_lens", I32, dev, b, keep, "B: the rows of kv_score")
        optional_vector(load_indices, &lx, "load_indices", dev, b, keep, "B: the rows of kv_score")
    error_counter(error_count, dev, &errors, keep)
    fill_head(p, struct_size=sizeof(dsa_c128_decode_params), flags=flags, device=dev, head_dim=d,
              num_slots=st.shape[0], batch_size=b)
    p.state = st.data
    p.kv_score = <const float*>kv.data
    p.out = <float*>o.data
    p.ape = <const float*>ap.data
    p.indices = <const int32_t*>ix.data
    p.seq_lens = <const int32_t*>sl.data
    p.error_count = errors
    p.state_dtype = sdt
    p.reserved = 0
    p.load_indices = <const int32_t*>lx.data
    p.store = store_address
    p.cache_slots = slots
    return 0


# ---- prefill ----------------------------------------------------------------------------------

cdef int _plan(object plan, int32_t dev, uint32_t* flags, uintptr_t* cp, int64_t* nc, uintptr_t* wp, int64_t* nw,
               uintptr_t* counts, list keep) except -1:
    """The plan: pyplan's record arrays (read from host memory during the call), uint8 [M, 16] record
    tensors (on the op's device or in host memory), or a DevicePlan."""
    cdef Arg pc, pw
    counts[0] = 0
    if type(plan) is list and len(<list>plan) == 2:
        plan = tuple(plan)
    if keep is not None:
        keep.append(plan)
    if type(plan) is tuple and len(<tuple>plan) == 2:
        compress, write = <tuple>plan
        if is_ndarray(compress):
            cp[0], nc[0], wp[0], nw[0] = record_lists(compress, write)  # raises for arrays that are not
            flags[0] |= DSA_FLAG_HOST_PLAN
            return 0
        read(compress, &pc, "plan[0] (compress)", keep)
        where = pc.dev if pc.dev == -1 else dev
        if pc.dev != dev and pc.dev != -1:
            raise ArgumentValueError("plan", f"plan tensors are on {compress.device} but the other tensors are on "
                             f"{_device(dev)}")
        judge(compress, &pc, "plan[0] (compress)", U8, where, 2, ANY, ANY)  # read above
        tensor(write, &pw, "plan[1] (write)", U8, where, 2, ANY, ANY, keep)
        if pc.shape[1] != 16 or pw.shape[1] != 16:
            raise ArgumentValueError("plan", f"plan tensors must have shape [M, 16] (got {[pc.shape[0], pc.shape[1]]} and "
                             f"{[pw.shape[0], pw.shape[1]]})")
        cp[0], nc[0], wp[0], nw[0] = <uintptr_t>pc.data, pc.shape[0], <uintptr_t>pw.data, pw.shape[0]
        if where == -1:
            flags[0] |= DSA_FLAG_HOST_PLAN
        return 0
    cdef DevicePlan dp
    if type(plan) is DevicePlan:
        dp = <DevicePlan>plan
        cp[0], nc[0], wp[0], nw[0], counts[0] = dp.compress_ptr, dp.compress_capacity, dp.write_ptr, dp.write_capacity, dp.counts_ptr
        if dp.dev != dev:
            raise ArgumentValueError("plan", f"plan is a DevicePlan on {plan.device} but the tensors are on {_device(dev)}")
        return 0
    raise ArgumentTypeError("plan", "plan must be a (compress, write) pair from pyplan.plan_prefill (or of uint8 [M, 16] "
                    "record tensors) or a DevicePlan")


cdef object _device(int32_t dev):
    return "cpu" if dev < 0 else f"cuda:{dev}"


def c128_prefill(state, kv_score, out, ape, indices, plan, *, load_indices=None, compact=False, store=None,
                 cache_slots=None, stream=None, pdl=None, error_count=None, cooperative=True):
    """Many new tokens per request (docs/spec.md, prefill). kv_score [N,2D] ragged; indices / load_indices [B]
    int32 (requests that store a trailing partial need distinct `indices`: stores into one slot
    race on the GPU); plan from pyplan.plan_prefill (read from host memory during the call) or a DevicePlan.
    out: [N,D] with each chunk's vector at its closing ragged row, or with compact=True [C,D] with
    row i for compress record i (C = the plan's compress capacity; docs/spec.md, the state, output layouts).
    cooperative=False: never the one cooperative launch a small eager pyplan plan takes, always
    ordinary launches (for engines that run kernels on other streams alongside: a cooperative grid
    waits until all its blocks fit; and for device-bound eager steps: the ordinary launches cost
    more host time but, for plans of many whole chunks, less device time).
    store / cache_slots (int64 [N], the slot of the vector a ragged row closes): store every closed
    vector into a pydsa.KVCache as well, in the same call (on the GPU by a store launch behind the
    prefill's own, reading the vectors from out); `out` may then be None (the call then takes out rows
    of its own from torch's allocator)."""
    cdef dsa_c128_prefill_params p
    own = _prefill(&p, state=state, kv_score=kv_score, out=out, ape=ape, indices=indices, plan=plan,
                   load_indices=load_indices, compact=compact, store=store, cache_slots=cache_slots, pdl=pdl,
                   error_count=error_count, cooperative=cooperative, keep=None)
    cdef int status = launch(OP_PREFILL, &p, p.device, stream)
    if own is not None:  # the call's own out rows: released behind its launch (stream-ordered on its stream)
        _tensors.keep_for_stream(own, stream)
    del own
    if status:
        raise_status(status)


cdef class C128Prefill(Prepared):
    """A validated prefill call over fixed buffers (c128_prefill's arguments but the stream; docs/spec.md,
    prefill); launch() re-runs it.

    `plan` is a (compress, write) pair of SEGMENT_DTYPE record arrays from pyplan.plan_prefill,
    read from host memory at every launch (re-plan into the same arrays with plan_prefill(...,
    out=...) and launch again), or a DevicePlan (read in place on the device: re-plan, then launch
    or replay a graph that captured this call)."""

    __signature__ = prepared_signature(c128_prefill)

    def __init__(self, state, kv_score, out, ape, indices, plan, *, load_indices=None, compact=False, store=None,
                 cache_slots=None, pdl=None, error_count=None, cooperative=True):
        cdef dsa_c128_prefill_params* p = <dsa_c128_prefill_params*>self.room(OP_PREFILL)
        _prefill(p, state=state, kv_score=kv_score, out=out, ape=ape, indices=indices, plan=plan,
                 load_indices=load_indices, compact=compact, store=store, cache_slots=cache_slots, pdl=pdl,
                 error_count=error_count, cooperative=cooperative, keep=self.keep)
        self.bound(p.device)


cdef object _prefill(dsa_c128_prefill_params* p, state, kv_score, out, ape, indices, plan, load_indices, compact,
                     store, cache_slots, pdl, error_count, cooperative, list keep):
    """The prefill's one fill: judges every argument (a wrong one raises, naming it) and fills the params at `p`,
    appending to `keep` (a prepared call's, or None) what they point into; returns the out rows the call made
    for itself (a storing prefill on the GPU with out None), or None: they must outlive its launch."""
    cdef Arg st, kv, o, ap, ix, lx
    cdef const void* store_address
    cdef const int64_t* slots
    cdef int32_t sdt
    cdef uint32_t* errors
    cdef uintptr_t cp, wp, counts
    cdef int64_t nc, nw
    bool_argument(cooperative, "cooperative")
    cdef uint32_t flags = pdl_flag(pdl) | (0 if cooperative else DSA_FLAG_NO_COOPERATIVE)
    own = None
    bool_argument(compact, "compact")
    state_arg(state, &st, &sdt, "state", keep)
    cdef int32_t dev = st.dev
    cdef int64_t d = st.shape[2] // 3
    tensor(kv_score, &kv, "kv_score", F32, dev, 2, ANY, 2 * d, keep)
    cdef int64_t n = kv.shape[0]
    tensor(indices, &ix, "indices", I32, dev, 1, ANY, ANY, keep)
    cdef int64_t b = ix.shape[0]
    _plan(plan=plan, dev=dev, flags=&flags, cp=&cp, nc=&nc, wp=&wp, nw=&nw, counts=&counts, keep=keep)
    o.data = NULL
    if out is None and store is not None and dev >= 0 and nc > 0:
        # a storing prefill on the GPU passes its vectors through out: compact rows the call owns
        out = own = new_rows(kv_score, nc, d)
        compact = True
        if keep is not None:
            keep.append(own)
    if not (out is None and store is not None):
        tensor(out, &o, "out", F32, dev, 2, nc if compact else n, d, keep,
               "the plan's compress records" if compact else "N: the rows of kv_score")
        disjoint(&o, (nc if compact else n) * d * 4, "out", &kv, n * 2 * d * 4, "kv_score")
    tensor(ape, &ap, "ape", F32, dev, 2, DSA_CHUNK, d, keep)
    optional_vector(load_indices, &lx, "load_indices", dev, b, keep, "B: the length of indices")
    error_counter(error_count, dev, &errors, keep)
    store_arg(store, cache_slots, dev, d, n, &store_address, &slots, keep)
    state_store_apart(store, &st, sdt, kv=&kv, kv_rows=n, ap=&ap, o=&o, out_rows=nc if compact else n, d=d)
    fill_head(p, struct_size=sizeof(dsa_c128_prefill_params), flags=flags, device=dev, head_dim=d,
              num_slots=st.shape[0], batch_size=b)
    p.num_tokens = n
    p.state = st.data
    p.kv_score = <const float*>kv.data
    p.out = <float*>o.data
    p.ape = <const float*>ap.data
    p.indices = <const int32_t*>ix.data
    p.load_indices = <const int32_t*>lx.data
    p.compress = <const dsa_segment*>cp
    p.write = <const dsa_segment*>wp
    p.compress_capacity = nc
    p.write_capacity = nw
    p.counts = <const int64_t*>counts
    p.error_count = errors
    p.state_dtype = sdt
    p.out_layout = DSA_OUT_COMPACT if compact else DSA_OUT_RAGGED
    p.store = store_address
    p.cache_slots = slots
    return own


# ---- DevicePlan: prefill plans in device memory ----------------------------------------------

cdef class DevicePlan:
    """Prefill plans in device memory, for CUDA graphs: the kernels read the records from one
    fixed device buffer.

    Sized once for at most `max_tokens` new tokens and `max_batch` requests. plan() plans on the
    host into arrays of this object, then the library writes the real counts and records into
    the device buffer with a small kernel launch on the caller's stream (the records travel in
    its launch parameters, DSA_UPLOAD_RECORDS per launch). Stream order is the only
    synchronization: a launch or replay queued before plan() reads the previous plan, one
    queued after reads the new one, and plan() never waits, allocates or stages, however far
    ahead of the GPU it runs. The prefill grid is sized from the capacities, so a graph captured
    once stays valid; the kernels' work follows the real counts.
    """

    cdef readonly object device, buffer
    cdef readonly int64_t max_tokens, max_batch, compress_capacity, write_capacity, num_tokens, num_compress, num_write
    cdef readonly uintptr_t counts_ptr, compress_ptr, write_ptr
    cdef int32_t dev
    cdef object host  # (compress, write): the host side of the plan, SEGMENT_DTYPE arrays
    cdef dsa_plan_upload_params upload  # the upload over it, prepared once (plan() sets the counts)

    def __init__(self, max_tokens, max_batch, device="cuda"):
        for name, v, most in (("max_tokens", max_tokens, 0xFFFFFFFE), ("max_batch", max_batch, 0x7FFFFFFF)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
                raise ArgumentValueError(name, f"{name} must be an int in 1..{most} (got {v!r})")
        device = _tensors.resolve_device(device)
        self.device = device
        self.dev = -1 if device.type == "cpu" else device.index
        self.max_tokens = max_tokens
        self.max_batch = max_batch
        self.compress_capacity = pyplan.compress_capacity(self.max_tokens, self.max_batch)
        self.write_capacity = self.max_batch
        self.buffer = _tensors.byte_buffer(16 * (1 + self.compress_capacity + self.write_capacity), device)
        self.counts_ptr = self.buffer.data_ptr()
        self.compress_ptr = self.counts_ptr + 16
        self.write_ptr = self.counts_ptr + 16 * (1 + self.compress_capacity)
        self.num_tokens = self.num_compress = self.num_write = 0
        self.host = (np.empty(self.compress_capacity, pyplan.SEGMENT_DTYPE),
                     np.empty(self.write_capacity, pyplan.SEGMENT_DTYPE))
        cdef dsa_plan_upload_params* p = &self.upload
        p.struct_size = sizeof(dsa_plan_upload_params)
        p.device = self.dev
        p.compress = <const dsa_segment*><uintptr_t>self.host[0].ctypes.data
        p.write = <const dsa_segment*><uintptr_t>self.host[1].ctypes.data
        p.num_compress = p.num_write = 0
        p.device_compress = <dsa_segment*>self.compress_ptr
        p.device_write = <dsa_segment*>self.write_ptr
        p.compress_capacity = self.compress_capacity
        p.write_capacity = self.write_capacity
        p.device_counts = <int64_t*>self.counts_ptr

    def plan(self, seq_lens, extend_lens, *, num_tokens=None, stream=None):
        """Plans on the host and enqueues the upload of the plan on `stream` (raw handle) or the
        current stream."""
        tokens = self.max_tokens if num_tokens is None else num_tokens
        if tokens > self.max_tokens:
            raise ArgumentValueError("num_tokens", f"num_tokens {tokens} exceeds this DevicePlan's max_tokens {self.max_tokens}")
        if len(seq_lens) > self.max_batch:
            raise ArgumentValueError("seq_lens", f"seq_lens: {len(seq_lens)} requests exceed this DevicePlan's max_batch "
                                                 f"{self.max_batch}")
        _, _, nc, nw = pyplan.plan_prefill(seq_lens, extend_lens, num_tokens=tokens, graph=True, out=self.host,
                                           return_counts=True)
        self.upload.num_compress = nc
        self.upload.num_write = nw
        cdef int status = launch(OP_UPLOAD, &self.upload, self.dev, stream)
        if status:
            raise_status(status)
        self.num_tokens, self.num_compress, self.num_write = tokens, nc, nw
        return self

    @property
    def host_records(self):
        """The last plan's records as planned on the host: (compress, write) views of the real ones."""
        return self.host[0][:self.num_compress], self.host[1][:self.num_write]
