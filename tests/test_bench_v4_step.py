"""The pydsa side of the V4 step benchmark (pydsa/bench/v4_step.py) on the host backend, at tiny sizes: what it
times stores what its sglang counterpart would from the same inputs (pydsa's request-scoped c4 ring holds sglang's
window; a settled c128 state compresses what the default path's ring holds; the plugin's route stores what one c4
decode stores), and the check it records sees a difference."""
import numpy as np
import torch

import pydsa
from pydsa.bench import c4_paths, v4_step as v
from pydsa.sglang import CompressorDecodePlan

CPU = "cpu"


def _geometry(b, closing, seed=0):
    return v.Geometry(v.step_lengths(b, closing, seed, CPU, ratio=4, max_len=600), max_len=600)


def _records_decode(layer, geo, caches):
    """pydsa's c4 decode over sglang's page-scoped rings and its decode records, into `caches`."""
    plan = CompressorDecodePlan.generate(4, geo.rpi, geo.r2t, geo.f2s, geo.seq64, v.SWA_PAGE, v.RING)
    comps = [pydsa.C4Compressor(layer.rings[k], layer.apes[k], store=pydsa.KVCache(
        caches[k], layer.weights[k], layer.ours[k].store.rotary, page_size=v.C4_PAGE, eps=v.EPS,
        layout="v4" if k == 0 else "indexer")) for k in range(2)]
    pydsa.c4_decode(comps[0], layer.kv[0], indexer=comps[1], indexer_kv_score=layer.kv[1], records=plan.plan_d,
                    cache_slots=geo.out_loc)
    return plan


def test_the_request_scoped_c4_ring_stores_what_sglangs_page_ring_and_records_store():
    """Lengths across SWA page boundaries and every row closing: the window rows copied into pydsa's ring give the
    same cache bytes as the decode over sglang's ring and records."""
    for closing in (False, True):
        seq = v.step_lengths(9, closing, 3, CPU, ratio=4, max_len=600)
        seq[:3] = torch.tensor([260, 516, 8])  # windows reaching back into the previous SWA page; from position 0
        geo = v.Geometry(seq, max_len=600)
        layer = v.C4Layer(geo, torch.float32, torch.Generator().manual_seed(1))
        theirs = [c.clone() for c in layer.caches]
        _records_decode(layer, geo, theirs)
        layer.op.launch()
        assert int((theirs[0] != 0).sum()) > 0
        for mine, other in zip(layer.caches, theirs):
            assert torch.equal(mine, other)


def test_a_settled_c128_state_compresses_what_the_default_paths_ring_holds():
    geo = v.Geometry(torch.tensor([128, 384, 256, 1000, 7]), max_len=1024)
    layer = v.C128Layer(geo, torch.float32, torch.Generator().manual_seed(2), ring=True)
    layer.settle()
    out = torch.full((geo.b, v.D), float("nan"))
    pydsa.c128_decode(layer.state, layer.kv, out, layer.ape, geo.slots, geo.seq32)
    for b in range(3):  # the closing rows: the chunk's 127 ring rows and the new token
        rows = layer.ring[b].double().clone()
        rows[127] = layer.kv[b].double()
        w = torch.softmax(rows[:, v.D:] + layer.ape.double(), dim=0)
        want = (w * rows[:, :v.D]).sum(0)
        assert float((out[b].double() - want).norm() / want.norm()) < 1e-5
    assert bool(torch.isnan(out[3:]).all())


def test_the_plugins_routes_store_what_one_c4_decode_stores():
    """P35's plugin row times one call for both compressors (the layer hook's), its per-compressor row one per
    compressor; each stores what one c4 decode stores."""
    for routes, count in ((c4_paths.plugin_calls, 1), (c4_paths.per_compressor_calls, 2)):
        geo = _geometry(7, True, seed=5)
        layer = v.C4Layer(geo, torch.float32, torch.Generator().manual_seed(4))
        theirs = [c.clone() for c in layer.caches]
        plan = _records_decode(layer, geo, theirs)  # it writes the new tokens' ring rows, which the route writes alike
        calls = routes(layer, plan, geo.out_loc)
        assert len(calls) == count
        for call in calls:
            call()
        for mine, other in zip(layer.caches, theirs):
            assert torch.equal(mine, other)


def test_a_step_alternates_its_layers_and_runs_on_the_host():
    geo = v.Geometry(v.step_lengths(3, True, 0, CPU), max_len=1024)
    step = v.StepSet(geo, "m", torch.bfloat16, torch.Generator().manual_seed(0), False, {"m": (2, 3)})
    kinds = [type(layer).__name__ for layer in step.layers]
    assert kinds == ["C4Layer", "C128Layer", "C4Layer", "C128Layer", "C4Layer"]
    turns = v.Turns([step, step], v.StepSet.pydsa)
    turns()
    turns()
    assert turns.calls == 2
    assert all(int((layer.cache != 0).sum()) > 0 for layer in step.c128)
    assert all(int((layer.caches[1] != 0).sum()) > 0 for layer in step.c4)


