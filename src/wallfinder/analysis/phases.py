"""Phases and modules: where in the model the step's time goes.

Every unit of work of the step (a device op, or on a CPU-only trace an outermost op of the
main thread) is placed in one phase, from what the trace records around the call that issued
it: inside an autograd node (`autograd::engine::evaluate_function: …Backward`, or any op
carrying a backward `Fwd thread id`) it is backward, whatever thread ran it; inside an
`Optimizer.step#…`/`Optimizer.zero_grad#…` range it is the optimizer's; a host-to-device
memcpy is the input copy; a collective is communication, and so is the work of the
frameworks' gradient reduction (DeepSpeed ZeRO-1/2's `reduce_ipg_grads`, Megatron's
`finish_grad_sync`: bucket scaling and copies, after the backward where it does not overlap
it); inside an `nn.Module` range, or
issued in the step before its first backward op, it is forward; the rest is other. The
DataLoader's `__next__` is data wait: GPU idle time while the host waits for a batch.

A phase has two times per step. Its *GPU time* is the union of its device ops' intervals
(phases run side by side on streams, so these need not sum to the step). Its *exposed time*
tiles the step: busy time goes to one phase in a fixed priority (backward, forward,
optimizer, other, communication, input copy: a collective or a copy under compute costs no
wall time), idle time to data wait where the host sat in the DataLoader, else to the phase of
the work the device waited for (the next op to start). Exposed times sum to the step.

Modules: each unit of work is attributed to the innermost module range around its call; a
backward op to the module of the forward op that made its autograd node, found by the
node's `Sequence number` on the forward thread its `Fwd thread id` names (the profiler's own
thread ids, matched to the trace's threads by the sequence numbers they share). Module times
roll up the module tree (a module's time holds its children's), and sibling instances of one
module class (`TransformerBlock_0` … `_31`) are collapsed into one row with their spread.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Literal

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import (
    classify_op,
    communication_ops,
    is_communication_op,
    is_data_loading,
)
from wallfinder.analysis.gpu import CLASSES, COMM, DeviceOps
from wallfinder.analysis.intervals import Coverage, in_windows
from wallfinder.analysis.roofline import Placement, Spans, enclosing, outermost
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.diagnosis import ModuleRow, Modules, ModuleSpread, Phases, StepPhases
from wallfinder.trace import NONE, Events, Kind, Trace, step_key, thread_key
from wallfinder.trace.dynamo import compile_range
from wallfinder.trace.names import module_name
from wallfinder.units import is_user_path

NS = 1e-9
I64 = npt.NDArray[np.int64]

PHASES = (
    "data_wait",
    "input_copy",
    "forward",
    "backward",
    "optimizer",
    "communication",
    "other",
)
DATA, COPY_IN, FORWARD, BACKWARD, OPTIMIZER, COMMUNICATION, OTHER = range(len(PHASES))
_BUSY_ORDER = (BACKWARD, FORWARD, OPTIMIZER, OTHER, COMMUNICATION, COPY_IN)
"""Which phase a busy instant belongs to when several run at once: compute first, then a
collective, then a copy (as the breakdown exposes communication and copies)."""

MODULE_PREFIX = "nn.Module: "
_NUMBER = re.compile(r"(?<![A-Za-z])\d+(?![A-Za-z])")
"""A number standing alone in a name (`Block_3`, `layer_7_ffn`, `layers.3.attn`; not the 2
of `Conv2d`): instances of one repeated block differ only there."""
MAX_MODULE_ROWS = 60
"""Module rows kept in the result (the largest, with every ancestor they need)."""
_BOUND_NAMES = ("unknown", "compute", "bandwidth")


class Work(msgspec.Struct, frozen=True):
    """The step's units of work, one row each: when and on which thread they were issued
    (NO_LAUNCH: unknown), how long they ran, their class index (`CLASSES`), roofline bound
    code (0 unknown, 1 compute, 2 bandwidth), and their interval on the analysed clock."""

    issued: I64
    thread: I64
    ts: I64
    end: I64
    cls: npt.NDArray[np.int8]
    bound: npt.NDArray[np.int8]
    input_copy: npt.NDArray[np.bool_]
    inside: npt.NDArray[np.bool_]
    """Starts inside a steady-state step."""
    pct: npt.NDArray[np.float64]
    """% of roof (NaN: unknown)."""
    fp32_no_tc: npt.NDArray[np.bool_]
    """An fp32 matmul that does not use the device's tensor cores."""

    @classmethod
    def calls(cls, thread: I64, ts: I64) -> Work:
        """Host calls (a sync, a copy) as units of work issued where they start, to ask
        where they sit."""
        n = ts.size
        zeros = np.zeros(n, dtype=np.int8)
        no = np.zeros(n, dtype=bool)
        return cls(ts, thread, ts, ts, zeros, zeros, no, no, np.full(n, np.nan), no)


