"""`python -m pydsa soak`: the c128 serving loop for as many steps as asked, every step busy, every
result checked against float64 on the device.

Requests keep arriving (prompts of 1..3000 tokens, outputs of 20..300) and finishing over 32 main
state slots, so the slots, their bank entries and the KV-cache entries are reused over and over. Each
step prefills a chunk of every prefilling request (up to 512 tokens each, 2048 per step, planned by a
DevicePlan) and runs, for the decoding requests, a plain decode (one step in three) or a speculative
step: V = 4 drafts verified in one launch, a random number accepted, the commit resolving on the device
where each state now is (the next op reads it from there: the host never learns it). Every op stores
the vectors it closes into a paged fp8 KV cache in the same launch.

The checks run on the device, so the loop waits for the GPU only at checkpoints:
- every accepted chunk vector against the float64 softmax over its 128 raw rows (kept per slot in a
  ring), relative error < 1e-5: a rejected draft leaking into a state, a stale state read, an
  unwritten output (outputs are poisoned with NaN before each launch) all fail it;
- the KV cache, byte for byte, against a mirror that the standalone store fills from the same vectors
  at the same slots and positions (the entries of rejected drafts included), often enough that every
  entry is compared before its slot is reused;
- the index errors the ops skip and count (must stay 0).
At each checkpoint the counters are read with the device memory in use and the process's resident
memory, which must not grow after the first checkpoint.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch

from ._tensors import resolve_device
from .c128 import C128Decode, C128Prefill, DevicePlan
from .speculative import C128Commit, C128Verify
from .store import KVCache, kv_page_bytes, kv_store

CHUNK, D, DRAFTS = 128, 512, 4
MAX_RUNNING = 32  # requests served at once, one main state slot each
MAX_EXTEND, TOKEN_BUDGET = 512, 2048  # a prefill chunk's tokens per request, and per step
RING = 1024  # raw rows kept per slot (>= MAX_EXTEND + CHUNK: a closing's window is always there)
CACHE_SLOTS = 4096
TOLERANCE = 1e-5
# The cache is compared with its mirror every COMPARE_EVERY steps: a step stores at most
# TOKEN_BUDGET / CHUNK + MAX_RUNNING entries, so an entry lives at least CACHE_SLOTS / 80 = 51 steps
# before its slot is reused, and every entry ever written is compared at least once.
COMPARE_EVERY = 16
FAULTS = ("out", "leak", "cache")  # what a self-test may break: each must fail the run

# int32 staging: the ops' host-known index buffers at fixed offsets (MAX_RUNNING each), then the
# mirror store's positions.
P_IDX, P_LOAD, D_IDX, D_SEQ, V_SEQ, V_BANK, V_LENS, V_ACC = (i * MAX_RUNNING for i in range(8))
I32_FIXED = 8 * MAX_RUNNING
# int64 staging: the ops' cache slots (per prefill row, per decode row, per draft), then the
# step's gather and scatter indices.
P_SLOTS, D_SLOTS, V_SLOTS = 0, TOKEN_BUDGET, TOKEN_BUDGET + MAX_RUNNING
I64_FIXED = TOKEN_BUDGET + MAX_RUNNING * (1 + DRAFTS)


def _bucket(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return float("nan")


class _Staging:
    """The step's index data, built in numpy and sent in one int32 and one int64 copy."""

    def __init__(self, device):
        self.h32 = np.zeros(I32_FIXED + 4096, np.int32)
        self.h64 = np.zeros(I64_FIXED + 32768, np.int64)
        self.t32, self.t64 = torch.from_numpy(self.h32), torch.from_numpy(self.h64)
        self.d32 = torch.zeros(len(self.h32), dtype=torch.int32, device=device)
        self.d64 = torch.zeros(len(self.h64), dtype=torch.int64, device=device)
        self.n32, self.n64 = I32_FIXED, I64_FIXED

    def reset(self):
        self.n32, self.n64 = I32_FIXED, I64_FIXED

    def put64(self, values) -> torch.Tensor:
        """Appends values to the int64 staging; returns their device view (valid after send())."""
        k = len(values)
        self.h64[self.n64:self.n64 + k] = values
        view = self.d64[self.n64:self.n64 + k]
        self.n64 += k
        return view

    def put32(self, values) -> torch.Tensor:
        k = len(values)
        self.h32[self.n32:self.n32 + k] = values
        view = self.d32[self.n32:self.n32 + k]
        self.n32 += k
        return view

    def send(self):
        self.d32[:self.n32].copy_(self.t32[:self.n32], non_blocking=True)  # pageable: staged before it returns
        self.d64[:self.n64].copy_(self.t64[:self.n64], non_blocking=True)


