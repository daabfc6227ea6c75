"""The c4 compressor (docs/spec.md, "The ratio-4 compressor") on the host backend and the GPU: entries against
float64, the fused stores against the standalone store and the float64 indexer store, poisoned outputs and
caches, records, the speculative property and the verify bound."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import pydsa
import pyplan
from c4_reference import Layer, bf16, check_indexer_entry, decode_records, entry
from conftest import DEVICES, examples
from reference import rel_err

POISON = 0xA5


class Shadow:
    """What the main cache must hold: the standalone store of every closed vector, into a poisoned copy."""

    def __init__(self, layer: Layer):
        self.layer = layer
        c = layer.caches[0]
        self.cache = torch.full_like(c.cache, POISON)
        self.store = pydsa.KVCache(self.cache, c.norm_weight, c.rotary, page_size=64, eps=c.eps)
        self.indexer_entries = {}

    def closed(self, outs, rows, locs, positions):
        if not rows:
            return
        dev = self.layer.device
        v = torch.from_numpy(np.ascontiguousarray(outs[0][rows])).to(dev)
        pydsa.kv_store(v, torch.tensor(positions, dtype=torch.int32, device=dev),
                       torch.tensor(locs, dtype=torch.int64, device=dev), self.store)
        if len(outs) > 1:
            for r, loc, pos in zip(rows, locs, positions):
                self.indexer_entries[loc] = (outs[1][r].copy(), pos)

    def check(self):
        assert torch.equal(self.layer.caches[0].cache.cpu(), self.cache.cpu())
        if len(self.layer.dims) < 2:
            return
        cache = self.layer.caches[1].cache
        rot = self.layer.rotary.cpu().numpy()
        written = np.zeros(cache.numel(), bool)
        for loc, (x, pos) in self.indexer_entries.items():
            check_indexer_entry(cache, loc, x, self.layer.weights[1], 1e-6, rot[pos])
            base = (loc // 64) * 64 * 132
            written[base + 128 * (loc % 64): base + 128 * (loc % 64) + 128] = True
            written[base + 64 * 128 + 4 * (loc % 64): base + 64 * 128 + 4 * (loc % 64) + 4] = True
        assert np.all(cache.reshape(-1).cpu().numpy()[~written] == POISON)


def expected(layer: Layer, k: int, slot: int, n: int, ring_below: int) -> np.ndarray:
    """Entry n of the request at `slot`, compressor k: positions below ring_below were read from the ring
    (rounded to bf16 with a bf16 ring)."""
    rows = layer.tokens[k][slot, :4 * n + 4].copy()
    if layer.bf16:
        rows[:ring_below] = bf16(rows[:ring_below])
    return entry(rows, layer.apes[k], n)


def check_outs(layer, outs, closing, tol):
    """closing: [(out row, slot, n, ring_below)]; every other out row stays NaN."""
    for k, out in enumerate(outs):
        rows = {r for r, *_ in closing}
        for r, slot, n, ring_below in closing:
            assert rel_err(out[r], expected(layer, k, slot, n, ring_below)) < tol, (k, r, n)
        for r in range(out.shape[0]):
            if r not in rows:
                assert np.isnan(out[r]).all(), (k, r)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bf16_ring", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dims", [(512, 128), (256,), (128, 128)], ids=["main+indexer", "d256", "d128+indexer"])
def test_prefill_chunks_and_decodes_match_float64(device, bf16_ring, dims):
    """Chunked prefills split mid-quartet, then decodes (first windows included), then another extend:
    every entry within 1e-5 of float64 (a bf16 ring: of float64 over the rows it rounded), every other out
    row untouched, the main cache equal to the standalone store of the entries, the indexer cache within one
    fp8 step of the float64 store and no other byte written."""
    layer = Layer(torch.device(device), bf16_ring=bf16_ring, dims=dims, ring_size=8, seed=len(dims) + bf16_ring)
    shadow = Shadow(layer)
    tol = 1e-5
    slots = [2, 0, 3]
    lens = [0, 0, 0]

    def extend(exts):
        seqs = [lens[i] + exts[i] for i in range(3)]
        outs, compress = layer.extend(seqs, exts, slots)
        closing, rows, locs, positions = [], [], [], []
        rec = compress.view(np.uint32).reshape(-1, 4)
        off = np.cumsum([0] + exts)
        for i, r in enumerate(rec):
            seq_len = int(r[0])
            b = int(np.searchsorted(off, int(r[1]) & 0xFFFF, side="right") - 1)
            n = seq_len // 4 - 1
            closing.append((i, slots[b], n, lens[b]))
            rows.append(i), locs.append(n + 32 * slots[b]), positions.append(4 * n)
        check_outs(layer, outs, closing, tol)
        shadow.closed(outs, rows, locs, positions)
        lens[:] = seqs

    def decode():
        seqs = [s + 1 for s in lens]
        outs = layer.decode(seqs, slots)
        closing = [(b, slots[b], s // 4 - 1, s) for b, s in enumerate(seqs) if s % 4 == 0]
        check_outs(layer, outs, closing, tol)
        shadow.closed(outs, [c[0] for c in closing], [c[2] + 32 * c[1] for c in closing], [4 * c[2] for c in closing])
        lens[:] = seqs

    decode()                 # first tokens: no entry
    extend([2, 9, 3])        # prefixes 1: windows span ring and input
    for _ in range(6):
        decode()
    extend([13, 1, 6])       # mid-quartet starts and ends
    decode()
    extend([1, 17, 4])
    shadow.check()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ahead", [False, True], ids=["records", "records-ahead"])
def test_decode_records_equal_request_scoped_rows(device, ahead):
    """sglang's 16-byte decode records addressing the same rows give the same ring, outputs and caches as
    pydsa's request-scoped mode, bit for bit (also when the records are read ahead of the producers' wait)."""
    a = Layer(torch.device(device), seed=5)
    b = Layer(torch.device(device), seed=5)
    slots = [1, 3]
    for s in range(1, 14):
        oa = a.decode([s, s + 2], slots)
        ob = b.decode([s, s + 2], slots, records=True, records_ahead=ahead)
        for x, y in zip(oa, ob):
            np.testing.assert_array_equal(x, y)
    for k in range(2):
        assert torch.equal(a.compressors[k].ring.cpu().nan_to_num(7), b.compressors[k].ring.cpu().nan_to_num(7))
        assert torch.equal(a.caches[k].cache.cpu(), b.caches[k].cache.cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bf16_ring", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("ahead", [False, True], ids=["records", "records-ahead"])
def test_a_write_row_inside_the_window_is_read_as_written(device, bf16_ring, ahead):
    """Records are data: a closing record whose write row is any row of its own window (not only the current
    group's last, which the GPU takes from registers) or none of it closes the entry from the ring as it is
    after the token's row is written, on both backends, both rings, the record read before or after the wait."""
    dev = torch.device(device)
    layer = Layer(dev, seed=11, dims=(128,), bf16_ring=bf16_ring, store=False)
    ring = layer.compressors[0].ring
    g = torch.Generator().manual_seed(12)
    start = torch.randn(ring.shape, generator=g).to(ring.dtype)
    writes = [0, 2, 3, 4, 6, 7, 9, 13]  # prev group 0 / current group 1's rows, and rows outside the window
    recs = np.array([[8, w, 0, 1] for w in writes], np.int32)
    kv = torch.randn(len(writes), 4 * 128, generator=g)
    for i, w in enumerate(writes):
        ring.copy_(start.to(dev))
        out = torch.full((1, 128), float("nan"), device=dev)
        rec = torch.from_numpy(recs[i:i + 1].view(np.uint8).reshape(1, 16).copy()).to(dev)
        pydsa.c4_decode(layer.compressors[0], kv[i:i + 1].to(dev), records=rec, out=out, records_ahead=ahead)
        after = start.clone()
        after[w] = kv[i].to(ring.dtype)
        assert torch.equal(ring.cpu().view(torch.int16 if bf16_ring else torch.int32),
                           after.view(torch.int16 if bf16_ring else torch.int32)), f"write row {w}"
        want = entry(after[:8].float().numpy(), layer.apes[0], 1)
        assert rel_err(out.cpu().numpy()[0], want) < 1e-5, f"write row {w}"


@pytest.mark.parametrize("device", DEVICES)
def test_bad_rows_are_skipped_and_counted(device):
    """Records whose rows lie outside the ring or the input are skipped and counted; nothing is written for
    them (padding records are skipped silently)."""
    dev = torch.device(device)
    layer = Layer(dev, seed=9, dims=(512,))
    ring_rows = layer.compressors[0].ring.shape[0]
    recs = decode_records([4, 8, 3], [0, 1, 2], 8).view(np.int32).reshape(3, 4).copy()
    recs[0, 1] = ring_rows          # write row past the ring
    recs[1, 2] = -5                 # previous group outside the ring (closing row)
    recs = np.concatenate([recs, np.zeros((1, 4), np.int32)])  # seq_len 0: padding
    errors = torch.zeros(1, dtype=torch.int32, device=dev)
    before = layer.compressors[0].ring.cpu().clone()
    kv = torch.randn(4, 2048, device=dev)
    out = torch.full((4, 512), float("nan"), device=dev)
    pydsa.c4_decode(layer.compressors[0], kv, records=torch.from_numpy(recs.view(np.uint8).reshape(4, 16)).to(dev),
                    out=out, cache_slots=torch.arange(4, dtype=torch.int64, device=dev), error_count=errors)
    assert int(errors.item()) == 2
    assert torch.isnan(out.cpu()).all()
    after = layer.compressors[0].ring.cpu()
    changed = [r for r in range(ring_rows) if not torch.equal(before[r].nan_to_num(1), after[r].nan_to_num(1))]
    assert changed == [8 + 7, 16 + 2]  # request 1's row (its token written, its entry skipped) and request 2's


def test_verify_bound_is_refused_by_name():
    """c4_verify refuses a V the ring cannot serve, naming the bound; c4_max_drafts states it."""
    layer = Layer(torch.device("cpu"), seed=1, dims=(128,), ring_size=16, store=False)
    assert pydsa.c4_max_drafts(16) == 10 and pydsa.c4_max_drafts(16, reject_all=True) == 9
    assert pydsa.c4_max_drafts(8) == 2
    drafts = torch.randn(11, 512)
    with pytest.raises(pydsa.DsaError, match=r"num_drafts is 11; a ring of 16 rows serves 1\.\.10"):
        pydsa.c4_verify(layer.compressors[0], drafts, torch.zeros(1, dtype=torch.int32),
                        torch.zeros(1, dtype=torch.int32), num_drafts=11, ring_size=16)
    with pytest.raises(pydsa.DsaError, match=r"serves 1\.\.9"):
        pydsa.c4_verify(layer.compressors[0], drafts[:10], torch.zeros(1, dtype=torch.int32),
                        torch.zeros(1, dtype=torch.int32), num_drafts=10, ring_size=16, reject_all=True)


def _speculative(device, ring_size, reject_all, data):
    """Any schedule of extends, decodes and verifies (any acceptance the bound allows) leaves the caches
    equal, entry for entry and byte for byte, to decoding the accepted tokens one by one."""
    dev = torch.device(device)
    V = data.draw(st.integers(1, pydsa.c4_max_drafts(ring_size, reject_all=reject_all)), label="V")
    spec = Layer(dev, seed=3, ring_size=ring_size, max_len=160, pages=16)
    plain = Layer(dev, seed=3, ring_size=ring_size, max_len=160, pages=16)
    g = np.random.default_rng(data.draw(st.integers(0, 2 ** 16), label="seed"))
    slots = [0, 2]
    lens = [0, 0]
    first = [int(x) for x in data.draw(st.lists(st.integers(1, 11), min_size=2, max_size=2), label="prefill")]
    seqs = [first[0], first[1]]
    for layer in (spec, plain):
        layer.extend(seqs, first, slots)
    lens[:] = seqs
    for _ in range(data.draw(st.integers(1, 6), label="steps")):
        if data.draw(st.booleans(), label="verify"):
            # drafts: the true tokens of positions lens .. lens + V - 1, the rejected ones overwritten with noise
            accepted = [int(data.draw(st.integers(0 if reject_all else 1, V))) for _ in slots]
            rows = []
            for k, d in enumerate(spec.dims):
                block = np.stack([spec.tokens[k][slots[b], lens[b]:lens[b] + V] for b in range(2)])
                for b in range(2):
                    block[b, accepted[b]:] = g.standard_normal((V - accepted[b], 4 * d)).astype(np.float32)
                rows.append(block.reshape(2 * V, 4 * d))
            kw = spec.kwargs(rows, 2 * V)
            kw["cache_slots"] = torch.tensor([(lens[b] + j) // 4 + 32 * slots[b] for b in range(2) for j in range(V)],
                                             dtype=torch.int64, device=dev)
            pydsa.c4_verify(drafts=kw.pop("kv_score"), indexer_drafts=kw.pop("indexer_kv_score"),
                            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
                            slots=torch.tensor(slots, dtype=torch.int32, device=dev), num_drafts=V,
                            ring_size=ring_size, reject_all=reject_all, **kw)
            for b in range(2):
                for _ in range(accepted[b]):
                    plain.decode([lens[b] + 1], [slots[b]])
                    lens[b] += 1
        else:
            ext = [int(x) for x in data.draw(st.lists(st.integers(0, 9), min_size=2, max_size=2), label="extend")]
            if data.draw(st.booleans(), label="as decode") or 0 in ext:
                seq1 = [s + 1 for s in lens]
                spec.decode(seq1, slots)
                plain.decode(seq1, slots)
                lens[:] = seq1
            else:
                seqn = [lens[b] + ext[b] for b in range(2)]
                spec.extend(seqn, ext, slots)
                for b in range(2):
                    for p in range(lens[b], seqn[b]):
                        plain.decode([p + 1], [slots[b]])
                lens[:] = seqn
    # every entry closed below each request's committed length, in both caches
    for k in range(2):
        a, c = spec.caches[k].cache.cpu(), plain.caches[k].cache.cpu()
        page = a.shape[1]
        for b in range(2):
            for n in range(lens[b] // 4):
                loc = n + 32 * slots[b]
                flat_a, flat_c = a.reshape(-1), c.reshape(-1)
                if k == 0:
                    base, s = (loc // 64) * page, loc % 64
                    spans = [(base + 576 * s, 576), (base + 64 * 576 + 8 * s, 7)]
                else:
                    base, s = (loc // 64) * page, loc % 64
                    spans = [(base + 128 * s, 128), (base + 64 * 128 + 4 * s, 4)]
                for start, size in spans:
                    assert torch.equal(flat_a[start:start + size], flat_c[start:start + size]), (k, b, n)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ring_size,reject_all", [(16, False), (16, True), (8, False), (12, True)])
@settings(max_examples=examples(12))
@given(data=st.data())
def test_verify_with_any_acceptance_equals_decoding_the_accepted_tokens(device, ring_size, reject_all, data):
    _speculative(device, ring_size, reject_all, data)


@given(seq=st.lists(st.integers(1, 300), min_size=1, max_size=6), data=st.data())
@settings(max_examples=examples(40))
def test_plan_c4_records_cover_every_closing_position_and_keep_the_last_rows(seq, data):
    """pyplan.plan_c4: one compress record per closing position (in request and position order) with the
    window rows before the extend from the ring; write records for the last min(extend, R) positions."""
    ext = [data.draw(st.integers(1, s)) for s in seq]
    held = data.draw(st.permutations(range(21)))  # live requests hold distinct slots (plan_c4 refuses others)
    slots = [-1 if data.draw(st.booleans()) else held[i] for i in range(len(seq))]
    R = data.draw(st.sampled_from([8, 12, 16]))
    compress, write = pyplan.plan_c4(np.array(seq), np.array(ext), np.array(slots), R)
    c = compress.view(pyplan.C4_COMPRESS_DTYPE).reshape(-1)
    w = write.view(pyplan.C4_WRITE_DTYPE).reshape(-1)
    want_c, want_w, off = [], [], 0
    for s, e, slot in zip(seq, ext, slots):
        l0 = s - e
        if slot >= 0:
            for p in range(l0, s):
                if (p + 1) % 4 == 0:
                    row, prev = slot * R + p % R, slot * R + max(p - 4, 0) % R
                    want_c.append((p + 1, off + p - l0, 8 - min(p - l0 + 1, 8), prev // 4, row // 4))
            for p in range(max(l0, s - R), s):
                want_w.append((off + p - l0, slot * R + p % R))
        off += e
    assert [tuple(int(v) for v in r) for r in c.tolist()] == want_c
    assert [tuple(int(v) for v in r) for r in w.tolist()] == want_w


def test_plan_c4_refuses_bad_input_by_name():
    with pytest.raises(pydsa.ArgumentValueError, match=r"extend_lens\[0\] is 5 and seq_lens\[0\] 3"):
        pyplan.plan_c4(np.array([3]), np.array([5]), np.array([0]), 8)
    with pytest.raises(ValueError, match="ring_size is 6"):
        pyplan.plan_c4(np.array([3]), np.array([3]), np.array([0]), 6)
    with pytest.raises(ValueError, match="extend_lens: the extends sum to 70000 tokens; a c4 extend takes at most 65536"):
        pyplan.plan_c4(np.array([70000]), np.array([70000]), np.array([0]), 8)
    with pytest.raises(ValueError, match="num_tokens is 70000; expected 0..65536"):
        pyplan.plan_c4(np.array([7]), np.array([7]), np.array([0]), 8, num_tokens=70000)


def test_arguments_are_judged_by_name():
    layer = Layer(torch.device("cpu"), seed=2, dims=(512, 128))
    main, idx = layer.compressors
    kv = torch.randn(2, 2048)
    seq = torch.ones(2, dtype=torch.int32)
    with pytest.raises(TypeError, match="main must be a pydsa.C4Compressor"):
        pydsa.c4_decode(object(), kv, seq_lens=seq, slots=seq, ring_size=8)
    with pytest.raises(ValueError, match="indexer_kv_score is None but indexer is given: the indexer and its input go together"):
        pydsa.c4_decode(main, kv, indexer=idx, seq_lens=seq, slots=seq, ring_size=8)
    with pytest.raises(ValueError, match="kv_score"):
        pydsa.c4_decode(main, torch.randn(2, 1024), seq_lens=seq, slots=seq, ring_size=8)
    with pytest.raises(pydsa.ArgumentValueError, match="records_ahead=True needs records=") as err:
        pydsa.c4_decode(main, kv, seq_lens=seq, slots=seq, records_ahead=True)
    assert err.value.argument == "records_ahead"
    with pytest.raises(pydsa.ArgumentTypeError, match="records_ahead must be a bool") as err:
        pydsa.c4_decode(main, kv, records=torch.zeros(2, 16, dtype=torch.uint8), records_ahead=1)
    assert err.value.argument == "records_ahead"
    with pytest.raises(ValueError, match="records= and seq_lens="):
        pydsa.c4_decode(main, kv, records=torch.zeros(2, 16, dtype=torch.uint8), seq_lens=seq, slots=seq)
    with pytest.raises(ValueError, match="ring_size is 6 but main's ring has ring_size 8"):
        pydsa.c4_decode(main, kv, seq_lens=seq, slots=seq, ring_size=6, cache_slots=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="cache_slots is None but a compressor has a store"):
        pydsa.c4_decode(main, kv, seq_lens=seq, slots=seq, ring_size=8)
    with pytest.raises(ValueError, match="ring has 6 rows"):
        pydsa.C4Compressor(torch.zeros(6, 512), torch.zeros(8, 128))
    # the compressor judges its ring, ape and store once, when made, and stands for them
    with pytest.raises(ValueError, match=r"ape must have shape \[8, 128\]"):
        pydsa.C4Compressor(torch.randn(8, 512), torch.randn(8, 64))
    with pytest.raises(TypeError, match="ring must have dtype torch.float32"):
        pydsa.C4Compressor(torch.ones(8, 512, dtype=torch.int32), torch.randn(8, 128))
    with pytest.raises(ValueError, match="ring must be contiguous"):
        pydsa.C4Compressor(torch.randn(512, 8).t(), torch.randn(8, 128))
    with pytest.raises(ValueError, match="store is for D = 512 but the ring's D is 128"):
        pydsa.C4Compressor(torch.randn(8, 512), torch.randn(8, 128), store=main.store)
    with pytest.raises(TypeError, match="store must be a pydsa.KVCache"):
        pydsa.C4Compressor(torch.randn(8, 512), torch.randn(8, 128), store=object())
    with pytest.raises(AttributeError):
        main.ring = torch.randn(8, 2048)
    with pytest.raises(TypeError, match="indexer must be a pydsa.C4Compressor"):
        pydsa.c4_decode(main, kv, indexer=object(), indexer_kv_score=kv, seq_lens=seq, slots=seq, ring_size=8)
    with pytest.raises(ValueError, match="cache_slots is given but neither compressor has a store"):
        bare = pydsa.C4Compressor(torch.randn(8, 2048), torch.randn(8, 512), ring_size=8)
        pydsa.c4_decode(bare, kv, seq_lens=seq, slots=seq, ring_size=8, cache_slots=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="an indexer cache needs D = 128"):
        pydsa.KVCache(torch.zeros(8448, dtype=torch.uint8), torch.ones(512), torch.zeros(8, 64), page_size=64,
                      layout="indexer")


@pytest.mark.parametrize("device", DEVICES)
def test_standalone_stores_of_c4_records_equal_the_fused_ones(device):
    """kv_store with a c4 layer's decode records (ratio=4), into the main and the indexer cache, writes the
    same bytes as the fused decode, and nothing for rows that close no entry."""
    dev = torch.device(device)
    fused = Layer(dev, seed=21)
    alone = Layer(dev, seed=21)
    slots = [0, 1, 2, 3]
    for s in range(1, 14):
        seqs = [s] * 4
        outs = fused.decode(seqs, slots)
        recs = torch.from_numpy(decode_records(seqs, slots, 8)).to(dev)
        locs = torch.tensor([(q - 1) // 4 + 32 * slots[i] for i, q in enumerate(seqs)], dtype=torch.int64, device=dev)
        # the vectors of the rows that close an entry; other rows hold garbage the store must skip
        for k in range(2):
            v = torch.from_numpy(np.nan_to_num(outs[k], nan=3.0)).to(dev)
            pydsa.kv_store(v, None, locs, alone.caches[k], records=recs, ratio=4)
    for k in range(2):
        assert torch.equal(fused.caches[k].cache.cpu(), alone.caches[k].cache.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_a_prepared_decode_replays_what_the_one_shot_decode_does(device):
    """C4Decode fills the params once; launch() over fresh contents of the same buffers equals c4_decode."""
    dev = torch.device(device)
    a, b = Layer(dev, seed=8), Layer(dev, seed=8)
    slots = torch.tensor([0, 2], dtype=torch.int32, device=dev)
    seq = torch.zeros(2, dtype=torch.int32, device=dev)
    kv = [torch.zeros(2, 4 * d, device=dev) for d in a.dims]
    locs = torch.zeros(2, dtype=torch.int64, device=dev)
    step = pydsa.C4Decode(b.compressors[0], kv[0], indexer=b.compressors[1], indexer_kv_score=kv[1], seq_lens=seq,
                          slots=slots, ring_size=8, cache_slots=locs)
    for s in range(1, 13):
        seq.fill_(s)
        locs.copy_(torch.tensor([(s - 1) // 4, 64 + (s - 1) // 4]))
        for k in range(2):
            kv[k].copy_(torch.from_numpy(np.stack([a.tokens[k][0, s - 1], a.tokens[k][2, s - 1]])))
        a.decode([s, s], [0, 2])
        step.launch()
    for k in range(2):
        assert torch.equal(a.caches[k].cache.cpu(), b.caches[k].cache.cpu())


def _wide_layer(dev, bf16_ring, n, seed):
    """Both compressors of a layer over n request slots (ring R = 8 each), random rings, poisoned caches."""
    g = torch.Generator().manual_seed(seed)
    rot = torch.randn(n // 4 + 64, 64, generator=g).to(dev)
    comps = []
    for d, layout, page in ((512, "v4", pydsa.kv_page_bytes(512, 64)), (128, "indexer", pydsa.indexer_page_bytes(128, 64))):
        ring = torch.randn(8 * n, 4 * d, generator=g).to(torch.bfloat16 if bf16_ring else torch.float32).to(dev)
        cache = torch.full((n // 64 + 2, page), POISON, dtype=torch.uint8).to(dev)
        store = pydsa.KVCache(cache, (torch.rand(d, generator=g) + 0.5).to(dev), rot, page_size=64, eps=1e-6,
                              layout=layout)
        comps.append(pydsa.C4Compressor(ring, (torch.randn(8, d, generator=g) * 0.5).to(dev), store=store, ring_size=8))
    return comps


def _state(comps, outs):
    return [c.ring.clone() for c in comps] + [c.store.cache.clone() for c in comps] + [o.clone() for o in outs]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bf16_ring", [False, True], ids=["fp32", "bf16"])
def test_the_launch_shape_changes_no_byte(device, bf16_ring):
    """A decode of 300 requests and an extend of 300 compress records (wide launches: 4 channels per thread)
    write the same ring rows, entries and cache bytes as the same work in chunks of 100 (2 channels per
    thread): the arithmetic's order does not depend on the launch shape."""
    dev = torch.device(device)
    n, chunk = 300, 100
    g = torch.Generator().manual_seed(5)
    seq = torch.randint(1, 200, (n,), generator=g, dtype=torch.int32)
    seq[::2] = (seq[::2] // 4 + 1) * 4  # half the rows close an entry
    slots = torch.randperm(n, generator=g).to(torch.int32)
    kv = [torch.randn(n, 4 * d, generator=g).to(dev) for d in (512, 128)]
    locs = torch.randperm(n, generator=g).to(dev)
    states = []
    for parts in ((slice(0, n),), tuple(slice(i, i + chunk) for i in range(0, n, chunk))):
        comps = _wide_layer(dev, bf16_ring, n, seed=9)
        outs = [torch.full((n, d), float("nan"), device=dev) for d in (512, 128)]
        for sl in parts:
            pydsa.c4_decode(comps[0], kv[0][sl], indexer=comps[1], indexer_kv_score=kv[1][sl], seq_lens=seq[sl].to(dev),
                            slots=slots[sl].to(dev), ring_size=8, out=outs[0][sl], indexer_out=outs[1][sl],
                            cache_slots=locs[sl])
        assert torch.isfinite(outs[0][(seq % 4 == 0).to(dev)]).all()
        states.append(_state(comps, outs))
    for a, b in zip(*states):
        assert torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))
    # an extend: 4 new tokens for each of 300 requests, every one closing an entry at its last token
    ext = np.full(n, 4)
    lens = (np.arange(n) % 50) * 4 + 4 + ext
    compress, write = pyplan.plan_c4(lens, ext, np.arange(n), 8)
    assert len(compress) == n
    tokens = [torch.randn(4 * n, 4 * d, generator=g).to(dev) for d in (512, 128)]
    slots4 = torch.full((4 * n,), -1, dtype=torch.int64)
    slots4[3::4] = torch.randperm(n, generator=g)  # the closing tokens' cache slots
    slots4 = slots4.to(dev)
    states = []
    for parts in ((slice(0, n),), tuple(slice(i, i + chunk) for i in range(0, n, chunk))):
        comps = _wide_layer(dev, bf16_ring, n, seed=10)
        outs = [torch.full((n, d), float("nan"), device=dev) for d in (512, 128)]
        empty = torch.from_numpy(write[:0]).to(dev)
        for sl in parts:  # every compress pass before the write pass
            pydsa.c4_extend(comps[0], tokens[0], (torch.from_numpy(compress[sl]).to(dev), empty), indexer=comps[1],
                            indexer_kv_score=tokens[1], out=outs[0][sl], indexer_out=outs[1][sl], cache_slots=slots4)
        pydsa.c4_extend(comps[0], tokens[0], (torch.from_numpy(compress[:0]).to(dev), torch.from_numpy(write).to(dev)),
                        indexer=comps[1], indexer_kv_score=tokens[1], cache_slots=slots4)
        assert torch.isfinite(outs[0]).all() and torch.isfinite(outs[1]).all()
        states.append(_state(comps, outs))
    for a, b in zip(*states):
        assert torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))


def _stored_pair(mcache, xcache, b=2, r=8):
    """A main (D = 512, page 2) and an indexer (D = 128, page 64) compressor over request-scoped rings of r rows,
    their stores over the given caches, on the host."""
    gen = torch.Generator().manual_seed(3)
    freqs = torch.randn(4096, 64, generator=gen)

    def comp(d, layout, cache):
        store = pydsa.KVCache(cache, torch.rand(d, generator=gen) + 0.5, freqs, page_size=64 if layout == "indexer"
                              else 2, layout=layout)
        return pydsa.C4Compressor(torch.randn(b * r, 4 * d, generator=gen), torch.randn(8, d, generator=gen),
                                  store=store, ring_size=r)
    return comp(512, "v4", mcache), comp(128, "indexer", xcache)


@pytest.mark.parametrize("over", ["out in indexer cache", "indexer_out in main cache", "cache_slots in main cache",
                                  "cache_slots in indexer cache"])
def test_a_two_compressor_calls_out_or_slots_inside_a_cache_is_refused_by_name(over):
    """One c4 launch writes out, indexer_out and both caches and reads cache_slots: each out apart from the other
    side's cache, the slots apart from both (the store would overwrite the slots it reads). Refused naming the cache;
    nothing written."""
    b = 2
    xcache = torch.zeros(pydsa.indexer_page_bytes(128, 64) * 2, dtype=torch.uint8)
    mcache = torch.zeros(pydsa.kv_page_bytes(512, 2) * 8, dtype=torch.uint8)
    main, indexer = _stored_pair(mcache, xcache, b)
    out, indexer_out, slots = torch.zeros(b, 512), torch.zeros(b, 128), torch.tensor([0, 1])
    if over == "out in indexer cache":
        out, name = xcache[:b * 512 * 4].view(torch.float32).view(b, 512), "indexer.store.cache"
    elif over == "indexer_out in main cache":
        indexer_out, name = mcache[-b * 128 * 4:].view(torch.float32).view(b, 128), "main.store.cache"
    else:
        cache = mcache if "main" in over else xcache
        slots, name = cache[-b * 8:].view(torch.int64), "main.store.cache" if "main" in over else "indexer.store.cache"
        slots.copy_(torch.tensor([0, 1]))
    before = mcache.clone(), xcache.clone()
    with pytest.raises(pydsa.ArgumentValueError, match="shares memory") as caught:
        pydsa.c4_decode(main, torch.randn(b, 2048), indexer=indexer, indexer_kv_score=torch.randn(b, 512),
                        seq_lens=torch.tensor([4, 8], dtype=torch.int32), slots=torch.tensor([0, 1], dtype=torch.int32),
                        out=out, indexer_out=indexer_out, cache_slots=slots)
    assert caught.value.argument == name, str(caught.value)
    assert torch.equal(mcache, before[0]) and torch.equal(xcache, before[1])
