"""A job's critical path: its ranks replayed together, joined at the collectives every rank
takes part in (each ending when the last rank arrives plus its transfer, each rank's work
between two of them as measured), and the path through the rank the others wait for."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from wallfinder.analysis.critpath.model import F64, NS
from wallfinder.diagnosis import CriticalPath, RankSummary, WhatIfRow


class JobReplay(msgspec.Struct, frozen=True, eq=False):
    """A job replayed across its ranks, joined at the collectives every rank takes part in: a
    collective ends on every rank when the last rank arrives plus its transfer time (the
    fastest rank's time in it), and each rank's work between two of them (its own graph
    between the joins) takes what it measured. Times are ns over the replayed span: from the
    first such collective's end to the last's."""

    measured_ns: float
    replayed_ns: float
    intervals: int
    """Collective-to-collective intervals replayed."""
    on_path_ns: F64
    """Per rank (column): the path's time in its work where it arrived last, more than
    `edge_ns` after the next rank (the others waited for it)."""
    together_ns: float
    """The path's time in work where the last ranks arrived together (no one rank waited for)."""
    transfer_ns: float
    """The path's time in the collectives' transfers."""
    work: F64
    """Intervals x ranks: each rank's work from one join's end to its arrival at the next."""
    transfer: F64
    """Per interval: the transfer time of the collective that ends it."""

    def without(self, rank: int) -> float:
        """The replayed span with rank (column) `rank`'s work brought to the median of the
        other ranks' at every interval."""
        work = self.work.copy()
        work[:, rank] = np.median(np.delete(self.work, rank, axis=1), axis=1)
        return float((work.max(axis=1) + self.transfer).sum())


def job_replay(arrive: F64, dur: F64, edge_ns: int) -> JobReplay | None:
    """The job's cross-rank replay from its matched collectives: `arrive` and `dur` are
    instances x ranks, ns on aligned clocks (NaN: the rank has no such instance); `edge_ns`:
    `SlackThresholds.edge_ns`. None when fewer than two collectives are taken part in by every
    rank."""
    full = ~np.isnan(arrive).any(axis=1) & ~np.isnan(dur).any(axis=1)
    a, d = arrive[full], dur[full]
    if a.shape[0] < 2 or a.shape[1] < 2:
        return None
    order = np.argsort(np.median(a, axis=1), kind="stable")
    a, d = a[order], d[order]
    transfer = d.min(axis=1)[1:]
    end = a + d
    # Each rank's work from the previous join's end (on its clock) to its arrival at the next
    # (negative where it arrived before that one ended: collectives on two streams).
    work = a[1:] - end[:-1]
    binding = work.max(axis=1)
    last = np.argmax(work, axis=1)
    alone = (binding - np.sort(work, axis=1)[:, -2] > edge_ns) & (binding > 0)
    return JobReplay(
        measured_ns=float(np.median(end[-1]) - np.median(end[0])),
        replayed_ns=float((binding + transfer).sum()),
        intervals=int(work.shape[0]),
        on_path_ns=np.bincount(last[alone], weights=binding[alone], minlength=a.shape[1]).astype(
            np.float64
        ),
        together_ns=float(np.maximum(binding[~alone], 0.0).sum()),
        transfer_ns=float(transfer.sum()),
        work=work,
        transfer=transfer,
    )


def job_path(
    paths: Sequence[tuple[int | None, CriticalPath | None]],
    ranks: Sequence[RankSummary],
    straggler: int | None,
    joined: JobReplay | None = None,
    steps: float = 1.0,
) -> CriticalPath | None:
    """A job's critical path. With `joined` (the cross-rank replay, its columns in the order
    of `paths`; the traces hold `steps` steps, each with the same collectives):
    the path runs through the rank whose work the others wait for most on the replayed path
    (said with each rank's share in `rank_shares`), and the "straggler" what-if brings the
    named straggler (else that rank) to the median and replays the job. Without it: the
    straggler's path (else the rank with the longest replayed step), and the what-if is an
    estimate from the join's waits (the least wait of the other ranks leaves the step)."""
    known = [(r, p) for r, p in paths if p is not None]
    if not known:
        return None
    by_rank = dict(known)
    ids = [r for r, _ in paths]
    notes: list[str] = []
    shares: dict[str, float] = {}
    if joined is not None:
        shares, late, note = _through(joined, ids)
        notes.append(note)
        alone = None if late is None else ids[late]
        if (
            late is not None
            and alone in by_rank
            and (straggler is None or straggler not in by_rank)
        ):
            straggler = alone
    if straggler is None or straggler not in by_rank:
        straggler = max(known, key=lambda x: x[1].replayed_step_s)[0]
    path = by_rank[straggler]
    saving: float | None = None
    if joined is not None:
        # The straggler at the median, replayed: the job's step loses what the span loses.
        column = ids.index(straggler)
        # Every step has the same collectives: the intervals span this many steps.
        spanned = steps * joined.intervals / (joined.intervals + 1)
        saving = (joined.replayed_ns - joined.without(column)) * NS / max(spanned, 1e-12)
    else:
        waits = sorted(r.wait_s for r in ranks if r.rank != straggler and r.wait_s is not None)
        if waits:
            notes.append(
                "across ranks: fewer than two collectives join every rank here (point-to-point, "
                "or groups with ranks whose traces are not here), so the job is not replayed "
                "across ranks: the straggler row is an estimate from the collectives' waits"
            )
            # Every other rank waits for the straggler at least the least of their waits: the
            # straggler at the median takes that off every rank's step.
            saving = waits[0]
    rows, slowest = _slowest_rows(straggler, path, known)
    if slowest:  # (before the cross-rank replay's own note, which says where the path runs)
        notes.insert(0, slowest)
    if saving is not None:
        step = max(path.measured_step_s - saving, 1e-12)
        rows.append(
            WhatIfRow(
                change="straggler",
                step_s=step,
                speedup=path.measured_step_s / step,
                wall_after=path.wall,
            )
        )
    return msgspec.structs.replace(
        path,
        rank=straggler,
        what_if=rows,
        notes=[*path.notes, *notes],
        rank_shares=shares,
    )


def _slowest_rows(
    at: int | None, path: CriticalPath, known: Sequence[tuple[int | None, CriticalPath]]
) -> tuple[list[WhatIfRow], str]:
    """The job's what-if rows: each change of `path`'s table (rank `at`'s), at the rank that
    gains least from it among the ranks that replayed it, and the note that says so ("" where
    no row moved). Every rank replays a change, the strategy levers (microbatches, prefetch,
    async TP, units merged) as the rest, on its own graph, where its waits for the other
    ranks stay as measured; the ranks meet at every step's collectives, so the job's step
    under a change is at least its slowest rank's (the cross-rank replay, `JobReplay`, takes
    each rank's work between two collectives as measured: the straggler row alone)."""
    rows: list[WhatIfRow] = []
    moved: list[str] = []
    for row in path.what_if:
        least, by = row, at
        for r, other in known:
            theirs = next((x for x in other.what_if if x.change == row.change), None)
            if theirs is not None and theirs.speedup < least.speedup:
                least, by = theirs, r
        if by != at:
            moved.append(f"{row.change} (rank {by}'s {least.speedup:.2f}x)")
            least = msgspec.structs.replace(
                least, step_s=path.measured_step_s / max(least.speedup, 1e-12)
            )
        rows.append(least)
    if not moved:
        return rows, ""
    return rows, (
        f"across ranks: each what-if is the rank that gains least from it, the job's step being "
        f"its slowest rank's (each rank replays its own graph, its waits for the others as "
        f"measured): {', '.join(moved)}"
    )


def _through(
    joined: JobReplay, ids: Sequence[int | None]
) -> tuple[dict[str, float], int | None, str]:
    """Where the cross-rank replay's path runs: each rank's share of it (by its id, else its
    column), the column of the rank that holds most of it alone (None: no rank alone), and
    the note that says so."""
    total = joined.replayed_ns or 1.0
    shares = {
        str(r if r is not None else i): float(v) / total
        for i, (r, v) in enumerate(zip(ids, joined.on_path_ns.tolist(), strict=True))
    }
    late = int(np.argmax(joined.on_path_ns))
    alone = not joined.on_path_ns[late] <= 0
    if alone:
        through = f"{shares[str(ids[late])]:.0%} through rank {ids[late]}'s work"
    else:
        through = "no rank alone (the last ranks arrive together)"
    error = (joined.replayed_ns - joined.measured_ns) / (joined.measured_ns or 1.0)
    note = (
        f"across ranks: between the {joined.intervals + 1} collectives every rank joins, "
        f"the job's path runs {through}, {joined.together_ns / total:.0%} through work "
        f"the last ranks finish together and {joined.transfer_ns / total:.0%} through "
        f"the transfers; the cross-rank replay's span is {error:+.1%} off the measured "
        "one (an estimate: each rank's work between two collectives is taken as measured)"
    )
    return shares, late if alone else None, note
