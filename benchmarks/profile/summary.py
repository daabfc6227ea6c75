"""Condenses `ncu --csv --page raw` output (stdin) to one line per profiled kernel: duration, DRAM and
L2 throughput, achieved occupancy, registers, instructions and the three largest stall reasons."""
import csv
import sys

METRICS = {
    "us": "gpu__time_duration.sum",
    "dram%": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "dramGB/s": "dram__bytes.sum.per_second",
    "occ%": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "regs": "launch__registers_per_thread",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "inst": "smsp__inst_executed.sum",
}


def main():
    rows = list(csv.reader(sys.stdin))
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    names, units = rows[head], rows[head + 1]
    col = {n: i for i, n in enumerate(names)}
    stalls = [n for n in names if "issue_stalled_" in n and "per_issue_active" in n and "not_issued" not in n]
    for k, r in enumerate(rows[head + 2:]):
        if len(r) != len(names):
            continue
        vals = []
        for label, m in METRICS.items():
            v = r[col[m]] if m in col else "?"
            if m == "gpu__time_duration.sum" and m in col and units[col[m]] == "nsecond":
                v = f"{float(v.replace(',', '')) / 1e3:.2f}"
            vals.append(f"{label}={v}")
        top = []
        for s in stalls:
            try:
                top.append((float(r[col[s]].replace(",", "")), s.split("stalled_")[1].split("_per_issue")[0]))
            except ValueError:
                pass
        top.sort(reverse=True)
        print(f"{k:3d} {r[col['Kernel Name']][:38]:38s} " + " ".join(vals) +
              " stalls: " + ", ".join(f"{n}={v:.0f}" for v, n in top[:4]))


if __name__ == "__main__":
    main()
