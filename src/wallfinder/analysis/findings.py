"""Findings: symptom → cause → fix, each with its evidence and the most it can gain.

Each rule is a small function over one rank's `Facts` returning a `Finding` or None,
registered with `@rule(Facts, id=..., replay=..., work=...)` (analysis/rules.py) in the module
of its topic (analysis/topics/). This module holds what they share: the `Facts`, the Amdahl
bound, the finding's common form and the host calls' helpers, and `find`, which runs them. A
finding's `share` is the part of the step it can remove at most, and `max_speedup` the
Amdahl bound 1 / (1 − share): what fixing it could give if that share went to zero (or, where
stated, to what the device's faster path would take).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property, wraps
from typing import TypeVar, cast

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import communication_ops
from wallfinder.analysis.critpath import WhatIf, with_replay
from wallfinder.analysis.dispatch import DispatchSummary
from wallfinder.analysis.gpu import DeviceOps, IdlePieces, idle_pieces
from wallfinder.analysis.intervals import Coverage, in_windows
from wallfinder.analysis.phases import Attribution, user_frames
from wallfinder.analysis.roofline import enclosing
from wallfinder.analysis.rules import evaluate
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.thresholds import Thresholds
from wallfinder.diagnosis import (
    Breakdown,
    Finding,
    FusionCandidate,
    MemoryProfile,
    Parallelism,
    Roofline,
    Serving,
    Steps,
    Wall,
)
from wallfinder.trace import Events, Kind, Trace
from wallfinder.units import ms, short_frame

T = TypeVar("T")


class Facts(msgspec.Struct, frozen=True, dict=True):  # dict: the cached properties
    """What the rules look at: one rank's scope (the trace, its device ops, the steady-state
    windows, the peaks and the thresholds) and the analyses already made."""

    scope: Scope
    steps: Steps
    breakdown: Breakdown
    roofline: Roofline | None
    fusion: list[FusionCandidate]
    cpu_dispatch: DispatchSummary | None = None  # CPU-only traces: the dispatch-sized ops
    memory: MemoryProfile | None = None
    whatif: WhatIf | None = None  # the step's dependency graph, to replay a fix on
    attribution: Attribution | None = None
    """Each unit of work's phase and module (`phases.attribute`)."""
    main_thread: int | None = None
    """The CPU as the device: the thread (`thread_key`) whose time is the step's."""
    serving: Serving | None = None
    """An LLM serving trace's engine iterations (`serving.serving`; None: not one)."""
    parallelism: Parallelism | None = None
    """The job's parallel strategies seen in this rank's trace (None: none, or not known)."""
    memo: dict[Callable[[Facts], object], object] = msgspec.field(default_factory=dict)
    """What `once` computed: shared by a rank's facts without the what-if graph (the critical
    path's levers are selected from them) and with it (the findings)."""

    def strategies(self) -> frozenset[str]:
        """The names of the strategies seen ("DDP", "FSDP", "TP", ...)."""
        p = self.parallelism
        return frozenset(s.name for s in p.strategies) if p is not None else frozenset()

    @property
    def trace(self) -> Trace:
        return self.scope.trace

    @property
    def dev(self) -> DeviceOps | None:
        return self.scope.dev

    @property
    def inside(self) -> npt.NDArray[np.bool_]:
        """Per device op: inside a steady-state step."""
        return self.scope.inside

    @property
    def thresholds(self) -> Thresholds:
        return self.scope.thresholds

    @property
    def steady(self) -> float:
        """The share of the step that recurs: all of it but the one-off start-up the GPU
        waited for inside the steady-state steps (idle cause `startup`: first launches
        loading kernel code)."""
        return max(1.0 - self.breakdown.idle_causes.get("startup", 0.0), 1e-9)

    def share(self, part: float) -> float:
        """`part`, a share of the measured step, as a share of its recurring time: what a
        fix can remove from every later step, which its Amdahl bound is over."""
        return min(part / self.steady, 1.0)

    @property
    def step_s(self) -> float:
        """The recurring step, seconds: the mean steady-state step less its one-off
        start-up."""
        return self.breakdown.per_step_ms["step"] / 1e3 * self.steady

    def per_step(self, count: int) -> float:
        return count / max(self.steps.count, 1)

    @cached_property
    def busy(self) -> Coverage:
        """The device's busy time: the union of its ops over all streams (traces with a
        device), found once for the rules that read the idle gaps."""
        assert self.dev is not None
        return Coverage.of(self.dev.ops.ts, self.dev.ops.end)

    @cached_property
    def idle(self) -> IdlePieces:
        """The device's idle stretches in every step window, each with its time by cause: the
        pieces the breakdown's idle causes sum (traces with a device and steps)."""
        assert self.dev is not None
        s = self.scope
        return idle_pieces(self.trace, self.dev, s.start, s.end, self.thresholds.slack)

    @property
    def hideable(self) -> float:
        """The share of the step that communication could still hide behind: the compute no
        collective runs beside yet. Hidden, a collective runs beside compute, and only beside
        compute it does not already run beside: the step cannot become shorter than its
        communication or its compute."""
        b = self.breakdown
        return self.share(max(b.compute - b.comm_hidden, 0.0))

    @cached_property
    def comm_codes(self) -> npt.NDArray[np.int32]:
        """The codes of the names the communication patterns call collectives."""
        return communication_ops(self.trace)

    def once(self, compute: Callable[[Facts], T]) -> T:
        """`compute(self)`, computed on the first call and kept for every later one: for
        what several rules, their claims and their what-if levers all derive from the facts
        (a strategy's collectives, a pipeline's schedule). `compute` is a module-level
        function of the facts alone, and never reads `whatif`: what it returns is kept for
        the rank's facts with the graph and without (`memo`)."""
        memo = self.memo
        if compute not in memo:
            memo[compute] = compute(self)
        return cast(T, memo[compute])

    @cached_property
    def user_frames(self) -> Events:
        """Python frames of the user's code (traces recorded with stacks), found once for
        every rule that names call sites."""
        return user_frames(self.trace)


