"""The companion trace of `analyze --annotate FILE`: wallfinder's marks as Chrome trace-event
JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open, on a process of their own
named "wallfinder", one track (thread) per kind of mark. Its times are the original trace's,
so the two load side by side or merged into one file (README, "Opening the evidence")."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wallfinder.errors import WallfinderError

if TYPE_CHECKING:
    from wallfinder.diagnosis import TraceMarks

PROCESS = "wallfinder"
TRACK_ORDER = ("steps", "idle gaps", "critical path")
"""The tracks first, in this order; the findings' tracks after them, in the findings' order."""


def marks_document(marks: TraceMarks) -> dict[str, Any]:
    """The trace-event document of `marks`."""
    pid = marks.pid
    tracks: dict[str, int] = {}
    for t in (*TRACK_ORDER, *(m.track for m in marks.marks)):
        tracks.setdefault(t, len(tracks) + 1)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": PROCESS}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": -1}},
    ]
    used = {m.track for m in marks.marks}
    for track, tid in tracks.items():
        if track not in used:
            continue
        events.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}}
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    for m in marks.marks:
        event: dict[str, Any] = {
            "name": m.name,
            "cat": PROCESS,
            "pid": pid,
            "tid": tracks[m.track],
            "ts": round(m.ts_us, 3),
        }
        if m.dur_us > 0:
            event.update(ph="X", dur=round(m.dur_us, 3))
        else:
            event.update(ph="i", s="t")
        if m.detail:
            event["args"] = {"wallfinder": m.detail}
        events.append(event)
    return {"traceEvents": events, "displayTimeUnit": "ms", "schema": marks.schema}


def write_marks(marks: TraceMarks, path: Path) -> None:
    """Write the companion trace to `path`, gzip-compressed when its name ends in `.gz`.
    Raises `WallfinderError` when it cannot be written."""
    data = json.dumps(marks_document(marks), separators=(",", ":")).encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise WallfinderError(f"{path}: cannot write ({exc.strerror})") from None
