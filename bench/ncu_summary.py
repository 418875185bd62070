#!/usr/bin/env python3
"""Summarizes an `ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum` log: per kernel name and
(rounded) DRAM bytes read, the count, median time, median bytes and bandwidth; then the sum of the medians times
the count: the GPU time of the profiled launches as ncu times them (each kernel alone with caches flushed, so
launch overlap is not in it).

    python3 bench/ncu_summary.py NCU.csv [TITLE]
"""

import collections
import csv
import sys

TIME = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}
BYTES = {"byte": 1, "B": 1, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}


def main():
    lines = open(sys.argv[1], errors="replace").read().splitlines()
    title = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]
    start = next((j for j, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{sys.argv[1]}: no ncu csv")
    recs = collections.defaultdict(dict)
    for r in csv.DictReader(lines[start:]):
        recs[r["ID"]]["name"] = r["Kernel Name"].split("(")[0].split("<")[0]
        recs[r["ID"]][r["Metric Name"]] = (float(r["Metric Value"].replace(",", "")), r["Metric Unit"])
    groups = collections.defaultdict(list)
    for rec in recs.values():
        if "gpu__time_duration.sum" not in rec or "dram__bytes_read.sum" not in rec:
            continue
        t, b = rec["gpu__time_duration.sum"], rec["dram__bytes_read.sum"]
        tn, bb = t[0] * TIME[t[1]], b[0] * BYTES[b[1]]
        # Kernels of one name reading different weights are told apart by their bytes (2 significant digits).
        mb = bb / 1e6
        key = f"{rec['name']} [{float(f'{mb:.2g}'):g} MB]" if mb >= 1 else rec["name"]
        groups[key].append((tn, bb))
    total_t = total_b = 0.0
    print(f"{title}: {len(recs)} launches, median per kernel (each alone)")
    rows = []
    for k, v in groups.items():
        t = sorted(x[0] for x in v)[len(v) // 2]
        b = sorted(x[1] for x in v)[len(v) // 2]
        rows.append((t * len(v), k, len(v), t, b))
        total_t += t * len(v)
        total_b += b * len(v)
    for share, k, n, t, b in sorted(rows, reverse=True):
        print(f"  {k[:60]:60s} n={n:4d} {t / 1e3:8.2f} us {b / 1e6:9.2f} MB {b / t:7.1f} GB/s {share / total_t:6.1%}")
    print(f"  all: {total_t / 1e6:.3f} ms, {total_b / 1e9:.3f} GB, {total_b / total_t:.1f} GB/s")


if __name__ == "__main__":
    main()
