"""Benchmark cases of speculative decoding (docs/performance.md P15-P17): c128_verify at V = 8, the commit of
30 c128 layers, and a speculative step end to end; each beside sglang 0.5.23's way of doing it,
measured in the same process when the reference build is given (`--reference-build DIR`, see
benchmarks/README.md): its prefill over the drafts plus write_prefix_states per layer,
commit_pending per layer, its decode per layer."""
from __future__ import annotations

import importlib
import sys

import numpy as np
import torch

from ..c128 import C128Decode
from ..speculative import C128Commit, C128Verify, c128_verify
from .harness import D, graph_us, graph_us_alternating, graph_us_beside_empty, host_vs_empty

V = 8
C128_LAYERS = 30  # c128 layers of a 61-layer DeepSeek-V4


def load_reference(folder: str):
    """(anchor, anchor_mtp523) from a reference build folder, or a SystemExit saying why not."""
    sys.path.insert(0, folder)
    try:
        return importlib.import_module("anchor"), importlib.import_module("anchor_mtp523")
    except Exception as exc:  # the build's own loader errors, reported as they are
        raise SystemExit(f"--reference-build {folder}: cannot load the reference kernels ({exc})") from exc


def _state(slots, dtype, gen):
    state = torch.randn(slots, 1, 3 * D, device="cuda", generator=gen)
    state[:, :, D:2 * D].uniform_(1, 30, generator=gen)
    return state.to(dtype)


