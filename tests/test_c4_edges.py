"""The c4 ops' edges, as strict as c128's (docs/spec.md, "The ring"): the request-scoped ring owns its geometry,
rows are computed in 64 bits and range-checked before any narrowing, a plan made for another ring or input is
refused, live slots are distinct, an empty batch does nothing, outputs never alias inputs, and the helpers judge
their arguments. Each case names the argument as the call spells it and writes nothing."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import pydsa
import pyplan
from c4_reference import Layer
from conftest import DEVICES


def _i32(*v, device="cpu"):
    return torch.tensor(v, dtype=torch.int32, device=device)


def _ring_bytes(layer):
    return [c.ring.cpu().view(torch.uint8).clone() for c in layer.compressors]


def _unchanged(layer, before):
    return all(torch.equal(a, b) for a, b in zip(before, _ring_bytes(layer)))


def test_the_compressor_owns_its_ring_geometry():
    ring = torch.randn(32, 512)
    c = pydsa.C4Compressor(ring, torch.randn(8, 128), ring_size=8)
    assert (c.ring_size, c.num_slots) == (8, 4)
    assert pydsa.C4Compressor(ring, torch.randn(8, 128)).ring_size is None
    with pytest.raises(pydsa.ArgumentValueError, match="ring_size is 12; expected a multiple of 4 that divides the "
                                                       "ring's 32 rows") as e:
        pydsa.C4Compressor(ring, torch.randn(8, 128), ring_size=12)
    assert e.value.argument == "ring_size"
    for bad in ("8", 8.0, True, 6):
        with pytest.raises(pydsa.ArgumentError) as e:
            pydsa.C4Compressor(ring, torch.randn(8, 128), ring_size=bad)
        assert e.value.argument == "ring_size"


def test_one_compressor_as_both_sides_is_refused_by_name():
    """The same C4Compressor passed as main and indexer (its ring and cache written twice by one launch: a race on
    the GPU) is refused naming indexer, by the one-shot calls and the prepared decode; nothing is written."""
    layer = Layer(torch.device("cpu"), seed=4, dims=(128,), ring_size=8, store=False)
    main = layer.compressors[0]
    before = _ring_bytes(layer)
    kv = torch.randn(1, 512)
    calls = (lambda: pydsa.c4_decode(main, kv, indexer=main, indexer_kv_score=kv, seq_lens=_i32(4), slots=_i32(0)),
             lambda: pydsa.C4Decode(main, kv, indexer=main, indexer_kv_score=kv, seq_lens=_i32(4), slots=_i32(0)),
             lambda: pydsa.c4_verify(main, torch.randn(2, 512), _i32(5), _i32(0), num_drafts=2, indexer=main,
                                     indexer_drafts=torch.randn(2, 512)))
    for call in calls:
        with pytest.raises(pydsa.ArgumentValueError, match="indexer is main") as e:
            call()
        assert e.value.argument == "indexer"
    assert _unchanged(layer, before)


def test_a_verify_names_seq_lens_when_seq_lens_is_what_is_wrong():
    """A seq_lens of the wrong shape or dtype is named as seq_lens, not as the drafts it would size."""
    layer = Layer(torch.device("cpu"), seed=5, dims=(128,), ring_size=8, store=False)
    main = layer.compressors[0]
    drafts = torch.randn(2, 512)
    for bad in (_i32(5, 6).view(1, 2), torch.tensor(5, dtype=torch.int32), torch.tensor([5], dtype=torch.int64)):
        with pytest.raises(pydsa.ArgumentError) as e:
            pydsa.c4_verify(main, drafts, bad, _i32(0), num_drafts=2)
        assert e.value.argument == "seq_lens", str(e.value)
    with pytest.raises(pydsa.ArgumentValueError, match="drafts has 2 rows; expected batch_size \\* num_drafts = "
                                                       "2 \\* 2") as e:
        pydsa.c4_verify(main, drafts, _i32(5, 6), _i32(0, 1), num_drafts=2)
    assert e.value.argument == "drafts"


def test_a_call_for_another_geometry_is_refused_by_name():
    """A decode or verify that claims another R than the ring's, a plan made for another R, more slots or
    another input, and a request-scoped call on a ring without a geometry are refused; nothing is written."""
    layer = Layer(torch.device("cpu"), seed=3, dims=(128,), ring_size=8, store=False)
    main = layer.compressors[0]
    before = _ring_bytes(layer)
    kv = torch.randn(1, 512)
    with pytest.raises(pydsa.ArgumentValueError, match="ring_size is 16 but main's ring has ring_size 8") as e:
        pydsa.c4_decode(main, kv, seq_lens=_i32(4), slots=_i32(0), ring_size=16)
    assert e.value.argument == "ring_size"
    with pytest.raises(pydsa.ArgumentValueError, match="ring_size is 16 but main's ring has ring_size 8"):
        pydsa.c4_verify(main, torch.randn(10, 512), _i32(0), _i32(0), num_drafts=10, ring_size=16)
    # the bound is the ring's: R = 8 serves 2 drafts
    with pytest.raises(pydsa.DsaError, match="num_drafts is 10; a ring of 8 rows serves 1..2"):
        pydsa.c4_verify(main, torch.randn(10, 512), _i32(0), _i32(0), num_drafts=10)
    plan16 = pyplan.plan_c4(np.array([6]), np.array([6]), np.array([0]), 16)
    with pytest.raises(pydsa.ArgumentValueError, match="plan was made for ring_size 16 but main.ring_size is 8") as e:
        pydsa.c4_extend(main, torch.randn(6, 512), plan16)
    assert e.value.argument == "plan"
    plan_wide = pyplan.plan_c4(np.array([6]), np.array([6]), np.array([0]), 8, num_slots=64)
    with pytest.raises(pydsa.ArgumentValueError, match="plan was made for 64 slots but main's ring holds 4"):
        pydsa.c4_extend(main, torch.randn(6, 512), plan_wide)
    # a plan for 2 of 3 requests (its num_tokens is theirs) on the 3 requests' input
    two = pyplan.plan_c4(np.array([6, 5]), np.array([6, 5]), np.array([0, 1]), 8)
    with pytest.raises(pydsa.ArgumentValueError, match="kv_score has 14 rows but plan was made for num_tokens = 11") as e:
        pydsa.c4_extend(main, torch.randn(14, 512), two)
    assert e.value.argument == "kv_score"
    bare = pydsa.C4Compressor(torch.randn(32, 512), torch.randn(8, 128))
    with pytest.raises(pydsa.ArgumentValueError, match="main was made without ring_size") as e:
        pydsa.c4_decode(bare, kv, seq_lens=_i32(4), slots=_i32(0))
    assert e.value.argument == "main"
    with pytest.raises(pydsa.ArgumentValueError, match="main was made without ring_size"):
        pydsa.c4_extend(bare, torch.randn(6, 512), pyplan.plan_c4(np.array([6]), np.array([6]), np.array([0]), 8))
    other = pydsa.C4Compressor(torch.randn(64, 512), torch.randn(8, 128), ring_size=16)
    with pytest.raises(pydsa.ArgumentValueError, match="indexer.ring_size is 16 but main.ring_size is 8") as e:
        pydsa.c4_decode(main, kv, indexer=other, indexer_kv_score=kv, seq_lens=_i32(4), slots=_i32(0))
    assert e.value.argument == "indexer"
    with pytest.raises(pydsa.ArgumentValueError, match="ring_size is given with records="):
        pydsa.c4_decode(main, kv, records=torch.zeros(1, 16, dtype=torch.uint8), ring_size=8)
    assert _unchanged(layer, before)


@pytest.mark.parametrize("device", DEVICES)
def test_a_slot_past_the_ring_is_skipped_and_counted_never_wrapped(device):
    """Rows are 64-bit: slot 2^28 at R = 16 (row 2^32) used to land on slot 0's row 0 in a decode, and slot
    2^30 closed an entry from slot 0's rows in a verify. Now each is skipped and counted; the ring is untouched."""
    dev = torch.device(device)
    layer = Layer(dev, seed=4, dims=(128,), ring_size=16, store=False)
    main = layer.compressors[0]
    before = _ring_bytes(layer)
    errors = torch.zeros(1, dtype=torch.int32, device=dev)
    out = torch.full((1, 128), float("nan"), device=dev)
    pydsa.c4_decode(main, torch.randn(1, 512, device=dev), seq_lens=_i32(1, device=dev),
                    slots=_i32(2 ** 28, device=dev), out=out, error_count=errors)
    assert int(errors) == 1 and _unchanged(layer, before)
    errors.zero_()
    out = torch.full((4, 128), float("nan"), device=dev)
    # drafts at positions 4..7: the last closes entry 1, whose window's first quartet is in the ring
    pydsa.c4_verify(main, torch.randn(4, 512, device=dev), _i32(4, device=dev), _i32(2 ** 30, device=dev),
                    num_drafts=4, out=out, error_count=errors)
    assert int(errors) > 0 and _unchanged(layer, before)
    assert torch.isnan(out).all()  # no entry was closed from another slot's rows


