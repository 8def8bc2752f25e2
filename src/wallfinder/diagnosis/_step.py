"""The parts of a diagnosis of one step: device, steps, breakdown, verdict, findings, roofline,
phases, modules, the job, fusion, the timeline and the calculation."""

from __future__ import annotations

from typing import Literal

import msgspec

from wallfinder.diagnosis._base import Answer, Wall, _Base


class Device(_Base, frozen=True):
    """The device the breakdown is about. `kind` is "gpu" (any accelerator with kernels in
    the trace) or "cpu" (no device kernels: the CPU is the device)."""

    name: str | None
    kind: Literal["gpu", "cpu"]
    index: int | None = None
    matched_spec: str | None = None
    spec_source: str | None = None
    peak_flops: dict[str, float] | None = None
    mem_bandwidth: float | None = None
    note: str | None = None


class DroppedStep(_Base, frozen=True):
    step: str
    duration_s: float
    reason: str


class Spike(_Base, frozen=True):
    """A steady-state step much slower than the median, and what grew in it."""

    step: str
    duration_s: float
    excess_s: float
    part: str
    """The part of the step (compute, an idle cause, ...) that grew most."""
    kernels: list[str] = []
    """Kernels with the most extra time in this step compared with a typical one."""


class Steps(_Base, frozen=True):
    """Step-time statistics over the steady-state steps (warm-up steps dropped)."""

    source: str
    total: int
    count: int
    median_s: float
    mean_s: float
    min_s: float
    max_s: float
    cv: float
    stable: bool
    dropped: list[DroppedStep] = []
    spikes: list[Spike] = []


class StepBreakdown(_Base, frozen=True):
    """One step's window and where its time went (seconds; the parts sum to `duration_s`)."""

    step: str
    start_s: float
    duration_s: float
    compute_s: float
    comm_exposed_s: float
    copy_exposed_s: float
    idle_s: float
    idle_causes_s: dict[str, float]
    warmup: bool = False


class Breakdown(_Base, frozen=True):
    """Fractions of step time over the steady-state steps; they sum to 1. `idle_causes`
    split `idle` (fractions of step time, summing to `idle`)."""

    basis: Literal["gpu", "cpu"]
    compute: float
    comm_exposed: float
    copy_exposed: float
    idle: float
    idle_causes: dict[str, float]
    per_step_ms: dict[str, float]
    steps: list[StepBreakdown] = []
    graph_replayed: float = 0.0
    """Share of the steady steps' kernel time in kernels replayed from CUDA/HIP graphs."""
    comm_hidden: float = 0.0
    """Share of the step in which communication runs beside compute (in `compute`, not a part
    of its own). Hiding more of `comm_exposed` needs compute it does not yet run beside: at
    most `compute − comm_hidden` of it can hide (0 in results written before it was kept)."""


class CpuActivity(_Base, frozen=True):
    """CPU-side view for traces with no device kernels: fractions of step time on the main
    thread, and op time by class (seconds per step)."""

    data_loading: float
    ops: float
    python: float
    untraced: float
    op_time_by_class_s: dict[str, float]
    top_ops: list[OpRow] = []
    waiting_on_collectives: float = 0.0
    """The main thread recording nothing while a collective runs on another thread of its
    process (gloo's work threads): in the breakdown's `comm_exposed`, not in `untraced`."""


class OpRow(_Base, frozen=True):
    name: str
    cls: str = msgspec.field(name="class")
    count: int
    time_s: float
    share: float


class KernelRow(_Base, frozen=True):
    """A kernel name's total over the steady-state steps (per step: `time_s` / step count).
    Cost-model fields (flops, bytes, ai, bound, pct_of_roof) are null until shapes are costed."""

    name: str
    cls: str = msgspec.field(name="class")
    count: int
    time_s: float
    share: float
    flops: float | None = None
    bytes: float | None = None
    ai: float | None = None
    bound: str | None = None
    pct_of_roof: float | None = None
    bound_basis: str | None = None
    """"cost model" when the bound comes from FLOPs and bytes, "class" when from the kernel's
    class alone (no shapes or no cost model for its op), "counters" when an Nsight Compute
    export (`--counters`) refuted that estimate and its bound ("compute", "bandwidth" or
    "latency") and % of roof are the counted ones."""
    estimated_bound: str | None = None
    """With `bound_basis` "counters": the bound the roofline estimated, which they refuted."""


