"""`python -m pydsa bench`: one harness for every kernel and the planner.

Device time: CUDA-graph replay of 20 calls, on one input set ("graph us", the data may sit in
L2 as it does when a previous kernel just wrote it) and rotating input sets until 256 MB are
cycled through ("cold us", cold L2); each replay is timed by events behind a GPU spin, so the
host's submission of the replay is not counted (graph_us).
Host time: Python wall time per call, no sync. Every row is printed beside its floor (copy
bandwidth, an empty kernel launch) and its baseline (the torch way), all measured in this run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import pyplan

from . import _abi, baselines
from .c128 import C128Decode, C128Prefill, DevicePlan, c128_decode, c128_prefill, plan_prefill_c
from .metadata import MetadataCopy

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
GRAPH_BUSY_START = True


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


def planner_workload(b: int, rng) -> tuple:
    if b == 1:
        return np.array([1025], np.int64), np.array([25], np.int64)
    # Mostly chunked prefills and short extends, now and then a long prompt (about 300 tokens each
    # on average, as in the reference figures).
    ext = np.where(rng.random(b) < 0.01, rng.integers(1, 8193, b), rng.integers(1, 513, b)).astype(np.int64)
    prefix = rng.integers(0, 100_001, b).astype(np.int64)
    return prefix + ext, ext


def bench_planner(rows: list) -> None:
    rng = np.random.default_rng(0)
    for b in (1, 16, 64, 256, 1024):
        seq, ext = planner_workload(b, rng)
        tokens = int(ext.sum())
        cap = pyplan.compress_capacity(tokens, b)
        out = (np.empty(cap, pyplan.SEGMENT_DTYPE), np.empty(b, pyplan.SEGMENT_DTYPE))
        n = 20000 if b <= 64 else 4000
        row = dict(kernel="planner", case=f"B={b} ({tokens} tokens)", batch=b, tokens=tokens,
                   cython_us=host_us(lambda: pyplan.plan_prefill(seq, ext), n=n),
                   cython_out_us=host_us(lambda: pyplan.plan_prefill(seq, ext, out=out), n=n),
                   cython_graph_us=host_us(lambda: pyplan.plan_prefill(seq, ext, num_tokens=tokens, graph=True, out=out), n=n),
                   c_ctypes_us=host_us(lambda: plan_prefill_c(seq, ext), n=n // 4),
                   python_us=host_us(lambda: baselines.plan_prefill_python(seq.tolist(), ext.tolist()), n=max(3, 2000 // b), rounds=3))
        if torch.cuda.is_available():  # plan() and the upload of its records (one launch per 1024 records)
            device_plan = DevicePlan(tokens, b)
            row["device_plan_us"] = host_us(lambda: device_plan.plan(seq, ext, num_tokens=tokens), n=n // 4,
                                            sync=torch.cuda.synchronize)
        rows.append(row)
    # P8 planner part: graph mode, 8 K-token capacity, one 100-token request.
    seq, ext = np.array([1100], np.int64), np.array([100], np.int64)
    cap = pyplan.compress_capacity(8192, 1)
    out = (np.empty(cap, pyplan.SEGMENT_DTYPE), np.empty(1, pyplan.SEGMENT_DTYPE))
    row = dict(kernel="planner", case="graph mode, 8K capacity, 1 x 100 tokens", batch=1, tokens=100,
               cython_graph_us=host_us(lambda: pyplan.plan_prefill(seq, ext, num_tokens=8192, graph=True, out=out), n=20000))
    if torch.cuda.is_available():
        plan = DevicePlan(8192, 1)
        row["device_plan_us"] = host_us(lambda: plan.plan(seq, ext, num_tokens=8192), n=5000, sync=torch.cuda.synchronize)
    rows.append(row)


# ---------------------------------------------------------------------------------------------
# c128


def _decode_set(b, gen):
    state = torch.randn(b, 1, 3 * D, device="cuda", generator=gen)
    state[:, :, D:2 * D].uniform_(1, 30, generator=gen)
    kv = torch.randn(b, 2 * D, device="cuda", generator=gen)
    out = torch.empty(b, D, device="cuda")
    idx = torch.randperm(b, device="cuda", generator=gen).to(torch.int32)
    seq = torch.randint(1, 100_000, (b,), device="cuda", generator=gen, dtype=torch.int32)
    return state, kv, out, idx, seq


def bench_c128(rows: list, fl: dict) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    ape = torch.randn(128, D, device="cuda", generator=gen)
    bw = fl["copy_bandwidth_tbps"]
    for b in (1, 32, 256, 1024, 8192):
        nbytes = b * D * 8 * 4
        sets = [_decode_set(b, gen) for _ in range(rotation(nbytes))]
        ops = [C128Decode(s, kv, o, ape, i, q) for s, kv, o, i, q in sets]
        t, t_empty = graph_us_beside_empty([ops[0].launch])
        s0 = sets[0]
        raw = torch.cuda.current_stream().cuda_stream
        host, empty_host = host_vs_empty(ops[0].launch)
        host_given, empty_given = host_vs_empty(lambda: ops[0].launch(raw))
        rows.append(dict(
            kernel="c128_decode", case=f"decode B={b}", bytes=nbytes, graph_us=t, empty_graph_us=t_empty,
            graph_cold_us=graph_us([op.launch for op in ops]) if len(ops) > 1 else t,
            tbps=nbytes / t / 1e6, frac_copy_bw=nbytes / t / 1e6 / bw,
            torch_eager_us=event_us(lambda: baselines.c128_decode_torch(s0[0], s0[1], s0[2], ape, s0[3], s0[4])),
            host_us=host, host_empty_us=empty_host,
            host_stream_given_us=host_given, host_stream_given_empty_us=empty_given,
            host_oneshot_us=host_us(lambda: c128_decode(s0[0], s0[1], s0[2], ape, s0[3], s0[4]), n=500,
                                    sync=torch.cuda.synchronize),
            **dict(zip(("host_oneshot_vs_us", "host_oneshot_empty_us"),
                       host_vs_empty(lambda: c128_decode(s0[0], s0[1], s0[2], ape, s0[3], s0[4]), n=500,
                                     fetch_stream=True)))))
    for b in (1, 8192):  # bf16 state: 20 bytes per channel per request instead of 32
        nbytes = b * D * 20
        s0 = _decode_set(b, gen)
        state16 = s0[0].to(torch.bfloat16)
        t, t32 = graph_us_alternating([C128Decode(state16, s0[1], s0[2], ape, s0[3], s0[4]).launch],
                                      [C128Decode(s0[0], s0[1], s0[2], ape, s0[3], s0[4]).launch])
        rows.append(dict(kernel="c128_decode", case=f"decode B={b}, bf16 state", bytes=nbytes, graph_us=t,
                         tbps=nbytes / t / 1e6, frac_copy_bw=nbytes / t / 1e6 / bw, fp32_state_graph_us=t32,
                         speedup_vs_fp32=t32 / t, variant="bf16 state"))
    rng = np.random.default_rng(1)
    cases = [("prefill 1 x 128", [128], [0]),
             ("prefill 4 x 128, prefixes <= 4096", [128] * 4, [2748, 3298, 92, 3310]),
             ("prefill 64 x (1-600), prefixes <= 100K", list(rng.integers(1, 601, 64)), list(rng.integers(0, 100_001, 64))),
             ("prefill 1 x 8K", [8192], [0]),
             ("prefill 8 x 1K, prefixes <= 4096", [1024] * 8, list(rng.integers(0, 4097, 8))),
             ("prefill 1 x 32K", [32768], [0]),
             ("prefill 32 x 1K, prefixes <= 4096", [1024] * 32, list(rng.integers(0, 4097, 32))),
             ("prefill 1 x 128K", [131072], [0]),
             ("prefill 128 x 1K, prefixes <= 4096", [1024] * 128, list(rng.integers(0, 4097, 128)))]
    for name, extends, prefixes in cases:
        ext = np.array(extends, np.int64)
        seq = ext + np.array(prefixes, np.int64)
        n, nb = int(ext.sum()), len(ext)
        compress, write = pyplan.plan_prefill(seq, ext)
        mid = int(sum(1 for r in compress.tolist() + write.tolist() if (r[2] % 128) - r[3] + 1 != 0))
        nbytes = 4 * (n * 2 * D + len(compress) * D + mid * 3 * D + len(write) * 3 * D)
        sets = []
        for _ in range(rotation(nbytes)):
            state = torch.randn(nb, 1, 3 * D, device="cuda", generator=gen)
            state[:, :, D:2 * D].uniform_(1, 30, generator=gen)
            kv = torch.randn(n, 2 * D, device="cuda", generator=gen)
            out = torch.empty(n, D, device="cuda")
            idx = torch.arange(nb, dtype=torch.int32, device="cuda")
            sets.append(C128Prefill(state, kv, out, ape, idx, (compress, write)))
        t, t_empty = graph_us_beside_empty([sets[0].launch])
        cold = graph_us([op.launch for op in sets]) if len(sets) > 1 else t
        whole = (n // 128) * 128
        kv0 = sets[0]._keep[1]
        torch_us = event_us(lambda: baselines.c128_chunks_torch(kv0[:whole], ape)) if whole else float("nan")
        op0 = sets[0]
        args0 = op0._keep[:5]
        oneshot, oneshot_empty = host_vs_empty(lambda: c128_prefill(*args0, (compress, write)), n=500, fetch_stream=True)
        # Back-to-back one-shot calls timed on the GPU: host- or device-bound, whichever is slower.
        eager = event_us(lambda: c128_prefill(*args0, (compress, write)))
        rows.append(dict(kernel="c128_prefill", case=name, bytes=nbytes, graph_us=t, empty_graph_us=t_empty,
                         graph_cold_us=cold, tbps=nbytes / t / 1e6,
                         frac_copy_bw=nbytes / t / 1e6 / bw, torch_eager_us=torch_us,
                         host_us=host_us(sets[0].launch, sync=torch.cuda.synchronize),
                         host_oneshot_us=oneshot, host_oneshot_empty_us=oneshot_empty, eager_oneshot_us=eager))
        if n >= 32768:  # bf16 state and compact output on the same plan and inputs
            state0, kv0, out0, _, idx0 = op0._keep[:5]
            state16 = state0.to(torch.bfloat16)
            compact = torch.empty(len(compress), D, device="cuda")
            variants = {"bf16 state": C128Prefill(state16, kv0, out0, ape, idx0, (compress, write)),
                        "compact output": C128Prefill(state0, kv0, compact, ape, idx0, (compress, write), compact=True)}
            for label, op in variants.items():
                tv, t_fp32 = graph_us_alternating([op.launch], [op0.launch])  # beside the fp32 ragged op
                vbytes = nbytes - (2 * 4 * D * (mid + len(write)) if label == "bf16 state" else 0)
                rows.append(dict(kernel="c128_prefill", case=f"{name}, {label}", bytes=vbytes, graph_us=tv,
                                 tbps=vbytes / tv / 1e6, frac_copy_bw=vbytes / tv / 1e6 / bw, same_plan_fp32_ragged_us=t_fp32,
                                 variant=label))
    # P8: CUDA-graph mode with an 8 K-token DevicePlan holding one 100-token request.
    ext, seq = np.array([100], np.int64), np.array([1100], np.int64)
    state = torch.randn(1, 1, 3 * D, device="cuda", generator=gen)
    state[:, :, D:2 * D].uniform_(1, 30, generator=gen)
    kv = torch.randn(8192, 2 * D, device="cuda", generator=gen)
    out = torch.empty(8192, D, device="cuda")
    idx = torch.zeros(1, dtype=torch.int32, device="cuda")
    plan = DevicePlan(8192, 1).plan(seq, ext, num_tokens=8192)
    graph_op = C128Prefill(state, kv, out, ape, idx, plan)
    plain_op = C128Prefill(state, kv[:100], out[:100], ape, idx, pyplan.plan_prefill(seq, ext))
    tg, tp = graph_us([graph_op.launch]), graph_us([plain_op.launch])
    # Per step in the CUDA-graph pattern: plan() (host plan and upload launch) before the replay;
    # and plan() followed by an eager call with the DevicePlan.
    replan, replan_empty = host_vs_empty(lambda: plan.plan(seq, ext, num_tokens=8192), n=500, fetch_stream=True)
    args = (state, kv, out, ape, idx, plan)
    pair, pair_empty = host_vs_empty(lambda: (plan.plan(seq, ext, num_tokens=8192), c128_prefill(*args)), n=500,
                                     fetch_stream=True)
    rows.append(dict(kernel="c128_prefill", case="graph mode: 8K capacity, 1 x 100 tokens", bytes=100 * 2 * D * 4,
                     graph_us=tg, plain_graph_us=tp, graph_over_plain=tg / tp,
                     host_us=host_us(graph_op.launch, sync=torch.cuda.synchronize),
                     host_replan_us=replan, host_replan_empty_us=replan_empty,
                     host_replan_oneshot_us=pair, host_replan_oneshot_empty_us=pair_empty))


# ---------------------------------------------------------------------------------------------
# Metadata copy


def _metadata_set(mode, bs, width, rows, expanded, real_cols, meta, k, gen):
    i32 = dict(dtype=torch.int32, device="cuda")

    def r(*shape):
        return torch.randint(0, 1 << 30, shape, generator=gen, **i32)

    n = bs if mode == "decode" else expanded
    src = dict(cache_seqlens=r(bs), cu_seqlens_k=r(bs + 1), page_indices=r(rows, width),
               dsa_cache_seqlens=r(n), dsa_cu_seqlens_k=r(n + 1))
    if mode != "decode":
        src["seqlens_expanded"] = r(n)
    if real_cols:
        src["real_page_table"] = r(rows, real_cols)
    if meta:
        src["num_splits"], src["flashmla_metadata"] = r(n + 1), r(meta)
    dsts = []
    for _ in range(k):
        d = dict(cache_seqlens=r(bs), cu_seqlens_k=r(bs + 1), page_table_1=r(rows, width + 128),
                 dsa_cache_seqlens=r(n), dsa_cu_seqlens_k=r(n + 1))
        if mode != "decode":
            d["seqlens_expanded"] = r(n)
        if real_cols:
            d["real_page_table"] = r(rows, real_cols + 64)
        if meta:
            d["flashmla_num_splits"], d["flashmla_metadata"] = r(n + 1), r(meta)
        dsts.append(d)
    elements = sum(t.numel() for t in src.values()) - 2  # element 0 of both cu_seqlens is not copied
    return src, dsts, elements


def bench_metadata(rows: list, fl: dict) -> None:
    gen = torch.Generator(device="cuda").manual_seed(2)
    bw = fl["copy_bandwidth_tbps"]
    cases = [("decode", 1, 128, 0, None, None), ("decode", 32, 2048, 0, None, None),
             ("decode", 128, 4096, 0, None, None), ("decode", 64, 8192, 0, 128, 1024),
             ("decode", 256, 32768, 0, None, None), ("decode", 512, 65536, 0, None, None),
             ("target_verify", 32, 2048, 128, None, None)]
    for mode, bs, width, expanded, real_cols, meta in cases:
        rows_ = bs if mode == "decode" else expanded
        for k in (1, 3):
            src, dsts, elements = _metadata_set(mode, bs, width, rows_, expanded, real_cols, meta, k, gen)
            nbytes = elements * 4 * (1 + k)
            sets = [(src, dsts)] + [_metadata_set(mode, bs, width, rows_, expanded, real_cols, meta, k, gen)[:2]
                                    for _ in range(rotation(nbytes) - 1)]
            ops = [(MetadataCopy(d, mode=mode), s) for s, d in sets]
            calls = [(lambda op=op, s=s: op(**s)) for op, s in ops]
            t, t_empty = graph_us_beside_empty(calls[:1])
            cold = graph_us(calls) if len(calls) > 1 else t
            torch_calls = [(lambda s=s, d=d: [baselines.metadata_copy_torch(s, x, mode) for x in d]) for s, d in sets]
            tt = graph_us(torch_calls[:1])
            op0, s0 = ops[0]
            args = [s0[key] for key in ("cache_seqlens", "cu_seqlens_k", "page_indices", "dsa_cache_seqlens", "dsa_cu_seqlens_k")]
            extra = {key: s0[key] for key in ("seqlens_expanded", "real_page_table", "num_splits", "flashmla_metadata") if key in s0}
            label = f"{mode} {bs}x{width}" + (" +real+flashmla" if real_cols else "") + (f" ({rows_} rows)" if mode != "decode" else "")
            # A second set of source tensor objects with the same contents: alternating the two makes
            # every call a "new sources" call, which re-checks them.
            twin = [t.clone() for t in args]
            twin_extra = {key: v.clone() for key, v in extra.items()}
            flip = [0]

            def fresh_sources():
                flip[0] ^= 1
                if flip[0]:
                    op0(*twin, **twin_extra)
                else:
                    op0(*args, **extra)

            host, empty_host = host_vs_empty(lambda: op0(*args, **extra))
            raw = torch.cuda.current_stream().cuda_stream
            host_given, empty_given = host_vs_empty(lambda: op0(*args, **extra, stream=raw))
            op0.bind(*args, **extra)
            host_bound, empty_bound = host_vs_empty(lambda: op0.launch(raw))
            rows.append(dict(kernel="metadata_copy", case=f"{label} K={k}", k=k, bytes=nbytes, graph_us=t, empty_graph_us=t_empty,
                             graph_cold_us=cold,
                             tbps=nbytes / t / 1e6, frac_copy_bw=nbytes / t / 1e6 / bw, torch_graph_us=tt,
                             host_us=host, host_empty_us=empty_host,
                             host_stream_given_us=host_given, host_stream_given_empty_us=empty_given,
                             host_bound_launch_us=host_bound, host_bound_launch_empty_us=empty_bound,
                             host_new_sources_us=host_us(fresh_sources, sync=torch.cuda.synchronize),
                             **dict(zip(("host_new_sources_vs_us", "host_new_sources_empty_us"),
                                        host_vs_empty(fresh_sources, fetch_stream=True))),
                             torch_host_us=host_us(torch_calls[0], n=500, sync=torch.cuda.synchronize)))
            del sets, ops, calls, torch_calls
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Per-step: what an engine runs per forward step of DeepSeek-V4 (61 layers)

LAYERS = 61


def _step_time(step, n=20) -> tuple:
    """(host us per step without sync, device us per step by CUDA events, launch gaps included).
    Host time is timed one step at a time (a step's 61-122 launches fit the launch queue)."""
    step()
    torch.cuda.synchronize()
    host = host_us(step, n=n, rounds=5, sync=torch.cuda.synchronize, block=1)
    return host, event_us(step, n=5, rounds=5)


def bench_step(rows: list, fl: dict) -> None:
    gen = torch.Generator(device="cuda").manual_seed(3)
    b = 64
    apes = [torch.randn(128, D, device="cuda", generator=gen) for _ in range(LAYERS)]
    decode_layers = [_decode_set(b, gen) for _ in range(LAYERS)]
    mds, dsts, _ = _metadata_set("decode", b, 4096, b, 0, None, None, 3, gen)
    copy = MetadataCopy(dsts)
    src = [mds[k] for k in ("cache_seqlens", "cu_seqlens_k", "page_indices", "dsa_cache_seqlens", "dsa_cu_seqlens_k")]

    def decode_step():
        copy(*src)
        for (state, kv, out, idx, seq), ape in zip(decode_layers, apes):
            c128_decode(state, kv, out, ape, idx, seq)

    host, device = _step_time(decode_step)
    ops = [C128Decode(state, kv, out, ape, idx, seq) for (state, kv, out, idx, seq), ape in zip(decode_layers, apes)]
    copy.bind(*src)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        copy.launch()
        for op in ops:
            op.launch()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        copy.launch()
        for op in ops:
            op.launch()
    ghost, gdevice = _step_time(graph.replay)
    rows.append(dict(kernel="step", case=f"decode step: {LAYERS} layers x c128 decode B={b} + K=3 metadata refresh",
                     bytes=LAYERS * b * D * 32, graph_us=gdevice, eager_host_us=host, eager_device_us=device,
                     graph_host_us=ghost, graph_device_us=gdevice))
    del graph, ops
    decode_layers.clear()
    # Chunked prefill: 8 requests of 1-2 K new tokens after prefixes, planned once per step.
    rng = np.random.default_rng(4)
    ext = rng.integers(1024, 2049, 8).astype(np.int64)
    seq = ext + rng.integers(0, 20000, 8).astype(np.int64)
    n = int(ext.sum())
    idx = torch.arange(8, dtype=torch.int32, device="cuda")
    prefill_layers = []
    for ape in apes:
        state = torch.randn(8, 1, 3 * D, device="cuda", generator=gen)
        state[:, :, D:2 * D].uniform_(1, 30, generator=gen)
        prefill_layers.append((state, torch.randn(n, 2 * D, device="cuda", generator=gen), torch.empty(n, D, device="cuda"), ape))

    # By default each layer's call is one cooperative launch (the plan's items fit one wave in
    # 128-channel tiles); with cooperative=False, two ordinary launches split by state reads.
    for cooperative in (True, False):
        def prefill_step():
            plan = pyplan.plan_prefill(seq, ext)
            for state, kv, out, ape in prefill_layers:
                c128_prefill(state, kv, out, ape, idx, plan, cooperative=cooperative)

        host, device = _step_time(prefill_step, n=5)
        rows.append(dict(kernel="step", case=f"prefill step: {LAYERS} layers x c128 prefill, 8 x 1-2K tokens ({n}) with prefixes"
                         + ("" if cooperative else ", cooperative=False"),
                         bytes=LAYERS * n * 2 * D * 4, graph_us=device, eager_host_us=host, eager_device_us=device))
    prefill_layers.clear()
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# sglang-style calls beside the direct calls (host time)


def bench_sglang(rows: list, fl: dict) -> None:
    from . import sglang
    gen = torch.Generator(device="cuda").manual_seed(5)
    i32 = dict(dtype=torch.int32, device="cuda")
    bs, width = 32, 2048
    src, dsts, _ = _metadata_set("decode", bs, width, bs, 0, None, None, 3, gen)
    order = ("cache_seqlens", "cu_seqlens_k", "page_indices", "dsa_cache_seqlens", "dsa_cu_seqlens_k")
    args = [src[k] for k in order]
    twin = [t.clone() for t in args]
    dkeys = ("cache_seqlens", "cu_seqlens_k", "page_table_1", "dsa_cache_seqlens", None, "dsa_cu_seqlens_k",
             None, None, None)
    groups = [[d[k] if k else None for k in dkeys] for d in dsts]
    sg_src = [src["cache_seqlens"], src["cu_seqlens_k"], src["page_indices"], src["dsa_cache_seqlens"], None,
              src["dsa_cu_seqlens_k"], None, None, None]
    one, three = MetadataCopy(dsts[0]), MetadataCopy(dsts)
    flip = [0]

    def fresh(op):
        flip[0] ^= 1
        op(*(twin if flip[0] else args))

    drop4 = lambda xs: [x for i, x in enumerate(xs) if i != 4]  # noqa: E731
    single = sg_src + groups[0] + [0, bs, width, 0, 0]
    multi = drop4(sg_src) + drop4(groups[0]) + drop4(groups[1]) + drop4(groups[2]) + [bs, width, 0]
    calls = [("fused_metadata_copy_cuda, DECODE 32x2048", lambda: sglang.fused_metadata_copy_cuda(*single),
              lambda: fresh(one)),
             ("fused_metadata_copy_multi_cuda, 32x2048", lambda: sglang.fused_metadata_copy_multi_cuda(*multi),
              lambda: fresh(three))]
    s0 = _decode_set(64, gen)
    ape = torch.randn(128, D, device="cuda", generator=gen)
    calls.append(("c128_online_decode, B=64", lambda: sglang.c128_online_decode(s0[0], s0[1], s0[2], ape, s0[3], s0[4]),
                  lambda: c128_decode(s0[0], s0[1], s0[2], ape, s0[3], s0[4])))
    seq, ext = np.array([1100, 300], np.int64), np.array([100, 300], np.int64)
    n = 400
    compress, write = pyplan.plan_prefill(seq, ext)
    cplan = torch.from_numpy(compress.view(np.uint8).reshape(-1, 16).copy()).cuda()
    wplan = torch.from_numpy(write.view(np.uint8).reshape(-1, 16).copy()).cuda()
    state = torch.rand(2, 1, 3 * D, device="cuda") + 1
    kv, out, idx = torch.randn(n, 2 * D, device="cuda"), torch.empty(n, D, device="cuda"), torch.arange(2, **i32)
    calls.append(("c128_online_prefill, 2 requests, 400 tokens",
                  lambda: sglang.c128_online_prefill(state, kv, out, ape, idx, cplan, wplan),
                  lambda: c128_prefill(state, kv, out, ape, idx, (cplan, wplan))))
    seq_t, ext_t = torch.from_numpy(seq), torch.from_numpy(ext)
    cp, wp = torch.empty(n, 16, dtype=torch.uint8), torch.empty(n, 16, dtype=torch.uint8)
    calls.append(("plan_compress_online_prefill, 2 requests",
                  lambda: sglang.plan_compress_online_prefill(ext_t, seq_t, cp, wp, False),
                  lambda: pyplan.plan_prefill(seq_t, ext_t, num_tokens=n, out=(cp, wp), return_counts=True)))
    for name, sg, direct in calls:
        sg_us, empty_us = host_vs_empty(sg, n=1000, fetch_stream=True)
        direct_us, empty2_us = host_vs_empty(direct, n=1000, fetch_stream=True)
        rows.append(dict(kernel="sglang", case=name, sglang_host_us=sg_us, direct_host_us=direct_us,
                         host_empty_us=empty_us, direct_host_empty_us=empty2_us))


# ---------------------------------------------------------------------------------------------
# Report


def targets(rows: list, fl: dict) -> list:
    """BENCH.md targets evaluated on this run's rows: (id, what, measured, ok)."""
    out = []

    def add(tid, what, value, ok):
        out.append(dict(id=tid, what=what, measured=value, ok=bool(ok)))

    md = [r for r in rows if r["kernel"] == "metadata_copy"]
    for r in md:
        if r["bytes"] >= 256e6:
            add("P1", f"{r['case']}: >= 0.90 x copy bw", f"{r['frac_copy_bw']:.3f}", r["frac_copy_bw"] >= 0.90)
        elif r["bytes"] >= 64e6:
            add("P1", f"{r['case']}: >= 0.85 x copy bw", f"{r['frac_copy_bw']:.3f}", r["frac_copy_bw"] >= 0.85)
        if r["bytes"] <= 64e3:
            lim = 1.4 if r["k"] == 1 else 1.8
            add("P2", f"{r['case']}: graph <= {lim} us", f"{r['graph_us']:.2f} us", r["graph_us"] <= lim)
        if r["graph_us"] < r["host_empty_us"]:  # launch-bound; otherwise host time is device time
            # BENCH's floor fetches the stream once; so do these figures (stream= passed).
            ratio = r["host_bound_launch_us"] / r["host_bound_launch_empty_us"]
            add("P3", f"{r['case']}: bound launch() host <= 1.2 x empty launch measured alongside",
                f"{r['host_bound_launch_us']:.2f} us = {ratio:.2f}x (call with sources: "
                f"{r['host_stream_given_us'] / r['host_stream_given_empty_us']:.2f}x, and fetching the current "
                f"stream: {r['host_us'] / r['host_empty_us']:.2f}x)", ratio <= 1.2)
        add("P9", f"{r['case']}: >= 2x torch graph", f"{r['torch_graph_us'] / r['graph_us']:.1f}x",
            r["torch_graph_us"] / r["graph_us"] >= 2)
        add("P9", f"{r['case']}: >= 5x torch host", f"{r['torch_host_us'] / r['host_us']:.1f}x",
            r["torch_host_us"] / r["host_us"] >= 5)
    for r in rows:
        if r.get("variant"):
            continue  # judged by the turn-2 targets (P14)
        if r["kernel"] == "c128_decode":
            b = int(r["case"].split("=")[1])
            if b >= 4096:
                add("P4", f"{r['case']}: >= 0.92 x copy bw", f"{r['frac_copy_bw']:.3f}", r["frac_copy_bw"] >= 0.92)
            if b <= 256:
                add("P5", f"{r['case']}: graph <= 1.3 us", f"{r['graph_us']:.2f} us", r["graph_us"] <= 1.3)
                ratio = r["host_stream_given_us"] / r["host_stream_given_empty_us"]
                add("P5", f"{r['case']}: host (stream given) <= 1.2 x empty launch measured alongside",
                    f"{r['host_stream_given_us']:.2f} us = {ratio:.2f}x (current stream fetched: "
                    f"{r['host_us'] / r['host_empty_us']:.2f}x)", ratio <= 1.2)
            add("P9", f"{r['case']}: >= 10x eager torch", f"{r['torch_eager_us'] / r['graph_us']:.1f}x",
                r["torch_eager_us"] / r["graph_us"] >= 10)
        if r["kernel"] == "c128_prefill" and "graph mode" not in r["case"]:
            if r["bytes"] >= 32768 * 2 * D * 4:
                add("P6", f"{r['case']}: >= 0.90 x copy bw", f"{r['frac_copy_bw']:.3f}", r["frac_copy_bw"] >= 0.90)
            if not math.isnan(r.get("torch_eager_us", float("nan"))):
                add("P9", f"{r['case']}: >= 10x eager torch", f"{r['torch_eager_us'] / r['graph_us']:.1f}x",
                    r["torch_eager_us"] / r["graph_us"] >= 10)
        if r["kernel"] == "c128_prefill" and "graph mode" in r["case"]:
            add("P8", "prefill graph-mode kernel <= 1.5 x non-graph", f"{r['graph_over_plain']:.2f}x", r["graph_over_plain"] <= 1.5)
        if r["kernel"] == "planner":
            lim = {1: 1.0, 256: 3.0, 1024: 8.0}.get(r["batch"]) if "graph" not in r["case"] else None
            if lim and "cython_us" in r:
                add("P7", f"planner {r['case']} <= {lim} us", f"{r['cython_us']:.2f} us", r["cython_us"] <= lim)
            if "graph" in r["case"]:
                add("P8", "planner graph mode, 8K capacity, 1 x 100 <= 3 us", f"{r['cython_graph_us']:.2f} us",
                    r["cython_graph_us"] <= 3.0)
    out += targets_turn2(rows, fl)
    return out


# The reference kernels' graph times from BENCH.md's side-by-side run, whose empty kernel took
# 0.70 us: a target of 0.9 x the reference is judged on the time above the empty kernel measured
# beside the row in this run (the launch floor differs between machines and drifts within a run),
# and printed beside the raw figure.
REFERENCE_EMPTY_US = 0.70
REFERENCE_US = {"decode B=1": 1.66, "decode B=32": 1.78, "decode B=256": 2.20, "prefill 1 x 128": 3.20,
                "prefill 64 x (1-600), prefixes <= 100K": 31.5,
                "decode 32x2048 K=3": 2.72, "decode 128x4096 K=3": 3.50, "decode 64x8192 +real+flashmla K=3": 4.20}


def _versus_reference(r, fl, factor, key):
    """(our time above the empty kernel, the reference's above its empty kernel x factor, text)."""
    empty = r.get("empty_graph_us", fl["empty_kernel_graph_us"])
    ours = r["graph_us"] - empty
    ref = REFERENCE_US[key] - REFERENCE_EMPTY_US
    return ours, ref * factor, (f"{r['graph_us']:.2f} us ({ours:.2f} above the empty kernel measured beside it, {empty:.2f}; "
                                f"reference {REFERENCE_US[key]:.2f} = {ref:.2f} above)")


def targets_turn2(rows: list, fl: dict) -> list:
    out = []

    def add(tid, what, value, ok):
        out.append(dict(id=tid, what=what, measured=value, ok=bool(ok)))

    for r in rows:
        if r.get("host_oneshot_vs_us"):
            ratio = r["host_oneshot_vs_us"] / r["host_oneshot_empty_us"]
            add("P10", f"one-shot c128_decode, {r['case']}: host <= 1.6 x empty launch (both fetch the stream)",
                f"{r['host_oneshot_vs_us']:.2f} us = {ratio:.2f}x", ratio <= 1.6)
        if r.get("host_replan_us"):
            ratio = r["host_replan_us"] / r["host_replan_empty_us"]
            pair = r["host_replan_oneshot_us"] / r["host_replan_oneshot_empty_us"]
            add("P10", f"re-planned DevicePlan, {r['case']}: plan() host <= 1.6 x empty launch (the per-step call "
                f"before a replay)", f"{r['host_replan_us']:.2f} us = {ratio:.2f}x; plan() then an eager c128_prefill "
                f"with it {r['host_replan_oneshot_us']:.2f} us = {pair:.2f}x", ratio <= 1.6)
        if r["kernel"] == "c128_prefill" and r.get("host_oneshot_us") and r["bytes"] < 64e6:
            ratio = r["host_oneshot_us"] / r["host_oneshot_empty_us"]
            add("P10", f"one-shot c128_prefill with a pyplan plan, {r['case']}: host <= 1.6 x empty launch",
                f"{r['host_oneshot_us']:.2f} us = {ratio:.2f}x", ratio <= 1.6)
        if r["kernel"] == "metadata_copy" and r.get("host_new_sources_vs_us") and r["bytes"] < 64e6:
            ratio = r["host_new_sources_vs_us"] / r["host_new_sources_empty_us"]
            add("P10", f"MetadataCopy with new sources, {r['case']}: host <= 1.6 x empty launch",
                f"{r['host_new_sources_vs_us']:.2f} us = {ratio:.2f}x", ratio <= 1.6)
            ratio = r["host_bound_launch_us"] / r["host_bound_launch_empty_us"]
            add("P10", f"bound launch(), {r['case']}: host <= 1.2 x empty launch", f"{ratio:.2f}x", ratio <= 1.2)
        if r["kernel"] == "c128_decode" and r["case"] in ("decode B=1", "decode B=32", "decode B=256"):
            ours, lim, text = _versus_reference(r, fl, 0.9, r["case"])
            add("P11", f"{r['case']}: <= 0.9 x the reference", text, ours <= lim)
        if r["kernel"] == "c128_prefill" and r["case"] in REFERENCE_US:
            factor = 0.8 if "1 x 128" in r["case"] else 1 / 1.3
            ours, lim, text = _versus_reference(r, fl, factor, r["case"])
            add("P12", f"{r['case']}: {'<= 0.8 x' if factor == 0.8 else '>= 1.3 x faster than'} the reference", text, ours <= lim)
        if r["kernel"] == "metadata_copy" and r["case"] in REFERENCE_US:
            ours, lim, text = _versus_reference(r, fl, 0.9, r["case"])
            add("P13", f"{r['case']}: <= 0.9 x the reference", text, ours <= lim)
        if r["kernel"] == "c128_decode" and r["case"] == "decode B=8192, bf16 state":
            add("P14", "decode B=8192: bf16 state >= 1.45 x faster than fp32 state", f"{r['speedup_vs_fp32']:.2f}x",
                r["speedup_vs_fp32"] >= 1.45)
        if r["kernel"] == "c128_prefill" and r.get("same_plan_fp32_ragged_us"):
            what = "bf16 state" if "bf16" in r["case"] else "compact output"
            add("P14", f"{r['case']}: {what} not slower than fp32 ragged",
                f"{r['graph_us']:.2f} vs {r['same_plan_fp32_ragged_us']:.2f} us", r["graph_us"] <= r["same_plan_fp32_ragged_us"] * 1.02)
    return out


def _fmt(v, spec=".2f"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def print_report(result: dict) -> None:
    fl = result.get("floors") or {}
    if fl:
        print(f"floors: copy bandwidth {fl['copy_bandwidth_tbps']:.2f} TB/s; empty kernel graph {fl['empty_kernel_graph_us']:.2f} us; "
              f"empty ctypes launch host {fl['empty_kernel_host_us']:.2f} us (raw-stream fetch {fl['empty_kernel_host_raw_stream_us']:.2f}, "
              f"torch stream fetch {fl['empty_kernel_host_torch_stream_us']:.2f}); torch 1-element op graph "
              f"{fl['torch_one_element_graph_us']:.2f} us, host {fl['torch_one_element_host_us']:.2f} us")
    plan = [r for r in result["rows"] if r["kernel"] == "planner"]
    if plan:
        print("\nplanner, host us per call | cython | cython out= | cython graph | C via ctypes | pure Python | DevicePlan.plan")
        for r in plan:
            print(f"  {r['case']:<42} {_fmt(r.get('cython_us')):>7} {_fmt(r.get('cython_out_us')):>7} {_fmt(r.get('cython_graph_us')):>7} "
                  f"{_fmt(r.get('c_ctypes_us')):>7} {_fmt(r.get('python_us'), '.1f'):>9} {_fmt(r.get('device_plan_us')):>7}")
    for r in (r for r in result["rows"] if r["kernel"] == "step"):
        print(f"\n{r['case']}: eager host {r['eager_host_us']:.1f} us, device {r['eager_device_us']:.1f} us per step"
              + (f"; CUDA graph replay host {r['graph_host_us']:.1f} us, device {r['graph_device_us']:.1f} us" if "graph_host_us" in r else ""))
    sg = [r for r in result["rows"] if r["kernel"] == "sglang"]
    if sg:
        print("\nsglang-style call, host us | pydsa.sglang (empty launch) | direct call (empty launch)")
        for r in sg:
            print(f"  {r['case']:<48} {r['sglang_host_us']:.2f} ({r['host_empty_us']:.2f})  {r['direct_host_us']:.2f} ({r['direct_host_empty_us']:.2f})")
    dev = [r for r in result["rows"] if r["kernel"] not in ("planner", "step", "sglang")]
    if dev:
        print(f"\n{'kernel / case':<58} {'MB':>8} {'graph us':>9} {'cold us':>8} {'TB/s':>6} {'x bw':>6} {'torch us':>9} {'speedup':>8} {'host us':>8} {'empty':>6} {'new src':>8} {'torch host':>10}")
        for r in dev:
            base = r.get("torch_graph_us", r.get("torch_eager_us"))
            print(f"{r['kernel'] + ': ' + r['case']:<58} {r['bytes'] / 1e6:>8.3f} {r['graph_us']:>9.2f} {_fmt(r.get('graph_cold_us')):>8} "
                  f"{_fmt(r.get('tbps')):>6} {_fmt(r.get('frac_copy_bw'), '.3f'):>6} {_fmt(base):>9} "
                  f"{_fmt(base / r['graph_us'] if base else None, '.1f'):>8} {_fmt(r.get('host_us')):>8} {_fmt(r.get('host_empty_us')):>6} "
                  f"{_fmt(r.get('host_new_sources_us')):>8} {_fmt(r.get('torch_host_us')):>10}")
    if result.get("targets"):
        print("\ntargets (BENCH.md):")
        for t in result["targets"]:
            print(f"  {t['id']:<3} {'ok  ' if t['ok'] else 'MISS'} {t['what']}: {t['measured']}")


def _md_table(header: list, rows: list) -> list:
    """A Markdown table (header cells, rows of cells) and a blank line; nothing for no rows."""
    if not rows:
        return []
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] * len(header)) + " |",
            *("| " + " | ".join(row) + " |" for row in rows), ""]


