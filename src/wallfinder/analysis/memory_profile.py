"""Memory from a profiler trace's `[memory]` events (`profile_memory=True`): pure functions.

Each event is one allocation (bytes > 0) or free (bytes < 0) of the block at an address, with
the allocator's totals after it. Per device, this finds the peak of allocated bytes and when
it happens (step, phase, op), replays the events (the one allocate/free replay of
`wallfinder.analysis.allocations`, shared with allocator snapshots) to say what is live then,
measures the level
at the start of each step (growth: a leak), and counts the allocator's reserved memory
growing and shrinking (device mallocs and frees).

What a block holds is a heuristic on when it was allocated and freed, not a fact the
allocator records:
- allocated in the forward pass and kept past it: activations (saved for backward, outputs);
  `retained` when kept into a later step (outputs and losses kept across steps, or a leak);
- allocated in the backward pass and kept past it: gradients;
- allocated in the optimizer and kept past it: optimizer state;
- allocated and freed within one phase of one step: temporaries;
- allocated before the first step and never freed: parameters (the model made, moved or
  loaded before the loop);
- allocated between steps: other (inputs, data); allocated before the trace: `before_trace`.

Only the backward pass makes gradients: a trace with no backward (a forward-only or
inference run, compiled or not) has none. A leak is growth that persists across steps: the
level at the steps' starts rising, with blocks allocated in one step still alive at the end
of later ones (the one rule of `wallfinder.analysis.allocations`); what the backward pass
frees, and gradients held until the optimizer step, are not.

These are `PROFILE_CATEGORIES` of the one vocabulary (`wallfinder.diagnosis.MEMORY_CATEGORIES`).

The phase of an event comes from what encloses it on its thread: an
`autograd::engine::evaluate_function` op or the `backward` Python call is the backward pass,
an `Optimizer.step#`/`Optimizer.zero_grad#` annotation the optimizer, the rest of a step the
forward pass.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.allocations import Replay, by_site, rank_sites, step_growth
from wallfinder.analysis.findings import Facts
from wallfinder.analysis.intervals import Coverage
from wallfinder.analysis.phases import optimizer_codes, user_frames
from wallfinder.analysis.roofline import enclosing, enclosing_of
from wallfinder.analysis.rules import evaluate, rule
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.steps import StepSpans
from wallfinder.analysis.thresholds import MemoryThresholds, Thresholds
from wallfinder.diagnosis import (
    PROFILE_CATEGORIES,
    DeviceMemoryProfile,
    Finding,
    MemoryBlock,
    MemoryLeak,
    MemoryPoint,
    MemoryProfile,
    StepMemory,
)
from wallfinder.trace import NONE, Events, Kind, MemoryEvents, Trace, thread_key
from wallfinder.units import short_frame, size

__all__ = ["MemoryFacts", "device_label", "memory_profile"]

I64 = npt.NDArray[np.int64]
NS = 1e-9

PHASES = ("forward", "backward", "optimizer", "between steps")
FORWARD, BACKWARD, OPTIMIZER, BETWEEN = range(4)
_CAT = {c: i for i, c in enumerate(PROFILE_CATEGORIES)}
# Category of a block kept past the phase that allocated it, by that phase.
_KEPT = np.array([_CAT["activations"], _CAT["gradients"], _CAT["optimizer_state"], _CAT["other"]])

_DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps", 19: "mtia"}


def device_label(device_type: int, device_id: int) -> str:
    """ "cuda:0", "cpu", ... from c10's device type and index."""
    name = _DEVICE_TYPES.get(device_type, f"device-type-{device_type}")
    return name if device_id < 0 else f"{name}:{device_id}"


