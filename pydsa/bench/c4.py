"""pydsa's c4 layer beside sglang 0.5.23's own c4 kernels, in one process, same inputs, same plans (H200).

    python -m pydsa.bench.c4 results.json --reference-build OUT

Checks first (sglang's plans read in place by pydsa): ring rows written bit for bit, compressed vectors
within fp32 rounding, main cache bytes equal but for one-step fp8 flips, indexer codes within one fp8 step
and scales within 1e-6; decode and a chunked prefill with prefixes, fp32 and bf16 ring. Then times, CUDA
graphs, median of interleaved rounds, PDL as each side ships it:
- P28: one c4 layer's decode (both compressors, both stores; sglang: compress + store twice, 4 launches;
  the per-step plan excluded on both sides), B = 1, 32, 256, 1024, random lengths and every row closing.
- P29: one c4 layer's extend + stores (sglang's host plan, read in place by pydsa): 1 x 128, 8 x 1K with
  prefixes, 1 x 8K, 64 x (1-600) with prefixes; a target verify of V = 3 and 7 drafts at B = 32 and 256
  (sglang: its device plan, excluded, and its six launches; pydsa: c4_verify over a request-scoped ring of
  16 rows, two launches, no plan).
- P30: a model-like step, 30 c4 layers each with its own rings and caches (L2-cold), one graph, beside the
  bytes' floor at copy bandwidth; the per-step plan (sglang's kernel, which both sides read) timed apart, eager.
- P32: the per-step plan itself, CUDA graphs: pydsa.sglang's planners (the c4 plan op) beside sglang's plan
  kernels, records checked equal first; the decode plan at B = 1, 32, 256, 1024 (random lengths) and a target
  verify's extend plan from device lengths (V = 4, ring of 16) at the same B.
- parts (not in the default run): pydsa's decode with parts removed, beside an empty launch.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys

import numpy as np
import torch

import pydsa
from pydsa.sglang import c4 as sglang_c4

from .harness import copy_bandwidth_tbps, event_us, graph_us_beside_empty, median_graph_us
from .reference import load

SWA_PAGE = 256
DIMS = (512, 128)


class Context:
    """B requests in sglang's paged layout (identity full-to-SWA map, each request its own pages), both
    compressors' rings (R rows per SWA page) and caches, the rotary table, and pydsa's views of them."""

    def __init__(self, b, max_len, ring_size=8, bf16=False, seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        dev = "cuda"
        self.b, self.R = b, ring_size
        per = -(-max_len // SWA_PAGE) * SWA_PAGE
        self.per = per
        self.rpi = torch.arange(b, dtype=torch.int64, device=dev)
        self.r2t = torch.arange(b * per, dtype=torch.int32, device=dev).reshape(b, per)
        self.f2s = torch.arange(b * per + SWA_PAGE, dtype=torch.int64, device=dev)
        rows = (b * per // SWA_PAGE + 2) * ring_size
        dtype = torch.bfloat16 if bf16 else torch.float32
        self.freqs_cis = torch.polar(torch.ones(max_len + 8, 32, device=dev),
                                     torch.rand(max_len + 8, 32, device=dev, generator=g) * 6.28)
        rotary = torch.view_as_real(self.freqs_cis).flatten(-2).contiguous()
        pages = b * per // SWA_PAGE + 2
        self.rings, self.apes, self.weights, self.caches, self.ours = [], [], [], [], []
        for k, d in enumerate(DIMS):
            ring = (torch.randn(rows, 4 * d, device=dev, generator=g)).to(dtype)
            ape = torch.randn(8, d, device=dev, generator=g) * 0.5
            w = torch.rand(d, device=dev, generator=g) + 0.5
            page = pydsa.kv_page_bytes(d, 64) if k == 0 else pydsa.indexer_page_bytes(d, 64)
            cache = torch.zeros(pages, page, dtype=torch.uint8, device=dev)
            kv_cache = pydsa.KVCache(cache, w, rotary, page_size=64, eps=1e-6, layout="v4" if k == 0 else "indexer")
            self.rings.append(ring), self.apes.append(ape), self.weights.append(w), self.caches.append(cache)
            self.ours.append(pydsa.C4Compressor(ring, ape, store=kv_cache))
        self.gen = g

    def clone_state(self):
        return [r.clone() for r in self.rings], [c.clone() for c in self.caches]

    def restore(self, state):
        for r, s in zip(self.rings, state[0]):
            r.copy_(s)
        for c, s in zip(self.caches, state[1]):
            c.copy_(s)

    def inputs(self, n):
        return [torch.randn(n, 4 * d, device="cuda", generator=self.gen) for d in DIMS]

    def out_loc(self, rows_seq, rows_req):
        """sglang's c4_out_loc per row: the closing token's full-pool slot // 4 (0 where none closes)."""
        loc = (rows_req * self.per + rows_seq - 1) // 4
        return torch.where(rows_seq % 4 == 0, loc, torch.zeros_like(loc))


