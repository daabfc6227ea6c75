"""Timing harness of `python -m pydsa bench`: device time by CUDA-graph replay, host time per call
beside an empty kernel launch, and the floors (copy bandwidth, empty kernel) every row is printed
beside.

Device time: CUDA-graph replay of 20 calls, on one input set ("graph us", the data may sit in
L2 as it does when a previous kernel just wrote it) and rotating input sets until 256 MB are
cycled through ("cold us", cold L2); each replay is timed by events behind a GPU spin, so the
host's submission of the replay is not counted (graph_us).
Host time: Python wall time per call, no sync.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from .. import _abi

D = 512
GRAPH_CALLS = 20
L2_ROTATE_BYTES = 256 << 20  # rotate input sets until this much memory is cycled through


# ---------------------------------------------------------------------------------------------
# Timers


# Host timings of GPU ops run in blocks of at most this many calls, each block followed by a
# synchronization that is not timed: the launches of a block fit the driver's launch queue (its
# entries and its parameter space, which a prefill launch carrying 4 KB of plan records fills
# fast), so a kernel slower than its launch never makes a launch wait, which would measure
# device time instead of host time.
HOST_BLOCK = 50


def _blocks(n: int, sync, block=HOST_BLOCK) -> list:
    if sync is None or n <= block:
        return [n]
    return [block] * (n // block)


def host_us(fn, n=2000, rounds=5, sync=None, block=HOST_BLOCK) -> float:
    """Median over rounds of Python wall time per call (no sync inside a timed block of `block`
    calls)."""
    for _ in range(min(n, 200)):
        fn()
    if sync:
        sync()
    results = []
    for _ in range(rounds):
        elapsed, calls = 0.0, 0
        for size in _blocks(n, sync, block):
            t0 = time.perf_counter()
            for _ in range(size):
                fn()
            elapsed += time.perf_counter() - t0
            calls += size
            if sync:
                sync()
        results.append(elapsed / calls * 1e6)
    return statistics.median(results)


_EMPTY = {}


def host_vs_empty(fn, n=2000, rounds=7, fetch_stream=False) -> tuple:
    """(µs per call of fn, µs per empty-kernel ctypes launch), measured in alternating blocks of
    HOST_BLOCK calls so that drift in the host's speed affects both alike. With fetch_stream the
    empty launch looks up the current stream on every call, as a call without stream= does."""
    dev = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    lib_empty = _abi.lib.dsa_empty_launch
    raw = torch._C._cuda_getCurrentRawStream
    empty = (lambda d, s: lib_empty(d, raw(d))) if fetch_stream else lib_empty
    sync = torch.cuda.synchronize
    for _ in range(200):
        fn()
        empty(dev, stream)
    sync()
    ours, floor = [], []
    blocks = max(1, n // HOST_BLOCK)
    for _ in range(rounds * blocks):
        t0 = time.perf_counter()
        for _ in range(HOST_BLOCK):
            fn()
        ours.append((time.perf_counter() - t0) / HOST_BLOCK * 1e6)
        sync()
        t0 = time.perf_counter()
        for _ in range(HOST_BLOCK):
            empty(dev, stream)
        floor.append((time.perf_counter() - t0) / HOST_BLOCK * 1e6)
        sync()
    return statistics.median(ours), statistics.median(floor)


# A replay is timed from an event that the GPU reaches while the host is still submitting the
# replay, unless the GPU is kept busy until the replay is queued: a spin of GRAPH_SPIN_CYCLES
# (about 0.1 ms, longer than the host takes to record the event and submit the replay) is queued
# before the start event, so the events time the replay's device work alone.
# `--graph-idle-start` turns the spin off (the way the bench measured before it).
GRAPH_SPIN_CYCLES = 200_000
GRAPH_BUSY_START = True  # set by main (--graph-idle-start)


def capture_graph(calls) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of GRAPH_CALLS calls (cycling through `calls`), after one warm-up round on a
    side stream; replayed once and synchronized."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(GRAPH_CALLS):
            calls[i % len(calls)]()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def graph_us(calls, replays=30, busy_start=None) -> float:
    """Device µs per call: a CUDA graph of GRAPH_CALLS calls (cycling through `calls`). With
    busy_start False (default: GRAPH_BUSY_START) the GPU idles when the start event is recorded,
    so each replay's time also counts the host's submission of it."""
    busy_start = GRAPH_BUSY_START if busy_start is None else busy_start
    graph = capture_graph(calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        if busy_start:
            torch.cuda._sleep(GRAPH_SPIN_CYCLES)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / GRAPH_CALLS)
    del graph
    return statistics.median(times)


def graph_us_alternating(calls, beside, rounds=5) -> tuple:
    """(device us per call of `calls`, of `beside`) as medians over alternating rounds of graph_us.
    Graph replay times drift within a run (the empty kernel measured 0.71 and 0.89 us minutes apart
    in one process on an H200), so two figures that are compared are measured side by side."""
    times, others = [], []
    for _ in range(rounds):
        others.append(graph_us(beside))
        times.append(graph_us(calls))
    return statistics.median(times), statistics.median(others)


def graph_us_beside_empty(calls, rounds=5) -> tuple:
    """(device us per call, an empty kernel's device us): latency-bound rows are judged on their
    time above the empty kernel measured beside them (graph_us_alternating)."""
    dev = torch.cuda.current_device()
    empty = _abi.lib.dsa_empty_launch
    return graph_us_alternating(calls, [lambda: empty(dev, torch.cuda.current_stream().cuda_stream)], rounds)


def event_us(fn, n=20, rounds=7) -> float:
    """Device-side µs per call of eager code (launch gaps included), by CUDA events."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / n)
    return statistics.median(times)


def rotation(nbytes: int) -> int:
    return max(1, min(8, math.ceil(L2_ROTATE_BYTES / max(nbytes, 1))))


# ---------------------------------------------------------------------------------------------
# Floors


def copy_bandwidth_tbps() -> float:
    """Device-to-device copy of 1 GiB, bytes read plus bytes written per second."""
    src = torch.rand(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    t = event_us(lambda: dst.copy_(src), n=5, rounds=7)
    return 2 * src.numel() * 4 / (t * 1e-6) / 1e12


def floors() -> dict:
    dev = torch.cuda.current_device()
    copy_tbps = copy_bandwidth_tbps()
    stream = torch.cuda.current_stream().cuda_stream
    empty = _abi.lib.dsa_empty_launch
    sync = torch.cuda.synchronize
    raw = torch._C._cuda_getCurrentRawStream
    one = torch.zeros(1, device="cuda")
    return {
        "copy_bandwidth_tbps": copy_tbps,
        "empty_kernel_graph_us": graph_us([lambda: empty(dev, torch.cuda.current_stream().cuda_stream)]),
        "empty_kernel_host_us": host_us(lambda: empty(dev, stream), sync=sync),
        "empty_kernel_host_raw_stream_us": host_us(lambda: empty(dev, raw(dev)), sync=sync),
        "empty_kernel_host_torch_stream_us": host_us(lambda: empty(dev, torch.cuda.current_stream().cuda_stream), sync=sync),
        "torch_one_element_graph_us": graph_us([lambda: one.add_(1)]),
        "torch_one_element_host_us": host_us(lambda: one.add_(1), sync=sync),
    }


# ---------------------------------------------------------------------------------------------
# Planner


def median_graph_us(cases: dict, rounds: int) -> dict:
    """{name: median over rounds of graph_us(calls) x len(calls)} for {name: [calls of one step]}, the
    cases interleaved round by round."""
    t = {k: [] for k in cases}
    for _ in range(rounds):
        for k, calls in cases.items():
            t[k].append(graph_us(calls) * len(calls))
    return {k: statistics.median(v) for k, v in t.items()}
