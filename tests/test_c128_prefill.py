"""The c128 prefill (docs/spec.md, prefill): any schedule against the offline vectors, the GPU against the host backend, the order of state reads and stores, the launches a plan calls for, host plans that do not fit the call."""
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import pydsa
import pyplan
from pydsa import sglang
from conftest import DEVICES, examples, gpu
from reference import CHUNK, TokenStream, rel_err
from c128_cases import BOUND, POISON, _valid, ape_for, random_state


# ---------------------------------------------------------------------------------------------
# End-to-end: any schedule of prefill extends and decode steps emits the offline chunk vectors.


class Server:
    """Drives requests through prefill and decode steps on one device and checks every chunk
    vector the library emits against the float64 offline formula."""

    def __init__(self, device, d, lengths, num_slots, seed, state_dtype=torch.float32):
        self.device = device
        self.d = d
        self.stream = TokenStream(d, seed)
        self.ape = ape_for(d, seed).numpy()
        self.ape_t = torch.from_numpy(self.ape).to(device)
        self.state = torch.full((num_slots, 1, 3 * d), POISON, device=device, dtype=state_dtype)
        self.bound = BOUND[state_dtype]
        self.lengths = lengths  # target total length per request
        self.done = [0] * len(lengths)  # tokens absorbed so far
        rng = np.random.default_rng(seed)
        self.free = list(rng.permutation(num_slots))
        self.slot = [int(self.free.pop()) for _ in lengths]
        self.emitted = 0
        self.max_err = 0.0

    def _check(self, b, pos, vector):
        ref = self.stream.chunk_vector(b, pos // CHUNK, self.ape)
        err = rel_err(vector, ref)
        self.max_err = max(self.max_err, err)
        assert err < self.bound, f"request {b} chunk {pos // CHUNK}: relative error {err:.2e}"
        self.emitted += 1

    def prefill(self, extends: dict, cow: set, compact: bool = False):
        reqs = sorted(extends)
        seq = np.array([self.done[b] + extends[b] for b in reqs], np.int64)
        ext = np.array([extends[b] for b in reqs], np.int64)
        rows = np.concatenate([self.stream.rows(b, self.done[b], self.done[b] + extends[b]) for b in reqs])
        load = [self.slot[b] for b in reqs]
        store = []
        for b in reqs:
            if b in cow:  # copy-on-write: continue from the old slot, store into a fresh one
                new = int(self.free.pop())
                self.free.insert(0, self.slot[b])
                self.slot[b] = new
            store.append(self.slot[b])
        compress, write = pyplan.plan_prefill(seq, ext)
        out = torch.full((len(compress) + 1 if compact else len(rows), self.d), POISON, device=self.device)
        i32 = dict(dtype=torch.int32, device=self.device)
        pydsa.c128_prefill(self.state, torch.from_numpy(rows).to(self.device), out[:len(compress)] if compact else out,
                           self.ape_t, torch.tensor(store, **i32), (compress, write),
                           load_indices=torch.tensor(load, **i32), compact=compact)
        out = out.cpu()
        closing = set()
        for i, (rid, j, pos, _) in enumerate(compress.tolist()):
            row = i if compact else rid
            closing.add(row)
            self._check(reqs[j], pos, out[row].numpy())
        others = [r for r in range(len(out)) if r not in closing]
        assert torch.isnan(out[others]).all(), "rows that hold no chunk vector must stay untouched"
        for b, e in extends.items():
            self.done[b] += e

    def decode(self, reqs: list, padding: int):
        b_all = reqs + [-1] * padding
        kv = np.stack([self.stream.rows(b, self.done[b], self.done[b] + 1)[0] if b >= 0
                       else np.full(2 * self.d, 1e30, np.float32) for b in b_all])
        i32 = dict(dtype=torch.int32, device=self.device)
        seq_lens = torch.tensor([self.done[b] + 1 if b >= 0 else 0 for b in b_all], **i32)
        slots = torch.tensor([self.slot[b] if b >= 0 else 10**9 for b in b_all], **i32)
        out = torch.full((len(b_all), self.d), POISON, device=self.device)
        pydsa.c128_decode(self.state, torch.from_numpy(kv).to(self.device), out, self.ape_t, slots, seq_lens)
        out = out.cpu()
        for i, b in enumerate(b_all):
            pos = self.done[b] if b >= 0 else -1
            if b >= 0 and pos % CHUNK == CHUNK - 1:
                self._check(b, pos, out[i].numpy())
            else:
                assert torch.isnan(out[i]).all()
        for b in reqs:
            self.done[b] += 1


@st.composite
def schedules(draw):
    n = draw(st.integers(1, 5))
    lengths = [draw(st.one_of(st.integers(1, 300), st.sampled_from([127, 128, 129, 256, 257]), st.integers(300, 700)))
               for _ in range(n)]
    d = draw(st.sampled_from([128, 256, 512, 64]))
    steps = []
    done = [0] * n
    while any(done[b] < lengths[b] for b in range(n)):
        active = [b for b in range(n) if done[b] < lengths[b]]
        if draw(st.booleans()):
            chosen = draw(st.lists(st.sampled_from(active), min_size=1, unique=True))
            extends = {b: draw(st.integers(1, lengths[b] - done[b])) for b in chosen}
            cow = set(draw(st.lists(st.sampled_from(chosen), unique=True)))
            steps.append(("prefill", extends, cow, draw(st.booleans())))
            for b, e in extends.items():
                done[b] += e
        else:
            chosen = draw(st.lists(st.sampled_from(active), min_size=1, unique=True))
            steps.append(("decode", chosen, draw(st.integers(0, 2))))
            for b in chosen:
                done[b] += 1
    return d, lengths, steps, draw(st.integers(0, 2**31)), draw(st.sampled_from([torch.float32, torch.bfloat16]))


def run_schedule(device, sched):
    """Runs the steps and checks every emitted vector; the count expected is derived from the
    tokens the steps actually fed, so a schedule cannot disagree with its own lengths."""
    d, lengths, steps, seed, state_dtype = sched
    server = Server(device, d, lengths, num_slots=2 * len(lengths) + 3, seed=seed, state_dtype=state_dtype)
    for step in steps:
        if step[0] == "prefill":
            server.prefill(*step[1:])
        else:
            server.decode(step[1], step[2])
    assert server.emitted == sum(n // CHUNK for n in server.done)
    return server


@pytest.mark.parametrize("device_name", DEVICES)
@settings(max_examples=examples(25))
@given(schedules())
def test_any_schedule_emits_the_offline_chunk_vectors(device_name, sched):
    """Every chunk vector, whichever mix of prefill segments (mid-chunk starts, copy-on-write
    slots, many requests per batch, ragged or compact output) and decode steps produced it, equals
    the float64 offline formula within 1e-5 norm-wise relative error with fp32 state and within
    the documented bf16 bound with bf16 state."""
    run_schedule(torch.device(device_name), sched)


def _plan_case(name):
    """(seq_lens, extend_lens) of one prefill. The prefill kernel picks its tile layout from the
    pass size (one or two records: 8-channel tiles; a few: 16; more: 64; hundreds at D = 512 on a
    large GPU: 128), so the cases together run every layout."""
    if name == "small":
        return np.array([1000, 130, 77, 4096, 300], np.int64), np.array([900, 130, 20, 4000, 1], np.int64)
    if name == "tiny":  # one mid-chunk compress record, one write record
        return np.array([200], np.int64), np.array([120], np.int64)
    if name == "wide":  # 256 compress records after a mid-chunk start, in one launch
        return np.array([32768 + 100], np.int64), np.array([32768], np.int64)
    if name == "wave":  # 72 records in both lists: at D = 512 on an H200 one launch, in 128-channel tiles only
        ext = np.full(8, 1024, np.int64)
        return ext + np.array([1692, 3423, 4089, 1154, 1925, 881, 2837, 2619], np.int64), ext
    if name == "split":  # 144 records: at D = 512 on an H200 over one wave, split by state reads
        ext = np.full(16, 1024, np.int64)
        return ext + np.array([1692, 3423, 4089, 1154, 1925, 881, 2837, 2619] * 2, np.int64), ext
    # Over DSA_INLINE_RECORDS records in both lists: several chained launches per pass.
    rng = np.random.default_rng(3)
    ext = rng.integers(1, 200, 300).astype(np.int64)
    ext[7] = 40_000
    return ext + rng.integers(0, 5000, 300), ext


def _close_state(a, b, dtype):
    """States agree to fp32 rounding: exactly the same NaNs; values within fp32 rounding, or
    within one bf16 step where the two sides rounded a value just apart."""
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    tol = 2e-6 if dtype == torch.float32 else 2 ** -7
    torch.testing.assert_close(a.float().nan_to_num(), b.float().nan_to_num(), rtol=tol, atol=tol)


def _same_out(a, g):
    """Two outputs of the same call (poisoned with NaN before it) agree in which rows were written
    and, to fp32 rounding, in their values."""
    assert torch.equal(torch.isnan(a), torch.isnan(g))
    torch.testing.assert_close(a.nan_to_num(), g.nan_to_num(), rtol=2e-6, atol=2e-6)


def _same_as_host(results, state_dtype=torch.float32):
    """results["cpu"] and results["cuda"] are (state, out) after the same call: the states agree
    to fp32 rounding (or bf16 rounding), the outputs as in _same_out."""
    _close_state(results["cpu"][0], results["cuda"][0], state_dtype)
    _same_out(results["cpu"][1], results["cuda"][1])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,case", [(128, "small"), (256, "small"), (512, "small"), (128, "chained"), (512, "tiny"),
                                    (512, "wide"), (512, "wave"), (512, "split")])
