"""The step's dependency graph (`StepGraph`) and what its parts share.

The graph is built from what the trace holds, as columns (no object per event):

- the **host chain**: the runtime calls of the threads that launch device work, in time order
  (the autograd engine's thread and the main thread take turns, so one chain), each with the
  host work before it (the gap since the previous call ended: Python and CPU ops, the
  DataLoader, host-side collectives) and its own cost;
- **launch → op**: each kernel, copy or set starts no earlier than its launch call plus the
  launch path's latency (correlation ids; a graph launch starts all its kernels);
- **stream order**: an op starts after the previous op on its stream ends;
- **event waits**: an op that started later than its launch and its stream allowed, just as
  an op on another stream ended, waited for that op (a stream/event wait: Kineto does not
  record which event, so the edge is taken from the timing);
- **measured order across streams**: an op stays after the op on another stream that ended
  last before it started. Kineto does not record which stream waits on which event, so an op
  that started at its launch (the host was late) may still depend on the other stream's work
  before it; without this edge a faster host would let the device run more concurrently than
  it ever did (a collective over work not yet done), and a replay predict a step shorter
  than the device's own busy time;
- **synchronisation**: a synchronising call (`cudaStreamSynchronize`, `cudaDeviceSynchronize`,
  `cudaEventSynchronize`, a blocking copy; HIP's likewise) returns after the device work it
  drained: the launched ops that had ended by the time it returned; a launch call blocked on a
  full launch queue likewise returns after the device op that freed its slot.

`graph.build_graph` builds it, with the edges read from timing (event waits, measured order,
releases, drains) from `edges`; when the CPU is the device, `cpu.cpu_graph` builds the same
graph from its ops.
"""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.gpu import CLASSES
from wallfinder.analysis.verdict import MATMUL_CLASSES

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
NS = 1e-9
NEVER = -(1 << 52)
"""A time before everything (ns): no constraint."""
MAX_ROUNDS = 5000
"""Fixed-point rounds at most: each round settles at least one more sync or event wait along
the longest chain, so this is only reached by a step with thousands of them."""

MATMUL = frozenset(CLASSES.index(c) for c in MATMUL_CLASSES)
"""The class indices (into `CLASSES`) of matmul-class kernels: the compute wall's work."""

CATEGORIES = ("data", "host", "launch", "sync", "communication", "compute", "bandwidth", "wait")
"""What the critical path's time is spent in: the host waiting for the DataLoader, host work
(Python, CPU ops), launch calls and their latency, synchronising calls' own cost, collectives
(on the host or the device), matmul-class kernels, memory-bound and other kernels, and device
waits the graph cannot explain by an edge (start-up, unrecorded dependencies)."""


class StepGraph(msgspec.Struct, frozen=True, eq=False):
    """One rank's steady-state steps as a dependency graph: the host chain (calls), the device
    ops, and their edges. Times are ns relative to `t0`: the first steady step's CPU start,
    or its window's start when that is earlier (the host runs ahead of the device, so a step's
    CPU work begins before the previous step's device work ends)."""

    t0: int
    origin: int
    """Where the first steady step's window starts, relative to `t0`."""
    # The host chain, in time order.
    gap: I64
    """Host work before each call (since the previous call ended, or `t0`)."""
    gap_data: I64
    """Of `gap`: the part in the DataLoader."""
    gap_comm: I64
    """Of `gap`: the part in host-side collectives."""
    after_data: I64
    """Of `gap`: the time after its last stretch in the DataLoader (0: no DataLoader)."""
    cost: I64
    """The call's own time (for a sync: the part after the device drained)."""
    sync: npt.NDArray[np.bool_]
    blocked: npt.NDArray[np.bool_]
    """Launch calls that returned only when a device op ended (the launch queue was full): they
    wait for the device as a sync does, but no sync what-if removes that."""
    offset: I64
    """Each call's start less the previous calls' end: `gap` when positive, else how far it
    overlapped them."""
    call_first: npt.NDArray[np.bool_]
    """The first call of its thread's chain (the chains are in (thread, time) order)."""
    call_step: npt.NDArray[np.intp]
    """The steady step (index into the replayed range) each call is in."""
    # The device ops (rows of `DeviceOps.ops` in the range), sorted by (stream, start).
    row: I64
    call: I64
    """The op's launch call (NONE: placed at its measured start, `fixed`)."""
    fixed: I64
    lat: I64
    dur: I64
    cls: npt.NDArray[np.int8]
    stream_first: npt.NDArray[np.bool_]
    dep: I64
    """The op (index into these) it waited for on another stream (NONE: none)."""
    dep_gap: I64
    after: I64
    """The op (index into these) on another stream that ended last before it started, in the
    trace: it stays after it (NONE: none)."""
    host: I64
    """The later host call whose start released the op (NONE: none)."""
    host_lat: I64
    extra: I64
    """Per op: a wait after its launch that no edge explains, kept as a fixed delay."""
    stream_gap: I64
    """Per op: likewise, a wait after the op before it on its stream."""
    drained_by: I64
    """The sync call that waited for the op (NONE: none)."""
    fused: F64
    """Per op: its time with the fusion candidates fused (== dur where not in one)."""
    roof_time: F64
    """Per op: the share of its time a matmul at 100% of roof would take (NaN: unknown)."""
    steps: int
    tail: int
    """Host work after the last call, when the last step launched no device work or is a
    whole-trace window (either window ends with its CPU work); -1 otherwise."""
    measured_s: float
    """The measured mean step over the replayed range."""
    tie_ns: int
    """The walk's tie (`SlackThresholds.tie_ns`, from the thresholds it was built with)."""
    busy_s: float = 0.0
    """The device's busy time per step (the union of its ops over all streams, in the range):
    no fix that leaves the device's work as it is can make the step shorter, since the device
    would have to run more concurrently than it did."""
    busy_other_s: float = 0.0
    """The same without the collectives: the floor of a fix that overlaps them (`overlap`)."""
    cost_fixed: I64 | None = None
    """Of `cost`: the part a host cut leaves alone (a CPU op's arithmetic, when the CPU is the
    device); None: none (a runtime call is all host overhead)."""
    call_cat: npt.NDArray[np.int8] | None = None
    """Per call: what the path spends its own time in (an index into CATEGORIES); None:
    launch (runtime calls)."""
    notes: tuple[str, ...] = ()
    """What the critical path's notes say of how this graph was built."""
    accum: npt.NDArray[np.bool_] | None = None
    """Per op: a gradient all-reduce of a micro-step that accumulates (`accumulation`), what
    the `accum` what-if removes; None: none (the CPU as the device)."""
    once: npt.NDArray[np.bool_] | None = None
    """Per call: inside a one-off stretch (library start-up, code loading, a JIT compile:
    `DeviceOps.one_offs`): its gap and its own time are start-up, which a host cut does not
    shrink (no later step pays it); None: none."""
    call_ts: I64 | None = None
    """Per call: its measured start, relative to `t0` (the CPU as the device, where a lever's
    work is the time its calls and gaps spend in collectives); None: not kept."""
