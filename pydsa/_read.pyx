# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The reader every filler shares: tensor arguments read through the DLPack C exchange API
(`type(t).__dlpack_c_exchange_api__`, DLPack 1.3: one C call per tensor, a few tens of ns, instead of
five attribute reads through torch's Python bindings), each judged against what the op takes; the
default error counters; the launch table of the library's entry points.

A reader that finds an argument wrong raises the error naming it, built on the cold path by the
formatters in pydsa/_tensors.py (what was expected, what was given). An array that is not a framework
tensor (numpy, CuPy, JAX ...) is read through a zero-copy DLPack view of it; a torch whose tensor type
lacks the exchange API is read through the tensor's attributes (the slower reader)."""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid

from pydsa.errors import ArgumentTypeError, ArgumentValueError

cdef extern from "Python.h":
    long long PyLong_AsLongLongAndOverflow(object obj, int* overflow) except? -1
    ctypedef struct PyTypeObject
    PyTypeObject* Py_TYPE(object o)
    void PyErr_Clear()

from pydsa._dlpack cimport DLTensor, ExchangeAPI  # the standard's C layout

cdef enum:
    DL_CPU = 1
    DL_CUDA = 2
    MAX_TYPES = 8
    MAX_DEVICES = 64

ctypedef int (*Entry)(const void* params, void* stream) noexcept nogil

ABI_VERSION = DSA_ABI_VERSION
"""The header's DSA_ABI_VERSION, as these modules were compiled against it."""

STRUCT_IDS = dict(segment=DSA_STRUCT_SEGMENT, plan_params=DSA_STRUCT_PLAN_PARAMS)
"""The header's dsa_struct_id of each struct made in Python (pyplan's segment records, pydsa/c128.py's plan params),
by name (DSA_STRUCT_<NAME> in lower case), for their declare_struct; an op's params
id is in the op table (PARAMS), declared by its filler."""

cdef enum:
    MAX_OPS = 64

OPS = {}
"""The op table: op name -> its row in the launch table, as the filler modules declared them."""
SYMBOLS = {}
"""op name -> its entry point's symbol."""
SIZES = {}
"""op name -> the size of its params as its filler was compiled."""
PARAMS = {}
"""op name -> the dsa_struct_id of its params."""
STRUCTS = {}
"""struct name -> (its dsa_struct_id, its size as its filler was compiled), for the structs fillers make that are no
op's params."""
cdef int _num_ops = 0
cdef object _resolve = None      # symbol -> address in the library (bound by init)
cdef object _struct_size = None  # dsa_struct_id -> the library's size of it (bound by init)

cdef Entry _entries[<int>MAX_OPS]
cdef size_t _sizes[<int>MAX_OPS]              # each op's params size, as its filler declared it
cdef const ExchangeAPI* _streams = NULL       # the framework's current_work_stream
cdef PyTypeObject* _types[MAX_TYPES]           # tensor types seen, and their API (NULL: unreadable)
cdef const ExchangeAPI* _apis[MAX_TYPES]
cdef int _num_types = 0
cdef list _type_refs = []                      # keeps the cached type objects alive
cdef uintptr_t _error_counters[MAX_DEVICES + 1]  # default counter per device, [0] = host
cdef object _ndarray_type = None
cdef object _record_lists = None
cdef object _tensor_type = None                # the framework's tensor type (the slower reader's)
cdef dict _dtype_keys = {}                     # its dtype objects -> dtype keys (the slower reader)
cdef dict _dtypes = {}                         # dtype keys -> its dtype objects (the messages)
cdef object _raw_stream = None                 # current raw stream of a device, without the exchange API
cdef bint _attributes_only = False             # tests: read every tensor through the slower reader
cdef object _messages = None                   # pydsa._tensors, the formatters (bound by init)
cdef uint32_t _default_pdl = 0                 # the launch flag of pdl=None (bound by init)
cdef object _status_error = None               # status -> raises the library's error (bound by init)

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


def init(*, tensor_type, dict dtypes, raw_stream, resolve, struct_size, messages, ndarray_type, record_lists,
         bint pdl_default, status_error):
    """Binds the framework's tensor type (its dtypes by name: float32, bfloat16, int32, int64, uint8;
    its current-stream reader), the library (resolve: an entry symbol's address; struct_size: the
    library's dsa_struct_size; pdl_default: whether pdl=None launches with PDL; status_error: raises
    the library's error for a status), the message formatters (pydsa._tensors) and pyplan's reader of
    record arrays; binds every op declared so far (later ones as they are declared); returns `available`."""
    global _streams, _ndarray_type, _record_lists, available, _tensor_type, _dtype_keys, _dtypes, _raw_stream
    global _messages, _resolve, _struct_size, _default_pdl, _status_error
    _default_pdl = DSA_FLAG_PDL if pdl_default else 0
    _status_error = status_error
    keys = dict(float32=F32, bfloat16=BF16, int32=I32, int64=I64, uint8=U8)
    _dtype_keys = {dtype: keys[name] for name, dtype in dtypes.items()}
    _dtypes = {keys[name]: dtype for name, dtype in dtypes.items()}
    _tensor_type, _raw_stream, _messages = tensor_type, raw_stream, messages
    _resolve, _struct_size = resolve, struct_size
    for name in OPS:
        _bind(name)
    for name in STRUCTS:
        _check_struct(name)
    _ndarray_type, _record_lists = ndarray_type, record_lists
    _streams = _table(tensor_type)
    available = _streams != NULL
    return available


cdef int _bind(str name) except -1:
    """Checks op `name`'s params size against the library and binds its entry point."""
    cdef int row = OPS[name]
    library_size = _struct_size(PARAMS[name])
    if library_size != SIZES[name]:
        raise ImportError(f"pydsa: the library lays out the {name} params in {library_size} bytes but this pydsa "
                          f"has {SIZES[name]} (a stale build); rebuild with `pip install --no-build-isolation -e .`")
    _entries[row] = <Entry><uintptr_t>_resolve(SYMBOLS[name])
    return 0


cdef int _check_struct(str name) except -1:
    sid, size = STRUCTS[name]
    library_size = _struct_size(sid)
    if library_size != size:
        raise ImportError(f"pydsa: the library lays out dsa_{name} in {library_size} bytes but this pydsa has {size} (a "
                          f"stale build); rebuild with `pip install --no-build-isolation -e .`")
    return 0


cpdef int declare_struct(str name, int struct_id, size_t size) except -1:
    """Declares struct dsa_`name` (its dsa_struct_id and size as the caller compiled it), checked against the library."""
    STRUCTS[name] = (struct_id, size)
    if _struct_size is not None:
        _check_struct(name)
    return 0


cpdef int declare_op(str name, str symbol, int struct_id, size_t size) except -1:
    """Declares op `name` (its entry symbol, its params' dsa_struct_id and size as the caller compiled them):
    its row in the launch table. Declared again, the same row."""
    global _num_ops
    if name in OPS:
        return OPS[name]
    cdef int row = _num_ops
    if row >= MAX_OPS:
        raise RuntimeError(f"pydsa: more than {MAX_OPS} ops declared")
    _entries[row] = NULL
    _sizes[row] = size
    OPS[name], SYMBOLS[name], PARAMS[name], SIZES[name] = row, symbol, struct_id, size
    _num_ops += 1
    if _resolve is not None:
        _bind(name)
    return row


def read_attributes_only(bint on):
    """Tests: read every tensor through its attributes (the reader for a torch without the
    exchange API), as an older torch would be read."""
    global _attributes_only
    _attributes_only = on


cdef bint is_tensor(object x):
    return isinstance(x, _tensor_type)


cdef bint is_ndarray(object x):
    return type(x) is _ndarray_type


cdef object record_lists(object compress, object write):
    return _record_lists(compress, write)


cdef object new_rows(object like, int64_t rows, int64_t cols):
    """Rows of the call's own (float32, on `like`'s device), from the framework's allocator."""
    if type(like) is not _tensor_type:
        like = _messages.as_tensor(like, "kv_score")
    return like.new_empty((rows, cols))


# ---- reading one tensor -----------------------------------------------------------------------

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


cdef int _read_attributes(object obj, Arg* a) except -2:
    """The slower reader: a framework tensor through its attributes (a torch without the exchange API)."""
    cdef int i, n
    if not isinstance(obj, _tensor_type):
        return -1
    try:
        shape = obj.shape
        n = len(shape)
        if n > MAX_DIMS:
            return -1
        for i in range(n):
            a.dims[i] = shape[i]
        kind = obj.device.type
        a.data = <char*><uintptr_t>obj.data_ptr()
        a.dev = obj.get_device() if kind == "cuda" else (-1 if kind == "cpu" else OTHER_DEVICE)
        a.dtype = _dtype_keys.get(obj.dtype, 0)
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
        return _read_attributes(obj, a)
    a.data = <char*>t.data + t.byte_offset
    a.dev = (t.device.device_id if t.device.device_type == DL_CUDA
             else (-1 if t.device.device_type == DL_CPU else OTHER_DEVICE))
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


cdef int read(object obj, Arg* a, str name, list keep) except -1:
    if keep is not None:
        keep.append(obj)
    if _read(obj, a) == 0:
        return 0
    view = _messages.as_tensor(obj, name)  # cold: raises naming `name`, or a zero-copy torch view
    if keep is not None:
        keep.append(view)
    cdef int i
    if _read(view, a) == 0:
        if a.ndim > MAX_DIMS:
            raise ArgumentValueError(name, f"{name} has {a.ndim} dimensions; pydsa reads at most {MAX_DIMS}")
        for i in range(a.ndim):  # the view's shape lives with the view: copied, the view may go
            a.dims[i] = a.shape[i]
        a.shape = a.dims
        return 0
    raise ArgumentTypeError(name, f"{name} cannot be read (a {view.layout} tensor of {view.dtype} on {view.device}); it must be "
                    f"a dense tensor")


cdef object _shape(int32_t ndim, int64_t d0, int64_t d1):
    dims = [None if d0 == ANY else d0, None if d1 == ANY else d1, None][:ndim]
    return tuple(dims + [None] * (ndim - len(dims)))


cdef int _refuse(object obj, const Arg* a, str name, uint32_t dtype, int32_t dev, int32_t ndim, int64_t d0,
                 int64_t d1, str rows) except -1:
    """Cold: the formatter's error for an argument that is not what the op takes (a dimension of any
    size is shown as the argument's own where its rank is right)."""
    if a.ndim == ndim:
        d0 = a.shape[0] if ndim > 0 and d0 == ANY else d0
        d1 = a.shape[1] if ndim > 1 and d1 == ANY else d1
    want = _shape(ndim, d0, d1)
    if a.ndim == ndim and ndim > 2:
        want = want[:2] + tuple(a.shape[i] for i in range(2, ndim))
    _messages.check(obj, name, _dtypes[dtype], want, _messages.device_name(dev), rows)
    raise RuntimeError(f"pydsa: {name} was refused but passes its check (a bug in pydsa; please report it)")


cdef int tensor(object obj, Arg* a, str name, uint32_t dtype, int32_t dev, int32_t ndim, int64_t d0, int64_t d1,
                list keep, str rows=None) except -1:
    """A contiguous tensor of `dtype` on `dev` with `ndim` dimensions, the first two d0, d1 (ANY: any)."""
    read(obj, a, name, keep)
    return judge(obj, a, name, dtype, dev, ndim, d0, d1, rows)


cdef int judge(object obj, const Arg* a, str name, uint32_t dtype, int32_t dev, int32_t ndim, int64_t d0, int64_t d1,
               str rows=None) except -1:
    """tensor()'s judgement of `obj`, already read into `a`."""
    if (a.dtype != dtype or a.dev != dev or a.ndim != ndim or not a.contiguous
            or (ndim > 0 and d0 != ANY and a.shape[0] != d0) or (ndim > 1 and d1 != ANY and a.shape[1] != d1)):
        return _refuse(obj, a, name, dtype, dev, ndim, d0, d1, rows)
    return 0


cdef int vector(object obj, Arg* a, str name, uint32_t dtype, int32_t dev, int64_t n, list keep,
                str rows=None) except -1:
    return tensor(obj, a, name, dtype, dev, 1, n, ANY, keep, rows)


cdef int optional_vector(object obj, Arg* a, str name, int32_t dev, int64_t n, list keep, str rows=None) except -1:
    """An optional int32 [n]: None leaves a.data null."""
    a.data = NULL
    if obj is None:
        return 0
    return tensor(obj, a, name, I32, dev, 1, n, ANY, keep, rows)


cdef int state_arg(object obj, Arg* a, int32_t* state_dtype, str name, list keep) except -1:
    """A state [S, 1, 3D], D a positive multiple of 64, fp32 or bf16, on the host or a CUDA device."""
    read(obj, a, name, keep)
    if (a.dev == OTHER_DEVICE or a.ndim != 3 or not a.contiguous or a.shape[1] != 1 or a.shape[2] <= 0
            or a.shape[2] % 192 != 0 or (a.dtype != F32 and a.dtype != BF16)):
        _messages.check_state(obj, name)
        raise RuntimeError(f"pydsa: {name} was refused but passes its check (a bug in pydsa; please report it)")
    state_dtype[0] = DSA_STATE_FLOAT32 if a.dtype == F32 else DSA_STATE_BFLOAT16
    return 0


cdef int error_counter(object obj, int32_t dev, uint32_t** out, list keep) except -1:
    """`error_count` (int32 [1] on `dev`), or None: the device's default counter (made on first use)."""
    cdef Arg a
    if obj is not None:
        tensor(obj, &a, "error_count", I32, dev, 1, 1, ANY, keep)
        out[0] = <uint32_t*>a.data
        return 0
    if dev < -1 or dev >= MAX_DEVICES:
        raise ValueError(f"device {dev} is beyond the {MAX_DEVICES} devices pydsa keeps default error counters "
                         f"for; pass error_count=")
    if _error_counters[dev + 1] == 0:  # cold: made once per device, by the tensor helpers
        _error_counters[dev + 1] = <uintptr_t>_messages.error_counter(dev).data_ptr()
    out[0] = <uint32_t*>_error_counters[dev + 1]
    return 0


cdef int disjoint(const Arg* out, int64_t out_bytes, str out_name, const Arg* other, int64_t other_bytes,
                  str other_name) except -1:
    if out.dev == other.dev and overlap(out.data, out_bytes, other.data, other_bytes):
        raise ArgumentValueError(out_name, f"{out_name} shares memory with {other_name}: the op writes {out_name} while it reads "
                         f"{other_name}; pass a buffer of its own")
    return 0


cdef int distinct_slots(const Arg* seq, const Arg* slots, int64_t n, int32_t live_from) except -1:
    """On the host backend: live requests (seq_lens >= live_from, slot >= 0) must hold distinct slots (two
    would write one ring's rows). Device tensors are data the call does not read on the host."""
    if seq.dev != -1:
        return 0
    cdef const int32_t* q = <const int32_t*>seq.data
    cdef const int32_t* s = <const int32_t*>slots.data
    cdef dict seen = {}
    cdef int64_t i
    for i in range(n):
        if q[i] >= live_from and s[i] >= 0:
            first = seen.setdefault(s[i], i)
            if first != i:
                raise ArgumentValueError("slots", f"slots[{first}] and slots[{i}] are both {s[i]}: live requests must "
                                                  f"hold distinct slots (each owns its slot's ring rows)")
    return 0


cdef int int_arg(object x, str name, int64_t low, int64_t high, str extra) except -1:
    """x an int in low..high (a bool or another type is not), else the error naming it."""
    cdef int overflow = 0
    cdef long long v
    if type(x) is int:
        v = PyLong_AsLongLongAndOverflow(x, &overflow)
        if overflow == 0 and low <= v <= high:
            return 0
    bound = "2**31-1" if high == 2**31 - 1 else str(high)
    raise ArgumentValueError(name, f"{name} must be an int in {low}..{bound}{extra} (got {x!r})")


# ---- the launch table -------------------------------------------------------------------------

cdef int launch(int op, const void* params, int32_t dev, object stream) except? -9:
    """Runs entry point `op` on `stream` (a raw handle) or the device's current stream: its status."""
    cdef void* s = NULL
    cdef int status
    cdef Entry entry = _entries[op] if 0 <= op < _num_ops else NULL
    if entry == NULL:
        raise RuntimeError(f"pydsa: op {op} is not bound to the library (import pydsa first)")
    if stream is not None:
        if type(stream) is not int or stream < 0:
            raise ArgumentTypeError("stream", f"stream must be a raw cudaStream_t handle (an int >= 0) or None (got "
                            f"{type(stream).__name__} {stream!r})")
        s = <void*><uintptr_t>stream
    elif dev >= 0:
        if _streams == NULL or _attributes_only or _streams.current_work_stream(DL_CUDA, dev, &s) != 0:
            PyErr_Clear()
            s = <void*><uintptr_t>_messages.launch_stream(None, dev)  # cold: torch's own reader
    if dev < 0:  # the host backend computes on this thread: let other Python threads run
        with nogil:
            status = entry(params, s)
        return status
    return entry(params, s)


cpdef uint32_t pdl_flag(object pdl) except? 0xFFFFFFFF:
    """The launch flag of every op's `pdl` argument: DSA_FLAG_PDL for True, 0 for False; None: the
    library's default (PDL where every architecture it holds supports it)."""
    if pdl is None:
        return _default_pdl
    if pdl is True:
        return DSA_FLAG_PDL
    if pdl is False:
        return 0
    raise ArgumentTypeError("pdl", f"pdl must be True, False or None (got {pdl!r})")


cdef int raise_status(int status) except -1:
    """Raises the library's error for a non-OK status (its dsa_last_error())."""
    _status_error(status)
    return 0


def launch_prepared(int op, uintptr_t address, int32_t dev, stream):
    """Launches prepared params at `address` (op: a row of OPS): the library's status."""
    return launch(op, <const void*>address, dev, stream)


cpdef object prepared_signature(object one_shot):
    """The signature of a one-shot call's prepared form: the one-shot's own less `stream` (launch() takes it)."""
    import inspect
    sig = inspect.signature(one_shot)
    return sig.replace(parameters=[p for p in sig.parameters.values() if p.name != "stream"])


cdef class Prepared:
    """A validated call: its arguments judged once and its params filled (a wrong argument raises, naming it);
    launch() runs the call again on the same buffers, whatever they hold then, with no re-validation (e.g. for
    CUDA-graph capture or replay). `device`: where it runs."""

    def __dealloc__(self):
        PyMem_Free(self.params)

    cdef void* room(self, int op) except NULL:
        """Zeroed room for op's params (op: a row of the launch table), taken once."""
        if self.params != NULL and self.device is not None:
            raise RuntimeError("pydsa: a prepared call is filled once")
        PyMem_Free(self.params)  # a construction that failed before filling may be retried
        self.params = PyMem_Calloc(1, _sizes[op])
        if self.params == NULL:
            raise MemoryError()
        self.op = op
        self.keep = []
        return self.params

    cdef int bound(self, int32_t dev) except -1:
        """The params are filled, for `dev`."""
        self.dev = dev
        self.device = _messages.device_name(dev)
        return 0

    def launch(self, stream=None):
        """Runs the prepared call on `stream` (a raw cudaStream_t handle as int) or the current stream."""
        if self.device is None:
            raise RuntimeError(f"pydsa: {type(self).__name__} was not filled (its construction failed)")
        cdef int status = launch(self.op, self.params, self.dev, stream)
        if status:
            raise_status(status)

    def __reduce__(self):
        raise TypeError(f"pydsa: a {type(self).__name__} points into its arguments' memory and cannot be copied or "
                        f"pickled; make another from the same arguments")

    @property
    def _params(self):
        """The params as the library reads them (bytes; tests compare them)."""
        return b"" if self.device is None else (<char*>self.params)[:_sizes[self.op]]


# the raw rings' descriptions and their plans (C4Compressor, C128Ring): pydsa/_read_rings.pxi
include "_read_rings.pxi"
