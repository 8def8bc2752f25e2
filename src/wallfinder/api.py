"""The library's entry points: `analyze` a trace file or a folder of rank traces."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from wallfinder.analysis import Thresholds, diagnose
from wallfinder.diagnosis import Diagnosis, RankSummary
from wallfinder.errors import WallfinderError
from wallfinder.trace import Progress, find_trace_files, load_trace, process_context

RankProgress = Callable[[int, int], None]


def analyze(
    path: str | Path,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
    thresholds: Thresholds | None = None,
) -> Diagnosis:
    """Analyse a Kineto/PyTorch profiler trace (`.json` or `.json.gz`) or a folder of them
    (one per rank) and return the `Diagnosis`.

    For a folder, the diagnosis is the lowest rank's, with a summary line per rank in `ranks`;
    a rank file that cannot be read is skipped and named in `warnings`.
    Raises `WallfinderError` for input that cannot be analysed.
    """
    files = find_trace_files(path)
    if len(files) == 1:
        return diagnose(load_trace(files[0], progress, workers=workers), thresholds)
    return _analyze_ranks(files, progress, workers, thresholds)


def _one(path: Path, thresholds: Thresholds | None) -> Diagnosis | str:
    try:
        return diagnose(load_trace(path, workers=1), thresholds)
    except WallfinderError as exc:
        return str(exc)


def _analyze_ranks(
    files: list[Path],
    progress: Progress | None,
    workers: int | None,
    thresholds: Thresholds | None,
) -> Diagnosis:
    results: list[Diagnosis | str] = []
    total = sum(f.stat().st_size for f in files)
    done = 0
    n = workers if workers is not None else min(len(files), multiprocessing.cpu_count() or 1)
    if n > 1 and total > 16 << 20:
        with ProcessPoolExecutor(max_workers=n, mp_context=process_context()) as pool:
            futures = [pool.submit(_one, f, thresholds) for f in files]
            for f, future in zip(files, futures, strict=True):
                results.append(future.result())
                done += f.stat().st_size
                if progress is not None:
                    progress(done, total)
    else:
        for f in files:
            results.append(_one(f, thresholds))
            done += f.stat().st_size
            if progress is not None:
                progress(done, total)
    good = [r for r in results if isinstance(r, Diagnosis)]
    skipped = [f"skipped {r}" for r in results if isinstance(r, str)]
    if not good:
        raise WallfinderError(f"no rank trace could be analysed ({'; '.join(skipped)})")
    good.sort(key=lambda d: (d.rank is None, d.rank if d.rank is not None else 0, d.source))
    ranks = [
        RankSummary(
            source=d.source,
            rank=d.rank,
            steps=d.steps.count,
            median_step_s=d.steps.median_s,
            compute=d.breakdown.compute,
            idle=d.breakdown.idle,
            wall=d.verdict.wall,
            cause=d.verdict.cause,
        )
        for d in good
    ]
    main = good[0]
    return Diagnosis(
        **{
            **{f: getattr(main, f) for f in main.__struct_fields__},
            "ranks": ranks,
            "warnings": [*main.warnings, *skipped],
        }
    )
