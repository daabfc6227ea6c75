"""Drop-in replacements for sglang's calls of the reference kernels, with sglang's signatures.

    from pydsa.sglang import fused_metadata_copy_cuda, fused_metadata_copy_multi_cuda
    from pydsa.sglang import c128_online_decode, c128_online_prefill, plan_compress_online_prefill
    from pydsa.sglang import (online_c128_mtp_write_prefix_states, online_c128_mtp_mark_pending,
                              online_c128_mtp_commit_pending)
    from pydsa.sglang import (CompressorDecodePlan, CompressorPrefillPlan, compress_forward,
                              compress_norm_rope_store, compress_forward_and_store)   # sglang 0.5.23
    from pydsa.sglang import c4_layer   # one c4 layer's two compressors and stores, fused

sglang 0.5.23's c4 calls (compress_ratio 4) run pydsa's c4 ops over sglang's plan records in place
(pydsa/sglang/c4.py says how its rings are addressed and what a verify may ask), and its offline c128 calls
(compress_ratio 128, is_online=False: sglang's default c128 layer) pydsa's offline c128 ops
(pydsa/sglang/offline.py).

Each function is a thin layer over the library's ops (the same C entry points and kernels): it
turns sglang's positional arguments and conventions into the op's sizes and launches. CUDA
tensors run the kernels on the current stream, CPU tensors the host backend. sglang's
conventions (docs/spec.md, metadata copy where they agree):
- DECODE copies `bs` rows x `max_len` columns of `page_indices`, the other modes
  `page_indices.shape[0]` rows x `max_seqlen_k` columns, reading the source as a dense block of
  that shape; the destination page table's row stride is its `shape[1]`, the real page table
  destination's its `stride(0)`; `flashmla_metadata` of any shape is copied flat (the source's
  numel); `seqlens_expanded` is ignored in DECODE.
- A tensor that is not int32 raises RuntimeError("<name> must have dtype int32 ..."), as sglang's
  kernels do; other bad input raises as the rest of pydsa does.
"""
from __future__ import annotations

import torch

import pyplan

from ..errors import ArgumentError, ArgumentTypeError, ArgumentValueError
from ..c128 import c128_decode, c128_prefill
from ..metadata import MODE_DECODE, MetadataCopy
from ..speculative import c128_commit, c128_verify
from ._args import caller_words as _caller_words, count_of
from .c4 import layer as c4_layer
from .compress import (CompressorDecodePlan, CompressorPrefillPlan, compress_forward, compress_forward_and_store,
                        compress_norm_rope_store, memo)

__all__ = ["fused_metadata_copy_cuda", "fused_metadata_copy_multi_cuda", "c128_online_decode",
           "c128_online_prefill", "plan_compress_online_prefill", "online_c128_mtp_write_prefix_states",
           "online_c128_mtp_mark_pending", "online_c128_mtp_commit_pending", "CompressorDecodePlan",
           "CompressorPrefillPlan", "compress_forward", "compress_norm_rope_store", "compress_forward_and_store",
           "c4_layer"]

_SOURCE_NAMES = ("cache_seqlens_src", "cu_seqlens_k_src", "page_indices_src", "nsa_cache_seqlens_src",
                 "seqlens_expanded_src", "nsa_cu_seqlens_k_src", "real_page_table_src", "flashmla_num_splits_src",
                 "flashmla_metadata_src")
_DEST_KEYS = ("cache_seqlens", "cu_seqlens_k", "page_table_1", "dsa_cache_seqlens", "seqlens_expanded",
              "dsa_cu_seqlens_k", "real_page_table", "flashmla_num_splits", "flashmla_metadata")

_INT32 = torch.int32

# Bound copies per destination set: sglang refreshes the same static buffers every step.
_bound: dict = {}


def _require_int32(tensors, names) -> None:
    for t, name in zip(tensors, names):
        if t is not None and getattr(t, "dtype", _INT32) is not _INT32:
            raise RuntimeError(f"{name} must have dtype int32 (got {t.dtype})")


def _destination(group) -> dict:
    """A destination dict for MetadataCopy in sglang's conventions: page_table_1 rows are
    shape[1] apart."""
    dest = {key: t for key, t in zip(_DEST_KEYS, group) if t is not None}
    table = dest["page_table_1"]
    if table.dim() == 2 and table.stride() != (table.shape[1], 1):
        dest["page_table_1"] = table.as_strided(table.shape, (table.shape[1], 1))
    return dest


