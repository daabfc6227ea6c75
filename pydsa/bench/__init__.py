"""`python -m pydsa bench`: the one maintained benchmark of every op and the planner.

    python -m pydsa bench [all|planner|c128|metadata|step|sglang|speculative|host ...] [--json F] [--markdown F]
        [--reference-build DIR] [--side-by-side F]

The package is split by concern: harness (timers, floors), cases (per-call ops), steps (61-layer
steps, sglang-style calls), speculative (verify, commit, the speculative step), host (host time per
call of every op, one-shot and prepared, against the empty launch), targets (docs/performance.md
verdicts from same-run figures only), report (console, Markdown, plot).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

import torch

from .. import _abi
from . import harness
from .cases import bench_c128, bench_metadata, bench_planner
from .harness import floors
from .host import bench_host
from .report import markdown, plot, print_report
from .speculative import bench_speculative, load_reference
from .steps import bench_sglang, bench_step
from .targets import targets

KINDS = ("planner", "c128", "metadata", "step", "sglang", "speculative", "host")

def _commit() -> str:
    """The source commit: $PYDSA_COMMIT when set (machines that get a copy of the tree without
    git), else git's HEAD, with '+dirty' when the tree differs from it."""
    if os.environ.get("PYDSA_COMMIT"):
        return os.environ["PYDSA_COMMIT"]
    try:
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (head + ("+dirty" if dirty else "")) if head else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pydsa bench", description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="*", metavar="{all," + ",".join(KINDS) + "}", help="which rows to run (default: all)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write a PNG of achieved bandwidth versus bytes moved")
    ap.add_argument("--markdown", help="write the results as Markdown tables here")
    ap.add_argument("--graph-idle-start", action="store_true",
                    help="time graph replays from an idle GPU, the host's submission of each replay included "
                         "(default: from a GPU kept busy until the replay is queued)")
    ap.add_argument("--reference-build", metavar="DIR",
                    help="time sglang's speculative kernels beside pydsa's in this process (a build of "
                         "benchmarks/reference/build.sh; benchmarks/README.md)")
    ap.add_argument("--side-by-side", metavar="FILE",
                    help="judge the targets relative to the seed kernels on this side-by-side run of the same "
                         "lease (the format of benchmarks/results/side-by-side-*.json)")
    args = ap.parse_args(argv)
    harness.GRAPH_BUSY_START = not args.graph_idle_start
    what = set(args.what or ["all"])
    unknown = what - {"all", *KINDS}
    if unknown:
        ap.error(f"unknown benchmark {sorted(unknown)}; choose from all, {', '.join(KINDS)}")
    if "all" in what:
        what = set(KINDS)
    gpu = torch.cuda.is_available() and _abi.lib.dsa_device_count() > 0
    result = dict(gpu=torch.cuda.get_device_name() if gpu else "none", date=datetime.date.today().isoformat(),
                  commit=_commit(), command="python -m pydsa bench " + " ".join(argv if argv is not None else sys.argv[2:]),
                  host=platform.processor() or platform.machine(), python=platform.python_version(),
                  torch=torch.__version__, graph_start="busy" if harness.GRAPH_BUSY_START else "idle", floors={}, rows=[])
    if gpu:
        print("measuring floors ...", flush=True)
        result["floors"] = floors()
    rows = result["rows"]
    if "planner" in what:
        print("planner ...", flush=True)
        bench_planner(rows)
    if gpu and "c128" in what:
        print("c128 ...", flush=True)
        bench_c128(rows, result["floors"])
    if gpu and "metadata" in what:
        print("metadata copy ...", flush=True)
        bench_metadata(rows, result["floors"])
    if gpu and "step" in what:
        print("per-step ...", flush=True)
        bench_step(rows, result["floors"])
    if gpu and "sglang" in what:
        print("sglang-style calls ...", flush=True)
        bench_sglang(rows, result["floors"])
    if gpu and "speculative" in what:
        print("speculative decoding ...", flush=True)
        bench_speculative(rows, result["floors"], load_reference(args.reference_build) if args.reference_build else None)
    if gpu and "host" in what:
        print("host time per call ...", flush=True)
        bench_host(rows)
    if not gpu and what - {"planner"}:
        skipped = ", ".join(sorted(what - {"planner"}))
        print(f"no CUDA GPU: the {skipped} rows need one and did not run"
              + ("; the planner rows ran" if "planner" in what else "; no row ran"))
    side = None
    if args.side_by_side:
        with open(args.side_by_side) as f:
            side = json.load(f)
        result["side_by_side"] = dict(file=os.path.basename(args.side_by_side), rows=side["rows"],
                                      floors=side.get("floors"))
    result["targets"] = targets(rows, result["floors"], side)
    print_report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nsaved {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(result))
    if args.plot:
        if not result["floors"]:
            raise SystemExit("--plot needs the GPU rows")
        plot(result, args.plot)
        print(f"saved {args.plot}")
    return 0
