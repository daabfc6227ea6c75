"""The c4 layer of `python -m pydsa demo` (pydsa/demo_c4.py) and `python -m pydsa soak` (pydsa/_soak_c4.py), served
step by step: both compressors of a DeepSeek-V4 ratio-4 layer (main D = 512 stored into a KVCache of layout "v4",
the indexer's D = 128 into one of layout "indexer", page size 64, over request-scoped rings of RING rows).

Requests arrive (at least one when none is served; each further one with a chance of 0.3) and finish over the
workload's slots, so ring rows and cache entries are reused. A serving step's prefill chunks (starting and ending
mid-quartet) are one `c4_extend` planned by `pyplan.plan_c4`, and the decoding requests take a plain `c4_decode`
(one serving step in three) or a `c4_verify` of V drafts with a random number accepted (none included:
reject_all), the next call starting at the first rejected position. The inputs are rows of two fixed random pools
taken at a random offset each call, so a position's raw rows are known by their pool row (kept per slot on the
host) and nothing is copied to check them.

The outputs go to held rows (NaN until written) and the cache entries to one half of the caches (a span's), both
taken in order. What checks the results watches each step as an observer, as the c128 loop's do
(pydsa/_serving.py): `stage(step)` before the step's one copy (it may stage indices of its own), `launched(step)`
once the ops ran. A C4Step names the entries the step's requests committed; when a span ends (the next step's
might not fit, or the caller reads the counters next) it also names everything the span holds, which the
observers settle in that step: the held rows are poisoned again after it, and the span after the next reuses the
cache half.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import pyplan

from ._serving import Staging, Step
from .c4 import C4Compressor, c4_decode, c4_extend, c4_max_drafts, c4_verify
from .errors import ArgumentValueError
from .store import KVCache, indexer_page_bytes, kv_page_bytes

DIMS = (512, 128)  # D of the main compressor and of the indexer's
RING = 16  # ring rows per request slot
TOLERANCE = 1e-5  # an entry's relative error against float64
PAGE = 64  # the caches' page size
# What a span holds: output rows (HELD) and cache slots (SPAN_SLOTS: an extend takes one per input row, a decode
# or verify one per row; only the rows that close an entry store there). Spans use the two halves of the caches
# in turn, so no slot is reused before the span end that settled it.
HELD, SPAN_SLOTS = 4096, 16384
FAULTS = ("c4ring", "c4cache")  # what a self-test may break (C4Serving, fault)


@dataclass(frozen=True)
class C4Workload:
    """The shape of the c4 layer's traffic."""
    slots: int  # requests served at once
    prompts: tuple  # (least, most) prompt tokens
    outputs: tuple  # (least, most) output tokens
    max_extend: int  # a prefill chunk's tokens per request
    token_budget: int  # prefill tokens per serving step
    drafts: int = 4  # V: draft tokens per request in a speculative step
    every: int = 1  # steps per serving step


@dataclass
class C4Span:
    """Everything a span holds, at its end: per held row (vectors[c][:used]), the position closing its entry (-1:
    it closes none; every closing row is stored, a rejected draft's too) and its cache slot."""
    used: int
    closing: np.ndarray
    cache_slot: np.ndarray


@dataclass
class C4Step:
    """One step of the c4 layer as its observers see it: per entry its requests committed, its held row, the
    position closing it (entry n: 4n + 3), its cache slot and the pool rows of its input rows at positions
    closing - 7 .. closing ([entries, 8]; entry 0's first 4: the pool's "no term" row), read at this step."""
    index: int
    rows: np.ndarray
    closing: np.ndarray
    cache_slot: np.ndarray
    window: np.ndarray
    span: C4Span | None = None


