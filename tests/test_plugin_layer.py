"""A c4 layer's two compressors as one pydsa call, through sglang 0.5.23's own plugin loader and call sites (its
wheel installed without its dependencies, entered as tests/sglang_wheel.py enters it; run as a script in a process
of its own, which prints one JSON line of findings).

sglang's code that makes the two calls runs as it is: `MQALayer._forward_prepare` (the layer: the indexer, then
the main compressor's `forward_core_compressor`) and `C4IndexerBackendMixin._forward_prepare_normal` (the indexer:
its compressor's `forward_indexer_compressor`), compiled from sglang's installed source, since their modules
(sglang.srt.models.deepseek_v4, sglang.srt.layers.attention.dsv4.indexer) import its whole runtime; `MQALayer` is
a stand-in class holding sglang's `_forward_prepare` and a `forward` that calls it as sglang's does, in a stand-in
sglang.srt.models.deepseek_v4 module, so that the plugin's hook of `MQALayer.forward` is applied by sglang's loader.
Everything else is sglang's: the loader, the hook registry, compressor_v2's `forward_unified`, compress.py (its
kernel loaders trapped). The layer's GEMMs, q and SWA cache are stand-ins (the compressors' kv_score a fixed
projection of x); the indexer's top-k is a read of its cache, recorded."""
import functools
import importlib.metadata
import json
import os
import subprocess
import sys
import types

import pytest

from sglang_wheel_layers import model_module, sglang_method

ROUNDS = ("extend", "decode", "decode")  # a prefill, then two decode steps


class Indexer:
    """The layer's C4Indexer: sglang's backend code makes its compressor's call; then its top-k reads its cache."""

    def __init__(self, layer_id, compressor, cache):
        self.layer_id, self.compressor, self.cache, self.reads = layer_id, compressor, cache, []

    def compute_weights(self, x, skip_scale=False):
        return None

    def compute_q(self, q_lora, positions, weights, q_lora_quant=None):
        return None, None

    def __call__(self, x, q_lora, forward_batch, attn_backend, q_lora_quant=None, **kwargs):
        attn_backend._forward_prepare_normal(x=x, q_lora=q_lora, c4_indexer=self, positions=None,
                                             forward_batch=forward_batch, q_lora_quant=q_lora_quant)
        self.reads.append(self.cache.clone())


def _compressor(torch, gen, layer_id, d, hidden, rows, counts, name):
    """One sglang Compressor as forward_unified reads it; kv_score a fixed projection of x, counted."""
    w = torch.randn(hidden, 4 * d, generator=gen) * 0.3
    buffer = torch.randn(rows, 4 * d, generator=gen)
    pool = types.SimpleNamespace(kv_score_buffer=types.SimpleNamespace(kv_score=buffer))

    def kv_score(x, batch):
        counts[name] = counts.get(name, 0) + 1
        return x @ w
    return types.SimpleNamespace(
        layer_id=layer_id, ratio=4, head_dim=d, ape=torch.randn(4, 2 * d, generator=gen) * 0.5,
        norm=types.SimpleNamespace(weight=torch.rand(d, generator=gen) + 0.5, variance_epsilon=1e-6),
        freqs_cis=torch.polar(torch.ones(4096, 32), torch.rand(4096, 32, generator=gen) * 6.3), is_in_indexer=d == 128,
        rotate=d == 128, compute_kv_score=kv_score, get_state_pool=lambda backend: pool, buffer=buffer)


