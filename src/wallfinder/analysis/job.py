"""One job from its ranks: which rank results belong to the job, and the job's diagnosis (the
lowest rank's, with a line per rank and the cross-rank view). Pure: the ranks are read and
diagnosed by `wallfinder.api`, which hands their results here."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from statistics import median

import msgspec

from wallfinder.analysis.collectives import RankCollectives, join
from wallfinder.analysis.critpath import consistent_rows, job_path, job_replay
from wallfinder.analysis.findings import rank
from wallfinder.analysis.thresholds import Thresholds
from wallfinder.analysis.views import Views
from wallfinder.diagnosis import CriticalPath, Diagnosis, Finding
from wallfinder.errors import WallfinderError
from wallfinder.hardware import DeviceSpec, get_spec

__all__ = ["RankResult", "consistent_ranks", "job_diagnosis"]

RankResult = tuple[Diagnosis, RankCollectives] | str
"""What one rank's worker sends back: its diagnosis and collective records, or why it was
skipped."""


def job_diagnosis(results: Sequence[RankResult], thresholds: Thresholds | None = None) -> Diagnosis:
    """The job's diagnosis from its ranks' results: the lowest rank's diagnosis with a line per
    rank, the cross-rank join (`job`) and its findings (by `thresholds.job`). Ranks that are
    not consistent with the job are skipped and named in `warnings`; raises `WallfinderError`
    when none is left."""
    good = [r for r in results if not isinstance(r, str)]
    skipped = [f"skipped {r}" for r in results if isinstance(r, str)]
    if not good:
        raise WallfinderError(f"no rank trace could be analysed ({'; '.join(skipped)})")
    good.sort(key=lambda r: (r[0].rank is None, r[0].rank or 0, r[0].source))
    kept, dropped = consistent_ranks(good)
    skipped += dropped
    main = kept[0][0]
    if len(kept) == 1 and dropped:
        # Not a job: the folder's traces do not agree. One trace is analysed, and the
        # warnings say which and why the rest were left out.
        alone = (
            f"the folder's traces are not one job: {main.source} is analysed alone "
            "(analyse each of the others as a file of its own)"
        )
        return msgspec.structs.replace(main, warnings=[*main.warnings, alone, *skipped])
    # The cross-rank views are optional: a bug in one leaves the lowest rank's verdict.
    views = Views(dict(main.not_computed))
    job = views.compute("collectives", lambda: join(kept, _spec_of(main), thresholds))
    if job is None:
        return msgspec.structs.replace(
            main, warnings=[*main.warnings, *skipped], not_computed=views.failed
        )
    # Ranked as a rank's are: the findings that move the verdict's wall first, each group by
    # bound (by bound alone, a 30% cast finding led a job whose wall is its 25% exposed
    # gradient reduction).
    findings = rank([*job.findings, *main.findings], main.verdict.wall)
    notes = [*job.summary.notes, *_missing(kept)]
    summary = (
        job.summary
        if notes == job.summary.notes
        else msgspec.structs.replace(job.summary, notes=notes)
    )
    straggler = summary.stragglers[0].rank if summary.stragglers else None
    path = views.compute(
        "critical path",
        lambda: job_path(
            [(d.rank, d.critical_path) for d, _ in kept],
            job.ranks,
            straggler,
            job_replay(
                job.arrive[job.joins],
                job.dur[job.joins],
                (thresholds or Thresholds()).slack.edge_ns,
            ),
            float(median([max(d.steps.total, 1) for d, _ in kept])),
        ),
    )
    if path is not None and path.rank_shares:
        findings = [_straggler_replayed(f, path) for f in findings]
    if path is not None and main.breakdown.basis == "gpu":
        # The path may be another rank's than the findings shown: one fix, one figure still.
        path = msgspec.structs.replace(path, what_if=consistent_rows(path.what_if, findings))
    return msgspec.structs.replace(
        main,
        ranks=job.ranks,
        findings=findings,
        warnings=[*main.warnings, *skipped],
        job=summary,
        critical_path=path,
        not_computed=views.failed,
    )


def _straggler_replayed(f: Finding, path: CriticalPath) -> Finding:
    """The straggler finding with its gain from the cross-rank replay (within its bound)."""
    row = next((r for r in path.what_if if r.change == "straggler"), None)
    if f.id != "straggler" or row is None:
        return f
    return msgspec.structs.replace(
        f,
        gain_basis="replay",
        replay_speedup=min(max(row.speedup, 1.0), f.max_speedup),
        wall_after=row.wall_after,
    )


_MODEL = re.compile(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b")
"""A device's model in its name: A100, H100, V100, MI250X, B200, T4 is too short on purpose
(names without a model token compare whole)."""


def _family(d: Diagnosis) -> str:
    """The kind of device a rank ran on, as far as its trace says: "gpu A100", "gpu MI250",
    "cpu"; an unnamed GPU is "gpu ?" and matches any GPU."""
    if d.device.kind == "cpu":
        return "cpu"
    name = d.device.matched_spec or d.device.name or ""
    found = _MODEL.search(name.upper())
    return f"gpu {found.group(1) if found else name or '?'}"


def _same_device(a: str, b: str) -> bool:
    return a == b or (a.startswith("gpu") and b.startswith("gpu") and "gpu ?" in (a, b))


def consistent_ranks(
    ranks: Sequence[tuple[Diagnosis, RankCollectives]],
) -> tuple[list[tuple[Diagnosis, RankCollectives]], list[str]]:
    """The ranks of one job: traces that say they are ranks (a world size), of the same world
    size and the same kind of device, one file per rank (the first by name). The job is the
    largest such group (the lowest rank's on a tie); with no trace that says it is a rank, the
    first trace alone. Returns the kept ranks and, for each skipped trace, why, in words."""
    ordered = sorted(ranks, key=lambda r: (r[0].rank is None, r[0].rank or 0, r[0].source))
    keys = Counter((d.world_size, _family(d)) for d, _ in ordered if d.world_size is not None)
    first = ordered[0][0]
    if keys:
        size, family = max(keys, key=lambda k: (keys[k], k == (first.world_size, _family(first))))
    else:
        size, family = None, _family(first)
    kept: list[tuple[Diagnosis, RankCollectives]] = []
    skipped: list[str] = []
    seen: dict[int, str] = {}
    for d, c in ordered:
        if size is None and kept:
            why = "it is not a rank of a job (its trace has no distributedInfo)"
        elif size is not None and d.world_size is None:
            why = (
                "its trace names no world size (no distributedInfo), so it cannot be a rank "
                f"of the {size}-rank job"
            )
        elif not _same_device(_family(d), family):
            why = f"it ran on {d.device.name or 'another device'}, the job on {family[4:]}"
        elif d.world_size != size:
            why = (
                f"another job's rank (world size {d.world_size}: rank {d.rank} of "
                f"{d.world_size}, the job's ranks are of {size})"
            )
        elif d.rank is not None and d.rank in seen:
            why = f"rank {d.rank} again (kept {seen[d.rank]})"
        else:
            if d.rank is not None:
                seen[d.rank] = d.source
            kept.append((d, c))
            continue
        skipped.append(f"skipped {d.source}: {why}")
    return kept, skipped


def _missing(ranks: Sequence[tuple[Diagnosis, RankCollectives]]) -> list[str]:
    world = ranks[0][0].world_size
    if world is None:
        return []
    have = {d.rank for d, _ in ranks if d.rank is not None}
    gone = [r for r in range(world) if r not in have]
    if not gone:
        return []
    listed = ", ".join(map(str, gone[:10])) + (", ..." if len(gone) > 10 else "")
    return [
        f"{len(have)} of {world} ranks have a trace here; missing: {listed} "
        "(collectives are matched among the ranks present)"
    ]


def _spec_of(d: Diagnosis) -> DeviceSpec | None:
    """The catalogue's spec for the device the rank matched; None when it matched none."""
    if d.device.matched_spec is None:
        return None
    try:
        return get_spec(d.device.matched_spec)
    except WallfinderError:
        return None
