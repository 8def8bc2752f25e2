"""One-off costs: the host stretches a run pays once, recognised by their signatures.

Context creation and library start-up (handles, workspaces, module and library loads, the
CUDA driver loading a kernel's code lazily), JIT compiles (TorchScript fusers, NVRTC, Triton,
Inductor) and first launches loading code. Each is found whether or not its op repeats in the
window: from what CUPTI and the runtime record inside it, not from a comparison with later
calls. The op that holds such a signature (with the enclosing ops whose time it is) is a
one-off stretch of its thread; the GPU's wait for it is idle cause `startup`, set aside from
the steady state (analysis/gpu.py) and named by the `warm-up` finding.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.intervals import Coverage, enclosing
from wallfinder.analysis.steps import NO_LAUNCH, blocking_calls, waiting
from wallfinder.analysis.thresholds import TimeThresholds
from wallfinder.trace import NONE, Events, Kind, Trace

I64 = npt.NDArray[np.int64]

CODE_LOADS = frozenset(
    {
        # Context creation, module and library loads: the driver calls behind a first use.
        "cuInit",
        "cuCtxCreate",
        "cuCtxCreate_v2",
        "cuDevicePrimaryCtxRetain",
        "cuModuleLoad",
        "cuModuleLoadData",
        "cuModuleLoadDataEx",
        "cuModuleLoadFatBinary",
        "cuModuleGetFunction",
        "cuLibraryLoadData",
        "cuLibraryLoadFromFile",
        "cuLibraryGetKernel",
        "hipModuleLoad",
        "hipModuleLoadData",
        "hipModuleLoadDataEx",
        "hipModuleGetFunction",
        # CUPTI's own records of the driver loading code lazily (category `overhead`).
        "Runtime Triggered Module Loading",
        "Lazy Function Loading",
    }
)
"""Calls and CUPTI records that load code or create a context: a cost paid once per run."""

DRIVER_LAUNCHES = frozenset(
    {"cuLaunchKernel", "cuLaunchKernelEx", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel"}
)
"""Driver-API launches: how NVRTC, Triton, Inductor and the TorchScript fusers start the
kernels they build (the framework's own kernels go through the runtime's launch)."""

_JIT_KERNEL = re.compile(r"^(fused_|triton_|cpp_fused_|nvfuser_|kernel_\d|CudaCodeGen)")
"""Names of kernels built at run time (TorchScript NNC `fused_*`, Triton/Inductor
`triton_*`, nvFuser)."""

_NAMED_CALLS = (
    ("cudaFree", "cudaFree"),
    ("hipFree", "hipFree"),
    ("cudaMalloc", "cudaMalloc"),
    ("hipMalloc", "hipMalloc"),
    ("cudaHostAlloc", "cudaHostAlloc"),
    ("cudaStreamCreate", "stream creation"),
    ("Module Loading", "module loading"),
    ("Function Loading", "module loading"),
    ("cuModuleLoad", "module loading"),
    ("cuLibraryLoad", "library loading"),
    ("cuModuleGetFunction", "module loading"),
)
"""What a one-off stretch is said to hold: the calls inside it worth naming, by name part."""

LIBRARY = "library start-up"
JIT = "JIT compile"


class OneOffs(msgspec.Struct, frozen=True):
    """The one-off stretches of the host threads: [start, end) on `thread` (a `thread_key`),
    each the span of op `op` (a name code; NONE: a call outside any op), its `kind` (`LIBRARY`
    or `JIT`) and what it holds, in words (`what`)."""

    thread: I64
    start: I64
    end: I64
    op: I64
    kind: list[str]
    what: list[str]
    recurring: dict[int, tuple[int, int]] = msgspec.field(default_factory=dict)
    """Ops (name codes) whose calls held the signatures again and again (`recurring_one_off`
    times or more on one thread): a library or compiler building code for each new shape,
    which recurs as long as shapes change (cuDNN attention per sequence length in a decode
    loop). Each: (its calls holding a signature, their time in ns). Only the first call of
    each is a one-off stretch; the others are the steady state's."""

    @classmethod
    def none(cls) -> OneOffs:
        empty = np.empty(0, np.int64)
        return cls(empty, empty, empty, empty, [], [])

    def __len__(self) -> int:
        return int(self.start.size)

    def holds(self, thread: I64, at: I64) -> npt.NDArray[np.bool_]:
        """Whether time `at` on `thread` falls in a one-off stretch."""
        out = np.zeros(at.size, bool)
        for key in np.unique(self.thread).tolist():
            mine = self.thread == key
            spans = Coverage.of(self.start[mine], self.end[mine])
            here = thread == key
            out[here] = spans.covered(at[here], at[here] + 1) > 0
        return out


