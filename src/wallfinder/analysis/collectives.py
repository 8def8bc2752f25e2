"""Collectives across a job's ranks: what each rank's trace says about its collectives, and the
cross-rank join that aligns clocks, splits each collective into transfer and wait time and
finds the rank the others wait for.

`rank_collectives(trace)` runs where the trace is (a worker process, a dask worker) and returns
a `RankCollectives`: a few numpy columns with one row per collective instance, small enough to
send back. `join(ranks, spec)` is vectorised: one matrix of instances x ranks per column, no
Python loop per event or per instance.

A collective instance is an NCCL/RCCL kernel on a GPU (every version's names: `ncclKernel_*`,
`ncclDevKernel_*`, lower case), and on a CPU the backend's annotation (`gloo:all_reduce`),
which spans the collective's work on gloo's own thread. Its name, message size and process group
come from the arguments recent PyTorch releases put on the kernel (`Collective name`,
`In msg nelems`, `Out msg nelems`, `dtype`, `Group size`, `Process Group Name`), else from the
kernel's name (and the trace's default group).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import is_communication_kernel
from wallfinder.analysis.findings import amdahl
from wallfinder.analysis.rules import evaluate, rule
from wallfinder.analysis.steps import cpu_steps
from wallfinder.analysis.thresholds import JobThresholds, Thresholds
from wallfinder.analysis.verdict import job_verdict
from wallfinder.diagnosis import (
    CollectiveRow,
    Diagnosis,
    Finding,
    JobSummary,
    RankSummary,
    Straggler,
)
from wallfinder.hardware import DeviceSpec
from wallfinder.trace import Kind, Trace
from wallfinder.units import short_kernel

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

DEFAULT_GROUP = "default"
"""The group of a collective whose trace does not name one (the default process group)."""


_NOT_COLLECTIVES = frozenset({"wait", "barrier_wait", ""})
_KERNEL_OP = re.compile(r"^(?:nccl|rccl|msccl)(?:dev)?kernel_([a-z]+)", re.IGNORECASE)


class RankCollectives(msgspec.Struct, frozen=True, eq=False):
    """One rank's collective instances, one row per instance in time order.

    `group`/`name` are codes into `groups`/`names`; `seq` is the instance's position in its
    group on this rank; `nbytes` is the message size (-1: unknown); `size` the group's size
    (-1: unknown); `start`/`dur` are ns on the rank's own clock (absolute, so that ranks can be
    compared once aligned); `step` the index of the rank's step it started in (its CPU step
    span, or the last one begun before it: a GPU's kernels lag their step; -1: before the
    first)."""

    rank: int | None
    source: str
    world_size: int | None
    groups: list[str]
    names: list[str]
    group: npt.NDArray[np.int32]
    seq: I64
    name: npt.NDArray[np.int32]
    nbytes: I64
    size: npt.NDArray[np.int32]
    start: I64
    dur: I64
    step: I64

    def __len__(self) -> int:
        return int(self.start.shape[0])


def collective_name(text: str) -> str:
    """A collective's name in one spelling: `allreduce`, `allgather`, `reducescatter`,
    `alltoall`, `broadcast`, `sendrecv`, ... from an argument (`_allgather_base`), an
    annotation (`gloo:all_reduce`, `nccl:all_to_all`) or a kernel name
    (`ncclKernel_AllReduce_RING_LL_Sum_float`, `ncclDevKernel_ReduceScatter_Sum_f32_RING_LL`)."""
    t = text.strip()
    kernel = _KERNEL_OP.match(t)
    t = kernel.group(1) if kernel is not None else t.split(":", 1)[-1]
    t = t.lower().replace("_", "")
    for suffix in ("base", "coalesced", "intocoalesced", "tensor", "single"):
        if t.endswith(suffix) and len(t) > len(suffix):
            t = t[: -len(suffix)]
    return {"alltoallv": "alltoall", "allgatherinto": "allgather", "send": "sendrecv"}.get(t, t)


def bus_factor(name: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor: what each rank's link carries per byte of message."""
    if n <= 1:
        return 1.0
    if name == "allreduce":
        return 2.0 * (n - 1) / n
    if name in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def rank_collectives(trace: Trace) -> RankCollectives:
    """The collective instances of one rank's trace (see the module's docstring)."""
    codes = trace.names_matching(is_communication_kernel, (Kind.KERNEL,))
    ev = trace.named((Kind.KERNEL,), codes)
    if len(ev) == 0:  # CPU (gloo): the backend's annotation spans the work
        host = (Kind.ANNOTATION, Kind.CPU_OP)
        codes = trace.names_matching(
            lambda s: s.startswith("gloo:") and collective_name(s) not in _NOT_COLLECTIVES, host
        )
        ev = trace.named(host, codes)
    # Arguments once per distinct code (a handful), then per row by table lookup.
    arg_codes, arg_index = np.unique(ev.comm, return_inverse=True)
    parsed = [trace.collective(int(c)) if c else None for c in arg_codes.tolist()]
    name_codes, name_index = np.unique(ev.name, return_inverse=True)
    from_names = [collective_name(trace.strings[int(c)]) for c in name_codes.tolist()]

    default_size = trace.world_size or -1
    pg_sizes = _pg_sizes(trace)
    groups: dict[str, int] = {}
    names: dict[str, int] = {}
    # Per distinct (args, name) pair: group, name, bytes, size; looked up per row.
    pair = arg_index.astype(np.int64) * max(len(name_codes), 1) + name_index
    pairs, pair_index = np.unique(pair, return_inverse=True)
    table = np.empty((len(pairs), 4), np.int64)
    for i, p in enumerate(pairs.tolist()):
        a = parsed[p // max(len(name_codes), 1)]
        nm = from_names[p % max(len(name_codes), 1)]
        if a is not None and a.name:
            nm = collective_name(a.name)
        group = a.group if a is not None and a.group else DEFAULT_GROUP
        size = a.group_size if a is not None else -1
        size = size if size > 0 else pg_sizes.get(group, default_size)
        nbytes = a.nbytes if a is not None else -1
        table[i] = (
            groups.setdefault(group, len(groups)),
            names.setdefault(nm, len(names)),
            nbytes,
            size,
        )
    row = table[pair_index] if len(ev) else np.empty((0, 4), np.int64)
    keep = ~np.isin(row[:, 1], [names[n] for n in _NOT_COLLECTIVES if n in names])
    row = row[keep]
    group = row[:, 0].astype(np.int32)
    seq = _order_in_group(group)
    origin_ns = round(trace.origin_us) * 1000
    ts = ev.ts[keep]
    spans = cpu_steps(trace)
    step = np.searchsorted(spans.cpu_start, ts, side="right").astype(np.int64) - 1
    return RankCollectives(
        rank=trace.rank,
        source=trace.source,
        world_size=trace.world_size,
        groups=list(groups),
        names=list(names),
        group=group,
        seq=seq,
        name=row[:, 1].astype(np.int32),
        nbytes=row[:, 2].copy(),
        size=row[:, 3].astype(np.int32),
        start=ts + origin_ns,
        dur=ev.dur[keep].copy(),
        step=step,
    )


def _pg_sizes(trace: Trace) -> dict[str, int]:
    sizes: dict[str, int] = {}
    config = trace.distributed.get("pg_config")
    if isinstance(config, list):
        for pg in config:
            if isinstance(pg, dict) and isinstance(pg.get("pg_size"), int):
                sizes[str(pg.get("pg_name"))] = int(pg["pg_size"])
    if "0" in sizes:
        sizes.setdefault(DEFAULT_GROUP, sizes["0"])
    return sizes


def _order_in_group(group: npt.NDArray[np.int32]) -> I64:
    """Each row's position among the rows of its group (rows are in time order)."""
    seq = np.zeros(group.shape[0], np.int64)
    if not group.size:
        return seq
    order = np.argsort(group, kind="stable")
    g = group[order]
    first = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1]
    run_start = np.repeat(first, np.diff(np.r_[first, g.size]))
    seq[order] = np.arange(g.size) - run_start
    return seq


