"""`python -m pydsa soak`: the c128 serving loop and a c4 layer beside it for as many steps as asked, every
step busy, every result checked against float64 where the ops ran (the GPU, or the host backend), and the
memory judged for growth.

Requests keep arriving (prompts of 1..3000 tokens, outputs of 20..300) and finishing over 32 main
state slots, so the slots, their bank entries and the KV-cache entries are reused over and over. Each
step prefills a chunk of every prefilling request (up to 512 tokens each, 2048 per step, planned by a
DevicePlan) and runs, for the decoding requests, a plain decode (one step in three) or a speculative
step: V = 4 drafts verified in one launch, a random number accepted, the commit resolving on the device
where each state now is (the next op reads it from there: the host never learns it). Every op stores
the vectors it closes into a paged fp8 KV cache in the same launch. A c4 layer serves requests of its
own beside it, one serving step every 8 loop steps, with both its compressors (main D = 512 into a "v4"
cache, the indexer's D = 128 into an "indexer" cache): chunked prefills as c4_extend, plain decodes as
c4_decode, speculative steps as c4_verify with a random number of drafts accepted (pydsa/_soak_c4.py).

The checks run where the ops run, so the loop waits for the GPU only at checkpoints:
- every accepted chunk vector against the float64 softmax over its 128 raw rows (kept per slot in a
  ring), relative error < 1e-5: a rejected draft leaking into a state, a stale state read, an
  unwritten output (outputs are poisoned with NaN before each launch) all fail it; every committed c4
  entry of both compressors likewise against the float64 formula over its 8 raw rows;
- the KV cache, byte for byte, against a mirror that the standalone store fills from the same vectors
  at the same slots and positions (the entries of rejected drafts included), often enough that every
  entry is compared before its slot is reused; both c4 caches likewise;
- the index errors the ops skip and count (must stay 0).
At each checkpoint the counters are read. The memory is sampled as the run goes (at most 256 times) and
judged for growth after the first quarter of the steps (pydsa/_soak_memory.py): the device memory in use
exactly (never above its level then), the host heap in use and the resident memory less the allocator's
free bytes within a floor and their own measured noise, so that a leak fails and allocator noise passes.
"""
from __future__ import annotations

import gc
import sys
import time

import numpy as np
import torch

from ._abi import CHUNK
from ._serving import ServingLoop, Workload
from ._serving_offline import CONFIGS, serving_loop
from ._tensors import resolve_device
from ._soak_c4 import C4_EVERY, C4_SLOTS, RING as C4_RING, C4Soak
from ._soak_memory import MemoryTrace
from ._soak_report import progress_line, summary_text
from .demo import TOLERANCE  # the demo's check limit
from .errors import ArgumentTypeError, ArgumentValueError
from .store import KVCache, kv_page_bytes, kv_store

D, DRAFTS = 512, 4
MAX_RUNNING = 32  # requests served at once, one main state slot each
MAX_EXTEND, TOKEN_BUDGET = 512, 2048  # a prefill chunk's tokens per request, and per step
WORKLOAD = Workload(MAX_RUNNING, TOKEN_BUDGET, MAX_EXTEND, drafts=DRAFTS, cache_slots=4096, head_dim=D)
RING = 1024  # raw rows kept per slot (>= MAX_EXTEND + CHUNK: a closing's window is always there)
CACHE_SLOTS = WORKLOAD.cache_slots
# The cache is compared with its mirror every COMPARE_EVERY steps: a step stores at most
# TOKEN_BUDGET / CHUNK + MAX_RUNNING entries, so an entry lives at least CACHE_SLOTS / 80 = 51 steps
# before its slot is reused, and every entry ever written is compared at least once.
COMPARE_EVERY = 16
# The float64 check runs every CHECK_EVERY steps over the vectors closed since the last one (their raw
# windows gathered from the ring at the step that closed them), or sooner when the held buffers could
# not take another step's closings (at most TOKEN_BUDGET / CHUNK + 2 * MAX_RUNNING).
CHECK_EVERY, MAX_CLOSED = 8, TOKEN_BUDGET // CHUNK + 2 * MAX_RUNNING
WINDOWS_HELD, VECTORS_HELD = 256, 512
TRASH = MAX_RUNNING * RING  # the ring row that takes what must not be kept
# What a self-test may break; each must fail the run: `out` perturbs the outputs before the check; `leak`
# commits every verified draft while the checks accept only some; `cache` flips a cache byte; `c4ring`
# shifts the c4 main ring's rows (a stale state); `c4cache` flips a c4 cache byte; `retain` keeps one
# request's raw rows (RING rows, 4 MiB) every RETAIN_EVERY steps, a leak of one request's state.
FAULTS = ("out", "leak", "cache", "c4ring", "c4cache", "retain")
RETAIN_EVERY = 50


