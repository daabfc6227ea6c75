"""Decode-context-parallel ownership of the KV cache (docs/spec.md, "The store"): with
KVCache(..., dcp=(world, rank)) the entry of cache slot loc is written only on the rank loc % world, at
local slot loc // world. For world 1-4 and every storing op (the standalone store, the fused decode, verify
and prefill), every rank's call into its own cache: the union of the ranks' entries equals the world-1
cache byte for byte, every other byte of each rank's cache and the guard bytes around it stay poisoned."""
import numpy as np
import pytest
import torch

import c_structs
import pydsa
import pyplan
from conftest import DEVICES

D, CHUNK, PAGE, POISON, GUARD = 512, 128, 2, 0xA5, 4096


def _cache(slots, device, dcp=(1, 0)):
    """A poisoned cache of `slots` entries inside a poisoned buffer (GUARD bytes on each side)."""
    page = pydsa.kv_page_bytes(D, PAGE)
    pages = -(-slots // PAGE)
    buf = torch.full((GUARD + pages * page + GUARD,), POISON, dtype=torch.uint8, device=device)
    gen = torch.Generator().manual_seed(11)
    w = (torch.rand(D, generator=gen) + 0.5).to(device)
    angles = torch.rand(2048, 32, generator=gen) * 6.3
    rot = torch.stack([angles.cos(), angles.sin()], -1).reshape(2048, 64).to(device)
    return buf, pydsa.KVCache(buf[GUARD:GUARD + pages * page], w, rot, page_size=PAGE, eps=1e-6, dcp=dcp)


def _entry(cache, loc):
    """The bytes of slot loc (data row and scale row) of a flat cache."""
    page = pydsa.kv_page_bytes(D, PAGE)
    row, srow = D + 64, (D // 64 + 7) // 8 * 8
    p, e = divmod(loc, PAGE)
    base = p * page
    return (cache[base + e * row: base + (e + 1) * row],
            cache[base + PAGE * row + e * srow: base + PAGE * row + (e + 1) * srow])


def _store(cache, device):
    gen = torch.Generator().manual_seed(1)
    n = 45
    slots = torch.randperm(n, generator=gen).to(torch.int64)
    slots[7] = -3  # negative: skipped on every rank
    pydsa.kv_store(torch.randn(n, D, generator=gen).to(device),
                   torch.randint(0, 2000, (n,), generator=gen, dtype=torch.int32).to(device), slots.to(device), cache)


def _decode(cache, device):
    gen = torch.Generator().manual_seed(2)
    b = 23
    state = torch.randn(b, 1, 3 * D, generator=gen).to(device)
    seq = (torch.randint(1, 9, (b,), generator=gen, dtype=torch.int32) * CHUNK)
    seq[::4] += 5  # rows that close no chunk
    slots = torch.randperm(b, generator=gen).to(torch.int64)
    pydsa.c128_decode(state, torch.randn(b, 2 * D, generator=gen).to(device), None,
                      torch.randn(CHUNK, D, generator=gen).to(device), torch.arange(b, dtype=torch.int32).to(device),
                      seq.to(device), store=cache, cache_slots=slots.to(device))


def _verify(cache, device):
    gen = torch.Generator().manual_seed(3)
    b, v = 7, 5
    state = torch.randn(b * (v + 2), 1, 3 * D, generator=gen).to(device)
    seq = torch.randint(0, 600, (b,), generator=gen, dtype=torch.int32)
    seq[:3] = torch.tensor([CHUNK - 1, 2 * CHUNK - 3, 3 * CHUNK - 5], dtype=torch.int32)
    slots = torch.randperm(b * v, generator=gen).to(torch.int64)
    idx = torch.arange(b, dtype=torch.int32).to(device)
    bank = (b + torch.arange(b, dtype=torch.int32) * (v + 1)).to(device)
    pydsa.c128_verify(state, torch.randn(b * v, 2 * D, generator=gen).to(device), None,
                      torch.randn(CHUNK, D, generator=gen).to(device), idx, seq.to(device), bank, store=cache,
                      cache_slots=slots.to(device))


def _prefill(cache, device):
    rng = np.random.default_rng(4)
    seq = np.array([700, 129, 300, 1500, 255], np.int64)
    ext = np.array([650, 129, 200, 1400, 127], np.int64)
    n = int(ext.sum())
    state = torch.from_numpy(rng.standard_normal((len(seq), 1, 3 * D), dtype=np.float32)).to(device)
    pydsa.c128_prefill(state, torch.from_numpy(rng.standard_normal((n, 2 * D), dtype=np.float32)).to(device), None,
                       torch.from_numpy(rng.standard_normal((CHUNK, D), dtype=np.float32)).to(device),
                       torch.arange(len(seq), dtype=torch.int32).to(device), pyplan.plan_prefill(seq, ext),
                       compact=True, store=cache, cache_slots=torch.from_numpy(rng.permutation(n)).to(device))


OPS = {"store": (_store, 45), "decode": (_decode, 23), "verify": (_verify, 35), "prefill": (_prefill, 2506)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_ranks_entries_are_the_single_cache_s(device, op, world):
    run, slots = OPS[op]
    _, whole = _cache(slots, device)
    run(whole, device)
    full = whole.cache.cpu().numpy()
    written = [loc for loc in range(slots) if not (np.concatenate(_entry(full, loc)) == POISON).all()]
    assert len(written) >= 3, "the case stores too few entries to test ownership"
    for rank in range(world):
        local = -(-slots // world)
        buf, part = _cache(local, device, dcp=(world, rank))
        run(part, device)
        got = buf.cpu().numpy()
        assert (got[:GUARD] == POISON).all() and (got[GUARD + part.cache.numel():] == POISON).all()
        mine = got[GUARD:GUARD + part.cache.numel()]
        owned = {loc // world for loc in written if loc % world == rank}
        for loc in written:
            if loc % world == rank:
                for a, b in zip(_entry(mine, loc // world), _entry(full, loc)):
                    assert np.array_equal(a, b), f"rank {rank} of {world}: slot {loc}"
        for j in range(local):
            if j not in owned:
                assert (np.concatenate(_entry(mine, j)) == POISON).all(), f"rank {rank}: local slot {j} written"


@pytest.mark.parametrize("dcp", [(0, 0), (2, 2), (2, -1), (-1, 0), ("2", None), (3,), 5])
def test_bad_dcp_is_refused_naming_it(dcp):
    with pytest.raises(ValueError, match="dcp must be"):
        _cache(8, "cpu", dcp=dcp)


def test_the_library_refuses_a_bad_rank_from_a_c_caller():
    _, kv = _cache(8, "cpu", dcp=(2, 1))
    c_structs.kv_cache(kv).dcp_rank = 2  # what a C caller could set
    with pytest.raises(pydsa.DsaError, match="store.dcp_rank 2"):
        _store(kv, "cpu")


def test_a_zeroed_dcp_owns_every_slot():
    """A C caller's zeroed struct (dcp_world 0) stores like world 1."""
    _, one = _cache(45, "cpu")
    _, zero = _cache(45, "cpu")
    c_structs.kv_cache(zero).dcp_world = 0
    _store(one, "cpu"), _store(zero, "cpu")
    assert torch.equal(one.cache, zero.cache)
