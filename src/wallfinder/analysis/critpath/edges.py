"""The graph's edges that the trace does not record but its timing shows: event waits across
streams, the measured order across streams, ops a later host call released, the delays no
edge explains, the device work each synchronising call drained, and launch calls blocked on a
full launch queue."""

from __future__ import annotations

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.critpath.model import I64, NEVER
from wallfinder.analysis.thresholds import SlackThresholds


class Waits(msgspec.Struct, frozen=True, eq=False):
    """Per op, the edges of `StepGraph`'s fields of the same names: the op it waited for on
    another stream (`dep`, `dep_gap`), the op it stays after (`after`), the host call that
    released it (`host`, `host_lat`), and the waits no edge explains (`extra`,
    `stream_gap`)."""

    dep: I64
    dep_gap: I64
    after: I64
    host: I64
    host_lat: I64
    extra: I64
    stream_gap: I64


def event_waits(
    c_ts: I64,
    call: I64,
    lat: I64,
    o_ts: I64,
    o_end: I64,
    stream: I64,
    stream_first: npt.NDArray[np.bool_],
    t0: int,
    slack: SlackThresholds,
) -> Waits:
    """The edges into each op (sorted by (stream, start); `call`: its launch call, an index
    into the calls starting at `c_ts`) that its timing shows."""
    edge_ns = slack.edge_ns
    # Event waits: an op that started later than its launch and stream allowed, just as an op
    # on another stream ended.
    c = np.maximum(call, 0)
    launch_ready = np.where(call >= 0, c_ts[c] + lat, o_ts)
    prev = np.where(stream_first, NEVER + t0, np.concatenate([[NEVER + t0], o_end[:-1]]))
    allowed = np.maximum(launch_ready, prev)
    waited = o_ts - allowed > edge_ns
    by_end = np.argsort(o_end, kind="stable")
    ends_sorted = o_end[by_end]
    cand = np.searchsorted(ends_sorted, o_ts + edge_ns // 10, "right") - 1
    dep = np.full(o_ts.size, -1, np.int64)
    for back in range(2):  # the latest ending op, or the one before it when that is ours
        other = by_end[np.maximum(cand - back, 0)]
        ok = (
            waited
            & (dep < 0)
            & (cand - back >= 0)
            & (stream[other] != stream)
            & (o_end[other] >= o_ts - edge_ns)
            & (o_end[other] <= o_ts + edge_ns)
        )
        dep[ok] = other[ok]
    del by_end, ends_sorted, cand
    dep_gap = np.where(dep >= 0, np.maximum(o_ts - o_end[np.maximum(dep, 0)], 0), 0)
    after_op = ended_before(o_ts, o_end, stream)
    # Else, an op that started just after a later host call began waited for the host there
    # (work the host released: a graph's node behind a host-side wait, a stream made ready).
    by_ts = np.argsort(c_ts, kind="stable")
    after = by_ts[np.maximum(np.searchsorted(c_ts[by_ts], o_ts, "right") - 1, 0)]
    host = np.where(
        waited
        & (dep < 0)
        & (c_ts[after] <= o_ts)
        & (c_ts[after] > c_ts[c])
        & (o_ts - c_ts[after] <= slack.queued_ns),
        after,
        -1,
    )
    del by_ts, after
    host_lat = np.where(host >= 0, o_ts - c_ts[np.maximum(host, 0)], 0)
    # What no edge explains stays as measured: a fixed delay after the op's launch or after
    # the op before it on its stream, whichever held it last.
    unexplained = np.where(waited & (dep < 0) & (host < 0), o_ts - allowed, 0)
    after_prev = prev >= launch_ready
    return Waits(
        dep=dep,
        dep_gap=dep_gap,
        after=after_op,
        host=host,
        host_lat=host_lat,
        extra=np.where(after_prev, 0, unexplained),
        stream_gap=np.where(after_prev, unexplained, 0),
    )


def drains(
    c_ts: I64,
    c_end: I64,
    inc: I64,
    sync: npt.NDArray[np.bool_],
    blocked: npt.NDArray[np.bool_],
    call: I64,
    o_end: I64,
    t0: int,
    edge_ns: int,
) -> tuple[I64, I64]:
    """Per op, the sync call (or call blocked on a full queue) that waited for it: the first
    at or after its launch that returned after it ended (-1: none); and per call, its cost
    (`StepGraph.cost`: a sync's is what it took after the device drained). `edge_ns`:
    `SlackThresholds.edge_ns`."""
    sync_idx = np.flatnonzero(sync | blocked)
    sync_idx = sync_idx[np.argsort(c_ts[sync_idx], kind="stable")]
    drained_by = np.full(o_end.size, -1, np.int64)
    own = c_end - c_ts
    if sync_idx.size:
        after_launch = np.searchsorted(c_ts[sync_idx], c_ts[np.maximum(call, 0)])
        s_end = c_end[sync_idx]
        after_end = np.searchsorted(np.maximum.accumulate(s_end), o_end - edge_ns)
        p = np.maximum(after_launch, after_end)
        ok = (call >= 0) & (p < sync_idx.size)
        drained_by[ok] = sync_idx[np.minimum(p, sync_idx.size - 1)][ok]
        drain = np.full(c_ts.size, NEVER + t0, np.int64)
        np.maximum.at(drain, drained_by[ok], o_end[ok])
        # A sync's own cost is what it took after the device drained.
        own = np.where(sync | blocked, c_end - np.clip(drain, c_ts, c_end), own)
    # The host's time moves by what each call adds to it (its part past the one before).
    return drained_by, np.where(sync | blocked, np.minimum(own, inc), inc)


def queue_full(
    c_ts: I64,
    c_end: I64,
    sync: npt.NDArray[np.bool_],
    call: I64,
    o_ts: I64,
    o_end: I64,
    slack: SlackThresholds,
) -> npt.NDArray[np.bool_]:
    """Launch calls that blocked on a full launch queue: long (over `slack.queued_ns`), their
    own op started over `slack.queued_ns` after they returned (the queue was deep), and they
    returned just after a device op ended (the slot it freed)."""
    out = np.zeros(c_ts.size, dtype=bool)
    mine = call >= 0
    if not mine.any():
        return out
    first_start = np.full(c_ts.size, -NEVER, np.int64)
    np.minimum.at(first_start, call[mine], o_ts[mine])
    queued_ns = slack.queued_ns
    deep = (c_end - c_ts > queued_ns) & (first_start - c_end > queued_ns) & ~sync
    rows = np.flatnonzero(deep)
    if rows.size == 0:
        return out
    ends = np.sort(o_end)
    i = np.searchsorted(ends, c_end[rows], "right") - 1
    freed = (i >= 0) & (c_end[rows] - ends[np.maximum(i, 0)] <= 2 * slack.edge_ns)
    out[rows[freed]] = True
    return out


def ended_before(o_ts: I64, o_end: I64, stream: I64) -> I64:
    """Per op, the op on another stream that ended last at or before it started (-1: none)."""
    out = np.full(o_ts.size, -1, np.int64)
    for s in np.unique(stream).tolist():
        mine = np.flatnonzero(stream == s)
        others = np.flatnonzero(stream != s)
        if others.size == 0:
            continue
        others = others[np.argsort(o_end[others], kind="stable")]
        i = np.searchsorted(o_end[others], o_ts[mine], "right") - 1
        out[mine] = np.where(i >= 0, others[np.maximum(i, 0)], -1)
    return out
