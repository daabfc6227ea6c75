"""sglang 0.5.23's online c128 API over pydsa (pydsa.sglang): plan bytes as sglang's planner writes them
(a reference written here from its record layout), compress_forward and compress_norm_rope_store on
pydsa's ops, the fused form equal to the two calls, the refusals of what is not pydsa's, the plugin."""
import struct
import sys
import types

import numpy as np
import pytest
import torch

import pydsa
import pyplan
from conftest import DEVICES, HAS_GPU
from pydsa import sglang
from pydsa.sglang import plugin as sglang_plugin

D, CHUNK = 512, 128


def ref_decode_plan(seq, rid, off):
    return b"".join(struct.pack("<Iiii", int(s), int(r) + off, int(r) + off, -1) for s, r in zip(seq, rid))


def ref_prefill_plan(seq, ext, rid, off, n, graph):
    """sglang 0.5.23's planner: cut each extend at chunk ends; a piece that ends a chunk is a compress
    record, the trailing piece a write record; {last position + 1, last ragged row | length << 16,
    rid + off, rid}; graph mode pads both lists to n records {0xFFFFFFFF, 0, -1, -1}."""
    c, w, counter = [], [], 0
    for i, (s, e) in enumerate(zip(seq, ext)):
        prefix, pos = s - e, s - e
        while pos < s:
            start = pos // CHUNK * CHUNK
            end = min(s, start + CHUNK)
            rec = struct.pack("<IHHii", end, counter + (end - 1 - prefix), end - pos, int(rid[i]) + off, int(rid[i]))
            (c if (pos - start) + (end - pos) == CHUNK else w).append(rec)
            pos = end
        counter += e
    pad = struct.pack("<IHHii", 0xFFFFFFFF, 0, 0, -1, -1)
    if graph:
        c, w = c + [pad] * (n - len(c)), w + [pad] * (n - len(w))
    return b"".join(c), b"".join(w)


def _bytes(t):
    return t.cpu().contiguous().numpy().tobytes()


@pytest.mark.parametrize("device", DEVICES)
def test_decode_plan_bytes_are_sglangs(device):
    seq = torch.tensor([1, 128, 300, 5000], dtype=torch.int64, device=device)
    rid = torch.tensor([3, 0, 7, 2], dtype=torch.int64, device=device)
    r2t = torch.zeros(4, 8, dtype=torch.int32, device=device)
    for off in (0, 9):
        plan = sglang.CompressorDecodePlan.generate_online(seq, rid, r2t, off)
        assert plan.plan_d.dtype == torch.uint8 and tuple(plan.plan_d.shape) == (4, 16) and plan.is_decode
        assert _bytes(plan.plan_d) == ref_decode_plan(seq.tolist(), rid.tolist(), off)
        assert plan.compress_ratio == 128 and plan[1] is plan.plan_d


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("graph", [False, True])
def test_prefill_plan_bytes_are_sglangs(device, graph):
    rng = np.random.default_rng(3)
    for _ in range(20):
        b = int(rng.integers(1, 9))
        ext = rng.integers(1, 400, b)
        seq = ext + rng.integers(0, 600, b)
        n = int(ext.sum())
        rid = torch.from_numpy(rng.permutation(20)[:b]).to(device)
        plan = sglang.CompressorPrefillPlan.generate_online(torch.from_numpy(seq), torch.from_numpy(ext), rid,
                                                            torch.zeros(20, 4, dtype=torch.int32, device=device),
                                                            n, graph, 5)
        c, w = ref_prefill_plan(seq.tolist(), ext.tolist(), rid.tolist(), 5, n, graph)
        assert _bytes(plan.plan_c) == c and _bytes(plan.plan_w) == w and not plan.is_decode


def test_prefill_plan_refusals_and_the_padded_bucket():
    rid, r2t = torch.arange(2), torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(ValueError):
        sglang.CompressorPrefillPlan.generate_online(torch.tensor([5, 5]), torch.tensor([0, 5]), rid, r2t, 5)
    with pytest.raises(RuntimeError, match="16-bit ragged rows"):
        sglang.CompressorPrefillPlan.generate_online(torch.tensor([70000]), torch.tensor([70000]), rid[:1], r2t, 70000)
    # a bucket of 300 rows for 260 real tokens: refused as sglang refuses it, unless planned as a graph bucket
    with pytest.raises(RuntimeError, match="num_q_tokens is 300 but the extends sum to 260"):
        sglang.CompressorPrefillPlan.generate_online(torch.tensor([200, 60]), torch.tensor([200, 60]), rid, r2t, 300)


