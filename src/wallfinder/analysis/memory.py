"""What fills GPU memory, from a CUDA allocator snapshot: pure functions, no file I/O.

From the segments: reserved and allocated bytes per device, fragmentation, live blocks by
call site, the largest allocations. From the recorded history (`device_traces`): the peak of
allocated bytes and what was live then, growth over the history, call sites whose allocations
are never freed, out-of-memory events.

Categories (parameters, optimizer state, gradients, activations) are heuristics on the call
stack of each allocation, not facts the allocator records: a stack through `torch/optim/` is
optimizer state, one through autograd's backward is a gradient, one through `Module._apply`,
`.to`, `.cuda` or parameter initialisation is a parameter, another through a `forward` is an
activation or temporary, anything else is other: `SNAPSHOT_CATEGORIES` of the one vocabulary
(`wallfinder.diagnosis.MEMORY_CATEGORIES`). The history's entries become columns and are
replayed by the one allocate/free replay (`wallfinder.analysis.allocations`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.allocations import Replay, rank_sites
from wallfinder.analysis.rules import evaluate, rule
from wallfinder.analysis.thresholds import SnapshotThresholds, Thresholds
from wallfinder.diagnosis import (
    SNAPSHOT_CATEGORIES,
    DeviceMemory,
    Finding,
    MemoryBlock,
    MemoryLeak,
    MemoryPeak,
    MemoryReport,
    MemorySite,
    OomEvent,
)
from wallfinder.trace.snapshot import OOM, History, Snapshot, SnapshotFrame, TraceEntry, history
from wallfinder.units import is_user_path, short_path, size

__all__ = ["SnapshotFacts", "call_site", "category", "memory_report"]

I64 = npt.NDArray[np.int64]

_PARAM_FUNCS = {"_apply", "to", "cuda", "reset_parameters", "__init__", "to_empty"}
_BACKWARD_FUNCS = {"backward", "_engine_run_backward", "run_backward", "grad"}
_FORWARD_FUNCS = {"forward", "_call_impl", "_wrapped_call_impl"}


def call_site(frames: Sequence[SnapshotFrame]) -> str:
    """The first frame (innermost first) outside torch and site-packages, else the first."""
    if not frames:
        return "unknown (no stack recorded)"
    frame = next((f for f in frames if is_user_path(f.filename)), frames[0])
    return f"{short_path(frame.filename)}:{frame.line} ({frame.name})"


def category(frames: Sequence[SnapshotFrame]) -> str:
    """A heuristic guess at what an allocation holds, from its call stack: one of
    `SNAPSHOT_CATEGORIES`."""
    files = [f.filename.replace("\\", "/") for f in frames]
    if any("torch/optim/" in f for f in files):
        return "optimizer_state"
    if any(
        f.name in _BACKWARD_FUNCS or "torch/autograd/" in p
        for f, p in zip(frames, files, strict=True)
    ):
        return "gradients"
    for f, p in zip(frames, files, strict=True):
        if "nn/modules/module.py" in p and f.name in _PARAM_FUNCS:
            return "parameters"
        if p.endswith("nn/init.py") or f.name == "reset_parameters":
            return "parameters"
        if "nn/modules/" in p and f.name == "__init__":
            return "parameters"
    if any(f.name in _FORWARD_FUNCS for f in frames):
        return "activations"
    return "other"


def _by_site(items: Sequence[tuple[int, Sequence[SnapshotFrame]]], top: int) -> list[MemorySite]:
    return rank_sites(((call_site(fr), category(fr), nbytes) for nbytes, fr in items), top)


def _categories(items: Sequence[tuple[int, Sequence[SnapshotFrame]]]) -> dict[str, int]:
    out = dict.fromkeys(SNAPSHOT_CATEGORIES, 0)
    for nbytes, frames in items:
        out[category(frames)] += nbytes
    return out


def _devices(snapshot: Snapshot) -> list[DeviceMemory]:
    out = []
    for device in sorted({s.device for s in snapshot.segments}):
        segs = [s for s in snapshot.segments if s.device == device]
        reserved = sum(s.reserved for s in segs)
        allocated = sum(s.allocated for s in segs)
        free_blocks = [b.size for s in segs for b in s.blocks if not b.live]
        live = [(b.size, b.stack) for s in segs for b in s.blocks if b.live]
        out.append(
            DeviceMemory(
                device=device,
                reserved=reserved,
                allocated=allocated,
                free=max(0, reserved - allocated),
                segments=len(segs),
                largest_free_block=max(free_blocks, default=0),
                categories=_categories(live),
            )
        )
    return out


@dataclass
class _Replayed:
    peak: MemoryPeak
    leaks: list[MemoryLeak]
    ooms: list[OomEvent]


def _replay(
    device: int, entries: list[TraceEntry], allocated_now: int | None, th: SnapshotThresholds
) -> _Replayed:
    h = history(entries)
    r = Replay.of(h.addr, h.size, h.action)
    curve = r.level
    current = int(curve[-1])
    # The history is a ring buffer: it may begin with memory already allocated. The snapshot's
    # segments give the allocated bytes at its end, so the start is that minus the net change.
    unmatched = int(h.size[r.from_before()].sum())
    baseline = max(unmatched, -min(int(curve.min()), 0), 0)
    if allocated_now is not None and allocated_now - current >= baseline:
        baseline = allocated_now - current
    peak_index = int(np.argmax(curve))
    at_peak = [(int(h.size[i]), h.frames[i]) for i in r.live_after(peak_index).tolist()]
    ooms = [
        OomEvent(
            device=device,
            index=i,
            time_us=h.time_us[i],
            requested=int(h.size[i]),
            device_free=int(h.addr[i]),
            allocated=baseline + int(curve[i]),
        )
        for i in np.flatnonzero(h.action == OOM).tolist()
    ]
    peak = MemoryPeak(
        device=device,
        bytes=baseline + int(curve[peak_index]),
        index=peak_index,
        events=len(entries),
        time_us=h.time_us[peak_index],
        baseline=baseline,
        start=baseline,
        end=baseline + current,
        growth=current,
        categories=_categories(at_peak),
        sites=_by_site(at_peak, th.top),
    )
    never_freed = r.live_after(len(entries) - 1)
    return _Replayed(peak=peak, leaks=_leaks(device, h, never_freed, th), ooms=ooms)


def _leaks(device: int, h: History, never_freed: I64, th: SnapshotThresholds) -> list[MemoryLeak]:
    # Never freed is not enough (parameters and optimizer state live for the whole run):
    # a suspect site keeps allocating without freeing in every third of the history.
    n = len(h.frames)
    groups: dict[str, list[int]] = defaultdict(list)
    for i in never_freed.tolist():
        groups[call_site(h.frames[i])].append(i)
    out = []
    for site, items in groups.items():
        thirds = {3 * i // max(n, 1) for i in items}
        if len(items) >= th.leak_min_count and thirds == {0, 1, 2}:
            out.append(
                MemoryLeak(
                    device=device,
                    site=site,
                    category=category(h.frames[items[0]]),
                    count=len(items),
                    bytes=int(h.size[items].sum()),
                )
            )
    return sorted(out, key=lambda s: (-s.bytes, s.site))


@dataclass(frozen=True)
class SnapshotFacts:
    """What the snapshot rules look at: the report (without findings) and the thresholds."""

    report: MemoryReport
    thresholds: Thresholds

    @property
    def limits(self) -> SnapshotThresholds:
        return self.thresholds.snapshot


@rule(SnapshotFacts)
def oom(f: SnapshotFacts) -> Finding | None:
    r = f.report
    if not r.ooms:
        return None
    e = r.ooms[0]
    held = f", {size(e.allocated)} allocated" if e.allocated is not None else ""
    return Finding.memory(
        id="memory-oom",
        title=f"Out of memory on device {e.device} ({len(r.ooms)} event(s))",
        evidence=f"a request for {size(e.requested)} failed with {size(e.device_free)} free on "
        f"the device{held}",
        fix="lower the peak: see the call sites live at the peak; activation checkpointing, a "
        "smaller micro-batch, or expandable_segments if reserved memory is fragmented",
    )


@rule(SnapshotFacts)
def fragmentation(f: SnapshotFacts) -> Finding | None:
    r, th = f.report, f.limits
    worst = max(r.devices, key=lambda d: d.free, default=None)
    if worst is None or worst.free <= th.fragmentation_free:
        return None
    if worst.reserved <= th.fragmentation_ratio * worst.allocated:
        return None
    return Finding.memory(
        id="memory-fragmentation",
        title=f"Allocator cache holds {size(worst.free)} it is not using (device {worst.device})",
        evidence=f"reserved {size(worst.reserved)} vs allocated {size(worst.allocated)} in "
        f"{worst.segments} segments; largest free block {size(worst.largest_free_block)}",
        fix="set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so segments grow instead of "
        "fragmenting; avoid many differently shaped allocations (pad or bucket shapes)",
        saving_bytes=worst.free,
        device=f"cuda:{worst.device}",
    )


@rule(SnapshotFacts)
def activations(f: SnapshotFacts) -> Finding | None:
    r, th = f.report, f.limits
    if r.peaks:
        peak = max(r.peaks, key=lambda p: p.bytes)
        cats, total, where = peak.categories, peak.bytes, f"the peak (device {peak.device})"
    else:
        cats, total, where = r.categories, sum(d.allocated for d in r.devices), "the snapshot"
    act = cats.get("activations", 0)
    if total <= 0 or act / total < th.activation_share:
        return None
    return Finding.memory(
        id="memory-activations",
        title=f"Activations and temporaries are {act / total:.0%} of memory at {where}",
        evidence=f"{size(act)} of {size(total)} allocated from forward frames (heuristic)",
        fix="activation checkpointing (torch.utils.checkpoint) on the largest blocks, bf16 "
        "autocast, or a smaller micro-batch with gradient accumulation",
        saving_bytes=act,
    )


@rule(SnapshotFacts)
def optimizer(f: SnapshotFacts) -> Finding | None:
    r, th = f.report, f.limits
    views = [(r.categories, sum(d.allocated for d in r.devices))]
    views += [(p.categories, p.bytes) for p in r.peaks]
    cats, total = max(views, key=lambda v: v[0].get("optimizer_state", 0))
    opt = cats.get("optimizer_state", 0)
    if total <= 0 or opt < th.optimizer_bytes or opt / total < th.optimizer_share:
        return None
    params = cats.get("parameters", 0)
    ratio = f" ({opt / params:.1f}x the parameters)" if params else ""
    return Finding.memory(
        id="memory-optimizer-state",
        title=f"Optimizer state is {opt / total:.0%} of allocated memory",
        evidence=f"{size(opt)} from torch/optim/ frames{ratio}, of {size(total)} (heuristic)",
        fix="shard the optimizer state across ranks (FSDP, ZeRO via DeepSpeed or "
        "ZeroRedundancyOptimizer), or use an 8-bit optimizer (bitsandbytes)",
        saving_bytes=opt,
    )


@rule(SnapshotFacts)
def leaks(f: SnapshotFacts) -> Finding | None:
    r = f.report
    if not r.leaks:
        return None
    top = r.leaks[0]
    return Finding.memory(
        id="memory-leak-suspect",
        title=f"{len(r.leaks)} call site(s) keep allocating and never free",
        evidence=f"{top.site}: {top.count} allocations, {size(top.bytes)} never freed over the "
        f"history, found in every third of it",
        fix="find tensors kept across steps (losses or outputs appended for logging): keep "
        "`.detach()` or `.item()` values, every N steps, not tensors with their graph",
        saving_bytes=sum(leak.bytes for leak in r.leaks),
    )


def memory_report(
    snapshot: Snapshot, *, source: str = "snapshot", thresholds: Thresholds | None = None
) -> MemoryReport:
    """What fills GPU memory in `snapshot`, with the findings that follow from it (when:
    `thresholds.snapshot`)."""
    thresholds = thresholds or Thresholds()
    th = thresholds.snapshot
    devices = _devices(snapshot)
    live = [(seg.device, block) for seg in snapshot.segments for block in seg.blocks if block.live]
    items = [(b.size, b.stack) for _, b in live]
    largest = sorted(live, key=lambda db: -db[1].size)[: th.top]
    notes = []
    allocated = {d.device: d.allocated for d in devices}
    peaks, found_leaks, ooms = [], [], []
    for device, entries in enumerate(snapshot.device_traces):
        if not entries:
            continue
        replay = _replay(device, entries, allocated.get(device), th)
        peaks.append(replay.peak)
        found_leaks += replay.leaks
        ooms += replay.ooms
    if not peaks:
        notes.append(
            "no allocation history: call torch.cuda.memory._record_memory_history() before "
            "the snapshot to see the peak, growth and leaks"
        )
    if not snapshot.segments:
        notes.append("no segments: the snapshot holds no allocator state")
    notes.append("categories are heuristics on call stacks, not recorded facts")
    report = MemoryReport(
        source=source,
        devices=devices,
        categories=_categories(items),
        sites=_by_site(items, th.top),
        largest=[
            MemoryBlock(device=d, bytes=b.size, site=call_site(b.stack), category=category(b.stack))
            for d, b in largest
        ],
        peaks=peaks,
        leaks=found_leaks,
        ooms=ooms,
        notes=notes,
    )
    findings = evaluate(SnapshotFacts(report, thresholds))
    return msgspec.structs.replace(report, findings=findings)