class ClassShare(_Base, frozen=True):
    """A kernel (or CPU op) class's time over the steady-state steps: `time_s` and `share`
    sum its kernels' durations (two at once count twice); `busy` weighs the timeline."""

    cls: str = msgspec.field(name="class")
    time_s: float
    share: float
    busy: float | None = None
    """The share of the device's busy time (when a non-communication kernel runs: the
    breakdown's `compute`) this class holds on the timeline: a matmul-class kernel holds every
    moment it runs, whatever runs beside it; the moments with none go to the other classes
    (of those running at once, the one with the most kernel time). Communication holds none:
    beside compute it shares the SMs (`beside`), alone it is exposed. The classes' `busy` sum
    to 1. None: not weighed on a timeline (a CPU's op classes, one thread's time already, and
    results written before it was kept)."""
    streaming: float = 0.0
    """Of `busy`, the share held by this class's kernels that stream their operands
    (bandwidth-bound matmuls: skinny shapes, GEMV, decode attention)."""
    beside: float = 0.0
    """Communication's: the share of the summed kernel time (as `share`) its kernels run
    beside compute, summed over them: the SMs they take from the compute kernels while
    hidden, which is what hidden communication costs (0 for the other classes)."""


class Question(_Base, frozen=True):
    question: str
    answer: Answer
    value: float | None
    detail: str


class Verdict(_Base, frozen=True):
    wall: Wall
    cause: str
    reason: str
    questions: list[Question]
    thin_evidence: list[str] = []
    """Why the verdict rests on thin evidence (one step, no launch records, an unknown
    device, little of the busy time costed), each in words; empty when it does not."""
    mechanism: str = ""
    """When the cause is exposed communication and one parallel strategy's own finding
    explains most of it: that mechanism in words ("the pipeline bubble (2 stages, 2
    microbatches: 33% by theory)", "FSDP all-gathers not prefetched", "TP all-reduces in the
    forward"); empty otherwise. `wall` and `cause` stay as they are."""

    @property
    def confidence(self) -> Literal["high", "low"]:
        return "low" if self.thin_evidence else "high"


class Finding(_Base, frozen=True):
    """Symptom → cause → fix: what shows it (`evidence`), the `fix`, and the most the fix can
    save, which `saves` names:

    - "time": `share` is the part of the step it can remove at most and `max_speedup` the
      bound on the step's speed-up (Amdahl's over that share, or where stated a replay), for
      the `wall` it moves; `saving_bytes` and `device` are null. A finding with nothing to
      gain but a limit to say (memory-peak) is a time finding with share 0 and bound 1.
    - "memory": `saving_bytes` is the most the fix frees at the memory peak of `device` (null
      when the evidence gives no bound); it moves no wall (`wall` null) and claims no step
      time (`share` 0, `max_speedup` 1). `Finding.memory` makes one.
    - "once": a one-off cost per run (start-up, warm-up): `share` is its part of the profiled
      time, and it gains the steady step nothing (`max_speedup` 1).
    """

    id: str
    wall: Wall | None
    title: str
    share: float
    max_speedup: float
    evidence: str
    fix: str
    saves: Literal["time", "memory", "once"] = "time"
    saving_bytes: int | None = None
    device: str | None = None
    gain_basis: Literal["replay", "bound"] | None = None
    """How the gain is known: "replay" (the step's dependency graph re-timed with the fix,
    `replay_speedup`), "bound" (Amdahl's over `share` only: the graph cannot say), null
    (not asked: a memory or once finding, or an older result)."""
    replay_speedup: float | None = None
    """The step's speed-up with the fix, replayed on the graph (≤ `max_speedup`)."""
    wall_after: Wall | None = None
    """The wall the replayed step's critical path hits after the fix."""
    reach: float | None = None
    """The part of the step (≤ `share`) the fix can remove given the other work in the step,
    and `max_speedup` is Amdahl's over it: hiding communication saves at most the compute it
    can run beside. Null: all of `share`."""

    @classmethod
    def memory(
        cls,
        *,
        id: str,
        title: str,
        evidence: str,
        fix: str,
        saving_bytes: int | None = None,
        device: str | None = None,
    ) -> Finding:
        """A finding that frees memory at the peak (see the class)."""
        return cls(
            id=id,
            wall=None,
            title=title,
            share=0.0,
            max_speedup=1.0,
            evidence=evidence,
            fix=fix,
            saves="memory",
            saving_bytes=saving_bytes,
            device=device,
        )


