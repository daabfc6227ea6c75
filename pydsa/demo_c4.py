"""The demo's c4 layer: a DeepSeek-V4 ratio-4 layer (main compressor D = 512 and the indexer's D = 128, both
stores fused) served after the c128 layers, on built-in data.

The layer is the soak's (pydsa/_serving_c4.py), served alone: requests arrive with random prompt lengths (up to
MAX_PROMPT) and are prefilled in chunks of random size (chunks start and end mid-quartet: `pyplan.plan_c4` + one
`c4_extend` per step), then decode: plain steps (`c4_decode`, both compressors and both stores in one launch)
and speculative steps (`c4_verify` of V drafts, a random number of them accepted, none included; the next step
starts at the first rejected position, with no commit). Ring slots, ring rows and cache entries are reused as
requests finish. The checks are an observer of the layer, on the host after each step (C4Checks): every entry
a request commits, both compressors' vectors against float64 (norm-wise 1e-5), the main cache entry byte for
byte against the standalone store of that vector and within fp8's precision of the float64 store, the indexer
entry's scale within 1e-5 of float64 and every code within one fp8 step; and the index errors the ops skip and
count (none).
"""
from __future__ import annotations

import numpy as np
import torch

from ._serving import Staging
from ._serving_c4 import DIMS, PAGE, TOLERANCE, C4Serving, C4Workload
from .demo import DRAFTS, show_progress
from .store import KVCache, kv_page_bytes, kv_store

MAX_PROMPT, MAX_OUTPUT = 699, 79  # tokens of a request's prompt and output, at most
MAX_EXTEND, TOKEN_BUDGET = 512, 2048  # a prefill chunk's tokens per request, and per step
POOL_ROWS = 1024  # the pools' rows to draw inputs from (past TOKEN_BUDGET)
_H = np.array([[(-1) ** bin(i & j).count("1") for j in range(128)] for i in range(128)], np.float64)


def entry64(rows: np.ndarray, ape: np.ndarray) -> np.ndarray:
    """Entries in float64 [entries, D] from their input rows [entries, 8, 4D] at positions 4n - 4 .. 4n + 3
    (docs/spec.md, "One entry"; a row of zero kv and -inf scores: no term)."""
    d = ape.shape[1]
    kv = np.concatenate([rows[:, :4, :d], rows[:, 4:, d:2 * d]], axis=1)
    z = np.concatenate([rows[:, :4, 2 * d:3 * d], rows[:, 4:, 3 * d:]], axis=1) + ape
    w = np.exp(z - z.max(axis=1, keepdims=True))
    return (w * kv).sum(axis=1) / w.sum(axis=1)


def _fp8(codes: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(codes)).view(torch.float8_e4m3fn).float().numpy().astype(np.float64)


