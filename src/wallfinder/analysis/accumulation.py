"""Gradient accumulation under DDP: the gradient all-reduces of the micro-steps that
accumulate. One selection, read by the finding that reports them (`grad-sync-per-micro-step`,
its evidence on the timeline) and by the step's graph (the ops the `accum` what-if removes),
so that the finding's replayed gain is the replay of the very kernels it marks."""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.gpu import COMM
from wallfinder.analysis.intervals import in_windows
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.trace import Kind

DDP_FORWARD = "DistributedDataParallel.forward"
"""The range DDP records around each forward: one per micro-step."""

OPTIMIZER_STEP = "Optimizer.step#"
"""How the optimizer's step range begins (`Optimizer.step#SGD.step`): one per optimizer step."""


class MicroStepSyncs(msgspec.Struct, frozen=True, eq=False):
    """The all-reduce kernels launched in a micro-step that no optimizer step ends (`rows`: a
    mask over the device's ops; empty with no device) — gradient accumulation syncing
    gradients it will add to again, what `no_sync()` skips — and the micro-steps per
    optimizer step in the steady steps (`per_step`; 0 without DDP's forwards or an optimizer
    step)."""

    rows: npt.NDArray[np.bool_]
    per_step: float


def micro_step_syncs(scope: Scope) -> MicroStepSyncs:
    """The steady steps' all-reduces of the micro-steps that accumulate (`MicroStepSyncs`)."""
    dev = scope.dev
    if dev is None:
        return MicroStepSyncs(np.zeros(0, dtype=bool), 0.0)
    none = MicroStepSyncs(np.zeros(len(dev.ops), dtype=bool), 0.0)
    trace, host = scope.trace, (Kind.ANNOTATION, Kind.CPU_OP)
    forward = trace.code_of(DDP_FORWARD)
    if forward < 0:
        return none  # (no DDP: the trace's names are not searched further)
    lo, hi = scope.spans.cpu_start[scope.kept], scope.spans.cpu_end[scope.kept]
    forwards = trace.named(host, np.array([forward], dtype=np.int32))
    starts = np.unique(forwards.ts[in_windows(forwards.ts, lo, hi)])
    optimizer = trace.named(
        host, trace.names_matching(lambda s: s.startswith(OPTIMIZER_STEP), host)
    )
    stepped = np.sort(optimizer.ts[in_windows(optimizer.ts, lo, hi)])
    if starts.size < 2 or stepped.size == 0:
        return none
    # Micro-step i runs from its forward to the next one; it accumulates when that forward is
    # in the same step and no optimizer step starts between the two.
    a, b = starts[:-1], starts[1:]
    step = np.searchsorted(lo, starts, side="right") - 1
    between = np.searchsorted(stepped, b) - np.searchsorted(stepped, a)
    accumulating = (step[:-1] == step[1:]) & (between == 0)
    a, b = a[accumulating], b[accumulating]
    ops = dev.ops
    reduces = trace.names_matching(lambda s: "allreduce" in s.lower().replace("_", ""))
    at = np.where(dev.launch_ts != NO_LAUNCH, dev.launch_ts, ops.ts)
    k = np.searchsorted(a, at, side="right") - 1
    inside = (k >= 0) & (at < b[np.maximum(k, 0)]) if a.size else np.zeros(len(ops), dtype=bool)
    rows: npt.NDArray[np.bool_] = inside & (dev.cls == COMM) & np.isin(ops.name, reduces)
    return MicroStepSyncs(rows, starts.size / stepped.size)
