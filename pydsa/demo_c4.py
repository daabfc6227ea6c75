"""The demo's c4 layer: a DeepSeek-V4 ratio-4 layer (main compressor D = 512 and the indexer's D = 128, both
stores fused) served beside the c128 layers, on built-in data.

Requests arrive with random prompt lengths and are prefilled in chunks of random size (chunks start and end
mid-quartet: `pyplan.plan_c4` + one `c4_extend` per step), then decode: plain steps (`c4_decode`, both
compressors and both stores in one launch) alternate with speculative steps (`c4_verify` of V drafts, a
random number of them accepted; the next step starts at the first rejected position, with no commit).
Ring slots, ring rows and cache entries are reused as requests finish. Every entry a request commits is
checked: both compressors' vectors against float64 (norm-wise 1e-5), the main cache entry byte for byte
against the standalone store of that vector and within fp8's precision of the float64 store, the indexer
entry's scale within 1e-5 of float64 and every code within one fp8 step.
"""
from __future__ import annotations

import numpy as np
import torch

import pyplan

from .c4 import C4Compressor, c4_decode, c4_extend, c4_max_drafts, c4_verify
from .demo import show_progress
from .store import KVCache, indexer_page_bytes, kv_page_bytes, kv_store

DIMS = (512, 128)
RING = 16
TOLERANCE = 1e-5
PAGE = 64
_H = np.array([[(-1) ** bin(i & j).count("1") for j in range(128)] for i in range(128)], np.float64)


def entry64(rows: np.ndarray, ape: np.ndarray, n: int) -> np.ndarray:
    """Entry n in float64 from a request's rows [positions, 4D] (docs/spec.md, "One entry")."""
    d = ape.shape[1]
    idx = ([(4 * n - 4 + j, 0, j) for j in range(4)] if n >= 1 else []) + [(4 * n + j, 1, 4 + j) for j in range(4)]
    kv = np.stack([rows[p, h * d:(h + 1) * d] for p, h, _ in idx]).astype(np.float64)
    z = np.stack([rows[p, (2 + h) * d:(3 + h) * d].astype(np.float64) + ape[a] for p, h, a in idx])
    w = np.exp(z - z.max(axis=0))
    return (w * kv).sum(axis=0) / w.sum(axis=0)


def _fp8(codes: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn).float().numpy().astype(np.float64)


class Layer:
    """Both compressors over request-scoped rings of RING rows, their caches (page 64), and the checks."""

    def __init__(self, device, slots: int, entries_per_slot: int, gen: torch.Generator):
        self.device, self.slots, self.per = device, slots, entries_per_slot
        pages = -(-slots * entries_per_slot // PAGE)
        self.rotary = (torch.rand(4 * entries_per_slot + 8, 64, generator=gen) * 2 - 1).to(device)
        self.comp, self.apes, self.weights = [], [], []
        for k, d in enumerate(DIMS):
            ring = torch.zeros(slots * RING, 4 * d, device=device)
            ape = (torch.randn(8, d, generator=gen) * 0.5).to(device)
            w = (torch.rand(d, generator=gen) + 0.5).to(device)
            page = kv_page_bytes(d, PAGE) if k == 0 else indexer_page_bytes(d, PAGE)
            cache = KVCache(torch.zeros(pages, page, dtype=torch.uint8, device=device), w, self.rotary,
                            page_size=PAGE, layout="v4" if k == 0 else "indexer")
            self.comp.append(C4Compressor(ring, ape, store=cache, ring_size=RING))
            self.apes.append(ape.cpu().numpy().astype(np.float64))
            self.weights.append(w.cpu().numpy().astype(np.float64))
        self.scratch = KVCache(torch.zeros(1, kv_page_bytes(512, PAGE), dtype=torch.uint8, device=device),
                               self.comp[0].store.norm_weight, self.rotary, page_size=PAGE)
        self.entries = self.failures = 0
        self.max_err = 0.0

    def loc(self, slot: int, n: int) -> int:
        return slot * self.per + n

    def check(self, rows: list, slot: int, n: int, outs: list) -> None:
        """Entry n of a request (rows: its rows per compressor, [positions, 4D]) against float64 and its cache
        entries; outs: the vectors the op wrote, per compressor."""
        ok = True
        for k in range(2):
            ref = entry64(rows[k], self.apes[k], n)
            err = float(np.linalg.norm(outs[k] - ref) / np.linalg.norm(ref))
            self.max_err = max(self.max_err, err)
            ok &= err < TOLERANCE
        ok &= self._main_entry(self.loc(slot, n), 4 * n, outs[0]) and self._indexer_entry(self.loc(slot, n), 4 * n,
                                                                                          outs[1])
        self.entries += 1
        self.failures += not ok

    def _main_entry(self, loc: int, pos: int, x: np.ndarray) -> bool:
        dev, d = self.device, 512
        kv_store(torch.from_numpy(np.ascontiguousarray(x[None], np.float32)).to(dev),
                 torch.tensor([pos], dtype=torch.int32, device=dev), torch.zeros(1, dtype=torch.int64, device=dev),
                 self.scratch)
        page = self.comp[0].store.page_bytes
        flat = self.comp[0].store.cache.view(-1)
        base, s = (loc // PAGE) * page, loc % PAGE
        data = flat[base + s * (d + 64): base + (s + 1) * (d + 64)].cpu()
        scale = flat[base + PAGE * (d + 64) + 8 * s: base + PAGE * (d + 64) + 8 * s + 7].cpu()
        ref = self.scratch.cache.view(-1).cpu()
        same = torch.equal(data, ref[:d + 64]) and torch.equal(scale, ref[PAGE * (d + 64): PAGE * (d + 64) + 7])
        x64 = x.astype(np.float64)
        y = x64 / np.sqrt(np.mean(x64 * x64) + self.comp[0].store.eps) * self.weights[0]
        got = _fp8(data[:d - 64].numpy()) * np.repeat(np.exp2(scale.numpy().astype(np.float64) - 127), 64)
        return same and float(np.linalg.norm(got - y[:d - 64]) / np.linalg.norm(y[:d - 64])) < 0.08

    def _indexer_entry(self, loc: int, pos: int, x: np.ndarray) -> bool:
        st = self.comp[1].store
        flat = st.cache.view(-1)
        base, s = (loc // PAGE) * st.page_bytes, loc % PAGE
        codes = flat[base + 128 * s: base + 128 * s + 128].cpu().numpy()
        scale = float(flat[base + PAGE * 128 + 4 * s: base + PAGE * 128 + 4 * s + 4].cpu().numpy().view(np.float32)[0])
        x64 = x.astype(np.float64)
        y = x64 / np.sqrt(np.mean(x64 * x64) + st.eps) * self.weights[1]
        rot = self.rotary[pos].cpu().numpy().astype(np.float64)
        a, b = y[64::2].copy(), y[65::2].copy()
        y[64::2], y[65::2] = a * rot[0::2] - b * rot[1::2], a * rot[1::2] + b * rot[0::2]
        h = _H @ y / np.sqrt(128.0)
        want = max(np.abs(h).max(), 1e-4) / 448.0
        v = np.clip(h / want, -448, 448)
        step = np.exp2(np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** -6))) - 3)
        return abs(scale - want) <= 1e-5 * want and bool(np.all(np.abs(_fp8(codes) - v) <= step * 1.0001))


