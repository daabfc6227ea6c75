"""sglang 0.5.23's compressor plans (its `CompressorDecodePlan` and `CompressorPrefillPlan`), made over pydsa's
planners: the online c128 records (pydsa.c128_decode_records / c128_prefill_records, pyplan's segments), the c4
records (c4.py) and the offline c128 records (offline.py). compress.py says what the records hold and which calls
read them; it re-exports both classes.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

import pyplan

from .. import DEFAULT_PDL_FLAG, check_status as _check_status
from ..c128 import DevicePlan, c128_decode_records as _decode_records, c128_prefill_records as _prefill_records
from ..errors import ArgumentValueError
from . import c4 as sglang_c4, offline as sglang_offline
from ._args import count_of, described as _described
from .config import RATIO, config_int as _config_int, not_ours as _not_ours

__all__ = ["CompressorDecodePlan", "CompressorPrefillPlan"]


def _kinds_differ(a, b) -> bool:
    """Whether two plans' records are of different kinds (online c128 against offline / c4); None: untold."""
    return a.online is not None and b.online is not None and a.online != b.online


class CompressorDecodePlan(NamedTuple):
    compress_ratio: int
    plan_d: torch.Tensor  # [B, 16] uint8, sglang's decode records, which pydsa's decode reads in place
    # pydsa: which records plan_d holds (True: generate_online's, False: generate's; set by the subclasses pydsa's
    # planners return, below), so that a plan given to the other path is refused by name; None (a plan made by
    # sglang itself): untold, read as the call says. A class attribute, not a field: sglang's own compress_forward
    # passes plan[1:] on, so the tuple stays sglang's two fields.
    online = None

    def copy_(self, other) -> None:
        if not isinstance(other, CompressorDecodePlan) or self.compress_ratio != other.compress_ratio \
                or _kinds_differ(self, other):
            raise ValueError("copy_ takes a CompressorDecodePlan of the same compress ratio and kind (online or not)")
        self.plan_d.copy_(other.plan_d)

    @staticmethod
    def generate(compress_ratio, req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size: int,
                 ring_size: int, use_req_ring: bool = False) -> "CompressorDecodePlan":
        """sglang's c4 (compress_ratio 4) or offline c128 (128) decode plan, one step's records on the device of
        req_pool_indices, no host synchronization. c4: ring_size >= 8 (sglang's own planner takes 4, and its
        kernels then compute entries from overwritten rows, silently); c128: ring_size a multiple of 128."""
        _config_int("compress_ratio", compress_ratio)
        if compress_ratio == RATIO:
            return _RecordsDecodePlan(RATIO, sglang_offline.plan_decode(
                req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size=swa_page_size,
                ring_size=ring_size, use_req_ring=use_req_ring))
        if compress_ratio != sglang_c4.RATIO:
            raise _not_ours(f"compress_ratio {compress_ratio}")
        return _RecordsDecodePlan(sglang_c4.RATIO, sglang_c4.plan_decode(
            req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size=swa_page_size, ring_size=ring_size,
            use_req_ring=use_req_ring))

    @staticmethod
    def generate_online(seq_lens: torch.Tensor, req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                        state_slot_offset: int = 0) -> "CompressorDecodePlan":
        """sglang's argument order; seq_lens and req_pool_indices int64 [B] on the device, req_to_token
        shape-checked only (as in sglang). No host synchronization: one launch writes the records. A
        seq_len outside 0..2^31-1 (sglang's 32-bit record would wrap it) becomes a padding record and is
        counted on the device (pydsa.error_count); one in a CPU tensor is refused by name."""
        if not isinstance(req_to_token, torch.Tensor) or req_to_token.dim() != 2 or req_to_token.dtype != torch.int32:
            raise RuntimeError(f"req_to_token must be a 2-D int32 tensor (got {_described(req_to_token)})")
        sglang_c4.check_data(seq_lens=seq_lens, req_pool_indices=req_pool_indices, req_to_token=req_to_token)
        for name, t in (("seq_lens", seq_lens), ("req_pool_indices", req_pool_indices)):
            if not isinstance(t, torch.Tensor):
                raise RuntimeError(f"{name} must be a torch.Tensor (got {_described(t)})")
        if seq_lens.device.type == "cpu" and seq_lens.numel() and seq_lens.dtype == torch.int64 \
                and not 0 <= int(seq_lens.min()) <= int(seq_lens.max()) < 2**31:
            raise RuntimeError(f"seq_lens must lie in 0..2^31-1 (sglang's record holds 32 bits; got "
                               f"{int(seq_lens.min())}..{int(seq_lens.max())})")
        plan_d = torch.empty((seq_lens.shape[0], 16), dtype=torch.uint8, device=req_pool_indices.device)
        status = _decode_records(seq_lens, req_pool_indices, state_slot_offset=state_slot_offset, plan_d=plan_d,
                                 flags=DEFAULT_PDL_FLAG)
        if status:
            _check_status(status)
        return _OnlineDecodePlan(RATIO, plan_d)

    @property
    def is_decode(self) -> bool:
        return True