def _layers(torch, model, v2, v4, pydsa, count, seed, hisparse=False, layer_class=None):
    """`count` c4 layers of one model, with the backend (sglang's CompressorBackendMixin) they share."""
    prepare_normal = sglang_method("srt/layers/attention/dsv4/indexer.py", "C4IndexerBackendMixin",
                                    "_forward_prepare_normal", {})
    gen = torch.Generator().manual_seed(seed)
    caches, layers, counts = {}, [], {}

    class Backend(v2.CompressorBackendMixin):
        _forward_prepare_normal = prepare_normal
    backend = Backend()
    main_pool = types.SimpleNamespace()
    if hisparse:  # a hisparse pool translates the main compressor's slots (here: to the same values, a new tensor)
        main_pool.translate_loc_to_hisparse_device = True
        main_pool._translate_loc_to_hisparse_device = lambda loc: loc.clone()
    backend.token_to_kv_pool = types.SimpleNamespace(
        uniform_fp8=False, layer_mapping={i: (None, None, main_pool) for i in range(count)},
        get_index_k_page_size=lambda ratio: 64, get_index_k_with_scale_buffer=lambda i: caches[i, 1],
        get_extra_key_buffer=lambda i: caches[i, 0], get_extra_key_page_size=lambda i: 64,
        get_extra_key_layout=lambda i: v4)
    backend.enable_deepseek_v4_fp4_indexer = False
    for i in range(count):
        caches[i, 0] = torch.full((6, pydsa.kv_page_bytes(512, 64)), 0xA5, dtype=torch.uint8)
        caches[i, 1] = torch.full((6, pydsa.indexer_page_bytes(128, 64)), 0xA5, dtype=torch.uint8)
        layer = (layer_class or model.MQALayer)()
        main = _compressor(torch, gen, i, 512, 16, 40, counts, f"{i} main")
        indexer = Indexer(i, _compressor(torch, gen, i, 128, 16, 40, counts, f"{i} indexer"), caches[i, 1])
        layer.__dict__.update(
            layer_id=i, compress_ratio=4, compressor=main, indexer=indexer, attn_backend=backend, fuse_wqa_wkv=False,
            use_fused_qk_norm_rope=False, wq_a=lambda x: (x[:, :8], None), _normalize_q_lora=lambda q: (q, q),
            _compute_q_b=lambda q, positions, q_out: q, _compute_kv_to_cache=lambda *a, **k: None)
        layers.append(layer)
    return backend, layers, caches, counts


def _steps(torch, compress, ours):
    """Three rounds of 4 requests (ring 8 rows per 256-token SWA page): an extend, then two decodes; (plan,
    out_loc, x rows) per round, sglang's plan types holding sglang's records (pydsa's planner writes them: sglang's
    own planner is a GPU kernel)."""
    per, gen = 256, torch.Generator().manual_seed(9)
    r2t, f2s = torch.arange(4 * per, dtype=torch.int32).reshape(4, per), torch.arange(5 * per, dtype=torch.int64)
    rid, ext = torch.arange(4), torch.tensor([13, 4, 30, 9])
    seq = ext + torch.tensor([0, 7, 2, 250])
    n = int(ext.sum())
    p = ours.CompressorPrefillPlan.generate(4, rid, seq, ext, r2t, f2s, per, 8, n)
    rounds = [(compress.CompressorPrefillPlan(4, p.plan_c, p.plan_w, None), torch.randperm(n, generator=gen) % 24, n)]
    for _ in ROUNDS[1:]:
        seq = seq + 1
        plan = ours.CompressorDecodePlan.generate(4, rid, r2t, f2s, seq, per, 8).plan_d
        rounds.append((compress.CompressorDecodePlan(4, plan), torch.randperm(24, generator=gen)[:4], 4))
    return rounds


def _batch(kind):
    mode = types.SimpleNamespace(is_idle=lambda: False, is_decode_or_idle=lambda: kind == "decode",
                                 is_target_verify=lambda: False)
    return types.SimpleNamespace(forward_mode=mode, attn_cp_metadata=None)


def _drive(torch, v2, built, rounds, per_compressor, ops, counts_by_round):
    """Every round over every layer: sglang's layer forward (one call for both), or (per_compressor) sglang's
    forward_unified per compressor in the layer's order, the plugin's per-compressor route."""
    backend, layers, _, counts = built
    gen = torch.Generator().manual_seed(4)
    for kind, (plan, loc, n) in zip(ROUNDS, rounds):
        backend.forward_metadata = types.SimpleNamespace(c4_compress_metadata=plan,
                                                         core_metadata=types.SimpleNamespace(c4_out_loc=loc))
        batch = _batch(kind)
        for layer in layers:
            x = torch.randn(n, 16, generator=gen)
            before, seen = dict(ops), dict(counts)
            if per_compressor:
                v2.CompressorBackendMixin.forward_unified(backend, x, batch, layer.layer_id, layer.indexer.compressor)
                layer.indexer.reads.append(layer.indexer.cache.clone())
                v2.CompressorBackendMixin.forward_unified(backend, x, batch, layer.layer_id, layer.compressor)
            else:
                layer.forward(x, None, batch)
            counts_by_round.append({"ops": {k: v - before.get(k, 0) for k, v in ops.items() if v != before.get(k, 0)},
                                    "kv_score": {k.split()[1]: v - seen.get(k, 0) for k, v in counts.items()
                                                 if v != seen.get(k, 0)}})