def test_a_host_plan_that_does_not_fit_its_call_is_refused_naming_the_record():
    """pyplan's records (numpy, read on the host) that point past the input fail the call before anything is
    written; the same records as tensors are data, skipped and counted."""
    layer = Layer(torch.device("cpu"), seed=5, dims=(128,), ring_size=8, store=False)
    main = layer.compressors[0]
    plan = pyplan.plan_c4(np.array([9, 8]), np.array([9, 8]), np.array([0, 1]), 8)
    before = _ring_bytes(layer)
    out = torch.full((len(plan[0]), 128), float("nan"))
    with pytest.raises(pydsa.DsaError, match=r"dsa_c4_extend: compress record \d+ .* does not fit this call \(12 input rows"):
        pydsa.c4_extend(main, torch.randn(12, 512), (plan[0], plan[1]), out=out)
    assert _unchanged(layer, before) and torch.isnan(out).all()
    errors = torch.zeros(1, dtype=torch.int32)
    pydsa.c4_extend(main, torch.randn(12, 512), (torch.from_numpy(plan[0]), torch.from_numpy(plan[1])), out=out,
                    error_count=errors)
    assert int(errors) > 0


def test_live_slots_must_be_distinct():
    layer = Layer(torch.device("cpu"), seed=6, dims=(128,), ring_size=8, store=False)
    main = layer.compressors[0]
    before = _ring_bytes(layer)
    with pytest.raises(pydsa.ArgumentValueError, match=r"slots\[0\] and slots\[2\] are both 1") as e:
        pydsa.c4_decode(main, torch.randn(3, 512), seq_lens=_i32(4, 5, 6), slots=_i32(1, 2, 1))
    assert e.value.argument == "slots"
    with pytest.raises(pydsa.ArgumentValueError, match=r"slots\[0\] and slots\[1\] are both 3"):
        pydsa.c4_verify(main, torch.randn(4, 512), _i32(0, 5), _i32(3, 3), num_drafts=2)
    with pytest.raises(pydsa.ArgumentValueError, match=r"slots\[0\] and slots\[1\] are both 2"):
        pyplan.plan_c4(np.array([4, 4]), np.array([4, 4]), np.array([2, 2]), 8)
    with pytest.raises(pydsa.ArgumentValueError, match=r"slots\[1\] is 4; expected below num_slots = 4"):
        pyplan.plan_c4(np.array([4, 4]), np.array([4, 4]), np.array([0, 4]), 8, num_slots=4)
    assert _unchanged(layer, before)
    # padding rows and requests not held here may repeat a slot
    pydsa.c4_decode(main, torch.randn(3, 512), seq_lens=_i32(4, 0, 6), slots=_i32(1, 1, -1))


