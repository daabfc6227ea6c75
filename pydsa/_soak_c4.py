"""The soak's c4 layer: both compressors of a DeepSeek-V4 ratio-4 layer (main D = 512 stored into a KVCache of
layout "v4", the indexer's D = 128 into one of layout "indexer", page size 64, over request-scoped rings of
RING rows), serving requests of its own over C4_SLOTS slots beside the c128 loop, one serving step every
C4_EVERY loop steps: a serving step's host side costs about what a c128 step's does, and one in 8 adds
about 13 % to the loop's step (H100: 0.40 -> 0.45 ms), which keeps a million steps inside a 600 s run.
Requests arrive and finish as in the c128 loop (prompts of 1..3000 tokens, outputs of 20..300); each
step's prefill chunks (1..512 tokens each, starting and ending mid-quartet) are one `c4_extend` planned by
`pyplan.plan_c4`, and the decoding requests take a plain `c4_decode` (one step in three) or a `c4_verify`
of V drafts with a random number accepted (none included: reject_all), the next call starting at the
first rejected position. The inputs are rows of two fixed random pools taken at a random offset each
call, so a position's raw rows are known by their pool row (kept per slot on the host) and nothing is
copied to check them.

Checked where the ops run, in batches (when what a check span holds would not take another step's, and at
every checkpoint):
- every entry a request commits, of both compressors, against the float64 formula over its 8 raw rows
  (docs/spec.md, "One entry"), relative error < TOLERANCE: a stale ring row, a rejected draft read as
  accepted, an unwritten output (the held rows are NaN until written) all fail it;
- both caches, byte for byte, against mirrors the standalone store fills from the same vectors at the same
  slots and rotary rows (the entries of rejected drafts included), at every check: every entry is compared
  before its slot is reused;
- the index errors the ops skip and count (the c128 loop's counter)."""
from __future__ import annotations

import numpy as np
import torch

import pyplan

from .c4 import C4Compressor, c4_decode, c4_extend, c4_max_drafts, c4_verify
from .demo_c4 import DIMS, PAGE, RING, TOLERANCE  # the demo's c4 geometry and check limit
from .errors import ArgumentValueError
from .store import KVCache, indexer_page_bytes, kv_page_bytes, kv_store

C4_SLOTS, C4_EVERY = 8, 8  # request slots; loop steps per c4 serving step
MAX_EXTEND, TOKEN_BUDGET = 512, 2048  # a prefill chunk's tokens per request, and per serving step
HISTORY = 4096  # positions whose pool rows are kept per slot (> the longest request: 3300 + the drafts)
# What a check span holds before its check: output rows (HELD) and cache slots (SPAN_SLOTS: an extend takes
# one per input row, a decode or verify one per row; only the rows that close an entry store there). The
# check runs when the next step's might not fit (about every 60 serving steps) and at every checkpoint; spans use
# the two halves of the caches in turn, so no slot is reused before the check that compared it.
HELD, SPAN_SLOTS = 4096, 16384
# flat rows of a pool seen as [rows * 4, D] ([kv_A | kv_B | score_A | score_B] per input row): entry terms 0..3
# take the A quarters of the previous quartet's rows, 4..7 the B quarters of their own
_QUARTERS = np.array([[0] * 4 + [1] * 4, [2] * 4 + [3] * 4], np.int64)