# The cross-rank join --------------------------------------------------------------------------


class Job(msgspec.Struct, frozen=True):
    """What the join adds to a job's diagnosis."""

    summary: JobSummary
    ranks: list[RankSummary]
    findings: list[Finding]
    arrive: F64
    """Matched instances x ranks: when each rank reached the collective (ns, aligned clocks;
    NaN: the rank has none)."""
    dur: F64
    """Matched instances x ranks: each rank's time in it (ns)."""
    joins: npt.NDArray[np.bool_]
    """Per matched instance: whether it joins every rank of the job and only them (a
    collective of a group of the ranks present, each of them in it; not point-to-point):
    it ends when the last of them arrives."""


def rank_summary(d: Diagnosis) -> RankSummary:
    """A rank's line in the job's table, from its own diagnosis."""
    return RankSummary(
        source=d.source,
        rank=d.rank,
        steps=d.steps.count,
        median_step_s=d.steps.median_s,
        compute=d.breakdown.compute,
        idle=d.breakdown.idle,
        wall=d.verdict.wall,
        cause=d.verdict.cause,
        comm_exposed=d.breakdown.comm_exposed,
        peak_allocated=d.main_memory.peak_allocated if d.main_memory else None,
    )


def join(
    ranks: Sequence[tuple[Diagnosis, RankCollectives]],
    spec: DeviceSpec | None = None,
    thresholds: Thresholds | None = None,
) -> Job:
    """Match the ranks' collectives and say what the job's ranks wait for.

    `ranks` are in rank order. Instances are matched by (group, order in group); an instance
    whose name or size differs between ranks, or that only one rank has, is left out."""
    thresholds = thresholds or Thresholds()
    diags = [d for d, _ in ranks]
    cols = [c for _, c in ranks]
    r_count = len(cols)
    m = _Matrix.build(cols)
    matched, unmatched, notes = _match(m, cols)
    start, dur = m.start[matched], m.dur[matched]
    offset, has_offset = _clock_offsets(start + dur, r_count)
    arrive = start - offset  # aligned
    transfer = np.nanmin(dur, axis=1) if dur.shape[0] else np.empty(0)
    wait = dur - transfer[:, None]
    late, lead = _last(arrive, thresholds.job.tie_ns)
    caused, late_count = _caused(late, wait, r_count)
    took_part = (~np.isnan(start)).sum(axis=0)

    steps = [float(max(d.steps.total, 1)) for d in diags]
    step_count = float(np.median(steps))
    step_s = float(np.median([d.steps.median_s for d in diags]))
    rank_rows = _rank_rows(
        diags, cols, steps, offset, has_offset, dur, transfer, wait, late_count, took_part
    )
    waits = [r.wait_s or 0.0 for r in rank_rows]
    # What a straggler costs the job's step is the wait it causes each other rank, not that
    # wait summed over them: summed, 7 ranks waiting 2 ms each in a 9.3 ms step would be
    # "150% of the step", capped at 100%, and an Amdahl bound of 1000x.
    others = max(int((took_part > 0).sum()) - 1, 1)
    per_step_caused = caused / 1e9 / step_count / others
    stragglers = _stragglers(
        diags,
        waits,
        cols,
        per_step_caused,
        late_count,
        took_part,
        step_s,
        thresholds,
        _Arrivals(late, lead, m.step[matched]),
    )
    link, peak = fastest_link(spec)
    n_matched = int(matched.sum())
    notes += _clock_notes(cols, has_offset)
    findings = evaluate(
        JobFacts(
            stragglers=stragglers,
            ranks=rank_rows,
            step_s=step_s,
            step_count=step_count,
            message_bytes=m.bytes_hi[matched],
            transfer=transfer,
            thresholds=thresholds,
            stages=[stage for d in diags if (stage := pipeline_stage(d)) is not None],
            strategies=frozenset(
                n for d in diags if d.parallelism is not None for n in d.parallelism.names
            ),
        )
    )
    wait_finding = next((f for f in findings if f.id == "collective-wait"), None)
    wall, cause, reason = job_verdict(
        [d.verdict for d in diags], stragglers, wait_finding, thresholds
    )
    summary = JobSummary(
        ranks=r_count,
        world_size=next((c.world_size for c in cols if c.world_size), None),
        wall=wall,
        cause=cause,
        reason=reason,
        max_clock_skew_s=(
            float(np.max(np.abs(offset[has_offset]))) / 1e9
            if has_offset.any() and r_count > 1
            else None
        ),
        clock_basis=(
            f"median offset of the end times of {n_matched} matched collectives "
            "(a collective ends at about the same moment on every rank): an estimate"
            if n_matched
            else "no collective matched across ranks: clocks not aligned"
        ),
        matched=n_matched,
        unmatched=unmatched,
        link=link,
        link_peak=peak,
        collectives=_table(m, matched, transfer, wait, peak),
        stragglers=stragglers,
        notes=notes,
    )
    return Job(
        summary=summary,
        ranks=rank_rows,
        findings=findings,
        arrive=arrive,
        dur=dur,
        joins=_joins(m, matched, start, cols),
    )


