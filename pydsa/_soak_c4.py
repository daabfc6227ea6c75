"""The soak's c4 layer: the c4 layer of pydsa/_serving_c4.py beside the c128 loop, an observer of it, serving
requests of its own over C4_SLOTS slots (prompts of 1..3000 tokens, outputs of 20..300, prefill chunks of
1..512 tokens each, 2048 a serving step), one serving step every C4_EVERY loop steps: a serving step's host side
costs about what a c128 step's does, and one in 8 adds about 13 % to the loop's step (H100: 0.40 -> 0.45 ms),
which keeps a million steps inside a 600 s run.

Checked where the ops run (C4Check, an observer of the c4 layer), at every span's end (about every 60 serving
steps, and at every checkpoint):
- every entry a request commits, of both compressors, against the float64 formula over its 8 raw rows
  (docs/spec.md, "One entry"), relative error < TOLERANCE: a stale ring row, a rejected draft read as
  accepted, an unwritten output (the held rows are NaN until written) all fail it;
- both caches, byte for byte, against mirrors the standalone store fills from the same vectors at the same
  slots and rotary rows (the entries of rejected drafts included), at every span's end: every entry is compared
  before its slot is reused;
- the index errors the ops skip and count (the c128 loop's counter)."""
from __future__ import annotations

import numpy as np
import torch

from ._serving_c4 import DIMS, FAULTS, PAGE, RING, TOLERANCE, C4Serving, C4Workload
from .store import KVCache, kv_store

C4_SLOTS, C4_EVERY = 8, 8  # request slots; loop steps per c4 serving step
MAX_EXTEND, TOKEN_BUDGET = 512, 2048  # a prefill chunk's tokens per request, and per serving step
# flat rows of a pool seen as [rows * 4, D] ([kv_A | kv_B | score_A | score_B] per input row): entry terms 0..3
# take the A quarters of the previous quartet's rows, 4..7 the B quarters of their own
_QUARTERS = np.array([[0] * 4 + [1] * 4, [2] * 4 + [3] * 4], np.int64)


class C4Soak(C4Serving):
    """The soak's c4 layer, an observer of the c128 loop (its staging, its error counter), with its check
    attached. Counters on the device: failures, mismatches, max_err (the check's); the rest in `counts`."""

    def __init__(self, device, staging, errors, rotary, weight, *, drafts: int, pool_rows: int, seed: int,
                 steps: int, fault: str | None = None):
        w = C4Workload(C4_SLOTS, (1, 3000), (20, 300), MAX_EXTEND, TOKEN_BUDGET, drafts=drafts, every=C4_EVERY)
        super().__init__(w, device, staging, errors, rotary, weight, pool_rows=pool_rows, seed=seed, steps=steps,
                         fault=fault if fault in FAULTS else None)
        self.check = C4Check(self)
        self.observers.append(self.check)

    @property
    def failures(self):
        return self.check.failures

    @property
    def mismatches(self):
        return self.check.mismatches

    @property
    def max_err(self):
        return self.check.max_err


class C4Check:
    """The soak's checks of a c4 layer (an observer of it), run where the ops run: every committed entry is held
    with its 8 window rows until the span's end, then checked against float64; the mirrors store every vector
    the span holds, and the caches are compared with them. Counters on the device: failures, mismatches,
    max_err."""

    def __init__(self, layer: C4Serving):
        device = layer.errors.device
        self.layer, self.st = layer, layer.st
        self.mirrors = [KVCache(torch.zeros_like(c.store.cache), c.store.norm_weight, c.store.rotary,
                                page_size=PAGE, layout=c.store.layout) for c in layer.comp]
        self.failures = torch.zeros((), dtype=torch.int64, device=device)
        self.mismatches = torch.zeros((), dtype=torch.int64, device=device)
        self.max_err = torch.zeros((), dtype=torch.float64, device=device)
        self.pending, self.windows, self.check = [], [], None

    def stage(self, step) -> None:
        """Holds the step's committed entries; at a span's end stages the check of the span: the committed
        entries' rows and windows, and every held row's rotary row and cache slot for the mirrors (-1: the row
        closed nothing)."""
        self.check = None
        if len(step.rows):
            self.pending.append(step.rows)
            self.windows.append(step.window)
        span = step.span
        if span is None:
            return
        rows = np.concatenate(self.pending) if self.pending else np.zeros(0, np.int64)
        windows = (np.concatenate(self.windows)[:, None, :] * 4 + _QUARTERS).reshape(-1) if self.windows else rows
        stored = span.closing >= 0
        self.check = (span.used, len(rows), self.st.put64(rows), self.st.put64(windows),
                      self.st.put32(np.maximum(span.closing - 3, 0)),
                      self.st.put64(np.where(stored, span.cache_slot, -1)))
        self.pending, self.windows = [], []

    def launched(self, step) -> None:
        """Every held committed entry against float64; the mirrors store every held vector; caches compared."""
        if self.check is None:
            return
        layer = self.layer
        used, k, rows, windows, rotary_rows, cache_slots = self.check
        for c, d in enumerate(DIMS):
            if k:
                raw = layer.pools[c].view(-1, d).index_select(0, windows).view(k, 2, 8, d).double()
                weights = torch.softmax(raw[:, 1] + layer.apes[c], dim=1)
                ref = (weights * raw[:, 0]).sum(1)
                got = layer.vectors[c].index_select(0, rows).double()
                err = torch.linalg.vector_norm(got - ref, dim=1) / torch.linalg.vector_norm(ref, dim=1)
                self.failures += (~(err < TOLERANCE)).sum()
                torch.maximum(self.max_err, err.max(), out=self.max_err)
                del raw, weights, ref, got, err  # nothing of a check outlives it: the memory sampled is exact
            kv_store(layer.vectors[c][:used], rotary_rows, cache_slots, self.mirrors[c], error_count=layer.errors)
            self.mismatches += (layer.comp[c].store.cache != self.mirrors[c].cache).any()
