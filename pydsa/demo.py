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
any check failed.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ._tensors import resolve_device

import pyplan

from . import baselines
from .c128 import C128Decode, C128Prefill, DevicePlan
from .metadata import MetadataCopy
from .speculative import C128Commit, C128Verify

CHUNK = 128
TOLERANCE = 1e-5
DRAFTS = 4  # V: draft tokens per request in a speculative step
MAX_RUNNING = 16  # requests served at once


@dataclass
class Request:
    rid: int
    prompt: int
    output: int
    slot: int  # main slot; its bank follows the main slots
    load: int = -1  # the slot holding the state after `done` tokens (the main slot or a bank entry)
    done: int = 0  # tokens absorbed so far
    rows: list = field(default_factory=list)  # this request's rows of the chunk in progress

    @property
    def prefilling(self) -> bool:
        return self.done < self.prompt

    @property
    def finished(self) -> bool:
        return self.done >= self.prompt + self.output


class Checker:
    """Compares each emitted chunk vector with the float64 offline formula."""

    def __init__(self, ape: np.ndarray, d: int, corrupt: bool):
        self.ape = ape.astype(np.float64)
        self.d = d
        self.corrupt = corrupt
        self.chunks = 0
        self.max_err = 0.0
        self.failures = 0

    def absorb(self, req: Request, rows: np.ndarray, outputs: dict) -> None:
        """rows: this request's new token rows in order; outputs: position -> emitted vector."""
        start = req.done
        for i in range(len(rows)):
            req.rows.append(rows[i])
            pos = start + i
            if pos % CHUNK == CHUNK - 1:
                chunk = np.asarray(req.rows, np.float64)
                req.rows.clear()
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
        self.slots, self.next, self.d, self.device = slots, 0, d, device
        self.entries = self.failures = 0
        self.max_err = 0.0

    def slot(self) -> int:
        """A fresh cache slot for the next chunk that closes (slots are reused round robin)."""
        self.next = (self.next + 1) % self.slots
        return self.next

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


def _bucket(n: int) -> int:
    b = 1
    while b < n:
        b *= 2
    return b