def sglang_layer(ref, ctx, kv, plan, out_loc):
    """sglang 0.5.23's c4 layer: compress + store, main then indexer (4 launches)."""
    outs = []
    for k, d in enumerate(DIMS):
        out = ref.compress_forward_c4(ctx.rings[k], kv[k], ctx.apes[k], plan, d)
        ref.store(out, plan, ctx.weights[k], 1e-6, ctx.freqs_cis, out_loc, ctx.caches[k], 64)
        outs.append(out)
    return outs


def pydsa_decode(ctx, kv, records, out_loc, outs=(None, None)):
    pydsa.c4_decode(ctx.ours[0], kv[0], indexer=ctx.ours[1], indexer_kv_score=kv[1], records=records,
                    cache_slots=out_loc, out=outs[0], indexer_out=outs[1])


def pydsa_extend(ctx, kv, plan, out_loc, outs=(None, None)):
    pydsa.c4_extend(ctx.ours[0], kv[0], (plan.plan_c, plan.plan_w), indexer=ctx.ours[1], indexer_kv_score=kv[1],
                    cache_slots=out_loc, out=outs[0], indexer_out=outs[1])


def _fp8_steps(a, b):
    """Largest distance in e4m3 codes between two code arrays of one sign (different signs: a large number)."""
    a, b = a.to(torch.int32), b.to(torch.int32)
    same = (a & 0x80) == (b & 0x80)
    d = torch.where(same, (a & 0x7F) - (b & 0x7F), torch.full_like(a, 255))
    return int(d.abs().max().item()) if d.numel() else 0


def compare(ref, ctx, run_ours, run_theirs, out_rows) -> dict:
    """Runs both sides from the same state; what differs."""
    start = ctx.clone_state()
    theirs = run_theirs()
    torch.cuda.synchronize()
    their_state = ctx.clone_state()
    ctx.restore(start)
    ours = [torch.full((out_rows, d), float("nan"), device="cuda") for d in DIMS]
    run_ours(ours)
    torch.cuda.synchronize()
    res = {}
    for k, d in enumerate(DIMS):
        rows_equal = torch.equal(ctx.rings[k].view(torch.int16 if ctx.rings[k].dtype == torch.bfloat16 else
                                                   torch.int32),
                                 their_state[0][k].view(torch.int16 if ctx.rings[k].dtype == torch.bfloat16 else
                                                        torch.int32))
        t, o = theirs[k], ours[k]
        mask = ~torch.isnan(o[:, 0])
        rel = float(((o[mask] - t[mask]).norm(dim=1) / t[mask].norm(dim=1).clamp_min(1e-30)).max().item()) \
            if mask.any() else 0.0
        mine, other = ctx.caches[k], their_state[1][k]
        if k == 0:
            differ = int((mine != other).sum().item())
            res["main_cache_bytes_differing"] = differ
            res["main_cache_fp8_steps"] = _fp8_steps(mine, other)
        else:
            codes_m, codes_o = mine[:, :64 * 128], other[:, :64 * 128]
            sc_m = mine[:, 64 * 128:].contiguous().view(torch.float32)
            sc_o = other[:, 64 * 128:].contiguous().view(torch.float32)
            res["indexer_code_steps"] = _fp8_steps(codes_m, codes_o)
            nz = sc_o != 0
            res["indexer_scale_rel"] = float(((sc_m[nz] - sc_o[nz]).abs() / sc_o[nz]).max().item()) if nz.any() else 0.0
        res[f"ring_{d}_bit_equal"] = bool(rows_equal)
        res[f"out_{d}_max_rel"] = rel
        res[f"out_{d}_rows"] = int(mask.sum().item())
    return res


