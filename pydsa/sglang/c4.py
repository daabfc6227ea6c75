"""sglang 0.5.23's ratio-4 (c4) compressor calls over pydsa's c4 ops (docs/spec.md, "The ratio-4 compressor").

sglang keeps one ring of R raw rows per 256-token SWA page: the row of position p of request rid is
(swa // S) * R + swa % R with swa = full_to_state[req_to_token[rid, p]] (S = swa_page_size), or
rid * R + p % R with use_req_ring. Its plans are the c4 records pydsa's kernels read in place:
- decode: plan_d uint8 [B, 16], {u32 seq_len, i32 write row, i32 previous group, i32 current group};
- extend: plan_c uint8 [C, 16], {u32 seq_len = position + 1, u16 ragged row, u16 window rows from the ring,
  i32 previous group, i32 current group} and plan_w uint8 [W, 8], {u32 ragged row, i32 ring row}; padding
  {0xFFFFFFFF, 0, 0, -1, -1} and {0xFFFFFFFF, -1} (CUDA-graph plans are padded to num_q_tokens rows).

The planners here write the same records as sglang's (its host planner byte for byte; its device planner's
records in request and position order, where sglang's order depends on its atomics). A target verify of V
drafts is an extend of V tokens per request; sglang's ring of 16 rows serves V <= 10 (R - 6), which this
layer cannot check (sglang's signatures do not tell a verify from a prefill): pydsa.c4_verify, which takes
V, refuses more.
"""
from __future__ import annotations

import torch

from .. import _fill_c4_plan
from .._abi import DEFAULT_PDL_FLAG, check as _check_status
from ..c4 import C4Compressor, c4_decode, c4_extend
from ._args import count_of, described as _described

WINDOW, RATIO = 8, 4
MAX_TOKENS = 65536
_decode_plan = _fill_c4_plan.decode_plan
_extend_plan = _fill_c4_plan.extend_plan


def _check_ring(compress_ratio, swa_page_size, ring_size):
    for name, v in (("swa_page_size", swa_page_size), ("ring_size", ring_size)):
        if count_of(v) is None:
            raise RuntimeError(f"{name} must be an int (got {_described(v)} {v!r})")
    if compress_ratio != RATIO:
        raise ValueError(f"compress_ratio {compress_ratio} is not a c4 plan")
    if ring_size <= 0 or ring_size % RATIO or swa_page_size <= 0 or swa_page_size % ring_size:
        raise RuntimeError(f"swa_page_size ({swa_page_size}) must be a multiple of ring_size ({ring_size}), and "
                           f"ring_size a multiple of 4")


def _check_tables(req_pool_indices, req_to_token, full_to_state):
    """The tables' kinds (their values are data: the plan op never reads past them)."""
    for name, t, dtype, dim in (("req_pool_indices", req_pool_indices, torch.int64, 1),
                                ("req_to_token", req_to_token, torch.int32, 2),
                                ("full_to_state", full_to_state, torch.int64, 1)):
        if not isinstance(t, torch.Tensor) or t.dtype is not dtype or t.dim() != dim:
            raise RuntimeError(f"{name} must be a {dim}-D {dtype} tensor (got {_described(t)})")


def plan_decode(req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size: int, ring_size: int,
                use_req_ring: bool = False) -> torch.Tensor:
    """sglang's c4 decode plan (plan_d uint8 [B, 16]) on the device of req_pool_indices, in one launch, no
    host synchronization. A seq_len <= 0 gives a padding record (seq_len 0, nothing read or written)."""
    _check_ring(RATIO, swa_page_size, ring_size)
    _check_tables(req_pool_indices, req_to_token, full_to_state)
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(f"seq_lens must be a torch.int64/torch.int32 tensor (got {_described(seq_lens)})")
    if req_pool_indices.dim() != 1 or seq_lens.dim() != 1 or req_pool_indices.shape[0] != seq_lens.shape[0]:
        raise RuntimeError(f"req_pool_indices must be [B] with B the length of seq_lens (got "
                           f"{list(req_pool_indices.shape)} and {list(seq_lens.shape)})")
    seq = seq_lens.to(req_pool_indices.device, torch.int64)
    plan_d = torch.empty((seq.shape[0], 16), dtype=torch.uint8, device=seq.device)
    status = _decode_plan(_dense(req_pool_indices), _rows_apart(req_to_token), _dense(full_to_state), _dense(seq),
                          swa_page_size=count_of(swa_page_size), ring_size=count_of(ring_size),
                          use_req_ring=bool(use_req_ring), plan_d=plan_d, flags=DEFAULT_PDL_FLAG)
    if status:
        _check_status(status)
    return plan_d


