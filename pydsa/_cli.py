"""What the command lines that run the built-in loops share (`python -m pydsa demo`, `... soak`): the run
flags (--device, --seed, --json), their checks before anything runs (each odd one a one-line error), and the
summary written as strict JSON."""
from __future__ import annotations

import json

import torch

from ._tensors import resolve_device


def add_run_flags(ap) -> None:
    ap.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the built-in data (0..2^32-1)")
    ap.add_argument("--json", help="write the summary here")


def judge_run_flags(ap, args, counts: dict) -> torch.device:
    """The install, then `counts` (flag -> value, each at least 1), the seed, the device and the JSON path,
    each odd one an argparse error; returns the device."""
    from .info import install_problems
    for problem in install_problems():
        ap.error(f"this install is broken: {problem}")
    if any(v < 1 for v in counts.values()):
        ap.error(f"{' and '.join(counts)} must be at least 1 (got {', '.join(str(v) for v in counts.values())})")
    if not 0 <= args.seed < 2**32:
        ap.error(f"--seed must be in 0..2^32-1 (got {args.seed})")
    try:
        device = resolve_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except (ValueError, RuntimeError) as exc:
        ap.error(f"--device {args.device}: {exc}")
    if device.type not in ("cpu", "cuda"):
        ap.error(f"--device {args.device}: expected cpu, cuda or cuda:N")
    if args.json:  # fail before the run, not after it
        try:
            with open(args.json, "a"):
                pass
        except OSError as exc:
            ap.error(f"--json {args.json}: cannot write there ({exc.strerror})")
    return device


def _strict(v):
    """NaN (a figure with no sample) as null, in lists and dicts too."""
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, dict):
        return {k: _strict(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_strict(x) for x in v]
    return v


def write_json(path: str, summary: dict) -> None:
    with open(path, "w") as f:
        json.dump(_strict(summary), f, indent=1, allow_nan=False)
