"""The decode path's rows of the release bench: the decode and the fused layer (P18, P24) on one layer's
buffers, the 30-layer step (P27, L2-cold) and the floors (P25, each op against a copy kernel of its bytes,
L2-cold). `pydsa.bench.release` runs them beside sglang 0.5.23's kernels."""
from __future__ import annotations

import statistics

import numpy as np
import torch

import pydsa
import pyplan
from .harness import graph_us, median_graph_us

D = 512
PAGE = 2
LAYERS = 30


def _rotary(positions, gen):
    angles = torch.rand(positions, 32, generator=gen, device="cuda") * 6.3
    return torch.polar(torch.ones_like(angles), angles)  # complex64 [P, 32], as sglang's freq_cis


class Layer:
    """One c128 layer's buffers (state, ape, norm, cache) for B requests; pydsa and sglang views."""

    def __init__(self, b, dtype, closing, gen):
        self.b = b
        self.state = (torch.randn(b + 1, 1, 3 * D, device="cuda", generator=gen) * 0.1).to(dtype)
        self.state[:, :, D:2 * D] = 3.0
        self.ape = torch.randn(128, D, device="cuda", generator=gen)
        self.kv = torch.randn(b, 2 * D, device="cuda", generator=gen)
        self.out = torch.empty(b, D, device="cuda")
        seq = torch.randint(200, 4000, (b,), device="cuda", generator=gen)
        if closing:
            seq = (seq // 128 + 1) * 128
        self.seq64 = seq.to(torch.int64)
        self.seq = seq.to(torch.int32)
        self.idx = torch.arange(b, dtype=torch.int32, device="cuda")
        self.rid = self.idx.to(torch.int64)
        self.loc = torch.arange(b, dtype=torch.int64, device="cuda")
        self.cache = torch.zeros((b + 1) // 2 + 1, 1728, dtype=torch.uint8, device="cuda")
        self.w = torch.rand(D, device="cuda", generator=gen) + 0.5
        self.freq = _rotary(4096 + 128, gen)
        self.store = pydsa.KVCache(self.cache, self.w, self.freq, page_size=PAGE, eps=1e-6)
        self.r2t = torch.zeros(b, 8, dtype=torch.int32, device="cuda")


class PrefillCase:
    """One prefill case's buffers (state, inputs, cache, pyplan's plan) for pydsa and sglang: `case` is
    (seq_lens, extend_lens), or None for 64 requests of 1-600 new tokens behind random prefixes."""

    def __init__(self, case, rng, gen):
        if case is None:
            ext = rng.integers(1, 601, 64)
            seq = ext + rng.integers(0, 100_000, 64)
        else:
            seq, ext = np.array(case[0]), np.array(case[1])
        self.seq, self.ext = seq.astype(np.int64), ext.astype(np.int64)
        self.n, self.b = n, b = int(self.ext.sum()), len(seq)
        self.state = torch.randn(b, 1, 3 * D, device="cuda", generator=gen)
        self.state[:, :, D:2 * D] = 3.0
        self.kv = torch.randn(n, 2 * D, device="cuda", generator=gen)
        self.ape = torch.randn(128, D, device="cuda", generator=gen)
        self.idx = torch.arange(b, dtype=torch.int32, device="cuda")
        self.rid = self.idx.to(torch.int64)
        self.r2t = torch.zeros(b, 8, dtype=torch.int32, device="cuda")
        self.loc = torch.randperm(n, device="cuda", generator=gen).to(torch.int64)
        self.cache = torch.zeros(n // 2 + 1, 1728, dtype=torch.uint8, device="cuda")
        self.w = torch.rand(D, device="cuda", generator=gen) + 0.5
        self.freq = _rotary(int(self.seq.max()) + 128, gen)
        self.store = pydsa.KVCache(self.cache, self.w, self.freq, page_size=PAGE, eps=1e-6)
        self.plan = pyplan.plan_prefill(self.seq, self.ext)

    @staticmethod
    def fits_sglang(case) -> bool:
        """sglang's records hold 16-bit ragged rows: at most 65535 tokens."""
        return case is None or sum(case[1]) < 65536


def p24_target(b, closing) -> float:
    """P24: the fused decode + store against sglang's decode + store kernels (docs/performance.md)."""
    return 1.65 if b == 1 else (1.75 if closing else 1.9) if b == 32 else 1.6 if b == 256 else 1.5


def decode_rows(ref, bs, dtypes, rounds=5):
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for dtype in dtypes:
        for closing in (False, True):
            for b in bs:
                L = Layer(b, dtype, closing, gen)
                plan = ref.plan_decode(L.seq64, L.rid, L.r2t)
                ours = pydsa.C128Decode(L.state, L.kv, L.out, L.ape, L.idx, L.seq)
                # the same plan tensor sglang's decode reads, read in place
                records = pydsa.C128Decode(L.state, L.kv, L.out, L.ape, plan.plan_d, None)
                fused = pydsa.C128Decode(L.state, L.kv, None, L.ape, L.idx, L.seq, store=L.store, cache_slots=L.loc)
                sg_dec = lambda: ref.compress_forward(L.state, L.kv, L.ape, plan, out=L.out)
                sg_store = lambda: ref.store(L.out, plan, L.w, 1e-6, L.freq, L.loc, L.cache, PAGE)
                cases = {"pydsa decode": [ours.launch], "pydsa decode (sglang's records)": [records.launch],
                         "sglang decode": [sg_dec],
                         "pydsa decode+store fused": [fused.launch], "sglang decode + store": [sg_dec, sg_store],
                         "sglang store": [sg_store]}
                m = median_graph_us(cases, rounds)
                row = {"b": b, "state": str(dtype).replace("torch.", ""), "lengths": "closing" if closing else "random",
                       **{k + " us": round(v, 3) for k, v in m.items()},
                       "P18 decode speedup": round(m["sglang decode"] / m["pydsa decode"], 3),
                       "P18 decode speedup (records)": round(m["sglang decode"] / m["pydsa decode (sglang's records)"], 3),
                       "P24 layer speedup": round(m["sglang decode + store"] / m["pydsa decode+store fused"], 3),
                       "P24 target": p24_target(b, closing)}
                rows.append(row)
                print(row, flush=True)
    return rows


def model_step_rows(ref, bs, dtypes, rounds=5):
    """P27: a model-like decode step, 30 layers, each its own state and cache (L2-cold across layers), each
    after a producer (a bf16 matmul), in one graph: the compressor's share (step - producers alone). P27b: the
    same 30 layers back to back in one graph, no producers between them (each layer's launch follows the
    previous layer's, so how early a kernel releases and how fast it drains decide the step)."""
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(2)
    a = torch.randn(256, 7168, device="cuda", dtype=torch.bfloat16)
    wm = torch.randn(7168, 1024, device="cuda", dtype=torch.bfloat16)
    res = torch.empty(256, 1024, device="cuda", dtype=torch.bfloat16)
    producer = lambda: torch.matmul(a, wm, out=res)
    for dtype in dtypes:
        for closing in (False, True):
            for b in bs:
                layers = [Layer(b, dtype, closing, gen) for _ in range(LAYERS)]
                ours = [pydsa.C128Decode(L.state, L.kv, None, L.ape, L.idx, L.seq, store=L.store, cache_slots=L.loc)
                        for L in layers]

                def step_ours():
                    for op in ours:
                        producer()
                        op.launch()

                def step_sglang():
                    p = ref.plan_decode(layers[0].seq64, layers[0].rid, layers[0].r2t)
                    for L in layers:
                        producer()
                        ref.compress_forward(L.state, L.kv, L.ape, p, out=L.out)
                        ref.store(L.out, p, L.w, 1e-6, L.freq, L.loc, L.cache, PAGE)

                def producers():
                    for _ in layers:
                        producer()

                def back_to_back_ours():
                    for op in ours:
                        op.launch()

                def back_to_back_sglang():
                    p = ref.plan_decode(layers[0].seq64, layers[0].rid, layers[0].r2t)
                    for L in layers:
                        ref.compress_forward(L.state, L.kv, L.ape, p, out=L.out)
                        ref.store(L.out, p, L.w, 1e-6, L.freq, L.loc, L.cache, PAGE)

                t = {"producers": [], "pydsa": [], "sglang": [], "pydsa b2b": [], "sglang b2b": []}
                for _ in range(rounds):
                    t["producers"].append(graph_us([producers]))
                    t["pydsa"].append(graph_us([step_ours]))
                    t["sglang"].append(graph_us([step_sglang]))
                    t["pydsa b2b"].append(graph_us([back_to_back_ours]))
                    t["sglang b2b"].append(graph_us([back_to_back_sglang]))
                m = {k: statistics.median(v) for k, v in t.items()}
                share_o, share_s = m["pydsa"] - m["producers"], m["sglang"] - m["producers"]
                row = {"b": b, "state": str(dtype).replace("torch.", ""), "lengths": "closing" if closing else "random",
                       "producers us": round(m["producers"], 2), "pydsa step us": round(m["pydsa"], 2),
                       "sglang step us": round(m["sglang"], 2), "pydsa compressor share us": round(share_o, 2),
                       "sglang compressor share us": round(share_s, 2),
                       "P27 step speedup": round(share_s / share_o, 3) if share_o > 0 else None, "P27 target": 1.6,
                       "pydsa back-to-back step us": round(m["pydsa b2b"], 2),
                       "sglang back-to-back step us": round(m["sglang b2b"], 2),
                       "P27b step speedup": round(m["sglang b2b"] / m["pydsa b2b"], 3)}
                rows.append(row)
                print(row, flush=True)
                del layers, ours
    return rows


def floor_rows(bs=(1024, 8192), dtypes=(torch.float32, torch.bfloat16), rounds=5, v=8):
    """P25: each decode-path op against a copy of its bytes (reads + writes), both L2-cold: every call in
    a graph works on its own buffers (as many sets as cover three L2s), the copy likewise."""
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(4)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for dtype in dtypes:
        sb = torch.finfo(dtype).bits // 8
        for b in bs:
            def layer_bytes(closing_rows, writes_state):
                # in: token (kv, score) and state; out: the state of the rows that do not close, a cache
                # entry (584 B) or an fp32 vector of those that do; the ape table (read once) beside
                per_row = 2 * D * 4 + 3 * D * sb
                closes = closing_rows * (584 if writes_state == "store" else D * 4)
                return b * per_row + (b - closing_rows) * 3 * D * sb + closes + 128 * D * 4

            def timed(make, nbytes):
                n = max(2, min(12, -(-3 * l2 // nbytes)))
                ops = [make() for _ in range(n)]
                # a copy kernel (an elementwise fp32 kernel, 16-byte accesses; a graph's memcpy node runs
                # on the copy engine, measured 2.6 TB/s here): half the bytes read, half written
                half = nbytes // 8
                pairs = [(torch.randn(half, device="cuda", generator=gen), torch.empty(half, device="cuda"))
                         for _ in range(n)]
                copies = [lambda s=s_, d=d_: torch.mul(s, 1.0, out=d) for s_, d_ in pairs]
                t, c = [], []
                for _ in range(rounds):
                    t.append(graph_us(ops))
                    c.append(graph_us(copies))
                del ops, pairs
                return statistics.median(t), statistics.median(c)

            def decode(store):
                L = Layer(b, dtype, False, gen)
                if store:
                    return pydsa.C128Decode(L.state, L.kv, None, L.ape, L.idx, L.seq, store=L.store,
                                            cache_slots=L.loc).launch
                return pydsa.C128Decode(L.state, L.kv, L.out, L.ape, L.idx, L.seq).launch

            closing_rows = int(((torch.randint(200, 4000, (b,)) - 1) % 128 == 127).sum())  # about b / 128
            cases = {"decode": (lambda: decode(False), layer_bytes(closing_rows, "out")),
                     "fused decode + store": (lambda: decode(True), layer_bytes(closing_rows, "store"))}
            if b * v * 2 * D * 4 * 3 < 8 << 30:
                def verify():
                    state = (torch.randn(b * (v + 1), 1, 3 * D, device="cuda", generator=gen) * 0.1).to(dtype)
                    drafts = torch.randn(b * v, 2 * D, device="cuda", generator=gen)
                    ape = torch.randn(128, D, device="cuda", generator=gen)
                    idx = torch.arange(b, dtype=torch.int32, device="cuda")
                    seq = torch.randint(1, 4000, (b,), dtype=torch.int32, device="cuda", generator=gen)
                    cache = torch.zeros(b * v // 2 + 1, 1728, dtype=torch.uint8, device="cuda")
                    store = pydsa.KVCache(cache, torch.rand(D, device="cuda", generator=gen) + 0.5,
                                          _rotary(4096 + 128, gen), page_size=PAGE, eps=1e-6)
                    loc = torch.arange(b * v, dtype=torch.int64, device="cuda")
                    return pydsa.C128Verify(state, drafts, None, ape, idx, seq, idx, bank_stride=b, store=store,
                                            cache_slots=loc).launch
                # drafts in, the load slot's state in, V bank entries out, about V / 128 cache entries per row
                vb = b * (v * 2 * D * 4 + 3 * D * sb + v * 3 * D * sb) + (b * v // 128) * 584 + 128 * D * 4
                cases[f"fused verify + store (V = {v})"] = (verify, vb)
            for name, (make, nbytes) in cases.items():
                us, copy_us = timed(make, nbytes)
                row = {"b": b, "state": str(dtype).replace("torch.", ""), "op": name, "MB": round(nbytes / 1e6, 2),
                       "us": round(us, 3), "copy us": round(copy_us, 3), "P25 time / copy time": round(us / copy_us, 3),
                       "P25 target": 1.15, "op GB/s": round(nbytes / us / 1e3, 1)}
                rows.append(row)
                print(row, flush=True)
    return rows
