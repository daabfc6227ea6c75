"""sglang 0.5.23's MTP protocol beside pydsa (python -m pydsa.bench.release): the states compared step after
step, and the commit of a speculative step timed (P16)."""
from __future__ import annotations

import statistics

import numpy as np
import torch

import pydsa
from .decode_path import D
from .harness import graph_us


def _bf16_steps(a, b) -> int:
    """Largest distance between two bf16 tensors in representable values (0: identical)."""
    def ordered(t):
        x = t.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(x < 0, -(x & 0x7FFF), x)
    return int((ordered(a) - ordered(b)).abs().max().item())


def compare_mtp_protocol(ref, steps=40, seed=9, v=4, layers=2, dev="cuda"):
    """sglang 0.5.23's MTP protocol through pydsa.sglang beside sglang's own kernels, step after step on
    the same inputs: mark_pending, write_prefix_states per layer, commit_pending with a random acceptance
    (past num_verify_tokens too), the next step from the committed lengths. Requests start at seq 0 and
    some return to 0 (a slot reused by a new request). Main slots and banks compared after every step,
    relative to the state's magnitude (bf16 also in steps: anywhere, and away from 0); the next step
    starts both sides from pydsa's states, so each step's own difference is measured (bf16 states
    re-rounded step after step drift apart like any two correct implementations would)."""
    from .. import sglang as ours
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=dev).manual_seed(seed)
    r = dict(steps=0, seq0_rows=0, pending_differ=0, max_main_err_fp32=0.0, max_bank_err_fp32=0.0,
             max_main_err_bf16=0.0, max_bank_err_bf16=0.0, max_main_bf16_steps=0, max_bank_bf16_steps=0,
             max_main_bf16_steps_not_near_0=0, max_bank_bf16_steps_not_near_0=0)
    for dtype in (torch.float32, torch.bfloat16):
        b, stride = 24, 32
        rid = torch.from_numpy(rng.permutation(stride)[:b].astype(np.int64)).to(dev)
        seq = rng.integers(0, 3000, b).astype(np.int64)
        seq[: b // 4] = 0
        mine = [((torch.randn(stride * (v + 1), 3 * D, device=dev, generator=gen) * 0.1).to(dtype)) for _ in
                range(layers)]
        for st in mine:
            st[:, D:2 * D] = 2.0
        theirs = [st.clone() for st in mine]
        ape = [torch.randn(128, D, device=dev, generator=gen) for _ in range(layers)]
        r2t = torch.zeros(stride, 8, dtype=torch.int32, device=dev)
        pend_m = torch.full((stride,), -7, dtype=torch.int64, device=dev)
        pend_t = pend_m.clone()
        for step in range(steps):
            restart = rng.random(b) < 0.1
            seq = np.where(restart, 0, seq)
            r["seq0_rows"] += int((seq == 0).sum())
            seq_t = torch.from_numpy(seq).to(dev)
            ours.online_c128_mtp_mark_pending(seq_t, rid, pend_m, b, stride, head_dim=D, state_dtype=dtype)
            ref.mark_pending(seq_t, rid, pend_t, b, stride, dtype)
            for layer in range(layers):
                drafts = torch.randn(b * v, 2 * D, device=dev, generator=gen)
                ours.online_c128_mtp_write_prefix_states(drafts, seq_t, rid, r2t, ape[layer], mine[layer], b, v,
                                                         stride, head_dim=D)
                ref.write_prefix_states(drafts, seq_t, rid, r2t, ape[layer], theirs[layer], b, v, stride)
            seq = seq + rng.integers(0, v + 3, b)  # accepted drafts (clamped to v by commit)
            seq_t = torch.from_numpy(seq).to(dev)
            for layer in range(layers):
                ours.online_c128_mtp_commit_pending(seq_t, rid, r2t, pend_m, mine[layer], b, v, stride, stride,
                                                    head_dim=D)
                ref.commit_pending(seq_t, rid, r2t, pend_t, theirs[layer], b, v, stride, stride)
            torch.cuda.synchronize() if dev == "cuda" else None
            r["steps"] += 1
            r["pending_differ"] += int(not torch.equal(pend_m, pend_t))
            main = rid  # main slots of the batch; banks: every other row the drafts wrote
            for a, t in zip(mine, theirs):
                banks = torch.ones(a.shape[0], dtype=torch.bool, device=dev)
                banks[main] = False
                for part, rows in (("main", main), ("bank", banks)):
                    x, y = a[rows].float(), t[rows].float()
                    key = f"max_{part}_err_" + ("fp32" if dtype == torch.float32 else "bf16")
                    r[key] = max(r[key], float(((x - y).abs().max() / y.abs().max()).item()))
                    if dtype == torch.bfloat16:
                        mag = y.abs().view(-1, 3, D)
                        big = (mag >= mag.amax(dim=-1, keepdim=True) / 64).view(y.shape)
                        r[f"max_{part}_bf16_steps"] = max(r[f"max_{part}_bf16_steps"], _bf16_steps(a[rows], t[rows]))
                        r[f"max_{part}_bf16_steps_not_near_0"] = max(r[f"max_{part}_bf16_steps_not_near_0"],
                                                                     _bf16_steps(a[rows][big], t[rows][big]))
                t.copy_(a)  # each step from equal states: its own differences, not a drift accumulated
    return r


def commit_rows(ref, bs, dtypes, rounds=5, v=8, layers=30):
    """P16: the commit of a speculative step over `layers` c128 layers, against sglang 0.5.23's own MTP calls
    on the same lengths and acceptances. sglang: mark_pending, then commit_pending per layer (each copies a
    request's accepted bank entry onto its main slot: the mark is in the graph so that every replay commits).
    pydsa: one c128_commit for every layer (it writes the slot holding each request's accepted state; no state
    moves), and the same with states= (the accepted entry copied onto the main slot of every layer in one
    launch: sglang's result)."""
    rows = []
    rng = np.random.default_rng(8)
    gen = torch.Generator(device="cuda").manual_seed(8)
    for dtype in dtypes:
        for b in bs:
            stride = b
            seq = rng.integers(1, 4000, b).astype(np.int64)
            acc = rng.integers(0, v + 1, b)
            rid = torch.arange(b, dtype=torch.int64, device="cuda")
            r2t = torch.zeros(b, 8, dtype=torch.int32, device="cuda")
            before = torch.from_numpy(seq).cuda()
            after = torch.from_numpy(seq + acc).cuda()
            pending = torch.full((b,), -1, dtype=torch.int64, device="cuda")
            theirs = [(torch.randn(stride * (v + 1), 3 * D, device="cuda", generator=gen) * 0.1).to(dtype)
                      for _ in range(layers)]
            ours_states = [(torch.randn(b * (v + 2), 1, 3 * D, device="cuda", generator=gen) * 0.1).to(dtype)
                           for _ in range(layers)]
            seq32 = before.to(torch.int32)
            accepted = torch.from_numpy(acc.astype(np.int32)).cuda()
            main = rid.to(torch.int32)
            bank = (main + b).contiguous()
            load = torch.empty(b, dtype=torch.int32, device="cuda")
            resolve = pydsa.C128Commit(seq32, accepted, main, bank, num_drafts=v, bank_stride=b, load_indices=load,
                                       num_slots=b * (v + 2))
            copying = pydsa.C128Commit(seq32, accepted, main, bank, num_drafts=v, bank_stride=b, states=ours_states)
            calls = [lambda: ref.mark_pending(before, rid, pending, b, stride, dtype)]
            calls += [lambda s=s: ref.commit_pending(after, rid, r2t, pending, s, b, v, stride, stride) for s in theirs]
            t = {"pydsa": [], "pydsa copying": [], "sglang": []}
            for _ in range(rounds):
                t["pydsa"].append(graph_us([resolve.launch]))
                t["pydsa copying"].append(graph_us([copying.launch]))
                t["sglang"].append(graph_us(calls) * len(calls))
            m = {k: statistics.median(x) for k, x in t.items()}
            row = {"b": b, "v": v, "layers": layers, "state": str(dtype).replace("torch.", ""),
                   "pydsa commit (load slots) us": round(m["pydsa"], 3),
                   "pydsa commit copying onto main slots us": round(m["pydsa copying"], 3),
                   "sglang mark_pending + commit_pending per layer us": round(m["sglang"], 3),
                   "P16 speedup": round(m["sglang"] / m["pydsa"], 2),
                   "copying speedup": round(m["sglang"] / m["pydsa copying"], 3)}
            rows.append(row)
            print(row, flush=True)
    return rows