def _match(
    m: _Matrix, cols: Sequence[RankCollectives]
) -> tuple[npt.NDArray[np.bool_], int, list[str]]:
    """Which instances are matched (at least two ranks have them, agreeing in name and size),
    how many of the ranks' instances are not, and the note on those that disagree."""
    present = ~np.isnan(m.start)
    n_present = present.sum(axis=1)
    agree = (m.name_lo == m.name_hi) & (m.bytes_lo == m.bytes_hi)
    matched = (n_present >= 2) & agree
    unmatched = int(sum(len(c) for c in cols) - (n_present * matched).sum())
    notes: list[str] = []
    if (~agree & (n_present >= 2)).any():
        notes.append(
            f"{int((~agree & (n_present >= 2)).sum())} collectives differ in name or size "
            "between ranks (different jobs, or a rank that skipped one): left out"
        )
    return matched, unmatched, notes


def _clock_offsets(end: F64, r_count: int) -> tuple[F64, npt.NDArray[np.bool_]]:
    """Clocks: per rank, the median offset of its collective ends (`end`: matched instances x
    ranks) from the collective's median, relative to the first rank that has one; and which
    ranks have one."""
    offset = np.zeros(r_count)
    has_offset = np.zeros(r_count, dtype=bool)
    if end.shape[0]:
        ref = np.nanmedian(end, axis=1, keepdims=True)
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                off = np.nanmedian(end - ref, axis=0)
        has_offset = ~np.isnan(off)
        offset = np.where(has_offset, off, 0.0)
        if has_offset.any():
            offset = offset - offset[int(np.flatnonzero(has_offset)[0])]
    return offset, has_offset