@pytest.mark.parametrize("device", DEVICES)
def test_a_prefill_plan_of_more_records_than_one_launch_carries(device):
    """1100 requests of 50 tokens: over 1024 records, so the plan takes several launches (and its padding
    and slots the first); the bytes are still sglang's."""
    b = 1100
    ext = np.full(b, 50, np.int64)
    seq = ext + np.arange(b, dtype=np.int64) * 7 % 300
    rid = torch.from_numpy(np.random.default_rng(2).permutation(2 * b)[:b]).to(device)
    r2t = torch.zeros(2 * b, 4, dtype=torch.int32, device=device)
    for graph in (False, True):
        plan = sglang.CompressorPrefillPlan.generate_online(torch.from_numpy(seq), torch.from_numpy(ext), rid, r2t,
                                                            int(ext.sum()), graph, 3)
        c, w = ref_prefill_plan(seq.tolist(), ext.tolist(), rid.tolist(), 3, int(ext.sum()), graph)
        if not graph:
            assert len(plan.records[0]) + len(plan.records[1]) > 1024
        assert _bytes(plan.plan_c) == c and _bytes(plan.plan_w) == w
        assert plan.indices.tolist() == [r + 3 for r in rid.tolist()] and plan.load_indices.tolist() == rid.tolist()


def test_the_plan_entry_point_refuses_records_sglang_cannot_hold():
    """dsa_request_records checks a prefill's records on the host before writing anything: a batch_id past the
    batch, a ragged row past 16 bits, a window outside 1..128."""
    import ctypes
    import c_structs
    from pydsa import _abi
    rid = torch.arange(2, dtype=torch.int64)
    slots, load = torch.full((2,), 7, dtype=torch.int32), torch.full((2,), 7, dtype=torch.int32)
    for bad, why in (((0, 2, 127, 1), "batch_id 2"), ((70000, 0, 127, 1), "ragged_id 70000"),
                     ((5, 0, 127, 0), "window_len 0")):
        records = np.array([(127, 0, 127, 128), bad], pyplan.SEGMENT_DTYPE)
        plan_c = torch.full((2, 16), 0xAB, dtype=torch.uint8)
        p = c_structs.new(c_structs.RequestRecordsParams)
        p.device, p.kind, p.batch_size = -1, 1, 2
        p.req_pool_indices, p.slots, p.load_slots = rid.data_ptr(), slots.data_ptr(), load.data_ptr()
        p.compress, p.num_compress, p.plan_c, p.compress_rows = records.ctypes.data, 2, plan_c.data_ptr(), 2
        assert _abi.lib.dsa_request_records(ctypes.byref(p), None) == 1
        assert f"compress record 1 {{ragged_id" in _abi.lib.dsa_last_error().decode() and why in \
            _abi.lib.dsa_last_error().decode()
        assert (plan_c == 0xAB).all() and (slots == 7).all()  # nothing written
    p.kind = 5
    assert _abi.lib.dsa_request_records(ctypes.byref(p), None) == 1 and "kind is 5" in _abi.lib.dsa_last_error().decode()


def _layer(device, b, seed=0):
    gen = torch.Generator().manual_seed(seed)
    state = torch.randn(b + 4, 3 * D, generator=gen) * 0.1
    state[:, D:2 * D] = 2.0
    w = torch.rand(D, generator=gen) + 0.5
    freq = torch.polar(torch.ones(4096, 32), torch.rand(4096, 32, generator=gen) * 6.3)
    cache = torch.full((256, 1728), 0xA5, dtype=torch.uint8)
    return [t.to(device) for t in (state, torch.randn(CHUNK, D, generator=gen), w, freq, cache)]


