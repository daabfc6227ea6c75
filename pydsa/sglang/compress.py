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

import torch

from ..c128 import DevicePlan, c128_decode, c128_prefill
from .. import buffer_key
from ..errors import ArgumentError, ArgumentTypeError, ArgumentValueError
from ..store import KVCache, kv_store
from . import c4 as sglang_c4, offline as sglang_offline
from ._args import caller_words as _caller_words, described as _described, memo, of_kind
# the configuration rule (config.py) and the plans (plans.py), importable from here as they always were (the plugin
# reads HANDED_BACK and outside_pydsa here)
from .config import HANDED_BACK, HEAD_DIM, RATIO, check_config as _check_config, not_ours as _not_ours, outside_pydsa
from .plans import CompressorDecodePlan, CompressorPrefillPlan

__all__ = ["CompressorDecodePlan", "CompressorPrefillPlan", "compress_forward", "compress_norm_rope_store",
           "compress_forward_and_store"]


def _plan_of(plan, compress_ratio=RATIO):
    """plan when it is a plan of compress_ratio's that the online c128 path (or the c4 path) reads, else the error
    naming plan."""
    if compress_ratio == sglang_c4.RATIO:
        return sglang_c4.plan_of(plan)  # c4 records are read in place, whoever made them (sglang's planner or pydsa's)
    if isinstance(plan, (CompressorDecodePlan, CompressorPrefillPlan)) and plan.compress_ratio != RATIO:
        raise ArgumentValueError("plan", f"plan is a compress_ratio {plan.compress_ratio} plan but compress_ratio is "
                                         f"{RATIO}")
    of_kind(plan, online=True)
    if isinstance(plan, CompressorDecodePlan):  # its records are read in place, whoever made them
        return plan
    if isinstance(plan, CompressorPrefillPlan):
        if plan.records is None:
            raise ArgumentValueError("plan", "plan: this CompressorPrefillPlan was not made by pydsa's generate_online "
                                             "(it lacks the records pydsa's kernels read)")
        return plan
    raise ArgumentTypeError("plan", f"plan must be a pydsa.sglang CompressorDecodePlan or CompressorPrefillPlan "
                                    f"(got {_described(plan)})")



# compress_forward and compress_forward_and_store, c128 (state, indices) and c4 (ring, records, plan[0], plan[1])
# alike; store: the KVCache made of kvcache and norm_weight, whose channels set its D
_COMPRESS_NAMES = {"state": "kv_score_buffer", "kv_score": "kv_score_input", "indices": "plan.plan_d",
                   "cache_slots": "out_loc", "out": "out", "ape": "ape", "ring": "kv_score_buffer",
                   "main": "kv_score_buffer", "records": "plan.plan_d",
                   "plan[0]": "plan.plan_c", "plan[1]": "plan.plan_w", "store": "norm_weight",
                   "store.cache": "kvcache", "main.store.cache": "kvcache", "ring.store.cache": "kvcache"}
_STORE_NAMES = {"vectors": "kv", "cache_slots": "out_loc", "records": "plan", "cache": "kvcache",
                "rotary": "freq_cis", "eps": "norm_eps"}


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


def _no_promise(records_ahead) -> None:
    """records_ahead is a c4 decode's (and a store's) promise: a c128 compress takes none."""
    if records_ahead is not False:
        raise ArgumentValueError("records_ahead", f"records_ahead is for a c4 layer's compress (compress_ratio 4); "
                                                  f"a c128 compress reads its plan after the wait (got {records_ahead!r})")


def _ring_compress(*args, c4: bool, records_ahead, **kwargs):
    """A compress over a ring of raw rows, sglang's plan read in place: c4 (records_ahead its decode's promise) or
    offline c128 (which takes no promise); pydsa's errors in sglang's words."""
    if not c4:
        _no_promise(records_ahead)
    try:
        if c4:
            return sglang_c4.compress(*args, records_ahead=records_ahead, **kwargs)
        return sglang_offline.compress(*args, **kwargs)
    except ArgumentError as exc:
        raise _caller_words(exc, _COMPRESS_NAMES) from None


def compress_forward(kv_score_buffer, kv_score_input, ape, plan, *, head_dim: int, compress_ratio: int,
                     out=None, is_online: bool = False, records_ahead: bool = False):
    """sglang's compress_forward: decode (out [B, D], a chunk's vector at the rows whose token closes it) or
    prefill (compact out [plan_c rows, D], plan order), online or offline c128, or c4. records_ahead=True (a
    keyword of pydsa's, c4 decode only): the caller's promise that the plan was written before the launch ahead
    of this call began (sglang's step metadata); the kernel then reads it before waiting for that launch."""
    _check_config(head_dim, compress_ratio, is_online)
    c4 = compress_ratio == sglang_c4.RATIO
    if c4 or not is_online:
        return _ring_compress(kv_score_buffer, kv_score_input, ape, plan, head_dim, out, c4=c4,
                              records_ahead=records_ahead)
    _no_promise(records_ahead)
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
        cache = KVCache(kvcache, w, freq_cis, page_size=page_size, eps=float(norm_eps), layout=layout)
        # sglang's caches are [pages, page bytes]: rows of another width mean another page_size (whose pages may
        # still tile the same bytes: 3 pages of 64 entries are 65 of 2 at D = 512); a 1-D cache is whole pages
        if kvcache.dim() >= 2 and kvcache.shape[-1] != cache.page_bytes:
            raise ArgumentValueError("page_size", f"page_size {page_size} makes {cache.page_bytes}-byte pages but "
                                                  f"kvcache's rows hold {kvcache.shape[-1]} bytes (sglang's cache is "
                                                  f"[pages, page bytes]: another page_size?)")
        return cache
    if type(page_size) is not int or not all(isinstance(t, torch.Tensor) for t in (kvcache, norm_weight, freq_cis)):
        return make()
    # the weight's in-place version too: the KVCache holds an fp32 copy of a bf16 weight, made again once it changed
    key = (buffer_key(kvcache), buffer_key(norm_weight), norm_weight._version, buffer_key(freq_cis), page_size,
           float(norm_eps), layout)
    return memo(_caches, key, make, 4096)