def _bind(mode: int, groups) -> MetadataCopy:
    """The bound copy for these destination tensors (checked and bound on first use)."""
    def make():
        for k, group in enumerate(groups):
            suffix = f"_dst{k}" if len(groups) > 1 else "_dst"
            _require_int32(group, (name.replace("_src", suffix) for name in _SOURCE_NAMES))
        return MetadataCopy([_destination(group) for group in groups], mode=mode)
    dests = tuple(t for group in groups for t in group)
    return memo(_bound, (mode, id(dests[0]), len(dests)), make, 64, dests)


_FLAT_NAMES = _SOURCE_NAMES + ("bs", "max_len", "max_seqlen_k", "seqlens_expanded_size")


def _copy(copy: MetadataCopy, sources, sizes) -> None:
    copy.fill_flat(_FLAT_NAMES, sizes=sizes, sources=sources)
    copy.launch()


def fused_metadata_copy_cuda(cache_seqlens_src, cu_seqlens_k_src, page_indices_src, nsa_cache_seqlens_src,
                             seqlens_expanded_src, nsa_cu_seqlens_k_src, real_page_table_src,
                             flashmla_num_splits_src, flashmla_metadata_src,
                             cache_seqlens_dst, cu_seqlens_k_dst, page_table_1_dst, nsa_cache_seqlens_dst,
                             seqlens_expanded_dst, nsa_cu_seqlens_k_dst, real_page_table_dst,
                             flashmla_num_splits_dst, flashmla_metadata_dst,
                             forward_mode, bs, max_len, max_seqlen_k, seqlens_expanded_size) -> None:
    """sglang's fused metadata copy to one backend (forward_mode 0 DECODE, 1 TARGET_VERIFY,
    2 DRAFT_EXTEND), in one launch."""
    decode = forward_mode == MODE_DECODE
    sources = (cache_seqlens_src, cu_seqlens_k_src, page_indices_src, nsa_cache_seqlens_src,
               None if decode else seqlens_expanded_src, nsa_cu_seqlens_k_src, real_page_table_src,
               flashmla_num_splits_src, flashmla_metadata_src)
    dests = (cache_seqlens_dst, cu_seqlens_k_dst, page_table_1_dst, nsa_cache_seqlens_dst,
             None if decode else seqlens_expanded_dst, nsa_cu_seqlens_k_dst, real_page_table_dst,
             flashmla_num_splits_dst, flashmla_metadata_dst)
    _copy(_bind(forward_mode, (dests,)), sources, (bs, max_len, max_seqlen_k, seqlens_expanded_size))


def fused_metadata_copy_multi_cuda(cache_seqlens_src, cu_seqlens_k_src, page_indices_src, nsa_cache_seqlens_src,
                                   nsa_cu_seqlens_k_src, real_page_table_src, flashmla_num_splits_src,
                                   flashmla_metadata_src,
                                   cache_seqlens_dst0, cu_seqlens_k_dst0, page_table_1_dst0, nsa_cache_seqlens_dst0,
                                   nsa_cu_seqlens_k_dst0, real_page_table_dst0, flashmla_num_splits_dst0,
                                   flashmla_metadata_dst0,
                                   cache_seqlens_dst1, cu_seqlens_k_dst1, page_table_1_dst1, nsa_cache_seqlens_dst1,
                                   nsa_cu_seqlens_k_dst1, real_page_table_dst1, flashmla_num_splits_dst1,
                                   flashmla_metadata_dst1,
                                   cache_seqlens_dst2, cu_seqlens_k_dst2, page_table_1_dst2, nsa_cache_seqlens_dst2,
                                   nsa_cu_seqlens_k_dst2, real_page_table_dst2, flashmla_num_splits_dst2,
                                   flashmla_metadata_dst2,
                                   bs, max_len, seqlens_expanded_size) -> None:
    """sglang's DECODE copy to three backends (target and draft attention), in one launch."""
    sources = (cache_seqlens_src, cu_seqlens_k_src, page_indices_src, nsa_cache_seqlens_src, None,
               nsa_cu_seqlens_k_src, real_page_table_src, flashmla_num_splits_src, flashmla_metadata_src)
    groups = tuple((c, cu, pt, nc, None, ncu, rp, ns, fm) for c, cu, pt, nc, ncu, rp, ns, fm in (
        (cache_seqlens_dst0, cu_seqlens_k_dst0, page_table_1_dst0, nsa_cache_seqlens_dst0, nsa_cu_seqlens_k_dst0,
         real_page_table_dst0, flashmla_num_splits_dst0, flashmla_metadata_dst0),
        (cache_seqlens_dst1, cu_seqlens_k_dst1, page_table_1_dst1, nsa_cache_seqlens_dst1, nsa_cu_seqlens_k_dst1,
         real_page_table_dst1, flashmla_num_splits_dst1, flashmla_metadata_dst1),
        (cache_seqlens_dst2, cu_seqlens_k_dst2, page_table_1_dst2, nsa_cache_seqlens_dst2, nsa_cu_seqlens_k_dst2,
         real_page_table_dst2, flashmla_num_splits_dst2, flashmla_metadata_dst2)))
    _copy(_bind(MODE_DECODE, groups), sources, (bs, max_len, 0, seqlens_expanded_size))


