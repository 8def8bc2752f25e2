"""Phases: a forward longer than its backward, a backward well over twice its forward, and an
optimizer step that is slow or a large share of the step."""

from __future__ import annotations

import numpy as np

from wallfinder.analysis.classify import EVENT_SYNCS, SYNC_CALLS
from wallfinder.analysis.findings import Facts, amdahl, calls_in_steps, make_finding, ms_text
from wallfinder.analysis.phases import PHASES
from wallfinder.analysis.rules import rule
from wallfinder.diagnosis import Finding
from wallfinder.trace import Kind


@rule(Facts, id="slow-optimizer")
def slow_optimizer(f: Facts) -> Finding | None:
    """An optimizer step that launches many small kernels (not fused/foreach)."""
    if f.dev is None or f.step_s <= 0:
        return None
    codes = f.trace.names_matching(lambda s: s.startswith("Optimizer.step#"))
    spans = f.trace.named((Kind.ANNOTATION, Kind.CPU_OP), codes)
    if len(spans) == 0:
        return None
    ops = f.dev.ops
    launch = f.dev.launch_ts
    k = np.searchsorted(spans.ts, launch, side="right") - 1
    in_step = (k >= 0) & (launch < spans.end[np.maximum(k, 0)]) & f.inside
    kernels = int(in_step.sum())
    per_step = f.per_step(kernels)
    if per_step < f.thresholds.time.optimizer_kernels:
        return None
    seconds = float(ops.dur[in_step].sum()) * 1e-9 / max(f.steps.count, 1)
    host = float(spans.dur.sum()) * 1e-9 / max(len(spans), 1)
    share = min(host, f.step_s) / f.step_s
    name = f.trace.strings[int(spans.name[0])]
    return make_finding(
        f,
        "slow-optimizer",
        "overhead",
        "The optimizer step launches many small kernels",
        share,
        f"{name}: {per_step:.0f} kernels per step ({ms_text(seconds)} of GPU time), "
        f"{ms_text(host)} on the host",
        "use a fused or foreach optimizer: torch.optim.AdamW(..., fused=True) or "
        "foreach=True; apex/FusedAdam; or torch.compile the optimizer step",
        speedup=amdahl(share),
    )


def _phase_times(f: Facts) -> tuple[dict[str, float], dict[str, float]] | None:
    """Per phase, seconds per step: device time (exposed time on a CPU-only trace) and
    exposed time; None without phases or without backward evidence."""
    a = f.attribution
    if a is None:
        return None
    p = a.phases
    busy = p.gpu_s or p.exposed_s
    if busy.get("backward", 0.0) <= 0 or busy.get("forward", 0.0) <= 0:
        return None
    return busy, p.exposed_s


_FORWARD_STALLS = tuple(n for n in SYNC_CALLS if n not in EVENT_SYNCS)
"""What a forward waits on: the synchronising calls the user's code makes."""


@rule(Facts, id="forward-heavy")
def forward_heavy(f: Facts) -> Finding | None:
    """A forward that takes longer than its backward: not what training looks like (the
    backward does about twice the forward's work), so the forward waits on something: a
    synchronising call in it (without one, the idle is the host's launching, launch-bound's)."""
    times = _phase_times(f)
    if times is None or f.dev is None or f.step_s <= 0 or f.attribution is None:
        return None
    busy, exposed = times
    fwd, bwd = busy["forward"], busy["backward"]
    if exposed["forward"] <= f.thresholds.time.forward_over_backward * exposed["backward"]:
        return None
    # Bound: the device's idle time inside the forward (what a forward without host stalls
    # would not wait), not the forward's work.
    idle = max(exposed["forward"] - fwd, 0.0)
    share = min(idle / f.step_s, 1.0)
    calls = calls_in_steps(f, _FORWARD_STALLS)
    phase, _ = f.attribution.place_calls(calls.thread, calls.ts)
    in_forward = phase == PHASES.index("forward")
    names, counts = np.unique(calls.name[in_forward], return_counts=True)
    if names.size == 0:
        # Nothing in the forward waits on the device: its idle is the host launching the
        # forward's ops one by one (Python runs the forward, C++ the backward), which
        # launch-bound or host-work report with their own fix. Claiming it again here
        # would count the same time twice under a fix that does not apply.
        return None
    listed = ", ".join(
        f"{f.trace.strings[int(n)]} ×{f.per_step(int(c)):.0f}/step"
        for n, c in zip(names.tolist(), counts.tolist(), strict=True)
    )
    return make_finding(
        f,
        "forward-heavy",
        "overhead",
        "The forward takes longer than the backward",
        share,
        f"forward {ms_text(exposed['forward'])} per step against backward "
        f"{ms_text(exposed['backward'])} (device time {ms_text(fwd)} and {ms_text(bwd)}; a "
        f"backward is usually about twice its forward); the device idles {ms_text(idle)} per "
        f"step inside the forward; synchronising calls in the forward: {listed} (the bound "
        "is that idle time)",
        "look in the forward for .item(), .cpu(), .tolist(), print(tensor), data-dependent "
        "shapes (nonzero, boolean masks) and Python control flow on tensor values; keep "
        "metrics on the device and log every N steps",
        speedup=amdahl(share),
    )