class C4Soak:
    """One c4 layer beside the c128 loop, an observer of it. stage() is the host side of a step (it stages the
    step's indices in the loop's staging, before its one copy); launched() the device side (the ops, then the check when due).
    Counters on the device: failures, mismatches, max_err; the rest in `counts`."""

    def __init__(self, device, staging, errors, rotary, weight, *, drafts: int, pool_rows: int, seed: int,
                 steps: int, fault: str | None = None):
        if drafts > c4_max_drafts(RING, reject_all=True):
            raise ArgumentValueError("drafts", f"drafts is {drafts}; a c4 ring of {RING} rows takes at most "
                                               f"{c4_max_drafts(RING, reject_all=True)} (any acceptance)")
        gen = torch.Generator(device=device).manual_seed(seed + 4)
        f32 = dict(dtype=torch.float32, device=device)
        self.rng, self.st, self.errors = np.random.default_rng(seed + 4), staging, errors
        self.V, self.fault, self.steps = drafts, fault, steps
        self.rows = pool_rows // 4 + TOKEN_BUDGET  # input rows to draw from; row `rows` is the window's "no term"
        self.step_max = (TOKEN_BUDGET // 4 + C4_SLOTS * (1 + drafts), TOKEN_BUDGET + C4_SLOTS * drafts)  # rows, slots
        self.pools, self.apes, self.comp, self.mirrors, self.vectors = [], [], [], [], []
        for k, d in enumerate(DIMS):
            pool = torch.randn(self.rows + 1, 4 * d, generator=gen, **f32)
            pool[:, 2 * d:] *= 2.0
            pool[-1, :2 * d], pool[-1, 2 * d:] = 0.0, float("-inf")  # a term of weight 0 (entry 0 has 4 terms)
            ape = torch.randn(8, d, generator=gen, **f32) * 0.5
            w = weight if k == 0 else torch.rand(d, generator=gen, **f32) + 0.5
            page = kv_page_bytes(d, PAGE) if k == 0 else indexer_page_bytes(d, PAGE)
            cache, mirror = (KVCache(torch.zeros(2 * SPAN_SLOTS // PAGE, page, dtype=torch.uint8, device=device), w,
                                     rotary, page_size=PAGE, layout="v4" if k == 0 else "indexer") for _ in range(2))
            ring = torch.full((C4_SLOTS * RING, 4 * d), float("nan"), **f32)  # never-written rows: NaN
            self.comp.append(C4Compressor(ring, ape, store=cache, ring_size=RING))
            self.pools.append(pool)
            self.apes.append(ape.double())
            self.mirrors.append(mirror)
            self.vectors.append(torch.full((HELD, d), float("nan"), **f32))
        self.slot_ids = torch.arange(2 * SPAN_SLOTS, dtype=torch.int64, device=device)
        self.records = staging.d64.view(torch.uint8)  # the staging's bytes: the extend's records are staged there
        self.failures = torch.zeros((), dtype=torch.int64, device=device)
        self.mismatches = torch.zeros((), dtype=torch.int64, device=device)
        self.max_err = torch.zeros((), dtype=torch.float64, device=device)
        # pool row of each slot's position p at [slot, p]; the last 4 columns are the "no term" row, which
        # positions -4..-1 (entry 0's A terms) read
        self.source = np.full((C4_SLOTS, HISTORY + 4), self.rows, np.int64)
        self.flat, self.window = self.source.reshape(-1), np.arange(8) - 7
        self.closing = np.full(HELD, -1, np.int64)  # per held row: the position closing its entry (-1: none)
        self.slot = np.zeros(HELD, np.int64)  # per held row: its cache slot
        self.draft_of = {b: np.divmod(np.arange(b * drafts), drafts) for b in range(1, C4_SLOTS + 1)}
        self.used = self.slots_used = self.span = self.served = 0
        self.active = np.zeros(C4_SLOTS, bool)
        self.prompt, self.total, self.done = (np.zeros(C4_SLOTS, np.int64) for _ in range(3))
        self.pending, self.windows = [], []
        self.extend = self.decode = self.check = None
        self.broken = False
        self.counts = dict(c4_steps=0, c4_requests_arrived=0, c4_requests_finished=0, c4_extends=0, c4_decodes=0,
                           c4_verifies=0, c4_tokens=0, c4_entries_stored=0, c4_entries_checked=0,
                           c4_drafts_accepted=0, c4_drafts_rejected=0)

    # --- the host side ------------------------------------------------------------------------------------------
    def stage(self, step) -> None:
        """The host side of the c128 loop's step (pydsa/_serving.py, before its one copy): a serving step every
        C4_EVERY, and the check when one is due (step.sync: the loop reads the counters after this step, so
        everything held is checked in it)."""
        self.extend = self.decode = self.check = None
        if step.index % C4_EVERY == C4_EVERY - 1:
            self._serve()
        rows, slots = self.step_max
        if self.used and (step.sync or self.used + rows > HELD or self.slots_used + slots > SPAN_SLOTS):
            self._plan_check()

    def _serve(self) -> None:
        """One serving step: arrivals, an extend of the prefilling requests, a decode or a verify of the others,
        the requests' new lengths, the finished ones' slots freed."""
        rng, active, done, prompt = self.rng, self.active, self.done, self.prompt
        while not active.all() and (not active.any() or rng.random() < 0.3):
            s = int(np.flatnonzero(~active)[0])
            active[s], done[s], prompt[s] = True, 0, rng.integers(1, 3001)
            self.total[s] = prompt[s] + rng.integers(20, 301)
            self.counts["c4_requests_arrived"] += 1
        pre = np.flatnonzero(active & (done < prompt))
        dec = np.flatnonzero(active & (done >= prompt))
        if len(pre):
            extend = np.minimum(prompt[pre] - done[pre], rng.integers(1, MAX_EXTEND + 1, len(pre)))
            extend = np.minimum(extend, TOKEN_BUDGET - (np.cumsum(extend) - extend))
            pre, extend = pre[extend > 0], extend[extend > 0]
            self._plan_extend(done, pre, extend)
        if len(dec) and self.served % 3 == 0:
            self._plan_decode(done, dec)
            advance = 1
        elif len(dec):
            advance = np.minimum(rng.integers(0, self.V + 1, len(dec)), self.total[dec] - done[dec])
            self._plan_verify(done, dec, advance)
        if len(pre):
            done[pre] += extend
        if len(dec):
            done[dec] += advance
        finished = active & (done >= self.total)
        self.counts["c4_requests_finished"] += int(finished.sum())
        active &= ~finished
        self.served += 1
        self.counts["c4_steps"] += 1

    def _take(self, count: int, slots: int):
        """`count` held rows and `slots` cache slots for an op: (its first row, its first slot)."""
        u, s = self.used, self.span * SPAN_SLOTS + self.slots_used
        self.used += count
        self.slots_used += slots
        return u, s

    def _commit(self, u: int, closes, owners, closing) -> None:
        """Held rows u + closes close committed entries (ending at positions `closing` of slots `owners`): their
        8 window rows are read now (a slot's rows change as its requests go on) for the next check."""
        if len(closes):
            self.pending.append(u + closes)
            self.windows.append(np.take(self.flat, (owners * (HISTORY + 4) + closing)[:, None] + self.window))

    def _plan_extend(self, done, slots, extend) -> None:
        plan = pyplan.plan_c4(done[slots] + extend, extend, slots, RING, num_slots=C4_SLOTS)
        end = np.cumsum(extend)
        n, c, w = int(end[-1]), len(plan[0]), len(plan[1])
        u, s = self._take(c, n)
        o = int(self.rng.integers(0, self.rows - n + 1))
        owner = np.repeat(slots, extend)
        position = np.repeat(done[slots] + extend - end, extend) + np.arange(n)
        self.source[owner, position] = o + np.arange(n)
        ragged = plan[0].view(np.uint16)[:, 2]  # each compress record's ragged row (its out row: its index)
        closing = position[ragged]
        self.closing[u:u + c] = closing
        self.slot[u:u + c] = s + ragged  # ragged row r's cache slot: s + r
        self._commit(u, np.arange(c), owner[ragged], closing)
        # the records go to the staging as int64 (compress 16-byte aligned, write after it), read there as bytes
        at = self.st.put64(np.concatenate([plan[0].view(np.int64).reshape(-1), plan[1].view(np.int64).reshape(-1)]),
                           align=2).storage_offset() * 8
        self.extend = (o, n, u, s, at, c, w, plan)
        self.counts["c4_extends"] += 1
        self.counts["c4_tokens"] += n

    def _plan_decode(self, done, slots) -> None:
        at, b = done[slots], len(slots)
        u, s = self._take(b, b)
        o = int(self.rng.integers(0, self.rows - b + 1))
        self.source[slots, at] = o + np.arange(b)
        closes = at % 4 == 3
        self.closing[u:u + b] = np.where(closes, at, -1)
        self.slot[u:u + b] = s + np.arange(b)
        closes = np.flatnonzero(closes)
        self._commit(u, closes, slots[closes], at[closes])
        self.decode = (False, o, b, u, s, self.st.put32(np.concatenate([at + 1, slots])))
        self.counts["c4_decodes"] += 1
        self.counts["c4_tokens"] += b

    def _plan_verify(self, done, slots, accepted) -> None:
        at, b, V = done[slots], len(slots), self.V
        u, s = self._take(b * V, b * V)
        o = int(self.rng.integers(0, self.rows - b * V + 1))
        request, draft = self.draft_of[b]
        position = at[request] + draft
        # every draft's row, rejected ones too: a rejected position is produced again before any window reads it
        self.source[slots[request], position] = o + np.arange(b * V)
        closes = position % 4 == 3  # every closing draft is stored; the accepted ones are checked
        self.closing[u:u + b * V] = np.where(closes, position, -1)
        self.slot[u:u + b * V] = s + np.arange(b * V)
        committed = np.flatnonzero(closes & (draft < accepted[request]))
        self._commit(u, committed, slots[request[committed]], position[committed])
        self.decode = (True, o, b, u, s, self.st.put32(np.concatenate([at, slots])))
        taken = int(accepted.sum())
        self.counts["c4_verifies"] += 1
        self.counts["c4_tokens"] += taken
        self.counts["c4_drafts_accepted"] += taken
        self.counts["c4_drafts_rejected"] += b * V - taken

    def _plan_check(self) -> None:
        """Stages the check of everything held: the committed entries' rows and windows, and every held row's
        rotary row and cache slot for the mirrors (-1: the row closed nothing); the next span begins."""
        u, closing = self.used, self.closing[:self.used]
        rows = np.concatenate(self.pending) if self.pending else np.zeros(0, np.int64)
        windows = (np.concatenate(self.windows)[:, None, :] * 4 + _QUARTERS).reshape(-1) if self.windows else rows
        stored = closing >= 0
        self.check = (u, len(rows), self.st.put64(rows), self.st.put64(windows),
                      self.st.put32(np.maximum(closing - 3, 0)), self.st.put64(np.where(stored, self.slot[:u], -1)))
        self.counts["c4_entries_checked"] += len(rows)
        self.counts["c4_entries_stored"] += int(stored.sum())
        self.used = self.slots_used = 0
        self.span, self.pending, self.windows = 1 - self.span, [], []

    # --- the device side ----------------------------------------------------------------------------------------
    def launched(self, step) -> None:
        """The step's c4 calls (after the c128 ops), then the check when one is due."""
        (main, indexer), (pool, pool_i), (out, out_i) = self.comp, self.pools, self.vectors
        if self.extend:
            o, n, u, s, at, c, w, plan = self.extend
            plan = pyplan.C4Plan(self.records[at:at + 16 * c].view(c, 16),
                                 self.records[at + 16 * c:at + 16 * c + 8 * w].view(w, 8), plan.ring_size,
                                 plan.num_slots, plan.num_tokens)
            c4_extend(main, pool[o:o + n], plan, indexer=indexer, indexer_kv_score=pool_i[o:o + n], out=out[u:u + c],
                      indexer_out=out_i[u:u + c], cache_slots=self.slot_ids[s:s + n], error_count=self.errors)
        if self.decode:
            verify, o, b, u, s, staged = self.decode
            rows, seq_lens, slots = (b * self.V if verify else b), staged[:b], staged[b:]
            args = dict(indexer=indexer, out=out[u:u + rows], indexer_out=out_i[u:u + rows],
                        cache_slots=self.slot_ids[s:s + rows], error_count=self.errors)
            if verify:
                c4_verify(main, pool[o:o + rows], seq_lens, slots, num_drafts=self.V, indexer_drafts=pool_i[o:o + rows],
                          reject_all=True, **args)
            else:
                c4_decode(main, pool[o:o + rows], indexer_kv_score=pool_i[o:o + rows], seq_lens=seq_lens, slots=slots,
                          **args)
        if self.fault in ("c4ring", "c4cache") and not self.broken and step.index >= self.steps // 2:
            self._break()
        if self.check:
            self._check()

    def _break(self) -> None:
        """The self-test's fault: every main ring row off by 1 (a stale state), or one byte of the entry just
        stored flipped."""
        if self.fault == "c4ring":
            self.comp[0].ring.add_(1.0)
        else:
            stored = np.flatnonzero(self.closing[:self.used] >= 0)
            if not len(stored):
                return
            slot = int(self.slot[stored[-1]])
            cache = self.comp[0].store
            cache.cache.view(-1)[slot // PAGE * cache.page_bytes + slot % PAGE * (DIMS[0] + 64)] ^= 1
        self.broken = True

    def _check(self) -> None:
        """Every held committed entry against float64; the mirrors store every held vector; caches compared."""
        used, k, rows, windows, rotary_rows, cache_slots = self.check
        for c, d in enumerate(DIMS):
            if k:
                raw = self.pools[c].view(-1, d).index_select(0, windows).view(k, 2, 8, d).double()
                weights = torch.softmax(raw[:, 1] + self.apes[c], dim=1)
                ref = (weights * raw[:, 0]).sum(1)
                got = self.vectors[c].index_select(0, rows).double()
                err = torch.linalg.vector_norm(got - ref, dim=1) / torch.linalg.vector_norm(ref, dim=1)
                self.failures += (~(err < TOLERANCE)).sum()
                torch.maximum(self.max_err, err.max(), out=self.max_err)
                del raw, weights, ref, got, err  # nothing of a check outlives it: the memory sampled is exact
            kv_store(self.vectors[c][:used], rotary_rows, cache_slots, self.mirrors[c], error_count=self.errors)
            self.mismatches += (self.comp[c].store.cache != self.mirrors[c].cache).any()
            self.vectors[c][:used].fill_(float("nan"))