def _lengths(b, rng):
    """Committed lengths; a quarter a few tokens before a chunk end, so drafts cross it."""
    seq = rng.integers(1, 4000, b).astype(np.int64)
    k = max(1, b // 4)
    seq[:k] = 128 * rng.integers(1, 30, k) - rng.integers(1, 5, k)
    return seq


class _Sglang:
    """sglang's verify, commit and decode of one layer over sglang's layout (entry k of request r at
    r + k * B, main slot r), through the reference build."""

    def __init__(self, ref, b, seq, drafts, ape, gen):
        anchor, mtp = ref
        self.anchor, self.mtp, self.b, self.ape = anchor, mtp, b, ape
        i32 = dict(dtype=torch.int32, device="cuda")
        self.req = torch.arange(b, dtype=torch.int64, device="cuda")
        self.r2t = torch.zeros(b, 8, **i32)
        self.seq = torch.from_numpy(seq).to(torch.int32).cuda()
        self.drafts = drafts
        ext = np.full(b, V, np.int64)
        buf = torch.empty((2, b * V, 16), dtype=torch.uint8).pin_memory()
        nc, nw = anchor.c128_plan(torch.from_numpy(ext), torch.from_numpy(seq + V), buf[0], buf[1], False)
        self.cplan, self.wplan = buf[0, :nc].cuda(), buf[1, :nw].cuda()
        self.scratch = _state(2 * b, torch.float32, gen)  # the compress path's copy-on-write slots
        self.load = torch.arange(b, **i32)
        self.tmp = torch.arange(b, 2 * b, **i32)
        self.out = torch.empty(b * V, D, device="cuda")
        self.pending = torch.full((b,), -1, dtype=torch.int64, device="cuda")
        mtp.mark_pending(self.seq, self.req, self.pending, b, b)
        self.cur = self.seq + torch.randint(0, V + 1, (b,), device="cuda", dtype=torch.int32)

    def prefill(self):
        self.anchor.c128_prefill(D, self.scratch, self.drafts, self.out, self.ape, self.tmp, self.cplan, self.wplan,
                                 self.load)

    def write_prefix(self, state):
        self.mtp.write_prefix_states(self.drafts, self.seq, self.req, self.r2t, self.ape, state.view(state.shape[0], -1),
                                     self.b, V, self.b)

    def verify(self, state):
        self.prefill()
        self.write_prefix(state)

    def commit(self, state):
        self.mtp.commit_pending(self.cur, self.req, self.r2t, self.pending, state.view(state.shape[0], -1), self.b, V,
                                self.b, self.b)

    def decode(self, state, kv, out):
        self.anchor.c128_decode(D, state, kv, out, self.ape, self.load, self.cur + 1)


def bench_speculative(rows: list, fl: dict, ref=None) -> None:
    gen = torch.Generator(device="cuda").manual_seed(7)
    rng = np.random.default_rng(7)
    ape = torch.randn(128, D, device="cuda", generator=gen)
    bw = fl["copy_bandwidth_tbps"]
    i32 = dict(dtype=torch.int32, device="cuda")
    for b in (1, 32, 256, 1024):
        seq = _lengths(b, rng)
        drafts = torch.randn(b * V, 2 * D, device="cuda", generator=gen)
        sg = _Sglang(ref, b, seq, drafts, ape, gen) if ref else None
        for dtype in (torch.float32, torch.bfloat16):
            esz = 2 if dtype == torch.bfloat16 else 4
            state = _state(b + b * (V + 1), dtype, gen)
            main = torch.arange(b, **i32)
            bank = torch.arange(b, b + b * (V + 1), V + 1, **i32)
            seq_t = torch.from_numpy(seq).to(torch.int32).cuda()
            out = torch.empty(b * V, D, device="cuda")
            op = C128Verify(state, drafts, out, ape, main, seq_t, bank)
            mid = int((seq % 128 != 0).sum())
            entries = sum(int(((s + j) % 128) != 0) for s in seq for j in range(V + 1))
            closed = sum(int(((s + j) % 128) == 127) for s in seq for j in range(V))
            nbytes = b * V * 2 * D * 4 + mid * 3 * D * esz + entries * 3 * D * esz + closed * D * 4
            row = dict(kernel="c128_verify", case=f"verify B={b} V={V}" + (", bf16 state" if esz == 2 else ""),
                       batch=b, state=str(dtype)[6:], bytes=nbytes)
            if sg is not None and esz == 4:
                sglang_state = _state(b * (V + 1), dtype, gen)
                t, t_sg = graph_us_alternating([op.launch], [lambda: sg.verify(sglang_state)])
                row.update(graph_us=t, sglang_verify_us=t_sg, empty_graph_us=fl["empty_kernel_graph_us"],
                           sglang_write_prefix_us=graph_us([lambda: sg.write_prefix(sglang_state)]),
                           reference_prefill_drafts_us=graph_us([sg.prefill]))
            else:
                row["graph_us"], row["empty_graph_us"] = graph_us_beside_empty([op.launch])
            row.update(tbps=nbytes / row["graph_us"] / 1e6, frac_copy_bw=nbytes / row["graph_us"] / 1e6 / bw)
            row["host_us"], row["host_empty_us"] = host_vs_empty(op.launch, n=500, fetch_stream=True)
            row["host_oneshot_us"], row["host_oneshot_empty_us"] = host_vs_empty(
                lambda: c128_verify(state, drafts, out, ape, main, seq_t, bank), n=500, fetch_stream=True)
            rows.append(row)
        torch.cuda.empty_cache()
    _bench_commit_and_step(rows, ref, gen, rng, ape)


def _bench_commit_and_step(rows, ref, gen, rng, ape) -> None:
    """P16 (commit of 30 layers) and P17 (verify 30 layers, commit, next decode 30 layers), B = 256."""
    b = 256
    i32 = dict(dtype=torch.int32, device="cuda")
    seq = _lengths(b, rng)
    seq_t = torch.from_numpy(seq).to(torch.int32).cuda()
    accepted = torch.randint(0, V + 1, (b,), generator=gen, device="cuda", dtype=torch.int32)
    main = torch.arange(b, **i32)
    bank = torch.arange(b, b + b * (V + 1), V + 1, **i32)
    load = torch.empty(b, **i32)
    states = [_state(b + b * (V + 1), torch.float32, gen) for _ in range(C128_LAYERS)]
    resolve = C128Commit(seq_t, accepted, main, bank, num_drafts=V, load_indices=load, num_slots=states[0].shape[0])
    copying = C128Commit(seq_t, accepted, main, bank, num_drafts=V, states=states)
    drafts = torch.randn(b * V, 2 * D, device="cuda", generator=gen)
    sg = _Sglang(ref, b, seq, drafts, ape, gen) if ref else None
    sg_states = [_state(b * (V + 1), torch.float32, gen) for _ in range(C128_LAYERS)] if sg else []
    row = dict(kernel="c128_commit", case=f"commit, {C128_LAYERS} c128 layers, B={b} V={V}", batch=b,
               bytes=C128_LAYERS * b * 2 * 3 * D * 4)
    row["graph_us"], row["empty_graph_us"] = graph_us_beside_empty([resolve.launch])
    row["copy_graph_us"] = graph_us([copying.launch])
    if sg:
        row["sglang_graph_us"] = graph_us([lambda: [sg.commit(s) for s in sg_states]])
    row["host_us"], row["host_empty_us"] = host_vs_empty(resolve.launch, n=500, fetch_stream=True)
    rows.append(row)
    # The step: a verify per layer, the commit, then the next step's decode per layer from the
    # accepted slots (one new token per request).
    outs = [torch.empty(b * V, D, device="cuda") for _ in range(C128_LAYERS)]
    verifies = [C128Verify(s, drafts, o, ape, main, seq_t, bank) for s, o in zip(states, outs)]
    kv = torch.randn(b, 2 * D, device="cuda", generator=gen)
    dec_out = torch.empty(b, D, device="cuda")
    next_seq = seq_t + accepted + 1
    decodes = [C128Decode(s, kv, dec_out, ape, main, next_seq, load_indices=load) for s in states]

    def ours():
        for op in verifies:
            op.launch()
        resolve.launch()
        for op in decodes:
            op.launch()

    step = dict(kernel="speculative_step", case=f"speculative step: {C128_LAYERS} c128 layers x verify V={V}, commit, "
                f"{C128_LAYERS} x next decode, B={b}", batch=b, bytes=0)
    if sg:
        def theirs():
            for s in sg_states:
                sg.verify(s)
            for s in sg_states:
                sg.commit(s)
            for s in sg_states:
                sg.decode(s.view(s.shape[0], 1, -1), kv, dec_out)

        step["graph_us"], step["sglang_graph_us"] = graph_us_alternating([ours], [theirs], rounds=3)
    else:
        step["graph_us"] = graph_us([ours])
    rows.append(step)
    states.clear()
    sg_states.clear()
    torch.cuda.empty_cache()
