# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The one filler of every op's params: read each tensor argument, check it, fill the params on
the C stack (one-shot calls) or into a prepared buffer, and call the library's entry point
directly, on the framework's current stream unless a stream is given.

Tensors are read through the DLPack C exchange API (`type(t).__dlpack_c_exchange_api__`, DLPack
1.3): one C call per tensor (a few tens of ns) instead of five attribute reads through torch's
Python bindings (~0.1 us each). A torch tensor whose type lacks the API (an older torch) is read
through its attributes instead (the slower reader). Every function returns DECLINED without
writing or launching anything when an argument is not a tensor it can read or is not exactly
what the op takes. The op modules then run their checks, which raise the error naming the
argument, and call again with the arguments converted to torch tensors (zero-copy DLPack views of
other arrays): so the checks hold every message, and this module every params layout.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.string cimport memset

cdef extern from "Python.h":
    ctypedef struct PyTypeObject
    PyTypeObject* Py_TYPE(object o)
    void PyErr_Clear()

cdef extern from "dsa_kernels.h":
    int DSA_FLAG_HOST_PLAN
    int DSA_FLAG_DECODE_RECORDS
    int DSA_FLAG_STORE_DECODE_RECORDS
    int DSA_FLAG_STORE_EXTEND_RECORDS
    int DSA_CHUNK
    int DSA_STATE_FLOAT32
    int DSA_STATE_BFLOAT16
    int DSA_OUT_RAGGED
    int DSA_OUT_COMPACT

    ctypedef struct dsa_segment:
        pass

    ctypedef struct dsa_c128_decode_params:
        uint32_t struct_size
        uint32_t flags
        int32_t device
        int32_t head_dim
        int64_t num_slots
        int64_t batch_size
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

    ctypedef struct dsa_c128_prefill_params:
        uint32_t struct_size
        uint32_t flags
        int32_t device
        int32_t head_dim
        int64_t num_slots
        int64_t batch_size
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

    ctypedef struct dsa_metadata_destination:
        pass

    int DSA_SGLANG_DECODE_PLAN
    int DSA_SGLANG_PREFILL_PLAN

    ctypedef struct dsa_sglang_plan_params:
        uint32_t struct_size
        uint32_t flags
        int32_t device
        int32_t kind
        int64_t batch_size
        int64_t state_slot_offset
        const int64_t* req_pool_indices
        int32_t* slots
        int32_t* load_slots
        const int64_t* seq_lens
        uint8_t* plan_d
        int32_t* seq_lens_out
        const dsa_segment* compress
        const dsa_segment* write
        int64_t num_compress
        int64_t num_write
        uint8_t* plan_c
        uint8_t* plan_w
        int64_t compress_rows
        int64_t write_rows
        uint32_t* error_count

    ctypedef struct dsa_metadata_sources:
        const int32_t* cache_seqlens
        const int32_t* cu_seqlens_k
        const int32_t* page_indices
        const int32_t* seqlens_expanded
        const int32_t* dsa_cache_seqlens
        const int32_t* dsa_cu_seqlens_k
        const int32_t* real_page_table
        const int32_t* num_splits
        const int32_t* flashmla_metadata

    ctypedef struct dsa_metadata_copy_params:
        uint32_t struct_size
        uint32_t flags
        int32_t device
        int32_t mode
        int64_t bs
        int64_t page_rows
        int64_t page_width
        int64_t expanded
        int64_t real_cols
        int64_t metadata_size
        dsa_metadata_sources src
        int32_t num_destinations
        int32_t reserved
        const dsa_metadata_destination* destinations


# ---- DLPack 1.3: the tensor view and the C exchange API table (the standard's C layout) --------

cdef struct DLDevice:
    int32_t device_type
    int32_t device_id

cdef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

cdef struct DLTensor:
    void* data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t* shape
    int64_t* strides
    uint64_t byte_offset

ctypedef int (*DLTensorFromPyObject)(void* py_object, DLTensor* out) noexcept
ctypedef int (*CurrentWorkStream)(int32_t device_type, int32_t device_id, void** out) noexcept

cdef struct ExchangeAPI:
    uint32_t major
    uint32_t minor
    void* prev_api
    void* managed_tensor_allocator
    void* managed_tensor_from_py_object_no_sync
    void* managed_tensor_to_py_object_no_sync
    DLTensorFromPyObject dltensor_from_py_object_no_sync
    CurrentWorkStream current_work_stream

cdef enum:
    DL_CPU = 1
    DL_CUDA = 2
    # dtype keys: code | bits << 8 | lanes << 16
    F32 = 2 | (32 << 8) | (1 << 16)
    BF16 = 4 | (16 << 8) | (1 << 16)
    I32 = 0 | (32 << 8) | (1 << 16)
    U8 = 1 | (8 << 8) | (1 << 16)
    I64 = 0 | (64 << 8) | (1 << 16)
    MAX_TYPES = 8
    MAX_DEVICES = 64

DECLINED = -1
"""Returned when nothing was launched or written: the op's checks take the call."""

ctypedef int (*Entry)(const void* params, void* stream) noexcept nogil

cdef Entry _decode_entry = NULL
cdef Entry _prefill_entry = NULL
cdef Entry _metadata_entry = NULL
cdef Entry _upload_entry = NULL
cdef Entry _verify_entry = NULL
cdef Entry _commit_entry = NULL
cdef Entry _store_entry = NULL
cdef Entry _sglang_plan_entry = NULL
cdef const ExchangeAPI* _streams = NULL       # the framework's current_work_stream
cdef PyTypeObject* _types[MAX_TYPES]           # tensor types seen, and their API (NULL: unreadable)
cdef const ExchangeAPI* _apis[MAX_TYPES]
cdef int _num_types = 0
cdef list _type_refs = []                      # keeps the cached type objects alive
cdef uintptr_t _error_counters[MAX_DEVICES + 1]  # default counter per device, [0] = host
cdef object _device_plan_type = None
cdef object _ndarray_type = None
cdef object _record_lists = None
cdef object _tensor_type = None                # the framework's tensor type (the slower reader's)
cdef dict _dtype_keys = {}                     # its dtype objects -> dtype keys (the slower reader)
cdef object _raw_stream = None                 # current raw stream of a device, without the exchange API
cdef bint _attributes_only = False             # tests: read every tensor through the slower reader

