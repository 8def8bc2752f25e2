"""The one memory model: categories, blocks, sites and leaks, a trace's memory profile and an
allocator snapshot's `MemoryReport`."""

from __future__ import annotations

import msgspec

from wallfinder.diagnosis._base import (
    _Base,
    _Schema,
    _upgrade_memory_findings,
    _upgrade_snapshot_categories,
)
from wallfinder.diagnosis._step import Finding

MEMORY_CATEGORIES = (
    "parameters",
    "before_trace",
    "activations",
    "retained",
    "gradients",
    "optimizer_state",
    "temporaries",
    "other",
)
"""What a block of memory holds: one vocabulary for both memory sources, each a heuristic,
never a fact the allocator records. Each source can tell only some of them:

- an allocator snapshot (`wallfinder.analysis.memory`), from the call stack of each
  allocation: `SNAPSHOT_CATEGORIES` (parameters, optimizer_state, gradients, activations;
  other when the stack says none of them);
- a profiler trace's memory events (`wallfinder.analysis.memory_profile`), from when each
  block was allocated and freed: `PROFILE_CATEGORIES` (parameters for blocks allocated
  before the first step and never freed; before_trace for what was allocated before the
  trace, parameters among it; activations, retained, gradients, optimizer_state,
  temporaries; other for blocks allocated between steps).

Gradients come from the backward pass only (autograd's engine on the stack, or the events'
backward phase): a forward-only or compiled inference run has none.

/1 memory reports named the snapshot's other "unknown"; `MemoryReport.from_json` renames it."""

SNAPSHOT_CATEGORIES = ("parameters", "optimizer_state", "gradients", "activations", "other")
"""The categories a snapshot's call stacks tell, in the order its reports list them."""

PROFILE_CATEGORIES = MEMORY_CATEGORIES
"""The categories a profiler trace's event timing tells, in the order its reports list them
(all of them: parameters since the memory reports of issue 16)."""


class MemoryBlock(_Base, frozen=True):
    """One live allocation: its size, category and call site, with what its source knows
    of it. From a snapshot: `device`, its index. From a profiler trace (the device is the
    profile's): the op that allocated it, and when (`step`, `phase`); `site` is the
    innermost user-code frames, null when the trace has no Python stacks."""

    bytes: int
    category: str
    site: str | None
    op: str | None = None
    step: str | None = None
    phase: str | None = None
    device: int | None = None


class MemorySite(_Base, frozen=True):
    """Live bytes from one call site and category. From a snapshot, the site is the first
    frame outside torch and site-packages (else the innermost frame); from a profiler trace,
    the innermost user-code frames (else the op, without stacks)."""

    site: str
    category: str
    bytes: int
    count: int


class MemoryLeak(_Base, frozen=True):
    """A call site whose blocks, allocated in several steps (`steps`), are still alive at
    the end of later ones while allocated memory rises step over step: growth that persists
    across steps (never one step's working set). From a snapshot, with its `device` and the
    `category` of its first block; from a profiler trace, with the `op` that allocates most
    of them."""

    site: str
    count: int
    bytes: int
    category: str | None = None
    op: str | None = None
    steps: int | None = None
    device: int | None = None


class StepMemory(_Base, frozen=True):
    """Allocated bytes at one step's start and its peak, and how often the allocator grew or
    shrank its reserved memory (device mallocs/frees) during it. Seconds from trace start."""

    step: str
    start_s: float
    end_s: float
    start_allocated: int
    end_allocated: int
    peak_allocated: int
    peak_reserved: int
    reserved_changes: int
    warmup: bool = False


class MemoryPoint(_Base, frozen=True):
    """A point of the memory timeline (seconds from trace start): allocated and reserved
    bytes, and allocated bytes by category."""

    t_s: float
    allocated: int
    reserved: int
    categories: dict[str, int] = {}


