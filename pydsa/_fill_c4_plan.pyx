# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The c4 plans (docs/spec.md, "c4 plans"): a step's c4 decode records, or an extend's compress and write
records, built from the engine's tables in one launch on the tables' device (or by the host backend for host
tensors), into the caller's plan tensors. The arguments are judged here; a wrong one raises a RuntimeError
naming it and what was passed (the plans' caller speaks another framework's words: pydsa.sglang)."""
from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.string cimport memset

from pydsa._read cimport *

cdef extern from "dsa_kernels.h":  # this family's params, as the header lays them out
    int DSA_STRUCT_C4_PLAN_PARAMS
    ctypedef struct dsa_c4_decode_record:
        pass
    ctypedef struct dsa_c4_compress_record:
        pass
    ctypedef struct dsa_c4_write_record:
        pass
    ctypedef struct dsa_c4_plan_params:
        uint32_t struct_size
        uint32_t flags
        int32_t device
        int32_t use_req_ring
        int32_t swa_page_size
        int32_t ring_size
        int64_t batch_size
        const int64_t* req_pool_indices
        const int32_t* req_to_token
        int64_t token_rows
        int64_t token_cols
        int64_t token_stride
        const int64_t* full_to_state
        int64_t num_full
        const void* seq_lens
        const void* extend_lens
        int32_t seq_lens_int32
        int32_t extend_lens_int32
        int64_t num_tokens
        dsa_c4_decode_record* plan_d
        dsa_c4_compress_record* plan_c
        dsa_c4_write_record* plan_w

cdef int OP_DECODE = declare_op("c4_plan_decode", "dsa_c4_plan_decode", DSA_STRUCT_C4_PLAN_PARAMS,
                                sizeof(dsa_c4_plan_params))
cdef int OP_EXTEND = declare_op("c4_plan_extend", "dsa_c4_plan_extend", DSA_STRUCT_C4_PLAN_PARAMS,
                                sizeof(dsa_c4_plan_params))


cdef str _passed(object x):
    """What the caller passed, in its own terms: a tensor's dtype, shape and device, else its type."""
    if hasattr(x, "dtype") and hasattr(x, "shape") and hasattr(x, "device"):
        return f"{str(x.dtype).replace('torch.', '')} {list(x.shape)} on {x.device}"
    module = type(x).__module__
    return type(x).__name__ if module == "builtins" else f"{module}.{type(x).__name__}"


cdef str _device(int32_t dev):
    return "cpu" if dev < 0 else f"cuda:{dev}"


cdef int _read_tensor(object obj, Arg* a, str name, int32_t dev) except -1:
    """A tensor on `dev` (OTHER_DEVICE: on the host or a CUDA device, any)."""
    if not is_tensor(obj):
        raise RuntimeError(f"{name} must be a torch.Tensor (got {_passed(obj)})")
    read(obj, a, name, None)
    if a.dev == OTHER_DEVICE or (dev != OTHER_DEVICE and a.dev != dev):
        where = "on the host or a CUDA device" if dev == OTHER_DEVICE else f"on {_device(dev)} (req_pool_indices')"
        raise RuntimeError(f"{name} must be {where} (got {_passed(obj)})")
    return 0


cdef int _vector(object obj, Arg* a, str name, int32_t dev, int64_t n, bint int32_too) except -1:
    """A contiguous 1-D int64 [n] (int32 too where int32_too; n ANY: any length)."""
    _read_tensor(obj, a, name, dev)
    if a.ndim != 1 or not a.contiguous or not (a.dtype == I64 or (int32_too and a.dtype == I32)):
        raise RuntimeError(f"{name} must be a contiguous 1-D {'int64 or int32' if int32_too else 'int64'} tensor "
                           f"(got {_passed(obj)})")
    if n != ANY and a.shape[0] != n:
        raise RuntimeError(f"{name} has {a.shape[0]} entries but req_pool_indices has {n}")
    return 0


cdef int _rows(object obj, Arg* a, str name, int32_t dev, int64_t n, int64_t width) except -1:
    """A plan tensor: contiguous uint8 [n, width] (n ANY: any rows)."""
    _read_tensor(obj, a, name, dev)
    if a.dtype != U8 or a.ndim != 2 or not a.contiguous or a.shape[1] != width or (n != ANY and a.shape[0] != n):
        rows = "rows" if n == ANY else str(n)
        raise RuntimeError(f"{name} must be a contiguous uint8 tensor [{rows}, {width}] (got {_passed(obj)})")
    return 0


