"""sglang 0.5.23's compressor API (its `sglang/kernels/ops/attention/dsv4/compress.py`), over pydsa's ops: the
online c128 path, the offline c128 path (sglang's default) and the c4 path.

    from pydsa.sglang import (CompressorDecodePlan, CompressorPrefillPlan, compress_forward,
                              compress_norm_rope_store, compress_forward_and_store)

Signatures and plan tensors are sglang's: a decode plan holds `plan_d` uint8 [B, 16], records
{u32 seq_len, i32 store slot, i32 load slot, i32 -1} with both slots req_pool_indices[b] +
state_slot_offset, which pydsa's decode reads in place (a plan sglang made works as well); a prefill plan holds `plan_c` / `plan_w` uint8 [M, 16], records {u32 seq_len (the
segment's last position + 1), u16 ragged row of its last token, u16 length, i32 store slot =
rid + state_slot_offset, i32 load slot = rid}, padded in CUDA-graph mode to num_q_tokens rows with
{0xFFFFFFFF, 0, 0, -1, -1}. The prefill tuple carries, after sglang's fields, what pydsa's kernels
read (the per-request slots and the prefill's own records), so `compress_forward` runs on it with no
conversion; a prefill plan made elsewhere (without them) is refused by name.

The c4 layers (compress_ratio 4, `is_online=False`: sglang's only c4 path) are pydsa's too, main (D = 512)
and indexer (D = 128) compressors alike, fp32 or bf16 ring: `CompressorDecodePlan.generate(4, ...)`,
`CompressorPrefillPlan.generate(4, ...)`, `compress_forward` and `compress_norm_rope_store` (page size 64;
D = 128 is the indexer's store) run pydsa's c4 ops over sglang's plan records read in place
(pydsa/sglang/c4.py). So is the offline c128 compressor (compress_ratio 128, `is_online=False`, D = 512, fp32
or bf16 ring): `CompressorDecodePlan.generate(128, ...)`, `CompressorPrefillPlan.generate(128, ...)` (sglang's
records), `compress_forward`, `compress_norm_rope_store` and `compress_forward_and_store(..., is_online=False)`
run pydsa.c128_offline_decode / c128_offline_extend over sglang's records read in place
(pydsa/sglang/offline.py). pydsa's configurations: c128 online and offline (fp32 input, D = 512) and c4, the
V4 cache layout. The others (HANDED_BACK: the fp4 indexer, `bf16_store`, the fp8 two-pool store, the V4.1
layouts, other head_dims) raise NotImplementedError naming them. Where sglang refuses, pydsa does too: a prefill
plan's num_q_tokens must equal the sum of the extends, unless use_cuda_graph (a padded bucket: the rows past
the real tokens belong to no segment).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

import pyplan

from .. import _fill_records
from .._abi import DEFAULT_PDL_FLAG, check as _check_status
from ..c128 import DevicePlan, c128_decode, c128_prefill
from ..errors import ArgumentError, ArgumentTypeError, ArgumentValueError
from ..store import KVCache, kv_store
from . import c4 as sglang_c4, offline as sglang_offline
from ._args import caller_words as _caller_words, count_of, described as _described, memo

_decode_records = _fill_records.decode_records
_prefill_records = _fill_records.prefill_records

__all__ = ["CompressorDecodePlan", "CompressorPrefillPlan", "compress_forward", "compress_norm_rope_store",
           "compress_forward_and_store"]

HEAD_DIM, RATIO = 512, 128
# What of sglang's compressor configurations stays sglang's (outside_pydsa names the one a call has; the plugin
# names them all in its start-up line)
HANDED_BACK = ("the fp4 indexer store", "bf16_store", "the fp8 two-pool store", "the V4.1 cache layouts",
               "c128 head_dims other than 512", "c4 head_dims other than 128, 256 and 512",
               "a kv_score_input other than fp32",
               "the trtllm backend's uniform-fp8 store (its compress_forward runs on pydsa)")


def _not_ours(what: str):
    return NotImplementedError(f"pydsa implements sglang's c128 paths (online and offline, fp32 input, head_dim 512) "
                               f"and its c4 path (head_dim 512, 256 or 128), the V4 layout; {what} is not pydsa's: "
                               f"call sglang's own kernel for it")


class CompressorDecodePlan(NamedTuple):
    compress_ratio: int
    plan_d: torch.Tensor  # [B, 16] uint8, sglang's decode records, which pydsa's decode reads in place

    def copy_(self, other) -> None:
        if not isinstance(other, CompressorDecodePlan) or self.compress_ratio != other.compress_ratio:
            raise ValueError("copy_ takes a CompressorDecodePlan of the same compress ratio")
        self.plan_d.copy_(other.plan_d)

    @staticmethod
    def generate(compress_ratio, req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size: int,
                 ring_size: int, use_req_ring: bool = False) -> "CompressorDecodePlan":
        """sglang's c4 (compress_ratio 4) or offline c128 (128) decode plan, one step's records on the device of
        req_pool_indices, no host synchronization. c4: ring_size >= 8 (sglang's own planner takes 4, and its
        kernels then compute entries from overwritten rows, silently); c128: ring_size a multiple of 128."""
        _config_int("compress_ratio", compress_ratio)
        if compress_ratio == RATIO:
            return CompressorDecodePlan(RATIO, sglang_offline.plan_decode(
                req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size=swa_page_size,
                ring_size=ring_size, use_req_ring=use_req_ring))
        if compress_ratio != sglang_c4.RATIO:
            raise _not_ours(f"compress_ratio {compress_ratio}")
        return CompressorDecodePlan(sglang_c4.RATIO, sglang_c4.plan_decode(
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
        return CompressorDecodePlan(RATIO, plan_d)

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

    def copy_(self, other) -> None:
        if not isinstance(other, CompressorPrefillPlan) or self.compress_ratio != other.compress_ratio:
            raise ValueError("copy_ takes a CompressorPrefillPlan of the same compress ratio")
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
            return CompressorPrefillPlan(RATIO, plan_c, plan_w, pin)
        if compress_ratio != sglang_c4.RATIO:
            raise _not_ours(f"compress_ratio {compress_ratio}")
        plan_c, plan_w = sglang_c4.plan_prefill(req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state,
                                                swa_page_size=swa_page_size, ring_size=ring_size,
                                                num_q_tokens=num_q_tokens, use_cuda_graph=use_cuda_graph,
                                                use_req_ring=use_req_ring)
        return CompressorPrefillPlan(sglang_c4.RATIO, plan_c, plan_w)

    @staticmethod
    def generate_online(seq_lens, extend_lens, req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                        num_q_tokens: int, use_cuda_graph: bool = False,
                        state_slot_offset: int = 0) -> "CompressorPrefillPlan":
        """sglang's argument order. seq_lens / extend_lens are read on the host (sglang passes host
        copies); req_pool_indices int64 on the device. In CUDA-graph mode pydsa's records live in a
        DevicePlan that copy_ refreshes, so a captured compress_forward reads the new plan."""
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
        return CompressorPrefillPlan(RATIO, plan_c, plan_w, records=records, indices=indices, load_indices=load)

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


def _plan_of(plan, compress_ratio=RATIO):
    """plan when it is a plan of compress_ratio's that the online c128 path (or the c4 path) reads, else the error
    naming plan."""
    if compress_ratio == sglang_c4.RATIO:
        return sglang_c4.plan_of(plan)  # c4 records are read in place, whoever made them (sglang's planner or pydsa's)
    if isinstance(plan, (CompressorDecodePlan, CompressorPrefillPlan)) and plan.compress_ratio != RATIO:
        raise ArgumentValueError("plan", f"plan is a compress_ratio {plan.compress_ratio} plan but compress_ratio is "
                                         f"{RATIO}")
    if isinstance(plan, CompressorDecodePlan):  # its records are read in place, whoever made them
        return plan
    if isinstance(plan, CompressorPrefillPlan):
        if plan.records is None:
            raise ArgumentValueError("plan", "plan: this CompressorPrefillPlan was not made by pydsa's generate_online "
                                             "(it lacks the records pydsa's kernels read)")
        return plan
    raise ArgumentTypeError("plan", f"plan must be a pydsa.sglang CompressorDecodePlan or CompressorPrefillPlan "
                                    f"(got {_described(plan)})")


def outside_pydsa(head_dim=HEAD_DIM, compress_ratio=RATIO, is_online=True, *, indexer=False, bf16_store=False,
                  two_pool=False, layout="V4", input_dtype=None):
    """What in a call's configuration is not pydsa's, or None when all of it is: the one rule this layer's
    calls (which raise NotImplementedError naming it) and the plugin (which passes such calls to sglang's
    own kernels) apply."""
    if compress_ratio == sglang_c4.RATIO:
        if is_online:
            return "is_online=True with compress_ratio 4 (sglang has no online c4)"
        if head_dim not in (128, 256, 512):
            return f"head_dim {head_dim}"
    elif compress_ratio != RATIO:
        return f"compress_ratio {compress_ratio}"
    elif head_dim != HEAD_DIM:  # online or offline alike
        return f"head_dim {head_dim}"
    if input_dtype is not None and input_dtype != torch.float32:
        return f"a {str(input_dtype).replace('torch.', '')} kv_score_input"
    if indexer:
        return "the fp4 indexer store"
    if bf16_store:
        return "bf16_store"
    if two_pool:
        return "the fp8 two-pool store"
    name = str(getattr(layout, "name", layout))
    if name.upper() not in ("V4", "KVLAYOUT.V4"):
        return f"the {name} cache layout"
    return None


def _config_int(name: str, x) -> None:
    """A configuration int (head_dim, compress_ratio) is an int: another type is refused as such, not taken for
    a configuration pydsa does not implement."""
    if count_of(x) is None:
        raise ArgumentTypeError(name, f"{name} must be an int (got {_described(x)} {x!r})")


def _check_config(head_dim, compress_ratio, is_online):
    _config_int("head_dim", head_dim)
    _config_int("compress_ratio", compress_ratio)
    if is_online is not True and is_online is not False:
        raise ArgumentTypeError("is_online", f"is_online must be a bool (got {_described(is_online)} {is_online!r})")
    reason = outside_pydsa(head_dim, compress_ratio, is_online)
    if reason:
        raise _not_ours(reason)


# pydsa's argument names as sglang's caller knows them (errors are re-raised in the caller's words), for
# compress_forward and compress_forward_and_store, c128 (state, indices) and c4 (ring, records, plan[0], plan[1])
# alike; store: the KVCache made of kvcache and norm_weight, whose channels set its D
_COMPRESS_NAMES = {"state": "kv_score_buffer", "kv_score": "kv_score_input", "indices": "plan.plan_d",
                   "cache_slots": "out_loc", "out": "out", "ape": "ape", "ring": "kv_score_buffer",
                   "main": "kv_score_buffer", "records": "plan.plan_d",
                   "plan[0]": "plan.plan_c", "plan[1]": "plan.plan_w", "store": "norm_weight"}
_STORE_NAMES = {"vectors": "kv", "cache_slots": "out_loc", "records": "plan", "cache": "kvcache",
                "rotary": "freq_cis"}


def _explained(exc) -> bool:
    """Whether an exception may come from a wrong argument (not the library's DsaError)."""
    return isinstance(exc, (TypeError, ValueError, AttributeError)) or type(exc) is RuntimeError


def _compress_args(kv_score_buffer, kv_score_input, ape) -> None:
    """compress_forward's tensors as sglang's caller passed them (before pydsa's views)."""
    for name, t in (("kv_score_buffer", kv_score_buffer), ("kv_score_input", kv_score_input), ("ape", ape)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (got {_described(t)})")
    if kv_score_buffer.dim() < 2 or kv_score_buffer.shape[-1] != 3 * HEAD_DIM:
        raise ValueError(f"kv_score_buffer must be [num_slots, {3 * HEAD_DIM}] (3 x head_dim {HEAD_DIM}; got "
                         f"{_described(kv_score_buffer)})")
    if ape.numel() != RATIO * HEAD_DIM or ape.shape[-1] != HEAD_DIM:
        raise ValueError(f"ape must be [{RATIO}, {HEAD_DIM}] (got {_described(ape)})")


def _run(kv_score_buffer, kv_score_input, ape, plan, out, store=None, cache_slots=None):
    try:
        state = kv_score_buffer.view(-1, 1, kv_score_buffer.shape[-1])
        a = ape if ape.dtype == kv_score_input.dtype else ape.to(dtype=kv_score_input.dtype)
        _ops(state, kv_score_input, a.view(-1, HEAD_DIM), plan, out, store=store, cache_slots=cache_slots)
    except Exception as exc:
        if not _explained(exc):
            raise
        _compress_args(kv_score_buffer, kv_score_input, ape)  # the tensors as passed, before the views
        raise _caller_words(exc, _COMPRESS_NAMES) from None


def _ops(state, kv_score_input, ape, plan, out, *, store, cache_slots):
    if plan.is_decode:
        c128_decode(state, kv_score_input, out, ape, plan.plan_d, None, store=store, cache_slots=cache_slots)
        return
    rows = out
    if isinstance(plan.records, DevicePlan):  # compact rows of the DevicePlan's capacity
        rows = None if out is None else out[:min(out.shape[0], plan.records.compress_capacity)]
    elif out is not None:
        rows = out[:len(plan.records[0])]
    n = kv_score_input.shape[0]
    c128_prefill(state, kv_score_input, rows, ape, plan.indices, plan.records, load_indices=plan.load_indices,
                 compact=True, store=store, cache_slots=None if cache_slots is None else cache_slots[:n])


def compress_forward(kv_score_buffer, kv_score_input, ape, plan, *, head_dim: int, compress_ratio: int,
                     out=None, is_online: bool = False):
    """sglang's compress_forward: decode (out [B, D], a chunk's vector at the rows whose token closes it) or
    prefill (compact out [plan_c rows, D], plan order), online or offline c128, or c4."""
    _check_config(head_dim, compress_ratio, is_online)
    if compress_ratio == sglang_c4.RATIO or not is_online:
        step = sglang_c4.compress if compress_ratio == sglang_c4.RATIO else sglang_offline.compress
        try:
            return step(kv_score_buffer, kv_score_input, ape, plan, head_dim, out)
        except ArgumentError as exc:
            raise _caller_words(exc, _COMPRESS_NAMES) from None
    plan = _plan_of(plan, compress_ratio)
    if out is None:
        if not isinstance(kv_score_input, torch.Tensor):
            _compress_args(kv_score_buffer, kv_score_input, ape)
        out = kv_score_input.new_empty((plan[1].shape[0], head_dim))
    _run(kv_score_buffer, kv_score_input, ape, plan, out)
    return out


_caches: dict = {}


def _kv_cache(kvcache, norm_weight, norm_eps, freq_cis, page_size, layout="v4") -> KVCache:
    """The KVCache of one layer's buffers, made once (keyed by their memory: views made per call hit too);
    layout "indexer" for a c4 indexer's cache. KVCache judges every argument (page_size an int: never
    converted); buffers that are not tensors, or a page_size that is not an int, go to it uncached, to be named."""
    def make():
        w = norm_weight.float() if isinstance(norm_weight, torch.Tensor) and norm_weight.is_floating_point() \
            else norm_weight
        return KVCache(kvcache, w, freq_cis, page_size=page_size, eps=float(norm_eps), layout=layout)
    if type(page_size) is not int or not all(isinstance(t, torch.Tensor) for t in (kvcache, norm_weight, freq_cis)):
        return make()
    key = (kvcache.data_ptr(), kvcache.numel(), norm_weight.data_ptr(), freq_cis.data_ptr(), page_size,
           float(norm_eps), layout)
    return memo(_caches, key, make, 4096)


def _check_store_config(kv, *, use_fp4, bf16_store, kvcache_scale, rope_cache, fp4_k_write_metadata, layout,
                        fp8_2buff, kvcache_rope):
    reason = outside_pydsa(indexer=bool(use_fp4) or fp4_k_write_metadata is not None or kvcache_scale is not None
                           or rope_cache is not None, bf16_store=bool(bf16_store),
                           two_pool=bool(fp8_2buff) or kvcache_rope is not None, layout=layout)
    if reason:
        raise _not_ours(reason)
    if not isinstance(kv, torch.Tensor) or not kv.dim():
        return  # kv_store names it
    if kv.dtype != torch.float32 or kv.shape[-1] not in (HEAD_DIM, 128):
        raise _not_ours(f"a {kv.dtype} [.., {kv.shape[-1]}] store")


def _check_eps(norm_eps) -> None:
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)):
        raise TypeError(f"norm_eps must be a float (got {type(norm_eps).__name__} {norm_eps!r})")


