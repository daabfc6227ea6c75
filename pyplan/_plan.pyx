# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Cython planner: typed loops over the callers' buffers, no GIL held while planning."""
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int64_t

cimport numpy as cnp
import numpy as np

from pyplan.errors import ArgumentTypeError, ArgumentValueError

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    # Steals a reference to descr.
    object PyArray_Empty(int nd, cnp.npy_intp* dims, cnp.dtype descr, int fortran)

SEGMENT_DTYPE = np.dtype(
    [("ragged_id", "<u4"), ("batch_id", "<u4"), ("position", "<u4"), ("window_len", "<u4")]
)
SENTINEL = 0xFFFFFFFF
CHUNK = 128

cdef enum:
    _CHUNK = 128
cdef int64_t _MAX_COORDINATE = 0xFFFFFFFE
cdef cnp.dtype _SEGMENT = SEGMENT_DTYPE

cdef extern from "dsa_kernels.h":
    ctypedef struct dsa_segment:
        pass

# The segment rules, shared with the library's C planner (native/src/plan_rules.h).
cdef extern from "plan_rules.h" nogil:
    int DSA_PLAN_BAD_SEQ
    int DSA_PLAN_BAD_EXTEND
    int DSA_PLAN_TOO_MANY
    int dsa_plan_count(const int64_t* seq, const int64_t* ext, int64_t batch, int64_t* total,
                       int64_t* num_compress, int64_t* num_write, int64_t* bad)
    void dsa_plan_cut(const int64_t* seq, const int64_t* ext, int64_t batch, int graph, dsa_segment* compress,
                      int64_t compress_capacity, dsa_segment* write, int64_t write_capacity,
                      int64_t* num_compress, int64_t* num_write)


cdef int64_t _int(object x, str name, int64_t lo, int64_t hi) except? -1:
    """x as an int in lo..hi: a Python or numpy integer, not a bool or a float (never truncated)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise ArgumentTypeError(name, f"{name} must be an int (got {type(x).__name__} {x!r})")
    if x < lo or x > hi:
        raise ArgumentValueError(name, f"{name} is {x}; expected {lo}..{hi}")
    return <int64_t>x


def compress_capacity(num_tokens, batch_size):
    """Compress records a plan can need: sum(extend) // 128 + B (write records need at most B)."""
    cdef int64_t tokens = _int(num_tokens, "num_tokens", 0, _MAX_COORDINATE)
    return tokens // _CHUNK + _int(batch_size, "batch_size", 0, _MAX_COORDINATE)


cdef cnp.ndarray _as_int64(object x, str name):
    """A C-contiguous 1-D int64 array with the values of x (numpy, torch CPU tensor, sequence)."""
    cdef cnp.ndarray a
    if type(x) is np.ndarray:
        a = <cnp.ndarray>x
        if cnp.PyArray_TYPE(a) == cnp.NPY_INT64 and cnp.PyArray_NDIM(a) == 1 and cnp.PyArray_IS_C_CONTIGUOUS(a):
            return a
    if x is None or isinstance(x, (str, bytes, int, float, np.number)):
        raise ArgumentTypeError(name, f"{name} must be a one-dimensional integer array (numpy, a CPU tensor or a "
                                      f"sequence; got {type(x).__name__} {x!r})")
    if hasattr(x, "numpy") and hasattr(x, "device"):
        if x.device.type != "cpu":
            raise ArgumentValueError(name, f"{name} must be on the host (got a tensor on {x.device})")
        x = x.numpy()
    y = np.asarray(x)
    if y.ndim != 1:
        raise ArgumentValueError(name, f"{name} must be one-dimensional (got shape {y.shape})")
    if y.dtype.kind not in "iu":
        raise ArgumentTypeError(name, f"{name} must hold integers (got dtype {y.dtype})")
    if y.dtype.kind == "u" and y.dtype.itemsize == 8 and y.size and y.max() > 0x7FFFFFFFFFFFFFFF:
        b = int(np.argmax(y > 0x7FFFFFFFFFFFFFFF))  # would wrap to a negative int64 (a padding value)
        raise ArgumentValueError(name, f"{name}[{b}] is {int(y[b])}, past the int64 range")
    return np.ascontiguousarray(y, dtype=np.int64)


