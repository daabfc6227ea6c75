"""The sglang plugin: `pip install dsa-kernels` and sglang 0.5.23 loads this through its `sglang.srt.plugins`
entry point (`register`), which makes a running sglang use pydsa for its compressor layers: the online c128
layers, the c4 layers (main and indexer compressors, one call for both), fp32 or bf16 ring or state; the MTP
calls and the fused metadata copy; and, with PYDSA_SGLANG_OFFLINE=1, the offline c128 layers (sglang's default
c128 path: off by default, as pydsa's offline ops are slower than sglang's own in most measured cases). Restrict
sglang's plugins with SGLANG_PLUGINS=pydsa. register() says in one log line what runs on pydsa and what stays
sglang's.

Hooks, per compressor: the compressor's two calls per c128 or c4 compressor (`compress_forward`, then
`compress_norm_rope_store`, made by `CompressorBackendMixin._forward_compress_all_in_one`) become one fused call
(decode: one launch; an offline c128 extend: two, where sglang runs three); whether a c128 layer is online is
sglang's own rule (SGLANG_OPT_USE_ONLINE_COMPRESS).

Hooks, per c4 layer: sglang calls a c4 layer's two compressors separately. `MQALayer._forward_prepare`
(sglang.srt.models.deepseek_v4; the multi-stream prepares alike) calls the indexer first, whose
`C4IndexerBackendMixin._forward_prepare_normal` (sglang.srt.layers.attention.dsv4.indexer) makes the indexer
compressor's call, `CompressorBackendMixin.forward_indexer_compressor` (an alias of `forward_unified`), and then
reads the indexer cache it stored (the top-k); the layer then makes the main compressor's call,
`CompressorBackendMixin.forward_core_compressor` (the same function). Nothing between the two reads the main
compressor's ring or cache, but the indexer's store must come before its read, so the one call for both runs at
the first of the two: the plugin hooks `sglang.srt.models.deepseek_v4.MQALayer.forward` (the layer that owns both
compressors: which layer's step is running, and the x and forward_batch it passes both calls) and the two
aliases. At the first call, sglang's own `forward_unified` runs for both compressors with their
`_forward_compress_all_in_one` held back (each compressor's kv_score_input from its own GEMM, the other's from the
layer's x, which sglang passes its call unchanged; its caches, page sizes, layouts and slots as sglang resolves
them); when both are pydsa's configuration, share sglang's c4_out_loc and have as many input rows,
`pydsa.sglang.c4_layer` runs once (decode: one launch, where sglang runs four; extend: two, where sglang runs
four), and the second compressor's call is then a no-op, checked to carry the same x, forward_batch and layer_id
(a different one raises: its compressor already ran). Otherwise only the first compressor runs then (per
compressor, as above) and the second runs at its own call: a hisparse pool (the main's slots translated, and its
swap-in between the two calls rewriting the main's pool), the indexer's x cut to fewer rows than the layer's, a
configuration that is not pydsa's (a layer found so for its configuration runs per compressor from then on); the
trtllm uniform-fp8 pool, context-parallel prefill (collectives in the compressor's GEMM) and V4.1 layers are
never joined.

The online c128 plans come from pydsa's planners; the offline c128 and c4 plans stay sglang's (one kernel per
step; their records are what pydsa's kernels read in place); the MTP calls and the metadata copies are
replaced. Everything that is not pydsa's configuration (compress.HANDED_BACK: the fp4 indexer, bf16 or two-pool
stores, the V4.1 layouts, other head_dims; online c128 plans made elsewhere) still runs sglang's own code: those
hooks wrap the original (sglang's AROUND hooks) and pass such calls through, where a plain REPLACE would break
them.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref

logger = logging.getLogger(__name__)

_COMPRESS = "sglang.kernels.ops.attention.dsv4.compress"
_MTP = "sglang.kernels.ops.attention.dsv4.online_c128_mtp"
_METADATA = "sglang.kernels.ops.attention.dsa.fused_metadata_copy"
_BACKEND = "sglang.srt.layers.attention.dsv4.compressor_v2.CompressorBackendMixin"
_MIXIN = f"{_BACKEND}._forward_compress_all_in_one"
_LAYER = "sglang.srt.models.deepseek_v4.MQALayer.forward"
_C4_RATIO, _MAIN_DIM, _INDEXER_DIM = 4, 512, 128

# sglang's offline c128 layers (its default c128 path) run on pydsa only when asked: measured beside sglang's
# own offline kernels, pydsa's offline ops are slower in most cells (docs/performance.md, "The offline c128
# compressor"), so an install keeps them sglang's unless this is set to 1.
OFFLINE_SWITCH = "PYDSA_SGLANG_OFFLINE"
_SWITCH_WORDS = {"1": True, "on": True, "true": True, "yes": True, "0": False, "off": False, "false": False,
                 "no": False, "": False}


_offline = None  # the switch as register() read it (a server reads its environment once)


def serves_offline(refresh: bool = False) -> bool:
    """Whether sglang's offline c128 layers run on pydsa (PYDSA_SGLANG_OFFLINE=1; off by default), read from the
    environment at register() (or the first call, or with refresh) and kept: the hooks ask it per call. Any other
    value than 1/on/true/yes or 0/off/false/no is refused, naming the variable."""
    global _offline
    if _offline is None or refresh:
        value = os.environ.get(OFFLINE_SWITCH, "")
        try:
            _offline = _SWITCH_WORDS[value.strip().lower()]
        except KeyError:
            raise ValueError(f"{OFFLINE_SWITCH} is {value!r}; expected 1 (sglang's offline c128 layers on pydsa) or "
                             f"0 (sglang's own, the default)") from None
    return _offline

# .step: the c4 layer step running on this thread (_LayerStep); .held: the _forward_compress_all_in_one calls
# held back while sglang's forward_unified runs for the layer's one call
_running = threading.local()
_per_compressor = weakref.WeakSet()  # c4 layers whose configuration is not one call's: they run per compressor


def _ours(plan) -> bool:
    """A plan the online c128 path reads: a decode plan not made for the offline path, or a prefill plan made by
    generate_online (which carries pydsa's records)."""
    from . import compress as sglang_v2
    if isinstance(plan, sglang_v2.CompressorDecodePlan):
        return plan.online is not False
    return isinstance(plan, sglang_v2.CompressorPrefillPlan) and plan.load_indices is not None \
        and plan.online is not False


def _c4(plan) -> bool:
    return getattr(plan, "compress_ratio", None) == 4


def _c128(plan) -> bool:
    """A c128 plan of any maker (the offline path and the store read its records in place) whose layer pydsa serves:
    only with PYDSA_SGLANG_OFFLINE=1."""
    return getattr(plan, "compress_ratio", None) == 128 and hasattr(plan, "is_decode") and serves_offline()


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
    # the store reads plan[1]'s seq_len and ragged row, alike in every plan; an offline layer's only when switched on
    if _c4(plan) or _ours(plan) or _c128(plan):
        try:
            return sglang_v2.compress_norm_rope_store(kv, plan, **kwargs)
        except NotImplementedError:
            pass
    return original(kv, plan, **kwargs)


def _reason(kw):
    """What of one _forward_compress_all_in_one call's configuration is not pydsa's, or None (config.outside_pydsa)."""
    from . import compress as sglang_v2
    ratio = kw["compress_ratio"]
    return sglang_v2.outside_pydsa(kw["head_dim"], ratio, ratio != _C4_RATIO,
                                   indexer=bool(kw.get("use_fp4_indexer") or (kw.get("is_indexer") and ratio != 4)),
                                   bf16_store=bool(kw.get("bf16_store")), two_pool=bool(kw.get("fp8_2buff")),
                                   layout=kw.get("kv_layout", "V4"),
                                   input_dtype=getattr(kw.get("kv_score_input"), "dtype", None))


def _compress_all_in_one(original, self, **kw):
    """One fused call (decode: one launch) for a c4 compressor, an offline c128 layer, or an online c128 layer
    whose plan is pydsa's; sglang's path otherwise. Held back (not run) while a c4 layer's one call gathers its
    two compressors' calls."""
    from . import compress as sglang_v2
    held = getattr(_running, "held", None)
    if held is not None:
        held.append((original, kw))
        return None
    ratio = kw["compress_ratio"]
    plan = self._get_paged_compress_metadata(ratio)
    reason = _reason(kw)
    online = reason is None and ratio == 128 and _online(ratio)
    if reason is None and ((ratio == 4 and _c4(plan)) or
                           (ratio == 128 and not online and _c128(plan))):
        d, norm = kw["head_dim"], kw["norm"]
        sglang_v2.compress_forward_and_store(
            kw["kv_score_buffer"], kw["kv_score_input"], kw["ape"].view(-1, d), plan, norm_weight=norm.weight,
            norm_eps=norm.variance_epsilon, freq_cis=kw["freqs_cis_cache"], out_loc=kw["out_loc"],
            kvcache=kw["kv_cache"], page_size=kw["page_size"], head_dim=d, compress_ratio=ratio, is_online=False,
            records_ahead=ratio == 4 and step_slots(self, ratio, kw["out_loc"]))
        return None
    if online and _ours(plan):
        norm = kw["norm"]
        sglang_v2.compress_forward_and_store(
            kw["kv_score_buffer"].view(-1, 1, 3 * 512), kw["kv_score_input"], kw["ape"].view(-1, 512), plan,
            norm_weight=norm.weight, norm_eps=norm.variance_epsilon, freq_cis=kw["freqs_cis_cache"],
            out_loc=kw["out_loc"], kvcache=kw["kv_cache"], page_size=kw["page_size"])
        return None
    return original(self, **kw)


def step_slots(backend, ratio, out_loc) -> bool:
    """Whether out_loc is the step's own slots of `ratio` (sglang's forward metadata, made with the plans at the
    step's start, before the layers' launches), so the plugin can promise pydsa's kernels that the plan and the
    slots were written before the launch ahead of theirs (records_ahead): not for slots sglang translated just
    before the call (a hisparse pool's gather is that launch)."""
    get = getattr(backend, "_get_out_loc", None)
    try:
        return get is not None and out_loc is get(ratio)
    except Exception:  # a backend without the step's slots of this ratio: no promise
        return False


def c4_layer_call(plan, main: dict, indexer: dict, *, records_ahead: bool = False) -> None:
    """One c4 layer's two compressors and both stores as one pydsa.sglang.c4_layer call (decode: one launch), from
    the keywords sglang's forward_unified gives `_forward_compress_all_in_one` for its main and its indexer
    compressor (both pydsa's configuration, one out_loc). records_ahead: c4_layer's promise (step_slots)."""
    from . import c4 as sglang_c4
    sglang_c4.layer(_layer_side(main, "v4"), _layer_side(indexer, "indexer"), plan, main["out_loc"],
                    records_ahead=records_ahead)


def _layer_side(kw, layout) -> dict:
    """c4_layer's dict of one compressor, from its _forward_compress_all_in_one keywords."""
    from .compress import layer_store
    norm = kw["norm"]
    store = layer_store(kw["kv_cache"], norm.weight, norm.variance_epsilon, kw["freqs_cis_cache"], kw["page_size"],
                        layout)
    return {"kv_score_buffer": kw["kv_score_buffer"], "kv_score_input": kw["kv_score_input"],
            "ape": kw["ape"].view(-1, kw["head_dim"]), "store": store}


def _apart(main, indexer, judged):
    """Why two compressors' calls cannot be one c4_layer call, or None; and whether that holds for every step (the
    configuration) rather than this one (the rows). `judged`: the one of the two whose configuration is known
    to be pydsa's."""
    reason = _reason(indexer if judged is main else main)
    if reason:
        return reason, True
    if (main["head_dim"], indexer["head_dim"]) != (_MAIN_DIM, _INDEXER_DIM):
        return f"head_dims {main['head_dim']} and {indexer['head_dim']}", True
    if main["out_loc"] is not indexer["out_loc"]:
        return "the main compressor's slots are not the indexer's (a hisparse pool)", True
    rows = [getattr(kw["kv_score_input"], "shape", (None,))[0] for kw in (main, indexer)]
    if rows[0] != rows[1]:
        return f"{rows[0]} and {rows[1]} input rows", False
    return None, False


class _LayerStep:
    """One c4 layer's forward (MQALayer.forward): its two compressors, the x and forward_batch the layer passes
    their calls, its layer_id, and which call already came (first) or ran with the first (ahead)."""

    def __init__(self, layer, main, indexer, x, batch):
        self.layer, self.main, self.indexer, self.x, self.batch = layer, main, indexer, x, batch
        self.first = self.ahead = self.layer_id = None

    def owns(self, compressor) -> bool:
        return compressor is self.main or compressor is self.indexer

    def name(self, compressor) -> str:
        return "main" if compressor is self.main else "indexer"


def _keep_apart(layer) -> None:
    """The layer's compressors run per compressor from now on (a configuration that is not one call's)."""
    try:
        _per_compressor.add(layer)
    except TypeError:  # not weakly referable: judged again each step
        pass


def _joinable(layer) -> bool:
    try:
        return layer not in _per_compressor
    except TypeError:  # not weakly referable: never found apart
        return True


def _layer_forward(original, layer, *args, **kwargs):
    """sglang's MQALayer.forward(x, positions, forward_batch, ...) of a DeepSeek-V4 c4 layer, with the layer's step
    known to its two compressors' calls; other layers as they are."""
    if getattr(layer, "compress_ratio", None) != _C4_RATIO:
        return original(layer, *args, **kwargs)
    main = getattr(layer, "compressor", None)
    indexer = getattr(getattr(layer, "indexer", None), "compressor", None)
    if getattr(layer, "is_dsv41", False) or main is None or indexer is None or not _joinable(layer):
        return original(layer, *args, **kwargs)
    x = args[0] if args else kwargs.get("x")
    batch = args[2] if len(args) > 2 else kwargs.get("forward_batch")
    outer = getattr(_running, "step", None)
    _running.step = step = _LayerStep(layer, main, indexer, x, batch)
    try:
        result = original(layer, *args, **kwargs)
    finally:
        _running.step = outer
    if step.ahead is not None:
        raise RuntimeError(f"layer {step.layer_id}'s {step.name(step.ahead)} compressor ran with the "
                           f"{step.name(step.first)} compressor's call, but sglang's forward of the layer made no "
                           f"call of its own for it")
    return result


def _held(original, backend, args, kwargs):
    """sglang's forward_unified with its _forward_compress_all_in_one call held back: (that call's original, its
    keywords), or None when it made none (an idle batch)."""
    held, outer = [], getattr(_running, "held", None)
    _running.held = held
    try:
        original(backend, *args, **kwargs)
    finally:
        _running.held = outer
    return held[0] if held else None


def _compressor_call(original, backend, *args, **kwargs):
    """sglang's forward_core_compressor / forward_indexer_compressor (forward_unified: x, forward_batch, layer_id,
    compressor). Within a c4 layer's step: the first of its two calls runs both compressors as one c4_layer call
    when it can (the module's docstring says when), and the second is then a no-op; anything else as it was."""
    step = getattr(_running, "step", None)
    if step is None:  # not inside a c4 layer's forward
        return original(backend, *args, **kwargs)
    call = dict(zip(("x", "forward_batch", "layer_id", "compressor"), args))
    call.update(kwargs)
    compressor = call.get("compressor")
    if call.get("forward_batch") is not step.batch or not step.owns(compressor):
        return original(backend, *args, **kwargs)
    if step.ahead is compressor:
        if call.get("x") is not step.x or call.get("layer_id") != step.layer_id:
            raise RuntimeError(
                f"layer {step.layer_id}'s {step.name(compressor)} compressor already ran with the "
                f"{step.name(step.first)} compressor's call, on the x the layer was given and layer_id "
                f"{step.layer_id}; sglang's own call for it now passes "
                f"{'another x' if call.get('x') is not step.x else 'the same x'} and layer_id {call.get('layer_id')}")
        step.ahead = None
        return None
    if step.first is not None:
        return original(backend, *args, **kwargs)
    step.first, step.layer_id = compressor, call.get("layer_id")
    if (getattr(getattr(backend, "token_to_kv_pool", None), "uniform_fp8", False)
            or getattr(call.get("forward_batch"), "attn_cp_metadata", None) is not None):
        return original(backend, *args, **kwargs)
    this = _held(original, backend, args, kwargs)
    if this is None:
        return None
    own, kw = this
    plan = backend._get_paged_compress_metadata(_C4_RATIO)
    if kw["compress_ratio"] != _C4_RATIO or not _c4(plan):
        return _compress_all_in_one(own, backend, **kw)
    if _reason(kw) is not None:  # its configuration: the layer runs per compressor from now on
        _keep_apart(step.layer)
        return _compress_all_in_one(own, backend, **kw)
    if call.get("x") is not step.x:  # the indexer's x cut to its queries: apart this step, the other's GEMM not run
        return _compress_all_in_one(own, backend, **kw)
    other = step.indexer if compressor is step.main else step.main
    that = _held(original, backend, (step.x, step.batch, step.layer_id, other), {})
    if that is not None:
        main, indexer = (that[1], kw) if kw.get("is_indexer") else (kw, that[1])
        reason, lasting = _apart(main, indexer, kw)
        if reason is None:
            c4_layer_call(plan, main, indexer, records_ahead=step_slots(backend, _C4_RATIO, main["out_loc"]))
            step.ahead = other
            return None
        if lasting:
            _keep_apart(step.layer)
    return _compress_all_in_one(own, backend, **kw)


def hooks() -> list:
    """(target, hook, kind) of every hook the plugin registers; kind is "around" or "replace"."""
    from .. import sglang
    return [
        (f"{_COMPRESS}.CompressorDecodePlan.generate_online", _decode_plan, "around"),
        (f"{_COMPRESS}.CompressorPrefillPlan.generate_online", _prefill_plan, "around"),
        (f"{_COMPRESS}.compress_forward", _compress_forward, "around"),
        (f"{_COMPRESS}.compress_norm_rope_store", _norm_rope_store, "around"),
        (_MIXIN, _compress_all_in_one, "around"),
        (_LAYER, _layer_forward, "around"),
        (f"{_BACKEND}.forward_indexer_compressor", _compressor_call, "around"),
        (f"{_BACKEND}.forward_core_compressor", _compressor_call, "around"),
        (f"{_MTP}.online_c128_mtp_write_prefix_states", sglang.online_c128_mtp_write_prefix_states, "replace"),
        (f"{_MTP}.online_c128_mtp_mark_pending", sglang.online_c128_mtp_mark_pending, "replace"),
        (f"{_MTP}.online_c128_mtp_commit_pending", sglang.online_c128_mtp_commit_pending, "replace"),
        (f"{_METADATA}.fused_metadata_copy_cuda", sglang.fused_metadata_copy_cuda, "replace"),
        (f"{_METADATA}.fused_metadata_copy_multi_cuda", sglang.fused_metadata_copy_multi_cuda, "replace"),
    ]


def startup_line() -> str:
    """The plugin's one start-up log line: what runs on pydsa, and what stays sglang's (compress.HANDED_BACK, and
    the offline c128 layers unless PYDSA_SGLANG_OFFLINE=1)."""
    from .. import __version__
    from .compress import HANDED_BACK
    offline = serves_offline()
    c128 = "c128 offline (sglang's default) and online" if offline else "c128 online"
    kept = [] if offline else [f"c128 offline layers (sglang's default c128 path; {OFFLINE_SWITCH}=1 runs them on "
                               f"pydsa, slower than sglang's in most measured cases)"]
    return (f"pydsa {__version__} serves sglang's compressor layers: {c128}, c4 "
            f"layers (main and indexer compressors in one call, decode: one launch), fp32 or bf16 ring or state, "
            f"into V4 caches; the online c128 plans, the "
            f"MTP calls and the fused metadata copy. Handed back to sglang's own kernels: "
            f"{', '.join(kept + list(HANDED_BACK))}; the per-step c4"
            f"{' and offline c128' if offline else ''} plans stay sglang's (pydsa reads their records in place)")


def register() -> None:
    """The entry point's function: registers the hooks with sglang's HookRegistry (sglang applies them) and logs
    the plugin's one start-up line."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    serves_offline(refresh=True)  # a mistyped switch fails register() (sglang logs it and runs without it), not a layer
    for target, hook, kind in hooks():
        HookRegistry.register(target, hook, HookType.AROUND if kind == "around" else HookType.REPLACE)
    logger.info(startup_line())