def compress_norm_rope_store(kv, plan, *, norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size,
                             use_fp4=False, bf16_store=False, kvcache_scale=None, rope_cache=None,
                             fp4_k_write_metadata=None, layout="V4", fp8_2buff=False, kvcache_rope=None) -> None:
    """sglang's store of a layer's vectors: decode (row b stored when its seq_len closes an entry, at out_loc[b])
    or prefill (row i for plan_c record i, at out_loc[ragged row]), in one launch. It reads plan[1]'s seq_len and
    ragged row, which every plan of a ratio holds alike (online or offline, whoever made it)."""
    _check_store_config(kv, use_fp4=use_fp4, bf16_store=bf16_store, kvcache_scale=kvcache_scale, rope_cache=rope_cache,
                        fp4_k_write_metadata=fp4_k_write_metadata, layout=layout, fp8_2buff=fp8_2buff,
                        kvcache_rope=kvcache_rope)
    _check_eps(norm_eps)
    c4 = getattr(plan, "compress_ratio", None) == sglang_c4.RATIO
    plan = sglang_c4.plan_of(plan, sglang_c4.RATIO if c4 else RATIO)
    width = kv.shape[-1] if isinstance(kv, torch.Tensor) and kv.dim() else None
    if not c4 and width not in (None, HEAD_DIM):
        raise _not_ours(f"a c128 store of head_dim {width}")
    try:
        cache = _kv_cache(kvcache, norm_weight, norm_eps, freq_cis, page_size,
                          "indexer" if c4 and width == 128 else "v4")
        # one launch: the store reads each row's position and slot from the plan's records in place
        kv_store(kv, None, out_loc, cache, records=plan[1], extend=not plan.is_decode,
                 ratio=sglang_c4.RATIO if c4 else RATIO)
    except (TypeError, ValueError) as exc:
        raise _caller_words(exc, _STORE_NAMES) from None


