"""How fast an Nsight Systems export is read: a synthetic export with a million kernels (each
with its launch call, NVTX step ranges around them), written under /tmp, then read into the
trace model and diagnosed. Prints the figures; not a timed test.

    python benchmarks/bench_nsys.py                 # 1,000,000 kernels
    python benchmarks/bench_nsys.py --kernels 200000

The export is built with the tests' builder (tests/nsysgen.py): run from the repository root.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from nsysgen import NsysBuilder
from wallfinder import analyze
from wallfinder.trace import load_traces

NAMES = (
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_nn",
    "void at::native::vectorized_elementwise_kernel<4>(int)",
    "void at::native::reduce_kernel<512, 1>(int)",
    "void (anonymous namespace)::softmax_warp_forward<float>(float*)",
)


def build(kernels: int, path: Path, per_step: int = 1000) -> None:
    b = NsysBuilder()
    b.device(0)
    b.process(1)
    t = step_start = 0
    for i in range(kernels):
        if i % per_step == 0:
            if i:
                b.nvtx(1, "train_step", step_start, t)
            step_start = t
        b.kernel(1, 0, NAMES[i % len(NAMES)], t, t + 5_000, 8_000, grid=(1 + i % 300, 1, 1))
        t += 10_000
    b.nvtx(1, "train_step", step_start, t)
    b.write(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        path = Path(folder) / "bench.sqlite"
        began = time.perf_counter()
        build(args.kernels, path)
        built = time.perf_counter() - began
        size = path.stat().st_size
        began = time.perf_counter()
        (trace,) = load_traces(path)
        read = time.perf_counter() - began
        began = time.perf_counter()
        d = analyze(path)
        whole = time.perf_counter() - began
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
    print(
        f"export: {args.kernels:,} kernels + {args.kernels:,} launch calls, "
        f"{size / 2**20:.0f} MiB (written in {built:.1f} s)"
    )
    print(
        f"read into the trace model: {read:.2f} s ({len(trace.events):,} events, "
        f"{len(trace.events) / read / 1e6:.2f} M events/s)"
    )
    print(f"analyze (read + diagnose): {whole:.2f} s, {d.steps.total} steps")


if __name__ == "__main__":
    main()