def _state(built):
    _, layers, caches, _ = built
    return [t for layer in layers for t in (layer.compressor.buffer, layer.indexer.compressor.buffer)] + \
        list(caches.values()) + [r for layer in layers for r in layer.indexer.reads]


def main():
    import torch
    import pydsa
    from pydsa.bench.sglang_shim import enter, import_all
    found, stand_ins = {}, enter()
    os.environ["SGLANG_PLUGINS"] = "pydsa"
    os.environ.pop("SGLANG_OPT_USE_ONLINE_COMPRESS", None)
    compress, v2, layout, environ = import_all(("sglang.kernels.ops.attention.dsv4.compress",
                                                "sglang.srt.layers.attention.dsv4.compressor_v2",
                                                "sglang.kernels.ops.attention.dsv4.kv_layout", "sglang.srt.environ"),
                                               stand_ins)
    import_all(("sglang.srt.plugins", "sglang.srt.layers.attention.dsv4.unified_kv_gate"), stand_ins)
    model = model_module(torch, environ.envs)
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    from pydsa import sglang as ours
    from pydsa.sglang import c4 as ours_c4, compress as ours_v2, plugin
    load_plugins()
    found["layer_hook_applied"] = plugin._LAYER in HookRegistry._patched and all(
        f"{plugin._BACKEND}.{name}" in HookRegistry._patched
        for name in ("forward_core_compressor", "forward_indexer_compressor"))
    ops, asked, promises = {}, [], []
    for module, name in ((ours_c4, "c4_decode"), (ours_c4, "c4_extend"), (ours_v2, "kv_store")):
        fn = getattr(module, name)

        def counted(*args, _fn=fn, _name=name, **kwargs):
            ops[_name] = ops.get(_name, 0) + 1
            if _name == "c4_decode":
                promises.append(kwargs.get("records_ahead", False))
            return _fn(*args, **kwargs)
        setattr(module, name, functools.wraps(fn)(counted))
    for name in ("_jit_compress_module", "_jit_compress_norm_rope_module", "_jit_compress_plan_module"):
        def loader(*args, _name=name, **kwargs):
            asked.append(_name)
            raise RuntimeError(f"sglang's {_name} was asked for")
        setattr(compress, name, loader)
    v4, rounds = layout.KVLayout.V4, _steps(torch, compress, ours)

    def run(per_compressor, **kw):
        built = _layers(torch, model, v2, v4, pydsa, 2, 3, **kw)
        start = [t.clone() for t in _state(built)[:8]]
        record = []
        promises.clear()
        _drive(torch, v2, built, rounds, per_compressor, ops, record)
        found[("per_compressor" if per_compressor else "hisparse" if kw else "layer") + "_promises"] = list(promises)
        return _state(built), start, record

    layer, start, found["layer_rounds"] = run(False)
    apart, _, found["per_compressor_rounds"] = run(True)
    found["equal_to_per_compressor"] = len(layer) == len(apart) and all(torch.equal(a, b) for a, b in zip(layer, apart))
    found["everything_written"] = all(not torch.equal(a, b) for a, b in zip(layer[:8], start))
    found["indexer_read_after_its_store"] = all(not bool((r == 0xA5).all()) for r in layer[8:])
    hisparse, _, found["hisparse_rounds"] = run(False, hisparse=True)
    found["hisparse_equal"] = len(hisparse) == len(apart) and all(torch.equal(a, b) for a, b in zip(hisparse, apart))
    found["sglang_kernels"] = list(asked)

    class Odd(model.MQALayer):  # a prepare whose main compressor's call carries another x than the layer's
        def _forward_prepare(self, x, positions, forward_batch, attn_backend, **kwargs):
            self.indexer(x=x, q_lora=x, forward_batch=forward_batch, attn_backend=attn_backend)
            attn_backend.forward_core_compressor(x.clone(), forward_batch, self.layer_id, self.compressor)
    odd = _layers(torch, model, v2, v4, pydsa, 1, 5, layer_class=Odd)
    plan, loc, n = rounds[1]
    odd[0].forward_metadata = types.SimpleNamespace(c4_compress_metadata=plan,
                                                    core_metadata=types.SimpleNamespace(c4_out_loc=loc))
    try:
        odd[1][0].forward(torch.randn(n, 16), None, _batch("decode"))
        found["other_x_refused"] = ""
    except RuntimeError as exc:
        found["other_x_refused"] = str(exc)

    class Lone(model.MQALayer):  # a prepare that never makes the main compressor's own call
        def _forward_prepare(self, x, positions, forward_batch, attn_backend, **kwargs):
            self.indexer(x=x, q_lora=x, forward_batch=forward_batch, attn_backend=attn_backend)

    class Broken(model.MQALayer):  # a prepare that raises between the two calls
        def _forward_prepare(self, x, positions, forward_batch, attn_backend, **kwargs):
            self.indexer(x=x, q_lora=x, forward_batch=forward_batch, attn_backend=attn_backend)
            raise ValueError("the layer's own failure")
    for name, cls in (("lone", Lone), ("broken", Broken)):
        built = _layers(torch, model, v2, v4, pydsa, 1, 6, layer_class=cls)
        built[0].forward_metadata = types.SimpleNamespace(c4_compress_metadata=plan,
                                                          core_metadata=types.SimpleNamespace(c4_out_loc=loc))
        try:
            built[1][0].forward(torch.randn(n, 16), None, _batch("decode"))
            found[f"{name}_raised"] = ""
        except (RuntimeError, ValueError) as exc:
            found[f"{name}_raised"] = f"{type(exc).__name__}: {exc}"
        found[f"{name}_state_left"] = getattr(plugin._running, "step", None) is not None or \
            getattr(plugin._running, "held", None) is not None

    class Cut(model.MQALayer):  # the indexer given x cut to its queries (a new tensor), as sglang's indexer may cut it
        def _forward_prepare(self, x, positions, forward_batch, attn_backend, **kwargs):
            self.indexer(x=x[:x.shape[0]], q_lora=x, forward_batch=forward_batch, attn_backend=attn_backend)
            attn_backend.forward_core_compressor(x, forward_batch, self.layer_id, self.compressor)
    cut = _layers(torch, model, v2, v4, pydsa, 1, 8, layer_class=Cut)
    cut[0].forward_metadata = types.SimpleNamespace(c4_compress_metadata=plan,
                                                    core_metadata=types.SimpleNamespace(c4_out_loc=loc))
    before, seen = dict(ops), dict(cut[3])
    cut[1][0].forward(torch.randn(n, 16), None, _batch("decode"))
    found["cut_ops"] = {k: v - before.get(k, 0) for k, v in ops.items() if v != before.get(k, 0)}
    found["cut_kv_score"] = {k.split()[1]: v - seen.get(k, 0) for k, v in cut[3].items() if v != seen.get(k, 0)}
    # after both, a plain layer's step is still one call for both compressors
    before = dict(ops)
    again = _layers(torch, model, v2, v4, pydsa, 1, 7)
    again[0].forward_metadata = types.SimpleNamespace(c4_compress_metadata=plan,
                                                      core_metadata=types.SimpleNamespace(c4_out_loc=loc))
    again[1][0].forward(torch.randn(n, 16), None, _batch("decode"))
    found["after_failures_ops"] = {k: v - before.get(k, 0) for k, v in ops.items() if v != before.get(k, 0)}
    found["stand_ins"] = sorted(stand_ins.names)
    print("FINDINGS " + json.dumps(found))