# pydsa's argument names -> these calls' (sglang's) names, for the errors they raise
_ONLINE_NAMES = {"state": "kv_score_buffer", "kv_score": "kv_score_input", "plan": "compress_plan",
                 "plan[0] (compress)": "compress_plan", "plan[1] (write)": "write_plan"}


def c128_online_decode(kv_score_buffer, kv_score_input, out, ape, indices, seq_lens, extra=None) -> None:
    """sglang's online c128 decode: kv_score_buffer is the state [S, 1, 3D]; `extra` is unused,
    as in sglang."""
    try:
        c128_decode(kv_score_buffer, kv_score_input, out, ape, indices, seq_lens)
    except ArgumentError as exc:
        raise _caller_words(exc, _ONLINE_NAMES) from None


def c128_online_prefill(kv_score_buffer, kv_score_input, out, ape, indices, compress_plan, write_plan,
                        load_indices=None, *, cooperative=True) -> None:
    """sglang's online c128 prefill: plans are uint8 [M, 16] record tensors (device or host).
    cooperative=False (not in sglang's signature): as in pydsa.c128_prefill, host plans never take
    the one cooperative launch (for kernels of other streams running alongside)."""
    try:
        c128_prefill(kv_score_buffer, kv_score_input, out, ape, indices, (compress_plan, write_plan),
                     load_indices=load_indices, cooperative=cooperative)
    except ArgumentError as exc:
        raise _caller_words(exc, _ONLINE_NAMES) from None


# pyplan.plan_prefill's argument names -> plan_compress_online_prefill's: the token count is the plans' rows
_PLANNER_NAMES = {"num_tokens": ("compress_plan", "compress_plan's row count"),
                  "out": "compress_plan", "out[0]": "compress_plan", "out[1]": "write_plan"}


def plan_compress_online_prefill(extend_lens, seq_lens, compress_plan, write_plan, use_cuda_graph) -> tuple:
    """sglang's host planner: int64 extend_lens / seq_lens [B] (host), uint8 [M, 16] host or
    pinned plan buffers filled in place, M = the token count (sum of extend_lens). Returns the
    record counts, or (M, M) in CUDA-graph mode, where the rest is padded with sentinels."""
    for name, t in (("extend_lens", extend_lens), ("seq_lens", seq_lens)):
        dtype = getattr(t, "dtype", None)
        if dtype is not None and dtype is not torch.int64 and str(dtype) != "int64":
            raise RuntimeError(f"{name} must have dtype int64 (got {type(t).__module__.split('.')[0]} {dtype})")
    for name, t in (("compress_plan", compress_plan), ("write_plan", write_plan)):
        shape = tuple(getattr(t, "shape", ()))
        if str(getattr(t, "dtype", None)) not in ("torch.uint8", "uint8") or len(shape) != 2 or shape[1] != 16:
            raise ValueError(f"{name} must be a uint8 [M, 16] array, a torch tensor or numpy (got "
                             f"{type(t).__module__.split('.')[0]} {getattr(t, 'dtype', type(t).__name__)} "
                             f"{list(shape)})")
    m = compress_plan.shape[0]
    if write_plan.shape[0] != m:
        raise ValueError(f"compress_plan has {m} rows but write_plan has {write_plan.shape[0]}")
    # num_tokens = m: the planner refuses extends that do not sum to it before writing anything.
    try:
        _, _, nc, nw = pyplan.plan_prefill(seq_lens, extend_lens, num_tokens=m, out=(compress_plan, write_plan),
                                           return_counts=True)
    except ArgumentError as exc:
        raise _caller_words(exc, _PLANNER_NAMES) from None
    if not use_cuda_graph:
        return nc, nw
    pyplan.plan_prefill(seq_lens, extend_lens, num_tokens=m, graph=True, out=(compress_plan, write_plan))
    return m, m