class Mfu(_Base, frozen=True):
    """Model FLOPs utilisation: `flops_per_step` / step time / the device's peak for `dtype`.
    `basis` says where the FLOPs come from (counted from the trace's matmul ops, or given)."""

    value: float | None
    basis: str
    flops_per_step: float | None = None
    achieved_flops: float | None = None
    peak_flops: float | None = None
    dtype: str | None = None


class OpRoofRow(_Base, frozen=True):
    """An op signature (name, input shapes, dtype) over the steady-state steps: its kernels'
    GPU time (union), its cost-model FLOPs and bytes, and where it sits on the roofline."""

    name: str
    shapes: str
    dtype: str
    calls: int
    time_s: float
    flops: float
    bytes: float
    ai: float | None
    achieved_flops: float
    achieved_bandwidth: float
    ridge: float | None
    bound: str | None
    pct_of_roof: float | None
    cls: str | None = msgspec.field(default=None, name="class")
    """The kernel class with most of the op's time (its launching op's class on a CPU)."""
    bound_basis: str | None = None
    """"counters" when hardware counters (`--counters`) refuted the estimated bound for most
    of the op's kernel time: `bound` and `pct_of_roof` are then the counted ones."""
    kernels: list[str] = []
    """The kernels the op launched, by their time in it, the longest first (at most
    `roofline.OP_KERNELS`)."""
    fits_l2: bool | None = None
    """One call's bytes (its working set, by the cost model) fit in the device's L2: read
    back while still resident, its operands see L2's bandwidth, not memory's (None: no L2
    size for the device)."""
    pct_of_l2_roof: float | None = None
    """For a working set that fits in L2: its time against the L2 roof (peak, or bytes at the
    L2 bandwidth), a fraction; below `pct_of_roof`, since L2 is the faster roof."""


class Roofline(_Base, frozen=True):
    """Where the device's busy (kernel) time sits on the roofline. Shares are of kernel time;
    kernels whose op has no cost model take the bound of their class (a GEMM's: unknown, see
    `matmul_unknown_share`). `pct_of_roof_*` are
    time-weighted over the costed kernels of that kind (1 = at the roof)."""

    device: str | None
    ridge: dict[str, float]
    compute_bound_share: float
    bandwidth_bound_share: float
    unknown_bound_share: float
    costed_share: float
    pct_of_roof_compute: float | None
    pct_of_roof_bandwidth: float | None
    pct_of_roof_matmul: float | None
    fp32_matmul_without_tensor_cores_s: float
    fp32_matmul_without_tensor_cores_share: float
    ops: list[OpRoofRow] = []
    matmul_bandwidth_share: float = 0.0
    """Busy time in matmul-class kernels that are bandwidth-bound (skinny shapes by their cost
    model, or a GEMV/decode kernel by name): matmuls that stream their operands."""
    matmul_unknown_share: float = 0.0
    """Busy time in matmul-class kernels whose bound is unknown (GEMMs with no shapes)."""
    more_ops: list[OpRoofRow] = []
    """The costed op signatures after the top `ops`, by time (a bounded number): with `ops`,
    every point of the roofline plot."""
    latency_bound_share: float = 0.0
    """Busy time in kernels that hardware counters (`--counters`) call latency-bound (neither
    the SMs nor memory busy); part of `unknown_bound_share`, which is what is neither compute-
    nor bandwidth-bound."""
    by_counters: list[str] = []
    l2_bandwidth: float | None = None
    """The L2 roof, bytes/s (`DeviceSpec.l2_roof`): the catalogue's (derived from a whitepaper)
    or, with `l2_bandwidth_estimate`, twice the memory bandwidth."""
    l2_bandwidth_estimate: bool = False
    l2_fit_share: float = 0.0
    """Busy time in costed ops whose working set fits in L2."""
    l2_note: str | None = None
    """What the L2 roof says, in words (None when no op fits or the device has no L2 size)."""
    """The kernels whose estimated bound hardware counters refuted and re-placed, each with
    the estimate, the counted bound and its share of busy time (empty without counters)."""


class StepPhases(_Base, frozen=True):
    """One step's time by phase: `exposed_s` tiles the step (sums to `duration_s`);
    `gpu_s` is each phase's device busy time (phases overlap on streams; empty on the
    CPU)."""

    step: str
    duration_s: float
    exposed_s: dict[str, float]
    gpu_s: dict[str, float] = {}
    warmup: bool = False


