"""Pipeline parallelism: the bubble, a stage waiting for its neighbour's activations or
gradients.

A pipelined step is recognised by the schedule's ranges around each microbatch's chunk of
work together with point-to-point transfers between stages. torch.distributed.pipelining
(torch 2.13) records `Forward i` / `Backward i` around each microbatch of ScheduleGPipe and
`PP:<stage><action><microbatch>` (`PP:0F1`, `PP:1B0`, `PP:0W1`) around each action of its
multi-stage schedules (interleaved 1F1B, zero bubble); Schedule1F1B records none, and is read
from its transfers alone where that is unambiguous (`_from_transfers`). The transfers are
`c10d::send` / `c10d::recv_` ops (`gloo:send`, `nccl:send`, ...) and NCCL `SendRecv` kernels.

What the stage spends inside those transfers with no compute beside it is the time it waits
for its neighbour: the bubble of the schedule, plus the transfers' own cost and any stage
slower than this one. Exposed communication (topics/comm.py) leaves that time to this rule.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.collectives import JobFacts
from wallfinder.analysis.critpath import MICROBATCHES
from wallfinder.analysis.critpath.lever import LeverWork, lever, on_host
from wallfinder.analysis.findings import (
    NO_ROWS,
    Facts,
    amdahl,
    make_finding,
    ms_text,
    once_per_facts,
)
from wallfinder.analysis.gpu import COMM
from wallfinder.analysis.intervals import Coverage, in_windows
from wallfinder.analysis.parallelism import (
    described_pipeline_group,
    megatron_microbatches,
    pipeline_group_size,
)
from wallfinder.analysis.rules import Claim, rule
from wallfinder.diagnosis import Finding
from wallfinder.trace import Events, Kind, thread_codes

NS = 1e-9

_CHUNK = re.compile(r"^(?:(Forward|Backward) (\d+)|PP:(\d+)([A-Z_]+?)(\d+))$")
"""A schedule's range around one microbatch's work: single-stage `Forward 3` / `Backward 3`,
multi-stage `PP:<stage><action><microbatch>` (action F forward; B, I, W backward parts)."""

_P2P = re.compile(r"(?<![a-z])i?(?:send|recv)", re.IGNORECASE)
"""Point-to-point transfers by name: `c10d::send`, `c10d::recv_`, `gloo:recv`,
`nccl:batch_isend_irecv`, `ncclDevKernel_SendRecv(...)`, `ncclKernel_SendRecv_...`."""


def _is_p2p(name: str) -> bool:
    return _P2P.search(name) is not None


class Pipeline(msgspec.Struct, frozen=True):
    """What one rank's trace shows of a pipelined step."""

    microbatches: int | None
    """m: the microbatches a step's forward runs (distinct microbatch indices per step); None
    where the trace records neither the schedule's ranges nor its frames."""
    local_stages: int
    """v: the stages this rank runs (1 for GPipe and 1F1B; more when interleaved)."""
    stages: int | None
    """p: the stages of the pipeline (its process group's size where the trace says it),
    None when the trace cannot say."""
    wait_ns: float
    """The stage inside point-to-point transfers with no compute beside it, per step."""
    wait_share: float
    """`wait_ns` as a share of the measured step."""
    work: Events | npt.NDArray[np.bool_]
    """The transfers in the steady steps: a mask over the device ops, or a CPU-only trace's
    host calls."""
    counted: bool = False
    """m counted from the transfers (the schedule recorded no ranges)."""

    def theory(self, microbatches: int | None = None) -> float | None:
        """The schedule's bubble by theory, (p−1)/(v·m+p−1) (GPipe and 1F1B: v = 1), with `m`
        microbatches (the measured ones by default); None without p or m."""
        p = self.stages
        m = self.microbatches if microbatches is None else microbatches
        if p is None or p < 2 or m is None:
            return None
        return (p - 1) / (self.local_stages * m + p - 1)


def _stages(f: Facts) -> int | None:
    """p: the pipeline group's size. A trace of one process group (the default group is the
    pipeline's) says it; with several (PP beside TP or DP) the trace does not say which group
    carries the transfers, so None."""
    info = f.trace.distributed
    configs = info.get("pg_config")
    if isinstance(configs, list) and len(configs) == 1 and isinstance(configs[0], dict):
        size = configs[0].get("pg_size")
        if isinstance(size, int):
            return size
    named = pipeline_group_size(f.trace, _is_p2p)
    if named is not None:
        return named
    count = info.get("pg_count")
    world = f.trace.world_size
    return world if count in (None, 1) and world is not None and world > 1 else None