def compress_forward_and_store(kv_score_buffer, kv_score_input, ape, plan, *, norm_weight, norm_eps, freq_cis,
                               out_loc, kvcache, page_size, head_dim: int = HEAD_DIM, compress_ratio: int = RATIO,
                               out=None, is_online=None):
    """compress_forward then compress_norm_rope_store of its vectors, as one call (decode: one launch; prefill:
    the online path's launches and a store launch behind them, the offline path's two, the c4 path's two): every
    vector the compression closes is normalized, quantized and stored into kvcache at out_loc (decode: per
    request; prefill: per query token, by the closing token's row). is_online: as compress_forward's (None: True
    for compress_ratio 128, False for 4). Returns `out` when given."""
    c4 = compress_ratio == sglang_c4.RATIO
    online = (not c4) if is_online is None else is_online
    _check_config(head_dim, compress_ratio, online)
    _check_eps(norm_eps)
    # c4 and offline plans are read in place, whoever made them; the online path reads pydsa's own plan
    plan = _plan_of(plan, compress_ratio) if online and not c4 else sglang_c4.plan_of(plan, compress_ratio)
    try:
        cache = _kv_cache(kvcache, norm_weight, norm_eps, freq_cis, page_size,
                          "indexer" if c4 and head_dim == 128 else "v4")
    except (TypeError, ValueError) as exc:
        raise _caller_words(exc, _STORE_NAMES) from None
    if c4 or not online:
        step = sglang_c4.compress if c4 else sglang_offline.compress
        try:
            step(kv_score_buffer, kv_score_input, ape, plan, head_dim, out, store=cache, out_loc=out_loc)
        except ArgumentError as exc:
            raise _caller_words(exc, _COMPRESS_NAMES) from None
        return out
    _run(kv_score_buffer, kv_score_input, ape, plan, out, store=cache, cache_slots=out_loc)
    return out
