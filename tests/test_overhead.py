"""Per-step calls never synchronize and never allocate (after the first call): every op is
called right behind a long queued GPU sleep and must return long before the sleep ends, and
the caching allocator's allocation count must not move over 100 calls."""
import time
import tracemalloc

import numpy as np
import pytest
import torch

import pydsa
import pyplan
from conftest import gpu

D = 128


# Without out, a storing prefill on the GPU takes its out rows from torch's caching allocator (one block
# per call, stream-ordered); everything else allocates nothing.
OWN_ROWS = "prefill + store, out None"


def _ops(device):
    """One callable per per-step call pattern, all on `device`, over random data."""
    gen = torch.Generator().manual_seed(0)
    dev = torch.device(device)
    f32 = dict(device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    ape = torch.randn(128, D, generator=gen).to(dev)
    state = (torch.rand(8, 1, 3 * D, generator=gen) + 1).to(dev)
    state_bf16 = state.to(torch.bfloat16)
    b = 4
    kv = torch.randn(b, 2 * D, generator=gen).to(dev)
    out = torch.empty(b, D, **f32)
    idx = torch.arange(b, **i32)
    seq_lens = torch.tensor([5, 130, 1, 300], **i32)
    seq = np.array([300, 200, 77], np.int64)
    ext = np.array([300, 70, 77], np.int64)
    plan = pyplan.plan_prefill(seq, ext)
    n = int(ext.sum())
    kvp = torch.randn(n, 2 * D, generator=gen).to(dev)
    outp = torch.empty(n, D, **f32)
    compact = torch.empty(len(plan[0]), D, **f32)
    pidx = torch.arange(3, **i32)
    device_plan = pydsa.DevicePlan(1024, 4, device=dev)
    device_plan.plan(seq, ext, num_tokens=1024)
    kv_graph = torch.randn(1024, 2 * D, generator=gen).to(dev)
    out_graph = torch.empty(1024, D, **f32)
    copy = pydsa.MetadataCopy([dict(cache_seqlens=torch.zeros(b, **i32), cu_seqlens_k=torch.zeros(b + 1, **i32),
                                    page_table_1=torch.zeros(b, 64, **i32), dsa_cache_seqlens=torch.zeros(b, **i32),
                                    dsa_cu_seqlens_k=torch.zeros(b + 1, **i32)) for _ in range(3)])
    sources = [[torch.randint(0, 100, shape, generator=gen, dtype=torch.int32).to(dev)
                for shape in ((b,), (b + 1,), (b, 64), (b,), (b + 1,))] for _ in range(2)]
    flip = [0]

    def metadata_new_sources():
        flip[0] ^= 1
        copy(*sources[flip[0]])

    def replan_and_prefill():
        device_plan.plan(seq, ext, num_tokens=1024)
        pydsa.c128_prefill(state, kv_graph, out_graph, ape, pidx, device_plan)

    v = 4  # speculative: b requests x v drafts; bank entries in slots 8.. of a larger state
    spec = (torch.rand(8 + b * (v + 1), 1, 3 * D, generator=gen) + 1).to(dev)
    drafts = torch.randn(b * v, 2 * D, generator=gen).to(dev)
    out_drafts = torch.empty(b * v, D, **f32)
    bank = torch.arange(8, 8 + b * (v + 1), v + 1, **i32)
    accepted = torch.tensor([0, 4, 2, 1], **i32)
    load = idx.clone()
    layers = [spec, spec.clone(), spec.clone()]
    spec_bf16 = spec.to(torch.bfloat16)
    # The store (D = 128 cache pages of 2 entries), fused and standalone; prepared forms beside.
    cache = pydsa.KVCache(torch.zeros(64, pydsa.kv_page_bytes(D, 2), dtype=torch.uint8, device=dev),
                          (torch.rand(D, generator=gen) + 0.5).to(dev), torch.randn(1024, 64, generator=gen).to(dev),
                          page_size=2)
    i64 = dict(dtype=torch.int64, device=dev)
    slots_b = torch.arange(b, **i64)
    slots_n = torch.arange(n, **i64) % 128
    slots_v = torch.arange(b * v, **i64)
    positions = torch.arange(b, dtype=torch.int32, device=dev) * 128
    prepared_decode = pydsa.C128Decode(state, kv, None, ape, idx, seq_lens, store=cache, cache_slots=slots_b)
    prepared_prefill = pydsa.C128Prefill(state, kvp, None, ape, pidx, plan, store=cache, cache_slots=slots_n)
    return {
        "decode": lambda: pydsa.c128_decode(state, kv, out, ape, idx, seq_lens),
        "decode from load_indices": lambda: pydsa.c128_decode(state, kv, out, ape, idx, seq_lens, load_indices=idx),
        "verify": lambda: pydsa.c128_verify(spec, drafts, out_drafts, ape, idx, seq_lens, bank),
        "verify bf16 state": lambda: pydsa.c128_verify(spec_bf16, drafts, out_drafts, ape, idx, seq_lens, bank),
        "commit, load slots": lambda: pydsa.c128_commit(seq_lens, accepted, idx, bank, load_indices=load, num_drafts=v),
        "commit, copy 3 layers": lambda: pydsa.c128_commit(seq_lens, accepted, idx, bank, states=layers, num_drafts=v),
        "decode bf16 state": lambda: pydsa.c128_decode(state_bf16, kv, out, ape, idx, seq_lens),
        "prefill, pyplan plan": lambda: pydsa.c128_prefill(state, kvp, outp, ape, pidx, plan),
        "prefill, compact output": lambda: pydsa.c128_prefill(state, kvp, compact, ape, pidx, plan, compact=True),
        "prefill, re-planned DevicePlan": replan_and_prefill,
        "metadata copy, new sources": metadata_new_sources,
        "decode + store": lambda: pydsa.c128_decode(state, kv, None, ape, idx, seq_lens, store=cache,
                                                    cache_slots=slots_b),
        "decode + store, prepared": prepared_decode.launch,
        "verify + store": lambda: pydsa.c128_verify(spec, drafts, None, ape, idx, seq_lens, bank, store=cache,
                                                    cache_slots=slots_v),
        "prefill + store": lambda: pydsa.c128_prefill(state, kvp, compact, ape, pidx, plan, compact=True, store=cache,
                                                      cache_slots=slots_n),
        OWN_ROWS: lambda: pydsa.c128_prefill(state, kvp, None, ape, pidx, plan, store=cache, cache_slots=slots_n),
        "prefill + store, prepared": prepared_prefill.launch,
        "kv_store": lambda: pydsa.kv_store(out, positions, slots_b, cache),
    }


def _sleep_cycles_per_ms() -> float:
    """GPU clock cycles of torch.cuda._sleep per millisecond, measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    end.synchronize()
    return 1_000_000 / start.elapsed_time(end)


@gpu
@pytest.mark.gpu
def test_no_call_waits_for_queued_gpu_work():
    """Each op, called right behind about a second of queued GPU work, returns within a small
    fraction of it: nothing synchronizes the stream or the device."""
    ops = _ops("cuda")
    for fn in ops.values():
        fn()
    torch.cuda.synchronize()
    cycles_per_ms = _sleep_cycles_per_ms()
    for name, fn in ops.items():
        torch.cuda._sleep(int(cycles_per_ms * 1000))  # ~1 s
        t0 = time.perf_counter()
        for _ in range(10):
            fn()
        elapsed = time.perf_counter() - t0
        torch.cuda.synchronize()
        assert elapsed < 0.1, f"{name}: 10 calls behind 1 s of GPU work took {elapsed * 1e3:.0f} ms"


def _completes_beside_other_stream(cooperative: bool) -> bool:
    """Whether an eager prefill whose plan has both lists and fills the GPU (2 x 4K tokens with
    prefixes at D = 512: 66 records of 8 tiles, 528 blocks, all an H200 holds at once) completes
    while a kernel of another stream still runs (a sleep of about 300 ms on one SM)."""
    d = 512
    ext = np.array([4096, 4096], np.int64)
    plan = pyplan.plan_prefill(ext + np.array([1692, 3423], np.int64), ext)
    gen = torch.Generator().manual_seed(9)
    n = int(ext.sum())
    state = (torch.rand(2, 1, 3 * d, generator=gen) + 1).cuda()
    kv, ape = torch.randn(n, 2 * d, generator=gen).cuda(), torch.randn(128, d, generator=gen).cuda()
    out, idx = torch.empty(n, d, device="cuda"), torch.arange(2, dtype=torch.int32, device="cuda")
    pydsa.c128_prefill(state, kv, out, ape, idx, plan, cooperative=cooperative)
    torch.cuda.synchronize()
    cycles_per_ms = _sleep_cycles_per_ms()
    other, other_done, done = torch.cuda.Stream(), torch.cuda.Event(), torch.cuda.Event()
    with torch.cuda.stream(other):
        torch.cuda._sleep(int(cycles_per_ms * 300))
        other_done.record()
    time.sleep(0.01)  # the other kernel is running
    pydsa.c128_prefill(state, kv, out, ape, idx, plan, cooperative=cooperative)
    done.record()
    t0 = time.perf_counter()
    while not done.query() and time.perf_counter() - t0 < 0.1:
        time.sleep(0.0005)
    beside = done.query() and not other_done.query()
    torch.cuda.synchronize()
    return beside


@gpu
@pytest.mark.gpu
def test_prefill_without_cooperative_launch_runs_beside_other_streams():
    """cooperative=False: an eager prefill that would take a whole-GPU cooperative launch makes
    ordinary launches instead, which run beside a kernel of another stream and complete while it
    still runs (a cooperative grid waits for it: README, Limitations)."""
    assert _completes_beside_other_stream(cooperative=False)


@gpu
@pytest.mark.gpu
def test_no_call_allocates_device_memory():
    """After its first call, 100 calls of each op leave the caching allocator's allocation count
    where it was."""
    ops = _ops("cuda")
    for name, fn in ops.items():
        fn()
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        for _ in range(100):
            fn()
        after = torch.cuda.memory_stats()["allocation.all.allocated"]
        expected = 100 if name == OWN_ROWS else 0
        assert after - before == expected, f"{name}: {after - before} device allocations in 100 calls"


def test_host_backend_calls_allocate_no_arrays():
    """On the host backend, 100 calls of each op allocate no numpy memory (the plan is read in
    place; nothing is copied or staged)."""
    ops = _ops("cpu")
    for fn in ops.values():
        fn()
    domain = np.lib.tracemalloc_domain
    tracemalloc.start()
    try:
        for name, fn in ops.items():
            before = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, domain)])
            for _ in range(100):
                fn()
            after = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, domain)])
            grown = sum(s.size_diff for s in after.compare_to(before, "filename") if s.size_diff > 0)
            assert grown == 0, f"{name}: {grown} bytes of numpy memory allocated in 100 calls"
    finally:
        tracemalloc.stop()
