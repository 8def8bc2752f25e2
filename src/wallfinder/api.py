"""The library's entry points: `analyze` a trace file or a folder of rank traces, and what
the command line needs beside it: saved diagnoses (`load_diagnosis`), what moved between two
runs (`diff`), bounds for a CI gate (`Bounds`, `check`), the roofline calculator (`calculate`,
`cost_of`, `fusion`), allocator snapshots (`analyze_memory`) and the TOML file a CI gate's
bounds live in (`read_toml`). The analyses themselves stay in `wallfinder.analysis`: the
command line reaches them through this module only."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from wallfinder._lazy import lazy_attributes
from wallfinder.analysis import (
    DiagnoseOptions,
    ModelFlops,
    Thresholds,
    diagnose,
    diagnose_marked,
)
from wallfinder.analysis.collectives import rank_collectives
from wallfinder.analysis.counters import collect_commands, counter_report
from wallfinder.diagnosis import (
    DIAGNOSIS_SCHEMAS,
    SCHEMA,
    Calculation,
    CounterReport,
    Diagnosis,
    MemoryReport,
    TraceMarks,
)
from wallfinder.errors import WallfinderError, blame
from wallfinder.hardware import (
    DeviceEvidence,
    DeviceSpec,
    evidence_of,
    get_spec,
    identify_device,
    load_spec_file,
)
from wallfinder.hardware._toml import read_toml_file
from wallfinder.trace import (
    UNREADABLE,
    Kind,
    Progress,
    ResultCache,
    Trace,
    check_workers,
    find_trace_files,
    gunzipped,
    load_trace,
    load_traces,
    process_context,
    result_cache,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from wallfinder.analysis.calculator import (
        DEFAULT_DTYPE,
        calculate,
        cost_of,
        dtype_defaulted,
        fusion,
    )
    from wallfinder.analysis.check import BoundCheck, Bounds, baseline_warning, check
    from wallfinder.analysis.diff import diff, run_names
    from wallfinder.analysis.job import RankResult

# The calculator's, the CI gate's, the diff's and the job's names are imported on first use:
# analysing one trace needs none of them (together 10 ms of every `analyze`'s start).
__getattr__ = lazy_attributes(
    __name__,
    {
        "DEFAULT_DTYPE": "wallfinder.analysis.calculator",
        "calculate": "wallfinder.analysis.calculator",
        "cost_of": "wallfinder.analysis.calculator",
        "dtype_defaulted": "wallfinder.analysis.calculator",
        "fusion": "wallfinder.analysis.calculator",
        "BoundCheck": "wallfinder.analysis.check",
        "Bounds": "wallfinder.analysis.check",
        "baseline_warning": "wallfinder.analysis.check",
        "check": "wallfinder.analysis.check",
        "diff": "wallfinder.analysis.diff",
        "run_names": "wallfinder.analysis.diff",
        "RankResult": "wallfinder.analysis.job",
    },
)

__all__ = [
    "DEFAULT_DTYPE",
    "MIN_STEPS_FOR_STABILITY",
    "BoundCheck",
    "Bounds",
    "Calculation",
    "Diagnosis",
    "ModelFlops",
    "Options",
    "Progress",
    "RankResult",
    "Thresholds",
    "analyze",
    "analyze_counters",
    "analyze_marked",
    "analyze_memory",
    "analyze_rank",
    "baseline_warning",
    "calculate",
    "check",
    "cost_of",
    "diff",
    "dtype_defaulted",
    "fusion",
    "load_diagnosis",
    "ncu_commands",
    "read_toml",
    "run_names",
    "saved_schema",
]


MIN_STEPS_FOR_STABILITY = Thresholds().min_steps
"""With fewer steady-state steps, whether steps are stable is unknown (`Thresholds.min_steps`,
by default)."""


@dataclass(frozen=True)
class Options:
    """What the user can say about an analysis; the CLI builds one from its flags.

    `device` names the device (a spec key, a `deviceProperties` name or a family name such as
    "A100", taken as its common variant and said so) when the trace's is unknown or wrong;
    without it the trace's device is matched by name, else inferred (and said so);
    `spec_file` gives the device's figures in a TOML file (it wins over both);
    `device_profile` is a profile measured by `wallfinder calibrate`, whose roofs replace
    those of the spec for the dtypes it measured; `model` describes the model for true MFU;
    `thresholds` decide the verdict and every finding (a rank's, its memory's, the job's,
    and an allocator snapshot's in `analyze_memory`)."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    device: str | None = None
    spec_file: Path | None = None
    model: ModelFlops = field(default_factory=ModelFlops)
    device_profile: Path | None = None
    step_range: str | None = None
    """The name of the range (an NVTX range, a `record_function`) that marks each step, in
    place of `ProfilerStep#N` (or, for an Nsight Systems capture, the range chosen by name)."""
    what_if: str | None = None
    """The fixes to replay on each step's dependency graph, comma-separated (`"data,host:4"`:
    each alone, then all combined; see `wallfinder analyze --help`); None: the default
    what-if table."""
    counters: Path | None = None
    """An Nsight Compute export of the same program (`ncu --csv`, or a folder of them): each
    kernel it measured is placed by its counted bound in the verdict and findings, and the
    diagnosis's `counters` confirms or refutes each estimate."""
    cache: bool = False
    """Keep the parse of a large trace in wallfinder's cache folder ($WALLFINDER_CACHE, else
    the user's cache folder) and reuse it while the file is unchanged (the CLI's default);
    `analyze` keeps its diagnosis there too, read back when asked again with the same
    options."""

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
            # By name, else inferred from deviceProperties and kernel names, and said so.
            spec = identify_device(_device_evidence(trace))
        if self.device_profile is None:
            return spec
        from wallfinder.hardware.profile import load_device_profile  # (only with a profile)

        profile = load_device_profile(self.device_profile)
        if self.spec_file is None:  # a user's own spec file says nothing about the device
            profile.check_device(spec, trace.device_name)
        return profile.over(spec)

    def diagnose_options(self, trace: Trace) -> DiagnoseOptions:
        """What `diagnose` is told for `trace` (the spec, the model, the what-ifs, the
        counters)."""
        counters = None
        if self.counters is not None:
            from wallfinder.trace import load_ncu  # (here: only --counters reads an export)

            counters = load_ncu(self.counters)
        return DiagnoseOptions(
            spec=self.spec_for(trace), model=self.model, what_if=self.what_if, counters=counters
        )


def _device_evidence(trace: Trace) -> DeviceEvidence:
    """What the trace says about its device: its first device's deviceProperties, and its
    kernel names (one per distinct name) for the architecture tags they carry."""
    # (Kept on the trace, where the serving view reads them again.)
    names = [trace.strings[c] for c in trace.distinct_names(Kind.KERNEL).tolist()]
    props = trace.device_properties[0] if trace.device_properties else {}
    return evidence_of(trace.device_name, props, names)


def analyze(
    path: str | Path,
    options: Options | None = None,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
) -> Diagnosis:
    """Analyse a Kineto/PyTorch profiler trace (`.json` or `.json.gz`) or a folder of them
    (one per rank), or an Nsight Systems capture (an `nsys export --type sqlite` file, or an
    `.nsys-rep` report when `nsys` is on PATH; each GPU process in it a rank), and return the
    `Diagnosis`.

    For a folder, each rank is analysed in its own worker process (or, with `scheduler`, the
    address of a running dask.distributed scheduler such as ``"tcp://host:8786"``, on that
    cluster's workers: they need wallfinder installed and must see the files at the same
    absolute path, e.g. on a shared filesystem); only small per-rank summaries come back, and
    the result is the same as in-process. The diagnosis is the lowest rank's, with a line per
    rank in `ranks` and the cross-rank view (clock skew, matched collectives, stragglers) in
    `job`. A rank file that cannot be read, a duplicate
    rank, or a rank of another job is skipped and named in `warnings`.
    Raises `WallfinderError` for input that cannot be analysed.
    """
    check_workers(workers)  # before a kept diagnosis could answer without them
    options = options or Options()
    files = find_trace_files(path)
    if len(files) == 1 and scheduler is None:
        kept = _kept_diagnosis(files[0], options)
        data = kept.read() if kept is not None else None
        if kept is not None and data is not None:
            try:
                return Diagnosis.from_json(data)
            except (msgspec.DecodeError, WallfinderError):
                kept.drop()  # damaged: analysed again below, and kept again
        traces = load_traces(
            files[0],
            progress,
            workers=workers,
            step_range=options.step_range,
            cache=options.cache,
        )
        if len(traces) == 1:
            diagnosis = _diagnose(traces[0], options)
            if kept is not None:
                kept.write(msgspec.json.encode(diagnosis))
            return diagnosis
        # An Nsight Systems capture of several GPU processes: each is a rank of one job.
        ranks = [(_diagnose(t, options), rank_collectives(t)) for t in traces]
        return _job(ranks, options.thresholds)
    if scheduler is None:
        return _job(_in_processes(files, progress, workers, options), options.thresholds)
    results = _on_dask(scheduler, files, options, progress)
    if len(files) > 1:
        return _job(results, options.thresholds)
    # One file is one trace, not a job: the same diagnosis as without a scheduler.
    if isinstance(results[0], str):
        raise WallfinderError(results[0])
    return results[0][0]


def _kept_diagnosis(file: Path, options: Options) -> ResultCache | None:
    """Where the diagnosis of a large trace file (one whose parse is cached) is kept for these
    options, with `options.cache`: asked again (the HTML after the terminal, `check`, `diff`),
    it is read back instead of analysed. Keyed by the file, every option that decides the
    diagnosis, the files options name (spec, profile, counters) and this wallfinder."""
    if not options.cache:
        return None
    question = {k: v for k, v in asdict(options).items() if k != "cache"}
    files = [Path(p) for p in (options.spec_file, options.device_profile, options.counters) if p]
    return result_cache(file, msgspec.json.encode(question, enc_hook=str), files)


def analyze_marked(
    path: str | Path,
    options: Options | None = None,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
) -> tuple[Diagnosis, TraceMarks]:
    """`analyze` one Kineto trace file, and return with its diagnosis the marks that place
    the evidence on the trace's own timeline (steps, idle gaps, each finding's kernels, the
    critical path) for `report.write_marks`. Raises `WallfinderError` for a folder of
    traces or an Nsight Systems capture (whose timeline is not a trace-event file)."""
    options = options or Options()
    files = find_trace_files(path)
    if len(files) != 1:
        raise WallfinderError(
            f"{path}: an annotated trace is made from one trace file, not a folder of "
            f"{len(files)} (annotate one rank's file)"
        )
    traces = load_traces(
        files[0], progress, workers=workers, step_range=options.step_range, cache=options.cache
    )
    if len(traces) != 1 or not traces[0].reader.trace_events:
        raise WallfinderError(
            f"{path}: an annotated trace is made from a PyTorch profiler (Kineto) trace, "
            f"whose timeline Perfetto opens; not from {traces[0].reader.title}"
        )
    trace = traces[0]
    return diagnose_marked(trace, options.thresholds, **options.diagnose_options(trace))


_SCHEMA_KEY = re.compile(rb'"schema"\s*:\s*"(wallfinder\.[^"]{1,40})"')
HEAD_BYTES = 4096
"""How much of a file is read to tell a saved result from a trace (its `schema` key comes
first in what wallfinder writes)."""


def load_diagnosis(path: str | Path, options: Options | None = None) -> Diagnosis:
    """A `Diagnosis` from a saved one (`analyze --format json`, told by its `schema` key) or
    from analysing a trace file or a folder of rank traces (as `analyze`).
    Raises `WallfinderError` for input that is neither."""
    p = Path(path)
    schema = saved_schema(p)
    if schema is None:
        return analyze(p, options)
    if schema not in DIAGNOSIS_SCHEMAS:
        raise WallfinderError(f"{p}: a {schema} file, not a diagnosis ({SCHEMA})")
    try:
        return Diagnosis.from_json(_read(p))
    except msgspec.DecodeError as exc:
        raise WallfinderError(f"{p}: not a readable {SCHEMA} file: {exc}") from None


def saved_schema(path: Path) -> str | None:
    """The `schema` of a result file wallfinder saved (e.g. "wallfinder.diagnosis/1"), or None
    for anything else (a trace, a folder)."""
    if not path.is_file():
        return None
    try:
        with path.open("rb") as f, gunzipped(f) as g:
            head = g.read(HEAD_BYTES)
    except UNREADABLE:
        return None  # the trace loader says what is wrong with it
    found = _SCHEMA_KEY.search(head)
    return found.group(1).decode("utf-8", "replace") if found else None


def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as f, gunzipped(f) as g:
            return g.read()
    except UNREADABLE as exc:
        raise WallfinderError(f"{path}: cannot read ({exc})") from None


def _diagnose(trace: Trace, options: Options) -> Diagnosis:
    given = options.diagnose_options(trace)
    try:
        return diagnose(trace, options.thresholds, **given)
    except WallfinderError:
        raise
    except Exception as exc:  # a bug: the file it happened on goes with it (one job's ranks)
        blame(exc, trace.source)
        raise


def analyze_rank(path: Path, options: Options) -> RankResult:
    """One rank's work, run in a worker: parse, diagnose, extract the collectives."""
    try:
        trace = load_trace(path, workers=1, cache=options.cache)
        if options.step_range is not None:
            trace.use_step_range(options.step_range)
        return _diagnose(trace, options), rank_collectives(trace)
    except WallfinderError as exc:
        return str(exc)
    except Exception as exc:  # a bug, perhaps in a worker process: it names its file
        blame(exc, path.name)
        raise


def _in_processes(
    files: list[Path], progress: Progress | None, workers: int | None, options: Options
) -> list[RankResult]:
    results: list[RankResult] = []
    total = sum(f.stat().st_size for f in files)
    done = 0
    n = workers if workers is not None else min(len(files), os.cpu_count() or 1)
    if n > 1 and total > 16 << 20:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=n, mp_context=process_context()) as pool:
            futures = [pool.submit(analyze_rank, f, options) for f in files]
            for f, future in zip(files, futures, strict=True):
                results.append(future.result())
                done += f.stat().st_size
                if progress is not None:
                    progress(done, total)
    else:
        for f in files:
            results.append(analyze_rank(f, options))
            done += f.stat().st_size
            if progress is not None:
                progress(done, total)
    return results