def _caused(late: I64, wait: F64, r_count: int) -> tuple[F64, I64]:
    """Per rank: the others' wait at the instances where it arrived last (ns), and how many
    such instances there were (a tie, `late` -1, is nobody's)."""
    rows = np.flatnonzero(late >= 0)
    if not rows.size:
        return np.zeros(r_count), np.zeros(r_count, np.int64)
    wait_total = np.nansum(wait[rows], axis=1)
    caused = np.bincount(
        late[rows],
        weights=wait_total - np.nan_to_num(wait[rows, late[rows]]),
        minlength=r_count,
    ).astype(np.float64, copy=False)
    late_count: I64 = np.bincount(late[rows], minlength=r_count)
    return caused, late_count


def _rank_rows(
    diags: Sequence[Diagnosis],
    cols: Sequence[RankCollectives],
    steps: Sequence[float],
    offset: F64,
    has_offset: npt.NDArray[np.bool_],
    dur: F64,
    transfer: F64,
    wait: F64,
    late_count: I64,
    took_part: I64,
) -> list[RankSummary]:
    """The ranks' lines: each with its clock's offset (where it has one), its collectives,
    and its time per step in those it took part in (matched instances x ranks: `dur`,
    `wait`; per instance `transfer`): transferring, waiting, and the share it arrived last
    at (None: it took part in none)."""
    rows = []
    for i, d in enumerate(diags):
        part = took_part[i] > 0
        rows.append(
            msgspec.structs.replace(
                rank_summary(d),
                clock_offset_s=float(offset[i]) / 1e9 if has_offset[i] else None,
                collectives=len(cols[i]),
                transfer_s=float(np.nansum(np.where(np.isnan(dur[:, i]), np.nan, transfer)))
                / 1e9
                / steps[i]
                if part
                else None,
                wait_s=float(np.nansum(wait[:, i])) / 1e9 / steps[i] if part else None,
                late_share=float(late_count[i] / took_part[i]) if part else None,
            )
        )
    return rows


def _clock_notes(cols: Sequence[RankCollectives], has_offset: npt.NDArray[np.bool_]) -> list[str]:
    """What the notes say when no collective is there to align clocks by, or none matched on
    some ranks."""
    if not any(len(c) for c in cols):
        return ["no collectives in these traces: nothing to match across ranks"]
    if not has_offset.all() and len(cols) > 1:
        missing = [str(c.rank) for c, ok in zip(cols, has_offset, strict=True) if not ok]
        return [
            f"no collective matched on rank(s) {', '.join(missing)}: their clocks are not aligned"
        ]
    return []


def _joins(
    m: _Matrix, matched: npt.NDArray[np.bool_], start: F64, cols: Sequence[RankCollectives]
) -> npt.NDArray[np.bool_]:
    """`Job.joins`: per matched instance, whether it joins every rank of the job and only
    them."""
    r_count = len(cols)
    world = next((c.world_size for c in cols if c.world_size), None)
    size = m.size[matched]
    p2p = np.isin(m.name[matched], [i for i, n in enumerate(m.name_of) if n == "sendrecv"])
    joins: npt.NDArray[np.bool_] = (
        ((size == r_count) | ((size < 0) & (world == r_count)))
        & ~p2p
        & ~np.isnan(start).any(axis=1)
    )
    return joins


