"""Benchmark cases of whole steps (61 layers) and of the sglang-style calls."""
from __future__ import annotations

import numpy as np
import torch

import pyplan

from ..c128 import C128Decode, c128_decode, c128_prefill
from ..metadata import MetadataCopy
from .cases import _decode_set, _metadata_set
from .harness import D, event_us, host_us, host_vs_empty


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
    from .. import sglang
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