def one_offs(
    trace: Trace,
    launch_ts: I64,
    launch_end: I64,
    launch_thread: I64,
    kernels: Events,
    first_loads: npt.NDArray[np.bool_],
    t: TimeThresholds,
) -> OneOffs:
    """The one-off stretches of the trace's host threads. `kernels`: the device's ops with
    their launches (`launch_ts`, `launch_end`, `launch_thread`); `first_loads`: those whose
    first launch loaded their code (`DeviceOps.one_off`). A signature is a code load or
    context creation (`CODE_LOADS`), a first launch loading code, or a JIT compile: the first
    launch of a kernel built at run time, through the driver API or under a JIT kernel's name,
    after a host stretch of at least `jit_stretch_ns` in which its thread recorded nothing."""
    cpu = trace.of_kind(Kind.CPU_OP)
    if len(cpu) == 0:
        return OneOffs.none()
    loads = trace.named((Kind.RUNTIME, Kind.OTHER), trace.codes_of(CODE_LOADS))
    marks_thread: list[I64] = []
    marks_at: list[I64] = []
    marks_kind: list[npt.NDArray[np.int8]] = []
    # Code loads: on their thread; CUPTI's records of lazy loading sit on a thread of their
    # own, and belong to the launching thread whose op encloses them.
    threads = np.unique(launch_thread[launch_thread != NONE])
    own = np.isin(loads.thread, threads)
    marks_thread.append(loads.thread[own])
    marks_at.append(loads.ts[own])
    for thread in threads.tolist():
        marks_thread.append(np.full(int((~own).sum()), thread, np.int64))
        marks_at.append(loads.ts[~own])
    marks_kind.append(np.zeros(sum(m.size for m in marks_at), np.int8))
    # First launches loading code.
    first = np.flatnonzero(first_loads & (launch_ts != NO_LAUNCH))
    marks_thread.append(launch_thread[first])
    marks_at.append(launch_ts[first])
    marks_kind.append(np.zeros(first.size, np.int8))
    # JIT compiles: the long silent stretch before a run-time-built kernel's first launch.
    jit = _jit_launches(trace, kernels, launch_ts, launch_thread, t)
    marks_thread.append(launch_thread[jit])
    marks_at.append(launch_ts[jit])
    # A compile when the kernel is named as one built at run time; a driver-API kernel of a
    # library (cuBLAS's nvjet launched by cuLaunchKernelEx) loading lazily is start-up.
    built = trace.names_matching(lambda s: _JIT_KERNEL.match(s) is not None)
    marks_kind.append(np.isin(kernels.name[jit], built).astype(np.int8))
    thread = np.concatenate(marks_thread)
    at = np.concatenate(marks_at)
    kind = np.concatenate(marks_kind)
    if thread.size == 0:
        return OneOffs.none()
    row = np.asarray(enclosing(cpu, thread, at), dtype=np.int64)
    inside = row != NONE
    row, thread, kind = row[inside], thread[inside], kind[inside]
    if row.size == 0:
        return OneOffs.none()
    row = _whose_time(cpu, row)
    # One stretch per op; a JIT mark makes it a compile.
    rows, inverse = np.unique(row, return_inverse=True)
    is_jit = np.zeros(rows.size, bool)
    np.logical_or.at(is_jit, inverse, kind == 1)
    waits = blocking_calls(trace)
    keep = [
        i
        for i, r in enumerate(rows.tolist())
        if not waiting(waits, int(cpu.ts[r]), int(cpu.end[r]), int(cpu.thread[r]))
    ]
    rows, is_jit = rows[keep], is_jit[keep]
    # Nested stretches (two marks in ops of one chain) count once: the outer one.
    order = np.lexsort((-cpu.end[rows], cpu.ts[rows], cpu.thread[rows]))
    rows, is_jit = rows[order], is_jit[order]
    outer = np.ones(rows.size, bool)
    for i in range(1, rows.size):
        prev = rows[:i][outer[:i]]
        same = cpu.thread[prev] == cpu.thread[rows[i]]
        outer[i] = not bool((same & (cpu.end[prev] >= cpu.end[rows[i]])).any())
    rows, is_jit = rows[outer], is_jit[outer]
    loaded = _built_in(cpu, rows, kernels, launch_ts, launch_thread)
    rows, is_jit, recurring = _recurring(cpu, rows, is_jit, loaded, t.recurring_one_off)
    what = _what(trace, cpu, rows)
    return OneOffs(
        cpu.thread[rows].astype(np.int64),
        cpu.ts[rows].astype(np.int64),
        cpu.end[rows].astype(np.int64),
        cpu.name[rows].astype(np.int64),
        [JIT if j else LIBRARY for j in is_jit.tolist()],
        what,
        recurring,
    )


