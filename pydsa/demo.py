"""`python -m pydsa demo`: a simulated DeepSeek-V4-style serving loop on built-in data.

Requests arrive with random prompt lengths (some over 10 K tokens), are prefilled in chunks of
random size (so chunks start mid-way through 128-token chunks), decode and finish; state slots
are reused. Decoding alternates between plain decode steps and speculative steps: V = 4 drafts
per request are verified in one launch (the state after every draft prefix kept in a bank), a
random number of them (0..V, often across a chunk end) is accepted, and the commit resolves
on the device where each request's state now is; the next op reads it from there. Each step
plans with pyplan, runs the c128 kernels and refreshes the static DSA metadata buffers of K
backends with the fused copy (replayed in a CUDA graph on the GPU). Every compressed vector is
checked against the float64 offline formula over the accepted tokens only (a rejected draft that
leaked into a state would fail it), every metadata buffer against its source. Exit status 1 if
any check failed. `--config default` serves the c128 layers as sglang's default configuration does, with
the offline compressor (a ring of raw rows; a speculative step is an extend over the drafts with no commit,
pydsa/_serving_offline.py); `--config online` (the default) with the online one.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch

from ._abi import CHUNK
from ._serving import ServingLoop, Workload
from ._serving_offline import serving_loop
from ._tensors import resolve_device

from . import baselines
from .metadata import MetadataCopy

TOLERANCE = 1e-5
DRAFTS = 4  # V: draft tokens per request in a speculative step
MAX_RUNNING = 16  # requests served at once
# prefills of up to 2048 tokens a request and 8192 a step; one prompt in five of 10 000..16 000 tokens
WORKLOAD = Workload(MAX_RUNNING, 8192, 2048, long_prompts=0.2, drafts=DRAFTS)


class Checker:
    """Compares each emitted chunk vector with the float64 offline formula."""

    def __init__(self, ape: np.ndarray, d: int, corrupt: bool):
        self.ape = ape.astype(np.float64)
        self.d = d
        self.corrupt = corrupt
        self.chunks = 0
        self.max_err = 0.0
        self.failures = 0
        self.rows: dict = {}  # main slot -> its request's rows of the chunk in progress

    def absorb(self, slot: int, start: int, rows: np.ndarray, outputs: dict) -> None:
        """rows: the new token rows of the request in `slot`, in order from position `start` (0: a new
        request); outputs: position -> emitted vector."""
        if start == 0:
            self.rows[slot] = []
        kept = self.rows[slot]
        for i in range(len(rows)):
            kept.append(rows[i])
            pos = start + i
            if pos % CHUNK == CHUNK - 1:
                chunk = np.asarray(kept, np.float64)
                kept.clear()
                t = chunk[:, self.d:] + self.ape
                w = np.exp(t - t.max(axis=0))
                ref = (w / w.sum(axis=0) * chunk[:, :self.d]).sum(axis=0)
                got = outputs.get(pos)
                if self.corrupt and got is not None:
                    got = got.copy()
                    got[0] += 1.0
                err = float("inf") if got is None else float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                self.max_err = max(self.max_err, err)
                self.chunks += 1
                if not err < TOLERANCE:
                    self.failures += 1


class StoreChecker:
    """Every chunk vector the ops close is also stored into a paged KV cache in the same call (the
    layer's `KVCache`). For each accepted chunk the cache entry must equal, byte for byte, the
    standalone store of the vector the op wrote to `out`, and its dequantized values must match the
    float64 normed vector within fp8's precision."""

    def __init__(self, device: torch.device, d: int, gen: torch.Generator, slots: int = 4096):
        from .store import KVCache, kv_page_bytes
        pages = slots // 2
        w = torch.rand(d, device=device, generator=gen) + 0.5
        angles = torch.rand(1 << 15, 32, device=device, generator=gen) * 6.3
        rot = torch.stack([angles.cos(), angles.sin()], -1).reshape(1 << 15, 64)
        self.cache = KVCache(torch.zeros(pages, kv_page_bytes(d, 2), dtype=torch.uint8, device=device), w, rot,
                             page_size=2)
        self.scratch = KVCache(torch.zeros(1, kv_page_bytes(d, 2), dtype=torch.uint8, device=device), w, rot,
                               page_size=2)
        self.d, self.device = d, device
        self.entries = self.failures = 0
        self.max_err = 0.0

    def check(self, loc: int, position: int, vector: np.ndarray) -> None:
        from .store import kv_store
        d, page = self.d, self.cache.page_bytes
        dev = self.device
        kv_store(torch.from_numpy(np.ascontiguousarray(vector[None], np.float32)).to(dev),
                 torch.tensor([position], dtype=torch.int32, device=dev), torch.zeros(1, dtype=torch.int64, device=dev),
                 self.scratch)
        flat = self.cache.cache.view(-1)
        base = (loc // 2) * page
        data = flat[base + (loc % 2) * (d + 64): base + (loc % 2 + 1) * (d + 64)].cpu()
        scale = flat[base + 2 * (d + 64) + (loc % 2) * 8: base + 2 * (d + 64) + (loc % 2) * 8 + 8].cpu()
        ref = self.scratch.cache.view(-1).cpu()
        same = torch.equal(data, ref[:d + 64]) and torch.equal(scale[:d // 64 - 1], ref[2 * (d + 64): 2 * (d + 64) + d // 64 - 1])
        # dequantized nope part against the float64 norm of the vector
        x = vector.astype(np.float64)
        y = x / np.sqrt(np.mean(x * x) + self.cache.eps) * self.cache.norm_weight.cpu().numpy()
        codes = data[:d - 64].view(torch.float8_e4m3fn).float().numpy().reshape(-1, 64)
        scales = np.exp2(scale[:d // 64 - 1].numpy().astype(np.float64) - 127)[:, None]
        err = float(np.linalg.norm(codes.reshape(-1) * np.repeat(scales, 64) - y[:d - 64]) / np.linalg.norm(y[:d - 64]))
        self.max_err = max(self.max_err, err)
        self.entries += 1
        if not (same and err < 0.08):  # fp8 e4m3 keeps 3 mantissa bits: about 3 % norm-wise
            self.failures += 1


class Timer:
    """Device time (CUDA events) on the GPU, wall time on the host backend; µs per call. The first
    call of each kind is a warm-up (library loading, torch's first dispatch, allocator growth) and
    is left out, so pydsa and the torch way are compared warm against warm."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.totals: dict = {}
        self.seen: set = set()

    def run(self, name: str, fn):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            us = start.elapsed_time(end) * 1e3
        else:
            t0 = time.perf_counter()
            fn()
            us = (time.perf_counter() - t0) * 1e6
        if name not in self.seen:
            self.seen.add(name)
            return
        total, n = self.totals.get(name, (0.0, 0))
        self.totals[name] = (total + us, n + 1)

    def add_host(self, name: str, us: float):
        total, n = self.totals.get(name, (0.0, 0))
        self.totals[name] = (total + us, n + 1)

    def mean(self, name: str) -> float:
        total, n = self.totals.get(name, (0.0, 0))
        return total / n if n else float("nan")


class MetadataBackends:
    """K attention backends' static metadata buffers, refreshed by the fused copy each step."""

    def __init__(self, device, k: int, max_bs: int, max_len: int, timer: Timer):
        i32 = dict(dtype=torch.int32, device=device)
        self.device, self.max_bs, self.max_len, self.timer = device, max_bs, max_len, timer
        self.dsts = [dict(cache_seqlens=torch.zeros(max_bs, **i32), cu_seqlens_k=torch.zeros(max_bs + 1, **i32),
                          page_table_1=torch.zeros(max_bs, max_len + 64, **i32),
                          dsa_cache_seqlens=torch.zeros(max_bs, **i32), dsa_cu_seqlens_k=torch.zeros(max_bs + 1, **i32))
                     for _ in range(k)]
        self.copy = MetadataCopy(self.dsts)
        self.graphs: dict = {}  # bucket -> (sources, graph or None)
        self.failures = 0

    def _sources(self, bs: int, width: int):
        i32 = dict(dtype=torch.int32, device=self.device)
        return dict(cache_seqlens=torch.zeros(bs, **i32), cu_seqlens_k=torch.zeros(bs + 1, **i32),
                    page_indices=torch.zeros(bs, width, **i32), dsa_cache_seqlens=torch.zeros(bs, **i32),
                    dsa_cu_seqlens_k=torch.zeros(bs + 1, **i32))

    def refresh(self, seq_lens: np.ndarray, rng: np.random.Generator) -> None:
        bs = len(seq_lens)
        width = self.max_len
        if bs not in self.graphs:
            src = self._sources(bs, width)
            graph = None
            if self.device.type == "cuda":
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    self.copy(**src)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self.copy(**src)
            self.graphs[bs] = (src, graph)
        src, graph = self.graphs[bs]
        seq = torch.from_numpy(seq_lens.astype(np.int32))
        cu = torch.from_numpy(np.concatenate([[0], np.cumsum(seq_lens)]).astype(np.int32))
        dsa = torch.clamp(seq, max=2048)
        src["cache_seqlens"].copy_(seq)
        src["cu_seqlens_k"].copy_(cu)
        src["page_indices"].copy_(torch.from_numpy(rng.integers(0, 1 << 20, (bs, width), dtype=np.int32)))
        src["dsa_cache_seqlens"].copy_(dsa)
        src["dsa_cu_seqlens_k"].copy_(torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(dsa, 0).int()]))
        self.timer.run("metadata", graph.replay if graph is not None else (lambda: self.copy(**src)))
        scratch = [{k: v.clone() for k, v in d.items()} for d in self.dsts]
        self.timer.run("metadata_torch", lambda: [baselines.metadata_copy_torch(src, d) for d in scratch])
        for dst in self.dsts:
            ok = (torch.equal(dst["cache_seqlens"][:bs], src["cache_seqlens"])
                  and torch.equal(dst["cu_seqlens_k"][1:bs + 1], src["cu_seqlens_k"][1:])
                  and torch.equal(dst["page_table_1"][:bs, :width], src["page_indices"])
                  and torch.equal(dst["dsa_cache_seqlens"][:bs], src["dsa_cache_seqlens"])
                  and torch.equal(dst["dsa_cu_seqlens_k"][1:bs + 1], src["dsa_cu_seqlens_k"][1:]))
            self.failures += not ok


def show_progress(what: str, step: int, steps: int, counts: str) -> None:
    """The progress of a loop after `step` (0-based) of `steps`, on stderr: a live bar on a terminal (ended
    by a newline after the last step), a line per 50 steps and the last in a log."""
    tty, last = sys.stderr.isatty(), step + 1 == steps
    if tty or (step + 1) % 50 == 0 or last:
        filled = int(30 * (step + 1) / steps)
        start, end = ("\r", "\n" if last else "") if tty else ("", "\n")
        print(f"{start}[{'#' * filled}{'.' * (30 - filled)}] {what} {step + 1}/{steps}  {counts}", end=end,
              file=sys.stderr, flush=True)


class DemoChecks:
    """The demo's checks, an observer of the serving loop (pydsa/_serving.py), all on the host after each
    step: every committed row to the float64 Checker with the vector of each chunk it closes, each of those
    cache entries to the StoreChecker; the compact prefill output past its records must stay NaN. Times
    the torch way every 10th step and refreshes the metadata of the decoding requests."""

    def __init__(self, loop: ServingLoop, checker: Checker, entries: StoreChecker, meta: MetadataBackends,
                 timer: Timer, seed: int):
        self.loop, self.checker, self.entries, self.meta, self.timer = loop, checker, entries, meta, timer
        self.rng = np.random.default_rng(seed + 2)  # the metadata's page indices

    def stage(self, step) -> None:
        if step.launches and step.launches[0].kind == "prefill":
            self.timer.add_host("plan", step.plan_us)

    def launched(self, step) -> None:
        for x in step.launches:
            rows, out = x.kv.cpu().numpy().copy(), x.out.cpu().numpy()  # the reference keeps rows across steps
            if step.index % 10 == 0:
                self._time_torch(x)
            committed = np.flatnonzero(x.committed)
            for i in committed[x.out_row[committed] >= 0]:
                self.entries.check(int(x.cache_slot[i]), int(x.position[i]) - CHUNK + 1, out[x.out_row[i]])
            if x.kind == "prefill" and not np.isnan(out[len(x.closes):]).all():
                self.checker.failures += 1  # a compact row past the plan's records was written
            for slot in x.requests:
                mine = committed[x.owner[committed] == slot]
                if len(mine):
                    self.checker.absorb(int(slot), int(x.position[mine[0]]), rows[mine],
                                        {int(x.position[i]): out[x.out_row[i]] for i in mine if x.out_row[i] >= 0})
        if len(step.decoding):
            self.meta.refresh(self.loop.done[step.decoding], self.rng)

    def _time_torch(self, x) -> None:
        """The torch way of the same call, timed on copies (its results are not used)."""
        loop = self.loop
        if x.kind == "prefill" and len(x.owner) >= CHUNK:
            whole = len(x.owner) // CHUNK * CHUNK
            self.timer.run("prefill_torch", lambda: baselines.c128_chunks_torch(x.kv[:whole], loop.ape))
        elif x.kind == "decode" and loop.config == "online":  # the offline layer has no online state
            slots = torch.from_numpy(np.maximum(x.owner, 0).astype(np.int32)).to(loop.device)
            seq = torch.from_numpy(np.where(x.owner >= 0, x.position + 1, 0).astype(np.int32)).to(loop.device)
            s2, o2 = loop.state.clone(), x.out.clone()
            self.timer.run("decode_torch", lambda: baselines.c128_decode_torch(s2, x.kv, o2, loop.ape, slots, seq))


def run(steps=200, requests=24, device=None, seed=0, d=512, backends=3, corrupt=False, leak=False,
        progress=True, soak=False, config="online") -> dict:
    """requests: how many arrive over the run (at most MAX_RUNNING at once); soak: they keep arriving for
    every step instead (slots, cache entries and bank entries reused over and over). corrupt: perturb emitted
    vectors before the check; leak: commit every verified draft on the device while the checker accepts only
    some (both must make the demo fail; leak needs a commit: refused under config "default"). config: "online"
    (the online c128 compressor) or "default" (sglang's default: the offline one, pydsa/_serving_offline.py)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1 (got {steps})")
    device = resolve_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    entries, timer = StoreChecker(device, d, torch.Generator(device=device).manual_seed(seed + 1)), Timer(device)
    workload = Workload(**{**WORKLOAD.__dict__, "head_dim": d})
    loop = serving_loop(config, workload, device, seed=seed, store=entries.cache,
                        arrivals=None if soak else requests, leak=leak, launch=timer.run)
    checker = Checker(loop.ape.cpu().numpy(), d, corrupt)
    meta = MetadataBackends(device, backends, MAX_RUNNING, 1024, timer)
    loop.observers.append(DemoChecks(loop, checker, entries, meta, timer, seed))
    started = time.perf_counter()
    for step in range(steps):
        loop.step(step)
        if progress:
            show_progress("c128 layers, step", step, steps, f"chunks {checker.chunks}  max err {checker.max_err:.1e}")
    c = loop.counts
    ok = checker.failures == 0 and meta.failures == 0 and checker.chunks > 0 and entries.failures == 0 and entries.entries > 0
    return dict(device=str(device), config=config, steps=steps, busy_steps=c["busy"], requests_arrived=c["arrived"],
                requests_finished=c["finished"], tokens=c["tokens"], chunks_emitted=checker.chunks,
                verify_steps=c["verify_steps"], cache_entries_checked=entries.entries,
                cache_entry_failures=entries.failures, cache_max_dequant_error=entries.max_err,
                drafts_accepted=c["drafts_accepted"], drafts_rejected=c["drafts_rejected"],
                max_relative_error=checker.max_err, chunk_failures=checker.failures,
                metadata_failures=meta.failures, backends=backends, head_dim=d,
                plan_us=timer.mean("plan"), prefill_us=timer.mean("prefill"), prefill_torch_us=timer.mean("prefill_torch"),
                decode_us=timer.mean("decode"), decode_torch_us=timer.mean("decode_torch"),
                verify_us=timer.mean("verify"), commit_us=timer.mean("commit"), metadata_us=timer.mean("metadata"),
                metadata_torch_us=timer.mean("metadata_torch"), wall_s=time.perf_counter() - started, ok=ok)
