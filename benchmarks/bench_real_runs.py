"""What real runs on this machine measure today: the figures that used to be asserted in tests
and are measurements, not facts (they move with the machine and with whatever else runs on it).

    python benchmarks/bench_real_runs.py [--repeat 3] [--workload NAME ...] [--no-ranks]

Three parts, each printing its figures and, beside each claim the project makes about them,
whether this run bears it out:

- the demo workloads, as written and fixed, on this machine's device (CUDA/ROCm when present,
  else the CPU, where the workloads run on one thread): the verdict against what the workload
  expects, the fastest and median kept step, the CV; then each pair as `wallfinder demo
  --compare` judges it (step time before and after, the speed-up, the wall before and after,
  and whether that is what the workload was made to show), and the share of the step in the
  workload's mechanism; then, per pair, the as-written run's what-if for the fix (replayed on
  its dependency graph) beside the fixed run's measured step;
- the step timer on a loop that sleeps 100 ms in its first step and 20 ms in the rest: the
  median, the CV and whether the steps come out stable, the first dropped as warm-up;
- a two-rank gloo job under `wallfinder run` (torchrun), balanced and with one rank stalled
  30 ms before each step: how long each rank waits in its collectives, the clocks' skew, and
  the straggler named.

Each demo is run `--repeat` times and the run with the fastest median step kept, as a person
would rerun a measurement on a noisy machine. Needs torch; the ranks part needs torchrun.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import wallfinder
from wallfinder.capture.run import RunSettings, run_program
from wallfinder.capture.workloads import WORKLOADS, default_device
from wallfinder.diagnosis import Diagnosis
from wallfinder.measure import DemoPair, DemoResult, run_demo
from wallfinder.report.diff import speed_text, verdict_line


@dataclass(frozen=True)
class Claim:
    """A figure the project claims of a workload's run, as a test used to assert it."""

    text: str
    holds: Callable[[Diagnosis, Diagnosis], bool]
    figure: Callable[[Diagnosis, Diagnosis], str]


def fastest_ms(d: Diagnosis) -> float:
    return d.steps.min_s * 1e3


def speedup(broken: Diagnosis, fixed: Diagnosis) -> float:
    return broken.steps.median_s / fixed.steps.median_s


def idle(d: Diagnosis, cause: str) -> float:
    return d.breakdown.idle_causes.get(cause, 0.0)


def bf16_matmuls_are_fast_here() -> bool:
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


def faster(text: str, over: float, applies: Callable[[Diagnosis], bool] | None = None) -> Claim:
    """The fix makes the median step more than `over` times faster (where `applies`)."""
    return Claim(
        text,
        lambda b, f: (applies is not None and not applies(b)) or speedup(b, f) > over,
        lambda b, f: f"{speedup(b, f):.2f}x",
    )


def waits_over(text: str, cause: str, share: float) -> Claim:
    """As written, the idle cause takes more than `share` of the step."""
    return Claim(text, lambda b, f: idle(b, cause) > share, lambda b, f: f"{idle(b, cause):.1%}")


def lower_precision_pays(d: Diagnosis) -> bool:
    """GPUs have TF32 and bf16 tensor cores; a CPU gains only with bf16 instructions."""
    return d.device.kind != "cpu" or bf16_matmuls_are_fast_here()


CLAIMS: dict[str, list[Claim]] = {
    "dataloader": [
        waits_over("the wait for data is over half the step as written", "data_loading", 0.5),
        Claim(
            "workers cut the wait's share of the step to under a quarter of it",
            lambda b, f: idle(f, "data_loading") < idle(b, "data_loading") / 4,
            lambda b, f: f"{idle(b, 'data_loading'):.1%} -> {idle(f, 'data_loading'):.1%}",
        ),
        faster("the fixed step is over 2x faster", 2.0),
    ],
    "tiny-ops": [
        waits_over("host overhead is over 40% of the step as written", "host_overhead", 0.4),
        faster("batching makes the step over 5x faster", 5.0),
    ],
    "sync": [
        Claim(
            "on the CPU, .item() leaves no synchronisation idle",
            lambda b, f: b.device.kind != "cpu" or idle(b, "synchronization") == 0.0,
            lambda b, f: f"{idle(b, 'synchronization'):.1%}",
        ),
    ],
    "pointwise": [faster("the fused built-ins make the step over 2x faster", 2.0)],
    "matmul": [
        faster(
            "bf16 makes the step over 1.18x faster (CPUs: only with bf16 instructions)",
            1 / 0.85,
            lower_precision_pays,
        )
    ],
    "precision": [
        faster(
            "TF32 (GPU) or bf16 (CPU, only with bf16 instructions) makes the step over 1.18x "
            "faster",
            1 / 0.85,
            lower_precision_pays,
        )
    ],
}


