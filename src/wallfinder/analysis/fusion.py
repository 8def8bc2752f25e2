"""Fusion candidates: runs of consecutive memory-bound kernels on one stream.

Between two matmul-class kernels, a run of pointwise, normalisation, reduction, softmax and
copy kernels writes each intermediate tensor to memory and reads it back. Fused into one
kernel, the run reads its inputs once and writes its output once. Runs with the same kernel
sequence (the same code, every layer and every step) are grouped; the costliest are reported.

The saving is an upper bound, stated as such: fused, the run still moves at least the traffic
of its largest kernel, so at most (all bytes − the largest kernel's bytes) is saved, at the run's
achieved bandwidth, and never below the roofline time of those bytes at the device's
bandwidth. Without shapes, kernel times stand in for bytes.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import KernelClass
from wallfinder.analysis.counters import BOUND_CODE
from wallfinder.analysis.gpu import CLASSES, DeviceOps
from wallfinder.analysis.roofline import Costed
from wallfinder.analysis.scope import Scope
from wallfinder.diagnosis import FusionCandidate
from wallfinder.trace import Kind, Trace

NS = 1e-9
TOP_RUNS = 5
_MEMORY_BOUND = np.array(
    [
        c
        in (
            KernelClass.ELEMENTWISE,
            KernelClass.NORMALIZATION,
            KernelClass.REDUCTION,
            KernelClass.SOFTMAX,
            KernelClass.COPY,
        )
        for c in CLASSES
    ]
)


def fusion_candidates(scope: Scope, costed: Costed) -> list[FusionCandidate]:
    """The costliest repeated runs of ≥ 2 consecutive memory-bound kernels on one stream,
    within one steady-state step."""
    trace, dev, inside, steps = scope.trace, scope.gpu, scope.inside, scope.count
    window_start = scope.window_start
    bandwidth = scope.spec.mem_bandwidth if scope.spec is not None else None
    ops = dev.ops
    rows = np.flatnonzero(inside & (ops.kind == Kind.KERNEL))
    if rows.size < 2:
        return []
    stream = np.where(ops.stream[rows] >= 0, ops.stream[rows], ops.tid[rows])
    order = rows[np.lexsort((ops.ts[rows], stream))]
    stream = np.where(ops.stream[order] >= 0, ops.stream[order], ops.tid[order])
    memory = _MEMORY_BOUND[dev.cls[order]]
    if scope.counters is not None:
        # A kernel the counters call compute-bound gains nothing from fewer memory round trips.
        memory &= scope.counters.bound[order] != BOUND_CODE["compute"]
    step = np.searchsorted(window_start, ops.ts[order], side="right")
    # A run: consecutive memory-bound kernels on the same stream, in the same step.
    breaks = ~memory[:-1] | (stream[1:] != stream[:-1]) | (step[1:] != step[:-1])
    starts = memory & np.concatenate([[True], breaks])
    members = order[memory]
    if members.size < 2:
        return []
    first = np.flatnonzero(starts[memory])
    length = np.diff(np.append(first, members.size))
    # Runs with the same kernel sequence get the same key: a hash of (position, name) pairs,
    # computed for all runs at once; equality is checked on the candidates reported.
    position = np.arange(members.size) - np.repeat(first, length)
    mixed = (ops.name[members].astype(np.uint64) + np.uint64(1)) * (
        position.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0xBF58476D1CE4E5B9)
    )
    key = np.add.reduceat(mixed, first) ^ (length.astype(np.uint64) << np.uint64(56))
    time = np.add.reduceat(ops.dur[members].astype(np.float64), first)
    long_runs = np.flatnonzero(length >= 2)
    if long_runs.size == 0:
        return []
    keys, inverse = np.unique(key[long_runs], return_inverse=True)
    group_time = np.bincount(inverse, weights=time[long_runs])
    found = []
    for g in np.argsort(-group_time)[: 4 * TOP_RUNS].tolist():
        runs = long_runs[inverse == g]
        instances = [members[first[r] : first[r] + length[r]] for r in runs.tolist()]
        names = tuple(ops.name[instances[0]].tolist())
        same = [i for i in instances if tuple(ops.name[i].tolist()) == names]
        found.append(_candidate(trace, dev, costed, names, same, steps, bandwidth))
    del keys
    found.sort(key=lambda c: -c.max_saving_s)
    return [c for c in found[:TOP_RUNS] if c.max_saving_s > 0]


def _candidate(
    trace: Trace,
    dev: DeviceOps,
    costed: Costed,
    names: tuple[int, ...],
    instances: list[npt.NDArray[np.intp]],
    steps: int,
    bandwidth: float | None,
) -> FusionCandidate:
    """`bandwidth`: the device's memory bandwidth (B/s; None: unknown), the fused run's
    roof."""
    all_rows = np.concatenate(instances)
    time = float(dev.ops.dur[all_rows].sum())
    # One row per instance, one column per kernel of the chain (instances are alike).
    grid = np.stack(instances)
    per_kernel = dev.ops.dur[grid].astype(np.float64)
    nbytes = costed.bytes[grid]
    if np.isfinite(nbytes).all():
        total = float(nbytes.sum())
        saved_fraction = 1.0 - float(nbytes.max(axis=1).sum()) / total if total > 0 else 0.0
        basis = "bytes from the ops' cost models"
        fused: float | None = float(nbytes.max(axis=1).sum())
        unfused: float | None = total
    else:
        saved_fraction = 1.0 - float(per_kernel.max(axis=1).sum()) / time if time > 0 else 0.0
        basis = "kernel times (no shapes recorded): bytes unknown"
        fused = unfused = None
    cpu = trace.of_kind(Kind.CPU_OP)
    ops_launching: list[str] = []
    for row in instances[0].tolist():
        launcher = int(costed.launcher[row])
        name = trace.strings[int(cpu.name[launcher])] if launcher >= 0 else None
        if name and name not in ops_launching:
            ops_launching.append(name)
    saving = time * saved_fraction
    if fused is not None and bandwidth:
        # Fused, the run takes at least its roofline time: the bytes it still moves at the
        # device's bandwidth (where the cost model's bytes ran faster than that, the achieved
        # bandwidth would promise a fused kernel beyond the roof).
        saving = min(saving, max(time - fused / bandwidth * 1e9, 0.0))
    n = max(steps, 1)
    return FusionCandidate(
        kernels=[trace.strings[c] for c in names],
        ops=ops_launching,
        occurrences_per_step=len(instances) / n,
        time_s=time * NS / n,
        bytes_unfused=None if unfused is None else unfused / n,
        bytes_fused_at_least=None if fused is None else fused / n,
        max_saving_s=saving * NS / n,
        basis=basis,
    )
