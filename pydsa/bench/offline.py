"""The sglang 0.5.23 user's real choice: the release's default offline c128 path (a 128-row ring of raw
kv_score rows per request, compressed when a chunk closes), its opt-in online path, and pydsa's fused
online path, per layer in one process on the same inputs (fp32), decode + store and prefill + store; and
the state bytes per request each keeps. Then P33 and P34: sglang's default offline c128 layer against pydsa's
offline ops over sglang's own plans (decode + store, extend + store; fp32 and bf16 ring), each case checked.

    python -m pydsa.bench.release OUT.json --reference-build DIR --only offline
"""
from __future__ import annotations

import json

import numpy as np
import torch

import pydsa
from .decode_path import D, PAGE, Layer, PrefillCase
from .harness import copy_bandwidth_tbps, median_graph_us
from .v4_step import CHUNK, EPS, _release, cache_diff, offline_dtypes, same_start, step_lengths, within_tolerance

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
    """The offline-versus-online rows, then P33 and P34 (the ring dtypes whose sglang offline module was built)."""
    built = offline_dtypes(ref)
    dtypes = [dtype for dtype, why in built.items() if why is None]
    copy_tbps = copy_bandwidth_tbps()
    return {"state bytes per request per c128 layer": {"decode": state_bytes(0), "speculative, 4 drafts": state_bytes(4)},
            "decode": decode_rows(ref, [1, 32, 256, 1024], rounds),
            "prefill": prefill_rows(ref, prefill_cases or {}, rounds),
            "copy_tbps": copy_tbps,
            "skipped": [f"ring {dtype}: {why}" for dtype, why in built.items() if why],
            "P33": p33_rows(ref, rounds, dtypes, copy_tbps), "P34": p34_rows(ref, rounds, dtypes, copy_tbps)}


# ---- P33 / P34: sglang's default offline c128 layer, pydsa's offline ops over sglang's own plans --------------------
# sglang 0.5.23 runs a c128 layer this way unless SGLANG_OPT_USE_ONLINE_COMPRESS is set: a request-scoped ring of 128
# raw rows per request, its plan (CompressorDecodePlan.generate(128, ...) / CompressorPrefillPlan.generate(128, ...)),
# then its offline compress (decode: one launch; extend: compress + write) and its store (one launch). pydsa reads
# the same plan records in place: pydsa.c128_offline_decode (one launch: row, chunk and store) and
# pydsa.c128_offline_extend (two: chunks and store, then rows). The plan is made once per step on both sides and is
# not timed. Each case is checked once, both sides from the same start (ring rows bit for bit, cache bytes within one
# fp8 step, vectors, plan records of pydsa.sglang's planners against sglang's), then timed (CUDA graphs, median of
# interleaved rounds) beside the copy floor of the bytes it must move. The check code is device-generic
# (tests/test_sglang_offline.py runs it on the host backend against pydsa.sglang standing in for sglang).

SWA = 256          # sglang's SWA page (the c128 planner judges it: a multiple of the ring size)
ENTRY_BYTES = 584  # a V4 cache entry: 448 fp8 codes, 64 bf16 rope values, 8 scale bytes
P34_CASES = {  # name: (seq_lens, extend_lens); None: 64 requests of 1-600 new tokens behind random prefixes
    "1x128": ([128], [128]), "8x1K prefixes": ([1024 + 100 * i for i in range(8)], [1024] * 8),
    "1x8K": ([8192], [8192]), "1x32K": ([32768], [32768]), "64x(1-600) prefixes": None}


def ragged_case(rng):
    """P34's ragged extend: 64 requests of 1-600 new tokens behind random prefixes, (seq_lens, extend_lens)."""
    ext = rng.integers(1, 601, 64)
    return (ext + rng.integers(0, 100_000, 64)).tolist(), ext.tolist()


