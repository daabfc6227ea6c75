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

from . import _abi, _calls
from ._abi import (CHUNK, DEFAULT_PDL_FLAG, FLAG_PDL, FLAG_NO_COOPERATIVE, check as _check_status, lib, new,
                   pdl_flag)
from ._op import DECLINED, SIZES, Prepared, call_checked, counter_arg, state_arg
from ._tensors import (_float32, _int32, arg, as_tensor, device_name, launch_stream, optional_arg, resolve_device, rows_arg,
                       shaped_arg)
from .store import store_arg

__all__ = ["c128_decode", "c128_prefill", "C128Decode", "C128Prefill", "DevicePlan", "plan_prefill_c"]

_fast_decode = _calls.decode
_fast_prefill = _calls.prefill


def _out_arg(out, store, dev: int, shape: tuple):
    """`out`, checked; None is allowed when the op stores its vectors into a cache."""
    if out is None and store is not None:
        return None
    return arg(out, "out", _float32, dev, shape)


def _decode_checked(state, kv_score, out, ape, indices, seq_lens, error_count, load_indices=None, store=None,
                    cache_slots=None) -> tuple:
    """The decode's arguments checked (a wrong one raises, naming it) and as tensors; and the device."""
    state, dev, _, d = state_arg(state)
    kv_score, b = rows_arg(kv_score, "kv_score", _float32, dev, 2 * d)
    if seq_lens is None:  # indices are records
        if load_indices is not None:
            raise ValueError("load_indices must be None when seq_lens is None (the records in `indices` carry the "
                             "load slots)")
        records = as_tensor(indices, "indices")
        if records.dim() != 2:
            raise TypeError(f"seq_lens must be an int32 [{b}] tensor; it may be None only when indices holds one "
                            f"record per request (int32 [B, 4] or uint8 [B, 16]), got indices of shape "
                            f"{list(records.shape)}")
        indices = (arg(records, "indices", torch.uint8, dev, (b, 16)) if records.dtype is torch.uint8
                   else arg(records, "indices (records: int32 [B, 4] or uint8 [B, 16])", _int32, dev, (b, 4)))
    else:
        indices = arg(indices, "indices", _int32, dev, (b,))
        seq_lens = arg(seq_lens, "seq_lens", _int32, dev, (b,))
    return dict(state=state, kv_score=kv_score, out=_out_arg(out, store, dev, (b, d)),
                ape=arg(ape, "ape", _float32, dev, (CHUNK, d)), indices=indices, seq_lens=seq_lens,
                error_count=counter_arg(error_count, dev),
                load_indices=optional_arg(load_indices, "load_indices", dev, (b,)), store=store,
                cache_slots=store_arg(store, cache_slots, dev, d, b)), dev


def c128_decode(state, kv_score, out, ape, indices, seq_lens, *, load_indices=None, store=None, cache_slots=None,
                stream=None, pdl=None, error_count=None) -> None:
    """One new token per request (docs/spec.md, decode). state [S,1,3D] f32 or bf16, kv_score [B,2D] f32,
    out [B,D] f32 (rows of requests that close a chunk are written), ape [128,D] f32, indices [B]
    int32 (one slot per live row: two rows updating one slot race on the GPU), seq_lens [B] int32
    (<= 0: padding); or, with seq_lens None, `indices` holds one 16-byte record per request, int32
    [B, 4] or uint8 [B, 16]: {seq_len, slot, load slot, unused} (sglang 0.5.23's decode plan records,
    read in place). load_indices [B] int32: the slot each request's state is read from (e.g. the
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
        call_checked(_fast_decode, *_decode_checked(state, kv_score, out, ape, indices, seq_lens, error_count,
                                                     load_indices, store, cache_slots), stream, flags)


class C128Decode(Prepared):
    """A validated decode call over fixed buffers; launch() re-runs it (e.g. for CUDA-graph
    capture or replay) with no re-validation. Contents of the buffers may change between launches."""

    _op = _calls.OP_DECODE
    _struct = 2

    def __init__(self, state, kv_score, out, ape, indices, seq_lens, *, load_indices=None, store=None,
                 cache_slots=None, pdl=None, error_count=None):
        self._bind(_calls.fill_decode, _decode_checked,
                   dict(state=state, kv_score=kv_score, out=out, ape=ape, indices=indices, seq_lens=seq_lens,
                        error_count=error_count, load_indices=load_indices, store=store, cache_slots=cache_slots),
                   dict(flags=pdl_flag(pdl)))


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
        self._upload = C.create_string_buffer(SIZES[7])
        self._upload_address = C.addressof(self._upload)
        _calls.init_upload(self._upload_address, self._dev, self._host[0].ctypes.data, self._host[1].ctypes.data,
                           self.compress_ptr, self.write_ptr, self.compress_capacity, self.write_capacity,
                           self.counts_ptr)

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
                status = _calls.upload(self._upload_address, nc, nw, self._dev, launch_stream(stream, self._dev))
            _check_status(status)
        self.num_tokens, self.num_compress, self.num_write = tokens, nc, nw
        return self

    @property
    def host_records(self) -> tuple:
        """The last plan's records as planned on the host: (compress, write) views of the real ones."""
        return self._host[0][:self.num_compress], self._host[1][:self.num_write]