def markdown(result: dict) -> str:
    """The run as Markdown tables (the README's results section)."""
    fl = result.get("floors") or {}
    rows = result["rows"]
    lines = [f"{result['gpu']}, {result['date']}, commit {result['commit']}, `{result['command']}`", ""]
    if fl:
        lines += [f"Floors measured in the same run: device copy {fl['copy_bandwidth_tbps']:.2f} TB/s (read + write), "
                  f"empty kernel {fl['empty_kernel_graph_us']:.2f} us in a graph, empty kernel through ctypes "
                  f"{fl['empty_kernel_host_us']:.2f} us host time.", ""]
    start = result.get("graph_start", "idle")  # runs before the field was recorded timed from an idle GPU
    lines += [f"Graph replays timed from {'a busy GPU (a spin queued before the start event)' if start == 'busy' else 'an idle GPU (the host submission of each replay included)'}.", ""]
    lines += _md_table(
        ["per step (DeepSeek-V4, 61 layers)", "eager host us", "eager device us", "graph replay host us",
         "graph replay device us"],
        [[r["case"], f"{r['eager_host_us']:.1f}", f"{r['eager_device_us']:.1f}", _fmt(r.get("graph_host_us"), ".1f"),
          _fmt(r.get("graph_device_us"), ".1f")] for r in rows if r["kernel"] == "step"])
    lines += _md_table(
        ["sglang-style call", "pydsa.sglang host us", "direct call host us", "empty launch host us"],
        [[r["case"], f"{r['sglang_host_us']:.2f}", f"{r['direct_host_us']:.2f}", f"{r['host_empty_us']:.2f}"]
         for r in rows if r["kernel"] == "sglang"])
    lines += _md_table(
        ["one-shot `c128_prefill(..., pyplan plan)`", "host us (empty launch alongside)", "back-to-back eager us",
         "graph us"],
        [[r["case"], f"{r['host_oneshot_us']:.2f} ({r['host_oneshot_empty_us']:.2f})", _fmt(r.get("eager_oneshot_us")),
          f"{r['graph_us']:.2f}"] for r in rows if r["kernel"] == "c128_prefill" and r.get("host_oneshot_us")])
    lines += _md_table(
        ["kernel", "case", "MB moved", "graph us (empty kernel beside it)", "cold-L2 us", "TB/s", "x copy bw",
         "torch us", "host us (empty launch alongside)", "host us, stream given (empty)",
         "bound launch() host us (empty)"],
        [[r["kernel"], r["case"], f"{r['bytes'] / 1e6:.3f}", f"{r['graph_us']:.2f} ({_fmt(r.get('empty_graph_us'))})",
          _fmt(r.get("graph_cold_us")), _fmt(r.get("tbps")), _fmt(r.get("frac_copy_bw"), ".3f"),
          _fmt(r.get("torch_graph_us", r.get("torch_eager_us"))),
          f"{_fmt(r.get('host_us'))} ({_fmt(r.get('host_empty_us'))})",
          f"{_fmt(r.get('host_stream_given_us'))} ({_fmt(r.get('host_stream_given_empty_us'))})",
          f"{_fmt(r.get('host_bound_launch_us'))} ({_fmt(r.get('host_bound_launch_empty_us'))})"]
         for r in rows if r["kernel"] not in ("planner", "step", "sglang")])
    lines += _md_table(
        ["planner (host us per call)", "Cython", "Cython, out=", "Cython, graph mode", "C via ctypes", "pure Python",
         "DevicePlan.plan() (plan and upload)"],
        [[r["case"], _fmt(r.get("cython_us")), _fmt(r.get("cython_out_us")), _fmt(r.get("cython_graph_us")),
          _fmt(r.get("c_ctypes_us")), _fmt(r.get("python_us"), ".1f"), _fmt(r.get("device_plan_us"))]
         for r in rows if r["kernel"] == "planner"])
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(f"--plot needs matplotlib ({exc}); pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(8, 5))
    for kernel, marker in (("metadata_copy", "o"), ("c128_decode", "s"), ("c128_prefill", "^")):
        pts = sorted((r["bytes"], r["tbps"]) for r in result["rows"]
                     if r["kernel"] == kernel and r.get("tbps") and not r.get("variant"))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=kernel)
    bw = result["floors"]["copy_bandwidth_tbps"]
    ax.axhline(bw, color="gray", linestyle="--", label=f"device copy {bw:.2f} TB/s")
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved per call")
    ax.set_ylabel("achieved TB/s")
    ax.set_title(f"pydsa on {result['gpu']} ({result['date']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _commit() -> str:
    """The source commit: $PYDSA_COMMIT when set (machines that get a copy of the tree without
    git), else git's HEAD, with '+dirty' when the tree differs from it."""
    if os.environ.get("PYDSA_COMMIT"):
        return os.environ["PYDSA_COMMIT"]
    try:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (head + ("+dirty" if dirty else "")) if head else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pydsa bench", description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="*", metavar="{all,planner,c128,metadata,step,sglang}",
                    help="which rows to run (default: all)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write a PNG of achieved bandwidth versus bytes moved")
    ap.add_argument("--markdown", help="write the results as Markdown tables here")
    ap.add_argument("--graph-idle-start", action="store_true",
                    help="time graph replays from an idle GPU, the host's submission of each replay included "
                         "(default: from a GPU kept busy until the replay is queued)")
    args = ap.parse_args(argv)
    global GRAPH_BUSY_START
    GRAPH_BUSY_START = not args.graph_idle_start
    what = set(args.what or ["all"])
    unknown = what - {"all", "planner", "c128", "metadata", "step", "sglang"}
    if unknown:
        ap.error(f"unknown benchmark {sorted(unknown)}; choose from all, planner, c128, metadata, step, sglang")
    if "all" in what:
        what = {"planner", "c128", "metadata", "step", "sglang"}
    gpu = torch.cuda.is_available() and _abi.lib.dsa_device_count() > 0
    result = dict(gpu=torch.cuda.get_device_name() if gpu else "none", date=datetime.date.today().isoformat(),
                  commit=_commit(), command="python -m pydsa bench " + " ".join(argv if argv is not None else sys.argv[2:]),
                  host=platform.processor() or platform.machine(), python=platform.python_version(),
                  torch=torch.__version__, graph_start="busy" if GRAPH_BUSY_START else "idle", floors={}, rows=[])
    if gpu:
        print("measuring floors ...", flush=True)
        result["floors"] = floors()
    rows = result["rows"]
    if "planner" in what:
        print("planner ...", flush=True)
        bench_planner(rows)
    if gpu and "c128" in what:
        print("c128 ...", flush=True)
        bench_c128(rows, result["floors"])
    if gpu and "metadata" in what:
        print("metadata copy ...", flush=True)
        bench_metadata(rows, result["floors"])
    if gpu and "step" in what:
        print("per-step ...", flush=True)
        bench_step(rows, result["floors"])
    if gpu and "sglang" in what:
        print("sglang-style calls ...", flush=True)
        bench_sglang(rows, result["floors"])
    if not gpu and what - {"planner"}:
        print("no CUDA GPU: only the planner rows run here")
    result["targets"] = targets(rows, result["floors"])
    print_report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nsaved {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(result))
    if args.plot:
        if not result["floors"]:
            raise SystemExit("--plot needs the GPU rows")
        plot(result, args.plot)
        print(f"saved {args.plot}")
    return 0