def _built_in(cpu: Events, rows: I64, kernels: Events, launch_ts: I64, launch_thread: I64) -> I64:
    """Per stretch, the name of the first kernel launched inside it (NONE: none)."""
    out = np.full(rows.size, NONE, np.int64)
    order = np.argsort(launch_ts, kind="stable")
    ts, thread = launch_ts[order], launch_thread[order]
    for i, r in enumerate(rows.tolist()):
        lo = int(np.searchsorted(ts, cpu.ts[r], side="left"))
        hi = int(np.searchsorted(ts, cpu.end[r], side="right"))
        mine = np.flatnonzero(thread[lo:hi] == cpu.thread[r])
        if mine.size:
            out[i] = int(kernels.name[order[lo + int(mine[0])]])
    return out


def _recurring(
    cpu: Events, rows: I64, is_jit: npt.NDArray[np.bool_], built: I64, least: int
) -> tuple[I64, npt.NDArray[np.bool_], dict[int, tuple[int, int]]]:
    """`rows` (stretches, in (thread, start) order) less the repeats of an op that loads or
    builds the same kernel (`built`: the kernel each stretch launches) at least `least` times
    on one thread: start-up loads each kernel once, so the same kernel's code loaded call
    after call is code built per shape (cuDNN's attention plans), which recurs (its first
    call stays a one-off). An op whose first calls load different kernels (a GEMM's shapes
    each taking a new cuBLAS kernel) is start-up in each. Also those ops: (calls, time, ns)."""
    keep = np.ones(rows.size, bool)
    recurring: dict[int, tuple[int, int]] = {}
    known = built != NONE
    pairs = np.stack(
        [
            cpu.thread[rows],
            cpu.name[rows].astype(np.int64),
            np.where(known, built, -1 - np.arange(rows.size)),
        ],
        axis=1,
    )
    if not rows.size:
        return rows, is_jit, recurring
    groups, inverse, counts = np.unique(pairs, axis=0, return_inverse=True, return_counts=True)
    for g in np.flatnonzero(counts >= least).tolist():
        members = np.flatnonzero(inverse.ravel() == g)
        keep[members[1:]] = False
        op = int(groups[g][1])
        calls, total = recurring.get(op, (0, 0))
        spent = int((cpu.end[rows[members]] - cpu.ts[rows[members]]).sum())
        recurring[op] = (calls + int(members.size), total + spent)
    return rows[keep], is_jit[keep], recurring


