"""The offline c128 compressor (docs/spec.md, "The offline c128 compressor") on the host backend and the GPU:
entries against float64, the fused store against the standalone store and the float64 store, poisoned outputs
and caches, awkward batch sizes, fp32 and bf16 rings, records (sglang's and the request-scoped ring's), any
schedule of extends and decodes, records out of range counted, bad arguments named, empty calls."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import pydsa
import pyplan
from conftest import DEVICES, examples, gpu
from offline_reference import CHUNK, PAGE, POISON, Layer, decode_records, entry
from reference import rel_err
from test_store import compare_to_reference

TOL = 1e-5


class Shadow:
    """What the layer's cache must hold: the standalone store of every closed vector, into a poisoned copy; and
    the vectors themselves, for the float64 store."""

    def __init__(self, layer: Layer):
        self.layer = layer
        c = layer.cache
        self.store = pydsa.KVCache(torch.full_like(c.cache, POISON), c.norm_weight, c.rotary, page_size=PAGE, eps=c.eps)
        self.vectors, self.positions, self.locs = [], [], []

    def closed(self, out, rows, locs, positions):
        if not rows:
            return
        dev = self.layer.device
        v = np.ascontiguousarray(out[rows])
        pydsa.kv_store(torch.from_numpy(v).to(dev), torch.tensor(positions, dtype=torch.int32, device=dev),
                       torch.tensor(locs, dtype=torch.int64, device=dev), self.store)
        self.vectors += list(v)
        self.positions += positions
        self.locs += locs

    def check(self):
        """The fused store wrote the standalone store's bytes, nothing else, and the float64 store's but for
        counted one-step flips."""
        assert torch.equal(self.layer.cache.cache.cpu(), self.store.cache.cpu())
        flips = compare_to_reference(self.layer.cache, np.array(self.vectors), self.positions, self.locs)
        assert sum(flips) <= max(1, 1e-4 * len(self.vectors) * self.layer.d), flips


def check_out(layer, out, closing):
    """closing: [(out row, slot, n, ring_below)] within TOL of float64; every other out row stays NaN."""
    for r, slot, n, ring_below in closing:
        assert rel_err(out[r], layer.expected(slot, n, ring_below)) < TOL, (r, slot, n)
    rows = {c[0] for c in closing}
    assert all(np.isnan(out[r]).all() for r in range(out.shape[0]) if r not in rows)


def run_schedule(layer, shadow, slots, prefixes, decodes):
    """Extends of `prefixes` tokens (in up to three parts), then `decodes` decode steps, checking every out."""
    lens = [0] * len(slots)

    def extend(exts):
        live = [b for b in range(len(slots)) if exts[b] > 0]
        seqs = [lens[b] + exts[b] for b in live]
        out, compress = layer.extend(seqs, [exts[b] for b in live], [slots[b] for b in live])
        rec = compress.view(np.uint32).reshape(-1, 4)
        off = np.cumsum([0] + [exts[b] for b in live])
        closing = []
        for i, r in enumerate(rec):
            k = live[int(np.searchsorted(off, int(r[1]) & 0xFFFF, side="right") - 1)]
            closing.append((i, slots[k], int(r[0]) // CHUNK - 1, lens[k]))
        # the chunks that close, worked out from the lengths alone (not from the plan the records come from)
        want = [(slots[b], n, lens[b]) for b in live for n in range(lens[b] // CHUNK, (lens[b] + exts[b]) // CHUNK)]
        assert [c[1:] for c in closing] == want, (closing, want)
        check_out(layer, out, closing)
        if shadow:
            shadow.closed(out, [c[0] for c in closing], [layer.loc(c[1], c[2]) for c in closing],
                          [CHUNK * c[2] for c in closing])
        for b in live:
            lens[b] += exts[b]

    for part in range(3):
        extend([p // 3 + (p % 3 if part == 2 else 0) for p in prefixes])
    for _ in range(decodes):
        seqs = [n + 1 for n in lens]
        out = layer.decode(seqs, slots)
        closing = [(b, slots[b], s // CHUNK - 1, s) for b, s in enumerate(seqs) if s % CHUNK == 0]
        check_out(layer, out, closing)
        if shadow:
            shadow.closed(out, [c[0] for c in closing], [layer.loc(c[1], c[2]) for c in closing],
                          [CHUNK * c[2] for c in closing])
        lens[:] = seqs
    return lens


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bf16_ring", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("batch", [1, 17, 127, 129])
def test_chunked_prefills_then_decodes_through_several_chunks_match_float64(device, bf16_ring, batch):
    """Chunked prefills of staggered lengths, then decodes through two more chunks of every request: every entry
    within 1e-5 of float64 (a bf16 ring: of float64 over the rows it rounded), every other out row untouched, the
    cache equal to the standalone store of the entries and to the float64 store but for counted one-step flips."""
    g = np.random.default_rng(batch)
    layer = Layer(device, slots=batch + 3, bf16_ring=bf16_ring, max_len=420, seed=batch + bf16_ring)
    shadow = Shadow(layer)
    slots = [int(s) for s in g.permutation(batch + 3)[:batch]]
    prefixes = [int(p) for p in g.integers(1, 150, batch)]
    lens = run_schedule(layer, shadow, slots, prefixes, decodes=2 * CHUNK + 1)
    assert sum(n // CHUNK for n in lens) >= 2 * batch
    shadow.check()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bf16_ring", [False, True], ids=["fp32", "bf16"])
def test_decode_records_equal_request_scoped_rows(device, bf16_ring):
    """sglang's 16-byte decode records addressing the same rows give the same ring, outs and cache as the ring's
    request-scoped slots, bit for bit."""
    a = Layer(device, slots=3, bf16_ring=bf16_ring, max_len=300, seed=5)
    b = Layer(device, slots=3, bf16_ring=bf16_ring, max_len=300, seed=5)
    for s in range(1, 262):
        np.testing.assert_array_equal(a.decode([s, s + 5], [2, 0]), b.decode([s, s + 5], [2, 0], records=True))
    assert torch.equal(a.ring.ring.cpu().view(torch.uint8), b.ring.ring.cpu().view(torch.uint8))
    assert torch.equal(a.cache.cache.cpu(), b.cache.cache.cpu())


@gpu
@pytest.mark.parametrize("padded", [False, True], ids=["slices", "rows"])
@pytest.mark.parametrize("bf16_ring", [False, True], ids=["fp32", "bf16"])
def test_a_record_writing_elsewhere_than_its_pages_last_row_agrees_with_the_host(bf16_ring, padded):
    """Records are data: a closing decode record whose write row is another row of its page (read back as written,
    by other lanes than wrote it in the row form) or a row of another page (the page's last row then as the ring
    holds it) gives the host backend's ring, outs and cache bytes on the GPU; on each backend the cache holds the
    standalone store of its own outs. Padded with skipped records to the row form's threshold: both forms."""
    runs = []
    n = max(3, _rows_from("Decode")) if padded else 3
    for device in ("cpu", "cuda"):
        layer = Layer(device, slots=4, bf16_ring=bf16_ring, max_len=300, seed=9)
        g = torch.Generator().manual_seed(4)
        layer.ring.ring.copy_(torch.randn(layer.ring.ring.shape, generator=g).to(layer.ring.ring.dtype))
        rec = np.zeros((n, 4), np.int32)  # seq_len 0: padding, skipped
        rec[:3] = np.frombuffer(decode_records([128, 256, 128], [0, 1, 3]).tobytes(), np.int32).reshape(3, 4)
        rec[0, 1] = 0 * CHUNK + 5          # request 0: row 5 of its own page
        rec[1, 1] = 2 * CHUNK + 127        # request 1 (page 1): the last row of page 2
        kv = torch.randn(n, 2 * layer.d, generator=g).to(device)
        out = torch.full((n, layer.d), float("nan"), device=device)
        pydsa.c128_offline_decode(layer.ring, kv, records=torch.from_numpy(rec.view(np.uint8).reshape(n, 16)).to(device),
                                  out=out, cache_slots=torch.tensor([0, 1, 2] + [3] * (n - 3), device=device))
        assert torch.isnan(out[3:]).all()  # padding writes nothing
        out = out[:3]
        shadow = Shadow(layer)
        shadow.closed(out.cpu().numpy(), [0, 1, 2], [0, 1, 2], [0, CHUNK, 0])  # rotary rows seq_len - 128
        shadow.check()
        runs.append((out.cpu(), layer.ring.ring.cpu().view(torch.uint8), layer.cache.cache.cpu()))
    (o1, r1, c1), (o2, r2, c2) = runs
    assert torch.isfinite(o1).all()
    assert (o1 - o2).abs().max() <= TOL * o1.abs().max()
    assert torch.equal(r1, r2)
    assert (c1 != c2).sum() <= 4  # a one-step fp8 flip where the outs differ in their last bits