def memory_profile(
    scope: Scope, capacity: int | None = None, capacity_source: str | None = None
) -> MemoryProfile | None:
    """The memory profile of every device with `[memory]` events (None when there are
    none). The findings are about the scope's device (the analysed accelerator, or the CPU
    of a CPU-only trace), whose capacity is `capacity` bytes."""
    trace, spans, kept, thresholds = scope.trace, scope.spans, scope.kept, scope.thresholds
    device = scope.dev.device if scope.dev is not None else None
    world_size = trace.world_size
    limits = thresholds.memory
    mem = trace.memory
    # An allocator's total is never negative: an event that says so is not usable.
    usable = (mem.bytes != NONE) & (mem.total_allocated >= 0) & (mem.bytes != 0)
    if not usable.any():
        return None
    mem = mem.take(np.flatnonzero(usable))
    ctx = _Context.of(trace, mem, spans)
    found = set(zip(mem.device_type.tolist(), mem.device_id.tolist(), strict=True))
    main = _main_device(found, device)
    keys = sorted(found, key=lambda k: (k != main, k))
    profiles: list[DeviceMemoryProfile] = []
    notes: list[str] = []
    findings: list[Finding] = []
    for key in keys:
        rows = np.flatnonzero((mem.device_type == key[0]) & (mem.device_id == key[1]))
        is_main = key == main
        facts, device_notes = _device(
            ctx,
            rows,
            spans,
            kept,
            key,
            capacity if is_main else None,
            capacity_source if is_main else None,
            world_size,
            thresholds,
        )
        profiles.append(facts.profile)
        notes.extend(device_notes)
        if is_main:
            findings = evaluate(facts)
            p = facts.profile
            if p.capacity and not _under_pressure(p, limits):
                what = "reserved" if p.peak_reserved >= p.peak_allocated else "allocated"
                notes.append(
                    f"{p.device}: peak {what} memory ({size(_in_use(p))}) is "
                    f"{_in_use(p) / p.capacity:.0%} of its {size(p.capacity)}: memory is not "
                    "the limit, so no fix that trades time for memory is suggested (a larger "
                    "batch may use the device better)"
                )
    if any(k[0] == 0 for k in keys):
        notes.append(
            "cpu: the profiler counts only host memory allocated while it records: blocks "
            "allocated before the trace (parameters, optimizer state) are not in these figures"
        )
    if not ctx.has_stacks:
        notes.append(
            "no Python stacks in the trace: call sites are ops (record with with_stack=True, "
            "or wallfinder run --memory, for the Python functions)"
        )
    return MemoryProfile(devices=profiles, findings=findings, notes=notes)


def _main_device(found: set[tuple[int, int]], device: int | None) -> tuple[int, int]:
    """The (device type, index) the findings are about: the analysed accelerator; the CPU
    of a CPU-only trace; else an accelerator, when the trace has its memory events but no
    kernels."""
    if device is not None:
        match = [k for k in found if k[0] != 0 and k[1] == device]
        if match:
            return min(match)
    elif (0, -1) in found:
        return (0, -1)
    return min(found, key=lambda k: (k[0] == 0, k))


def _in_use(p: DeviceMemoryProfile) -> int:
    return max(p.peak_reserved, p.peak_allocated)


def _under_pressure(p: DeviceMemoryProfile, limits: MemoryThresholds) -> bool:
    """Whether memory may be the limit: the peak uses enough of a known capacity (an unknown
    capacity may be full)."""
    return p.capacity is None or _in_use(p) >= limits.pressure * p.capacity


class _Context(msgspec.Struct, frozen=True):
    """Per memory event: its op, call site, step and phase."""

    trace: Trace
    mem: MemoryEvents
    op_row: I64
    """Row in `ops` of the innermost CPU op around the event (NONE: none)."""
    site: I64
    """Index in `sites` of its user-code call stack (NONE: no Python frames around it)."""
    sites: list[str]
    step: I64
    """Index of the step it falls in (NONE: between steps)."""
    phase: I64
    has_stacks: bool
    ops: Events

    @classmethod
    def of(cls, trace: Trace, mem: MemoryEvents, spans: StepSpans) -> _Context:
        ops = trace.of_kind(Kind.CPU_OP)
        # The innermost op that does more than allocate: `aten::empty` names no culprit.
        # (Found among those ops' times alone: a copy of all their columns is large.)
        real = np.flatnonzero(~np.isin(ops.name, trace.names_matching(_allocates_only)))
        op_row = _innermost(ops, mem, real)
        user = user_frames(trace)
        frame = _innermost(user, mem)
        site, sites = _call_stacks(trace, user, frame)
        step = np.searchsorted(spans.cpu_start, mem.ts, side="right") - 1
        inside = (step >= 0) & (mem.ts < spans.cpu_end[np.maximum(step, 0)])
        if spans.whole:
            inside[:] = True
            step[:] = len(spans.labels) - 1  # the analysed window (after any start-up)
        step = np.where(inside, step, NONE)
        phase = np.full(len(mem), FORWARD, dtype=np.int64)
        phase[_covered(trace, mem, _backward_codes(trace))] = BACKWARD
        phase[_covered(trace, mem, optimizer_codes(trace))] = OPTIMIZER
        phase[~inside] = BETWEEN
        return cls(
            trace=trace,
            mem=mem,
            op_row=op_row,
            site=site,
            sites=sites,
            step=step.astype(np.int64),
            phase=phase,
            has_stacks=len(trace.of_kind(Kind.PYTHON)) > 0,
            ops=ops,
        )

    def name(self, code: int) -> str | None:
        return self.trace.strings[code] if code >= 0 else None

    def op(self, i: int) -> str | None:
        """The op around event `i`."""
        row = int(self.op_row[i])
        return self.trace.strings[int(self.ops.name[row])] if row >= 0 else None

    def stack(self, i: int) -> str | None:
        code = int(self.site[i])
        return self.sites[code] if code >= 0 else None

    def where(self, i: int) -> str:
        """The call site of event `i` (else its op)."""
        return self.stack(i) or self.op(i) or "unknown"