available = False
"""True once init() found the exchange API on the framework's tensor type."""


cdef const ExchangeAPI* _table(object tensor_type):
    cap = getattr(tensor_type, "__dlpack_c_exchange_api__", None)
    if cap is None or not PyCapsule_IsValid(cap, b"dlpack_exchange_api"):
        return NULL
    cdef const ExchangeAPI* api = <const ExchangeAPI*>PyCapsule_GetPointer(cap, b"dlpack_exchange_api")
    if api == NULL or api.major != 1 or api.dltensor_from_py_object_no_sync == NULL or api.current_work_stream == NULL:
        return NULL
    return api


def init(tensor_type, dict dtype_keys, raw_stream, uintptr_t decode, uintptr_t prefill, uintptr_t metadata,
         uintptr_t upload, uintptr_t verify, uintptr_t commit, uintptr_t store, uintptr_t sglang_plan, ndarray_type,
         record_lists):
    """Binds the library's entry points (addresses), the framework's tensor type (its dtypes by
    name: float32, bfloat16, int32, int64, uint8; its current-stream reader), and the plan types
    with pyplan's reader of record arrays; sets and returns `available` (the exchange API)."""
    global _decode_entry, _prefill_entry, _metadata_entry, _upload_entry, _verify_entry, _commit_entry, _streams
    global _device_plan_type, _ndarray_type, _record_lists, available, _store_entry, _tensor_type, _dtype_keys
    global _raw_stream, _sglang_plan_entry
    _sglang_plan_entry = <Entry>sglang_plan
    keys = dict(float32=F32, bfloat16=BF16, int32=I32, int64=I64, uint8=U8)
    _dtype_keys = {dtype: keys[name] for name, dtype in dtype_keys.items()}
    _tensor_type = tensor_type
    _raw_stream = raw_stream
    _store_entry = <Entry>store
    _verify_entry = <Entry>verify
    _commit_entry = <Entry>commit
    _decode_entry = <Entry>decode
    _prefill_entry = <Entry>prefill
    _metadata_entry = <Entry>metadata
    _upload_entry = <Entry>upload
    _ndarray_type = ndarray_type
    _record_lists = record_lists
    _streams = _table(tensor_type)
    available = _streams != NULL
    return available


def set_device_plan_type(device_plan_type):
    global _device_plan_type
    _device_plan_type = device_plan_type


def read_attributes_only(bint on):
    """Tests: read every tensor through its attributes (the reader for a torch without the
    exchange API), as an older torch would be read."""
    global _attributes_only
    _attributes_only = on


def struct_sizes():
    """The params layouts this module fills, as compiled from the library's header:
    {dsa_struct_id: size}, checked against the loaded library."""
    return {2: sizeof(dsa_c128_decode_params), 3: sizeof(dsa_c128_prefill_params),
            6: sizeof(dsa_metadata_copy_params), 7: sizeof(dsa_plan_upload_params),
            8: sizeof(dsa_c128_verify_params), 9: sizeof(dsa_c128_commit_params), 11: sizeof(dsa_kv_store_params),
            12: sizeof(dsa_sglang_plan_params)}


def set_error_counter(int dev, uintptr_t address):
    """Registers the default error counter of device `dev` (DSA_DEVICE_HOST = -1 for the host)."""
    if -1 <= dev < MAX_DEVICES:
        _error_counters[dev + 1] = address


cdef const ExchangeAPI* _api_of(object obj):
    cdef PyTypeObject* tp = Py_TYPE(obj)
    cdef int i
    global _num_types
    for i in range(_num_types):
        if _types[i] == tp:
            return _apis[i]
    cdef const ExchangeAPI* api = _table(type(obj))
    if _num_types < MAX_TYPES:
        _type_refs.append(type(obj))
        _types[_num_types] = tp
        _apis[_num_types] = api
        _num_types += 1
    return api


cdef enum:
    MAX_DIMS = 8


cdef struct Arg:
    char* data
    int32_t dev      # CUDA ordinal, -1 host, -2 anything else
    uint32_t dtype
    int32_t ndim
    const int64_t* shape
    bint contiguous
    int64_t dims[MAX_DIMS]  # the shape, when read through attributes


cdef int _read_attributes(object obj, Arg* a) except -2:
    """The slower reader: a framework tensor through its attributes (a torch without the exchange API)."""
    cdef int i, n
    if not isinstance(obj, _tensor_type):
        return -1
    try:
        dtype = _dtype_keys.get(obj.dtype)
        shape = obj.shape
        n = len(shape)
        if dtype is None or n > MAX_DIMS:
            return -1
        for i in range(n):
            a.dims[i] = shape[i]
        kind = obj.device.type
        a.data = <char*><uintptr_t>obj.data_ptr()
        a.dev = obj.get_device() if kind == "cuda" else (-1 if kind == "cpu" else -2)
        a.dtype = dtype
        a.ndim = n
        a.shape = a.dims
        a.contiguous = obj.is_contiguous()
    except Exception:  # a tensor without storage or of another layout: not readable here
        return -1
    return 0


