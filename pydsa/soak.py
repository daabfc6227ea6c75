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

import sys
import time

import numpy as np
import torch

from ._abi import CHUNK
from ._tensors import resolve_device
from ._soak_c4 import C4_EVERY, C4_SLOTS, RING as C4_RING, C4Soak
from ._soak_memory import MemoryTrace
from ._soak_report import progress_line, summary_text
from .c128 import C128Decode, C128Prefill, DevicePlan
from .demo import TOLERANCE, _bucket  # the demo's check limit and its CUDA-graph batch buckets
from .errors import ArgumentTypeError, ArgumentValueError
from .speculative import C128Commit, C128Verify
from .store import KVCache, kv_page_bytes, kv_store

D, DRAFTS = 512, 4
MAX_RUNNING = 32  # requests served at once, one main state slot each
MAX_EXTEND, TOKEN_BUDGET = 512, 2048  # a prefill chunk's tokens per request, and per step
RING = 1024  # raw rows kept per slot (>= MAX_EXTEND + CHUNK: a closing's window is always there)
CACHE_SLOTS = 4096
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

# int32 staging: the ops' host-known index buffers at fixed offsets (MAX_RUNNING each), then the
# mirror store's positions and the c4 layer's indices.
P_IDX, P_LOAD, D_IDX, D_SEQ, V_SEQ, V_BANK, V_LENS, V_ACC = (i * MAX_RUNNING for i in range(8))
I32_FIXED = 8 * MAX_RUNNING
# int64 staging: the ops' cache slots (per prefill row, per decode row, per draft), then the
# step's gather and scatter indices and the c4 layer's (its check's windows: 16 per entry, up to 4096).
P_SLOTS, D_SLOTS, V_SLOTS = 0, TOKEN_BUDGET, TOKEN_BUDGET + MAX_RUNNING
I64_FIXED = TOKEN_BUDGET + MAX_RUNNING * (1 + DRAFTS)


class _Staging:
    """The step's index data, built in numpy and sent in one int32 and one int64 copy."""

    def __init__(self, device):
        self.h32 = np.zeros(I32_FIXED + 16384, np.int32)
        self.h64 = np.zeros(I64_FIXED + 131072, np.int64)
        self.t32, self.t64 = torch.from_numpy(self.h32), torch.from_numpy(self.h64)
        self.d32 = torch.zeros(len(self.h32), dtype=torch.int32, device=device)
        self.d64 = torch.zeros(len(self.h64), dtype=torch.int64, device=device)
        self.n32, self.n64 = I32_FIXED, I64_FIXED

    def reset(self):
        self.n32, self.n64 = I32_FIXED, I64_FIXED

    def put64(self, values, align: int = 1) -> torch.Tensor:
        """Appends values to the int64 staging at a multiple of `align` values; returns their device view
        (valid after send())."""
        self.n64 += -self.n64 % align
        view, self.n64 = self._put(self.h64, self.d64, self.n64, values)
        return view

    def put32(self, values) -> torch.Tensor:
        view, self.n32 = self._put(self.h32, self.d32, self.n32, values)
        return view

    @staticmethod
    def _put(host, dev, at, values):
        host[at:at + len(values)] = values
        return dev[at:at + len(values)], at + len(values)

    def send(self):
        self.d32[:self.n32].copy_(self.t32[:self.n32], non_blocking=True)  # pageable: staged before it returns
        self.d64[:self.n64].copy_(self.t64[:self.n64], non_blocking=True)