class _Matrix(msgspec.Struct, frozen=True, eq=False):
    """Instances x ranks: start and duration (ns from the job's earliest start; NaN where a
    rank has no such instance), and per instance the lowest and highest name code and size
    seen across ranks (equal when the ranks agree)."""

    start: F64
    dur: F64
    name_lo: I64
    name_hi: I64
    bytes_lo: I64
    bytes_hi: I64
    size: I64
    group_of: list[str]
    name_of: list[str]
    group: I64
    name: I64
    step: I64
    """Per instance: the step it began in, the latest of the ranks' (-1: before any)."""

    @classmethod
    def build(cls, cols: Sequence[RankCollectives]) -> _Matrix:
        groups: dict[str, int] = {}
        names: dict[str, int] = {}
        gmaps = [
            np.array([groups.setdefault(g, len(groups)) for g in c.groups], np.int64) for c in cols
        ]
        nmaps = [
            np.array([names.setdefault(n, len(names)) for n in c.names], np.int64) for c in cols
        ]
        n_groups = len(groups)
        longest = np.zeros(max(n_groups, 1), np.int64)
        for c, gm in zip(cols, gmaps, strict=True):
            if len(c):
                np.maximum.at(longest, gm[c.group], c.seq + 1)
        first = np.r_[0, np.cumsum(longest)[:-1]]
        rows = int(longest.sum())
        r = len(cols)
        start = np.full((rows, r), np.nan)
        dur = np.full((rows, r), np.nan)
        big = np.iinfo(np.int64).max
        name_lo = np.full(rows, big, np.int64)
        name_hi = np.full(rows, -1, np.int64)
        bytes_lo = np.full(rows, big, np.int64)
        bytes_hi = np.full(rows, -2, np.int64)
        size = np.full(rows, -1, np.int64)
        base = min((int(c.start.min()) for c in cols if len(c)), default=0)
        group = np.zeros(rows, np.int64)
        name = np.zeros(rows, np.int64)
        step = np.full(rows, -1, np.int64)
        for i, (c, gm, nm) in enumerate(zip(cols, gmaps, nmaps, strict=True)):
            if not len(c):
                continue
            g = gm[c.group]
            at = first[g] + c.seq
            start[at, i] = (c.start - base).astype(np.float64)
            dur[at, i] = c.dur.astype(np.float64)
            code = nm[c.name]
            np.minimum.at(name_lo, at, code)
            np.maximum.at(name_hi, at, code)
            np.minimum.at(bytes_lo, at, c.nbytes)
            np.maximum.at(bytes_hi, at, c.nbytes)
            np.maximum.at(size, at, c.size.astype(np.int64))
            group[at] = g
            name[at] = code
            np.maximum.at(step, at, c.step)
        return cls(
            start=start,
            dur=dur,
            name_lo=name_lo,
            name_hi=name_hi,
            bytes_lo=bytes_lo,
            bytes_hi=bytes_hi,
            size=size,
            group_of=list(groups),
            name_of=list(names),
            group=group,
            name=name,
            step=step,
        )


def _last(arrive: F64, tie_ns: float) -> tuple[I64, F64]:
    """Per instance, the rank (column) that arrived last, and its lead: how long after the
    next latest rank it arrived (ns). Ranks within `tie_ns` of each other arrive together:
    such an instance has no last rank (-1), or the first column would take every tie."""
    if not arrive.shape[0]:
        return np.empty(0, np.int64), np.empty(0)
    filled = np.where(np.isnan(arrive), -np.inf, arrive)
    last: I64 = np.argmax(filled, axis=1).astype(np.int64)
    rows = np.arange(last.size)
    top = filled[rows, last]
    filled[rows, last] = -np.inf
    with np.errstate(invalid="ignore"):
        lead = top - filled.max(axis=1)  # nan where only one rank has it (-inf - -inf)
    lead = np.where(np.isfinite(lead), lead, 0.0)
    last = np.where(lead > tie_ns, last, -1)
    return last, lead


class _Arrivals(msgspec.Struct, frozen=True, eq=False):
    """Per matched instance: the rank that arrived last (-1: a tie), its lead over the next
    latest (ns) and the step the instance began in (-1: before any)."""

    last: I64
    lead: F64
    step: I64

    def late_steps(self, rank: int) -> tuple[int, int, float, float]:
        """For `rank`: in how many steps it arrived last at most of the step's collectives
        that had a last rank, of how many steps had collectives; its lateness there (the
        median over those steps of its median lead in each, ns); and the noise of arrival
        order, the median lead of the other ranks where they arrived last (ns; 0 when they
        never did)."""
        in_step = self.step >= 0
        # Every step with collectives counts: one where all tie has nobody late in it.
        steps, at = np.unique(self.step[in_step], return_inverse=True)
        ok = self.last[in_step] >= 0
        last, lead, at = self.last[in_step][ok], self.lead[in_step][ok], at[ok]
        mine = last == rank
        late = 2 * np.bincount(at[mine], minlength=steps.size) > np.bincount(
            at, minlength=steps.size
        )
        lateness = (
            float(np.median([np.median(lead[mine & (at == i)]) for i in np.flatnonzero(late)]))
            if late.any()
            else 0.0
        )
        noise = float(np.median(lead[~mine])) if (~mine).any() else 0.0
        return int(late.sum()), int(steps.size), lateness, noise