@pytest.mark.parametrize("device", DEVICES)
def test_decode_compress_store_and_the_fused_form(device):
    b = 6
    state, ape, w, freq, cache = _layer(device, b)
    seq = torch.tensor([128, 5, 256, 1, 384, 129], dtype=torch.int64, device=device)
    rid = torch.tensor([4, 0, 1, 2, 3, 5], dtype=torch.int64, device=device)
    kv = torch.randn(b, 2 * D).to(device)
    loc = torch.arange(b, dtype=torch.int64, device=device) * 3
    plan = sglang.CompressorDecodePlan.generate_online(seq, rid, torch.zeros(8, 8, dtype=torch.int32, device=device))
    s1, s2, s3 = state.clone(), state.clone(), state.clone()
    out = sglang.compress_forward(s1, kv, ape, plan, head_dim=D, compress_ratio=128, is_online=True)
    ref = torch.full((b, D), float("nan"), device=device)
    pydsa.c128_decode(s2.view(-1, 1, 3 * D), kv, ref, ape, rid.to(torch.int32), seq.to(torch.int32))
    closing = seq % 128 == 0
    assert torch.equal(out[closing], ref[closing]) and torch.equal(s1, s2)
    two = cache.clone()
    sglang.compress_norm_rope_store(out, plan, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=loc, kvcache=two,
                                    page_size=2)
    expect = cache.clone()
    kvc = pydsa.KVCache(expect, w, freq, page_size=2, eps=1e-6)
    pydsa.kv_store(out[closing], (seq[closing] - 128).to(torch.int32), loc[closing], kvc)
    assert torch.equal(two, expect) and not torch.equal(two, cache)
    fused = cache.clone()
    sglang.compress_forward_and_store(s3, kv, ape, plan, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=loc,
                                      kvcache=fused, page_size=2)
    assert torch.equal(fused, two) and torch.equal(s3, s1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("graph", [False, True])
def test_prefill_compress_store_and_the_fused_form(device, graph):
    torch.manual_seed(23)
    seq, ext = np.array([700, 129, 300, 40]), np.array([650, 129, 200, 40])
    n, b = int(ext.sum()), 4
    state, ape, w, freq, cache = _layer(device, b, 1)
    rid = torch.tensor([2, 0, 3, 1], dtype=torch.int64, device=device)
    kv = torch.randn(n, 2 * D).to(device)
    loc = torch.randperm(n).to(torch.int64).to(device) % 500
    plan = sglang.CompressorPrefillPlan.generate_online(torch.from_numpy(seq), torch.from_numpy(ext), rid,
                                                        torch.zeros(8, 8, dtype=torch.int32, device=device), n, graph)
    s1, s2, s3 = state.clone(), state.clone(), state.clone()
    out = sglang.compress_forward(s1, kv, ape, plan, head_dim=D, compress_ratio=128, is_online=True)
    records = pyplan.plan_prefill(seq, ext)
    ref = torch.full((len(records[0]), D), float("nan"), device=device)
    pydsa.c128_prefill(s2.view(-1, 1, 3 * D), kv, ref, ape, rid.to(torch.int32), records, compact=True)
    k = len(records[0])
    torch.testing.assert_close(out[:k], ref, rtol=1e-5, atol=1e-6)  # layouts may differ in the last bits
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-6)
    two = cache.clone()
    sglang.compress_norm_rope_store(out, plan, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=loc, kvcache=two,
                                    page_size=2)
    expect = cache.clone()
    kvc = pydsa.KVCache(expect, w, freq, page_size=2, eps=1e-6)
    pos = torch.from_numpy(records[0]["position"].astype(np.int64) - 127).to(torch.int32).to(device)
    rows = torch.from_numpy(records[0]["ragged_id"].astype(np.int64)).to(device)
    pydsa.kv_store(out[:k], pos, loc[rows], kvc)
    assert torch.equal(two, expect) and not torch.equal(two, cache)
    # the fused form: the same prefill, then the store of the vectors it closes: the two calls' bytes
    fused, own = cache.clone(), cache.clone()
    out3 = torch.full_like(out, float("nan"))
    sglang.compress_forward_and_store(s3, kv, ape, plan, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=loc,
                                      kvcache=fused, page_size=2, out=out3)
    sglang.compress_norm_rope_store(out3, plan, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=loc, kvcache=own,
                                    page_size=2)
    assert torch.equal(fused, own) and not torch.equal(fused, cache)
    assert torch.equal(out3[:k], out[:k]) and torch.equal(s3, s1)
    assert torch.equal(fused, two)


