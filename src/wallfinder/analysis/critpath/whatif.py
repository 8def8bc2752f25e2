"""What-ifs on a rank's graph: its replays on demand, the findings whose gain a replay gives,
and the what-if table kept consistent with them (one fix, one figure)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from wallfinder.analysis.critpath.change import UNCHANGED, Change, covers, parse_what_if
from wallfinder.analysis.critpath.lever import Cuts, changed
from wallfinder.analysis.critpath.model import NS, StepGraph
from wallfinder.analysis.critpath.onepass import Plan
from wallfinder.analysis.critpath.path import path_shares, wall_of
from wallfinder.analysis.critpath.timing import Timing, moves, one_pass_pays, replay
from wallfinder.analysis.pipeline import timed
from wallfinder.analysis.rules import declared
from wallfinder.diagnosis import Finding, Wall, WhatIfRow
from wallfinder.errors import WallfinderError


class WhatIf(msgspec.Struct, frozen=True, eq=False):
    """A rank's graph, its unchanged replay, and replays on demand: what the findings ask."""

    graph: StepGraph
    step_s: float
    """The unchanged replay's mean step."""
    rounds: int
    """The rounds the unchanged replay took."""
    blocked_s: float
    """The host's time per step inside synchronising calls (blocking copies included) in the
    unchanged replay: time it could not queue work, so the most that removing the syncs can
    save."""
    cuts: dict[str, Cuts] = msgspec.field(default_factory=dict)
    """Per strategy lever whose work the graph holds: what it takes off the nodes."""
    once_s: float = 0.0
    """The host's time per step inside one-off stretches (`StepGraph.once`), which every
    replay keeps as measured: left out of the speed-ups (`_gain`)."""
    _done: dict[Change, tuple[float, dict[str, float]]] = msgspec.field(default_factory=dict)
    """Each change's replayed step and path shares, replayed once: the table and the findings
    ask for several of the same changes."""
    _orders: dict[bool, Plan | None] = msgspec.field(default_factory=dict)
    """The dependency orders the graph's one passes found and their layouts, by edge set
    (see `replay`)."""

    @classmethod
    def of(
        cls,
        g: StepGraph,
        base: Timing,
        shares: dict[str, float],
        orders: dict[bool, Plan | None],
        cuts: dict[str, Cuts] | None = None,
    ) -> WhatIf:
        """The what-ifs of `g` from its unchanged replay `base` and its critical path's
        `shares`, of which only figures are kept (its per-node times are as large as the
        graph); `cuts`: the strategy levers'."""
        blocked = float((base.call_end - base.call_start)[g.sync].sum()) * NS / g.steps
        once = 0.0 if g.once is None else float((g.gap + g.cost)[g.once].sum()) * NS / g.steps
        return cls(
            g,
            base.step_s,
            base.rounds,
            blocked,
            cuts or {},
            once,
            _done={UNCHANGED: (base.step_s, shares)},
            _orders=orders,
        )

    def _gain(self, step_s: float) -> float:
        """The speed-up of a replayed step over the unchanged one, over the recurring time:
        the one-off start-up, kept as measured under every change, is left out of both (as
        the bounds leave it out)."""
        once = min(self.once_s, 0.99 * min(step_s, self.step_s))
        return (self.step_s - once) / max(step_s - once, 1e-12)

    def _outcome(self, change: Change) -> tuple[float, dict[str, float]]:
        done = self._done.get(change)
        if done is None:
            cuts = changed(self.cuts, change)
            if not moves(self.graph, change, cuts):
                # It touches nothing on this graph (no data wait to remove, no sync to drop,
                # no fused kernel here): the unchanged replay's figures, a 1.00x gain.
                done = self._done[change] = self._done[UNCHANGED]
            else:
                done = self._done[change] = timed(
                    change.label, lambda: self._replayed(change, cuts), "replay"
                )
        return done

    def _replayed(self, change: Change, cuts: Cuts | None) -> tuple[float, dict[str, float]]:
        # A change moves few edges: where the unchanged graph took more rounds than the one
        # pass costs, so will the changed one, and the one pass is taken at once.
        g = self.graph
        at_once = self.rounds > one_pass_pays(g.gap.size + g.dur.size)
        t = replay(g, change, 1 if at_once else 0, self._orders, cuts)
        return t.step_s, path_shares(g, t)

    @property
    def error(self) -> float:
        """How far the unchanged replay is from the measured step (a fraction, unsigned)."""
        g = self.graph
        return abs(self.step_s - g.measured_s) / g.measured_s if g.measured_s > 0 else 0.0

    def speedup(self, change: Change) -> tuple[float, Wall]:
        step_s, shares = self._outcome(change)
        return self._gain(step_s), wall_of(shares)

    def row(self, change: Change) -> WhatIfRow:
        step_s, shares = self._outcome(change)
        return WhatIfRow(
            change=change.label,
            step_s=step_s,
            speedup=self._gain(step_s),
            wall_after=wall_of(shares),
        )