cdef int _head(dsa_c4_plan_params* p, req_pool_indices, req_to_token, full_to_state, seq_lens, object swa_page_size,
               object ring_size, object use_req_ring, uint32_t flags) except -1:
    """The fields both plans share, judged and filled."""
    cdef Arg rid, r2t, f2s, sq
    memset(p, 0, sizeof(dsa_c4_plan_params))
    p.struct_size = sizeof(dsa_c4_plan_params)
    p.flags = flags
    _vector(req_pool_indices, &rid, "req_pool_indices", OTHER_DEVICE, ANY, False)
    p.device = rid.dev
    p.batch_size = rid.shape[0]
    p.req_pool_indices = <const int64_t*>rid.data
    for name, v in (("swa_page_size", swa_page_size), ("ring_size", ring_size)):
        if type(v) is not int or not 1 <= v < 2**31:
            raise RuntimeError(f"{name} must be an int in 1..2^31-1 (got {v!r})")
    p.swa_page_size = swa_page_size
    p.ring_size = ring_size
    if use_req_ring is not True and use_req_ring is not False:
        raise RuntimeError(f"use_req_ring must be a bool (got {use_req_ring!r})")
    p.use_req_ring = use_req_ring
    _vector(seq_lens, &sq, "seq_lens", rid.dev, p.batch_size, True)
    p.seq_lens = sq.data
    p.seq_lens_int32 = sq.dtype == I32
    if use_req_ring:  # the tables are not read
        return 0
    _read_tensor(req_to_token, &r2t, "req_to_token", rid.dev)
    if r2t.dtype != I32 or r2t.ndim != 2:
        raise RuntimeError(f"req_to_token must be a 2-D int32 tensor (got {_passed(req_to_token)})")
    p.token_rows, p.token_cols = r2t.shape[0], r2t.shape[1]
    p.token_stride = p.token_cols
    if not r2t.contiguous:  # rows apart (a view of a wider table): their stride, each row itself contiguous
        strides = req_to_token.stride()
        if p.token_cols > 1 and strides[1] != 1:
            raise RuntimeError(f"req_to_token's rows must be contiguous (got strides {tuple(strides)})")
        p.token_stride = strides[0]
    p.req_to_token = <const int32_t*>r2t.data
    _vector(full_to_state, &f2s, "full_to_state", rid.dev, ANY, False)
    p.full_to_state = <const int64_t*>f2s.data
    p.num_full = f2s.shape[0]
    return 0


def decode_plan(req_pool_indices, req_to_token, full_to_state, seq_lens, *, swa_page_size, ring_size, use_req_ring,
                plan_d, stream=None, uint32_t flags=0):
    """A step's c4 decode records into plan_d (uint8 [B, 16]), one per request, in one launch: the library's
    status. req_pool_indices int64 [B]; req_to_token int32 [rows, T] (rows may lie apart); full_to_state int64;
    seq_lens int64 or int32 [B] (lengths with the new token); all on one device. Table values are data: a row
    the tables cannot address is -1 in the record, never read past."""
    cdef dsa_c4_plan_params p
    cdef Arg pd
    _head(&p, req_pool_indices=req_pool_indices, req_to_token=req_to_token, full_to_state=full_to_state,
          seq_lens=seq_lens, swa_page_size=swa_page_size, ring_size=ring_size, use_req_ring=use_req_ring, flags=flags)
    _rows(plan_d, &pd, "plan_d", p.device, p.batch_size, 16)
    p.plan_d = <dsa_c4_decode_record*>pd.data
    return launch(OP_DECODE, &p, p.device, stream)


def extend_plan(req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state, *, swa_page_size, ring_size,
                use_req_ring, plan_c, plan_w, stream=None, uint32_t flags=0):
    """An extend's c4 records from lengths on the tables' device: compress records into plan_c (uint8 [N, 16])
    and write records into plan_w (uint8 [N, 8]), each list in ragged-row order then padded to its N rows (N:
    the ragged rows, at most 65536), in one launch: the library's status. extend_lens int64 or int32 [B]; the
    other arguments as decode_plan's."""
    cdef dsa_c4_plan_params p
    cdef Arg ex, pc, pw
    _head(&p, req_pool_indices=req_pool_indices, req_to_token=req_to_token, full_to_state=full_to_state,
          seq_lens=seq_lens, swa_page_size=swa_page_size, ring_size=ring_size, use_req_ring=use_req_ring, flags=flags)
    _vector(extend_lens, &ex, "extend_lens", p.device, p.batch_size, True)
    _rows(plan_c, &pc, "plan_c", p.device, ANY, 16)
    _rows(plan_w, &pw, "plan_w", p.device, pc.shape[0], 8)
    if pc.shape[0] > 65536:
        raise RuntimeError(f"plan_c has {pc.shape[0]} rows; the records' ragged rows hold 16 bits (at most 65536)")
    p.extend_lens = ex.data
    p.extend_lens_int32 = ex.dtype == I32
    p.num_tokens = pc.shape[0]
    p.plan_c = <dsa_c4_compress_record*>pc.data
    p.plan_w = <dsa_c4_write_record*>pw.data
    return launch(OP_EXTEND, &p, p.device, stream)