@torch.inference_mode()
def run(steps=1_000_000, device=None, seed=0, checkpoint=10_000, fault=None, progress=True, pool_rows=1 << 14,
        config="online") -> dict:
    """Runs the soak; returns its summary (ok: every check passed, every step busy, no memory growing).
    fault: break one thing on purpose (one of FAULTS) — the run must then fail. config: the c128 layer's
    compressor, "online" or "default" (sglang's default: the offline one, pydsa/_serving_offline.py; no commit,
    so no `leak`)."""
    _check_arguments(steps, checkpoint, fault, config)
    device = resolve_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    f32 = dict(dtype=torch.float32, device=device)
    w = torch.rand(D, generator=gen, **f32) + 0.5
    angles = torch.rand(1 << 12, 32, generator=gen, **f32) * 6.3
    rot = torch.stack([angles.cos(), angles.sin()], -1).reshape(1 << 12, 64)
    cache, mirror = (KVCache(torch.zeros(CACHE_SLOTS // 2, kv_page_bytes(D, 2), dtype=torch.uint8, device=device), w,
                             rot, page_size=2) for _ in range(2))
    loop = serving_loop(config, WORKLOAD, device, seed=seed, store=cache, pool_rows=pool_rows, leak=fault == "leak")
    check = C128Check(loop, mirror, steps, fault)
    c4 = C4Soak(device, loop.staging, loop.errors, rot, w, drafts=DRAFTS, pool_rows=pool_rows, seed=seed, fault=fault,
                steps=steps)
    loop.observers += [check, c4]
    gc.collect()  # what earlier work in this process left for the collector is freed now, not during the run
    memory, marks = MemoryTrace(steps, device), []  # marks: the checkpoints (_mark)
    started = time.perf_counter()
    tty = progress and sys.stderr.isatty()
    for step in range(steps):
        at_mark = (step + 1) % checkpoint == 0 or step + 1 == steps
        loop.step(step, sync=at_mark)
        memory.sample(step)
        if at_mark:
            marks.append(_mark(step + 1, check, loop.errors, c4=c4, memory=memory))
            if progress:
                counts = dict(loop.counts, chunks=check.chunks)
                progress_line(marks[-1], counts, c4.counts, steps, time.perf_counter() - started, tty)
    if tty:
        print(file=sys.stderr)
    counts = dict(loop.counts, chunks=check.chunks, entries=check.entries)
    return dict(_summary(device, steps, counts, c4.counts, marks, memory=memory.judge(), fault=fault, seed=seed,
                         wall=time.perf_counter() - started), config=config)


class C128Check:
    """The soak's checks of the c128 layer, run where the ops run (an observer of the ServingLoop): every
    input row a request keeps goes into its slot's ring of RING raw rows (the others to TRASH); every vector
    an op closes is stored again into the mirror cache by the standalone store, and the committed ones are
    held, with their 128-row raw windows gathered from the ring at the step that closed them, for the
    float64 check. Counters on the device: failures, mismatches, max_err."""

    def __init__(self, loop: ServingLoop, mirror: KVCache, steps: int, fault: str | None):
        f32, device = dict(dtype=torch.float32, device=loop.device), loop.device
        self.loop, self.mirror, self.steps, self.fault = loop, mirror, steps, fault
        self.ape64 = loop.ape.double()
        self.ring = torch.zeros(MAX_RUNNING * RING + 1, 2 * D, **f32)  # the last row takes the rejected drafts' rows
        self.vectors = torch.zeros(VECTORS_HELD, D, **f32)  # the vectors closed since the last check, in order
        self.held = torch.zeros(WINDOWS_HELD * CHUNK, 2 * D, **f32)  # the raw windows of those to check
        self.failures = torch.zeros((), dtype=torch.int64, device=device)
        self.mismatches = torch.zeros((), dtype=torch.int64, device=device)
        self.max_err = torch.zeros((), dtype=torch.float64, device=device)
        self.pending, self.pending_rows, self.vec_used, self.chunks, self.entries = 0, [], 0, 0, 0
        self.broken, self.retained = False, []

    def stage(self, step) -> None:
        """Stages the ring rows of every input row, the mirror's positions and slots of every closed vector,
        the windows of the committed ones, and the check's rows when it is due."""
        st, parts, windows = self.loop.staging, [], []
        self.rows = [st.put64(np.where(x.committed, x.owner * RING + x.position % RING, TRASH)) for x in step.launches]
        for x in step.launches:
            closes = x.closes
            if not len(closes):
                continue
            kept = x.committed[closes]
            parts.append((x.out, st.put64(x.out_row[closes]), self.vectors[self.vec_used:self.vec_used + len(closes)],
                          x.position[closes], x.cache_slot[closes]))
            self.pending_rows.append(np.arange(self.vec_used, self.vec_used + len(closes))[kept])
            closing = x.position[closes][kept]
            windows.append(((closing[:, None] - (CHUNK - 1) + np.arange(CHUNK)) % RING
                            + x.owner[closes][kept][:, None] * RING).reshape(-1))
            self.pending += int(kept.sum())
            self.vec_used += len(closes)
        self.stored = sum(len(p[3]) for p in parts)
        if self.stored:
            self.positions = st.put32(np.concatenate([p[3] for p in parts]) - (CHUNK - 1))
            self.mirror_slots = st.put64(np.concatenate([p[4] for p in parts]))
            window = np.concatenate(windows)
            self.window = st.put64(window) if len(window) else None
            self.step_vectors = self.vectors[self.vec_used - self.stored:self.vec_used]
        self.parts, self.first_slot = [p[:3] for p in parts], int(parts[0][4][0]) if parts else -1
        self.check_now = self.pending and (self.pending + MAX_CLOSED > WINDOWS_HELD
                                           or self.vec_used + MAX_CLOSED > VECTORS_HELD
                                           or step.index % CHECK_EVERY == CHECK_EVERY - 1 or step.sync)
        if self.check_now:
            self.check_rows = st.put64(np.concatenate(self.pending_rows))

    def launched(self, step) -> None:
        """The ring, the mirror, the held windows; the float64 check and the cache comparison when due."""
        for x, rows in zip(step.launches, self.rows):
            self.ring.index_copy_(0, rows, x.kv)
        if self.stored:
            for out, rows, into in self.parts:
                torch.index_select(out, 0, rows, out=into)
            kv_store(self.step_vectors, self.positions, self.mirror_slots, self.mirror, error_count=self.loop.errors)
            if self.window is not None:
                n = self.pending * CHUNK
                torch.index_select(self.ring, 0, self.window, out=self.held[n - len(self.window):n])
            if self.fault == "cache" and not self.broken and step.index >= self.steps // 2:
                self.loop.store.cache.view(-1)[self.first_slot // 2 * self.loop.store.page_bytes] ^= 1
                self.broken = True
            self.entries += self.stored
        if self.check_now:
            self._check()
        if not self.pending:
            self.vec_used = 0  # no held vector is waiting for its check: the rows are free again (stream order)
        if step.index % COMPARE_EVERY == 0 or step.index + 1 == self.steps:
            self.mismatches += (self.loop.store.cache != self.mirror.cache).any()
        if self.fault == "retain" and step.index % RETAIN_EVERY == RETAIN_EVERY - 1:
            self.retained.append(self.ring[:RING].clone())

    def _check(self) -> None:
        """The float64 reference of every vector held since the last check."""
        got = self.vectors.index_select(0, self.check_rows).double()
        if self.fault == "out":
            got[:, 0] += 1e-3
        raw = self.held[:self.pending * CHUNK].view(self.pending, CHUNK, 2 * D).double()
        weights = torch.softmax(raw[..., D:] + self.ape64, dim=1)
        ref = (weights * raw[..., :D]).sum(1)
        err = torch.linalg.vector_norm(got - ref, dim=1) / torch.linalg.vector_norm(ref, dim=1)
        self.failures += (~(err < TOLERANCE)).sum()
        torch.maximum(self.max_err, err.max(), out=self.max_err)
        self.chunks += self.pending
        del got, raw, weights, ref, err  # nothing of a check outlives it: the memory at checkpoints is exact
        self.pending, self.pending_rows = 0, []


def _check_arguments(steps, checkpoint, fault, config) -> None:
    for name, value in (("steps", steps), ("checkpoint", checkpoint)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError(name, f"{name} must be an int >= 1 (got {type(value).__name__} {value!r})")
        if value < 1:
            raise ArgumentValueError(name, f"{name} must be an int >= 1 (got {value!r})")
    if fault is not None and fault not in FAULTS:
        raise ArgumentValueError("fault", f"fault must be None or one of {', '.join(FAULTS)} (got {fault!r})")
    if config not in CONFIGS:
        raise ArgumentValueError("config", f"config must be one of {', '.join(CONFIGS)} (got {config!r})")
    if config == "default" and fault == "leak":
        raise ArgumentValueError("fault", "fault leak commits rejected drafts; config \"default\" (the offline c128 "
                                 "compressor) has no commit: run it with config \"online\"")


def _mark(step, check, errors, *, c4, memory) -> dict:
    """A checkpoint: the device's counters (reading them waits for the device) and the memory now."""
    device_mb, heap_mb, resident_mb, rss_mb = memory.now()
    return dict(step=step, chunk_failures=int(check.failures), cache_mismatches=int(check.mismatches),
                index_errors=int(errors.item()) & 0xFFFFFFFF, max_relative_error=float(check.max_err),
                c4_failures=int(c4.failures), c4_cache_mismatches=int(c4.mismatches),
                c4_max_relative_error=float(c4.max_err), device_mb=device_mb, heap_mb=heap_mb,
                resident_less_free_mb=resident_mb, rss_mb=rss_mb)


def _summary(device, steps, counts, c4_counts, marks, *, memory, fault, seed, wall) -> dict:
    """The run's summary: its counts, the last checkpoint's counters, the memory judgement, ok."""
    first, last = marks[0], marks[-1]
    flat = all(m["ok"] for m in memory.values())
    ok = (last["chunk_failures"] == last["cache_mismatches"] == last["index_errors"] == 0 and counts["chunks"] > 0
          and last["c4_failures"] == last["c4_cache_mismatches"] == 0 and c4_counts["c4_entries_checked"] > 0
          and counts["busy"] == steps and flat)
    return dict(device=str(device), steps=steps, busy_steps=counts["busy"], requests_arrived=counts["arrived"],
                requests_finished=counts["finished"], tokens=counts["tokens"], prefill_launches=counts["prefill_launches"],
                decode_steps=counts["decode_steps"], verify_steps=counts["verify_steps"],
                drafts_accepted=counts["drafts_accepted"], drafts_rejected=counts["drafts_rejected"],
                chunks_checked=counts["chunks"], chunk_failures=last["chunk_failures"],
                max_relative_error=last["max_relative_error"], cache_entries_stored=counts["entries"],
                cache_mismatches=last["cache_mismatches"], index_errors=last["index_errors"], **c4_counts,
                c4_failures=last["c4_failures"], c4_max_relative_error=last["c4_max_relative_error"],
                c4_cache_mismatches=last["c4_cache_mismatches"], c4_every=C4_EVERY, c4_slots=C4_SLOTS,
                c4_ring_size=C4_RING,
                device_mb_first=first["device_mb"], device_mb_last=last["device_mb"], rss_mb_first=first["rss_mb"],
                rss_mb_last=last["rss_mb"], memory=memory, memory_flat=flat, checkpoints=marks, fault=fault, seed=seed,
                wall_s=wall, ms_per_step=wall / steps * 1e3, ok=ok)


def main(argv=None) -> int:
    """`python -m pydsa soak`'s command line: flags checked first, the run, its summary (--json: strict JSON)."""
    import argparse
    from ._cli import add_run_flags, judge_run_flags, write_json
    what = " ".join(__doc__.split("\n\n")[0].split()).split(": ", 1)[1]  # the docstring's first paragraph
    ap = argparse.ArgumentParser(prog="python -m pydsa soak", description=what[0].upper() + what[1:],
                                 epilog="Exit status 0 when every check passed, every step was busy and no memory grew "
                                        "(PASS); 1 otherwise (FAIL, the line that saw it marked); 2 for a wrong flag.")
    ap.add_argument("--steps", type=int, default=100_000, help="serving steps to run, every one busy (default 100000)")
    ap.add_argument("--checkpoint", type=int, default=10_000, help="steps between checkpoints: the only points "
                    "where the loop waits for the device and reads the counters (default 10000)")
    ap.add_argument("--config", choices=CONFIGS, default="online", help="the c128 layer's compressor: online (the "
                    "default) or default (sglang's default configuration: the offline compressor)")
    add_run_flags(ap)
    args = ap.parse_args(argv)
    device = judge_run_flags(ap, args, {"--steps": args.steps, "--checkpoint": args.checkpoint})
    where = "the host backend" if device.type == "cpu" else torch.cuda.get_device_name(device)
    print(f"pydsa soak: {args.steps} steps, run and checked on {where}, a checkpoint every {args.checkpoint}, "
          f"--config {args.config}")
    r = run(args.steps, device, args.seed, args.checkpoint, config=args.config)
    print(summary_text(r, TOLERANCE))
    if args.json:  # strict JSON, with where and how it ran
        import datetime
        from . import __version__
        r = dict(gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "none (host backend)",
                 date=datetime.date.today().isoformat(), command="python -m pydsa soak " + " ".join(argv or sys.argv[1:]),
                 pydsa=__version__, torch=torch.__version__, python=sys.version.split()[0], **r)
        write_json(args.json, r)
    return 0 if r["ok"] else 1