class CompressorPrefillPlan(NamedTuple):
    compress_ratio: int
    plan_c: torch.Tensor                      # [M, 16] uint8, sglang's records of the segments closing a chunk
    plan_w: torch.Tensor                      # [M, 16] uint8, of the trailing partial segments
    pin_buffer: Optional[torch.Tensor] = None
    records: object = None                    # pydsa: its own plan (host record arrays, or a DevicePlan)
    indices: Optional[torch.Tensor] = None    # pydsa: int32 [B] store slots
    load_indices: Optional[torch.Tensor] = None  # pydsa: int32 [B] load slots
    online = None  # pydsa: which records it holds, as CompressorDecodePlan's (a class attribute, not a field)

    def copy_(self, other) -> None:
        if not isinstance(other, CompressorPrefillPlan) or self.compress_ratio != other.compress_ratio \
                or _kinds_differ(self, other):
            raise ValueError("copy_ takes a CompressorPrefillPlan of the same compress ratio and kind (online or not)")
        self.plan_c.copy_(other.plan_c)
        self.plan_w.copy_(other.plan_w)
        if isinstance(self.records, DevicePlan) and isinstance(other.records, DevicePlan):
            self.records.buffer.copy_(other.records.buffer)
            self.indices.copy_(other.indices)
            self.load_indices.copy_(other.load_indices)

    @staticmethod
    def generate(compress_ratio, req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state,
                 swa_page_size: int, ring_size: int, num_q_tokens: int, use_cuda_graph: bool = False,
                 use_req_ring: bool = False) -> "CompressorPrefillPlan":
        """sglang's c4 (compress_ratio 4) or offline c128 (128) extend plan: host lengths give its host planner's
        records, device ones (CUDA graphs, target verify) records in request order padded to num_q_tokens.
        ring_size as for the decode plan (c4: >= 8; sglang's own planner takes 4 and then corrupts silently)."""
        _config_int("compress_ratio", compress_ratio)
        if compress_ratio == RATIO:
            plan_c, plan_w, pin = sglang_offline.plan_prefill(
                req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state, swa_page_size=swa_page_size,
                ring_size=ring_size, num_q_tokens=num_q_tokens, use_cuda_graph=use_cuda_graph,
                use_req_ring=use_req_ring)
            return _RecordsPrefillPlan(RATIO, plan_c, plan_w, pin)
        if compress_ratio != sglang_c4.RATIO:
            raise _not_ours(f"compress_ratio {compress_ratio}")
        plan_c, plan_w = sglang_c4.plan_prefill(req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state,
                                                swa_page_size=swa_page_size, ring_size=ring_size,
                                                num_q_tokens=num_q_tokens, use_cuda_graph=use_cuda_graph,
                                                use_req_ring=use_req_ring)
        return _RecordsPrefillPlan(sglang_c4.RATIO, plan_c, plan_w)

    @staticmethod
    def generate_online(seq_lens, extend_lens, req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                        num_q_tokens: int, use_cuda_graph: bool = False,
                        state_slot_offset: int = 0) -> "CompressorPrefillPlan":
        """sglang's argument order. seq_lens / extend_lens are read on the host (sglang passes host
        copies); req_pool_indices int64 on the device. In CUDA-graph mode pydsa's records live in a
        DevicePlan that copy_ refreshes, so a captured compress_forward reads the new plan."""
        sglang_c4.check_data(seq_lens=seq_lens, extend_lens=extend_lens, req_pool_indices=req_pool_indices,
                             req_to_token=req_to_token, num_q_tokens=num_q_tokens)
        seq, ext = _host_int64(seq_lens, "seq_lens"), _host_int64(extend_lens, "extend_lens")
        n, b = _length("num_q_tokens", num_q_tokens), int(seq.shape[0])
        if ext.shape[0] != b:  # as the planner says it
            raise ArgumentValueError("extend_lens", f"extend_lens has {ext.shape[0]} entries but seq_lens has {b} (B: "
                                                    f"the length of seq_lens)")
        if not isinstance(req_pool_indices, torch.Tensor) or req_pool_indices.dim() != 1 \
                or req_pool_indices.dtype not in (torch.int64, torch.int32):
            raise RuntimeError(f"req_pool_indices must be a 1-D int64 tensor (got {_described(req_pool_indices)})")
        if req_pool_indices.shape[0] != b:
            raise RuntimeError(f"req_pool_indices has {req_pool_indices.shape[0]} entries but seq_lens has {b}")
        if state_slot_offset < 0:
            raise RuntimeError(f"state_slot_offset must be >= 0 (got {state_slot_offset})")
        if not isinstance(req_to_token, torch.Tensor) or req_to_token.dim() != 2 or req_to_token.dtype != torch.int32:
            raise RuntimeError(f"req_to_token must be a 2-D int32 tensor (got {_described(req_to_token)})")
        total = int(ext.sum())
        if n != total and not use_cuda_graph:
            raise RuntimeError(f"num_q_tokens is {n} but the extends sum to {total} (sglang's planner refuses this "
                               f"too; a padded CUDA-graph bucket passes use_cuda_graph=True)")
        if total > 65536:
            raise RuntimeError(f"sglang's prefill records hold 16-bit ragged rows; row {total - 1} "
                               f"overflows (a prefill this long needs pydsa's own plan: pydsa.c128_prefill)")
        dev = req_pool_indices.device
        if use_cuda_graph and dev.type == "cuda":  # planned once, on the host side of the DevicePlan
            records = DevicePlan(max(n, 1), max(b, 1), device=dev).plan(seq, ext, num_tokens=n)
            compress, write = records.host_records
        else:
            compress, write, nc, nw = pyplan.plan_prefill(seq, ext, num_tokens=n,
                                                          graph=bool(use_cuda_graph) or n != total,
                                                          return_counts=True)
            records = (compress[:nc], write[:nw])  # views of this call's own arrays
            compress, write = records
        rows_c, rows_w = (n, n) if use_cuda_graph else (len(compress), len(write))
        # sglang's records and pydsa's slots in one launch (the records travel inside it)
        plan_c = torch.empty((rows_c, 16), dtype=torch.uint8, device=dev)
        plan_w = torch.empty((rows_w, 16), dtype=torch.uint8, device=dev)
        indices, load = torch.empty(b, dtype=torch.int32, device=dev), torch.empty(b, dtype=torch.int32, device=dev)
        rid = req_pool_indices if req_pool_indices.dtype == torch.int64 else req_pool_indices.to(torch.int64)
        status = _prefill_records(compress, write, rid, state_slot_offset=state_slot_offset, plan_c=plan_c,
                                  plan_w=plan_w, slots=indices, load_slots=load, flags=DEFAULT_PDL_FLAG)
        if status:
            _check_status(status)
        return _OnlinePrefillPlan(RATIO, plan_c, plan_w, records=records, indices=indices, load_indices=load)

    @property
    def is_decode(self) -> bool:
        return False


