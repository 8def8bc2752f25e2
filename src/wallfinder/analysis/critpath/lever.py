"""A parallel strategy's lever on the graph: the work each lever changes, selected by the rule
whose fix it is (`@lever` in the rule's topic module), and what it takes off each node.

- `microbatches` (pipeline): the stage's bubble waits, the schedule's (p−1)/(m+p−1) of the
  step: with M microbatches for the same batch, each microbatch's stage time is m/M of the
  measured one, and so is the bubble (p−1 of them); the wait beyond the schedule's bubble (the
  transfers' own time, a slower neighbour) stays.
- `prefetch` (FSDP/ZeRO-3) and `async-tp` (tensor parallel): each collective of the lever runs
  beside the compute before it (the previous unit's, the layer's matmuls) instead of after it;
  it hides at most that compute's time, taken once (a collective is prefetched one unit ahead,
  not two).
- `units-merged` (FSDP/ZeRO-3): each group of K adjacent units' collectives (of one kind, in
  one phase of a step) becomes one, which pays one fixed cost instead of K: every collective
  but the first of its group loses its fixed cost, estimated by its rule as its time less its
  bytes at the link's peak (its transfer stays: the merged collective moves the same bytes).

The graph is then replayed with those nodes' weights cut: the rest of the step (what waited
for them, what they waited for) follows from its edges."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.critpath.change import Change, levers_of
from wallfinder.analysis.critpath.model import CATEGORIES, F64, I64, StepGraph
from wallfinder.analysis.gpu import COMM, COPY
from wallfinder.analysis.intervals import Coverage
from wallfinder.analysis.rules import rules_for
from wallfinder.analysis.scope import Scope
from wallfinder.trace import Events


class LeverWork(msgspec.Struct, frozen=True, eq=False):
    """The work a lever changes, as the rule whose fix it is selects it from the trace."""

    ops: npt.NDArray[np.bool_] | None = None
    """A mask over the device's ops (`DeviceOps.ops`); None: the CPU as the device."""
    host: Coverage | None = None
    """The CPU as the device: the main thread's time in the lever's collectives (its calls
    and the host gaps between them)."""
    beside: Coverage | None = None
    """The CPU as the device: the lever's collectives on the process's other threads, the
    main thread's wait where it records nothing (its host gaps); None: none."""
    microbatches: int = 0
    """The pipeline's m, as the trace shows it (0: not a pipeline lever)."""
    bubble_ns: float = 0.0
    """The pipeline's bubble per step the schedule explains (its theory's share of the step,
    at most the stage's wait): the part of the waits that more microbatches shrink."""
    fixed_ns: F64 | None = None
    """Per device op: the fixed cost (ns) a merged collective no longer pays (units merged;
    0 outside the lever's ops)."""
    merge_pos: I64 | None = None
    """Per device op: its place in its run of adjacent units' collectives (0, 1, 2, ...; the
    first of every K keeps its fixed cost)."""


def on_host(*evs: Events, main: int | None, **pipeline: Any) -> LeverWork:
    """A CPU trace's lever work from its collectives' ranges or calls `evs`: the main
    thread's (`main`; None: all of them) and its process's other threads' (`pipeline`: the
    pipeline's m and bubble)."""
    ts = np.concatenate([e.ts for e in evs])
    end = np.concatenate([e.end for e in evs])
    thread = np.concatenate([e.thread for e in evs])
    here = np.ones(ts.size, dtype=bool) if main is None else thread == main
    others = ~here
    return LeverWork(
        host=Coverage.of(ts[here], end[here]),
        beside=Coverage.of(ts[others], end[others]) if others.any() else None,
        **pipeline,
    )


Select = Callable[[Any], "LeverWork | None"]
SELECTORS: dict[str, Select] = {}
"""Per lever (a name in `change.LEVERS`): the function of a rank's facts that selects its
work (None: the trace shows none), registered by the rule whose fix the lever is."""


def lever(name: str) -> Callable[[Select], Select]:
    """Register the decorated function as the selector of lever `name`'s work."""

    def register(select: Select) -> Select:
        SELECTORS[name] = select
        return select

    return register


class Cuts(msgspec.Struct, frozen=True, eq=False):
    """What a lever takes off each node of a graph (ns): per op, per call's cost, per call's
    host gap before it."""

    op: F64
    call: F64
    gap: F64
    microbatches: int = 0
    """A pipeline lever's m: its cuts are the bubble, of which M microbatches leave m/M."""
    merge_pos: I64 | None = None
    """Units merged: per op, its place in its run of collectives (`LeverWork.merge_pos`);
    `op` is then each op's fixed cost, cut where it is not the first of its group of K."""

    def at(self, change: Change) -> Cuts:
        """The cuts under `change` (a pipeline's with its M: 0, twice m; units merged with
        its K: 0, two)."""
        if self.merge_pos is not None:
            k = change.units_merged or 2
            return Cuts(np.where(self.merge_pos % k != 0, self.op, 0.0), self.call, self.gap)
        if not self.microbatches:
            return self
        m = self.microbatches
        want = change.microbatches or 2 * m
        # (Fewer microbatches than m grow the bubble: a negative cut lengthens the waits.)
        f = 1.0 - m / want
        return Cuts(self.op * f, self.call * f, self.gap * f)

    @staticmethod
    def none(g: StepGraph) -> Cuts:
        return Cuts(np.zeros(g.dur.size), np.zeros(g.gap.size), np.zeros(g.gap.size))

    def __add__(self, other: Cuts) -> Cuts:
        return Cuts(self.op + other.op, self.call + other.call, self.gap + other.gap)


