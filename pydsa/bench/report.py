"""Printing and saving a bench run: the console report, Markdown tables, the bandwidth plot."""
from __future__ import annotations

import math


SPECULATIVE = ("c128_verify", "c128_commit", "speculative_step")
NOT_PER_CALL = ("planner", "step", "sglang", "c128_commit", "speculative_step", "host")


def _fmt(v, spec=".2f"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def print_report(result: dict) -> None:
    fl = result.get("floors") or {}
    if fl:
        print(f"floors: copy bandwidth {fl['copy_bandwidth_tbps']:.2f} TB/s; empty kernel graph {fl['empty_kernel_graph_us']:.2f} us; "
              f"empty ctypes launch host {fl['empty_kernel_host_us']:.2f} us (raw-stream fetch {fl['empty_kernel_host_raw_stream_us']:.2f}, "
              f"torch stream fetch {fl['empty_kernel_host_torch_stream_us']:.2f}); torch 1-element op graph "
              f"{fl['torch_one_element_graph_us']:.2f} us, host {fl['torch_one_element_host_us']:.2f} us")
    plan = [r for r in result["rows"] if r["kernel"] == "planner"]
    if plan:
        print("\nplanner, host us per call | cython | cython out= | cython graph | C via ctypes | pure Python | DevicePlan.plan")
        for r in plan:
            print(f"  {r['case']:<42} {_fmt(r.get('cython_us')):>7} {_fmt(r.get('cython_out_us')):>7} {_fmt(r.get('cython_graph_us')):>7} "
                  f"{_fmt(r.get('c_ctypes_us')):>7} {_fmt(r.get('python_us'), '.1f'):>9} {_fmt(r.get('device_plan_us')):>7}")
    for r in (r for r in result["rows"] if r["kernel"] == "step"):
        print(f"\n{r['case']}: eager host {r['eager_host_us']:.1f} us, device {r['eager_device_us']:.1f} us per step"
              + (f"; CUDA graph replay host {r['graph_host_us']:.1f} us, device {r['graph_device_us']:.1f} us" if "graph_host_us" in r else ""))
    sg = [r for r in result["rows"] if r["kernel"] == "sglang"]
    if sg:
        print("\nsglang-style call, host us | pydsa.sglang (empty launch) | direct call (empty launch)")
        for r in sg:
            print(f"  {r['case']:<48} {r['sglang_host_us']:.2f} ({r['host_empty_us']:.2f})  {r['direct_host_us']:.2f} ({r['direct_host_empty_us']:.2f})")
    hosted = [r for r in result["rows"] if r["kernel"] == "host"]
    if hosted:
        print("\nhost us per call | call | empty launch | beyond the launch")
        for r in hosted:
            print(f"  {r['case']:<32} {r['host_us']:6.2f} {r['host_empty_us']:6.2f} {r['over_empty_us']:6.2f}")
    for r in (r for r in result["rows"] if r["kernel"] in SPECULATIVE):
        extra = "".join(f", {label} {r[key]:.2f} us" for key, label in (
            ("copy_graph_us", "copying every layer in one launch"), ("sglang_verify_us", "sglang's verify"),
            ("sglang_graph_us", "sglang's way")) if key in r)
        print(f"{r['case']}: {r['graph_us']:.2f} us{extra}")
    dev = [r for r in result["rows"] if r["kernel"] not in NOT_PER_CALL]
    if dev:
        print(f"\n{'kernel / case':<58} {'MB':>8} {'graph us':>9} {'cold us':>8} {'TB/s':>6} {'x bw':>6} {'torch us':>9} {'speedup':>8} {'host us':>8} {'empty':>6} {'new src':>8} {'torch host':>10}")
        for r in dev:
            base = r.get("torch_graph_us", r.get("torch_eager_us"))
            print(f"{r['kernel'] + ': ' + r['case']:<58} {r['bytes'] / 1e6:>8.3f} {r['graph_us']:>9.2f} {_fmt(r.get('graph_cold_us')):>8} "
                  f"{_fmt(r.get('tbps')):>6} {_fmt(r.get('frac_copy_bw'), '.3f'):>6} {_fmt(base):>9} "
                  f"{_fmt(base / r['graph_us'] if base else None, '.1f'):>8} {_fmt(r.get('host_us')):>8} {_fmt(r.get('host_empty_us')):>6} "
                  f"{_fmt(r.get('host_new_sources_us')):>8} {_fmt(r.get('torch_host_us')):>10}")
    if result.get("targets"):
        print("\ntargets (docs/performance.md):")
        for t in result["targets"]:
            verdict = "----" if t["ok"] is None else "ok  " if t["ok"] else "MISS"
            print(f"  {t['id']:<3} {verdict} {t['what']}: {t['measured']}")


def _md_table(header: list, rows: list) -> list:
    """A Markdown table (header cells, rows of cells) and a blank line; nothing for no rows."""
    if not rows:
        return []
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] * len(header)) + " |",
            *("| " + " | ".join(row) + " |" for row in rows), ""]


