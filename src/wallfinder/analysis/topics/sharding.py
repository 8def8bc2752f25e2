"""Sharding: the collectives of sharded data parallel (FSDP / ZeRO-3) and of tensor parallel
that the step waits for, each with its strategy's own levers (not the DDP bucket advice of
`exposed-comm`)."""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.collectives import bus_factor, collective_name, fastest_link
from wallfinder.analysis.critpath import ASYNC_TP, PREFETCH
from wallfinder.analysis.critpath.change import UNITS_MERGED
from wallfinder.analysis.critpath.lever import LeverWork, lever, on_host
from wallfinder.analysis.findings import (
    NO_ROWS,
    Facts,
    amdahl,
    make_finding,
    ms_text,
    once_per_facts,
)
from wallfinder.analysis.gpu import COMM, COPY
from wallfinder.analysis.intervals import Coverage, in_windows
from wallfinder.analysis.parallelism import (
    HostCollectives,
    fsdp_ranges,
    host_collectives,
    unit_of,
)
from wallfinder.analysis.phases import FORWARD
from wallfinder.analysis.roofline import outermost
from wallfinder.analysis.rules import Claim, rule
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.diagnosis import Finding
from wallfinder.trace import Events, Kind
from wallfinder.units import size

NS = 1e-9


@once_per_facts
def steady_collectives(f: Facts) -> HostCollectives:
    """The steady steps' host collective calls (`parallelism.host_collectives`), found once
    for the strategies' rules, their claims and their levers."""
    return host_collectives(f.scope, f.attribution)


def _main(f: Facts, ev: Events) -> Events:
    """`ev`'s rows on the thread whose time is the step's (the CPU as the device), the
    outermost ones: the time that thread spends blocked in them."""
    if f.main_thread is not None:
        ev = ev.take(np.flatnonzero(ev.thread == f.main_thread))
    return ev.take(np.flatnonzero(outermost(ev)))


def _kernels(f: Facts, kinds: tuple[str, ...], phase: int | None) -> npt.NDArray[np.bool_]:
    """The steady steps' communication kernels of the given collective kinds (and, with
    `phase`, launched in that phase of the step)."""
    if f.dev is None:
        return NO_ROWS
    dev, trace = f.dev, f.trace
    names, index = np.unique(dev.ops.name, return_inverse=True)
    wanted = np.array([collective_name(trace.strings[int(c)]) in kinds for c in names.tolist()])
    rows: npt.NDArray[np.bool_] = f.inside & (dev.cls == COMM) & wanted[index]
    if phase is not None:
        # The phase a collective kernel is issued in: the phases give the kernel itself to
        # communication, whichever phase launched it.
        # (A kernel whose launch the trace does not hold is left out.)
        rows &= dev.launch_ts != NO_LAUNCH
        a, at = f.attribution, np.flatnonzero(rows)
        if a is None:
            return np.zeros_like(rows)
        placed, _ = a.place_calls(dev.launch_thread[at], dev.launch_ts[at])
        rows[at[placed != phase]] = False
    return rows


def exposed_s(f: Facts, rows: npt.NDArray[np.bool_]) -> float:
    """Seconds per step of the kernels at `rows` that no compute kernel runs beside."""
    assert f.dev is not None
    ops = f.dev.ops
    compute = f.inside & (f.dev.cls != COMM) & (f.dev.cls != COPY)
    cover = Coverage.of(ops.ts[compute], ops.end[compute])
    union = Coverage.of(ops.ts[rows], ops.end[rows])
    exposed = union.total - int(cover.covered(union.starts, union.ends).sum())
    return max(exposed, 0) * NS / max(f.steps.count, 1)


# fsdp-exposed-gather ------------------------------------------------------------------------


def _gathers(f: Facts) -> Events:
    """The forward all-gathers of FSDP's units the step waits for: its `FSDP::all_gather (i)`
    and `FSDP::all_gather_copy_out (i)` ranges (the wait is in the copy-out) in the
    forward."""
    ev = fsdp_ranges(f.scope, "all_gather", "all_gather_copy_out")
    if f.attribution is not None and len(ev):
        phase, _ = f.attribution.place_calls(ev.thread, ev.ts)
        ev = ev.take(np.flatnonzero(phase == FORWARD))
    return ev