def _sglang_version():
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    if _sglang_version() != "0.5.23":
        pytest.skip("sglang 0.5.23's wheel is not installed")
    r = subprocess.run([sys.executable, __file__], cwd=tmp_path_factory.mktemp("layer"), capture_output=True,
                       text=True, timeout=300)
    lines = [line for line in r.stdout.splitlines() if line.startswith("FINDINGS ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(lines[-1][len("FINDINGS "):])


def test_one_pydsa_call_per_c4_layer_per_step_through_sglangs_loader_and_call_sites(found):
    """sglang's loader applies the layer hook; over an extend and two decode steps of two c4 layers, each layer's
    step is one pydsa call (decode: one c4_decode launch for both compressors; extend: one c4_extend call), no
    standalone store, each compressor's kv_score computed once (the second call is a no-op), no sglang kernel
    asked for."""
    assert found["layer_hook_applied"]
    assert [r["ops"] for r in found["layer_rounds"]] == [{"c4_extend": 1}] * 2 + [{"c4_decode": 1}] * 4
    assert all(r["kv_score"] == {"main": 1, "indexer": 1} for r in found["layer_rounds"])
    assert [r["ops"] for r in found["per_compressor_rounds"]] == [{"c4_extend": 2}] * 2 + [{"c4_decode": 2}] * 4
    assert found["sglang_kernels"] == []
    assert not any(name.startswith(("sglang", "torch", "pydsa")) for name in found["stand_ins"])


def test_the_layers_one_call_leaves_the_per_compressor_routes_bytes(found):
    """From poisoned caches and random rings and inputs: both rings and both caches of every layer, bit for bit the
    per-compressor route's (sglang's forward_unified per compressor, in the layer's order), every one written; and
    the indexer's top-k read its cache after its store, as it reads it on the per-compressor route."""
    assert found["equal_to_per_compressor"] and found["everything_written"]
    assert found["indexer_read_after_its_store"]


def test_a_hisparse_layer_runs_per_compressor_and_is_remembered(found):
    """The main compressor's slots translated (hisparse): the two calls stay apart, each at its own time (the first
    step computes the main's kv_score twice finding so, later steps once), with the per-compressor route's bytes."""
    rounds = found["hisparse_rounds"]
    assert [r["ops"] for r in rounds] == [{"c4_extend": 2}] * 2 + [{"c4_decode": 2}] * 4
    assert all(r["kv_score"] == {"main": 2, "indexer": 1} for r in rounds[:2])
    assert all(r["kv_score"] == {"main": 1, "indexer": 1} for r in rounds[2:])
    assert found["hisparse_equal"]


def test_the_plugin_promises_records_ahead_only_for_the_steps_own_slots(found):
    """pydsa's c4 decode reads sglang's plan and slots before waiting for the launch ahead (records_ahead) only where
    out_loc is the step's own c4_out_loc (made with the plan at the step's start): on the layer route and on the
    per-compressor route, but not for a hisparse pool's main compressor, whose slots sglang translates (a gather
    launched just before the call); its indexer, on the step's slots, still reads ahead."""
    assert found["layer_promises"] == [True] * 4
    assert found["per_compressor_promises"] == [True] * 8
    assert found["hisparse_promises"] == [True, False] * 4


def test_a_layer_that_never_makes_its_second_call_or_fails_between_them_leaves_nothing_behind(found):
    """A layer forward that never makes the main compressor's own call raises, naming the layer and the compressor
    that ran ahead; one that raises between the two calls passes its own error through; neither leaves the
    plugin's per-thread step or held calls set, and the next layer's step is one pydsa call again."""
    assert found["lone_raised"].startswith("RuntimeError: layer 0's main compressor ran with the indexer")
    assert "made no call of its own" in found["lone_raised"]
    assert found["broken_raised"] == "ValueError: the layer's own failure"
    assert not found["lone_state_left"] and not found["broken_state_left"]
    assert found["after_failures_ops"] == {"c4_decode": 1}


def test_an_indexer_given_a_cut_x_runs_per_compressor_each_input_computed_once(found):
    """When the indexer's call carries another x than the layer's (sglang cuts it to its queries), the two
    compressors run apart, each at its own call, and neither's input GEMM runs twice."""
    assert found["cut_ops"] == {"c4_decode": 2}
    assert found["cut_kv_score"] == {"main": 1, "indexer": 1}


def test_a_second_call_with_another_x_is_refused_by_name(found):
    assert "layer 0's main compressor already ran" in found["other_x_refused"]
    assert "another x" in found["other_x_refused"]


if __name__ == "__main__":
    main()