def markdown(result: dict) -> str:
    """The run as Markdown tables (the README's results section)."""
    fl = result.get("floors") or {}
    rows = result["rows"]
    lines = [f"{result['gpu']}, {result['date']}, commit {result['commit']}, `{result['command']}`", ""]
    if fl:
        lines += [f"Floors measured in the same run: device copy {fl['copy_bandwidth_tbps']:.2f} TB/s (read + write), "
                  f"empty kernel {fl['empty_kernel_graph_us']:.2f} us in a graph, empty kernel through ctypes "
                  f"{fl['empty_kernel_host_us']:.2f} us host time.", ""]
    start = result.get("graph_start", "idle")  # runs before the field was recorded timed from an idle GPU
    lines += [f"Graph replays timed from {'a busy GPU (a spin queued before the start event)' if start == 'busy' else 'an idle GPU (the host submission of each replay included)'}.", ""]
    lines += _md_table(
        ["per step (DeepSeek-V4, 61 layers)", "eager host us", "eager device us", "graph replay host us",
         "graph replay device us"],
        [[r["case"], f"{r['eager_host_us']:.1f}", f"{r['eager_device_us']:.1f}", _fmt(r.get("graph_host_us"), ".1f"),
          _fmt(r.get("graph_device_us"), ".1f")] for r in rows if r["kernel"] == "step"])
    lines += _md_table(
        ["sglang-style call", "pydsa.sglang host us", "direct call host us", "empty launch host us"],
        [[r["case"], f"{r['sglang_host_us']:.2f}", f"{r['direct_host_us']:.2f}", f"{r['host_empty_us']:.2f}"]
         for r in rows if r["kernel"] == "sglang"])
    lines += _md_table(
        ["one-shot `c128_prefill(..., pyplan plan)`", "host us (empty launch alongside)", "back-to-back eager us",
         "graph us"],
        [[r["case"], f"{r['host_oneshot_us']:.2f} ({r['host_oneshot_empty_us']:.2f})", _fmt(r.get("eager_oneshot_us")),
          f"{r['graph_us']:.2f}"] for r in rows if r["kernel"] == "c128_prefill" and r.get("host_oneshot_us")])
    lines += _md_table(
        ["kernel", "case", "MB moved", "graph us (empty kernel beside it)", "cold-L2 us", "TB/s", "x copy bw",
         "torch us", "host us (empty launch alongside)", "host us, stream given (empty)",
         "bound launch() host us (empty)"],
        [[r["kernel"], r["case"], f"{r['bytes'] / 1e6:.3f}", f"{r['graph_us']:.2f} ({_fmt(r.get('empty_graph_us'))})",
          _fmt(r.get("graph_cold_us")), _fmt(r.get("tbps")), _fmt(r.get("frac_copy_bw"), ".3f"),
          _fmt(r.get("torch_graph_us", r.get("torch_eager_us"))),
          f"{_fmt(r.get('host_us'))} ({_fmt(r.get('host_empty_us'))})",
          f"{_fmt(r.get('host_stream_given_us'))} ({_fmt(r.get('host_stream_given_empty_us'))})",
          f"{_fmt(r.get('host_bound_launch_us'))} ({_fmt(r.get('host_bound_launch_empty_us'))})"]
         for r in rows if r["kernel"] not in NOT_PER_CALL])
    lines += _md_table(
        ["speculative decoding (V = 8, D = 512)", "pydsa graph us", "sglang 0.5.23's way, same run, graph us"],
        [[r["case"], f"{r['graph_us']:.2f}" + (f" (copying: {r['copy_graph_us']:.2f})" if "copy_graph_us" in r else ""),
          _fmt(r.get("sglang_verify_us", r.get("sglang_graph_us")))] for r in rows if r["kernel"] in SPECULATIVE])
    lines += _md_table(
        ["planner (host us per call)", "Cython", "Cython, out=", "Cython, graph mode", "C via ctypes", "pure Python",
         "DevicePlan.plan() (plan and upload)"],
        [[r["case"], _fmt(r.get("cython_us")), _fmt(r.get("cython_out_us")), _fmt(r.get("cython_graph_us")),
          _fmt(r.get("c_ctypes_us")), _fmt(r.get("python_us"), ".1f"), _fmt(r.get("device_plan_us"))]
         for r in rows if r["kernel"] == "planner"])
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(f"--plot needs matplotlib ({exc}); pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(8, 5))
    for kernel, marker in (("metadata_copy", "o"), ("c128_decode", "s"), ("c128_prefill", "^")):
        pts = sorted((r["bytes"], r["tbps"]) for r in result["rows"]
                     if r["kernel"] == kernel and r.get("tbps") and not r.get("variant"))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=kernel)
    bw = result["floors"]["copy_bandwidth_tbps"]
    ax.axhline(bw, color="gray", linestyle="--", label=f"device copy {bw:.2f} TB/s")
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved per call")
    ax.set_ylabel("achieved TB/s")
    ax.set_title(f"pydsa on {result['gpu']} ({result['date']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