def run(steps=1_000_000, device=None, seed=0, checkpoint=10_000, fault=None, progress=True, pool_rows=1 << 14) -> dict:
    """Runs the soak; returns its summary (ok: every check passed, every step busy, memory flat).
    fault: break one thing on purpose (`out`: perturb the outputs before the check; `leak`: commit
    every verified draft while the checks accept only some; `cache`: flip a cache byte) — the run must
    then fail."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1 (got {steps!r})")
    if isinstance(checkpoint, bool) or not isinstance(checkpoint, int) or checkpoint < 1:
        raise ValueError(f"checkpoint must be an int >= 1 (got {checkpoint!r})")
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"fault must be None or one of {', '.join(FAULTS)} (got {fault!r})")
    device = resolve_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
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
    ring = torch.empty(num_main * RING, 2 * D, **f32)
    # device-side results, read at checkpoints only
    failures = torch.zeros((), dtype=torch.int64, device=device)
    mismatches = torch.zeros((), dtype=torch.int64, device=device)
    max_err = torch.zeros((), dtype=torch.float64, device=device)
    # where each slot's state is after a verify: [0, num_main) written by the commit, then constants
    load_table = torch.cat([torch.arange(num_main, dtype=torch.int32), torch.arange(num_main, dtype=torch.int32)]).to(device)

    st = _Staging(device)
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
    marks = []  # checkpoints: (step, failures, mismatches, errors, max_err, device MB, rss MB)

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
        store_parts, store_pos, store_slot, check_sel, check_win = [], [], [], [], []
        nstored = 0

        # --- host side of the prefill: its plan, slots and the rows it absorbs ----------------------
        if len(pre):
            e = np.minimum(prompt[pre] - done[pre], rng.integers(1, MAX_EXTEND + 1, len(pre)))
            e = np.clip(np.minimum(e, TOKEN_BUDGET - (np.cumsum(e) - e)), 0, None)
            keep = e > 0
            pre, e = pre[keep], e[keep]
            n = int(e.sum())
            plan.plan(done[pre] + e, e)
            comp = plan.host_records[0]
            ragged, batch, closing = (comp["ragged_id"].astype(np.int64), comp["batch_id"].astype(np.int64),
                                      comp["position"].astype(np.int64))
            k = len(comp)
            st.h32[P_IDX:P_IDX + len(pre)] = pre
            st.h32[P_LOAD:P_LOAD + len(pre)] = pre  # a prefilling request's state is in its main slot
            st.h64[P_SLOTS:P_SLOTS + TOKEN_BUDGET] = -1
            slots = cache_slots(k)
            st.h64[P_SLOTS + ragged] = slots
            start = np.repeat(np.cumsum(e) - e, e)
            pre_ring = st.put64(np.repeat(pre * RING, e) + (np.repeat(done[pre], e) + np.arange(n) - start) % RING)
            if k:
                store_parts.append((out_pre, st.put64(np.arange(k))))
                store_pos.append(closing - (CHUNK - 1))
                store_slot.append(slots)
                check_sel.append(np.arange(k))
                check_win.append(windows(pre[batch], closing))
                nstored += k
            kv_src = pool_rows_at(n)

        # --- host side of the decode or speculative step ------------------------------------------
        verify = len(dec) and step % 3 != 0
        if len(dec):
            nb = len(dec)
            b = _bucket(nb)
            load_gather = st.put64(np.concatenate([dec + np.where(on_device[dec], 0, num_main),
                                                   np.full(b - nb, num_main, np.int64)]))
        if len(dec) and not verify:
            kv, out, load, op = decode_op(b)
            st.h32[D_IDX:D_IDX + b] = np.concatenate([dec, np.zeros(b - nb, np.int64)])
            st.h32[D_SEQ:D_SEQ + b] = np.concatenate([done[dec] + 1, np.zeros(b - nb, np.int64)])  # 0: padding
            closes = np.flatnonzero(done[dec] % CHUNK == CHUNK - 1)
            slots = cache_slots(len(closes))
            st.h64[D_SLOTS:D_SLOTS + b] = -1
            st.h64[D_SLOTS + closes] = slots
            dec_ring = st.put64(dec * RING + done[dec] % RING)
            if len(closes):
                store_parts.append((out, st.put64(closes)))
                store_pos.append(done[dec][closes] - (CHUNK - 1))
                store_slot.append(slots)
                check_sel.append(nstored + np.arange(len(closes)))
                check_win.append(windows(dec[closes], done[dec][closes]))
                nstored += len(closes)
            dec_src = pool_rows_at(b)
            accepted = np.ones(nb, np.int64)
        elif len(dec):
            drafts, out, load, vop, cop = verify_op(b)
            left = total[dec] - done[dec]
            lens = np.where(rng.random(nb) < 0.2, rng.integers(0, DRAFTS + 1, nb), DRAFTS)
            lens = np.minimum(lens, left)
            to_end = CHUNK - done[dec] % CHUNK
            pick = rng.integers(0, 4, nb)  # none, all, up to the chunk end, or any number
            accepted = np.choose(pick, [np.zeros(nb, np.int64), lens, np.minimum(lens, to_end),
                                        (rng.random(nb) * (lens + 1)).astype(np.int64)])
            pad = np.zeros(b - nb, np.int64)
            st.h32[V_SEQ:V_SEQ + b] = np.concatenate([done[dec], pad])  # 0: padding
            st.h32[V_BANK:V_BANK + b] = np.concatenate([num_main + dec * (DRAFTS + 1), pad])
            st.h32[V_LENS:V_LENS + b] = np.concatenate([lens, pad])
            st.h32[V_ACC:V_ACC + b] = np.concatenate([lens if fault == "leak" else accepted, pad])
            j, i = np.divmod(np.arange(nb * DRAFTS), DRAFTS)
            pos = done[dec][j] + i
            closes = np.flatnonzero((i < lens[j]) & (pos % CHUNK == CHUNK - 1))  # every draft that closes
            slots = cache_slots(len(closes))
            st.h64[V_SLOTS:V_SLOTS + b * DRAFTS] = -1
            st.h64[V_SLOTS + closes] = slots
            taken = np.flatnonzero(i < accepted[j])  # the accepted drafts' rows, absorbed into the ring
            dec_take = st.put64(taken)
            dec_ring = st.put64(dec[j[taken]] * RING + pos[taken] % RING)
            scatter = st.put64(dec)
            if len(closes):
                store_parts.append((out, st.put64(closes)))
                store_pos.append(pos[closes] - (CHUNK - 1))
                store_slot.append(slots)
                kept = i[closes] < accepted[j[closes]]
                check_sel.append(nstored + np.flatnonzero(kept))
                check_win.append(windows(dec[j[closes[kept]]], pos[closes[kept]]))
                nstored += len(closes)
            dec_src = pool_rows_at(b * DRAFTS)

        if nstored:
            positions = st.put32(np.concatenate(store_pos))
            mirror_slots = st.put64(np.concatenate(store_slot))
            sel = np.concatenate(check_sel)
            check_idx = st.put64(sel) if len(sel) else None
            window = st.put64(np.concatenate(check_win)) if len(sel) else None

        # --- the device side: one copy of the indices, the ops, the checks ---------------------------
        st.send()
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
                ring.index_copy_(0, dec_ring, kv[:nb])
                on_device[dec] = False
                counts["decode_steps"] += 1
            else:
                drafts.copy_(dec_src)
                vop.launch()
                cop.launch()
                load_table.index_copy_(0, scatter, load[:nb])
                ring.index_copy_(0, dec_ring, drafts.index_select(0, dec_take))
                on_device[dec] = True
                counts["verify_steps"] += 1
                counts["drafts_accepted"] += int(accepted.sum())
                counts["drafts_rejected"] += int((lens - accepted).sum())
            counts["tokens"] += int(accepted.sum())
            done[dec] += accepted
        if nstored:
            vectors = torch.cat([o.index_select(0, rows) for o, rows in store_parts])
            kv_store(vectors, positions, mirror_slots, mirror, error_count=errors)
            if fault == "cache" and not broken and step >= steps // 2:
                cache.cache.view(-1)[int(store_slot[0][0]) // 2 * page] ^= 1
                broken = True
            if check_idx is not None:
                got = vectors.index_select(0, check_idx).double()
                if fault == "out":
                    got[:, 0] += 1e-3
                raw = ring.index_select(0, window).view(-1, CHUNK, 2 * D).double()
                weights = torch.softmax(raw[..., D:] + ape64, dim=1)
                ref = (weights * raw[..., :D]).sum(1)
                err = torch.linalg.vector_norm(got - ref, dim=1) / torch.linalg.vector_norm(ref, dim=1)
                failures += (~(err < TOLERANCE)).sum()
                torch.maximum(max_err, err.max(), out=max_err)
                counts["chunks"] += len(sel)
            counts["entries"] += nstored
        if step % COMPARE_EVERY == 0 or step + 1 == steps:
            mismatches += (cache.cache != mirror.cache).any()
        counts["busy"] += bool(len(pre) or len(dec))
        finished = active & (done >= total)
        counts["finished"] += int(finished.sum())
        active &= ~finished

        if (step + 1) % checkpoint == 0 or step + 1 == steps:
            marks.append((step + 1, int(failures), int(mismatches), int(errors.item()) & 0xFFFFFFFF, float(max_err),
                          torch.cuda.memory_allocated(device) / 2**20 if cuda else float("nan"), _rss_mb()))
            if progress:
                m = marks[-1]
                print(("\r" if tty else "") + f"step {m[0]}/{steps}: {counts['chunks']} chunks checked, {m[1]} failed, "
                      f"{m[2]} cache mismatches, {m[3]} index errors, max err {m[4]:.1e}, device {m[5]:.0f} MB, "
                      f"rss {m[6]:.0f} MB, {(time.perf_counter() - started) / (step + 1) * 1e3:.3f} ms/step",
                      end="" if tty else "\n", file=sys.stderr, flush=True)
    if tty:
        print(file=sys.stderr)
    wall = time.perf_counter() - started
    last = marks[-1]
    first = marks[0]
    device_growth = last[5] - first[5] if cuda else 0.0
    rss_growth = last[6] - first[6]
    flat = (device_growth <= 0.0) and not rss_growth > 64.0
    ok = (last[1] == 0 and last[2] == 0 and last[3] == 0 and counts["chunks"] > 0 and counts["busy"] == steps
          and flat)
    return dict(device=str(device), steps=steps, busy_steps=counts["busy"], requests_arrived=counts["arrived"],
                requests_finished=counts["finished"], tokens=counts["tokens"], prefill_launches=counts["prefill_launches"],
                decode_steps=counts["decode_steps"], verify_steps=counts["verify_steps"],
                drafts_accepted=counts["drafts_accepted"], drafts_rejected=counts["drafts_rejected"],
                chunks_checked=counts["chunks"], chunk_failures=last[1], max_relative_error=last[4],
                cache_entries_stored=counts["entries"], cache_mismatches=last[2], index_errors=last[3],
                device_mb_first=first[5], device_mb_last=last[5], rss_mb_first=first[6], rss_mb_last=last[6],
                memory_flat=flat, checkpoints=len(marks), fault=fault, seed=seed,
                wall_s=wall, ms_per_step=wall / steps * 1e3, ok=ok)


def main(argv=None) -> int:
    """`python -m pydsa soak`'s command line: flags checked first, the run, its summary (--json: strict JSON)."""
    import argparse
    import json
    ap = argparse.ArgumentParser(prog="python -m pydsa soak", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000, help="serving steps to run, every one busy (default 100000)")
    ap.add_argument("--checkpoint", type=int, default=10_000, help="steps between checkpoints: the only points "
                    "where the loop waits for the device, reads the counters and the memory in use (default 10000)")
    ap.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the built-in data (0..2^32-1)")
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args(argv)
    from .info import replaced_files
    for problem in replaced_files():
        ap.error(f"this install is broken: {problem}")
    if args.steps < 1 or args.checkpoint < 1:
        ap.error(f"--steps and --checkpoint must be at least 1 (got {args.steps}, {args.checkpoint})")
    if not 0 <= args.seed < 2**32:
        ap.error(f"--seed must be in 0..2^32-1 (got {args.seed})")
    try:
        device = resolve_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except (ValueError, RuntimeError) as exc:
        ap.error(f"--device {args.device}: {exc}")
    if device.type not in ("cpu", "cuda"):
        ap.error(f"--device {args.device}: expected cpu, cuda or cuda:N")
    if args.json:  # fail before the run, not after it
        try:
            with open(args.json, "a"):
                pass
        except OSError as exc:
            ap.error(f"--json {args.json}: cannot write there ({exc.strerror})")
    where = "the host backend" if device.type == "cpu" else torch.cuda.get_device_name(device)
    print(f"pydsa soak: {args.steps} steps on {where}, checked on the device, a checkpoint every {args.checkpoint}")
    r = run(args.steps, device, args.seed, args.checkpoint)
    print(f"\n{'steps (busy: an op ran)':<34}{r['steps']} ({r['busy_steps']} busy)\n"
          f"{'requests arrived / finished':<34}{r['requests_arrived']} / {r['requests_finished']}\n"
          f"{'tokens absorbed':<34}{r['tokens']}\n"
          f"{'prefill / decode / verify steps':<34}{r['prefill_launches']} / {r['decode_steps']} / {r['verify_steps']} "
          f"({r['drafts_accepted']} drafts accepted, {r['drafts_rejected']} rejected)\n"
          f"{'chunks checked vs float64':<34}{r['chunks_checked']} ({r['chunk_failures']} failed; max relative "
          f"error {r['max_relative_error']:.2e}, limit {TOLERANCE:g})\n"
          f"{'KV-cache entries stored':<34}{r['cache_entries_stored']} ({r['cache_mismatches']} comparisons found the "
          f"cache unlike its mirror)\n{'index errors counted':<34}{r['index_errors']}\n"
          + (f"{'device memory, first / last':<34}{r['device_mb_first']:.1f} / {r['device_mb_last']:.1f} MB\n"
             if device.type == "cuda" else "") +
          f"{'resident memory, first / last':<34}{r['rss_mb_first']:.1f} / {r['rss_mb_last']:.1f} MB "
          f"({'flat' if r['memory_flat'] else 'GROWING'})\n"
          f"{'time':<34}{r['wall_s']:.1f} s, {r['ms_per_step']:.3f} ms per step\n\n{'PASS' if r['ok'] else 'FAIL'}")
    if args.json:
        clean = {k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
        with open(args.json, "w") as f:
            json.dump(clean, f, indent=1, allow_nan=False)
    return 0 if r["ok"] else 1
