"""Online c128 compression (docs/spec.md, online c128): decode and prefill through libdsa_kernels.

CPU tensors run the host backend, CUDA tensors the kernels, on the framework's current stream
unless `stream` (a raw cudaStream_t handle as int) is given. The state is float32 or bfloat16
(its dtype selects it, docs/spec.md, the state, output layouts); everything else is float32 / int32.

Every call is cheap enough to make per layer per step: the one-shot functions check their
tensors, fill a params buffer in one go and launch; they never synchronize and never allocate.
Plans from pyplan travel inside the kernel launches (the library reads them from host memory),
so a prefill needs no copy to the device.
"""
from __future__ import annotations

import ctypes as C

import numpy as np

import pyplan

from . import _fill_c128, _fill_records, _read
from ._abi import check as _check_status, lib
from .errors import ArgumentValueError

__all__ = ["c128_decode", "c128_prefill", "C128Decode", "C128Prefill", "DevicePlan", "c128_decode_records",
           "c128_prefill_records"]

c128_decode = _fill_c128.c128_decode  # compiled: the call goes straight to its fill (pydsa/_fill_c128.pyx)
c128_prefill = _fill_c128.c128_prefill
DevicePlan = _fill_c128.DevicePlan  # compiled, recognised by type where a prefill takes its plan
# the prepared forms (compiled, over pydsa/_read.pyx's Prepared): arguments judged once, launch() runs them again
C128Decode = _fill_c128.C128Decode
C128Prefill = _fill_c128.C128Prefill
# sglang's 16-byte request and segment records of an online c128 step (compiled, pydsa/_fill_records.pyx), written
# in one launch; each returns the library's status (pydsa.check_status raises it), the launch flags are the caller's
# (pydsa.DEFAULT_PDL_FLAG: the ops' default)
c128_decode_records = _fill_records.decode_records
c128_prefill_records = _fill_records.prefill_records


class PlanParams(C.Structure):
    """dsa_plan_params, filled through ctypes by plan_prefill_c (a C caller's path, measured as such)."""
    _fields_ = [
        ("struct_size", C.c_uint32), ("graph_mode", C.c_uint32),
        ("batch_size", C.c_int64), ("num_tokens", C.c_int64),
        ("seq_lens", C.c_void_p), ("extend_lens", C.c_void_p),
        ("compress", C.c_void_p), ("write", C.c_void_p),
        ("compress_capacity", C.c_int64), ("write_capacity", C.c_int64),
        ("num_compress", C.c_void_p), ("num_write", C.c_void_p),
    ]


_read.declare_struct("plan_params", _read.STRUCT_IDS["plan_params"], C.sizeof(PlanParams))
_read.declare_struct("segment", _read.STRUCT_IDS["segment"], pyplan.SEGMENT_DTYPE.itemsize)


def plan_prefill_c(seq_lens, extend_lens, *, num_tokens=None, graph=False, capacity=None):
    """The C planner (dsa_c128_plan_prefill) through ctypes, with pyplan.plan_prefill's plain
    contract: returns (compress, write, num_compress, num_write). For C-ABI parity tests and
    benchmarks; Python callers normally use pyplan."""
    seq = np.ascontiguousarray(seq_lens, dtype=np.int64)
    ext = np.ascontiguousarray(extend_lens, dtype=np.int64)
    if seq.shape != ext.shape or seq.ndim != 1:
        raise ArgumentValueError("seq_lens", f"seq_lens and extend_lens must be 1-D of one length (got {seq.shape}, {ext.shape})")
    b = seq.shape[0]
    total = int(ext.sum()) if num_tokens is None else int(num_tokens)
    if capacity is None:
        capacity = (pyplan.compress_capacity(max(total, 0), b), b)
    compress = np.empty(capacity[0], pyplan.SEGMENT_DTYPE)
    write = np.empty(capacity[1], pyplan.SEGMENT_DTYPE)
    counts = np.zeros(2, np.int64)
    p = PlanParams(struct_size=C.sizeof(PlanParams))
    p.graph_mode = 1 if graph else 0
    p.batch_size, p.num_tokens = b, total
    p.seq_lens, p.extend_lens = seq.ctypes.data, ext.ctypes.data
    p.compress, p.write = compress.ctypes.data, write.ctypes.data
    p.compress_capacity, p.write_capacity = capacity
    p.num_compress, p.num_write = counts.ctypes.data, counts.ctypes.data + 8
    _check_status(lib.dsa_c128_plan_prefill(C.byref(p)))
    nc, nw = int(counts[0]), int(counts[1])
    if not graph:
        compress, write = compress[:nc], write[:nw]
    return compress, write, nc, nw
