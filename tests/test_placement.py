"""The speculative ops, the store, the fused layer and the sglang calls on the second GPU of a node.

Each op runs with its tensors on cuda:1 while cuda:0 is current, on a side stream of cuda:1, and
concurrently on both GPUs; results equal the host backend's and the current device never moves.
These tests need two GPUs and skip cleanly with fewer."""
import numpy as np
import pytest
import torch

import pydsa
import pyplan
from conftest import HAS_GPU
from pydsa import sglang

two_gpus = pytest.mark.skipif(not HAS_GPU or torch.cuda.device_count() < 2, reason="needs two GPUs")
D, CHUNK, V = 512, 128, 4


def _cache(dev, pages=512):
    gen = torch.Generator().manual_seed(3)
    w = torch.rand(D, generator=gen) + 0.5
    angles = torch.rand(1024, 32, generator=gen) * 6.3
    rot = torch.stack([angles.cos(), angles.sin()], -1).reshape(1024, 64)
    cache = torch.full((pages, pydsa.kv_page_bytes(D, 2)), 0xA5, dtype=torch.uint8)
    return pydsa.KVCache(cache.to(dev), w.to(dev), rot.to(dev), page_size=2)


def _inputs(seed):
    """Host tensors of one layer step: state with a bank, drafts, decode and prefill rows."""
    gen = torch.Generator().manual_seed(seed)
    b = 5
    return dict(
        state=torch.randn(b * (V + 2), 1, 3 * D, generator=gen) * 0.1 + torch.cat(
            [torch.zeros(D), torch.full((D,), 3.0), torch.zeros(D)]).view(1, 1, 3 * D),
        ape=torch.randn(CHUNK, D, generator=gen), drafts=torch.randn(b * V, 2 * D, generator=gen),
        tokens=torch.randn(b, 2 * D, generator=gen), rows=torch.randn(700, 2 * D, generator=gen),
        seq=torch.tensor([126, 0, 300, 127, 5], dtype=torch.int32), idx=torch.arange(b, dtype=torch.int32),
        bank=(b + torch.arange(b, dtype=torch.int32) * (V + 1)).to(torch.int32),
        accepted=torch.tensor([2, 4, 0, 1, 3], dtype=torch.int32),
        slots=torch.arange(1000, dtype=torch.int64))


def _step(dev, t, stream=None):
    """Every op of a layer step on `dev` (storing decode, storing verify, both commits, storing
    prefill, the standalone store, sglang's MTP calls); returns the tensors to compare."""
    x = {k: v.to(dev) for k, v in t.items()}
    kv = _cache(dev)
    state = x["state"]
    out = torch.full((5, D), float("nan"), device=dev)
    pydsa.c128_decode(state, x["tokens"], out, x["ape"], x["idx"], x["seq"] + 1, store=kv,
                      cache_slots=x["slots"][:5], stream=stream)
    vout = torch.full((5 * V, D), float("nan"), device=dev)
    pydsa.c128_verify(state, x["drafts"], vout, x["ape"], x["idx"], x["seq"], x["bank"], store=kv,
                      cache_slots=x["slots"][10:10 + 5 * V], stream=stream)
    load = torch.full((5,), -7, dtype=torch.int32, device=dev)
    pydsa.c128_commit(x["seq"], x["accepted"], x["idx"], x["bank"], num_drafts=V, load_indices=load,
                      num_slots=state.shape[0], stream=stream)
    copied = state.clone()
    pydsa.c128_commit(x["seq"], x["accepted"], x["idx"], x["bank"], num_drafts=V, states=[copied],
                      num_slots=state.shape[0], stream=stream)
    seq, ext = np.array([400, 300], np.int64), np.array([400, 300], np.int64)
    pout = torch.full((700, D), float("nan"), device=dev)
    pstate = state[:2].clone()
    pydsa.c128_prefill(pstate, x["rows"], pout, x["ape"], x["idx"][:2], pyplan.plan_prefill(seq, ext), store=kv,
                       cache_slots=x["slots"][200:900], stream=stream)
    pydsa.kv_store(out[[0]].nan_to_num(1.0), torch.tensor([7], dtype=torch.int32, device=dev),
                   torch.tensor([120], dtype=torch.int64, device=dev), kv, stream=stream)
    sg_state = state.view(state.shape[0], 3 * D).clone()
    sglang.online_c128_mtp_write_prefix_states(x["drafts"], x["seq"].to(torch.int64), x["idx"].to(torch.int64),
                                               torch.zeros(5, 8, dtype=torch.int32, device=dev), x["ape"], sg_state,
                                               5, V, 5)
    return dict(state=state, out=out, vout=vout, load=load, copied=copied, pstate=pstate, pout=pout,
                cache=kv.cache, sg_state=sg_state)


def _compare(got, want):
    for k, w in want.items():
        g = got[k].cpu()
        if g.is_floating_point():
            assert torch.equal(torch.isnan(g), torch.isnan(w)), k
            torch.testing.assert_close(g.nan_to_num(), w.nan_to_num(), rtol=2e-6, atol=2e-6, msg=k)
        elif k == "cache":
            # fp8 codes of vectors that differ in their last bits between backends: a few one-step flips
            assert (g != w).sum().item() <= 1e-4 * w.numel(), k
        else:
            assert torch.equal(g, w), k


@two_gpus
@pytest.mark.gpu
def test_speculative_store_and_sglang_calls_on_the_second_gpu_from_a_side_stream():
    t = _inputs(1)
    want = _step("cpu", t)
    torch.cuda.set_device(0)
    stream = torch.cuda.Stream(device=1)
    with torch.cuda.stream(stream):  # the current stream of cuda:1 is the side stream; cuda:0 stays current
        got = _step(torch.device("cuda", 1), t)
    assert torch.cuda.current_device() == 0
    stream.synchronize()
    _compare(got, want)
    got = _step(torch.device("cuda", 1), t, stream=torch.cuda.Stream(device=1).cuda_stream)
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0
    _compare(got, want)


@two_gpus
@pytest.mark.gpu
def test_both_gpus_at_once():
    """The same steps queued on both GPUs back to back, each on its own stream, then compared."""
    t0, t1 = _inputs(2), _inputs(3)
    want0, want1 = _step("cpu", t0), _step("cpu", t1)
    s0, s1 = torch.cuda.Stream(device=0), torch.cuda.Stream(device=1)
    with torch.cuda.stream(s0):
        got0 = _step(torch.device("cuda", 0), t0)
    with torch.cuda.stream(s1):
        got1 = _step(torch.device("cuda", 1), t1)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    _compare(got0, want0)
    _compare(got1, want1)


def test_the_placement_step_runs_on_the_host_backend():
    """The step the two-GPU tests run, on the host backend: it runs, and stores what it closes."""
    got = _step("cpu", _inputs(4))
    assert not (got["cache"] == 0xA5).all() and (got["load"] != -7).all()


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_the_placement_step_on_one_gpu_matches_the_host_backend():
    """The comparison the two-GPU tests make, on cuda:0 alone (so the step and the comparison are
    known to hold wherever one GPU is)."""
    t = _inputs(5)
    _compare(_step(torch.device("cuda", 0), t), _step("cpu", t))