class Attribution(msgspec.Struct, frozen=True):
    """Per unit of work: its phase (index in `PHASES`) and module row in `Modules.rows`
    (NONE: none), for the rules that name where a kernel sits."""

    phase: npt.NDArray[np.int8]
    module: I64
    phases: Phases
    modules: Modules | None
    scope: Scope
    ranges: _Ranges
    range_row: I64
    """Per module range: its row in `modules.rows` (NONE: not kept)."""
    work: Work
    recompute: npt.NDArray[np.bool_]
    """Backward work issued inside an `nn.Module` range: a forward re-run during the
    backward (activation checkpointing)."""

    def where(self, rows: npt.NDArray[np.bool_], weights: npt.NDArray[np.float64]) -> str:
        """The module and phase that hold most of the selected units of work (`weights`:
        each one's time), as a clause for a finding's evidence ("" when unknown)."""
        return _where(self, self.phase[rows], self.module[rows], weights[rows])

    def where_calls(self, thread: I64, ts: I64) -> str:
        """The same for host calls on `thread` at `ts` (syncs, copies), each weighing one."""
        phase, module = self.place_calls(thread, ts)
        return _where(self, phase, module, np.ones(ts.size))

    def place_calls(self, thread: I64, ts: I64) -> tuple[npt.NDArray[np.int8], I64]:
        """The phase and module row (NONE: none) of host calls on `thread` at `ts`."""
        work = Work.calls(thread, ts)
        phase, in_module, in_node = _place(self.scope, self.ranges, work)
        owner, _, _ = _owners(self.scope.trace, self.ranges, phase, in_module, in_node)
        module = np.full(ts.size, NONE, dtype=np.int64)
        if self.range_row.size:
            module = np.where(owner >= 0, self.range_row[np.maximum(owner, 0)], NONE)
        return phase, module


def _where(
    a: Attribution, phase: npt.NDArray[np.int8], module: I64, weights: npt.NDArray[np.float64]
) -> str:
    if phase.size == 0 or a.phases.evidence == []:
        return ""
    time = np.bincount(phase, weights=weights, minlength=len(PHASES))
    main = int(time.argmax())
    parts = []
    # The module that holds most of the main phase's share of the work.
    has = (module >= 0) & ((phase == main) | (main == OTHER))
    if a.modules is not None and has.any():
        top = int(np.bincount(module[has], weights=weights[has]).argmax())
        parts.append(f"module {a.modules.rows[top].path}")
    if main != OTHER:
        parts.append(f"the {PHASES[main].replace('_', ' ')} phase")
    return f" (mostly in {', '.join(parts)})" if parts else ""


def device_work(scope: Scope, placed: Placement) -> Work:
    """The device ops as units of work, with their place on the roofline."""
    dev: DeviceOps = scope.gpu
    trace, ops = scope.trace, dev.ops
    htod = trace.names_matching(lambda s: "htod" in s.lower().replace(" ", ""))
    return Work(
        issued=dev.launch_ts,
        thread=dev.launch_thread,
        ts=ops.ts,
        end=ops.end,
        cls=dev.cls,
        bound=placed.bound,
        input_copy=(ops.kind == Kind.MEMCPY) & np.isin(ops.name, htod),
        inside=scope.inside,
        pct=placed.pct,
        fp32_no_tc=placed.fp32_no_tc,
    )


def host_work(scope: Scope, ops: Events) -> Work:
    """The CPU's units of work on a CPU-only trace: the outermost of `ops` (the main
    thread's CPU ops, by start) and of the collectives' ranges on their threads, and the
    outermost autograd nodes of other threads (a backward the main thread waits for), each
    issued where it starts."""
    trace = scope.trace
    main = np.unique(ops.thread)
    # A collective's own range (`gloo:recv`, `nccl:all_reduce`) is where the thread blocks
    # in it, often past the op that posted it (`c10d::recv_` returns, the wait is the
    # range): as work it is communication, where as a gap it went to the phase of the work
    # after it (a pipeline stage's wait for its neighbour's gradients read as backward).
    comm = trace.named(
        (Kind.ANNOTATION,),
        communication_ops(trace),
    )
    # One inside an op (`record_param_comms` around it) is that op's; one that only begins
    # inside the op that posted it (the recorder's ranges overlap by a few µs) is its own.
    ops = ops.take(np.flatnonzero(outermost(ops)))
    comm = comm.take(np.flatnonzero(np.isin(comm.thread, main)))
    comm = comm.take(np.flatnonzero(outermost(comm)))
    if len(comm) and len(ops):
        before = np.searchsorted(ops.ts, comm.ts, side="right") - 1
        reach = np.maximum.accumulate(ops.end)[np.maximum(before, 0)]
        comm = comm.take(np.flatnonzero((before < 0) | (reach < comm.end)))
    if len(comm):
        order = np.argsort(np.concatenate([ops.ts, comm.ts]), kind="stable")
        ops = Events(
            **{
                f.name: np.concatenate([getattr(ops, f.name), getattr(comm, f.name)])[order]
                for f in fields(Events)
            }
        )
    outer = _ranges(trace).outer_backward
    nodes = trace.of_kind(Kind.CPU_OP).take(outer.rows[~np.isin(outer.thread, main)])
    if len(nodes):
        order = np.argsort(np.concatenate([ops.ts, nodes.ts]), kind="stable")
        ops = Events(
            **{
                f.name: np.concatenate([getattr(ops, f.name), getattr(nodes, f.name)])[order]
                for f in fields(Events)
            }
        )
    codes, inverse = np.unique(ops.name, return_inverse=True)
    index = {c: i for i, c in enumerate(CLASSES)}
    per_name = np.array(
        [index[classify_op(trace.strings[int(c)])] for c in codes.tolist()], dtype=np.int8
    )
    cls = per_name[inverse.reshape(-1)] if codes.size else np.zeros(0, np.int8)
    return Work(
        issued=ops.ts,
        thread=ops.thread,
        ts=ops.ts,
        end=ops.end,
        cls=cls,
        bound=np.zeros(len(ops), dtype=np.int8),
        input_copy=np.zeros(len(ops), dtype=bool),
        inside=in_windows(ops.ts, scope.window_start, scope.window_end),
        pct=np.full(len(ops), np.nan),
        fp32_no_tc=np.zeros(len(ops), dtype=bool),
    )