def test_step_bytes_counts_the_inputs_states_entries_and_windows():
    seq = torch.tensor([128, 5])  # one row closing both kinds, one closing neither
    c128 = 2 * (2 * 512 * 4 + 3 * 512 * 4) + 1 * 3 * 512 * 4 + 584 + 128 * 512 * 4
    c4 = sum(2 * (4 * d * 4 + 4 * d * 4) + (7 * 2 * d * 4 + entry) for d, entry in ((512, 584), (128, 132)))
    assert v.step_bytes(1, 0, seq, 4) == c128
    assert v.step_bytes(0, 1, seq, 4) == c4
    assert v.step_bytes(3, 2, seq, 4) == 3 * c128 + 2 * c4
    # sglang's default c128 layers: rings of raw rows; the closing row reads its 127 earlier rows back
    for ring in (4, 2):
        row = 2 * 512 * ring
        offline = 2 * 2 * 512 * 4 + 1 * row + (127 * row + 584) + 128 * 512 * 4
        assert v.step_bytes(1, 0, seq, ring, offline=True) == offline
        assert v.step_bytes(2, 1, seq, ring, offline=True) == 2 * offline + v.step_bytes(0, 1, seq, ring)


def test_the_recorded_check_sees_one_step_flips_and_anything_more():
    pages = np.random.default_rng(0).integers(0, 100, (3, pydsa.kv_page_bytes(512, v.C4_PAGE)), dtype=np.uint8)
    cache = torch.from_numpy(pages)
    assert v.within_tolerance(v.cache_diff(cache.clone(), cache, "v4"))
    flip = cache.clone()
    flip[1, 7] += 1  # one fp8 code, one step
    found = v.cache_diff(flip, cache, "v4")
    assert found["bytes_differing"] == 1 and found["fp8_steps"] == 1 and v.within_tolerance(found)
    scale = cache.clone()
    scale[0, v.C4_PAGE * v.ENTRY + 2] += 1
    assert not v.within_tolerance(v.cache_diff(scale, cache, "v4"))
    far = cache.clone()
    far[2, 0] += 3
    assert not v.within_tolerance(v.cache_diff(far, cache, "v4", prefix="main_cache_"))
    idx = torch.zeros(2, pydsa.indexer_page_bytes(128, v.C4_PAGE), dtype=torch.uint8)
    idx[:, v.C4_PAGE * 128:].view(torch.float32)[:] = 0.5
    off = idx.clone()
    off[:, v.C4_PAGE * 128:].view(torch.float32)[0, 3] = 0.5001
    assert not v.within_tolerance(v.cache_diff(off, idx, "indexer"))
    assert not v.within_tolerance({"plan_bytes_equal": False})


def test_the_default_same_step_runs_pydsas_offline_ops_over_sglangs_default_plan():
    """config default-same on the host: sglang's offline c128 plan of the step (pydsa.sglang's planner stands in for
    sglang's plan kernel, with its signature), pydsa's offline decode + store over each c128 layer's ring: every
    request's new row lands in its ring at position % 128 and the closing rows' entries are stored, ring and cache
    byte-equal to the same decode run request-scoped (no plan) from the same start; the c4 layers run as in the
    plain pydsa step."""
    import types
    import pydsa.sglang as sglang
    geo = v.Geometry(v.step_lengths(3, True, 0, CPU), max_len=1024)
    step = v.StepSet(geo, "m", torch.float32, torch.Generator().manual_seed(1), True, {"m": (2, 1)})
    expected = []
    for layer in step.c128:  # the reference: the request-scoped decode (each request's slot its index) on copies
        ring, cache = layer.ring.clone(), layer.cache.clone()
        store = pydsa.KVCache(cache, layer.w, layer.freq, page_size=v.PAGE, eps=v.EPS)
        own = pydsa.C128Ring(ring.view(geo.b * v.CHUNK, 2 * v.D), layer.ape, store=store, ring_size=v.CHUNK)
        pydsa.c128_offline_decode(own, layer.kv, seq_lens=geo.seq64.to(torch.int32),
                                  slots=torch.arange(geo.b, dtype=torch.int32), cache_slots=layer.loc)
        expected.append((ring, cache))
    from pydsa.bench.reference import Reference
    planner = types.SimpleNamespace(compress=sglang)  # pydsa.sglang's planners stand in for sglang's plan kernels
    planner.plan_decode_c4 = lambda *args: Reference.plan_decode_c4(planner, *args)
    step.pydsa_default_same(planner)
    for layer, (ring, cache) in zip(step.c128, expected):
        rows = (geo.seq64 - 1) % v.CHUNK
        assert torch.equal(layer.ring[torch.arange(geo.b), rows], layer.kv.view(geo.b, 2 * v.D))
        assert int((layer.cache != 0).sum()) > 0  # every row closes: entries stored
        assert torch.equal(layer.ring, ring) and torch.equal(layer.cache, cache)
    assert all(int((layer.caches[1] != 0).sum()) > 0 for layer in step.c4)