class DeviceMemoryProfile(_Base, frozen=True):
    """One device's memory over a profiler trace, from its `[memory]` events.

    `peak_*` are the allocator's own totals. `categories` split what is live at the peak;
    `before_trace` is what was allocated before the trace's first event (on the CPU the
    profiler counts only blocks allocated while it records, so it is 0 there).
    `growth_per_step` is the slope of allocated bytes at the boundaries of the steady-state
    steps (least squares, leaving out the first boundary: a first step that allocates what the
    loop keeps is not a leak); `leak` says they rise and seldom fall, by enough to matter."""

    device: str
    events: int
    capacity: int | None
    capacity_source: str | None
    peak_allocated: int
    peak_reserved: int
    """0 where the device reports no reserved memory (the CPU)."""
    peak_time_s: float
    peak_step: str | None
    peak_phase: str
    peak_op: str | None
    before_trace: int
    categories: dict[str, int] = {}
    largest: list[MemoryBlock] = []
    sites: list[MemorySite] = []
    steps: list[StepMemory] = []
    growth_per_step: float | None = None
    leak: bool = False
    leak_sites: list[MemoryLeak] = []
    reserved_at_peak: int = 0
    """Reserved bytes when allocated peaks: reserved - allocated is cached but unused."""
    reserved_grows: int = 0
    reserved_shrinks: int = 0
    steady_reserved_changes_per_step: float = 0.0
    timeline: list[MemoryPoint] = []


class MemoryProfile(_Base, frozen=True):
    """Memory from the trace's `[memory]` events (`profile_memory=True`), per device, with
    findings on the analysed device."""

    devices: list[DeviceMemoryProfile] = []
    findings: list[Finding] = []
    """The memory findings (`saves` "memory") of the analysed device, in the order of their
    rules."""
    notes: list[str] = []

    @property
    def main(self) -> DeviceMemoryProfile | None:
        """The analysed device's profile (the first), None when no device has one."""
        return self.devices[0] if self.devices else None


MEMORY_SCHEMA = "wallfinder.memory/2"
"""/2: findings of the one `Finding` type (`saves` "memory"); blocks and leaks of the one
memory model (`MemoryBlock`, `MemoryLeak`: the fields of a profiler trace's blocks and leak
sites added, null here); the category /1 called "unknown" is "other" (`MEMORY_CATEGORIES`).
`MemoryReport.from_json` reads /1 too."""
_MEMORY_V1 = "wallfinder.memory/1"


class DeviceMemory(_Base, frozen=True):
    """One device's allocator state at the snapshot (bytes)."""

    device: int
    reserved: int
    allocated: int
    free: int
    """Reserved but not allocated: cached by the allocator, unusable by other processes."""
    segments: int
    largest_free_block: int
    categories: dict[str, int] = {}


class MemoryPeak(_Base, frozen=True):
    """The peak of allocated bytes over one device's recorded history (replaying alloc and
    free events). `baseline` is what was already allocated when the history begins."""

    device: int
    bytes: int
    index: int
    events: int
    time_us: int | None
    """The allocator's time stamp of the peak's event (µs since the epoch)."""
    baseline: int
    start: int
    end: int
    growth: int
    categories: dict[str, int] = {}
    sites: list[MemorySite] = []
    time_s: float | None = None
    """Seconds from the history's first time-stamped event to the peak's (null: no stamps)."""


class OomEvent(_Base, frozen=True):
    device: int
    index: int
    time_us: int | None
    requested: int
    device_free: int
    allocated: int | None


class MemoryReport(_Base, frozen=True, kw_only=True):
    """What fills GPU memory, from an allocator snapshot (`wallfinder memory`): bytes in
    integers, categories are heuristics on call stacks, never certainties."""

    schema: str = MEMORY_SCHEMA
    source: str
    devices: list[DeviceMemory] = []
    categories: dict[str, int] = {}
    sites: list[MemorySite] = []
    largest: list[MemoryBlock] = []
    peaks: list[MemoryPeak] = []
    leaks: list[MemoryLeak] = []
    ooms: list[OomEvent] = []
    findings: list[Finding] = []
    notes: list[str] = []

    @classmethod
    def from_json(cls, text: str | bytes) -> MemoryReport:
        """A memory report from its JSON form, of this schema or /1 (upgraded)."""
        if msgspec.json.decode(text, type=_Schema).schema != _MEMORY_V1:
            return msgspec.json.decode(text, type=cls)
        data = msgspec.json.decode(text)
        _upgrade_memory_findings(data)
        _upgrade_snapshot_categories(data)
        return msgspec.convert({**data, "schema": MEMORY_SCHEMA}, cls)
