"""Spikes: steady-state steps much slower than the median, named by what grew in them.

For each slow step, the part of the breakdown (compute, exposed communication or copies, an
idle cause) with the most time above the median step, and the kernels with the most time above
their time in a typical step. Periodic work (evaluation, checkpointing, logging, a collective
that waits for a straggler) shows up this way.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.gpu import DeviceOps, WindowBreakdown
from wallfinder.analysis.scope import Scope
from wallfinder.diagnosis import Spike
from wallfinder.trace import Kind, Trace

MAX_SPIKES = 5
TOP_KERNELS = 3
NS = 1e-9


def find_spikes(scope: Scope, wb: WindowBreakdown) -> list[Spike]:
    """The slowest steady-state steps over `spike_factor` times the median, each named by the
    part of the breakdown (`wb`, every step's) that grew most in it."""
    trace, dev, labels, kept = scope.trace, scope.dev, scope.labels, scope.kept
    length = (wb.end - wb.start).astype(np.float64)
    if kept.sum() < 3:
        return []
    median = float(np.median(length[kept]))
    slow = np.flatnonzero(kept & (length > scope.thresholds.steps.spike_factor * median))
    if slow.size == 0:
        return []
    parts = {
        "compute": wb.compute,
        "exposed communication": wb.comm_exposed,
        "exposed copies": wb.copy_exposed,
        **{f"idle: {k.replace('_', ' ')}": v for k, v in wb.idle_causes.items()},
    }
    typical = {k: float(np.median(np.asarray(v, np.float64)[kept])) for k, v in parts.items()}
    kernel_excess = _kernel_excess(trace, dev, wb, kept, slow)
    spikes = []
    for i in slow[np.argsort(-length[slow])][:MAX_SPIKES].tolist():
        growth = {k: float(v[i]) - typical[k] for k, v in parts.items()}
        part = max(growth, key=lambda k: growth[k])
        spikes.append(
            Spike(
                step=labels[i],
                duration_s=float(length[i]) * NS,
                excess_s=(float(length[i]) - median) * NS,
                part=part,
                kernels=kernel_excess.get(i, []),
            )
        )
    return spikes


def _kernel_excess(
    trace: Trace,
    dev: DeviceOps | None,
    wb: WindowBreakdown,
    kept: npt.NDArray[np.bool_],
    slow: npt.NDArray[np.intp],
) -> dict[int, list[str]]:
    """Per slow window: the kernels with the most time above their mean in a normal step."""
    if dev is None:
        return {}
    ops = dev.ops
    window = np.searchsorted(wb.start, ops.ts, side="right") - 1
    valid = (window >= 0) & (ops.kind == Kind.KERNEL)
    valid &= ops.ts < wb.end[np.maximum(window, 0)]
    normal = kept.copy()
    normal[slow] = False
    if not normal.any():
        return {}
    in_normal = valid & normal[np.maximum(window, 0)]
    names = ops.name
    size = len(trace.strings)
    typical = np.bincount(names[in_normal], weights=ops.dur[in_normal], minlength=size) / int(
        normal.sum()
    )
    out = {}
    for i in slow.tolist():
        rows = valid & (window == i)
        here = np.bincount(names[rows], weights=ops.dur[rows], minlength=size)
        excess = here - typical
        top = np.argsort(-excess)[:TOP_KERNELS]
        out[i] = [trace.strings[int(c)] for c in top.tolist() if excess[c] > 0]
    return out
