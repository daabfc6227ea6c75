"""The c128 serving loop of `python -m pydsa demo` and `python -m pydsa soak`.

Requests arrive (prompts of 1..3000 tokens, some of 10 000..16 000 where the workload asks, outputs of
20..300) and finish over `max_running` main state slots, so slots, bank entries and KV-cache entries are
reused. Each step prefills a chunk of every prefilling request (up to `max_extend` tokens each,
`token_budget` per step, planned by a DevicePlan; chunks start and end mid-way through 128-token chunks),
then runs, for the decoding requests, a plain decode (one step in three) or a speculative step: V drafts
verified in one launch (the state after every draft prefix kept in the request's bank entries), a random
number of them accepted (none, all, up to the chunk end, or any), and the commit resolving on the device
where each state now is. The host never learns it: the commit writes it into `load_table`, and the next op
reads it from there. Every op stores the vectors it closes into the layer's paged KV cache in the same
launch. The inputs are rows of a fixed random pool taken at a random offset each call.

The step's index data is built in numpy and sent in one int32 and one int64 copy (`Staging`). What checks
the results watches each step as an observer, with two calls: `stage(step)`, the step planned on the host,
before that copy (an observer may stage indices of its own); `launched(step)`, once the ops ran. A step
describes each op call as a `Launch`: its input and output tensors and, per input row, the request, the
position and whether the row is committed (in its request's sequence from now on).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ._abi import CHUNK
from .c128 import C128Decode, C128Prefill, DevicePlan
from .speculative import C128Commit, C128Verify


@dataclass(frozen=True)
class Workload:
    """The shape of a serving loop's traffic."""
    max_running: int  # requests served at once, one main state slot each
    token_budget: int  # prefill tokens per step
    max_extend: int  # a prefill chunk's tokens per request
    long_prompts: float = 0.0  # the share of prompts of 10 000..16 000 tokens
    drafts: int = 4  # V: draft tokens per request in a speculative step
    cache_slots: int = 4096  # KV-cache entries, taken round robin
    head_dim: int = 512


def bucket(n: int) -> int:
    """The batch size an op is prepared for (a power of two >= n: one prepared op, or CUDA graph, each)."""
    b = 1
    while b < n:
        b *= 2
    return b


class Staging:
    """The step's index data, built in numpy and sent in one int32 and one int64 copy. The ops' host-known
    index buffers sit at fixed offsets (`i32` and `i64` name them); observers append after them. Without a
    workload (a c4 layer served alone, pydsa/_serving_c4.py) there are no fixed buffers."""

    def __init__(self, device, w: Workload | None = None):
        r, v, budget = (w.max_running, w.drafts, w.token_budget) if w else (0, 0, 0)
        names = ("prefill_slots", "prefill_loads", "decode_slots", "decode_seq", "verify_seq", "verify_bank",
                 "verify_lens", "verify_accepted")
        self.i32 = {name: i * r for i, name in enumerate(names)} if w else {}
        self.i64 = dict(prefill_cache=0, decode_cache=budget, verify_cache=budget + r) if w else {}
        self.fixed32, self.fixed64 = 8 * r, budget + r * (1 + v)
        self.h32 = np.zeros(self.fixed32 + 16384, np.int32)
        self.h64 = np.zeros(self.fixed64 + 131072, np.int64)
        self.t32, self.t64 = torch.from_numpy(self.h32), torch.from_numpy(self.h64)
        self.d32 = torch.zeros(len(self.h32), dtype=torch.int32, device=device)
        self.d64 = torch.zeros(len(self.h64), dtype=torch.int64, device=device)
        self.n32, self.n64 = self.fixed32, self.fixed64

    def reset(self):
        self.n32, self.n64 = self.fixed32, self.fixed64

    def view32(self, name: str, n: int) -> torch.Tensor:
        return self.d32[self.i32[name]:self.i32[name] + n]

    def view64(self, name: str, n: int) -> torch.Tensor:
        return self.d64[self.i64[name]:self.i64[name] + n]

    def set32(self, name: str, values, width: int) -> None:
        """Writes values at a fixed buffer, padded with 0 up to `width`."""
        at = self.i32[name]
        self.h32[at:at + len(values)] = values
        self.h32[at + len(values):at + width] = 0

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