_ALLOCATION_OPS = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::resize_",
        "aten::zeros",
        "aten::zeros_like",
        "aten::new_zeros",
        "aten::zero_",
        "aten::fill_",
    }
)


def _allocates_only(name: str) -> bool:
    return name in _ALLOCATION_OPS


def _innermost(events: Events, mem: MemoryEvents, rows: I64 | None = None) -> I64:
    """Row of the innermost of `events` (of their `rows` alone, when given) around each
    memory event on its thread (NONE: none). The rows' times are read, not all their
    columns copied."""
    if len(events) == 0 or (rows is not None and rows.size == 0):
        return np.full(len(mem), NONE, dtype=np.int64)
    if rows is None:
        return np.asarray(enclosing(events, mem.thread, mem.ts), dtype=np.int64)
    ts = events.ts[rows]
    # Each column gathered before it is derived (`events.thread` and `events.end` would be
    # made for every row first), and handed over unnamed, to be dropped once read.
    found = np.asarray(
        enclosing_of(
            thread_key(events.pid[rows], events.tid[rows]),
            ts,
            ts + events.dur[rows],
            mem.thread,
            mem.ts,
        ),
        dtype=np.int64,
    )
    return np.where(found >= 0, rows[np.maximum(found, 0)], NONE)


STACK_DEPTH = 3
"""User-code frames named in a call site: the innermost and its callers."""


def _call_stacks(trace: Trace, user: Events, frame: I64) -> tuple[I64, list[str]]:
    """Each memory event's user-code call stack (innermost frame first, "a ← b ← c"), as an
    index into the list of distinct stacks (NONE where no frame encloses it)."""
    if len(user) == 0:
        return frame, []
    rows = np.unique(frame[frame >= 0])
    levels = [rows]
    for _ in range(STACK_DEPTH - 1):
        levels.append(_caller(user, levels[-1]))
    # Name codes of each frame and its callers; stacks are few, frame events many.
    chains = np.stack([np.where(r >= 0, user.name[np.maximum(r, 0)], NONE) for r in levels], 1)
    distinct, codes = np.unique(chains, axis=0, return_inverse=True)
    names = [
        " ← ".join(short_frame(trace.strings[int(c)]) for c in chain if c >= 0)
        for chain in distinct.tolist()
    ]
    site = np.full(frame.size, NONE, dtype=np.int64)
    known = frame >= 0
    site[known] = codes.reshape(-1)[np.searchsorted(rows, frame[known])]
    return site, names


def _caller(user: Events, rows: I64) -> I64:
    """The user frame around each of `rows` (NONE: none, or `rows` is NONE)."""
    out = np.full(rows.size, NONE, dtype=np.int64)
    known = rows >= 0
    if not known.any():
        return out
    r = rows[known]
    parent = np.asarray(enclosing(user, user.thread[r], user.ts[r] - 1), dtype=np.int64)
    # Just before a frame starts, the innermost frame around that instant is its caller,
    # unless an earlier sibling ends right there: a caller must outlast the frame.
    valid = (parent >= 0) & (user.end[np.maximum(parent, 0)] >= user.end[r])
    out[np.flatnonzero(known)[valid]] = parent[valid]
    return out


def _backward_codes(trace: Trace) -> npt.NDArray[np.int32]:
    return trace.names_matching(
        lambda s: (
            s.startswith("autograd::engine::evaluate_function")
            or (
                s.endswith("): backward")
                and s.startswith(("torch/_tensor.py(", "torch/autograd/__init__.py("))
            )
        )
    )


