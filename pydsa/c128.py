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
import threading

import numpy as np
import torch

import pyplan

from . import _abi, _calls
from ._abi import (CHUNK, DECODE_FORMAT, FLAG_HOST_PLAN, FLAG_NO_COOPERATIVE, FLAG_PDL, OUT_COMPACT, OUT_RAGGED,
                   DEFAULT_PDL_FLAG, PREFILL_FORMAT, check as _check_status, lib, new, pdl_flag)
from .store import store_fields
from ._tensors import (_float32, _int32, as_tensor, device_name, error_ptr, launch_stream, ptr, resolve_device,
                       rows_ptr, shaped_ptr)

__all__ = ["c128_decode", "c128_prefill", "C128Decode", "C128Prefill", "DevicePlan", "plan_prefill_c"]

_decode_fn = lib.dsa_c128_decode
_prefill_fn = lib.dsa_c128_prefill
_upload_fn = lib.dsa_c128_upload_plan
_STATE_DTYPES = {torch.float32: _abi.STATE_FLOAT32, torch.bfloat16: _abi.STATE_BFLOAT16}
_DECODE_SIZE = DECODE_FORMAT.size
_PREFILL_SIZE = PREFILL_FORMAT.size


def _state(state) -> tuple:
    """(pointer, device, num_slots, D, state dtype id) of the state argument [S, 1, 3D]."""
    try:
        sdt = _STATE_DTYPES.get(state.dtype)
        slots, one, width = state.shape
        if sdt is not None and one == 1 and width % 192 == 0 and width > 0 and state.is_contiguous():
            return state.data_ptr(), state.get_device(), slots, width // 3, sdt
    except (AttributeError, ValueError):
        pass
    state = as_tensor(state, "state")
    if state.dtype not in _STATE_DTYPES:
        raise TypeError(f"state must have dtype torch.float32 or torch.bfloat16 (got {state.dtype})")
    if state.dim() != 3 or state.shape[1] != 1 or state.shape[2] % 3 != 0:
        raise ValueError(f"state must have shape [num_slots, 1, 3*D] (got {list(state.shape)})")
    d = state.shape[2] // 3
    if d <= 0 or d % 64 != 0:
        raise ValueError(f"head dim D = state.shape[2] / 3 = {d} must be a positive multiple of 64")
    if not state.is_contiguous():
        raise ValueError(f"state must be contiguous (got strides {state.stride()})")
    if state.device.type not in ("cpu", "cuda"):
        raise ValueError(f"tensors must be on the CPU or a CUDA device (got {state.device})")
    return state.data_ptr(), state.get_device(), state.shape[0], d, _STATE_DTYPES[state.dtype]


# One params buffer per op and thread for the one-shot calls: filled in one pack_into, launched.
_local = threading.local()


def _launch_once(name: str, fmt, fn, fields: tuple, stream) -> None:
    """The Python path of a one-shot call: params packed from checked fields, ctypes call."""
    try:
        buf, address = getattr(_local, name)
    except AttributeError:
        buf = C.create_string_buffer(fmt.size)
        address = C.addressof(buf)
        setattr(_local, name, (buf, address))
    fmt.pack_into(buf, 0, *fields)
    status = fn(address, launch_stream(stream, fields[2]))
    if status:
        _check_status(status)


def _out_ptr(out, store, dev: int, shape: tuple) -> int:
    """`out`'s pointer; None is allowed (0) when the op stores its vectors into a cache."""
    if out is None and store is not None:
        return 0
    return ptr(out, "out", _float32, dev, shape)


def _decode_fields(state, kv_score, out, ape, indices, seq_lens, pdl, error_count, load_indices=None, store=None,
                   cache_slots=None) -> tuple:
    sp, dev, slots, d, sdt = _state(state)
    kp, b = rows_ptr(kv_score, "kv_score", _float32, dev, 2 * d)
    return (_DECODE_SIZE, pdl_flag(pdl), dev, d, slots, b, sp, kp,
            _out_ptr(out, store, dev, (b, d)), ptr(ape, "ape", _float32, dev, (CHUNK, d)),
            ptr(indices, "indices", _int32, dev, (b,)), ptr(seq_lens, "seq_lens", _int32, dev, (b,)),
            error_ptr(error_count, dev), sdt, 0,
            0 if load_indices is None else ptr(load_indices, "load_indices", _int32, dev, (b,)),
            *store_fields(store, cache_slots, dev, d, b))


