"""sglang 0.5.23's offline c128 compressor (its default c128 layer: compress_ratio 128, `is_online=False`) over
pydsa's offline c128 ops (docs/spec.md, "The offline c128 compressor").

sglang keeps a request-scoped ring of raw [kv | score] rows: `kv_score_buffer` viewed [-1, 128, 2D], request rid's
position p at row rid * R + p % R (R = the pool's ring_size: 128, or 256 under speculative decoding), a chunk's 128
rows one page of 128 rows. Its plans are the records pydsa's offline ops read in place:
- decode: plan_d uint8 [B, 16], {u32 seq_len, i32 write row, i32 page of position max(p - 128, 0), i32 page of the
  new token's chunk}, p = seq_len - 1 (a record of seq_len 0 writes nothing here; sglang's writes row rid * R - 1);
- extend: plan_c uint8 [C, 16], {u32 seq_len = position + 1, u16 ragged row, u16 buffer_len = 128 - min(j + 1,
  128) for the request's j-th new token, i32 page of max(position - 128, 0), i32 page of the chunk} where
  buffer_len > 0, else {.., -1, the request's batch index}; plan_w uint8 [W, 8], {u32 ragged row, i32 ring row}
  for the positions >= min(the last chunk start, seq_len - pad), pad = R - 126 when R > 128 (0 otherwise).
  Padding {0xFFFFFFFF, 0, 0, -1, -1} and {0xFFFFFFFF, -1}; CUDA-graph plans have num_q_tokens rows of each.

The planners write sglang's records: host lengths give its host planner's records byte for byte, device lengths
its device planner's records in ragged-row order (sglang's order follows its atomics), padded to num_q_tokens
rows. Neither synchronizes with the host: device lengths stay on the device, and host records travel in one
copy from pinned memory, as sglang's do. They are torch operations (a handful of small launches where sglang
runs one kernel): the plugin leaves the per-step plan to sglang's kernel and reads its records in place.

Ring sizes that are not a multiple of 128 are refused (sglang's decode planner takes them; a page of 128 rows
then straddles two requests' rings, silently). The calls raise pydsa's argument errors in pydsa's names
(compress.py says them in sglang's); the planners raise sglang's RuntimeError, naming the argument.
"""
from __future__ import annotations

import torch

from .. import buffer_key
from ..c128_offline import C128Ring, c128_offline_decode, c128_offline_extend
from ..errors import ArgumentValueError
from . import c4 as sglang_c4
from ._args import count_of, described as _described, memo, of_kind

RATIO = 128  # rows of a chunk, and of a ring page
MAX_TOKENS = sglang_c4.MAX_TOKENS


def _check_geometry(swa_page_size, ring_size, use_req_ring) -> None:
    """sglang's pool geometry for ratio 128: ring_size rows per request (a multiple of 128, dividing
    swa_page_size, as sglang's prefill planner requires); its c128 ring is request-scoped, so use_req_ring (a
    c4 switch) is refused, as sglang's planners refuse it."""
    for name, v in (("swa_page_size", swa_page_size), ("ring_size", ring_size)):
        if count_of(v) is None:
            raise RuntimeError(f"{name} must be an int (got {_described(v)} {v!r})")
    sglang_c4.check_flags(use_req_ring=use_req_ring)
    if use_req_ring:
        raise RuntimeError("use_req_ring is True but compress_ratio is 128: the c128 ring is request-scoped already "
                           "(use_req_ring is a c4 switch; sglang's planner refuses it too)")
    if ring_size < RATIO or ring_size % RATIO:
        raise RuntimeError(f"ring_size is {ring_size}; expected a positive multiple of 128 (a chunk's rows are one "
                           f"page of 128 ring rows; another size makes a page straddle two requests' rings)")
    if swa_page_size <= 0 or swa_page_size % ring_size:
        raise RuntimeError(f"swa_page_size ({swa_page_size}) must be a positive multiple of ring_size ({ring_size})")


def _lengths(name: str, t, b: int) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int64, torch.int32) or t.dim() != 1 \
            or t.shape[0] != b:
        raise RuntimeError(f"{name} must be an int64 or int32 tensor [B] with B the length of req_pool_indices (got "
                           f"{_described(t)}; req_pool_indices [{b}])")