class _Nodes(msgspec.Struct, frozen=True):
    """Backward ranges (autograd's ops): the columns the phases read of some of the trace's
    CPU ops, by start (a copy of all of their columns is tens of MB on a large trace)."""

    rows: I64
    """Each range's row in the trace's CPU ops (`Trace.of_kind(Kind.CPU_OP)`)."""
    ts: I64
    end: I64
    thread: I64
    seq: I64
    fwd_thread: I64

    @classmethod
    def of(cls, cpu: Events, rows: I64) -> _Nodes:
        ts = cpu.ts[rows]
        thread = thread_key(cpu.pid[rows], cpu.tid[rows])
        return cls(rows, ts, ts + cpu.dur[rows], thread, cpu.seq[rows], cpu.fwd_thread[rows])

    def __len__(self) -> int:
        return int(self.ts.size)

    def take(self, index: npt.NDArray[np.intp]) -> _Nodes:
        return _Nodes(*(getattr(self, f)[index] for f in self.__struct_fields__))


class _Ranges(msgspec.Struct, frozen=True):
    """The host ranges that mark phases and modules, each sorted by start."""

    backward: _Nodes
    outer_backward: _Nodes
    """The backward ranges no other encloses on their thread: whether work is backward is
    asked of these (the innermost-range search gives up behind many nested nodes)."""
    optimizer: Events
    data: Events
    modules: Events
    module_source: str
    reducers: Events
    """The frameworks' gradient reduction frames (`is_grad_reducer`): their work is the
    gradient sync's, communication."""


CALL_SITES = "call sites"
"""`Modules.source` when the user's Python frames stand for modules."""


def user_frames(trace: Trace) -> Events:
    """The trace's Python frames of the user's code (recorded with stacks), by start time."""
    py = trace.of_kind(Kind.PYTHON)
    if len(py) == 0:
        return py
    frames = trace.names_matching(_is_user_frame, (Kind.PYTHON,))
    return py.take(np.flatnonzero(np.isin(py.name, frames)))


def _is_user_frame(name: str) -> bool:
    """A profiler Python frame ("path(line): function") of the user's code."""
    return "(" in name and is_user_path(name.split("(", 1)[0])


def _site(frame: str) -> str:
    """A call site's name in the module tree: the frame's file name, line and function
    ("train.py(42): step"), none of its folders (they name the machine, and a "/" is the
    tree's separator)."""
    path, paren, rest = frame.partition("(")
    return path.replace("\\", "/").rpartition("/")[2] + paren + rest.replace("/", "∕")


_GRAD_REDUCERS = (
    "reduce_ipg_grads",
    "average_tensor",
    "allreduce_and_copy",
    "allreduce_bucket",
    "reduce_independent_p_g_buckets_and_remove_grads",
    "finish_grad_sync",
    "start_grad_sync",
)
"""The functions DeepSpeed ZeRO-1/2 (stage_1_and_2.py) and Megatron's DDP
(distributed_data_parallel.py, param_and_grad_buffer.py) reduce gradients in."""


def is_grad_reducer(name: str) -> bool:
    """A Python frame of DeepSpeed's or Megatron's gradient reduction (`_GRAD_REDUCERS`)."""
    low = name.lower()
    return ("deepspeed" in low or "megatron" in low) and name.endswith(
        tuple(f": {f}" for f in _GRAD_REDUCERS)
    )


def optimizer_codes(trace: Trace) -> npt.NDArray[np.int32]:
    """The names of the optimizer's ranges (`Optimizer.step#…`, `Optimizer.zero_grad#…`)."""
    return trace.names_matching(lambda s: s.startswith(("Optimizer.step#", "Optimizer.zero_grad#")))


def _ranges(trace: Trace) -> _Ranges:
    cpu = trace.of_kind(Kind.CPU_OP)
    engine = trace.names_matching(
        lambda s: s.startswith(("autograd::engine", "evaluate_function")), (Kind.CPU_OP,)
    )
    backward = _Nodes.of(cpu, np.flatnonzero(np.isin(cpu.name, engine) | (cpu.fwd_thread > 0)))
    host = (Kind.ANNOTATION, Kind.CPU_OP)
    optimizer = trace.named(host, optimizer_codes(trace))
    data = trace.named(host, trace.names_matching(is_data_loading, host))
    # The Python tracer's module records (with_stack), or the same names as record_function
    # ranges (what `wallfinder run` and `wallfinder.profile` put around each forward).
    marked = (Kind.PYTHON, Kind.ANNOTATION)
    modules = trace.named(
        marked, trace.names_matching(lambda s: s.startswith(MODULE_PREFIX), marked)
    )
    source = "modules"
    if len(modules) == 0:
        step = step_key(trace.step_range) if trace.step_range else None
        modules = trace.named(
            (Kind.ANNOTATION,),
            trace.names_matching(
                lambda s: _is_user_range(s) and step_key(s) != step, (Kind.ANNOTATION,)
            ),
        )
        source = "record_function"
    if len(modules) == 0:
        # Neither: the user's own Python frames (traces recorded with stacks) stand for them.
        modules, source = user_frames(trace), CALL_SITES
    reducers = trace.named((Kind.PYTHON,), trace.names_matching(is_grad_reducer, (Kind.PYTHON,)))
    return _Ranges(backward, _outermost(backward), optimizer, data, modules, source, reducers)