@torch.inference_mode()
def run(steps=1_000_000, device=None, seed=0, checkpoint=10_000, fault=None, progress=True, pool_rows=1 << 14) -> dict:
    """Runs the soak; returns its summary (ok: every check passed, every step busy, no memory growing).
    fault: break one thing on purpose (one of FAULTS) — the run must then fail."""
    _check_arguments(steps, checkpoint, fault)
    device = resolve_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    f32 = dict(dtype=torch.float32, device=device)
    num_main = MAX_RUNNING
    num_slots = num_main * (DRAFTS + 2)  # main slots, then V + 1 bank entries per main slot

    # --- the layer: state, ape, the caches, the raw-row pool the inputs are drawn from ----------------
    ape = torch.randn(CHUNK, D, generator=gen, **f32)
    ape64 = ape.double()
    state = torch.randn(num_slots, 1, 3 * D, generator=gen, **f32)  # stale contents: must never leak in
    pool = torch.randn(pool_rows + TOKEN_BUDGET, 2 * D, generator=gen, **f32)
    pool[:, D:] *= 3.0
    w = torch.rand(D, generator=gen, **f32) + 0.5
    angles = torch.rand(1 << 12, 32, generator=gen, **f32) * 6.3
    rot = torch.stack([angles.cos(), angles.sin()], -1).reshape(1 << 12, 64)
    page = kv_page_bytes(D, 2)
    cache = KVCache(torch.zeros(CACHE_SLOTS // 2, page, dtype=torch.uint8, device=device), w, rot, page_size=2)
    mirror = KVCache(torch.zeros(CACHE_SLOTS // 2, page, dtype=torch.uint8, device=device), w, rot, page_size=2)
    errors = torch.zeros(1, dtype=torch.int32, device=device)  # the ops' skipped-and-counted indices
    ring = torch.zeros(num_main * RING + 1, 2 * D, **f32)  # the last row takes the rejected drafts' rows
    vectors = torch.zeros(VECTORS_HELD, D, **f32)  # the vectors closed since the last check, in order
    held = torch.zeros(WINDOWS_HELD * CHUNK, 2 * D, **f32)  # the raw windows of those to check
    # device-side results, read at checkpoints only
    failures = torch.zeros((), dtype=torch.int64, device=device)
    mismatches = torch.zeros((), dtype=torch.int64, device=device)
    max_err = torch.zeros((), dtype=torch.float64, device=device)
    # where each slot's state is after a verify: [0, num_main) written by the commit, then constants
    load_table = torch.cat([torch.arange(num_main, dtype=torch.int32), torch.arange(num_main, dtype=torch.int32)]).to(device)

    st = _Staging(device)
    c4 = C4Soak(device, st, errors, rot, w, drafts=DRAFTS, pool_rows=pool_rows, seed=seed, fault=fault)
    memory, retained = MemoryTrace(steps, device), []
    d32, d64 = st.d32, st.d64
    kv_pre = torch.empty(TOKEN_BUDGET, 2 * D, **f32)
    plan = DevicePlan(TOKEN_BUDGET, MAX_RUNNING, device=device)
    out_pre = torch.empty(plan.compress_capacity, D, **f32)  # compact: row i = compress record i
    prefill = C128Prefill(state, kv_pre, out_pre, ape, d32[P_IDX:P_IDX + MAX_RUNNING], plan,
                          load_indices=d32[P_LOAD:P_LOAD + MAX_RUNNING], compact=True, store=cache,
                          cache_slots=d64[P_SLOTS:P_SLOTS + TOKEN_BUDGET], error_count=errors)
    decode_ops, verify_ops = {}, {}

    def decode_op(b):
        if b not in decode_ops:
            kv, out, load = torch.empty(b, 2 * D, **f32), torch.empty(b, D, **f32), torch.zeros(b, dtype=torch.int32, device=device)
            decode_ops[b] = (kv, out, load, C128Decode(state, kv, out, ape, d32[D_IDX:D_IDX + b], d32[D_SEQ:D_SEQ + b],
                                                       load_indices=load, store=cache, cache_slots=d64[D_SLOTS:D_SLOTS + b],
                                                       error_count=errors))
        return decode_ops[b]

    def verify_op(b):
        if b not in verify_ops:
            drafts, out = torch.empty(b * DRAFTS, 2 * D, **f32), torch.empty(b * DRAFTS, D, **f32)
            load = torch.zeros(b, dtype=torch.int32, device=device)
            seq, bank, lens = d32[V_SEQ:V_SEQ + b], d32[V_BANK:V_BANK + b], d32[V_LENS:V_LENS + b]
            verify = C128Verify(state, drafts, out, ape, load, seq, bank_indices=bank, verify_lens=lens, store=cache,
                                cache_slots=d64[V_SLOTS:V_SLOTS + b * DRAFTS], error_count=errors)
            commit = C128Commit(seq, d32[V_ACC:V_ACC + b], load, bank, num_drafts=DRAFTS, verify_lens=lens,
                                load_indices=load, num_slots=num_slots, error_count=errors)
            verify_ops[b] = (drafts, out, load, verify, commit)
        return verify_ops[b]

    # --- the requests, one per main slot ----------------------------------------------------------
    active = np.zeros(num_main, bool)
    prompt = np.zeros(num_main, np.int64)
    total = np.zeros(num_main, np.int64)
    done = np.zeros(num_main, np.int64)
    on_device = np.zeros(num_main, bool)  # the state's slot is known only to the device (after a commit)
    counts = dict(arrived=0, finished=0, tokens=0, chunks=0, entries=0, verify_steps=0, decode_steps=0,
                  prefill_launches=0, drafts_accepted=0, drafts_rejected=0, busy=0)
    next_cache = 0
    marks = []  # the checkpoints (_mark)

    def cache_slots(k):
        nonlocal next_cache
        s = (next_cache + np.arange(k)) % CACHE_SLOTS
        next_cache = (next_cache + k) % CACHE_SLOTS
        return s

    def windows(slots, closing):
        """ring rows of each closing position's 128-row window, flattened [k * 128]"""
        return ((closing[:, None] - (CHUNK - 1) + np.arange(CHUNK)) % RING + slots[:, None] * RING).reshape(-1)

    def pool_rows_at(n):
        o = int(rng.integers(0, pool_rows))
        return pool[o:o + n]

    for b in (1 << i for i in range(MAX_RUNNING.bit_length())):  # every bucket's op now: memory stays flat
        decode_op(b)
        verify_op(b)
    draft_of = {nb: np.divmod(np.arange(nb * DRAFTS), DRAFTS) for nb in range(1, MAX_RUNNING + 1)}  # (request, draft)
    pending, pending_rows, pending_windows, vec_used = 0, [], [], 0
    broken = False
    started = time.perf_counter()
    tty = progress and sys.stderr.isatty()
    for step in range(steps):
        st.reset()
        while not active.all() and (not active.any() or rng.random() < 0.3):
            s = int(np.flatnonzero(~active)[0])
            active[s] = True
            prompt[s] = int(rng.integers(1, 3001))
            total[s] = prompt[s] + int(rng.integers(20, 301))
            done[s] = 0
            on_device[s] = False
            counts["arrived"] += 1
        pre = np.flatnonzero(active & (done < prompt))
        dec = np.flatnonzero(active & (done >= prompt))
        stores = []  # (op output, its rows that closed a chunk, whether each is checked, window slots, closings)

        # --- host side of the prefill: its plan, slots and the rows it absorbs ----------------------
        if len(pre):
            e = np.minimum(prompt[pre] - done[pre], rng.integers(1, MAX_EXTEND + 1, len(pre)))
            e = np.minimum(e, TOKEN_BUDGET - (np.cumsum(e) - e))
            keep = e > 0
            pre, e = pre[keep], e[keep]
            n = int(e.sum())
            plan.plan(done[pre] + e, e)
            comp = plan.host_records[0]
            k = len(comp)
            st.h32[P_IDX:P_IDX + len(pre)] = pre
            st.h32[P_LOAD:P_LOAD + len(pre)] = pre  # a prefilling request's state is in its main slot
            st.h64[P_SLOTS:P_SLOTS + TOKEN_BUDGET] = -1
            slots = cache_slots(k)
            st.h64[P_SLOTS + comp["ragged_id"]] = slots
            position = np.repeat(done[pre] - (np.cumsum(e) - e), e) + np.arange(n)
            pre_ring = st.put64(np.repeat(pre * RING, e) + position % RING)
            if k:
                closing = comp["position"].astype(np.int64)
                stores.append((out_pre, np.arange(k), None, pre[comp["batch_id"]], closing, slots))
            kv_src = pool_rows_at(n)

        # --- host side of the decode or speculative step ------------------------------------------
        verify = bool(len(dec)) and step % 3 != 0
        if len(dec):
            nb = len(dec)
            b = _bucket(nb)
            at = done[dec]
            load_gather = st.put64(np.concatenate([dec + np.where(on_device[dec], 0, num_main),
                                                   np.full(b - nb, num_main, np.int64)]))
        if len(dec) and not verify:
            kv, out, load, op = decode_op(b)
            st.h32[D_IDX:D_IDX + nb] = dec
            st.h32[D_IDX + nb:D_IDX + b] = 0
            st.h32[D_SEQ:D_SEQ + nb] = at + 1
            st.h32[D_SEQ + nb:D_SEQ + b] = 0  # 0: padding
            closes = np.flatnonzero(at % CHUNK == CHUNK - 1)
            slots = cache_slots(len(closes))
            st.h64[D_SLOTS:D_SLOTS + b] = -1
            st.h64[D_SLOTS + closes] = slots
            dec_ring = st.put64(np.concatenate([dec * RING + at % RING, np.full(b - nb, TRASH, np.int64)]))
            if len(closes):
                stores.append((out, closes, None, dec[closes], at[closes], slots))
            dec_src = pool_rows_at(b)
            accepted = np.ones(nb, np.int64)
        elif len(dec):
            drafts, out, load, vop, cop = verify_op(b)
            j, i = draft_of[nb]
            lens = np.where(rng.random(nb) < 0.2, rng.integers(0, DRAFTS + 1, nb), DRAFTS)
            lens = np.minimum(lens, total[dec] - at)
            pick = rng.integers(0, 4, nb)  # none, all, up to the chunk end, or any number
            accepted = np.choose(pick, [np.zeros(nb, np.int64), lens, np.minimum(lens, CHUNK - at % CHUNK),
                                        (rng.random(nb) * (lens + 1)).astype(np.int64)])
            st.h32[V_SEQ:V_SEQ + nb] = at
            st.h32[V_BANK:V_BANK + nb] = num_main + dec * (DRAFTS + 1)
            st.h32[V_LENS:V_LENS + nb] = lens
            st.h32[V_ACC:V_ACC + nb] = lens if fault == "leak" else accepted
            for o in (V_SEQ, V_BANK, V_LENS, V_ACC):
                st.h32[o + nb:o + b] = 0  # 0: padding
            pos = at[j] + i
            closes = np.flatnonzero((i < lens[j]) & (pos % CHUNK == CHUNK - 1))  # every draft that closes
            slots = cache_slots(len(closes))
            st.h64[V_SLOTS:V_SLOTS + b * DRAFTS] = -1
            st.h64[V_SLOTS + closes] = slots
            # the accepted drafts' rows go into the ring, the others to a row never read
            rows = np.full(b * DRAFTS, TRASH, np.int64)
            rows[:nb * DRAFTS] = np.where(i < accepted[j], dec[j] * RING + pos % RING, TRASH)
            dec_ring = st.put64(rows)
            scatter = st.put64(dec)
            if len(closes):
                stores.append((out, closes, i[closes] < accepted[j[closes]], dec[j[closes]], pos[closes], slots))
            dec_src = pool_rows_at(b * DRAFTS)

        # every vector closed this step: stored again into the mirror, and kept for the float64 check
        stored = sum(len(x[1]) for x in stores)
        if stored:
            parts = []
            for o, rows, kept, owners, closing, slots in stores:
                parts.append((o, st.put64(rows), vectors[vec_used:vec_used + len(rows)]))
                sel = np.arange(vec_used, vec_used + len(rows))
                if kept is not None:
                    sel, owners, closing = sel[kept], owners[kept], closing[kept]
                pending_rows.append(sel)
                pending_windows.append(windows(owners, closing))
                pending += len(sel)
                vec_used += len(rows)
            positions = st.put32(np.concatenate([x[4] for x in stores]) - (CHUNK - 1))
            mirror_slots = st.put64(np.concatenate([x[5] for x in stores]))
            window = np.concatenate(pending_windows[-len(stores):])
            window = st.put64(window) if len(window) else None
            step_vectors = vectors[vec_used - stored:vec_used]
        at_mark = (step + 1) % checkpoint == 0 or step + 1 == steps
        check_now = pending and (pending + MAX_CLOSED > WINDOWS_HELD or vec_used + MAX_CLOSED > VECTORS_HELD
                                 or step % CHECK_EVERY == CHECK_EVERY - 1 or at_mark)
        if check_now:
            check_rows = st.put64(np.concatenate(pending_rows))
        c4.plan(step, at_mark)

        # --- the device side: one copy of the indices, the ops, the checks ---------------------------
        st.send()
        c4.launch(step, steps)
        if len(pre):
            kv_pre[:n].copy_(kv_src)
            out_pre[:k].fill_(float("nan"))
            prefill.launch()
            ring.index_copy_(0, pre_ring, kv_pre[:n])
            counts["prefill_launches"] += 1
            counts["tokens"] += n
            done[pre] += e
        if len(dec):
            torch.index_select(load_table, 0, load_gather, out=load)
            out.fill_(float("nan"))
            if not verify:
                kv.copy_(dec_src)
                op.launch()
                ring.index_copy_(0, dec_ring, kv)
                on_device[dec] = False
                counts["decode_steps"] += 1
            else:
                drafts.copy_(dec_src)
                vop.launch()
                cop.launch()
                load_table.index_copy_(0, scatter, load[:nb])
                ring.index_copy_(0, dec_ring, drafts)
                on_device[dec] = True
                counts["verify_steps"] += 1
                counts["drafts_accepted"] += int(accepted.sum())
                counts["drafts_rejected"] += int((lens - accepted).sum())
            counts["tokens"] += int(accepted.sum())
            done[dec] += accepted
        if stored:
            for o, rows, into in parts:
                torch.index_select(o, 0, rows, out=into)
            kv_store(step_vectors, positions, mirror_slots, mirror, error_count=errors)
            if window is not None:
                torch.index_select(ring, 0, window, out=held[pending * CHUNK - len(window):pending * CHUNK])
            if fault == "cache" and not broken and step >= steps // 2:
                cache.cache.view(-1)[int(stores[0][5][0]) // 2 * page] ^= 1
                broken = True
            counts["entries"] += stored
        if check_now:  # the float64 reference of every vector held since the last check
            got = vectors.index_select(0, check_rows).double()
            if fault == "out":
                got[:, 0] += 1e-3
            raw = held[:pending * CHUNK].view(pending, CHUNK, 2 * D).double()
            weights = torch.softmax(raw[..., D:] + ape64, dim=1)
            ref = (weights * raw[..., :D]).sum(1)
            err = torch.linalg.vector_norm(got - ref, dim=1) / torch.linalg.vector_norm(ref, dim=1)
            failures += (~(err < TOLERANCE)).sum()
            torch.maximum(max_err, err.max(), out=max_err)
            counts["chunks"] += pending
            del got, raw, weights, ref, err  # nothing of a check outlives it: the memory at checkpoints is exact
            pending, pending_rows, pending_windows = 0, [], []
        if not pending:
            vec_used = 0  # no held vector is waiting for its check: the rows are free again (stream order)
        if step % COMPARE_EVERY == 0 or step + 1 == steps:
            mismatches += (cache.cache != mirror.cache).any()
        counts["busy"] += bool(len(pre) or len(dec))
        finished = active & (done >= total)
        counts["finished"] += int(finished.sum())
        active &= ~finished
        if fault == "retain" and step % RETAIN_EVERY == RETAIN_EVERY - 1:
            retained.append(ring[:RING].clone())
        memory.sample(step)
        if at_mark:
            marks.append(_mark(step + 1, failures, mismatches, errors, max_err, c4=c4, memory=memory))
            if progress:
                progress_line(marks[-1], counts, c4.counts, steps, time.perf_counter() - started, tty)
    if tty:
        print(file=sys.stderr)
    return _summary(device, steps, counts, c4.counts, marks, memory=memory.judge(), fault=fault, seed=seed,
                    wall=time.perf_counter() - started)


def _check_arguments(steps, checkpoint, fault) -> None:
    for name, value in (("steps", steps), ("checkpoint", checkpoint)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError(name, f"{name} must be an int >= 1 (got {type(value).__name__} {value!r})")
        if value < 1:
            raise ArgumentValueError(name, f"{name} must be an int >= 1 (got {value!r})")
    if fault is not None and fault not in FAULTS:
        raise ArgumentValueError("fault", f"fault must be None or one of {', '.join(FAULTS)} (got {fault!r})")


def _mark(step, failures, mismatches, errors, max_err, *, c4, memory) -> dict:
    """A checkpoint: the device's counters (reading them waits for the device) and the memory now."""
    device_mb, heap_mb, resident_mb, rss_mb = memory.now()
    return dict(step=step, chunk_failures=int(failures), cache_mismatches=int(mismatches),
                index_errors=int(errors.item()) & 0xFFFFFFFF, max_relative_error=float(max_err),
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
    add_run_flags(ap)
    args = ap.parse_args(argv)
    device = judge_run_flags(ap, args, {"--steps": args.steps, "--checkpoint": args.checkpoint})
    where = "the host backend" if device.type == "cpu" else torch.cuda.get_device_name(device)
    print(f"pydsa soak: {args.steps} steps, run and checked on {where}, a checkpoint every {args.checkpoint}")
    r = run(args.steps, device, args.seed, args.checkpoint)
    print(summary_text(r, TOLERANCE))
    if args.json:  # strict JSON, with where and how it ran
        import datetime
        from . import __version__
        r = dict(gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else "none (host backend)",
                 date=datetime.date.today().isoformat(), command="python -m pydsa soak " + " ".join(argv or sys.argv[1:]),
                 pydsa=__version__, torch=torch.__version__, python=sys.version.split()[0], **r)
        write_json(args.json, r)
    return 0 if r["ok"] else 1