def test_gpu_equals_host_backend(d, case, state_dtype):
    """GPU and host backend agree to fp32 rounding on a random prefill (ragged and compact) and
    a decode from the same state, for both state dtypes; the chained case has more plan records
    than one launch carries."""
    gen = torch.Generator().manual_seed(d)
    seq, ext = _plan_case(case)
    compress, write = pyplan.plan_prefill(seq, ext)
    b, n = len(seq), int(ext.sum())
    kv = torch.randn(n, 2 * d, generator=gen) * 2
    ape = ape_for(d)
    state0 = random_state(b + 3, d, gen).to(state_dtype)
    idx = torch.randperm(b + 3, generator=gen)[:b].to(torch.int32)
    results = {}
    for dev in ("cpu", "cuda"):
        state = state0.clone().to(dev)
        out = torch.full((n, d), POISON, device=dev)
        compact = torch.full((len(compress), d), POISON, device=dev)
        pydsa.c128_prefill(state0.clone().to(dev), kv.to(dev), compact, ape.to(dev), idx.to(dev), (compress, write),
                           compact=True)
        pydsa.c128_prefill(state, kv.to(dev), out, ape.to(dev), idx.to(dev), (compress, write))
        results[dev] = (state.cpu(), out.cpu(), compact.cpu())
    (s_host, o_host, c_host), (s_gpu, o_gpu, c_gpu) = results["cpu"], results["cuda"]
    _close_state(s_host, s_gpu, state_dtype)
    _same_out(o_host, o_gpu)
    _same_out(c_host, c_gpu)
    assert torch.equal(c_host, o_host[torch.from_numpy(compress["ragged_id"].astype(np.int64))])
    decoded = {}
    for dev in ("cpu", "cuda"):
        state = s_host.clone().to(dev)
        out2 = torch.full((b, d), POISON, device=dev)
        pydsa.c128_decode(state, kv[:b].to(dev), out2, ape.to(dev), idx.to(dev),
                          torch.tensor(seq + 1, dtype=torch.int32).to(dev))
        decoded[dev] = (state.cpu(), out2.cpu())
    _same_as_host(decoded, state_dtype)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("plan_kind", ["host", "host no-coop", "host captured", "device"])
