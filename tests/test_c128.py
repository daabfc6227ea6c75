"""Online c128 compression (docs/spec.md, online c128): the same properties on the host backend and on the GPU."""
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import c_structs
import pydsa
import pyplan
from pydsa import _abi, sglang
from conftest import DEVICES, examples, gpu
from reference import BF16_BOUND, CHUNK, TokenStream, online_step_fp32, rel_err

POISON = float("nan")
# Norm-wise relative error against the float64 formula: fp32 state (docs/spec.md, the per-token update) and bf16 state
# (docs/spec.md, the state, output layouts: the bound measured over the random schedules below, with margin).
BOUND = {torch.float32: 1e-5, torch.bfloat16: BF16_BOUND}


def random_state(num_slots, d, gen):
    m = torch.randn(num_slots, 1, d, generator=gen) * 2
    s = torch.rand(num_slots, 1, d, generator=gen) * 20 + 1
    k = torch.randn(num_slots, 1, d, generator=gen)
    return torch.cat([m, s, k], dim=2)


def ape_for(d, seed=7):
    return torch.randn(CHUNK, d, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# Decode step semantics


@pytest.mark.parametrize("d", [128, 256, 512, 192])
def test_decode_step_matches_spec_update_at_chunk_edges(device, d):
    """Positions 0, 1, 63, 126, 127, 128, 129: fresh start at 0, the per-token update elsewhere, chunk
    close at 127 writes out and leaves the slot alone; untouched out rows keep their poison."""
    gen = torch.Generator().manual_seed(d)
    positions = [0, 1, 63, 126, 127, 128, 129, 255]
    b = len(positions)
    slots = torch.randperm(b + 3, generator=gen)[:b].to(torch.int32)
    state0 = random_state(b + 3, d, gen)
    kv_score = torch.randn(b, 2 * d, generator=gen)
    ape = ape_for(d)
    seq_lens = torch.tensor([p + 1 for p in positions], dtype=torch.int32)
    state = state0.clone().to(device)
    out = torch.full((b, d), POISON, device=device)
    pydsa.c128_decode(state, kv_score.to(device), out, ape.to(device), slots.to(device), seq_lens.to(device))
    state, out = state.cpu(), out.cpu()
    for i, p in enumerate(positions):
        c = p % CHUNK
        row = state0[slots[i], 0].numpy()
        t = (kv_score[i, d:] + ape[c]).numpy()
        v = kv_score[i, :d].numpy()
        if c == 0:
            m, s, k = t, np.ones(d, np.float32), v
        else:
            m, s, k = online_step_fp32(row[:d], row[d:2 * d], row[2 * d:], t, v)
        if c == CHUNK - 1:
            assert rel_err(out[i].numpy(), k) < 1e-6
            assert torch.equal(state[slots[i]], state0[slots[i]]), "a chunk close must not write the slot"
        else:
            assert torch.isnan(out[i]).all(), "out rows of requests that do not close a chunk stay untouched"
            got = state[slots[i], 0].numpy()
            assert rel_err(got[:d], m) < 1e-6 and rel_err(got[d:2 * d], s) < 1e-6 and rel_err(got[2 * d:], k) < 1e-6
    untouched = torch.ones(b + 3, dtype=torch.bool)
    untouched[slots.long()] = False
    assert torch.equal(state[untouched], state0[untouched])


def test_decode_padding_rows_and_empty_batch(device):
    """seq_len <= 0 is padding: even a garbage slot index is neither read nor counted; B = 0 is a
    no-op."""
    d = 128
    gen = torch.Generator().manual_seed(3)
    state0 = random_state(4, d, gen).to(device)
    state = state0.clone()
    out = torch.full((3, d), POISON, device=device)
    pydsa.reset_error_count(device)
    pydsa.c128_decode(state, torch.randn(3, 2 * d, device=device), out, ape_for(d).to(device),
                      torch.tensor([1 << 30, -7, 2], dtype=torch.int32, device=device),
                      torch.tensor([0, -5, 128], dtype=torch.int32, device=device))
    assert pydsa.error_count(device) == 0
    assert torch.equal(state[:2], state0[:2]) and torch.equal(state[3], state0[3])
    assert torch.isnan(out[:2]).all() and not torch.isnan(out[2]).any()
    empty = torch.zeros(0, dtype=torch.int32, device=device)
    pydsa.c128_decode(state, torch.zeros(0, 2 * d, device=device), torch.zeros(0, d, device=device),
                      ape_for(d).to(device), empty, empty)


def test_decode_out_of_range_slot_is_skipped_and_counted_a_negative_one_skipped_silently(device):
    """As in every op (docs/spec.md, conventions): a negative slot is not held on this GPU."""
    d = 128
    state0 = random_state(4, d, torch.Generator().manual_seed(5)).to(device)
    state = state0.clone()
    out = torch.full((3, d), POISON, device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    pydsa.c128_decode(state, torch.randn(3, 2 * d, device=device), out, ape_for(d).to(device),
                      torch.tensor([4, -1, 1 << 31 - 1], dtype=torch.int32, device=device),
                      torch.tensor([5, 128, 1], dtype=torch.int32, device=device), error_count=counter)
    assert int(counter.item()) == 2  # slots 4 (past the 4 slots) and 2^30, not -1
    assert torch.equal(state, state0) and torch.isnan(out).all()


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_decode_reads_per_request_records_in_place(device, state_dtype, as_bytes):
    """seq_lens None: `indices` holds {seq_len, slot, load slot, unused} per request (sglang 0.5.23's
    decode records). The same call as three arrays, bit for bit: fresh, mid-chunk and closing rows,
    a load slot other than the slot, padding, a load slot not held here, out-of-range slots."""
    d, b = 512, 9
    gen = torch.Generator().manual_seed(11)
    state0 = random_state(12, d, gen).to(state_dtype).to(device)
    kv = torch.randn(b, 2 * d, generator=gen).to(device)
    ape = ape_for(d).to(device)
    seq = torch.tensor([1, 77, 128, 300, 0, 5, 129, 256, 40], dtype=torch.int32)
    slot = torch.tensor([0, 1, 2, 3, 1 << 30, 5, 6, 7, 20], dtype=torch.int32)
    load = torch.tensor([0, 9, 2, 10, 0, -1, 6, 11, 3], dtype=torch.int32)
    records = torch.stack([seq, slot, load, torch.full_like(seq, -1)], dim=1).contiguous()
    results = []
    for how in ("arrays", "records"):
        state = state0.clone()
        out = torch.full((b, d), POISON, device=device)
        counter = torch.zeros(1, dtype=torch.int32, device=device)
        if how == "arrays":
            pydsa.c128_decode(state, kv, out, ape, slot.to(device), seq.to(device), load_indices=load.to(device),
                              error_count=counter)
        else:
            r = records.view(torch.uint8) if as_bytes else records
            pydsa.c128_decode(state, kv, out, ape, r.to(device), None, error_count=counter)
        results.append((state.cpu(), out.cpu(), int(counter.item())))
    (s0, o0, e0), (s1, o1, e1) = results
    assert e0 == e1 == 1 and torch.equal(s0, s1) and torch.equal(o0.isnan(), o1.isnan())
    assert torch.equal(o0.nan_to_num(), o1.nan_to_num()) and not o1[2].isnan().any() and not torch.equal(s1, state0.cpu())
    with pytest.raises(ValueError, match="load_indices must be None"):
        pydsa.c128_decode(state0.clone(), kv, o1.to(device), ape, records.to(device), None, load_indices=load.to(device))
    with pytest.raises(ValueError, match=r"indices \(records"):
        pydsa.c128_decode(state0.clone(), kv, o1.to(device), ape, records[:, :3].contiguous().to(device), None)


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


# ---------------------------------------------------------------------------------------------
# CUDA graphs and device plans


def replan_and_check(plan, kv, out, stream, ape, schedule, run):
    """For each step's extends: re-plan into `plan`, fill kv with the step's rows, run() the
    captured or prepared prefill, and check every emitted chunk vector and that nothing else in
    `out` was written."""
    done = [0] * len(schedule[0])
    for extends in schedule:
        seq = np.array([done[b] + e for b, e in enumerate(extends)], np.int64)
        plan.plan(seq, np.array(extends, np.int64), num_tokens=kv.shape[0])
        rows = np.concatenate([stream.rows(b, done[b], done[b] + e) for b, e in enumerate(extends)])
        kv[:len(rows)].copy_(torch.from_numpy(rows))
        out.fill_(POISON)
        run()
        check_chunk_vectors(out, seq, np.array(extends, np.int64), stream, ape)
        done = list(seq)


def check_chunk_vectors(out, seq, ext, stream, ape):
    """Every chunk the plan of (seq, ext) closes has its offline vector at its ragged row of
    `out` (poisoned before the run), and no other row was written."""
    compress, _ = pyplan.plan_prefill(seq, ext)
    got = out.cpu()
    for rid, b, pos, _ in compress.tolist():
        assert rel_err(got[rid].numpy(), stream.chunk_vector(b, pos // CHUNK, ape)) < 1e-5
    assert int((~torch.isnan(got[:, 0])).sum()) == len(compress)


def test_device_plan_reused_across_replans(device):
    """A DevicePlan padded to its capacity: re-plan with other lengths, launch the prepared op
    again (no re-validation) and get the right chunk vectors; the work follows real counts."""
    d = 128
    stream = TokenStream(d, 11)
    ape = ape_for(d, 11).numpy()
    max_tokens = 1024
    plan = pydsa.DevicePlan(max_tokens, 4, device=device)
    state = torch.full((6, 1, 3 * d), POISON, device=device)
    kv = torch.zeros(max_tokens, 2 * d, device=device)
    out = torch.full((max_tokens, d), POISON, device=device)
    idx = torch.tensor([4, 1, 2, 0], dtype=torch.int32, device=device)
    op = pydsa.C128Prefill(state, kv, out, torch.from_numpy(ape).to(device), idx, plan)
    replan_and_check(plan, kv, out, stream, ape, ([300, 5, 128, 1], [200, 300, 128, 126], [1, 250, 1, 2]), op.launch)


@gpu
@pytest.mark.gpu
def test_cuda_graph_capture_once_replan_and_replay():
    """Capture prefill once; re-plan with other lengths outside the graph; replay; compare."""
    d = 256
    stream = TokenStream(d, 5)
    ape = ape_for(d, 5).numpy()
    dev = torch.device("cuda")
    max_tokens = 2048
    plan = pydsa.DevicePlan(max_tokens, 3, device=dev)
    state = torch.full((3, 1, 3 * d), POISON, device=dev)
    kv = torch.zeros(max_tokens, 2 * d, device=dev)
    out = torch.full((max_tokens, d), POISON, device=dev)
    idx = torch.tensor([2, 0, 1], dtype=torch.int32, device=dev)
    plan.plan(np.array([1, 1, 1]), np.array([1, 1, 1]), num_tokens=max_tokens)
    op = pydsa.C128Prefill(state, kv, out, torch.from_numpy(ape).to(dev), idx, plan)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        op.launch()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op.launch()
    state.fill_(POISON)

    def replay():
        graph.replay()
        torch.cuda.synchronize()

    replan_and_check(plan, kv, out, stream, ape, ([700, 129, 1], [100, 1000, 300], [5, 1, 127]), replay)


def _planned(seq, ext, tokens, batch_cap, device, poison=0xAB):
    """A DevicePlan whose buffer was poisoned before plan(seq, ext): (plan, buffer read back)."""
    plan = pydsa.DevicePlan(tokens, batch_cap, device=device)
    plan.buffer.fill_(poison)
    plan.plan(seq, ext, num_tokens=tokens)
    return plan, plan.buffer.cpu().numpy()


@pytest.mark.parametrize("b,per_request", [(1, 1), (3, 700), (64, 300), (2, 140_000), (16, 9_000)])
def test_device_plan_buffer_holds_the_counts_and_records(device, b, per_request):
    """After plan(), the device buffer holds {num_compress, num_write} and exactly the planner's
    records, in order, for plans carried by one upload launch and by several (over
    DSA_UPLOAD_RECORDS records); the records past the counts are left as they were."""
    rng = np.random.default_rng(b)
    ext = rng.integers(per_request // 2 + 1, per_request + 1, b).astype(np.int64)
    seq = ext + rng.integers(0, 300, b)
    tokens = int(ext.sum()) + 5
    compress, write = pyplan.plan_prefill(seq, ext)
    plan, raw = _planned(seq, ext, tokens, b + 2, device)
    assert (plan.num_compress, plan.num_write) == (len(compress), len(write))
    assert raw[:16].view(np.int64).tolist() == [len(compress), len(write)]
    cap_c = plan.compress_capacity
    got_c = raw[16:16 * (1 + cap_c)].view(pyplan.SEGMENT_DTYPE)
    got_w = raw[16 * (1 + cap_c):].view(pyplan.SEGMENT_DTYPE)
    assert np.array_equal(got_c[:len(compress)], compress) and np.array_equal(got_w[:len(write)], write)
    assert (raw[16 * (1 + len(compress)):16 * (1 + cap_c)] == 0xAB).all()
    assert (got_w[len(write):].view(np.uint8) == 0xAB).all()
    if b == 2:
        assert len(compress) + len(write) > _abi.UPLOAD_RECORDS  # several launches


def test_device_plan_replan_to_fewer_records_updates_the_counts(device):
    plan, _ = _planned(np.array([1000, 900]), np.array([1000, 900]), 2048, 2, device)
    plan.plan(np.array([5]), np.array([5]), num_tokens=2048)
    raw = plan.buffer.cpu().numpy()
    assert raw[:16].view(np.int64).tolist() == [0, 1]
    assert raw[16 * (1 + plan.compress_capacity):][:16].view(pyplan.SEGMENT_DTYPE).tolist() == [(4, 0, 4, 5)]


def test_device_plan_upload_takes_the_stream_looked_up_in_python(device):
    """Where the current stream cannot be read through the exchange API (an older torch: the reader of
    attributes), the launch looks it up through torch: the buffer holds the plan's counts and records."""
    from pydsa import _read
    _read.read_attributes_only(True)
    try:
        _upload_check(device)
    finally:
        _read.read_attributes_only(False)


def _upload_check(device):
    seq, ext = np.array([1000, 300], np.int64), np.array([900, 300], np.int64)
    compress, write = pyplan.plan_prefill(seq, ext)
    plan, raw = _planned(seq, ext, 2048, 3, device)
    assert raw[:16].view(np.int64).tolist() == [len(compress), len(write)]
    got_c = raw[16:16 * (1 + len(compress))].view(pyplan.SEGMENT_DTYPE)
    got_w = raw[16 * (1 + plan.compress_capacity):][:16 * len(write)].view(pyplan.SEGMENT_DTYPE)
    assert np.array_equal(got_c, compress) and np.array_equal(got_w, write)


def _upload_params(device, num_compress, num_write, cap_c, cap_w):
    import ctypes
    host = np.zeros(max(num_compress, num_write, 1), pyplan.SEGMENT_DTYPE)
    dst = torch.full((16 * (1 + cap_c + cap_w),), 0xAB, dtype=torch.uint8, device=device)
    p = _abi.new(c_structs.PlanUploadParams)
    p.device = -1 if device.type == "cpu" else device.index or 0
    p.compress = p.write = host.ctypes.data
    p.num_compress, p.num_write = num_compress, num_write
    p.device_counts = dst.data_ptr()
    p.device_compress, p.device_write = dst.data_ptr() + 16, dst.data_ptr() + 16 * (1 + cap_c)
    p.compress_capacity, p.write_capacity = cap_c, cap_w
    return p, dst, host, ctypes.byref(p)


@pytest.mark.parametrize("change,status,match", [
    (dict(num_compress=5), 3, "num_compress is 5 but compress_capacity is 4"),
    (dict(num_write=3), 3, "num_write is 3 but write_capacity is 2"),
    (dict(num_write=-1), 1, "must be >= 0"),
    (dict(device_counts=None), 1, "device_counts is null"),
    (dict(device_compress=None), 1, "compress or device_compress is null"),
    (dict(write=None), 1, "write or device_write is null"),
    (dict(device=999), 1, "device is 999"),
])
def test_upload_plan_refuses_bad_input_and_writes_nothing(device, change, status, match):
    p, dst, _, ref = _upload_params(device, 2, 1, 4, 2)
    for name, value in change.items():
        setattr(p, name, value)
    if device.type == "cpu" and "device" in change:
        status, match = (5, "no CUDA device") if not torch.cuda.is_available() else (status, match)
    assert _abi.lib.dsa_c128_upload_plan(ref, None) == status
    assert match in _abi.lib.dsa_last_error().decode()
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert (dst.cpu() == 0xAB).all()


@gpu
@pytest.mark.gpu
def test_replans_queued_behind_gpu_work_each_reach_their_own_launch():
    """Re-plans and prefills queued far ahead of the GPU (behind a long sleep, nothing waited on)
    each run on their own plan: stream order alone carries every plan to its launch."""
    d = 128
    token_stream = TokenStream(d, 21)
    ape = ape_for(d, 21).numpy()
    dev = torch.device("cuda")
    max_tokens = 1024
    plan = pydsa.DevicePlan(max_tokens, 3, device=dev)
    state = torch.full((3, 1, 3 * d), POISON, device=dev)
    idx = torch.tensor([1, 2, 0], dtype=torch.int32, device=dev)
    ape_dev = torch.from_numpy(ape).to(dev)
    schedule = ([300, 5, 128], [200, 300, 1], [1, 250, 127], [600, 2, 129], [128, 128, 128])
    steps, done = [], [0, 0, 0]
    for extends in schedule:
        seq = np.array([done[b] + e for b, e in enumerate(extends)], np.int64)
        rows = np.concatenate([token_stream.rows(b, done[b], done[b] + e) for b, e in enumerate(extends)])
        kv = torch.zeros(max_tokens, 2 * d)
        kv[:len(rows)] = torch.from_numpy(rows)
        steps.append((seq, np.array(extends, np.int64), kv.to(dev), torch.full((max_tokens, d), POISON, device=dev)))
        done = list(seq)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s or more: everything below is queued behind it
    for seq, ext, kv, out in steps:
        plan.plan(seq, ext, num_tokens=max_tokens)
        pydsa.c128_prefill(state, kv, out, ape_dev, idx, plan)
    assert torch.cuda.current_stream().query() is False  # the sleep was still running: nothing waited
    torch.cuda.synchronize()
    for seq, ext, _, out in steps:
        check_chunk_vectors(out, seq, ext, token_stream, ape)


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
# Bad input


def _valid(device, d=128, b=2):
    return dict(state=torch.zeros(4, 1, 3 * d, device=device), kv_score=torch.randn(b, 2 * d, device=device),
                out=torch.zeros(b, d, device=device), ape=torch.zeros(CHUNK, d, device=device),
                indices=torch.zeros(b, dtype=torch.int32, device=device),
                seq_lens=torch.ones(b, dtype=torch.int32, device=device))


@pytest.mark.parametrize("name,bad,error,match", [
    ("state", lambda t: t.double(), TypeError, "state must have dtype torch.float32"),
    ("state", lambda t: t[:, :, :300], ValueError, "multiple of 64"),
    ("kv_score", lambda t: t[:, :100], ValueError, r"kv_score must have shape \[2, 256\]"),
    ("out", lambda t: t[:1], ValueError, r"out must have shape \[2, 128\]"),
    ("out", lambda t: torch.zeros(128, 2, device=t.device).t(), ValueError, "out must be contiguous"),
    ("ape", lambda t: t[:127], ValueError, r"ape must have shape \[128, 128\]"),
    ("indices", lambda t: t.long(), TypeError, "indices must have dtype torch.int32"),
    ("seq_lens", lambda t: t.tolist(), TypeError, "seq_lens must be a torch.Tensor or an array with __dlpack__"),
])
def test_decode_bad_arguments_are_named(device, name, bad, error, match):
    args = _valid(device)
    args[name] = bad(args[name])
    with pytest.raises(error, match=match):
        pydsa.c128_decode(**args)


@gpu
@pytest.mark.gpu
def test_mixed_devices_are_refused():
    args = _valid("cuda")
    args["ape"] = args["ape"].cpu()
    with pytest.raises(ValueError, match="ape is on cpu but the other tensors are on cuda"):
        pydsa.c128_decode(**args)


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


def test_abi_decode_records_refuse_separate_arrays():
    """DSA_FLAG_DECODE_RECORDS: the records are `indices`; a seq_lens or load_indices beside them is an error
    and nothing runs."""
    import ctypes
    d, b = 128, 2
    state = torch.zeros(4, 1, 3 * d)
    kv, out, ape = torch.randn(b, 2 * d), torch.full((b, d), POISON), torch.zeros(CHUNK, d)
    rec = torch.tensor([[128, 0, 0, -1], [128, 1, 1, -1]], dtype=torch.int32)
    for field in ("seq_lens", "load_indices"):
        p = _abi.new(c_structs.DecodeParams)
        p.flags, p.device, p.head_dim, p.num_slots, p.batch_size = _abi.FLAG_DECODE_RECORDS, -1, d, 4, b
        p.state, p.kv_score, p.out, p.ape = state.data_ptr(), kv.data_ptr(), out.data_ptr(), ape.data_ptr()
        p.indices = rec.data_ptr()
        setattr(p, field, rec.data_ptr())
        assert _abi.lib.dsa_c128_decode(ctypes.byref(p), None) == 1  # DSA_STATUS_INVALID_ARGUMENT
        assert "seq_lens and load_indices must be null" in _abi.lib.dsa_last_error().decode()
        assert out.isnan().all()
        setattr(p, field, None)
        assert _abi.lib.dsa_c128_decode(ctypes.byref(p), None) == 0 and not out.isnan().any()
        out.fill_(POISON)


def test_abi_refuses_a_wrong_struct_size():
    import ctypes
    from pydsa import _abi
    p = _abi.new(c_structs.DecodeParams)
    p.struct_size -= 8
    status = _abi.lib.dsa_c128_decode(ctypes.byref(p), None)
    assert status == 2
    assert "struct_size" in _abi.lib.dsa_last_error().decode()


@gpu
@pytest.mark.gpu
def test_gpu_decode_refuses_a_batch_beyond_int32_before_launching():
    """The decode kernel indexes requests in 32 bits: a batch_size above INT32_MAX is refused by
    the C entry point with a clear error, and nothing runs (the buffers stay as they were)."""
    import ctypes
    d = 128
    args = _valid(torch.device("cuda"), d=d)
    state0 = args["state"].clone()
    p = _abi.new(c_structs.DecodeParams)
    p.device, p.head_dim, p.num_slots, p.batch_size = torch.cuda.current_device(), d, 4, 2 ** 31
    for field in ("state", "kv_score", "out", "ape", "indices", "seq_lens"):
        setattr(p, field, args[field].data_ptr())
    status = _abi.lib.dsa_c128_decode(ctypes.byref(p), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert status == 1
    assert "batch_size or head_dim too large" in _abi.lib.dsa_last_error().decode()
    assert torch.equal(args["state"], state0)


def _dlpack_arrays(device):
    """A DLPack-speaking array module for `device` (numpy on the host, CuPy on the GPU), or a skip."""
    if device.type == "cpu":
        return np.asarray
    cupy = pytest.importorskip("cupy")
    return lambda t: cupy.asarray(t)


def test_dlpack_arrays_are_taken_without_copies(device):
    """Arrays of other frameworks (numpy, CuPy) work through __dlpack__: the op writes into their
    memory and the result equals the torch call's."""
    to_array = _dlpack_arrays(device)
    d = 128
    gen = torch.Generator().manual_seed(9)
    state = (torch.rand(3, 1, 3 * d, generator=gen) + 1).to(device)
    kv = torch.randn(2, 2 * d, generator=gen).to(device)
    ape = ape_for(d).to(device)
    idx = torch.tensor([2, 0], dtype=torch.int32, device=device)
    seq = torch.tensor([128, 5], dtype=torch.int32, device=device)
    want_state, want_out = state.clone(), torch.full((2, d), POISON, device=device)
    pydsa.c128_decode(want_state, kv, want_out, ape, idx, seq)
    got_state, got_out = to_array(state.clone()), to_array(torch.full((2, d), POISON, device=device))
    pydsa.c128_decode(got_state, to_array(kv), got_out, to_array(ape), to_array(idx), to_array(seq))
    assert torch.equal(torch.from_dlpack(got_state), want_state)
    assert torch.equal(torch.from_dlpack(got_out).isnan(), want_out.isnan())
    with pytest.raises(TypeError, match="indices must have dtype torch.int32"):
        pydsa.c128_decode(got_state, to_array(kv), got_out, to_array(ape), to_array(idx.long()), to_array(seq))
