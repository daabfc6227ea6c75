"""Run as a script by tests/test_sglang_wheel.py, in its own process: sglang 0.5.23's real modules (its
wheel installed without its dependencies) with pydsa's plugin loaded by sglang's own plugin loader, and
sglang's own compress.py calls made on CPU tensors. Prints one JSON line of findings.

sglang's package __init__ imports its whole runtime, so the package is entered without it, and the
third-party modules its imported modules name but that are not installed (triton, zmq, ...) are stood
in for by permissive stand-ins: what is checked is sglang's code that pydsa's hooks touch."""
import importlib
import json
import os
import sys

from pydsa.bench.sglang_shim import enter, import_all
from sglang_wheel_layers import model_module


def main():
    found = {}
    stand_ins = enter()
    os.environ["SGLANG_PLUGINS"] = "pydsa"

    import torch
    import_all(("sglang.srt.plugins", "sglang.kernels.ops.attention.dsv4.compress",
                "sglang.kernels.ops.attention.dsv4.online_c128_mtp", "sglang.kernels.ops.attention.dsa.fused_metadata_copy",
                "sglang.srt.layers.attention.dsv4.compressor_v2"), stand_ins)
    model_module(torch, import_all(("sglang.srt.environ",), stand_ins)[0].envs)  # the layer hook's target
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    import pydsa
    from pydsa import sglang as ours
    from pydsa.sglang import plugin as sglang_plugin

    load_plugins()  # sglang's loader: finds pydsa's entry point, runs register(), applies the hooks
    found["registered"] = sorted(t for t in HookRegistry._hooks if any(
        getattr(h, "__module__", "").startswith("pydsa") for _, h, _ in HookRegistry._hooks[t]))
    found["patched"] = sorted(HookRegistry._patched)
    found["ours"] = sorted(t for t, _, _ in sglang_plugin.hooks())

    compress = importlib.import_module("sglang.kernels.ops.attention.dsv4.compress")
    mtp = importlib.import_module("sglang.kernels.ops.attention.dsv4.online_c128_mtp")
    meta = importlib.import_module("sglang.kernels.ops.attention.dsa.fused_metadata_copy")
    def calls(installed, hook) -> bool:  # sglang's wrapper around a REPLACE hook holds the hook in its closure
        return any(cell.cell_contents is hook for cell in (getattr(installed, "__closure__", None) or ()))

    found["replaced"] = {name: calls(getattr(module, name), getattr(ours, name)) for module, name in (
        (mtp, "online_c128_mtp_write_prefix_states"), (mtp, "online_c128_mtp_mark_pending"),
        (mtp, "online_c128_mtp_commit_pending"), (meta, "fused_metadata_copy_cuda"),
        (meta, "fused_metadata_copy_multi_cuda"))}

    # sglang's own calls, as its compressor makes them, on CPU tensors (pydsa's host backend)
    d = 512
    gen = torch.Generator().manual_seed(5)
    b = 3
    seq = torch.tensor([128, 300, 1024], dtype=torch.int64)
    rid = torch.tensor([2, 0, 1], dtype=torch.int64)
    r2t = torch.zeros(4, 8, dtype=torch.int32)
    state = torch.randn(8, 1, 3 * d, generator=gen) * 0.1
    kv = torch.randn(b, 2 * d, generator=gen)
    ape = torch.randn(128, d, generator=gen)
    plan = compress.CompressorDecodePlan.generate_online(seq, rid, r2t, 4)
    mine = ours.CompressorDecodePlan.generate_online(seq, rid, r2t, 4)
    found["decode_plan_is_pydsas"] = isinstance(plan, ours.CompressorDecodePlan) and plan.online is True \
        and len(plan) == 2 and torch.equal(plan.plan_d, mine.plan_d)
    s1, s2 = state.clone(), state.clone()
    out = compress.compress_forward(s1, kv, ape, plan, head_dim=d, compress_ratio=128, is_online=True)
    ref = ours.compress_forward(s2, kv, ape, mine, head_dim=d, compress_ratio=128, is_online=True)
    found["decode_state_equal"] = torch.equal(s1, s2)
    found["decode_out_equal"] = torch.equal(out[seq % 128 == 0], ref[seq % 128 == 0])
    w = torch.rand(d, generator=gen) + 0.5
    angles = torch.rand(2048, 32, generator=gen)
    freq = torch.polar(torch.ones_like(angles), angles)
    loc = torch.tensor([5, 1, 2], dtype=torch.int64)
    c1 = torch.full((8, pydsa.kv_page_bytes(d, 2)), 0xA5, dtype=torch.uint8)
    c2 = c1.clone()
    compress.compress_norm_rope_store(out, plan, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=loc,
                                      kvcache=c1, page_size=2)
    ours.compress_norm_rope_store(ref, mine, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=loc,
                                  kvcache=c2, page_size=2)
    found["store_equal"] = torch.equal(c1, c2) and not bool((c1 == 0xA5).all())
    ext = torch.tensor([100, 300, 5], dtype=torch.int64)
    pseq = ext + torch.tensor([28, 0, 1019])
    n = int(ext.sum())
    pplan = compress.CompressorPrefillPlan.generate_online(pseq, ext, rid, r2t, n, False, 4)
    pmine = ours.CompressorPrefillPlan.generate_online(pseq, ext, rid, r2t, n, False, 4)
    kvp = torch.randn(n, 2 * d, generator=gen)
    s1, s2 = state.clone(), state.clone()
    pout = compress.compress_forward(s1, kvp, ape, pplan, head_dim=d, compress_ratio=128, is_online=True)
    pref = ours.compress_forward(s2, kvp, ape, pmine, head_dim=d, compress_ratio=128, is_online=True)
    found["prefill_plan_is_pydsas"] = (isinstance(pplan, ours.CompressorPrefillPlan) and pplan.online is True
                                       and torch.equal(pplan.plan_c, pmine.plan_c) and torch.equal(pplan.plan_w, pmine.plan_w))
    found["prefill_equal"] = torch.equal(s1, s2) and torch.equal(pout[:len(pmine.records[0])], pref[:len(pmine.records[0])])
    # a c4 layer's calls through sglang's own module reach pydsa: its planner, compression and store
    per, rows4 = 256, 2 * 8
    r2t4 = torch.arange(2 * per, dtype=torch.int32).reshape(2, per)
    f2s4 = torch.arange(3 * per, dtype=torch.int64)
    rid4, seq4 = torch.arange(2, dtype=torch.int64), torch.tensor([8, 13], dtype=torch.int64)
    # sglang's own plan type holding the records (its JIT planner needs a GPU; pydsa's writes the same bytes)
    plan4 = compress.CompressorDecodePlan(4, ours.CompressorDecodePlan.generate(4, rid4, r2t4, f2s4, seq4, per, 8).plan_d)
    ring = torch.randn(rows4 + 8, 4 * d, generator=gen)
    ape8, kv4 = torch.randn(8, d, generator=gen), torch.randn(2, 4 * d, generator=gen)
    r1, r2 = ring.clone(), ring.clone()
    o1 = compress.compress_forward(r1.view(-1, 4, 4 * d), kv4, ape8, plan4, head_dim=d, compress_ratio=4)
    o2 = ours.compress_forward(r2.view(-1, 4, 4 * d), kv4, ape8, ours.CompressorDecodePlan(4, plan4.plan_d),
                               head_dim=d, compress_ratio=4)
    found["c4_reached_pydsa"] = (type(plan4) is not ours.CompressorDecodePlan and torch.equal(r1, r2)
                                 and torch.equal(o1[0], o2[0]) and not torch.equal(r1, ring))
    # a configuration that is not pydsa's (head_dim 256) goes to sglang's own code: its kernel loader, trapped here
    asked = []

    def trap(*args, **kwargs):
        asked.append(args)
        raise RuntimeError("sglang's kernel loader")
    compress._jit_compress_module = trap
    try:
        compress.compress_forward(torch.randn(256, 512), torch.randn(1, 512), torch.randn(128, 256),
                                  compress.CompressorDecodePlan(128, plan.plan_d[:1]), head_dim=256, compress_ratio=128,
                                  is_online=False)
        found["not_ours_reached_sglang"] = False
    except RuntimeError as exc:
        found["not_ours_reached_sglang"] = str(exc) == "sglang's kernel loader" and len(asked) == 1
    found["stand_ins"] = sorted(stand_ins.names)
    print("FINDINGS " + json.dumps(found))


if __name__ == "__main__":
    main()