cdef cnp.ndarray _as_records(object buf, str name):
    """A 1-D SEGMENT_DTYPE view of a caller-owned record buffer (numpy array, torch CPU or
    pinned tensor) holding whole 16-byte records."""
    cdef cnp.ndarray a
    if type(buf) is np.ndarray:
        a = <cnp.ndarray>buf
        if (<object>cnp.PyArray_DESCR(a) is _SEGMENT and cnp.PyArray_NDIM(a) == 1
                and cnp.PyArray_IS_C_CONTIGUOUS(a) and cnp.PyArray_ISWRITEABLE(a)):
            return a
    if hasattr(buf, "numpy") and hasattr(buf, "device"):
        if buf.device.type != "cpu":
            raise ArgumentValueError(name, f"{name} must be in host memory (got a tensor on {buf.device})")
        buf = buf.numpy()
    if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous or not buf.flags.writeable:
        raise ArgumentTypeError(name, f"{name} must be a writable C-contiguous numpy array or CPU tensor (got "
                                      f"{type(buf).__name__})")
    if buf.dtype not in (np.dtype(np.uint8), np.dtype(np.int32), np.dtype(np.uint32)) and buf.dtype != _SEGMENT:
        raise ArgumentTypeError(name, f"{name} must be a buffer of records: SEGMENT_DTYPE, or uint8 / int32 / uint32 "
                                      f"holding whole 16-byte records (got {buf.dtype})")
    if buf.nbytes % 16 != 0:
        raise ArgumentValueError(name, f"{name} must hold whole 16-byte records (got {buf.nbytes} bytes)")
    return buf.reshape(-1).view(np.uint8).view(SEGMENT_DTYPE)


cdef cnp.ndarray _new_records(cnp.npy_intp n):
    Py_INCREF(_SEGMENT)  # PyArray_Empty steals a reference to the descriptor
    return PyArray_Empty(1, &n, _SEGMENT, 0)


cdef int _fail(str name, str msg) except -1:
    raise ArgumentValueError(name, msg)