_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _host_int64(t, name: str) -> np.ndarray:
    """A host int64 array of a length list (a CPU int64 tensor is read in place): a 1-D integer tensor, array or
    sequence of ints; anything else is refused by name (sglang's RuntimeError)."""
    if type(t) is torch.Tensor and t.dtype is torch.int64 and t.device.type == "cpu" and t.is_contiguous():
        return t.numpy()
    try:
        a = torch.as_tensor(t).detach()
    except (TypeError, ValueError, RuntimeError):
        a = None
    if a is None or a.dim() != 1 or a.dtype not in _INTEGER_DTYPES:
        raise RuntimeError(f"{name} must be a 1-D integer tensor or sequence of lengths (got {_described(t)})")
    return np.ascontiguousarray(a.to(torch.int64).cpu().numpy())


def _length(name: str, x) -> int:
    """A count (num_q_tokens): an int >= 0, not a bool, a float or a string; sglang's RuntimeError otherwise."""
    v = count_of(x)
    if v is None:
        raise RuntimeError(f"{name} must be an int (got {_described(x)})")
    if v < 0:
        raise RuntimeError(f"{name} is {v}; expected >= 0")
    return v


# The plans pydsa's planners return, tagged with the records they hold (`online`): the same tuples, by the same
# name (their repr is sglang's class's).
def _tagged(plan_class, online: bool):
    return type(plan_class.__name__, (plan_class,), {
        "__slots__": (), "online": online, "__module__": plan_class.__module__,
        "__reduce__": lambda self: (_remade, (plan_class.__name__, online, tuple(self)))})


_OnlineDecodePlan, _RecordsDecodePlan = _tagged(CompressorDecodePlan, True), _tagged(CompressorDecodePlan, False)
_OnlinePrefillPlan, _RecordsPrefillPlan = _tagged(CompressorPrefillPlan, True), _tagged(CompressorPrefillPlan, False)
_KINDS = {("CompressorDecodePlan", True): _OnlineDecodePlan, ("CompressorDecodePlan", False): _RecordsDecodePlan,
          ("CompressorPrefillPlan", True): _OnlinePrefillPlan, ("CompressorPrefillPlan", False): _RecordsPrefillPlan}


def _remade(name: str, online: bool, fields: tuple):
    """A tagged plan from its pickle: its class by name and kind (the classes share sglang's class names)."""
    return _KINDS[name, online](*fields)