cdef int _read(object obj, Arg* a) except -2:
    """0 and `a` filled for a tensor this path can read; -1 for anything else."""
    cdef const ExchangeAPI* api = NULL if _attributes_only else _api_of(obj)
    cdef DLTensor t
    if api == NULL:
        return _read_attributes(obj, a)
    if api.dltensor_from_py_object_no_sync(<void*>obj, &t) != 0:
        PyErr_Clear()
        return -1
    a.data = <char*>t.data + t.byte_offset
    a.dev = t.device.device_id if t.device.device_type == DL_CUDA else (-1 if t.device.device_type == DL_CPU else -2)
    a.dtype = t.dtype.code | (<uint32_t>t.dtype.bits << 8) | (<uint32_t>t.dtype.lanes << 16)
    a.ndim = t.ndim
    a.shape = t.shape
    # torch's rule: no elements, or unit steps over every dimension longer than one
    a.contiguous = True
    cdef int64_t expect = 1
    cdef int i
    if t.strides != NULL:
        for i in range(t.ndim):
            if t.shape[i] == 0:
                return 0
        for i in range(t.ndim - 1, -1, -1):
            if t.shape[i] != 1:
                if t.strides[i] != expect:
                    a.contiguous = False
                    break
                expect *= t.shape[i]
    return 0


cdef int _tensor(object obj, Arg* a, uint32_t dtype, int32_t dev, int32_t ndim) except -2:
    """0 for a contiguous tensor of `dtype` on `dev` with `ndim` dimensions, else -1."""
    if _read(obj, a) < 0 or a.dtype != dtype or a.dev != dev or a.ndim != ndim or not a.contiguous:
        return -1
    return 0


cdef int _vector(object obj, Arg* a, uint32_t dtype, int32_t dev, int64_t n) except -2:
    if _tensor(obj, a, dtype, dev, 1) < 0 or a.shape[0] != n:
        return -1
    return 0


cdef int _matrix(object obj, Arg* a, uint32_t dtype, int32_t dev, int64_t rows, int64_t cols) except -2:
    if _tensor(obj, a, dtype, dev, 2) < 0 or a.shape[0] != rows or a.shape[1] != cols:
        return -1
    return 0


cdef int _state(object state, Arg* a, int32_t* sdt) except -2:
    """The state [S, 1, 3D] with D a positive multiple of 64, fp32 or bf16."""
    if _read(state, a) < 0 or a.dev == -2 or a.ndim != 3 or not a.contiguous:
        return -1
    if a.shape[1] != 1 or a.shape[2] <= 0 or a.shape[2] % 192 != 0:
        return -1
    if a.dtype == F32:
        sdt[0] = DSA_STATE_FLOAT32
    elif a.dtype == BF16:
        sdt[0] = DSA_STATE_BFLOAT16
    else:
        return -1
    return 0


cdef int _error_counter(object error_count, int32_t dev, uint32_t** out) except -2:
    cdef Arg a
    if error_count is None:
        if dev < -1 or dev >= MAX_DEVICES or _error_counters[dev + 1] == 0:
            return -1
        out[0] = <uint32_t*>_error_counters[dev + 1]
        return 0
    if _vector(error_count, &a, I32, dev, 1) < 0:
        return -1
    out[0] = <uint32_t*>a.data
    return 0


cdef object _store_type = None   # pydsa.KVCache (set_store_type)


def set_store_type(store_type):
    global _store_type
    _store_type = store_type


cdef int _store(object store, object cache_slots, int32_t dev, int64_t d, int64_t rows, const void** address,
                const int64_t** slots) except -2:
    """A call's optional store: the KVCache's descriptor and the int64 cache_slots [rows]; -1 declines."""
    cdef Arg cs
    address[0] = NULL
    slots[0] = NULL
    if store is None:
        return -1 if cache_slots is not None else 0
    if type(store) is not _store_type or store.device != dev or store.head_dim != d:
        return -1
    if _vector(cache_slots, &cs, I64, dev, rows) < 0:
        return -1
    address[0] = <const void*><uintptr_t>store.address
    slots[0] = <const int64_t*>cs.data
    return 0


cdef int _launch(Entry entry, const void* params, int32_t dev, object stream) except -2:
    cdef void* s = NULL
    cdef int status
    if stream is not None:
        s = <void*><uintptr_t>stream
    elif dev >= 0:
        if _streams == NULL or _attributes_only:
            if _raw_stream is None:
                return -1
            s = <void*><uintptr_t>_raw_stream(dev)
        elif _streams.current_work_stream(DL_CUDA, dev, &s) != 0:
            PyErr_Clear()
            return -1
    if dev < 0:  # the host backend computes on this thread: let other Python threads run
        with nogil:
            status = entry(params, s)
        return status
    return entry(params, s)


# ---- c128 decode ----------------------------------------------------------------------------

cdef int _fill_decode(dsa_c128_decode_params* p, state, kv_score, out, ape, indices, seq_lens,
                      uint32_t flags, error_count, load_indices, store=None, cache_slots=None) except -2:
    cdef Arg st, kv, o, ap, ix, sl, lx
    cdef int32_t sdt
    cdef uint32_t* errors
    if _state(state, &st, &sdt) < 0:
        return -1
    cdef int32_t dev = st.dev
    cdef int64_t d = st.shape[2] // 3
    if _tensor(kv_score, &kv, F32, dev, 2) < 0 or kv.shape[1] != 2 * d:
        return -1
    cdef int64_t b = kv.shape[0]
    cdef const void* store_address
    cdef const int64_t* slots
    o.data = NULL
    if ((not (out is None and store is not None) and _matrix(out, &o, F32, dev, b, d) < 0)
            or _matrix(ape, &ap, F32, dev, DSA_CHUNK, d) < 0
            or _error_counter(error_count, dev, &errors) < 0
            or _store(store, cache_slots, dev, d, b, &store_address, &slots) < 0):
        return -1
    lx.data = NULL
    sl.data = NULL
    if seq_lens is None:  # indices: one 16-byte record per request (int32 [B, 4] or uint8 [B, 16])
        if (load_indices is not None or _read(indices, &ix) < 0 or ix.dev != dev or ix.ndim != 2
                or not ix.contiguous or ix.shape[0] != b
                or not ((ix.dtype == I32 and ix.shape[1] == 4) or (ix.dtype == U8 and ix.shape[1] == 16))):
            return -1
        flags |= DSA_FLAG_DECODE_RECORDS
    elif (_vector(indices, &ix, I32, dev, b) < 0 or _vector(seq_lens, &sl, I32, dev, b) < 0
            or (load_indices is not None and _vector(load_indices, &lx, I32, dev, b) < 0)):
        return -1
    p.struct_size = sizeof(dsa_c128_decode_params)
    p.flags = flags
    p.device = dev
    p.head_dim = <int32_t>d
    p.num_slots = st.shape[0]
    p.batch_size = b
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