def once_per_facts(compute: Callable[[Facts], T]) -> Callable[[Facts], T]:
    """`compute` computed once per `Facts` (`Facts.once`): a helper that several rules call."""

    @wraps(compute)
    def memoised(f: Facts) -> T:
        return f.once(compute)

    return memoised


def amdahl(share: float) -> float:
    """The most a fix that removes `share` of the step can speed it up."""
    return 1.0 / max(1.0 - min(share, 0.999), 1e-3)


def make_finding(
    f: Facts,
    id: str,
    wall: Wall,
    title: str,
    share: float,
    evidence: str,
    fix: str,
    *,
    speedup: float,
    reach: float | None = None,
) -> Finding | None:
    if share < f.thresholds.time.min_share:
        return None
    return Finding(
        id=id,
        wall=wall,
        title=title,
        share=share,
        max_speedup=speedup,
        evidence=evidence,
        fix=fix,
        reach=reach,
    )


def ms_text(seconds: float) -> str:
    return f"{ms(seconds)} ms"


NO_ROWS: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)
"""A rule's evidence where the trace has no device ops to mark."""

Names = Sequence[str] | Callable[[str], bool]
"""Host calls by their names, or by a test of their names (`classify.is_data_loading`)."""


def name_codes(trace: Trace, names: Names) -> npt.NDArray[np.int32]:
    """The codes of the trace's strings that `names` names."""
    if callable(names):
        return trace.names_matching(names)
    return trace.codes_of(names)


def call_sites(f: Facts, names: Names, kinds: tuple[Kind, ...]) -> str:
    """Where the named ops are called from: the innermost user-code Python frame around them
    (traces recorded with_stack=True), most frequent first; "" without stacks."""
    user = f.user_frames
    if len(user) == 0:
        return ""
    ops = f.trace.named(kinds, name_codes(f.trace, names))
    ops = ops.take(np.flatnonzero(in_windows(ops.ts, f.scope.window_start, f.scope.window_end)))
    if len(ops) == 0:
        return ""
    rows = enclosing(user, ops.thread, ops.ts)
    rows = rows[rows >= 0]
    if rows.size == 0:
        return ""
    sites, counts = np.unique(user.name[rows], return_counts=True)
    top = np.argsort(-counts)[:3]
    listed = ", ".join(
        f"{short_frame(f.trace.strings[int(sites[i])])} ×{f.per_step(int(counts[i])):.0f}/step"
        for i in top.tolist()
    )
    return f"; called from {listed}"


def host_calls(f: Facts, names: tuple[str, ...]) -> list[tuple[str, float, float]]:
    """(name, calls per step, seconds per step) of the named host ops and runtime calls that
    start inside the steady-state steps, most frequent first."""
    out = []
    for name in names:
        code = f.trace.code_of(name)
        if code < 0:
            continue
        rows = f.trace.named((Kind.CPU_OP, Kind.RUNTIME), np.array([code], dtype=np.int32))
        inside = in_windows(rows.ts, f.scope.window_start, f.scope.window_end)
        if not inside.any():
            continue
        seconds = float(rows.dur[inside].sum()) * 1e-9 / max(f.steps.count, 1)
        out.append((name, f.per_step(int(inside.sum())), seconds))
    out.sort(key=lambda x: -x[1])
    return out


def named_rows(f: Facts, names: list[str]) -> npt.NDArray[np.bool_]:
    """The steady steps' device ops with one of these names."""
    assert f.dev is not None
    return f.inside & np.isin(f.dev.ops.name, f.trace.codes_of(names))


def where_calls(f: Facts, names: Names) -> str:
    """Where the named host calls in the steady-state steps sit."""
    a = f.attribution
    if a is None:
        return ""
    calls = calls_in_steps(f, names)
    return a.where_calls(calls.thread, calls.ts) if len(calls) else ""


def calls_in_steps(
    f: Facts, names: Names, kinds: tuple[Kind, ...] = (Kind.CPU_OP, Kind.RUNTIME)
) -> Events:
    """The named host ops and runtime calls (`kinds`) that start in a steady-state step's
    host span."""
    calls = f.trace.named(kinds, name_codes(f.trace, names))
    spans, kept = f.scope.spans, f.scope.kept
    return calls.take(
        np.flatnonzero(in_windows(calls.ts, spans.cpu_start[kept], spans.cpu_end[kept]))
    )


def find(facts: Facts) -> list[Finding]:
    """Every rank rule's finding, in the rules' order, each time finding with its gain
    replayed where its rule declares how (`rank` orders them for a wall)."""
    limit = facts.thresholds.time.replay_error
    return [
        with_replay(facts.whatif, x, limit) if x.saves == "time" else x
        for x in evaluate(facts, facts.scope.views)
    ]


def rank(found: list[Finding], wall: Wall) -> list[Finding]:
    """`found` (in the rules' order, which breaks ties), the findings that move `wall` first,
    each group by bound on gain."""
    return sorted(found, key=lambda x: (x.wall != wall, -x.max_speedup))