def plan_prefill(seq_lens, extend_lens, *, num_tokens=None, graph=False, capacity=None,
                 out=None, return_counts=False):
    """Plan one prefill batch.

    seq_lens, extend_lens: int64[B] (numpy, torch CPU tensor or sequence); request b's new tokens
    are positions seq_lens[b] - extend_lens[b] .. seq_lens[b].
    num_tokens: rows of the ragged input. Plain mode: must equal sum(extend_lens) (default).
    graph: CUDA-graph mode. Both lists are padded with sentinel records to their capacity;
        num_tokens (required) may exceed the real sum of extends (padding rows).
    capacity: (compress, write) record capacities for graph mode; default
        (num_tokens // 128 + B, B).
    out: (compress, write) caller-owned record buffers (numpy SEGMENT_DTYPE arrays, or any
        writable C-contiguous host array / torch CPU or pinned tensor of whole 16-byte records);
        no allocation happens then. Their sizes are the capacities.
    return_counts: also return the real record counts.

    Returns (compress, write) or (compress, write, num_compress, num_write). Plain mode returns
    exactly the real records; graph mode returns the whole padded buffers.
    """
    cdef cnp.ndarray seq_arr = _as_int64(seq_lens, "seq_lens")
    cdef cnp.ndarray ext_arr = _as_int64(extend_lens, "extend_lens")
    cdef const int64_t* seq = <const int64_t*>cnp.PyArray_DATA(seq_arr)
    cdef const int64_t* ext = <const int64_t*>cnp.PyArray_DATA(ext_arr)
    cdef Py_ssize_t B = cnp.PyArray_DIM(seq_arr, 0)
    if cnp.PyArray_DIM(ext_arr, 0) != B:
        raise ArgumentValueError("extend_lens", f"extend_lens has {cnp.PyArray_DIM(ext_arr, 0)} entries but seq_lens has "
                                                f"{B} (B: the length of seq_lens)")
    if graph is not True and graph is not False:
        raise ArgumentTypeError("graph", f"graph must be a bool (got {graph!r})")
    if return_counts is not True and return_counts is not False:
        raise ArgumentTypeError("return_counts", f"return_counts must be a bool (got {return_counts!r})")
    cdef bint graph_mode = graph

    # Validate everything and count records before anything is written.
    cdef int64_t total = 0, n_compress = 0, n_write = 0, bad = 0
    cdef int why
    with nogil:
        why = dsa_plan_count(seq, ext, B, &total, &n_compress, &n_write, &bad)
    if why == DSA_PLAN_BAD_SEQ:
        _fail("seq_lens", f"seq_lens[{bad}] is {seq[bad]}; expected 0..{_MAX_COORDINATE}")
    elif why == DSA_PLAN_BAD_EXTEND:
        _fail("extend_lens", f"extend_lens[{bad}] is {ext[bad]}; expected 1..seq_lens[{bad}] = {seq[bad]}")
    elif why == DSA_PLAN_TOO_MANY:
        _fail("extend_lens", f"extend_lens: the sum exceeds {_MAX_COORDINATE} at request {bad}")

    cdef int64_t tokens
    if num_tokens is None:
        if graph_mode:
            raise ArgumentValueError("num_tokens", "num_tokens is required in graph mode (the padded bucket's token "
                                                   "count)")
        tokens = total
    else:
        tokens = _int(num_tokens, "num_tokens", 0, _MAX_COORDINATE)
        if graph_mode and tokens < total:
            raise ArgumentValueError("num_tokens", f"num_tokens is {tokens} but the extends sum to {total} (graph mode "
                                                   f"needs >=)")
        if not graph_mode and tokens != total:
            raise ArgumentValueError("num_tokens", f"num_tokens is {tokens} but the extends sum to {total} (they must "
                                                   f"be equal)")

    cdef int64_t cap_c, cap_w
    cdef cnp.ndarray compress_arr, write_arr
    if out is not None:
        if capacity is not None:
            raise ArgumentValueError("capacity", "capacity: pass either out or capacity; out's sizes are the "
                                                 "capacities")
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ArgumentTypeError("out", f"out must be a pair of record buffers (compress, write) (got "
                                           f"{type(out).__name__})")
        compress_arr = _as_records(out[0], "out[0]")
        write_arr = _as_records(out[1], "out[1]")
        cap_c = cnp.PyArray_DIM(compress_arr, 0)
        cap_w = cnp.PyArray_DIM(write_arr, 0)
    else:
        if capacity is not None:
            if not isinstance(capacity, (tuple, list)) or len(capacity) != 2:
                raise ArgumentTypeError("capacity", f"capacity must be a pair of ints (compress, write) (got "
                                                    f"{capacity!r})")
            cap_c = _int(capacity[0], "capacity", 0, _MAX_COORDINATE)
            cap_w = _int(capacity[1], "capacity", 0, _MAX_COORDINATE)
        elif graph_mode:
            cap_c = tokens // _CHUNK + B
            cap_w = B
        else:
            cap_c = n_compress
            cap_w = n_write
    where = "out" if out is not None else "capacity"
    if n_compress > cap_c:
        raise ArgumentValueError(where, f"{where}: the plan needs {n_compress} compress records but the capacity is "
                                        f"{cap_c}")
    if n_write > cap_w:
        raise ArgumentValueError(where, f"{where}: the plan needs {n_write} write records but the capacity is {cap_w}")
    if out is None:
        compress_arr = _new_records(cap_c)
        write_arr = _new_records(cap_w)

    cdef int64_t c = 0, w = 0
    with nogil:
        dsa_plan_cut(seq, ext, B, graph_mode, <dsa_segment*>cnp.PyArray_DATA(compress_arr), cap_c,
                     <dsa_segment*>cnp.PyArray_DATA(write_arr), cap_w, &c, &w)
    if not graph_mode and (cap_c != c or cap_w != w):
        if return_counts:
            return compress_arr[:c], write_arr[:w], c, w
        return compress_arr[:c], write_arr[:w]
    if return_counts:
        return compress_arr, write_arr, c, w
    return compress_arr, write_arr