def plan_prefill(req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state, swa_page_size: int,
                 ring_size: int, num_q_tokens: int, use_cuda_graph: bool = False, use_req_ring: bool = False):
    """sglang's c4 extend plan (plan_c uint8 [C, 16], plan_w uint8 [W, 8]): with host seq_lens / extend_lens
    (int64), its host planner's records (sum of extends == num_q_tokens); with device ones (CUDA graphs,
    target verify), records in request and position order, both lists padded to num_q_tokens rows."""
    _check_ring(RATIO, swa_page_size, ring_size)
    _check_tables(req_pool_indices, req_to_token, full_to_state)
    for name, t in (("seq_lens", seq_lens), ("extend_lens", extend_lens)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int64, torch.int32) or t.dim() != 1 \
                or t.shape[0] != req_pool_indices.shape[0]:
            raise RuntimeError(f"{name} must be an int64 or int32 tensor [B] with B the length of req_pool_indices "
                               f"(got {_described(t)}; req_pool_indices {list(req_pool_indices.shape)})")
    for name, v in (("use_cuda_graph", use_cuda_graph), ("use_req_ring", use_req_ring)):
        if v is not True and v is not False:
            raise RuntimeError(f"{name} must be a bool (got {v!r})")
    n = count_of(num_q_tokens)
    if n is None:
        raise RuntimeError(f"num_q_tokens must be an int (got {_described(num_q_tokens)})")
    dev = req_pool_indices.device
    host = seq_lens.device.type == "cpu"
    seq, ext = seq_lens.to(torch.int64), extend_lens.to(torch.int64)
    b_count = seq.shape[0]
    if not (b_count < MAX_TOKENS and b_count <= n <= MAX_TOKENS):
        raise RuntimeError(f"a c4 prefill plan needs batch_size ({b_count}) <= num_q_tokens ({n}) <= 65536 "
                           f"(16-bit ragged rows)")
    if host:
        if bool(((ext <= 0) | (ext > seq)).any()):
            bad = int(torch.nonzero((ext <= 0) | (ext > seq))[0, 0])
            raise RuntimeError(f"extend_lens[{bad}] is {int(ext[bad])}; expected 1..seq_lens[{bad}] = {int(seq[bad])}")
        if int(ext.sum()) != n:
            raise RuntimeError(f"the extends sum to {int(ext.sum())} but num_q_tokens is {n}")
    seq_d, ext_d = seq.to(dev), ext.to(dev)
    plan_c = torch.empty((n, 16), dtype=torch.uint8, device=dev)
    plan_w = torch.empty((n, 8), dtype=torch.uint8, device=dev)
    page, ring = count_of(swa_page_size), count_of(ring_size)
    status = _extend_plan(_dense(req_pool_indices), _dense(seq_d), _dense(ext_d), _rows_apart(req_to_token),
                          _dense(full_to_state), swa_page_size=page, ring_size=ring, use_req_ring=use_req_ring,
                          plan_c=plan_c, plan_w=plan_w, flags=DEFAULT_PDL_FLAG)
    if status:
        _check_status(status)
    if host and not use_cuda_graph:  # exactly the real records, counted from the host's lengths
        nc, nw = _host_counts(seq, ext, page, ring, use_req_ring)
        return plan_c[:nc], plan_w[:nw]
    return plan_c, plan_w


