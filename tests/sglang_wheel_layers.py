"""Run as a script by tests/test_sglang_wheel.py, in its own process: sglang 0.5.23's real modules (its wheel
installed without its dependencies, entered as tests/sglang_wheel.py enters them) with pydsa's plugin loaded by
sglang's own plugin loader, and sglang's compressor call site (CompressorBackendMixin.forward_core_compressor,
its forward_unified) driven on CPU tensors for an offline c128 layer (decode and extend), a c4 layer's main
compressor called on its own (outside a layer's forward: the per-compressor route; tests/test_plugin_layer.py
drives a c4 layer's forward, both compressors in one call) and an online c128 layer (sglang's rule:
SGLANG_OPT_USE_ONLINE_COMPRESS). sglang's kernel loaders are trapped: every call of one is recorded (and refused).
Prints one JSON line of findings: which pydsa ops ran (a standalone store, kv_store, would say a layer's compress
and store went apart instead of fused), which sglang kernels were asked for, and whether each
layer's ring or state and cache bytes are those of pydsa's own ops on the same inputs."""
import __future__
import ast
import functools
import json
import logging
import os
import pathlib
import sys
import types

import torch

from pydsa.bench.sglang_shim import enter, import_all

D = 512
KERNEL_LOADERS = ("_jit_compress_module", "_jit_compress_norm_rope_module", "_jit_compress_128_online_module",
                  "_jit_compress_plan_module")


def sglang_method(rel: str, cls: str, name: str, namespace: dict):
    """sglang's own method `cls.name`, compiled from its installed source file `rel` (a module that imports sglang's
    whole runtime, which these scripts stand in for) with the globals it reads."""
    path = pathlib.Path(sys.modules["sglang"].__path__[0]) / rel
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == name:
                    code = compile(ast.Module(body=[f], type_ignores=[]), str(path), "exec",
                                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
                    scope = {"TYPE_CHECKING": False, **namespace}
                    exec(code, scope)
                    return scope[name]
    raise LookupError(f"{cls}.{name} is not in sglang's {rel}")


def model_module(torch, envs):
    """The stand-in sglang.srt.models.deepseek_v4 (sglang's imports its whole runtime), the plugin's layer hook's
    target: MQALayer with sglang's own _forward_prepare (its CUDA, single-stream path: not HIP, not NPU, no context
    parallelism) and a forward that calls it as sglang's MQALayer.forward does."""
    prepare = sglang_method("srt/models/deepseek_v4.py", "MQALayer", "_forward_prepare", {
        "torch": torch, "envs": envs, "is_cp_active": lambda batch: False, "_is_hip": False, "_is_npu": False,
        "in_replay_tail_graph": lambda: False})

    class MQALayer:
        is_dsv41 = False
        _forward_prepare = prepare

        def forward(self, x, positions, forward_batch, x_quant=None, defer_all_reduce=False):
            return self._forward_prepare(x, positions, forward_batch, self.attn_backend, x_quant=x_quant)

    module = types.ModuleType("sglang.srt.models.deepseek_v4")
    module.MQALayer = MQALayer
    sys.modules[module.__name__] = module
    return module


class Site:
    """The backend's side of forward_unified: its pool, its metadata, the per-layer objects it reads."""

    @staticmethod
    def compressor(ratio, ape, weight, freqs, buffer, kv):
        norm = types.SimpleNamespace(weight=weight, variance_epsilon=1e-6)
        pool = types.SimpleNamespace(kv_score_buffer=types.SimpleNamespace(kv_score=buffer))
        return types.SimpleNamespace(ratio=ratio, head_dim=D, ape=ape, norm=norm, freqs_cis=freqs, is_in_indexer=False,
                                     rotate=False, compute_kv_score=lambda x, batch: kv,
                                     get_state_pool=lambda backend: pool)

    @staticmethod
    def kv_pool(cache, page_size, layout):
        return types.SimpleNamespace(uniform_fp8=False, layer_mapping={0: (None, None, object())},
                                     get_extra_key_buffer=lambda layer: cache,
                                     get_extra_key_page_size=lambda layer: page_size,
                                     get_extra_key_layout=lambda layer: layout)


def _counted(module, name, ran):
    fn = getattr(module, name)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        ran[name] = ran.get(name, 0) + 1
        return fn(*args, **kwargs)
    setattr(module, name, call)


def _trap(compress, asked):
    for name in KERNEL_LOADERS:
        def loader(*args, name=name, **kwargs):
            asked.append(name)
            raise RuntimeError(f"sglang's {name} was asked for")
        setattr(compress, name, loader)


def _layer(mixin, ratio, plan, out_loc, buffer, kv, cache, page_size, layout, seed):
    """One compressor call of a layer (sglang's forward_core_compressor, its name for forward_unified); its ring
    or state and cache after it."""
    g = torch.Generator().manual_seed(seed)
    ape = torch.randn(ratio * (2 if ratio == 4 else 1), D, generator=g) * 0.5
    weight = torch.rand(D, generator=g) + 0.5
    freqs = torch.polar(torch.ones(4096, 32), torch.rand(4096, 32, generator=g) * 6.3)

    class Backend(mixin):
        pass
    backend = Backend()
    backend.token_to_kv_pool = Site.kv_pool(cache, page_size, layout)
    backend.enable_deepseek_v4_fp4_indexer = False
    core = types.SimpleNamespace(**{f"c{ratio}_out_loc": out_loc})
    backend.forward_metadata = types.SimpleNamespace(**{f"c{ratio}_compress_metadata": plan, "core_metadata": core})
    batch = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_idle=lambda: False))
    backend.forward_core_compressor(torch.zeros(1), batch, 0, Site.compressor(ratio, ape, weight, freqs, buffer, kv))
    return ape, weight, freqs, backend