@pytest.mark.parametrize("device", DEVICES)
def test_an_empty_batch_does_nothing(device):
    """An engine step without decodes is normal: B = 0 (and plan_c4's own empty plan) runs nothing and raises nothing."""
    dev = torch.device(device)
    layer = Layer(dev, seed=7, ring_size=8)
    main, idx = layer.compressors
    before = _ring_bytes(layer)
    e32, e64 = torch.empty(0, dtype=torch.int32, device=dev), torch.empty(0, dtype=torch.int64, device=dev)
    kw = dict(indexer=idx, cache_slots=e64)
    pydsa.c4_decode(main, torch.empty(0, 2048, device=dev), indexer_kv_score=torch.empty(0, 512, device=dev),
                    seq_lens=e32, slots=e32, **kw)
    pydsa.c4_decode(main, torch.empty(0, 2048, device=dev), indexer_kv_score=torch.empty(0, 512, device=dev),
                    records=torch.empty(0, 16, dtype=torch.uint8, device=dev), **kw)
    pydsa.c4_verify(main, torch.empty(0, 2048, device=dev), e32, e32, num_drafts=2,
                    indexer_drafts=torch.empty(0, 512, device=dev), **kw)
    empty = pyplan.plan_c4(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 8)
    pydsa.c4_extend(main, torch.empty(0, 2048, device=dev), empty.to(dev),
                    indexer_kv_score=torch.empty(0, 512, device=dev), **kw)
    assert _unchanged(layer, before)