cdef inline bint _is_record_list(object a):
    return (type(a) is np.ndarray and cnp.PyArray_NDIM(<cnp.ndarray>a) == 1
            and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>a)
            and (<object>cnp.PyArray_DESCR(<cnp.ndarray>a) is _SEGMENT or a.dtype == _SEGMENT))


def record_lists(compress, write):
    """(compress address, compress count, write address, write count) of a plan's two record
    arrays (1-D C-contiguous SEGMENT_DTYPE numpy arrays, as plan_prefill returns them), for
    launching with the records read from host memory. Raises TypeError for anything else."""
    if not _is_record_list(compress):
        raise ArgumentTypeError("plan[0]", "plan[0] (compress) must be a 1-D C-contiguous numpy array of "
                                           "pyplan.SEGMENT_DTYPE records")
    if not _is_record_list(write):
        raise ArgumentTypeError("plan[1]", "plan[1] (write) must be a 1-D C-contiguous numpy array of "
                                           "pyplan.SEGMENT_DTYPE records")
    return (<Py_ssize_t>cnp.PyArray_DATA(<cnp.ndarray>compress), cnp.PyArray_DIM(<cnp.ndarray>compress, 0),
            <Py_ssize_t>cnp.PyArray_DATA(<cnp.ndarray>write), cnp.PyArray_DIM(<cnp.ndarray>write, 0))


# ---- the c4 planner: a request-scoped ring (docs/spec.md, "The ring") -------------------------

C4_COMPRESS_DTYPE = np.dtype([("seq_len", "<u4"), ("ragged_id", "<u2"), ("ring_rows", "<u2"),
                              ("previous_group", "<i4"), ("current_group", "<i4")])
C4_WRITE_DTYPE = np.dtype([("ragged_id", "<u4"), ("ring_row", "<i4")])

cdef struct C4Compress:
    unsigned int seq_len
    unsigned short ragged_id
    unsigned short ring_rows
    int previous_group
    int current_group

cdef struct C4Write:
    unsigned int ragged_id
    int ring_row


cdef inline int64_t _ring_row(int64_t slot, int64_t ring_size, int64_t p) nogil:
    return slot * ring_size + p % ring_size


class C4Plan(tuple):
    """One c4 extend's records, (compress, write) (unpacks as the pair), with the geometry it was planned
    for: ring_size (R), num_slots (the slots it may address; None when not given) and num_tokens (the rows
    of the input it indexes). pydsa's c4_extend refuses it for a ring or an input of another geometry."""

    ratio = 4  # tokens per entry of the ring's layer: a c4 plan is no offline c128 one, and the reverse

    def __new__(cls, compress, write, ring_size, num_slots, num_tokens):
        plan = tuple.__new__(cls, (compress, write))
        plan._geometry = (ring_size, num_slots, num_tokens)
        return plan

    ring_size = property(lambda self: self._geometry[0], doc="R: ring rows per request slot")
    num_slots = property(lambda self: self._geometry[1], doc="slots the plan may address, or None")
    num_tokens = property(lambda self: self._geometry[2], doc="rows of the ragged input")

    def to(self, device):
        """The same plan with its records as torch tensors on `device` (a GPU call reads them there)."""
        import torch
        return type(self)(torch.from_numpy(np.asarray(self[0])).to(device),
                          torch.from_numpy(np.asarray(self[1])).to(device), *self._geometry)

    def __repr__(self):
        return (f"{type(self).__name__}(compress=[{len(self[0])}, 16], write=[{len(self[1])}, 8], "
                f"ring_size={self.ring_size}, num_slots={self.num_slots}, num_tokens={self.num_tokens})")