def _covered(
    trace: Trace, mem: MemoryEvents, codes: npt.NDArray[np.int32]
) -> npt.NDArray[np.bool_]:
    """Whether each memory event lies inside one of the named events on its own thread."""
    spans = trace.named((Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON), codes)
    if len(spans) == 0 or len(mem) == 0:
        return np.zeros(len(mem), dtype=bool)
    _, rank = np.unique(np.concatenate([spans.thread, mem.thread]), return_inverse=True)
    lo = int(min(spans.ts.min(), mem.ts.min()))
    width = int(max(spans.end.max(), mem.ts.max()) - lo) + 2
    key = rank.astype(np.int64) * width
    s_key, m_key = key[: len(spans)], key[len(spans) :]
    # One time line with each thread's events in a band of its own.
    cover = Coverage.of(s_key + (spans.ts - lo), s_key + (spans.end - lo))
    return cover.contains(m_key + (mem.ts - lo))


class MemoryFacts(msgspec.Struct, frozen=True, dict=True):  # dict: the cached property
    """What the memory rules look at: one device's memory profile from a trace's memory
    events, what the replay measured beyond it, the job's world size and the thresholds."""

    profile: DeviceMemoryProfile
    activation_fp32: int
    """Bytes of the activations live at the peak allocated by ops with fp32 inputs."""
    growth: int
    """Growth of allocated bytes over the steady-state steps."""
    steady_steps: int
    world_size: int | None
    thresholds: Thresholds

    @property
    def limits(self) -> MemoryThresholds:
        return self.thresholds.memory

    @property
    def peak(self) -> int:
        """Allocated bytes at the peak (at least 1: shares are of it)."""
        return max(self.profile.peak_allocated, 1)

    @property
    def pressure(self) -> bool:
        """Whether memory may be the limit: else no fix that trades time for memory."""
        return _under_pressure(self.profile, self.limits)

    @cached_property
    def where(self) -> str:
        """The peak in words, for the evidence."""
        p = self.profile
        return (
            f"at the peak ({size(p.peak_allocated)} allocated"
            + (f", {p.peak_step}" if p.peak_step else "")
            + f", {p.peak_phase}"
            + (f", in {p.peak_op}" if p.peak_op else "")
            + ")"
        )


def _device(
    ctx: _Context,
    rows: I64,
    spans: StepSpans,
    kept: npt.NDArray[np.bool_],
    key: tuple[int, int],
    capacity: int | None,
    capacity_source: str | None,
    world_size: int | None,
    thresholds: Thresholds,
) -> tuple[MemoryFacts, list[str]]:
    """The device's memory facts (its profile), and notes on what could not be measured."""
    limits = thresholds.memory
    mem = ctx.mem.take(rows)
    # A free with no allocation before it is of a block from before the trace.
    replay = Replay.of(mem.addr, np.abs(mem.bytes), np.sign(mem.bytes))
    free_of = replay.free_of
    if key[0] == 0:
        # The CPU's totals count what earlier profiling sessions of the process allocated, and
        # some but not all of its frees: only the blocks allocated in the trace are counted.
        mine = mem.bytes > 0
        mine[free_of[free_of >= 0]] = True
        mem = replace(mem, total_allocated=np.cumsum(np.where(mine, mem.bytes, 0)))
    n = len(mem)
    label = device_label(*key)
    step, phase = ctx.step[rows], ctx.phase[rows]
    alloc = mem.bytes > 0
    freed = free_of >= 0
    block_cat, event_cat = _categories(mem, free_of, step, phase, spans)
    baseline = max(int(mem.total_allocated[0] - mem.bytes[0]), 0)
    running = np.zeros((len(PROFILE_CATEGORIES), n), dtype=np.int64)
    for c in range(len(PROFILE_CATEGORIES)):
        running[c] = np.cumsum(np.where(event_cat == c, mem.bytes, 0))
    running[_CAT["before_trace"]] += baseline
    np.maximum(running, 0, out=running)

    p = int(np.argmax(mem.total_allocated))
    peak = int(mem.total_allocated[p])
    residual = peak - int(running[:, p].sum())
    _reconcile(running, mem.total_allocated)
    at_peak = {c: int(running[i, p]) for i, c in enumerate(PROFILE_CATEGORIES)}
    notes: list[str] = []
    if abs(residual) > 0.01 * max(peak, 1):
        notes.append(
            f"{label}: the allocator's total at the peak and the replayed events differ by "
            f"{size(abs(residual))} (events missing from the trace): categories are partial"
        )
    live = np.flatnonzero(alloc & (np.arange(n) <= p) & (~freed | (free_of > p)))
    live = live[np.argsort(-mem.bytes[live], kind="stable")]
    largest = [
        MemoryBlock(
            bytes=int(mem.bytes[i]),
            category=PROFILE_CATEGORIES[int(block_cat[i])],
            op=ctx.op(int(rows[i])),
            site=ctx.stack(int(rows[i])),
            step=_step_label(spans, int(step[i])),
            phase=PHASES[int(phase[i])],
        )
        for i in live[: limits.top].tolist()
    ]
    sites = rank_sites(
        (
            (ctx.where(int(rows[i])), PROFILE_CATEGORIES[int(block_cat[i])], int(mem.bytes[i]))
            for i in live.tolist()
        ),
        limits.top,
    )
    steps = _steps(mem, spans, kept, baseline)
    growth_per_step, growth, leak, steady = _growth(steps, peak, limits)
    leak_sites = _leak_sites(ctx, rows, mem, replay, step, kept) if leak else []
    if leak and not leak_sites:
        notes.append(
            f"{label}: allocated memory grows every step, but no call site's blocks stay "
            "allocated across steps in the trace: the growth is in blocks freed later"
        )
    reserved = mem.total_reserved
    known_reserved = bool((reserved != NONE).all())
    diffs = np.diff(reserved) if known_reserved else np.zeros(0, np.int64)
    steady_changes = sum(s.reserved_changes for s in steps if not s.warmup)
    profile = DeviceMemoryProfile(
        device=label,
        events=n,
        capacity=capacity,
        capacity_source=capacity_source,
        peak_allocated=peak,
        peak_reserved=int(reserved.max()) if known_reserved else 0,
        peak_time_s=float(mem.ts[p]) * NS,
        peak_step=_step_label(spans, int(step[p])),
        peak_phase=PHASES[int(phase[p])],
        peak_op=ctx.op(int(rows[p])),
        before_trace=baseline,
        categories=at_peak,
        largest=largest,
        sites=sites,
        steps=steps,
        growth_per_step=growth_per_step,
        leak=leak,
        leak_sites=leak_sites,
        reserved_at_peak=int(reserved[p]) if known_reserved else 0,
        reserved_grows=int((diffs > 0).sum()),
        reserved_shrinks=int((diffs < 0).sum()),
        steady_reserved_changes_per_step=steady_changes / max(steady, 1) if steady else 0.0,
        timeline=_timeline(mem, running, p, limits.timeline_points),
    )
    activations = alloc & (block_cat == _CAT["activations"])
    act_live = live[activations[live]]
    fp32 = _fp32_bytes(ctx, rows[act_live], mem.bytes[act_live])
    return MemoryFacts(profile, fp32, growth, steady, world_size, thresholds), notes


