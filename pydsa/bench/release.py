"""pydsa beside sglang 0.5.23's own online c128 kernels (its v2 decode, prefill and store kernel, its MTP
kernels), in one process, on the same inputs, timed with the same graph method and a busy start, PDL as
each side ships it (sglang: on every launch; pydsa: its defaults). Targets P16, P18, P20, P21, P23, P24, P25, P27 (docs/performance.md).

    python -m pydsa.bench.release OUT.json --reference-build DIR

DIR is the reference build (benchmarks/reference/build.sh; benchmarks/README.md): sglang 0.5.23's own
Python calls (its compress.py and online_c128_mtp.py) over its own kernels, compiled ahead of time by its
own JIT builder. First the store's bytes are compared with sglang's store kernel on the same vectors (fp8
code, scale and rope flips counted), then the rows are timed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys

import numpy as np
import torch

import pydsa
from . import c4_paths, harness, offline, reference, v4_step
from .harness import graph_us, host_us, host_vs_empty, median_graph_us

from .mtp import _bf16_steps, commit_rows, compare_mtp_protocol
from .decode_path import D, PAGE, Layer, PrefillCase, _rotary, decode_rows, floor_rows, model_step_rows  # noqa: F401


def _load(folder):
    try:
        return reference.load(folder)
    except Exception as exc:
        raise SystemExit(f"--reference-build {folder}: cannot load sglang 0.5.23's kernels ({exc}); build them "
                         f"with benchmarks/reference/build.sh") from exc


def _extend_records(positions):
    """sglang extend-mode store records: one per vector i, seq_len = position + 128, ragged_id = i."""
    n = positions.shape[0]
    rec = np.zeros((n, 4), np.uint32)
    rec[:, 0] = positions.cpu().numpy().astype(np.uint32) + 128
    rec[:, 1] = np.arange(n, dtype=np.uint32) | (128 << 16)
    return torch.from_numpy(rec.view(np.uint8).reshape(n, 16)).cuda()


def compare_store(ref, n=8192, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, D, device="cuda", generator=gen) * torch.rand(n, 1, device="cuda", generator=gen) * 4
    w = torch.rand(D, device="cuda", generator=gen) + 0.5
    freq = _rotary(4096, gen)
    positions = torch.randint(0, 4096 - 128, (n,), device="cuda", generator=gen, dtype=torch.int32)
    slots = torch.randperm(n * 2, device="cuda", generator=gen)[:n].to(torch.int64)
    pages = n + 1
    ours = torch.full((pages, 1728), 0xA5, dtype=torch.uint8, device="cuda")
    theirs = ours.clone()
    kv = pydsa.KVCache(ours, w, freq, page_size=PAGE, eps=1e-6)
    pydsa.kv_store(x, positions, slots, kv)
    torch.cuda.synchronize()
    ref.store(x, ref.extend_plan(_extend_records(positions)), w, 1e-6, freq, slots,
                       theirs, PAGE)
    torch.cuda.synchronize()
    a, b = ours.cpu().numpy().reshape(-1), theirs.cpu().numpy().reshape(-1)
    s = slots.cpu().numpy()
    page, entry = s // 2, s % 2
    data = (page * 1728 + entry * 576)[:, None] + np.arange(576)
    scale = (page * 1728 + 1152 + entry * 8)[:, None] + np.arange(8)
    codes_a, codes_b = a[data[:, :448]], b[data[:, :448]]
    rope_a, rope_b = a[data[:, 448:]].view(np.uint16), b[data[:, 448:]].view(np.uint16)
    sc_a, sc_b = a[scale[:, :7]], b[scale[:, :7]]
    written = np.zeros(a.shape, bool)
    written[data.reshape(-1)] = True
    written[scale[:, :7].reshape(-1)] = True
    return {
        "vectors": n, "values": n * D,
        "fp8_code_flips": int((codes_a != codes_b).sum()),
        "fp8_code_max_step": int(np.abs(codes_a.astype(int) - codes_b.astype(int)).max()),
        "scale_flips": int((sc_a != sc_b).sum()),
        "rope_values_off": int((rope_a != rope_b).sum()),
        "rope_max_bf16_steps": int(np.abs(rope_a.astype(np.int32) - rope_b.astype(np.int32)).max()),
        "pad_bytes_written_pydsa": int((a[scale[:, 7]] != 0xA5).sum()),
        "other_bytes_differ": int((a[~written] != b[~written]).sum()),
    }


def pyplan_records(plan):
    """The real compress records of a pydsa prefill plan (host arrays, or a DevicePlan's counts)."""
    recs = plan.records
    return range(recs.num_compress) if hasattr(recs, "num_compress") else recs[0]


def compare_sglang_api(ref, cases=30, seed=7):
    """pydsa.sglang's 0.5.23 calls beside sglang's own on the same inputs: plan bytes (decode and
    prefill, plain and CUDA-graph mode, with a state slot offset), states and outputs of
    compress_forward, cache bytes of compress_norm_rope_store and of the fused form (against our own two
    calls: decode bit for bit; prefill within the last bits a storing prefill's sum order may change,
    docs/spec.md, prefill)."""
    from .. import sglang as ours
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    r = dict(cases=0, plan_bytes_differ=0, max_state_err_fp32=0.0, max_state_bf16_steps=0,
             max_state_bf16_steps_not_near_0=0, max_state_err_bf16=0.0, max_out_err=0.0,
             cache_bytes_differ=0, fused_decode_cache_bytes_differ=0, fused_prefill_cache_bytes_differ=0,
             cache_bytes=0)
    for case in range(cases):
        dtype = torch.float32 if case % 2 == 0 else torch.bfloat16
        decode = case % 3 != 0
        b = int(rng.integers(1, 40))
        rid = torch.from_numpy(rng.permutation(64)[:b]).cuda()
        r2t = torch.zeros(64, 8, dtype=torch.int32, device="cuda")
        off = int(rng.integers(0, 3)) * 64
        state = torch.randn(64 * 4, 1, 3 * D, device="cuda", generator=gen) * 0.1
        state[:, :, D:2 * D] = 2.0
        state = state.to(dtype)
        ape = torch.randn(128, D, device="cuda", generator=gen)
        w = torch.rand(D, device="cuda", generator=gen) + 0.5
        freq = _rotary(70000, gen)
        if decode:
            seq = torch.from_numpy(rng.integers(1, 60000, b)).cuda()
            seq[: b // 2] = (seq[: b // 2] // 128 + 1) * 128
            mine = ours.CompressorDecodePlan.generate_online(seq, rid, r2t, off)
            theirs = ref.plan_decode(seq, rid, r2t, off)
            same = torch.equal(mine.plan_d, theirs.plan_d)
            n, plan_t = b, theirs
        else:
            ext = rng.integers(1, 600, b)
            seq = ext + rng.integers(0, 3000, b)
            n = int(ext.sum())
            graph = case % 4 == 0
            mine = ours.CompressorPrefillPlan.generate_online(torch.from_numpy(seq), torch.from_numpy(ext), rid, r2t,
                                                              n, graph, off)
            theirs = ref.plan_prefill(torch.from_numpy(seq), torch.from_numpy(ext), rid, r2t, n, graph, off)
            same = torch.equal(mine.plan_c, theirs.plan_c) and torch.equal(mine.plan_w, theirs.plan_w)
            plan_t = theirs
        r["plan_bytes_differ"] += int(not same)
        kv = torch.randn(n, 2 * D, device="cuda", generator=gen)
        loc = torch.randperm(2 * n, device="cuda", generator=gen)[:n].to(torch.int64)
        s_m, s_t = state.clone(), state.clone()
        out_m = ours.compress_forward(s_m, kv, ape, mine, head_dim=D, compress_ratio=128, is_online=True)
        out_t = ref.compress_forward(s_t, kv, ape, plan_t)
        # rows that hold a vector: decode rows whose token closes a chunk, the real compress records
        real = (seq % 128 == 0) if decode else slice(0, len(pyplan_records(mine)))
        a, t = out_m[real], out_t[real]
        if a.shape[0]:
            r["max_out_err"] = max(r["max_out_err"], float(((a - t).norm() / t.norm()).item()))
        if dtype == torch.float32:  # largest difference relative to the state's largest magnitude
            err = float(((s_m - s_t).abs().max() / s_t.abs().max()).item())
            r["max_state_err_fp32"] = max(r["max_state_err_fp32"], err)
        else:  # steps anywhere; steps where the value is not near 0 (|x| >= 1/64 of its row's largest);
            # and the largest difference relative to the state's largest magnitude, as for fp32
            r["max_state_bf16_steps"] = max(r["max_state_bf16_steps"], _bf16_steps(s_m, s_t))
            mag = s_t.float().abs().view(-1, 3, D)  # each slot's m, s and k rows
            big = (mag >= mag.amax(dim=-1, keepdim=True) / 64).view(s_t.shape)
            r["max_state_bf16_steps_not_near_0"] = max(r["max_state_bf16_steps_not_near_0"],
                                                       _bf16_steps(s_m[big], s_t[big]))
            err = float(((s_m.float() - s_t.float()).abs().max() / s_t.float().abs().max()).item())
            r["max_state_err_bf16"] = max(r["max_state_err_bf16"], err)
        pages = n + 2
        c_m = torch.full((pages, 1728), 0xA5, dtype=torch.uint8, device="cuda")
        c_t, c_f = c_m.clone(), c_m.clone()
        ours.compress_norm_rope_store(out_t, mine, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=loc,
                                      kvcache=c_m, page_size=PAGE)
        ref.store(out_t, plan_t, w, 1e-6, freq, loc, c_t, PAGE)
        torch.cuda.synchronize()
        ours.compress_forward_and_store(state.clone(), kv, ape, mine, norm_weight=w, norm_eps=1e-6, freq_cis=freq,
                                        out_loc=loc, kvcache=c_f, page_size=PAGE)
        c_two = torch.full_like(c_m, 0xA5)
        ours.compress_norm_rope_store(out_m, mine, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=loc,
                                      kvcache=c_two, page_size=PAGE)
        r["cache_bytes_differ"] += int((c_m != c_t).sum().item())
        r["fused_decode_cache_bytes_differ" if decode else "fused_prefill_cache_bytes_differ"] += int(
            (c_f != c_two).sum().item())
        r["cache_bytes"] += c_m.numel()
        r["cases"] += 1
    return r


PREFILL_CASES = {  # name: (seq_lens, extend_lens)
    "1x128": ([128], [128]),
    "8x1K prefixes": ([1024 + 100 * i for i in range(8)], [1024] * 8),
    "1x8K": ([8192], [8192]),
    "1x32K": ([32768], [32768]),
    "64x(1-600) prefixes": None,  # random, seeded below
}


def prefill_rows(ref, rounds=5):
    rows = []
    rng = np.random.default_rng(4)
    gen = torch.Generator(device="cuda").manual_seed(4)
    for name, case in PREFILL_CASES.items():
        if not PrefillCase.fits_sglang(case):
            continue
        P = PrefillCase(case, rng, gen)
        n, state, kv, ape, idx, loc, cache, w, freq, store, plan = (P.n, P.state, P.kv, P.ape, P.idx, P.loc, P.cache,
                                                                    P.w, P.freq, P.store, P.plan)
        sg_plan = ref.plan_prefill(torch.from_numpy(P.seq), torch.from_numpy(P.ext), P.rid, P.r2t, n)
        out_c = torch.empty(max(1, sg_plan.plan_c.shape[0]), D, device="cuda")
        ours = lambda: pydsa.c128_prefill(state, kv, None, ape, idx, plan, compact=True, store=store, cache_slots=loc)
        ours_plain = lambda: pydsa.c128_prefill(state, kv, out_c, ape, idx, plan, compact=True)
        sg_c = lambda: ref.compress_forward(state, kv, ape, sg_plan, out=out_c)
        sg_s = lambda: ref.store(out_c, sg_plan, w, 1e-6, freq, loc, cache, PAGE)
        # The two-call way: the plain prefill into a compact out, then kv_store of its rows (positions and
        # slots of the compress records gathered at plan time, as an engine would).
        recs = plan[0]
        pos_t = torch.from_numpy((recs["position"].astype(np.int64) - 127).astype(np.int32)).cuda()
        slots_t = loc[torch.from_numpy(recs["ragged_id"].astype(np.int64)).cuda()]
        two = [ours_plain, lambda: pydsa.kv_store(out_c[:len(recs)], pos_t, slots_t, store)]
        cases = {"pydsa prefill+store fused": [ours], "pydsa prefill": [ours_plain], "pydsa prefill, kv_store": two,
                 "sglang prefill": [sg_c], "sglang prefill + store": [sg_c, sg_s]}
        m = median_graph_us(cases, rounds)
        row = {"case": name, "tokens": n, **{k + " us": round(v, 3) for k, v in m.items()},
               "P20 speedup": round(m["sglang prefill + store"] / m["pydsa prefill+store fused"], 3)}
        rows.append(row)
        print(row, flush=True)
    return rows


def verify_rows(ref, bs, dtypes, rounds=5, v=8):
    """P21: a storing verify of V drafts per request against sglang's verify of a c128 layer: its v2
    prefill over the drafts (plan made outside the graph), its store, and write_prefix_states."""
    rows = []
    rng = np.random.default_rng(6)
    gen = torch.Generator(device="cuda").manual_seed(6)
    for dtype in dtypes:
        for b in bs:
            seq = rng.integers(1, 4000, b).astype(np.int64)
            k = max(1, b // 4)
            seq[:k] = (seq[:k] // 128 + 1) * 128 - rng.integers(1, v + 1, k)  # drafts that close a chunk
            state = (torch.randn(b * (v + 1), 1, 3 * D, device="cuda", generator=gen) * 0.1)
            state[:, :, D:2 * D] = 3.0
            state = state.to(dtype)
            drafts = torch.randn(b * v, 2 * D, device="cuda", generator=gen)
            ape = torch.randn(128, D, device="cuda", generator=gen)
            idx = torch.arange(b, dtype=torch.int32, device="cuda")
            rid = idx.to(torch.int64)
            r2t = torch.zeros(b, 8, dtype=torch.int32, device="cuda")
            seq_t = torch.from_numpy(seq).cuda()
            loc = torch.randperm(b * v, device="cuda", generator=gen).to(torch.int64)
            cache = torch.zeros(b * v // 2 + 1, 1728, dtype=torch.uint8, device="cuda")
            w = torch.rand(D, device="cuda", generator=gen) + 0.5
            freq = _rotary(4096 + 128, gen)
            store = pydsa.KVCache(cache, w, freq, page_size=PAGE, eps=1e-6)
            ours = pydsa.C128Verify(state, drafts, None, ape, idx, seq_t.to(torch.int32), idx, bank_stride=b,
                                    store=store, cache_slots=loc)
            plan = ref.plan_prefill(torch.from_numpy(seq + v), torch.full((b,), v, dtype=torch.int64), rid, r2t,
                                          b * v, state_slot_offset=v * b)
            out_c = torch.empty(max(1, plan.plan_c.shape[0]), D, device="cuda")
            state2d = state.view(state.shape[0], 3 * D)
            calls = [lambda: ref.compress_forward(state, drafts, ape, plan, out=out_c),
                     lambda: ref.write_prefix_states(drafts, seq_t, rid, r2t, ape, state2d, b, v, b)]
            if plan.plan_c.shape[0] > 0:
                calls.insert(1, lambda: ref.store(out_c, plan, w, 1e-6, freq, loc, cache, PAGE))
            t = {"pydsa": [], "sglang": []}
            for _ in range(rounds):
                t["pydsa"].append(graph_us([ours.launch]))
                t["sglang"].append(graph_us(calls) * len(calls))
            m = {k2: statistics.median(x) for k2, x in t.items()}
            row = {"b": b, "v": v, "state": str(dtype).replace("torch.", ""),
                   "pydsa verify+store fused us": round(m["pydsa"], 3),
                   "sglang verify (prefill + store + write_prefix_states) us": round(m["sglang"], 3),
                   "P21 speedup": round(m["sglang"] / m["pydsa"], 3)}
            rows.append(row)
            print(row, flush=True)
    return rows


def planning_rows(ref) -> list:
    """P23: host time per call of the sglang-shaped planning calls, pydsa.sglang's generate_online beside
    the reference's (sglang's host steps: its pinned buffer, copies and plan kernel), alternating in
    blocks, no sync inside a block; and the empty launch measured beside them."""
    from .. import sglang as ours
    rows = []
    rng = np.random.default_rng(11)
    sync = torch.cuda.synchronize
    for b in (1, 32, 256, 1024):
        seq = torch.from_numpy(rng.integers(1, 60000, b)).cuda()
        rid = torch.from_numpy(rng.permutation(4 * b)[:b]).cuda()
        r2t = torch.zeros(4 * b, 8, dtype=torch.int32, device="cuda")
        mine = lambda: ours.CompressorDecodePlan.generate_online(seq, rid, r2t, 64)
        theirs = lambda: ref.plan_decode(seq, rid, r2t, 64)
        o, t = [], []
        for _ in range(5):
            o.append(host_us(mine, n=400, rounds=1, sync=sync))
            t.append(host_us(theirs, n=400, rounds=1, sync=sync))
        mo, mt = statistics.median(o), statistics.median(t)
        rows.append({"plan": "decode", "b": b, "pydsa host us": round(mo, 2), "sglang host us": round(mt, 2),
                     "P23 ratio (target <= 0.5)": round(mo / mt, 3)})
        print(rows[-1], flush=True)
    for name, ext in (("4 x (77-400)", np.array([100, 300, 77, 400])), ("8 x 1K", np.full(8, 1024)),
                      ("64 x (1-600)", rng.integers(1, 601, 64))):
        ext = ext.astype(np.int64)
        seq = ext + rng.integers(0, 5000, len(ext))
        n, b = int(ext.sum()), len(ext)
        seq_t, ext_t = torch.from_numpy(seq), torch.from_numpy(ext)
        rid = torch.from_numpy(rng.permutation(4 * b)[:b]).cuda()
        r2t = torch.zeros(4 * b, 8, dtype=torch.int32, device="cuda")
        mine = lambda: ours.CompressorPrefillPlan.generate_online(seq_t, ext_t, rid, r2t, n, False, 64)
        theirs = lambda: ref.plan_prefill(seq_t, ext_t, rid, r2t, n, False, 64)
        o, t = [], []
        for _ in range(5):
            o.append(host_us(mine, n=200, rounds=1, sync=sync))
            t.append(host_us(theirs, n=200, rounds=1, sync=sync))
        mo, mt = statistics.median(o), statistics.median(t)
        rows.append({"plan": "prefill", "case": name, "tokens": n, "pydsa host us": round(mo, 2),
                     "sglang host us": round(mt, 2), "P23 ratio (target <= 0.2)": round(mo / mt, 3)})
        print(rows[-1], flush=True)
    rows.append({"empty launch host us": round(host_vs_empty(lambda: None, n=1000, fetch_stream=True)[1], 2)})
    return rows


def sglang_layer_rows(ref, bs, rounds=5):
    """The sglang-shaped per-layer calls timed: a decode layer as sglang 0.5.23 makes it (compress_forward,
    then compress_norm_rope_store) through pydsa.sglang and through sglang's kernels, and pydsa.sglang's
    fused compress_forward_and_store; the same plan tensors and inputs (random lengths, fp32 state)."""
    from .. import sglang as ours
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(12)
    for b in bs:
        L = Layer(b, torch.float32, False, gen)
        plan = ours.CompressorDecodePlan.generate_online(L.seq64, L.rid, L.r2t)
        theirs = ref.plan_decode(L.seq64, L.rid, L.r2t)
        store = dict(norm_weight=L.w, norm_eps=1e-6, freq_cis=L.freq, out_loc=L.loc, kvcache=L.cache, page_size=PAGE)
        fwd = dict(head_dim=D, compress_ratio=128, is_online=True)
        cases = {
            "pydsa.sglang compress_forward + compress_norm_rope_store": [
                lambda: ours.compress_forward(L.state, L.kv, L.ape, plan, out=L.out, **fwd),
                lambda: ours.compress_norm_rope_store(L.out, plan, **store)],
            "pydsa.sglang compress_forward_and_store": [
                lambda: ours.compress_forward_and_store(L.state, L.kv, L.ape, plan, out=L.out, **store)],
            "sglang compress_forward + compress_norm_rope_store": [
                lambda: ref.compress_forward(L.state, L.kv, L.ape, theirs, out=L.out),
                lambda: ref.store(L.out, theirs, L.w, 1e-6, L.freq, L.loc, L.cache, PAGE)]}
        t = {k: [] for k in cases}
        for _ in range(rounds):
            for k, calls in cases.items():
                t[k].append(graph_us(calls) * len(calls))
        row = {"b": b, **{k + " us": round(statistics.median(x), 3) for k, x in t.items()}}
        rows.append(row)
        print(row, flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pydsa.bench.release", description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="where the rows go")
    ap.add_argument("--reference-build", required=True, help="a build of benchmarks/reference")
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--commit", help="the commit measured (where the checkout's git does not know it)")
    ap.add_argument("--only", choices=["store", "decode", "prefill", "verify", "commit", "step", "floor", "sglang-api", "planning", "offline",
                                       "v4-step", "c4-paths"],
                    help="one part")
    args = ap.parse_args(argv)
    ref = _load(args.reference_build)
    harness.GRAPH_BUSY_START = True
    rounds = 3 if args.quick else 5
    result = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "command": "python -m pydsa.bench.release " + " ".join(argv or sys.argv[1:]),
              "commit": args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                      text=True).stdout.strip(),
              "torch": torch.__version__, "pdl_default": pydsa._abi.PDL_DEFAULT}
    if args.only in (None, "sglang-api"):
        result["sglang_api_vs_sglang"] = compare_sglang_api(ref)
        print(result["sglang_api_vs_sglang"], flush=True)
        result["mtp_protocol_vs_sglang"] = compare_mtp_protocol(ref)
        print(result["mtp_protocol_vs_sglang"], flush=True)
        result["sglang_layer"] = sglang_layer_rows(ref, [1, 32, 256, 1024], rounds)
    if args.only in (None, "planning"):
        result["planning"] = planning_rows(ref)
    if args.only in (None, "store"):
        result["store_vs_sglang"] = compare_store(ref)
        print(result["store_vs_sglang"], flush=True)
    if args.only in (None, "decode"):
        result["decode"] = decode_rows(ref, [1, 32, 256, 1024], [torch.float32, torch.bfloat16], rounds)
    if args.only in (None, "prefill"):
        result["prefill"] = prefill_rows(ref, rounds)
    if args.only in (None, "verify"):
        result["verify"] = verify_rows(ref, [1, 32, 256, 1024], [torch.float32, torch.bfloat16], rounds)
    if args.only in (None, "commit"):
        result["commit"] = commit_rows(ref, [32, 256, 1024], [torch.float32, torch.bfloat16], rounds)
    if args.only in (None, "step"):
        result["model_step"] = model_step_rows(ref, [32, 256, 1024], [torch.float32, torch.bfloat16], rounds)
    if args.only in (None, "floor"):
        result["floor"] = floor_rows(bs=(32, 256, 1024, 8192), rounds=rounds)
    if args.only in (None, "offline"):
        result["offline_vs_online"] = offline.rows(ref, rounds, PREFILL_CASES)
    if args.only == "v4-step":  # P31, P35 (pydsa/bench/v4_step.py): on request only
        result["v4_step"] = v4_step.rows(ref, rounds)
        result["v4_step"]["rows"] += c4_paths.path_rows(ref, rounds)
    if args.only == "c4-paths":  # P35 alone (the plugin's route and each drop-in c4 call), for a quick A/B
        result["v4_step"] = {"rows": c4_paths.path_rows(ref, rounds)}
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
