"""Kernel by kernel under ncu (run it as ncu ... python3 benchmarks/ncu_kernels.py REFERENCE_BUILD, from outside the clone):
the P35 c4 calls (each pydsa.sglang call and the plugin route beside sglang 0.5.23's) and the offline c128 decode + store
(B = 1 / 32 / 1024), both sides, each call 3 times inside an NVTX range naming the case."""
import sys, torch
from pydsa.bench import reference
from pydsa.bench.c4_paths import path_cases
from pydsa.bench.v4_step import C4Layer, Geometry, step_lengths, RING
from pydsa.bench import offline as off
ref = reference.load(sys.argv[1])
dev = "cuda"
for b in (1, 256):
    for closing in (False, True):
        geo = Geometry(step_lengths(b, closing, 35 * b + closing, dev, ratio=4))
        layer = C4Layer(geo, torch.float32, torch.Generator(device=dev).manual_seed(5 * b + closing))
        plan = ref.plan_decode_c4(geo.rpi, geo.r2t, geo.f2s, geo.seq64, RING)
        cases = path_cases(ref, layer, geo, plan)
        for (path, comp), (theirs, mine, _) in cases.items():
            if path in ("per-compressor",):
                continue
            for side, calls in (("sglang", theirs), ("pydsa", mine)):
                torch.cuda.synchronize()
                print(f"CASE c4 b={b} closing={closing} {path} {comp} {side}", flush=True)
                torch.cuda.nvtx.range_push(f"c4.b{b}.{'closing' if closing else 'random'}.{path}.{comp}.{side}")
                for _ in range(3):
                    for c in calls:
                        c()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
for b in (1, 32, 1024):
    for closing in (False, True):
        case = off.decode_case(ref, b, closing, torch.float32)
        for side, calls in (("sglang", off.sglang_calls(ref, case)), ("pydsa", [lambda: off.pydsa_call(case)])):
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(f"off.b{b}.{'closing' if closing else 'random'}.{side}")
            for _ in range(3):
                for c in calls:
                    c()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
print("DONE")
