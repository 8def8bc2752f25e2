"""The critical path and what-if replay: how well the unchanged replay reproduces the measured
step on each real trace with steps, and how long the graph and its replays take on a 64-rank
synthetic job.

    python benchmarks/bench_critpath.py [TRACES_DIR] [--ranks 64]

Prints, per real trace (`../shared/traces` by default): the measured and replayed mean step,
the replay's error, the rounds to the fixed point, the graph's size and its edges read from
timing (event waits, sync edges); then the synthetic job's time per rank and in all. Figures
are from this machine: quote them with it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from wallfinder.analysis.critpath import build_graph, path_shares, replay  # noqa: E402
from wallfinder.analysis.scope import Scope  # noqa: E402


def _scope(path: Path) -> Scope | None:
    """A trace's scope as `diagnose` builds it (steps, windows, steady state)."""
    import numpy as np

    from wallfinder.analysis import Thresholds
    from wallfinder.analysis.gpu import device_ops
    from wallfinder.analysis.scope import ModelFlops
    from wallfinder.analysis.steps import cpu_steps, dropped_steps, gpu_windows
    from wallfinder.trace import load_trace

    trace = load_trace(path)
    spans = cpu_steps(trace)
    if spans.whole:
        return None
    dev = device_ops(trace)
    if dev is None:
        return None
    start, end = gpu_windows(spans, dev.ops, dev.launch_ts)
    kept = np.ones(start.size, dtype=bool)
    durations = (end - start).astype(np.float64) * 1e-9
    kept[[i for i, _ in dropped_steps(spans, durations)]] = False
    return Scope(trace, spans, dev, start, end, kept, None, Thresholds(), ModelFlops())


def real(folder: Path) -> None:
    print(
        f"{'trace':52} {'steps':>5} {'measured':>10} {'replayed':>10} {'error':>7} "
        f"{'rounds':>6} {'ops':>6} {'waits':>5} {'syncs':>5}  path"
    )
    for path in sorted(folder.rglob("*.json.gz")):
        scope = _scope(path)
        g = build_graph(scope) if scope is not None else None
        if g is None:
            continue
        t = replay(g)
        shares = path_shares(g, t)
        top = ", ".join(f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda x: -x[1])[:3])
        error = (t.step_s - g.measured_s) / g.measured_s
        print(
            f"{path.relative_to(folder)!s:52} {g.steps:5d} {g.measured_s * 1e3:8.2f}ms "
            f"{t.step_s * 1e3:8.2f}ms {error:+7.1%} {t.rounds:6d} {g.dur.size:6d} "
            f"{int((g.dep >= 0).sum()):5d} {int((g.drained_by >= 0).sum()):5d}  {top}"
        )


def synthetic(ranks: int, size_mb: float, tmp: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_ranks import write_job  # the generated job the ranks benchmark uses
    from wallfinder.analysis.critpath import critical_path

    write_job(tmp, ranks, size_mb, 0)
    scopes = [s for f in sorted(tmp.glob("*.json")) if (s := _scope(f)) is not None]
    t0 = time.perf_counter()
    ops = calls = 0
    for scope in scopes:
        path, _ = critical_path(scope)
        assert path is not None
        ops += path.device_ops
        calls += path.host_calls
    whole = time.perf_counter() - t0
    each = whole / max(len(scopes), 1) * 1e3
    print(
        f"{len(scopes)} ranks ({ops} device ops, {calls} host calls in their steady steps): "
        f"graph, critical path and 5 what-ifs {whole:.2f} s ({each:.0f} ms per rank)"
    )
    # Across ranks: the ranks' collectives matched and the job replayed at them, with the
    # rank the path runs through brought to the median of the others. (The generated ranks
    # share one clock, so the join's clock alignment is left out here.)
    import numpy as np

    from wallfinder.analysis import Thresholds
    from wallfinder.analysis.collectives import _Matrix, rank_collectives
    from wallfinder.analysis.critpath import job_replay

    cols = [rank_collectives(s.trace) for s in scopes]
    t0 = time.perf_counter()
    m = _Matrix.build(cols)
    every = m.size == len(cols)  # the collectives of the whole job's group
    start, dur = m.start[every], m.dur[every]
    # A known straggler: rank 17 (of 64) reaches each collective 2 ms late, so every other
    # rank waits those 2 ms inside it, and all still end together.
    slow = 17 % len(cols)
    start[:, slow] += 2e6
    dur[:, np.arange(len(cols)) != slow] += 2e6
    joined = job_replay(start, dur, Thresholds().slack.edge_ns)
    assert joined is not None
    late = int(joined.on_path_ns.argmax())
    at_median = joined.without(late)
    job_s = time.perf_counter() - t0
    print(
        f"across ranks: {joined.intervals + 1} collectives joined on {len(cols)} ranks, replayed "
        f"span {joined.replayed_ns / 1e6:.2f} ms (measured {joined.measured_ns / 1e6:.2f} ms), "
        f"path through rank {late} (2 ms late at each) "
        f"{joined.on_path_ns[late] / joined.replayed_ns:.0%}, through ranks arriving "
        f"together {joined.together_ns / joined.replayed_ns:.0%}; "
        f"rank {late} at the median of the others: {at_median / 1e6:.2f} ms; join and replays "
        f"{job_s:.3f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="?", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--size-mb", type=float, default=1.0, help="MB per rank trace")
    args = parser.parse_args()
    if args.traces.is_dir():
        real(args.traces)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        synthetic(args.ranks, args.size_mb, Path(tmp))


if __name__ == "__main__":
    main()