def lengths(b, closing, max_len=1024, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    seq = torch.randint(1, max_len // 4, (b,), device="cuda", generator=g) * 4 if closing else \
        torch.randint(1, max_len, (b,), device="cuda", generator=g)
    if b == 1 and not closing:
        seq[0] = 4 * (max_len // 8) + 1
    return seq


def decode_case(ref, b, closing, bf16, max_len=1024, seed=0, seq=None):
    ctx = Context(b, max_len, bf16=bf16, seed=seed)
    seq = lengths(b, closing, max_len, seed) if seq is None else seq
    plan = ref.plan_decode_c4(ctx.rpi, ctx.r2t, ctx.f2s, seq.to(torch.int64), ctx.R)
    out_loc = ctx.out_loc(seq.to(torch.int64), ctx.rpi)
    kv = ctx.inputs(b)
    return ctx, plan, out_loc, kv


def check_decode(ref, b, closing, bf16):
    ctx, plan, out_loc, kv = decode_case(ref, b, closing, bf16, seed=b + closing)
    seq = torch.from_numpy(plan.plan_d.cpu().view(torch.int32).reshape(-1, 4)[:, 0].numpy().astype(np.int64)).cuda()
    ours = sglang_c4.plan_decode(ctx.rpi, ctx.r2t, ctx.f2s, seq, SWA_PAGE, ctx.R)
    r = compare(ref, ctx, lambda outs: pydsa_decode(ctx, kv, plan.plan_d, out_loc, outs),
                lambda: sglang_layer(ref, ctx, kv, plan, out_loc), b)
    return dict(check="decode", b=b, lengths="closing" if closing else "random", state="bf16" if bf16 else "fp32",
                plan_bytes_equal=bool(torch.equal(ours, plan.plan_d)), **r)


def extend_case(ref, seqs, exts, bf16, seed=0, ring_size=8):
    max_len = max(seqs) + 4
    ctx = Context(len(seqs), max_len, ring_size=ring_size, bf16=bf16, seed=seed)
    n = int(sum(exts))
    seq_cpu, ext_cpu = torch.tensor(seqs, dtype=torch.int64), torch.tensor(exts, dtype=torch.int64)
    plan = ref.plan_prefill_c4(ctx.rpi, seq_cpu, ext_cpu, ctx.r2t, ctx.f2s, ctx.R, n)
    rows_req = torch.repeat_interleave(ctx.rpi, ext_cpu.cuda())
    starts = (seq_cpu - ext_cpu).cuda()
    pos = torch.cat([torch.arange(int(s), int(s) + int(e), device="cuda") for s, e in zip(starts.tolist(), exts)])
    out_loc = ctx.out_loc(pos + 1, rows_req)
    kv = ctx.inputs(n)
    return ctx, plan, out_loc, kv


def _by_ragged(plan_c, plan_w):
    c = plan_c.cpu().view(torch.int32).reshape(-1, 4).tolist()
    w = plan_w.cpu().view(torch.int32).reshape(-1, 2).tolist()
    return sorted(tuple(r) for r in c if r[0] != -1), sorted(tuple(r) for r in w if r[0] != -1)


def check_extend(ref, name, seqs, exts, bf16, ring_size=8):
    ctx, plan, out_loc, kv = extend_case(ref, seqs, exts, bf16, seed=len(seqs), ring_size=ring_size)
    rows = plan.plan_c.shape[0]
    seq_cpu, ext_cpu, n = torch.tensor(seqs), torch.tensor(exts), int(sum(exts))
    ours = sglang_c4.plan_prefill(ctx.rpi, seq_cpu, ext_cpu, ctx.r2t, ctx.f2s, SWA_PAGE, ctx.R, n)
    host_equal = torch.equal(ours[0], plan.plan_c) and torch.equal(ours[1], plan.plan_w)
    dev_ours = sglang_c4.plan_prefill(ctx.rpi, seq_cpu.cuda(), ext_cpu.cuda(), ctx.r2t, ctx.f2s, SWA_PAGE, ctx.R, n,
                                      use_cuda_graph=True)
    dev_theirs = ref.plan_prefill_c4(ctx.rpi, seq_cpu.cuda(), ext_cpu.cuda(), ctx.r2t, ctx.f2s, ctx.R, n, True)
    device_equal = _by_ragged(*dev_ours) == _by_ragged(dev_theirs.plan_c, dev_theirs.plan_w)
    r = compare(ref, ctx, lambda outs: pydsa_extend(ctx, kv, plan, out_loc, outs),
                lambda: sglang_layer(ref, ctx, kv, plan, out_loc), rows)
    return dict(check="extend", case=name, state="bf16" if bf16 else "fp32", ring_size=ring_size,
                host_plan_bytes_equal=bool(host_equal), device_plan_records_equal=bool(device_equal), **r)


EXTEND_CASES = {
    "1x128": ([128], [128]),
    "8x1K+prefix": ([1024 + 37 * i for i in range(8)], [1024] * 8),
    "1x8K": ([8192], [8192]),
    "64x(1-600)+prefix": (None, None),
}


def ragged_case(rng):
    ext = rng.integers(1, 601, 64)
    pre = rng.integers(0, 300, 64)
    return (pre + ext).tolist(), ext.tolist()


def decode_rows(ref, rounds):
    rows = []
    for bf16 in (False, True):
        for b in (1, 32, 256, 1024):
            for closing in (False, True):
                ctx, plan, out_loc, kv = decode_case(ref, b, closing, bf16, seed=7 * b + closing)
                cases = {"sglang": [lambda: sglang_layer(ref, ctx, kv, plan, out_loc)],
                         "pydsa": [lambda: pydsa_decode(ctx, kv, plan.plan_d, out_loc)]}
                t = median_graph_us(cases, rounds)
                rows.append({"key": "P28 layer speedup", "b": b, "lengths": "closing" if closing else "random",
                             "state": "bf16" if bf16 else "fp32", "sglang_us": t["sglang"], "pydsa_us": t["pydsa"],
                             "speedup": t["sglang"] / t["pydsa"]})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def extend_rows(ref, rounds):
    rows = []
    rng = np.random.default_rng(3)
    for name, (seqs, exts) in EXTEND_CASES.items():
        if seqs is None:
            seqs, exts = ragged_case(rng)
        ctx, plan, out_loc, kv = extend_case(ref, seqs, exts, False, seed=11)
        cases = {"sglang": [lambda: sglang_layer(ref, ctx, kv, plan, out_loc)],
                 "pydsa": [lambda: pydsa_extend(ctx, kv, plan, out_loc)]}
        t = median_graph_us(cases, rounds)
        rows.append({"key": "P29 speedup", "case": name, "lengths": "given", "state": "fp32",
                     "sglang_us": t["sglang"], "pydsa_us": t["pydsa"], "speedup": t["sglang"] / t["pydsa"]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def verify_rows(ref, rounds, ring_size=16):
    """P29's verify rows: V drafts per request, fp32 ring; sglang's device plan made once, outside the graph."""
    rows = []
    for b in (32, 256):
        for v in (3, 7):
            seq = torch.randint(8, 1000, (b,), device="cuda", generator=torch.Generator(device="cuda").manual_seed(b))
            ctx = Context(b, 1024 + v, ring_size=ring_size, seed=b + v)
            ext = torch.full((b,), v, dtype=torch.int64, device="cuda")
            plan = ref.plan_prefill_c4(ctx.rpi, seq + v, ext, ctx.r2t, ctx.f2s, ring_size, b * v, True)
            rows_req = torch.repeat_interleave(ctx.rpi, v)
            pos = (seq.repeat_interleave(v) + torch.arange(v, device="cuda").repeat(b))
            out_loc = ctx.out_loc(pos + 1, rows_req)
            kv = ctx.inputs(b * v)
            ours = [pydsa.C4Compressor(torch.randn(b * ring_size, 4 * d, device="cuda"), ctx.apes[k],
                                       store=ctx.ours[k].store, ring_size=ring_size) for k, d in enumerate(DIMS)]
            seq32, slots = seq.to(torch.int32), torch.arange(b, dtype=torch.int32, device="cuda")

            def mine():
                pydsa.c4_verify(ours[0], kv[0], seq32, slots, num_drafts=v, indexer=ours[1],
                                indexer_drafts=kv[1], cache_slots=out_loc)
            t = median_graph_us({"sglang": [lambda: sglang_layer(ref, ctx, kv, plan, out_loc)], "pydsa": [mine]},
                                rounds)
            rows.append({"key": "P29 speedup", "case": f"verify V={v}", "b": b, "lengths": "random", "state": "fp32",
                         "sglang_us": t["sglang"], "pydsa_us": t["pydsa"], "speedup": t["sglang"] / t["pydsa"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _plan_tables(b, max_len):
    """sglang's paged tables alone (Context's, without rings or caches): rpi, req_to_token, full_to_swa."""
    per = -(-max_len // SWA_PAGE) * SWA_PAGE
    rpi = torch.arange(b, dtype=torch.int64, device="cuda")
    r2t = torch.arange(b * per, dtype=torch.int32, device="cuda").reshape(b, per)
    return rpi, r2t, torch.arange(b * per + SWA_PAGE, dtype=torch.int64, device="cuda")


def plan_rows(ref, rounds, verify_drafts=4):
    """P32: one step's plan, CUDA-graph replays, pydsa.sglang's planner (one launch of the c4 plan op) beside
    sglang's plan kernel (the decode: one launch; the device-length extend: two), records checked first (the
    extend's by ragged row: sglang's order depends on its atomics)."""
    rows = []
    for b in (1, 32, 256, 1024):
        rpi, r2t, f2s = _plan_tables(b, 1024 + verify_drafts)
        seq = lengths(b, False, seed=b).to(torch.int64)
        ext = torch.full((b,), verify_drafts, dtype=torch.int64, device="cuda")
        seq_v, n = seq + verify_drafts, b * verify_drafts
        plans = {
            "decode": (lambda: sglang_c4.plan_decode(rpi, r2t, f2s, seq, SWA_PAGE, 8),
                       lambda: ref.plan_decode_c4(rpi, r2t, f2s, seq, 8)),
            f"verify V={verify_drafts}": (
                lambda: sglang_c4.plan_prefill(rpi, seq_v, ext, r2t, f2s, SWA_PAGE, 16, n, use_cuda_graph=True),
                lambda: ref.plan_prefill_c4(rpi, seq_v, ext, r2t, f2s, 16, n, True)),
        }
        for plan, (ours, theirs) in plans.items():
            mine, other = ours(), theirs()
            equal = torch.equal(mine, other.plan_d) if plan == "decode" else \
                _by_ragged(*mine) == _by_ragged(other.plan_c, other.plan_w)
            t = median_graph_us({"sglang": [theirs], "pydsa": [ours]}, rounds)
            rows.append({"key": "P32 plan speedup", "b": b, "plan": plan, "lengths": "random",
                         "records_equal": bool(equal), "sglang_us": t["sglang"], "pydsa_us": t["pydsa"],
                         "speedup": t["sglang"] / t["pydsa"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _step_bytes(b_closing, b, state_bytes=4):
    """Bytes a c4 decode step of one layer must move (both compressors): every row's input read and ring row
    written; a closing row's 7 earlier half-row pairs (kv and score) read and its two cache entries written."""
    total = 0
    for d, entry in ((512, 584), (128, 132)):
        total += b * (4 * d * 4 + 4 * d * state_bytes) + b_closing * (7 * 2 * d * state_bytes + entry)
    return total


def step_rows(ref, rounds, layers=30):
    """P30: 30 layers back to back, each its own rings and caches; the plan apart."""
    rows = []
    copy_tbps = copy_bandwidth_tbps()
    for b in (32, 256, 1024):
        for closing in (False, True):
            seq = lengths(b, closing, seed=b)
            cases = [decode_case(ref, b, closing, False, seed=1000 + layer, seq=seq) for layer in range(layers)]

            def theirs():
                for ctx, plan, out_loc, kv in cases:
                    sglang_layer(ref, ctx, kv, plan, out_loc)

            def mine():
                for ctx, plan, out_loc, kv in cases:
                    pydsa_decode(ctx, kv, plan.plan_d, out_loc)
            t = median_graph_us({"sglang": [theirs], "pydsa": [mine]}, rounds)
            ctx0 = cases[0][0]
            seq64 = seq.to(torch.int64)
            # the step's plan, shared by every layer: sglang's kernel on both sides (the plugin keeps it); pydsa's
            # planner of the same records (the c4 plan op) timed for reference, eager as sglang's (P32: in graphs)
            plan_theirs = event_us(lambda: ref.plan_decode_c4(ctx0.rpi, ctx0.r2t, ctx0.f2s, seq64, ctx0.R))
            plan_ours = event_us(lambda: sglang_c4.plan_decode(ctx0.rpi, ctx0.r2t, ctx0.f2s, seq64, SWA_PAGE, ctx0.R))
            nclose = int((seq % 4 == 0).sum())
            floor = layers * _step_bytes(nclose, b) / (copy_tbps * 1e12) * 1e6
            rows.append({"key": "P30 step speedup", "b": b, "lengths": "closing" if closing else "random",
                         "state": "fp32", "layers": layers, "sglang_us": t["sglang"], "pydsa_us": t["pydsa"],
                         "speedup": t["sglang"] / t["pydsa"], "floor_us": floor, "pydsa_over_floor": t["pydsa"] / floor,
                         "sglang_plan_us": plan_theirs, "pydsa_planner_us": plan_ours,
                         "speedup_with_sglang_plan": (t["sglang"] + plan_theirs) / (t["pydsa"] + plan_theirs)})
            print(json.dumps(rows[-1]), flush=True)
            cases.clear()
            torch.cuda.empty_cache()
    return rows


def parts_rows(ref, rounds):
    """Where a decode's time goes: one layer's decode (fp32, B = 1 / 32 / 1024, random lengths and every row
    closing) with parts removed (both compressors and stores, both without stores, each compressor with its
    store alone), each beside an empty launch measured in turn (latency-bound rows are read above it)."""
    rows = []
    for b in (1, 32, 1024):
        for closing in (False, True):
            ctx = Context(b, 1024, seed=3 * b + closing)
            seq = lengths(b, closing, 1024, seed=b).to(torch.int64)
            rec = sglang_c4.plan_decode(ctx.rpi, ctx.r2t, ctx.f2s, seq, SWA_PAGE, ctx.R)
            loc = ctx.out_loc(seq, ctx.rpi)
            kv = ctx.inputs(b)
            bare = [pydsa.C4Compressor(ctx.rings[k], ctx.apes[k]) for k in range(2)]
            forms = {
                "both+stores": lambda: pydsa.c4_decode(ctx.ours[0], kv[0], indexer=ctx.ours[1], indexer_kv_score=kv[1],
                                                       records=rec, cache_slots=loc),
                "both, no store": lambda: pydsa.c4_decode(bare[0], kv[0], indexer=bare[1], indexer_kv_score=kv[1],
                                                          records=rec),
                "main+store": lambda: pydsa.c4_decode(ctx.ours[0], kv[0], records=rec, cache_slots=loc),
                "indexer+store": lambda: pydsa.c4_decode(ctx.ours[1], kv[1], records=rec, cache_slots=loc),
            }
            for what, fn in forms.items():
                t, empty = graph_us_beside_empty([fn], rounds)
                rows.append({"key": "c4 decode parts", "b": b, "lengths": "closing" if closing else "random",
                             "state": "fp32", "what": what, "pydsa_us": t, "empty_us": empty, "above_empty_us": t - empty})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pydsa.bench.c4", description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--reference-build", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", nargs="+", choices=("checks", "decode", "extend", "verify", "plan", "step", "parts"),
                    default=["checks", "decode", "extend", "verify", "plan", "step"])
    args = ap.parse_args(argv)
    ref = load(args.reference_build)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"gpu": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "commit": commit, "command": " ".join(["python -m pydsa.bench.c4"] + (argv or sys.argv[1:])),
              "copy_tbps": copy_bandwidth_tbps(), "checks": [], "rows": []}

    def save():  # after every part: a run cut short keeps what it measured
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    checks = result["checks"]
    for bf16 in (False, True) if "checks" in args.only else ():
        for b in (1, 37, 256):
            for closing in (False, True):
                checks.append(check_decode(ref, b, closing, bf16))
                print(json.dumps(checks[-1]), flush=True)
        rng = np.random.default_rng(5)
        for name, (seqs, exts) in EXTEND_CASES.items():
            if name == "1x8K":
                continue
            if seqs is None:
                seqs, exts = ragged_case(rng)
            checks.append(check_extend(ref, name, seqs, exts, bf16))
            print(json.dumps(checks[-1]), flush=True)
        checks.append(check_extend(ref, "8x1K+prefix R=16", EXTEND_CASES["8x1K+prefix"][0], [1024] * 8, bf16, 16))
        print(json.dumps(checks[-1]), flush=True)
    save()
    parts = dict(decode=decode_rows, extend=extend_rows, verify=verify_rows, plan=plan_rows, step=step_rows,
                 parts=parts_rows)
    for name, run in parts.items():
        if name in args.only:
            result["rows"] += run(ref, args.rounds)
            save()


if __name__ == "__main__":
    main()