@once_per_facts
def pipeline_of(f: Facts) -> Pipeline | None:
    """The pipelined step this rank's trace shows, None when it shows none: neither a
    schedule's ranges in the steady steps nor transfers that can only be a pipeline's
    (`_from_transfers`), or no point-to-point transfer there."""
    dev = f.dev
    if f.steps.count == 0 or f.scope.window_start.size == 0:
        return None
    start, end = f.scope.window_start, f.scope.window_end
    schedule = _from_ranges(f) or _from_transfers(f) or _from_megatron(f) or _from_group(f)
    if schedule is None:
        return None
    micro, local, counted = schedule
    codes = f.trace.names_matching(_is_p2p)
    found = _device_wait(f, codes) if dev is not None else _cpu_wait(f, codes)
    if found is None:
        return None
    wait, work = found
    total = float((end - start).sum())
    return Pipeline(
        microbatches=micro,
        local_stages=local,
        stages=_stages(f),
        wait_ns=wait / max(f.steps.count, 1),
        wait_share=wait / total if total > 0 else 0.0,
        work=work,
        counted=counted,
    )


def _from_ranges(f: Facts) -> tuple[int, int, bool] | None:
    """m and v from the schedule's ranges in the steady steps (distinct microbatches of
    forward chunks per step and stage; distinct stages), None without them."""
    start, end = f.scope.window_start, f.scope.window_end
    chunk_codes = f.trace.names_matching(lambda s: _CHUNK.match(s) is not None)
    if chunk_codes.size == 0:
        return None
    chunks = f.trace.named((Kind.CPU_OP, Kind.ANNOTATION), chunk_codes)
    chunks = chunks.take(np.flatnonzero(in_windows(chunks.ts, start, end)))
    forwards: set[tuple[int, int, int]] = set()
    for ts, code in zip(chunks.ts.tolist(), chunks.name.tolist(), strict=True):
        m = _CHUNK.match(f.trace.strings[int(code)])
        assert m is not None
        window = int(np.searchsorted(start, ts, side="right")) - 1
        if m.group(1) == "Forward":
            forwards.add((window, 0, int(m.group(2))))
        elif m.group(4) == "F":
            forwards.add((window, int(m.group(3)), int(m.group(5))))
    if not forwards:
        return None
    windows = {w for w, _, _ in forwards}
    local = len({s for _, s, _ in forwards})
    return round(len(forwards) / (len(windows) * local)), local, False


_C10D_P2P = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")
"""The host's point-to-point calls, one per tensor sent or received."""


def _from_transfers(f: Facts) -> tuple[int, int, bool] | None:
    """m from the transfers alone, for schedules that record no ranges (Schedule1F1B up to
    torch 2.13): where the pipeline has 2 stages, each stage has one neighbour and sends or
    receives one tensor each way per microbatch, so a step's point-to-point calls are 2m.
    Only where they are the step's only collectives: beside others (data or tensor
    parallel) the trace cannot tell a pipeline from another use of send/recv, and with more
    stages a middle stage's count is twice an end stage's. None otherwise."""
    if _stages(f) != 2:
        return None
    start, end = f.scope.window_start, f.scope.window_end
    calls = f.trace.named((Kind.CPU_OP, Kind.ANNOTATION), f.comm_codes)
    calls = calls.take(np.flatnonzero(in_windows(calls.ts, start, end)))
    names = [f.trace.strings[int(c)] for c in np.unique(calls.name).tolist()]
    if not names or not all(_is_p2p(n) or n == "record_param_comms" for n in names):
        return None
    p2p = f.trace.codes_of(_C10D_P2P)
    count = int(np.isin(calls.name, p2p).sum())
    micro = round(count / 2 / max(f.steps.count, 1))
    return (micro, 1, True) if micro >= 1 else None


def _from_group(f: Facts) -> tuple[int | None, int, bool] | None:
    """A pipeline whose m the trace does not hold: its process groups name a pipeline group
    (Megatron's, in `pg_config`), but neither the schedule's ranges nor its frames were
    recorded (a trace without Python stacks). None without such a group."""
    return (None, 1, False) if described_pipeline_group(f.trace) is not None else None


def _from_megatron(f: Facts) -> tuple[int, int, bool] | None:
    """m from Megatron's `forward_step` frames (its schedules record no ranges of their own;
    a trace with Python stacks holds one frame per microbatch), None without them."""
    micro = megatron_microbatches(f.scope)
    return (micro, 1, False) if micro else None


def _device_wait(
    f: Facts, codes: npt.NDArray[np.int32]
) -> tuple[float, npt.NDArray[np.bool_]] | None:
    """The steady steps' time in point-to-point transfers with no compute beside it, and
    the transfers' rows among the device ops: the breakdown's exposed communication
    (analysis/gpu.py `breakdown`) over the transfers alone. None without transfers."""
    dev = f.dev
    assert dev is not None
    ops, start, end = dev.ops, f.scope.window_start, f.scope.window_end
    rows: npt.NDArray[np.bool_] = f.inside & (dev.cls == COMM) & np.isin(ops.name, codes)
    if not rows.any():
        return None
    compute = (ops.kind == Kind.KERNEL) & (dev.cls != COMM)
    beside = Coverage.of(ops.ts[compute], ops.end[compute])
    both = Coverage.union(beside, Coverage.of(ops.ts[rows], ops.end[rows]))
    return float((both.covered(start, end) - beside.covered(start, end)).sum()), rows