@rule(Facts, id="backward-heavy")
def backward_heavy(f: Facts) -> Finding | None:
    """A backward well above twice its forward: recomputation (activation checkpointing),
    or a backward that is slower than it need be."""
    times = _phase_times(f)
    if times is None or f.step_s <= 0 or f.attribution is None:
        return None
    busy, _ = times
    fwd, bwd = busy["forward"], busy["backward"]
    ratio = bwd / fwd
    if ratio <= f.thresholds.time.backward_over_forward:
        return None
    a = f.attribution
    w = a.work
    rows = a.recompute & w.inside
    dur = (w.end - w.ts).astype(np.float64)
    recompute = float(dur[rows].sum()) * 1e-9 / max(f.steps.count, 1)
    if recompute > 0:
        saved = recompute
        seen = (
            f"forward modules re-run inside the backward (activation checkpointing): "
            f"{ms_text(recompute)} per step of recomputation{a.where(rows, dur)}; "
            "the bound is that recomputation, which checkpointing trades for memory"
        )
        fix = (
            "expected with activation checkpointing: checkpoint fewer blocks where memory "
            "allows (selective checkpointing of the cheap ops), or recompute only attention"
        )
    else:
        saved = max(bwd - 2.0 * fwd, 0.0)
        seen = (
            "no recomputation is visible (no module re-run inside the backward)"
            if a.modules is not None and a.modules.source == "modules"
            else "the trace has no module records, so recomputation cannot be seen"
        ) + "; the bound is the backward's time beyond twice its forward"
        fix = (
            "find the slow backward kernels (the module table's backward column): "
            "non-contiguous gradients, fp32 reductions, scatter/index_add backward of "
            "embeddings and gathers; torch.compile fuses the backward too"
        )
    share = min(saved / f.step_s, 1.0)
    return make_finding(
        f,
        "backward-heavy",
        "compute",
        "The backward takes more than twice the forward",
        share,
        f"backward {ms_text(bwd)} per step, {ratio:.1f}x the forward's {ms_text(fwd)}; {seen}",
        fix,
        speedup=amdahl(share),
    )


@rule(Facts, id="optimizer-heavy")
def optimizer_heavy(f: Facts) -> Finding | None:
    """An optimizer step that is a large share of the step (when it is not the many small
    kernels `slow_optimizer` reports)."""
    a = f.attribution
    if a is None or f.step_s <= 0 or len(a.ranges.optimizer) == 0:
        return None
    share = f.share(a.phases.exposed.get("optimizer", 0.0))
    if share < f.thresholds.time.optimizer_share or slow_optimizer(f) is not None:
        return None
    names = sorted({f.trace.strings[int(c)] for c in np.unique(a.ranges.optimizer.name)})
    fused = any("fused" in n.lower() for n in names)
    busy = a.phases.gpu_s.get("optimizer", 0.0)
    return make_finding(
        f,
        "optimizer-heavy",
        "bandwidth" if busy >= a.phases.exposed_s.get("optimizer", 0.0) / 2 else "overhead",
        "The optimizer step is a large share of the step",
        share,
        f"{', '.join(names[:3])}: {share:.0%} of the step ({ms_text(share * f.step_s)})"
        + (f", {ms_text(busy)} of it device time" if f.dev is not None else "")
        + " (the bound removes it all)",
        (
            "the optimizer is already fused: its time is the parameter and state traffic; "
            "keep optimizer states in bf16 or 8-bit, shard them (ZeRO/FSDP), or step less "
            "often (gradient accumulation)"
        )
        if fused
        else "use a fused or foreach optimizer (torch.optim.AdamW(..., fused=True) or "
        "foreach=True), or torch.compile the optimizer step",
        speedup=amdahl(share),
    )
