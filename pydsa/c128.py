"""Online c128 compression (SPEC 1): decode and prefill through libdsa_kernels.

CPU tensors run the host backend, CUDA tensors the kernels, on the framework's current stream
unless `stream` (a raw cudaStream_t handle as int) is given.
"""
from __future__ import annotations

import ctypes as C

import numpy as np
import torch

import pyplan

from . import _abi
from ._abi import CHUNK, FLAG_PDL, DecodeParams, PrefillParams, check as _check_status, lib, new
from ._tensors import _float32, _int32, check, current_stream, device_index, error_counter, resolve_device

__all__ = ["c128_decode", "c128_prefill", "C128Decode", "C128Prefill", "DevicePlan", "plan_prefill_c"]

_decode_fn = lib.dsa_c128_decode
_prefill_fn = lib.dsa_c128_prefill


def _state_and_dim(state: torch.Tensor):
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"state must be a torch.Tensor (got {type(state).__name__})")
    if state.dim() != 3 or state.shape[1] != 1 or state.shape[2] % 3 != 0:
        raise ValueError(f"state must have shape [num_slots, 1, 3*D] (got {list(state.shape)})")
    d = state.shape[2] // 3
    if d <= 0 or d % 64 != 0:
        raise ValueError(f"head dim D = state.shape[2] / 3 = {d} must be a positive multiple of 64")
    return d, state.device


def _error_ptr(error_count, device) -> int:
    if error_count is None:
        return error_counter(device).data_ptr()
    check(error_count, "error_count", _int32, (1,), device)
    return error_count.data_ptr()


def _c128_params(struct, state, kv_score, out, ape, *, pdl, error_count):
    """Checks the buffers both ops share and fills their fields of a new `struct`.
    Returns (params, device, rows of kv_score)."""
    d, device = _state_and_dim(state)
    check(state, "state", _float32, (None, 1, 3 * d), device)
    rows = kv_score.shape[0] if isinstance(kv_score, torch.Tensor) and kv_score.dim() == 2 else None
    check(kv_score, "kv_score", _float32, (rows, 2 * d), device)
    check(out, "out", _float32, (rows, d), device)
    check(ape, "ape", _float32, (CHUNK, d), device)
    p = new(struct)
    p.flags = FLAG_PDL if pdl else 0
    p.device = device_index(state)
    p.head_dim = d
    p.num_slots = state.shape[0]
    p.state, p.kv_score, p.out, p.ape = (t.data_ptr() for t in (state, kv_score, out, ape))
    p.error_count = _error_ptr(error_count, device)
    return p, device, rows


class _Prepared:
    """A validated call: a prebuilt params struct and the C entry point that takes it."""

    _fn = None

    def _bind_params(self, p) -> None:
        self._params = p
        self._ref = C.byref(p)
        self._dev = p.device

    def launch(self, stream=None) -> None:
        """Runs the prepared call on `stream` (raw handle) or the current stream."""
        status = self._fn(self._ref, current_stream(self._dev) if stream is None else stream)
        if status:
            _check_status(status)


class C128Decode(_Prepared):
    """A validated decode call over fixed buffers; launch() re-runs it (e.g. for CUDA-graph
    capture or replay) with no re-validation. Contents of the buffers may change between launches."""

    _fn = _decode_fn

    def __init__(self, state, kv_score, out, ape, indices, seq_lens, *, pdl=False, error_count=None):
        p, device, b = _c128_params(DecodeParams, state, kv_score, out, ape, pdl=pdl, error_count=error_count)
        check(indices, "indices", _int32, (b,), device)
        check(seq_lens, "seq_lens", _int32, (b,), device)
        self.device = device
        self._tensors = (state, kv_score, out, ape, indices, seq_lens, error_count)
        p.batch_size = b
        p.indices, p.seq_lens = indices.data_ptr(), seq_lens.data_ptr()
        self._bind_params(p)


def c128_decode(state, kv_score, out, ape, indices, seq_lens, *, stream=None, pdl=False,
                error_count=None) -> None:
    """One new token per request (SPEC 1.2). state [S,1,3D] f32, kv_score [B,2D] f32, out [B,D]
    f32 (rows of requests that close a chunk are written), ape [128,D] f32, indices [B] int32,
    seq_lens [B] int32 (<= 0: padding)."""
    C128Decode(state, kv_score, out, ape, indices, seq_lens, pdl=pdl, error_count=error_count).launch(stream)


