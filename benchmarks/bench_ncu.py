"""How fast an Nsight Compute export is read: a synthetic details page (`ncu --csv`, the
default page) with one row per metric per launch, 60 metrics a launch as the sections and a
`--metrics` list give, written under /tmp, then read and classified. Prints the figures; not a
timed test. Real exports hold hundreds to a few thousand launches (ncu replays each launch
several times), so the default is a generous 10,000.

    python benchmarks/bench_ncu.py                   # 10,000 launches
    python benchmarks/bench_ncu.py --launches 50000
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import tempfile
import time
from pathlib import Path

from wallfinder.api import analyze_counters
from wallfinder.trace import load_ncu

HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream"]
HEAD += ["Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
METRICS = [
    ("gpu__time_duration.sum", "usecond", "1,234.56"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "71.20"),
    ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "%", "40.10"),
    ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "%", "22.00"),
    ("dram__bytes.sum", "Mbyte", "8.39"),
    ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum", "inst", "1,000,000"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "%", "n/a"),
    ("launch__grid_size", "", "108"),
] + [(f"l1tex__other_metric_{i}.sum", "byte", f"{i * 1000:,}") for i in range(52)]


def build(launches: int, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        f.write("==PROF== Connected to process 4242\n")
        out = csv.writer(f, quoting=csv.QUOTE_ALL, lineterminator="\n")
        out.writerow(HEAD)
        for i in range(launches):
            name = f"void at::native::vectorized_elementwise_kernel<4, Functor{i % 7}>(int)"
            ident = [str(i), "4242", "python3", "host", name, "1", "7", "0", "8.0"]
            for metric, unit, value in METRICS:
                out.writerow([*ident, "Command line profiler metrics", metric, unit, value])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        path = Path(folder) / "bench.ncu.csv"
        build(args.launches, path)
        size = path.stat().st_size
        began = time.perf_counter()
        export = load_ncu(path)
        read = time.perf_counter() - began
        began = time.perf_counter()
        report = analyze_counters(path)
        whole = time.perf_counter() - began
    rows = args.launches * len(METRICS)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
    print(f"export: {args.launches:,} launches, {rows:,} metric rows, {size / 2**20:.0f} MiB")
    print(
        f"read: {read:.2f} s ({len(export.launches):,} launches, {rows / read / 1e6:.2f} M rows/s)"
    )
    print(f"read + classify: {whole:.2f} s, bounds {sorted({k.bound for k in report.kernels})}")


if __name__ == "__main__":
    main()