def _outermost(ranges: _Nodes) -> _Nodes:
    """The ranges no earlier one encloses on the same thread, by start."""
    keep = np.zeros(len(ranges), dtype=bool)
    thread = ranges.thread
    for t in np.unique(thread).tolist():
        rows = np.flatnonzero(thread == t)
        keep[rows[outermost(ranges.take(rows))]] = True
    return ranges.take(np.flatnonzero(keep))


def _is_user_range(name: str) -> bool:
    """A `record_function` range of the user's: not a step, optimizer or DataLoader range
    the profiler writes itself."""
    return bool(name) and not (
        name.startswith(("ProfilerStep#", "Optimizer.", "##", "cuda", "hip"))
        or is_data_loading(name)
        or is_communication_op(name)
        # torch.compile's compiler at work (Dynamo, Inductor, autotuning): a one-off, not
        # a part of the model.
        or compile_range(name)
    )


def _inside(ranges: Spans, work: Work, rows: I64) -> I64:
    """Row of the innermost of `ranges` around each issue of `work` at `rows` (NONE if
    none)."""
    out = np.full(rows.size, NONE, dtype=np.int64)
    if len(ranges) and rows.size:
        out[:] = enclosing(ranges, work.thread[rows], work.issued[rows])
    return out


def _place(scope: Scope, r: _Ranges, work: Work) -> tuple[npt.NDArray[np.int8], I64, I64]:
    """Each unit of work's phase, and the module range and backward node around its issue
    (NONE: none)."""
    n = work.ts.size
    phase = np.full(n, OTHER, dtype=np.int8)
    issued = np.flatnonzero(work.issued != NO_LAUNCH)
    in_module = np.full(n, NONE, dtype=np.int64)
    in_module[issued] = _inside(r.modules, work, issued)
    in_node = np.full(n, NONE, dtype=np.int64)
    in_node[issued] = _inside(r.backward, work, issued)
    in_opt = np.zeros(n, dtype=bool)
    in_opt[issued] = _inside(r.optimizer, work, issued) >= 0
    in_backward = np.zeros(n, dtype=bool)
    in_backward[issued] = _inside(r.outer_backward, work, issued) >= 0
    # A call site is no forward pass (the outermost is the whole program): only modules and
    # record_function ranges mark forward work.
    in_forward = (in_module >= 0) if r.module_source != CALL_SITES else False
    phase[in_forward | _before_backward(scope, r.backward, work)] = FORWARD
    phase[work.input_copy] = COPY_IN
    phase[in_opt] = OPTIMIZER
    phase[in_backward | (in_node >= 0)] = BACKWARD
    # The gradient sync's own work (a ZeRO-1 bucket scaled and copied after the backward, on
    # the main thread: it was "other") is communication, as its collectives are.
    if len(r.reducers):
        phase[issued[_inside(r.reducers, work, issued) >= 0]] = COMMUNICATION
    phase[work.cls == COMM] = COMMUNICATION
    return phase, in_module, in_node


def _owners(
    trace: Trace, r: _Ranges, phase: npt.NDArray[np.int8], in_module: I64, in_node: I64
) -> tuple[I64, int, int]:
    """Each unit of work's module range (NONE: none): the one around its issue; for
    backward work outside any (the autograd thread), the one around the forward op that
    made its autograd node. With how many backward nodes needed that link, and how many
    had it."""
    owner = in_module.copy()
    need = np.flatnonzero((phase == BACKWARD) & (owner == NONE) & (in_node >= 0))
    if need.size == 0 or len(r.modules) == 0:
        return owner, 0, 0
    fthread, fts, linked = _forward_ops(trace, r.backward, in_node[need])
    found = fthread != NONE
    if found.any():
        owner[need[found]] = enclosing(r.modules, fthread[found], fts[found])
    # Distinct nodes (rows of `r.backward`) by a table, not a sort.
    seen = np.zeros(len(r.backward), dtype=bool)
    seen[in_node[need]] = True
    return owner, int(np.count_nonzero(seen)), linked


def attribute(scope: Scope, work: Work) -> Attribution:
    """Every unit of work's phase and module, the phases per step, and the module table."""
    r = _ranges(scope.trace)
    n = work.ts.size
    phase, in_module, in_node = _place(scope, r, work)
    evidence: list[str] = []
    unsplit: list[str] = []
    if len(r.backward):
        evidence.append(
            f"autograd backward ops ({_per_step(r.backward, scope):.0f} per step): backward "
            "work by the thread and time of its call"
        )
    else:
        unsplit.append(
            "no autograd backward ops in the trace: nothing is backward"
            + (
                "; forward is the work inside module ranges"
                if len(r.modules) and r.module_source != CALL_SITES
                else ", and forward cannot be told from other"
            )
        )
    if len(r.optimizer):
        evidence.append("Optimizer.step#/zero_grad# ranges")
    if len(r.reducers):
        evidence.append(
            "gradient reduction frames (DeepSpeed reduce_ipg_grads, Megatron "
            "finish_grad_sync, ...): their work is communication"
        )
    if len(r.data):
        evidence.append("DataLoader __next__ ranges (data wait)")
    if work.input_copy.any():
        evidence.append("host-to-device memcpys (input copy)")
    if len(r.modules) and r.module_source != CALL_SITES:  # call sites mark no phase
        evidence.append(
            "nn.Module ranges (forward)"
            if r.module_source == "modules"
            else "record_function ranges (forward)"
        )
    if n and not (work.issued != NO_LAUNCH).any():
        unsplit.append("no launch records: device work cannot be tied to the host's phases")
    phases = _phases(scope, r, work, phase, evidence, unsplit)
    owner, needed, linked = _owners(scope.trace, r, phase, in_module, in_node)
    if needed:
        evidence.append(
            f"Sequence number links: {linked} of {needed} backward autograd nodes tied to "
            "the forward op that made them"
        )
    # An optional view of its own: a bug in it costs the module table, not the phases.
    made = scope.views.compute("modules", lambda: _modules(scope, r, work, phase, owner))
    modules, module, range_row = made or (
        None,
        np.full(n, NONE, dtype=np.int64),
        np.full(len(r.modules), NONE, dtype=np.int64),
    )
    recompute = (phase == BACKWARD) & (in_module >= 0) & (r.module_source == "modules")
    return Attribution(phase, module, phases, modules, scope, r, range_row, work, recompute)


