"""`python -m pydsa bench`: one harness for every kernel and the planner.

Device time: CUDA-graph replay of 20 calls, on one input set ("graph us", the data may sit in
L2 as it does when a previous kernel just wrote it) and rotating input sets until 256 MB are
cycled through ("cold us", cold L2).
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


def host_us(fn, n=2000, rounds=5, sync=None) -> float:
    """Median over rounds of Python wall time per call (no sync inside the loop)."""
    for _ in range(min(n, 200)):
        fn()
    results = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        results.append((time.perf_counter() - t0) / n * 1e6)
        if sync:
            sync()
    return statistics.median(results)


_EMPTY = {}


def host_vs_empty(fn, n=2000, rounds=7, fetch_stream=False) -> tuple:
    """(µs per call of fn, µs per empty-kernel ctypes launch), measured in alternating rounds so
    that drift in the host's speed affects both alike. With fetch_stream the empty launch looks up
    the current stream on every call, as a call without stream= does."""
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
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ours.append((time.perf_counter() - t0) / n * 1e6)
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            empty(dev, stream)
        floor.append((time.perf_counter() - t0) / n * 1e6)
        sync()
    return statistics.median(ours), statistics.median(floor)


def graph_us(calls, replays=30) -> float:
    """Device µs per call: a CUDA graph of GRAPH_CALLS calls (cycling through `calls`)."""
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
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / GRAPH_CALLS)
    del graph
    return statistics.median(times)


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
        t = graph_us([ops[0].launch])
        s0 = sets[0]
        raw = torch.cuda.current_stream().cuda_stream
        host, empty_host = host_vs_empty(ops[0].launch)
        host_given, empty_given = host_vs_empty(lambda: ops[0].launch(raw))
        rows.append(dict(
            kernel="c128_decode", case=f"decode B={b}", bytes=nbytes, graph_us=t,
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
    rng = np.random.default_rng(1)
    cases = [("prefill 1 x 128", [128], [0]),
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
        t = graph_us([sets[0].launch])
        cold = graph_us([op.launch for op in sets]) if len(sets) > 1 else t
        whole = (n // 128) * 128
        kv0 = sets[0]._keep[1]
        torch_us = event_us(lambda: baselines.c128_chunks_torch(kv0[:whole], ape)) if whole else float("nan")
        op0 = sets[0]
        args0 = op0._keep[:5]
        oneshot, oneshot_empty = host_vs_empty(lambda: c128_prefill(*args0, (compress, write)), n=500, fetch_stream=True)
        rows.append(dict(kernel="c128_prefill", case=name, bytes=nbytes, graph_us=t, graph_cold_us=cold, tbps=nbytes / t / 1e6,
                         frac_copy_bw=nbytes / t / 1e6 / bw, torch_eager_us=torch_us,
                         host_us=host_us(sets[0].launch, sync=torch.cuda.synchronize),
                         host_oneshot_us=oneshot, host_oneshot_empty_us=oneshot_empty))
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
    rows.append(dict(kernel="c128_prefill", case="graph mode: 8K capacity, 1 x 100 tokens", bytes=100 * 2 * D * 4,
                     graph_us=tg, plain_graph_us=tp, graph_over_plain=tg / tp,
                     host_us=host_us(graph_op.launch, sync=torch.cuda.synchronize)))


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
            t = graph_us(calls[:1])
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
            rows.append(dict(kernel="metadata_copy", case=f"{label} K={k}", k=k, bytes=nbytes, graph_us=t,
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
    dev = [r for r in result["rows"] if r["kernel"] != "planner"]
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


def markdown(result: dict) -> str:
    """The run as Markdown tables (the README's results section)."""
    fl = result.get("floors") or {}
    lines = [f"{result['gpu']}, {result['date']}, commit {result['commit']}, `{result['command']}`", ""]
    if fl:
        lines += [f"Floors measured in the same run: device copy {fl['copy_bandwidth_tbps']:.2f} TB/s (read + write), "
                  f"empty kernel {fl['empty_kernel_graph_us']:.2f} us in a graph, empty kernel through ctypes "
                  f"{fl['empty_kernel_host_us']:.2f} us host time.", ""]
    dev = [r for r in result["rows"] if r["kernel"] != "planner"]
    if dev:
        lines += ["| kernel | case | MB moved | graph us | cold-L2 us | TB/s | x copy bw | torch us | host us (empty launch alongside) | host us, stream given (empty) | bound launch() host us (empty) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in dev:
            base = r.get("torch_graph_us", r.get("torch_eager_us"))
            lines.append(f"| {r['kernel']} | {r['case']} | {r['bytes'] / 1e6:.3f} | {r['graph_us']:.2f} | "
                         f"{_fmt(r.get('graph_cold_us'))} | {_fmt(r.get('tbps'))} | {_fmt(r.get('frac_copy_bw'), '.3f')} | "
                         f"{_fmt(base)} | {_fmt(r.get('host_us'))} ({_fmt(r.get('host_empty_us'))}) | "
                         f"{_fmt(r.get('host_stream_given_us'))} ({_fmt(r.get('host_stream_given_empty_us'))}) | "
                         f"{_fmt(r.get('host_bound_launch_us'))} ({_fmt(r.get('host_bound_launch_empty_us'))}) |")
        lines.append("")
    plan = [r for r in result["rows"] if r["kernel"] == "planner"]
    if plan:
        lines += ["| planner (host us per call) | Cython | Cython, out= | Cython, graph mode | C via ctypes | pure Python |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in plan:
            lines.append(f"| {r['case']} | {_fmt(r.get('cython_us'))} | {_fmt(r.get('cython_out_us'))} | "
                         f"{_fmt(r.get('cython_graph_us'))} | {_fmt(r.get('c_ctypes_us'))} | {_fmt(r.get('python_us'), '.1f')} |")
        lines.append("")
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
        pts = sorted((r["bytes"], r["tbps"]) for r in result["rows"] if r["kernel"] == kernel and r.get("tbps"))
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
    ap.add_argument("what", nargs="*", metavar="{all,planner,c128,metadata}",
                    help="which rows to run (default: all)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write a PNG of achieved bandwidth versus bytes moved")
    ap.add_argument("--markdown", help="write the results as Markdown tables here")
    args = ap.parse_args(argv)
    what = set(args.what or ["all"])
    unknown = what - {"all", "planner", "c128", "metadata"}
    if unknown:
        ap.error(f"unknown benchmark {sorted(unknown)}; choose from all, planner, c128, metadata")
    if "all" in what:
        what = {"planner", "c128", "metadata"}
    gpu = torch.cuda.is_available() and _abi.lib.dsa_device_count() > 0
    result = dict(gpu=torch.cuda.get_device_name() if gpu else "none", date=datetime.date.today().isoformat(),
                  commit=_commit(), command="python -m pydsa bench " + " ".join(argv if argv is not None else sys.argv[2:]),
                  host=platform.processor() or platform.machine(), python=platform.python_version(),
                  torch=torch.__version__, floors={}, rows=[])
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