def _cpu_wait(f: Facts, codes: npt.NDArray[np.int32]) -> tuple[float, Events] | None:
    """A CPU-only trace's time in point-to-point transfers, and the transfers: on the main
    thread, all of their time (its breakdown counts a collective's time as communication
    whatever runs inside it); on its process's other threads, where the main thread records
    nothing (it waits for them there), as the CPU breakdown counts collectives beside it
    (analysis/cpu.py). At most its exposed communication. None without transfers."""
    main = f.main_thread
    codes = codes[np.isin(codes, f.comm_codes)]  # a user's `send_metrics` range is none
    if main is None or codes.size == 0:
        return None
    start, end = f.scope.window_start, f.scope.window_end
    calls = f.trace.named((Kind.CPU_OP, Kind.ANNOTATION), codes)
    calls = calls.take(np.flatnonzero(in_windows(calls.ts, start, end)))
    pid, _ = thread_codes(main)
    calls = calls.take(np.flatnonzero(calls.pid == pid))
    if len(calls) == 0:
        return None
    here = calls.thread == main
    own = Coverage.of(calls.ts[here], calls.end[here]).covered(start, end)
    mine = f.trace.on_thread((Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON), main)
    steps = f.trace.names_matching(lambda s: s.startswith("ProfilerStep#"))
    mine = mine.take(np.flatnonzero(~np.isin(mine.name, steps)))
    recorded = Coverage.of(mine.ts, mine.end)
    others = Coverage.of(calls.ts[~here], calls.end[~here])
    waited = Coverage.union(recorded, others).covered(start, end) - recorded.covered(start, end)
    return float((own + waited).sum()), calls


def _bubble(f: Facts) -> Claim | None:
    """The exposed communication that is the pipeline's bubble: this rank's wait in
    point-to-point transfers of a pipelined step (None when it is not pipelined), not
    collectives to overlap."""
    pipe = pipeline_of(f)
    if pipe is None:
        return None
    m, theory = pipe.microbatches, pipe.theory()
    said = _microbatches(m)
    if pipe.stages is not None:
        said = f"{pipe.stages} stages, {said}"
    if theory is not None:
        said += f": {theory:.0%} by theory"
    return Claim(pipe.wait_share, f"the pipeline bubble ({said})")


@lever("microbatches")
def _microbatch_work(f: Facts) -> LeverWork | None:
    """The `microbatches` what-if's work: the stage's bubble waits, with the part of them the
    schedule explains (its bubble by theory, at most the wait); None without a pipeline or
    its theory (the stages unknown)."""
    pipe = pipeline_of(f)
    theory = pipe.theory() if pipe is not None else None
    if pipe is None or theory is None or pipe.microbatches is None or f.step_s <= 0:
        return None
    bubble = min(pipe.wait_ns, theory * f.step_s / NS)
    if isinstance(pipe.work, Events):
        return on_host(
            pipe.work, main=f.main_thread, microbatches=pipe.microbatches, bubble_ns=bubble
        )
    return LeverWork(ops=pipe.work, microbatches=pipe.microbatches, bubble_ns=bubble)


def _microbatches(m: int | None) -> str:
    return "m unknown" if m is None else f"{m} microbatch{'es' if m != 1 else ''}"


def _transfers(f: Facts) -> Events | npt.NDArray[np.bool_]:
    pipe = pipeline_of(f)
    return NO_ROWS if pipe is None else pipe.work


