"""The plugin's c4 path call by call (P35): one c4 layer's decode, B = 1 / 32 / 256 / 1024, fp32, sglang's plan read
by both sides: the plugin's route (its layer hook: the two compressors' `_forward_compress_all_in_one` keywords, as
sglang's forward_unified resolves them, as one `plugin.c4_layer_call`, 1 launch) and its per-compressor route (its
hook of `_forward_compress_all_in_one` per compressor, 2 launches: a layer the layer hook cannot join) against
sglang's four; each pydsa.sglang call against the sglang call it replaces
(compress_forward and compress_norm_rope_store per compressor, CompressorDecodePlan.generate(4, ...)). The plugin's
routes make the records_ahead promise as its hooks do (out_loc is the step's own); the drop-in calls run as sglang
calls them, without it. Each case is
checked once from the same start on both sides before it is timed (pydsa/bench/v4_step.py's checks). Run with the
V4 step: python -m pydsa.bench.release OUT.json --reference-build DIR --only v4-step
"""
from __future__ import annotations

import json
from functools import partial
from types import SimpleNamespace

import torch

from ..sglang import CompressorDecodePlan, compress_forward, compress_norm_rope_store, plugin
from .c4 import DIMS, SWA_PAGE, sglang_layer
from .harness import median_graph_us
from .v4_step import (C4_PAGE, EPS, RING, C4Layer, Geometry, _release, c4_cache_diff, cache_diff, same_start,
                      step_lengths, within_tolerance)


class _Backend:
    """What the plugin's hooks read of sglang's attention backend: the step's plan and slots of a compress ratio."""

    def __init__(self, plan, out_loc):
        self.plan, self.out_loc = plan, out_loc

    def _get_paged_compress_metadata(self, compress_ratio):
        return self.plan

    def _get_out_loc(self, compress_ratio):
        return self.out_loc


def _sglang_own(*args, **kwargs):
    raise AssertionError("the plugin passed a c4 compressor to sglang's own code")


def compressor_keywords(layer, out_loc):
    """The keywords sglang's forward_unified gives _forward_compress_all_in_one for the layer's main and indexer
    compressors (the ape as its [4, 2D] parameter; one out_loc, sglang's c4_out_loc)."""
    return [dict(kv_score_buffer=layer.rings[k], kv_score_input=layer.kv[k], ape=layer.apes[k].view(4, 2 * d),
                 head_dim=d, norm=SimpleNamespace(weight=layer.weights[k], variance_epsilon=EPS),
                 freqs_cis_cache=layer.freqs_cis, kv_cache=layer.caches[k], is_indexer=k == 1, rotate=k == 1,
                 compress_ratio=4, page_size=C4_PAGE, out_loc=out_loc) for k, d in enumerate(DIMS)]


def plugin_calls(layer, plan, out_loc):
    """The plugin's route of one c4 layer's step: what its layer hook runs at the first compressor's call, one
    c4_layer call for both compressors (the second call is a no-op)."""
    main, indexer = compressor_keywords(layer, out_loc)
    ahead = plugin.step_slots(_Backend(plan, out_loc), 4, main["out_loc"])  # as the hook decides: the step's slots
    return [partial(plugin.c4_layer_call, plan, main, indexer, records_ahead=ahead)]


def per_compressor_calls(layer, plan, out_loc):
    """The plugin's per-compressor route of one c4 layer (a layer its hook cannot join): its hook of sglang's
    _forward_compress_all_in_one, once per compressor."""
    backend = _Backend(plan, out_loc)
    return [partial(plugin._compress_all_in_one, _sglang_own, backend, **kw)
            for kw in compressor_keywords(layer, out_loc)]


def _compress_check(ring, theirs, mine, k, rows):
    """A compress call from the same start on both sides: its ring and the closing rows' vectors, bit for bit."""
    (ring_t, out_t), (ring_m, out_m) = same_start([ring], theirs, mine)
    bits = torch.int16 if ring.dtype == torch.bfloat16 else torch.int32
    t, m = out_t[rows], out_m[rows]
    rel = float(((m - t).norm(dim=1) / t.norm(dim=1).clamp_min(1e-30)).max()) if t.shape[0] else 0.0
    same = (t.view(torch.int32) == m.view(torch.int32)).all(1)
    return {f"ring_{DIMS[k]}_bit_equal": bool(torch.equal(ring_t[0].view(bits), ring_m[0].view(bits))),
            "out_rows": int(t.shape[0]), "out_rows_bit_equal": int(same.sum()), "out_max_rel": rel}


