"""One c4 layer's decode under the profiler, pydsa's one launch beside sglang 0.5.23's four (the benchmarks'
reference build, its c4 modules), B = 1024, every row closing, fp32 ring, for ncu (L2 flushed before each
profiled kernel by ncu's default cache control):

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --section MemoryWorkloadAnalysis python benchmarks/profile/c4.py --reference-build DIR

Each side is warmed up, then launched once between cudaProfilerStart/Stop: pydsa's c4 decode kernel, then
sglang's compress and store kernels of the main and the indexer compressor.
"""
import argparse

import torch

from pydsa.bench import c4
from pydsa.bench.reference import load


def main(argv=None):
    ap = argparse.ArgumentParser(prog="benchmarks/profile/c4.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference-build", required=True)
    ap.add_argument("--b", type=int, default=1024)
    args = ap.parse_args(argv)
    ref = load(args.reference_build)
    ctx, plan, out_loc, kv = c4.decode_case(ref, args.b, True, False, seed=3)
    for side in ("pydsa", "sglang"):
        run = (lambda: c4.pydsa_decode(ctx, kv, plan.plan_d, out_loc)) if side == "pydsa" else \
            (lambda: c4.sglang_layer(ref, ctx, kv, plan, out_loc))
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled: {side}, B = {args.b}, every row closing, fp32", flush=True)


if __name__ == "__main__":
    main()