class OfflineCase:
    """One offline c128 layer in sglang's pool layout (request b in ring slot b: rows b * 128 .. of a flat ring of
    B * 128 + 129 rows rounded to 128, as sglang's CompressStatePool sizes it; cache slots per token), its store's
    buffers (V4, page 2), pydsa's C128Ring over the same ring and cache, sglang's tables and one step's input of
    `tokens` rows."""

    def __init__(self, b, tokens, dtype, max_len, gen):
        dev = gen.device
        rows = -(-(b * CHUNK + CHUNK + 1) // CHUNK) * CHUNK
        self.ring = torch.randn(rows, 2 * D, device=dev, generator=gen).to(dtype)
        self.view = self.ring.view(-1, CHUNK, 2 * D)  # sglang's view of it
        self.ape = torch.randn(CHUNK, D, device=dev, generator=gen) * 0.5
        self.w = torch.rand(D, device=dev, generator=gen) + 0.5
        angles = torch.rand(max_len + CHUNK, 32, device=dev, generator=gen) * 6.3
        self.freq = torch.polar(torch.ones_like(angles), angles)
        self.kv = torch.randn(tokens, 2 * D, device=dev, generator=gen)
        self.cache = torch.zeros(tokens // PAGE + 1, pydsa.kv_page_bytes(D, PAGE), dtype=torch.uint8, device=dev)
        store = pydsa.KVCache(self.cache, self.w, self.freq, page_size=PAGE, eps=EPS)
        self.ours = pydsa.C128Ring(self.ring, self.ape, store=store)
        self.rpi = torch.arange(b, dtype=torch.int64, device=dev)
        self.r2t = torch.zeros(b, 8, dtype=torch.int32, device=dev)
        self.f2s = torch.zeros(16, dtype=torch.int64, device=dev)
        self.state = "bf16" if dtype == torch.bfloat16 else "fp32"


def decode_case(ref, b, closing, dtype, device="cuda", seed=0):
    """B requests' decode step: lengths (random below 4096, or every row closing), sglang's plan of the step."""
    gen = torch.Generator(device=device).manual_seed(seed)
    case = OfflineCase(b, b, dtype, 4096, gen)
    case.seq = step_lengths(b, closing, seed, device, max_len=4096)
    case.loc = torch.arange(b, dtype=torch.int64, device=device)
    case.plan = ref.compress.CompressorDecodePlan.generate(CHUNK, case.rpi, case.r2t, case.f2s, case.seq, SWA, CHUNK)
    case.out = torch.empty(b, D, device=device)
    case.closing = int((case.seq % CHUNK == 0).sum())
    return case


def extend_case(ref, seqs, exts, dtype, device="cuda", seed=0):
    """One extend (request b's positions seqs[b] - exts[b] .. seqs[b] - 1 behind a cached prefix), sglang's host
    plan of it, a cache slot per token."""
    gen = torch.Generator(device=device).manual_seed(seed)
    n = int(sum(exts))
    case = OfflineCase(len(seqs), n, dtype, max(seqs), gen)
    case.seqs, case.exts = torch.tensor(seqs, dtype=torch.int64), torch.tensor(exts, dtype=torch.int64)
    case.plan = ref.compress.CompressorPrefillPlan.generate(CHUNK, case.rpi, case.seqs, case.exts, case.r2t, case.f2s,
                                                            SWA, CHUNK, n)
    case.loc = torch.randperm(n, device=device, generator=gen).to(torch.int64)
    case.out = torch.empty(case.plan.plan_c.shape[0], D, device=device)
    case.closing = int(case.plan.plan_c.shape[0])
    return case


def sglang_calls(ref, case) -> list:
    """sglang's layer step: its offline compress (decode: one launch; extend: two), then its store."""
    return [lambda: ref.compress_forward_offline(case.view, case.kv, case.ape, case.plan, out=case.out),
            lambda: ref.store(case.out, case.plan, case.w, EPS, case.freq, case.loc, case.cache, PAGE)]


def pydsa_call(case, out=None):
    """pydsa's layer step over sglang's records: one call (decode: one launch; extend: two)."""
    if case.plan.is_decode:
        pydsa.c128_offline_decode(case.ours, case.kv, records=case.plan.plan_d, out=out, cache_slots=case.loc)
    else:
        pydsa.c128_offline_extend(case.ours, case.kv, (case.plan.plan_c, case.plan.plan_w), out=out,
                                  cache_slots=case.loc)


def _records_by_ragged(plan_c, plan_w):
    """A plan's live records, each list in ragged-row order (a device plan's order is sglang's atomics')."""
    c = [tuple(r) for r in plan_c.cpu().view(torch.int32).reshape(-1, 4).tolist() if r[0] != -1]
    w = [tuple(r) for r in plan_w.cpu().view(torch.int32).reshape(-1, 2).tolist() if r[0] != -1]
    return sorted(c, key=lambda r: r[1] & 0xFFFF), sorted(w)


def plan_check(ref, case) -> dict:
    """pydsa.sglang's planners beside sglang's on the case's lengths: decode records and host extend records byte
    for byte; the device-lengths extend plan (CUDA graphs, target verify) record for record by ragged row."""
    from .. import sglang as ours
    if case.plan.is_decode:
        mine = ours.CompressorDecodePlan.generate(CHUNK, case.rpi, case.r2t, case.f2s, case.seq, SWA, CHUNK)
        return {"plan_bytes_equal": bool(torch.equal(mine.plan_d, case.plan.plan_d))}
    n, dev = case.kv.shape[0], case.rpi.device
    mine = ours.CompressorPrefillPlan.generate(CHUNK, case.rpi, case.seqs, case.exts, case.r2t, case.f2s, SWA, CHUNK, n)
    found = {"plan_bytes_equal": bool(torch.equal(mine.plan_c, case.plan.plan_c)
                                      and torch.equal(mine.plan_w, case.plan.plan_w))}
    if dev.type == "cuda":
        args = (CHUNK, case.rpi, case.seqs.to(dev), case.exts.to(dev), case.r2t, case.f2s, SWA, CHUNK, n, True)
        a, b = ours.CompressorPrefillPlan.generate(*args), ref.compress.CompressorPrefillPlan.generate(*args)
        found["device_plan_records_bit_equal"] = _records_by_ragged(a.plan_c, a.plan_w) == \
            _records_by_ragged(b.plan_c, b.plan_w)
    return found


def check(ref, case) -> dict:
    """Both sides' step from the same start: ring rows bit for bit, the vectors of the chunks that close (rows
    written alike, largest relative difference), cache bytes (v4_step.cache_diff: fp8 code steps, scale bytes, rope
    steps), and the plans; whether it is within c4.py's tolerance."""
    rows = case.out.shape[0]

    def theirs():
        out = torch.full((rows, D), float("nan"), device=case.kv.device)
        ref.compress_forward_offline(case.view, case.kv, case.ape, case.plan, out=out)
        ref.store(out, case.plan, case.w, EPS, case.freq, case.loc, case.cache, PAGE)
        return out

    def mine():
        out = torch.full((rows, D), float("nan"), device=case.kv.device)
        pydsa_call(case, out)
        return out
    (ring_t, out_t), (ring_m, out_m) = same_start([case.ring, case.cache], theirs, mine)
    bits = torch.int16 if case.ring.dtype == torch.bfloat16 else torch.int32
    written = ~torch.isnan(out_t[:, 0])
    t, m = out_t[written], out_m[written]
    found = {"closing_rows": case.closing, "out_rows": int(written.sum()),
             "out_rows_written_alike_bit_equal": bool(torch.equal(written, ~torch.isnan(out_m[:, 0]))),
             "ring_bit_equal": bool(torch.equal(ring_t[0].view(bits), ring_m[0].view(bits))),
             "ring_rows_changed": int((ring_m[0] != case.ring).any(dim=1).sum()),
             "cache_bytes_written": int((ring_m[1] != case.cache).sum()),
             "out_max_rel": float(((m - t).norm(dim=1) / t.norm(dim=1).clamp_min(1e-30)).max()) if t.shape[0] else 0.0,
             **cache_diff(ring_m[1], ring_t[1], "v4", page_size=PAGE), **plan_check(ref, case)}
    found["within_tolerance"] = within_tolerance(found) and found["out_rows"] == case.closing
    return found


def floor_us(case, copy_tbps) -> float:
    """The step's bytes at copy bandwidth: every input row read; every ring row the plan keeps written; the ring
    rows each closing chunk reads (a decode: 127, the new row being its input; an extend: its buffer_len); each
    entry stored; ape and the norm weight."""
    e = case.ring.element_size()
    row_in, row_ring = 2 * D * 4, 2 * D * e
    if case.plan.is_decode:
        b = case.kv.shape[0]
        nbytes = b * (row_in + row_ring) + case.closing * (127 * row_ring + ENTRY_BYTES)
    else:
        words = case.plan.plan_c.cpu().view(torch.int32).reshape(-1, 4)
        read = int(((words[:, 1] >> 16) & 0xFFFF).sum())
        nbytes = case.kv.shape[0] * row_in + case.plan.plan_w.shape[0] * row_ring + read * row_ring \
            + case.closing * ENTRY_BYTES
    nbytes += CHUNK * D * 4 + D * 4
    return nbytes / (copy_tbps * 1e12) * 1e6


def _timed(ref, case, head, rounds, copy_tbps) -> dict:
    found = check(ref, case)
    t = median_graph_us({"sglang": sglang_calls(ref, case), "pydsa": [lambda: pydsa_call(case)]}, rounds)
    floor = floor_us(case, copy_tbps)
    row = {**head, "state": case.state, "sglang_us": t["sglang"], "pydsa_us": t["pydsa"],
           "speedup": t["sglang"] / t["pydsa"], "floor_us": floor, "pydsa_over_floor": t["pydsa"] / floor,
           "check": found}
    print(json.dumps(row), flush=True)
    return row


def p33_rows(ref, rounds, dtypes, copy_tbps, device="cuda") -> list:
    """P33: one offline c128 layer's decode + store, B = 1 / 32 / 256 / 1024, random lengths and every row closing;
    sglang's two launches (offline compress, store) against pydsa's one."""
    rows = []
    for dtype in dtypes:
        for closing in (False, True):
            for b in (1, 32, 256, 1024):
                case = decode_case(ref, b, closing, dtype, device, seed=b + closing)
                head = {"key": "P33 layer speedup", "b": b, "lengths": "closing" if closing else "random"}
                rows.append(_timed(ref, case, head, rounds, copy_tbps))
                del case
                _release(device)
    return rows


def p34_rows(ref, rounds, dtypes, copy_tbps, device="cuda") -> list:
    """P34: one offline c128 layer's extend + store, sglang's host plan read by both sides: sglang's three launches
    (compress, write, store) against pydsa's two."""
    rows = []
    rng = np.random.default_rng(34)
    for name, lengths in P34_CASES.items():
        if lengths is None:
            lengths = ragged_case(rng)
        for dtype in dtypes:
            case = extend_case(ref, *lengths, dtype, device, seed=len(rows))
            head = {"key": "P34 speedup", "case": name, "tokens": int(sum(lengths[1])),
                    "lengths": "random" if name.startswith("64x") else "given"}
            rows.append(_timed(ref, case, head, rounds, copy_tbps))
            del case
            _release(device)
    return rows
