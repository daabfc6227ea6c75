"""Plainly written float64 references of the c4 compressor (docs/spec.md, "The ratio-4 compressor") and a small
engine that drives pydsa's c4 ops over request-scoped rings, for the tests."""
from __future__ import annotations

import numpy as np
import torch

import pydsa
import pyplan

FP8_MAX = 448.0


def entry(rows: np.ndarray, ape: np.ndarray, n: int) -> np.ndarray:
    """Entry n of one request in float64: rows [positions, 4D] (the values the kernel reads: a bf16 ring's
    rows already rounded), ape [8, D]."""
    d = ape.shape[1]
    r = rows.astype(np.float64)
    a = ape.astype(np.float64)
    kv, z = [], []
    if n >= 1:
        for j in range(4):
            u = r[4 * n - 4 + j]
            kv.append(u[:d]), z.append(u[2 * d:3 * d] + a[j])
    for j in range(4):
        u = r[4 * n + j]
        kv.append(u[d:2 * d]), z.append(u[3 * d:] + a[4 + j])
    kv, z = np.stack(kv), np.stack(z)
    w = np.exp(z - z.max(axis=0))
    return (w * kv).sum(axis=0) / w.sum(axis=0)


def bf16(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def hadamard(n: int = 128) -> np.ndarray:
    i = np.arange(n)
    bits = np.vectorize(lambda v: bin(v).count("1"))(i[:, None] & i[None, :])
    return np.where(bits % 2 == 0, 1.0, -1.0)


_H = hadamard()


def indexer_entry(x: np.ndarray, w: np.ndarray, eps: float, rot: np.ndarray):
    """The indexer's store of vector x [128] in float64: (the transformed values h [128], scale)."""
    x = x.astype(np.float64)
    y = x / np.sqrt(np.mean(x * x) + eps) * w.astype(np.float64)
    a, b = y[64::2].copy(), y[65::2].copy()
    c, s = rot[0::2].astype(np.float64), rot[1::2].astype(np.float64)
    y[64::2], y[65::2] = a * c - b * s, a * s + b * c
    h = _H @ y / np.sqrt(128.0)
    return h, max(np.abs(h).max(), 1e-4) / FP8_MAX


def fp8_values(codes: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(codes, np.uint8)).view(torch.float8_e4m3fn).float().numpy()


def fp8_step(v: np.ndarray) -> np.ndarray:
    """The spacing of e4m3 values at |v| (subnormal step 2^-9 below 2^-6)."""
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0 ** -6)))
    return 2.0 ** (e - 3)


def read_indexer(cache: torch.Tensor, loc: int, page_size: int = 64):
    """(codes [128] uint8, scale) of the indexer cache entry at slot loc."""
    flat = cache.reshape(-1).cpu()
    page, s = loc // page_size, loc % page_size
    base = page * page_size * 132
    codes = flat[base + 128 * s: base + 128 * s + 128].numpy()
    scale = flat[base + page_size * 128 + 4 * s: base + page_size * 128 + 4 * s + 4].numpy().view(np.float32)[0]
    return codes, float(scale)


def check_indexer_entry(cache, loc, x, w, eps, rot, page_size=64):
    """The stored indexer entry of vector x (fp32, as the op computed it) against the float64 store: scale
    within 1e-5 relative, every code within one fp8 step of h / scale."""
    codes, scale = read_indexer(cache, loc, page_size)
    h, want = indexer_entry(x, w, eps, rot)
    assert abs(scale - want) <= 1e-5 * want, (scale, want)
    got = fp8_values(codes)
    ref = np.clip(h / want, -FP8_MAX, FP8_MAX)
    assert np.all(np.abs(got - ref) <= fp8_step(ref) * 1.0001), np.abs(got - ref).max()