def main():
    import pydsa
    found, stand_ins = {}, enter()
    os.environ["SGLANG_PLUGINS"] = "pydsa"
    os.environ["PYDSA_SGLANG_OFFLINE"] = "1"  # sglang's offline c128 layers on pydsa (off by default)
    os.environ.pop("SGLANG_OPT_USE_ONLINE_COMPRESS", None)
    compress, v2, layout_mod = import_all(("sglang.kernels.ops.attention.dsv4.compress",
                                           "sglang.srt.layers.attention.dsv4.compressor_v2",
                                           "sglang.kernels.ops.attention.dsv4.kv_layout"), stand_ins)
    environ, _, _ = import_all(("sglang.srt.environ", "sglang.srt.plugins",
                                "sglang.srt.layers.attention.dsv4.unified_kv_gate"), stand_ins)
    model_module(torch, environ.envs)
    from sglang.srt.plugins import load_plugins
    from pydsa import sglang as ours
    from pydsa.sglang import c4 as ours_c4, compress as ours_v2, offline as ours_offline
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage()) if record.name.startswith("pydsa") else None
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)  # as sglang's configure_logger leaves it before it loads plugins
    load_plugins()
    found["startup_lines"] = lines
    ran, asked = {}, []
    for module, name in ((ours_offline, "c128_offline_decode"), (ours_offline, "c128_offline_extend"),
                         (ours_c4, "c4_decode"), (ours_v2, "c128_decode"), (ours_v2, "kv_store")):
        _counted(module, name, ran)
    _trap(compress, asked)
    mixin, v4 = v2.CompressorBackendMixin, layout_mod.KVLayout.V4
    found.update(_offline(compress, ours, pydsa, mixin, v4))
    found.update(_c4(compress, ours, pydsa, mixin, v4))
    os.environ["SGLANG_OPT_USE_ONLINE_COMPRESS"] = "1"
    found.update(_online(compress, ours, pydsa, mixin, v4))
    os.environ.pop("SGLANG_OPT_USE_ONLINE_COMPRESS")
    found["pydsa_ops"], found["sglang_kernels_before_hand_back"] = dict(ran), list(asked)
    found["handed_back_reached_sglang"] = _handed_back(compress, ours, mixin, v4, asked)
    os.environ["PYDSA_SGLANG_OFFLINE"] = "0"
    import pydsa.sglang.plugin as plugin
    plugin.serves_offline(refresh=True)  # as a server started with it off reads it at register()
    found["offline_switched_off_reached_sglang"] = _handed_back(compress, ours, mixin, v4, asked, bf16_store=False)
    found["stand_ins"] = sorted(stand_ins.names)
    print("FINDINGS " + json.dumps(found))