class Phases(_Base, frozen=True):
    """Where the step goes by phase (data_wait, input_copy, forward, backward, optimizer,
    communication, other), over the steady-state steps: `exposed` as fractions of the step
    (summing to 1), `exposed_s` and `gpu_s` in seconds per step. `evidence` says what the
    split rests on; `unsplit` what the trace could not split."""

    basis: Literal["gpu", "cpu"]
    exposed: dict[str, float]
    exposed_s: dict[str, float]
    gpu_s: dict[str, float] = {}
    evidence: list[str] = []
    unsplit: list[str] = []
    steps: list[StepPhases] = []


class ModuleSpread(_Base, frozen=True):
    """The instances of a collapsed row (e.g. 32 `Block_*`): their time per step (forward
    plus backward) and the largest one."""

    count: int
    min_s: float
    median_s: float
    max_s: float
    outlier: str


class ModuleRow(_Base, frozen=True):
    """One module (or collapsed repeated block) with its descendants' time: device time per
    step in forward and backward, its share of the steady-state device time, by kernel class
    and by roofline bound ("compute", "bandwidth", "unknown")."""

    path: str
    parent: str | None
    depth: int
    instances: int
    forward_s: float
    backward_s: float
    share: float
    classes: dict[str, float] = {}
    bound_s: dict[str, float] = {}
    spread: ModuleSpread | None = None
    names: list[str] = []
    """The row's path as its names, outermost first: what identifies it (`path` is these
    joined by `/` for people to read, and a name may hold `/` itself). Empty in results
    written before it existed."""

    @property
    def name(self) -> str:
        """The row's own name (the last of `names`; from `path` in older results)."""
        return self.names[-1] if self.names else self.path.rpartition("/")[2]


class Modules(_Base, frozen=True):
    """Time per module, rolled up the module tree (`rows` in tree order, the largest kept).
    `source`: "modules" (nn.Module ranges) or "record_function" (user ranges instead)."""

    source: str
    note: str
    rows: list[ModuleRow] = []
    unattributed_s: float = 0.0


class RankSummary(_Base, frozen=True):
    """One rank of a job: its step time, breakdown and verdict, and (from the cross-rank join
    of its collectives) its estimated clock offset and its time in collectives per step."""

    source: str
    rank: int | None
    steps: int
    median_step_s: float
    compute: float
    idle: float
    wall: Wall
    cause: str
    comm_exposed: float = 0.0
    """Communication with no compute beside it, as a fraction of the rank's step."""
    clock_offset_s: float | None = None
    """Estimated offset of this rank's clock from the lowest rank's (null: no collective
    matched)."""
    collectives: int = 0
    """Collective instances found in this rank's trace."""
    transfer_s: float | None = None
    """Per step: time its matched collectives took at the pace of the fastest rank."""
    wait_s: float | None = None
    """Per step: time its matched collectives took beyond that (waiting for other ranks)."""
    late_share: float | None = None
    """Of the matched collectives it took part in, the fraction it arrived at last."""
    peak_allocated: int | None = None
    """Peak allocated bytes on its device, from its memory events (null: none recorded)."""


class CollectiveRow(_Base, frozen=True):
    """Matched collectives of one kind, group and message size, over the whole trace.
    `transfer_s` sums, per instance, the shortest duration across ranks; `wait_s` sums the
    mean time the ranks spent beyond it. Bandwidths are bytes per second of transfer time:
    `algbw` = message bytes / transfer time, `busbw` = algbw x the collective's bus factor
    (all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; others 1)."""

    group: str
    name: str
    ranks: int
    count: int
    bytes: int | None
    transfer_s: float
    wait_s: float
    algbw: float | None = None
    busbw: float | None = None
    pct_of_link: float | None = None


class Straggler(_Base, frozen=True):
    """A rank the others wait for in collectives."""

    rank: int
    late_share: float
    """Fraction of matched collectives at which it arrived last."""
    wait_caused_s: float
    """Per step: the wait it causes each other rank in the collectives it arrived last at
    (their wait summed, over the number of other ranks)."""
    share: float
    """`wait_caused_s` as a fraction of the job's median step time."""
    doing: str
    """What it was doing instead, from its own diagnosis."""
    late_steps: int | None = None
    """In how many steps it arrived last at most of the step's collectives (of `steps`, the
    steps where some rank arrived last; None: a result written before these were kept)."""
    steps: int | None = None
    lateness_s: float | None = None
    """Its median lead over the next latest rank in those steps."""
    noise_s: float | None = None
    """The noise of arrival order it is late beyond: the median lead of the other ranks
    where they arrived last."""
    step_spread_s: float | None = None
    """The steps' spread it is late beyond too: per rank 1.4826 x the median absolute
    deviation of its steady steps' lengths, the median over the ranks."""