def c128_decode(state, kv_score, out, ape, indices, seq_lens, *, load_indices=None, store=None, cache_slots=None,
                stream=None, pdl=None, error_count=None) -> None:
    """One new token per request (docs/spec.md, decode). state [S,1,3D] f32 or bf16, kv_score [B,2D] f32,
    out [B,D] f32 (rows of requests that close a chunk are written), ape [128,D] f32, indices [B]
    int32 (one slot per live row: two rows updating one slot race on the GPU), seq_lens [B] int32
    (<= 0: padding). load_indices [B] int32: the slot each request's state is read from (e.g. the
    accepted bank entry that c128_commit resolved; negative: not held on this GPU, skipped); the
    new state is stored into `indices`. Default: `indices`. store: a pydsa.KVCache that every closed
    vector is also stored into, at cache_slots[b] (int64 [B]); `out` may then be None. pdl: None
    launches with programmatic dependent launch where every compiled architecture supports it."""
    flags = DEFAULT_PDL_FLAG if pdl is None else FLAG_PDL if pdl else 0  # pdl_flag, inline
    status = _fast_decode(state, kv_score, out, ape, indices, seq_lens, stream, flags, error_count, load_indices,
                          store, cache_slots)
    if status:
        if status != DECLINED:
            _check_status(status)  # raises
        _launch_once("decode", DECODE_FORMAT, _decode_fn,
                     _decode_fields(state, kv_score, out, ape, indices, seq_lens, pdl, error_count, load_indices,
                                    store, cache_slots),
                     stream)


class _Prepared:
    """A validated call: a filled params buffer and the C entry point that takes it."""

    _fn = None
    _format = None
    _op = None

    def _bind_fields(self, fields: tuple) -> None:
        self._buf = C.create_string_buffer(self._format.size)
        self._format.pack_into(self._buf, 0, *fields)
        self._address = C.addressof(self._buf)
        self._dev = fields[2]
        self.device = device_name(self._dev)

    def launch(self, stream=None) -> None:
        """Runs the prepared call on `stream` (raw handle) or the current stream."""
        status = _launch(self._op, self._address, self._dev, stream)
        if status:
            if status == DECLINED:
                status = self._fn(self._address, launch_stream(stream, self._dev))
            _check_status(status)


class C128Decode(_Prepared):
    """A validated decode call over fixed buffers; launch() re-runs it (e.g. for CUDA-graph
    capture or replay) with no re-validation. Contents of the buffers may change between launches."""

    _fn = _decode_fn
    _format = DECODE_FORMAT
    _op = _calls.OP_DECODE

    def __init__(self, state, kv_score, out, ape, indices, seq_lens, *, load_indices=None, store=None,
                 cache_slots=None, pdl=None, error_count=None):
        self._bind_fields(_decode_fields(state, kv_score, out, ape, indices, seq_lens, pdl, error_count,
                                         load_indices, store, cache_slots))
        self._keep = (state, kv_score, out, ape, indices, seq_lens, error_count, load_indices, store, cache_slots)


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
        if max_tokens <= 0 or max_batch <= 0:
            raise ValueError(f"max_tokens and max_batch must be positive (got {max_tokens}, {max_batch})")
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
        up = self._upload = new(_abi.PlanUploadParams)
        up.device = self._dev
        up.compress, up.write = self._host[0].ctypes.data, self._host[1].ctypes.data
        up.device_compress, up.device_write, up.device_counts = self.compress_ptr, self.write_ptr, self.counts_ptr
        up.compress_capacity, up.write_capacity = self.compress_capacity, self.write_capacity
        self._upload_address = C.addressof(up)

    def plan(self, seq_lens, extend_lens, *, num_tokens=None, stream=None) -> "DevicePlan":
        """Plans on the host and enqueues the upload of the plan on `stream` (raw handle) or the
        current stream."""
        tokens = self.max_tokens if num_tokens is None else num_tokens
        if tokens > self.max_tokens:
            raise ValueError(f"num_tokens {tokens} exceeds this DevicePlan's max_tokens {self.max_tokens}")
        if len(seq_lens) > self.max_batch:
            raise ValueError(f"{len(seq_lens)} requests exceed this DevicePlan's max_batch {self.max_batch}")
        _, _, nc, nw = pyplan.plan_prefill(seq_lens, extend_lens, num_tokens=tokens, graph=True, out=self._host,
                                           return_counts=True)
        status = _upload(self._upload_address, nc, nw, self._dev, stream)
        if status:
            if status == DECLINED:  # the counts are set: only the stream could not be read
                status = _upload_fn(self._upload_address, launch_stream(stream, self._dev))
            _check_status(status)
        self.num_tokens, self.num_compress, self.num_write = tokens, nc, nw
        return self

    @property
    def host_records(self) -> tuple:
        """The last plan's records as planned on the host: (compress, write) views of the real ones."""
        return self._host[0][:self.num_compress], self._host[1][:self.num_write]