class DevicePlan:
    """Prefill plans staged in pinned memory and copied to the device on the caller's stream.

    Sized once for at most `max_tokens` new tokens and `max_batch` requests; every plan() pads
    the record lists to that capacity (CUDA-graph mode) and puts the real counts in device
    memory, so a graph captured once stays valid and the kernels' work follows the real counts.
    Staging is double-buffered: re-planning while the previous copy is in flight is safe.
    """

    def __init__(self, max_tokens: int, max_batch: int, device="cuda"):
        if max_tokens <= 0 or max_batch <= 0:
            raise ValueError(f"max_tokens and max_batch must be positive (got {max_tokens}, {max_batch})")
        device = resolve_device(device)
        self.device = device
        self.max_tokens = int(max_tokens)
        self.max_batch = int(max_batch)
        self.compress_capacity = pyplan.compress_capacity(self.max_tokens, self.max_batch)
        self.write_capacity = self.max_batch
        self._nbytes = 16 * (1 + self.compress_capacity + self.write_capacity)
        pin = device.type == "cuda"
        self._staging = [torch.empty(self._nbytes, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self._views = [self._split(s.numpy()) for s in self._staging]
        self._events = [torch.cuda.Event() if pin else None for _ in range(2)]
        self._used = [False, False]
        self._next = 0
        self.buffer = torch.empty(self._nbytes, dtype=torch.uint8, device=device)
        base = self.buffer.data_ptr()
        self.counts_ptr = base
        self.compress_ptr = base + 16
        self.write_ptr = base + 16 * (1 + self.compress_capacity)
        self.num_tokens = 0
        self.num_compress = 0
        self.num_write = 0

    def _split(self, raw: np.ndarray):
        counts = raw[:16].view(np.int64)
        compress = raw[16:16 * (1 + self.compress_capacity)]
        write = raw[16 * (1 + self.compress_capacity):]
        return counts, compress, write

    def plan(self, seq_lens, extend_lens, *, num_tokens=None, stream=None) -> "DevicePlan":
        """Plans on the host into the next staging buffer and enqueues its copy to the device."""
        slot = self._next
        self._next ^= 1
        event = self._events[slot]
        if self._used[slot] and event is not None:
            event.synchronize()  # that buffer's previous copy must have left before it is reused
        counts, compress, write = self._views[slot]
        tokens = self.max_tokens if num_tokens is None else num_tokens
        if tokens > self.max_tokens:
            raise ValueError(f"num_tokens {tokens} exceeds this DevicePlan's max_tokens {self.max_tokens}")
        if len(seq_lens) > self.max_batch:
            raise ValueError(f"{len(seq_lens)} requests exceed this DevicePlan's max_batch {self.max_batch}")
        _, _, nc, nw = pyplan.plan_prefill(seq_lens, extend_lens, num_tokens=tokens, graph=True,
                                           out=(compress, write), return_counts=True)
        counts[0], counts[1] = nc, nw
        self.num_tokens, self.num_compress, self.num_write = tokens, nc, nw
        if self.device.type == "cuda":
            s = torch.cuda.current_stream(self.device) if stream is None else torch.cuda.ExternalStream(stream, device=self.device)
            with torch.cuda.stream(s):
                self.buffer.copy_(self._staging[slot], non_blocking=True)
                event.record(s)
        else:
            self.buffer.copy_(self._staging[slot])
        self._used[slot] = True
        return self


class C128Prefill(_Prepared):
    """A validated prefill call over fixed buffers (SPEC 1.3); launch() re-runs it.

    `plan` is a (compress, write) pair of SEGMENT_DTYPE record arrays from pyplan.plan_prefill
    (copied to the op's device here) or a DevicePlan (read in place: re-plan, then launch or
    replay a graph that captured this call)."""

    _fn = _prefill_fn

    def __init__(self, state, kv_score, out, ape, indices, plan, *, load_indices=None, pdl=False,
                 error_count=None):
        p, device, n = _c128_params(PrefillParams, state, kv_score, out, ape, pdl=pdl, error_count=error_count)
        b = indices.shape[0] if isinstance(indices, torch.Tensor) and indices.dim() == 1 else None
        check(indices, "indices", _int32, (b,), device)
        if load_indices is not None:
            check(load_indices, "load_indices", _int32, (b,), device)
        p.batch_size = b
        p.num_tokens = n
        p.indices = indices.data_ptr()
        p.load_indices = load_indices.data_ptr() if load_indices is not None else None
        keep = [state, kv_score, out, ape, indices, load_indices, error_count]
        if isinstance(plan, DevicePlan):
            if plan.device != device:
                raise ValueError(f"plan is a DevicePlan on {plan.device} but the tensors are on {device}")
            p.compress, p.write, p.counts = plan.compress_ptr, plan.write_ptr, plan.counts_ptr
            p.compress_capacity, p.write_capacity = plan.compress_capacity, plan.write_capacity
            keep.append(plan)
        else:
            try:
                compress, write = plan
            except (TypeError, ValueError):
                raise TypeError("plan must be a (compress, write) pair from pyplan.plan_prefill or a DevicePlan") from None
            for name, records in (("plan[0] (compress)", compress), ("plan[1] (write)", write)):
                if not isinstance(records, np.ndarray) or records.dtype != pyplan.SEGMENT_DTYPE or records.ndim != 1:
                    raise TypeError(f"{name} must be a 1-D numpy array of pyplan.SEGMENT_DTYPE records")
            both = np.ascontiguousarray(np.concatenate([compress, write])).view(np.uint8)
            records = torch.from_numpy(both)
            records = records.to(device) if device.type == "cuda" else records
            p.compress = records.data_ptr()
            p.write = records.data_ptr() + 16 * len(compress)
            p.compress_capacity, p.write_capacity = len(compress), len(write)
            p.counts = None
            keep.append(records)
        self._keep = keep
        self._bind_params(p)


def c128_prefill(state, kv_score, out, ape, indices, plan, *, load_indices=None, stream=None,
                 pdl=False, error_count=None) -> None:
    """Many new tokens per request (SPEC 1.3). kv_score [N,2D] ragged, out [N,D] (chunk-closing
    rows are written), indices / load_indices [B] int32, plan from pyplan.plan_prefill or a
    DevicePlan."""
    C128Prefill(state, kv_score, out, ape, indices, plan, load_indices=load_indices, pdl=pdl,
                error_count=error_count).launch(stream)


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