def _issued(f: Facts, gathers: Events) -> Events:
    """Of `gathers`, the `FSDP::all_gather (i)` ranges (where each all-gather is issued)."""
    names, index = np.unique(gathers.name, return_inverse=True)
    issue = np.array(
        [f.trace.strings[int(c)].startswith("FSDP::all_gather (") for c in names.tolist()],
        dtype=bool,
    )
    return gathers.take(np.flatnonzero(issue[index])) if len(gathers) else gathers


def _on_demand(f: Facts, gathers: Events) -> npt.NDArray[np.bool_]:
    """Per forward all-gather: issued inside its own unit's `FSDP::pre_forward (i)` (on
    demand, when the unit is about to run: no prefetch), not by an earlier unit's hook."""
    pre = fsdp_ranges(f.scope, "pre_forward")
    if not len(pre) or not len(gathers):
        return np.zeros(len(gathers), dtype=bool)
    unit, pre_unit = unit_of(f.trace, gathers), unit_of(f.trace, pre)
    k = np.searchsorted(pre.ts, gathers.ts, side="right") - 1
    j = np.maximum(k, 0)
    inside = (k >= 0) & (gathers.ts < pre.end[j]) & (pre.thread[j] == gathers.thread)
    result: npt.NDArray[np.bool_] = inside & (pre_unit[j] == unit)
    return result


def _gather_bytes(f: Facts, own: Events) -> dict[int, int]:
    """Per FSDP unit: the bytes its forward all-gather gathers (the output of the
    `c10d::_allgather_base_` inside its `FSDP::all_gather (i)` range, `own`)."""
    trace = f.trace
    codes = trace.names_matching(lambda s: s.endswith("_allgather_base_"))
    calls = trace.named((Kind.CPU_OP,), codes)
    if not len(calls) or not len(own):
        return {}
    k = np.searchsorted(own.ts, calls.ts, side="right") - 1
    j = np.maximum(k, 0)
    inside = (k >= 0) & (calls.ts < own.end[j])
    units = unit_of(trace, own)
    sizes: dict[int, int] = {}
    for row in np.flatnonzero(inside).tolist():
        args = trace.op_args(
            int(calls.input_dims[row]), int(calls.input_type[row]), int(calls.concrete_inputs[row])
        )
        out = args.tensor(0) if args is not None else None
        if out is not None:
            sizes.setdefault(int(units[j[row]]), out.nbytes)
    return sizes


def _gather_rows(f: Facts) -> npt.NDArray[np.bool_]:
    return _kernels(f, ("allgather",), FORWARD)


def _gather_wait(f: Facts) -> tuple[float, dict[int, float], Events] | None:
    """The forward all-gathers the step waits for: seconds per step, per unit, and the
    gathers' ranges (None: no FSDP all-gather in the forward)."""
    gathers = _gathers(f)
    if f.dev is None:
        if not len(gathers):
            return None
        per_unit = _per_unit(f, _main(f, gathers))
        return sum(per_unit.values()), per_unit, gathers
    rows = _gather_rows(f)
    if not rows.any():
        return None
    return exposed_s(f, rows), _kernels_per_unit(f, rows, _issued(f, gathers)), gathers


def strategy_claim(f: Facts, seconds: float, words: str) -> Claim | None:
    """The exposed communication a finding of `seconds` per step claims: none where it is too
    small to be a finding (the time then stays exposed-comm's)."""
    if f.step_s <= 0 or f.share(seconds / f.step_s) < f.thresholds.time.min_share:
        return None
    return Claim(seconds / f.step_s, words)


def _gather_claim(f: Facts) -> Claim | None:
    wait = _gather_wait(f)
    if wait is None:
        return None
    seconds, _, gathers = wait
    prefetched = not _on_demand(f, _issued(f, gathers)).any()
    return strategy_claim(
        f, seconds, "FSDP all-gathers " + ("waited for" if prefetched else "not prefetched")
    )


@lever("prefetch")
def _prefetch_work(f: Facts) -> LeverWork | None:
    """The `prefetch` what-if's work: every all-gather of FSDP's units, the forward's and the
    backward's re-gathers (None: no FSDP all-gather the step waits for, as its finding
    counts them)."""
    if _gather_claim(f) is None:
        return None
    if f.dev is not None:
        return LeverWork(ops=_kernels(f, ("allgather",), None))
    gathers = fsdp_ranges(f.scope, "all_gather", "all_gather_copy_out")
    return on_host(gathers, main=f.main_thread)