def decode(state, kv_score, out, ape, indices, seq_lens, stream, uint32_t flags, error_count, load_indices=None,
           store=None, cache_slots=None):
    """One-shot c128 decode: the library's status, or DECLINED."""
    cdef dsa_c128_decode_params p
    if _fill_decode(&p, state, kv_score, out, ape, indices, seq_lens, flags, error_count, load_indices, store,
                    cache_slots) < 0:
        return DECLINED
    return _launch(_decode_entry, &p, p.device, stream)


def fill_decode(uintptr_t address, state, kv_score, out, ape, indices, seq_lens, uint32_t flags, error_count,
                load_indices=None, store=None, cache_slots=None):
    """Fills the decode params at `address`: True, or False with nothing written."""
    cdef dsa_c128_decode_params p
    if _fill_decode(&p, state, kv_score, out, ape, indices, seq_lens, flags, error_count, load_indices, store,
                    cache_slots) < 0:
        return False
    (<dsa_c128_decode_params*>address)[0] = p
    return True


# ---- c128 prefill ---------------------------------------------------------------------------

cdef int _fill_prefill(dsa_c128_prefill_params* p, state, kv_score, out, ape, indices, plan, load_indices,
                       uint32_t flags, error_count, bint compact, store=None, cache_slots=None,
                       list keep=None) except -2:
    cdef Arg st, kv, o, ap, ix, lx, pc, pw
    cdef const void* store_address
    cdef const int64_t* slots
    cdef int32_t sdt
    cdef uint32_t* errors
    cdef uintptr_t cp, wp, counts = 0
    cdef int64_t nc, nw
    if _state(state, &st, &sdt) < 0:
        return -1
    cdef int32_t dev = st.dev
    cdef int64_t d = st.shape[2] // 3
    if _tensor(kv_score, &kv, F32, dev, 2) < 0 or kv.shape[1] != 2 * d:
        return -1
    cdef int64_t n = kv.shape[0]
    if _tensor(indices, &ix, I32, dev, 1) < 0:
        return -1
    cdef int64_t b = ix.shape[0]
    lx.data = NULL
    if load_indices is not None and _vector(load_indices, &lx, I32, dev, b) < 0:
        return -1
    if type(plan) is tuple and len(<tuple>plan) == 2:
        compress, write = <tuple>plan
        if type(compress) is not type(write):
            return -1
        if type(compress) is _ndarray_type:  # pyplan's record arrays, read from host memory during the call
            try:
                cp, nc, wp, nw = _record_lists(compress, write)
            except TypeError:
                return -1
            flags |= DSA_FLAG_HOST_PLAN
        else:  # uint8 [M, 16] record tensors, on the op's device or in host memory
            if (_read(compress, &pc) < 0 or _read(write, &pw) < 0 or pc.dtype != U8 or pw.dtype != U8
                    or pc.dev != pw.dev or (pc.dev != dev and pc.dev != -1) or pc.ndim != 2 or pw.ndim != 2
                    or not pc.contiguous or not pw.contiguous or pc.shape[1] != 16 or pw.shape[1] != 16):
                return -1
            cp, nc, wp, nw = <uintptr_t>pc.data, pc.shape[0], <uintptr_t>pw.data, pw.shape[0]
            if pc.dev == -1:
                flags |= DSA_FLAG_HOST_PLAN
    elif type(plan) is _device_plan_type:
        plan_dev, cp, nc, wp, nw, counts = plan._records
        if plan_dev != dev:
            return -1
    else:
        return -1
    o.data = NULL
    if out is None and store is not None and dev >= 0 and nc > 0:
        # a storing prefill on the GPU passes its vectors through out: compact rows the call owns
        if type(kv_score) is not _tensor_type or keep is None:
            return -1
        out = kv_score.new_empty((nc, d))
        compact = True
        keep.append(out)
    if ((not (out is None and store is not None) and _matrix(out, &o, F32, dev, nc if compact else n, d) < 0)
            or _matrix(ape, &ap, F32, dev, DSA_CHUNK, d) < 0 or _error_counter(error_count, dev, &errors) < 0
            or _store(store, cache_slots, dev, d, n, &store_address, &slots) < 0):
        return -1
    p.struct_size = sizeof(dsa_c128_prefill_params)
    p.flags = flags
    p.device = dev
    p.head_dim = <int32_t>d
    p.num_slots = st.shape[0]
    p.batch_size = b
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
    return 0


def prefill(state, kv_score, out, ape, indices, plan, load_indices, stream, uint32_t flags, error_count,
            bint compact, store=None, cache_slots=None):
    """One-shot c128 prefill: the library's status, or DECLINED."""
    cdef dsa_c128_prefill_params p
    cdef list keep = []
    if _fill_prefill(&p, state, kv_score, out, ape, indices, plan, load_indices, flags, error_count, compact, store,
                     cache_slots, keep) < 0:
        return DECLINED
    return _launch(_prefill_entry, &p, p.device, stream)