def with_replay(whatif: WhatIf | None, finding: Finding, max_error: float) -> Finding:
    """`finding` with its gain replayed on the graph where the graph can (`replay_speedup`,
    `wall_after`), else marked as a bound (`gain_basis`): also where the unchanged replay
    misses the measured step by more than `max_error`, since that graph lacks dependencies.
    The change is the one the finding's rule declares (`rules.rule(replay=...)`)."""
    declaration = declared(finding.id)
    change = declaration.replay if declaration is not None else None
    if whatif is None or change is None or finding.saves != "time" or whatif.error > max_error:
        return msgspec.structs.replace(finding, gain_basis="bound")
    if change.host != 1.0 and whatif.graph.cost_fixed is not None:
        # On the CPU a host cut also divides the Python between ops and each op's fixed cost,
        # more than the per-op overhead finding's share: the table's `host:F` rows are that
        # fix, and the finding keeps its bound rather than a second figure for it.
        return msgspec.structs.replace(finding, gain_basis="bound")
    speedup, wall = whatif.speedup(change)
    # The replay moves what the graph holds; the Amdahl bound caps what removing the share
    # can give, so a replay above it is the graph's error, not a gain.
    speedup = min(max(speedup, 1.0), finding.max_speedup)
    return msgspec.structs.replace(
        finding, gain_basis="replay", replay_speedup=speedup, wall_after=wall
    )


def consistent_rows(rows: Sequence[WhatIfRow], findings: Sequence[Finding]) -> list[WhatIfRow]:
    """The what-if rows, each no faster than a replayed finding whose fix is the same or
    larger says (a finding's replay is capped by its Amdahl bound, the share of the step the
    breakdown gives its cause), with that finding's wall after: one fix, one figure, in the
    table and in the findings."""
    ceilings: list[tuple[Change, str, float, Wall | None]] = []
    for f in findings:
        # What each finding's rule declares: the change it replays, or the what-if it bounds.
        d = declared(f.id)
        if d is not None and d.replay is not None and f.replay_speedup is not None:
            ceilings.append((d.replay, f.id, f.replay_speedup, f.wall_after))
        if d is not None and d.bounds is not None:
            ceilings.append((d.bounds, f.id, f.max_speedup, None))
    out = []
    for r in rows:
        try:
            change = parse_what_if(r.change)[-1]
        except WallfinderError:  # a job's straggler row: not a graph change
            out.append(r)
            continue
        caps = [(s, i, w) for c, i, s, w in ceilings if covers(c, change) and s < r.speedup]
        if not caps:
            out.append(r)
            continue
        speedup, by, wall = min(caps)
        out.append(
            msgspec.structs.replace(
                r,
                speedup=speedup,
                step_s=r.step_s * r.speedup / speedup,
                capped_by=by,
                wall_after=wall or r.wall_after,
            )
        )
    return out