@pytest.mark.parametrize("b,d", [(3, 512), (40, 64), (300, 256)])
@pytest.mark.parametrize("whole_chunks", [(0, 2), (2, 4)])
def test_state_stores_land_after_every_state_read(b, d, plan_kind, whole_chunks):
    """docs/spec.md, prefill's order across requests: request i continues from slot L[i] and stores its
    trailing partial into L[i + 1], the slot request i + 1 continues from. Every compress read
    must see the slot before any write-segment store, however the launch is cut: GPU equals the
    host backend, which runs the lists one after the other. The cuts: an eager call of a host plan
    whose items fit one wave is one launch with a grid barrier (the two smaller cases); a host
    plan with more whole-chunk compress records than continuing ones (2-3 whole chunks per
    request) and at most 256 records per launch is split by state reads (the continuing records,
    then the rest; captured, cooperative=False, or eager over one wave); otherwise a compress
    pass, then a write pass (0-1 whole chunks, the 300-request plans, device plans)."""
    rng = np.random.default_rng(b)
    prefix = 128 * rng.integers(0, 40, b) + rng.integers(1, 127, b)  # every request starts mid-chunk
    ext = 128 - prefix % 128 + 128 * rng.integers(*whole_chunks, b) + rng.integers(1, 127, b)  # and ends mid-chunk
    seq = (prefix + ext).astype(np.int64)
    ext = ext.astype(np.int64)
    n = int(ext.sum())
    gen = torch.Generator().manual_seed(b)
    kv = torch.randn(n, 2 * d, generator=gen) * 2
    ape = ape_for(d)
    state0 = random_state(b + 1, d, gen)
    load = torch.randperm(b + 1, generator=gen)[:b].to(torch.int32)
    store = torch.roll(load, -1)
    results = {}
    for dev in ("cpu", "cuda"):
        plan = pyplan.plan_prefill(seq, ext)
        if dev == "cuda" and plan_kind == "device":
            plan = pydsa.DevicePlan(n, b, device=dev).plan(seq, ext, num_tokens=n)
        state = state0.clone().to(dev)
        out = torch.full((n, d), POISON, device=dev)
        args = (state, kv.to(dev), out, ape.to(dev), store.to(dev), plan)
        load_dev = load.to(dev)
        if dev == "cuda" and plan_kind == "host captured":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                pydsa.c128_prefill(*args, load_indices=load_dev)
            state.copy_(state0), out.fill_(POISON)  # capture does not run the kernels; make sure
            graph.replay()
        else:
            pydsa.c128_prefill(*args, load_indices=load_dev, cooperative=plan_kind != "host no-coop")
        results[dev] = (state.cpu(), out.cpu())
    _same_as_host(results)