_SURPLUS_ORDER = [
    _CAT[c]
    for c in (
        "before_trace",
        "other",
        "temporaries",
        "retained",
        "activations",
        "gradients",
        "optimizer_state",
        "parameters",
    )
]
"""Where the replay's bytes that the allocator does not count are taken from: the least
certain categories first."""


def _reconcile(running: I64, total: I64) -> None:
    """Make the categories at each event (`running`, in place) split the allocator's total
    after it, as `categories` promise. They differ only when events are missing from the
    trace: bytes the allocator counts but no event shows are `other` (unknown); bytes the
    events show but the allocator does not count (frees missing) are taken from the least
    certain categories first. The profile's notes say the categories are partial then."""
    gap = total - running.sum(axis=0)
    running[_CAT["other"]] += np.maximum(gap, 0)
    surplus = np.maximum(-gap, 0)
    for c in _SURPLUS_ORDER:
        take = np.minimum(running[c], surplus)
        running[c] -= take
        surplus -= take


def _categories(
    mem: MemoryEvents, free_of: I64, step: I64, phase: I64, spans: StepSpans
) -> tuple[I64, I64]:
    """The category of each allocation (its block's), then of each event: a free takes its
    block's category, a free of a block from before the trace is `before_trace`."""
    n = len(mem)
    alloc = mem.bytes > 0
    freed = free_of >= 0
    j = np.maximum(free_of, 0)
    same = freed & (step[j] == step) & (phase[j] == phase) & (step >= 0)
    block_cat = np.where(same, _CAT["temporaries"], _KEPT[phase])
    # Forward blocks that outlive their step: freed in a later one, or never while later
    # steps ran.
    later = np.where(freed, step[j] > step, step < step.max(initial=0))
    block_cat[(phase == FORWARD) & (step >= 0) & later] = _CAT["retained"]
    if not spans.whole and spans.cpu_start.size:
        # Allocated before the first step and never freed: the model's state made, moved or
        # loaded before the loop (parameters), as far as the trace can tell.
        block_cat[alloc & ~freed & (mem.ts < spans.cpu_start[0])] = _CAT["parameters"]
    event_cat = np.full(n, _CAT["before_trace"], dtype=np.int64)
    event_cat[alloc] = block_cat[alloc]
    matched_free = free_of[alloc & freed]
    event_cat[matched_free] = block_cat[alloc & freed]
    return block_cat, event_cat


