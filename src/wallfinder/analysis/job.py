"""One job from its ranks: which rank results belong to the job, and the job's diagnosis (the
lowest rank's, with a line per rank and the cross-rank view). Pure: the ranks are read and
diagnosed by `wallfinder.api`, which hands their results here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgspec

from wallfinder.analysis.collectives import RankCollectives, join
from wallfinder.analysis.thresholds import Thresholds
from wallfinder.diagnosis import Diagnosis
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
    job = join(kept, _spec_of(main), thresholds)
    findings = sorted([*job.findings, *main.findings], key=lambda f: -f.max_speedup)
    notes = [*job.summary.notes, *_missing(kept)]
    summary = (
        job.summary
        if notes == job.summary.notes
        else msgspec.structs.replace(job.summary, notes=notes)
    )
    return msgspec.structs.replace(
        main,
        ranks=job.ranks,
        findings=findings,
        warnings=[*main.warnings, *skipped],
        job=summary,
    )


def consistent_ranks(
    ranks: Sequence[tuple[Diagnosis, RankCollectives]],
) -> tuple[list[tuple[Diagnosis, RankCollectives]], list[str]]:
    """The ranks of one job: those with the most common world size (the lowest rank's job on a
    tie), one file per rank (the first by name). Returns them and what was skipped, why."""
    sizes = Counter(d.world_size for d, _ in ranks)
    first = ranks[0][0].world_size
    size = max(sizes, key=lambda s: (sizes[s], s == first))
    kept: list[tuple[Diagnosis, RankCollectives]] = []
    skipped: list[str] = []
    seen: dict[int, str] = {}
    for d, c in sorted(ranks, key=lambda r: (r[0].rank or 0, r[0].source)):
        if d.world_size != size:
            skipped.append(
                f"skipped {d.source}: another job's rank (world size {d.world_size}, not {size})"
            )
        elif d.rank is not None and d.rank in seen:
            skipped.append(f"skipped {d.source}: rank {d.rank} again (kept {seen[d.rank]})")
        else:
            if d.rank is not None:
                seen[d.rank] = d.source
            kept.append((d, c))
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