_PARTS = {
    "compute": "computing",
    "comm_exposed": "communicating with no compute beside it",
    "copy_exposed": "copying memory",
    "data_loading": "waiting for data loading",
    "synchronization": "blocked in synchronisation (.item(), cuda synchronize)",
    "communication_wait": "waiting in other collectives",
    "host_overhead": "on the host (CPU ops, Python) while the device waited",
    "launch_latency": "launching kernels",
    "dependency_wait": "waiting for other streams",
    "startup": "in one-off start-up (first launches loading kernel code)",
    "other": "in time the trace does not explain (untraced host code, sleep, I/O)",
}


def _parts_s(d: Diagnosis, wait_s: float = 0.0) -> dict[str, float]:
    """Where a rank's median step goes, in seconds per part, less `wait_s` (its wait in
    collectives, taken from the parts that hold it: exposed communication, communication
    wait, then untraced time, where a CPU rank waits for gloo's thread)."""
    b = d.breakdown
    s = d.steps.median_s
    parts = {
        "compute": b.compute * s,
        "comm_exposed": b.comm_exposed * s,
        "copy_exposed": b.copy_exposed * s,
    }
    for cause, share in b.idle_causes.items():
        parts[cause] = share * s
    for key in ("comm_exposed", "communication_wait", "other"):
        taken = min(wait_s, parts.get(key, 0.0))
        if key in parts:
            parts[key] -= taken
        wait_s -= taken
    return parts


def _doing(diags: Sequence[Diagnosis], waits: Sequence[float], i: int) -> str:
    """What rank `i` spends more time on than the other ranks (median), from the diagnoses,
    each rank's wait in collectives left out; when nothing stands out, its own largest part."""
    mine = _parts_s(diags[i], waits[i])
    others = [_parts_s(d, waits[j]) for j, d in enumerate(diags) if j != i]
    excess = {k: v - float(np.median([o.get(k, 0.0) for o in others])) for k, v in mine.items()}
    key, extra = max(excess.items(), key=lambda kv: kv[1])
    d = diags[i]
    if extra <= 0.05 * d.steps.median_s:
        key = max(mine.items(), key=lambda kv: kv[1])[0]
        text = f"most of its step is {_PARTS.get(key, key)} ({mine[key] * 1e3:.2f} ms/step)"
    else:
        text = f"{_PARTS.get(key, key)}: {extra * 1e3:.2f} ms/step more than the other ranks"
    if key == "compute" and d.kernels:
        text += f"; its longest kernel is {short_kernel(d.kernels[0].name)}"
    return text


def _stragglers(
    diags: Sequence[Diagnosis],
    waits: Sequence[float],
    cols: Sequence[RankCollectives],
    caused: F64,
    late_count: npt.NDArray[np.int64],
    took_part: npt.NDArray[np.int64],
    step_s: float,
    thresholds: Thresholds,
    arrivals: _Arrivals,
) -> list[Straggler]:
    """Ranks whose lateness accounts for a large part of the others' wait: the one that caused
    the most, when it caused at least half of all of it and a visible share of a step, and
    when that is its steady habit, not chance (`_steady`)."""
    if len(cols) < 2 or caused.sum() <= 0 or step_s <= 0:
        return []
    order = np.argsort(-caused, kind="stable")
    top = int(order[0])
    total = float(caused.sum())
    if caused[top] < 0.5 * total or caused[top] / step_s < thresholds.time.min_share:
        return []
    if len(order) > 1 and caused[top] < 2.0 * caused[int(order[1])]:
        return []
    late_steps, steps, lateness, noise = arrivals.late_steps(top)
    spread = _step_spread(diags)
    if not _steady(late_steps, steps, lateness, max(noise, spread), thresholds.job):
        return []
    own = cols[top].rank
    rank = own if own is not None else top
    return [
        Straggler(
            rank=rank,
            late_share=float(late_count[top] / max(int(took_part[top]), 1)),
            wait_caused_s=float(caused[top]),
            share=min(float(caused[top]) / step_s, 1.0),
            doing=_doing(diags, waits, top),
            late_steps=late_steps,
            steps=steps,
            lateness_s=lateness / 1e9,
            noise_s=noise / 1e9,
            step_spread_s=spread / 1e9,
        )
    ]


