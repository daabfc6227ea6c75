"""The sglang plugin: `pip install dsa-kernels` and sglang 0.5.23 loads this through its `sglang.srt.plugins`
entry point (`register`), which makes a running sglang use pydsa for every compressor layer of its default
deployment: the c128 layers (offline, sglang's default, and online), the c4 layers (main and indexer
compressors), fp32 or bf16 ring or state; the MTP calls and the fused metadata copy. Restrict sglang's plugins
with SGLANG_PLUGINS=pydsa. register() says in one log line what runs on pydsa and what stays sglang's.

Hooks: the compressor's two calls per c128 or c4 compressor (`compress_forward`, then
`compress_norm_rope_store`, made by `CompressorBackendMixin._forward_compress_all_in_one`) become one
fused launch (an offline c128 extend: two, where sglang runs three; a c4 layer's two compressors: two launches,
where sglang runs four); whether a c128 layer is online is sglang's own rule (SGLANG_OPT_USE_ONLINE_COMPRESS).
The online c128 plans come from pydsa's planners; the offline c128 and c4 plans stay sglang's (one kernel per
step; their records are what pydsa's kernels read in place); the MTP calls and the metadata copies are
replaced. Everything that is not pydsa's configuration (compress.HANDED_BACK: the fp4 indexer, bf16 or two-pool
stores, the V4.1 layouts, other head_dims; online c128 plans made elsewhere) still runs sglang's own code: those
hooks wrap the original (sglang's AROUND hooks) and pass such calls through, where a plain REPLACE would break
them.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_COMPRESS = "sglang.kernels.ops.attention.dsv4.compress"
_MTP = "sglang.kernels.ops.attention.dsv4.online_c128_mtp"
_METADATA = "sglang.kernels.ops.attention.dsa.fused_metadata_copy"
_MIXIN = "sglang.srt.layers.attention.dsv4.compressor_v2.CompressorBackendMixin._forward_compress_all_in_one"


def _ours(plan) -> bool:
    from . import compress as sglang_v2
    return isinstance(plan, (sglang_v2.CompressorDecodePlan, sglang_v2.CompressorPrefillPlan)) and plan[-1] is not None


def _c4(plan) -> bool:
    return getattr(plan, "compress_ratio", None) == 4


def _c128(plan) -> bool:
    """A c128 plan of any maker: the offline path and the store read its records in place."""
    return getattr(plan, "compress_ratio", None) == 128 and hasattr(plan, "is_decode")


def _online(ratio: int) -> bool:
    """sglang's own rule for whether a layer of this ratio runs the online c128 path."""
    from sglang.srt.layers.attention.dsv4.compressor_v2 import _use_online_compress
    return _use_online_compress(ratio)


def _decode_plan(original, *args, **kwargs):
    from .compress import CompressorDecodePlan
    return CompressorDecodePlan.generate_online(*args, **kwargs)


def _prefill_plan(original, *args, **kwargs):
    from .compress import CompressorPrefillPlan
    return CompressorPrefillPlan.generate_online(*args, **kwargs)


def _compress_forward(original, kv_score_buffer, kv_score_input, ape, plan, **kwargs):
    from . import compress as sglang_v2
    online = kwargs.get("is_online", False)
    readable = _c4(plan) or (_ours(plan) if online is True else _c128(plan))
    if readable and sglang_v2.outside_pydsa(kwargs.get("head_dim"), kwargs.get("compress_ratio"), online,
                                            input_dtype=getattr(kv_score_input, "dtype", None)) is None:
        return sglang_v2.compress_forward(kv_score_buffer, kv_score_input, ape, plan, **kwargs)
    return original(kv_score_buffer, kv_score_input, ape, plan, **kwargs)


def _norm_rope_store(original, kv, plan, **kwargs):
    from . import compress as sglang_v2
    if _c128(plan) or _c4(plan):  # the store reads plan[1]'s seq_len and ragged row, alike in every plan
        try:
            return sglang_v2.compress_norm_rope_store(kv, plan, **kwargs)
        except NotImplementedError:
            pass
    return original(kv, plan, **kwargs)