def _jit_launches(
    trace: Trace, kernels: Events, launch_ts: I64, launch_thread: I64, t: TimeThresholds
) -> npt.NDArray[np.intp]:
    """Rows of `kernels` whose launch is the first of a kernel built at run time (launched
    through the driver API, or named as one) after `jit_stretch_ns` or more in which the
    launching thread recorded no op and no call."""
    runtime = trace.of_kind(Kind.RUNTIME)
    driver = trace.codes_of(DRIVER_LAUNCHES)
    built = trace.names_matching(lambda s: _JIT_KERNEL.match(s) is not None)
    rows = np.flatnonzero((kernels.kind == Kind.KERNEL) & (launch_ts != NO_LAUNCH))
    if rows.size == 0:
        return rows
    by_driver = np.zeros(len(kernels), bool)
    if driver.size:
        calls = runtime.take(np.flatnonzero(np.isin(runtime.name, driver)))
        by_driver = np.isin(kernels.correlation, calls.correlation[calls.correlation >= 0])
    rows = rows[by_driver[rows] | np.isin(kernels.name[rows], built)]
    if rows.size == 0:
        return rows
    rows = rows[np.lexsort((launch_ts[rows], kernels.name[rows]))]
    rows = rows[np.r_[True, kernels.name[rows][1:] != kernels.name[rows][:-1]]]
    at, key = launch_ts[rows], launch_thread[rows]
    # The last thing the launching thread recorded before the launch: the end of an op or a
    # call, or the start of the op the launch is inside.
    last = np.full(rows.size, NONE, np.int64)
    # Each kind's own rows (views, not a merged copy of every host op and call).
    kinds = (trace.of_kind(Kind.CPU_OP), trace.of_kind(Kind.RUNTIME))
    for thread in np.unique(key).tolist():
        mine = key == thread
        ends = np.sort(np.concatenate([h.end[h.thread == thread] for h in kinds]))
        i = np.searchsorted(ends, at[mine], side="right") - 1
        last[mine] = np.where(i >= 0, ends[np.maximum(i, 0)], NONE)
    cpu = trace.of_kind(Kind.CPU_OP)
    inside = np.asarray(enclosing(cpu, key, at), dtype=np.int64)
    begun = np.where(inside != NONE, cpu.ts[np.maximum(inside, 0)], NONE)
    last = np.maximum(last, begun)
    found: npt.NDArray[np.intp] = rows[(last != NONE) & (at - last >= t.jit_stretch_ns)]
    return found


def _whose_time(cpu: Events, row: I64) -> I64:
    """Each op widened to the enclosing ops whose time it is: a parent at most twice as long
    as its child (aten::conv2d around the cudnn_convolution that loads cuDNN), never a
    region whose time is mostly its other work."""
    row = row.copy()
    for _ in range(32):
        parent = np.asarray(enclosing(cpu, cpu.thread[row], cpu.ts[row] - 1), dtype=np.int64)
        ok = parent != NONE
        safe = np.where(ok, parent, 0)
        ok &= cpu.end[safe] >= cpu.end[row]
        ok &= (cpu.end[safe] - cpu.ts[safe]) <= 2 * (cpu.end[row] - cpu.ts[row])
        if not ok.any():
            break
        row = np.where(ok, parent, row)
    return row


def _what(trace: Trace, cpu: Events, rows: npt.NDArray[np.intp]) -> list[str]:
    """What each stretch holds, in words: the named calls recorded inside it, on its thread
    (CUPTI's loading records on any)."""
    out = []
    calls, other = trace.of_kind(Kind.RUNTIME), trace.of_kind(Kind.OTHER)
    for r in rows.tolist():
        a, b, key = int(cpu.ts[r]), int(cpu.end[r]), int(cpu.thread[r])
        # Each kind's rows are sorted by start: the stretch's are one slice of each.
        lo, hi = np.searchsorted(calls.ts, [a, b])
        mine = calls.name[lo:hi][calls.thread[lo:hi] == key]
        lo, hi = np.searchsorted(other.ts, [a, b])
        said: list[str] = []
        for code in np.unique(np.concatenate([mine, other.name[lo:hi]])).tolist():
            name = trace.strings[code]
            for part, words in _NAMED_CALLS:
                if part in name and words not in said:
                    said.append(words)
        out.append(", ".join(sorted(said, key=[w for _, w in _NAMED_CALLS].index)))
    return out