def _same(a, b, start) -> bool:
    return torch.equal(a, b) and not torch.equal(a, start)


def _offline(compress, ours, pydsa, mixin, v4):
    """An offline c128 layer's decode, then an extend: sglang's plan objects holding sglang's records (pydsa's
    planner writes them: sglang's own planner is a GPU kernel)."""
    g = torch.Generator().manual_seed(1)
    r2t, f2s = torch.zeros(4, 8, dtype=torch.int32), torch.zeros(16, dtype=torch.int64)
    rid, seq = torch.tensor([2, 0, 1]), torch.tensor([128, 300, 256])
    ring = torch.randn(5 * 128, 2 * D, generator=g)
    cache = torch.full((8, pydsa.kv_page_bytes(D, 2)), 0xA5, dtype=torch.uint8)
    plan = compress.CompressorDecodePlan(128, ours.CompressorDecodePlan.generate(128, rid, r2t, f2s, seq, 256,
                                                                                 128).plan_d)
    kv, loc = torch.randn(3, 2 * D, generator=g), torch.tensor([5, 1, 2])
    start, mine, own = (ring.clone(), cache.clone()), ring.clone(), cache.clone()
    ape, w, freqs, _ = _layer(mixin, 128, plan, loc, ring, kv, cache, 2, v4, 10)
    store = pydsa.KVCache(own, w, freqs, page_size=2, eps=1e-6)
    pydsa.c128_offline_decode(pydsa.C128Ring(mine, ape, store=store), kv, records=plan.plan_d, cache_slots=loc)
    res = {"offline_decode_equal": _same(ring, mine, start[0]) and _same(cache, own, start[1])}
    ext, pseq = torch.tensor([100, 300, 5]), torch.tensor([228, 300, 261])
    prefill = ours.CompressorPrefillPlan.generate(128, rid, pseq, ext, r2t, f2s, 256, 128, 405)
    plan = compress.CompressorPrefillPlan(128, prefill.plan_c, prefill.plan_w, None)
    kv, loc = torch.randn(405, 2 * D, generator=g), torch.randperm(405) % 16
    start = (ring.clone(), cache.clone())
    _layer(mixin, 128, plan, loc, ring, kv, cache, 2, v4, 10)
    pydsa.c128_offline_extend(pydsa.C128Ring(mine, ape, store=store), kv, (plan.plan_c, plan.plan_w), cache_slots=loc)
    res["offline_extend_equal"] = _same(ring, mine, start[0]) and _same(cache, own, start[1])
    return res


def _c4(compress, ours, pydsa, mixin, v4):
    g = torch.Generator().manual_seed(2)
    per = 256
    r2t, f2s = torch.arange(2 * per, dtype=torch.int32).reshape(2, per), torch.arange(3 * per, dtype=torch.int64)
    rid, seq = torch.arange(2), torch.tensor([8, 13])
    plan = compress.CompressorDecodePlan(4, ours.CompressorDecodePlan.generate(4, rid, r2t, f2s, seq, per, 8).plan_d)
    ring = torch.randn(3 * 8, 4 * D, generator=g)
    cache = torch.full((4, pydsa.kv_page_bytes(D, 64)), 0xA5, dtype=torch.uint8)
    kv, loc = torch.randn(2, 4 * D, generator=g), torch.tensor([1, 3])
    start, mine, own = (ring.clone(), cache.clone()), ring.clone(), cache.clone()
    ape, w, freqs, _ = _layer(mixin, 4, plan, loc, ring, kv, cache, 64, v4, 11)
    store = pydsa.KVCache(own, w, freqs, page_size=64, eps=1e-6)
    pydsa.c4_decode(pydsa.C4Compressor(mine, ape, store=store), kv, records=plan.plan_d, cache_slots=loc)
    return {"c4_decode_equal": _same(ring, mine, start[0]) and _same(cache, own, start[1])}


