"""One launch of each decode-path kernel under the profiler, pydsa beside sglang 0.5.23's v2 decode and
store (the benchmarks' reference build), for ncu (L2 flushed before each profiled kernel by ncu's default
cache control, as in a model step where every layer has its own buffers):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy ... \\
        python benchmarks/profile/decode.py --reference-build DIR [--b 256 1024]

Each case is warmed up, then launched once between cudaProfilerStart/Stop; the case names print in launch
order (sglang's decode + store case launches two kernels). `--cache-control none` profiles them L2-warm, as
the graph rows run; `--section SourceCounters` then `ncu --import REP --page source --csv --print-source sass`
gives each instruction's execution count and stall samples.
"""
import argparse
import sys

import torch

import pydsa
from pydsa.bench import release


def main(argv=None):
    ap = argparse.ArgumentParser(prog="benchmarks/profile/decode.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference-build", required=True)
    ap.add_argument("--b", type=int, nargs="+", default=[256, 1024])
    args = ap.parse_args(argv)
    ref = release._load(args.reference_build)
    gen = torch.Generator(device="cuda").manual_seed(1)
    order = []
    for dtype in (torch.float32, torch.bfloat16):
        for closing in (False, True):
            for b in args.b:
                L = release.Layer(b, dtype, closing, gen)
                plan = ref.plan_decode(L.seq64, L.rid, L.r2t)
                plain = pydsa.C128Decode(L.state, L.kv, L.out, L.ape, L.idx, L.seq)
                fused = pydsa.C128Decode(L.state, L.kv, None, L.ape, L.idx, L.seq, store=L.store, cache_slots=L.loc)
                cases = {"pydsa decode": [plain.launch], "pydsa fused": [fused.launch],
                         "sglang decode": [lambda: ref.compress_forward(L.state, L.kv, L.ape, plan, out=L.out)],
                         "sglang store": [lambda: ref.store(L.out, plan, L.w, 1e-6, L.freq, L.loc, L.cache,
                                                            release.PAGE)]}
                tag = f"{str(dtype)[6:]} {'closing' if closing else 'random'} B={b}"
                for name, calls in cases.items():
                    for _ in range(3):
                        for c in calls:
                            c()
                    torch.cuda.synchronize()
                    torch.cuda.profiler.start()
                    for c in calls:
                        c()
                    torch.cuda.synchronize()
                    torch.cuda.profiler.stop()
                    order.append(f"{name} | {tag}")
    for i, name in enumerate(order):
        print(f"case {i}: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
