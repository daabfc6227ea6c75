"""sglang 0.5.23's offline c128 plans, written out plainly from its planner's rules (c_plan.cuh: the host loop, then
the request-scoped rows of compress_ratio 128) in C's integer semantics, and an sglang-shaped offline c128 layer
driven through pydsa.sglang, for the tests."""
from __future__ import annotations

import struct

import numpy as np
import torch

import pydsa
from pydsa import sglang

CHUNK, D, PAGE = 128, 512, 2
_INVALID_C = struct.pack("<IHHii", 0xFFFFFFFF, 0, 0, -1, -1)
_INVALID_W = struct.pack("<Ii", 0xFFFFFFFF, -1)


def _i32(x: int) -> int:
    """x narrowed to a signed 32-bit int (a C static_cast)."""
    return (x + 2 ** 31) % 2 ** 32 - 2 ** 31


def _rem(a: int, m: int) -> int:
    """C's a % m (the sign of a)."""
    return a - m * int(a / m) if a >= 0 else -((-a) % m)


def _div(a: int, m: int) -> int:
    """C's a / m (toward zero)."""
    return a // m if a >= 0 else -((-a) // m)


def _row(rid: int, p: int, ring_size: int) -> int:
    return _i32(rid * ring_size + _rem(p, ring_size))


def decode_plan(seq_lens, rids, ring_size=CHUNK) -> bytes:
    """plan_d: {seq_len, write row, page of max(p - 128, 0), page of p}, p = seq_len - 1."""
    out = b""
    for s, r in zip(seq_lens, rids):
        s = _i32(s)
        p = s - 1
        write = _row(r, p, ring_size)
        out += struct.pack("<Iiii", s % 2 ** 32, write, _div(_row(r, max(p - CHUNK, 0), ring_size), CHUNK),
                           _div(write, CHUNK))
    return out