def _step_label(spans: StepSpans, step: int) -> str | None:
    return spans.labels[step] if 0 <= step < len(spans.labels) else None


def _steps(
    mem: MemoryEvents, spans: StepSpans, kept: npt.NDArray[np.bool_], baseline: int
) -> list[StepMemory]:
    if spans.whole:
        return []
    first = np.searchsorted(mem.ts, spans.cpu_start, side="left")
    last = np.searchsorted(mem.ts, spans.cpu_end, side="left")
    reserved = mem.total_reserved
    out = []
    for k, label in enumerate(spans.labels):
        a, b = int(first[k]), int(last[k])
        level = int(mem.total_allocated[a - 1]) if a > 0 else baseline
        window = slice(a, b)
        res = reserved[max(a - 1, 0) : b]
        out.append(
            StepMemory(
                step=label,
                start_s=float(spans.cpu_start[k]) * NS,
                end_s=float(spans.cpu_end[k]) * NS,
                start_allocated=level,
                end_allocated=int(mem.total_allocated[b - 1]) if b > 0 else baseline,
                peak_allocated=max(level, int(mem.total_allocated[window].max(initial=0))),
                peak_reserved=int(reserved[window].max(initial=0)),
                reserved_changes=int((np.diff(res) != 0).sum()) if res.size > 1 else 0,
                warmup=not bool(kept[k]),
            )
        )
    return out


def _growth(
    steps: list[StepMemory], peak: int, limits: MemoryThresholds
) -> tuple[float | None, int, bool, int]:
    """(slope of allocated bytes at the steady steps' boundaries, per step; the growth it
    makes over them; whether it is a leak; steady steps)."""
    steady = [s for s in steps if not s.warmup]
    levels = np.array(
        [s.start_allocated for s in steady] + [steady[-1].end_allocated] if steady else [],
        dtype=np.float64,
    )
    g = step_growth(levels, peak, limits)
    return g.per_step, g.bytes, g.leak, len(steady)


def _leak_sites(
    ctx: _Context,
    rows: I64,
    mem: MemoryEvents,
    replay: Replay,
    step: I64,
    kept: npt.NDArray[np.bool_],
) -> list[MemoryLeak]:
    """Call sites whose blocks, allocated in at least two of the steady-state steps before
    the last, are never freed in the trace."""
    members = replay.kept_across(step, np.flatnonzero(kept))
    out = []
    for site, items in by_site(members, lambda i: ctx.where(int(rows[i])), step).items():
        ops = [ctx.op(int(rows[i])) for i in items]
        op = max(set(ops), key=ops.count, default=None)
        out.append(
            MemoryLeak(
                site=site,
                op=op,
                count=len(items),
                bytes=int(mem.bytes[items].sum()),
                steps=len({int(step[i]) for i in items}),
            )
        )
    out.sort(key=lambda s: -s.bytes)
    return out[:5]


def _timeline(mem: MemoryEvents, running: I64, peak: int, points: int) -> list[MemoryPoint]:
    """At most `points` points: in each slice of time, the event with the most allocated
    bytes, and the peak itself."""
    n = len(mem)
    if n == 0:
        return []
    edges = np.linspace(float(mem.ts[0]), float(mem.ts[-1]) + 1.0, points + 1)
    bucket = np.searchsorted(edges, mem.ts, side="right") - 1
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    best = [
        int(a + np.argmax(mem.total_allocated[a:b]))
        for a, b in zip(starts.tolist(), [*starts[1:].tolist(), n], strict=True)
    ]
    chosen = sorted({*best, peak, 0, n - 1})
    return [
        MemoryPoint(
            t_s=float(mem.ts[i]) * NS,
            allocated=int(mem.total_allocated[i]),
            reserved=int(mem.total_reserved[i]) if mem.total_reserved[i] != NONE else 0,
            categories={c: int(running[k, i]) for k, c in enumerate(PROFILE_CATEGORIES)},
        )
        for i in chosen
    ]


