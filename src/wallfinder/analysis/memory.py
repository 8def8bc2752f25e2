"""What fills GPU memory, from a CUDA allocator snapshot: pure functions, no file I/O.

From the segments: reserved and allocated bytes per device, fragmentation, live blocks by
call site, the largest allocations. From the recorded history (`device_traces`): the peak of
allocated bytes and what was live then, growth over the history's steps, leaks, out-of-memory
events.

Categories (`SNAPSHOT_CATEGORIES` of the one vocabulary,
`wallfinder.diagnosis.MEMORY_CATEGORIES`) are heuristics, not facts the allocator records:
- from the call stack: through `torch/optim/`, optimizer state; through autograd's engine
  (its C++ frames, or `Tensor.backward`/`torch.autograd.backward`/`grad` in Python), a
  gradient; through `Module._apply`/`.to`/`.cuda`/`to_empty`/`load_state_dict`,
  `nn.Parameter`, `nn.init` or a module's constructor, parameters; through a `forward`, an
  activation; anything else, other. Only the backward pass makes gradients, so a
  forward-only or compiled inference run has none (a compiled forward runs inside
  `torch/autograd/function.py`, which is no backward);
- from the history, where the stack says nothing: a block with no stack that was allocated
  before the history began and stayed alive through all of it, and a block allocated before
  the first forward pass and never freed, is the model's parameters. The report's notes say
  when a category rests on this.

A leak is growth that persists across steps. The history is cut into steps: in training,
at each forward pass that follows a backward pass or an optimizer step; in a forward-only
history, where the model's outermost forward call starts again (the first allocation at the
shallowest module depth, recurring). Then the one rule of `wallfinder.analysis.allocations`
applies: the level at the steps' starts rises, and blocks allocated in earlier steps are
still alive at the end of later ones. A history of one step (one forward pass, one
training step) has no leak verdict, whatever it keeps alive. The history's entries become
columns and are replayed by the one allocate/free replay.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.allocations import Replay, by_site, rank_sites, step_growth
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
from wallfinder.trace.model import OOM
from wallfinder.units import is_user_path, short_path, size

if TYPE_CHECKING:
    from wallfinder.trace.snapshot import (
        History,
        Snapshot,
        SnapshotBlock,
        SnapshotFrame,
        TraceEntry,
    )

__all__ = ["SnapshotFacts", "call_site", "category", "memory_report"]

I64 = npt.NDArray[np.int64]

_MODULE_PARAM_FUNCS = {
    "_apply",
    "to",
    "cuda",
    "to_empty",
    "__init__",
    "load_state_dict",
    "_load_from_state_dict",
}
_BACKWARD_FUNCS = {"backward", "_engine_run_backward", "run_backward", "grad"}
_FORWARD_FUNCS = {"forward", "_call_impl", "_wrapped_call_impl"}
_ENGINE = ("torch::autograd::Engine::", "torch::autograd::python::PythonEngine::")
"""C++ frames of autograd's engine: every allocation of the backward pass runs under them."""
_AUTOGRAD_NODE = re.compile(r"torch::autograd::(?:generated::)?(\w+)::apply")

FORWARD, BACKWARD, OPTIMIZER, OTHER = range(4)


def _path(frame: SnapshotFrame) -> str:
    return frame.filename.replace("\\", "/")


def _in_torch(path: str, *names: str) -> bool:
    return any(path.endswith(f"torch/{n}") or f"torch/{n}/" in path for n in names)


def _stage(frames: Sequence[SnapshotFrame]) -> int:
    """The part of a step an allocation was made in, from its stack: FORWARD, BACKWARD,
    OPTIMIZER or OTHER."""
    paths = [_path(f) for f in frames]
    if any("torch/optim/" in p for p in paths):
        return OPTIMIZER
    for f, p in zip(frames, paths, strict=True):
        if f.name.startswith(_ENGINE):
            return BACKWARD
        # Only torch's own backward entry points: a compiled forward runs inside
        # torch/autograd/function.py, and no_grad decorators live under torch/autograd/ too.
        if f.name in _BACKWARD_FUNCS and (
            _in_torch(p, "autograd") or p.endswith("torch/_tensor.py")
        ):
            return BACKWARD
    if any(f.name in _FORWARD_FUNCS for f in frames):
        return FORWARD
    return OTHER