class C128OfflinePlan(C4Plan):
    """One offline c128 extend's records (plan_c128_offline), with the geometry it was planned for; pydsa's
    c128_offline_extend refuses it for a ring or an input of another geometry."""

    ratio = 128


def plan_c4(seq_lens, extend_lens, slots, ring_size, *, num_tokens=None, num_slots=None):
    """Plan one c4 extend over pydsa's request-scoped ring (request slot s owns ring rows s*R .. s*R+R-1;
    position p lives at row s*R + p % R).

    seq_lens, extend_lens: int64 [B]; request b's new tokens are positions seq_lens[b] - extend_lens[b] ..
    seq_lens[b] - 1 at consecutive ragged rows (request after request). slots: int [B] (a negative slot:
    the request is not held here and gets no records; the others distinct, below num_slots when given).
    ring_size: R, a multiple of 4, >= 8 (the ring's: C4Compressor(..., ring_size=R)). num_tokens: rows of
    the ragged input, >= sum(extend_lens) (default: the sum); <= 65536.

    Returns a C4Plan: (compress, write) as uint8 arrays [C, 16] and [W, 8] in sglang's record formats
    (C4_COMPRESS_DTYPE, C4_WRITE_DTYPE viewed as bytes), with the geometry it was made for: one compress
    record per position p with (p + 1) % 4 == 0, its window rows before the extend read from the ring; one
    write record for each of the last min(extend, R) positions of each request."""
    return _plan_ring(seq_lens, extend_lens, slots, ring_size, num_tokens, num_slots, 4)


def plan_c128_offline(seq_lens, extend_lens, slots, ring_size=128, *, num_tokens=None, num_slots=None):
    """Plan one offline c128 extend over pydsa's request-scoped ring (pydsa.C128Ring: request slot s owns ring rows
    s*R .. s*R+R-1; position p lives at row s*R + p % R), as plan_c4 does for a c4 ring.

    seq_lens, extend_lens, slots, num_tokens, num_slots: as plan_c4's. ring_size: R, a multiple of 128 (the
    ring's). Returns a C128OfflinePlan in the same record formats: one compress record per position p with
    (p + 1) % 128 == 0 (window rows before the extend read from the ring: 128 - min(j + 1, 128) for the j-th new
    token, previous group -1, current group the page of 128 rows holding the chunk); one write record for each of
    the last min(extend, R) positions of each request."""
    return _plan_ring(seq_lens, extend_lens, slots, ring_size, num_tokens, num_slots, 128)