def _online(compress, ours, pydsa, mixin, v4):
    """An online c128 layer: its plan from sglang's generate_online (the plugin's planner hook)."""
    g = torch.Generator().manual_seed(3)
    rid, seq = torch.tensor([2, 0, 1]), torch.tensor([128, 300, 1024])
    plan = compress.CompressorDecodePlan.generate_online(seq, rid, torch.zeros(4, 8, dtype=torch.int32))
    state = torch.randn(6, 3 * D, generator=g) * 0.1
    cache = torch.full((8, pydsa.kv_page_bytes(D, 2)), 0xA5, dtype=torch.uint8)
    kv, loc = torch.randn(3, 2 * D, generator=g), torch.tensor([5, 1, 2])
    start, mine, own = (state.clone(), cache.clone()), state.clone(), cache.clone()
    ape, w, freqs, _ = _layer(mixin, 128, plan, loc, state, kv, cache, 2, v4, 12)
    store = pydsa.KVCache(own, w, freqs, page_size=2, eps=1e-6)
    pydsa.c128_decode(mine.view(-1, 1, 3 * D), kv, None, ape, rid.to(torch.int32), seq.to(torch.int32), store=store,
                      cache_slots=loc)
    return {"online_plan_is_pydsas": isinstance(plan, ours.CompressorDecodePlan) and plan.online is True,
            "online_decode_equal": _same(state, mine, start[0]) and _same(cache, own, start[1])}


def _handed_back(compress, ours, mixin, v4, asked, bf16_store=True) -> bool:
    """An offline c128 layer with a configuration that is not pydsa's (a bf16 store) runs sglang's own path: its
    store kernel's loader is asked for (pydsa's compress_forward serves its first call, as it serves any offline
    c128 compress_forward). With PYDSA_SGLANG_OFFLINE=0 (bf16_store False) the whole layer is sglang's: its
    compress kernel's loader is the first asked for."""
    before = len(asked)
    plan = compress.CompressorDecodePlan(128, ours.CompressorDecodePlan.generate(
        128, torch.tensor([0]), torch.zeros(1, 8, dtype=torch.int32), torch.zeros(4, dtype=torch.int64),
        torch.tensor([128]), 256, 128).plan_d)

    class Backend(mixin):
        def _get_paged_compress_metadata(self, ratio):
            return plan
    norm = types.SimpleNamespace(weight=torch.ones(D), variance_epsilon=1e-6)
    try:
        Backend()._forward_compress_all_in_one(
            kv_score_buffer=torch.randn(2 * 128, 2 * D), kv_score_input=torch.randn(1, 2 * D), ape=torch.randn(128, D),
            head_dim=D, norm=norm, freqs_cis_cache=torch.polar(torch.ones(256, 32), torch.ones(256, 32)),
            kv_cache=torch.zeros(2, 1728, dtype=torch.uint8), is_indexer=False, rotate=False, compress_ratio=128,
            page_size=2, out_loc=torch.zeros(1, dtype=torch.int64), bf16_store=bf16_store)
    except RuntimeError as exc:
        want = "_jit_compress_norm_rope_module" if bf16_store else "_jit_compress_module"
        return want in str(exc) and asked[before:] == [want]
    return False


if __name__ == "__main__":
    main()
