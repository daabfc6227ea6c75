"""A plainly written float64 reference of the offline c128 compressor (docs/spec.md, "The offline c128
compressor") and a small engine that drives pydsa's offline ops over a request-scoped ring, for the tests."""
from __future__ import annotations

import numpy as np
import torch

import pydsa
import pyplan
from c4_reference import bf16

CHUNK = 128
POISON = 0xA5
PAGE = 2  # sglang's c128 cache: two entries a page


def entry(rows: np.ndarray, ape: np.ndarray) -> np.ndarray:
    """A chunk's entry in float64 from its 128 rows [128, 2D] (the values the op reads: a bf16 ring's rows
    already rounded) and ape [128, D]."""
    d = ape.shape[1]
    r = rows.astype(np.float64)
    z = r[:, d:] + ape.astype(np.float64)
    w = np.exp(z - z.max(axis=0))
    return (w * r[:, :d]).sum(axis=0) / w.sum(axis=0)


def decode_records(seqs, slots, ring_size=CHUNK) -> np.ndarray:
    """sglang-format decode records for a request-scoped ring (uint8 [B, 16]): {seq_len, write row, -1, page}."""
    out = np.zeros((len(seqs), 4), np.int32)
    for i, (s, slot) in enumerate(zip(seqs, slots)):
        p = s - 1
        row = slot * ring_size + p % ring_size
        out[i] = (s, row, -1, (slot * ring_size + (p - p % CHUNK) % ring_size) // CHUNK)
    return out.view(np.uint8).reshape(len(seqs), 16)


class Layer:
    """One offline c128 layer on `device`: a request-scoped ring of `slots` slots (R rows each), a poisoned V4
    cache (page size 2) and the input rows of every position of every request (`tokens[slot][p]`). Chunk n of
    slot s is stored at cache slot s * chunks + n."""

    def __init__(self, device, *, slots=4, bf16_ring=False, d=512, max_len=400, seed=0, store=True, ring_size=CHUNK):
        g = torch.Generator().manual_seed(seed)
        self.device, self.d, self.bf16, self.R = torch.device(device), d, bf16_ring, ring_size
        self.chunks = max_len // CHUNK + 1
        dtype = torch.bfloat16 if bf16_ring else torch.float32
        ring = torch.full((slots * ring_size, 2 * d), float("nan"), dtype=dtype).to(self.device)
        self.ape = (torch.randn(CHUNK, d, generator=g) * 0.5).to(self.device)
        angles = torch.rand(max_len + CHUNK, 32, generator=g) * 6.3
        rot = torch.stack([angles.cos(), angles.sin()], dim=-1).reshape(-1, 64)
        weight = torch.rand(d, generator=g) + 0.5
        self.cache = None
        if store:
            pages = (slots * self.chunks + PAGE - 1) // PAGE
            cache = torch.full((pages, pydsa.kv_page_bytes(d, PAGE)), POISON, dtype=torch.uint8)
            self.cache = pydsa.KVCache(cache.to(self.device), weight.to(self.device), rot.to(self.device),
                                       page_size=PAGE, eps=1e-6)
        self.ring = pydsa.C128Ring(ring, self.ape, store=self.cache, ring_size=ring_size)
        tokens = torch.randn(slots, max_len, 2 * d, generator=g)
        tokens[:, :, d:] *= 3  # scores spread enough that the softmax is far from uniform
        self.tokens = tokens.numpy()

    def loc(self, slot, n):
        return slot * self.chunks + n

    def decode(self, seqs, slots, *, records=False, error_count=None):
        """One token per request (seqs: lengths with it); returns out [B, D] (NaN where no chunk closed)."""
        b = len(seqs)
        kv = torch.from_numpy(np.stack([self.tokens[slots[i], seqs[i] - 1] for i in range(b)]).reshape(b, 2 * self.d))
        out = torch.full((b, self.d), float("nan"), device=self.device)
        kw = dict(out=out, error_count=error_count)
        if self.cache is not None:
            kw["cache_slots"] = torch.tensor([self.loc(slots[i], (s - 1) // CHUNK) for i, s in enumerate(seqs)],
                                             dtype=torch.int64, device=self.device)
        if records:
            kw["records"] = torch.from_numpy(decode_records(seqs, slots, self.R)).to(self.device)
        else:
            kw["seq_lens"] = torch.tensor(seqs, dtype=torch.int32, device=self.device)
            kw["slots"] = torch.tensor(slots, dtype=torch.int32, device=self.device)
        pydsa.c128_offline_decode(self.ring, kv.to(self.device), **kw)
        return out.cpu().numpy()

    def extend(self, seqs, exts, slots, *, host_plan=False):
        """One extend (positions seq - ext .. seq - 1 of each request); returns (out, compress records)."""
        rows = np.concatenate([self.tokens[slots[i], seqs[i] - exts[i]:seqs[i]] for i in range(len(seqs))])
        plan = pyplan.plan_c128_offline(np.array(seqs), np.array(exts), np.array(slots), self.R)
        compress = plan[0]
        out = torch.full((compress.shape[0], self.d), float("nan"), device=self.device)
        kw = dict(out=out)
        if self.cache is not None:
            locs = [self.loc(slots[i], p // CHUNK) for i in range(len(seqs)) for p in range(seqs[i] - exts[i], seqs[i])]
            kw["cache_slots"] = torch.tensor(locs, dtype=torch.int64, device=self.device)
        pydsa.c128_offline_extend(self.ring, torch.from_numpy(rows).to(self.device),
                                  plan if host_plan else plan.to(self.device), **kw)
        return out.cpu().numpy(), compress

    def expected(self, slot, n, ring_below):
        """Chunk n of `slot` in float64: positions below ring_below were read from the ring (rounded with a
        bf16 ring)."""
        rows = self.tokens[slot, CHUNK * n:CHUNK * n + CHUNK].copy()
        if self.bf16:
            below = max(0, min(CHUNK, ring_below - CHUNK * n))
            rows[:below] = bf16(rows[:below])
        return entry(rows, self.ape.cpu().numpy())
