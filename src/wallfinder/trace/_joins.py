"""Launch → device op joins for traces without correlation ids.

Kineto joins a runtime call (`cudaLaunchKernel`, `hipLaunchKernel`, a memcpy call) to the
kernel or copy it launched by the `correlation` argument both carry. Some traces drop it
(converters, trimmed or re-numbered exports) but keep one of two other records of the same
link, tried in this order:

- the `ac2g` flow events: a flow start (`ph` "s") at the runtime call (same thread, same start
  time) and a flow end (`ph` "f") at the device op, with one flow `id` (Kineto's flow id is the
  correlation id);
- the `External id` both carry (the id of the CPU op around the launch): the k-th launch call of
  an External id launched the k-th device op of that id, when the counts agree (an id whose
  calls and ops differ in number is left unjoined rather than guessed).

The join fills the `correlation` column, so every analysis joins launches one way; which
record was used is said in the trace's warnings.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.trace.model import NONE, Events, Kind

I64 = npt.NDArray[np.int64]

_LAUNCHED = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)


class Links(msgspec.Struct, frozen=True):
    """`ac2g` flow endpoints, one row each: flow id, start (True) or end, thread, time (ns on
    the trace's clock)."""

    id: I64
    start: npt.NDArray[np.bool_]
    thread: I64
    ts: I64

    @staticmethod
    def empty() -> Links:
        none = np.zeros(0, dtype=np.int64)
        return Links(none, np.zeros(0, dtype=bool), none, none)

    def __len__(self) -> int:
        return int(self.id.size)


def join_launches(events: Events, links: Links, strings: Callable[[], list[str]]) -> str | None:
    """Fill the `correlation` of runtime calls and device ops that have none, from `links`,
    else from their External ids; return what was used, in words (None: nothing to join, or
    the trace's own correlation ids join them). `strings`: the string table, asked for only
    when there is something to join."""
    kind = events.kind
    launched = np.isin(kind, _LAUNCHED)
    unjoined = launched & (events.correlation < 0)
    if unjoined.sum() <= 0.05 * launched.sum():
        return None  # the trace's own ids join (nearly) all: a few strays are not a format
    runtime = (kind == Kind.RUNTIME) & _launch_calls(events, strings())
    if not runtime.any():
        return None
    how = []
    if len(links) and _by_flows(events, links, runtime, unjoined):
        how.append("their ac2g flow events")
    unjoined &= events.correlation < 0
    if unjoined.any() and _by_external_id(events, runtime & (events.correlation < 0), unjoined):
        how.append("their External ids, in order")
    if not how:
        return (
            "kernels carry no correlation id and no flow event or External id links them to "
            "their launch calls: idle time cannot be split into host waits and launch latency"
        )
    return "kernels carry no correlation id: launch calls are joined to them by " + (
        " and ".join(how)
    )


def _by_flows(
    events: Events, links: Links, runtime: npt.NDArray[np.bool_], unjoined: npt.NDArray[np.bool_]
) -> bool:
    """Join by flow endpoints bound to the event starting on the same thread at the same
    time: starts to runtime calls, ends to device ops. True when any pair was joined."""
    thread = events.thread
    starts = _bind(links, links.start, thread, events.ts, runtime & (events.correlation < 0))
    ends = _bind(links, ~links.start, thread, events.ts, unjoined)
    # A flow joins only when both of its ends found their event.
    ids = np.intersect1d(links.id[starts >= 0], links.id[ends >= 0])
    if ids.size == 0:
        return False
    for rows in (starts, ends):
        ok = (rows >= 0) & np.isin(links.id, ids)
        events.correlation[rows[ok]] = links.id[ok]
    return True


def _bind(
    links: Links,
    side: npt.NDArray[np.bool_],
    thread: I64,
    ts: I64,
    candidates: npt.NDArray[np.bool_],
) -> I64:
    """Per link row on `side`, the row of the candidate event with its thread and start time
    (NONE where there is none)."""
    out = np.full(len(links), NONE, dtype=np.int64)
    rows = np.flatnonzero(candidates)
    want = np.flatnonzero(side)
    if rows.size == 0 or want.size == 0:
        return out
    # Events and links on one sorted list, by (thread, time), an event before a link with
    # the same key: a link is bound when the entry before it is an event with its key.
    key_thread = np.concatenate([thread[rows], links.thread[want]])
    key_ts = np.concatenate([ts[rows], links.ts[want]])
    is_link = np.concatenate([np.zeros(rows.size, bool), np.ones(want.size, bool)])
    order = np.lexsort((is_link, key_ts, key_thread))
    k_thread, k_ts, k_link = key_thread[order], key_ts[order], is_link[order]
    bound = np.zeros(order.size, dtype=bool)
    bound[1:] = (
        k_link[1:] & ~k_link[:-1] & (k_thread[1:] == k_thread[:-1]) & (k_ts[1:] == k_ts[:-1])
    )
    at = np.flatnonzero(bound)
    link_index = order[at] - rows.size
    event_index = order[at - 1]
    out[want[link_index]] = rows[event_index]
    return out


def _by_external_id(
    events: Events, runtime: npt.NDArray[np.bool_], unjoined: npt.NDArray[np.bool_]
) -> bool:
    """Pair launch calls and device ops of the same External id in time order, for the ids
    whose counts agree. Joined pairs get fresh correlation ids above every id in the trace."""
    calls = np.flatnonzero(runtime & (events.external_id >= 0))
    ops = np.flatnonzero(unjoined & (events.external_id >= 0))
    if calls.size == 0 or ops.size == 0:
        return False
    call_rank, call_count = _rank_within(events.external_id[calls], events.ts[calls])
    op_rank, op_count = _rank_within(events.external_id[ops], events.ts[ops])
    ext_ids, inverse = np.unique(
        np.concatenate([events.external_id[calls], events.external_id[ops]]), return_inverse=True
    )
    counts = np.zeros((2, ext_ids.size), dtype=np.int64)
    counts[0, inverse[: calls.size]] = call_count
    counts[1, inverse[calls.size :]] = op_count
    agree = counts[0] == counts[1]
    keep_calls = agree[inverse[: calls.size]]
    keep_ops = agree[inverse[calls.size :]]
    if not keep_ops.any():
        return False
    base = int(max(events.correlation.max(initial=0), 0)) + 1
    # One fresh id per (External id, rank) pair: both sides compute the same.
    width = int(max(call_rank.max(initial=0), op_rank.max(initial=0))) + 1
    call_ids = base + inverse[: calls.size] * width + call_rank
    op_ids = base + inverse[calls.size :] * width + op_rank
    events.correlation[calls[keep_calls]] = call_ids[keep_calls]
    events.correlation[ops[keep_ops]] = op_ids[keep_ops]
    return True


def _rank_within(keys: I64, ts: I64) -> tuple[I64, I64]:
    """Each row's position among the rows of its key in time order, and its key's row count
    (both per row)."""
    order = np.lexsort((ts, keys))
    sorted_keys = keys[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    group_start = np.maximum.accumulate(np.where(first, np.arange(order.size), 0))
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size) - group_start
    _, group, count = np.unique(sorted_keys, return_inverse=True, return_counts=True)
    per_row = np.empty(order.size, dtype=np.int64)
    per_row[order] = count[group.reshape(-1)]
    return rank, per_row


_LAUNCH_WORDS = ("launch", "memcpy", "memset")
"""Runtime calls whose names hold one of these launch device work (kernel and graph launches,
copies, sets); syncs, allocations and queries do not."""


def _launch_calls(events: Events, strings: list[str]) -> npt.NDArray[np.bool_]:
    table = np.array([any(w in s.lower() for w in _LAUNCH_WORDS) for s in strings], dtype=bool)
    return table[events.name]