def _builds_parameters(frames: Sequence[SnapshotFrame]) -> bool:
    """Whether the stack makes, moves or loads a module's parameters."""
    for f in frames:
        p = _path(f)
        if "nn/modules/module.py" in p and f.name in _MODULE_PARAM_FUNCS:
            return True
        if p.endswith(("nn/init.py", "nn/parameter.py")) or f.name == "reset_parameters":
            return True
        if "nn/modules/" in p and f.name == "__init__":
            return True
    return False


def _depth(frames: Sequence[SnapshotFrame]) -> int:
    """How many `forward` calls (module depth) the stack is inside."""
    return sum(f.name == "forward" for f in frames)


def call_site(frames: Sequence[SnapshotFrame]) -> str:
    """The first Python frame (innermost first) outside torch and site-packages, else the
    first Python frame; for a stack of C++ frames only, the autograd node that allocated
    (the backward pass runs on autograd's own thread, with no Python frames), else the
    innermost frame."""
    if not frames:
        return "unknown (no stack recorded)"
    python = [f for f in frames if _path(f).endswith(".py")]
    if python:
        frame = next((f for f in python if is_user_path(f.filename)), python[0])
        return f"{short_path(frame.filename)}:{frame.line} ({frame.name})"
    for f in frames:
        node = _AUTOGRAD_NODE.search(f.name)
        if node:
            return f"autograd backward ({node.group(1)}, no Python stack)"
    if any(f.name.startswith(_ENGINE) for f in frames):
        return "autograd backward (no Python stack)"
    frame = frames[0]
    return f"{short_path(frame.filename)}:{frame.line} ({frame.name})"


def category(frames: Sequence[SnapshotFrame]) -> str:
    """A heuristic guess at what an allocation holds, from its call stack alone: one of
    `SNAPSHOT_CATEGORIES`."""
    stage = _stage(frames)
    if stage == OPTIMIZER:
        return "optimizer_state"
    if stage == BACKWARD:
        return "gradients"
    if _builds_parameters(frames):
        return "parameters"
    if stage == FORWARD:
        return "activations"
    return "other"


Item = tuple[int, str, str]
"""A live block as the report groups it: bytes, call site, category."""


class _Labels(msgspec.Struct):
    """What the history adds to the stacks: the category of blocks whose stack says nothing
    (by device and address), and the notes that say so."""

    by_block: dict[tuple[int, int], str] = msgspec.field(default_factory=dict)
    """Category of each block alive at the end of a history, by (device, address)."""
    histories: set[int] = msgspec.field(default_factory=set)
    """Devices with a recorded history."""
    from_before: dict[int, list[int]] = msgspec.field(default_factory=dict)
    """Per device, the bytes of each block with no stack that predates its history."""
    setup: dict[int, list[int]] = msgspec.field(default_factory=dict)
    """Per device, the bytes of each block allocated before the first forward pass and never
    freed that no stack names."""

    def of(self, device: int, block: SnapshotBlock) -> str:
        """The category of a live block of the segments."""
        if block.address is not None and (device, block.address) in self.by_block:
            return self.by_block[device, block.address]
        if not block.stack and device in self.histories:
            # No stack: allocated before recording began, and alive through all of the
            # history (a block freed in it would have left its address to a newer one).
            self.from_before.setdefault(device, []).append(block.size)
            return "parameters"
        return category(block.stack)

    def notes(self, without_stack: list[int]) -> list[str]:
        out = []
        before = [b for sizes in self.from_before.values() for b in sizes]
        if before:
            out.append(
                f"{len(before)} blocks ({size(sum(before))}) have no recorded stack: they were "
                "allocated before the history began and stayed alive through all of it, so "
                "they are counted as parameters (the model's state from before recording: "
                "parameters, and any buffers or optimizer state made then)"
            )
        setup = [b for sizes in self.setup.values() for b in sizes]
        if setup:
            out.append(
                f"{len(setup)} blocks ({size(sum(setup))}) that no stack names were allocated "
                "before the first forward pass and never freed: counted as parameters"
            )
        if without_stack:
            out.append(
                f"{len(without_stack)} blocks ({size(sum(without_stack))}) have no recorded "
                "stack and no history to date them: counted as other"
            )
        return out