@pytest.mark.parametrize("device", DEVICES)
def test_a_wider_request_ring_serves_the_same_entries(device):
    """A request-scoped ring of R = 256 rows per slot (sglang's ring under speculative decoding) pages each chunk
    by its position: the same entries as R = 128."""
    a = Layer(device, slots=2, max_len=400, seed=6)
    b = Layer(device, slots=2, max_len=400, seed=6, ring_size=256)
    for s in range(1, 381):
        np.testing.assert_array_equal(a.decode([s], [1]), b.decode([s], [1], records=s % 2 == 0))
    np.testing.assert_array_equal(a.extend([395], [15], [1])[0], b.extend([395], [15], [1])[0])  # closes 383
    assert torch.equal(a.cache.cache.cpu(), b.cache.cache.cpu())


def _cache_entries(layer, slot, chunks):
    flat = layer.cache.cache.cpu().reshape(-1)
    page = pydsa.kv_page_bytes(layer.d, PAGE)
    spans = []
    for n in range(chunks):
        loc = layer.loc(slot, n)
        base, s = (loc // PAGE) * page, loc % PAGE
        spans.append(flat[base + (layer.d + 64) * s:base + (layer.d + 64) * (s + 1)].clone())
        scales = base + PAGE * (layer.d + 64) + 8 * s
        spans.append(flat[scales:scales + layer.d // 64 - 1].clone())
    return spans


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=examples(20))
@given(data=st.data())
def test_any_split_into_extends_and_decodes_equals_decoding_every_token(device, data):
    """Any schedule of extends (chunked prefill, prefixes of any length) and decodes, with an fp32 ring, leaves
    every entry of every request, in out and in the cache, byte for byte what decoding every token one by one
    leaves (a decode reads its window from the ring, an extend from the ring and its input: the same floats)."""
    lengths = data.draw(st.lists(st.integers(1, 300), min_size=2, max_size=2), label="lengths")
    spec = Layer(device, slots=3, max_len=300, seed=11)
    plain = Layer(device, slots=3, max_len=300, seed=11)
    slots = [2, 0]
    lens, outs_spec = [0, 0], {}
    while lens != lengths:
        left = [lengths[b] - lens[b] for b in range(2)]
        if data.draw(st.booleans(), label="decode"):
            live = [b for b in range(2) if left[b] > 0]
            out = spec.decode([lens[b] + 1 for b in live], [slots[b] for b in live])
            for i, b in enumerate(live):
                lens[b] += 1
                if lens[b] % CHUNK == 0:
                    outs_spec[b, lens[b] // CHUNK - 1] = out[i]
        else:
            exts = [data.draw(st.integers(0, left[b]), label="extend") for b in range(2)]
            if not any(exts):
                exts = left  # the rest of both requests in one extend
            live = [b for b in range(2) if exts[b] > 0]
            out, compress = spec.extend([lens[b] + exts[b] for b in live], [exts[b] for b in live],
                                        [slots[b] for b in live])
            rec = compress.view(np.uint32).reshape(-1, 4)
            off = np.cumsum([0] + [exts[b] for b in live])
            for i, r in enumerate(rec):
                b = live[int(np.searchsorted(off, int(r[1]) & 0xFFFF, side="right") - 1)]
                outs_spec[b, int(r[0]) // CHUNK - 1] = out[i]
            for b in live:
                lens[b] += exts[b]
    for b in range(2):
        for p in range(1, lengths[b] + 1):
            out = plain.decode([p], [slots[b]])
            if p % CHUNK == 0:
                np.testing.assert_array_equal(outs_spec[b, p // CHUNK - 1], out[0])
    assert len(outs_spec) == sum(n // CHUNK for n in lengths)
    for b in range(2):
        for x, y in zip(_cache_entries(spec, slots[b], lengths[b] // CHUNK),
                        _cache_entries(plain, slots[b], lengths[b] // CHUNK)):
            assert torch.equal(x, y), b


@pytest.mark.parametrize("device", DEVICES)
def test_the_standalone_store_of_the_extends_records_equals_the_fused_store(device):
    """kv_store with the extend's compress records (ratio=128) writes the bytes the fused store wrote."""
    fused = Layer(device, slots=3, max_len=400, seed=13)
    alone = Layer(device, slots=3, max_len=400, seed=13, store=False)
    seqs, exts, slots = [300, 140, 390], [300, 140, 390], [1, 2, 0]
    fused.extend(seqs, exts, slots)
    out, compress = alone.extend(seqs, exts, slots)
    shadow = Shadow(fused)
    locs = [fused.loc(slots[i], p // CHUNK) for i in range(3) for p in range(seqs[i] - exts[i], seqs[i])]
    dev = fused.device
    pydsa.kv_store(torch.from_numpy(out).to(dev), None, torch.tensor(locs, dtype=torch.int64, device=dev),
                   shadow.store, records=torch.from_numpy(compress).to(dev), extend=True, ratio=CHUNK)
    assert torch.equal(fused.cache.cache.cpu(), shadow.store.cache.cpu())


def test_plan_c128_offline_writes_sglangs_compress_records():
    """pyplan.plan_c128_offline: one compress record per closing position in request and position order, as
    sglang's host planner writes them for ratio 128 ({p + 1, ragged row, 128 - min(j + 1, 128), -1, page}), and a
    write record for each of the last min(extend, R) positions."""
    seqs, exts, slots, R = [300, 129, 640, 5], [300, 2, 257, 5], [3, 0, -1, 1], 256
    compress, write = pyplan.plan_c128_offline(np.array(seqs), np.array(exts), np.array(slots), R)
    assert pyplan.plan_c128_offline(np.array(seqs), np.array(exts), np.array(slots), R).ratio == CHUNK
    c = [tuple(int(v) for v in r) for r in compress.view(pyplan.C4_COMPRESS_DTYPE).reshape(-1).tolist()]
    w = [tuple(int(v) for v in r) for r in write.view(pyplan.C4_WRITE_DTYPE).reshape(-1).tolist()]
    want_c, want_w, off = [], [], 0
    for s, e, slot in zip(seqs, exts, slots):
        if slot >= 0:
            for j in range(e):
                p = s - e + j
                if (p + 1) % CHUNK == 0:
                    want_c.append((p + 1, off + j, CHUNK - min(j + 1, CHUNK), -1, (slot * R + p % R) // CHUNK))
            want_w += [(off + p - (s - e), slot * R + p % R) for p in range(max(s - e, s - R), s)]
        off += e
    assert c == want_c and w == want_w
    with pytest.raises(pydsa.ArgumentValueError, match="ring_size is 192; expected a multiple of 128") as e:
        pyplan.plan_c128_offline(np.array([3]), np.array([3]), np.array([0]), 192)
    assert e.value.argument == "ring_size"


def _i32(*v, device="cpu"):
    return torch.tensor(v, dtype=torch.int32, device=device)


def _ring_bytes(layer):
    return layer.ring.ring.cpu().view(torch.uint8).clone()


@pytest.mark.parametrize("device", DEVICES)
def test_decode_rows_out_of_range_are_skipped_and_counted(device):
    """Decode records whose write row or (closing) page lie outside the ring, and a request-scoped slot past the
    ring, are skipped and counted once each; padding is skipped silently; a row whose write row is good but whose
    page is not still writes its row; nothing else is written."""
    dev = torch.device(device)
    layer = Layer(device, slots=2, max_len=300, seed=9)
    rows = layer.ring.ring.shape[0]
    recs = decode_records([128, 256, 3, 128], [0, 1, 1, 0]).view(np.int32).reshape(4, 4).copy()
    recs[0, 1] = rows        # write row past the ring
    recs[1, 3] = 2           # page past the ring (closing row): its row is written, its chunk skipped
    recs[2, 1] = -3          # write row negative
    recs[3, 0] = 0           # padding
    errors = torch.zeros(1, dtype=torch.int32, device=dev)
    before = _ring_bytes(layer)
    out = torch.full((4, 512), float("nan"), device=dev)
    pydsa.c128_offline_decode(layer.ring, torch.randn(4, 1024, device=dev),
                              records=torch.from_numpy(recs.view(np.uint8).reshape(4, 16)).to(dev), out=out,
                              cache_slots=torch.arange(4, dtype=torch.int64, device=dev), error_count=errors)
    assert int(errors) == 3 and torch.isnan(out).all()
    after = _ring_bytes(layer)
    changed = [r for r in range(rows) if not torch.equal(before[r], after[r])]
    assert changed == [128 + 127]
    assert (layer.cache.cache.cpu() == POISON).all()
    errors.zero_()
    pydsa.c128_offline_decode(layer.ring, torch.randn(2, 1024, device=dev), seq_lens=_i32(128, 5, device=device),
                              slots=_i32(2 ** 24, -1, device=device), out=out[:2],
                              cache_slots=torch.zeros(2, dtype=torch.int64, device=dev), error_count=errors)
    assert int(errors) == 1 and torch.equal(after, _ring_bytes(layer))  # a slot past the ring, never wrapped


@pytest.mark.parametrize("device", DEVICES)
def test_extend_records_out_of_range_are_skipped_and_counted(device):
    """Compress records that close no chunk, read past the input or a page past the ring, and write records past
    the input or the ring, are skipped and counted (as tensors: data); padding records are skipped silently. The
    same records as numpy (a host plan) fail the call naming the first bad one, before anything is written."""
    dev = torch.device(device)
    layer = Layer(device, slots=2, max_len=300, seed=10)
    kv = torch.from_numpy(layer.tokens[0, :200]).to(dev)
    compress, write = pyplan.plan_c128_offline(np.array([200]), np.array([200]), np.array([1]))
    c = np.concatenate([compress.view(np.int32).reshape(-1, 4)] * 6)
    c[1, 0] = 129                                # not a closing length
    c[2, 1] = 200 | (0 << 16)                    # ragged row past the input
    c[3, 1] = 100 | (5 << 16)                    # reads input rows from -22
    c[4, 1], c[4, 3] = 127 | (3 << 16), 2        # reads 3 rows of page 2 (past the ring)
    c[5, 0] = -1                                 # padding
    w = write.view(np.int32).reshape(-1, 2).copy()
    w[0, 0], w[1, 1], w[2, 0] = 200, 256, -1     # past the input, past the ring, padding
    c_u8, w_u8 = c.view(np.uint8).reshape(-1, 16), w.view(np.uint8).reshape(-1, 8)
    errors = torch.zeros(1, dtype=torch.int32, device=dev)
    out = torch.full((6, 512), float("nan"), device=dev)
    slots = torch.zeros(200, dtype=torch.int64, device=dev)
    before = _ring_bytes(layer)
    if device == "cpu":  # numpy records are a host plan: read on the host before anything runs
        with pytest.raises(pydsa.DsaError, match=r"dsa_c128_offline_extend: compress record 1 \{seq_len 129"):
            pydsa.c128_offline_extend(layer.ring, kv, (c_u8, w_u8), out=out, cache_slots=slots)
        assert torch.equal(before, _ring_bytes(layer)) and torch.isnan(out).all()
    pydsa.c128_offline_extend(layer.ring, kv, (torch.from_numpy(c_u8).to(dev), torch.from_numpy(w_u8).to(dev)),
                              out=out, cache_slots=slots, error_count=errors)
    assert int(errors) == 4 + 2
    assert torch.isfinite(out[0]).all() and torch.isnan(out[1:]).all()
    after = _ring_bytes(layer)
    # slot 0's rows untouched; slot 1's written (positions 72 .. 199) but those of the skipped records (72 .. 74)
    changed = [r for r in range(256) if not torch.equal(before[r], after[r])]
    assert changed == [r for r in range(128, 256) if r not in (128 + 72, 128 + 73, 128 + 74)]
    assert (layer.cache.cache.cpu() != POISON).any()


def test_arguments_are_judged_by_name():
    layer = Layer("cpu", slots=2, max_len=200, seed=2)
    ring = layer.ring
    kv, seq = torch.randn(2, 1024), _i32(1, 2)
    locs = torch.zeros(2, dtype=torch.int64)

    def refused(kind, argument, match, call):
        with pytest.raises(kind, match=match) as e:
            call()
        assert isinstance(e.value, pydsa.ArgumentError) and e.value.argument == argument

    before = _ring_bytes(layer)
    V = pydsa.ArgumentValueError
    refused(pydsa.ArgumentTypeError, "ring", "ring must be a pydsa.C128Ring",
            lambda: pydsa.c128_offline_decode(object(), kv, seq_lens=seq, slots=seq))
    refused(V, "kv_score", "kv_score", lambda: pydsa.c128_offline_decode(ring, torch.randn(2, 1000), seq_lens=seq,
                                                                         slots=seq, cache_slots=locs))
    refused(V, "seq_lens", "seq_lens is None", lambda: pydsa.c128_offline_decode(ring, kv, slots=seq, cache_slots=locs))
    refused(V, "records", "records= and seq_lens=", lambda: pydsa.c128_offline_decode(
        ring, kv, records=torch.zeros(2, 16, dtype=torch.uint8), seq_lens=seq, slots=seq, cache_slots=locs))
    refused(V, "ring_size", "ring_size is 256 but the ring has ring_size 128", lambda: pydsa.c128_offline_decode(
        ring, kv, seq_lens=seq, slots=seq, ring_size=256, cache_slots=locs))
    refused(V, "ring_size", "ring_size is given with records=", lambda: pydsa.c128_offline_decode(
        ring, kv, records=torch.zeros(2, 16, dtype=torch.uint8), ring_size=128, cache_slots=locs))
    refused(V, "cache_slots", "cache_slots is None but the ring has a store",
            lambda: pydsa.c128_offline_decode(ring, kv, seq_lens=seq, slots=seq))
    refused(V, "slots", r"slots\[0\] and slots\[1\] are both 1", lambda: pydsa.c128_offline_decode(
        ring, kv, seq_lens=seq, slots=_i32(1, 1), cache_slots=locs))
    refused(V, "out", "out shares memory with kv_score", lambda: pydsa.c128_offline_decode(
        ring, kv, seq_lens=seq, slots=seq, cache_slots=locs, out=kv.view(4, 512)[:2]))
    refused(V, "out", r"out must have shape \[2, 512\]", lambda: pydsa.c128_offline_decode(
        ring, kv, seq_lens=seq, slots=seq, cache_slots=locs, out=torch.empty(3, 512)))
    refused(pydsa.ArgumentTypeError, "plan", "plan must be a pair",
            lambda: pydsa.c128_offline_extend(ring, kv, object(), cache_slots=locs))
    c4_plan = pyplan.plan_c4(np.array([2]), np.array([2]), np.array([0]), 8)
    refused(V, "plan", "plan was made by pyplan.plan_c4", lambda: pydsa.c128_offline_extend(ring, kv, c4_plan))
    plan = pyplan.plan_c128_offline(np.array([2]), np.array([2]), np.array([0]), 256)
    refused(V, "plan", "plan was made for ring_size 256 but ring.ring_size is 128",
            lambda: pydsa.c128_offline_extend(ring, kv, plan, cache_slots=locs))
    plan = pyplan.plan_c128_offline(np.array([3]), np.array([3]), np.array([0]))
    refused(V, "kv_score", "kv_score has 2 rows but plan was made for num_tokens = 3",
            lambda: pydsa.c128_offline_extend(ring, kv, plan, cache_slots=locs))
    four = pydsa.C4Compressor(torch.zeros(8, 2048), torch.zeros(8, 512), ring_size=8)
    refused(V, "plan", "plan was made by pyplan.plan_c128_offline",
            lambda: pydsa.c4_extend(four, torch.zeros(3, 2048), plan))
    # the ring judges its buffers once, when made
    ape = torch.randn(128, 512)
    refused(V, "ring", "ring has 100 rows", lambda: pydsa.C128Ring(torch.zeros(100, 1024), ape))
    refused(V, "ring", r"ring must be a 2-D tensor \[rows, 2D\]", lambda: pydsa.C128Ring(torch.zeros(128, 1000), ape))
    refused(pydsa.ArgumentTypeError, "ring", "ring must have dtype torch.float32",
            lambda: pydsa.C128Ring(torch.zeros(128, 1024, dtype=torch.int32), ape))
    refused(V, "ape", r"ape must have shape \[128, 512\]", lambda: pydsa.C128Ring(torch.zeros(128, 1024), ape[:8]))
    refused(V, "ring_size", "ring_size is 384; expected a multiple of 128 that divides the ring's 512 rows",
            lambda: pydsa.C128Ring(torch.zeros(512, 1024), ape, ring_size=384))
    refused(V, "ring_size", "ring_size must be an int", lambda: pydsa.C128Ring(torch.zeros(512, 1024), ape, ring_size=64))
    refused(V, "store", "store is for D = 512 but the ring's D is 256",
            lambda: pydsa.C128Ring(torch.zeros(128, 512), ape[:, :256].contiguous(), store=layer.cache))
    index = pydsa.KVCache(torch.zeros(8448, dtype=torch.uint8), torch.ones(128), torch.zeros(8, 64), page_size=64,
                          layout="indexer")
    refused(V, "store", "store has layout 'indexer'",
            lambda: pydsa.C128Ring(torch.zeros(128, 256), torch.zeros(128, 128), store=index))
    bare = pydsa.C128Ring(torch.zeros(128, 1024), ape)
    refused(V, "cache_slots", "cache_slots is given but the ring has no store",
            lambda: pydsa.c128_offline_decode(bare, kv, seq_lens=seq, slots=_i32(0, -1), cache_slots=locs))
    with pytest.raises(AttributeError):
        ring.ring = torch.zeros(128, 1024)
    assert torch.equal(before, _ring_bytes(layer)) and (layer.cache.cache.cpu() == POISON).all()


@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_call_does_nothing(device):
    """B = 0 (empty tensors) and an extend without records raise nothing and write nothing."""
    dev = torch.device(device)
    layer = Layer(device, slots=1, max_len=200, seed=4)
    before = _ring_bytes(layer)
    empty_locs = torch.zeros(0, dtype=torch.int64, device=dev)
    pydsa.c128_offline_decode(layer.ring, torch.zeros(0, 1024, device=dev), seq_lens=_i32(device=device),
                              slots=_i32(device=device), out=torch.zeros(0, 512, device=dev), cache_slots=empty_locs)
    pydsa.c128_offline_decode(layer.ring, torch.zeros(0, 1024, device=dev),
                              records=torch.zeros(0, 16, dtype=torch.uint8, device=dev), cache_slots=empty_locs)
    plan = (torch.zeros(0, 16, dtype=torch.uint8, device=dev), torch.zeros(0, 8, dtype=torch.uint8, device=dev))
    pydsa.c128_offline_extend(layer.ring, torch.zeros(0, 1024, device=dev), plan, cache_slots=empty_locs)
    assert torch.equal(before, _ring_bytes(layer)) and (layer.cache.cache.cpu() == POISON).all()


def test_a_c_caller_is_refused_by_field():
    """The entry points judge every field for C callers (the Python layer refuses these earlier): each refusal
    names the field, and nothing runs."""
    import ctypes as C

    from c_structs import C128OfflineParams, new
    from pydsa import _abi
    ring, ape, kv = torch.zeros(256, 1024), torch.zeros(128, 512), torch.zeros(2, 1024)
    seq = torch.tensor([1, 2], dtype=torch.int32)

    def params(**fields):
        p = new(C128OfflineParams)
        p.device, p.head_dim, p.ring_size, p.ring, p.ring_rows = -1, 512, 128, ring.data_ptr(), 256
        p.kv_score, p.ape, p.batch_size, p.seq_lens, p.slots = kv.data_ptr(), ape.data_ptr(), 2, seq.data_ptr(), seq.data_ptr()
        for k, v in fields.items():
            setattr(p, k, v)
        return p

    def refused(fn, match, **fields):
        assert getattr(_abi.lib, fn)(C.byref(params(**fields)), None) == 1
        assert match in _abi.lib.dsa_last_error().decode(), _abi.lib.dsa_last_error()

    assert _abi.lib.dsa_c128_offline_decode(C.byref(params()), None) == 0
    refused("dsa_c128_offline_decode", "head_dim is 192; expected 128, 256 or 512", head_dim=192)
    refused("dsa_c128_offline_decode", "ring_rows is 200; expected a multiple of 128", ring_rows=200)
    refused("dsa_c128_offline_decode", "ring_dtype is 5", ring_dtype=5)
    refused("dsa_c128_offline_decode", "ring_size is 64; expected a multiple of 128 dividing ring_rows", ring_size=64)
    refused("dsa_c128_offline_decode", "seq_lens and slots must be non-null", slots=None)
    refused("dsa_c128_offline_decode", "batch_size is -1", batch_size=-1)
    refused("dsa_c128_offline_extend", "num_tokens is 65537", num_tokens=65537, batch_size=0, num_write=1,
            write=seq.data_ptr())
    refused("dsa_c128_offline_extend", "compress and write must be non-null", num_compress=1)
    cache = torch.zeros(1, 1728, dtype=torch.uint8)
    store = pydsa.KVCache(cache, torch.ones(512), torch.zeros(4, 64), page_size=2)
    refused("dsa_c128_offline_decode", "a store needs cache_slots", store=store.address)
    small = params(struct_size=8)
    assert _abi.lib.dsa_c128_offline_decode(C.byref(small), None) == 2
    assert f"expects {C.sizeof(C128OfflineParams)}" in _abi.lib.dsa_last_error().decode()
    assert torch.count_nonzero(ring) == 0


@gpu
@pytest.mark.parametrize("bf16_ring", [False, True], ids=["fp32", "bf16"])
def test_the_gpu_agrees_with_the_host_backend(bf16_ring):
    """The same prefills and decodes on both backends: rings byte for byte (copies and roundings), entries within
    1e-5 (the GPU's exponentials and division are the approximate ones), and on each backend the cache equal to
    the standalone store of its own entries."""
    slots, prefixes = [3, 0, 2], [130, 5, 250]
    runs = []
    for device in ("cpu", "cuda"):
        layer = Layer(device, slots=4, bf16_ring=bf16_ring, max_len=420, seed=21)
        shadow = Shadow(layer)
        run_schedule(layer, shadow, slots, prefixes, decodes=140)
        shadow.check()
        runs.append((layer, np.array(shadow.vectors)))
    (host, v_host), (dev, v_dev) = runs
    assert torch.equal(host.ring.ring.view(torch.uint8), dev.ring.ring.cpu().view(torch.uint8))
    assert len(v_host) == len(v_dev) > 5
    for a, b in zip(v_host, v_dev):
        assert rel_err(b, a) < TOL


@gpu
@pytest.mark.parametrize("bf16_ring", [False, True], ids=["fp32", "bf16"])
def test_more_rows_than_a_wave_of_blocks_takes(bf16_ring):
    """1100 requests (the row form: a block a row, more blocks than one wave holds): extends whose closing chunks
    fall on many rows, then decodes where a few requests close beside many that do not; every out within 1e-5 of
    float64, the ring the host backend's byte for byte, and the cache the standalone store's."""
    g = np.random.default_rng(5)
    batch = 1100
    slots = [int(s) for s in g.permutation(batch + 4)[:batch]]
    prefixes = [int(p) for p in g.integers(100, 170, batch)]  # each extend under 65536 tokens (16-bit rows)
    rings = []
    for device in ("cpu", "cuda"):
        layer = Layer(device, slots=batch + 4, bf16_ring=bf16_ring, max_len=440, seed=23)
        shadow = Shadow(layer)
        run_schedule(layer, shadow, slots, prefixes, decodes=24)
        shadow.check()
        rings.append(layer.ring.ring.cpu().view(torch.uint8))
    assert torch.equal(rings[0], rings[1])


def _rows_from(op: str) -> int:
    """The launch policy's threshold of the row form for an op, "Extend" or "Decode" (native/src/launch_policy.h)."""
    text = (Path(__file__).resolve().parents[1] / "native" / "src" / "launch_policy.h").read_text()
    return int(re.search(rf"kOffline{op}RowsFrom = (\d+);", text).group(1))


@gpu
@pytest.mark.parametrize("op", ["Extend", "Decode", "Extend after a prefix"])
@pytest.mark.parametrize("d", [512, 256, 128])
@pytest.mark.parametrize("bf16_ring", [False, True], ids=["fp32", "bf16"])
def test_the_row_and_slice_forms_give_the_same_bits(bf16_ring, d, op):
    """The closing launch's two forms (launch_policy.h: an extend from kOfflineExtendRowsFrom records, a decode from
    kOfflineDecodeRowsFrom requests a block a row, below a cluster of 64-channel slices a row) on the same step: a
    batch's extend (a record per chunk closed) and decode in one call each, and the same split into two halves; the
    op under test straddles its threshold (the whole batch at or over it, each half under it); entries, ring and
    cache bytes equal. "Extend after a prefix": every request first extends by 1-127 tokens (nothing closes), so the
    measured extend's first record reads its window from the ring and the input both."""
    g = np.random.default_rng(7)
    batch = 88 if op != "Decode" else 280
    slots = [int(s) for s in g.permutation(batch)]
    exts = [int(e) for e in g.choice([130, 255, 255, 257], batch)]  # 1, 1, 1 and 2 chunks closed
    pres = [int(p) for p in g.choice([1, 77, 127], batch)] if op.startswith("Extend after") else [0] * batch
    seqs = [e + 1 for e in exts]  # the decodes after 255 close a chunk
    rows_from, half = _rows_from(op.split()[0]), batch // 2
    records = [sum(1 + (e == 257) for e in exts[h * half:(h + 1) * half]) for h in range(2)]
    if op != "Decode":
        assert max(records) < rows_from <= sum(records)  # one form each way
    else:
        assert half < rows_from <= batch
    runs = []
    for halves in (1, 2):
        layer = Layer("cuda", slots=batch, bf16_ring=bf16_ring, d=d, max_len=400, seed=29)
        if any(pres):
            assert layer.extend(pres, pres, slots)[0].shape[0] == 0
        part = batch // halves
        cut = [slice(h * part, (h + 1) * part) for h in range(halves)]
        ext_out = [layer.extend(exts[c], [e - p for e, p in zip(exts[c], pres[c])], slots[c])[0] for c in cut]
        dec_out = [layer.decode(seqs[c], slots[c]) for c in cut]
        torch.cuda.synchronize()
        runs.append((np.concatenate(ext_out), np.concatenate(dec_out), layer.ring.ring.cpu().view(torch.uint8),
                     layer.cache.cache.cpu()))
    (e1, d1, r1, c1), (e2, d2, r2, c2) = runs
    assert e1.shape[0] == sum(records) and np.isfinite(e1).all()
    assert np.isfinite(d1).all(axis=1).sum() == exts.count(255) > batch // 3
    closed = [(slots[b], n, pres[b]) for b in range(batch) for n in range(exts[b] // CHUNK)]
    assert all(rel_err(e1[r], layer.expected(*c)) < TOL for r, c in enumerate(closed))
    assert np.array_equal(e1.view(np.uint32), e2.view(np.uint32))
    assert np.array_equal(d1.view(np.uint32), d2.view(np.uint32))
    assert torch.equal(r1, r2) and torch.equal(c1, c2)


@pytest.mark.parametrize("device", DEVICES)
def test_the_readme_block_runs_as_written(device):
    """The README's offline c128 block is the users' first call: it runs as written and stores what it closes."""
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text[text.index("## The offline c128 layers"):], re.S).group(1)
    scope: dict = {}
    exec(compile(code.replace('dev, slots_n = "cpu"', f'dev, slots_n = "{device}"'), "README.md", "exec"), scope)
    ring, out = scope["ring"], scope["out"]
    assert out.shape == (2, 512) and torch.isfinite(out).all()
    flat = ring.store.cache.cpu().reshape(-1)
    page = pydsa.kv_page_bytes(512, 2)
    for loc in (0, 1, 6):  # the prefill's chunks 0 and 1 of request 0; the decode's chunk of request 1
        assert flat[(loc // 2) * page + 576 * (loc % 2):(loc // 2) * page + 576 * (loc % 2 + 1)].any(), loc