class JobSummary(_Base, frozen=True):
    """The cross-rank view of a job: clock alignment, matched collectives, stragglers.

    Collectives are matched across ranks by process group and their order within the group
    (the n-th collective of a group on each rank is the same one); clocks are aligned by the
    median offset of their end times (a collective ends at about the same moment on every
    rank), so `max_clock_skew_s` is an estimate."""

    ranks: int
    world_size: int | None
    wall: Wall
    cause: str
    reason: str
    max_clock_skew_s: float | None
    clock_basis: str
    matched: int
    """Collective instances matched across at least two ranks."""
    unmatched: int
    """Instances left out: seen on one rank only, or whose name or size disagreed."""
    link: str | None = None
    link_peak: float | None = None
    """One direction of the link's datasheet bandwidth (bytes/s), for `pct_of_link`."""
    collectives: list[CollectiveRow] = []
    stragglers: list[Straggler] = []
    notes: list[str] = []


class FusionCandidate(_Base, frozen=True):
    """A repeated run of consecutive memory-bound kernels on one stream (per step). Fused, it
    moves at least `bytes_fused_at_least`; `max_saving_s` is an upper bound on the time saved
    (all the run's traffic but its largest kernel's, at the run's achieved bandwidth)."""

    kernels: list[str]
    ops: list[str]
    occurrences_per_step: float
    time_s: float
    bytes_unfused: float | None
    bytes_fused_at_least: float | None
    max_saving_s: float
    basis: str


class TimelineSpan(_Base, frozen=True):
    """A stretch of one lane of the step timeline in which the device was busy; busy stretches
    closer than the timeline's resolution are one span. Seconds from the step's start."""

    lane: Literal["compute", "communication", "copy"]
    start_s: float
    end_s: float
    busy_s: float
    ops: int
    cls: str = msgspec.field(name="class")
    """The kernel class with the most time in the span."""


class TimelineGap(_Base, frozen=True):
    """A stretch in which the device was idle: its time by idle cause (summing to its length)
    and `host`, what the thread that launched the work ending the gap was doing meanwhile: the
    most specific of its events that covers at least half as much of the wait as any other
    (null when the device was not waiting for the host)."""

    start_s: float
    end_s: float
    causes_s: dict[str, float]
    host: str | None = None


class StepTimeline(_Base, frozen=True):
    """The device timeline of one steady-state step, the one closest to the median: busy spans
    per lane (compute, communication, copies) and the idle gaps, in seconds from the step's
    start. Gaps shorter than `resolution_s`, and any beyond the longest listed, are counted in
    `unlisted_gaps` and `unlisted_gap_s`: listed and unlisted gaps sum to the step's idle time."""

    step: str
    start_s: float
    duration_s: float
    resolution_s: float
    spans: list[TimelineSpan] = []
    gaps: list[TimelineGap] = []
    unlisted_gaps: int = 0
    unlisted_gap_s: float = 0.0


class CalculatedOp(_Base, frozen=True, kw_only=True):
    """One op of a `wallfinder roofline --fuse` chain, run alone (its own kernel): its tensors
    (`what`), its cost and its time floor on the device."""

    op: str
    what: str
    flops: float
    bytes: float
    ai: float | None
    bound: str
    time_floor_s: float


class Calculation(_Base, frozen=True, kw_only=True):
    """A roofline calculation (`wallfinder roofline`): one op or FLOP/byte count on a device.

    With a fusion chain, `ops` holds each op alone, `bytes` is the unfused traffic (each op
    reads its inputs and writes its output) and `time_floor_s` the sum of the ops' floors;
    `fused_bytes` is the traffic of one kernel that keeps the intermediates on chip,
    `extra_bytes` the difference (each intermediate written and read back) and
    `extra_bytes_time_s` what those bytes take at the memory bandwidth. `notes` say every
    assumption the figures rest on (a matmul's K not given, dropout as in training)."""

    schema: str = "wallfinder.roofline/1"
    what: str
    device: str
    source: str
    dtype: str
    flops: float
    bytes: float
    ai: float | None
    ridge: float
    bound: str
    peak_flops: float
    mem_bandwidth: float
    attainable_flops: float
    time_floor_s: float
    utilisation_of_peak: float
    fused_bytes: float | None = None
    fused_time_floor_s: float | None = None
    time_saved_s: float | None = None
    extra_bytes: float | None = None
    extra_bytes_time_s: float | None = None
    ops: list[CalculatedOp] = []
    notes: list[str] = []