class C4Serving:
    """The c4 layer served step by step: alone (`step`), or beside another loop as its observer (`stage` and
    `launched` of its steps, sharing its staging and error counter; a serving step every `w.every` of them).
    rotary: the caches' rotary rows (one per position); weight: the main cache's norm weight (the indexer's is
    drawn); fault: break one of FAULTS once `steps` // 2 steps have run. Counts in `counts`."""

    def __init__(self, w: C4Workload, device, staging: Staging, errors, rotary, weight, *, pool_rows: int, seed: int,
                 steps: int = 0, fault: str | None = None):
        if w.drafts > c4_max_drafts(RING, reject_all=True):
            raise ArgumentValueError("drafts", f"drafts is {w.drafts}; a c4 ring of {RING} rows takes at most "
                                               f"{c4_max_drafts(RING, reject_all=True)} (any acceptance)")
        if fault is not None and fault not in FAULTS:
            raise ArgumentValueError("fault", f"fault must be None or one of {', '.join(FAULTS)} (got {fault!r})")
        gen = torch.Generator(device=device).manual_seed(seed + 4)
        f32 = dict(dtype=torch.float32, device=device)
        self.w, self.rng, self.st, self.errors = w, np.random.default_rng(seed + 4), staging, errors
        self.V, self.fault, self.steps = w.drafts, fault, steps
        self.rows = pool_rows // 4 + w.token_budget  # input rows to draw from; row `rows` is the window's "no term"
        self.step_max = (w.token_budget // 4 + w.slots * (1 + w.drafts), w.token_budget + w.slots * w.drafts)
        self.pools, self.apes, self.comp, self.vectors = [], [], [], []
        for k, d in enumerate(DIMS):
            pool = torch.randn(self.rows + 1, 4 * d, generator=gen, **f32)
            pool[:, 2 * d:] *= 2.0
            pool[-1, :2 * d], pool[-1, 2 * d:] = 0.0, float("-inf")  # a term of weight 0 (entry 0 has 4 terms)
            ape = torch.randn(8, d, generator=gen, **f32) * 0.5
            norm = weight if k == 0 else torch.rand(d, generator=gen, **f32) + 0.5
            page = kv_page_bytes(d, PAGE) if k == 0 else indexer_page_bytes(d, PAGE)
            cache = KVCache(torch.zeros(2 * SPAN_SLOTS // PAGE, page, dtype=torch.uint8, device=device), norm, rotary,
                            page_size=PAGE, layout="v4" if k == 0 else "indexer")
            ring = torch.full((w.slots * RING, 4 * d), float("nan"), **f32)  # never-written rows: NaN
            self.comp.append(C4Compressor(ring, ape, store=cache, ring_size=RING))
            self.pools.append(pool)
            self.apes.append(ape.double())
            self.vectors.append(torch.full((HELD, d), float("nan"), **f32))
        self.slot_ids = torch.arange(2 * SPAN_SLOTS, dtype=torch.int64, device=device)
        self.records = staging.d64.view(torch.uint8)  # the staging's bytes: the extend's records are staged there
        # pool row of each slot's position p at [slot, p]; the last 4 columns are the "no term" row, which
        # positions -4..-1 (entry 0's A terms) read
        self.history = w.prompts[1] + w.outputs[1] + w.drafts  # positions a request may reach
        self.source = np.full((w.slots, self.history + 4), self.rows, np.int64)
        self.flat, self.window = self.source.reshape(-1), np.arange(8) - 7
        self.closing = np.full(HELD, -1, np.int64)  # per held row: the position closing its entry (-1: none)
        self.slot = np.zeros(HELD, np.int64)  # per held row: its cache slot
        self.draft_of = {b: np.divmod(np.arange(b * w.drafts), w.drafts) for b in range(1, w.slots + 1)}
        self.used = self.slots_used = self.span = self.served = self.committed = 0
        self.active = np.zeros(w.slots, bool)
        self.prompt, self.total, self.done = (np.zeros(w.slots, np.int64) for _ in range(3))
        self.extend = self.decode = self.now = None
        self.broken, self.observers, self.entries = False, [], []
        self.counts = dict(c4_steps=0, c4_requests_arrived=0, c4_requests_finished=0, c4_extends=0, c4_decodes=0,
                           c4_verifies=0, c4_tokens=0, c4_entries_stored=0, c4_entries_checked=0,
                           c4_drafts_accepted=0, c4_drafts_rejected=0)

    def step(self, index: int, sync: bool = False) -> C4Step:
        """Serves step `index` alone: the host side, the one copy, the ops, the observers. sync: the span ends."""
        self.st.reset()
        step = Step(index, sync, [])
        self.stage(step)
        self.st.send()
        self.launched(step)
        return self.now

    # --- the host side ------------------------------------------------------------------------------------------
    def stage(self, step) -> None:
        """The host side of a step (before its one copy): a serving step every `w.every`, the span's end when the
        next step's might not fit or step.sync (the caller reads the counters after it), the observers' staging."""
        self.extend = self.decode = None
        if step.index % self.w.every == self.w.every - 1:
            self._serve()
        parts = ([np.concatenate(p) for p in zip(*self.entries)] if self.entries
                 else [np.zeros(0, np.int64)] * 3 + [np.zeros((0, 8), np.int64)])
        self.now, self.entries = C4Step(step.index, *parts), []
        rows, slots = self.step_max
        if self.used and (step.sync or self.used + rows > HELD or self.slots_used + slots > SPAN_SLOTS):
            self.now.span = self._end_span()
        for o in self.observers:
            o.stage(self.now)

    def _serve(self) -> None:
        """One serving step: arrivals, an extend of the prefilling requests, a decode or a verify of the others,
        the requests' new lengths, the finished ones' slots freed."""
        w, rng, active, done, prompt = self.w, self.rng, self.active, self.done, self.prompt
        while not active.all() and (not active.any() or rng.random() < 0.3):
            s = int(np.flatnonzero(~active)[0])
            active[s], done[s], prompt[s] = True, 0, rng.integers(w.prompts[0], w.prompts[1] + 1)
            self.total[s] = prompt[s] + rng.integers(w.outputs[0], w.outputs[1] + 1)
            self.counts["c4_requests_arrived"] += 1
        pre = np.flatnonzero(active & (done < prompt))
        dec = np.flatnonzero(active & (done >= prompt))
        if len(pre):
            extend = np.minimum(prompt[pre] - done[pre], rng.integers(1, w.max_extend + 1, len(pre)))
            extend = np.minimum(extend, w.token_budget - (np.cumsum(extend) - extend))
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
        8 window rows are read now (a slot's rows change as its requests go on)."""
        if len(closes):
            windows = np.take(self.flat, (owners * (self.history + 4) + closing)[:, None] + self.window)
            self.entries.append((u + closes, closing, self.slot[u + closes], windows))
            self.committed += len(closes)

    def _plan_extend(self, done, slots, extend) -> None:
        plan = pyplan.plan_c4(done[slots] + extend, extend, slots, RING, num_slots=self.w.slots)
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
        closes = position % 4 == 3  # every closing draft is stored; the accepted ones are committed
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

    def _end_span(self) -> C4Span:
        """The span's end: what it holds for the observers; the next span begins in the other cache half."""
        u = self.used
        span = C4Span(u, self.closing[:u].copy(), self.slot[:u].copy())
        self.counts["c4_entries_checked"] += self.committed
        self.counts["c4_entries_stored"] += int((span.closing >= 0).sum())
        self.used = self.slots_used = self.committed = 0
        self.span = 1 - self.span
        return span

    # --- the device side ----------------------------------------------------------------------------------------
    def launched(self, step) -> None:
        """The step's c4 calls (after the ops of a loop it rides on), the fault when due, the observers; at a
        span's end the held rows poisoned again."""
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
        if self.fault and not self.broken and step.index >= self.steps // 2:
            self._break()
        for o in self.observers:
            o.launched(self.now)
        if self.now.span:
            for v in self.vectors:
                v[:self.now.span.used].fill_(float("nan"))

    def _break(self) -> None:
        """The self-test's fault: every main ring row off by 1 (a stale state), or one byte flipped of the main
        cache entry the step's requests committed last (none: at a later step)."""
        if self.fault == "c4ring":
            self.comp[0].ring.add_(1.0)
        else:
            if not len(self.now.cache_slot):
                return
            slot = int(self.now.cache_slot[-1])
            cache = self.comp[0].store
            cache.cache.view(-1)[slot // PAGE * cache.page_bytes + slot % PAGE * (DIMS[0] + 64)] ^= 1
        self.broken = True
