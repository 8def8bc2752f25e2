"""What starting wallfinder costs: the CPU time and import time of `wallfinder --help` and of
`wallfinder analyze` on a small trace (`--format json`), each in a fresh interpreter.

    python benchmarks/bench_cold_start.py                    # writes a 1 MB trace under /tmp
    python benchmarks/bench_cold_start.py --trace T.json --repeat 10

The CPU time is the child's user + system time (getrusage), the median of --repeat runs; the
import time is the sum of the top-level cumulative times `python -X importtime` reports, the
median of the same runs (its own bookkeeping makes it a slight over-estimate).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

GENERATOR = Path(__file__).resolve().parent / "generate_trace.py"


def cpu_seconds(command: list[str]) -> float:
    """User + system CPU time of running `command` to completion."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_seconds(command: list[str]) -> float:
    """Seconds spent importing, by `-X importtime` (top-level entries' cumulative times)."""
    done = subprocess.run(
        [command[0], "-X", "importtime", *command[1:]],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    total = 0
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and line.startswith("import time:") and parts[1].strip().isdigit():
            name = parts[2]
            if name.startswith(" ") and not name.startswith("  "):  # a top-level import
                total += int(parts[1])
    return total / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="the small trace (default: a generated 1 MB)")
    parser.add_argument("--repeat", type=int, default=7, help="runs per command (median kept)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as scratch:
        trace = args.trace
        if trace is None:
            trace = Path(scratch) / "small.json"
            subprocess.run(
                [sys.executable, str(GENERATOR), "-o", str(trace), "--size-mb", "1"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        size_mb = trace.stat().st_size / 1e6
        wallfinder = [sys.executable, "-m", "wallfinder"]
        commands = {
            "wallfinder --help": [*wallfinder, "--help"],
            f"wallfinder analyze ({size_mb:.1f} MB file) --format json": [
                *wallfinder,
                "analyze",
                str(trace),
                "--format",
                "json",
                "-o",
                os.devnull,
            ],
            "python -c pass (the interpreter alone)": [sys.executable, "-c", "pass"],
        }
        print(f"{os.cpu_count()} CPUs, Python {platform.python_version()}, median of {args.repeat}")
        print(f"{'command':50} {'CPU s':>7} {'import s':>9}")
        for label, command in commands.items():
            cpu = statistics.median(cpu_seconds(command) for _ in range(args.repeat))
            imports = statistics.median(import_seconds(command) for _ in range(args.repeat))
            print(f"{label:50} {cpu:7.3f} {imports:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