def _step_spread(diags: Sequence[Diagnosis]) -> float:
    """How much the job's steps vary (ns): per rank, the spread of its steady steps' lengths
    (1.4826 x their median absolute deviation, which estimates a standard deviation that one
    spike does not move), the median over the ranks. On a busy host the steps and the
    arrivals jitter alike; a rank late by less than that is not told apart from chance."""
    spreads = []
    for d in diags:
        lengths = np.array([s.duration_s for s in d.breakdown.steps if not s.warmup]) * 1e9
        if lengths.size >= 2:
            spreads.append(1.4826 * float(np.median(np.abs(lengths - np.median(lengths)))))
    return float(np.median(spreads)) if spreads else 0.0


def _steady(late_steps: int, steps: int, lateness: float, noise: float, th: JobThresholds) -> bool:
    """Whether a rank's lateness is a straggler's: last at most collectives in most steps (one
    slow step is an unstable step, not a slow rank), and late by more than the noise (the
    larger of the arrival order's and the steps' spread: on a busy host the ranks take turns
    being last by about as much, and chance alone makes one of them last in most of a few
    steps)."""
    return late_steps > th.straggler_steps * steps and lateness > max(
        th.straggler_noise * noise, th.tie_ns
    )


def fastest_link(spec: DeviceSpec | None) -> tuple[str | None, float | None]:
    """The device's fastest GPU-to-GPU link and one direction of its bandwidth."""
    if spec is None:
        return None, None
    for key, label in (
        ("nvlink", "NVLink"),
        ("infinity_fabric", "Infinity Fabric"),
        ("pcie", "PCIe"),
    ):
        value = spec.interconnect.get(key)
        if value:
            return label, float(value) / 2.0
    return None, None


