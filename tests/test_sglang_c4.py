"""sglang 0.5.23's c4 calls over pydsa (pydsa.sglang): its planners' records, compress_forward and
compress_norm_rope_store for the main and the indexer compressor, the fused layer, the plugin's routing."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import pydsa
from pydsa import sglang
from pydsa.sglang import compress as sglang_v2, plugin as sglang_plugin
from c4_reference import entry
from conftest import DEVICES
from reference import rel_err

SWA = 256


def _words(plan_c) -> np.ndarray:
    """A plan's compress records as int32 words [C, 4]."""
    return plan_c.cpu().view(torch.int32).reshape(-1, 4).numpy()


def _context(device, b, max_len, ring_size=8, seed=0, bf16=False):
    """sglang's paged layout: request b's positions at full-pool slots b * per + p (per a multiple of 256),
    identity full-to-SWA map; both compressors' rings and caches."""
    g = torch.Generator().manual_seed(seed)
    per = -(-max_len // SWA) * SWA
    ctx = dict(rpi=torch.arange(b, dtype=torch.int64, device=device),
               r2t=torch.arange(b * per, dtype=torch.int32, device=device).reshape(b, per),
               f2s=torch.arange(b * per + SWA, dtype=torch.int64, device=device), per=per, R=ring_size)
    rows = (b * per // SWA + 1) * ring_size
    freqs = torch.polar(torch.ones(max_len + 8, 32), torch.rand(max_len + 8, 32, generator=g) * 6.28).to(device)
    ctx["freqs"] = freqs
    for k, d in (("main", 512), ("indexer", 128)):
        page = pydsa.kv_page_bytes(d, 64) if k == "main" else pydsa.indexer_page_bytes(d, 64)
        ctx[k] = dict(ring=torch.randn(rows, 4 * d, generator=g).to(torch.bfloat16 if bf16 else torch.float32).to(device),
                      ape=(torch.randn(4, 2 * d, generator=g) * 0.5).to(device),
                      w=(torch.rand(d, generator=g) + 0.5).to(device),
                      cache=torch.zeros(b * per // SWA + 1, page, dtype=torch.uint8, device=device), d=d)
    return ctx


def test_the_prefill_planner_writes_sglangs_worked_example():
    """R = 8, one request in SWA page k = 1, prefix 10, extend 6: the records the reference walks through."""
    ctx = _context("cpu", 2, 300)
    rpi = torch.tensor([1], dtype=torch.int64)
    plan = sglang_v2.CompressorPrefillPlan.generate(4, rpi, torch.tensor([16]), torch.tensor([6]), ctx["r2t"],
                                                    ctx["f2s"], SWA, 8, 6)
    k = 2  # request 1's first full-pool slot is 2 * 256 / 256 = SWA page 2... its ring base is 2 * 8
    c = _words(plan.plan_c)
    assert [tuple(int(v) for v in r) for r in c] == [(12, 1 | 6 << 16, 2 * k + 1, 2 * k), (16, 5 | 2 << 16, 2 * k, 2 * k + 1)]
    w = plan.plan_w.view(torch.int32).reshape(-1, 2).tolist()
    assert w == [[2, 8 * k + 4], [3, 8 * k + 5], [4, 8 * k + 6], [5, 8 * k + 7]]


def test_graph_mode_plans_pad_with_sglangs_invalid_records_and_the_decode_plan_follows_the_formula():
    ctx = _context("cpu", 3, 700, ring_size=16)
    plan = sglang_v2.CompressorPrefillPlan.generate(4, ctx["rpi"], torch.tensor([9, 600, 4]), torch.tensor([9, 5, 1]),
                                                    ctx["r2t"], ctx["f2s"], SWA, 16, 15, use_cuda_graph=True)
    c = _words(plan.plan_c)
    assert c.shape == (15, 4) and (c[5:] == [-1, 0, -1, -1]).all() and (c[:5, 0] == [4, 8, 596, 600, 4]).all()
    w = plan.plan_w.view(torch.int32).reshape(-1, 2)
    assert w[:, 0].tolist() == list(range(15))  # R = 16 keeps the last 10 positions: every row here
    seq = torch.tensor([1, 5, 300])
    d = sglang_v2.CompressorDecodePlan.generate(4, ctx["rpi"], ctx["r2t"], ctx["f2s"], seq, SWA, 16).plan_d
    words = d.view(torch.int32).reshape(-1, 4).tolist()
    per = ctx["per"]
    for b, s in enumerate(seq.tolist()):
        swa1, swa0 = b * per + s - 1, b * per + max(s - 5, 0)
        row1 = swa1 // SWA * 16 + swa1 % 16
        assert words[b] == [s, row1, (swa0 // SWA * 16 + swa0 % 16) // 4, row1 // 4]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_sglang_calls_and_the_fused_layer_agree_and_match_float64(device, bf16):
    """A chunked prefill then decodes through sglang's calls (compress_forward, compress_norm_rope_store, both
    compressors) and through pydsa.sglang.c4_layer leave equal rings and caches; fp32 entries within 1e-5
    of float64."""
    dev = torch.device(device)
    a, b = _context(dev, 2, 64, seed=4, bf16=bf16), _context(dev, 2, 64, seed=4, bf16=bf16)
    g = torch.Generator().manual_seed(9)
    tokens = {k: torch.randn(2, 64, 4 * d, generator=g) for k, d in (("main", 512), ("indexer", 128))}
    lens = [0, 0]

    def step(seqs, exts):
        n = sum(exts)
        rows_b = np.repeat(np.arange(2), exts)
        pos = np.concatenate([np.arange(s - e, s) for s, e in zip(seqs, exts)])
        decode = all(e == 1 for e in exts)
        seq_t = torch.tensor(seqs, dtype=torch.int64)
        if decode:
            plan = sglang_v2.CompressorDecodePlan.generate(4, a["rpi"], a["r2t"], a["f2s"], seq_t.to(dev), SWA, 8)
        else:
            plan = sglang_v2.CompressorPrefillPlan.generate(4, a["rpi"], seq_t, torch.tensor(exts), a["r2t"], a["f2s"],
                                                            SWA, 8, n)
        out_loc = torch.tensor([(rb * a["per"] + p) // 4 if (p + 1) % 4 == 0 else 0 for rb, p in zip(rows_b, pos)],
                               dtype=torch.int64, device=dev)
        for ctx in (a, b):
            ctx["inputs"] = {k: torch.stack([tokens[k][rb, p] for rb, p in zip(rows_b, pos)]).to(dev) for k in tokens}
        outs = {}
        for k in ("main", "indexer"):
            c = a[k]
            out = sglang.compress_forward(c["ring"].view(-1, 4, 4 * c["d"]), a["inputs"][k], c["ape"].view(-1, c["d"]),
                                          plan, head_dim=c["d"], compress_ratio=4, is_online=False)
            sglang.compress_norm_rope_store(out, plan, norm_weight=c["w"], norm_eps=1e-6, freq_cis=a["freqs"],
                                            out_loc=out_loc, kvcache=c["cache"], page_size=64)
            outs[k] = out.cpu().numpy()
        stores = {k: sglang_v2._kv_cache(b[k]["cache"], b[k]["w"], 1e-6, b["freqs"], 64,
                                         "indexer" if k == "indexer" else "v4") for k in ("main", "indexer")}
        sglang.c4_layer(*[dict(kv_score_buffer=b[k]["ring"], kv_score_input=b["inputs"][k], ape=b[k]["ape"],
                               store=stores[k]) for k in ("main", "indexer")], plan, out_loc)
        if not bf16:  # every closed entry against float64 (decode rows: where seq % 4 == 0)
            for k, d in (("main", 512), ("indexer", 128)):
                ape8 = a[k]["ape"].view(-1, d).cpu().numpy()
                closing = [(i, rb, p) for i, (rb, p) in enumerate(zip(rows_b, pos)) if (p + 1) % 4 == 0]
                for r, (i, rb, p) in enumerate(closing):
                    row = i if decode else r
                    want = entry(tokens[k][rb, :p + 1].numpy(), ape8, (p + 1) // 4 - 1)
                    assert rel_err(outs[k][row], want) < 1e-5, (k, p)
        lens[:] = seqs

    step([9, 6], [9, 6])
    for _ in range(7):
        step([lens[0] + 1, lens[1] + 1], [1, 1])
    step([lens[0] + 10, lens[1] + 3], [10, 3])
    for k in ("main", "indexer"):
        assert torch.equal(a[k]["cache"].cpu(), b[k]["cache"].cpu()), k
        ra, rb = a[k]["ring"].cpu(), b[k]["ring"].cpu()
        assert torch.equal(ra.view(torch.int16) if bf16 else ra.view(torch.int32),
                           rb.view(torch.int16) if bf16 else rb.view(torch.int32)), k


def test_the_plugin_routes_c4_to_pydsa_and_hands_back_what_is_not_ours():
    """The c4 compressor calls go to pydsa whoever made the plan (sglang's planner stays sglang's: its
    records are what pydsa reads); what is not pydsa's goes back to sglang."""
    targets = {t: kind for t, _, kind in sglang_plugin.hooks()}
    assert "sglang.kernels.ops.attention.dsv4.compress.CompressorDecodePlan.generate" not in targets
    ctx = _context("cpu", 1, 16)
    plan = sglang_v2.CompressorDecodePlan.generate(4, ctx["rpi"], ctx["r2t"], ctx["f2s"], torch.tensor([4]), SWA, 8)
    calls = []
    ring, kv, ape = torch.randn(8, 2048), torch.randn(1, 2048), torch.randn(8, 512)
    out = sglang_plugin._compress_forward(lambda *a, **k: calls.append(k) or "theirs", ring, kv, ape, plan,
                                          head_dim=512, compress_ratio=4, is_online=False)
    assert not calls and out.shape == (1, 512)
    assert sglang_v2.outside_pydsa(512, 4, False) is None and sglang_v2.outside_pydsa(128, 4, False) is None
    assert "online c4" in sglang_v2.outside_pydsa(512, 4, True)
    assert "fp4 indexer" in sglang_v2.outside_pydsa(128, 4, False, indexer=True)
    with pytest.raises(NotImplementedError, match="compress_ratio 64"):  # 128: the offline c128 planner's
        sglang_v2.CompressorDecodePlan.generate(64, ctx["rpi"], ctx["r2t"], ctx["f2s"], torch.tensor([4]), SWA, 8)


def test_records_ahead_is_a_c4_promise_refused_by_name_elsewhere():
    """records_ahead (pydsa's keyword on the drop-in calls, off by default: a drop-in call cannot know when its plan
    and out_loc were written) is a bool, and a c128 compress takes none; both refusals name it."""
    from pydsa.sglang import c4_layer
    with pytest.raises(pydsa.ArgumentValueError, match="records_ahead is for a c4 layer's compress") as err:
        sglang_v2.compress_forward(None, None, None, None, head_dim=512, compress_ratio=128, is_online=False,
                                   records_ahead=True)
    assert err.value.argument == "records_ahead"
    with pytest.raises(pydsa.ArgumentTypeError, match="records_ahead must be a bool") as err:
        c4_layer({}, {}, None, None, records_ahead="yes")
    assert err.value.argument == "records_ahead"


@pytest.mark.parametrize("device", DEVICES)
def test_table_entries_past_their_tables_are_records_the_ops_skip_and_count(device):
    """Index values are data: a request index outside req_to_token, a token outside full_to_state or a negative
    SWA slot gives records with ring row -1 (no out-of-bounds read in the planner, on either device); the c4
    decode over them writes no ring row, entry or cache byte for those requests and counts them."""
    ctx = _context(device, 3, 300)
    r2t, f2s = ctx["r2t"].clone(), ctx["f2s"].clone()
    rpi = torch.tensor([0, 7, 2], dtype=torch.int64, device=device)  # request 1: no row 7 in req_to_token
    r2t[2, 7] = 10 ** 6                                                # request 2's token: outside full_to_state
    seq = torch.tensor([8, 8, 8], dtype=torch.int64, device=device)     # every request closes an entry
    plan = sglang_v2.CompressorDecodePlan.generate(4, rpi, r2t, f2s, seq, SWA, 8)
    words = plan.plan_d.view(torch.int32).reshape(-1, 4).cpu().tolist()
    assert words[0][1] >= 0 and words[1][1] == -1 and words[2][1] == -1, words
    main = pydsa.C4Compressor(ctx["main"]["ring"], ctx["main"]["ape"].reshape(8, 512))
    before = main.ring.clone()
    out = torch.full((3, 512), float("nan"), device=device)
    errors = torch.zeros(1, dtype=torch.int32, device=device)
    kv = torch.randn(3, 4 * 512, device=device)
    pydsa.c4_decode(main, kv, records=plan.plan_d, out=out, error_count=errors)
    assert int(errors.item()) == 2
    assert torch.isfinite(out[0]).all() and torch.isnan(out[1:]).all()
    changed = (main.ring != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [words[0][1]]