def _per_step(ranges: Spans, scope: Scope) -> float:
    """How many of `ranges` start in a steady-state step's host span (host ranges run on
    the host's time, ahead of the device's windows)."""
    spans, kept = scope.spans, scope.kept
    inside = in_windows(ranges.ts, spans.cpu_start[kept], spans.cpu_end[kept])
    return float(inside.sum()) / max(scope.count, 1)


def _before_backward(scope: Scope, backward: _Nodes, work: Work) -> npt.NDArray[np.bool_]:
    """Work issued inside a step before that step's first backward op (a step with none:
    none)."""
    spans = scope.spans
    out = np.zeros(work.ts.size, dtype=bool)
    if len(backward) == 0:
        return out
    first = np.searchsorted(backward.ts, spans.cpu_start)
    has = first < len(backward)
    first_ts = np.where(has, backward.ts[np.minimum(first, len(backward) - 1)], 0)
    has &= first_ts < spans.cpu_end
    step = np.searchsorted(spans.cpu_start, work.issued, side="right") - 1
    ok = (step >= 0) & (work.issued != NO_LAUNCH)
    s = np.maximum(step, 0)
    out[ok] = (
        has[s[ok]] & (work.issued[ok] < first_ts[s[ok]]) & (work.issued[ok] < spans.cpu_end[s[ok]])
    )
    return out


def _phases(
    scope: Scope,
    r: _Ranges,
    work: Work,
    phase: npt.NDArray[np.int8],
    evidence: list[str],
    unsplit: list[str],
) -> Phases:
    start, end, kept = scope.start, scope.end, scope.kept
    k = len(PHASES)
    exposed = np.zeros((start.size, k))
    gpu = np.zeros((start.size, k))
    covered = Coverage.of(np.empty(0, np.int64), np.empty(0, np.int64))
    for p in _BUSY_ORDER:
        rows = phase == p
        mine = Coverage.of(work.ts[rows], work.end[rows])
        gpu[:, p] = mine.covered(start, end)
        both = Coverage.union(covered, mine)
        exposed[:, p] = both.covered(start, end) - covered.covered(start, end)
        covered = both
    # Idle time: data wait where the host sat in the DataLoader, else the phase of the work
    # the device waited for (the next to start; after the last: other).
    data = Coverage.of(r.data.ts, r.data.end)
    order = np.argsort(work.ts, kind="stable")
    starts = work.ts[order]
    next_phase = np.append(phase[order], np.int8(OTHER))  # past the last: other
    for i in range(start.size):
        gs, ge = covered.gaps(int(start[i]), int(end[i]))
        if gs.size == 0:
            continue
        waiting = data.covered(gs, ge)
        exposed[i, DATA] += float(waiting.sum())
        after = next_phase[np.searchsorted(starts, ge, side="left")]
        np.add.at(exposed[i], after.astype(np.intp), (ge - gs - waiting).astype(np.float64))
    length = (end - start).astype(np.float64)
    total = float(length[kept].sum()) or 1.0
    count = max(int(kept.sum()), 1)
    basis: Literal["gpu", "cpu"] = "gpu" if scope.dev is not None else "cpu"
    per_step = [
        StepPhases(
            step=scope.labels[i],
            duration_s=float(length[i]) * NS,
            exposed_s={p: float(exposed[i, j]) * NS for j, p in enumerate(PHASES)},
            gpu_s={p: float(gpu[i, j]) * NS for j, p in enumerate(PHASES)}
            if basis == "gpu"
            else {},
            warmup=not bool(kept[i]),
        )
        for i in range(start.size)
    ]
    return Phases(
        basis=basis,
        exposed={p: float(exposed[kept, j].sum()) / total for j, p in enumerate(PHASES)},
        exposed_s={p: float(exposed[kept, j].sum()) * NS / count for j, p in enumerate(PHASES)},
        gpu_s={p: float(gpu[kept, j].sum()) * NS / count for j, p in enumerate(PHASES)}
        if basis == "gpu"
        else {},
        evidence=evidence,
        unsplit=unsplit,
        steps=per_step,
    )


# Modules ---------------------------------------------------------------------------------