def fill_prefill(uintptr_t address, state, kv_score, out, ape, indices, plan, load_indices, uint32_t flags,
                 error_count, bint compact, store=None, cache_slots=None):
    """Fills the prefill params at `address`: False with nothing written; else True, or the list of
    buffers the params point into besides the arguments (a storing prefill's own out rows)."""
    cdef dsa_c128_prefill_params p
    cdef list keep = []
    if _fill_prefill(&p, state, kv_score, out, ape, indices, plan, load_indices, flags, error_count, compact, store,
                     cache_slots, keep) < 0:
        return False
    (<dsa_c128_prefill_params*>address)[0] = p
    return keep or True


# ---- c128 verify and commit (speculative decoding) -------------------------------------------

cdef int _optional_vector(object obj, Arg* a, int32_t dev, int64_t n) except -2:
    a.data = NULL
    if obj is None:
        return 0
    return _vector(obj, a, I32, dev, n)


cdef bint _int_in(object x, int64_t low, int64_t high):
    """x is an int in low..high (a bool or another type is not)."""
    return type(x) is int and low <= x <= high


cdef int _fill_verify(dsa_c128_verify_params* p, state, kv_score, out, ape, indices, seq_lens, bank_indices,
                      object stride, verify_lens, uint32_t flags, error_count, store=None,
                      cache_slots=None) except -2:
    cdef Arg st, kv, o, ap, ix, sl, bk, vl
    cdef const void* store_address
    cdef const int64_t* slots
    cdef int32_t sdt
    cdef uint32_t* errors
    if not _int_in(stride, 1, 2**31 - 1) or _state(state, &st, &sdt) < 0:
        return -1
    cdef int64_t bank_stride = stride
    cdef int32_t dev = st.dev
    cdef int64_t d = st.shape[2] // 3
    if _tensor(seq_lens, &sl, I32, dev, 1) < 0:
        return -1
    cdef int64_t b = sl.shape[0]
    if b <= 0 or _tensor(kv_score, &kv, F32, dev, 2) < 0 or kv.shape[1] != 2 * d or kv.shape[0] % b != 0:
        return -1
    cdef int64_t v = kv.shape[0] // b
    o.data = NULL
    if (v < 1 or v > 16 or (out is not None and _matrix(out, &o, F32, dev, b * v, d) < 0)
            or _matrix(ape, &ap, F32, dev, DSA_CHUNK, d) < 0 or _vector(indices, &ix, I32, dev, b) < 0
            or _vector(bank_indices, &bk, I32, dev, b) < 0 or _optional_vector(verify_lens, &vl, dev, b) < 0
            or _error_counter(error_count, dev, &errors) < 0
            or _store(store, cache_slots, dev, d, b * v, &store_address, &slots) < 0):
        return -1
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
    p.bank_stride = bank_stride
    p.error_count = errors
    p.store = store_address
    p.cache_slots = slots
    return 0


def verify(state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride, verify_lens, stream,
           uint32_t flags, error_count, store=None, cache_slots=None):
    """One-shot c128 verify: the library's status, or DECLINED."""
    cdef dsa_c128_verify_params p
    if _fill_verify(&p, state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride, verify_lens, flags,
                    error_count, store, cache_slots) < 0:
        return DECLINED
    return _launch(_verify_entry, &p, p.device, stream)


def fill_verify(uintptr_t address, state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride,
                verify_lens, uint32_t flags, error_count, store=None, cache_slots=None):
    """Fills the verify params at `address`: True, or False with nothing written."""
    cdef dsa_c128_verify_params p
    if _fill_verify(&p, state, kv_score, out, ape, indices, seq_lens, bank_indices, bank_stride, verify_lens, flags,
                    error_count, store, cache_slots) < 0:
        return False
    (<dsa_c128_verify_params*>address)[0] = p
    return True


cdef int _fill_commit(dsa_c128_commit_params* p, void** layers, int64_t capacity, seq_lens, accepted, indices,
                      bank_indices, load_indices, states, object slots_, object drafts_, object stride_, verify_lens,
                      uint32_t flags, error_count) except -2:
    """Either form: load_indices (the slots to resolve; num_slots bounds them) or states (a list of
    state buffers alike, their pointers written into layers[capacity])."""
    cdef Arg sl, ac, ix, bk, ld, vl, st
    cdef uint32_t* errors
    cdef int32_t sdt = 0, first_sdt = 0
    cdef int64_t num_slots = 0, d = 0, layers_n = 0, i
    if (not _int_in(drafts_, 1, 16) or not _int_in(stride_, 1, 2**31 - 1) or (load_indices is None) == (states is None)
            or _read(seq_lens, &sl) < 0 or sl.dev == -2 or sl.ndim != 1):
        return -1
    cdef int32_t dev = sl.dev
    cdef int64_t b = sl.shape[0]
    if (_vector(seq_lens, &sl, I32, dev, b) < 0 or _vector(accepted, &ac, I32, dev, b) < 0
            or _vector(indices, &ix, I32, dev, b) < 0 or _vector(bank_indices, &bk, I32, dev, b) < 0
            or _optional_vector(verify_lens, &vl, dev, b) < 0 or _error_counter(error_count, dev, &errors) < 0):
        return -1
    ld.data = NULL
    if states is None:
        if not _int_in(slots_, 1, 2**31 - 1) or _vector(load_indices, &ld, I32, dev, b) < 0:
            return -1
        num_slots = slots_
    else:
        if type(states) is not list and type(states) is not tuple:
            return -1
        layers_n = len(states)
        if layers_n < 1 or layers_n > capacity:
            return -1
        for i in range(layers_n):
            if _state(states[i], &st, &sdt) < 0 or st.dev != dev:
                return -1
            if i == 0:
                num_slots, d, first_sdt = st.shape[0], st.shape[2] // 3, sdt
            elif st.shape[0] != num_slots or st.shape[2] != 3 * d or sdt != first_sdt:
                return -1
        for i in range(layers_n):  # every layer checked: now written
            _read(states[i], &st)
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
    p.bank_stride = stride_
    p.load_indices = <int32_t*>ld.data
    p.num_layers = <int32_t>layers_n
    p.reserved = 0
    p.states = layers if layers_n > 0 else NULL
    p.error_count = errors
    return 0