def test_outputs_never_alias_inputs():
    layer = Layer(torch.device("cpu"), seed=8, dims=(128,), ring_size=8, store=False)
    main = layer.compressors[0]
    kv = torch.randn(4, 512)
    with pytest.raises(pydsa.ArgumentValueError, match="out shares memory with kv_score") as e:
        pydsa.c4_decode(main, kv, seq_lens=_i32(1, 2, 3, 4), slots=_i32(0, 1, 2, 3), out=kv.view(16, 128)[:4])
    assert e.value.argument == "out"
    with pytest.raises(pydsa.ArgumentValueError, match="out shares memory with main.ring"):
        pydsa.c4_decode(main, kv, seq_lens=_i32(1, 2, 3, 4), slots=_i32(0, 1, 2, 3), out=main.ring.view(-1, 128)[:4])


def test_a_standalone_store_over_records_states_its_ratio():
    """Records do not say which layer made them: c4 decode records stored with a default meant c128 (the
    seq_len-4 entry skipped, the seq_len-128 one at rotary row 0). records= now needs ratio=."""
    cache = pydsa.KVCache(torch.zeros(4, pydsa.kv_page_bytes(512, 64), dtype=torch.uint8), torch.rand(512) + 0.5,
                          torch.randn(256, 64), page_size=64)
    recs = torch.tensor([[4, 0, 0, 0], [128, 1, 0, 0]], dtype=torch.int32).view(torch.uint8)
    before = cache.cache.clone()
    with pytest.raises(pydsa.ArgumentValueError, match="records= needs ratio=") as e:
        pydsa.kv_store(torch.randn(2, 512), None, torch.arange(2), cache, records=recs)
    assert e.value.argument == "ratio" and torch.equal(before, cache.cache)
    with pytest.raises(pydsa.ArgumentValueError, match="ratio is given without records="):
        pydsa.kv_store(torch.randn(2, 512), _i32(0, 4), torch.arange(2), cache, ratio=4)
    pydsa.kv_store(torch.randn(2, 512), None, torch.arange(2), cache, records=recs, ratio=4)
    assert not torch.equal(before, cache.cache)