def _prefill_kernels(fn, names=("c128_prefill_kernel",)) -> list:
    """Names of the prefill kernels (or others named) that fn() launched, in launch order (CUDA
    activity of the torch profiler)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if any(name in e.name for name in names)]
    return [e.name for e in sorted(kernels, key=lambda e: e.time_range.start)]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("extends,prefixes,passes,how,cooperative", [
    ([300, 70, 77], [0, 130, 5000], ["<3,"], "one-shot", True),     # both lists, 7 records: one launch
    ([300, 70, 77], [0, 130, 5000], ["<3,"], "prepared", True),
    ([300, 70, 77], [0, 130, 5000], ["<3,"], "sglang", True),       # host plan tensors
    # cooperative=False: no compress record continues a chunk, so one launch of the split kernel
    ([300, 70, 77], [0, 130, 5000], ["<4,"], "one-shot", False),
    ([300, 70, 77], [0, 130, 5000], ["<4,"], "prepared", False),
    ([300, 70, 77], [0, 130, 5000], ["<4,"], "sglang", False),
    # cooperative=False: 2 continuing compress records, none that starts a chunk: two passes
    ([100, 100], [30, 300], ["<1,", "<2,"], "one-shot", False),
    # 8 continuing compress records, 56 whole chunks: the continuing ones, then the rest
    ([1024] * 8, [1692, 3423, 4089, 1154, 1925, 881, 2837, 2619], ["<1,", "<4,"], "one-shot", False),
    ([1024] * 4, [1692, 3423, 4089, 1154], ["<3,"], "one-shot", True),  # 4K tokens, 36 records x 8 tiles: one launch
    # 72 records: 576 64-channel items, 288 128-channel ones: one launch in the wide layout
    ([1024] * 8, [1692, 3423, 4089, 1154, 1925, 881, 2837, 2619], ["<3,"], "one-shot", True),
    ([1024] * 8, [1692, 3423, 4089, 1154, 1925, 881, 2837, 2619], ["<3,"], "prepared", True),
    # 576 wide items, over one wave: split by state reads (16 continuing records; 112 + 16 in the second launch)
    ([1024] * 16, [1692, 3423, 4089, 1154, 1925, 881, 2837, 2619] * 2, ["<1,", "<4,"], "one-shot", True),
    # 320 + 40 records: over one launch's 256, so a compress pass of two launches, then the write pass
    ([1024] * 40, [1692, 3423, 4089, 1154, 1925, 881, 2837, 2619] * 5, ["<1,", "<1,", "<2,"], "one-shot", True),
    ([128, 256], [0, 128], ["<1,"], "one-shot", True),                 # compress records only
    ([5, 60], [3, 0], ["<2,"], "one-shot", True),                      # write records only
])
def test_eager_prefill_takes_the_launches_its_plan_calls_for(extends, prefixes, passes, how, cooperative):
    """An eager host-plan prefill with both lists whose work items fit the blocks the GPU holds at
    once (an H200: 132 SMs x 4 = 528; D = 512 takes 64-channel tiles here, 8 per record, or
    128-channel ones, 4 per record, when only those fit) is one cooperative launch of the two-list
    kernel, unless called with cooperative=False. Otherwise, a plan with more compress records
    that start a chunk than continue one (and at most 256 records per launch) is split by state
    reads: the continuing compress records, then every other record in the split kernel (one
    launch of it when none continues); other plans are the compress pass, then the write pass. A
    plan with one list is one launch of that list's kernel. One-shot, prepared, and through the
    sglang layer with host plan tensors. Each result equals the host backend's."""
    d = 512
    ext = np.array(extends, np.int64)
    seq = ext + np.array(prefixes, np.int64)
    plan = pyplan.plan_prefill(seq, ext)
    n, b = int(ext.sum()), len(ext)
    gen = torch.Generator().manual_seed(n)
    kv, ape, state0 = torch.randn(n, 2 * d, generator=gen), ape_for(d), random_state(b, d, gen)
    idx = torch.randperm(b, generator=gen).to(torch.int32)
    results = {}
    for dev in ("cpu", "cuda"):
        state = state0.clone().to(dev)
        out = torch.full((n, d), POISON, device=dev)
        args = (state, kv.to(dev), out, ape.to(dev), idx.to(dev), plan)
        if how == "prepared":
            call = pydsa.C128Prefill(*args, cooperative=cooperative).launch
        elif how == "sglang":
            tensors = [torch.from_numpy(r.view(np.uint8).reshape(-1, 16)) for r in plan]
            call = lambda: sglang.c128_online_prefill(*args[:5], *tensors, cooperative=cooperative)  # noqa: E731
        else:
            call = lambda: pydsa.c128_prefill(*args, cooperative=cooperative)  # noqa: E731
        if dev == "cuda":
            names = _prefill_kernels(call)
            assert [next(p for p in ("<1,", "<2,", "<3,", "<4,") if p in name) for name in names] == passes, names
            if passes == ["<3,"]:  # 128-channel tiles (log2 of the threads across a tile: 5) iff 64-channel ones overflow
                lanes_log2 = int(re.search(r"c128_prefill_kernel<3, \d+, float, (\d)>", names[0]).group(1))
                assert (lanes_log2 == 5) == ((len(plan[0]) + len(plan[1])) * 8 > 528), names
        else:
            call()
        results[dev] = (state.cpu(), out.cpu())
    _same_as_host(results)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("requests", [3, 40, 300])