def layer_store(kvcache, norm_weight, norm_eps, freq_cis, page_size, layout) -> KVCache:
    """One compressor's store (its layer's cache, norm and rotary table; layout "v4" or "indexer"), judged once
    and named in sglang's words: compress_forward_and_store's, and the plugin's one call for a c4 layer."""
    _check_eps(norm_eps)
    try:
        return _kv_cache(kvcache, norm_weight, norm_eps, freq_cis, page_size, layout)
    except (TypeError, ValueError) as exc:
        raise _caller_words(exc, _STORE_NAMES) from None


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
        raise ArgumentTypeError("norm_eps", f"norm_eps must be a float (got {type(norm_eps).__name__} {norm_eps!r})")


def _norm_weight_named(exc, norm_weight, head_dim):
    """Cold path, a store refused: the error names norm_weight when it is not [head_dim] (the store takes its D
    from norm_weight, so one of another width is judged against kvcache's pages and named there); else exc."""
    if head_dim is not None and isinstance(norm_weight, torch.Tensor) and tuple(norm_weight.shape) != (head_dim,):
        return ArgumentValueError("norm_weight", f"norm_weight must be [{head_dim}] (head_dim {head_dim}; got "
                                                 f"{_described(norm_weight)})")
    return exc


def compress_norm_rope_store(kv, plan, *, norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size,
                             use_fp4=False, bf16_store=False, kvcache_scale=None, rope_cache=None,
                             fp4_k_write_metadata=None, layout="V4", fp8_2buff=False, kvcache_rope=None,
                             records_ahead: bool = False) -> None:
    """sglang's store of a layer's vectors: decode (row b stored when its seq_len closes an entry, at out_loc[b])
    or prefill (row i for plan_c record i, at out_loc[ragged row]), in one launch. It reads plan[1]'s seq_len and
    ragged row, which every plan of a ratio holds alike (online or offline, whoever made it). records_ahead=True
    (a keyword of pydsa's): the caller's promise that the plan and out_loc were written before the launch ahead
    of this call began; the store then reads them before waiting for that launch."""
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
                 ratio=sglang_c4.RATIO if c4 else RATIO, records_ahead=records_ahead)
    except (TypeError, ValueError) as exc:
        raise _caller_words(_norm_weight_named(exc, norm_weight, width), _STORE_NAMES) from None


def compress_forward_and_store(kv_score_buffer, kv_score_input, ape, plan, *, norm_weight, norm_eps, freq_cis,
                               out_loc, kvcache, page_size, head_dim: int = HEAD_DIM, compress_ratio: int = RATIO,
                               out=None, is_online=None, records_ahead: bool = False):
    """compress_forward then compress_norm_rope_store of its vectors, as one call (decode: one launch; prefill:
    the online path's launches and a store launch behind them, the offline path's two, the c4 path's two): every
    vector the compression closes is normalized, quantized and stored into kvcache at out_loc (decode: per
    request; prefill: per query token, by the closing token's row). is_online: as compress_forward's (None: True
    for compress_ratio 128, False for 4). records_ahead=True (c4 only): compress_forward's promise, for the plan
    and out_loc. Returns `out` when given."""
    c4 = compress_ratio == sglang_c4.RATIO
    online = (not c4) if is_online is None else is_online
    _check_config(head_dim, compress_ratio, online)
    _check_eps(norm_eps)
    # c4 and offline plans are read in place, whoever made them; the online path reads pydsa's own plan
    plan = _plan_of(plan, compress_ratio) if online and not c4 else sglang_c4.plan_of(plan, compress_ratio)
    try:
        cache = layer_store(kvcache, norm_weight, norm_eps, freq_cis, page_size,
                            "indexer" if c4 and head_dim == 128 else "v4")
    except (TypeError, ValueError) as exc:
        raise _norm_weight_named(exc, norm_weight, head_dim) from None
    if c4 or not online:
        _ring_compress(kv_score_buffer, kv_score_input, ape, plan, head_dim, out, c4=c4, records_ahead=records_ahead,
                       store=cache, out_loc=out_loc)
        return out
    _no_promise(records_ahead)
    _run(kv_score_buffer, kv_score_input, ape, plan, out, store=cache, cache_slots=out_loc)
    return out
