# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The request and segment records (docs/spec.md, records) written in one launch: a decode's request
records from its lengths, a prefill's segment records from pyplan's record arrays (read from host
memory during the call), each with the slots resolved from req_pool_indices. The arguments are judged
here; a wrong one raises a RuntimeError naming it and what was passed (the records' callers speak
another framework's words: pydsa.sglang)."""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uintptr_t
from libc.string cimport memset

from pydsa._read cimport *

cdef extern from "dsa_kernels.h":  # this family's params, as the header lays them out
    int DSA_STRUCT_RECORDS_PARAMS
    ctypedef struct dsa_request_records_params:
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

cdef int OP_RECORDS = declare_op("records", "dsa_request_records", DSA_STRUCT_RECORDS_PARAMS,
                                 sizeof(dsa_request_records_params))



cdef str _passed(object x):
    """What the caller passed, in its own terms: a tensor's dtype, shape and device, else its type."""
    if hasattr(x, "dtype") and hasattr(x, "shape") and hasattr(x, "device"):
        return f"{str(x.dtype).replace('torch.', '')} {list(x.shape)} on {x.device}"
    module = type(x).__module__
    return type(x).__name__ if module == "builtins" else f"{module}.{type(x).__name__}"


cdef int _int64_vector(object obj, Arg* a, str name, int32_t dev, int64_t n) except -1:
    """A contiguous int64 [n] (n ANY: any length) on `dev` (OTHER_DEVICE: any host or CUDA device)."""
    cdef Arg t
    if not is_tensor(obj):
        raise RuntimeError(f"{name} must be a torch.Tensor (got {_passed(obj)})")
    read(obj, a, name, None)
    if a.dtype != I64 or a.ndim != 1 or not a.contiguous or a.dev == OTHER_DEVICE:
        raise RuntimeError(f"{name} must be a contiguous 1-D int64 tensor (got {_passed(obj)})")
    if n != ANY and a.shape[0] != n:
        raise RuntimeError(f"{name} has {a.shape[0]} entries but {n} were expected")
    if dev != OTHER_DEVICE and a.dev != dev:
        raise RuntimeError(f"{name} must be on {'cpu' if dev < 0 else f'cuda:{dev}'} (got {_passed(obj)})")
    return 0


cdef int _head(dsa_request_records_params* p, int kind, req_pool_indices, object offset, uint32_t flags,
               Arg* rid) except -1:
    """The fields both kinds share; rid read (int64 [B])."""
    _int64_vector(req_pool_indices, rid, "req_pool_indices", OTHER_DEVICE, ANY)
    if type(offset) is not int or not 0 <= offset < 2**31:
        raise RuntimeError(f"state_slot_offset must be an int in 0..2^31-1 (got {offset!r})")
    memset(p, 0, sizeof(dsa_request_records_params))
    p.struct_size = sizeof(dsa_request_records_params)
    p.flags = flags
    p.device = rid.dev
    p.kind = kind
    p.batch_size = rid.shape[0]
    p.state_slot_offset = offset
    p.req_pool_indices = <const int64_t*>rid.data
    return 0


def decode_records(seq_lens, req_pool_indices, *, state_slot_offset, plan_d, stream=None, uint32_t flags=0):
    """Request records [B, 16] {seq_len, slot, load slot, -1} of a decode, in one launch: the library's
    status. seq_lens and req_pool_indices int64 [B] on one device; slot = req_pool_indices[b] +
    state_slot_offset; plan_d uint8 [B, 16] on their device. A seq_len outside 0..2^31-1 becomes a padding
    record and is counted."""
    cdef dsa_request_records_params p
    cdef Arg rid, sq, pd
    _int64_vector(seq_lens, &sq, "seq_lens", OTHER_DEVICE, ANY)
    _head(&p, DSA_RECORDS_DECODE, req_pool_indices, state_slot_offset, flags, &rid)
    if sq.shape[0] != rid.shape[0]:
        raise RuntimeError(f"seq_lens and req_pool_indices must have one length (got {sq.shape[0]} and "
                           f"{rid.shape[0]})")
    if sq.dev != rid.dev:
        raise RuntimeError(f"seq_lens and req_pool_indices must be on one device (got {seq_lens.device} and "
                           f"{req_pool_indices.device})")
    tensor(plan_d, &pd, "plan_d", U8, rid.dev, 2, p.batch_size, 16, None)
    error_counter(None, rid.dev, &p.error_count, None)
    p.seq_lens = <const int64_t*>sq.data
    p.plan_d = <uint8_t*>pd.data
    return launch(OP_RECORDS, &p, p.device, stream)


def prefill_records(compress, write, req_pool_indices, *, state_slot_offset, plan_c, plan_w, slots, load_slots,
                    stream=None, uint32_t flags=0):
    """A prefill's segment records {position + 1, ragged row | window_len << 16, slot, load slot} into
    plan_c / plan_w (uint8 [rows, 16], padded past the records) and its slots [B], in one launch: the
    library's status."""
    cdef dsa_request_records_params p
    cdef Arg rid, pc, pw, ls, sl
    cdef uintptr_t cp, wp
    cdef int64_t nc, nw
    cp, nc, wp, nw = record_lists(compress, write)  # raises for arrays that are not pyplan's records
    _head(&p, DSA_RECORDS_PREFILL, req_pool_indices, state_slot_offset, flags, &rid)
    vector(slots, &sl, "slots", I32, rid.dev, p.batch_size, None)
    tensor(plan_c, &pc, "plan_c", U8, rid.dev, 2, ANY, 16, None)
    tensor(plan_w, &pw, "plan_w", U8, rid.dev, 2, ANY, 16, None)
    if pc.shape[0] < nc or pw.shape[0] < nw:
        raise RuntimeError(f"plan_c / plan_w hold {pc.shape[0]} / {pw.shape[0]} rows but the plan has {nc} / {nw} "
                           f"records")
    vector(load_slots, &ls, "load_slots", I32, rid.dev, p.batch_size, None)
    p.slots = <int32_t*>sl.data
    p.load_slots = <int32_t*>ls.data
    p.compress = <const dsa_segment*>cp
    p.write = <const dsa_segment*>wp
    p.num_compress = nc
    p.num_write = nw
    p.plan_c = <uint8_t*>pc.data
    p.plan_w = <uint8_t*>pw.data
    p.compress_rows = pc.shape[0]
    p.write_rows = pw.shape[0]
    return launch(OP_RECORDS, &p, p.device, stream)
