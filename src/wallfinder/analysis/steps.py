"""Steps: the CPU step spans, the GPU windows that tile the timeline, and warm-up steps.

A step's GPU window ends where the last GPU work launched inside that CPU step ends, and begins
where the previous step's window ended (the first: at its CPU start). The windows tile the
timeline, so the GPU's wait before a step's first kernel (for the DataLoader, for the host)
belongs to that step.
"""

from __future__ import annotations

import itertools
import re

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.intervals import Coverage
from wallfinder.analysis.thresholds import StepThresholds
from wallfinder.trace import Events, Kind, Trace
from wallfinder.trace.dynamo import (
    compile_codes,
    dynamo_range,
    region_codes,
)

I64 = npt.NDArray[np.int64]

NO_LAUNCH = np.iinfo(np.int64).min
"""Launch time of a device op with no launch record. Not NONE (-1): a sentinel that a real
time could equal is never safe."""


_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")

EMPTY_STEP = "lasts no time (its window is empty)"

WHOLE_TRACE = "whole trace (no ProfilerStep)"
OPTIMIZER_ITERATIONS = "optimizer steps (no ProfilerStep)"
ANNOTATION_ITERATIONS = "repeated annotations (no ProfilerStep)"


class StepSpans(msgspec.Struct, frozen=True):
    """CPU spans of the steps, in time order; `source` says where they came from. `startup`,
    when set, says why the first span is the trace's start-up, set aside."""

    labels: list[str]
    cpu_start: I64
    cpu_end: I64
    source: str
    startup: str | None = None
    compile: tuple[int, str] | None = None
    """The span that is torch.compile compiling (its index, and why), set aside as one-off."""

    @property
    def whole(self) -> bool:
        """One window over the whole trace: no steps could be found."""
        return self.source == WHOLE_TRACE


def _outermost(annotations: Events) -> npt.NDArray[np.intp]:
    """Rows of `annotations` in time order, nested or repeated ones left out (some runners
    record a step twice)."""
    rows = np.arange(len(annotations))
    starts, ends = annotations.ts, annotations.end
    order = np.lexsort((-ends, starts))
    rows, starts, ends = rows[order], starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    keep = np.ones(rows.size, dtype=bool)
    keep[1:] = starts[1:] >= reach[:-1]
    return rows[keep]


def cpu_steps(trace: Trace, thresholds: StepThresholds | None = None) -> StepSpans:
    """Steps from `ProfilerStep#N` annotations; with none, the iterations between the first
    optimizer's steps (`Optimizer.step#...`, at least `min_iterations` of them); with neither,
    one window over the whole trace. A step the program stopped inside (`trace.cut_step`) is
    not a step. A trace whose steps are marked by another range (`trace.step_range`: an NVTX
    range, a `record_function`) takes that range's instances."""
    marked = trace.step_rows()
    if len(marked):
        rows = _outermost(marked)
        labels = [f"step {i}" for i in range(rows.size)]
        source = f"{trace.step_range} ranges"
        return StepSpans(labels, marked.ts[rows], marked.end[rows], source)
    # (The module step, recorded with module ranges after the timed steps, is not one.)
    untimed = (trace.cut_step, trace.module_step)
    codes = trace.names_matching(lambda s: _STEP_NAME.match(s) is not None and s not in untimed)
    annotations = trace.named((Kind.ANNOTATION, Kind.CPU_OP), codes)
    # A step range that lasts no time holds no step (a zero or negative duration).
    annotations = annotations.take(np.flatnonzero(annotations.end > annotations.ts))
    if len(annotations):
        rows = _outermost(annotations)
        labels = [
            trace.strings[c].replace("ProfilerStep#", "step ") for c in annotations.name[rows]
        ]
        return StepSpans(labels, annotations.ts[rows], annotations.end[rows], "ProfilerStep")
    th = thresholds or StepThresholds()
    iterations = _optimizer_iterations(trace, th.min_iterations) or _annotation_iterations(
        trace, th.min_iterations
    )
    if iterations is not None:
        return iterations
    start, end = (
        trace.extent(
            Kind.CPU_OP,
            Kind.RUNTIME,
            Kind.KERNEL,
            Kind.MEMCPY,
            Kind.MEMSET,
            Kind.ANNOTATION,
            Kind.PYTHON,
        )
        or trace.extent(Kind.OTHER, Kind.GPU_ANNOTATION)
        or (0, 0)
    )
    compiling = _compile_span(trace, start, end)
    if compiling is not None:
        at, until, why = compiling
        spans = list(itertools.pairwise(sorted({start, at, until, end})))
        labels = [
            "compile" if a == at else "before the compile" if b <= at else "after the compile"
            for a, b in spans
        ]
        return StepSpans(
            labels,
            np.array([a for a, _ in spans], np.int64),
            np.array([b for _, b in spans], np.int64),
            WHOLE_TRACE,
            compile=(labels.index("compile"), why),
        )
    cut, why = start, ""
    while (found := _startup(trace, cut, end, th)) is not None:  # set-up often comes in stages
        cut, why = found[0], (f"{why}; then " if why else "") + found[1]
    if cut > start:
        return StepSpans(
            ["start-up", "whole trace"],
            np.array([start, cut]),
            np.array([cut, end]),
            WHOLE_TRACE,
            startup=(
                f"start-up: {why} (first-call set-up: CUDA context, lazy initialisation, "
                "library handles, autotuning)"
            ),
        )
    return StepSpans(["whole trace"], np.array([start]), np.array([end]), WHOLE_TRACE)


