"""sglang 0.5.23's offline c128 calls over pydsa (pydsa.sglang, compress_ratio 128, is_online=False): its
planners' records byte for byte (a plain transcription of sglang's planner rules: tests/sglang_offline_reference.py),
compress_forward, compress_norm_rope_store and the fused call against float64 and against pydsa's own offline ops,
any split into extends and decodes equal to decoding every token, the plans' host synchronization (none)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import pydsa
import pyplan
from conftest import DEVICES, HAS_GPU
from pydsa import sglang
from pydsa.sglang import offline as sglang_offline
from reference import rel_err
from sglang_offline_reference import CHUNK, D, PAGE, Layer, by_ragged, decode_plan, prefill_plan, tables

TOL = 1e-5


def _bytes(t) -> bytes:
    return t.cpu().contiguous().numpy().tobytes()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ring_size", [128, 256])
def test_decode_plan_bytes_are_sglangs(device, ring_size):
    seq = [0, 1, 127, 128, 129, 255, 256, 300, 5000, 2 ** 31 - 1]
    rid = [0, 3, 7, 2, 5, 1, 6, 4, 9, 8]  # seq_len 0 of request 0: sglang's write row -1, its pages by C division
    r2t, f2s = tables(device, 10)
    plan = sglang.CompressorDecodePlan.generate(128, torch.tensor(rid, device=device), r2t, f2s,
                                                torch.tensor(seq, device=device), 256, ring_size)
    assert plan.compress_ratio == 128 and plan.is_decode and tuple(plan.plan_d.shape) == (10, 16)
    assert plan.plan_d.dtype == torch.uint8 and plan.plan_d.device.type == torch.device(device).type
    assert _bytes(plan.plan_d) == decode_plan(seq, rid, ring_size)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("ring_size", [128, 256])
def test_host_prefill_plan_bytes_are_sglangs(device, graph, ring_size):
    """Random batches (prefixes, chunk-aligned extends, a verify's uniform few tokens): the host planner's bytes,
    CUDA-graph plans padded to num_q_tokens rows."""
    rng = np.random.default_rng(5)
    r2t, f2s = tables(device, 40)
    for k in range(30):
        b = int(rng.integers(1, 9))
        ext = rng.integers(1, 400, b) if k % 3 else np.full(b, int(rng.integers(1, 9)))
        seq = ext + (rng.integers(0, 700, b) if k % 5 else rng.integers(0, 4, b) * 128)
        rid = rng.permutation(40)[:b].tolist()
        n = int(ext.sum())
        plan = sglang.CompressorPrefillPlan.generate(128, torch.tensor(rid, device=device), torch.from_numpy(seq),
                                                     torch.from_numpy(ext), r2t, f2s, 256, ring_size, n, graph)
        c, w = prefill_plan(seq.tolist(), ext.tolist(), rid, ring_size, n, graph)
        assert _bytes(plan.plan_c) == c and _bytes(plan.plan_w) == w, (seq, ext, rid)
        assert plan.plan_c.shape[1] == 16 and plan.plan_w.shape[1] == 8 and not plan.is_decode


def _device_plan(device, seq, ext, rid, ring_size, n):
    """The device-lengths planner's records; on the host backend, its own path run on host tensors (device
    lengths only take it on a GPU)."""
    rid_t = torch.tensor(rid, dtype=torch.int64, device=device)
    seq_t, ext_t = torch.tensor(seq, device=device), torch.tensor(ext, device=device)
    if torch.device(device).type == "cuda":
        r2t, f2s = tables(device, 40)
        plan = sglang.CompressorPrefillPlan.generate(128, rid_t, seq_t, ext_t, r2t, f2s, 256, ring_size, n, True)
        return plan.plan_c, plan.plan_w
    pad = ring_size - 126 if ring_size > 128 else 0
    c, w = sglang_offline._device_records(seq_t, ext_t, n, pad, rid_t, ring_size)
    return c.view(torch.uint8), w.view(torch.uint8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ring_size", [128, 256])
def test_device_prefill_plan_records_are_sglangs_in_ragged_order(device, ring_size):
    """Device lengths (CUDA graphs, target verify): sglang's records (its order follows its atomics; here in
    ragged-row order, so byte for byte the host planner's order), both lists padded to num_q_tokens rows; rows
    past the extends (a padded bucket) plan nothing."""
    rng = np.random.default_rng(8)
    for k in range(20):
        b = int(rng.integers(1, 9))
        ext = rng.integers(1, 300, b) if k % 2 else np.full(b, 4)
        seq = ext + rng.integers(0, 600, b)
        rid = rng.permutation(40)[:b].tolist()
        n = int(ext.sum()) + (0 if k % 3 else int(rng.integers(1, 50)))
        plan_c, plan_w = _device_plan(device, seq.tolist(), ext.tolist(), rid, ring_size, n)
        c, w = prefill_plan(seq.tolist(), ext.tolist(), rid, ring_size, n, True)
        assert _bytes(plan_c) == c and _bytes(plan_w) == w
        assert by_ragged(plan_c, plan_w) == by_ragged(torch.frombuffer(bytearray(c), dtype=torch.uint8),
                                                      torch.frombuffer(bytearray(w), dtype=torch.uint8))


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_the_plans_do_not_synchronize_with_the_host():
    """As sglang's: the decode plan and the device-lengths extend plan stay on the device, the host-lengths extend
    plan sends its records in one copy from pinned memory."""
    r2t, f2s = tables("cuda", 8)
    rid = torch.tensor([3, 0, 5], device="cuda")
    seq, ext = torch.tensor([300, 128, 700]), torch.tensor([200, 128, 9])
    seq_d, ext_d = seq.cuda(), ext.cuda()  # the test's own uploads, before the region judged
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        d = sglang.CompressorDecodePlan.generate(128, rid, r2t, f2s, seq_d, 256, 128)
        h = sglang.CompressorPrefillPlan.generate(128, rid, seq, ext, r2t, f2s, 256, 128, 337)
        g = sglang.CompressorPrefillPlan.generate(128, rid, seq_d, ext_d, r2t, f2s, 256, 128, 400, True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert h.pin_buffer is not None and h.pin_buffer.is_pinned()
    assert _bytes(d.plan_d) == decode_plan(seq.tolist(), rid.tolist())
    assert (_bytes(h.plan_c), _bytes(h.plan_w)) == prefill_plan(seq.tolist(), ext.tolist(), rid.tolist())
    assert (_bytes(g.plan_c), _bytes(g.plan_w)) == prefill_plan(seq.tolist(), ext.tolist(), rid.tolist(), 128, 400,
                                                                True)


def _closing_rows(plan):
    """(row of out, seq_len) of each record whose chunk closes."""
    words = plan[1].cpu().view(torch.int32).reshape(-1, 4)
    return [(i, int(w[0])) for i, w in enumerate(words) if int(w[0]) > 0 and int(w[0]) % CHUNK == 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bf16_ring", [False, True])
@pytest.mark.parametrize("ring_size", [128, 256])
def test_decode_matches_float64_and_pydsas_own_op(device, bf16_ring, ring_size):
    """A decode step through pydsa.sglang: the closing requests' chunks within 1e-5 of float64 (every window row
    read from the ring: a bf16 ring's rounded, the new one too); ring, out and cache bytes those of
    pydsa.c128_offline_decode over the request-scoped ring (seq_lens=, slots=: pydsa's own addressing), and the
    two calls (compress_forward, compress_norm_rope_store) write the fused call's bytes."""
    seqs, rids = [128, 5, 256, 300, 512, 129], [1, 0, 3, 2, 5, 4]
    fused, two, own = (Layer(device, reqs=6, ring_size=ring_size, bf16_ring=bf16_ring, seed=2) for _ in range(3))
    for layer in (fused, two, own):
        for r, s in zip(rids, seqs):
            layer.fill(r, s - 1)
    out = fused.decode(seqs, rids)
    out2 = two.decode(seqs, rids, fused=False)
    rows = own.ring.shape[0] // ring_size * ring_size  # sglang's pool rows: not always a multiple of R
    ring = pydsa.C128Ring(own.ring[:rows], own.ape, ring_size=ring_size,
                          store=pydsa.KVCache(own.cache, own.weight, own.freq, page_size=PAGE, eps=1e-6))
    ref = torch.full((len(seqs), D), float("nan"), device=device)
    pydsa.c128_offline_decode(ring, torch.stack([own.tokens[r, s - 1] for r, s in zip(rids, seqs)]).to(device),
                              seq_lens=torch.tensor(seqs, dtype=torch.int32, device=device),
                              slots=torch.tensor(rids, dtype=torch.int32, device=device), out=ref,
                              cache_slots=torch.tensor([own.loc(r, s - 1) for r, s in zip(rids, seqs)], device=device))
    closing = [i for i, s in enumerate(seqs) if s % CHUNK == 0]
    for i in closing:
        assert rel_err(out[i].cpu().numpy(), fused.expected(rids[i], seqs[i] - 1, seqs[i])) < TOL
    assert torch.equal(out[closing], ref[closing]) and torch.equal(out2[closing], ref[closing])
    assert torch.isnan(out[[i for i in range(len(seqs)) if i not in closing]]).all()  # rows closing nothing: as given
    for layer in (fused, two):
        assert torch.equal(layer.ring, own.ring) and torch.equal(layer.cache, own.cache)
    assert not (own.cache == 0xA5).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bf16_ring", [False, True])
@pytest.mark.parametrize("graph", [False, True])
def test_extend_matches_float64_and_pydsas_own_op(device, bf16_ring, graph):
    """An extend after cached prefixes through pydsa.sglang (host plan; graph: padded to num_q_tokens): chunks
    within 1e-5 of float64 (rows below the prefix from the ring, rounded in a bf16 ring; the extend's own rows
    unrounded, as in sglang); out rows and cache bytes those of pydsa.c128_offline_extend over
    pyplan.plan_c128_offline's records, the rows sglang's plan keeps written alike; the two calls write the fused
    call's bytes."""
    seqs, exts, rids = [300, 129, 520, 128, 40], [200, 129, 390, 1, 40], [2, 0, 3, 1, 4]
    fused, two, own = (Layer(device, reqs=5, bf16_ring=bf16_ring, seed=3) for _ in range(3))
    for layer in (fused, two, own):
        for r, s, e in zip(rids, seqs, exts):
            layer.fill(r, s - e)
    out, plan = fused.extend(seqs, exts, rids, graph=graph)
    out2, _ = two.extend(seqs, exts, rids, fused=False, graph=graph)
    ring = pydsa.C128Ring(own.ring, own.ape, store=pydsa.KVCache(own.cache, own.weight, own.freq, page_size=PAGE,
                                                                eps=1e-6))
    mine = pyplan.plan_c128_offline(np.array(seqs), np.array(exts), np.array(rids), num_slots=5)
    ref = torch.full((len(mine[0]), D), float("nan"), device=device)
    pydsa.c128_offline_extend(ring, torch.cat([own.tokens[r, s - e:s] for r, s, e in zip(rids, seqs, exts)]).to(device),
                              mine.to(device), out=ref, cache_slots=torch.tensor(
                                  [own.loc(r, p) for r, s, e in zip(rids, seqs, exts) for p in range(s - e, s)],
                                  device=device))
    k = len(mine[0])
    assert len(_closing_rows(plan)) == k and torch.equal(out[:k], ref) and torch.equal(out2[:k], ref)
    assert torch.isnan(out[k:]).all()
    ragged = plan.plan_c.cpu().view(torch.int32).reshape(-1, 4)[:k, 1] & 0xFFFF
    starts = np.cumsum([0] + exts)
    for i, (row, s_len) in enumerate(_closing_rows(plan)):
        b = int(np.searchsorted(starts, int(ragged[i]), side="right") - 1)
        assert rel_err(out[row].cpu().numpy(), fused.expected(rids[b], s_len - 1, seqs[b] - exts[b])) < TOL
    kept = plan.plan_w.cpu().view(torch.int32).reshape(-1, 2)
    kept = kept[kept[:, 0] != -1, 1].long()
    assert len(kept) and torch.equal(fused.ring[kept], own.ring[kept]) and torch.equal(two.ring, fused.ring)
    assert torch.equal(fused.cache, own.cache) and torch.equal(two.cache, own.cache)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ring_size", [128, 256])
def test_chunked_prefills_and_decodes_equal_decoding_every_token(device, ring_size):
    """With an fp32 ring, a schedule of sglang's calls (a chunked prefill in two extends, the second of several
    requests at once, then decodes) leaves every chunk, in out and in the cache, byte for byte what decoding every
    token one by one leaves: sglang's write records keep every row a later call reads."""
    lengths, rids = [420, 300, 260], [1, 2, 0]
    sched, plain = (Layer(device, reqs=3, ring_size=ring_size, seed=6) for _ in range(2))
    got = {}

    def keep(out, rows_seq, who):
        for row, s in rows_seq:
            got[who[row], s // CHUNK - 1] = out[row].cpu()
    first = [130, 1, 127]
    out, plan = sched.extend(first, first, rids)
    keep(out, _closing_rows(plan), _owners(plan, first, rids))
    second = [250, 299, 200]
    exts = [s - f for s, f in zip(second, first)]
    out, plan = sched.extend(second, exts, rids, graph=True)
    keep(out, _closing_rows(plan), _owners(plan, exts, rids))
    for step in range(max(n - s for n, s in zip(lengths, second))):
        live = [b for b in range(3) if second[b] + step < lengths[b]]
        seqs = [second[b] + step + 1 for b in live]
        out = sched.decode(seqs, [rids[b] for b in live])
        keep(out, [(i, s) for i, s in enumerate(seqs) if s % CHUNK == 0], [rids[b] for b in live])
    for b in range(3):
        for p in range(1, lengths[b] + 1):
            out = plain.decode([p], [rids[b]])
            if p % CHUNK == 0:
                assert torch.equal(got.pop((rids[b], p // CHUNK - 1)), out[0].cpu()), (b, p)
    assert not got and torch.equal(sched.cache, plain.cache)


def _owners(plan, exts, rids):
    """The request of each compress record's row (by its ragged row)."""
    starts = np.cumsum([0] + list(exts))
    words = plan.plan_c.cpu().view(torch.int32).reshape(-1, 4)
    return [rids[int(np.searchsorted(starts, int(w[1]) & 0xFFFF, side="right") - 1)] if int(w[0]) != -1 else None
            for w in words]


@pytest.mark.parametrize("device", DEVICES)
def test_a_device_plan_drives_the_extend_as_the_host_plan_does(device):
    """The device-lengths plan (padded, ragged order) read in place by the extend: the host plan's out rows,
    ring and cache bytes."""
    seqs, exts, rids = [300, 129, 200], [200, 129, 3], [2, 0, 1]
    a, b = Layer(device, reqs=3, seed=9), Layer(device, reqs=3, seed=9)
    for layer in (a, b):
        for r, s, e in zip(rids, seqs, exts):
            layer.fill(r, s - e)
    out_a, plan = a.extend(seqs, exts, rids)
    out_b, _ = b.extend(seqs, exts, rids, graph=True, device_lengths=torch.device(device).type == "cuda")
    k = plan.plan_c.shape[0]
    assert torch.equal(out_a, out_b[:k]) and torch.equal(a.ring, b.ring) and torch.equal(a.cache, b.cache)


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_a_device_length_past_32_bits_becomes_a_record_the_op_skips_and_counts():
    layer = Layer("cuda", reqs=2, seed=4)
    rid = torch.tensor([0, 1], device="cuda")
    plan = sglang.CompressorDecodePlan.generate(128, rid, layer.r2t, layer.f2s,
                                                torch.tensor([2 ** 31 + 127, 128], device="cuda"), 256, 128)
    words = plan.plan_d.view(torch.int32).cpu()
    assert words[0].tolist()[:2] == [1, -1] and words[0, 3] == -1
    assert _bytes(plan.plan_d[1:]) == decode_plan([128], [1])
    pydsa.reset_error_count("cuda")
    before = layer.ring.clone()
    sglang.compress_forward(layer.ring.view(-1, 128, 2 * D), torch.randn(2, 2 * D, device="cuda"), layer.ape, plan,
                            head_dim=D, compress_ratio=128)
    torch.cuda.synchronize()
    changed = (layer.ring != before).any(dim=1).nonzero().flatten().tolist()
    assert pydsa.error_count("cuda") == 1 and changed == [CHUNK + 127]  # request 1's row only


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_bench_checks_of_p33_and_p34_run_with_pydsa_sglang_standing_in_for_sglang(device, dtype):
    """pydsa/bench/offline.py's cases and checks, on the host backend, with pydsa.sglang's compress module in
    sglang's place (its own two calls against pydsa's fused op): every check passes, and is not vacuous."""
    from pydsa.bench import offline as bench
    from pydsa.bench.reference import Reference
    from pydsa.sglang import compress as stand_in
    ref = Reference(stand_in, None)
    for closing in (False, True):
        case = bench.decode_case(ref, 6, closing, dtype, device, seed=3)
        found = bench.check(ref, case)
        assert found["within_tolerance"] and found["plan_bytes_equal"] and found["bytes_differing"] == 0, found
        assert found["ring_rows_changed"] == 6 and found["out_rows"] == case.closing
        assert (case.closing == 6 and found["cache_bytes_written"] > 1000) if closing else case.closing < 6
        assert bench.floor_us(case, 3.0) > 0
    case = bench.extend_case(ref, [300, 129, 40], [200, 129, 40], dtype, device)
    found = bench.check(ref, case)
    assert found["within_tolerance"] and found["out_rows"] == case.closing == 3 and found["ring_rows_changed"], found
    assert found["cache_bytes_written"] > 1000 and bench.floor_us(case, 3.0) > bench.floor_us(bench.decode_case(
        ref, 1, False, dtype, device), 3.0)
    case.plan.plan_w[0, 4] ^= 1  # sglang's records no longer pydsa.sglang's: the check says so
    assert not bench.check(ref, case)["plan_bytes_equal"]


def test_the_p34_ragged_draw_is_64_requests_of_1_to_600_tokens_behind_prefixes():
    """pydsa/bench/offline.py's ragged P34 case (the release rows and the ncu script draw it alike)."""
    from pydsa.bench import offline as bench
    seqs, exts = bench.ragged_case(np.random.default_rng(34))
    assert len(seqs) == len(exts) == 64 and min(exts) >= 1 and max(exts) <= 600
    assert all(s >= e for s, e in zip(seqs, exts)) and len(set(exts)) > 32
    assert bench.ragged_case(np.random.default_rng(34)) == (seqs, exts)