def best_of(name: str, fixed: bool, device: str, steps: int, repeat: int, root: Path) -> DemoResult:
    runs = []
    for i in range(repeat):
        folder = root / f"{name}{'-fixed' if fixed else ''}" / str(i)
        runs.append(run_demo(name, fixed=fixed, device=device, steps=steps, trace_dir=folder))
    return min(runs, key=lambda r: r.diagnosis.steps.median_s)


def verdict(d: Diagnosis) -> str:
    top = d.findings[0].id if d.findings else "-"
    return f"{d.verdict.wall}/{d.verdict.cause or '-'}/{top}"


def bench_demos(names: list[str], steps: int, repeat: int, root: Path) -> int:
    device = default_device()
    print(f"## Demo workloads on {device} ({steps} steps, best of {repeat})\n")
    print(
        f"{'workload':<17} {'found wall/cause/top finding':<58} {'as expected':<11} "
        f"{'fastest ms':>10} {'median ms':>10} {'CV':>6}"
    )
    differs = 0
    pairs: dict[str, tuple[DemoResult, DemoResult]] = {}
    for name in names:
        results = [best_of(name, fixed, device, steps, repeat, root) for fixed in (False, True)]
        for r in results:
            d = r.diagnosis
            label = f"{name}{' fixed' if r.fixed else ''}"
            ok = "yes" if not r.differences else "NO"
            differs += bool(r.differences)
            print(
                f"{label:<17} {verdict(d):<58} {ok:<11} {fastest_ms(d):>10.2f} "
                f"{d.steps.median_s * 1e3:>10.2f} {d.steps.cv:>6.1%}"
            )
            if r.differences:
                print(f"{'':<17} expected {r.expected.describe()}: {'; '.join(r.differences)}")
        pairs[name] = (results[0], results[1])
    print("\nPairs (wallfinder demo --compare: before -> after, the wall, and the verdict):")
    broken_claims = 0
    for name, (broken, fixed) in pairs.items():
        pair = DemoPair.of(broken, fixed)
        change = pair.diff.steps
        noise = "within the noise" if change.within_noise else "beyond the noise"
        agree = "cannot show it here" if pair.cannot_show else "as made to show"
        if pair.differences:
            agree = "DIFFERS: " + "; ".join(pair.differences)
        print(
            f"  {name}: {change.before_s * 1e3:.2f} ms -> {change.after_s * 1e3:.2f} ms, "
            f"{speed_text(change)} ({noise}); {verdict_line(pair.diff)}; {agree}"
        )
        differs += bool(pair.differences)
        for claim in CLAIMS.get(name, []):
            holds = claim.holds(broken.diagnosis, fixed.diagnosis)
            broken_claims += not holds
            print(
                f"    {'holds' if holds else 'DOES NOT HOLD'}: {claim.text}: "
                f"{claim.figure(broken.diagnosis, fixed.diagnosis)}"
            )
    print(
        f"\n{differs} runs or pairs differ from their expectation; {broken_claims} claims do "
        "not hold"
    )
    print_predictions([DemoPair.of(*pair) for pair in pairs.values()])
    return differs + broken_claims


def print_predictions(pairs: list[DemoPair]) -> None:
    """The replay's prediction for each fix beside the fixed run's measured step (mean steady
    steps): the table the README quotes."""
    print(
        "\nPrediction vs measured (the as-written run's what-if for the fix, replayed on its "
        "dependency graph; the fixed run measured):\n"
    )
    print(
        f"{'workload':<11} {'what-if':<9} {'as written':>11} {'replayed':>10} "
        f"{'predicted':>10} {'measured':>10} {'error':>7}"
    )
    for pair in pairs:
        name = pair.before.workload.name
        p = pair.prediction
        if p is None:
            print(f"{name:<11} {'-':<9} (no what-if stands for this fix on this device)")
            continue
        print(
            f"{name:<11} {p.what_if:<9} {pair.before.diagnosis.steps.mean_s * 1e3:9.1f}ms "
            f"{p.replayed_s * 1e3:8.1f}ms {p.predicted_s * 1e3:8.1f}ms "
            f"{p.measured_s * 1e3:8.1f}ms {p.error:+7.0%}"
        )