def prefill_plan(seq_lens, extend_lens, rids, ring_size=CHUNK, num_q_tokens=None, graph=False):
    """(plan_c, plan_w) bytes of the host planner: request by request, token by token; CUDA-graph plans padded to
    num_q_tokens records each."""
    pad = ring_size - CHUNK + 2 if ring_size > CHUNK else 0
    c, w, counter = [], [], 0
    for i, (s, e) in enumerate(zip(seq_lens, extend_lens)):
        prefix, r = s - e, rids[i]
        first_kept = min(s // CHUNK * CHUNK, s - pad)
        for j in range(e):
            p, ragged = prefix + j, counter + j
            if (p + 1) % CHUNK == 0:
                ring_rows = CHUNK - min(j + 1, CHUNK)
                pages = (_div(_row(r, max(p - CHUNK, 0), ring_size), CHUNK), _div(_row(r, p, ring_size), CHUNK)) \
                    if ring_rows else (-1, i)
                c.append(struct.pack("<IHHii", p + 1, ragged, ring_rows, *pages))
            if p >= first_kept:
                w.append(struct.pack("<Ii", ragged, _row(r, p, ring_size)))
        counter += e
    if graph:
        c += [_INVALID_C] * (num_q_tokens - len(c))
        w += [_INVALID_W] * (num_q_tokens - len(w))
    return b"".join(c), b"".join(w)


def tables(device, num_reqs=8):
    """req_to_token and full_to_state as sglang passes them (the c128 planner judges them, never reads them)."""
    return (torch.zeros(num_reqs, 8, dtype=torch.int32, device=device),
            torch.zeros(16, dtype=torch.int64, device=device))


class Layer:
    """One sglang-shaped offline c128 layer on `device`: the pool's ring (flat [rows, 2D], rid's rows rid * R ..,
    rows for `reqs` requests + R + 1 rounded to 128, as sglang's pool), ape, the store's buffers (V4, page 2) and
    every position's input row of every request (`tokens[rid][p]`). Chunk n of request rid is stored at cache slot
    rid * chunks + n."""

    def __init__(self, device, *, reqs=4, ring_size=CHUNK, bf16_ring=False, max_len=600, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.device, self.R, self.bf16 = torch.device(device), ring_size, bf16_ring
        self.chunks = max_len // CHUNK + 1
        rows = -(-(reqs * ring_size + ring_size + 1) // CHUNK) * CHUNK
        self.ring = (torch.randn(rows, 2 * D, generator=g)).to(torch.bfloat16 if bf16_ring else torch.float32)
        self.ring = self.ring.to(self.device)
        self.ape = (torch.randn(CHUNK, D, generator=g) * 0.5).to(self.device)
        self.weight = (torch.rand(D, generator=g) + 0.5).to(self.device)
        self.freq = torch.polar(torch.ones(max_len + CHUNK, 32), torch.rand(max_len + CHUNK, 32, generator=g) * 6.3)
        self.freq = self.freq.to(self.device)
        pages = (reqs * self.chunks + PAGE - 1) // PAGE
        self.cache = torch.full((pages, pydsa.kv_page_bytes(D, PAGE)), 0xA5, dtype=torch.uint8, device=self.device)
        tokens = torch.randn(reqs, max_len, 2 * D, generator=g)
        tokens[:, :, D:] *= 3  # scores spread enough that the softmax is far from uniform
        self.tokens = tokens
        self.r2t, self.f2s = tables(self.device, reqs)

    def store_args(self, out_loc):
        return dict(norm_weight=self.weight, norm_eps=1e-6, freq_cis=self.freq, out_loc=out_loc, kvcache=self.cache,
                    page_size=PAGE)

    def fill(self, rid, length):
        """The ring rows a request of `length` tokens holds: its chunk in progress, as its decodes wrote them."""
        for p in range(length // CHUNK * CHUNK, length):
            self.ring[rid * self.R + p % self.R] = self.tokens[rid, p].to(self.ring.dtype).to(self.device)

    def loc(self, rid, p):
        """The cache slot of the chunk position p closes (sglang's c128_out_loc of the token)."""
        return rid * self.chunks + p // CHUNK

    def decode(self, seqs, rids, *, fused=True):
        """One token per request through pydsa.sglang (its plan, then compress_forward_and_store or the two calls);
        returns out [B, D] (closing rows)."""
        rid = torch.tensor(rids, dtype=torch.int64, device=self.device)
        plan = sglang.CompressorDecodePlan.generate(CHUNK, rid, self.r2t, self.f2s,
                                                    torch.tensor(seqs, dtype=torch.int64, device=self.device),
                                                    256, self.R)
        kv = torch.stack([self.tokens[r, s - 1] for r, s in zip(rids, seqs)]).to(self.device)
        loc = torch.tensor([self.loc(r, s - 1) for r, s in zip(rids, seqs)], dtype=torch.int64, device=self.device)
        return self._run(kv, plan, loc, fused)

    def extend(self, seqs, exts, rids, *, fused=True, graph=False, device_lengths=False):
        """New tokens of each request (positions seq - ext .. seq - 1) through pydsa.sglang; returns (out [C, D],
        the plan)."""
        rid = torch.tensor(rids, dtype=torch.int64, device=self.device)
        where = self.device if device_lengths else "cpu"
        n = int(sum(exts))
        plan = sglang.CompressorPrefillPlan.generate(CHUNK, rid, torch.tensor(seqs, device=where),
                                                     torch.tensor(exts, device=where), self.r2t, self.f2s, 256,
                                                     self.R, n, use_cuda_graph=graph)
        kv = torch.cat([self.tokens[r, s - e:s] for r, s, e in zip(rids, seqs, exts)]).to(self.device)
        loc = torch.tensor([self.loc(r, p) for r, s, e in zip(rids, seqs, exts) for p in range(s - e, s)],
                           dtype=torch.int64, device=self.device)
        return self._run(kv, plan, loc, fused), plan

    def _run(self, kv, plan, loc, fused):
        view = self.ring.view(-1, CHUNK, 2 * D)
        if fused:
            out = torch.full((plan[1].shape[0], D), float("nan"), device=self.device)
            sglang.compress_forward_and_store(self.ring, kv, self.ape, plan, **self.store_args(loc), out=out,
                                              is_online=False)
            return out
        out = sglang.compress_forward(view, kv, self.ape, plan, head_dim=D, compress_ratio=CHUNK, is_online=False)
        sglang.compress_norm_rope_store(out, plan, **self.store_args(loc))
        return out

    def expected(self, rid, p, ring_below):
        """The chunk position p closes, in float64: rows of positions below ring_below read from the ring (bf16
        rounded in a bf16 ring; the closing row of a decode is written first, so it is rounded too)."""
        start = p // CHUNK * CHUNK
        rows = self.tokens[rid, start:start + CHUNK].double()
        if self.bf16:
            below = max(0, min(CHUNK, ring_below - start))
            rows[:below] = rows[:below].to(torch.bfloat16).double()
        z = rows[:, D:] + self.ape.cpu().double()
        e = torch.exp(z - z.max(dim=0).values)
        return ((e * rows[:, :D]).sum(0) / e.sum(0)).numpy()


def by_ragged(plan_c, plan_w):
    """A plan's live records, each list sorted by ragged row (a device plan's order is sglang's atomics')."""
    c = [tuple(r) for r in plan_c.cpu().view(torch.int32).reshape(-1, 4).tolist() if r[0] != -1]
    w = [tuple(r) for r in plan_w.cpu().view(torch.int32).reshape(-1, 2).tolist() if r[0] != -1]
    return sorted(c, key=lambda r: r[1] & 0xFFFF), sorted(w)


def words(b: bytes, width: int) -> np.ndarray:
    return np.frombuffer(b, np.int32).reshape(-1, width)