SCHEDULER_TIMEOUT_S = 10.0
"""How long to try to reach a dask scheduler before saying it cannot be reached."""

DASK_MISSING = (
    "--scheduler needs dask.distributed: pip install 'wallfinder[dask]' "
    "(or pip install 'dask[distributed]')"
)


def _on_dask(
    address: str, files: list[Path], options: Options, progress: Progress | None
) -> list[RankResult]:
    """Fan the ranks out over a running dask.distributed cluster; the workers read the files
    (a shared filesystem) and send back only their small results."""
    try:
        from distributed import Client  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise WallfinderError(DASK_MISSING) from None
    try:
        client = Client(address, timeout=SCHEDULER_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        raise WallfinderError(f"cannot reach the dask scheduler at {address} ({exc})") from None
    with client:
        paths = [f.resolve() for f in files]
        futures = client.map(analyze_rank, paths, options=options, pure=False)
        results: list[RankResult] = client.gather(futures)
    if progress is not None:
        total = sum(f.stat().st_size for f in files)
        progress(total, total)
    return results


def _job(results: Sequence[RankResult], thresholds: Thresholds) -> Diagnosis:
    """`analysis.job.job_diagnosis`, imported when a job is analysed: one trace needs none of
    it."""
    from wallfinder.analysis.job import job_diagnosis

    return job_diagnosis(results, thresholds)


def analyze_memory(path: str | Path, options: Options | None = None) -> MemoryReport:
    """What fills GPU memory, from the CUDA allocator snapshot at `path`
    (`torch.cuda.memory._dump_snapshot`, plain or gzip), with the findings its
    `options.thresholds.snapshot` make. The pickle is loaded without running code: anything
    but plain data is refused with a `WallfinderError`."""
    # (Imported here: an analysis of a trace needs neither.)
    from wallfinder.analysis.memory import memory_report
    from wallfinder.trace.snapshot import load_snapshot

    thresholds = (options or Options()).thresholds
    return memory_report(load_snapshot(path), source=str(path), thresholds=thresholds)


def analyze_counters(
    path: str | Path, options: Options | None = None, *, diagnosis: Diagnosis | None = None
) -> CounterReport:
    """What the hardware counters of an Nsight Compute export (`ncu --csv`, details or raw
    page; an `.ncu-rep` with `ncu` on PATH; or a folder of them) say per kernel: its bound by
    counters and the figures that decided it. With the `diagnosis` of a trace of the same
    program, its top kernels are joined to the profiled launches and each roofline estimate is
    confirmed or refuted. Raises `WallfinderError` for input that is not an export."""
    from wallfinder.trace import load_ncu  # (here: analysing a trace reads no export)

    thresholds = (options or Options()).thresholds
    return counter_report(load_ncu(path), thresholds, diagnosis)


def ncu_commands(diagnosis: Diagnosis | None = None, options: Options | None = None) -> list[str]:
    """The `ncu` command lines that collect the counters `analyze_counters` reads: for a
    diagnosis, one per top kernel by time (its first step's launches skipped); else one for
    every kernel."""
    return collect_commands(diagnosis, (options or Options()).thresholds)


def read_toml(path: str | os.PathLike[str], what: str) -> tuple[Path, dict[str, object]]:
    """A TOML file (e.g. the `[tool.wallfinder.check]` bounds of a pyproject.toml) and its
    document, read as the device spec files are: a missing, unreadable or malformed file is a
    one-line `WallfinderError` in which `what` names the kind of file."""
    return read_toml_file(path, what)
