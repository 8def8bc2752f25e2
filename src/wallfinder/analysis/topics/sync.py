"""Synchronisation: the host blocked on the device inside the step, and launched work that
waits on a dependency (another stream, an event, a peer)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import SYNC_CALLS
from wallfinder.analysis.critpath import Change
from wallfinder.analysis.findings import (
    NO_ROWS,
    Facts,
    amdahl,
    call_sites,
    calls_in_steps,
    host_calls,
    make_finding,
    ms_text,
    where_calls,
)
from wallfinder.analysis.rules import rule
from wallfinder.diagnosis import Finding
from wallfinder.trace import Events, Kind
from wallfinder.units import short_kernel


def _sync_calls(f: Facts) -> Events:
    """The synchronising calls in the steady steps."""
    return calls_in_steps(f, SYNC_CALLS)


@rule(Facts, id="sync-in-step", replay=Change(sync=True), work=_sync_calls)
def synchronization(f: Facts) -> Finding | None:
    if f.dev is None:
        # No device work recorded: a sync's wait is the device's own work, which removing
        # the sync would not remove (the GPU cannot be said to idle after it).
        return None
    share = f.share(f.breakdown.idle_causes.get("synchronization", 0.0))
    names = host_calls(f, SYNC_CALLS)
    listed = ", ".join(f"{n} ×{c:.0f}/step" for n, c, _ in names[:4]) or "synchronising calls"
    blocked = ""
    if f.whatif is not None and f.step_s > 0:
        # The GPU may stay busy while the host is blocked (the sync drains a deep queue), then
        # idle while the host refills it: idle the breakdown gives the host's overhead. Where
        # the replay without syncs gains a real share, the bound is the host's blocked time.
        # Removing the syncs saves at most the host's blocked time, and at most the idle the
        # host causes (the sync's, and the host's overhead and launches after it).
        causes = f.breakdown.idle_causes
        host_idle = f.share(
            sum(causes.get(k, 0.0) for k in ("synchronization", "host_overhead", "launch_latency"))
        )
        gain = f.whatif.speedup(Change(sync=True))[0]
        held = min(f.whatif.blocked_s / f.step_s, host_idle)
        if 1.0 - 1.0 / gain >= f.thresholds.time.min_share and held > share:
            share = held
            blocked = (
                f"the host is blocked {ms_text(f.whatif.blocked_s)} per step in synchronising "
                "calls and blocking copies, unable to queue work, and the GPU idles after each "
                f"while the host catches up: {host_idle:.0%} of the step is the GPU waiting for "
                "the host (the bound is the smaller of the two)"
            )
    return make_finding(
        f,
        "sync-in-step",
        "overhead",
        "The host blocks on the GPU inside the step",
        share,
        (blocked or f"{share:.0%} of each step the GPU is idle after the host waited for it")
        + f": {listed}"
        + where_calls(f, SYNC_CALLS)
        + call_sites(f, SYNC_CALLS, (Kind.CPU_OP, Kind.RUNTIME)),
        "remove .item(), .cpu(), print/logging of tensors and torch.cuda.synchronize() from "
        "the step (log every N steps, keep metrics on the GPU); use non_blocking=True copies",
        speedup=amdahl(share),
    )


def _waited_rows(f: Facts) -> npt.NDArray[np.bool_]:
    """The device ops that ended the steady steps' dependency waits."""
    if f.dev is None:
        return NO_ROWS
    rows = np.zeros(len(f.dev.ops), dtype=bool)
    rows[_waited_work(f)[0]] = True
    return rows


@rule(Facts, id="dependency-wait", work=_waited_rows)
def dependency_wait(f: Facts) -> Finding | None:
    share = f.share(f.breakdown.idle_causes.get("dependency_wait", 0.0))
    if share < f.thresholds.time.min_share:
        return None  # before the idle pieces that name the work
    return make_finding(
        f,
        "dependency-wait",
        "overhead",
        "Launched work waits on another stream, an event, a peer or unrecorded work",
        share,
        f"{share:.0%} of each step ({ms_text(share * f.step_s)}) the GPU is idle although the work "
        "that ends the wait was already launched (before the gap, or over 50 µs before it "
        "started): it waited for a dependency, or the GPU ran work the trace did not record"
        f"{_waiting_work(f)}",
        "find what it waits for: cross-stream waits (cudaStreamWaitEvent, copies on a side "
        "stream), a collective waiting for a slower rank (compare the ranks' traces), events "
        "recorded late, another process on the GPU, or work from before the profiler started "
        "(profile more steps); overlap or remove the dependency",
        speedup=amdahl(share),
    )


def _waiting_work(f: Facts) -> str:
    """The work that ended the steady steps' dependency waits, most idle time first, with
    how long before it started it was launched, in words."""
    if f.dev is None:
        return ""
    nxt, waited = _waited_work(f)
    if nxt.size == 0:
        return ""
    ops = f.dev.ops
    names, inverse = np.unique(ops.name[nxt], return_inverse=True)
    idle = np.bincount(inverse, weights=waited)
    said = []
    for i in np.argsort(-idle)[:2].tolist():
        mine = inverse == i
        # An op that ends a gap split at a step's start ends two pieces: its lead counts once.
        ended = np.unique(nxt[mine])
        lead = ops.ts[ended] - f.dev.launch_end[ended]
        graph = " (replayed from a graph)" if f.dev.graph[nxt[mine]].all() else ""
        said.append(
            f"{short_kernel(f.trace.strings[int(names[i])])}{graph} "
            f"{ms_text(idle[i] * 1e-9 / max(f.steps.count, 1))}/step, launched a median "
            f"{ms_text(float(np.median(lead)) * 1e-9)} before it started"
        )
    return "; the waits end at " + ", ".join(said)


def _waited_work(f: Facts) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """The device ops (rows) that ended the steady steps' dependency waits and the idle time
    each ended (ns): the idle pieces' `dependency_wait`, as the breakdown counts it."""
    if f.dev is None or f.scope.start.size == 0:
        return np.zeros(0, dtype=np.intp), np.zeros(0)
    pieces = f.idle
    waited = pieces.causes["dependency_wait"]
    keep = f.scope.kept[pieces.window] & (waited > 0) & (pieces.op >= 0)
    return pieces.op[keep], waited[keep]