def _categories(items: Sequence[Item]) -> dict[str, int]:
    out = dict.fromkeys(SNAPSHOT_CATEGORIES, 0)
    for nbytes, _, cat in items:
        out[cat] += nbytes
    return out


def _by_site(items: Sequence[Item], top: int) -> list[MemorySite]:
    return rank_sites(((site, cat, nbytes) for nbytes, site, cat in items), top)


def _item(labels: _Labels, device: int, block: SnapshotBlock) -> Item:
    return block.size, call_site(block.stack), labels.of(device, block)


def _devices(
    snapshot: Snapshot, live_blocks: list[tuple[int, SnapshotBlock, Item]]
) -> list[DeviceMemory]:
    out = []
    for device in sorted({s.device for s in snapshot.segments}):
        segs = [s for s in snapshot.segments if s.device == device]
        reserved = sum(s.reserved for s in segs)
        allocated = sum(s.allocated for s in segs)
        free_blocks = [b.size for s in segs for b in s.blocks if not b.live]
        live = [item for d, _, item in live_blocks if d == device]
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


class _History(msgspec.Struct, frozen=True):
    """One device's history replayed, with the category and step of each event."""

    device: int
    h: History
    r: Replay
    cats: list[str]
    """Category of each allocation ("" for other events)."""
    step: I64
    """Index of the step each event falls in (-1: before the first step starts)."""
    steps: int

    @classmethod
    def of(cls, device: int, entries: list[TraceEntry], labels: _Labels) -> _History:
        # (Imported here: the rules import this module, and a trace's analysis reads no
        # snapshot.)
        from wallfinder.trace.snapshot import history

        h = history(entries)
        r = Replay.of(h.addr, h.size, h.action)
        allocs = np.flatnonzero(r.alloc).tolist()
        stages = {i: _stage(h.frames[i]) for i in allocs}
        cats = [""] * len(entries)
        for i in allocs:
            cats[i] = category(h.frames[i])
        # Before the first forward pass and never freed, where no stack says what it is:
        # the model built, moved or loaded before the loop.
        first = next((i for i in allocs if stages[i] != OTHER), None)
        if first is not None:
            for i in allocs:
                if i < first and cats[i] == "other" and r.free_of[i] < 0:
                    cats[i] = "parameters"
                    labels.setup.setdefault(device, []).append(int(h.size[i]))
        for i in r.live_after(len(entries) - 1).tolist():
            labels.by_block[device, int(h.addr[i])] = cats[i]
        labels.histories.add(device)
        starts = _step_starts(h, allocs, stages)
        step = np.searchsorted(starts, np.arange(len(entries)), side="right") - 1
        return cls(device, h, r, cats, step.astype(np.int64), len(starts))


def _step_starts(h: History, allocs: list[int], stages: dict[int, int]) -> I64:
    """Where each step starts. In training, each forward pass that follows a backward pass or
    an optimizer step; in a history without either, each allocation with the stack of the
    first one made at the shallowest module depth (the model's outermost forward call
    starting again). One start, or none: the history is one step, or has no forward."""
    staged = [i for i in allocs if stages[i] != OTHER]
    if any(stages[i] != FORWARD for i in staged):
        return np.array(
            [
                i
                for k, i in enumerate(staged)
                if stages[i] == FORWARD and (k == 0 or stages[staged[k - 1]] != FORWARD)
            ],
            dtype=np.int64,
        )
    if not staged:
        return np.zeros(0, dtype=np.int64)
    depth = {i: _depth(h.frames[i]) for i in staged}
    shallowest = min(depth.values())
    marker = tuple(h.frames[next(i for i in staged if depth[i] == shallowest)])
    return np.array(
        [i for i in staged if depth[i] == shallowest and tuple(h.frames[i]) == marker],
        dtype=np.int64,
    )