def _prefill_flags(pdl, cooperative) -> int:
    return pdl_flag(pdl) | (0 if cooperative else FLAG_NO_COOPERATIVE)


def _plan_arg(plan, dev: int):
    """The plan checked: (plan as the filler takes it, compress capacity)."""
    if type(plan) is list and len(plan) == 2:
        plan = tuple(plan)
    if type(plan) is tuple and len(plan) == 2 and type(plan[0]) is np.ndarray:
        _, nc, _, _ = pyplan.record_lists(plan[0], plan[1])  # raises for arrays that are not record lists
        return plan, nc
    if type(plan) is tuple and len(plan) == 2 and type(plan[0]) is not np.ndarray:
        # Record tensors as sglang keeps them: uint8 [M, 16], on the op's device (read there) or
        # in host memory (carried inside the launches).
        compress, write = plan
        where = getattr(compress, "get_device", lambda: dev)()
        if where != dev and where != -1:
            raise ValueError(f"plan tensors are on {compress.device} but the other tensors are on {device_name(dev)}")
        compress, (nc, width_c) = shaped_arg(compress, "plan[0] (compress)", torch.uint8, where, 2)
        write, (_, width_w) = shaped_arg(write, "plan[1] (write)", torch.uint8, where, 2)
        if width_c != 16 or width_w != 16:
            raise ValueError(f"plan tensors must have shape [M, 16] (got {list(compress.shape)} and {list(write.shape)})")
        return (compress, write), nc
    if isinstance(plan, DevicePlan):
        if plan._dev != dev:
            raise ValueError(f"plan is a DevicePlan on {plan.device} but the tensors are on {device_name(dev)}")
        return plan, plan.compress_capacity
    raise TypeError("plan must be a (compress, write) pair from pyplan.plan_prefill (or of uint8 [M, 16] "
                    "record tensors) or a DevicePlan")


def _prefill_checked(state, kv_score, out, ape, indices, plan, load_indices, error_count, compact, store=None,
                     cache_slots=None) -> tuple:
    """The prefill's arguments checked (a wrong one raises, naming it) and as tensors; and the device."""
    state, dev, _, d = state_arg(state)
    kv_score, n = rows_arg(kv_score, "kv_score", _float32, dev, 2 * d)
    indices, (b,) = shaped_arg(indices, "indices", _int32, dev, 1)
    plan, nc = _plan_arg(plan, dev)
    return dict(state=state, kv_score=kv_score, out=_out_arg(out, store, dev, (nc if compact else n, d)),
                ape=arg(ape, "ape", _float32, dev, (CHUNK, d)), indices=indices, plan=plan,
                load_indices=optional_arg(load_indices, "load_indices", dev, (b,)),
                error_count=counter_arg(error_count, dev),
                compact=bool(compact), store=store, cache_slots=store_arg(store, cache_slots, dev, d, n)), dev


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
    vector into a pydsa.KVCache as well, in the same call (on the GPU by a store launch behind the
    prefill's own, reading the vectors from out); `out` may then be None (the call then takes out rows
    of its own from torch's allocator)."""
    flags = ((DEFAULT_PDL_FLAG if pdl is None else FLAG_PDL if pdl else 0)
             | (0 if cooperative else FLAG_NO_COOPERATIVE))  # _prefill_flags, inline
    status = _fast_prefill(state, kv_score, out, ape, indices, plan, load_indices, stream, flags, error_count, compact,
                           store, cache_slots)
    if status:
        if status != DECLINED:
            _check_status(status)  # raises
        call_checked(_fast_prefill, *_prefill_checked(state, kv_score, out, ape, indices, plan, load_indices,
                                                       error_count, compact, store, cache_slots), stream, flags)


_calls.set_device_plan_type(DevicePlan)
_upload = _calls.upload


class C128Prefill(Prepared):
    """A validated prefill call over fixed buffers (docs/spec.md, prefill); launch() re-runs it.

    `plan` is a (compress, write) pair of SEGMENT_DTYPE record arrays from pyplan.plan_prefill,
    read from host memory at every launch (re-plan into the same arrays with plan_prefill(...,
    out=...) and launch again), or a DevicePlan (read in place on the device: re-plan, then launch
    or replay a graph that captured this call)."""

    _op = _calls.OP_PREFILL
    _struct = 3

    def __init__(self, state, kv_score, out, ape, indices, plan, *, load_indices=None, compact=False, store=None,
                 cache_slots=None, pdl=None, error_count=None, cooperative=True):
        self._bind(_calls.fill_prefill, _prefill_checked,
                   dict(state=state, kv_score=kv_score, out=out, ape=ape, indices=indices, plan=plan,
                        load_indices=load_indices, error_count=error_count, compact=bool(compact), store=store,
                        cache_slots=cache_slots),
                   dict(flags=_prefill_flags(pdl, cooperative)))


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