def _fp32_bytes(ctx: _Context, rows: I64, nbytes: I64) -> int:
    """Bytes of these allocations made by ops whose recorded inputs are fp32 tensors."""
    total = 0
    for r, b in zip(ctx.op_row[rows].tolist(), nbytes.tolist(), strict=True):
        if r < 0:
            continue
        code = int(ctx.ops.input_type[r])
        if code <= 0:
            continue
        types = ctx.trace.input_dtypes(code)
        if types is not None and "fp32" in types and not ({"bf16", "fp16"} & set(types)):
            total += b
    return total


# The memory rules: findings on the analysed device, each with the most its fix frees at the
# peak. The fixes that trade time for memory are for a device under pressure only.


def _finding(
    f: MemoryFacts, id_: str, title: str, evidence: str, fix: str, saving: int | None
) -> Finding:
    return Finding.memory(
        id=id_,
        title=title,
        evidence=evidence,
        fix=fix,
        saving_bytes=saving,
        device=f.profile.device,
    )


def _activations_fill(f: MemoryFacts) -> bool:
    """Whether activations take enough of the peak, on a device under pressure."""
    return f.pressure and f.profile.categories["activations"] >= f.limits.activation_share * f.peak


@rule(MemoryFacts)
def activations(f: MemoryFacts) -> Finding | None:
    if not _activations_fill(f):
        return None
    act = f.profile.categories["activations"]
    return _finding(
        f,
        "memory-activations",
        "Activations fill most of the memory at the peak",
        f"activations are {size(act)} ({act / f.peak:.0%}) {f.where}",
        "activation checkpointing (torch.utils.checkpoint around the blocks that keep the "
        "most, or FSDP/DeepSpeed activation checkpointing): they are recomputed in the "
        "backward pass, at the cost of about one more forward pass of compute",
        act,
    )


@rule(MemoryFacts)
def fp32_activations(f: MemoryFacts) -> Finding | None:
    act = f.profile.categories["activations"]
    if not _activations_fill(f) or f.activation_fp32 < f.limits.fp32_share * act:
        return None
    return _finding(
        f,
        "memory-bf16",
        "Activations are kept in fp32",
        f"{size(f.activation_fp32)} of the activations live {f.where} come from ops "
        "with fp32 inputs",
        "bf16 autocast (torch.autocast(device_type, dtype=torch.bfloat16)) halves "
        "what the activations take",
        f.activation_fp32 // 2,
    )


@rule(MemoryFacts)
def micro_batch(f: MemoryFacts) -> Finding | None:
    if not _activations_fill(f):
        return None
    act, temps = f.profile.categories["activations"], f.profile.categories["temporaries"]
    return _finding(
        f,
        "memory-micro-batch",
        "A smaller micro-batch would lower the peak",
        f"activations and temporaries are {size(act + temps)} "
        f"({(act + temps) / f.peak:.0%}) {f.where}; they grow with the batch",
        "halve the micro-batch and accumulate gradients over two of them (the same "
        "effective batch; more, smaller steps)",
        (act + temps) // 2,
    )


def _model_state(f: MemoryFacts) -> tuple[int, str] | None:
    """Parameters, gradients and optimizer state at the peak (bytes, in words), when they
    take enough of it on a device under pressure, near capacity or with optimizer state."""
    p, cats = f.profile, f.profile.categories
    params = cats["parameters"] + cats["before_trace"]
    state = params + cats["optimizer_state"] + cats["gradients"]
    near = p.capacity is not None and p.peak_reserved >= f.limits.near_capacity * p.capacity
    if not (
        f.pressure
        and state >= f.limits.state_share * f.peak
        and (near or cats["optimizer_state"] > 0)
    ):
        return None
    return state, (
        f"parameters, gradients and optimizer state ({size(params)} of parameters and "
        f"blocks allocated before the trace, {size(cats['gradients'])} of gradients, "
        f"{size(cats['optimizer_state'])} of optimizer state) are {size(state)} "
        f"({state / f.peak:.0%}) {f.where}"
    )


@rule(MemoryFacts)
def shard_state(f: MemoryFacts) -> Finding | None:
    found = _model_state(f)
    if found is None or f.world_size is None or f.world_size <= 1:
        return None
    state, what = found
    return _finding(
        f,
        "memory-shard-state",
        "Each rank keeps a full copy of the model's state",
        what,
        f"shard optimizer state, gradients and parameters across the {f.world_size} "
        "ranks (FSDP, or ZeRO stages 1-3)",
        int(state * (1 - 1 / f.world_size)),
    )