class _Replayed(msgspec.Struct):
    peak: MemoryPeak
    leaks: list[MemoryLeak]
    ooms: list[OomEvent]
    notes: list[str]


def _replay(
    hist: _History,
    before: list[Item],
    allocated_now: int | None,
    thresholds: Thresholds,
) -> _Replayed:
    """The peak, leaks and out-of-memory events of one device's history; `before` are the
    live blocks of its segments that predate the history (alive at its peak too)."""
    th = thresholds.snapshot
    device, h, r = hist.device, hist.h, hist.r
    curve = r.level
    current = int(curve[-1])
    # The history is a ring buffer: it may begin with memory already allocated. The snapshot's
    # segments give the allocated bytes at its end, so the start is that minus the net change.
    unmatched = int(h.size[r.from_before()].sum())
    baseline = max(unmatched, -min(int(curve.min()), 0), 0)
    if allocated_now is not None and allocated_now - current >= baseline:
        baseline = allocated_now - current
    peak_index = int(np.argmax(curve))
    at_peak = before + [
        (int(h.size[i]), call_site(h.frames[i]), hist.cats[i])
        for i in r.live_after(peak_index).tolist()
    ]
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
    stamps = [t for t in h.time_us if t is not None]
    at = h.time_us[peak_index]
    peak = MemoryPeak(
        device=device,
        bytes=baseline + int(curve[peak_index]),
        index=peak_index,
        events=len(h.frames),
        time_us=at,
        # The stamps count from the epoch: from the history's start is what a person reads.
        time_s=(at - min(stamps)) * 1e-6 if at is not None else None,
        baseline=baseline,
        start=baseline,
        end=baseline + current,
        growth=current,
        categories=_categories(at_peak),
        sites=_by_site(at_peak, th.top),
    )
    leaks, notes = _leaks(hist, baseline + int(curve[peak_index]), thresholds)
    return _Replayed(peak=peak, leaks=leaks, ooms=ooms, notes=notes)


def _leaks(hist: _History, peak: int, thresholds: Thresholds) -> tuple[list[MemoryLeak], list[str]]:
    """Call sites whose blocks, allocated in several steps, are still alive at the end of
    later steps while allocated memory rises step over step (with the notes on why there is
    no verdict)."""
    device, h, r = hist.device, hist.h, hist.r
    if hist.steps < 3:
        what = "one step" if hist.steps <= 1 else f"{hist.steps} steps"
        return [], [
            f"device {device}: the history holds {what}: no leak verdict, as a leak is growth "
            "that persists across steps"
        ]
    starts = np.searchsorted(hist.step, np.arange(hist.steps), side="left")
    # Allocated bytes just before each step starts (the history's own count).
    levels = np.array([r.level[i - 1] if i > 0 else 0 for i in starts.tolist()], np.float64)
    grown = step_growth(levels, peak, thresholds.memory)
    if not grown.leak:
        return [], []
    members = r.kept_across(hist.step, np.arange(hist.steps, dtype=np.int64))
    out = []
    for site, items in by_site(members, lambda i: call_site(h.frames[i]), hist.step).items():
        if len(items) < thresholds.snapshot.leak_min_count:
            continue
        out.append(
            MemoryLeak(
                device=device,
                site=site,
                category=hist.cats[items[0]],
                count=len(items),
                bytes=int(h.size[items].sum()),
                steps=len({int(hist.step[i]) for i in items}),
            )
        )
    notes = []
    if not out:
        notes.append(
            f"device {device}: allocated memory rises step over step, but no call site's "
            "blocks stay alive across steps: the growth is in blocks freed later"
        )
    return sorted(out, key=lambda s: (-s.bytes, s.site)), notes