def _prefill_flags(pdl, cooperative) -> int:
    return pdl_flag(pdl) | (0 if cooperative else FLAG_NO_COOPERATIVE)


def _prefill_fields(state, kv_score, out, ape, indices, plan, load_indices, flags, error_count, compact, store=None,
                    cache_slots=None) -> tuple:
    sp, dev, slots, d, sdt = _state(state)
    kp, n = rows_ptr(kv_score, "kv_score", _float32, dev, 2 * d)
    try:
        b = indices.shape[0]
    except (AttributeError, IndexError):
        b = None
    ip = ptr(indices, "indices", _int32, dev, (b,))
    lp = 0 if load_indices is None else ptr(load_indices, "load_indices", _int32, dev, (b,))
    if type(plan) is tuple and len(plan) == 2 and type(plan[0]) is np.ndarray:
        cp, nc, wp, nw = pyplan.record_lists(plan[0], plan[1])
        counts = 0
        flags |= FLAG_HOST_PLAN
    elif type(plan) is tuple and len(plan) == 2 and isinstance(plan[0], torch.Tensor):
        # Record tensors as sglang keeps them: uint8 [M, 16], on the op's device (read there) or
        # in host memory (carried inside the launches).
        where = plan[0].get_device()
        if where != dev and where != -1:
            raise ValueError(f"plan tensors are on {plan[0].device} but the other tensors are on {device_name(dev)}")
        cp, (nc, _) = shaped_ptr(plan[0], "plan[0] (compress)", torch.uint8, where, 2)
        wp, (nw, _) = shaped_ptr(plan[1], "plan[1] (write)", torch.uint8, where, 2)
        if plan[0].shape[1] != 16 or plan[1].shape[1] != 16:
            raise ValueError(f"plan tensors must have shape [M, 16] (got {list(plan[0].shape)} and {list(plan[1].shape)})")
        counts = 0
        if where == -1:
            flags |= FLAG_HOST_PLAN
    elif isinstance(plan, DevicePlan):
        if plan._dev != dev:
            raise ValueError(f"plan is a DevicePlan on {plan.device} but the tensors are on {device_name(dev)}")
        cp, nc, wp, nw, counts = (plan.compress_ptr, plan.compress_capacity, plan.write_ptr,
                                  plan.write_capacity, plan.counts_ptr)
    else:
        if type(plan) is list and len(plan) == 2:
            return _prefill_fields(state, kv_score, out, ape, indices, tuple(plan), load_indices, flags,
                                   error_count, compact, store, cache_slots)
        raise TypeError("plan must be a (compress, write) pair from pyplan.plan_prefill (or of uint8 [M, 16] "
                        "record tensors) or a DevicePlan")
    op = _out_ptr(out, store, dev, (nc if compact else n, d))
    return (_PREFILL_SIZE, flags, dev, d, slots, b, n, sp, kp, op, ptr(ape, "ape", _float32, dev, (CHUNK, d)),
            ip, lp, cp, wp, nc, nw, counts, error_ptr(error_count, dev), sdt, OUT_COMPACT if compact else OUT_RAGGED,
            *store_fields(store, cache_slots, dev, d, n))