@rule(
    Facts,
    id="fsdp-exposed-gather",
    replay=PREFETCH,
    work=_gather_rows,
    claims=_gather_claim,
)
def fsdp_exposed_gather(f: Facts) -> Finding | None:
    """The forward all-gathers of sharded data parallel (FSDP / ZeRO-3) the step waits for,
    per unit, with whether they were prefetched."""
    wait = _gather_wait(f)
    if wait is None:
        return None
    seconds, per_unit, gathers = wait
    share = f.share(seconds / f.step_s) if f.step_s > 0 else 0.0
    if share < f.thresholds.time.min_share:
        return None
    issued = _issued(f, gathers)
    sizes = _gather_bytes(f, issued)
    units = ", ".join(
        f"unit {u} {ms_text(s)}" + (f" ({size(sizes[u])})" if u in sizes else "")
        for u, s in sorted(per_unit.items())
    )
    demand = _on_demand(f, issued)
    steps = max(f.steps.count, 1)
    prefetch = (
        (
            f"; {demand.sum() / steps:g} of {len(issued) / steps:g} per step issued by their "
            "own unit's pre-forward (no forward prefetch)"
            if demand.any()
            else f"; all {len(issued) / steps:g} per step prefetched by an earlier unit"
        )
        if len(issued)
        else ""
    )
    merge = _merge(f)
    merging = ""
    if isinstance(merge, str):
        merging = f"; merging adjacent units: {merge}"
    elif merge is not None and merge.saved_s(2) > 0:
        merging = (
            f"; merging adjacent units in pairs saves {ms_text(merge.saved_s(2))} per step of "
            "their collectives' fixed cost (fsdp-small-units)"
        )
    prefetching = f.trace.names_matching(lambda s: s.startswith("FSDP::backward_prefetch"))
    backward = (
        "; backward prefetch seen"
        if len(f.trace.named((Kind.ANNOTATION, Kind.CPU_OP), prefetching))
        else ""
    )
    reach = min(share, f.hideable)
    return make_finding(
        f,
        "fsdp-exposed-gather",
        "overhead",
        "FSDP's all-gathers are waited for before their unit's forward",
        share,
        f"{share:.0%} of each step ({ms_text(share * f.step_s)}) waits for parameters being "
        f"all-gathered before a unit's forward"
        + (f": {units}" if units else "")
        + prefetch
        + backward
        + _backward_costs(f)
        + merging
        + f"; the compute they could hide behind is {reach:.0%} of the step (the bound)",
        "prefetch the next unit's parameters while this one computes: FSDP2 "
        "`unit.set_modules_to_forward_prefetch([next_unit])` and "
        "`set_modules_to_backward_prefetch` (FSDP1: forward_prefetch=True, "
        "backward_prefetch=BACKWARD_PRE); fewer, larger units (wrap blocks, not layers) so "
        "each all-gather is large enough to run at bandwidth; reshard_after_forward=False "
        "(or an int, a smaller group) on the last units to skip their backward re-gather, "
        "at the memory it keeps",
        speedup=amdahl(reach),
        reach=reach,
    )


# fsdp-small-units ----------------------------------------------------------------------------


class _Merge(msgspec.Struct, frozen=True, eq=False):
    """FSDP's units' collectives on the GPU, each with its fixed cost: its time less its bytes
    at the link's peak (what a merged collective pays once instead of once per unit)."""

    rows: npt.NDArray[np.bool_]
    """The units' all-gather and reduce-scatter kernels in the steady steps."""
    fixed_ns: npt.NDArray[np.float64]
    """Per device op: its fixed cost (0 outside `rows`)."""
    pos: npt.NDArray[np.int64]
    """Per device op: its place in its run (one collective kind, one phase, one step)."""
    units: int
    link: str
    link_bps: float
    sizes: dict[str, int]
    """Per collective kind: its median message, bytes."""
    steps: int

    def saved_s(self, k: int) -> float:
        """Seconds per step that merging `k` adjacent units saves at most: the fixed cost of
        every collective but the first of its group."""
        cut = self.fixed_ns[self.rows & (self.pos % k != 0)]
        return float(cut.sum()) * NS / max(self.steps, 1)


