"""Kernel by kernel under ncu (run it as ncu ... python3 benchmarks/ncu_kernels.py REFERENCE_BUILD [--only REGEX]
[--times N], from outside the clone): the P35 c4 calls (each pydsa.sglang call and the plugin route beside sglang
0.5.23's; B = 1 / 32 / 256 / 1024), the P29 c4 extends (`c4x.<case>`: both compressors and stores, pydsa's two launches
beside sglang's six), the offline c128 decode + store (B = 1 / 32 / 1024) and its P34 extends + store
(`offx.<case>`, fp32 ring), both sides, each call N times (3)
inside an NVTX range naming the case; --only keeps the cases whose name matches."""
import argparse
import re

import numpy as np
import torch

from pydsa.bench import c4 as c4b, offline as off, reference
from pydsa.bench.c4_paths import path_cases
from pydsa.bench.v4_step import RING, C4Layer, Geometry, step_lengths


def profiled(name, calls, times=3, only=None):
    """The calls run `times` times inside the NVTX range `name` (ncu --nvtx names each kernel's case by it), unless
    `only` (a regular expression) does not match the name."""
    if only is not None and not re.search(only, name):
        return
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(name)
    for _ in range(times):
        for c in calls:
            c()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def main(reference_build, only=None, times=3, dev="cuda"):
    ref = reference.load(reference_build)
    for b in (1, 32, 256, 1024):
        for closing in (False, True):
            geo = Geometry(step_lengths(b, closing, 35 * b + closing, dev, ratio=4))
            layer = C4Layer(geo, torch.float32, torch.Generator(device=dev).manual_seed(5 * b + closing))
            plan = ref.plan_decode_c4(geo.rpi, geo.r2t, geo.f2s, geo.seq64, RING)
            for (path, comp), (theirs, mine, _) in path_cases(ref, layer, geo, plan).items():
                if path != "per-compressor":
                    for side, calls in (("sglang", theirs), ("pydsa", mine)):
                        profiled(f"c4.b{b}.{'closing' if closing else 'random'}.{path}.{comp}.{side}", calls, times, only)
    rng = np.random.default_rng(3)
    for name, (seqs, exts) in c4b.EXTEND_CASES.items():
        if seqs is None:  # the ragged case: drawn as the P29 rows draw it
            seqs, exts = c4b.ragged_case(rng)
        if only is not None and not re.search(only, f"c4x.{name}.pydsa"):
            continue
        ctx, plan, out_loc, kv = c4b.extend_case(ref, seqs, exts, False, seed=11)
        profiled(f"c4x.{name}.sglang", [lambda: c4b.sglang_layer(ref, ctx, kv, plan, out_loc)], times, only)
        profiled(f"c4x.{name}.pydsa", [lambda: c4b.pydsa_extend(ctx, kv, plan, out_loc)], times, only)
    for b in (1, 32, 1024):
        for closing in (False, True):
            case = off.decode_case(ref, b, closing, torch.float32)
            for side, calls in (("sglang", off.sglang_calls(ref, case)), ("pydsa", [lambda: off.pydsa_call(case)])):
                profiled(f"off.b{b}.{'closing' if closing else 'random'}.{side}", calls, times, only)
    rng = np.random.default_rng(34)
    for name, lengths in off.P34_CASES.items():
        if lengths is None:  # the ragged case: drawn as the P34 rows draw it
            lengths = off.ragged_case(rng)
        tag = "offx." + name.replace(" ", "_")  # a range name without spaces (ncu --nvtx-include takes it unquoted)
        if only is not None and not re.search(only, f"{tag}.pydsa"):
            continue
        case = off.extend_case(ref, *lengths, torch.float32, dev)
        profiled(f"{tag}.sglang", off.sglang_calls(ref, case), times, only)
        profiled(f"{tag}.pydsa", [lambda: off.pydsa_call(case)], times, only)
        del case


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference_build")
    ap.add_argument("--only", help="a regular expression: the cases whose name it matches")
    ap.add_argument("--times", type=int, default=3, help="runs of each call")
    a = ap.parse_args()
    main(a.reference_build, a.only, a.times)