def test_what_is_not_pydsas_is_refused_by_name():
    state, ape, w, freq, cache = _layer("cpu", 2)
    plan = sglang.CompressorDecodePlan.generate_online(torch.tensor([5, 6]), torch.tensor([0, 1]),
                                                       torch.zeros(2, 2, dtype=torch.int32))
    kv = torch.zeros(2, 2 * D)
    for kwargs, name in ((dict(is_online=False, head_dim=256), "head_dim 256"),
                         (dict(is_online=True, compress_ratio=4), "ratio 4"),
                         (dict(is_online=True, head_dim=128), "head_dim 128")):
        args = {**dict(head_dim=D, compress_ratio=128), **kwargs}
        with pytest.raises(NotImplementedError, match=name):
            sglang.compress_forward(state, kv, ape, plan, **args)
    store = dict(norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=torch.zeros(2, dtype=torch.int64), kvcache=cache,
                 page_size=2)
    for extra, name in ((dict(use_fp4=True), "fp4 indexer"), (dict(bf16_store=True), "bf16_store"),
                        (dict(fp8_2buff=True), "two-pool"), (dict(layout="V41"), "V41")):
        with pytest.raises(NotImplementedError, match=name):
            sglang.compress_norm_rope_store(torch.zeros(2, D), plan, **store, **extra)
    # a decode plan made elsewhere (sglang's own records) is read in place like pydsa's
    kv = torch.randn(2, 2 * D)
    plan = sglang.CompressorDecodePlan.generate_online(torch.tensor([128, 6]), torch.tensor([0, 1]),
                                                       torch.zeros(2, 2, dtype=torch.int32))
    ours, theirs = state.clone(), state.clone()
    a = sglang.compress_forward(ours, kv, ape, plan, head_dim=D, compress_ratio=128, is_online=True)
    foreign = sglang.CompressorDecodePlan(128, plan.plan_d.clone())
    b = sglang.compress_forward(theirs, kv, ape, foreign, head_dim=D, compress_ratio=128, is_online=True)
    assert torch.equal(ours, theirs) and not torch.equal(ours, state) and torch.equal(a[0], b[0])
    prefill = sglang.CompressorPrefillPlan.generate_online(torch.tensor([5, 6]), torch.tensor([5, 6]), torch.tensor([0, 1]),
                                                           torch.zeros(2, 2, dtype=torch.int32), 11)
    foreign = sglang.CompressorPrefillPlan(128, prefill.plan_c, prefill.plan_w)  # no records for pydsa's kernels
    with pytest.raises(ValueError, match="not made by pydsa"):
        sglang.compress_forward(state, torch.zeros(11, 2 * D), ape, foreign, head_dim=D, compress_ratio=128,
                                is_online=True)


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_graph_mode_prefill_plan_replays_after_copy():
    """A captured compress_forward of a static graph-mode plan computes the plan copy_'d into it."""
    seq, ext = np.array([300, 200]), np.array([300, 200])
    n = 512
    state, ape, w, freq, cache = _layer("cuda", 2, 2)
    rid = torch.tensor([0, 1], dtype=torch.int64, device="cuda")
    r2t = torch.zeros(4, 4, dtype=torch.int32, device="cuda")
    static = sglang.CompressorPrefillPlan.generate_online(torch.from_numpy(seq), torch.from_numpy(ext), rid, r2t, n, True)
    kv = torch.randn(n, 2 * D, device="cuda")
    out = torch.full((n, D), float("nan"), device="cuda")
    s = state.clone()
    run = lambda: sglang.compress_forward(s, kv, ape, static, head_dim=D, compress_ratio=128, is_online=True, out=out)  # noqa: E731
    run()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    seq2, ext2 = np.array([256, 256]), np.array([256, 256])  # 512 tokens: the bucket
    static.copy_(sglang.CompressorPrefillPlan.generate_online(torch.from_numpy(seq2), torch.from_numpy(ext2), rid, r2t,
                                                              n, True))
    s.copy_(state)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    ref = torch.full((4, D), float("nan"), device="cuda")
    s2 = state.clone()
    pydsa.c128_prefill(s2.view(-1, 1, 3 * D), kv, ref, ape, rid.to(torch.int32), pyplan.plan_prefill(seq2, ext2),
                       compact=True)
    torch.testing.assert_close(out[:4], ref, rtol=1e-5, atol=1e-6)


