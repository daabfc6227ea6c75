"""A whole DeepSeek-V4 compressor decode step as one figure (P31), and (pydsa/bench/c4_paths.py) the plugin's c4 path
call by call (P35): pydsa
beside sglang 0.5.23's own kernels in one process, same inputs, CUDA graphs (median of interleaved rounds, a GPU
spin before each replay), PDL as each side ships it. Targets in docs/performance.md.

    python -m pydsa.bench.release OUT.json --reference-build DIR --only v4-step

- P31: one decode step of V4-Flash (20 c128 + 21 c4 layers) or V4-Pro (31 c128 + 30 c4), the two kinds alternating,
  each layer its own state or rings and caches, in one graph; B = 32 / 256 / 1024; random lengths, or every row
  closing (multiples of 128: every c128 and every c4 layer closes); fp32 and bf16 state. pydsa: its fused c128
  decode + store and its c4 layer (both compressors and stores in one launch, over its request-scoped ring of 8
  rows per request), each from lengths and slots: no planner. sglang, config "default" (the release's default):
  its two plans of the step as its compressor makes them (CompressorDecodePlan.generate(128, ...) over a
  request-scoped ring of 128 raw rows, generate(4, ...) over its page-scoped c4 ring), then per c128 layer its
  offline compress + store, per c4 layer compress + store per compressor (4 launches); config "online": its
  online c128 plan and decode + store instead; config "default-same": pydsa in sglang's default numerics (sglang's
  offline c128 and c4 plans of the step, which the plugin keeps, pydsa's offline decode + store reading the c128
  plan in place over the same rings, pydsa's c4 layers) beside sglang's default. Where a step moves less than three L2s, sets of layers take turns
  (each replay's steps cycle through them: L2-cold). Beside each row the floor: the bytes the step must move at
  copy bandwidth.
- P35: one c4 layer's decode, B = 1 / 32 / 256 / 1024, fp32, sglang's plan read by both sides: the plugin's route
  (its layer hook: one c4_layer call for both compressors, 1 launch) and its per-compressor route (2 launches)
  against sglang's four; each pydsa.sglang call against the sglang call it replaces (compress_forward and
  compress_norm_rope_store per compressor, CompressorDecodePlan.generate(4, ...)).

Each case is checked once before it is timed, both sides from the same start: cache bytes, fp8 code steps (c4.py's
measure), scale bytes and rope steps, states, compressed vectors, plan bytes; the check and whether it is within
c4.py's tolerance go into the row. For the default path's check the first c128 layer's state is set to the online
softmax of what its ring holds, so both compress the same rows.
The pydsa side is device-generic (tests/test_bench_v4_step.py runs it on the host backend).
"""
from __future__ import annotations

import gc
import json
import math
from functools import partial

import torch

import pydsa
from .c4 import DIMS, SWA_PAGE, _fp8_steps, _step_bytes, sglang_layer
from .decode_path import D, PAGE
from .harness import copy_bandwidth_tbps, median_graph_us
from .mtp import _bf16_steps