def _forward_threads(trace: Trace, nodes: _Nodes) -> dict[int, int]:
    """The trace thread of each profiler `Fwd thread id` on backward nodes: the thread whose
    forward ops share the most sequence numbers with the nodes that name it."""
    cpu = trace.of_kind(Kind.CPU_OP)
    fwd = (cpu.fwd_thread == 0) & (cpu.seq >= 0)
    threads = cpu.thread[fwd]
    seqs = cpu.seq[fwd]
    out: dict[int, int] = {}
    for t in np.unique(nodes.fwd_thread).tolist():
        wanted = nodes.seq[nodes.fwd_thread == t]
        best, hits = NONE, 0
        for thread in np.unique(threads).tolist():
            n = int(np.isin(wanted, seqs[threads == thread]).sum())
            if n > hits:
                best, hits = thread, n
        if best != NONE:
            out[int(t)] = int(best)
    return out


def _forward_ops(trace: Trace, nodes: _Nodes, node_rows: I64) -> tuple[I64, I64, int]:
    """For backward nodes at `node_rows` of `nodes`: the thread and start of the forward op
    that made each (NONE where not found), and how many distinct nodes were linked."""
    thread_out = np.full(node_rows.size, NONE, dtype=np.int64)
    ts_out = np.full(node_rows.size, NONE, dtype=np.int64)
    linkable = nodes.take(np.flatnonzero((nodes.seq >= 0) & (nodes.fwd_thread > 0)))
    if len(linkable) == 0 or node_rows.size == 0:
        return thread_out, ts_out, 0
    threads = _forward_threads(trace, linkable)
    cpu = trace.of_kind(Kind.CPU_OP)
    fwd = np.flatnonzero((cpu.fwd_thread == 0) & (cpu.seq >= 0))
    # One key per (thread, sequence number): the earliest forward op with it.
    thread_ids, thread_rank = np.unique(cpu.thread[fwd], return_inverse=True)
    key = thread_rank.astype(np.int64) << 40 | cpu.seq[fwd]
    order = np.lexsort((cpu.ts[fwd], key))
    key, rows = key[order], fwd[order]
    seq = nodes.seq[node_rows]
    # Each node's forward thread, one mask per profiler thread id (a few), not per node.
    named = nodes.fwd_thread[node_rows]
    t = np.full(node_rows.size, NONE, dtype=np.int64)
    for profiler_id, thread in threads.items():
        t[named == profiler_id] = thread
    rank = np.searchsorted(thread_ids, t)
    ok = (seq >= 0) & (t != NONE) & (rank < thread_ids.size)
    ok[ok] = thread_ids[rank[ok]] == t[ok]
    want = rank.astype(np.int64) << 40 | np.maximum(seq, 0)
    pos = np.clip(np.searchsorted(key, want), 0, max(key.size - 1, 0))
    ok &= key.size > 0
    ok[ok] = key[pos[ok]] == want[ok]
    thread_out[ok] = cpu.thread[rows[pos[ok]]]
    ts_out[ok] = cpu.ts[rows[pos[ok]]]
    return thread_out, ts_out, int(np.unique(node_rows[ok]).size)


Path = tuple[str, ...]
"""A module range's path: the names from the outermost range down to its own. Names are
kept whole (a name may hold `/`, `.`, `:` or anything else); nothing joins a path into a
string to split it back."""

_REROOT_ROUNDS = 4
"""Rounds of re-rooting orphans (each can move an orphan's known path, see `_tree`)."""


def _tree(trace: Trace, mods: Events, rename: Callable[[str], str] | None = None) -> list[Path]:
    """Each module range's path (`("Model_0", "Block_3", "Attention_3")`), from nesting on
    its thread. A module re-run on another thread (a checkpointed block recomputed by the
    autograd engine) has no parent there: it takes the path its instance has where it does
    (instance names are unique per module object), in rounds, since re-rooting one orphan
    moves its descendants' paths, which another orphan may take. A loop over the module
    ranges only (a few per module per step)."""
    n = len(mods)
    parent = np.full(n, NONE, dtype=np.int64)
    order = np.lexsort((-mods.end, mods.ts, mods.thread))
    stack: list[int] = []
    # As Python ints: the loop reads them one at a time (numpy scalars are slow to index).
    thread_of, ts, end = mods.thread.tolist(), mods.ts.tolist(), mods.end.tolist()
    last_thread = None
    for i in order.tolist():
        if thread_of[i] != last_thread:
            stack, last_thread = [], thread_of[i]
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    codes = mods.name.tolist()
    # Each distinct name read (and renamed: a pure function of the text) once, not per range.
    named = {c: trace.strings[c].removeprefix(MODULE_PREFIX) for c in set(codes)}
    if rename is not None:
        named = {c: rename(text) for c, text in named.items()}
    names = [named[c] for c in codes]
    parents = parent.tolist()
    paths: list[Path] = [()] * n
    for i in order.tolist():  # parents come before their children
        p = parents[i]
        paths[i] = (names[i],) if p == NONE else (*paths[p], names[i])
    orphans = {names[i] for i in range(n) if parents[i] == NONE}
    threads = thread_of
    for _ in range(_REROOT_ROUNDS):
        nested: dict[str, set[tuple[Path, int]]] = {}
        for i in range(n):
            if parents[i] != NONE and names[i] in orphans:
                nested.setdefault(names[i], set()).add((paths[i], threads[i]))
        if not nested:
            return paths
        moved = False
        for i in order.tolist():  # re-rooting the orphans and their descendants
            p = parents[i]
            if p == NONE:
                # Only from other threads: on its own thread, a name that is both a root
                # and nested in itself (a block inside a block) is two instances.
                known = {q for q, t in nested.get(names[i], ()) if t != threads[i]}
                new = next(iter(known)) if len(known) == 1 else (names[i],)
            else:
                new = (*paths[p], names[i])
            moved |= new != paths[i]
            paths[i] = new
        if not moved:
            break
    return paths