def _store_check(cache, theirs, mine, layout):
    """A store call from the same start on both sides: how the caches differ."""
    (t, _), (m, _) = same_start([cache], theirs, mine)
    return cache_diff(m[0], t[0], layout)


def _plan_check(theirs, mine):
    return {"plan_bytes_equal": bool(torch.equal(theirs().plan_d, mine().plan_d))}


def _layer_check(caches, theirs, mine):
    return c4_cache_diff(same_start(caches, theirs, lambda: [call() for call in mine]))


def path_cases(ref, layer, geo, plan):
    """{(path, compressor): (sglang's calls, pydsa's calls, check)} of one c4 layer's decode over sglang's plan;
    check() runs both sides from the same start and says what differs."""
    theirs_layer = partial(sglang_layer, ref, layer, layer.kv, plan, geo.out_loc)
    cases = {}
    for path, calls in (("plugin", plugin_calls), ("per-compressor", per_compressor_calls)):
        mine = calls(layer, plan, geo.out_loc)
        cases[(path, None)] = ([theirs_layer], mine, partial(_layer_check, layer.caches, theirs_layer, mine))
    closing = geo.seq64 % 4 == 0
    for k, d in enumerate(DIMS):
        ring, kv, ape, w, cache = layer.rings[k], layer.kv[k], layer.apes[k], layer.weights[k], layer.caches[k]
        sg_c = partial(ref.compress_forward_c4, ring, kv, ape, plan, d)
        my_c = partial(compress_forward, ring.view(-1, 4, 4 * d), kv, ape, plan, head_dim=d, compress_ratio=4,
                       is_online=False)
        vec = sg_c()  # the store's input: this step's vectors (closing rows)
        sg_s = partial(ref.store, vec, plan, w, EPS, layer.freqs_cis, geo.out_loc, cache, C4_PAGE)
        my_s = partial(compress_norm_rope_store, vec, plan, norm_weight=w, norm_eps=EPS, freq_cis=layer.freqs_cis,
                       out_loc=geo.out_loc, kvcache=cache, page_size=C4_PAGE)
        name, layout = ("main", "v4") if k == 0 else ("indexer", "indexer")
        cases[("compress", name)] = ([sg_c], [my_c], partial(_compress_check, ring, sg_c, my_c, k, closing))
        cases[("store", name)] = ([sg_s], [my_s], partial(_store_check, cache, sg_s, my_s, layout))
    sg_p = partial(ref.plan_decode_c4, geo.rpi, geo.r2t, geo.f2s, geo.seq64, RING)
    my_p = partial(CompressorDecodePlan.generate, 4, geo.rpi, geo.r2t, geo.f2s, geo.seq64, SWA_PAGE, RING)
    cases[("plan", None)] = ([sg_p], [my_p], partial(_plan_check, sg_p, my_p))
    return cases


def path_target(path, b):
    return (1.6 if b <= 256 else 1.3) if path in ("plugin", "per-compressor") else 1.1


def path_group(ref, b, closing, rounds, device):
    """The P35 rows of one B and lengths (fp32 ring): every path's check, then all timed, interleaved."""
    geo = Geometry(step_lengths(b, closing, 35 * b + closing, device, ratio=4))
    layer = C4Layer(geo, torch.float32, torch.Generator(device=device).manual_seed(5 * b + closing))
    plan = ref.plan_decode_c4(geo.rpi, geo.r2t, geo.f2s, geo.seq64, RING)
    cases = path_cases(ref, layer, geo, plan)
    checks = {key: check() for key, (_, _, check) in cases.items()}
    timed = {}
    for (path, comp), (theirs, mine, _) in cases.items():
        timed[f"{path} {comp} sglang"], timed[f"{path} {comp} pydsa"] = theirs, mine
    t = median_graph_us(timed, rounds)
    rows = []
    for (path, comp) in cases:
        sg, ours = t[f"{path} {comp} sglang"], t[f"{path} {comp} pydsa"]
        row = {"key": "P35 path speedup", "path": path, "b": b, "lengths": "closing" if closing else "random",
               "state": "fp32"}
        if comp is not None:
            row["compressor"] = comp
        target = path_target(path, b)
        row.update(sglang_us=sg, pydsa_us=ours, speedup=sg / ours, target=target, met=sg / ours >= target,
                   check=checks[(path, comp)], check_within_tolerance=within_tolerance(checks[(path, comp)]))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def path_rows(ref, rounds, device="cuda", bs=(1, 32, 256, 1024)):
    rows = []
    for b in bs:
        for closing in (False, True):
            rows += path_group(ref, b, closing, rounds, device)
            _release(device)
    return rows