def test_the_plugin_registers_its_hooks_and_passes_other_calls_through(monkeypatch):
    registered = []

    class HookType:
        AROUND, REPLACE = "around", "replace"

    class HookRegistry:
        @staticmethod
        def register(target, hook, kind):
            registered.append((target, hook, kind))

    module = types.ModuleType("sglang.srt.plugins.hook_registry")
    module.HookRegistry, module.HookType = HookRegistry, HookType
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", module)
    sglang_plugin.register()
    targets = {t: k for t, _, k in registered}
    assert len(targets) == 13 and all(t.startswith("sglang.") for t in targets)
    for layer_hook in ("sglang.srt.models.deepseek_v4.MQALayer.forward",
                       "sglang.srt.layers.attention.dsv4.compressor_v2.CompressorBackendMixin.forward_core_compressor",
                       "sglang.srt.layers.attention.dsv4.compressor_v2.CompressorBackendMixin.forward_indexer_compressor"):
        assert targets[layer_hook] == "around"  # a c4 layer's two compressor calls as one
    assert targets["sglang.kernels.ops.attention.dsv4.compress.compress_forward"] == "around"
    assert targets["sglang.kernels.ops.attention.dsv4.online_c128_mtp.online_c128_mtp_commit_pending"] == "replace"
    # an AROUND hook hands a configuration that is not pydsa's back to sglang's own function
    calls = []
    sglang_plugin._compress_forward(lambda *a, **k: calls.append(k) or "theirs", None, None, None, object(),
                                    head_dim=128, compress_ratio=4, is_online=False)
    assert calls and calls[0]["compress_ratio"] == 4


def test_one_rule_says_what_is_not_pydsas_and_the_plugin_passes_it_on():
    from pydsa.sglang import compress as sglang_v2
    assert sglang_v2.outside_pydsa() is None and sglang_v2.outside_pydsa(layout="KVLayout.V4") is None
    assert sglang_v2.outside_pydsa(is_online=False) is None  # the offline c128 compressor is pydsa's too
    reasons = {"head_dim 256": dict(is_online=False, head_dim=256), "online c4": dict(compress_ratio=4),
               "compress_ratio 64": dict(compress_ratio=64), "head_dim 128": dict(head_dim=128), "fp4 indexer": dict(indexer=True), "bf16_store": dict(bf16_store=True),
               "two-pool": dict(two_pool=True), "V41 cache layout": dict(layout="V41")}
    for words, config in reasons.items():
        assert words in sglang_v2.outside_pydsa(**config), config
    calls = []
    plan = sglang_v2.CompressorDecodePlan(128, torch.zeros(1, 16, dtype=torch.uint8))  # pydsa's: only the rule decides

    class Layer:
        def _get_paged_compress_metadata(self, ratio):
            return plan

    for extra in (dict(bf16_store=True), dict(kv_layout="V41"), dict(fp8_2buff=True), dict(is_indexer=True)):
        kw = dict(compress_ratio=128, head_dim=512, **extra)
        assert sglang_plugin._compress_all_in_one(lambda self, **k: calls.append(k) or "theirs", Layer(), **kw) == "theirs"
    assert len(calls) == 4


