"""The library's entry points: `analyze` a trace file or a folder of rank traces."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from wallfinder.analysis import ModelFlops, Thresholds, diagnose
from wallfinder.diagnosis import Diagnosis, RankSummary
from wallfinder.errors import WallfinderError
from wallfinder.hardware import DeviceSpec, get_spec, load_spec_file, match_device
from wallfinder.hardware.profile import load_device_profile
from wallfinder.trace import Progress, Trace, find_trace_files, load_trace, process_context


@dataclass(frozen=True)
class Options:
    """What the user can say about an analysis; the CLI builds one from its flags.

    `device` names the device (a spec key or a `deviceProperties` name) when the trace's is
    unknown or wrong; `spec_file` gives the device's figures in a TOML file (it wins over
    both); `device_profile` is a profile measured by `wallfinder calibrate`, whose roofs
    replace those of the spec for the dtypes it measured; `model` describes the model for true
    MFU."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    device: str | None = None
    spec_file: Path | None = None
    model: ModelFlops = field(default_factory=ModelFlops)
    device_profile: Path | None = None

    def spec_for(self, trace: Trace) -> DeviceSpec | None:
        """The device spec to analyse `trace` against, or None when it is unknown.

        With a `device_profile`, the measured peaks and bandwidth replace the spec's (the
        datasheet the profile was measured against when nothing else names one) and the
        spec's `source` says they are calibrated; a trace from another device than the one
        measured is a `WallfinderError`."""
        spec: DeviceSpec | None
        if self.spec_file is not None:
            spec = load_spec_file(self.spec_file)
        elif self.device is not None:
            spec = get_spec(self.device)
        else:
            spec = match_device(trace.device_name or "")
        if self.device_profile is None:
            return spec
        profile = load_device_profile(self.device_profile)
        if self.spec_file is None:  # a user's own spec file says nothing about the device
            profile.check_device(spec, trace.device_name)
        return profile.over(spec)


def analyze(
    path: str | Path,
    options: Options | None = None,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
) -> Diagnosis:
    """Analyse a Kineto/PyTorch profiler trace (`.json` or `.json.gz`) or a folder of them
    (one per rank) and return the `Diagnosis`.

    For a folder, the diagnosis is the lowest rank's, with a summary line per rank in `ranks`;
    a rank file that cannot be read is skipped and named in `warnings`.
    Raises `WallfinderError` for input that cannot be analysed.
    """
    options = options or Options()
    files = find_trace_files(path)
    if len(files) == 1:
        return _diagnose(load_trace(files[0], progress, workers=workers), options)
    return _analyze_ranks(files, progress, workers, options)


def _diagnose(trace: Trace, options: Options) -> Diagnosis:
    spec = options.spec_for(trace)
    return diagnose(trace, options.thresholds, spec=spec, model=options.model)


def _one(path: Path, options: Options) -> Diagnosis | str:
    try:
        return _diagnose(load_trace(path, workers=1), options)
    except WallfinderError as exc:
        return str(exc)


def _analyze_ranks(
    files: list[Path],
    progress: Progress | None,
    workers: int | None,
    options: Options,
) -> Diagnosis:
    results: list[Diagnosis | str] = []
    total = sum(f.stat().st_size for f in files)
    done = 0
    n = workers if workers is not None else min(len(files), os.cpu_count() or 1)
    if n > 1 and total > 16 << 20:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=n, mp_context=process_context()) as pool:
            futures = [pool.submit(_one, f, options) for f in files]
            for f, future in zip(files, futures, strict=True):
                results.append(future.result())
                done += f.stat().st_size
                if progress is not None:
                    progress(done, total)
    else:
        for f in files:
            results.append(_one(f, options))
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
