"""Time `wallfinder analyze DIR` on a folder of many generated rank traces of one job.

Generates N rank traces (default 64 of ~6 MB) whose NCCL collectives match across ranks, then
runs `wallfinder analyze DIR --format json` once in a child process and prints the wall time,
the throughput, the peak RSS of the largest process and of the whole process tree, and the
job's matched collectives (a sanity check that the cross-rank join ran).

    python benchmarks/bench_ranks.py                       # 64 ranks, local worker processes
    python benchmarks/bench_ranks.py --ranks 256 --size-mb 8 --dir /scratch/job --workers 16
    python benchmarks/bench_ranks.py --dir /shared/job --scheduler tcp://host:8786
    python benchmarks/bench_ranks.py --ranks 1024 --size-mb 2 --dir /tmp/job1024 --pair

With --scheduler the ranks are analysed by the cluster's workers, which must see --dir at the
same path; the memory figures are then those of the client process only. --pair times the same
job twice in one run: in local worker processes, then through a real dask.distributed
scheduler with two separate worker processes (`dask scheduler` and `dask worker --nworkers 2
--nthreads 1`, started here on this machine and stopped after), and checks that both give the
same JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench_analyze import run_measured
from generate_trace import MB, generate


def _one(job: tuple[Path, int, int, int, int]) -> int:
    path, size, seed, rank, world = job
    return generate(path, size, seed, False, rank=rank, world_size=world).bytes


def write_job(folder: Path, ranks: int, size_mb: float, seed: int) -> int:
    """The job's rank traces in `folder` (kept from an earlier run with the same settings);
    returns their total size in bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    size = int(size_mb * MB)
    paths = [folder / f"rank{r:05d}-of-{ranks}.s{seed}.{size}.json" for r in range(ranks)]
    todo = [(p, size, seed, r, ranks) for r, p in enumerate(paths) if not p.is_file()]
    if todo:
        began = time.perf_counter()
        with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            list(pool.map(_one, todo, chunksize=4))
        print(f"generated {len(todo)} rank traces in {time.perf_counter() - began:.1f} s")
    stray = [p.name for p in folder.glob("*.json*") if p not in paths]
    if stray:
        raise SystemExit(f"{folder} holds other traces too ({stray[0]}, ...): use an empty --dir")
    return sum(p.stat().st_size for p in paths)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes], deadline: float) -> None:
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        proc.kill()


@contextmanager
def local_cluster(workers: int, timeout: float = 120.0) -> Iterator[str]:
    """A real dask.distributed scheduler and `workers` worker processes (one thread each), as
    separate processes on this machine; yields the scheduler's address, stops them after."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = [sys.executable, "-m"]
    procs = [
        subprocess.Popen(
            [
                *dask,
                "distributed.cli.dask_scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--dashboard-address",
                ":0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        procs.append(
            subprocess.Popen(
                [
                    *dask,
                    "distributed.cli.dask_worker",
                    address,
                    "--nworkers",
                    str(workers),
                    "--nthreads",
                    "1",
                    "--dashboard-address",
                    ":0",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        from distributed import Client

        with Client(address, timeout=timeout) as client:
            client.wait_for_workers(workers, timeout=timeout)
        yield address
    finally:
        for proc in reversed(procs):
            proc.terminate()
        deadline = time.monotonic() + 30
        for proc in procs:
            if proc.poll() is None:
                _stop(proc, deadline)


def time_job(
    folder: Path, out: Path, args: argparse.Namespace, scheduler: str | None
) -> dict[str, Any] | None:
    """One `wallfinder analyze folder` in a child process, measured; None if it failed."""
    command = [sys.executable, "-m", "wallfinder", "analyze", str(folder), "--format"]
    command += ["json", "-o", str(out)]
    if args.workers is not None and scheduler is None:
        command += ["--workers", str(args.workers)]
    if scheduler:
        command += ["--scheduler", scheduler]
    print("$", " ".join(command), flush=True)
    m = run_measured(command, args.timeout)
    if m["timed_out"] or m["returncode"] != 0:
        print(f"failed: {m['stderr_tail'].strip() or 'timed out'}")
        return None
    total = sum(p.stat().st_size for p in folder.glob("*.json*"))
    job = json.loads(out.read_text())["job"]
    figures = {
        "ranks": args.ranks,
        "total_mb": total / MB,
        "wall_s": m["wall_s"],
        "mb_per_s": total / MB / m["wall_s"],
        "ranks_per_s": args.ranks / m["wall_s"],
        "peak_rss_mb": m["peak_rss_bytes"] / MB,
        "peak_tree_rss_mb": m["peak_tree_rss_bytes"] / MB,
        "matched_collectives": job["matched"],
        "unmatched_collectives": job["unmatched"],
        "scheduler": scheduler,
        "cpus": os.cpu_count(),
    }
    where = f"dask scheduler {scheduler}" if scheduler else "local worker processes"
    memory = "client process" if scheduler else "largest process"
    print(
        f"{where}: wall {figures['wall_s']:.1f} s, {figures['mb_per_s']:.0f} MB/s "
        f"({figures['ranks_per_s']:.1f} ranks/s); peak RSS {figures['peak_rss_mb']:.0f} MB "
        f"({memory}), {figures['peak_tree_rss_mb']:.0f} MB (process tree); "
        f"{job['matched']} collectives matched across ranks, {job['unmatched']} unmatched",
        flush=True,
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64, help="ranks in the job (default 64)")
    parser.add_argument("--size-mb", type=float, default=6.0, help="MB per rank trace (default 6)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument(
        "--dir", type=Path, help="folder for the traces, kept for later runs (default: temporary)"
    )
    parser.add_argument("--workers", type=int, help="wallfinder analyze --workers")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="wallfinder analyze --scheduler")
    parser.add_argument(
        "--pair",
        action="store_true",
        help="also time the job through a dask scheduler with separate worker processes",
    )
    parser.add_argument(
        "--pair-workers", type=int, default=2, help="dask worker processes for --pair (default 2)"
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds (default 3600)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    if args.pair and args.scheduler:
        parser.error("--pair starts its own scheduler: give --pair or --scheduler")
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as scratch:
        folder = (args.dir or Path(scratch) / "job").absolute()
        total = write_job(folder, args.ranks, args.size_mb, args.seed)
        print(
            f"{args.ranks} ranks, {total / MB:.0f} MB in all; {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}"
        )
        runs: list[dict[str, Any]] = []
        local = Path(scratch) / "local.json"
        first = time_job(folder, local, args, args.scheduler)
        if first is None:
            return 1
        runs.append(first)
        if args.pair:
            remote = Path(scratch) / "dask.json"
            with local_cluster(args.pair_workers) as address:
                second = time_job(folder, remote, args, address)
            if second is None:
                return 1
            second["dask_workers"] = args.pair_workers
            second["same_json"] = remote.read_bytes() == local.read_bytes()
            print(
                "dask vs local: "
                + ("the same JSON, byte for byte" if second["same_json"] else "JSON DIFFERS")
            )
            runs.append(second)
            if not second["same_json"]:
                return 1
    if args.json:
        args.json.write_text(json.dumps(runs if args.pair else runs[0], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