def _table(
    m: _Matrix, matched: npt.NDArray[np.bool_], transfer: F64, wait: F64, peak: float | None
) -> list[CollectiveRow]:
    """Matched instances grouped by (group, name, size, group size), most time first."""
    if not transfer.size:
        return []
    g, n, b, s = m.group[matched], m.name[matched], m.bytes_hi[matched], m.size[matched]
    keys = np.stack([g, n, b, s], axis=1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    count = np.bincount(inv)
    t_sum = np.bincount(inv, weights=transfer) / 1e9
    w_mean = np.nanmean(np.where(np.isnan(wait), np.nan, wait), axis=1)
    w_sum = np.bincount(inv, weights=np.nan_to_num(w_mean)) / 1e9
    rows = []
    for k in np.argsort(-(t_sum + w_sum), kind="stable")[:20].tolist():
        group, name, nbytes, size = (int(x) for x in uniq[k])
        cname = m.name_of[name]
        algbw = busbw = pct = None
        if nbytes > 0 and t_sum[k] > 0:
            algbw = nbytes * float(count[k]) / float(t_sum[k])
            busbw = algbw * bus_factor(cname, size)
            pct = min(busbw / peak, 1.0) if peak else None
        rows.append(
            CollectiveRow(
                group=m.group_of[group],
                name=cname,
                ranks=max(size, 0),
                count=int(count[k]),
                bytes=nbytes if nbytes >= 0 else None,
                transfer_s=float(t_sum[k]),
                wait_s=float(w_sum[k]),
                algbw=algbw,
                busbw=busbw,
                pct_of_link=pct,
            )
        )
    return rows


class JobFacts(msgspec.Struct, frozen=True, eq=False):
    """What the job rules look at: the stragglers and the ranks' lines the join found, the
    job's median step (seconds) and step count, per matched collective instance its message
    size (bytes, -1 unknown) and transfer time (ns), and the thresholds."""

    stragglers: list[Straggler]
    ranks: list[RankSummary]
    step_s: float
    step_count: float
    message_bytes: I64
    transfer: F64
    thresholds: Thresholds
    stages: list[StageTimes] = msgspec.field(default_factory=list)
    """The pipelined ranks' compute and bubble (`pipeline_stage`), in rank order."""
    strategies: frozenset[str] = frozenset()
    """The parallel strategies any rank's trace names (`Diagnosis.parallelism`)."""


class StageTimes(msgspec.Struct, frozen=True):
    """One pipelined rank's facts, from its diagnosis: its compute per step (forward and
    backward: device time on a GPU, the main thread's exposed time on a CPU) and the share
    of its step it waits in its pipeline bubble."""

    rank: int
    forward_s: float
    backward_s: float
    bubble: float

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s


def pipeline_stage(d: Diagnosis) -> StageTimes | None:
    """A rank's `StageTimes` where its diagnosis names a pipeline bubble and its phases,
    None otherwise."""
    bubble = next((f for f in d.findings if f.id == "pipeline-bubble"), None)
    if bubble is None or d.phases is None or d.rank is None:
        return None
    times = d.phases.gpu_s or d.phases.exposed_s
    return StageTimes(
        rank=d.rank,
        forward_s=times.get("forward", 0.0),
        backward_s=times.get("backward", 0.0),
        bubble=bubble.share,
    )


def _waiting(id_: str, title: str, share: float, evidence: str, fix: str) -> Finding:
    """A job's finding: a share of the step lost waiting (the overhead wall), bounded by
    Amdahl's law."""
    return Finding(
        id=id_,
        wall="overhead",
        title=title,
        share=share,
        max_speedup=amdahl(share),
        evidence=evidence,
        fix=fix,
    )


@rule(JobFacts)
def straggler(f: JobFacts) -> Finding | None:
    if f.step_s <= 0 or not f.stragglers:
        return None
    s = f.stragglers[0]  # at most one: the rank that caused most of the wait
    # (Its excess is in computing: `_doing`'s words for the compute part.)
    experts = "EP" in f.strategies and s.doing.startswith(f"{_PARTS['compute']}: ")
    return _waiting(
        "straggler",
        f"Rank {s.rank} is a straggler: the other ranks wait for it",
        s.share,
        f"rank {s.rank} arrives last at {s.late_share:.0%} of the collectives (at most of "
        f"those a rank is last at in {s.late_steps} of {s.steps} steps), by a median "
        f"{(s.lateness_s or 0.0) * 1e3:.3f} ms, beyond the noise (the others' lead when "
        f"last {(s.noise_s or 0.0) * 1e3:.3f} ms, the steps' spread "
        f"{(s.step_spread_s or 0.0) * 1e3:.3f} ms); the others wait "
        f"{s.wait_caused_s * 1e3:.2f} ms per step for it "
        f"({s.share:.0%} of a {f.step_s * 1e3:.2f} ms step); it was {s.doing}"
        + (
            "; an expert-parallel job: a rank that computes more than the others at every "
            "step is most often one whose experts receive more tokens"
            if experts
            else ""
        ),
        (
            "balance the experts' load: a capacity factor, an auxiliary or loss-free "
            "balancing term, expert placement by measured load (replicate hot experts); "
            if experts
            else ""
        )
        + f"make rank {s.rank} as fast as the others: even out its data (equal shard "
        "and batch sizes, sequence-length bucketing), give it its share of CPU "
        "(DataLoader workers, no other process on its cores), check its GPU "
        "(clocks, throttling, a slow or shared device)",
    )


@rule(JobFacts)
def collective_wait(f: JobFacts) -> Finding | None:
    # A pipelined rank's wait in its bubble is the schedule's (pipeline-bubble and
    # pipeline-imbalance name it), not ranks waiting for each other's load: left out here.
    bubble: dict[int | None, float] = {s.rank: s.bubble for s in f.stages}
    waits = [
        max(r.wait_s - bubble.get(r.rank, 0.0) * r.median_step_s, 0.0)
        for r in f.ranks
        if r.wait_s is not None
    ]
    if f.step_s <= 0 or not waits or f.stragglers:
        return None
    share = min(float(np.median(waits)) / f.step_s, 1.0)
    if share < f.thresholds.time.min_share:
        return None
    worst = max(f.ranks, key=lambda r: r.median_step_s)
    return _waiting(
        "collective-wait",
        "Ranks wait for each other in collectives (load imbalance)",
        share,
        f"a rank waits a median {np.median(waits) * 1e3:.2f} ms per step in "
        f"collectives for slower ranks ({share:.0%} of the step), no single "
        f"rank to blame; the slowest step is rank {worst.rank}'s "
        f"({worst.median_step_s * 1e3:.2f} ms)",
        "balance the work per rank (equal batch and sequence lengths, "
        "bucketing by length), and keep host work off the critical path",
    )


@rule(JobFacts)
def small_messages(f: JobFacts) -> Finding | None:
    limit = f.thresholds.job.small_message_bytes
    small = (f.message_bytes >= 0) & (f.message_bytes < limit)
    if f.step_s <= 0 or not small.any():
        return None
    t_small = float(f.transfer[small].sum()) / 1e9 / f.step_count
    share = min(t_small / f.step_s, 1.0)
    if share < f.thresholds.time.min_share:
        return None
    count = int(small.sum())
    median_b = float(np.median(f.message_bytes[small]))
    return _waiting(
        "small-messages",
        "Many small collectives: latency-bound communication",
        share,
        f"{count} collectives under {limit >> 20} MiB (median "
        f"{median_b / 1024:.0f} KiB) take {t_small * 1e3:.2f} ms per step even "
        "at the fastest rank's pace",
        "send fewer, larger messages: a larger DDP bucket_cap_mb, coalesced "
        "collectives, FSDP wrapping larger units; avoid per-parameter or "
        "per-tensor collectives in the training loop",
    )