cdef enum:
    STACK_LAYERS = 256  # a one-shot copying commit's layer pointers live on the C stack


def commit(seq_lens, accepted, indices, bank_indices, load_indices, states, num_slots, num_drafts, bank_stride,
           verify_lens, stream, uint32_t flags, error_count):
    """One-shot c128 commit, either form: the library's status, or DECLINED."""
    cdef dsa_c128_commit_params p
    cdef void* layers[STACK_LAYERS]
    if _fill_commit(&p, layers, STACK_LAYERS, seq_lens, accepted, indices, bank_indices, load_indices, states,
                    num_slots, num_drafts, bank_stride, verify_lens, flags, error_count) < 0:
        return DECLINED
    return _launch(_commit_entry, &p, p.device, stream)


def fill_commit(uintptr_t address, uintptr_t layers, int64_t capacity, seq_lens, accepted, indices, bank_indices,
                load_indices, states, num_slots, num_drafts, bank_stride, verify_lens, uint32_t flags, error_count):
    """Fills the commit params at `address` (a copying commit's layer pointers into `layers`, room
    for `capacity`): True, or False with nothing written."""
    cdef dsa_c128_commit_params p
    if _fill_commit(&p, <void**>layers, capacity, seq_lens, accepted, indices, bank_indices, load_indices, states,
                    num_slots, num_drafts, bank_stride, verify_lens, flags, error_count) < 0:
        return False
    (<dsa_c128_commit_params*>address)[0] = p
    return True


# ---- the standalone store -------------------------------------------------------------------

cdef int _fill_store(dsa_kv_store_params* p, vectors, positions, cache_slots, cache, uint32_t flags,
                     error_count, records=None, bint extend=False) except -2:
    cdef Arg v, ps, cs, rc
    cdef uint32_t* errors
    if type(cache) is not _store_type:
        return -1
    cdef int32_t dev = cache.device
    cdef int64_t d = cache.head_dim
    if _tensor(vectors, &v, F32, dev, 2) < 0 or v.shape[1] != d:
        return -1
    cdef int64_t n = v.shape[0]
    ps.data = NULL
    rc.data = NULL
    if records is None:
        if _vector(positions, &ps, I32, dev, n) < 0 or _vector(cache_slots, &cs, I64, dev, n) < 0:
            return -1
    else:  # sglang's plan records, uint8 [M, 16]: the first M vectors; cache_slots of any length
        if (positions is not None or _tensor(records, &rc, U8, dev, 2) < 0 or rc.shape[1] != 16
                or rc.shape[0] > n or _tensor(cache_slots, &cs, I64, dev, 1) < 0):
            return -1
        n = rc.shape[0]
        flags |= DSA_FLAG_STORE_EXTEND_RECORDS if extend else DSA_FLAG_STORE_DECODE_RECORDS
    if _error_counter(error_count, dev, &errors) < 0:
        return -1
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
    return 0


def store(vectors, positions, cache_slots, cache, stream, uint32_t flags, error_count, records=None,
          bint extend=False):
    """One-shot standalone store: the library's status, or DECLINED."""
    cdef dsa_kv_store_params p
    if _fill_store(&p, vectors, positions, cache_slots, cache, flags, error_count, records, extend) < 0:
        return DECLINED
    return _launch(_store_entry, &p, p.device, stream)


# ---- sglang 0.5.23's plan records -----------------------------------------------------------

cdef int _plan_head(dsa_sglang_plan_params* p, int kind, req_pool_indices, object offset, uint32_t flags,
                    Arg* rid) except -2:
    """The fields both plans share; rid read (int64 [B])."""
    if (not _int_in(offset, 0, 2**31 - 1) or _read(req_pool_indices, rid) < 0 or rid.dev == -2 or rid.ndim != 1
            or rid.dtype != I64 or not rid.contiguous):
        return -1
    memset(p, 0, sizeof(dsa_sglang_plan_params))
    p.struct_size = sizeof(dsa_sglang_plan_params)
    p.flags = flags
    p.device = rid.dev
    p.kind = kind
    p.batch_size = rid.shape[0]
    p.state_slot_offset = offset
    p.req_pool_indices = <const int64_t*>rid.data
    return 0


def sglang_decode_plan(seq_lens, req_pool_indices, state_slot_offset, plan_d, stream, uint32_t flags):
    """sglang's decode plan records (which pydsa's decode reads in place) in one launch: the library's
    status, or DECLINED."""
    cdef dsa_sglang_plan_params p
    cdef Arg rid, sq, pd
    if _plan_head(&p, DSA_SGLANG_DECODE_PLAN, req_pool_indices, state_slot_offset, flags, &rid) < 0:
        return DECLINED
    if (_vector(seq_lens, &sq, I64, rid.dev, p.batch_size) < 0
            or _matrix(plan_d, &pd, U8, rid.dev, p.batch_size, 16) < 0
            or _error_counter(None, rid.dev, &p.error_count) < 0):
        return DECLINED
    p.seq_lens = <const int64_t*>sq.data
    p.plan_d = <uint8_t*>pd.data
    return _launch(_sglang_plan_entry, &p, p.device, stream)