def _merge(f: Facts) -> _Merge | str | None:
    """FSDP's units' collectives with their fixed costs, or why merging's gain is unknown
    here (words); None: no FSDP units' collectives in the trace."""
    units = fsdp_ranges(f.scope, "all_gather")
    if not len(units):
        return None
    if f.dev is None:
        return (
            "what it saves is unknown here (collectives on the CPU, gloo: no link peak "
            "splits a collective's fixed cost from its transfer)"
        )
    rows = _kernels(f, ("allgather", "reducescatter"), None)
    if not rows.any():
        return None
    link, bps = fastest_link(f.scope.spec)
    if bps is None or link is None:
        return (
            "what it saves is unknown here (the device's link is unknown: no peak splits a "
            "collective's fixed cost from its transfer)"
        )
    ops, trace = f.dev.ops, f.trace
    codes, index = np.unique(ops.comm[rows], return_inverse=True)
    args = [trace.collective(int(c)) if c else None for c in codes.tolist()]
    nbytes = np.array([a.nbytes if a is not None else -1 for a in args], dtype=np.int64)
    if (nbytes <= 0).any():
        return (
            "what it saves is unknown here (the collectives record no message size: no "
            "transfer time to split from their fixed cost)"
        )
    # The collective's kind from its arguments, else its kernel's name; its bus factor per
    # distinct (kind, group size): what each rank's link carries per byte of message.
    named, named_at = np.unique(ops.name[rows], return_inverse=True)
    kind = np.array([collective_name(trace.strings[int(c)]) for c in named.tolist()])
    kind = kind[named_at.reshape(-1)]
    from_args = np.array(
        [collective_name(a.name) if a is not None and a.name else "" for a in args]
    )
    kind = np.where(from_args[index] != "", from_args[index], kind)
    group = np.array([a.group_size if a is not None else -1 for a in args])[index]
    pairs, pair = np.unique(np.stack([kind, group.astype(str)]), axis=1, return_inverse=True)
    factor = np.array([bus_factor(str(k), int(n)) for k, n in pairs.T.tolist()])
    factor = factor[pair.reshape(-1)]
    at = np.flatnonzero(rows)
    transfer = nbytes[index] * factor / bps * 1e9
    fixed = np.zeros(ops.ts.size)
    fixed[at] = np.maximum(ops.dur[at] - transfer, 0.0)
    # Runs of adjacent units: one kind, issued in one phase (the forward's gathers, the
    # backward's re-gathers, its reduce-scatters), in one step, in time order.
    phase = np.zeros(at.size, np.int64)
    if f.attribution is not None:
        launched = f.dev.launch_ts[at] != NO_LAUNCH
        placed, _ = f.attribution.place_calls(f.dev.launch_thread[at], f.dev.launch_ts[at])
        phase = np.where(launched, placed, -1).astype(np.int64)
    step = np.searchsorted(f.scope.start, ops.ts[at], "right")
    _, run = np.unique(
        np.stack([step, phase, np.unique(kind, return_inverse=True)[1]]),
        axis=1,
        return_inverse=True,
    )
    run = run.reshape(-1)
    order = np.lexsort((ops.ts[at], run))
    first = np.r_[True, run[order][1:] != run[order][:-1]]
    seq = np.arange(at.size) - np.maximum.accumulate(np.where(first, np.arange(at.size), 0))
    pos = np.zeros(ops.ts.size, np.int64)
    pos[at[order]] = seq
    sizes = {str(k): int(np.median(nbytes[index][kind == k])) for k in np.unique(kind).tolist()}
    count = int(np.unique(unit_of(trace, units)).size)
    return _Merge(rows, fixed, pos, count, link, bps, sizes, max(f.steps.count, 1))


@lever("units-merged")
def _units_merged_work(f: Facts) -> LeverWork | None:
    """The `units-merged` what-if's work: FSDP's units' collectives with their fixed costs
    (None: none, or their fixed costs unknown: the CPU, no link, no message sizes)."""
    merge = _merge(f)
    if not isinstance(merge, _Merge):
        return None
    return LeverWork(ops=merge.rows, fixed_ns=merge.fixed_ns, merge_pos=merge.pos)


def _merge_rows(f: Facts) -> npt.NDArray[np.bool_]:
    merge = _merge(f)
    return merge.rows if isinstance(merge, _Merge) else NO_ROWS