def _prefixes(paths: Iterable[Path]) -> set[Path]:
    """The paths and every ancestor of each (an orphan's path, taken from another
    instance, need not have its ancestors among the ranges)."""
    return {p[:k] for p in paths for k in range(1, len(p) + 1)}


def _collapsed(paths: Iterable[Path]) -> dict[Path, Path]:
    """Each distinct instance path's row, for the paths and every ancestor of them: sibling
    instances of one class under the same row (`Block_0` … `Block_31`, `layer_0_ffn` …
    `layer_7_ffn`) become one row (`Block_*`, `layer_*_ffn`). Settled depth by depth, since
    which instances are siblings depends on their parents' rows."""
    out: dict[Path, Path] = {}
    by_depth: dict[int, list[Path]] = {}
    for path in _prefixes(paths):
        by_depth.setdefault(len(path), []).append(path)
    for depth in sorted(by_depth):
        groups: dict[tuple[Path, str], set[str]] = {}
        keys = {}
        for path in by_depth[depth]:
            head, name = path[:-1], path[-1]
            key = (out[head] if head else (), _NUMBER.sub("*", name))
            groups.setdefault(key, set()).add(name)
            keys[path] = (key, name)
        for path, (key, name) in keys.items():
            out[path] = (*key[0], key[1] if len(groups[key]) > 1 else name)
    return out


def _modules(
    scope: Scope,
    r: _Ranges,
    work: Work,
    phase: npt.NDArray[np.int8],
    owner: I64,
) -> tuple[Modules | None, I64, I64]:
    """The module table over the steady-state steps, each unit of work's row in it, and
    each module range's (NONE: none)."""
    trace, mods = scope.trace, r.modules
    module_of_work = np.full(work.ts.size, NONE, dtype=np.int64)
    if len(mods) == 0:
        return None, module_of_work, np.zeros(0, dtype=np.int64)
    steps = max(scope.count, 1)
    backward = phase == BACKWARD
    sites = r.module_source == CALL_SITES
    paths = _tree(trace, mods, _site if sites else module_name)
    # Call sites that differ in their line are different code, not instances of one block.
    row_of_path = {p: p for p in _prefixes(paths)} if sites else _collapsed(paths)
    row_names = sorted(set(row_of_path.values()), key=lambda p: (len(p), p))
    row_index = {p: i for i, p in enumerate(row_names)}
    range_row = np.array([row_index[row_of_path[p]] for p in paths], dtype=np.int64)
    # Distinct instances (a module's range repeats every step under one path), with every
    # ancestor of each, so that each has its parent among them.
    inst_names = sorted(row_of_path)
    inst_index = {p: i for i, p in enumerate(inst_names)}
    range_inst = np.array([inst_index[p] for p in paths], dtype=np.int64)
    inst_parent = np.array(
        [inst_index[p[:-1]] if len(p) > 1 else NONE for p in inst_names], dtype=np.int64
    )
    has = owner >= 0
    module_of_work[has] = range_row[owner[has]]
    # A module step (recorded with module ranges after the timed steps, untimed) is where the
    # modules are: their table reads it alone; the timed steps ran without the ranges.
    span = _module_step(trace)
    chosen = work.inside
    if span is not None:
        chosen = (work.issued >= span[0]) & (work.issued < span[1])
        steps = 1
    sel = has & chosen
    dur = (work.end - work.ts).astype(np.float64)
    inst = range_inst[owner[sel]]
    n_inst = len(inst_names)
    k = len(CLASSES)

    def per_instance(
        weights: npt.NDArray[np.float64], bins: npt.NDArray[np.intp] | None = None, width: int = 1
    ) -> npt.NDArray[np.float64]:
        idx = inst * width + (bins if bins is not None else 0)
        flat = np.bincount(idx, weights=weights, minlength=n_inst * width)
        self_time = np.asarray(flat, dtype=np.float64).reshape(n_inst, width)
        return _roll_up(self_time, inst_parent)

    d = dur[sel]
    fwd = per_instance(d * ~backward[sel])
    bwd = per_instance(d * backward[sel])
    by_class = per_instance(d, work.cls[sel].astype(np.intp), k)
    by_bound = per_instance(d, work.bound[sel].astype(np.intp), 3)
    total = float(dur[chosen].sum()) or 1.0
    rows = _module_rows(
        row_names, inst_names, row_of_path, fwd, bwd, by_class, by_bound, total, steps
    )
    attributed = float(d.sum())
    if sites and attributed <= 0:
        # Call sites none of the step's work ran under (another thread's frames): no table.
        return None, np.full(work.ts.size, NONE, dtype=np.int64), np.zeros(0, dtype=np.int64)
    source = r.module_source
    note = {
        "modules": "nn.Module ranges (the profiler's with_stack, or wallfinder run/profile's)",
        CALL_SITES: "no module or record_function ranges: the user's call sites (Python "
        "frames, file(line): function) stand for modules",
    }.get(source, "no module records: record_function ranges stand for modules")
    if span is not None:
        note += (
            f"; from {span[2]}, one step recorded with module ranges after the timed "
            "steps (untimed: the hooks' host time is not in the verdict)"
        )
    rows, keep = _top_rows(rows)
    remap = np.full(len(row_names), NONE, dtype=np.int64)
    remap[keep] = np.arange(len(keep))
    module_of_work[has] = remap[module_of_work[has]]
    modules = Modules(
        source=source,
        note=note,
        rows=rows,
        unattributed_s=max(total - attributed, 0.0) * NS / steps,
    )
    return modules, module_of_work, remap[range_row]


