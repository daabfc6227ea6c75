"""Prefill plans in device memory (DevicePlan): the upload, re-planning, CUDA-graph capture and replay."""

import numpy as np
import pytest
import torch

import c_structs
import pydsa
import pyplan
from pydsa import _abi
from conftest import gpu
from reference import CHUNK, TokenStream, rel_err
from c128_cases import POISON, ape_for


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


def _replan_rig(d, seed, max_tokens, batch, slots, device):
    """What a re-planning test starts from: the token stream and ape (host) of `seed`, a DevicePlan of
    max_tokens tokens and `batch` requests, and a poisoned state of `slots` slots."""
    return (TokenStream(d, seed), ape_for(d, seed).numpy(), pydsa.DevicePlan(max_tokens, batch, device=device),
            torch.full((slots, 1, 3 * d), POISON, device=device))


def test_device_plan_reused_across_replans(device):
    """A DevicePlan padded to its capacity: re-plan with other lengths, launch the prepared op
    again (no re-validation) and get the right chunk vectors; the work follows real counts."""
    d, max_tokens = 128, 1024
    stream, ape, plan, state = _replan_rig(d, 11, max_tokens, 4, 6, device)
    kv = torch.zeros(max_tokens, 2 * d, device=device)
    out = torch.full((max_tokens, d), POISON, device=device)
    idx = torch.tensor([4, 1, 2, 0], dtype=torch.int32, device=device)
    op = pydsa.C128Prefill(state, kv, out, torch.from_numpy(ape).to(device), idx, plan)
    replan_and_check(plan, kv, out, stream, ape, ([300, 5, 128, 1], [200, 300, 128, 126], [1, 250, 1, 2]), op.launch)


@gpu
@pytest.mark.gpu
def test_cuda_graph_capture_once_replan_and_replay():
    """Capture prefill once; re-plan with other lengths outside the graph; replay; compare."""
    d, max_tokens, dev = 256, 2048, torch.device("cuda")
    stream, ape, plan, state = _replan_rig(d, 5, max_tokens, 3, 3, dev)
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
        assert len(compress) + len(write) > c_structs.CONSTANTS["DSA_UPLOAD_RECORDS"]  # several launches


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
    p = c_structs.new(c_structs.PlanUploadParams)
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
    d, max_tokens, dev = 128, 1024, torch.device("cuda")
    token_stream, ape, plan, state = _replan_rig(d, 21, max_tokens, 3, 3, dev)
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
