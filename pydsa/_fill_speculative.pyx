# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The c128 verify's and commit's params, filled from a call's arguments (each judged by the shared
reader, pydsa/_read.pyx, which raises the error naming a wrong one), and launched."""
from libc.stdint cimport int32_t, int64_t, uint32_t, uintptr_t
from libc.stdlib cimport malloc, free

from pydsa._read cimport *

cdef extern from "dsa_kernels.h":  # this family's params, as the header lays them out
    int DSA_STRUCT_VERIFY_PARAMS
    int DSA_STRUCT_COMMIT_PARAMS
    ctypedef struct dsa_c128_verify_params:
        uint32_t struct_size
        uint32_t flags
        int32_t device
        int32_t head_dim
        int64_t num_slots
        int64_t batch_size
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
        uint32_t struct_size
        uint32_t flags
        int32_t device
        int32_t head_dim
        int64_t num_slots
        int64_t batch_size
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


cdef int _fill_verify(dsa_c128_verify_params* p, state_, kv_score, out, ape, indices, seq_lens, bank_indices,
                      object stride, verify_lens, uint32_t flags, error_count, kv_cache, cache_slots,
                      list keep, bint empty_ok) except -1:
    """0 when filled; 1 for B = 0 where `empty_ok` (a one-shot call with nothing to do)."""
    cdef Arg st, kv, o, ap, ix, sl, bk, vl
    cdef const void* store_address
    cdef const int64_t* slots
    cdef int32_t sdt
    cdef uint32_t* errors
    state_arg(state_, &st, &sdt, "state", keep)
    cdef int32_t dev = st.dev
    cdef int64_t d = st.shape[2] // 3
    tensor(seq_lens, &sl, "seq_lens", I32, dev, 1, ANY, ANY, keep)
    cdef int64_t b = sl.shape[0]
    if b == 0 and empty_ok:
        return 1
    tensor(kv_score, &kv, "kv_score", F32, dev, 2, ANY, 2 * d, keep)
    cdef int64_t rows = kv.shape[0]
    if b == 0 or rows % b != 0 or not 1 <= rows // b <= MAX_DRAFTS:
        raise ValueError(f"kv_score must have B * V rows with B = seq_lens.shape[0] = {b} and V in 1..{MAX_DRAFTS} "
                         f"(got {rows} rows)")
    cdef int64_t v = rows // b
    o.data = NULL
    if out is not None:
        tensor(out, &o, "out", F32, dev, 2, rows, d, keep)
    tensor(ape, &ap, "ape", F32, dev, 2, DSA_CHUNK, d, keep)
    vector(indices, &ix, "indices", I32, dev, b, keep)
    vector(bank_indices, &bk, "bank_indices", I32, dev, b, keep)
    int_arg(stride, "bank_stride", 1, 2**31 - 1, "")
    optional_vector(verify_lens, &vl, "verify_lens", dev, b, keep)
    error_counter(error_count, dev, &errors, keep)
    store_arg(kv_cache, cache_slots, dev, d, rows, &store_address, &slots, keep)
    p.struct_size = sizeof(dsa_c128_verify_params)
    p.flags = flags
    p.device = dev
    p.head_dim = <int32_t>d
    p.num_slots = st.shape[0]
    p.batch_size = b
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
    p.bank_stride = <int64_t>stride
    p.error_count = errors
    p.store = store_address
    p.cache_slots = slots
    return 0


def verify(state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride, verify_lens, stream,
           uint32_t flags, error_count, kv_cache, cache_slots):
    """One-shot c128 verify: the library's status (a wrong argument raises, naming it); B = 0 is a no-op."""
    cdef dsa_c128_verify_params p
    if _fill_verify(&p, state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride, verify_lens, flags,
                    error_count, kv_cache, cache_slots, None, True):
        return 0
    return launch(OP_VERIFY, &p, p.device, stream)


def fill_verify(uintptr_t address, state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride,
                verify_lens, uint32_t flags, error_count, kv_cache, cache_slots):
    """Fills the verify params at `address`: (device, the views the params point into)."""
    cdef dsa_c128_verify_params p
    cdef list keep = []
    _fill_verify(&p, state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride, verify_lens, flags,
                 error_count, kv_cache, cache_slots, keep, False)
    (<dsa_c128_verify_params*>address)[0] = p
    return p.device, keep