def _compress_all_in_one(original, self, **kw):
    """One fused call (decode: one launch) for a c4 compressor, an offline c128 layer, or an online c128 layer
    whose plan is pydsa's; sglang's path otherwise."""
    from . import compress as sglang_v2
    ratio = kw["compress_ratio"]
    plan = self._get_paged_compress_metadata(ratio)
    reason = sglang_v2.outside_pydsa(kw["head_dim"], ratio, ratio != 4,
                                     indexer=bool(kw.get("use_fp4_indexer") or (kw.get("is_indexer") and ratio != 4)),
                                     bf16_store=bool(kw.get("bf16_store")), two_pool=bool(kw.get("fp8_2buff")),
                                     layout=kw.get("kv_layout", "V4"),
                                     input_dtype=getattr(kw.get("kv_score_input"), "dtype", None))
    online = reason is None and ratio == 128 and _online(ratio)
    if reason is None and ((ratio == 4 and _c4(plan)) or (ratio == 128 and not online and _c128(plan))):
        d, norm = kw["head_dim"], kw["norm"]
        sglang_v2.compress_forward_and_store(
            kw["kv_score_buffer"], kw["kv_score_input"], kw["ape"].view(-1, d), plan, norm_weight=norm.weight,
            norm_eps=norm.variance_epsilon, freq_cis=kw["freqs_cis_cache"], out_loc=kw["out_loc"],
            kvcache=kw["kv_cache"], page_size=kw["page_size"], head_dim=d, compress_ratio=ratio, is_online=False)
        return None
    if online and _ours(plan):
        norm = kw["norm"]
        sglang_v2.compress_forward_and_store(
            kw["kv_score_buffer"].view(-1, 1, 3 * 512), kw["kv_score_input"], kw["ape"].view(-1, 512), plan,
            norm_weight=norm.weight, norm_eps=norm.variance_epsilon, freq_cis=kw["freqs_cis_cache"],
            out_loc=kw["out_loc"], kvcache=kw["kv_cache"], page_size=kw["page_size"])
        return None
    return original(self, **kw)


def hooks() -> list:
    """(target, hook, kind) of every hook the plugin registers; kind is "around" or "replace"."""
    from .. import sglang
    return [
        (f"{_COMPRESS}.CompressorDecodePlan.generate_online", _decode_plan, "around"),
        (f"{_COMPRESS}.CompressorPrefillPlan.generate_online", _prefill_plan, "around"),
        (f"{_COMPRESS}.compress_forward", _compress_forward, "around"),
        (f"{_COMPRESS}.compress_norm_rope_store", _norm_rope_store, "around"),
        (_MIXIN, _compress_all_in_one, "around"),
        (f"{_MTP}.online_c128_mtp_write_prefix_states", sglang.online_c128_mtp_write_prefix_states, "replace"),
        (f"{_MTP}.online_c128_mtp_mark_pending", sglang.online_c128_mtp_mark_pending, "replace"),
        (f"{_MTP}.online_c128_mtp_commit_pending", sglang.online_c128_mtp_commit_pending, "replace"),
        (f"{_METADATA}.fused_metadata_copy_cuda", sglang.fused_metadata_copy_cuda, "replace"),
        (f"{_METADATA}.fused_metadata_copy_multi_cuda", sglang.fused_metadata_copy_multi_cuda, "replace"),
    ]


def startup_line() -> str:
    """The plugin's one start-up log line: what runs on pydsa, and what stays sglang's (compress.HANDED_BACK)."""
    from .. import __version__
    from .compress import HANDED_BACK
    return (f"pydsa {__version__} serves sglang's compressor layers: c128 offline (sglang's default) and online, c4 "
            f"main and indexer compressors, fp32 or bf16 ring or state, into V4 caches; the online c128 plans, the "
            f"MTP calls and the fused metadata copy. Handed back to sglang's own kernels: "
            f"{', '.join(HANDED_BACK)}; the per-step c4 and offline c128 plans stay sglang's (pydsa reads their "
            f"records in place)")


def register() -> None:
    """The entry point's function: registers the hooks with sglang's HookRegistry (sglang applies them) and logs
    the plugin's one start-up line."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    for target, hook, kind in hooks():
        HookRegistry.register(target, hook, HookType.AROUND if kind == "around" else HookType.REPLACE)
    logger.info(startup_line())