class C4Checks:
    """The demo's checks, an observer of the c4 layer (pydsa/_serving_c4.py), on the host after each step: each
    entry its requests committed against float64 and both its cache entries."""

    def __init__(self, layer: C4Serving):
        main = layer.comp[0].store
        self.layer, self.device = layer, main.cache.device
        self.pools = [p.cpu().double().numpy() for p in layer.pools]
        self.apes = [a.cpu().numpy() for a in layer.apes]
        self.weights = [c.store.norm_weight.cpu().double().numpy() for c in layer.comp]
        self.rotary = main.rotary.cpu().double().numpy()
        self.scratch = KVCache(torch.zeros(1, kv_page_bytes(DIMS[0], PAGE), dtype=torch.uint8, device=self.device),
                               main.norm_weight, main.rotary, page_size=PAGE)
        self.entries = self.failures = 0
        self.max_err = 0.0

    def stage(self, step) -> None:
        pass

    def launched(self, step) -> None:
        """The step's committed entries: the vectors the ops wrote against float64, then their cache entries."""
        if not len(step.rows):
            return
        rows = torch.from_numpy(step.rows).to(self.device)
        outs = [v.index_select(0, rows).cpu().numpy() for v in self.layer.vectors]
        ok = np.ones(len(step.rows), bool)
        for k in range(2):
            ref = entry64(self.pools[k][step.window], self.apes[k])
            err = np.linalg.norm(outs[k] - ref, axis=1) / np.linalg.norm(ref, axis=1)
            self.max_err = max(self.max_err, float(np.nanmax(err, initial=0.0)))
            ok &= err < TOLERANCE
        for i, (slot, closing) in enumerate(zip(step.cache_slot.tolist(), step.closing.tolist())):
            ok[i] &= self._main_entry(slot, closing - 3, outs[0][i]) and self._indexer_entry(slot, closing - 3,
                                                                                             outs[1][i])
        self.entries += len(ok)
        self.failures += int((~ok).sum())

    def _main_entry(self, loc: int, pos: int, x: np.ndarray) -> bool:
        dev, d, store = self.device, DIMS[0], self.layer.comp[0].store
        kv_store(torch.from_numpy(np.ascontiguousarray(x[None], np.float32)).to(dev),
                 torch.tensor([pos], dtype=torch.int32, device=dev), torch.zeros(1, dtype=torch.int64, device=dev),
                 self.scratch)
        flat, page = store.cache.view(-1), store.page_bytes
        base, s = (loc // PAGE) * page, loc % PAGE
        data = flat[base + s * (d + 64): base + (s + 1) * (d + 64)].cpu()
        scale = flat[base + PAGE * (d + 64) + 8 * s: base + PAGE * (d + 64) + 8 * s + 7].cpu()
        ref = self.scratch.cache.view(-1).cpu()
        same = torch.equal(data, ref[:d + 64]) and torch.equal(scale, ref[PAGE * (d + 64): PAGE * (d + 64) + 7])
        x64 = x.astype(np.float64)
        y = x64 / np.sqrt(np.mean(x64 * x64) + store.eps) * self.weights[0]
        got = _fp8(data[:d - 64].numpy()) * np.repeat(np.exp2(scale.numpy().astype(np.float64) - 127), 64)
        return same and float(np.linalg.norm(got - y[:d - 64]) / np.linalg.norm(y[:d - 64])) < 0.08

    def _indexer_entry(self, loc: int, pos: int, x: np.ndarray) -> bool:
        st = self.layer.comp[1].store
        flat = st.cache.view(-1)
        base, s = (loc // PAGE) * st.page_bytes, loc % PAGE
        codes = flat[base + 128 * s: base + 128 * s + 128].cpu().numpy()
        scale = float(flat[base + PAGE * 128 + 4 * s: base + PAGE * 128 + 4 * s + 4].cpu().numpy().view(np.float32)[0])
        x64 = x.astype(np.float64)
        y = x64 / np.sqrt(np.mean(x64 * x64) + st.eps) * self.weights[1]
        rot = self.rotary[pos]
        a, b = y[64::2].copy(), y[65::2].copy()
        y[64::2], y[65::2] = a * rot[0::2] - b * rot[1::2], a * rot[1::2] + b * rot[0::2]
        h = _H @ y / np.sqrt(128.0)
        want = max(np.abs(h).max(), 1e-4) / 448.0
        v = np.clip(h / want, -448, 448)
        step = np.exp2(np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** -6))) - 3)
        return abs(scale - want) <= 1e-5 * want and bool(np.all(np.abs(_fp8(codes) - v) <= step * 1.0001))


def run(steps: int, requests: int, device, seed: int = 0, progress: bool = True, fault: str | None = None) -> dict:
    """Serves `steps` steps of one c4 layer for up to `requests` concurrent requests; the summary (c4_ok: every
    check passed). progress: report each step on stderr (demo.show_progress); fault: break the layer halfway
    ("c4ring" or "c4cache", the soak's faults) — the checks must then fail."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed + 5)
    f32 = dict(dtype=torch.float32, device=device)
    w = C4Workload(requests, (1, MAX_PROMPT), (1, MAX_OUTPUT), MAX_EXTEND, TOKEN_BUDGET, drafts=DRAFTS)
    rotary = torch.rand(MAX_PROMPT + MAX_OUTPUT + DRAFTS + 8, 64, generator=gen, **f32) * 2 - 1
    errors = torch.zeros(1, dtype=torch.int32, device=device)
    layer = C4Serving(w, device, Staging(device), errors, rotary, torch.rand(DIMS[0], generator=gen, **f32) + 0.5,
                      pool_rows=POOL_ROWS, seed=seed, steps=steps, fault=fault)
    checks = C4Checks(layer)
    layer.observers.append(checks)
    for step in range(steps):
        layer.step(step)
        if progress:
            show_progress("c4 layer, step", step, steps, f"entries {checks.entries}  max err {checks.max_err:.1e}")
    c, index_errors = layer.counts, int(errors.item())
    return dict(c4_entries_checked=checks.entries, c4_failures=checks.failures, c4_max_relative_error=checks.max_err,
                c4_extends=c["c4_extends"], c4_decodes=c["c4_decodes"], c4_verifies=c["c4_verifies"],
                c4_drafts_accepted=c["c4_drafts_accepted"], c4_drafts_rejected=c["c4_drafts_rejected"],
                c4_requests_arrived=c["c4_requests_arrived"], c4_requests_finished=c["c4_requests_finished"],
                c4_drafts=w.drafts, c4_index_errors=index_errors, c4_ok=checks.failures == 0 and index_errors == 0)