class Layer:
    """One c4 layer on `device`: both compressors over request-scoped rings of R rows per slot, both
    caches (page size 64), and the inputs of every position of every request (`tokens[c][b][p]`)."""

    def __init__(self, device, *, slots=4, ring_size=8, bf16_ring=False, dims=(512, 128), max_len=96, seed=0,
                 pages=8, store=True):
        g = torch.Generator().manual_seed(seed)
        self.device, self.R, self.dims = device, ring_size, dims
        dtype = torch.bfloat16 if bf16_ring else torch.float32
        self.bf16 = bf16_ring
        self.rotary = (torch.rand(4 * max_len + 8, 64, generator=g) * 2 - 1).to(device)
        self.compressors, self.apes, self.weights, self.caches = [], [], [], []
        for k, d in enumerate(dims):
            ring = torch.full((slots * ring_size, 4 * d), float("nan"), dtype=dtype).to(device)
            ape = (torch.randn(8, d, generator=g) * 0.5).to(device)
            w = (torch.rand(d, generator=g) + 0.5).to(device)
            cache = None
            if store:
                layout = "indexer" if k == 1 else "v4"
                page = pydsa.indexer_page_bytes(d, 64) if k == 1 else pydsa.kv_page_bytes(d, 64)
                cache_t = torch.full((pages, page), 0xA5, dtype=torch.uint8).to(device)
                cache = pydsa.KVCache(cache_t, w, self.rotary, page_size=64, eps=1e-6, layout=layout)
            self.compressors.append(pydsa.C4Compressor(ring, ape, store=cache, ring_size=ring_size))
            self.apes.append(ape.cpu().numpy())
            self.weights.append(w.cpu().numpy())
            self.caches.append(cache)
        self.tokens = [torch.randn(slots, max_len, 4 * d, generator=g).numpy().astype(np.float32) for d in dims]

    def kwargs(self, rows_by_compressor, out_rows=None):
        """The ops' compressor keywords for inputs given per compressor ([rows, 4D] numpy)."""
        kw = dict(main=self.compressors[0], kv_score=torch.from_numpy(rows_by_compressor[0]).to(self.device))
        if len(self.dims) > 1:
            kw.update(indexer=self.compressors[1],
                      indexer_kv_score=torch.from_numpy(rows_by_compressor[1]).to(self.device))
        if out_rows is not None:
            kw["out"] = torch.full((out_rows, self.dims[0]), float("nan"), device=self.device)
            if len(self.dims) > 1:
                kw["indexer_out"] = torch.full((out_rows, self.dims[1]), float("nan"), device=self.device)
        return kw

    def decode(self, seqs, slots, *, records=False, pdl=None, error_count=None, records_ahead=False):
        """Decode one token per request (seqs: lengths with the token); returns the outs per compressor."""
        b = len(seqs)
        rows = [np.stack([self.tokens[k][slots[i], seqs[i] - 1] for i in range(b)]) for k in range(len(self.dims))]
        kw = self.kwargs(rows, b)
        kw["cache_slots"] = torch.tensor([(s - 1) // 4 + 32 * slots[i] for i, s in enumerate(seqs)],
                                         dtype=torch.int64, device=self.device) if self.caches[0] else None
        if records:
            recs = decode_records(seqs, slots, self.R)
            pydsa.c4_decode(**kw, records=torch.from_numpy(recs).to(self.device), pdl=pdl, error_count=error_count,
                            records_ahead=records_ahead)
        else:
            pydsa.c4_decode(**kw, seq_lens=torch.tensor(seqs, dtype=torch.int32, device=self.device),
                            slots=torch.tensor(slots, dtype=torch.int32, device=self.device), pdl=pdl, error_count=error_count)
        return [kw["out"].cpu().numpy()] + ([kw["indexer_out"].cpu().numpy()] if len(self.dims) > 1 else [])

    def extend(self, seqs, exts, slots):
        """One extend (positions seq - ext .. seq - 1 of each request); returns (outs, compress records)."""
        rows = [np.concatenate([self.tokens[k][slots[i], seqs[i] - exts[i]:seqs[i]] for i in range(len(seqs))])
                for k in range(len(self.dims))]
        plan = pyplan.plan_c4(np.array(seqs, np.int64), np.array(exts, np.int64), np.array(slots, np.int64), self.R)
        compress = plan[0]
        kw = self.kwargs(rows, compress.shape[0])
        if self.caches[0]:
            slots_of_rows = []
            for i in range(len(seqs)):
                slots_of_rows += [p // 4 + 32 * slots[i] for p in range(seqs[i] - exts[i], seqs[i])]
            kw["cache_slots"] = torch.tensor(slots_of_rows, dtype=torch.int64, device=self.device)
        pydsa.c4_extend(**kw, plan=plan.to(self.device))
        return [kw["out"].cpu().numpy()] + ([kw["indexer_out"].cpu().numpy()] if len(self.dims) > 1 else []), compress


def decode_records(seqs, slots, ring_size) -> np.ndarray:
    """sglang-format decode records for request-scoped rings (uint8 [B, 16])."""
    out = np.zeros((len(seqs), 4), np.int32)
    for i, (s, slot) in enumerate(zip(seqs, slots)):
        p = s - 1
        q = max(p - 4, 0)
        row = slot * ring_size + p % ring_size
        out[i] = (s, row, (slot * ring_size + q % ring_size) // 4, row // 4)
    return out.view(np.uint8).reshape(len(seqs), 16)