def _startup(
    trace: Trace, start: int, end: int, thresholds: StepThresholds
) -> tuple[int, str] | None:
    """Where the start-up of a trace without steps ends, and why: the end of the first calls
    that took far longer than the same op's later calls (`startup_factor`, `startup_min_ns`,
    `startup_min_share`), begun in the first half of the trace. None when there is none, or
    when nothing would be left after it."""
    # Three columns of the host's rows, not a copy of them all (most of a trace's rows).
    ts, dur, names = trace.columns_of_kinds((Kind.CPU_OP, Kind.RUNTIME), "ts", "dur", "name")
    later_rows = np.flatnonzero(ts >= start)
    span = end - start
    if later_rows.size == 0 or span <= 0:
        return None
    waits = blocking_calls(trace)
    ts, dur, names = ts[later_rows], dur[later_rows], names[later_rows]
    order = np.lexsort((ts, names))
    names, ts, dur = names[order], ts[order], dur[order]
    first = np.flatnonzero(np.r_[True, names[1:] != names[:-1]])
    counts = np.diff(np.r_[first, names.size])
    long_first = (
        (counts >= 2)
        & (dur[first] >= thresholds.startup_min_ns)
        & (dur[first] >= thresholds.startup_min_share * span)
        & (ts[first] < start + span // 2)
    )
    cut, why = start, ""
    for i, n in zip(first[long_first].tolist(), counts[long_first].tolist(), strict=True):
        later = float(np.median(dur[i + 1 : i + n]))
        if dur[i] < thresholds.startup_factor * max(later, 1.0):
            continue
        if waiting(waits, int(ts[i]), int(ts[i] + dur[i])):
            continue  # the host waited for the GPU: a synchronisation, not set-up
        if ts[i] + dur[i] > cut:
            cut = int(ts[i] + dur[i])
            why = (
                f"the first {trace.strings[int(names[i])]} took "
                f"{dur[i] / 1e9:.2f} s, {dur[i] / max(later, 1.0):.0f}x its later calls"
            )
    if cut == start or cut >= end:
        return None
    return cut, why


def _compile_span(trace: Trace, start: int, end: int) -> tuple[int, int, str] | None:
    """In a trace without steps, the stretch torch.compile spent compiling (Dynamo's and
    Inductor's ranges, and the region calls that overlap them: a first call's autotuning),
    from the first of them to the last, when something is left on either side: (start, end,
    why). None without compiler ranges."""
    names = compile_codes(trace)
    ranges = trace.named((Kind.CPU_OP, Kind.ANNOTATION), names)
    if len(ranges) == 0:
        return None
    lo, hi = int(ranges.ts.min()), int(ranges.end.max())
    regions = trace.named(
        (Kind.CPU_OP, Kind.ANNOTATION),
        region_codes(trace),
    )
    # A region call that overlaps the compiler's ranges compiled (or autotuned) in it.
    hit = (regions.ts < hi) & (regions.end > lo)
    if hit.any():
        hi = max(hi, int(regions.end[hit].max()))
    if lo <= start and hi >= end:
        return None
    return (
        max(lo, start),
        min(hi, end),
        f"torch.compile compiling for {(min(hi, end) - max(lo, start)) / 1e9:.2f} s "
        "(Dynamo, AOT autograd, Inductor, autotuning): a one-off cost",
    )


def _optimizer_iterations(trace: Trace, min_iterations: int) -> StepSpans | None:
    """The training iterations of a trace without step markers: each ends where an optimizer
    step ends and begins where the previous one ended (the first, at the trace's first op, so
    it carries the start-up and is set aside as warm-up when it stands out). Only the first
    optimizer's steps count, so that a loop with two optimizers (a GAN) is not cut twice per
    iteration; None with fewer than `min_iterations`."""
    codes = trace.names_matching(lambda s: _OPTIMIZER_STEP.match(s) is not None)
    steps = trace.named((Kind.ANNOTATION, Kind.CPU_OP), codes)
    if len(steps) < min_iterations:
        return None
    first = steps.name[int(np.argmin(steps.ts))]
    steps = steps.take(np.flatnonzero(steps.name == first))
    rows = _outermost(steps)
    if rows.size < min_iterations:
        return None
    ends = steps.end[rows]
    begin = _host_start(trace, int(steps.ts[rows[0]]))
    starts = np.concatenate([[begin], ends[:-1]]).astype(np.int64)
    labels = [f"iteration {k + 1}" for k in range(rows.size)]
    return StepSpans(labels, starts, ends.astype(np.int64), OPTIMIZER_ITERATIONS)


def _annotation_iterations(trace: Trace, min_iterations: int) -> StepSpans | None:
    """The iterations of a trace with neither step markers nor optimizer steps, where its
    top-level user annotations (`record_function` ranges) on one thread repeat one sequence at
    least `min_iterations` times. Each iteration runs from one start of the sequence to the next,
    so that the unannotated work after a repetition (its backward pass, the optimizer) is its
    iteration's; the first from the trace's first op (carrying the start-up), the last to the
    end of the job's last op, launch or kernel. None when no sequence repeats."""
    annotations = trace.of_kind(Kind.ANNOTATION)
    # Dynamo's ranges (a guard check, a compiled region, the compiler's stages) mark compiled
    # code and compiling, never a step (`analysis.compiled` reads them).
    dynamo = trace.names_matching(dynamo_range, (Kind.ANNOTATION,))
    annotations = annotations.take(~np.isin(annotations.name, dynamo))
    if len(annotations) < min_iterations:
        return None
    best: tuple[int, I64, I64, str] | None = None  # (first start, starts, ends, name)
    for thread in np.unique(annotations.thread).tolist():
        mine = annotations.take(np.flatnonzero(annotations.thread == thread))
        top = mine.take(_outermost(mine))
        found = _repeating(top, min_iterations)
        if found is not None and (best is None or found[0] < best[0]):
            best = (found[0], found[1], found[2], trace.strings[found[3]])
    if best is None:
        return None
    _, starts, _, name = best
    work = trace.extent(Kind.CPU_OP, Kind.RUNTIME, Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
    last = max(work[1] if work is not None else 0, int(starts[-1]) + 1)
    ends = np.concatenate([starts[1:], [last]]).astype(np.int64)
    starts = starts.copy()
    starts[0] = _host_start(trace, int(starts[0]))
    labels = [f"iteration {k + 1} ({name[:40]})" for k in range(starts.size)]
    return StepSpans(labels, starts, ends, ANNOTATION_ITERATIONS)


def _host_start(trace: Trace, at: int) -> int:
    """The earlier of `at` and the start of the host's first row (ops, annotations, Python
    frames, runtime calls)."""
    found = trace.extent(Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON, Kind.RUNTIME)
    return min(found[0], at) if found is not None else at


def _repeating(top: Events, min_iterations: int) -> tuple[int, I64, I64, int] | None:
    """In one thread's top-level annotations (time order), the earliest name whose
    occurrences start repetitions of one same sequence, at least `min_iterations` of them:
    (its first start, the repetitions' starts, their ends, the name's code); a repetition
    ends where the last of its annotations ends."""
    names = top.name
    found: tuple[int, I64, I64, int] | None = None
    for code in np.unique(names).tolist():
        at = np.flatnonzero(names == code)
        if at.size < min_iterations or (found is not None and top.ts[at[0]] >= found[0]):
            continue
        period = int(at[1] - at[0])
        if not (np.diff(at) == period).all() or at[-1] + period > names.size:
            continue
        pattern = names[at[0] : at[0] + period]
        if any(not np.array_equal(names[a : a + period], pattern) for a in at.tolist()):
            continue
        ends = np.array([int(top.end[a : a + period].max()) for a in at.tolist()], np.int64)
        found = (int(top.ts[at[0]]), top.ts[at].astype(np.int64), ends, int(code))
    return found


def launched_in(
    cpu_start: I64, cpu_end: I64, gpu: Events, launch_ts: I64
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
    """Per GPU op, the host span [cpu_start, cpu_end) (sorted by start) that launched it,
    and whether one did. `launch_ts` is each op's launch time (NO_LAUNCH where unknown:
    such ops are placed by their own start)."""
    when = np.where(launch_ts != NO_LAUNCH, launch_ts, gpu.ts)
    step_of = np.searchsorted(cpu_start, when, side="right") - 1
    inside = (step_of >= 0) & (when < cpu_end[np.maximum(step_of, 0)])
    return step_of, inside


def gpu_windows(spans: StepSpans, gpu: Events, launch_ts: I64) -> tuple[I64, I64]:
    """Window [start, end) of each step on the device: from the last step's last op to its
    own last op (`launched_in`)."""
    n = len(spans.labels)
    step_of, inside = launched_in(spans.cpu_start, spans.cpu_end, gpu, launch_ts)
    last_end = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    if inside.any():
        np.maximum.at(last_end, step_of[inside], gpu.end[inside])
    # With no GPU work launched in a step, the window ends with the CPU step; a whole-trace
    # window also keeps the CPU work after the last kernel.
    end = np.where(last_end != np.iinfo(np.int64).min, last_end, spans.cpu_end)
    if spans.whole:
        end = np.maximum(end, spans.cpu_end)
    end = np.maximum.accumulate(np.maximum(end, spans.cpu_start))
    start = np.concatenate([[spans.cpu_start[0]], end[:-1]])
    return start.astype(np.int64), end.astype(np.int64)


def warmup_steps(
    durations: npt.NDArray[np.float64], thresholds: StepThresholds | None = None
) -> list[tuple[int, str]]:
    """Leading steps to drop as warm-up, with the reason for each."""
    th = thresholds or StepThresholds()
    n = durations.size
    dropped: list[tuple[int, str]] = []
    if n < 3:
        return dropped
    while len(dropped) < int(n * th.max_warmup_share):
        i = len(dropped)
        rest = np.median(durations[i + 1 :])
        if rest <= 0 or durations[i] <= th.warmup_factor * rest:
            break
        dropped.append(
            (
                i,
                f"took {durations[i] / rest:.1f}x the median of the later steps "
                "(first-iteration warm-up: compilation, autotuning, allocator growth)",
            )
        )
    return dropped


_BLOCKING = re.compile(r"Synchronize|Memcpy(?!Async)|MemcpyWithStream")
"""Runtime calls in which the host waits for the GPU: an op that spends its time in one is
waiting for queued work, not setting up."""


def blocking_calls(trace: Trace) -> tuple[I64, I64, I64]:
    """Start, end and thread of every blocking runtime call, by start."""
    codes = trace.names_matching(lambda name: _BLOCKING.search(name) is not None, (Kind.RUNTIME,))
    runtime = trace.of_kind(Kind.RUNTIME)
    waits = runtime.take(np.flatnonzero(np.isin(runtime.name, codes)))
    order = np.argsort(waits.ts, kind="stable")
    return waits.ts[order], waits.end[order], waits.thread[order]


def waiting(waits: tuple[I64, I64, I64], ts: int, end: int, thread: int | None = None) -> bool:
    """Over half of [ts, end) is spent inside blocking runtime calls (`blocking_calls`; of
    `thread` alone, when given)."""
    w_ts, w_end, w_thread = waits
    lo, hi = np.searchsorted(w_ts, ts), np.searchsorted(w_ts, end)
    inside = np.minimum(w_end[lo:hi], end) - w_ts[lo:hi]
    if thread is not None:
        inside = inside[w_thread[lo:hi] == thread]
    return 2 * int(inside.sum()) > end - ts


def compiling_steps(
    trace: Trace, spans: StepSpans, thresholds: StepThresholds | None = None
) -> list[tuple[int, str]]:
    """Steps in which torch.compile compiled (a recompile in the steady loop, after a new
    shape or a guard failure): the compiler's own ranges (Dynamo, AOT autograd, Inductor,
    autotuning) cover at least `compile_share` of the step on the host. A one-off cost per
    shape, set aside like the warm-up, never read as the steady state."""
    th = thresholds or StepThresholds()
    codes = compile_codes(trace)
    if codes.size == 0 or spans.cpu_start.size == 0:
        return []
    ranges = trace.named((Kind.ANNOTATION, Kind.CPU_OP, Kind.PYTHON), codes)
    if not len(ranges):
        return []
    out: list[tuple[int, str]] = []
    for thread in np.unique(ranges.thread).tolist():
        mine = ranges.take(np.flatnonzero(ranges.thread == thread))
        cover = Coverage.of(mine.ts, mine.end)
        held = cover.covered(spans.cpu_start, spans.cpu_end)
        span = np.maximum(spans.cpu_end - spans.cpu_start, 1)
        out.extend(
            (
                i,
                f"compiled for {held[i] / 1e6:.1f} ms (torch.compile: Dynamo, AOT autograd and "
                "Inductor at work, a recompile for a new shape or a failed guard): a one-off "
                "cost, not the steady state",
            )
            for i in np.flatnonzero(held >= th.compile_share * span).tolist()
        )
    return sorted(dict(out).items())


def dropped_steps(
    spans: StepSpans,
    durations: npt.NDArray[np.float64],
    thresholds: StepThresholds | None = None,
    compiling: list[tuple[int, str]] | None = None,
) -> list[tuple[int, str]]:
    """The steps set aside: the start-up span of a trace without steps, else the leading
    warm-up steps; steps in which torch.compile compiled (`compiling`); and any step whose
    window is empty (the device's windows tile the timeline, so a step whose work all ended
    before the last step's window did has none)."""
    dropped = (
        [(0, spans.startup)] if spans.startup is not None else warmup_steps(durations, thresholds)
    )
    if spans.compile is not None:
        dropped = [spans.compile]
    aside = {i for i, _ in dropped}
    dropped += [(i, why) for i, why in compiling or [] if i not in aside]
    aside = {i for i, _ in dropped}
    empty = [(i, EMPTY_STEP) for i in np.flatnonzero(durations <= 0).tolist() if i not in aside]
    return sorted(dropped + empty)