@rule(Facts, id="pipeline-bubble", replay=MICROBATCHES, work=_transfers, claims=_bubble)
def pipeline_bubble(f: Facts) -> Finding | None:
    """A pipeline stage waiting for its neighbour: the schedule's bubble, against its theory
    (p−1)/(v·m+p−1), and what more microbatches or another schedule would leave of it."""
    pipe = pipeline_of(f)
    if pipe is None:
        return None
    share = f.share(pipe.wait_share)
    m, v = pipe.microbatches, pipe.local_stages
    theory = pipe.theory()
    seen = (
        f"{_microbatches(m)} per step"
        + (f", {v} stages on this rank (interleaved)" if v > 1 else "")
        + (f", {pipe.stages} stages" if pipe.stages is not None else "")
        + (
            "; m counted from the send/recv calls, one each way per microbatch, as the "
            "schedule records no ranges"
            if pipe.counted
            else ""
        )
    )
    if theory is None:
        against = (
            "; the trace does not say how many stages the pipeline has (several process "
            "groups), so the schedule's bubble (p−1)/(m+p−1) is not computed"
            if m is not None
            else "; the trace records neither the schedule's ranges nor its frames (profile "
            "with with_stack=True), so m and the schedule's bubble (p−1)/(m+p−1) are unknown"
        )
        more = ""
    else:
        formula = "(p−1)/(v·m+p−1)" if v > 1 else "(p−1)/(m+p−1)"
        against = f"; the schedule's bubble by theory is {formula} = {theory:.0%} of the step"
        excess = share - theory
        if excess > f.thresholds.pipeline.excess:
            against += (
                f", so {excess:.0%} more than the schedule explains: the transfers themselves "
                "(bytes over the link), or a neighbouring stage slower than this one (the "
                "slowest stage sets the pace: compare the ranks' compute)"
            )
        elif excess < -f.thresholds.pipeline.excess:
            against += (
                ": this stage waits less than the schedule's average, another stage waits "
                "for it (it may be the slowest)"
            )
        assert m is not None  # (a theory needs m)
        options = sorted({2 * m, 4 * m})
        more = "; by theory " + ", ".join(f"m={n} leaves {pipe.theory(n):.0%}" for n in options)
        more += (
            " (`--what-if microbatches:M` replays the step with M: the waits the schedule "
            "explains shrink by m/M, the rest of the step as measured)"
        )
    return make_finding(
        f,
        "pipeline-bubble",
        "overhead",
        "Pipeline stages wait for each other (the bubble)",
        share,
        f"a pipelined step ({seen}): {share:.0%} of each step ({ms_text(pipe.wait_ns * 1e-9)}) "
        "this stage waits in send/recv for its neighbour with no compute beside it"
        f"{against}",
        "more microbatches per step (smaller microbatches, the same batch)"
        f"{more}; another schedule: interleaved 1F1B (ScheduleInterleaved1F1B, v stages per "
        "rank: (p−1)/(v·m+p−1)) or zero bubble (ScheduleInterleavedZeroBubble, ZBV) shrink "
        "the bubble itself, 1F1B (Schedule1F1B) has GPipe's bubble with the activations of p "
        "microbatches instead of m, room for more of them; balance the stages' compute (the "
        "slowest stage sets the pace); overlapping collectives does not help here",
        speedup=amdahl(share),
    )


@rule(JobFacts, id="pipeline-imbalance")
def pipeline_imbalance(f: JobFacts) -> Finding | None:
    """Pipeline stages of unequal compute (a job's ranks): the slowest stage sets the pace,
    the others wait for it in their bubble. Each pipelined rank's compute per step and
    bubble, the slowest one's excess over their mean, and what a balanced split would save
    at least (an estimate from the measured stage times)."""
    stages = f.stages
    if len(stages) < 2 or f.step_s <= 0:
        return None
    mean = sum(s.compute_s for s in stages) / len(stages)
    slow = max(stages, key=lambda s: s.compute_s)
    excess = slow.compute_s - mean
    if mean <= 0 or excess <= f.thresholds.pipeline.imbalance * mean:
        return None
    # Every microbatch passes through the slowest stage in every schedule, so its excess
    # over the mean lies on the step's path at least once per microbatch: the step carries
    # at least the excess per step (more where the fill and drain pass through it too).
    share = min(excess / f.step_s, 1.0)
    per_rank = "; ".join(
        f"rank {s.rank} {ms_text(s.compute_s)} ({ms_text(s.forward_s)} forward, "
        f"{ms_text(s.backward_s)} backward), bubble {s.bubble:.0%}"
        for s in stages
    )
    return Finding(
        id="pipeline-imbalance",
        wall="overhead",
        title="Pipeline stages are unbalanced: the slowest sets the pace",
        share=share,
        max_speedup=amdahl(share),
        evidence=(
            f"compute per step of the pipelined ranks: {per_rank}; rank {slow.rank}'s stage "
            f"is the slowest, {ms_text(excess)} ({excess / mean:.0%}) over their mean of "
            f"{ms_text(mean)}: the other stages wait for it in their bubble. A balanced split "
            f"(every stage at the mean) would save at least {ms_text(excess)} of the "
            f"{ms_text(f.step_s)} step ({share:.0%}): an estimate from the measured stage "
            "times, not a replay"
        ),
        fix=(
            f"move layers off rank {slow.rank}'s stage: split the model by measured time, not "
            "layer count (the first stage holds the embedding, the last the vocabulary "
            "projection and loss: Megatron's --decoder-first-pipeline-num-layers / "
            "--decoder-last-pipeline-num-layers, torch.distributed.pipelining's split points)"
        ),
    )