@rule(Facts, id="fsdp-small-units", replay=UNITS_MERGED, work=_merge_rows)
def fsdp_small_units(f: Facts) -> Finding | None:
    """FSDP's units' collectives that each pay a fixed cost (latency, launch, the ranks'
    handshake) larger than what merging units would leave: fewer, larger units pay it less
    often. On the GPU where the link and the message sizes are known (else its gain is
    unknown, said in `fsdp-exposed-gather`'s evidence)."""
    merge = _merge(f)
    if not isinstance(merge, _Merge) or f.step_s <= 0:
        return None
    saved = merge.saved_s(2)
    # Only the fixed cost where no compute runs beside the collectives can shorten the step.
    exposed = exposed_s(f, merge.rows)
    share = f.share(min(saved, exposed) / f.step_s)
    if share < f.thresholds.time.min_share:
        return None
    assert f.dev is not None
    total = float(f.dev.ops.dur[merge.rows].sum()) * NS / merge.steps
    fixed = float(merge.fixed_ns[merge.rows].sum()) * NS / merge.steps
    count = int(merge.rows.sum()) / merge.steps
    sizes = ", ".join(f"{_KIND_WORDS.get(k, k)} {size(b)}" for k, b in sorted(merge.sizes.items()))
    return make_finding(
        f,
        "fsdp-small-units",
        "overhead",
        "FSDP's units are small: each collective pays its fixed cost",
        share,
        f"{merge.units} FSDP units, {count:g} of their collectives per step taking "
        f"{ms_text(total)} (median per unit: {sizes}); at {merge.link}'s peak "
        f"({merge.link_bps / 1e9:.0f} GB/s one way) their bytes move in "
        f"{ms_text(total - fixed)}, leaving {ms_text(fixed)} of fixed cost (latency, launch, "
        f"the ranks' handshake; an estimate: each one's time less its bytes at the peak); "
        f"merging adjacent units in pairs (`--what-if units-merged:K` for K) saves "
        f"{ms_text(saved)} per step, {share:.0%} of the step where no compute runs beside "
        "them (the bound)",
        "wrap fewer, larger units: FSDP2 `fully_shard` on groups of blocks rather than each "
        "block (FSDP1: a ModuleWrapPolicy over larger modules, or a larger min_num_params), "
        "at the memory of the larger unit gathered at once; prefetch the next unit (the "
        "`prefetch` what-if) so what is left runs beside compute",
        speedup=amdahl(share),
    )


_KIND_WORDS = {"allgather": "all-gather", "reducescatter": "reduce-scatter"}


def _backward_costs(f: Facts) -> str:
    """The backward's FSDP waits on a CPU-only trace, in words: the re-gathers of units
    resharded after the forward, and each unit's gradient reduce-scatter."""
    if f.dev is not None or f.attribution is None:
        return ""
    ev = fsdp_ranges(f.scope, "all_gather", "all_gather_copy_out")
    phase, _ = f.attribution.place_calls(ev.thread, ev.ts)
    again = sum(_per_unit(f, _main(f, ev.take(np.flatnonzero(phase != FORWARD)))).values())
    reduce = _per_unit(f, _main(f, fsdp_ranges(f.scope, "post_backward_reduce")))
    parts = []
    if again > 0:
        parts.append(
            f"the backward re-gathers the resharded units for {ms_text(again)} "
            "(reshard_after_forward's cost)"
        )
    if reduce:
        parts.append(
            "the reduce-scatters of the gradients take "
            + ", ".join(f"unit {u} {ms_text(s)}" for u, s in sorted(reduce.items()))
        )
    return "; " + "; ".join(parts) if parts else ""


def _kernels_per_unit(f: Facts, rows: npt.NDArray[np.bool_], issued: Events) -> dict[int, float]:
    """Seconds per step of the all-gather kernels at `rows` with no compute beside them, per
    FSDP unit: the unit whose `FSDP::all_gather (i)` range launched the kernel (kernels
    launched outside one are left out)."""
    assert f.dev is not None
    if not len(issued):
        return {}
    at = np.flatnonzero(rows)
    launch, thread = f.dev.launch_ts[at], f.dev.launch_thread[at]
    k = np.searchsorted(issued.ts, launch, side="right") - 1
    j = np.maximum(k, 0)
    inside = (k >= 0) & (launch < issued.end[j]) & (issued.thread[j] == thread)
    unit = np.where(inside, unit_of(f.trace, issued)[j], -1)
    out: dict[int, float] = {}
    for u in np.unique(unit[unit >= 0]).tolist():
        mine = np.zeros_like(rows)
        mine[at[unit == u]] = True
        out[int(u)] = exposed_s(f, mine)
    return out


def _per_unit(f: Facts, blocked: Events) -> dict[int, float]:
    """Seconds per step the main thread spends in each unit's all-gather ranges."""
    unit = unit_of(f.trace, blocked)
    steps = max(f.steps.count, 1)
    out: dict[int, float] = {}
    for u in np.unique(unit).tolist():
        out[int(u)] = float(blocked.dur[unit == u].sum()) * NS / steps
    return out


# tp-allreduce-exposed ----------------------------------------------------------------------


_TP_KINDS = ("allreduce", "reducescatter")