class SnapshotFacts(msgspec.Struct, frozen=True):
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


OPTIMIZER_SITES = 2
"""Call sites of optimizer state the finding's evidence names (the largest)."""


@rule(SnapshotFacts)
def optimizer(f: SnapshotFacts) -> Finding | None:
    r, th = f.report, f.limits
    views = [(r.categories, sum(d.allocated for d in r.devices), r.sites)]
    views += [(p.categories, p.bytes, p.sites) for p in r.peaks]
    cats, total, sites = max(views, key=lambda v: v[0].get("optimizer_state", 0))
    opt = cats.get("optimizer_state", 0)
    if total <= 0 or opt < th.optimizer_bytes or opt / total < th.optimizer_share:
        return None
    params = cats.get("parameters", 0)
    ratio = f" ({opt / params:.1f}x the parameters)" if params else ""
    # What matched is a torch/optim/ frame on the stack: torch's optimizers, or the user's
    # own (a torch.optim.Optimizer's step runs inside torch's Optimizer.step wrapper); the
    # call sites say whose.
    mine = [s.site for s in sites if s.category == "optimizer_state"][:OPTIMIZER_SITES]
    where = f", most at {' and '.join(mine)}" if mine else ""
    return Finding.memory(
        id="memory-optimizer-state",
        title=f"Optimizer state is {opt / total:.0%} of allocated memory",
        evidence=f"{size(opt)} allocated inside an optimizer's step (torch.optim's "
        f"Optimizer.step on the stack){where}{ratio}, of {size(total)} (heuristic)",
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
        title=f"{len(r.leaks)} call site(s) keep blocks alive across steps while memory grows",
        evidence=f"{top.site}: {top.count} blocks ({size(top.bytes)}) allocated in "
        f"{top.steps} steps and still alive at the end of later ones; allocated memory at "
        "the steps' starts rises step over step",
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
    labels = _Labels()
    histories = [
        _History.of(device, entries, labels)
        for device, entries in enumerate(snapshot.device_traces)
        if entries
    ]
    live = [
        (seg.device, block, _item(labels, seg.device, block))
        for seg in snapshot.segments
        for block in seg.blocks
        if block.live
    ]
    devices = _devices(snapshot, live)
    items = [item for _, _, item in live]
    largest = sorted(live, key=lambda x: -x[1].size)[: th.top]
    notes: list[str] = []
    allocated = {d.device: d.allocated for d in devices}
    peaks, found_leaks, ooms = [], [], []
    for hist in histories:
        before = [
            item
            for device, block, item in live
            if device == hist.device and (device, block.address) not in labels.by_block
        ]
        replay = _replay(hist, before, allocated.get(hist.device), thresholds)
        peaks.append(replay.peak)
        found_leaks += replay.leaks
        ooms += replay.ooms
        notes += replay.notes
    if not peaks:
        notes.append(
            "no allocation history: call torch.cuda.memory._record_memory_history() before "
            "the snapshot to see the peak, growth and leaks"
        )
    if not snapshot.segments:
        notes.append("no segments: the snapshot holds no allocator state")
    notes.append("categories are heuristics on call stacks and the history, not recorded facts")
    notes += labels.notes([b.size for d, b, _ in live if not b.stack and d not in labels.histories])
    report = MemoryReport(
        source=source,
        devices=devices,
        categories=_categories(items),
        sites=_by_site(items, th.top),
        largest=[
            MemoryBlock(device=d, bytes=b.size, site=site, category=cat)
            for d, b, (_, site, cat) in largest
        ],
        peaks=peaks,
        leaks=found_leaks,
        ooms=ooms,
        notes=notes,
    )
    findings = evaluate(SnapshotFacts(report, thresholds))
    return msgspec.structs.replace(report, findings=findings)