def c128_prefill(state, kv_score, out, ape, indices, plan, *, load_indices=None, compact=False, store=None,
                 cache_slots=None, stream=None, pdl=None, error_count=None, cooperative=True) -> None:
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
    vector into a pydsa.KVCache as well, in the same launch; `out` may then be None."""
    flags = ((DEFAULT_PDL_FLAG if pdl is None else FLAG_PDL if pdl else 0)
             | (0 if cooperative else FLAG_NO_COOPERATIVE))  # _prefill_flags, inline
    status = DECLINED if store is not None else _fast_prefill(state, kv_score, out, ape, indices, plan, load_indices,
                                                              stream, flags, error_count, compact)
    if status:
        if status != DECLINED:
            _check_status(status)  # raises
        _launch_once("prefill", PREFILL_FORMAT, _prefill_fn,
                     _prefill_fields(state, kv_score, out, ape, indices, plan, load_indices, flags, error_count,
                                     compact, store, cache_slots), stream)


# The compiled call path (pydsa/_calls.pyx): tensors read through the DLPack C exchange API, the
# entry points called directly. Where it declines a call (an argument it cannot read or that is
# wrong, or a torch without the exchange API) the Python path above takes it.
_calls.init(torch.Tensor, C.cast(_decode_fn, C.c_void_p).value, C.cast(_prefill_fn, C.c_void_p).value,
            C.cast(lib.dsa_metadata_copy, C.c_void_p).value, C.cast(lib.dsa_c128_upload_plan, C.c_void_p).value,
            C.cast(lib.dsa_c128_verify, C.c_void_p).value, C.cast(lib.dsa_c128_commit, C.c_void_p).value,
            DevicePlan, np.ndarray, pyplan.record_lists)
DECLINED = _calls.DECLINED
_fast_decode = _calls.decode
_fast_prefill = _calls.prefill
_launch = _calls.launch
_upload = _calls.upload


class C128Prefill(_Prepared):
    """A validated prefill call over fixed buffers (docs/spec.md, prefill); launch() re-runs it.

    `plan` is a (compress, write) pair of SEGMENT_DTYPE record arrays from pyplan.plan_prefill,
    read from host memory at every launch (re-plan into the same arrays with plan_prefill(...,
    out=...) and launch again), or a DevicePlan (read in place on the device: re-plan, then launch
    or replay a graph that captured this call)."""

    _fn = _prefill_fn
    _format = PREFILL_FORMAT
    _op = _calls.OP_PREFILL

    def __init__(self, state, kv_score, out, ape, indices, plan, *, load_indices=None, compact=False, store=None,
                 cache_slots=None, pdl=None, error_count=None, cooperative=True):
        self._bind_fields(_prefill_fields(state, kv_score, out, ape, indices, plan, load_indices,
                                          _prefill_flags(pdl, cooperative), error_count, compact, store, cache_slots))
        self._keep = (state, kv_score, out, ape, indices, plan, load_indices, error_count)


def plan_prefill_c(seq_lens, extend_lens, *, num_tokens=None, graph=False, capacity=None):
    """The C planner (dsa_c128_plan_prefill) through ctypes, with pyplan.plan_prefill's plain
    contract: returns (compress, write, num_compress, num_write). For C-ABI parity tests and
    benchmarks; Python callers normally use pyplan."""
    seq = np.ascontiguousarray(seq_lens, dtype=np.int64)
    ext = np.ascontiguousarray(extend_lens, dtype=np.int64)
    if seq.shape != ext.shape or seq.ndim != 1:
        raise ValueError(f"seq_lens and extend_lens must be 1-D of one length (got {seq.shape}, {ext.shape})")
    b = seq.shape[0]
    total = int(ext.sum()) if num_tokens is None else int(num_tokens)
    if capacity is None:
        capacity = (pyplan.compress_capacity(max(total, 0), b), b)
    compress = np.empty(capacity[0], pyplan.SEGMENT_DTYPE)
    write = np.empty(capacity[1], pyplan.SEGMENT_DTYPE)
    counts = np.zeros(2, np.int64)
    p = new(_abi.PlanParams)
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