@dataclass
class Launch:
    """One op call of a step as the observers see it. The arrays from `owner` to `cache_slot` are per input
    row, on the host; `requests` and `advance` per request served (its main slot, the tokens it absorbs)."""
    kind: str  # "prefill", "decode" or "verify"
    kv: torch.Tensor  # the input rows [rows, 2D] (a decode's and a verify's padded to their bucket)
    out: torch.Tensor  # the output vectors (a prefill's compact: row i = compress record i)
    owner: np.ndarray  # the request's main slot (-1: padding)
    position: np.ndarray  # the token's position in its request
    committed: np.ndarray  # bool: the row is part of its request from now on (false: padding, rejected drafts)
    out_row: np.ndarray  # the row of `out` holding the chunk vector the row closes (-1: it closes none)
    cache_slot: np.ndarray  # where that vector is stored in the KV cache (-1: nowhere)
    requests: np.ndarray
    advance: np.ndarray
    pool_at: int = 0  # the pool row the inputs are copied from
    gather: torch.Tensor | None = None  # load_table rows of each request's state (decode, verify)
    lens: np.ndarray | None = None  # a verify's drafts per request
    scatter: torch.Tensor | None = None  # a verify's: where the commit's loads go in load_table

    @property
    def closes(self) -> np.ndarray:
        """The input rows that close a chunk (committed or not)."""
        return np.flatnonzero(self.out_row >= 0)


@dataclass
class Step:
    """One serving step as the observers see it."""
    index: int
    sync: bool  # observers settle everything they hold in this step (the caller reads their counters next)
    launches: list  # Launch, in the order the ops run
    plan_us: float = float("nan")  # the prefill's planning, host µs
    decoding: np.ndarray | None = None  # main slots of the requests that decoded or verified