def _host_counts(seq: torch.Tensor, ext: torch.Tensor, page: int, ring: int, use_req_ring: bool):
    """(compress, write) records of an extend whose host lengths passed the host planner's checks (0 < ext <=
    seq): the positions p in [seq - ext, seq) with (p + 1) % 4 == 0, and those kept in the ring (p at or past
    the first kept position, or among the last 4 of a page of a page-scoped ring)."""
    start = seq - ext
    closing = int((seq // RATIO - start // RATIO).sum())
    pad = ring - WINDOW + 2 if ring > WINDOW else 0
    first = torch.minimum(seq // RATIO * RATIO - RATIO, seq - pad)
    kept_from = torch.maximum(torch.minimum(first, seq), start)
    kept = seq - kept_from
    if not use_req_ring:  # page ends below kept_from: ends(x) counts the page-end positions below x
        def ends(x):
            return x // page * RATIO + (x % page - (page - RATIO)).clamp_min(0)
        kept = kept + ends(kept_from) - ends(start)
    return closing, int(kept.sum())


def _dense(t: torch.Tensor) -> torch.Tensor:
    """t contiguous, as the op reads it (sglang's own tensors already are)."""
    return t if t.is_contiguous() else t.contiguous()


def _rows_apart(req_to_token: torch.Tensor) -> torch.Tensor:
    """req_to_token with each row contiguous; its rows may lie apart (the op takes their stride)."""
    return req_to_token if req_to_token.shape[1] <= 1 or req_to_token.stride(1) == 1 else req_to_token.contiguous()


def compressor(kv_score_buffer, ape, head_dim: int, store=None) -> C4Compressor:
    """pydsa's view of one sglang c4 compressor: its ring ([rows, 4D] however sglang shapes it) and ape."""
    ring = kv_score_buffer.reshape(-1, 4 * head_dim)
    return C4Compressor(ring, ape.reshape(-1, head_dim), store=store)


def compress(kv_score_buffer, kv_score_input, ape, plan, head_dim: int, out=None, store=None, out_loc=None):
    """One compressor's c4 step over sglang's plan (decode or extend), its store fused when given; returns out
    (decode [B, D]: closing rows written; extend [C, D]: row i for record i)."""
    a = ape if ape.dtype == kv_score_input.dtype else ape.to(dtype=kv_score_input.dtype)
    comp = compressor(kv_score_buffer, a, head_dim, store)
    if plan.is_decode:
        if out is None and store is None:
            out = kv_score_input.new_empty((plan.plan_d.shape[0], head_dim))
        c4_decode(comp, kv_score_input, records=plan.plan_d, out=out, cache_slots=out_loc)
    else:
        if out is None and store is None:
            out = kv_score_input.new_empty((plan.plan_c.shape[0], head_dim))
        c4_extend(comp, kv_score_input, (plan.plan_c, plan.plan_w), out=out, cache_slots=out_loc)
    return out


def layer(main, indexer, plan, out_loc) -> None:
    """Both compressors of one c4 layer and both stores in one call (decode: one launch; extend: two). main
    and indexer: dicts of kv_score_buffer, kv_score_input, ape and store (a pydsa.KVCache, layout "v4" for
    main, "indexer" for the indexer); out_loc: sglang's c4_out_loc."""
    m = compressor(main["kv_score_buffer"], main["ape"], main["kv_score_buffer"].shape[-1] // 4, main["store"])
    i = compressor(indexer["kv_score_buffer"], indexer["ape"], indexer["kv_score_buffer"].shape[-1] // 4,
                   indexer["store"])
    if plan.is_decode:
        c4_decode(m, main["kv_score_input"], indexer=i, indexer_kv_score=indexer["kv_score_input"],
                  records=plan.plan_d, cache_slots=out_loc)
    else:
        c4_extend(m, main["kv_score_input"], (plan.plan_c, plan.plan_w), indexer=i,
                  indexer_kv_score=indexer["kv_score_input"], cache_slots=out_loc)