def lever_cuts(g: StepGraph, scope: Scope, work: LeverWork) -> Cuts | None:
    """What a lever (its `work`) takes off `g`'s nodes (its full change: a pipeline's at M = ∞,
    scaled by `Cuts.at`); None where the graph holds none of its work."""
    steps_at = scope.start[np.flatnonzero(scope.kept)]
    if work.ops is not None and scope.dev is not None and g.dur.size:
        ts = scope.dev.ops.ts[g.row] - g.t0
        lever = work.ops[g.row]
        lever_op = np.where(lever, g.dur, 0).astype(np.float64)
        compute = np.where(~lever & (g.cls != COMM) & (g.cls != COPY), g.dur, 0).astype(float)
        step = np.searchsorted(steps_at - g.t0, ts, "right")
        zeros = np.zeros(g.gap.size)
        if not lever.any():
            return None
        if work.microbatches:
            return _bubble(g, lever_op, zeros, zeros, work)
        if work.fixed_ns is not None and work.merge_pos is not None:
            fixed = np.where(lever, np.minimum(work.fixed_ns[g.row], g.dur), 0.0)
            return Cuts(fixed.astype(np.float64), zeros, zeros, merge_pos=work.merge_pos[g.row])
        order = np.argsort(ts, kind="stable")
        cut = np.zeros(g.dur.size)
        cut[order] = hidden_by_compute(lever_op[order], compute[order], step[order])
        return Cuts(cut, zeros, zeros)
    if work.host is None or g.call_ts is None:
        return None
    c_ts = g.call_ts
    c_end = c_ts + np.maximum(-g.offset, 0) + g.cost
    base = g.t0
    # The main thread's ops while a collective runs on another thread are compute beside
    # it, not a wait: the other threads' collectives count in its host gaps alone.
    in_call = work.host.covered(base + c_end - g.cost, base + c_end).astype(np.float64)
    either = work.host if work.beside is None else Coverage.union(work.host, work.beside)
    in_gap = either.covered(base + c_ts - g.gap, base + c_ts).astype(np.float64)
    if not (in_call.any() or in_gap.any()):
        return None
    if work.microbatches:
        return _bubble(g, np.zeros(g.dur.size), in_call, in_gap, work)
    comm = (
        g.call_cat == CATEGORIES.index("communication")
        if g.call_cat is not None
        else np.zeros(g.gap.size, dtype=bool)
    )
    # (A collective outside the lever's work hides nothing, and no call hides its own wait.)
    compute = np.where(comm, 0.0, g.cost - in_call)
    step = np.searchsorted(steps_at - g.t0, c_ts, "right")
    # A call's host gap comes before it, and its own cost's collective before its compute.
    n = g.gap.size
    lever_t = np.stack([in_gap, in_call], axis=1).ravel()
    compute_t = np.stack([np.zeros(n), compute], axis=1).ravel()
    hidden = hidden_by_compute(lever_t, compute_t, np.repeat(step, 2)).reshape(n, 2)
    return Cuts(np.zeros(g.dur.size), hidden[:, 1], hidden[:, 0])


def _bubble(g: StepGraph, op: F64, call: F64, gap: F64, work: LeverWork) -> Cuts:
    """The pipeline's cuts at M = ∞: of each wait, the share the schedule's bubble explains
    (`bubble_ns` over the waits' time per step, at most all of it)."""
    per_step = (float(op.sum()) + float(call.sum()) + float(gap.sum())) / max(g.steps, 1)
    explained = min(work.bubble_ns / per_step, 1.0) if per_step > 0 else 0.0
    return Cuts(op * explained, call * explained, gap * explained, work.microbatches)


def hidden_by_compute(lever: F64, compute: F64, step: npt.NDArray[np.intp]) -> F64:
    """Per item in time order: of its lever time (`lever`), what the compute before it can
    hide: the compute since the lever's previous stretch (`compute`), within the step, taken
    once (what one stretch hides, the next does not hide again)."""
    out = np.zeros(lever.size)
    avail = 0.0
    after_lever = False
    last_step = -1
    for i in np.flatnonzero((lever > 0) | (compute > 0)).tolist():
        if int(step[i]) != last_step:
            avail, after_lever, last_step = 0.0, False, int(step[i])
        if lever[i] > 0:
            take = min(float(lever[i]), avail)
            out[i] = take
            avail -= take
            after_lever = True
        if compute[i] > 0:
            if after_lever:
                # The compute after a stretch is the next stretch's to hide behind.
                avail, after_lever = 0.0, False
            avail += float(compute[i])
    return out


def changed(cuts: dict[str, Cuts], change: Change) -> Cuts | None:
    """The cuts of every lever `change` pulls (None: it pulls none, or the graph holds none
    of their work)."""
    parts = [cuts[n].at(change) for n in levers_of(change) if n in cuts]
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def selected(facts: Any, name: str) -> LeverWork | None:
    """Lever `name`'s work in a rank's `facts` (None: no rule selects it, or the trace shows
    none); a selector that fails is said as not computed (`what-if NAME`)."""
    rules_for(type(facts))  # (the topic modules register their selectors when imported)
    select = SELECTORS.get(name)
    if select is None:
        return None
    scope: Scope = facts.scope
    return scope.views.compute(f"what-if {name}", lambda: select(facts))
