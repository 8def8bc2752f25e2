"""Steps: unstable step times, and the one-off cost of start-up and warm-up."""

from __future__ import annotations

import numpy as np

from wallfinder.analysis.findings import Facts, amdahl, make_finding, ms_text
from wallfinder.analysis.rules import rule
from wallfinder.diagnosis import Finding
from wallfinder.units import short_kernel


@rule(Facts, id="unstable-steps")
def unstable_steps(f: Facts) -> Finding | None:
    s = f.steps
    if s.stable or s.mean_s <= 0 or s.count < f.thresholds.min_steps:
        return None
    # What the slow steps cost: their time over the median. Steps faster than the median
    # make the spread too, but running every step at the median would not recover them.
    kept = np.array([b.duration_s for b in f.breakdown.steps if not b.warmup], dtype=np.float64)
    if kept.size == 0 or kept.sum() <= 0:
        return None
    share = float(np.maximum(kept - s.median_s, 0.0).sum() / kept.sum())
    return make_finding(
        f,
        "unstable-steps",
        "overhead",
        "Step time is unstable",
        share,
        f"CV {s.cv:.0%} over {s.count} steps; median {ms_text(s.median_s)}, slowest "
        f"{ms_text(s.max_s)} "
        "(the bound assumes every step slower than the median ran at the median)",
        "look at the slow steps for periodic work (checkpointing, evaluation, logging, "
        "garbage collection, data loader stalls, stragglers); profile more steps",
        speedup=amdahl(share),
    )


@rule(Facts, id="warm-up")
def warmup_cost(f: Facts) -> Finding | None:
    """Start-up and warm-up: the steps set aside (compilation, autotuning, first-call
    set-up) and, inside the steady steps, the GPU's wait for first launches loading kernel
    code (idle cause `startup`). A one-off cost per run, shown as a share of the profiled
    time; it gains the steady-state step nothing, so its bound is 1x and it ranks last."""
    s = f.steps
    if s.median_s <= 0:
        return None
    extra = sum(max(0.0, d.duration_s - s.median_s) for d in s.dropped)
    loading = f.breakdown.idle_causes.get("startup", 0.0) * s.mean_s * s.count
    total = extra + s.mean_s * s.count + s.median_s * len(s.dropped)
    share = (extra + loading) / total
    if share < f.thresholds.time.min_share:
        return None
    said = []
    if s.dropped:
        said.append(
            f"{len(s.dropped)} step(s) set aside took {ms_text(extra)} more than a steady step "
            f"({s.dropped[0].reason})"
        )
    if loading > 0:
        said.append(
            f"in the steady {'steps' if s.count > 1 else 'window'}, the GPU waited "
            f"{ms_text(loading)} on {_first_launches(f)}"
        )
    startup = not s.dropped or s.dropped[0].step == "start-up"
    return Finding(
        id="warm-up",
        wall="overhead",
        title="Start-up takes a share of the profiled time"
        if startup
        else "The first steps pay a warm-up cost",
        share=share,
        max_speedup=1.0,
        evidence="; ".join(said)
        + f": a one-off cost per run, {share:.0%} of the profiled time, none of it in the "
        "steady state",
        fix="cache compilation (TORCHINDUCTOR_CACHE_DIR / torch.compile mode and dynamic=False "
        "to avoid recompiles), keep shapes static, warm up cudnn.benchmark before timing; "
        "profile more steps, so that the steady state is measured",
        saves="once",
    )


def _first_launches(f: Facts) -> str:
    """The first launches loading code inside the steady steps, in words."""
    if f.dev is None:
        return "first launches of kernels loading their code"
    rows = np.flatnonzero(f.inside & f.dev.one_off)
    calls = f.dev.launch_end[rows] - f.dev.launch_ts[rows]
    top = rows[np.argsort(-calls, kind="stable")][:2]
    named = ", ".join(
        f"{short_kernel(f.trace.strings[int(f.dev.ops.name[r])])} "
        f"{ms_text(float(f.dev.launch_end[r] - f.dev.launch_ts[r]) * 1e-9)}"
        for r in top.tolist()
    )
    return f"{rows.size} first launch(es) of a kernel loading its code ({named})"