def _tp_rows(f: Facts) -> npt.NDArray[np.bool_]:
    return _kernels(f, _TP_KINDS, FORWARD)


@once_per_facts
def _tp_wait(f: Facts) -> tuple[float, Events] | None:
    """Tensor parallel's collectives inside the forward the step waits for: seconds per step,
    and their host calls (None: none in the forward)."""
    if f.attribution is None:
        return None
    host = steady_collectives(f)
    # FSDP's reduce-scatters are the gradients', whatever phase the first of them is placed in.
    kinds = ("allreduce",) if len(fsdp_ranges(f.scope, "all_gather")) else _TP_KINDS
    forward = np.isin(host.kind, kinds) & (host.phase == FORWARD)
    if not forward.any():
        return None
    steps = max(f.steps.count, 1)
    calls = host.calls.take(np.flatnonzero(forward))
    if f.dev is None:
        return (float(_main(f, calls).dur.sum()) + _waits(f)) * NS / steps, calls
    rows = _tp_rows(f)
    if not rows.any():
        return None
    return exposed_s(f, rows), calls


def _tp_claim(f: Facts) -> Claim | None:
    wait = _tp_wait(f)
    return None if wait is None else strategy_claim(f, wait[0], "TP all-reduces in the forward")


@lever("async-tp")
def _async_tp_work(f: Facts) -> LeverWork | None:
    """The `async-tp` what-if's work: tensor parallel's collectives inside the forward (on
    the CPU with the functional collectives' waits for them); None: none the step waits
    for, as its finding counts them."""
    wait = _tp_wait(f)
    if wait is None or _tp_claim(f) is None:
        return None
    if f.dev is not None:
        return LeverWork(ops=_tp_rows(f))
    return on_host(wait[1], _wait_events(f), main=f.main_thread)


@rule(Facts, id="tp-allreduce-exposed", replay=ASYNC_TP, work=_tp_rows, claims=_tp_claim)
def tp_allreduce_exposed(f: Facts) -> Finding | None:
    """Tensor parallel's all-reduces (reduce-scatters with sequence parallel) inside the
    forward of its layers, which the next layer waits for: on the critical path unless
    overlapped."""
    wait = _tp_wait(f)
    if wait is None:
        return None
    seconds, calls = wait
    steps = max(f.steps.count, 1)
    share = f.share(seconds / f.step_s) if f.step_s > 0 else 0.0
    if share < f.thresholds.time.min_share:
        return None
    per_step = len(calls) / steps
    reach = min(share, f.hideable)
    return make_finding(
        f,
        "tp-allreduce-exposed",
        "overhead",
        "Tensor parallel's all-reduces sit on the critical path of the forward",
        share,
        f"{share:.0%} of each step ({ms_text(share * f.step_s)}) waits for the "
        f"{per_step:g} all-reduces/step inside the forward (a layer's partial outputs summed "
        f"before the next layer can start), {ms_text(seconds / max(per_step, 1))} "
        f"each; the compute they could hide behind is {reach:.0%} of the step (the bound)",
        "overlap tensor parallel's communication with its matmuls: async TP "
        "(torch._inductor.config._micro_pipeline_tp with torch.compile and "
        "enable_symm_mem_for_group), sequence parallel (SequenceParallel / "
        "PrepareModuleInput with Shard(1)) to turn each all-reduce into a reduce-scatter and an "
        "all-gather that overlap; keep TP inside a node (NVLink) and use data or pipeline "
        "parallel across nodes",
        speedup=amdahl(reach),
        reach=reach,
    )


def _waits(f: Facts) -> float:
    """Nanoseconds in the steady steps the main thread waits in functional collectives'
    `wait_tensor` inside the forward (the all-reduce's result awaited)."""
    return float(_wait_events(f).dur.sum())


def _wait_events(f: Facts) -> Events:
    """The main thread's functional collectives' `wait_tensor` in the steady steps' forward
    (outermost)."""
    trace = f.trace
    ops = (Kind.CPU_OP,)
    ev = trace.named(ops, trace.names_matching(lambda s: s.endswith("::wait_tensor"), ops))
    ev = ev.take(np.flatnonzero(in_windows(ev.ts, f.scope.window_start, f.scope.window_end)))
    if not len(ev) or f.attribution is None:
        return ev.take(np.zeros(0, np.intp))
    phase, _ = f.attribution.place_calls(ev.thread, ev.ts)
    return _main(f, ev.take(np.flatnonzero(phase == FORWARD)))
