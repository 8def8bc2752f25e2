"""Marks for the trace's own timeline (`analyze --annotate`): where the diagnosis's evidence
sits, so that a user can jump from a finding to the kernels in Perfetto or chrome://tracing.

The steps (the steady state as one span, warm-up steps named so), the longest idle gaps of
the steady steps with their causes, each finding's kernels or host calls, and the critical
path of the step the timeline draws. Times are the trace's own (µs from its clock's zero);
names are the step labels, wallfinder's categories, and the names of the trace's kernels and
ops, never their arguments."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from wallfinder.analysis.findings import Facts
from wallfinder.analysis.rules import declared
from wallfinder.diagnosis import Diagnosis, TraceMark, TraceMarks
from wallfinder.trace import Events, Kind
from wallfinder.units import duration, ms

_Clock = Callable[[int], float]
"""Trace ns → the trace's own µs."""

MAX_GAPS = 50
"""Idle gaps marked, at most: the longest of the steady steps."""
MAX_PER_FINDING = 200
"""Kernels or calls marked per finding, at most: the longest."""


def trace_marks(facts: Facts, diagnosis: Diagnosis) -> TraceMarks:
    """The marks of `diagnosis`, made from the `facts` it was made from."""
    scope, trace = facts.scope, facts.trace

    def us(ns: int) -> float:
        return trace.origin_us + ns / 1e3

    marks = []
    kept = scope.kept
    for i, label in enumerate(scope.labels):
        a, b = int(scope.start[i]), int(scope.end[i])
        warm = "" if kept[i] else " (warm-up, not in the steady state)"
        marks.append(TraceMark(track="steps", name=label + warm, ts_us=us(a), dur_us=(b - a) / 1e3))
    if kept.any():
        a, b = int(scope.start[kept].min()), int(scope.end[kept].max())
        s = diagnosis.steps
        marks.append(
            TraceMark(
                track="steps",
                name="steady state",
                ts_us=us(a),
                dur_us=(b - a) / 1e3,
                detail=f"{s.count} steps, median {ms(s.median_s)} ms, CV {s.cv:.1%}; "
                f"wall: {diagnosis.verdict.wall} ({diagnosis.verdict.cause})",
            )
        )
    marks += _gaps(facts, us)
    for finding in diagnosis.findings:
        work = evidence(facts, finding.id)
        longest = np.argsort(-work.dur, kind="stable")[:MAX_PER_FINDING]
        detail = f"{finding.title} (up to {finding.max_speedup:.2f}x)"
        marks += [
            TraceMark(
                track=f"finding: {finding.id}",
                name=trace.strings[int(work.name[k])],
                ts_us=us(int(work.ts[k])),
                dur_us=int(work.dur[k]) / 1e3,
                detail=detail,
            )
            for k in np.sort(longest).tolist()
        ]
    marks += _critical_path(facts, diagnosis, us)
    pids = (trace.ids[int(c)] for c in np.unique(trace.events.pid).tolist())
    used = [p for p in pids if isinstance(p, int)]
    return TraceMarks(pid=max(used, default=0) + 1, marks=marks)


def evidence(facts: Facts, finding: str) -> Events:
    """The work a finding (by id) is about, as its rule declares it (`rule(work=...)`): device
    ops of the steady-state steps (its kernels or copies), or host calls (its syncs,
    allocations); empty when the finding names no particular work (unstable steps)."""
    r = declared(finding)
    work = r.work(facts) if r is not None and r.work is not None else None
    if isinstance(work, Events):
        return work
    if work is None or facts.dev is None:
        return facts.trace.of_kind(Kind.KERNEL).take(slice(0, 0))
    return facts.dev.ops.take(np.flatnonzero(work))


def _gaps(facts: Facts, us: _Clock) -> list[TraceMark]:
    """The longest idle gaps of the steady steps, each named by its main cause."""
    scope, dev = facts.scope, facts.dev
    if dev is None or scope.start.size == 0:
        return []
    pieces = facts.idle
    length = pieces.end - pieces.start
    steady = np.flatnonzero(scope.kept[pieces.window] & (length > 0))
    longest = np.sort(steady[np.argsort(-length[steady], kind="stable")[:MAX_GAPS]])
    out = []
    for k in longest.tolist():
        # Causes under 1% of the gap are left out of its words.
        causes = sorted(
            ((c, float(v[k])) for c, v in pieces.causes.items() if v[k] >= 0.01 * length[k]),
            key=lambda x: -x[1],
        )
        main = causes[0][0] if causes else "other"
        out.append(
            TraceMark(
                track="idle gaps",
                name=f"idle: {main.replace('_', ' ')}",
                ts_us=us(int(pieces.start[k])),
                dur_us=int(length[k]) / 1e3,
                detail=", ".join(f"{c.replace('_', ' ')} {duration(v * 1e-9)}" for c, v in causes),
            )
        )
    return out


def _critical_path(facts: Facts, diagnosis: Diagnosis, us: _Clock) -> list[TraceMark]:
    """The critical path through the step the timeline draws, at its replayed times."""
    path, timeline = diagnosis.critical_path, diagnosis.timeline
    labels = facts.scope.labels
    if path is None or timeline is None or timeline.step not in labels:
        return []
    base = int(facts.scope.start[labels.index(timeline.step)])
    detail = (
        f"critical path of {timeline.step}, replayed on its dependency graph "
        f"({path.replay_error:+.1%} from the measured step)"
    )
    return [
        TraceMark(
            track="critical path",
            name=seg.category,
            ts_us=us(base + round(seg.start_s * 1e9)),
            dur_us=(seg.end_s - seg.start_s) * 1e6,
            detail=detail,
        )
        for seg in path.timeline
    ]