cdef int _fill_commit(dsa_c128_commit_params* p, void** layers, int64_t capacity, seq_lens, accepted, indices,
                      bank_indices, load_indices, states, object slots_, object drafts_, object stride_, verify_lens,
                      uint32_t flags, error_count, list keep) except -1:
    """Either form: load_indices (the slots to resolve; num_slots bounds them) or states (a list of
    state buffers alike, their pointers written into layers[capacity])."""
    cdef Arg sl, ac, ix, bk, ld, vl, st, first
    cdef uint32_t* errors
    cdef int32_t sdt = 0, first_sdt = 0
    cdef int64_t num_slots = 0, d = 0, layers_n = 0, i
    int_arg(drafts_, "num_drafts", 1, MAX_DRAFTS, "")
    read(seq_lens, &sl, "seq_lens", keep)
    if sl.ndim != 1:
        raise ValueError(f"seq_lens must have shape [B] (got {[sl.shape[i] for i in range(sl.ndim)]})")
    cdef int32_t dev = sl.dev
    cdef int64_t b = sl.shape[0]
    vector(seq_lens, &sl, "seq_lens", I32, dev, b, keep)
    vector(accepted, &ac, "accepted", I32, dev, b, keep)
    vector(indices, &ix, "indices", I32, dev, b, keep)
    vector(bank_indices, &bk, "bank_indices", I32, dev, b, keep)
    optional_vector(verify_lens, &vl, "verify_lens", dev, b, keep)
    int_arg(stride_, "bank_stride", 1, 2**31 - 1, "")
    error_counter(error_count, dev, &errors, keep)
    if (load_indices is None) == (states is None):
        raise ValueError("give exactly one of load_indices (the slots to resolve) and states (the layers to copy)")
    ld.data = NULL
    if states is None:
        vector(load_indices, &ld, "load_indices", I32, dev, b, keep)
        int_arg(slots_, "num_slots", 1, 2**31 - 1, " with load_indices")
        num_slots = slots_
    else:
        if type(states) is not list and type(states) is not tuple:
            raise TypeError(f"states must be a list of state buffers (got {type(states).__name__})")
        layers_n = len(states)
        if layers_n < 1:
            raise ValueError("states must hold at least one state buffer")
        if layers_n > capacity:
            raise ValueError(f"states holds {layers_n} buffers but this call has room for {capacity}")
        for i in range(layers_n):
            state_arg(states[i], &st, &sdt, f"states[{i}]", keep)
            if st.dev != dev:
                raise ValueError(f"states[{i}] is on {states[i].device} but seq_lens is on {seq_lens.device}")
            if i == 0:
                num_slots, d, first_sdt = st.shape[0], st.shape[2] // 3, sdt
            elif st.shape[0] != num_slots or st.shape[2] != 3 * d or sdt != first_sdt:
                shapes = sorted({str((tuple(t.shape), t.dtype)) for t in states})
                raise ValueError(f"every state buffer in states must have one shape and dtype (got {shapes})")
        for i in range(layers_n):  # every layer checked: now written
            state_arg(states[i], &st, &sdt, "states", keep)
            layers[i] = st.data
    p.struct_size = sizeof(dsa_c128_commit_params)
    p.flags = flags
    p.device = dev
    p.head_dim = <int32_t>d
    p.num_slots = num_slots
    p.batch_size = b
    p.num_drafts = <int32_t>drafts_
    p.state_dtype = first_sdt
    p.seq_lens = <const int32_t*>sl.data
    p.accepted = <const int32_t*>ac.data
    p.verify_lens = <const int32_t*>vl.data
    p.indices = <const int32_t*>ix.data
    p.bank_indices = <const int32_t*>bk.data
    p.bank_stride = <int64_t>stride_
    p.load_indices = <int32_t*>ld.data
    p.num_layers = <int32_t>layers_n
    p.reserved = 0
    p.states = layers if layers_n > 0 else NULL
    p.error_count = errors
    return 0


def commit(seq_lens, accepted, indices, bank_indices, load_indices, states, num_slots, num_drafts, bank_stride,
           verify_lens, stream, uint32_t flags, error_count):
    """One-shot c128 commit, either form: the library's status (a wrong argument raises, naming it)."""
    cdef dsa_c128_commit_params p
    cdef void* stack[STACK_LAYERS]
    cdef void** layers = stack
    cdef int64_t capacity = STACK_LAYERS
    if (type(states) is list or type(states) is tuple) and len(states) > STACK_LAYERS:
        capacity = len(states)
        layers = <void**>malloc(capacity * sizeof(void*))
        if layers == NULL:
            raise MemoryError()
    try:
        _fill_commit(&p, layers, capacity, seq_lens, accepted, indices, bank_indices, load_indices, states,
                     num_slots, num_drafts, bank_stride, verify_lens, flags, error_count, None)
        return launch(OP_COMMIT, &p, p.device, stream)
    finally:
        if layers != stack:
            free(layers)


def fill_commit(uintptr_t address, uintptr_t layers, int64_t capacity, seq_lens, accepted, indices, bank_indices,
                load_indices, states, num_slots, num_drafts, bank_stride, verify_lens, uint32_t flags, error_count):
    """Fills the commit params at `address` (a copying commit's layer pointers into `layers`, room for
    `capacity`): (device, the views the params point into)."""
    cdef dsa_c128_commit_params p
    cdef list keep = []
    _fill_commit(&p, <void**>layers, capacity, seq_lens, accepted, indices, bank_indices, load_indices, states,
                 num_slots, num_drafts, bank_stride, verify_lens, flags, error_count, keep)
    (<dsa_c128_commit_params*>address)[0] = p
    return p.device, keep
