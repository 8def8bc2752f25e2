"""What moved between two diagnoses: `diff(before, after) -> DiagnosisDiff` (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePath
from typing import Literal

from wallfinder.diagnosis import (
    MEMORY_CATEGORIES,
    BytesChange,
    CategoryChange,
    DeviceMemoryProfile,
    Diagnosis,
    DiagnosisDiff,
    FindingChange,
    MatchCount,
    MemoryChange,
    MfuChange,
    NameChange,
    PartChange,
    StepChange,
    VerdictChange,
)
from wallfinder.trace import reader_named
from wallfinder.units import pct

__all__ = ["TOP_MOVED", "diff", "run_names"]

TOP_MOVED = 10
"""Matched ops and kernels kept in `moved`, largest change first."""

PARTS = ("compute", "comm_exposed", "copy_exposed", "idle")

_Kind = Literal["op", "kernel", "cpu_op"]

_Rows = dict[tuple[str, str | None], float]
"""(name, shapes or None) -> seconds per steady-state step."""


def diff(
    before: Diagnosis, after: Diagnosis, *, names: tuple[str, str] | None = None
) -> DiagnosisDiff:
    """Compare two diagnoses: step time (with a noise judgement), the breakdown side by side,
    the verdict, findings resolved / new / remaining, the ops and kernels whose time per step
    moved most, MFU, and memory when both runs profiled it. What cannot be compared is said in
    `notes`, never hidden. `names`: what to call the runs (`run_names` of the paths they were
    read from); else each diagnosis's source, its trace's file name."""
    notes: list[str] = []
    same_basis = before.breakdown.basis == after.breakdown.basis
    if not same_basis:
        notes.append(
            f"one run is CPU-only and the other has GPU kernels ({before.breakdown.basis} before, "
            f"{after.breakdown.basis} after): the breakdowns measure different things (CPU "
            "time vs GPU time) and kernels cannot be matched; only step time is comparable"
        )
    elif device_key(before) != device_key(after):
        notes.append(
            f"different devices ({before.device.name or 'unknown'} before, "
            f"{after.device.name or 'unknown'} after): the changes mix what was changed in the "
            "job with the change of hardware"
        )
    if before.trace_format != after.trace_format:
        notes.append(_formats_note(before.trace_format, after.trace_format))
    if before.steps.source != after.steps.source:
        notes.append(
            f"steps were found differently ({before.steps.source!r} before, "
            f"{after.steps.source!r} after): step times may not cover the same work"
        )
    moved, matches = _moved(before, after, same_basis)
    if same_basis and matches and all(m.matched == 0 for m in matches):
        notes.append("no op or kernel name appears in both runs: nothing to match")
    memory = _memory(before, after, notes)
    return DiagnosisDiff(
        before_source=names[0] if names else before.source,
        after_source=names[1] if names else after.source,
        before_device=before.device.name,
        after_device=after.device.name,
        basis_before=before.breakdown.basis,
        basis_after=after.breakdown.basis,
        steps=_steps(before, after),
        breakdown=_breakdown(before, after),
        verdict=VerdictChange(
            before_wall=before.verdict.wall,
            before_cause=before.verdict.cause,
            after_wall=after.verdict.wall,
            after_cause=after.verdict.cause,
            moved=(before.verdict.wall, before.verdict.cause)
            != (after.verdict.wall, after.verdict.cause),
        ),
        findings=_findings(before, after),
        moved=moved,
        matches=matches,
        mfu=MfuChange(
            before=before.mfu.value,
            after=after.mfu.value,
            change=None
            if before.mfu.value is None or after.mfu.value is None
            else after.mfu.value - before.mfu.value,
            basis_before=before.mfu.basis,
            basis_after=after.mfu.basis,
        ),
        notes=notes,
        memory=memory,
    )


def run_names(before: str, after: str) -> tuple[str, str]:
    """What to call two runs given by their paths: the fewest last parts of each that tell
    them apart. Files named alike (`demo/trace_rank0.json`, `demo-fixed/trace_rank0.json`)
    are named with their folders; files named apart, by their names alone."""
    a, b = PurePath(before).parts, PurePath(after).parts
    k = 1
    # One file twice: its name (never the whole path, which names the machine).
    while a != b and k < max(len(a), len(b)) and a[-k:] == b[-k:]:
        k += 1
    return str(PurePath(*a[-k:])), str(PurePath(*b[-k:]))


def _format_title(name: str) -> str:
    """What a trace of the format `name` is, in words (its reader's title), else the name."""
    reader = reader_named(name)
    return reader.title if reader is not None else name


def _formats_note(before: str, after: str) -> str:
    """Which figures an Nsight Systems capture and a torch.profiler trace share."""
    names = (_format_title(before), _format_title(after))
    return (
        f"{names[0]} before, {names[1]} after: comparable are the step time (when both mark "
        "the same steps), the GPU breakdown (compute, exposed communication and copies, idle), "
        "the idle causes read from launch calls, and kernel times matched by name; not "
        "comparable are the op-level figures (ops, shapes, dtypes, roofline, MFU and the "
        "findings built on them), which Nsight Systems does not record"
    )


def device_key(d: Diagnosis) -> tuple[str, str | None]:
    """What two runs must share to have run on the same hardware: the kind and the spec
    matched (else the device's name)."""
    return d.device.kind, d.device.matched_spec or d.device.name


def _steps(before: Diagnosis, after: Diagnosis) -> StepChange:
    b, a = before.steps, after.steps
    change_s = a.median_s - b.median_s
    # Two standard deviations of the noisier run: a change smaller than that could be the
    # runs' own variation. (The min-max range would let one spike hide any change.)
    noise_s = 2 * max(b.cv * b.mean_s, a.cv * a.mean_s)
    within = abs(change_s) <= noise_s
    spread = (
        f"2 x the larger step standard deviation: {noise_s * 1e3:.3g} ms; CV "
        f"{pct(b.cv)} before, {pct(a.cv)} after"
    )
    if min(b.count, a.count) < 2:
        note = "one steady-state step on a side: no spread to judge the change against"
        within = change_s == 0
    else:
        where = "within" if within else "beyond"
        than = "no larger" if within else "larger"
        note = (
            f"{where} the noise: the change ({abs(change_s) * 1e3:.3g} ms) is {than} than "
            f"the steps' spread ({spread})"
        )
    return StepChange(
        before_s=b.median_s,
        after_s=a.median_s,
        change_s=change_s,
        change=change_s / b.median_s if b.median_s > 0 else 0.0,
        speedup=b.median_s / a.median_s if a.median_s > 0 else None,
        cv_before=b.cv,
        cv_after=a.cv,
        noise_s=noise_s,
        within_noise=within,
        note=note,
    )


def _breakdown(before: Diagnosis, after: Diagnosis) -> list[PartChange]:
    step_b = before.breakdown.per_step_ms.get("step", before.steps.mean_s * 1e3) * 1e-3
    step_a = after.breakdown.per_step_ms.get("step", after.steps.mean_s * 1e3) * 1e-3

    def row(part: str, fb: float, fa: float) -> PartChange:
        return PartChange(part=part, before=fb, after=fa, before_s=fb * step_b, after_s=fa * step_a)

    rows = [row(p, getattr(before.breakdown, p), getattr(after.breakdown, p)) for p in PARTS]
    causes_b, causes_a = before.breakdown.idle_causes, after.breakdown.idle_causes
    causes = list(causes_b) + [c for c in causes_a if c not in causes_b]
    rows += [row(f"idle:{c}", causes_b.get(c, 0.0), causes_a.get(c, 0.0)) for c in causes]
    return rows


def _findings(before: Diagnosis, after: Diagnosis) -> list[FindingChange]:
    return _by_id(
        {f.id: (f.title, f.share) for f in before.findings},
        {f.id: (f.title, f.share) for f in after.findings},
    )


def _by_id(
    b: dict[str, tuple[str, float | None]], a: dict[str, tuple[str, float | None]]
) -> list[FindingChange]:
    """Findings (id -> title, share) matched by id: resolved, then new, then remaining; each
    by share, largest first (the title is the newer one)."""
    rows = [
        FindingChange(
            id=i,
            title=a[i][0] if i in a else title,
            status="remaining" if i in a else "resolved",
            share_before=share,
            share_after=a[i][1] if i in a else None,
        )
        for i, (title, share) in b.items()
    ]
    rows += [
        FindingChange(id=i, title=title, status="new", share_before=None, share_after=share)
        for i, (title, share) in a.items()
        if i not in b
    ]
    order = {"resolved": 0, "new": 1, "remaining": 2}
    return sorted(rows, key=lambda r: (order[r.status], -(r.share_before or r.share_after or 0)))


def _memory(before: Diagnosis, after: Diagnosis, notes: list[str]) -> MemoryChange | None:
    """Memory before and after on the analysed device (the first of each profile); a note
    instead when only one run profiled memory or they profiled different devices."""
    b, a = before.main_memory, after.main_memory
    if b is None and a is None:
        return None
    if b is None or a is None:
        which = "before" if a is None else "after"
        notes.append(
            f"only the run {which} has a memory profile ([memory] events, recorded with "
            "profile_memory=True): memory cannot be compared"
        )
        return None
    if b.device != a.device:
        notes.append(
            f"memory was profiled on different devices ({b.device} before, {a.device} after): "
            "memory cannot be compared"
        )
        return None
    return MemoryChange(
        device=b.device,
        peak_allocated=_bytes_change(b.peak_allocated, a.peak_allocated),
        peak_reserved=_bytes_change(b.peak_reserved, a.peak_reserved),
        categories=_categories(b, a),
        leak_before=b.leak,
        leak_after=a.leak,
        growth_per_step_before=b.growth_per_step,
        growth_per_step_after=a.growth_per_step,
        findings=_by_id(_memory_findings(before), _memory_findings(after)),
    )


def _bytes_change(before: int, after: int) -> BytesChange:
    change = after - before
    return BytesChange(
        before=before,
        after=after,
        change_bytes=change,
        change=change / before if before > 0 else None,
    )


def _categories(b: DeviceMemoryProfile, a: DeviceMemoryProfile) -> list[CategoryChange]:
    """Bytes live at the peak by category (those on either side), largest move first; equal
    moves keep the order of MEMORY_CATEGORIES, then of first appearance."""
    names = list(dict.fromkeys([*MEMORY_CATEGORIES, *b.categories, *a.categories]))
    rows = [
        CategoryChange(
            category=c,
            before=b.categories.get(c, 0),
            after=a.categories.get(c, 0),
            change_bytes=a.categories.get(c, 0) - b.categories.get(c, 0),
        )
        for c in names
        if c in b.categories or c in a.categories
    ]
    return sorted(rows, key=lambda r: -abs(r.change_bytes))


def _memory_findings(d: Diagnosis) -> dict[str, tuple[str, float | None]]:
    """Memory findings by id, with no share: they free bytes at the peak, not step time."""
    return {f.id: (f.title, None) for f in (d.memory.findings if d.memory else [])}


def _moved(
    before: Diagnosis, after: Diagnosis, same_basis: bool
) -> tuple[list[NameChange], list[MatchCount]]:
    if not same_basis:
        return [], []
    kinds: list[tuple[_Kind, _Rows, _Rows]] = []
    roof = before.roofline is not None and after.roofline is not None
    if before.cpu is not None and after.cpu is not None:
        # On the CPU the costed ops are CPU ops too: an op the roofline lists by shapes is
        # matched there, shape by shape, and not again by name alone (the same time twice).
        costed = {name for name, _ in (*_roof_ops(before), *_roof_ops(after))} if roof else set()
        kinds.append(("cpu_op", _cpu_ops(before, costed), _cpu_ops(after, costed)))
    else:
        kinds.append(("kernel", _kernels(before), _kernels(after)))
    if roof:
        kinds.append(("op", _roof_ops(before), _roof_ops(after)))
    moved: list[NameChange] = []
    matches: list[MatchCount] = []
    for kind, rb, ra in kinds:
        both = [k for k in rb if k in ra]
        matches.append(
            MatchCount(
                kind=kind,
                matched=len(both),
                before_only=len(rb) - len(both),
                after_only=len(ra) - len(both),
            )
        )
        moved += [
            NameChange(
                kind=kind,
                name=name,
                shapes=shapes,
                before_s=rb[name, shapes],
                after_s=ra[name, shapes],
                change_s=ra[name, shapes] - rb[name, shapes],
            )
            for name, shapes in both
        ]
    moved.sort(key=lambda m: (-abs(m.change_s), m.kind, m.name))
    return moved[:TOP_MOVED], matches


def _per_step(d: Diagnosis, rows: Iterable[tuple[str, str | None, float]]) -> _Rows:
    steps = max(d.steps.count, 1)
    out: _Rows = {}
    for name, shapes, time_s in rows:
        out[name, shapes] = out.get((name, shapes), 0.0) + time_s / steps
    return out


def _kernels(d: Diagnosis) -> _Rows:
    return _per_step(d, ((k.name, None, k.time_s) for k in d.kernels))


def _cpu_ops(d: Diagnosis, costed: set[str]) -> _Rows:
    """The CPU ops by name, leaving out `costed` (listed by shapes as ops)."""
    ops = [o for o in (d.cpu.top_ops if d.cpu else []) if o.name not in costed]
    return _per_step(d, ((o.name, None, o.time_s) for o in ops))


def _roof_ops(d: Diagnosis) -> _Rows:
    r = d.roofline
    ops = [*r.ops, *r.more_ops] if r is not None else []
    return _per_step(d, ((o.name, o.shapes, o.time_s) for o in ops))