class ServingLoop:
    """One online c128 layer served step by step (`step`); `observers` watch each step, `counts` counts it.
    store: the KVCache every op stores into; leak: commit every verified draft on the device while the
    observers are told only the accepted ones are (a fault that must fail the checks); launch(name, fn):
    runs each op call (a timer may wrap it). The layer's ops are `_make_layer`'s, planned by `_plan_records`,
    `_plan_decode` and `_plan_verify`, run by `_run_ops` (pydsa/_serving_offline.py: the offline layer's)."""
    config = "online"  # sglang's online c128 compressor (its flag set)

    def __init__(self, w: Workload, device, *, seed: int, store, arrivals: int | None = None,
                 pool_rows: int = 1 << 14, leak: bool = False, launch=None):
        self.w, self.device, self.arrivals, self.leak = w, device, arrivals, leak
        self.rng = np.random.default_rng(seed)
        gen = torch.Generator(device=device).manual_seed(seed)
        f32, i32 = dict(dtype=torch.float32, device=device), dict(dtype=torch.int32, device=device)
        d, r, v = w.head_dim, w.max_running, w.drafts
        self.num_slots = r * (v + 2)  # main slots, then V + 1 bank entries per main slot
        self.ape = torch.randn(CHUNK, d, generator=gen, **f32)
        self.state = torch.randn(self.num_slots, 1, 3 * d, generator=gen, **f32)  # stale: must never leak in
        self.pool = torch.randn(pool_rows + w.token_budget, 2 * d, generator=gen, **f32)
        self.pool[:, d:] *= 3.0
        self.pool_rows, self.store, self.launch = pool_rows, store, launch or (lambda name, fn: fn())
        self.errors = torch.zeros(1, dtype=torch.int32, device=device)  # the ops' skipped-and-counted indices
        # where each slot's state is: [0, r) written by the commit, then constants (the main slot; padding: 0)
        self.load_table = torch.cat([torch.arange(r), torch.arange(r)]).to(**i32)
        self.staging = Staging(device, w)
        self.kv_pre = torch.empty(w.token_budget, 2 * d, **f32)
        self._make_layer()
        self.draft_of = {nb: np.divmod(np.arange(nb * v), v) for nb in range(1, r + 1)}  # (request, draft)
        self.active = np.zeros(r, bool)
        self.prompt, self.total, self.done = (np.zeros(r, np.int64) for _ in range(3))
        self.on_device = np.zeros(r, bool)  # the state's slot is known only to the device (after a commit)
        self.counts = dict(arrived=0, finished=0, tokens=0, verify_steps=0, decode_steps=0, prefill_launches=0,
                           drafts_accepted=0, drafts_rejected=0, busy=0)
        self.next_cache, self.observers = 0, []

    def _make_layer(self) -> None:
        """The online layer's ops: the prefill over a DevicePlan, a decode and a verify + commit per bucket."""
        w, st, r, store = self.w, self.staging, self.w.max_running, self.store
        self.plan = DevicePlan(w.token_budget, r, device=self.device)
        self.out_pre = torch.empty(self.plan.compress_capacity, w.head_dim, dtype=torch.float32, device=self.device)
        self.prefill = C128Prefill(self.state, self.kv_pre, self.out_pre, self.ape, st.view32("prefill_slots", r),
                                   self.plan, load_indices=st.view32("prefill_loads", r), compact=True, store=store,
                                   cache_slots=st.view64("prefill_cache", w.token_budget), error_count=self.errors)
        self.decode_ops = {b: self._decode_op(b) for b in (1 << i for i in range(r.bit_length()))}
        self.verify_ops = {b: self._verify_op(b) for b in self.decode_ops}

    def _decode_op(self, b: int):
        f32, st, d = dict(dtype=torch.float32, device=self.device), self.staging, self.w.head_dim
        kv, out = torch.empty(b, 2 * d, **f32), torch.empty(b, d, **f32)
        load = torch.zeros(b, dtype=torch.int32, device=self.device)
        op = C128Decode(self.state, kv, out, self.ape, st.view32("decode_slots", b), st.view32("decode_seq", b),
                        load_indices=load, store=self.store, cache_slots=st.view64("decode_cache", b),
                        error_count=self.errors)
        return kv, out, load, op

    def _verify_op(self, b: int):
        f32, st, d, v = dict(dtype=torch.float32, device=self.device), self.staging, self.w.head_dim, self.w.drafts
        drafts, out = torch.empty(b * v, 2 * d, **f32), torch.empty(b * v, d, **f32)
        load = torch.zeros(b, dtype=torch.int32, device=self.device)
        seq, bank, lens = st.view32("verify_seq", b), st.view32("verify_bank", b), st.view32("verify_lens", b)
        verify = C128Verify(self.state, drafts, out, self.ape, load, seq, bank_indices=bank, verify_lens=lens,
                            store=self.store, cache_slots=st.view64("verify_cache", b * v), error_count=self.errors)
        commit = C128Commit(seq, st.view32("verify_accepted", b), load, bank, num_drafts=v, verify_lens=lens,
                            load_indices=load, num_slots=self.num_slots, error_count=self.errors)
        return drafts, out, load, verify, commit

    # --- the host side -----------------------------------------------------------------------------------
    def _arrive(self) -> None:
        """New requests take free main slots (at least one when none is served), up to `arrivals` in all."""
        active, rng, c = self.active, self.rng, self.counts
        while (not active.all() and (self.arrivals is None or c["arrived"] < self.arrivals)
               and (not active.any() or rng.random() < 0.3)):
            s = int(np.flatnonzero(~active)[0])
            long = self.w.long_prompts and rng.random() < self.w.long_prompts
            active[s], self.done[s], self.on_device[s] = True, 0, False
            self.prompt[s] = rng.integers(10_000, 16_000) if long else rng.integers(1, 3001)
            self.total[s] = self.prompt[s] + rng.integers(20, 301)
            c["arrived"] += 1

    def _cache_slots(self, k: int) -> np.ndarray:
        s = (self.next_cache + np.arange(k)) % self.w.cache_slots
        self.next_cache = (self.next_cache + k) % self.w.cache_slots
        return s

    def _pool_at(self) -> int:
        """The pool row a call's inputs start at (the pool has token_budget rows past pool_rows)."""
        return int(self.rng.integers(0, self.pool_rows))

    def _plan_prefill(self, pre: np.ndarray, step: Step) -> None:
        w, st, done = self.w, self.staging, self.done
        e = np.minimum(self.prompt[pre] - done[pre], self.rng.integers(1, w.max_extend + 1, len(pre)))
        e = np.minimum(e, w.token_budget - (np.cumsum(e) - e))
        pre, e = pre[e > 0], e[e > 0]
        n = int(e.sum())
        started = time.perf_counter()
        ragged = self._plan_records(done[pre] + e, e, pre)
        step.plan_us = (time.perf_counter() - started) * 1e6
        st.set32("prefill_slots", pre, len(pre))
        st.set32("prefill_loads", pre, len(pre))  # a prefilling request's state is in its main slot
        cache = self._cache_slots(len(ragged))
        at = st.i64["prefill_cache"]
        st.h64[at:at + w.token_budget] = -1
        st.h64[at + ragged] = cache
        out_row, cache_slot = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        out_row[ragged], cache_slot[ragged] = np.arange(len(ragged)), cache
        position = np.repeat(done[pre] - (np.cumsum(e) - e), e) + np.arange(n)
        step.launches.append(Launch(kind="prefill", kv=self.kv_pre[:n], out=self.out_pre, owner=np.repeat(pre, e),
                                    position=position, committed=np.ones(n, bool), out_row=out_row,
                                    cache_slot=cache_slot, requests=pre, advance=e, pool_at=self._pool_at()))

    def _plan_records(self, seq_lens: np.ndarray, extend: np.ndarray, pre: np.ndarray) -> np.ndarray:
        """Plans the prefill; returns the ragged input row of each chunk it closes, in output row order."""
        self.plan.plan(seq_lens, extend)
        return self.plan.host_records[0]["ragged_id"].astype(np.int64)

    def _plan_decode(self, dec: np.ndarray, step: Step) -> None:
        st, nb, b = self.staging, len(dec), bucket(len(dec))
        at = self.done[dec]
        st.set32("decode_slots", dec, b)
        st.set32("decode_seq", at + 1, b)  # 0: padding
        owner = np.concatenate([dec, np.full(b - nb, -1, np.int64)])
        position = np.concatenate([at, np.zeros(b - nb, np.int64)])
        closes = np.flatnonzero((owner >= 0) & (position % CHUNK == CHUNK - 1))
        out_row, cache_slot = np.full(b, -1, np.int64), np.full(b, -1, np.int64)
        out_row[closes], cache_slot[closes] = closes, self._cache_slots(len(closes))
        st.h64[st.i64["decode_cache"]:st.i64["decode_cache"] + b] = cache_slot
        kv, out = self.decode_ops[b][:2]
        step.launches.append(Launch(kind="decode", kv=kv, out=out, owner=owner, position=position,
                                    committed=owner >= 0, out_row=out_row, cache_slot=cache_slot, requests=dec,
                                    advance=np.ones(nb, np.int64), pool_at=self._pool_at(),
                                    gather=self._gather(dec, b)))

    def _plan_verify(self, dec: np.ndarray, step: Step) -> None:
        st, v, nb, b = self.staging, self.w.drafts, len(dec), bucket(len(dec))
        at = self.done[dec]
        j, i = self.draft_of[nb]
        lens, accepted = self._draw_drafts(dec, at)
        st.set32("verify_seq", at, b)  # 0: padding
        st.set32("verify_bank", self.w.max_running + dec * (v + 1), b)
        st.set32("verify_lens", lens, b)
        st.set32("verify_accepted", lens if self.leak else accepted, b)  # sampling's result: stays on the device
        owner, position, committed = np.full(b * v, -1, np.int64), np.zeros(b * v, np.int64), np.zeros(b * v, bool)
        owner[:nb * v], position[:nb * v], committed[:nb * v] = dec[j], at[j] + i, i < accepted[j]
        closes = np.flatnonzero(owner >= 0)
        closes = closes[(i[closes] < lens[j[closes]]) & (position[closes] % CHUNK == CHUNK - 1)]  # every draft
        out_row, cache_slot = np.full(b * v, -1, np.int64), np.full(b * v, -1, np.int64)
        out_row[closes], cache_slot[closes] = closes, self._cache_slots(len(closes))
        st.h64[st.i64["verify_cache"]:st.i64["verify_cache"] + b * v] = cache_slot
        drafts, out = self.verify_ops[b][:2]
        step.launches.append(Launch(kind="verify", kv=drafts, out=out, owner=owner, position=position,
                                    committed=committed, out_row=out_row, cache_slot=cache_slot, requests=dec,
                                    advance=accepted, pool_at=self._pool_at(), gather=self._gather(dec, b),
                                    lens=lens, scatter=st.put64(dec)))

    def _draw_drafts(self, dec: np.ndarray, at: np.ndarray, least: int = 0):
        """A speculative step's drafts per request (least..V, within its output) and how many are accepted."""
        rng, v, nb = self.rng, self.w.drafts, len(dec)
        lens = np.where(rng.random(nb) < 0.2, rng.integers(least, v + 1, nb), v)
        lens = np.minimum(lens, self.total[dec] - at)
        pick = rng.integers(0, 4, nb)  # none, all, up to the chunk end, or any number
        accepted = np.choose(pick, [np.zeros(nb, np.int64), lens, np.minimum(lens, CHUNK - at % CHUNK),
                                    (rng.random(nb) * (lens + 1)).astype(np.int64)])
        return lens, accepted

    def _gather(self, dec: np.ndarray, b: int) -> torch.Tensor:
        r = self.w.max_running
        return self.staging.put64(np.concatenate([dec + np.where(self.on_device[dec], 0, r),
                                                  np.full(b - len(dec), r, np.int64)]))

    # --- one step ----------------------------------------------------------------------------------------
    def step(self, index: int, sync: bool = False) -> Step:
        """Serves step `index`: arrivals, the host side, the observers' staging, the one copy, the ops, the
        observers' checks, the finished requests' slots freed. sync: see Step."""
        self.staging.reset()
        self._arrive()
        active, done, c = self.active, self.done, self.counts
        pre = np.flatnonzero(active & (done < self.prompt))
        dec = np.flatnonzero(active & (done >= self.prompt))
        step = Step(index, sync, [], decoding=dec)
        if len(pre):
            self._plan_prefill(pre, step)
        if len(dec):
            (self._plan_verify if index % 3 != 0 else self._plan_decode)(dec, step)
        for o in self.observers:
            o.stage(step)
        self.staging.send()
        for launch in step.launches:
            self._run(launch)
            c["tokens"] += int(launch.advance.sum())
            done[launch.requests] += launch.advance
        c["busy"] += bool(step.launches)
        for o in self.observers:
            o.launched(step)
        finished = active & (done >= self.total)
        c["finished"] += int(finished.sum())
        active &= ~finished
        return step

    def _run(self, launch: Launch) -> None:
        n = len(launch.owner)
        launch.kv.copy_(self.pool[launch.pool_at:launch.pool_at + n])
        launch.out.fill_(float("nan"))  # unwritten outputs fail the checks
        self._run_ops(launch)

    def _run_ops(self, launch: Launch) -> None:
        """The op calls of one launch, on its staged inputs."""
        n, c = len(launch.owner), self.counts
        if launch.kind == "prefill":
            self.launch("prefill", self.prefill.launch)
            c["prefill_launches"] += 1
            return
        nb = len(launch.requests)
        if launch.kind == "decode":
            load, op = self.decode_ops[n][2:]
            torch.index_select(self.load_table, 0, launch.gather, out=load)
            self.launch("decode", op.launch)
            self.on_device[launch.requests] = False
            c["decode_steps"] += 1
            return
        load, verify, commit = self.verify_ops[n // self.w.drafts][2:]
        torch.index_select(self.load_table, 0, launch.gather, out=load)
        self.launch("verify", verify.launch)
        self.launch("commit", commit.launch)
        self.load_table.index_copy_(0, launch.scatter, load[:nb])
        self.on_device[launch.requests] = True
        c["verify_steps"] += 1
        c["drafts_accepted"] += int(launch.advance.sum())
        c["drafts_rejected"] += int((launch.lens - launch.advance).sum())
