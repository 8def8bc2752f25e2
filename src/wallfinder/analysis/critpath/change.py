"""The what-if changes: what `--what-if` takes, the rows of the default table, and which
change covers which (a finding's fix against a table row)."""

from __future__ import annotations

import msgspec

from wallfinder.errors import WallfinderError

WHAT_IFS = {
    "data": "data-loading gaps removed",
    "host": "host overhead (host work and launch calls) cut by a factor (host:F, default 2)",
    "sync": "synchronisation points removed (the host no longer waits for the device)",
    "fuse": "memory-bound chains fused (each at the fusion analysis's fused time)",
    "matmul": "matmuls at a fraction of their roof (matmul:P, default 0.8)",
    "overlap": "each collective overlapped with the compute it waited for (it starts with the "
    "previous bucket's backward kernel instead of after it)",
    "accum": "gradient accumulation without the all-reduce of each micro-step but the last "
    "(what DDP's no_sync() skips)",
    "microbatches": "a pipeline with M microbatches per step for the same batch "
    "(microbatches:M, default twice the trace's m): the stage's bubble waits (send/recv with no "
    "compute beside them) shrink by m/M, the per-microbatch stage time at M as the schedule's "
    "(p-1)/(m+p-1) gives it; the wait beyond the schedule's bubble stays",
    "prefetch": "FSDP/ZeRO-3 prefetch: each unit's all-gather (forward, and the backward's "
    "re-gather) runs beside the compute before it (the previous unit's) instead of after it, "
    "hiding at most that compute's time",
    "async-tp": "async tensor parallel: each forward all-reduce (reduce-scatter) of a "
    "row-parallel layer runs beside the compute before it (its layer's matmuls, in chunks), "
    "hiding at most that compute's time",
    "units-merged": "FSDP/ZeRO-3 units merged K at a time (units-merged:K, default 2): each "
    "group of K adjacent units' all-gathers (reduce-scatters) is one collective of their bytes, "
    "paying one collective's fixed cost instead of K (each one's fixed cost estimated as its "
    "time less its bytes at the link's peak; GPUs with a known link and message sizes only)",
}
"""The what-ifs `--what-if` takes, comma-separated (`data,host:4`)."""


class Change(msgspec.Struct, frozen=True):
    """A what-if: the graph's weights it changes. Identity by default."""

    data: bool = False
    host: float = 1.0
    """Host gaps (but the DataLoader's and collectives') and launch calls divided by this."""
    sync: bool = False
    fuse: bool = False
    matmul: float | None = None
    """Matmul-class kernels at this fraction of their roof (None: unchanged)."""
    overlap: bool = False
    """A collective that waited for an op on another stream (the bucket's last backward
    kernel) may start when that op starts, beside it."""
    accum: bool = False
    """The gradient all-reduces of the micro-steps that accumulate take no time (`no_sync()`
    in every micro-step but the last: they do not run); the last one's stays."""
    microbatches: int | None = None
    """A pipeline with this many microbatches per step (0: twice the trace's; None:
    unchanged): its bubble waits shrink (`critpath.lever`)."""
    prefetch: bool = False
    """FSDP's all-gathers beside the compute before them (`critpath.lever`)."""
    async_tp: bool = False
    """Tensor parallel's forward all-reduces beside the compute before them."""
    units_merged: int | None = None
    """FSDP's units merged this many at a time (0: two; None: unchanged): each merged
    group's collectives pay one fixed cost (`critpath.lever`)."""

    def items(self) -> list[tuple[str, str]]:
        """The what-ifs this change makes, in order: each one's name in `WHAT_IFS` and its
        item as `--what-if` writes it (`host:2`, `microbatches:8`)."""
        inf = float("inf")
        m, k = self.microbatches, self.units_merged
        made = (
            ("data", "data" if self.data else ""),
            (
                "host",
                "" if self.host == 1.0 else "host" if self.host == inf else f"host:{self.host:g}",
            ),
            ("sync", "sync" if self.sync else ""),
            ("fuse", "fuse" if self.fuse else ""),
            ("matmul", "" if self.matmul is None else f"matmul:{self.matmul:g}"),
            ("overlap", "overlap" if self.overlap else ""),
            ("accum", "accum" if self.accum else ""),
            ("microbatches", "" if m is None else f"microbatches:{m}" if m else "microbatches"),
            ("prefetch", "prefetch" if self.prefetch else ""),
            ("async-tp", "async-tp" if self.async_tp else ""),
            ("units-merged", "" if k is None else f"units-merged:{k}" if k else "units-merged"),
        )
        return [(name, item) for name, item in made if item]

    @property
    def label(self) -> str:
        return ",".join(item for _, item in self.items()) or "unchanged"


_FLAGS = {
    "data": "data",
    "sync": "sync",
    "fuse": "fuse",
    "overlap": "overlap",
    "accum": "accum",
    "prefetch": "prefetch",
    "async-tp": "async_tp",
}
"""The what-ifs that take no argument, and their `Change` fields."""