MODELS = {"V4-Flash": (20, 21), "V4-Pro": (31, 30)}  # c128 layers, c4 layers of one decode step
CHUNK = 128    # c128: tokens per chunk; sglang's default path keeps CHUNK raw rows per request
RING = 8       # c4: ring rows per request slot (pydsa) and per SWA page (sglang), sglang's decode ring
MAX_LEN = 1024
C4_PAGE = 64   # c4 cache page size (entries)
ENTRY, CODES = D + 64, D - 64  # a v4 cache entry's bytes: fp8 codes of channels 0 .. D-65, the 64 rope values as bf16
EPS = 1e-6
STATE = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def step_lengths(b, closing, seed, device, ratio=CHUNK, max_len=MAX_LEN):
    """Lengths with the new token (int64 [B], below max_len): uniform, or every row closing (multiples of ratio);
    a lone request at random lengths closes nothing (4k + 1)."""
    g = torch.Generator(device=device).manual_seed(seed)
    if closing:
        return torch.randint(1, max_len // ratio, (b,), generator=g, device=device) * ratio
    seq = torch.randint(1, max_len, (b,), generator=g, device=device)
    if b == 1:
        seq[0] = 4 * (max_len // 8) + 1
    return seq


class Geometry:
    """B requests in sglang's paged layout (identity full-to-SWA map, each request its own SWA pages, as c4.py's
    Context) at one step's lengths: the tables both sglang planners read, request b in slot b, each row's c4 cache
    slot (sglang's c4_out_loc: the closing token's full-pool slot // 4, 0 where none closes), and the c4 window
    rows: sglang's page-ring rows and pydsa's request-ring rows of each request's last 8 positions (what an
    entry reads: the previous quartet and its own)."""

    def __init__(self, seq, max_len=MAX_LEN):
        dev, b = seq.device, seq.shape[0]
        self.b, self.max_len, self.per = b, max_len, -(-max_len // SWA_PAGE) * SWA_PAGE
        self.seq64, self.seq32 = seq.to(torch.int64), seq.to(torch.int32)
        self.rpi = torch.arange(b, dtype=torch.int64, device=dev)
        self.slots = self.rpi.to(torch.int32)
        self.r2t = torch.arange(b * self.per, dtype=torch.int32, device=dev).reshape(b, self.per)
        self.f2s = torch.arange(b * self.per + SWA_PAGE, dtype=torch.int64, device=dev)
        self.pages = b * self.per // SWA_PAGE + 2
        loc = (self.rpi * self.per + self.seq64 - 1) // 4
        self.out_loc = torch.where(self.seq64 % 4 == 0, loc, torch.zeros_like(loc))
        q = (self.seq64 - 1)[:, None] - torch.arange(8, device=dev)[None, :]
        rid = self.rpi[:, None].expand_as(q)
        live = q >= 0
        q, rid = q[live], rid[live]
        swa = self.f2s[self.r2t[rid, q].to(torch.int64)]  # sglang's ring row: (swa // page) * R + swa % R
        self.window = (swa // SWA_PAGE * RING + swa % RING, rid * RING + q % RING)


class C4Layer:
    """One c4 layer: per compressor (main D = 512, indexer D = 128) sglang's page-scoped ring, the ape, the norm
    weight, the cache and the step's input; pydsa's request-scoped ring (RING rows per slot) holding the same
    window rows, and its one-launch decode of both compressors and stores. Attributes named as c4.Context's,
    which sglang_layer reads."""

    def __init__(self, geo, dtype, gen):
        dev = geo.seq64.device
        angles = torch.rand(geo.max_len + 8, 32, device=dev, generator=gen) * 6.28
        self.freqs_cis = torch.polar(torch.ones_like(angles), angles)
        rotary = torch.view_as_real(self.freqs_cis).flatten(-2).contiguous()
        self.rings, self.apes, self.weights, self.caches, self.kv, ours = [], [], [], [], [], []
        theirs_rows, our_rows = geo.window
        for k, d in enumerate(DIMS):
            ring = torch.randn(geo.pages * RING, 4 * d, device=dev, generator=gen).to(dtype)
            ape = torch.randn(8, d, device=dev, generator=gen) * 0.5
            w = torch.rand(d, device=dev, generator=gen) + 0.5
            page = pydsa.kv_page_bytes(d, C4_PAGE) if k == 0 else pydsa.indexer_page_bytes(d, C4_PAGE)
            cache = torch.zeros(geo.pages, page, dtype=torch.uint8, device=dev)
            store = pydsa.KVCache(cache, w, rotary, page_size=C4_PAGE, eps=EPS, layout="v4" if k == 0 else "indexer")
            mine = torch.zeros(geo.b * RING, 4 * d, dtype=dtype, device=dev)
            mine[our_rows] = ring[theirs_rows]
            ours.append(pydsa.C4Compressor(mine, ape, store=store, ring_size=RING))
            self.rings.append(ring), self.apes.append(ape), self.weights.append(w), self.caches.append(cache)
            self.kv.append(torch.randn(geo.b, 4 * d, device=dev, generator=gen))
        self.ours = ours
        self.op = pydsa.C4Decode(ours[0], self.kv[0], indexer=ours[1], indexer_kv_score=self.kv[1], seq_lens=geo.seq32,
                                 slots=geo.slots, cache_slots=geo.out_loc)


class C128Layer:
    """One c128 layer (request b in state slot b and cache slot b): state, ape, input, cache with its norm weight
    and rotary table, and pydsa's fused decode + store over them. sglang's online path reads the same state; its
    default path a ring of CHUNK raw rows per request (ring=True), row position % 128."""

    def __init__(self, geo, dtype, gen, ring):
        dev, b = geo.seq64.device, geo.b
        self.seq64 = geo.seq64
        state = torch.randn(b, 1, 3 * D, device=dev, generator=gen) * 0.1
        state[:, :, D:2 * D] = 3.0
        self.state = state.to(dtype)
        self.ape = torch.randn(CHUNK, D, device=dev, generator=gen)
        self.kv = torch.randn(b, 2 * D, device=dev, generator=gen)
        self.out = torch.empty(b, D, device=dev)
        self.loc = torch.arange(b, dtype=torch.int64, device=dev)
        self.cache = torch.zeros((b + 1) // PAGE + 1, pydsa.kv_page_bytes(D, PAGE), dtype=torch.uint8, device=dev)
        self.w = torch.rand(D, device=dev, generator=gen) + 0.5
        angles = torch.rand(geo.max_len + CHUNK, 32, device=dev, generator=gen) * 6.3
        self.freq = torch.polar(torch.ones_like(angles), angles)
        self.store = pydsa.KVCache(self.cache, self.w, self.freq, page_size=PAGE, eps=EPS)
        self.ring = torch.randn(b, CHUNK, 2 * D, device=dev, generator=gen).to(dtype) if ring else None
        # pydsa's offline ops over the same ring, reading sglang's default plan in place (config default-same)
        self.offline = pydsa.C128Ring(self.ring.view(b * CHUNK, 2 * D), self.ape, store=self.store) if ring else None
        self.op = pydsa.C128Decode(self.state, self.kv, None, self.ape, geo.slots, geo.seq32, store=self.store,
                                   cache_slots=self.loc)

    def settle(self):
        """Each request's state becomes the online softmax (docs/spec.md, the state) of its chunk's earlier tokens as
        the ring holds them (float64, then the state's dtype): both paths then compress the same rows."""
        n = (self.seq64 - 1) % CHUNK  # tokens of the chunk before the new one: ring rows 0 .. n-1
        ring = self.ring.double()
        t = ring[..., D:] + self.ape.double()
        earlier = torch.arange(CHUNK, device=n.device)[None, :, None] < n[:, None, None]
        t = t.masked_fill(~earlier, -math.inf)
        m = t.amax(1)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        w = torch.exp(t - m[:, None])
        s = w.sum(1)
        k = (w * ring[..., :D]).sum(1) / s.clamp_min(1e-300)
        keep = n > 0  # a chunk's first token reads no state
        self.state[keep, 0] = torch.cat([m, s, k], -1)[keep].to(self.state.dtype)


def _alternating(first, second):
    """The two kinds of layer alternating, the longer list first (V4 alternates its c4 and c128 layers)."""
    if len(second) > len(first):
        first, second = second, first
    out = []
    for i, layer in enumerate(first):
        out.append(layer)
        if i < len(second):
            out.append(second[i])
    return out


def sglang_c128_plan(ref, geo, config):
    """sglang's c128 plan of the step: the default path's as its compressor makes it (generate(128, ...): a ring of
    CHUNK rows per request, row position % 128, the records generate_legacy writes too), or the online one."""
    if config == "default":
        return ref.compress.CompressorDecodePlan.generate(CHUNK, geo.rpi, geo.r2t, geo.f2s, geo.seq64, SWA_PAGE, CHUNK)
    return ref.plan_decode(geo.seq64, geo.rpi, geo.r2t)


def sglang_c128(ref, layer, plan, config):
    """sglang's c128 layer: compress (offline over the ring, or online over the state), then store."""
    if config == "default":
        ref.compress_forward_offline(layer.ring, layer.kv, layer.ape, plan, out=layer.out)
    else:
        ref.compress_forward(layer.state, layer.kv, layer.ape, plan, out=layer.out)
    ref.store(layer.out, plan, layer.w, EPS, layer.freq, layer.loc, layer.cache, PAGE)


def pydsa_offline_c128(layer, plan):
    """pydsa's offline c128 decode + store of a layer over its ring, sglang's default plan's records read in place."""
    pydsa.c128_offline_decode(layer.offline, layer.kv, records=plan.plan_d, cache_slots=layer.loc)


class StepSet:
    """One decode step's layers of a model, in model order, each its own buffers."""

    def __init__(self, geo, model, dtype, gen, ring, models=MODELS):
        n128, n4 = models[model]
        self.geo = geo
        self.c128 = [C128Layer(geo, dtype, gen, ring) for _ in range(n128)]
        self.c4 = [C4Layer(geo, dtype, gen) for _ in range(n4)]
        self.layers = _alternating(self.c128, self.c4)

    def pydsa(self):
        for layer in self.layers:
            layer.op.launch()

    def pydsa_default_same(self, ref):
        """pydsa in sglang's default numerics: sglang's offline c128 plan of the step (its plan kernel, which the
        plugin keeps), pydsa's offline decode + store over each c128 layer's ring reading it in place, pydsa's c4
        layers as in pydsa(). The plugin keeps sglang's c4 plan kernel too, so its launch is part of the step
        (the request-scoped c4 decodes here do not read its records; the plugin's c4 layers do)."""
        geo = self.geo
        ref.plan_decode_c4(geo.rpi, geo.r2t, geo.f2s, geo.seq64, RING)
        plan128 = sglang_c128_plan(ref, geo, "default")
        for layer in self.layers:
            if isinstance(layer, C4Layer):
                layer.op.launch()
            else:
                pydsa_offline_c128(layer, plan128)

    def sglang(self, ref, config):
        geo = self.geo
        plan4 = ref.plan_decode_c4(geo.rpi, geo.r2t, geo.f2s, geo.seq64, RING)
        plan128 = sglang_c128_plan(ref, geo, config)
        for layer in self.layers:
            if isinstance(layer, C4Layer):
                sglang_layer(ref, layer, layer.kv, plan4, geo.out_loc)
            else:
                sglang_c128(ref, layer, plan128, config)


class Turns:
    """run(item) on the next item at each call: the GRAPH_CALLS calls a graph captures cycle through the items."""

    def __init__(self, items, run):
        self.items, self.run, self.calls = items, run, 0

    def __call__(self):
        item = self.items[self.calls % len(self.items)]
        self.calls += 1
        self.run(item)


def step_bytes(n128, n4, seq, state_bytes, offline=False):
    """Bytes a decode step must move: per c128 layer every row's input and state read, the state written back where
    no chunk closes and a cache entry (584 B) where one does, the ape read once (decode_path's floor); per c4 layer
    what c4.py's P30 floor counts. offline: the c128 layers keep sglang's default ring instead (state_bytes its
    element): every row's input read, a row that closes no chunk written into the ring, a closing row's CHUNK - 1
    earlier rows read back and its entry written, the ape read once."""
    b = seq.shape[0]
    close128, close4 = int((seq % CHUNK == 0).sum()), int((seq % 4 == 0).sum())
    if offline:
        row = 2 * D * state_bytes
        c128 = b * 2 * D * 4 + (b - close128) * row + close128 * ((CHUNK - 1) * row + 584) + CHUNK * D * 4
    else:
        c128 = b * (2 * D * 4 + 3 * D * state_bytes) + (b - close128) * 3 * D * state_bytes + close128 * 584 \
            + CHUNK * D * 4
    return n128 * c128 + n4 * _step_bytes(close4, b, state_bytes)


def same_start(tensors, theirs, mine):
    """Runs theirs, then mine, each from the tensors' present contents (restored after each):
    [(tensors after theirs, its result), (tensors after mine, its result)]."""
    start = [t.clone() for t in tensors]
    out = []
    for run in (theirs, mine):
        result = run()
        out.append(([t.clone() for t in tensors], result))
        for t, s in zip(tensors, start):
            t.copy_(s)
    return out


def cache_diff(mine, theirs, layout, page_size=C4_PAGE, prefix=""):
    """How two caches differ. A "v4" cache (pages of page_size entries of ENTRY bytes: CODES fp8 codes, then 64
    bf16 rope values; then 8 scale bytes per entry): bytes, the largest fp8 code step (c4.py's measure, over the
    codes), scale bytes, the largest rope difference in bf16 steps. An "indexer" cache (page_size x 128 codes, then
    fp32 scales): the largest code step and the scales' largest relative difference."""
    if layout == "indexer":
        codes = page_size * 128
        sc_m = mine[:, codes:].contiguous().view(torch.float32)
        sc_t = theirs[:, codes:].contiguous().view(torch.float32)
        nz = sc_t != 0
        rel = float(((sc_m[nz] - sc_t[nz]).abs() / sc_t[nz]).max()) if bool(nz.any()) else 0.0
        found = {"code_steps": _fp8_steps(mine[:, :codes], theirs[:, :codes]), "scale_rel": rel}
    else:
        data = page_size * ENTRY

        def parts(cache):
            entries = cache[:, :data].reshape(-1, page_size, ENTRY)
            return entries[..., :CODES], entries[..., CODES:].contiguous().view(torch.bfloat16), \
                cache[:, data:data + 8 * page_size]
        (codes_m, rope_m, scale_m), (codes_t, rope_t, scale_t) = parts(mine), parts(theirs)
        found = {"bytes_differing": int((mine != theirs).sum()), "fp8_steps": _fp8_steps(codes_m, codes_t),
                 "scale_bytes_differing": int((scale_m != scale_t).sum()),
                 "rope_bf16_steps": _bf16_steps(rope_m, rope_t) if rope_m.numel() else 0}
    return {prefix + key: value for key, value in found.items()}


def c4_cache_diff(runs):
    """One c4 layer's two caches after each side (same_start's runs)."""
    (theirs, _), (mine, _) = runs
    return {**cache_diff(mine[0], theirs[0], "v4", prefix="main_cache_"),
            **cache_diff(mine[1], theirs[1], "indexer", prefix="indexer_")}


def within_tolerance(check) -> bool:
    """c4.py's tolerance: caches equal but for one-step fp8 code flips (and rope values within one bf16 step, scale
    bytes equal), indexer scales within 1e-6 relative, rings and plans bit for bit, vectors within 1e-6."""
    for key, value in check.items():
        if (key.endswith("steps") and value > 1) or (key.endswith("scale_bytes_differing") and value) \
                or (key.endswith(("scale_rel", "out_max_rel")) and value > 1e-6) \
                or (key.endswith(("bit_equal", "plan_bytes_equal")) and value is False):
            return False
    return True


def check_step(ref, step, configs):
    """Each side's first c4 and c128 layer from the same start, with sglang's plans of the step: {config: what
    differs}. The default path's check first settles the c128 state from its ring."""
    geo, c4, c128 = step.geo, step.c4[0], step.c128[0]
    plan4 = ref.plan_decode_c4(geo.rpi, geo.r2t, geo.f2s, geo.seq64, RING)
    theirs_c4 = partial(sglang_layer, ref, c4, c4.kv, plan4, geo.out_loc)
    base = {"c4_closing_rows": int((geo.seq64 % 4 == 0).sum()),
            "c128_closing_rows": int((geo.seq64 % CHUNK == 0).sum()),
            **c4_cache_diff(same_start(c4.caches, theirs_c4, c4.op.launch))}
    checks = {}
    for config in configs:
        if config == "default":
            c128.settle()
        plan = sglang_c128_plan(ref, geo, config)
        (theirs, _), (mine, _) = same_start([c128.cache, c128.state], partial(sglang_c128, ref, c128, plan, config),
                                            c128.op.launch)
        checks[config] = {**base, **cache_diff(mine[0], theirs[0], "v4", PAGE, "c128_cache_")}
        if config == "online":
            checks[config]["c128_state_values_differing"] = int((mine[1] != theirs[1]).sum())
        if config == "default":  # default-same: pydsa's offline ops over sglang's default plan, the same ring
            (theirs, _), (mine, _) = same_start([c128.cache, c128.ring], partial(sglang_c128, ref, c128, plan, config),
                                                partial(pydsa_offline_c128, c128, plan))
            checks["default-same"] = {**base, **cache_diff(mine[0], theirs[0], "v4", PAGE, "c128_cache_"),
                                      "c128_ring_bit_equal": bool(torch.equal(mine[1], theirs[1]))}
    return checks


def step_group(ref, model, b, closing, dtype, rounds, env):
    """The P31 rows of one model, B, lengths and state: pydsa's step beside sglang's in each config it runs
    (env: device, copy_tbps, l2_bytes, offline: the state dtypes of sglang's offline c128 module, models)."""
    models = env.get("models", MODELS)
    n128, n4 = models[model]
    seq = step_lengths(b, closing, 31 * b + closing, env["device"])
    geo = Geometry(seq)
    sb = torch.finfo(dtype).bits // 8
    nbytes = step_bytes(n128, n4, geo.seq64, sb)
    configs = [c for c in ("default", "online") if c == "online" or dtype in env["offline"]]
    sets = max(1, min(8, math.ceil(3 * env["l2_bytes"] / nbytes)))
    gen = torch.Generator(device=env["device"]).manual_seed(7 * b + closing)
    steps = [StepSet(geo, model, dtype, gen, "default" in configs, models) for _ in range(sets)]
    checks = check_step(ref, steps[0], configs)
    cases = {"pydsa": [Turns(steps, StepSet.pydsa)]}
    for config in configs:
        cases[config] = [Turns(steps, partial(StepSet.sglang, ref=ref, config=config))]
    if "default" in configs:
        cases["pydsa default-same"] = [Turns(steps, partial(StepSet.pydsa_default_same, ref=ref))]
    t = median_graph_us(cases, rounds)
    rows = []
    for config in configs + (["default-same"] if "default" in configs else []):
        theirs, mine = (t["default"], t["pydsa default-same"]) if config == "default-same" else (t[config], t["pydsa"])
        # the floor of what pydsa's side runs: its online c128 layers, or in default-same sglang's offline rings
        moved = step_bytes(n128, n4, geo.seq64, sb, offline=True) if config == "default-same" else nbytes
        floor = moved / (env["copy_tbps"] * 1e12) * 1e6
        speedup, over = theirs / mine, mine / floor
        rows.append({"key": "P31 step speedup", "model": model, "config": config, "b": b,
                     "lengths": "closing" if closing else "random", "state": STATE[dtype],
                     "layers": f"{n128} c128 + {n4} c4", "sglang_us": theirs, "pydsa_us": mine,
                     "speedup": speedup, "floor_us": floor, "pydsa_over_floor": over, "step_MB": moved / 1e6,
                     "speedup_bound": theirs / floor,  # what a kernel at the floor would gain over sglang's time
                     "sets": sets, "target": ">= 2x; pydsa within 1.25x of the floor at B >= 256",
                     "met": speedup >= 2.0 and (b < 256 or over <= 1.25), "check": checks[config],
                     "check_within_tolerance": within_tolerance(checks[config])})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _release(device):
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def step_rows(ref, rounds, env, bs=(32, 256, 1024)):
    """P31: every model, B, lengths and state (sglang's default config where its offline module of that state's
    dtype was built)."""
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for model in env.get("models", MODELS):
            for b in bs:
                for closing in (False, True):
                    rows += step_group(ref, model, b, closing, dtype, rounds, env)
                    _release(env["device"])
    return rows


def offline_dtypes(ref) -> dict:
    """{state dtype: None where the reference build holds sglang's offline c128 module of that ring dtype, else
    why it cannot run}."""
    found = {}
    for dtype in (torch.float32, torch.bfloat16):
        try:
            ref.compress._jit_compress_module(D, dtype, torch.float32, torch.float32, CHUNK)
            found[dtype] = None
        except RuntimeError as exc:
            found[dtype] = str(exc)
    return found


def rows(ref, rounds=5, device="cuda") -> dict:
    """P31 (3 rounds at most: a step of 4000 launches per graph), with what it was measured beside; P35's rows are
    pydsa/bench/c4_paths.py's."""
    offline = offline_dtypes(ref)
    env = {"device": device, "copy_tbps": copy_bandwidth_tbps(),
           "l2_bytes": torch.cuda.get_device_properties(device).L2_cache_size,
           "offline": [dtype for dtype, why in offline.items() if why is None]}
    result = {"copy_tbps": env["copy_tbps"], "l2_bytes": env["l2_bytes"],
              "skipped": [f"P31 config default, state {STATE[dtype]}: {why}" for dtype, why in offline.items() if why]}
    print(json.dumps(result), flush=True)
    result["rows"] = step_rows(ref, min(rounds, 3), env)
    return result
