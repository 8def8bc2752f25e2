"""Steps: unstable step times, and the one-off cost of start-up and warm-up."""

from __future__ import annotations

import numpy as np

from wallfinder.analysis.findings import Facts, amdahl, make_finding, ms_text
from wallfinder.analysis.oneoff import JIT, LIBRARY
from wallfinder.analysis.rules import rule
from wallfinder.diagnosis import Finding
from wallfinder.units import short_frame, short_kernel


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
    set-up) and, inside the steady steps, the GPU's wait for one-off work (idle cause
    `startup`: library start-up, module loading, JIT compiles, first launches loading kernel
    code; analysis/oneoff.py). A one-off cost per run, shown as a share of the profiled time;
    it gains the steady-state step nothing, so its bound is 1x and it ranks last."""
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
    kinds: set[str] = set()
    if loading > 0:
        said.append(
            f"in the steady {'steps' if s.count > 1 else 'window'}, the GPU waited "
            f"{ms_text(loading)} on {_one_off_work(f, kinds)}"
        )
    startup = not s.dropped or s.dropped[0].step == "start-up"
    fix = []
    if LIBRARY in kinds:
        fix.append(
            "run one warm-up step before profiling (library handles, workspaces and kernel "
            "code load on first use; CUDA_MODULE_LOADING=EAGER loads code at start-up "
            "instead)"
        )
    if JIT in kinds:
        fix.append(
            "keep shapes static or warm up each shape before timing (a new shape recompiles "
            "the fused kernels)"
        )
    if s.dropped or not kinds:
        fix.append(
            "cache compilation (TORCHINDUCTOR_CACHE_DIR / torch.compile mode and dynamic=False "
            "to avoid recompiles), keep shapes static, warm up cudnn.benchmark before timing; "
            "profile more steps, so that the steady state is measured"
        )
    return Finding(
        id="warm-up",
        wall="overhead",
        title="Start-up takes a share of the profiled time"
        if startup
        else "Compiling takes a share of the profiled time"
        if any(d.reason.startswith("compiled for ") for d in s.dropped)
        else "The first steps pay a warm-up cost",
        share=share,
        max_speedup=1.0,
        evidence="; ".join(said)
        + f": a one-off cost per run, {share:.0%} of the profiled time, none of it in the "
        "steady state",
        fix="; ".join(fix),
        saves="once",
    )


def _one_off_work(f: Facts, kinds: set[str]) -> str:
    """The one-off work inside the steady steps, in words: the host's one-off stretches
    (their kind, op, length and what they hold, longest first; their kinds added to
    `kinds`), then the first launches loading code outside them."""
    if f.dev is None:
        return "first launches of kernels loading their code"
    once = f.dev.one_offs
    lo, hi = f.scope.window_start, f.scope.window_end
    at = np.searchsorted(lo, once.start, side="right") - 1
    steady = (at >= 0) & (once.start < hi[np.maximum(at, 0)])
    said = []
    for kind in (LIBRARY, JIT):
        rows = [i for i in np.flatnonzero(steady).tolist() if once.kind[i] == kind]
        if not rows:
            continue
        kinds.add(kind)
        rows.sort(key=lambda i: -int(once.end[i] - once.start[i]))
        named = ", ".join(
            f"{short_frame(f.trace.strings[int(once.op[i])])} "
            f"{ms_text(float(once.end[i] - once.start[i]) * 1e-9)}"
            + (f" ({once.what[i]})" if once.what[i] else "")
            for i in rows[:3]
        )
        more = f" and {len(rows) - 3} more" if len(rows) > 3 else ""
        said.append(f"{kind} in {named}{more}")
    first = np.flatnonzero(f.inside & f.dev.one_off)
    first = first[~once.holds(f.dev.launch_thread[first], f.dev.launch_ts[first])]
    if first.size:
        kinds.add(LIBRARY)
        calls = f.dev.launch_end[first] - f.dev.launch_ts[first]
        top = first[np.argsort(-calls, kind="stable")][:2]
        named = ", ".join(
            f"{short_kernel(f.trace.strings[int(f.dev.ops.name[r])])} "
            f"{ms_text(float(f.dev.launch_end[r] - f.dev.launch_ts[r]) * 1e-9)}"
            for r in top.tolist()
        )
        said.append(f"{first.size} first launch(es) of a kernel loading its code ({named})")
    return "; ".join(said) or "one-off work"