def test_a_storing_prefill_takes_the_plain_launches_then_its_store(requests):
    """On the GPU a storing prefill launches what the plain one does, then one store launch per 256
    compress records (16 records or fewer: the small parameter block)."""
    d = 512
    ext = np.full(requests, 200, np.int64)
    seq = ext + np.arange(requests, dtype=np.int64) * 37
    plan = pyplan.plan_prefill(seq, ext)
    n, k = int(ext.sum()), len(plan[0])
    stores = ["16>" if min(256, k - first) <= 16 else "256>" for first in range(0, k, 256)]
    gen = torch.Generator().manual_seed(requests)
    kv, ape, state = torch.randn(n, 2 * d, generator=gen).cuda(), ape_for(d).cuda(), random_state(requests, d, gen).cuda()
    idx = torch.arange(requests, dtype=torch.int32, device="cuda")
    out = torch.empty(n, d, device="cuda")
    page = pydsa.kv_page_bytes(d, 2)
    cache = pydsa.KVCache(torch.zeros(n // 2 + 1, page, dtype=torch.uint8, device="cuda"), torch.ones(d, device="cuda"),
                          torch.randn(20000, 64, device="cuda"), page_size=2)
    slots = torch.arange(n, dtype=torch.int64, device="cuda")
    kinds = ("c128_prefill_kernel", "kv_store_kernel")
    plain = _prefill_kernels(lambda: pydsa.c128_prefill(state, kv, out, ape, idx, plan), kinds)
    storing = _prefill_kernels(lambda: pydsa.c128_prefill(state, kv, out, ape, idx, plan, store=cache,
                                                          cache_slots=slots), kinds)
    assert storing[:len(plain)] == plain and not any("kv_store" in k for k in plain), (plain, storing)
    rest = storing[len(plain):]
    assert len(rest) == len(stores) and all("kv_store_kernel<4, true, " + s in k for k, s in zip(rest, stores)), rest



# ---------------------------------------------------------------------------------------------
# Host plans that do not fit the call

_BAD_COMPRESS = [(300, 0, 127, 1),          # ragged row past the input
                 (130, 0, 255, 129),      # window longer than a chunk
                 (9, 0, 127, 11),         # starts before ragged row 0
                 (50, 5, 127, 10),        # request index past B
                 (60, 0, 126, 10),        # does not close its chunk
                 (140, 0, 127, 0x10005),  # window past 16 bits (its low bits are a valid 5)
                 (150, 0, 127, 0xFFFFFFFF),  # a sentinel's window in a usable record
                 (0xFFFFFFFF, 0, 0, 0)]   # half a sentinel
_BAD_WRITE = [(80, 0, 127, 5)]            # closes its chunk: wrong list


def _corrupt_prefill(device, compress, write, as_tensors=False, idx=None, load=None):
    d, n = 64, 300
    state0 = random_state(3, d, torch.Generator().manual_seed(1)).to(device)
    state = state0.clone()
    out = torch.full((n, d), POISON, device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    idx = torch.tensor([0, 1, 77] if idx is None else idx, dtype=torch.int32, device=device)
    load = torch.tensor([0, 40, 1] if load is None else load, dtype=torch.int32, device=device)
    plan = (np.array(compress, pyplan.SEGMENT_DTYPE), np.array(write, pyplan.SEGMENT_DTYPE))
    if as_tensors:  # records in device memory: data, like slots
        plan = tuple(torch.from_numpy(r.view(np.uint8).reshape(-1, 16).copy()).to(device) for r in plan)
    try:
        pydsa.c128_prefill(state, torch.randn(n, 2 * d, device=device), out, torch.zeros(CHUNK, d, device=device),
                           idx, plan, load_indices=load, error_count=counter)
    finally:
        assert torch.equal(state, state0) and torch.isnan(out).all()  # nothing written either way
    return int(counter.item())


@pytest.mark.parametrize("record", range(len(_BAD_COMPRESS) + len(_BAD_WRITE)))
def test_a_host_plan_record_that_does_not_fit_the_call_is_an_error_naming_it(device, record):
    """A host plan is read on the host: a record outside the call's tokens or requests, crossing or
    not closing its chunk as its list requires, fails the call before anything runs, naming it (a plan
    made for another batch, a kv_score shorter than the plan, indices shorter than its requests)."""
    good_compress, good_write = [(200, 0, 127, 10)], [(250, 1, 50, 5)]
    if record < len(_BAD_COMPRESS):
        compress, write, which, at = good_compress + [_BAD_COMPRESS[record]], good_write, "compress", 1
    else:
        compress, write, which, at = good_compress, good_write + [_BAD_WRITE[0]], "write", 1
    with pytest.raises(pydsa.DsaError, match=f"{which} record {at} .* does not fit this call"):
        _corrupt_prefill(device, compress, write)


def test_slots_of_a_host_plan_are_data_skipped_and_counted(device):
    """Slots live in tensors: a load slot or store slot outside the state skips its record and counts."""
    assert _corrupt_prefill(device, [(70, 1, 127, 10)], [(90, 2, 50, 5), (0xFFFFFFFF,) * 4]) == 2


def test_negative_slots_of_a_prefill_are_skipped_silently(device):
    """As in every op (docs/spec.md, conventions): a negative load or store slot is not held on this GPU;
    its records write nothing and count nothing."""
    assert _corrupt_prefill(device, [(70, 1, 127, 10)], [(90, 2, 50, 5), (0xFFFFFFFF,) * 4],
                            idx=[0, 1, -7], load=[0, -4, 1]) == 0


@gpu
@pytest.mark.gpu
def test_corrupted_device_plan_records_are_skipped_and_counted():
    """Records in device memory are data: records outside the input, crossing a chunk, on the wrong
    list, with a bad request index or a slot outside the state are skipped, counted, and write nothing."""
    compress = _BAD_COMPRESS + [(70, 1, 127, 10)]  # and a load slot out of range (mid-chunk start)
    write = _BAD_WRITE + [(90, 2, 50, 5), (0xFFFFFFFF,) * 4]  # a store slot out of range; a real sentinel
    assert _corrupt_prefill("cuda", compress, write, as_tensors=True) == 11


def test_prefill_plan_must_be_records(device):
    args = _valid(device)
    del args["seq_lens"]
    with pytest.raises(TypeError, match="plan"):
        pydsa.c128_prefill(**args, plan=[1, 2, 3])
    with pytest.raises(TypeError, match="SEGMENT_DTYPE"):
        pydsa.c128_prefill(**args, plan=(np.zeros(3), np.zeros(3)))