def run(steps=200, requests=24, device=None, seed=0, d=512, backends=3, corrupt=False, leak=False,
        progress=True, soak=False) -> dict:
    """requests: how many arrive over the run (at most MAX_RUNNING at once); soak: they keep arriving for
    every step instead (slots, cache entries and bank entries reused over and over). corrupt: perturb emitted
    vectors before the check; leak: commit every verified draft on the device while the checker accepts only
    some (both must make the demo fail)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1 (got {steps})")
    device = resolve_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    verify_torch = False
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    max_running, max_tokens, max_chunk = MAX_RUNNING, 8192, 2048
    num_main = max_running + 4
    num_slots = num_main * (DRAFTS + 2)  # main slots, then V + 1 bank entries per main slot
    ape = torch.randn(CHUNK, d, device=device, generator=gen)
    state = torch.randn(num_slots, 1, 3 * d, device=device, generator=gen)  # stale contents: must never leak in
    kv_buf = torch.empty(max_tokens, 2 * d, device=device)
    idx_buf = torch.zeros(max_running, dtype=torch.int32, device=device)
    load_buf = torch.zeros(max_running, dtype=torch.int32, device=device)
    plan = DevicePlan(max_tokens, max_running, device=device)
    out_buf = torch.empty(plan.compress_capacity, d, device=device)  # compact: row i = compress record i
    entries = StoreChecker(device, d, gen)
    cache_slot_buf = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)  # per ragged row
    prefill = C128Prefill(state, kv_buf, out_buf, ape, idx_buf, plan, load_indices=load_buf, compact=True,
                          store=entries.cache, cache_slots=cache_slot_buf)
    decode_ops: dict = {}
    timer = Timer(device)
    checker = Checker(ape.cpu().numpy(), d, corrupt)
    meta = MetadataBackends(device, backends, max_running, 1024, timer)
    verify_ops: dict = {}
    free = list(range(num_main))
    running: list = []
    arrived = finished = tokens = verify_steps = accepted_drafts = rejected_drafts = busy = 0

    def new_request() -> Request:
        nonlocal arrived
        long = rng.random() < 0.2
        prompt = int(rng.integers(10_000, 16_000) if long else rng.integers(1, 3000))
        req = Request(arrived, prompt, int(rng.integers(20, 300)), free.pop(0))
        req.load = req.slot
        arrived += 1
        return req

    def bank_of(slot: int) -> int:
        return num_main + slot * (DRAFTS + 1)

    def run_prefill(batch: list, extends: list) -> None:
        """Extends `batch` by `extends` tokens, continuing from each request's load slot and storing
        into its main slot."""
        nonlocal tokens
        seq = np.array([r.done + e for r, e in zip(batch, extends)], np.int64)
        ext = np.array(extends, np.int64)
        n = int(ext.sum())
        t0 = time.perf_counter()
        plan.plan(seq, ext, num_tokens=max_tokens)
        timer.add_host("plan", (time.perf_counter() - t0) * 1e6)
        loads = [r.load for r in batch]
        stores = [r.slot for r in batch]
        idx_buf[:len(batch)].copy_(torch.tensor(stores, dtype=torch.int32))
        load_buf[:len(batch)].copy_(torch.tensor(loads, dtype=torch.int32))
        kv_buf[:n].normal_(generator=gen)
        kv_buf[:n, d:].mul_(3.0)
        out_buf.fill_(float("nan"))
        compress, _ = pyplan.plan_prefill(seq, ext)
        row_slots = np.full(n, -1, np.int64)
        for rec in compress.tolist():
            row_slots[rec[0]] = entries.slot()
        cache_slot_buf[:n].copy_(torch.from_numpy(row_slots))
        timer.run("prefill", prefill.launch)
        if verify_torch and n >= CHUNK:
            whole = n // CHUNK * CHUNK
            timer.run("prefill_torch", lambda: baselines.c128_chunks_torch(kv_buf[:whole], ape))
        rows = kv_buf[:n].cpu().numpy().copy()  # the reference keeps rows across steps
        out = out_buf.cpu().numpy()
        emitted = {(int(b), int(pos)): out[i] for i, (_, b, pos, _) in enumerate(compress.tolist())}
        for i, (ragged, _, pos, _) in enumerate(compress.tolist()):
            entries.check(int(row_slots[ragged]), int(pos) - CHUNK + 1, out[i])
        if not np.isnan(out[len(compress):]).all():
            checker.failures += 1  # a compact row past the plan's records was written
        off = 0
        for j, (r, e) in enumerate(zip(batch, extends)):
            checker.absorb(r, rows[off:off + e], {pos: v for (b, pos), v in emitted.items() if b == j})
            r.done += e
            r.load = r.slot
            off += e
        tokens += n

    def run_decode(batch: list) -> None:
        nonlocal tokens
        bucket = _bucket(len(batch))
        if bucket not in decode_ops:
            i32 = dict(dtype=torch.int32, device=device)
            bufs = (torch.empty(bucket, 2 * d, device=device), torch.empty(bucket, d, device=device),
                    torch.zeros(bucket, **i32), torch.zeros(bucket, **i32), torch.zeros(bucket, **i32),
                    torch.full((bucket,), -1, dtype=torch.int64, device=device))
            decode_ops[bucket] = (bufs, C128Decode(state, bufs[0], bufs[1], ape, bufs[2], bufs[3], load_indices=bufs[4],
                                                   store=entries.cache, cache_slots=bufs[5]))
        (kv, out, idx, seq, load, locs), op = decode_ops[bucket]
        row_slots = [entries.slot() if (r.done + 1) % CHUNK == 0 else -1 for r in batch] + [-1] * (bucket - len(batch))
        locs.copy_(torch.tensor(row_slots, dtype=torch.int64))
        pad = bucket - len(batch)
        idx.copy_(torch.tensor([r.slot for r in batch] + [0] * pad, dtype=torch.int32))
        load.copy_(torch.tensor([r.load for r in batch] + [0] * pad, dtype=torch.int32))
        seq.copy_(torch.tensor([r.done + 1 for r in batch] + [0] * pad, dtype=torch.int32))  # 0: padding
        kv.normal_(generator=gen)
        kv[:, d:].mul_(3.0)
        out.fill_(float("nan"))
        timer.run("decode", op.launch)
        if verify_torch:
            s2, o2 = state.clone(), out.clone()
            valid = [r.slot for r in batch] + [free[0]] * pad  # the torch way needs real slots for padding
            timer.run("decode_torch", lambda: baselines.c128_decode_torch(
                s2, kv, o2, ape, torch.tensor(valid, dtype=torch.int32, device=device), seq))
        rows, got = kv.cpu().numpy().copy(), out.cpu().numpy()
        for j, r in enumerate(batch):
            checker.absorb(r, rows[j:j + 1], {r.done: got[j]})
            if row_slots[j] >= 0:
                entries.check(row_slots[j], r.done - CHUNK + 1, got[j])
            r.done += 1
            r.load = r.slot
        tokens += len(batch)

    def run_verify(batch: list) -> None:
        """A speculative step: DRAFTS drafts per request verified, a random number accepted (some
        requests verify fewer drafts), committed on the device; the checker sees accepted tokens only."""
        nonlocal tokens, accepted_drafts, rejected_drafts
        bucket = _bucket(len(batch))
        if bucket not in verify_ops:
            i32 = dict(dtype=torch.int32, device=device)
            bufs = dict(drafts=torch.empty(bucket * DRAFTS, 2 * d, device=device),
                        out=torch.empty(bucket * DRAFTS, d, device=device), seq=torch.zeros(bucket, **i32),
                        load=torch.zeros(bucket, **i32), bank=torch.zeros(bucket, **i32),
                        lens=torch.zeros(bucket, **i32), accepted=torch.zeros(bucket, **i32),
                        locs=torch.full((bucket * DRAFTS,), -1, dtype=torch.int64, device=device))
            verify = C128Verify(state, bufs["drafts"], bufs["out"], ape, bufs["load"], bufs["seq"],
                                bank_indices=bufs["bank"], verify_lens=bufs["lens"], store=entries.cache, cache_slots=bufs["locs"])
            commit = C128Commit(bufs["seq"], bufs["accepted"], bufs["load"], bufs["bank"], num_drafts=DRAFTS,
                                verify_lens=bufs["lens"], load_indices=bufs["load"], num_slots=num_slots)
            verify_ops[bucket] = (bufs, verify, commit)
        bufs, verify, commit = verify_ops[bucket]
        pad = bucket - len(batch)
        lens = [min(DRAFTS, r.prompt + r.output - r.done, int(rng.integers(0, DRAFTS + 1)) if rng.random() < 0.2
                    else DRAFTS) for r in batch]
        accepted = []
        for r, v in zip(batch, lens):  # none, all, up to the chunk end, or any number
            to_end = CHUNK - r.done % CHUNK
            accepted.append(int(rng.choice([0, v, min(v, to_end), int(rng.integers(0, v + 1))])))
        as_i32 = lambda xs: torch.tensor(xs + [0] * pad, dtype=torch.int32)  # noqa: E731
        bufs["seq"].copy_(as_i32([r.done for r in batch]))  # 0: padding
        bufs["load"].copy_(as_i32([r.load for r in batch]))
        bufs["bank"].copy_(as_i32([bank_of(r.slot) for r in batch]))
        bufs["lens"].copy_(as_i32(lens))
        bufs["accepted"].copy_(as_i32(lens if leak else accepted))  # sampling's result; stays on the device
        bufs["drafts"].normal_(generator=gen)
        bufs["drafts"][:, d:].mul_(3.0)
        bufs["out"].fill_(float("nan"))
        draft_slots = np.full(bucket * DRAFTS, -1, np.int64)  # a slot for every draft that closes a chunk
        for j, (r, v) in enumerate(zip(batch, lens)):
            for i in range(v):
                if (r.done + i) % CHUNK == CHUNK - 1:
                    draft_slots[j * DRAFTS + i] = entries.slot()
        bufs["locs"].copy_(torch.from_numpy(draft_slots))
        timer.run("verify", verify.launch)
        timer.run("commit", commit.launch)
        rows, got = bufs["drafts"].cpu().numpy().copy(), bufs["out"].cpu().numpy()
        loads = bufs["load"].cpu().tolist()
        for j, (r, a) in enumerate(zip(batch, accepted)):
            first = j * DRAFTS
            checker.absorb(r, rows[first:first + a], {r.done + i: got[first + i] for i in range(a)})
            for i in range(a):  # the entries of accepted drafts; those of rejected ones are ignored
                if draft_slots[first + i] >= 0:
                    entries.check(int(draft_slots[first + i]), r.done + i - CHUNK + 1, got[first + i])
            r.done += a
            r.load = loads[j]
            accepted_drafts += a
            rejected_drafts += lens[j] - a
            tokens += a

    started = time.perf_counter()
    for step in range(steps):
        verify_torch = step % 10 == 0
        while len(running) < max_running and (soak or arrived < requests) and (not running or rng.random() < 0.3):
            running.append(new_request())
        pre = [r for r in running if r.prefilling]
        budget = max_tokens
        batch, extends = [], []
        for r in pre:
            e = min(r.prompt - r.done, int(rng.integers(1, max_chunk + 1)), budget)
            if e > 0:
                batch.append(r)
                extends.append(e)
                budget -= e
        if batch:
            run_prefill(batch, extends)
        dec = [r for r in running if not r.prefilling and not r.finished]
        busy += bool(batch or dec)
        if dec and step % 3 != 0:
            verify_steps += 1
            run_verify(dec)
        elif dec:
            run_decode(dec)
        if dec:
            meta.refresh(np.array([r.done for r in dec], np.int64), rng)
        for r in [r for r in running if r.finished]:
            running.remove(r)
            free.append(r.slot)
            finished += 1
        if progress:
            show_progress("c128 layers, step", step, steps, f"chunks {checker.chunks}  max err {checker.max_err:.1e}")
    ok = checker.failures == 0 and meta.failures == 0 and checker.chunks > 0 and entries.failures == 0 and entries.entries > 0
    return dict(device=str(device), steps=steps, busy_steps=busy, requests_arrived=arrived, requests_finished=finished,
                tokens=tokens, chunks_emitted=checker.chunks, verify_steps=verify_steps,
                cache_entries_checked=entries.entries, cache_entry_failures=entries.failures,
                cache_max_dequant_error=entries.max_err,
                drafts_accepted=accepted_drafts, drafts_rejected=rejected_drafts,
                max_relative_error=checker.max_err, chunk_failures=checker.failures,
                metadata_failures=meta.failures, backends=backends, head_dim=d,
                plan_us=timer.mean("plan"), prefill_us=timer.mean("prefill"), prefill_torch_us=timer.mean("prefill_torch"),
                decode_us=timer.mean("decode"), decode_torch_us=timer.mean("decode_torch"),
                verify_us=timer.mean("verify"), commit_us=timer.mean("commit"), metadata_us=timer.mean("metadata"),
                metadata_torch_us=timer.mean("metadata_torch"), wall_s=time.perf_counter() - started, ok=ok)