# ---- sglang 0.5.23's online_c128_mtp (speculative decoding, docs/spec.md, speculative decoding) ----------------------------
# sglang keeps main slots current: the verify writes bank entry k (the state after k drafts) at row
# req + k * state_slot_stride, mark_pending records each request's length before its drafts, and the
# next step's commit copies the accepted entry onto the main slot. Here the verify is c128_verify
# with bank entry 0 = the main slot (so only entries 1..V are written) and no output rows, and the
# commit is c128_commit's copying form. A request whose length before the drafts is 0 runs its
# drafts from position 0 and writes its bank, as in sglang 0.5.23. Differences from sglang's
# kernels, on input they do not guard: a negative length is padding (nothing written), and slots
# outside the state buffer are skipped and counted instead of accessed. int64 index tensors are
# converted to int32 (one small device op each). Every argument is judged before anything is written,
# in these calls' names: counts are ints (a float, a bool or a negative count refused), index tensors
# int32 or int64, pending_seq_lens int64, each tensor with the rows batch_size and num_verify_tokens read.

def _slots(t, batch_size: int):
    """The first batch_size entries of an index tensor, as int32."""
    t = t[:batch_size]
    return t if t.dtype is torch.int32 else t.to(torch.int32)


def _state_rows(state):
    """sglang's state [rows, 3D] (or pydsa's [rows, 1, 3D]) as [rows, 1, 3D], a view."""
    return state.view(state.shape[0], 1, state.shape[-1]) if state.dim() == 2 else state


