"""`python -m pydsa demo`'s command line: the flags checked before the run (each odd one a one-line
error), the run (pydsa/demo.py) and its report; --json writes the summary as strict JSON."""
from __future__ import annotations

import argparse
import time

import torch

from ._cli import add_run_flags, judge_run_flags, write_json
from . import demo_c4
from ._serving_offline import CONFIGS
from .demo import DRAFTS, MAX_RUNNING, TOLERANCE, __doc__ as _about, run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pydsa demo", description=_about.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="serving steps to run (each: a prefill chunk per "
                    "prefilling request, then a decode or a speculative step of the others, then a metadata refresh)")
    ap.add_argument("--requests", type=int, default=24, help=f"requests that arrive over the run (at most "
                    f"{MAX_RUNNING} are served at once; the rest wait for a free slot)")
    ap.add_argument("--soak", action="store_true", help="requests keep arriving for every step (no end): slots, "
                    "cache entries and bank entries reused over and over; the summary counts the busy steps (for a "
                    "million steps, python -m pydsa soak: the same ops, checked on the device without waiting for it)")
    ap.add_argument("--config", choices=CONFIGS, default="online", help="the c128 layers' compressor: online "
                    "(sglang's online flag set; the default) or default (sglang's default configuration: the offline "
                    "compressor, speculative steps as extends over the drafts with no commit)")
    add_run_flags(ap)
    args = ap.parse_args(argv)
    device = judge_run_flags(ap, args, {"--steps": args.steps, "--requests": args.requests})
    if device.type == "cpu":
        print("pydsa demo: no GPU in use, running the host backend (same C entry points, host memory)")
    else:
        print(f"pydsa demo: running on {torch.cuda.get_device_name(device)}")
    started = time.perf_counter()
    print(f"pydsa demo: c128 layers with the {'offline' if args.config == 'default' else 'online'} compressor "
          f"(--config {args.config})")
    r = run(args.steps, args.requests, device, args.seed, soak=args.soak, config=args.config)
    r["c128_wall_s"] = r.pop("wall_s")
    r.update(demo_c4.run(args.steps, min(args.requests, MAX_RUNNING), device, args.seed))
    r["wall_s"] = time.perf_counter() - started  # the whole run: the c128 layers, then the c4 layer
    r["ok"] = bool(r["ok"] and r["c4_ok"])
    unit = "device" if device.type == "cuda" else "host"
    print(f"\n{'steps (busy: any op ran)':<34}{r['steps']} ({r['busy_steps']} busy)\n{'requests arrived / finished':<34}{r['requests_arrived']} / {r['requests_finished']}\n"
          f"{'tokens compressed':<34}{r['tokens']}\n{'chunks emitted and checked':<34}{r['chunks_emitted']}\n"
          f"{'speculative steps (V = ' + str(DRAFTS) + ')':<34}{r['verify_steps']}: "
          f"{r['drafts_accepted']} drafts accepted, {r['drafts_rejected']} rejected\n"
          f"{'max relative error vs float64':<34}{r['max_relative_error']:.2e} (limit {TOLERANCE:g})\n"
          f"{'metadata buffers mismatched':<34}{r['metadata_failures']}\n"
          f"{'KV-cache entries checked':<34}{r['cache_entries_checked']} ({r['cache_entry_failures']} wrong; "
          f"fp8 dequantized error <= {r['cache_max_dequant_error']:.1e})\n"
          f"{'c4 layer (main + indexer)':<34}{r['c4_requests_arrived']} requests, {r['c4_extends']} extends, "
          f"{r['c4_decodes']} decodes, {r['c4_verifies']} verifies (V = {r['c4_drafts']}: {r['c4_drafts_accepted']} "
          f"accepted, {r['c4_drafts_rejected']} rejected)\n"
          f"{'c4 entries checked':<34}{r['c4_entries_checked']} ({r['c4_failures']} wrong; max relative error "
          f"{r['c4_max_relative_error']:.2e}; both caches per entry)\n")
    us = lambda x: f"{x:>8.1f}" if x == x else f"{'-':>8}"  # noqa: E731  (nan: no warm sample)
    if device.type == "cpu":
        print("On a CPU the ops run the host backend: the exactness reference (the same results as the GPU, on\n"
              "the calling thread), not the fast path; the torch column is eager torch on the CPU.")
    print(f"per call, {unit} us             pydsa   the torch way")
    print(f"  prefill planning (pyplan)  {us(r['plan_us'])}   -")
    print(f"  c128 prefill               {us(r['prefill_us'])}   {us(r['prefill_torch_us'])}  (offline softmax over the whole chunks only)")
    print(f"  c128 decode                {us(r['decode_us'])}   {us(r['decode_torch_us'])}  (eager torch)")
    print(f"  c128 verify, {DRAFTS} drafts     {us(r['verify_us'])}   -")
    print(f"  commit (every layer)       {us(r['commit_us'])}   -")
    print(f"  metadata refresh, K={r['backends']}     {us(r['metadata_us'])}   {us(r['metadata_torch_us'])}  (per-field copy_)")
    print(f"\n{'PASS' if r['ok'] else 'FAIL'}: {r['chunk_failures']} chunk, {r['cache_entry_failures']} cache entry, "
          f"{r['c4_failures']} c4 entry and {r['metadata_failures']} metadata check failures "
          f"in {r['wall_s']:.1f} s (c128 layers {r['c128_wall_s']:.1f} s, c4 layer {r['wall_s'] - r['c128_wall_s']:.1f} s)")
    if args.json:
        write_json(args.json, r)
    return 0 if r["ok"] else 1
