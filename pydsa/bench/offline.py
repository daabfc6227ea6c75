"""The sglang 0.5.23 user's real choice: the release's default offline c128 path (a 128-row ring of raw
kv_score rows per request, compressed when a chunk closes), its opt-in online path, and pydsa's fused
online path, per layer in one process on the same inputs (fp32), decode + store and prefill + store; and
the state bytes per request each keeps."""
from __future__ import annotations

import numpy as np
import torch

import pydsa
from .decode_path import D, PAGE, Layer, PrefillCase
from .harness import median_graph_us

RING_ROWS = 128  # the offline path's ring: 128 raw rows of 2D floats per request per c128 layer


def state_bytes(num_drafts: int = 0) -> dict:
    """Bytes each path keeps per request per c128 layer (fp32; bf16 online state is half)."""
    ring = (256 if num_drafts else RING_ROWS) * 2 * D * 4  # sglang sizes a speculative ring to 256 rows
    online = (num_drafts + 1) * 3 * D * 4
    return {"offline ring bytes": ring, "online state bytes": online, "ratio": round(ring / online, 1)}


def decode_rows(ref, bs, rounds=5):
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(11)
    for closing in (False, True):
        for b in bs:
            L = Layer(b, torch.float32, closing, gen)
            ring = torch.randn(b, RING_ROWS, 2 * D, device="cuda", generator=gen)
            off_plan = ref.plan_decode_offline(L.rid, L.seq64)
            on_plan = ref.plan_decode(L.seq64, L.rid, L.r2t)
            fused = pydsa.C128Decode(L.state, L.kv, None, L.ape, L.idx, L.seq, store=L.store, cache_slots=L.loc)
            off_dec = lambda: ref.compress_forward_offline(ring, L.kv, L.ape, off_plan, out=L.out)
            off_store = lambda: ref.store(L.out, off_plan, L.w, 1e-6, L.freq, L.loc, L.cache, PAGE)
            on_dec = lambda: ref.compress_forward(L.state, L.kv, L.ape, on_plan, out=L.out)
            on_store = lambda: ref.store(L.out, on_plan, L.w, 1e-6, L.freq, L.loc, L.cache, PAGE)
            cases = {"sglang offline (default) decode + store": [off_dec, off_store],
                     "sglang online decode + store": [on_dec, on_store], "pydsa decode+store fused": [fused.launch]}
            m = median_graph_us(cases, rounds)
            rows.append(_row({"b": b, "lengths": "closing" if closing else "random"}, m))
            print(rows[-1], flush=True)
            del ring
    return rows


def prefill_rows(ref, cases, rounds=5):
    rows = []
    rng = np.random.default_rng(12)
    gen = torch.Generator(device="cuda").manual_seed(12)
    for name, case in cases.items():
        if not PrefillCase.fits_sglang(case):
            continue
        P = PrefillCase(case, rng, gen)
        n, state, kv, ape, idx, loc, cache, w, freq, store, plan = (P.n, P.state, P.kv, P.ape, P.idx, P.loc, P.cache,
                                                                    P.w, P.freq, P.store, P.plan)
        ring = torch.randn(P.b, RING_ROWS, 2 * D, device="cuda", generator=gen)
        seq_t, ext_t = torch.from_numpy(P.seq), torch.from_numpy(P.ext)
        on_plan = ref.plan_prefill(seq_t, ext_t, P.rid, P.r2t, n)
        off_plan = ref.plan_prefill_offline(P.rid, seq_t, ext_t, n)
        out_on = torch.empty(max(1, on_plan.plan_c.shape[0]), D, device="cuda")
        out_off = torch.empty(max(1, off_plan.plan_c.shape[0]), D, device="cuda")
        cases_ = {
            "sglang offline (default) prefill + store": [
                lambda: ref.compress_forward_offline(ring, kv, ape, off_plan, out=out_off),
                lambda: ref.store(out_off, off_plan, w, 1e-6, freq, loc, cache, PAGE)],
            "sglang online prefill + store": [
                lambda: ref.compress_forward(state, kv, ape, on_plan, out=out_on),
                lambda: ref.store(out_on, on_plan, w, 1e-6, freq, loc, cache, PAGE)],
            "pydsa prefill+store fused": [
                lambda: pydsa.c128_prefill(state, kv, None, ape, idx, plan, compact=True, store=store,
                                           cache_slots=loc)]}
        m = median_graph_us(cases_, rounds)
        rows.append(_row({"case": name, "tokens": n}, m))
        print(rows[-1], flush=True)
        del ring
    return rows


def _row(head: dict, m: dict) -> dict:
    off, on, ours = m.values()
    return {**head, **{k + " us": round(v, 3) for k, v in m.items()},
            "pydsa vs offline": round(off / ours, 3), "pydsa vs online": round(on / ours, 3)}


def rows(ref, rounds=5, prefill_cases=None) -> dict:
    return {"state bytes per request per c128 layer": {"decode": state_bytes(0), "speculative, 4 drafts": state_bytes(4)},
            "decode": decode_rows(ref, [1, 32, 256, 1024], rounds),
            "prefill": prefill_rows(ref, prefill_cases or {}, rounds)}