def sglang_prefill_plan(compress, write, req_pool_indices, state_slot_offset, plan_c, plan_w, slots, load_slots,
                        stream, uint32_t flags):
    """sglang's prefill plan records (from pyplan's record arrays, read here during the call) and pydsa's
    slots in one launch: the library's status, or DECLINED."""
    cdef dsa_sglang_plan_params p
    cdef Arg rid, pc, pw, ls, sl
    cdef uintptr_t cp, wp
    cdef int64_t nc, nw
    if type(compress) is not _ndarray_type or type(write) is not _ndarray_type:
        return DECLINED
    try:
        cp, nc, wp, nw = _record_lists(compress, write)
    except TypeError:
        return DECLINED
    if (_plan_head(&p, DSA_SGLANG_PREFILL_PLAN, req_pool_indices, state_slot_offset, flags, &rid) < 0
            or _vector(slots, &sl, I32, rid.dev, p.batch_size) < 0):
        return DECLINED
    p.slots = <int32_t*>sl.data
    if (_tensor(plan_c, &pc, U8, rid.dev, 2) < 0 or pc.shape[1] != 16 or pc.shape[0] < nc
            or _tensor(plan_w, &pw, U8, rid.dev, 2) < 0 or pw.shape[1] != 16 or pw.shape[0] < nw
            or _vector(load_slots, &ls, I32, rid.dev, p.batch_size) < 0):
        return DECLINED
    p.load_slots = <int32_t*>ls.data
    p.compress = <const dsa_segment*>cp
    p.write = <const dsa_segment*>wp
    p.num_compress = nc
    p.num_write = nw
    p.plan_c = <uint8_t*>pc.data
    p.plan_w = <uint8_t*>pw.data
    p.compress_rows = pc.shape[0]
    p.write_rows = pw.shape[0]
    return _launch(_sglang_plan_entry, &p, p.device, stream)


# ---- metadata copy --------------------------------------------------------------------------

cdef int _optional(object obj, Arg* a, int32_t dev, int32_t ndim) except -2:
    a.data = NULL
    if obj is None:
        return 0
    return _tensor(obj, a, I32, dev, ndim)


cdef void _store_sources(dsa_metadata_copy_params* p, int64_t bs, int64_t rows, int64_t width, int64_t expanded,
                         int64_t real_cols, int64_t meta, const Arg* cs, const Arg* cu, const Arg* pi, const Arg* se,
                         const Arg* dc, const Arg* du, const Arg* rp, const Arg* ns, const Arg* fm) noexcept:
    """Writes one step's sizes and source pointers (checked by the caller) into the params."""
    p.bs = bs
    p.page_rows = rows
    p.page_width = width
    p.expanded = expanded
    p.real_cols = real_cols
    p.metadata_size = meta
    p.src.cache_seqlens = <const int32_t*>cs.data
    p.src.cu_seqlens_k = <const int32_t*>cu.data
    p.src.page_indices = <const int32_t*>pi.data
    p.src.seqlens_expanded = <const int32_t*>se.data
    p.src.dsa_cache_seqlens = <const int32_t*>dc.data
    p.src.dsa_cu_seqlens_k = <const int32_t*>du.data
    p.src.real_page_table = <const int32_t*>rp.data
    p.src.num_splits = <const int32_t*>ns.data
    p.src.flashmla_metadata = <const int32_t*>fm.data


def init_metadata(uintptr_t address, uint32_t flags, int32_t dev, int32_t mode, int32_t num_destinations,
                  uintptr_t destinations):
    """The metadata params at `address` for a bound set of destinations: device, mode and the
    destination array; every size and source zero until a step's sources are filled."""
    cdef dsa_metadata_copy_params* p = <dsa_metadata_copy_params*>address
    cdef dsa_metadata_sources none
    memset(&none, 0, sizeof(none))
    p.struct_size = sizeof(dsa_metadata_copy_params)
    p.flags = flags
    p.device = dev
    p.mode = mode
    p.bs = p.page_rows = p.page_width = p.expanded = p.real_cols = p.metadata_size = 0
    p.src = none
    p.num_destinations = num_destinations
    p.reserved = 0
    p.destinations = <const dsa_metadata_destination*>destinations


def fill_metadata_sources(uintptr_t address, bint decode, bint has_real_page_table, bint has_flashmla,
                          cache_seqlens, cu_seqlens_k, page_indices, dsa_cache_seqlens, dsa_cu_seqlens_k,
                          seqlens_expanded, real_page_table, num_splits, flashmla_metadata):
    """Writes the sizes and source pointers of one step into the metadata params at `address`
    (its device, mode and destinations already set): True, or False with nothing written."""
    cdef dsa_metadata_copy_params* p = <dsa_metadata_copy_params*>address
    cdef int32_t dev = p.device
    cdef Arg cs, cu, pi, se, dc, du, rp, ns, fm
    cdef int64_t bs, n, meta = 0
    cdef int i
    if _tensor(cache_seqlens, &cs, I32, dev, 1) < 0:
        return False
    bs = cs.shape[0]
    if (_vector(cu_seqlens_k, &cu, I32, dev, bs + 1) < 0 or _tensor(page_indices, &pi, I32, dev, 2) < 0
            or _optional(seqlens_expanded, &se, dev, 1) < 0 or _optional(real_page_table, &rp, dev, 2) < 0
            or _optional(num_splits, &ns, dev, 1) < 0 or (seqlens_expanded is None) != decode
            or (real_page_table is not None) != has_real_page_table
            or (num_splits is not None) != has_flashmla or (flashmla_metadata is not None) != has_flashmla):
        return False
    if decode:
        n = bs
        if pi.shape[0] != bs:
            return False
    else:
        n = se.shape[0]
    if (_vector(dsa_cache_seqlens, &dc, I32, dev, n) < 0 or _vector(dsa_cu_seqlens_k, &du, I32, dev, n + 1) < 0
            or (real_page_table is not None and rp.shape[0] != pi.shape[0])
            or (num_splits is not None and ns.shape[0] != n + 1)):
        return False
    fm.data = NULL
    if flashmla_metadata is not None:
        if _read(flashmla_metadata, &fm) < 0 or fm.dtype != I32 or fm.dev != dev or not fm.contiguous:
            return False
        meta = 1
        for i in range(fm.ndim):
            meta *= fm.shape[i]
    _store_sources(p, bs, pi.shape[0], pi.shape[1], 0 if decode else n,
                   rp.shape[1] if real_page_table is not None else 0, meta, &cs, &cu, &pi, &se, &dc, &du, &rp, &ns, &fm)
    return True


