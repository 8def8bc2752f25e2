"""The walls: which one a step, a critical path and a job hit, all decided here.

- a step's (`decide`): from the breakdown and the class shares, by the questions of DESIGN.md
  §1 asked in order, every answer carrying the number that decided it (the thresholds are
  `Thresholds`' top level, analysis/thresholds.py);
- a critical path's (and a what-if's wall after): where most of its time is
  (`wall_of_parts`, over its categories' walls);
- a job's (`job_verdict`): the ranks' waits for each other when they are the loss, else the
  wall most ranks hit (`wall_of_parts` again, over the ranks' walls).

The step's answers questions with thresholds (is the device busy, is the busy time in
matmuls); the other two weigh parts that are already walls. They share what a matmul is
(`MATMUL_CLASSES`: the critical path's compute category is the same kernels) and the rule of
the largest part.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

# (classify's, where the kernel classes are named: the compute wall's, and the critical path's)
from wallfinder.analysis.classify import MATMUL_CLASSES as MATMUL_CLASSES
from wallfinder.analysis.classify import KernelClass
from wallfinder.analysis.rules import Claim
from wallfinder.analysis.thresholds import Thresholds
from wallfinder.diagnosis import (
    Breakdown,
    ClassShare,
    Finding,
    Question,
    Roofline,
    Steps,
    Straggler,
    Verdict,
    Wall,
)

_CAUSE_TEXT = {
    "unstable": "unstable step time",
    "data_loading": "data loading (the step waits for the DataLoader)",
    "synchronization": "synchronisation (the host blocks on the GPU, e.g. .item())",
    "communication_wait": "communication wait on the host",
    "host_overhead": "host overhead (CPU ops and Python between launches)",
    "launch_latency": "launch latency (many short kernels, shallow launch queue)",
    "dependency_wait": (
        "launched work waiting (on another stream, an event, a peer or unrecorded work)"
    ),
    "startup": "one-off start-up (library start-up, module loading, JIT compiles)",
    "other": "idle time the trace does not explain",
    "cpu_other": (
        "waiting or untraced time (blocked calls, an idle event loop, or code the trace does "
        "not record)"
    ),
    "comm_exposed": "exposed communication (collectives not overlapped with compute)",
    "copy_exposed": "exposed memory copies (memcpy/memset not overlapped)",
}


def _cause_text(cause: str, device: str) -> str:
    """An idle cause in words. On the CPU, "other" holds the thread's waits (a blocking
    call, an idle event loop) with the time it records nothing in: not unexplained."""
    return _CAUSE_TEXT["cpu_other" if device == "CPU" and cause == "other" else cause]


STREAMING = "matmuls streaming operands"
"""The bandwidth cause of matmul-class kernels that are bandwidth-bound (skinny shapes)."""


def decide(
    steps: Steps,
    breakdown: Breakdown,
    classes: list[ClassShare],
    thresholds: Thresholds | None = None,
    roofline: Roofline | None = None,
    *,
    roof_estimate: bool = False,
) -> Verdict:
    """The wall of the typical step: from the first of questions 2-4 answered "no" (whether
    step time is stable is answered too, and weighed against the findings by `headline`).
    `roof_estimate` says the device's peaks are a nominal estimate (a CPU with no spec file),
    which the fourth answer says."""
    thresholds = thresholds or Thresholds()
    min_steps = thresholds.min_steps
    device = "GPU" if breakdown.basis == "gpu" else "CPU"
    q1 = Question(
        question="Is step time stable?",
        answer="unknown"
        if steps.count < min_steps
        else "yes"
        if steps.cv <= thresholds.max_cv
        else "no",
        value=steps.cv,
        detail=f"CV {steps.cv:.1%} over {steps.count} steps (stable at ≤ {thresholds.max_cv:.0%})"
        + (f"; too few steps to judge (at least {min_steps})" if steps.count < min_steps else ""),
    )
    # The steady state's wall: the one-off start-up inside the steps (first launches loading
    # code) is set aside, and every share is of the step without it.
    steady, one_off = _steady(breakdown)
    only = _only_startup(breakdown, thresholds)
    busy = breakdown.compute / steady
    q2 = Question(
        question=f"Is the {device} busy?",
        answer="yes" if busy >= thresholds.min_busy else "no",
        value=busy,
        detail=f"compute covers {busy:.1%} of the step{one_off} (busy at ≥ "
        f"{thresholds.min_busy:.0%})",
    )
    # The busy time's holders on the timeline where the device has one (`ClassShare.busy`):
    # work beside a matmul (collectives on their own SMs, copies, kernels on other streams)
    # holds none of the time the matmul runs through. Else (a CPU's one thread, results
    # written before) the summed time, which is the same there.
    timeline = bool(classes) and all(c.busy is not None for c in classes)
    held = {c.cls: c.busy if c.busy is not None else c.share for c in classes}
    matmul = sum(held[c.cls] for c in classes if c.cls in MATMUL_CLASSES)
    summed = sum(c.share for c in classes if c.cls in MATMUL_CLASSES)
    # Matmuls that stream their operands (skinny shapes, GEMV, decode attention) are
    # bandwidth-bound work, whatever their class.
    streaming_summed = min(roofline.matmul_bandwidth_share, summed) if roofline else 0.0
    streaming = (
        min(sum(c.streaming for c in classes if c.cls in MATMUL_CLASSES), matmul)
        if timeline
        else streaming_summed
    )
    unknown = roofline.matmul_unknown_share if roofline else 0.0
    in_matmuls = matmul - streaming
    q3 = Question(
        question="Is the busy time in matmuls?",
        answer="yes" if in_matmuls >= thresholds.min_matmul else "no",
        value=in_matmuls,
        detail=(
            f"GEMM/attention/convolution take {matmul:.1%} of busy time"
            + (
                f", {streaming:.1%} of it bandwidth-bound (skinny shapes stream their operands)"
                if streaming >= 0.005
                else ""
            )
            + f" (matmul-bound at ≥ {thresholds.min_matmul:.0%})"
            + _beside(classes)
        ),
    )
    # The roofline's shares are of summed kernel time, which on a timeline is not busy time.
    summed_words = "of the kernel time" if timeline else "of busy time"
    q4 = _near_peak(roofline, thresholds, roof_estimate, summed_words)
    questions = [q1, q2, q3, q4]
    if q2.answer == "no":
        parts = _losses(breakdown)
        top = max(parts, key=lambda k: parts[k])
        return Verdict(
            wall="overhead",
            cause=top,
            reason=(
                f"{only}the {device} computes for only {busy:.0%} of the step{one_off}; the "
                f"largest loss is {_cause_text(top, device)} at {parts[top] / steady:.0%} of "
                "the step"
            ),
            questions=questions,
        )
    if q3.answer == "no":
        memory_bound = {
            c.cls: held[c.cls]
            for c in classes
            if c.cls not in MATMUL_CLASSES
            # (On the timeline communication holds no busy time: beside compute it is not
            # the wall, and alone it is exposed, which the second question weighs.)
            and not (timeline and c.cls == KernelClass.COMMUNICATION)
        }
        if streaming > 0:
            memory_bound[STREAMING] = streaming
        most = max(memory_bound, key=lambda c: memory_bound[c]) if memory_bound else None
        named = f"; most of it {most} ({memory_bound[most]:.0%})" if most else ""
        return Verdict(
            wall="bandwidth",
            cause=most or "memory-bound kernels",
            reason=(
                f"{only}the {device} is busy ({busy:.0%}) but only {in_matmuls:.0%} of busy "
                f"time is in compute-bound matmuls: the rest is memory-bound work{named}"
            ),
            questions=questions,
        )
    reason = (
        f"{only}the {device} is busy ({busy:.0%}) and {in_matmuls:.0%} of busy time is in matmuls"
    )
    if q4.answer == "yes":
        cause = "at peak"
    elif q4.answer == "no":
        cause = "below peak: precision/shape/kernel"
    # (Of the matmul time that does not stream, on the roofline's summed basis as `unknown`.)
    elif unknown >= (summed - streaming_summed) / 2:
        cause = "matmul-bound (GEMM bound unknown: no shapes)"
        reason += (
            f"; {unknown:.0%} {summed_words} is in GEMMs whose shapes were not recorded, so "
            "whether they compute or stream their weights (small batches, decode) is not "
            "known: profile with record_shapes=True"
        )
    else:
        cause = "matmul-bound (how near peak: unknown)"
    return Verdict(wall="compute", cause=cause, reason=reason, questions=questions)


def _beside(classes: list[ClassShare]) -> str:
    """What hidden communication takes, in words ("" when it runs beside no compute): the
    summed time its kernels share the device with compute, which costs the SMs they hold, not
    a wall of its own."""
    comm = next((c for c in classes if c.cls == KernelClass.COMMUNICATION), None)
    if comm is None or comm.beside < 0.005:
        return ""
    return (
        f"; communication kernels ({comm.share:.0%} of the summed kernel time) run beside "
        f"compute for {comm.beside:.0%} of the summed kernel time: the SMs they hold are "
        "taken from the compute beside them, not a wall"
    )


_K = TypeVar("_K")


def _largest(parts: Iterable[tuple[_K, float]]) -> _K:
    """The key with the most weight, each key's weights summed in order; a tie goes to the key
    named first."""
    total: dict[_K, float] = {}
    for key, weight in parts:
        total[key] = total.get(key, 0.0) + weight
    return max(total, key=lambda k: total[k])


def wall_of_parts(parts: Iterable[tuple[Wall, float]]) -> Wall:
    """The wall most of `parts` is in: each part is (its wall, its weight: a share of a
    critical path's time, a rank); the walls' weights are summed and the largest wins, a tie
    going to the wall named first."""
    return _largest(parts)


def job_verdict(
    verdicts: Sequence[Verdict],
    stragglers: Sequence[Straggler],
    wait: Finding | None,
    thresholds: Thresholds,
) -> tuple[Wall, str, str]:
    """A job's wall, cause and reason, from its ranks' verdicts (in rank order) and what the
    cross-rank join found: the ranks wait for a straggler; else they wait for each other in
    collectives (the collective-wait finding, `wait`) for at least the `job.wait_wall_share`
    of a step; else the wall most ranks hit (the lowest rank's on a tie), with the cause most
    of those ranks give (likewise)."""
    if stragglers:
        s = stragglers[0]
        return (
            "overhead",
            "straggler",
            f"the ranks wait for rank {s.rank} ({s.share:.0%} of a step)",
        )
    if wait is not None and wait.share >= thresholds.job.wait_wall_share:
        return "overhead", "communication_wait", wait.evidence
    wall = wall_of_parts((v.wall, 1.0) for v in verdicts)
    cause = _largest((v.cause, 1.0) for v in verdicts if v.wall == wall)
    hit = sum(v.wall == wall for v in verdicts)
    return wall, cause, f"{hit} of {len(verdicts)} ranks hit the {wall} wall ({cause})"


def _steady(breakdown: Breakdown) -> tuple[float, str]:
    """The share of the step that recurs (all but the one-off start-up inside the steps),
    and words that say what was left out ("" when nothing was)."""
    startup = breakdown.idle_causes.get("startup", 0.0)
    if startup <= 0:
        return 1.0, ""
    return max(1.0 - startup, 1e-9), (
        f" without its one-off start-up ({startup:.0%} of it: library start-up, module "
        "loading, JIT compiles, first launches loading code)"
    )


def _only_startup(breakdown: Breakdown, thresholds: Thresholds) -> str:
    """Words that open the verdict of a window that holds almost only one-off start-up ("")
    when it holds a steady state): what remains is judged, but says little of the job."""
    startup = breakdown.idle_causes.get("startup", 0.0)
    if startup < thresholds.startup_only:
        return ""
    return (
        f"the window holds almost only one-off start-up ({startup:.0%} of it): profile steady "
        "steps; in what remains, "
    )


def _losses(breakdown: Breakdown) -> dict[str, float]:
    """The overhead parts of the step that recur, as shares of the measured step: the idle
    causes but start-up, exposed communication and copies."""
    parts = {k: v for k, v in breakdown.idle_causes.items() if k != "startup"}
    return {
        **parts,
        "comm_exposed": breakdown.comm_exposed,
        "copy_exposed": breakdown.copy_exposed,
    }


def _near_peak(
    roofline: Roofline | None, thresholds: Thresholds, estimate: bool, summed_words: str
) -> Question:
    """The fourth question; `summed_words` say what the roofline's shares are of."""
    question = "Are the matmuls near peak?"
    value = roofline.pct_of_roof_matmul if roofline else None
    if value is None:
        why = (
            "the device is unknown"
            if roofline is None or roofline.device is None
            else "no matmul op with recorded shapes"
        )
        if roofline is not None and roofline.matmul_unknown_share >= 0.005:
            why += (
                f"; {roofline.matmul_unknown_share:.0%} {summed_words} is in GEMMs whose bound "
                "is unknown without shapes"
            )
        return Question(
            question=question,
            answer="unknown",
            value=None,
            detail=f"not known: {why}" + _by_counters(roofline),
        )
    detail = (
        f"matmul kernels run at {value:.0%} of their roof, time-weighted "
        f"(near peak at ≥ {thresholds.near_peak:.0%})"
    )
    if roofline is not None and roofline.fp32_matmul_without_tensor_cores_share > 0.01:
        detail += (
            f"; {roofline.fp32_matmul_without_tensor_cores_share:.0%} {summed_words} is fp32 "
            "matmul without tensor cores"
        )
    if estimate:
        detail += (
            "; against a nominal estimate of the peak, not this device's: `wallfinder "
            "calibrate` measures it"
        )
    detail += _by_counters(roofline)
    return Question(
        question=question,
        answer="yes" if value >= thresholds.near_peak else "no",
        value=value,
        detail=detail,
    )


def _by_counters(roofline: Roofline | None) -> str:
    """The words that say which kernels hardware counters re-placed ("" when none)."""
    if roofline is None or not roofline.by_counters:
        return ""
    more = len(roofline.by_counters) - 3
    return (
        "; re-placed by hardware counters: "
        + "; ".join(roofline.by_counters[:3])
        + (f"; and {more} more" if more > 0 else "")
    )


UNSTABLE = "unstable-steps"
"""The finding of the time the slow steps cost over the median."""

_PART_OF_CAUSE = {"comm_exposed": "exposed communication", "copy_exposed": "exposed copies"}


def _part_of(verdict: Verdict) -> str:
    """The breakdown part (as `Spike.part` names it) that an overhead verdict's cause is."""
    return _PART_OF_CAUSE.get(verdict.cause, f"idle: {verdict.cause.replace('_', ' ')}")


def _wall_share(typical: Verdict, breakdown: Breakdown) -> float:
    """The share of the step the typical verdict's wall names: its overhead cause's part, or
    the busy time in matmuls (compute) or in the rest (bandwidth). Idle time nothing in the
    trace explains ("other") names no loss to weigh instability against."""
    steady = _steady(breakdown)[0]
    if typical.wall == "overhead":
        parts = _losses(breakdown)
        return 0.0 if typical.cause == "other" else parts.get(typical.cause, 0.0) / steady
    matmul = typical.questions[2].value or 0.0
    busy = breakdown.compute / steady
    return busy * (matmul if typical.wall == "compute" else 1.0 - matmul)


def headline(
    typical: Verdict, steps: Steps, findings: list[Finding], breakdown: Breakdown
) -> tuple[Verdict, list[Finding]]:
    """The verdict to show: the typical step's (`typical`), whose reason says when step time
    is unstable and what grew in the slow steps; or instability itself, when the time the slow
    steps cost over the median (the unstable-steps finding) is larger than every other finding
    and than the share of the step the typical wall names (its overhead, or the busy time in
    matmuls or in memory-bound work), and is not the typical step's own cause grown larger
    (slow steps that wait
    longer for the DataLoader are a data-loading problem). `typical` is the wall of the steady
    steps' time, slow ones included: what the job spends its time on. A step faster than the
    median is never a slow one. The findings come back without the unstable-steps one when
    the slow steps are the wall's own cause: their time is that cause's finding already."""
    if typical.questions[0].answer != "no":
        return typical, findings
    grew: dict[str, float] = {}
    for spike in steps.spikes:
        grew[spike.part] = grew.get(spike.part, 0.0) + spike.excess_s
    mostly = max(grew, key=lambda k: grew[k]) if grew else None
    slow = "; ".join(
        f"{s.step} +{s.excess_s * 1e3:.1f} ms, mostly {s.part}" for s in steps.spikes[:3]
    )
    unstable = (
        f"step time is unstable (CV {steps.cv:.0%}, median {steps.median_s * 1e3:.1f} ms, "
        f"slowest {steps.max_s * 1e3:.1f} ms)"
    )
    cost = next((f.share for f in findings if f.id == UNSTABLE), 0.0)
    others = max(
        [f.share for f in findings if f.id != UNSTABLE] + [_wall_share(typical, breakdown)]
    )
    # Slow steps that grew in the overhead the wall is named for are that overhead, larger: its
    # fix is theirs (unless it is time nothing in the trace explains: then its being in a few
    # steps is the news). Slow steps with more compute are other work (evaluation, a
    # checkpoint), which a faster kernel would not remove.
    explained = (
        typical.wall == "overhead" and typical.cause != "other" and mostly == _part_of(typical)
    )
    if cost > others and cost > 0 and not explained:
        return (
            Verdict(
                wall="overhead",
                cause="unstable",
                reason=(
                    f"{unstable}: the slow steps cost {cost:.0%} of the time over the median, "
                    "more than any other loss and than the typical step's wall"
                    + (f"; {slow}" if slow else "")
                ),
                questions=typical.questions,
            ),
            findings,
        )
    if mostly is None:
        note = f"; {unstable}, with no step much slower than the median"
    else:
        note = f"; {unstable}: the slow steps grew mostly in {mostly}" + (
            f" ({slow})" if slow else ""
        )
    if explained:
        findings = [f for f in findings if f.id != UNSTABLE]
    return msgspec.structs.replace(typical, reason=typical.reason + note), findings


def named(verdict: Verdict, claims: list[Claim], breakdown: Breakdown) -> Verdict:
    """`verdict` with its `mechanism`: where its cause is exposed communication and one
    parallel strategy's finding claims most of it (more than half), that claim's words."""
    if verdict.wall != "overhead" or verdict.cause != "comm_exposed" or not claims:
        return verdict
    top = max(claims, key=lambda c: c.share)  # the first of equal claims: registration order
    if top.share <= breakdown.comm_exposed / 2:
        return verdict
    return msgspec.structs.replace(verdict, mechanism=top.words)


def few_steps(count: int) -> str:
    """The thin evidence of too few steady-state steps, in words."""
    return (
        f"{count} steady-state step{'s' if count != 1 else ''}: whether that is typical of "
        "the job cannot be told (profile more steps)"
    )


def thin_evidence(
    steps: Steps,
    device_known: bool,
    launches_known: bool,
    roofline: Roofline | None,
    wall: str,
    thresholds: Thresholds,
    *,
    gpu: str | None = None,
) -> list[str]:
    """What makes a verdict rest on thin evidence, in words (empty: nothing does), by
    `thresholds` (`min_steps`, `min_costed_share`). `gpu`: what a CPU-side analysis of a
    machine with a GPU must say about it (`gpu_note`)."""
    out = []
    if gpu:
        out.append(gpu)
    if steps.count < thresholds.min_steps:
        out.append(few_steps(steps.count))
    if not launches_known:
        out.append("no launch records: idle time cannot be split into its causes")
    if not device_known:
        out.append("unknown device: no peaks, so nothing is measured against a roof")
    if (
        wall != "overhead"
        and roofline is not None
        and roofline.costed_share < thresholds.min_costed_share
    ):
        out.append(
            f"only {roofline.costed_share:.0%} of busy time has a cost model (shapes "
            "recorded with record_shapes=True and a known op)"
        )
    return out


def gpu_note(
    device_properties: bool, runtime_calls: int, memory_device_types: npt.NDArray[np.int64]
) -> str | None:
    """For a trace with no device kernels: what it says of the GPU, in words (None: nothing,
    no GPU in sight). Runtime calls mean the job used a GPU whose kernels were not recorded;
    device properties alone leave two readings, which the memory events (c10 device type 0:
    the CPU) can settle: every allocation on the CPU means the job never used the GPU."""
    if runtime_calls > 0:
        return (
            "the job used a GPU (runtime calls in the trace) but no kernel was recorded: this "
            "is the CPU's side only (profile with ProfilerActivity.CUDA)"
        )
    if not device_properties:
        return None
    if memory_device_types.size and not (memory_device_types != 0).any():
        return (
            "a GPU was present but the job never used it: no CUDA/HIP runtime call, and every "
            "allocation was on the CPU, so its ops ran on the CPU (move the model and its "
            "inputs to the GPU: model.to('cuda'), tensor.to('cuda'))"
        )
    return (
        "a GPU was present but the trace has no CUDA/HIP runtime call: either the job ran on "
        "the CPU (move the model and inputs to the GPU) or the profiler did not record CUDA "
        "activity (profile with ProfilerActivity.CUDA)"
    )
