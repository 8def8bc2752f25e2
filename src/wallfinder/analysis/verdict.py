"""The first verdict: which wall, from the breakdown and the class shares.

The thresholds are `Thresholds`' top level (analysis/thresholds.py); the questions are asked in
the order of DESIGN.md §1 and every answer carries the number that decided it.
"""

from __future__ import annotations

from wallfinder.analysis.thresholds import Thresholds
from wallfinder.diagnosis import Breakdown, ClassShare, Question, Roofline, Steps, Verdict

_CAUSE_TEXT = {
    "unstable": "unstable step time",
    "data_loading": "data loading (the step waits for the DataLoader)",
    "synchronization": "synchronisation (the host blocks on the GPU, e.g. .item())",
    "communication_wait": "communication wait on the host",
    "host_overhead": "host overhead (CPU ops and Python between launches)",
    "launch_latency": "launch latency (many short kernels, shallow launch queue)",
    "dependency_wait": "queued work waiting on another stream, an event or a peer",
    "other": "idle time the trace does not explain",
    "comm_exposed": "exposed communication (collectives not overlapped with compute)",
    "copy_exposed": "exposed memory copies (memcpy/memset not overlapped)",
}


MIN_STEPS_FOR_STABILITY = 3
"""With fewer steady-state steps, a coefficient of variation says nothing."""


def decide(
    steps: Steps,
    breakdown: Breakdown,
    classes: list[ClassShare],
    thresholds: Thresholds | None = None,
    roofline: Roofline | None = None,
    *,
    roof_estimate: bool = False,
) -> Verdict:
    """The wall, from the first question answered "no". `roof_estimate` says the device's
    peaks are a nominal estimate (a CPU with no spec file), which the fourth answer says."""
    thresholds = thresholds or Thresholds()
    device = "GPU" if breakdown.basis == "gpu" else "CPU"
    q1 = Question(
        question="Is step time stable?",
        answer="unknown"
        if steps.count < MIN_STEPS_FOR_STABILITY
        else "yes"
        if steps.cv <= thresholds.max_cv
        else "no",
        value=steps.cv,
        detail=f"CV {steps.cv:.1%} over {steps.count} steps (stable at ≤ {thresholds.max_cv:.0%})"
        + (
            f"; too few steps to judge (at least {MIN_STEPS_FOR_STABILITY})"
            if steps.count < MIN_STEPS_FOR_STABILITY
            else ""
        ),
    )
    busy = breakdown.compute
    q2 = Question(
        question=f"Is the {device} busy?",
        answer="yes" if busy >= thresholds.min_busy else "no",
        value=busy,
        detail=f"compute covers {busy:.1%} of the step (busy at ≥ {thresholds.min_busy:.0%})",
    )
    matmul = sum(c.share for c in classes if c.cls in ("gemm", "attention", "convolution"))
    q3 = Question(
        question="Is the busy time in matmuls?",
        answer="yes" if matmul >= thresholds.min_matmul else "no",
        value=matmul,
        detail=(
            f"GEMM/attention/convolution take {matmul:.1%} of busy time "
            f"(matmul-bound at ≥ {thresholds.min_matmul:.0%})"
        ),
    )
    q4 = _near_peak(roofline, thresholds, roof_estimate)
    questions = [q1, q2, q3, q4]
    if q1.answer == "no":
        spikes = "; ".join(
            f"{s.step} +{s.excess_s * 1e3:.1f} ms, mostly {s.part}" for s in steps.spikes[:3]
        )
        return Verdict(
            wall="overhead",
            cause="unstable",
            reason=(
                f"step time is unstable (CV {steps.cv:.0%}, median {steps.median_s * 1e3:.1f} ms, "
                f"slowest {steps.max_s * 1e3:.1f} ms): the slow steps come first"
                + (f"; {spikes}" if spikes else "")
            ),
            questions=questions,
        )
    if q2.answer == "no":
        parts = {
            **breakdown.idle_causes,
            "comm_exposed": breakdown.comm_exposed,
            "copy_exposed": breakdown.copy_exposed,
        }
        top = max(parts, key=lambda k: parts[k])
        return Verdict(
            wall="overhead",
            cause=top,
            reason=(
                f"the {device} computes for only {busy:.0%} of the step; the largest loss is "
                f"{_CAUSE_TEXT[top]} at {parts[top]:.0%} of the step"
            ),
            questions=questions,
        )
    if q3.answer == "no":
        bandwidth = [c for c in classes if c.cls not in ("gemm", "attention", "convolution")]
        top_cls = max(bandwidth, key=lambda c: c.share) if bandwidth else None
        named = f"; most of it {top_cls.cls} ({top_cls.share:.0%})" if top_cls else ""
        return Verdict(
            wall="bandwidth",
            cause=top_cls.cls if top_cls else "memory-bound kernels",
            reason=(
                f"the {device} is busy ({busy:.0%}) but only {matmul:.0%} of busy time is in "
                f"matmuls: the rest is memory-bound work{named}"
            ),
            questions=questions,
        )
    if q4.answer == "yes":
        cause = "at peak"
    elif q4.answer == "no":
        cause = "below peak: precision/shape/kernel"
    else:
        cause = "matmul-bound (how near peak: unknown)"
    return Verdict(
        wall="compute",
        cause=cause,
        reason=(f"the {device} is busy ({busy:.0%}) and {matmul:.0%} of busy time is in matmuls"),
        questions=questions,
    )


def _near_peak(roofline: Roofline | None, thresholds: Thresholds, estimate: bool) -> Question:
    question = "Are the matmuls near peak?"
    value = roofline.pct_of_roof_matmul if roofline else None
    if value is None:
        why = (
            "the device is unknown"
            if roofline is None or roofline.device is None
            else "no matmul op with recorded shapes"
        )
        return Question(question=question, answer="unknown", value=None, detail=f"not known: {why}")
    detail = (
        f"matmul kernels run at {value:.0%} of their roof, time-weighted "
        f"(near peak at ≥ {thresholds.near_peak:.0%})"
    )
    if roofline is not None and roofline.fp32_matmul_without_tensor_cores_share > 0.01:
        detail += (
            f"; {roofline.fp32_matmul_without_tensor_cores_share:.0%} of busy time is fp32 "
            "matmul without tensor cores"
        )
    if estimate:
        detail += (
            "; against a nominal estimate of the peak, not this device's: `wallfinder "
            "calibrate` measures it"
        )
    return Question(
        question=question,
        answer="yes" if value >= thresholds.near_peak else "no",
        value=value,
        detail=detail,
    )