cdef int _flat(object obj, Arg* a, int32_t dev, int64_t need) except -2:
    """0 for a contiguous int32 tensor on `dev` holding at least `need` elements (taken flat)."""
    cdef int64_t numel = 1
    cdef int i
    if _read(obj, a) < 0 or a.dtype != I32 or a.dev != dev or not a.contiguous:
        return -1
    for i in range(a.ndim):
        numel *= a.shape[i]
    return 0 if numel >= need else -1


def fill_flat_sources(uintptr_t address, bint decode, bint has_real_page_table, bint has_flashmla, bs_, max_len_,
                      max_seqlen_k_, expanded_, cache_seqlens, cu_seqlens_k,
                      page_indices, dsa_cache_seqlens, seqlens_expanded, dsa_cu_seqlens_k, real_page_table,
                      num_splits, flashmla_metadata):
    """sglang's convention (pydsa.sglang): sizes given, every source read flat and holding at least
    what is copied, seqlens_expanded ignored in DECODE. Writes the sizes and source pointers into
    the metadata params at `address`: True, or False with nothing written."""
    cdef dsa_metadata_copy_params* p = <dsa_metadata_copy_params*>address
    cdef int32_t dev = p.device
    cdef Arg cs, cu, pi, se, dc, du, rp, ns, fm
    cdef int64_t rows, width, n, real_cols = 0, meta = 0, bs, max_len, max_seqlen_k, expanded
    cdef int i
    if not (type(bs_) is int and type(max_len_) is int and type(max_seqlen_k_) is int and type(expanded_) is int
            and 0 <= bs_ < 2**31 and 0 <= max_len_ < 2**31 and 0 <= max_seqlen_k_ < 2**31
            and 0 <= expanded_ < 2**31):
        return False  # sizes the products below could overflow with: the checks say what is wrong
    bs, max_len, max_seqlen_k, expanded = bs_, max_len_, max_seqlen_k_, expanded_
    if ((real_page_table is not None) != has_real_page_table
            or (num_splits is not None) != has_flashmla or (flashmla_metadata is not None) != has_flashmla):
        return False
    n = bs if decode else expanded
    if decode:
        rows, width = bs, max_len
    else:
        if _read(page_indices, &pi) < 0 or pi.ndim < 1:
            return False
        rows, width = pi.shape[0], max_seqlen_k
        if rows >= 2**31:
            return False
    se.data = rp.data = ns.data = fm.data = NULL
    if real_page_table is not None:
        if _read(real_page_table, &rp) < 0 or rp.ndim < 2:
            return False
        real_cols = rp.shape[1]
        if real_cols >= 2**31:
            return False
    if flashmla_metadata is not None:
        if _read(flashmla_metadata, &fm) < 0:
            return False
        meta = 1
        for i in range(fm.ndim):
            meta *= fm.shape[i]
    if (_flat(cache_seqlens, &cs, dev, bs) < 0 or _flat(cu_seqlens_k, &cu, dev, bs + 1) < 0
            or _flat(page_indices, &pi, dev, rows * width) < 0
            or (not decode and _flat(seqlens_expanded, &se, dev, n) < 0)
            or _flat(dsa_cache_seqlens, &dc, dev, n) < 0 or _flat(dsa_cu_seqlens_k, &du, dev, n + 1) < 0
            or (real_page_table is not None and _flat(real_page_table, &rp, dev, rows * real_cols) < 0)
            or (num_splits is not None and _flat(num_splits, &ns, dev, n + 1) < 0)
            or (flashmla_metadata is not None and _flat(flashmla_metadata, &fm, dev, meta) < 0)):
        return False
    _store_sources(p, bs, rows, width, 0 if decode else n, real_cols, meta, &cs, &cu, &pi, &se, &dc, &du, &rp, &ns,
                   &fm)
    return True


# ---- prepared launches ----------------------------------------------------------------------

def init_upload(uintptr_t address, int32_t dev, uintptr_t compress, uintptr_t write, uintptr_t device_compress,
                uintptr_t device_write, int64_t compress_capacity, int64_t write_capacity, uintptr_t device_counts):
    """The plan-upload params at `address` of a DevicePlan: host arrays, device buffer, capacities."""
    cdef dsa_plan_upload_params* p = <dsa_plan_upload_params*>address
    p.struct_size = sizeof(dsa_plan_upload_params)
    p.device = dev
    p.compress = <const dsa_segment*>compress
    p.write = <const dsa_segment*>write
    p.num_compress = p.num_write = 0
    p.device_compress = <dsa_segment*>device_compress
    p.device_write = <dsa_segment*>device_write
    p.compress_capacity = compress_capacity
    p.write_capacity = write_capacity
    p.device_counts = <int64_t*>device_counts


def upload(uintptr_t address, int64_t num_compress, int64_t num_write, int32_t dev, stream):
    """Sets the record counts of the plan-upload params at `address` (everything else prepared)
    and launches them: the library's status, or DECLINED when the current stream could not be read."""
    cdef dsa_plan_upload_params* p = <dsa_plan_upload_params*>address
    p.num_compress = num_compress
    p.num_write = num_write
    return _launch(_upload_entry, p, dev, stream)


OP_DECODE, OP_PREFILL, OP_METADATA, OP_VERIFY, OP_COMMIT, OP_STORE = 0, 1, 2, 3, 4, 5


def launch(int op, uintptr_t address, int32_t dev, stream):
    """Launches prepared params at `address` (one of the OP_ values): the library's status, or
    DECLINED when the current stream could not be read."""
    cdef Entry entry = _metadata_entry
    if op == 0:
        entry = _decode_entry
    elif op == 1:
        entry = _prefill_entry
    elif op == 3:
        entry = _verify_entry
    elif op == 4:
        entry = _commit_entry
    elif op == 5:
        entry = _store_entry
    return _launch(entry, <const void*>address, dev, stream)