def _rows_of(rid: torch.Tensor, positions: torch.Tensor, ring_size: int) -> torch.Tensor:
    """Ring rows of positions (int64) of requests rid (int64), as sglang computes them: rid * R + p % R (a C
    remainder) in 32 bits; but where rid is negative or the row does not fit 31 bits (from rid 2^24 at R = 128;
    sglang's would wrap into another request's rows, request 0's for rid = 2^25), -2^31: a row (and a page,
    -2^24) outside every ring, which the ops skip and count."""
    rows = rid * ring_size + torch.fmod(positions, ring_size)  # int64: wraps for rid past 2^63 / R, tested first
    return torch.where((rid < 0) | (rid > (2 ** 31 - 1) // ring_size) | (rows > 2 ** 31 - 1), -2 ** 31,
                       rows).to(torch.int32)


def _page(rows: torch.Tensor) -> torch.Tensor:
    return torch.div(rows, RATIO, rounding_mode="trunc")  # C division, as sglang's int32 / int32


def plan_decode(req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size: int, ring_size: int,
                use_req_ring: bool = False) -> torch.Tensor:
    """sglang's offline c128 decode plan (plan_d uint8 [B, 16]) on the device of req_pool_indices, its device
    planner's bytes, no host synchronization. req_to_token and full_to_state are judged, not read (the ring is
    request-scoped). A seq_len past 2^31-1 is refused in a host tensor; one outside 0..2^31-1 in a device tensor
    becomes a record {1, -1, .., -1} (a write row and page outside the ring), which the ops skip and count."""
    _check_geometry(swa_page_size, ring_size, use_req_ring)
    sglang_c4.check_tables(req_pool_indices, req_to_token, full_to_state, seq_lens=seq_lens)
    _lengths("seq_lens", seq_lens, req_pool_indices.shape[0])
    if seq_lens.device.type == "cpu":
        sglang_c4.check_host_lengths(seq_lens.to(torch.int64))
    seq = seq_lens.to(req_pool_indices.device, torch.int64)
    fits = (seq >= 0) & (seq <= sglang_c4.MAX_SEQ_LEN)
    seq32 = seq.to(torch.int32)
    p1 = seq32.to(torch.int64) - 1
    rid = req_pool_indices
    write = _rows_of(rid, p1, ring_size)
    first = _page(_rows_of(rid, (p1 - RATIO).clamp_min(0), ring_size))
    words = torch.stack([torch.where(fits, seq32, 1), torch.where(fits, write, -1), first,
                         torch.where(fits, _page(write), -1)], dim=1)
    return words.view(torch.uint8)


def _tokens(seq: torch.Tensor, ext: torch.Tensor, n: int):
    """Per ragged row t < n (int64 [n] each): its request b, its position, its index j among the request's new
    tokens and whether it is one (rows past the extends are not). No host synchronization."""
    t = torch.arange(n, dtype=torch.int64, device=seq.device)
    counted = ext.clamp_min(0)
    ends = torch.cumsum(counted, 0)
    b = torch.searchsorted(ends, t, right=True)
    live = b < seq.shape[0]
    b = b.clamp_max(seq.shape[0] - 1)
    j = t - (ends - counted)[b]
    return t, b, (seq - ext)[b] + j, j, live


def _compress_words(t, b, pos, j, rid, ring_size) -> torch.Tensor:
    """sglang's compress records (int32 words [m, 4]) of closing tokens: rows read from the ring's page where
    buffer_len > 0, else the request's batch index in the last word."""
    reads = j < RATIO - 1
    buffer_len = (RATIO - 1 - j).clamp_min(0)
    r = rid[b]
    last = torch.where(reads, _page(_rows_of(r, pos, ring_size)), b.to(torch.int32))
    first = torch.where(reads, _page(_rows_of(r, (pos - RATIO).clamp_min(0), ring_size)), -1)
    return torch.stack([(pos + 1).to(torch.int32), (t | buffer_len << 16).to(torch.int32), first, last], dim=1)


def _write_words(t, b, pos, rid, ring_size) -> torch.Tensor:
    return torch.stack([t.to(torch.int32), _rows_of(rid[b], pos, ring_size)], dim=1)


def _invalid(rows: int, width: int, device) -> torch.Tensor:
    """rows padding records as int32 words: {0xFFFFFFFF, 0, -1, -1} (compress) or {0xFFFFFFFF, -1} (write)."""
    words = torch.full((rows, width), -1, dtype=torch.int32, device=device)
    if width == 4:
        words[:, 1] = 0
    return words


def _compacted(words: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The rows of words where keep, in order, then padding, as many rows as words (on the device: no host
    synchronization; dropped rows land on a spare row)."""
    n = words.shape[0]
    out = _invalid(n + 1, words.shape[1], words.device)
    return out.index_copy_(0, torch.where(keep, torch.cumsum(keep, 0) - 1, n), words)[:n]


def _padded(words: torch.Tensor, rows: int) -> torch.Tensor:
    if words.shape[0] == rows:
        return words
    out = _invalid(rows, words.shape[1], words.device)
    out[:words.shape[0]] = words
    return out


def _host_records(seq, ext, n, pad, rid, ring_size):
    """A host plan's compress and write words, in sglang's host planner's order, and the pinned table they
    travelled in (None on the host): closing positions and kept positions are found here, their ring rows on
    rid's device (one copy, no synchronization)."""
    t, b, pos, j, _ = _tokens(seq, ext, n)
    closes = torch.fmod(pos + 1, RATIO) == 0
    kept = pos >= torch.minimum(torch.div(seq, RATIO, rounding_mode="trunc") * RATIO, seq - pad)[b]
    table = torch.stack([t, b, pos, j], dim=1)
    table = torch.cat([table[closes], table[kept]]).to(torch.int32)
    nc, pin = int(closes.sum()), None
    if rid.device.type != "cpu":
        pin = table.pin_memory() if rid.device.type == "cuda" else table
        table = pin.to(rid.device, non_blocking=True)
    t, b, pos, j = table.to(torch.int64).unbind(1)
    return (_compress_words(t[:nc], b[:nc], pos[:nc], j[:nc], rid, ring_size),
            _write_words(t[nc:], b[nc:], pos[nc:], rid, ring_size), pin)


def _device_records(seq, ext, n, pad, rid, ring_size):
    """A device plan's words, every ragged row < n planned on the device: records in ragged-row order, padded
    to n rows each."""
    if seq.shape[0] == 0:
        return _invalid(n, 4, rid.device), _invalid(n, 2, rid.device)
    t, b, pos, j, live = _tokens(seq, ext, n)
    closes = live & (torch.fmod(pos + 1, RATIO) == 0)
    kept = live & (pos >= torch.minimum(torch.div(seq, RATIO, rounding_mode="trunc") * RATIO, seq - pad)[b])
    return (_compacted(_compress_words(t, b, pos, j, rid, ring_size), closes),
            _compacted(_write_words(t, b, pos, rid, ring_size), kept))


def plan_prefill(req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state, swa_page_size: int,
                 ring_size: int, num_q_tokens: int, use_cuda_graph: bool = False, use_req_ring: bool = False):
    """sglang's offline c128 extend plan, (plan_c uint8 [C, 16], plan_w uint8 [W, 8], the pinned table its host
    records travelled in, or None) on the device of req_pool_indices: with host seq_lens / extend_lens, its host
    planner's records byte for byte (1 <= extend <= seq, the extends summing to num_q_tokens; CUDA-graph plans
    padded to num_q_tokens rows); with device ones (CUDA graphs, target verify), its device planner's records in
    ragged-row order, both lists padded to num_q_tokens rows, rows past the extends planned as padding."""
    _check_geometry(swa_page_size, ring_size, use_req_ring)
    sglang_c4.check_tables(req_pool_indices, req_to_token, full_to_state, seq_lens=seq_lens, extend_lens=extend_lens,
                           num_q_tokens=num_q_tokens)
    b = req_pool_indices.shape[0]
    _lengths("seq_lens", seq_lens, b)
    _lengths("extend_lens", extend_lens, b)
    if extend_lens.device != seq_lens.device:
        raise RuntimeError(f"extend_lens is on {extend_lens.device} but seq_lens on {seq_lens.device} (both on the "
                           f"host, or both on req_pool_indices' device)")
    sglang_c4.check_flags(use_cuda_graph=use_cuda_graph)
    n = count_of(num_q_tokens)
    if n is None:
        raise RuntimeError(f"num_q_tokens must be an int (got {_described(num_q_tokens)})")
    if not (b < MAX_TOKENS and b <= n <= MAX_TOKENS):
        raise RuntimeError(f"an offline c128 prefill plan needs batch_size ({b}) <= num_q_tokens ({n}) <= 65536 "
                           f"(16-bit ragged rows)")
    seq, ext = seq_lens.to(torch.int64), extend_lens.to(torch.int64)
    pad = ring_size - RATIO + 2 if ring_size > RATIO else 0  # rows kept for a verify's rollback, as sglang keeps
    rid, pin = req_pool_indices, None
    if seq.device.type == "cpu":
        sglang_c4.check_host_lengths(seq)
        bad = torch.nonzero((ext <= 0) | (ext > seq))
        if bad.numel():
            i = int(bad[0, 0])
            raise RuntimeError(f"extend_lens[{i}] is {int(ext[i])}; expected 1..seq_lens[{i}] = {int(seq[i])}")
        if int(ext.sum()) != n:
            raise RuntimeError(f"the extends sum to {int(ext.sum())} but num_q_tokens is {n}")
        words_c, words_w, pin = _host_records(seq, ext, n, pad, rid, ring_size)
        if use_cuda_graph:
            words_c, words_w = _padded(words_c, n), _padded(words_w, n)
    else:
        words_c, words_w = _device_records(seq.to(rid.device), ext.to(rid.device), n, pad, rid, ring_size)
    return words_c.view(torch.uint8), words_w.view(torch.uint8), pin


_rings: dict = {}


def ring_of(kv_score_buffer, ape, store=None) -> C128Ring:
    """pydsa's view of one sglang offline c128 layer: kv_score_buffer as rows [-1, 2D] (sglang's [-1, 128, 2D] view
    or its flat buffer; ring_size 128: the records carry their rows), ape as [128, D] in fp32 (cast as sglang casts
    it to its fp32 input), the store (a pydsa.KVCache or None). Made once per buffers (a cast ape: every call, so
    a reloaded weight is read). Raises pydsa's errors (ring, ape, store), for the caller to say in its words."""
    ring = kv_score_buffer
    if isinstance(ring, torch.Tensor) and ring.dim() == 3:
        if ring.shape[1] != RATIO:
            raise ArgumentValueError("ring", f"ring must be viewed [-1, 128, 2D] (pages of a chunk's rows) or flat "
                                             f"[rows, 2D] (got {_described(ring)})")
        ring = sglang_c4.as_rows(ring)
    d = ring.shape[-1] // 2 if isinstance(ring, torch.Tensor) and ring.dim() == 2 else None
    cast = isinstance(ape, torch.Tensor) and ape.is_floating_point() and ape.dtype != torch.float32
    ape = sglang_c4.as_rows(ape.float() if cast else ape, d) if d else ape

    def make():
        return C128Ring(ring, ape, store=store)
    if cast or not (isinstance(ring, torch.Tensor) and isinstance(ape, torch.Tensor)):
        return make()
    key = (buffer_key(ring), buffer_key(ape), id(store))
    return memo(_rings, key, make, 4096)


def compress(kv_score_buffer, kv_score_input, ape, plan, head_dim: int, out=None, store=None, out_loc=None):
    """One offline c128 step over sglang's plan (decode or extend), its store fused when given; returns out
    (decode [B, D]: closing rows written; extend [C, D]: row i for compress record i), one of its own when out is
    None and there is no store. Raises pydsa's errors in pydsa's names (compress.py says them in sglang's) and its
    own in sglang's (head_dim, kv_score_input)."""
    plan = of_kind(sglang_c4.plan_of(plan, RATIO), online=False)
    return sglang_c4.ring_step(ring_of(kv_score_buffer, ape, store), kv_score_input, plan, head_dim=head_dim, parts=2,
                               decode=c128_offline_decode, extend=c128_offline_extend, out=out,
                               make=out is None and store is None, out_loc=out_loc)