def _rows(name: str, t, n: int) -> None:
    """t must be a torch.Tensor of at least n rows (what a call's batch_size reads of it)."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(name, f"{name} must be a torch.Tensor (got {type(t).__name__})")
    if t.dim() < 1 or t.shape[0] < n:
        raise ArgumentValueError(name, f"{name} has {t.shape[0] if t.dim() else 0} rows but the call reads {n} of it "
                                       f"(batch_size and num_verify_tokens say so)")


def _indices(name: str, t, n: int) -> None:
    """t must be an integer tensor (int32 or int64, as sglang's) of at least n rows."""
    _rows(name, t, n)
    if t.dtype is not torch.int32 and t.dtype is not torch.int64:
        raise RuntimeError(f"{name} must have dtype int32 or int64 (got {t.dtype})")


def _count(name: str, x, least: int) -> int:
    """x as an int >= least (_args.count_of: never a bool, a float or a string)."""
    v = count_of(x)
    if v is None:
        raise ArgumentTypeError(name, f"{name} must be an int (got {type(x).__name__} {x!r})")
    if v < least:
        raise ArgumentValueError(name, f"{name} is {v}; expected >= {least}")
    return v


# pydsa's argument names -> the MTP calls' (sglang's) names, for the errors pydsa's ops raise under them
_MTP_NAMES = {"kv_score": "kv_score_input", "bank_stride": "state_slot_stride", "ape": "ape", "state": "state",
              "num_drafts": "num_verify_tokens"}


def online_c128_mtp_write_prefix_states(kv_score_input, seq_lens, req_pool_indices, req_to_token, ape, state,
                                        batch_size, num_verify_tokens, state_slot_stride, *, head_dim=None) -> None:
    """Stores the state after each of the num_verify_tokens drafts of request b (rows
    b*num_verify_tokens.. of kv_score_input) at row req + (k+1) * state_slot_stride; main slots are
    only read. req_to_token is accepted and unused, as in sglang 0.5.23. As there, a bf16 state runs
    in fp32 from draft to draft (each bank entry rounded once)."""
    batch_size = _count("batch_size", batch_size, 0)
    num_verify_tokens = _count("num_verify_tokens", num_verify_tokens, 1)
    if batch_size == 0:
        return
    _rows("kv_score_input", kv_score_input, batch_size * num_verify_tokens)
    _rows("req_to_token", req_to_token, 0)  # unused, as in sglang, whose kernel takes it as a tensor
    _indices("seq_lens", seq_lens, batch_size)
    _indices("req_pool_indices", req_pool_indices, batch_size)
    _rows("state", state, 1)
    if head_dim is not None and state.shape[-1] != 3 * head_dim:
        raise ArgumentValueError("head_dim", f"head_dim is {head_dim} but state rows hold {state.shape[-1]} = 3 * "
                                             f"{state.shape[-1] // 3}")
    req = _slots(req_pool_indices, batch_size)
    try:
        c128_verify(_state_rows(state), kv_score_input[:batch_size * num_verify_tokens], None, ape, req,
                    _slots(seq_lens, batch_size), bank_indices=req, bank_stride=state_slot_stride,
                    round_between_drafts=state.dtype != torch.bfloat16)
    except ArgumentError as exc:
        raise _caller_words(exc, _MTP_NAMES) from None


def online_c128_mtp_mark_pending(seq_lens, req_pool_indices, pending_seq_lens, batch_size, num_req_slots, *,
                                 head_dim=None, state_dtype=None) -> None:
    """pending_seq_lens[0:num_req_slots] = -1, then pending_seq_lens[req] = seq_lens[b] for the
    batch's requests with 0 <= req < num_req_slots (int64; rows past num_req_slots untouched)."""
    batch_size = _count("batch_size", batch_size, 0)
    num_req_slots = _count("num_req_slots", num_req_slots, 0)
    if batch_size == 0:
        return
    _indices("seq_lens", seq_lens, batch_size)
    _indices("req_pool_indices", req_pool_indices, batch_size)
    _rows("pending_seq_lens", pending_seq_lens, 0)
    if pending_seq_lens.dtype is not torch.int64:
        raise RuntimeError(f"pending_seq_lens must have dtype int64 (got {pending_seq_lens.dtype})")
    if num_req_slots > pending_seq_lens.shape[0]:
        raise ArgumentValueError("num_req_slots", f"num_req_slots {num_req_slots} exceeds pending_seq_lens rows "
                                                  f"{pending_seq_lens.shape[0]}")
    pending = pending_seq_lens[:num_req_slots]
    pending.fill_(-1)
    req = req_pool_indices[:batch_size].to(torch.int64)
    valid = (req >= 0) & (req < num_req_slots)
    # Requests outside the table land on row 0 as -1, which the maximum ignores (lengths are >= 0).
    pending.scatter_reduce_(0, torch.where(valid, req, 0),
                            torch.where(valid, seq_lens[:batch_size].to(torch.int64), -1), "amax")


def online_c128_mtp_commit_pending(seq_lens, req_pool_indices, req_to_token, pending_seq_lens, state, batch_size,
                                   num_verify_tokens, state_slot_stride, num_req_slots, *, head_dim=None) -> None:
    """For each request with a pending length: accept = clamp(seq_lens[b] - pending, 0,
    num_verify_tokens); bank entry `accept` is copied onto the main slot req unless accept is 0 or
    pending + accept ends a chunk. pending_seq_lens is not cleared."""
    batch_size = _count("batch_size", batch_size, 0)
    num_verify_tokens = _count("num_verify_tokens", num_verify_tokens, 1)
    num_req_slots = _count("num_req_slots", num_req_slots, 0)
    if batch_size == 0:
        return
    _indices("seq_lens", seq_lens, batch_size)
    _indices("req_pool_indices", req_pool_indices, batch_size)
    _rows("req_to_token", req_to_token, 0)  # unused, as in sglang, whose kernel takes it as a tensor
    _rows("pending_seq_lens", pending_seq_lens, num_req_slots)
    if pending_seq_lens.dtype is not torch.int64:
        raise RuntimeError(f"pending_seq_lens must have dtype int64 (got {pending_seq_lens.dtype})")
    _rows("state", state, 1)
    req = req_pool_indices[:batch_size].to(torch.int64)
    valid = (req >= 0) & (req < num_req_slots)
    before = pending_seq_lens[torch.where(valid, req, 0)]
    live = valid & (before >= 0)
    accepted = torch.where(live, (seq_lens[:batch_size].to(torch.int64) - before).clamp(0, num_verify_tokens), 0)
    before = torch.where(live, before, 0)  # not pending: accepted 0, nothing copied
    slots = _slots(req_pool_indices, batch_size)
    try:
        c128_commit(before.to(torch.int32), accepted.to(torch.int32), slots, slots, num_drafts=num_verify_tokens,
                    bank_stride=state_slot_stride, states=[_state_rows(state)])
    except ArgumentError as exc:
        raise _caller_words(exc, _MTP_NAMES) from None