@pytest.mark.parametrize("call, argument", [
    (lambda: pydsa.c4_ring_bytes(-1, 16), "head_dim"),
    (lambda: pydsa.c4_ring_bytes(512, "16"), "ring_size"),
    (lambda: pydsa.c4_ring_bytes(512, 16, bf16="yes"), "bf16"),
    (lambda: pydsa.c4_max_drafts(2 ** 40), "ring_size"),
    (lambda: pydsa.c4_max_drafts(16, reject_all="no"), "reject_all"),
    (lambda: pydsa.kv_page_bytes("512"), "head_dim"),
    (lambda: pydsa.kv_page_bytes(512.0), "head_dim"),
    (lambda: pydsa.indexer_page_bytes(128.0), "head_dim"),
    (lambda: pydsa.bank_bytes(4, 4, head_dim=100), "head_dim"),
], ids=["ring_bytes-negative", "ring_bytes-str", "ring_bytes-bf16", "max_drafts-2^40", "max_drafts-reject_all",
        "page_bytes-str", "page_bytes-float", "indexer_page_bytes-float", "bank_bytes-head_dim"])
def test_the_sizing_helpers_judge_their_arguments(call, argument):
    with pytest.raises(pydsa.ArgumentError) as e:
        call()
    assert e.value.argument == argument


def test_the_sizing_helpers_answer_valid_sizes():
    assert pydsa.c4_ring_bytes(512, 8) == 8 * 2048 * 4 and pydsa.c4_ring_bytes(128, 16, bf16=True) == 16 * 512 * 2
    assert pydsa.c4_max_drafts(16) == 10 and pydsa.c4_max_drafts(16, reject_all=True) == 9
    assert pydsa.kv_page_bytes(512, 2) == 1728 and pydsa.indexer_page_bytes() == 8448
    assert pydsa.bank_bytes(4, 4, head_dim=512) == 4 * 5 * 3 * 512 * 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ring_size", [8, 16])
def test_a_verify_of_the_most_drafts_reads_the_row_its_last_draft_overwrites_first(device, ring_size):
    """V = R - 6: draft R - 7's row is the row of position seq - 7, which draft 0's entry reads when it closes
    (seq + 1 a multiple of 4). The verify of 48 such requests, every draft accepted, equals decoding the drafts one
    by one: both rings and both caches byte for byte (a write ordered after the read only by chance would lose
    the race in some of them)."""
    dev = torch.device(device)
    V = pydsa.c4_max_drafts(ring_size)
    slots = list(range(48))
    lens = [(11, 23, 15, 19)[s % 4] for s in slots]
    spec, plain = (Layer(dev, seed=5, slots=48, ring_size=ring_size, max_len=36, pages=28) for _ in range(2))
    for layer in (spec, plain):
        layer.extend(lens, lens, slots)
    rows = [np.concatenate([spec.tokens[k][s, n:n + V] for s, n in zip(slots, lens)]) for k in range(2)]
    kw = spec.kwargs(rows, len(slots) * V)
    kw["cache_slots"] = torch.tensor([(n + j) // 4 + 32 * s for s, n in zip(slots, lens) for j in range(V)],
                                     dtype=torch.int64, device=dev)
    pydsa.c4_verify(drafts=kw.pop("kv_score"), indexer_drafts=kw.pop("indexer_kv_score"),
                    seq_lens=_i32(*lens, device=dev), slots=_i32(*slots, device=dev), num_drafts=V,
                    ring_size=ring_size, **kw)
    for j in range(V):
        plain.decode([n + j + 1 for n in lens], slots)
    assert V == ring_size - 6 and all((n + 1) % 4 == 0 for n in lens)
    for a, c in zip(spec.compressors + spec.caches, plain.compressors + plain.caches):
        x, y = (a.ring, c.ring) if hasattr(a, "ring") else (a.cache, c.cache)
        assert torch.equal(x.cpu().view(torch.uint8), y.cpu().view(torch.uint8))