def test_the_plugin_entry_point_is_declared():
    import pathlib
    text = (pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text()
    assert '[project.entry-points."sglang.srt.plugins"]' in text and 'pydsa = "pydsa.sglang.plugin:register"' in text


def _write_prefix_float64(state, drafts, seq, rid, ape, v, stride, round_between):
    """sglang 0.5.23's write_prefix_states in float64, from its documented semantics: banks of draft k at
    rid + (k+1) * stride, bf16 on store; the running state rounded between drafts only if round_between."""
    out = state.clone()
    d = state.shape[1] // 3
    for i in range(seq.shape[0]):
        s0, req = int(seq[i]), int(rid[i])
        start = s0 & 127
        if s0 > 0 and start != 0:
            m, s, k = (state[req, j * d:(j + 1) * d].double() for j in range(3))
        else:
            m = s = k = torch.zeros(d, dtype=torch.float64)
        for j in range(v):
            pos = (start + j) & 127
            kvj, sc = drafts[i * v + j, :d].double(), drafts[i * v + j, d:].double() + ape[pos].double()
            if pos == 0:
                m, s, k = sc.clone(), torch.ones(d, dtype=torch.float64), kvj.clone()
            else:
                mx = torch.maximum(m, sc)
                a, e = s * torch.exp(m - mx), torch.exp(sc - mx)
                m, s, k = mx, a + e, (k * a + kvj * e) / (a + e)
            if (s0 + j + 1) & 127:
                out[req + (j + 1) * stride] = torch.cat([m, s, k]).to(state.dtype)
                if round_between:
                    m, s, k = (t.to(state.dtype).double() for t in (m, s, k))
            else:
                m = s = k = torch.zeros(d, dtype=torch.float64)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_write_prefix_states_keeps_a_bf16_state_in_fp32_between_drafts_as_sglang(device):
    """sglang's write_prefix_states keeps the running state in fp32 from draft to draft; pydsa.sglang's
    does too (c128_verify(round_between_drafts=False)), while pydsa's own verify rounds it between drafts
    as a decode would. Each is within one bf16 rounding of its float64 counterpart; they differ from
    each other by far more."""
    v, b, stride = 4, 24, 32
    gen = torch.Generator().manual_seed(1)
    rid = torch.randperm(stride, generator=gen)[:b].to(torch.int64)
    seq = torch.randint(1, 3000, (b,), generator=gen).to(torch.int64)
    seq[:3] = torch.tensor([0, 127, 125])
    state = torch.randn(stride * (v + 1), 3 * D, generator=gen) * 0.1
    state[:, D:2 * D] = 2.0
    state = state.to(torch.bfloat16)
    ape, drafts = torch.randn(CHUNK, D, generator=gen), torch.randn(b * v, 2 * D, generator=gen)
    r2t = torch.zeros(stride, 8, dtype=torch.int32)
    ours = state.clone().to(device)
    sglang.online_c128_mtp_write_prefix_states(drafts.to(device), seq.to(device), rid.to(device), r2t.to(device),
                                               ape.to(device), ours, b, v, stride, head_dim=D)
    decoded = state.clone().to(device)
    pydsa.c128_verify(decoded.view(-1, 1, 3 * D), drafts.to(device), None, ape.to(device), rid.to(torch.int32).to(device),
                      seq.to(torch.int32).to(device), rid.to(torch.int32).to(device), bank_stride=stride)
    step = 2.0 ** -8  # one bf16 rounding, relative to the state's magnitude
    for got, round_between in ((ours, False), (decoded, True)):
        want = _write_prefix_float64(state, drafts, seq, rid, ape, v, stride, round_between).float()
        assert float((got.float().cpu() - want).abs().max() / want.abs().max()) <= step, round_between
    assert float((ours.float() - decoded.float()).abs().max() / decoded.float().abs().max()) > step


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_between_drafts_is_refused_for_an_fp32_state(device):
    v, b = 3, 5
    gen = torch.Generator().manual_seed(2)
    state = (torch.randn(b * (v + 1), 1, 3 * D, generator=gen) * 0.1).to(device)
    drafts, ape = torch.randn(b * v, 2 * D, generator=gen).to(device), torch.randn(CHUNK, D, generator=gen).to(device)
    idx = torch.arange(b, dtype=torch.int32, device=device)
    seq = torch.tensor([0, 126, 5, 300, 127], dtype=torch.int32, device=device)
    a = state.clone()
    pydsa.c128_verify(a, drafts, None, ape, idx, seq, idx, bank_stride=b)
    assert not torch.equal(a, state)
    with pytest.raises(ValueError, match="round_between_drafts=False applies to a bf16 state only"):
        pydsa.c128_verify(state.clone(), drafts, None, ape, idx, seq, idx, bank_stride=b, round_between_drafts=False)
