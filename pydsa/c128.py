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
import torch

import pyplan

from . import _abi, _fill_c128, _read
from ._abi import check as _check_status, lib
from ._op import SIZES, Prepared
from ._tensors import resolve_device
from .errors import ArgumentValueError

__all__ = ["c128_decode", "c128_prefill", "C128Decode", "C128Prefill", "DevicePlan"]

c128_decode = _fill_c128.c128_decode  # compiled: the call goes straight to its fill (pydsa/_fill_c128.pyx)
c128_prefill = _fill_c128.c128_prefill


class C128Decode(Prepared):
    """A validated decode call over fixed buffers; launch() re-runs it (e.g. for CUDA-graph
    capture or replay) with no re-validation. Contents of the buffers may change between launches."""

    _op, _fill = "decode", staticmethod(_fill_c128.decode)

    def __init__(self, state, kv_score, out, ape, indices, seq_lens, *, load_indices=None, store=None,
                 cache_slots=None, pdl=None, error_count=None):
        self._bind(state, kv_score, out, ape, indices, seq_lens, load_indices=load_indices, store=store,
                   cache_slots=cache_slots, pdl=pdl, error_count=error_count)


class DevicePlan:
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

    def __init__(self, max_tokens: int, max_batch: int, device="cuda"):
        for name, v, most in (("max_tokens", max_tokens, 0xFFFFFFFE), ("max_batch", max_batch, 0x7FFFFFFF)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
                raise ArgumentValueError(name, f"{name} must be an int in 1..{most} (got {v!r})")
        device = resolve_device(device)
        self.device = device
        self._dev = -1 if device.type == "cpu" else device.index
        self.max_tokens = int(max_tokens)
        self.max_batch = int(max_batch)
        self.compress_capacity = pyplan.compress_capacity(self.max_tokens, self.max_batch)
        self.write_capacity = self.max_batch
        self.buffer = torch.empty(16 * (1 + self.compress_capacity + self.write_capacity), dtype=torch.uint8,
                                  device=device)
        base = self.buffer.data_ptr()
        self.counts_ptr = base
        self.compress_ptr = base + 16
        self.write_ptr = base + 16 * (1 + self.compress_capacity)
        self.num_tokens = 0
        self.num_compress = 0
        self.num_write = 0
        self._records = (self._dev, self.compress_ptr, self.compress_capacity, self.write_ptr, self.write_capacity,
                         self.counts_ptr)
        # The host side of the plan, and the upload params over it (prepared once; plan() sets the counts).
        self._host = (np.empty(self.compress_capacity, pyplan.SEGMENT_DTYPE),
                      np.empty(self.write_capacity, pyplan.SEGMENT_DTYPE))
        self._upload = C.create_string_buffer(SIZES["upload"])
        self._upload_address = C.addressof(self._upload)
        _fill_c128.init_upload(self._upload_address, dev=self._dev, compress=self._host[0].ctypes.data,
                               write=self._host[1].ctypes.data, device_compress=self.compress_ptr,
                               device_write=self.write_ptr, compress_capacity=self.compress_capacity,
                               write_capacity=self.write_capacity, device_counts=self.counts_ptr)

    def plan(self, seq_lens, extend_lens, *, num_tokens=None, stream=None) -> "DevicePlan":
        """Plans on the host and enqueues the upload of the plan on `stream` (raw handle) or the
        current stream."""
        tokens = self.max_tokens if num_tokens is None else num_tokens
        if tokens > self.max_tokens:
            raise ArgumentValueError("num_tokens", f"num_tokens {tokens} exceeds this DevicePlan's max_tokens {self.max_tokens}")
        if len(seq_lens) > self.max_batch:
            raise ArgumentValueError("seq_lens", f"seq_lens: {len(seq_lens)} requests exceed this DevicePlan's max_batch "
                                                 f"{self.max_batch}")
        _, _, nc, nw = pyplan.plan_prefill(seq_lens, extend_lens, num_tokens=tokens, graph=True, out=self._host,
                                           return_counts=True)
        status = _upload(self._upload_address, nc, nw, self._dev, stream)
        if status:
            _check_status(status)
        self.num_tokens, self.num_compress, self.num_write = tokens, nc, nw
        return self

    @property
    def host_records(self) -> tuple:
        """The last plan's records as planned on the host: (compress, write) views of the real ones."""
        return self._host[0][:self.num_compress], self._host[1][:self.num_write]


_upload = _fill_c128.upload
_read.register_type("device_plan", DevicePlan)


class C128Prefill(Prepared):
    """A validated prefill call over fixed buffers (docs/spec.md, prefill); launch() re-runs it.

    `plan` is a (compress, write) pair of SEGMENT_DTYPE record arrays from pyplan.plan_prefill,
    read from host memory at every launch (re-plan into the same arrays with plan_prefill(...,
    out=...) and launch again), or a DevicePlan (read in place on the device: re-plan, then launch
    or replay a graph that captured this call)."""

    _op, _fill = "prefill", staticmethod(_fill_c128.prefill)

    def __init__(self, state, kv_score, out, ape, indices, plan, *, load_indices=None, compact=False, store=None,
                 cache_slots=None, pdl=None, error_count=None, cooperative=True):
        self._bind(state, kv_score, out, ape, indices, plan, load_indices=load_indices, compact=compact, store=store,
                   cache_slots=cache_slots, pdl=pdl, error_count=error_count, cooperative=cooperative)


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