def bench_step_timer() -> int:
    print("\n## Step timer: a 100 ms first step, then 20 ms steps (sleeps)\n")
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with wallfinder.StepTimer() as t:
        for i in range(8):
            time.sleep(0.1 if i == 0 else 0.02)
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    s = t.steps
    assert s is not None
    print(
        f"median {s.median_s * 1e3:.2f} ms, CV {s.cv:.1%}, dropped as warm-up: "
        f"{', '.join(d.step for d in s.dropped) or 'none'}"
    )
    claims = [
        ("the first step is dropped as warm-up", [d.step for d in s.dropped] == ["step 0"]),
        ("the median is 20 to 50 ms", 0.02 <= s.median_s < 0.05),
        ("the steps are stable", s.stable),
    ]
    for text, holds in claims:
        print(f"    {'holds' if holds else 'DOES NOT HOLD'}: {text}")
    return sum(not holds for _, holds in claims)


DDP = """\
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(6):
    if dist.get_rank() == int(os.environ["SLOW_RANK"]):
        time.sleep(float(os.environ["STALL_S"]))
    opt.zero_grad(); model(torch.randn(8, 32)).sum().backward(); opt.step()
dist.barrier()
dist.destroy_process_group()
# torch 2.13's gloo can abort in its C++ teardown: run the exit handlers, then skip it.
import atexit; atexit._run_exitfuncs(); os._exit(0)
"""


STALL_S = 0.03


def bench_ranks(root: Path) -> int:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    if not Path(torchrun).exists():
        print("\n## Two ranks: torchrun not found, skipped")
        return 0
    print("\n## Two gloo ranks under `wallfinder run` (CPU), 3 profiled steps\n")
    script = root / "ddp.py"
    script.write_text(DDP)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets, without its warning
    failed = 0
    for slow in (-1, 0, 1):
        os.environ["SLOW_RANK"] = str(slow)
        outcome = run_program(
            [torchrun, "--nproc_per_node", "2", str(script)],
            RunSettings(steps=3, warmup=2),
            root / f"ranks{slow}",
        )
        d = wallfinder.analyze(outcome.trace_dir, workers=1)
        job = d.job
        assert job is not None
        wait = {r.rank: r.wait_s or 0.0 for r in d.ranks}
        skew = job.max_clock_skew_s
        named = [s.rank for s in job.stragglers]
        what = "balanced" if slow < 0 else f"rank {slow} stalls {STALL_S * 1e3:g} ms a step"
        print(
            f"{what}: waits "
            + ", ".join(f"rank {r} {w * 1e3:.2f} ms" for r, w in wait.items())
            + f"; skew {'-' if skew is None else f'{skew * 1e3:.2f} ms'}; stragglers "
            + (", ".join(f"rank {r}" for r in named) or "none")
        )
        path = d.critical_path
        row = next((r for r in path.what_if if r.change == "straggler"), None) if path else None
        if path is not None and row is not None:
            basis = "by replay across ranks" if path.rank_shares else "estimate from the waits"
            shares = ", ".join(f"rank {r} {v:.0%}" for r, v in path.rank_shares.items())
            print(
                f"    job path through rank {path.rank} ({shares or 'not replayed'}); rank "
                f"{path.rank} at the median: {path.measured_step_s * 1e3:.2f} ms -> "
                f"{row.step_s * 1e3:.2f} ms ({basis})"
            )
        if slow < 0:
            claims = [("each rank waits under 5 ms a step", max(wait.values()) < 0.005)]
        else:
            claims = [
                (f"rank {slow} is the only straggler", named == [slow]),
                (
                    f"rank {1 - slow} waits over half the stall",
                    wait[1 - slow] > STALL_S / 2,
                ),
            ]
        claims.append(("the clocks of one host agree within 5 ms", (skew or 0.0) < 0.005))
        for text, holds in claims:
            failed += not holds
            print(f"    {'holds' if holds else 'DOES NOT HOLD'}: {text}")
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workload", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--no-ranks", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wallfinder-bench-") as tmp:
        root = Path(tmp)
        failures = bench_demos(args.workload, args.steps, args.repeat, root)
        failures += bench_step_timer()
        if not args.no_ranks:
            os.environ["STALL_S"] = str(STALL_S)
            failures += bench_ranks(root)
    print(f"\n(all in {time.perf_counter() - began:.0f} s)")
    # A figure that differs from the claim is news, not a crash: the exit code says so.
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