cdef object _plan_ring(seq_lens, extend_lens, slots, ring_size, num_tokens, num_slots, int64_t ratio):
    """The records of an extend over a request-scoped ring whose entries close every `ratio` positions: 4 (c4,
    a window of the previous and the own quartet) or 128 (offline c128, a window of the chunk)."""
    cdef cnp.ndarray seq_arr = _as_int64(seq_lens, "seq_lens")
    cdef cnp.ndarray ext_arr = _as_int64(extend_lens, "extend_lens")
    cdef cnp.ndarray slot_arr = _as_int64(slots, "slots")
    cdef const int64_t* seq = <const int64_t*>cnp.PyArray_DATA(seq_arr)
    cdef const int64_t* ext = <const int64_t*>cnp.PyArray_DATA(ext_arr)
    cdef const int64_t* slot = <const int64_t*>cnp.PyArray_DATA(slot_arr)
    cdef Py_ssize_t B = cnp.PyArray_DIM(seq_arr, 0)
    for name, arr in (("extend_lens", ext_arr), ("slots", slot_arr)):
        if cnp.PyArray_DIM(arr, 0) != B:
            raise ArgumentValueError(name, f"{name} has {cnp.PyArray_DIM(arr, 0)} entries but seq_lens has {B} (B: the "
                                           f"length of seq_lens, one entry per request)")
    cdef bint overlap = ratio == 4  # a c4 entry's window is its own quartet and the previous one
    cdef int64_t window = 2 * ratio if overlap else ratio
    cdef str layer = "c4" if overlap else "offline c128"
    cdef int64_t R = _int(ring_size, "ring_size", window, 2 ** 20 if overlap else 2 ** 24)
    if R % ratio != 0:
        raise ArgumentValueError("ring_size", f"ring_size is {R}; expected a multiple of {ratio}, >= {window}")
    cdef int64_t slot_limit = 0x7FFFFFFF // R if num_slots is None else _int(num_slots, "num_slots", 0, 0x7FFFFFFF // R)
    cdef int64_t total = 0, n_c = 0, n_w = 0, b, p, l0, j, off, q
    cdef dict seen = {}
    for b in range(B):
        if ext[b] < 1 or ext[b] > seq[b] or seq[b] > 0x7FFFFFFE:
            raise ArgumentValueError("extend_lens", f"extend_lens[{b}] is {ext[b]} and seq_lens[{b}] {seq[b]}; expected "
                                                    f"1 <= extend_lens <= seq_lens <= 2^31-2")
        if slot[b] >= slot_limit:
            raise ArgumentValueError("slots", f"slots[{b}] is {slot[b]}; expected below "
                                     + (f"num_slots = {slot_limit}" if num_slots is not None else
                                        f"{slot_limit} (its ring rows pass 2^31-1)"))
        if slot[b] >= 0:
            first = seen.setdefault(slot[b], b)
            if first != b:
                raise ArgumentValueError("slots", f"slots[{first}] and slots[{b}] are both {slot[b]}: requests of one "
                                                  f"extend must hold distinct slots")
        total += ext[b]
        if slot[b] >= 0:
            n_c += seq[b] // ratio - (seq[b] - ext[b]) // ratio
            n_w += min(ext[b], R)
    if num_tokens is None and total > 65536:
        raise ArgumentValueError("extend_lens", f"the extends sum to {total} tokens; a {layer} extend takes at most "
                                                f"65536 (16-bit ragged rows): split it")
    cdef int64_t tokens = total if num_tokens is None else _int(num_tokens, "num_tokens", 0, 65536)
    if tokens < total:
        raise ArgumentValueError("num_tokens", f"num_tokens is {tokens}; expected sum(extend_lens) = {total} .. 65536 "
                                               f"(16-bit ragged rows)")
    cdef cnp.ndarray compress_arr = np.empty(n_c, C4_COMPRESS_DTYPE)
    cdef cnp.ndarray write_arr = np.empty(n_w, C4_WRITE_DTYPE)
    cdef C4Compress* c = <C4Compress*>cnp.PyArray_DATA(compress_arr)
    cdef C4Write* w = <C4Write*>cnp.PyArray_DATA(write_arr)
    cdef int64_t ci = 0, wi = 0
    with nogil:
        off = 0
        for b in range(B):
            l0 = seq[b] - ext[b]
            if slot[b] >= 0:
                p = l0 + (ratio - 1 - l0 % ratio)  # the first closing position
                while p < seq[b]:
                    j = p - l0
                    q = p - ratio if p >= ratio else 0
                    c[ci].seq_len = <unsigned int>(p + 1)
                    c[ci].ragged_id = <unsigned short>(off + j)
                    c[ci].ring_rows = <unsigned short>(window - min(j + 1, window))
                    c[ci].previous_group = <int>(_ring_row(slot[b], R, q) // ratio) if overlap else -1
                    c[ci].current_group = <int>(_ring_row(slot[b], R, p) // ratio)
                    ci += 1
                    p += ratio
                for p in range(max(l0, seq[b] - R), seq[b]):
                    w[wi].ragged_id = <unsigned int>(off + p - l0)
                    w[wi].ring_row = <int>_ring_row(slot[b], R, p)
                    wi += 1
            off += ext[b]
    plan = C4Plan if overlap else C128OfflinePlan
    return plan(compress_arr.view(np.uint8).reshape(n_c, 16), write_arr.view(np.uint8).reshape(n_w, 8), R,
                None if num_slots is None else slot_limit, tokens)
