"""The soak's words (pydsa/soak.py): a checkpoint's progress line and the run's summary, memory lines included."""
from __future__ import annotations

import sys


def progress_line(m: dict, counts: dict, c4_counts: dict, steps: int, seconds: float, tty: bool) -> None:
    """A checkpoint's progress line on stderr (one line rewritten in place on a terminal)."""
    memory = (f"device {m['device_mb']:.0f} MB, " if m["device_mb"] == m["device_mb"] else "") + \
        f"heap {m['heap_mb']:.0f} MB, rss {m['rss_mb']:.0f} MB"
    print(("\r" if tty else "") + f"step {m['step']}/{steps}: {counts['chunks']} chunks checked, {m['chunk_failures']} "
          f"failed, {m['cache_mismatches']} cache mismatches; c4 {c4_counts['c4_entries_checked']} entries checked, "
          f"{m['c4_failures']} failed, {m['c4_cache_mismatches']} cache mismatches; {m['index_errors']} index errors, "
          f"max err {max(m['max_relative_error'], m['c4_max_relative_error']):.1e}, {memory}, "
          f"{seconds / m['step'] * 1e3:.3f} ms/step", end="" if tty else "\n", file=sys.stderr, flush=True)


def summary_text(r: dict, tolerance: float) -> str:
    """The run's summary as `python -m pydsa soak` prints it, ending in PASS or FAIL."""
    layer = "offline (sglang's default)" if r.get("config") == "default" else "online"
    return (f"\n{'c128 compressor':<34}{layer}\n{'steps (busy: an op ran)':<34}{r['steps']} ({r['busy_steps']} busy)\n"
          f"{'requests arrived / finished':<34}{r['requests_arrived']} / {r['requests_finished']}\n"
          f"{'tokens absorbed':<34}{r['tokens']}\n"
          f"{'prefill / decode / verify steps':<34}{r['prefill_launches']} / {r['decode_steps']} / {r['verify_steps']} "
          f"({r['drafts_accepted']} drafts accepted, {r['drafts_rejected']} rejected)\n"
          f"{'chunks checked vs float64':<34}{r['chunks_checked']} ({r['chunk_failures']} failed; max relative "
          f"error {r['max_relative_error']:.2e}, limit {tolerance:g})\n"
          f"{'KV-cache entries stored':<34}{r['cache_entries_stored']} ({r['cache_mismatches']} comparisons found the "
          f"cache unlike its mirror)\n"
          f"{'c4 layer: serving steps':<34}{r['c4_steps']} (one every {r['c4_every']} steps; requests arrived / "
          f"finished {r['c4_requests_arrived']} / {r['c4_requests_finished']})\n"
          f"{'c4 extend / decode / verify calls':<34}{r['c4_extends']} / {r['c4_decodes']} / {r['c4_verifies']} "
          f"({r['c4_drafts_accepted']} drafts accepted, {r['c4_drafts_rejected']} rejected)\n"
          f"{'c4 entries checked vs float64':<34}{r['c4_entries_checked']} x 2 compressors ({r['c4_failures']} failed; "
          f"max relative error {r['c4_max_relative_error']:.2e})\n"
          f"{'c4 cache entries stored':<34}{r['c4_entries_stored']} x 2 caches ({r['c4_cache_mismatches']} comparisons "
          f"found a cache unlike its mirror)\n"
          f"{'index errors counted':<34}{r['index_errors']}\n{memory_lines(r['memory'])}"
          f"{'time':<34}{r['wall_s']:.1f} s, {r['ms_per_step']:.3f} ms per step\n\n{'PASS' if r['ok'] else 'FAIL'}")


def memory_lines(memory: dict) -> str:
    """The summary's memory lines: per judged measure its first / last and its growth after the warm-up
    against the growth tolerated; the resident memory as it is, for reference."""
    lines = ""
    for name, label, rule in (("device", "device memory in use", "exact"), ("heap", "host heap in use", "band"),
                              ("resident", "resident less malloc's free", "band")):
        m = memory[name]
        if m["first_mb"] != m["first_mb"]:  # not measured here
            continue
        judged = ("not judged (too few samples)" if m["growth_mb"] != m["growth_mb"] else
                  f"growth {m['growth_mb']:+.2f} MB, " + ("none allowed" if rule == "exact" else
                                                          f"{m['band_mb']:.2f} allowed") + ": " +
                  ("flat" if m["ok"] else "GROWING"))
        lines += f"{label:<34}first / last {m['first_mb']:.1f} / {m['last_mb']:.1f} MB ({judged})\n"
    rss = memory["rss"]
    return lines + (f"{'resident memory':<34}first / last {rss['first_mb']:.1f} / {rss['last_mb']:.1f} MB (with "
                    f"the allocator's free pages: not judged)\n")
