"""The torch planners pydsa.sglang's c4 plans were written with before the c4 plan op (docs/spec.md, "c4 plans"): a
chain of torch operations per plan, kept as the reference the op's records are held to. Arguments are taken as
valid in kind (pydsa.sglang.c4 judges them); their values are data, as the op takes them."""
from __future__ import annotations

from typing import NamedTuple

import torch

WINDOW, RATIO = 8, 4
_INVALID_C = (-1, 0, -1, -1)  # {0xFFFFFFFF, u16 0 | u16 0, -1, -1} as int32 words
_INVALID_W = (-1, -1)


class Ring(NamedTuple):
    """How sglang addresses a c4 ring: per SWA page (req_to_token, full_to_state) or per request."""
    req_to_token: torch.Tensor
    full_to_state: torch.Tensor
    swa_page_size: int
    ring_size: int
    use_req_ring: bool

    def rows(self, positions, rid):
        """Ring rows (int64) of positions (int64, >= 0) of requests rid, -1 where the tables cannot address one
        (rid or a position outside req_to_token, a token outside full_to_state, a negative SWA slot) or where the
        row does not fit a record's 31 bits."""
        if self.use_req_ring:
            row = rid * self.ring_size + positions % self.ring_size  # int64: may wrap for rid past 2^63 / R
            return torch.where((rid >= 0) & (rid <= (2 ** 31 - 1) // self.ring_size) & (row <= 2 ** 31 - 1), row, -1)
        r2t, f2s = self.req_to_token, self.full_to_state
        if r2t.dim() != 2 or r2t.numel() == 0 or f2s.numel() == 0:
            return torch.full_like(positions, -1)
        ok = (rid >= 0) & (rid < r2t.shape[0]) & (positions >= 0) & (positions < r2t.shape[1])
        tok = r2t[rid.clamp(0, r2t.shape[0] - 1), positions.clamp(0, r2t.shape[1] - 1)].to(torch.int64)
        ok &= (tok >= 0) & (tok < f2s.shape[0])
        swa = f2s.reshape(-1)[tok.clamp(0, f2s.numel() - 1)]
        ok &= swa >= 0
        page = torch.div(swa, self.swa_page_size, rounding_mode="floor")
        row = page * self.ring_size + swa % self.ring_size
        return torch.where(ok & (page <= (2 ** 31 - 1) // self.ring_size) & (row <= 2 ** 31 - 1), row, -1)


def plan_decode(req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size, ring_size,
                use_req_ring=False) -> torch.Tensor:
    """plan_d uint8 [B, 16]."""
    seq = seq_lens.to(req_pool_indices.device, torch.int64)
    rid = req_pool_indices
    p1 = (seq - 1).clamp_min(0)
    p0 = (p1 - RATIO).clamp_min(0)
    ring = Ring(req_to_token, full_to_state, swa_page_size, ring_size, use_req_ring)
    write, first = ring.rows(p1, rid), ring.rows(p0, rid)
    plan = torch.stack([seq.clamp_min(0), write, torch.div(first, 4, rounding_mode="floor"),
                        torch.div(write, 4, rounding_mode="floor")], dim=1)
    # a length past a record's 31 bits: a record the ops skip and count
    plan[seq > 2 ** 31 - 1] = torch.tensor([2 ** 31 - 1, -1, -1, -1], dtype=plan.dtype, device=plan.device)
    return plan.to(torch.int32).view(torch.uint8).reshape(-1, 16)


def _stage0(seq, ext, num_q_tokens, swa_page_size, ring_size, use_req_ring):
    """Per token row t < num_q_tokens: its request, position, whether it closes an entry, its window rows from
    the ring and whether it is kept in the ring (sglang's rules)."""
    dev = seq.device
    t = torch.arange(num_q_tokens, device=dev)
    ends = torch.cumsum(ext, 0)
    b = torch.searchsorted(ends, t, right=True)
    live = b < seq.shape[0]
    b = b.clamp_max(max(seq.shape[0] - 1, 0))
    j = t - (ends[b] - ext[b])
    pos = seq[b] - ext[b] + j
    mtp_pad = ring_size - WINDOW + 2 if ring_size > WINDOW else 0
    first_w = torch.minimum(torch.div(seq, RATIO, rounding_mode="floor") * RATIO - RATIO, seq - mtp_pad)[b]
    closes = live & ((pos + 1) % RATIO == 0)
    kept = live & ((pos >= first_w) | ((pos % swa_page_size >= swa_page_size - RATIO) if not use_req_ring else False))
    ring_rows = WINDOW - torch.clamp(j + 1, max=WINDOW)
    return t, b, pos, closes, kept, ring_rows


def plan_prefill(req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state, swa_page_size, ring_size,
                 num_q_tokens, use_cuda_graph=False, use_req_ring=False, host=None):
    """(plan_c uint8 [C, 16], plan_w uint8 [W, 8]): host=True (default: lengths on the CPU) the host planner's
    records; else the device planner's, in request and position order, padded to num_q_tokens rows."""
    dev = req_pool_indices.device
    host = seq_lens.device.type == "cpu" if host is None else host
    seq, ext = seq_lens.to(torch.int64), extend_lens.to(torch.int64)
    n = num_q_tokens
    seq_d, ext_d = seq.to(dev), ext.to(dev)
    t, b, pos, closes, kept, ring_rows = _stage0(seq_d, ext_d, n, swa_page_size, ring_size, use_req_ring)
    rid = req_pool_indices[b]
    p1 = torch.where(closes | kept, pos, torch.zeros_like(pos))
    p0 = (p1 - RATIO).clamp_min(0)
    from_ring = ring_rows > 0
    ring = Ring(req_to_token, full_to_state, swa_page_size, ring_size, use_req_ring)
    row1, row0 = ring.rows(p1, rid), ring.rows(p0, rid)
    g0 = torch.where(from_ring, torch.div(row0, 4, rounding_mode="floor"), torch.full_like(row0, -1))
    g1 = torch.where(from_ring, torch.div(row1, 4, rounding_mode="floor"), b)
    comp = torch.stack([pos + 1, t | (ring_rows << 16), g0, g1], dim=1).to(torch.int32)
    write = torch.stack([t, row1], dim=1).to(torch.int32)
    if host:
        nc, nw = int(closes.sum()), int(kept.sum())
        comp, write = comp[closes], write[kept]
        rows_c, rows_w = (n, n) if use_cuda_graph else (nc, nw)
    else:
        rows_c = rows_w = n
        comp = _compacted(comp, closes, _INVALID_C)
        write = _compacted(write, kept, _INVALID_W)
    plan_c = torch.tensor(_INVALID_C, dtype=torch.int32, device=dev).repeat(rows_c, 1)
    plan_w = torch.tensor(_INVALID_W, dtype=torch.int32, device=dev).repeat(rows_w, 1)
    plan_c[:comp.shape[0]] = comp[:rows_c]
    plan_w[:write.shape[0]] = write[:rows_w]
    return plan_c.view(torch.uint8).reshape(rows_c, 16), plan_w.view(torch.uint8).reshape(rows_w, 8)


def _compacted(records, mask, invalid):
    """The masked records first, in order, then invalid ones (fixed shape: no host synchronization)."""
    order = torch.argsort((~mask).to(torch.int8), stable=True)
    out = records[order]
    fill = torch.tensor(invalid, dtype=records.dtype, device=records.device)
    return torch.where(mask[order].unsqueeze(1), out, fill)
