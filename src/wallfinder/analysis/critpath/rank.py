"""A rank's critical path: its graph built, replayed unchanged and walked, the replay's
check, and the what-if table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from wallfinder.analysis.critpath.change import LEVERS, Change, default_changes
from wallfinder.analysis.critpath.drawn import drawn_at, drawn_window, in_step
from wallfinder.analysis.critpath.graph import build_graph
from wallfinder.analysis.critpath.lever import Cuts, LeverWork, lever_cuts
from wallfinder.analysis.critpath.model import MAX_ROUNDS, StepGraph
from wallfinder.analysis.critpath.onepass import Plan
from wallfinder.analysis.critpath.path import walk_path, wall_of
from wallfinder.analysis.critpath.timing import replay
from wallfinder.analysis.critpath.whatif import WhatIf
from wallfinder.analysis.pipeline import timed
from wallfinder.analysis.scope import Scope
from wallfinder.diagnosis import CriticalPath, FusionCandidate, Roofline, StepTimeline


def critical_path(
    scope: Scope,
    fusion: Sequence[FusionCandidate] = (),
    roofline: Roofline | None = None,
    changes: Sequence[Change] | None = None,
    timeline: StepTimeline | None = None,
    graph: StepGraph | None = None,
    cause: str = "",
    levers: Callable[[str], LeverWork | None] | None = None,
) -> tuple[CriticalPath | None, WhatIf | None]:
    """The steady steps' critical path, the replay check and the what-if table (`changes`, or
    the default changes for a wall of `cause`); None when the graph cannot be built. `graph`:
    the graph a device model built itself (the CPU's, `cpu_graph`); else it is built from
    the device's ops. `levers`: each strategy lever's work by name (`lever.SELECTORS`), for
    the what-ifs that pull them and the default table's rows of those the trace shows."""
    centre = None
    if timeline is not None:
        centre = int(np.searchsorted(scope.start, drawn_at(scope, timeline), "right")) - 1
    g = graph
    if g is None:
        g = timed("graph", lambda: build_graph(scope, fusion, roofline, centre), "part")
    if g is None:
        return None, None
    orders: dict[bool, Plan | None] = {}
    base = timed("replay unchanged", partial(replay, g, orders=orders), "part")
    window = drawn_window(g, scope, timeline)
    walk = timed("walk unchanged", partial(walk_path, g, base, window or (0, 0)), "part")
    shares = walk.shares()
    cuts = timed("lever cuts", lambda: _cuts(g, scope, levers), "part")
    whatif = WhatIf.of(g, base, shares, orders, cuts)
    del base  # (from here, its figures in `whatif` alone)
    drawn = in_step(walk, window)
    del walk
    notes = _notes(g, whatif, shares, scope.thresholds.time.replay_error)
    if changes is None:
        accumulates = g.accum is not None and bool(g.accum.any())
        changes = default_changes(cause, bool(g.dur.size), accumulates, tuple(whatif.cuts))
    rows = [whatif.row(c) for c in changes]
    error = (whatif.step_s - g.measured_s) / g.measured_s if g.measured_s > 0 else 0.0
    return (
        CriticalPath(
            steps=g.steps,
            measured_step_s=g.measured_s,
            replayed_step_s=whatif.step_s,
            replay_error=error,
            shares=shares,
            wall=wall_of(shares),
            host_calls=int(g.gap.size),
            device_ops=int(g.dur.size),
            event_waits=int((g.dep >= 0).sum()),
            sync_edges=int((g.drained_by >= 0).sum()),
            what_if=rows,
            notes=notes,
            timeline=drawn,
        ),
        whatif,
    )


def _cuts(
    g: StepGraph, scope: Scope, levers: Callable[[str], LeverWork | None] | None
) -> dict[str, Cuts]:
    """Per strategy lever whose work the trace shows and the graph holds, its cuts."""
    out: dict[str, Cuts] = {}
    for name in LEVERS if levers is not None else ():
        assert levers is not None
        work = levers(name)
        cuts = lever_cuts(g, scope, work) if work is not None else None
        if cuts is not None:
            out[name] = cuts
    return out


def _notes(g: StepGraph, whatif: WhatIf, shares: dict[str, float], max_error: float) -> list[str]:
    """What the critical path's notes say: how the graph was built, and how far to trust the
    replay (it stopped early, it misses the measured step, waits no edge explains)."""
    notes = list(g.notes)
    pipe = whatif.cuts.get("microbatches")
    if pipe is not None:
        m = pipe.microbatches
        notes.append(
            f"microbatches: the pipeline's m={m} made M (microbatches:M; {2 * m} by default) "
            "for the same batch: of the stage's send/recv waits, the bubble the schedule "
            "explains shrinks to m/M of itself, the rest of the step replays as measured; "
            "an estimate, which leaves out what smaller microbatches cost (more, smaller ops)"
        )
    if whatif.once_s > 0:
        notes.append(
            f"one-off start-up: {whatif.once_s * 1e3:.2f} ms per step of the host's time is "
            "inside library start-up, code loading or JIT compiles, which every replay keeps "
            "as measured (no later step pays it); the speed-ups are over the recurring time, "
            "that start-up left out of both steps, as the bounds leave it out"
        )
    if whatif.rounds >= MAX_ROUNDS:
        notes.append(f"the replay stopped after {MAX_ROUNDS} rounds: figures are approximate")
    if whatif.error > max_error:
        notes.append(
            f"the unchanged replay misses the measured step by {whatif.error:.0%}: the graph "
            "lacks dependencies the trace does not record, so the findings keep their bounds "
            "and the what-ifs are rough"
        )
    if shares["wait"] >= 0.05:
        notes.append(
            f"{shares['wait']:.0%} of the critical path is device waits no recorded edge "
            "explains (an event or stream wait on work the trace does not show, a graph's "
            "internal edges): each kept as a fixed delay after its launch or the op before "
            "it on its stream, so a fix cannot shorten them, though one that launches the "
            "work sooner moves them with it"
        )
    return notes