def _module_step(trace: Trace) -> tuple[int, int, str] | None:
    """The module step's span on the host and its label ("step N"); None: the trace has
    none, or it was cut short."""
    name = trace.module_step
    if name is None or name == trace.cut_step:
        return None
    found = trace.named((Kind.ANNOTATION, Kind.CPU_OP), np.array([trace.code_of(name)], np.int32))
    if len(found) == 0:
        return None
    return int(found.ts.min()), int(found.end.max()), name.replace("ProfilerStep#", "step ")


def _roll_up(self_time: npt.NDArray[np.float64], parent: I64) -> npt.NDArray[np.float64]:
    """Inclusive times: each instance's own plus its descendants'."""
    out: npt.NDArray[np.float64] = self_time.copy()
    depth = np.zeros(parent.size, dtype=np.int64)
    for i in range(parent.size):
        p, d = int(parent[i]), 0
        while p != NONE:
            d, p = d + 1, int(parent[p])
        depth[i] = d
    for i in np.argsort(-depth, kind="stable").tolist():
        if parent[i] != NONE:
            out[parent[i]] += out[i]
    return out


def _module_rows(
    row_names: list[Path],
    inst_names: list[Path],
    row_of_path: dict[Path, Path],
    fwd: npt.NDArray[np.float64],
    bwd: npt.NDArray[np.float64],
    by_class: npt.NDArray[np.float64],
    by_bound: npt.NDArray[np.float64],
    total: float,
    steps: int,
) -> list[ModuleRow]:
    members: dict[Path, list[int]] = {}
    for i, p in enumerate(inst_names):
        members.setdefault(row_of_path[p], []).append(i)
    label = _labels(row_names)
    out = []
    for name in row_names:
        idx = np.array(members[name], dtype=np.intp)
        f, b = float(fwd[idx].sum()), float(bwd[idx].sum())
        classes = by_class[idx].sum(axis=0)
        bound = by_bound[idx].sum(axis=0)
        spread = None
        if idx.size > 1:
            each = (fwd[idx] + bwd[idx]).ravel() * NS / steps
            top = int(np.argmax(each))
            spread = ModuleSpread(
                count=int(idx.size),
                min_s=float(each.min()),
                median_s=float(np.median(each)),
                max_s=float(each.max()),
                outlier=_short_names([inst_names[int(i)] for i in idx])[top],
            )
        out.append(
            ModuleRow(
                path=label[name],
                parent=label[name[:-1]] if len(name) > 1 else None,
                depth=len(name) - 1,
                instances=int(idx.size),
                forward_s=f * NS / steps,
                backward_s=b * NS / steps,
                share=min((f + b) / total, 1.0),
                classes={
                    CLASSES[j].value: float(classes[j]) * NS / steps
                    for j in np.flatnonzero(classes > 0).tolist()
                },
                bound_s={
                    _BOUND_NAMES[j]: float(bound[j]) * NS / steps
                    for j in np.flatnonzero(bound > 0).tolist()
                },
                spread=spread,
                names=list(name),
            )
        )
    return out


def _labels(rows: list[Path]) -> dict[Path, str]:
    """Each row's path as people read it (its names joined by `/`), unique: two paths whose
    names hold `/` themselves can read alike, and the second then gets a `#2`."""
    out: dict[Path, str] = {}
    taken: set[str] = set()
    for path in rows:
        text = "/".join(path)
        k = 1
        while text in taken:
            k += 1
            text = f"{'/'.join(path)} #{k}"
        taken.add(text)
        out[path] = text
    return out


def _short_names(paths: list[Path]) -> list[str]:
    """The shortest path ends that tell the instances apart (`Block_3`, or
    `layer_3_ffn/mlp` where every instance's own name is `mlp`)."""
    for k in range(1, max(len(p) for p in paths) + 1):
        ends = ["/".join(p[-k:]) for p in paths]
        if len(set(ends)) == len(ends):
            return ends
    return ["/".join(p) for p in paths]


def _top_rows(rows: list[ModuleRow]) -> tuple[list[ModuleRow], npt.NDArray[np.intp]]:
    """The largest rows (at most `MAX_MODULE_ROWS`) with their ancestors, in tree order
    (each row after its parent, siblings largest first)."""
    index = {r.path: i for i, r in enumerate(rows)}
    wanted: set[int] = set()
    for i in sorted(range(len(rows)), key=lambda i: -(rows[i].forward_s + rows[i].backward_s)):
        if len(wanted) >= MAX_MODULE_ROWS:
            break
        p: str | None = rows[i].path
        while p is not None and index[p] not in wanted:
            wanted.add(index[p])
            p = rows[index[p]].parent
    children: dict[str | None, list[int]] = {}
    for i in sorted(wanted):
        children.setdefault(rows[i].parent, []).append(i)
    order: list[int] = []

    def visit(parent: str | None) -> None:
        kids = children.get(parent, [])
        for i in sorted(kids, key=lambda i: -(rows[i].forward_s + rows[i].backward_s)):
            order.append(i)
            visit(rows[i].path)

    visit(None)
    keep = np.array(order, dtype=np.intp)
    return [rows[i] for i in order], keep