def parse_what_if(text: str) -> list[Change]:
    """The rows a `--what-if` text asks for: each item alone, then (for several) all of them
    combined. Raises `WallfinderError` for an unknown item or a bad factor."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise WallfinderError("--what-if: name at least one of " + ", ".join(WHAT_IFS))
    singles = [_parse_item(t) for t in items]
    if len(singles) == 1:
        return singles
    combined = Change()
    for c in singles:
        combined = msgspec.structs.replace(
            combined,
            host=max(combined.host, c.host),
            matmul=c.matmul if c.matmul is not None else combined.matmul,
            microbatches=c.microbatches if c.microbatches is not None else combined.microbatches,
            units_merged=c.units_merged if c.units_merged is not None else combined.units_merged,
            **{f: True for f in _FLAGS.values() if getattr(c, f)},
        )
    # (A combination that is one of the items, `microbatches,microbatches:8`, is no new row.)
    return singles if combined in singles else [*singles, combined]


def _parse_item(item: str) -> Change:
    name, _, arg = item.partition(":")
    name = name.strip().lower()
    if name not in WHAT_IFS:
        raise WallfinderError(f"--what-if: unknown change {name!r} (known: {', '.join(WHAT_IFS)})")
    value: float | None = None
    if arg:
        try:
            value = float(arg.rstrip("%")) / (100.0 if arg.endswith("%") else 1.0)
        except ValueError:
            raise WallfinderError(f"--what-if: {item!r}: {arg!r} is not a number") from None
    if name == "host":
        factor = 2.0 if value is None else value
        if not factor >= 1.0:
            raise WallfinderError(f"--what-if: {item!r}: the factor must be at least 1")
        return Change(host=factor)
    if name == "matmul":
        pct = 0.8 if value is None else value
        if not 0.0 < pct <= 1.0:
            raise WallfinderError(f"--what-if: {item!r}: the fraction of roof is in (0, 1]")
        return Change(matmul=pct)
    if name == "microbatches":
        if value is None:
            return Change(microbatches=0)
        if not (value >= 1 and value == int(value) and not arg.endswith("%")):
            raise WallfinderError(f"--what-if: {item!r}: M is a whole number of microbatches")
        return Change(microbatches=int(value))
    if name == "units-merged":
        if value is None:
            return Change(units_merged=0)
        if not (value >= 2 and value == int(value) and not arg.endswith("%")):
            raise WallfinderError(f"--what-if: {item!r}: K is a whole number of units, at least 2")
        return Change(units_merged=int(value))
    if value is not None:
        raise WallfinderError(f"--what-if: {name!r} takes no argument")
    return Change(**{_FLAGS[name]: True})


UNCHANGED = Change()
"""The identity what-if: the graph replayed as it is."""

DEFAULT_CHANGES = (
    Change(data=True),
    Change(host=2.0),
    Change(sync=True),
    Change(fuse=True),
    Change(matmul=0.8),
)

OVERLAP = Change(overlap=True)
"""The what-if of the exposed-communication finding's fix: in the default table when exposed
communication is the wall's cause (`default_changes`)."""

ACCUM = Change(accum=True)
"""The what-if of the per-micro-step gradient sync finding's fix (`no_sync()`): in the default
table when the graph holds such all-reduces (`default_changes`)."""


MICROBATCHES = Change(microbatches=0)
"""The what-if of the pipeline bubble's fix (twice the microbatches): in the default table
where the trace shows a pipeline (`default_changes`)."""

PREFETCH = Change(prefetch=True)
"""The what-if of FSDP's exposed all-gathers' fix: in the default table where the trace
shows FSDP's all-gathers."""

ASYNC_TP = Change(async_tp=True)
"""The what-if of tensor parallel's exposed all-reduces' fix: in the default table where the
trace shows them."""

UNITS_MERGED = Change(units_merged=0)
"""The what-if of FSDP's small units' fix (adjacent units merged in pairs): in the default
table where the trace shows their collectives' sizes and the device's link."""

LEVERS = {
    "microbatches": MICROBATCHES,
    "prefetch": PREFETCH,
    "async-tp": ASYNC_TP,
    "units-merged": UNITS_MERGED,
}
"""A parallel strategy's lever by name: the work each changes is selected by the rule that
replays it (`critpath.lever`)."""


def levers_of(change: Change) -> tuple[str, ...]:
    """The strategy levers `change` pulls (names in LEVERS)."""
    return tuple(name for name, _ in change.items() if name in LEVERS)


def default_changes(
    cause: str, device_ops: bool, accumulates: bool = False, levers: tuple[str, ...] = ()
) -> tuple[Change, ...]:
    """The what-if table's rows when `--what-if` does not name them, for a step whose wall has
    `cause`: with no device ops (the CPU as the device) there is nothing to sync, fuse,
    re-time or overlap; `accum` where the graph holds all-reduces of micro-steps that
    accumulate (`accumulates`), and only there (elsewhere it changes nothing); each strategy
    lever whose work the trace shows (`levers`, names in LEVERS), on either device."""
    pulled = tuple(LEVERS[n] for n in LEVERS if n in levers)
    if not device_ops:
        return DEFAULT_CHANGES[:2] + pulled
    return (
        DEFAULT_CHANGES
        + ((OVERLAP,) if cause == "comm_exposed" else ())
        + ((ACCUM,) if accumulates else ())
        + pulled
    )


def _kinds(change: Change) -> frozenset[str]:
    return frozenset(name for name, _ in change.items())


def covers(finding: Change, row: Change) -> bool:
    """The finding's change is the row's, or a larger one of the same kind (all host work
        gone against half of it, matmuls at their roof against 80% of it); microbatches only at
        the same count (more of them is a larger change, fewer a smaller one), and units merged
    likewise."""
    return (
        _kinds(finding) == _kinds(row)
        and finding.host >= row.host
        and (row.matmul is None or (finding.matmul or 0.0) >= row.matmul)
        and finding.microbatches == row.microbatches
        and finding.units_merged == row.units_merged
    )
