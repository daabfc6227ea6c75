"""Benchmark cases of the per-call ops: the planner, c128 decode and prefill, the metadata copy.
Each appends result rows (dicts) to `rows`; `fl` holds the floors of the run."""
from __future__ import annotations

import numpy as np
import torch

import pyplan

from .. import baselines
from ..c128 import C128Decode, C128Prefill, DevicePlan, c128_decode, c128_prefill, plan_prefill_c
from ..metadata import MetadataCopy
from .harness import D, event_us, graph_us, graph_us_alternating, graph_us_beside_empty, host_us, host_vs_empty, rotation




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
        sets, args = [], []  # prepared calls over rotated buffers, and the first one's arguments
        for _ in range(rotation(nbytes)):
            state = torch.randn(nb, 1, 3 * D, device="cuda", generator=gen)
            state[:, :, D:2 * D].uniform_(1, 30, generator=gen)
            kv = torch.randn(n, 2 * D, device="cuda", generator=gen)
            out = torch.empty(n, D, device="cuda")
            idx = torch.arange(nb, dtype=torch.int32, device="cuda")
            sets.append(C128Prefill(state, kv, out, ape, idx, (compress, write)))
            args = args or [state, kv, out, ape, idx]
        t, t_empty = graph_us_beside_empty([sets[0].launch])
        cold = graph_us([op.launch for op in sets]) if len(sets) > 1 else t
        whole = (n // 128) * 128
        state0, kv0, out0, _, idx0 = args0 = args
        torch_us = event_us(lambda: baselines.c128_chunks_torch(kv0[:whole], ape)) if whole else float("nan")
        op0 = sets[0]
        oneshot, oneshot_empty = host_vs_empty(lambda: c128_prefill(*args0, (compress, write)), n=500, fetch_stream=True)
        # Back-to-back one-shot calls timed on the GPU: host- or device-bound, whichever is slower.
        eager = event_us(lambda: c128_prefill(*args0, (compress, write)))
        rows.append(dict(kernel="c128_prefill", case=name, bytes=nbytes, graph_us=t, empty_graph_us=t_empty,
                         graph_cold_us=cold, tbps=nbytes / t / 1e6,
                         frac_copy_bw=nbytes / t / 1e6 / bw, torch_eager_us=torch_us,
                         host_us=host_us(sets[0].launch, sync=torch.cuda.synchronize),
                         host_oneshot_us=oneshot, host_oneshot_empty_us=oneshot_empty, eager_oneshot_us=eager))
        if n >= 32768:  # bf16 state and compact output on the same plan and inputs
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