@rule(MemoryFacts)
def offload_state(f: MemoryFacts) -> Finding | None:
    found = _model_state(f)
    if found is None or (f.world_size is not None and f.world_size > 1):
        return None
    cats = f.profile.categories
    return _finding(
        f,
        "memory-offload",
        "The model's state takes most of the memory",
        found[1],
        "offload optimizer state to host memory (FSDP CPUOffload, DeepSpeed ZeRO "
        "offload), or shard it across GPUs; an 8-bit optimizer shrinks it",
        cats["optimizer_state"] + cats["parameters"] + cats["before_trace"] or None,
    )


@rule(MemoryFacts)
def fragmentation(f: MemoryFacts) -> Finding | None:
    p, limits = f.profile, f.limits
    cached = p.reserved_at_peak - p.peak_allocated
    if not (
        f.pressure
        and p.device != "cpu"
        and p.reserved_at_peak >= limits.fragmentation_ratio * p.peak_allocated
        and cached
        >= max(
            limits.fragmentation_bytes,
            limits.fragmentation_capacity_share * (p.capacity or 0),
        )
    ):
        return None
    return _finding(
        f,
        "memory-fragmentation",
        "Reserved memory is far above what is allocated",
        f"{size(p.reserved_at_peak)} reserved but {size(p.peak_allocated)} allocated "
        f"at the peak: {size(cached)} held by the allocator but unused (freed blocks from "
        "an earlier, larger peak, or fragments too small for the requests)"
        + (
            f"; reserved memory grew {p.reserved_grows} times in the trace"
            if p.reserved_grows
            else ""
        ),
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets segments grow instead of "
        "splitting; keep tensor shapes stable",
        cached,
    )


@rule(MemoryFacts)
def churn(f: MemoryFacts) -> Finding | None:
    p = f.profile
    if p.device == "cpu" or p.steady_reserved_changes_per_step < f.limits.churn_per_step:
        return None
    return _finding(
        f,
        "memory-churn",
        "The allocator gets and releases device memory every step",
        f"reserved memory changed {p.steady_reserved_changes_per_step:.1f} times per "
        "steady-state step (device mallocs and frees, which synchronise)",
        "no torch.cuda.empty_cache() in the loop; PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True; stable shapes (pad or bucket variable lengths)",
        None,
    )


@rule(MemoryFacts)
def leak(f: MemoryFacts) -> Finding | None:
    p = f.profile
    if not p.leak:
        return None
    sites = "; ".join(
        f"{s.site} ({size(s.bytes)} in {s.count} blocks over {s.steps} steps)"
        for s in p.leak_sites[:3]
    )
    rate = p.growth_per_step or 0.0
    horizon = ""
    if p.capacity and rate > 0:
        left = max(p.capacity - p.peak_reserved, 0)
        horizon = f"; at this rate the device is full in about {left / rate:,.0f} more steps"
    return _finding(
        f,
        "memory-leak",
        "Allocated memory grows every step",
        f"allocated memory at the start of each step rises by {size(rate)} per step "
        f"({size(f.growth)} from the first to the last of {f.steady_steps} steady-state "
        f"steps){horizon}" + (f"; never freed: {sites}" if sites else ""),
        "do not keep tensors that hold their graph: log loss.item() or loss.detach() "
        "(every N steps), run evaluation under torch.no_grad(), and clear lists of "
        "outputs kept across steps",
        f.growth,
    )


@rule(Facts, id="memory-peak")
def memory_peak(f: Facts) -> Finding | None:
    """Device memory at its peak near capacity: not a time cost, a limit (batch size, OOM).
    A rank's finding, ranked with the time findings."""
    m = f.memory.main if f.memory is not None else None
    if m is None or f.dev is None or not m.capacity or m.device == "cpu":
        return None
    ratio = m.peak_reserved / m.capacity
    if ratio < f.thresholds.memory.near_capacity:
        return None
    when = ", ".join(x for x in (m.peak_step, m.peak_phase, m.peak_op) if x)
    return Finding(
        id="memory-peak",
        wall="overhead",
        title="Device memory peaks near capacity",
        share=0.0,
        max_speedup=1.0,
        evidence=(
            f"peak reserved {m.peak_reserved / 2**30:.1f} GiB ({ratio:.0%} of "
            f"{m.capacity / 2**30:.0f} GiB), peak allocated {m.peak_allocated / 2**30:.1f} GiB "
            f"({when}); no direct speedup: it caps the batch size and risks running out of "
            "memory (the memory findings say what fills it)"
        ),
        fix="activation checkpointing, bf16 autocast, a smaller micro-batch with gradient "
        "accumulation, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, sharded optimizer "
        "state (FSDP/ZeRO)",
    )