def run(steps: int, requests: int, device, seed: int = 0, progress: bool = True) -> dict:
    """Serves `steps` steps of one c4 layer for up to `requests` concurrent requests; the summary. progress:
    report each step on stderr (demo.show_progress)."""
    gen = torch.Generator().manual_seed(seed + 4)
    rng = np.random.default_rng(seed + 4)
    max_prompt, max_output = 700, 80
    layer = Layer(device, requests, (max_prompt + max_output + 16) // 4 + 1, gen)
    V = min(4, c4_max_drafts(layer.comp[0].ring_size))
    free = list(range(requests))
    live = {}  # slot -> dict(rows=[per compressor list of rows], done, prompt, total)
    stats = dict(extends=0, decodes=0, verifies=0, accepted=0, rejected=0, arrived=0, finished=0)

    def new_row(k):
        return rng.standard_normal(4 * DIMS[k]).astype(np.float32)

    def rows_of(req, k):
        return np.stack(req["rows"][k])

    def absorb(req, slot, start, count, outs_by_pos):
        """Checks every entry closed in positions start .. start + count - 1 (outs_by_pos: pos -> vectors)."""
        for p in range(start, start + count):
            if (p + 1) % 4 == 0:
                layer.check([rows_of(req, k)[:p + 1] for k in range(2)], slot, (p + 1) // 4 - 1, outs_by_pos[p])

    def serve(step):
        """One step over the live requests: an extend of the prefilling ones, then a decode (even steps) or a
        verify of the decoding ones; finished requests free their slots."""
        pre = [s for s, r in live.items() if r["done"] < r["prompt"]]
        dec = [s for s, r in live.items() if r["done"] >= r["prompt"]]
        if pre:  # one extend: a chunk of each prefilling request
            exts = [int(rng.integers(1, live[s]["prompt"] - live[s]["done"] + 1)) for s in pre]
            for s, e in zip(pre, exts):
                for k in range(2):
                    live[s]["rows"][k] += [new_row(k) for _ in range(e)]
            seqs = [live[s]["done"] + e for s, e in zip(pre, exts)]
            plan = pyplan.plan_c4(np.array(seqs), np.array(exts), np.array(pre), ring_size=RING, num_slots=requests)
            compress = plan[0]  # row i of out: the position its record names
            kv = [torch.from_numpy(np.concatenate([rows_of(live[s], k)[live[s]["done"]:q] for s, q in zip(pre, seqs)]))
                  .to(device) for k in range(2)]
            pos = [(s, p) for s, q, e in zip(pre, seqs, exts) for p in range(q - e, q)]
            slots_rows = torch.tensor([layer.loc(s, p // 4) for s, p in pos], dtype=torch.int64, device=device)
            outs = [torch.full((compress.shape[0], d), float("nan"), device=device) for d in DIMS]
            c4_extend(layer.comp[0], kv[0], plan.to(device), indexer=layer.comp[1], indexer_kv_score=kv[1],
                      out=outs[0], indexer_out=outs[1], cache_slots=slots_rows)
            o = [x.cpu().numpy() for x in outs]
            rec = compress.view(np.uint32).reshape(-1, 4)
            by = {}
            for i, r in enumerate(rec):
                s, p = pos[int(r[1]) & 0xFFFF]
                by.setdefault(s, {})[p] = [o[0][i], o[1][i]]
            for s, q, e in zip(pre, seqs, exts):
                absorb(live[s], s, q - e, e, by.get(s, {}))
                live[s]["done"] = q
            stats["extends"] += 1
        if dec and step % 2 == 0:  # a plain decode step
            seqs = [live[s]["done"] + 1 for s in dec]
            for s in dec:
                for k in range(2):
                    live[s]["rows"][k].append(new_row(k))
            kv = [torch.from_numpy(np.stack([live[s]["rows"][k][-1] for s in dec])).to(device) for k in range(2)]
            outs = [torch.full((len(dec), d), float("nan"), device=device) for d in DIMS]
            c4_decode(layer.comp[0], kv[0], indexer=layer.comp[1], indexer_kv_score=kv[1],
                      seq_lens=torch.tensor(seqs, dtype=torch.int32, device=device),
                      slots=torch.tensor(dec, dtype=torch.int32, device=device), out=outs[0],
                      indexer_out=outs[1], cache_slots=torch.tensor([layer.loc(s, (q - 1) // 4) for s, q in
                                                                     zip(dec, seqs)], dtype=torch.int64, device=device))
            o = [x.cpu().numpy() for x in outs]
            for i, (s, q) in enumerate(zip(dec, seqs)):
                absorb(live[s], s, q - 1, 1, {q - 1: [o[0][i], o[1][i]]})
                live[s]["done"] = q
            stats["decodes"] += 1
        elif dec:  # a speculative step: V drafts, the first always accepted
            accepted = [int(rng.integers(1, V + 1)) for _ in dec]
            drafts = [[], []]
            for s, a in zip(dec, accepted):
                for k in range(2):
                    true = [new_row(k) for _ in range(a)]
                    live[s]["rows"][k] += true
                    drafts[k] += true + [new_row(k) for _ in range(V - a)]  # rejected drafts: other rows
            seq0 = [live[s]["done"] for s in dec]
            outs = [torch.full((len(dec) * V, d), float("nan"), device=device) for d in DIMS]
            c4_verify(layer.comp[0], torch.from_numpy(np.stack(drafts[0])).to(device),
                      torch.tensor(seq0, dtype=torch.int32, device=device),
                      torch.tensor(dec, dtype=torch.int32, device=device), num_drafts=V,
                      indexer=layer.comp[1], indexer_drafts=torch.from_numpy(np.stack(drafts[1])).to(device),
                      out=outs[0], indexer_out=outs[1],
                      cache_slots=torch.tensor([layer.loc(s, (q + j) // 4) for s, q in zip(dec, seq0) for j in range(V)],
                                               dtype=torch.int64, device=device))
            o = [x.cpu().numpy() for x in outs]
            for i, (s, q, a) in enumerate(zip(dec, seq0, accepted)):
                absorb(live[s], s, q, a, {q + j: [o[0][i * V + j], o[1][i * V + j]] for j in range(a)})
                live[s]["done"] = q + a
                stats["accepted"] += a
                stats["rejected"] += V - a
            stats["verifies"] += 1
        for s in [s for s, r in live.items() if r["done"] >= r["total"]]:
            del live[s]
            free.append(s)
            stats["finished"] += 1

    for step in range(steps):
        while free and rng.random() < 0.5:
            slot = free.pop()
            prompt = int(rng.integers(1, max_prompt))
            live[slot] = dict(rows=[[], []], done=0, prompt=prompt, total=prompt + int(rng.integers(1, max_output)))
            stats["arrived"] += 1
        if live:
            serve(step)
        if progress:
            show_progress("c4 layer, step", step, steps, f"entries {layer.entries}  max err {layer.max_err:.1e}")
    return dict(c4_entries_checked=layer.entries, c4_failures=layer.failures, c4_max_relative_error=layer.max_err,
                c4_extends=stats["extends"], c4_decodes=stats["decodes"], c4_verifies=stats["verifies"],
                c4_drafts_accepted=stats["accepted"], c4_drafts_rejected=stats["rejected"],
                c4_requests_arrived=stats["arrived"], c4_requests_finished=stats["finished"], c4_drafts=V,
                c4_ok=layer.failures == 0)
