"""The KV-cache store (docs/spec.md, "The store"): standalone, and fused into every op that closes a chunk.

Properties: the store of a vector equals a float64 reference written from the specification but for
last-bit flips of fp32 arithmetic (counted, at most 1e-4 of the values); GPU and host backend write the
same bytes; a fused op writes exactly the bytes of store(compress(...)) on one backend; nothing else in
the cache is written; bad slots and rotary rows are skipped (negative silently, others counted)."""
import ctypes as C

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import c_structs
import pydsa
import pyplan
from conftest import DEVICES, HAS_GPU, examples, gpu

CHUNK = 128
POISON = 0xA5


def _bf16_bits(x64):
    """Round-to-nearest-even bf16 bits of float64 values (through float32, which is exact for the
    values a bf16 rounding can tell apart here)."""
    return torch.from_numpy(np.asarray(x64, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().astype(np.uint16)


def _bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def reference_entry(x, w, eps, rot_row):
    """(fp8 codes [D-64], scale exponent bytes [D/64-1], rope bf16 bits [64]) of vector x, float64."""
    x = np.asarray(x, np.float64)
    d = x.shape[0]
    y = x / np.sqrt(np.mean(x * x) + eps) * np.asarray(w, np.float64)
    nope = _bf16_value(_bf16_bits(y[:d - 64])).reshape(-1, 64)
    amax = np.maximum(np.abs(nope).max(axis=1), 1e-4)
    e = np.ceil(np.log2(amax / 448.0))
    scaled = np.clip(nope / np.exp2(e)[:, None], -448, 448)
    codes = torch.from_numpy(scaled.astype(np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    a, b = y[d - 64::2], y[d - 63::2]
    c, s = np.asarray(rot_row[0::2], np.float64), np.asarray(rot_row[1::2], np.float64)
    rope = np.empty(64)
    rope[0::2], rope[1::2] = a * c - b * s, a * s + b * c
    return codes.reshape(-1), (e + 127).astype(np.uint8), _bf16_bits(rope)


def entry_bytes(cache, loc, d, page_size):
    """(data row, scale row) bytes of slot loc in a flat uint8 cache."""
    flat = cache.reshape(-1)
    page_bytes = pydsa.kv_page_bytes(d, page_size)
    row, srow = d + 64, (d // 64 + 7) // 8 * 8
    page, entry = divmod(int(loc), page_size)
    base = page * page_bytes
    data = flat[base + entry * row: base + (entry + 1) * row]
    scale = flat[base + page_size * row + entry * srow: base + page_size * row + (entry + 1) * srow]
    return data, scale


def make_cache(d, page_size, num_pages, num_positions, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    cache = torch.full((num_pages, pydsa.kv_page_bytes(d, page_size)), POISON, dtype=torch.uint8)
    w = (torch.rand(d, generator=gen) * 1.5 + 0.25)
    angles = torch.rand(num_positions, 32, generator=gen) * 6.3
    rot = torch.stack([angles.cos(), angles.sin()], dim=-1).reshape(num_positions, 64)
    return pydsa.KVCache(cache.to(device), w.to(device), rot.to(device), page_size=page_size, eps=1e-6)


def compare_to_reference(kv, vectors, positions, slots):
    """Counts of (fp8 code flips, scale flips, rope values off by one bf16 step); asserts nothing else
    differs and every flip is one step."""
    cache = kv.cache.cpu().numpy()
    w, rot = kv.norm_weight.cpu().numpy(), kv.rotary.cpu().numpy()
    d = kv.head_dim
    code_flips = scale_flips = rope_steps = 0
    for x, pos, loc in zip(vectors, positions, slots):
        codes, scales, rope = reference_entry(x, w, kv.eps, rot[pos])
        data, srow = entry_bytes(cache, loc, d, kv.page_size)
        got_codes, got_rope = data[:d - 64], data[d - 64:].view(np.uint16)
        got_scales = srow[:d // 64 - 1]
        scale_flips += int((got_scales != scales).sum())
        assert np.all(np.abs(got_scales.astype(int) - scales.astype(int)) <= 1)
        same_scale = np.repeat(got_scales == scales, 64)
        diff = np.abs(got_codes.astype(int) - codes.astype(int))
        code_flips += int((diff[same_scale] != 0).sum())
        assert np.all(diff[same_scale] <= 1), "an fp8 code more than one step off"
        rd = np.abs(got_rope.astype(np.int32) - rope.astype(np.int32))
        rope_steps += int((rd != 0).sum())
        assert np.all(rd <= 1), "a rope value more than one bf16 step off"
        assert srow[d // 64 - 1:].tolist() == [POISON] * (len(srow) - (d // 64 - 1)), "the pad byte was written"
    return code_flips, scale_flips, rope_steps


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [512, 256, 192])
def test_store_matches_float64_reference_but_for_counted_last_bit_flips(device, d):
    torch.manual_seed(d)
    n, page_size = 67, 2
    kv = make_cache(d, page_size, num_pages=50, num_positions=300, device=device)
    vectors = torch.randn(n, d) * torch.rand(n, 1) * 4
    vectors[3] = 0.0  # a zero vector: the scale floor
    vectors[4, :64] *= 1e-6  # a tiny group: subnormal fp8 codes
    slots = torch.randperm(50 * page_size)[:n].to(torch.int64)
    positions = torch.randint(0, 300, (n,), dtype=torch.int32)
    pydsa.kv_store(vectors.to(device), positions.to(device), slots.to(device), kv)
    flips = compare_to_reference(kv, vectors.numpy(), positions.numpy(), slots.numpy())
    values = n * d
    assert sum(flips) <= max(1, 1e-4 * values), flips
    # entries of slots nobody stored keep their poison
    cache = kv.cache.cpu().numpy()
    untouched = sorted(set(range(50 * page_size)) - set(slots.tolist()))
    for loc in untouched[:20]:
        data, srow = entry_bytes(cache, loc, d, page_size)
        assert (data == POISON).all() and (srow == POISON).all()


@gpu
@pytest.mark.parametrize("d", [512, 256, 192, 320, 640])
@pytest.mark.parametrize("spread", ["normal", "wide"])
def test_store_gpu_writes_the_host_backends_bytes(d, spread):
    # d: powers of two (the mean as a product) and not (a division); 3, 5 and 10 groups of 64 (every
    # branch of the group total); 2 and 4 channels per thread. "wide": magnitudes over 2^-24..2^8 in
    # every group, so the codes span every binade, the subnormal codes and their rounding ties.
    torch.manual_seed(7 + d)
    n = 301
    host = make_cache(d, 2, 200, 1000, "cpu")
    dev = make_cache(d, 2, 200, 1000, "cuda")
    vectors = torch.randn(n, d) * 3
    if spread == "wide":
        vectors *= torch.exp2(torch.randint(-24, 8, (n, d)).float())
    slots = torch.randperm(400)[:n].to(torch.int64)
    positions = torch.randint(0, 1000, (n,), dtype=torch.int32)
    pydsa.kv_store(vectors, positions, slots, host)
    pydsa.kv_store(vectors.cuda(), positions.cuda(), slots.cuda(), dev)
    assert torch.equal(host.cache, dev.cache.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_store_skips_bad_slots_and_positions(device):
    d, page_size, pages = 512, 2, 4
    kv = make_cache(d, page_size, pages, 10, device)
    vectors = torch.randn(5, d).to(device)
    slots = torch.tensor([-1, 8, 3, 2**40, 1], dtype=torch.int64, device=device)  # 8: one past the cache
    positions = torch.tensor([0, 0, 10, 1, -1], dtype=torch.int32, device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    pydsa.kv_store(vectors, positions, slots, kv, error_count=counter)
    assert int(counter.item()) == 4  # past the cache (2), rotary row 10 and -1; the negative slot silently
    assert (kv.cache.cpu().numpy() == POISON).all()


@pytest.mark.parametrize("device", DEVICES)
def test_store_is_deterministic(device):
    d = 512
    a, b = make_cache(d, 2, 40, 200, device), make_cache(d, 2, 40, 200, device)
    vectors = (torch.randn(64, d) * 2).to(device)
    slots = torch.arange(64, dtype=torch.int64, device=device)
    positions = torch.arange(64, dtype=torch.int32, device=device)
    pydsa.kv_store(vectors, positions, slots, a)
    pydsa.kv_store(vectors, positions, slots, b)
    assert torch.equal(a.cache, b.cache)


def _records(words):
    return torch.tensor(np.array(words, dtype=np.int64).astype(np.uint32).view(np.int32)).view(torch.uint8).reshape(-1, 16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ahead", [False, True], ids=["records", "records-ahead"])
def test_store_reads_sglang_records_in_place(device, ahead):
    """records= (sglang 0.5.23's plan records) gives each vector's position and slot: the bytes of the
    store with the same positions and slots given as arrays; what closes nothing or pads is skipped, a
    slot index past cache_slots or an extend record too short to close a chunk is counted."""
    d, pages, rows = 512, 40, 7
    vectors = (torch.randn(rows, d, generator=torch.Generator().manual_seed(3)) * 2).to(device)
    out_loc = torch.tensor([11, 3, 70, 5, 60, 1, 9, 33, 2], dtype=torch.int64)
    # decode records {seq_len, slot, load slot, -1}: rows closing a chunk at 128, 384 and 1280; 0, 300, 129
    # and 2^31 + 128 (not a length) close none
    seq = [128, 0, 300, 384, 129, 1280, 2**31 + 128]
    dec = _records([[s, 0, 0, -1] for s in seq])
    keep = [i for i, s in enumerate(seq) if 0 < s < 2**31 and s % 128 == 0]
    # extend records {seq_len, ragged | len << 16, store slot, load slot}: padding, a ragged row past
    # out_loc (counted), a record of seq_len 100 (counted)
    ext_words = [[256, 4 | 128 << 16, 0, 0], [0xFFFFFFFF, 0, -1, -1], [128, 8 | 5 << 16, 0, 0],
                 [640, 12 | 1 << 16, 0, 0], [100, 2 | 1 << 16, 0, 0], [1024, 0 | 3 << 16, 0, 0]]
    ext = _records(ext_words)
    for extend, rec, want_pos, want_loc, counted in (
            (False, dec, [seq[i] - 128 for i in keep], [int(out_loc[i]) for i in keep], 0),
            (True, ext, [128, 0, 896], [int(out_loc[4]), int(out_loc[8]), int(out_loc[0])], 2)):
        a, b = make_cache(d, 2, pages, 2048, device), make_cache(d, 2, pages, 2048, device)
        counter = torch.zeros(1, dtype=torch.int32, device=device)
        pydsa.kv_store(vectors, None, out_loc.to(device), a, records=rec.to(device), extend=extend, ratio=128,
                       error_count=counter, records_ahead=ahead)
        rows_kept = keep if not extend else [0, 2, 5]
        pydsa.kv_store(vectors[rows_kept], torch.tensor(want_pos, dtype=torch.int32, device=device),
                       torch.tensor(want_loc, dtype=torch.int64, device=device), b)
        assert torch.equal(a.cache, b.cache) and not (b.cache == POISON).all()
        assert int(counter.item()) == counted
    with pytest.raises(pydsa.ArgumentValueError, match="records_ahead=True needs records=") as err:
        pydsa.kv_store(vectors, torch.zeros(rows, dtype=torch.int32, device=device), out_loc[:rows].to(device),
                       make_cache(d, 2, pages, 2048, device), records_ahead=True)
    assert err.value.argument == "records_ahead"
    with pytest.raises(pydsa.ArgumentTypeError, match="records_ahead must be a bool") as err:
        pydsa.kv_store(vectors, None, out_loc.to(device), make_cache(d, 2, pages, 2048, device),
                       records=torch.zeros(rows, 16, dtype=torch.uint8, device=device), ratio=128, records_ahead="yes")
    assert err.value.argument == "records_ahead"
    with pytest.raises(ValueError, match="positions must be None"):
        pydsa.kv_store(vectors, torch.zeros(rows, dtype=torch.int32, device=device), out_loc.to(device),
                       make_cache(d, 2, pages, 2048, device), records=dec.to(device), ratio=128)
    with pytest.raises(ValueError, match="records has 7 rows but vectors only 2"):
        pydsa.kv_store(vectors[:2], None, out_loc.to(device), make_cache(d, 2, pages, 2048, device),
                       records=dec.to(device), ratio=128)


def test_store_argument_errors():
    kv = make_cache(512, 2, 4, 10, "cpu")
    with pytest.raises(TypeError, match="cache must be a pydsa.KVCache"):
        pydsa.kv_store(torch.zeros(1, 512), torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), None)
    with pytest.raises(TypeError, match="cache_slots must have dtype torch.int64"):
        pydsa.kv_store(torch.zeros(1, 512), torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), kv)
    with pytest.raises(ValueError, match="whole 1728-byte pages"):
        pydsa.KVCache(torch.zeros(1000, dtype=torch.uint8), torch.ones(512), torch.zeros(4, 64), page_size=2)
    with pytest.raises(ValueError, match="a store needs D a multiple of 64"):
        pydsa.KVCache(torch.zeros(1728, dtype=torch.uint8), torch.ones(100), torch.zeros(4, 64), page_size=2)
    with pytest.raises(pydsa.DsaError, match="page_size is 3"):
        k = pydsa.KVCache(torch.zeros(1728 * 4, dtype=torch.uint8), torch.ones(512), torch.zeros(4, 64), page_size=2)
        c_structs.kv_cache(k).page_size = 3
        pydsa.kv_store(torch.zeros(1, 512), torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64), k)
    state = torch.zeros(4, 1, 3 * 512)
    with pytest.raises(ValueError, match="cache_slots is None but store= is given"):
        pydsa.c128_decode(state, torch.zeros(1, 1024), None, torch.zeros(128, 512), torch.zeros(1, dtype=torch.int32),
                          torch.ones(1, dtype=torch.int32), store=kv)


# ---- fused: decode, verify, prefill ---------------------------------------------------------------


def _decode_run(device, state_dtype, d, b, steps, store, seed):
    """Decode `steps` tokens for b requests from random lengths; returns the per-step outs (closing rows
    only, NaN elsewhere), and runs with store= when given."""
    gen = torch.Generator().manual_seed(seed)
    state = (torch.randn(b + 2, 1, 3 * d, generator=gen) * 0.1).to(state_dtype).to(device)
    ape = torch.randn(CHUNK, d, generator=gen).to(device)
    seq = torch.randint(100, 400, (b,), generator=gen, dtype=torch.int32)
    idx = torch.randperm(b + 2, generator=gen)[:b].to(torch.int32).to(device)
    outs, closers = [], []
    for step in range(steps):
        seq += 1
        kv = torch.randn(b, 2 * d, generator=gen).to(device)
        out = torch.full((b, d), float("nan"), device=device)
        slots = (torch.arange(b, dtype=torch.int64) + step * b).to(device)
        if store is not None:
            pydsa.c128_decode(state, kv, out, ape, idx, seq.to(device), store=store, cache_slots=slots)
        else:
            pydsa.c128_decode(state, kv, out, ape, idx, seq.to(device))
        outs.append(out.cpu())
        closers.append([(r, int(seq[r]) - CHUNK, step * b + r) for r in range(b) if int(seq[r]) % CHUNK == 0])
    return outs, closers


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
# On an H200 (132 SMs) batches from 396 requests take the storing decode's 4-channel layout: at D = 512
# one request per block (D a compiled constant), at 256 two (barrier ids), at 128 four (one warp each);
# smaller batches 2 channels per thread.
@pytest.mark.parametrize("d,b,steps", [(512, 37, 40), (512, 600, 4), (256, 600, 4), (128, 1000, 3)])
def test_fused_decode_writes_the_bytes_of_store_after_decode(device, state_dtype, d, b, steps):
    fused = make_cache(d, 2, (b * steps + 1) // 2 + 1, 600, device)
    two = make_cache(d, 2, (b * steps + 1) // 2 + 1, 600, device)
    outs_f, closers = _decode_run(device, state_dtype, d, b, steps, fused, seed=3)
    outs_p, _ = _decode_run(device, state_dtype, d, b, steps, None, seed=3)
    closed = 0
    for step, (of, op, cl) in enumerate(zip(outs_f, outs_p, closers)):
        assert torch.equal(of.nan_to_num(7.0), op.nan_to_num(7.0))  # out written exactly as without a store
        if cl:
            rows = torch.tensor([r for r, _, _ in cl])
            pydsa.kv_store(op[rows].to(device), torch.tensor([p for _, p, _ in cl], dtype=torch.int32).to(device),
                           torch.tensor([s for _, _, s in cl], dtype=torch.int64).to(device), two)
            closed += len(cl)
    assert closed > 5
    assert torch.equal(fused.cache.cpu(), two.cache.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_fused_decode_without_out(device):
    d, b = 512, 5
    kv_cache = make_cache(d, 2, 8, 300, device)
    state = torch.randn(b, 1, 3 * d).to(device)
    ape = torch.randn(CHUNK, d).to(device)
    seq = torch.tensor([128, 256, 5, 0, 384], dtype=torch.int32, device=device)
    idx = torch.arange(b, dtype=torch.int32, device=device)
    kv = torch.randn(b, 2 * d).to(device)
    slots = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int64, device=device)
    pydsa.c128_decode(state, kv, None, ape, idx, seq, store=kv_cache, cache_slots=slots)
    out = torch.full((b, d), float("nan"), device=device)
    ref = make_cache(d, 2, 8, 300, device)
    pydsa.c128_decode(state.clone(), kv, out, ape, idx, seq)  # state of closing rows is not written either way
    rows = torch.tensor([0, 1, 4])
    pydsa.kv_store(out[rows.to(device)], (seq[rows.to(device)] - CHUNK).to(torch.int32), slots[rows.to(device)], ref)
    assert torch.equal(kv_cache.cache.cpu(), ref.cache.cpu())
    data, _ = entry_bytes(kv_cache.cache.cpu().numpy(), 2, d, 2)
    assert (data == POISON).all()  # rows that close no chunk store nothing


@pytest.mark.parametrize("device", DEVICES)
@given(seed=st.integers(0, 2**31 - 1), v=st.integers(1, 8))
@settings(max_examples=examples(12))
def test_fused_verify_stores_what_its_drafts_close(device, seed, v):
    d, b = 512, 9
    gen = torch.Generator().manual_seed(seed)
    state = torch.randn(b + b * (v + 1), 1, 3 * d, generator=gen).to(device)
    ape = torch.randn(CHUNK, d, generator=gen).to(device)
    seq = torch.randint(0, 300, (b,), generator=gen, dtype=torch.int32)
    seq[0] = CHUNK - 1  # the first draft closes
    seq[1] = -1         # padding
    seq[2] = 0          # no committed tokens yet
    drafts = torch.randn(b * v, 2 * d, generator=gen).to(device)
    idx = torch.arange(b, dtype=torch.int32, device=device)
    bank = (b + torch.arange(b, dtype=torch.int32) * (v + 1)).to(device)
    slots = torch.randperm(b * v, generator=gen).to(torch.int64).to(device)
    fused = make_cache(d, 2, b * v, 400, device)
    out_f = torch.full((b * v, d), float("nan"), device=device)
    s1 = state.clone()
    pydsa.c128_verify(s1, drafts, out_f, ape, idx, seq.to(device), bank, verify_lens=None, store=fused,
                      cache_slots=slots)
    s2 = state.clone()
    out = torch.full((b * v, d), float("nan"), device=device)
    pydsa.c128_verify(s2, drafts, out, ape, idx, seq.to(device), bank)
    assert torch.equal(s1, s2) and torch.equal(out_f.nan_to_num(7.0), out.nan_to_num(7.0))
    rows = [r * v + j for r in range(b) for j in range(v) if int(seq[r]) >= 0 and (int(seq[r]) + j) % CHUNK == CHUNK - 1]
    ref = make_cache(d, 2, b * v, 400, device)
    if rows:
        rt = torch.tensor(rows)
        pos = torch.tensor([int(seq[r // v]) + r % v - (CHUNK - 1) for r in rows], dtype=torch.int32)
        pydsa.kv_store(out[rt.to(device)], pos.to(device), slots[rt.to(device)], ref)
    assert torch.equal(fused.cache.cpu(), ref.cache.cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [512, 256])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("plan_kind", ["host", "device"])
def test_fused_prefill_writes_the_bytes_of_store_after_prefill(device, d, state_dtype, plan_kind):
    rng = np.random.default_rng(5 + d)
    seq = np.array([700, 129, 128, 300, 40, 1500, 255], np.int64)
    ext = np.array([650, 129, 1, 200, 40, 1400, 127], np.int64)
    n = int(ext.sum())
    host_plan = pyplan.plan_prefill(seq, ext)
    if plan_kind == "device":
        plan = pydsa.DevicePlan(n, len(seq), device=device).plan(seq, ext)
    else:
        plan = host_plan
    kv = torch.from_numpy(rng.standard_normal((n, 2 * d), dtype=np.float32)).to(device)
    ape = torch.randn(CHUNK, d).to(device)
    state = torch.randn(len(seq), 1, 3 * d).to(state_dtype).to(device)
    idx = torch.arange(len(seq), dtype=torch.int32, device=device)
    slots = torch.from_numpy(rng.permutation(n)).to(torch.int64).to(device)
    slots[3] = -1  # a negative slot is skipped
    fused = make_cache(d, 2, n // 2 + 1, 1600, device)
    out_f = torch.full((n, d), float("nan"), device=device)
    s_f = state.clone()
    pydsa.c128_prefill(s_f, kv, out_f, ape, idx, plan, store=fused, cache_slots=slots)
    out = torch.full((n, d), float("nan"), device=device)
    s_p = state.clone()
    pydsa.c128_prefill(s_p, kv, out, ape, idx, plan)
    # A storing prefill runs the plain prefill's launches, then stores from out: the same vectors and states.
    assert torch.equal(out.isnan(), out_f.isnan())
    assert torch.equal(s_f, s_p)
    assert torch.equal(out.nan_to_num(7.0), out_f.nan_to_num(7.0))
    rows, pos = [], []
    off = 0
    for s_, e_ in zip(seq, ext):
        for p in range(int(s_ - e_), int(s_)):
            if p % CHUNK == CHUNK - 1:
                rows.append(off + p - int(s_ - e_)), pos.append(p - (CHUNK - 1))
        off += int(e_)
    assert len(rows) == len(host_plan[0])
    ref = make_cache(d, 2, n // 2 + 1, 1600, device)
    pydsa.kv_store(out_f[rows], torch.tensor(pos, dtype=torch.int32, device=device), slots[rows], ref)
    assert torch.equal(fused.cache.cpu(), ref.cache.cpu())
    compact = make_cache(d, 2, n // 2 + 1, 1600, device)
    pydsa.c128_prefill(state.clone(), kv, None, ape, idx, plan, compact=True, store=compact, cache_slots=slots)
    assert torch.equal(compact.cache.cpu(), ref.cache.cpu())


def _closing_rows(seq, ext):
    """(ragged rows that close a chunk, their chunks' first positions) of a prefill, in plan order."""
    rows, pos, off = [], [], 0
    for s_, e_ in zip(seq, ext):
        for p in range(int(s_ - e_), int(s_)):
            if p % CHUNK == CHUNK - 1:
                rows.append(off + p - int(s_ - e_)), pos.append(p - (CHUNK - 1))
        off += int(e_)
    return rows, pos


def _prefill_case(requests, rng, d=512):
    """A prefill of `requests` requests, each closing exactly one chunk (random prefixes and tails)."""
    seq = (rng.integers(1, 4, requests) * CHUNK + rng.integers(0, CHUNK, requests)).astype(np.int64)
    ext = (seq % CHUNK + 1 + rng.integers(0, 100, requests)).astype(np.int64)
    n = int(ext.sum())
    kv = torch.from_numpy(rng.standard_normal((n, 2 * d), dtype=np.float32)).cuda()
    state = torch.randn(requests, 1, 3 * d, device="cuda")
    state[:, :, d:2 * d].uniform_(1, 30)
    return seq, ext, n, kv, state, torch.randn(CHUNK, d, device="cuda"), torch.arange(requests, dtype=torch.int32,
                                                                                          device="cuda")


@gpu
@pytest.mark.parametrize("requests", [1, 5, 50, 300], ids=["tiny", "mid-one-launch", "wide-one-launch", "wide-passes"])
def test_fused_prefill_on_every_tile_layout_stores_its_out(requests):
    # Each request closes one chunk and most keep a trailing partial, so the plan has about 2 records
    # per request. On an H200 (132 SMs) that is 8-channel tiles (1 request), one launch of both lists
    # in 64- or 128-channel tiles (5, 50), and two passes in 128-channel tiles (300: more than one
    # launch holds; two store launches).
    rng = np.random.default_rng(requests)
    d = 512
    seq, ext, n, kv, state, ape, idx = _prefill_case(requests, rng)
    plan = pyplan.plan_prefill(seq, ext)
    rows, pos = _closing_rows(seq, ext)
    assert len(rows) == len(plan[0])
    slots = torch.from_numpy(rng.permutation(n)).to(torch.int64).cuda()
    fused = make_cache(d, 2, n // 2 + 1, 1000, "cuda")
    out = torch.full((n, d), float("nan"), device="cuda")
    pydsa.c128_prefill(state.clone(), kv, out, ape, idx, plan, store=fused, cache_slots=slots)
    ref = make_cache(d, 2, n // 2 + 1, 1000, "cuda")
    pydsa.kv_store(out[rows], torch.tensor(pos, dtype=torch.int32, device="cuda"), slots[rows], ref)
    assert torch.equal(fused.cache, ref.cache)
    plain = torch.full((n, d), float("nan"), device="cuda")
    pydsa.c128_prefill(state.clone(), kv, plain, ape, idx, plan)
    assert torch.equal(out.nan_to_num(7.0), plain.nan_to_num(7.0))
    # a device plan (its launches and tiles may differ from the host plan's: another order of the same
    # sums), with out given, then with out rows of its own: the store of its out, bit for bit
    dplan = pydsa.DevicePlan(n, requests, device="cuda").plan(seq, ext)
    dout = torch.full((n, d), float("nan"), device="cuda")
    given, own = make_cache(d, 2, n // 2 + 1, 1000, "cuda"), make_cache(d, 2, n // 2 + 1, 1000, "cuda")
    pydsa.c128_prefill(state.clone(), kv, dout, ape, idx, dplan, store=given, cache_slots=slots)
    pydsa.c128_prefill(state.clone(), kv, None, ape, idx, dplan, store=own, cache_slots=slots)
    dref = make_cache(d, 2, n // 2 + 1, 1000, "cuda")
    pydsa.kv_store(dout[rows], torch.tensor(pos, dtype=torch.int32, device="cuda"), slots[rows], dref)
    assert torch.equal(given.cache, dref.cache) and torch.equal(own.cache, dref.cache)
    assert torch.allclose(dout[rows], out[rows], rtol=1e-5, atol=1e-6)


@gpu
def test_a_storing_prefill_without_out_on_another_stream_keeps_its_rows_until_it_ran():
    # The call's own out rows are released right after its launch on `stream`; torch must not hand them to
    # the current stream while that launch is still queued (here behind a long sleep on the side stream).
    rng = np.random.default_rng(11)
    d = 512
    seq, ext, n, kv, state, ape, idx = _prefill_case(50, rng)
    plan = pyplan.plan_prefill(seq, ext)
    slots = torch.from_numpy(rng.permutation(n)).to(torch.int64).cuda()
    ref, own = make_cache(d, 2, n // 2 + 1, 1000, "cuda"), make_cache(d, 2, n // 2 + 1, 1000, "cuda")
    pydsa.c128_prefill(state.clone(), kv, None, ape, idx, plan, store=ref, cache_slots=slots)
    side, start = torch.cuda.Stream(), state.clone()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
    pydsa.c128_prefill(start, kv, None, ape, idx, plan, store=own, cache_slots=slots, stream=side.cuda_stream)
    victim = torch.full((len(plan[0]), d), 7.0, device="cuda")  # the size of the call's own rows
    torch.cuda.synchronize()
    assert (victim == 7.0).all()
    assert torch.equal(own.cache, ref.cache)


@gpu
def test_fused_prefill_with_repeated_and_bad_slots_stays_in_bounds():
    rng = np.random.default_rng(3)
    d, requests = 512, 40
    seq, ext, n, kv, state, ape, idx = _prefill_case(requests, rng)
    plan = pyplan.plan_prefill(seq, ext)
    rows, pos = _closing_rows(seq, ext)
    capacity = 2 * requests + 2
    named = rng.permutation(capacity - 2)[:requests].astype(np.int64)
    named[1] = named[0]            # two vectors name one slot: either may land, nothing else is written
    named[2] = -1                  # not held here: skipped
    named[3] = capacity            # past the cache: skipped and counted
    named[4] = 2**40
    slots = torch.full((n,), -7, dtype=torch.int64)
    slots[rows] = torch.from_numpy(named)
    kvc = make_cache(d, 2, capacity // 2, 1000, "cuda")
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.full((n, d), float("nan"), device="cuda")
    pydsa.c128_prefill(state.clone(), kv, out, ape, idx, plan, store=kvc, cache_slots=slots.cuda(), error_count=errors)
    assert int(errors.item()) == 2
    ref = make_cache(d, 2, capacity // 2, 1000, "cuda")
    good = [i for i in range(5, requests)]
    pydsa.kv_store(out[[rows[i] for i in good]], torch.tensor([pos[i] for i in good], dtype=torch.int32, device="cuda"),
                   torch.from_numpy(named[good]).cuda(), ref)
    got, want = kvc.cache.cpu().numpy(), ref.cache.cpu().numpy()
    for loc in range(capacity):
        g, w = entry_bytes(got, loc, d, 2), entry_bytes(want, loc, d, 2)
        if loc == named[0]:
            continue
        assert np.array_equal(g[0], w[0]) and np.array_equal(g[1], w[1]), loc
    # the same call with every slot its own then stores every entry
    slots[rows] = torch.arange(requests, dtype=torch.int64)
    kvc.cache.fill_(POISON)
    pydsa.c128_prefill(state.clone(), kv, out, ape, idx, plan, store=kvc, cache_slots=slots.cuda())
    ref = make_cache(d, 2, capacity // 2, 1000, "cuda")
    pydsa.kv_store(out[rows], torch.tensor(pos, dtype=torch.int32, device="cuda"), slots[rows].cuda(), ref)
    assert torch.equal(kvc.cache, ref.cache)


@gpu
def test_fused_prefill_graph_replays_store_the_same_bytes():
    rng = np.random.default_rng(8)
    d, requests = 512, 24
    seq, ext, n, kv, state0, ape, idx = _prefill_case(requests, rng)
    dplan = pydsa.DevicePlan(n, requests, device="cuda").plan(seq, ext)
    slots = torch.from_numpy(rng.permutation(n)).to(torch.int64).cuda()
    kvc = make_cache(d, 2, n // 2 + 1, 1000, "cuda")
    state = state0.clone()
    op = pydsa.C128Prefill(state, kv, None, ape, idx, dplan, store=kvc, cache_slots=slots)
    op.launch()
    torch.cuda.synchronize()
    first = kvc.cache.clone()
    assert not (first == POISON).all()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        op.launch()
    for _ in range(3):
        state.copy_(state0)
        kvc.cache.fill_(POISON)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(first, kvc.cache)
    host = make_cache(d, 2, n // 2 + 1, 1000, "cpu")
    pydsa.c128_prefill(state0.cpu(), kv.cpu(), None, ape.cpu(), idx.cpu(), pyplan.plan_prefill(seq, ext), store=host,
                       cache_slots=slots.cpu())
    assert (host.cache != first.cpu()).sum().item() <= 1e-4 * first.numel()


@gpu
def test_a_storing_prefill_on_the_gpu_needs_out():
    from c_structs import C128PrefillParams as PrefillParams
    from pydsa import _read
    d = 512
    seq, ext = np.array([300], np.int64), np.array([300], np.int64)
    plan = pyplan.plan_prefill(seq, ext)
    state, kv = torch.randn(1, 1, 3 * d, device="cuda"), torch.randn(300, 2 * d, device="cuda")
    ape, idx = torch.randn(CHUNK, d, device="cuda"), torch.zeros(1, dtype=torch.int32, device="cuda")
    slots = torch.arange(300, dtype=torch.int64, device="cuda")
    kvc = make_cache(d, 2, 200, 400, "cuda")
    out = torch.empty(300, d, device="cuda")
    prepared = pydsa.C128Prefill(state, kv, out, ape, idx, plan, store=kvc, cache_slots=slots)
    buf = (C.c_char * C.sizeof(PrefillParams)).from_buffer_copy(prepared._params)
    PrefillParams.from_buffer(buf).out = None
    status = _read.launch_prepared(_read.OPS["prefill"], C.addressof(buf), 0, None)
    with pytest.raises(pydsa.DsaError, match="out is null; a storing prefill on the GPU"):
        pydsa._abi.check(status)
    assert (kvc.cache == POISON).all()


@gpu
def test_fused_prefill_gpu_matches_the_host_backend():
    d = 512
    rng = np.random.default_rng(9)
    seq = rng.integers(1, 3000, 40).astype(np.int64)
    ext = np.minimum(seq, rng.integers(1, 700, 40)).astype(np.int64)
    n = int(ext.sum())
    plan = pyplan.plan_prefill(seq, ext)
    kv = torch.from_numpy(rng.standard_normal((n, 2 * d), dtype=np.float32))
    ape, state = torch.randn(CHUNK, d), torch.randn(40, 1, 3 * d)
    idx = torch.arange(40, dtype=torch.int32)
    slots = torch.from_numpy(rng.permutation(n)).to(torch.int64)
    caches = {}
    for dev in ("cpu", "cuda"):
        caches[dev] = make_cache(d, 2, n // 2 + 1, 3000, dev)
        pydsa.c128_prefill(state.clone().to(dev), kv.to(dev), None, ape.to(dev), idx.to(dev), plan, store=caches[dev],
                           cache_slots=slots.to(dev))
    host, dev_bytes = caches["cpu"].cache, caches["cuda"].cache.cpu()
    assert (host != dev_bytes).sum().item() <= 1e-4 * host.numel()


@gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_decode_gpu_writes_the_host_backends_bytes(state_dtype):
    d, b, steps = 512, 300, 6
    caches = {dev: make_cache(d, 2, b * steps // 2 + 1, 600, dev) for dev in ("cpu", "cuda")}
    for dev, kvc in caches.items():
        _decode_run(dev, state_dtype, d, b, steps, kvc, seed=11)
    host, gpu_bytes = caches["cpu"].cache, caches["cuda"].cache.cpu()
    mismatch = (host != gpu_bytes).sum().item()
    # GPU and host agree to fp32 rounding of the compression; the store of equal vectors is bitwise
    # equal, so a difference can only come from a vector that differs in its last bits.
    assert mismatch <= 1e-4 * host.numel(), mismatch


@gpu
def test_fused_decode_graph_replay():
    d, b = 512, 64
    kvc = make_cache(d, 2, b, 600, "cuda")
    state = torch.randn(b, 1, 3 * d, device="cuda")
    ape = torch.randn(CHUNK, d, device="cuda")
    seq = torch.full((b,), CHUNK, dtype=torch.int32, device="cuda")
    idx = torch.arange(b, dtype=torch.int32, device="cuda")
    kv = torch.randn(b, 2 * d, device="cuda")
    slots = torch.arange(b, dtype=torch.int64, device="cuda")
    op = pydsa.C128Decode(state, kv, None, ape, idx, seq, store=kvc, cache_slots=slots)
    op.launch()
    torch.cuda.synchronize()
    first = kvc.cache.clone()
    kvc.cache.fill_(POISON)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        op.launch()
    kvc.cache.fill_(POISON)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(first, kvc.cache)


def test_storing_calls_through_every_reader_write_the_same_bytes():
    """A storing decode, verify, prefill and standalone store write the same bytes whether the filler
    reads the tensors through the exchange API, through their attributes (an older torch), or the
    reader views numpy arrays through DLPack; and the filler itself refuses a store it cannot take, by name."""
    from pydsa import _read
    d, b = 512, 6
    gen = torch.Generator().manual_seed(4)
    state = torch.randn(4 * b, 1, 3 * d, generator=gen)
    ape, kv = torch.randn(CHUNK, d, generator=gen), torch.randn(b, 2 * d, generator=gen)
    idx = torch.arange(b, dtype=torch.int32)
    seq = torch.tensor([128, 256, 3, 384, 1, 512], dtype=torch.int32)
    slots = torch.arange(b, dtype=torch.int64)
    bank = torch.arange(b, dtype=torch.int32) + b
    drafts, vslots = torch.randn(b * 2, 2 * d, generator=gen), torch.arange(2 * b, dtype=torch.int64)
    seq_v = torch.tensor([127, 126, 0, 255, 3, 1], dtype=torch.int32)
    pseq, pext = np.array([300, 130], np.int64), np.array([300, 129], np.int64)
    plan = pyplan.plan_prefill(pseq, pext)
    kvp, pslots = torch.randn(429, 2 * d, generator=gen), torch.arange(429, dtype=torch.int64)
    vectors, positions = torch.randn(b, d, generator=gen), torch.arange(b, dtype=torch.int32) * 7

    def run(to):
        cache, st = make_cache(d, 2, 512, 600, "cpu"), state.clone()
        pydsa.c128_decode(st, to(kv), None, to(ape), to(idx), to(seq), store=cache, cache_slots=to(slots))
        pydsa.c128_verify(st, to(drafts), None, to(ape), to(idx), to(seq_v), to(bank), store=cache,
                          cache_slots=to(vslots) + 8)
        pydsa.c128_prefill(st, to(kvp), None, to(ape), to(idx[:2]), plan, store=cache, cache_slots=to(pslots) + 24)
        pydsa.kv_store(to(vectors), to(positions), to(slots) + 500, cache)
        return cache.cache, st

    fast = run(lambda t: t)
    _read.read_attributes_only(True)
    try:
        attributes = run(lambda t: t)
    finally:
        _read.read_attributes_only(False)
    converted = run(lambda t: t.numpy())
    assert not (fast[0] == POISON).all()
    for other in (attributes, converted):
        assert torch.equal(fast[0], other[0]) and torch.equal(fast[1], other[1])
    errors = torch.zeros(1, dtype=torch.int32)
    cache = make_cache(d, 2, 4, 600, "cpu")
    # cache_slots without a store, or of the wrong dtype: refused by name, nothing written
    before = cache.cache.clone()
    with pytest.raises(ValueError, match="cache_slots is given without store="):
        pydsa.c128_decode(state, kv, None, ape, idx, seq, error_count=errors, cache_slots=slots)
    with pytest.raises(TypeError, match="cache_slots must have dtype torch.int64"):
        pydsa.c128_decode(state, kv, None, ape, idx, seq, error_count=errors, store=cache,
                          cache_slots=slots.int())
    with pytest.raises(TypeError, match="cache_slots must have dtype torch.int64"):
        pydsa.kv_store(vectors, positions, slots.int(), cache, error_count=errors)
    assert torch.equal(cache.cache, before)


def test_buffer_key_tells_apart_every_view_pydsa_would_read_differently():
    """pydsa.buffer_key (the key of a cache of pydsa objects per buffer): the same memory read the same way gives
    one key, whatever tensor object carries it; another dtype, shape, layout or rank at the same address another;
    what pydsa cannot read is refused, naming t."""
    c = torch.zeros(8, 1200, dtype=torch.uint8)
    keys = [pydsa.buffer_key(v) for v in (c, c.view(8, 1200), c.t(), c.view(torch.int8), c[:4], c.view(-1),
                                          c.view(2, 4, 1200), c.view(2, 2, 2, 1200), c.view(2, 2, 2, 600, 2))]
    assert keys[0] == keys[1] and len(set(keys[1:])) == len(keys) - 1
    with pytest.raises(pydsa.ArgumentTypeError) as err:
        pydsa.buffer_key("not a tensor")
    assert err.value.argument == "t"
