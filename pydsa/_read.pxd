# The shared reader of the call path: the header's constants, the tensor view every filler reads an
# argument into (each op's params layout lives in its family's filler module), and the readers, which judge each argument and raise the error
# naming it (pydsa/_read.pyx). Every filler module (pydsa/_fill_*.pyx) cimports this.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t

cdef extern from "dsa_kernels.h":
    int DSA_ABI_VERSION
    int DSA_FLAG_PDL
    int DSA_FLAG_HOST_PLAN
    int DSA_FLAG_DECODE_RECORDS
    int DSA_FLAG_STORE_DECODE_RECORDS
    int DSA_FLAG_STORE_EXTEND_RECORDS
    int DSA_CHUNK
    int DSA_STATE_FLOAT32
    int DSA_STATE_BFLOAT16
    int DSA_OUT_RAGGED
    int DSA_OUT_COMPACT
    int DSA_RECORDS_DECODE
    int DSA_RECORDS_PREFILL
    # the structs made in Python (pydsa/c128.py, pyplan's records); each op's params id is declared by its filler
    int DSA_STRUCT_SEGMENT
    int DSA_STRUCT_PLAN_PARAMS

    ctypedef struct dsa_segment:
        pass

cdef enum:
    # dtype keys: DLPack's code | bits << 8 | lanes << 16
    F32 = 2 | (32 << 8) | (1 << 16)
    BF16 = 4 | (16 << 8) | (1 << 16)
    I32 = 0 | (32 << 8) | (1 << 16)
    U8 = 1 | (8 << 8) | (1 << 16)
    I64 = 0 | (64 << 8) | (1 << 16)
    ANY = -1          # a dimension of any size
    OTHER_DEVICE = -2  # Arg.dev of memory that is neither host nor CUDA
    MAX_DIMS = 8

# The op table: each filler module declares its ops when imported (name, entry symbol, params struct id,
# the params' size as it compiled them); the returned row of the launch table is what it launches.
cpdef int declare_op(str name, str symbol, int struct_id, size_t size) except -1
# A struct a filler makes that is no op's params (e.g. dsa_kv_cache): its size is checked against the library's.
cpdef int declare_struct(str name, int struct_id, size_t size) except -1

cdef struct Arg:
    char* data
    int32_t dev      # CUDA ordinal, -1 host, OTHER_DEVICE anything else
    uint32_t dtype
    int32_t ndim
    const int64_t* shape
    bint contiguous
    int64_t dims[MAX_DIMS]  # the shape, when read through attributes

# Each reader fills `a` from `obj` or raises the error naming `name` (what was expected, what it got). When `keep`
# is a list (a prepared call's), `obj` is appended to it, and so is the zero-copy DLPack view an array that is not a
# framework tensor is read through: the prepared call keeps alive what its params point into.
cdef int read(object obj, Arg* a, str name, list keep) except -1
# `rows`: where a size the call expects comes from (e.g. "B: the rows of kv_score"), said when it disagrees.
cdef int tensor(object obj, Arg* a, str name, uint32_t dtype, int32_t dev, int32_t ndim, int64_t d0, int64_t d1,
                list keep, str rows=*) except -1
# tensor()'s judgement alone, of an argument already read into `a` (a call that needed its shape first).
cdef int judge(object obj, const Arg* a, str name, uint32_t dtype, int32_t dev, int32_t ndim, int64_t d0, int64_t d1,
               str rows=*) except -1
cdef int vector(object obj, Arg* a, str name, uint32_t dtype, int32_t dev, int64_t n, list keep, str rows=*) except -1
cdef int optional_vector(object obj, Arg* a, str name, int32_t dev, int64_t n, list keep, str rows=*) except -1
cdef int state_arg(object obj, Arg* a, int32_t* state_dtype, str name, list keep) except -1
cdef int error_counter(object obj, int32_t dev, uint32_t** out, list keep) except -1
cdef int int_arg(object x, str name, int64_t low, int64_t high, str extra) except -1
# Whether two byte ranges of one device overlap (a null one overlaps nothing): the one test of disjoint and
# apart_from_ring.
cdef inline bint overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) noexcept:
    cdef const char* x = <const char*>a
    cdef const char* y = <const char*>b
    return x != NULL and y != NULL and x < y + b_bytes and y < x + a_bytes
# An output must not share memory with an input of the same call: the error naming both, else 0.
cdef int disjoint(const Arg* out, int64_t out_bytes, str out_name, const Arg* other, int64_t other_bytes,
                  str other_name) except -1
# An input must not share memory with a ring the op writes (rows are read and written by different threads, in an
# order no caller controls): the error naming the input and the ring's owner (`owner`.ring), else 0.
cdef int apart_from_ring(const void* input, int64_t input_bytes, str input_name, const void* ring, int64_t ring_bytes,
                         str owner) except -1
# On the host backend, live requests (seq_lens >= live_from, slot >= 0) must hold distinct slots: the error naming
# slots, else 0 (device tensors are data the call does not read on the host).
cdef int distinct_slots(const Arg* seq, const Arg* slots, int64_t n, int32_t live_from) except -1
cdef bint is_tensor(object x)
cdef bint is_ndarray(object x)
cdef object record_lists(object compress, object write)
cdef object new_rows(object like, int64_t rows, int64_t cols)
cdef int launch(int op, const void* params, int32_t dev, object stream) except? -9
# An op's `pdl` argument as its launch flag (or the error naming pdl); a one-shot call's non-OK status raised.
cpdef uint32_t pdl_flag(object pdl) except? 0xFFFFFFFF
cdef int raise_status(int status) except -1

# A raw ring's buffers as both raw-ring families' descriptions (C4Compressor, C128Ring) read them once: the ring
# (fp32 or bf16 [rows, parts * D], D 128 / 256 / 512, rows a positive multiple of row_unit) and its ape (fp32
# [ape_rows, D] on the ring's device); each family then judges its store (pydsa/_fill_store.pxd). Each wrong one
# raises, naming it; `what_rows` says what a row_unit of rows is.
cdef struct RawRing:
    int32_t dev
    uint32_t dtype
    void* data
    int64_t rows
    int64_t head_dim
    const float* ape
cdef int raw_ring(object ring, object ape, int parts, int64_t ape_rows, int64_t row_unit, str what_rows, RawRing* out,
                  list views) except -1
# A plan from pyplan (plan_c4: ratio 4, plan_c128_offline: ratio 128) carries the ring and input it was made for:
# it must be of this op's ratio, for the ring's ring_size and at most its num_slots (ring_name: how the call names
# the ring), and for this call's input rows. Record tuples of another origin carry none (0, nothing checked).
cdef int plan_geometry(object plan, int ratio, str ring_name, object ring_size, object num_slots,
                       object kv_score) except -1


# A prepared call: the params of one op, filled once by its fill and launched again by launch() (CUDA-graph capture or
# replay, a step loop over fixed buffers). Each family's prepared classes subclass it in their filler: __init__ takes
# room() for the op's params, fills them (the fill appends to `keep` what they point into) and calls bound().
# The signature a prepared class shows (inspect.signature): its one-shot call's, less `stream`.
cpdef object prepared_signature(object one_shot)
cdef class Prepared:
    cdef void* params          # the op's params, as many bytes as its filler declared (owned)
    cdef int op                # its row of the launch table
    cdef int32_t dev           # the params' device: a CUDA ordinal, -1 the host
    cdef list keep             # what the params point into: the arguments, DLPack views, the call's own buffers
    cdef readonly object device
    cdef void* room(self, int op) except NULL
    cdef int bound(self, int32_t dev) except -1
