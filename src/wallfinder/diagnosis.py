"""The result type: one typed, versioned `Diagnosis` that every renderer reads.

The JSON form is the contract of DESIGN.md §5: times in seconds, rates per second, shares and
`pct_of_roof` as fractions in [0, 1]. A field this version cannot compute is null, never
invented. Old files keep loading: fields are added with defaults, and a change of shape bumps
the schema's number, with `from_json` upgrading the older files it reads.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

SCHEMA = "wallfinder.diagnosis/2"
_DIAGNOSIS_V1 = "wallfinder.diagnosis/1"
DIAGNOSIS_SCHEMAS = (_DIAGNOSIS_V1, SCHEMA)
"""Every diagnosis schema `Diagnosis.from_json` reads. /2: one `Finding` type for every
finding (`saves`, `saving_bytes`, `device`), where /1 had a memory finding type of its own;
the memory profile's blocks, sites and leak sites are the memory model's `MemoryBlock`,
`MemorySite` and `MemoryLeak` (shared with the snapshot's report), which only add fields
with defaults to what /1 wrote."""

Wall = Literal["compute", "bandwidth", "overhead"]
Answer = Literal["yes", "no", "unknown"]


class _Base(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=False):
    def to_json(self, *, indent: int = 2) -> str:
        """The JSON form (the contract), indented."""
        return msgspec.json.format(msgspec.json.encode(self), indent=indent).decode()


class _Schema(msgspec.Struct):
    """Only the `schema` key of a saved result: which version to read it as."""

    schema: str = ""


def _upgrade_memory_findings(holder: dict[str, Any]) -> None:
    """/1 → /2 in place: the memory findings under `holder["findings"]` (a /1 `MemoryFinding`:
    id, title, evidence, fix, saving_bytes, device) as `Finding`s that save memory."""
    holder["findings"] = [
        {"wall": None, "share": 0.0, "max_speedup": 1.0, **f, "saves": "memory"}
        for f in holder.get("findings") or []
    ]


_SNAPSHOT_V1_CATEGORY = {"unknown": "other"}
"""/1 → /2: snapshot categories renamed to the one vocabulary (`MEMORY_CATEGORIES`)."""


def _upgrade_snapshot_categories(report: dict[str, Any]) -> None:
    """/1 → /2 in place: the category names of a memory report (its `categories` dicts, and
    the `category` of its sites, blocks and leaks) in the one vocabulary."""

    def renamed(cats: dict[str, int]) -> dict[str, int]:
        return {_SNAPSHOT_V1_CATEGORY.get(k, k): v for k, v in cats.items()}

    def listed(holder: dict[str, Any], key: str) -> list[dict[str, Any]]:
        return list(holder.get(key) or [])

    peaks = listed(report, "peaks")
    for holder in [report, *listed(report, "devices"), *peaks]:
        if isinstance(holder.get("categories"), dict):
            holder["categories"] = renamed(holder["categories"])
    rows = listed(report, "sites") + listed(report, "largest") + listed(report, "leaks")
    rows += [s for p in peaks for s in listed(p, "sites")]
    for row in rows:
        if isinstance(row.get("category"), str):
            row["category"] = _SNAPSHOT_V1_CATEGORY.get(row["category"], row["category"])


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
    cls: str = msgspec.field(name="class")
    time_s: float
    share: float


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


COUNTERS_SCHEMA = "wallfinder.counters/1"


class CounterKernel(_Base, frozen=True):
    """One profiled launch in an Nsight Compute export, as its hardware counters measured it:
    rates per second, bytes, fractions of peak (null where the export did not carry the
    metric), and the bound the counters give, with the figures that decided it."""

    id: int
    name: str
    grid: int | None
    block: int | None
    duration_s: float | None
    """Per launch (for a summary page's row: the average over its `invocations`)."""
    sm_pct: float | None
    memory_pct: float | None
    dram_pct: float | None
    l1_pct: float | None
    l2_pct: float | None
    dram_bytes: float | None
    l2_bytes: float | None
    flops: float | None
    flops_basis: str | None
    """"sass": counted CUDA-core thread instructions (an FMA as two; tensor-pipe work is not
    in it); "flop_count": the export's FLOP counts."""
    tensor_pct: float | None
    tensor_instructions: float | None
    ai: float | None
    """FLOPs per DRAM byte (achieved arithmetic intensity)."""
    flops_per_s: float | None
    dram_bytes_per_s: float | None
    occupancy: float | None
    bound: Literal["compute", "memory", "latency"] | None
    unit: str | None
    """Where the bound sits: "dram", "l2", "l1" for memory; "tensor" or "cuda cores" for
    compute; for latency the reasons (low occupancy, launch-sized)."""
    reason: str
    """The figures that decided the bound, in words."""
    invocations: int = 1
    """Launches this row stands for (a summary page's `Invocations`; else 1)."""


class CounterCheck(_Base, frozen=True):
    """A trace's kernel beside its counters: the roofline's estimate (from shapes and the
    datasheet) and the counters' bound, confirmed or refuted."""

    kernel: str
    time_s: float
    """The kernel's time in the trace (as `KernelRow.time_s`)."""
    share: float
    """Its share of the trace's kernel time (as `KernelRow.share`)."""
    launches: int
    """How many profiled launches matched it."""
    matched_by: str
    """"name" (the normalised full name), "base name" (the qualified function name) or
    "function name" (without its namespaces, as `--print-kernel-base function` prints it)."""
    estimated_bound: str | None
    estimated_flops: float | None
    estimated_bytes: float | None
    pct_of_roof: float | None
    counter_bound: str | None
    counter_unit: str | None
    counted_flops: float | None
    counted_bytes: float | None
    flops_ratio: float | None
    """Cost model's FLOPs / counted FLOPs, per launch (null when either is missing)."""
    bytes_ratio: float | None
    """Cost model's bytes / counted DRAM bytes, per launch."""
    status: Literal["confirmed", "refuted", "no estimate", "no counters"]
    detail: str


class CounterReport(_Base, frozen=True, kw_only=True):
    """What an Nsight Compute export's counters say per kernel (`wallfinder counters`), and,
    beside a trace, which of the roofline's bounds they confirm or refute."""

    schema: str = COUNTERS_SCHEMA
    source: str
    page: str
    kernels: list[CounterKernel] = []
    checks: list[CounterCheck] = []
    unmatched_kernels: list[str] = []
    """Trace kernels (among the top by time) that no profiled launch matched."""
    unmatched_launches: int = 0
    """Profiled launches that matched no kernel of the trace."""
    findings: list[Finding] = []
    collect: list[str] = []
    """`ncu` command lines that would collect what is missing (for a trace: its top kernels
    by time)."""
    notes: list[str] = []
    mismatch: str | None = None
    """Why the export is not shown to be the trace's program (another device, or too few
    launches joined by launch size or order), where it is not: then nothing is joined and
    the counters change nothing in the diagnosis."""

    @classmethod
    def from_json(cls, text: str | bytes) -> CounterReport:
        return msgspec.json.decode(text, type=cls)


class WhatIfRow(_Base, frozen=True):
    """One what-if: the steady step replayed on its dependency graph with `change` applied
    (an estimate: the graph's edges are read from the trace's timing)."""

    change: str
    step_s: float
    speedup: float
    """Replayed unchanged step / replayed step with the change."""
    wall_after: Wall
    capped_by: str | None = None
    """The finding whose gain for the same fix (or a larger one of the same kind) capped this
    row: the replay gained more than that finding says the fix can (None: the replay as is).
    So one fix has one figure everywhere."""


class PathSegment(_Base, frozen=True):
    """A stretch of the critical path in the timeline's step: seconds from its start, and
    what the path spends it in (one of `CriticalPath.shares`' categories)."""

    start_s: float
    end_s: float
    category: str


class CriticalPath(_Base, frozen=True):
    """The steady steps' dependency graph, replayed: its critical path's time by category
    (`shares` of the replayed step, summing to 1: data, host, launch, sync, communication,
    compute (matmul-class kernels), bandwidth (other kernels), wait (device waits no edge
    explains)), the replay's error against the measured step, and the what-if table."""

    steps: int
    measured_step_s: float
    replayed_step_s: float
    replay_error: float
    """(replayed − measured) / measured, for the unchanged graph."""
    shares: dict[str, float]
    wall: Wall
    host_calls: int
    device_ops: int
    event_waits: int
    sync_edges: int
    what_if: list[WhatIfRow] = []
    notes: list[str] = []
    rank: int | None = None
    """For a job: the rank whose path sets the job's step (the one the others wait for)."""
    rank_shares: dict[str, float] = {}
    """For a job replayed across ranks: per rank, the share of the job's critical path in its
    work between the collectives every rank joins (it arrived last: the others waited); the
    rest is in the collectives' transfers. Empty when not replayed across ranks."""
    timeline: list[PathSegment] = []
    """The path through the step `Diagnosis.timeline` draws (replayed times, which the
    unchanged replay keeps within `replay_error` of the measured ones), bounded in number."""


class Diagnosis(_Base, frozen=True, kw_only=True):
    """Where a job's step time goes and which wall it hits. Renders itself in a terminal
    (rich) and in a notebook; `to_json()` gives the contract form.

    Findings are of one type, `Finding`, in two places by what they save: `findings` holds
    those that cost step time (`saves` "time": the rank's and, for a job, the job's),
    ranked, those that move the verdict's wall first, each group by its bound; the memory
    findings (`saves` "memory": bytes freed at the peak, no step time) stay with the memory
    profile they are about, in `memory.findings`, in the order of their rules. So every
    entry of the ranked list has a speed-up to rank by, and `findings[0]` stays the first fix
    for the wall."""

    schema: str = SCHEMA
    source: str
    rank: int | None
    world_size: int | None
    device: Device
    steps: Steps
    breakdown: Breakdown
    verdict: Verdict
    findings: list[Finding] = []
    kernels: list[KernelRow] = []
    more_kernels: list[KernelRow] = []
    """Every kernel after the top `kernels`, by time: with them, the whole table (what
    `--export` writes); empty in diagnoses saved before it was kept."""
    classes: list[ClassShare] = []
    cpu: CpuActivity | None = None
    mfu: Mfu = Mfu(value=None, basis="not computed")
    roofline: Roofline | None = None
    fusion: list[FusionCandidate] = []
    ranks: list[RankSummary] = []
    warnings: list[str] = []
    timeline: StepTimeline | None = None
    job: JobSummary | None = None
    """The cross-rank view, for a folder of a job's rank traces."""
    memory: MemoryProfile | None = None
    """Memory from the trace's `[memory]` events (null when it has none)."""
    trace_format: str = "kineto"
    """What recorded the trace: "kineto" (torch.profiler) or "nsys" (Nsight Systems)."""
    counters: CounterReport | None = None
    """Hardware counters (an Nsight Compute export, `--counters`) beside the roofline's
    estimate: each matched kernel's bound confirmed or refuted (null without an export)."""
    critical_path: CriticalPath | None = None
    """The steady steps' critical path and what-if replay (null: no device graph)."""
    phases: Phases | None = None
    """The step by phase (null when not computed)."""
    modules: Modules | None = None
    """Time per module (null when the trace has no module or record_function ranges)."""
    not_computed: dict[str, str] = {}
    """The optional views an internal error left out (a bug in wallfinder, never in the
    input), each with why: {"modules": "internal error: KeyError 'x'; rerun with --debug"}.
    The verdict never depends on them; a view missing for want of data is null, not here."""

    @property
    def main_memory(self) -> DeviceMemoryProfile | None:
        """The analysed device's memory profile (None: the trace has no memory events)."""
        return self.memory.main if self.memory is not None else None

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = msgspec.to_builtins(self)
        return result

    @classmethod
    def from_json(cls, text: str | bytes) -> Diagnosis:
        """A diagnosis from its JSON form, of this schema or an older one (upgraded)."""
        if msgspec.json.decode(text, type=_Schema).schema != _DIAGNOSIS_V1:
            return msgspec.json.decode(text, type=cls)
        data = msgspec.json.decode(text)
        if isinstance(data.get("memory"), dict):
            _upgrade_memory_findings(data["memory"])
        return msgspec.convert({**data, "schema": SCHEMA}, cls)

    def violations(self) -> list[str]:
        """Each invariant this diagnosis breaks, in words (empty when it keeps them all):
        the breakdown's parts and idle causes sum to the step, every share is a fraction,
        every kernel's class is one of the classes, every finding's bound is at least 1x and
        within Amdahl's for its share, and memory categories sum to the peak."""
        return _violations(self)

    def self_check(self) -> None:
        """Raise AssertionError listing every broken invariant (see `violations`); tests call
        it on every fixture and every real trace."""
        problems = self.violations()
        if problems:
            raise AssertionError("diagnosis breaks its invariants: " + "; ".join(problems))

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from wallfinder.report.terminal import renderables

        yield from renderables(self)

    def _repr_html_(self) -> str:
        from wallfinder.report.terminal import to_html

        return to_html(self)


MARKS_SCHEMA = "wallfinder.marks/1"


class TraceMark(_Base, frozen=True):
    """One mark on the timeline of the trace it was made from, in that trace's own clock
    (microseconds, as the Chrome trace-event format keeps them), on one of wallfinder's
    tracks: "steps", "idle gaps", "critical path" or "finding: <id>". `name` is a step label,
    a cause, a category or the name of a kernel or op of the trace; `detail` is wallfinder's
    own words. Nothing else of the trace (no event arguments) is carried."""

    track: str
    name: str
    ts_us: float
    dur_us: float
    """0: an instant."""
    detail: str = ""


class TraceMarks(_Base, frozen=True, kw_only=True):
    """What `wallfinder analyze --annotate` writes beside a trace: the marks, and the process
    id they go on (one the trace does not use, so the two files load side by side or merged)."""

    schema: str = MARKS_SCHEMA
    pid: int
    marks: list[TraceMark] = []


DIFF_SCHEMA = "wallfinder.diff/1"


class StepChange(_Base, frozen=True):
    """The median step before and after, and whether the change stands out of the noise: it
    is `within_noise` when it is no larger than `noise_s`, two standard deviations of the
    steady-state steps of the noisier run (CV x mean step)."""

    before_s: float
    after_s: float
    change_s: float
    change: float
    """`change_s` as a fraction of the step before (negative: faster)."""
    speedup: float | None
    """before / after (null when the step after is zero)."""
    cv_before: float
    cv_after: float
    noise_s: float
    within_noise: bool
    note: str


class PartChange(_Base, frozen=True):
    """One part of the breakdown (or `idle:<cause>`) before and after: its share of the step
    and its time per step (the share times the mean steady-state step)."""

    part: str
    before: float
    after: float
    before_s: float
    after_s: float


class VerdictChange(_Base, frozen=True):
    before_wall: Wall
    before_cause: str
    after_wall: Wall
    after_cause: str
    moved: bool
    """Whether the wall or its cause changed."""


class FindingChange(_Base, frozen=True):
    """A finding by id: `resolved` (before only), `new` (after only) or `remaining` (both)."""

    id: str
    title: str
    status: Literal["resolved", "new", "remaining"]
    share_before: float | None
    share_after: float | None


class NameChange(_Base, frozen=True):
    """An op or kernel found in both runs, with its time per steady-state step."""

    kind: Literal["op", "kernel", "cpu_op"]
    """"op": a costed op signature (matched by name and shapes); "kernel" and "cpu_op": by
    name."""
    name: str
    shapes: str | None
    before_s: float
    after_s: float
    change_s: float


class MatchCount(_Base, frozen=True):
    """How the listed rows of one kind matched across the runs. A Diagnosis lists only its top
    rows, so a name missing from one side may still have run there, below the list."""

    kind: Literal["op", "kernel", "cpu_op"]
    matched: int
    before_only: int
    after_only: int


class MfuChange(_Base, frozen=True):
    before: float | None
    after: float | None
    change: float | None
    """after − before, in fractions of peak (null when either is unknown)."""
    basis_before: str
    basis_after: str


class BytesChange(_Base, frozen=True):
    """A memory figure before and after, in bytes."""

    before: int
    after: int
    change_bytes: int
    """after − before (negative: less memory)."""
    change: float | None
    """`change_bytes` as a fraction of before (null when before is 0)."""


class CategoryChange(_Base, frozen=True):
    """Bytes of one category (`MEMORY_CATEGORIES`) live at the peak, before and after."""

    category: str
    before: int
    after: int
    change_bytes: int


class MemoryChange(_Base, frozen=True):
    """The analysed device's memory before and after, when both runs profiled it (the same
    device label). `categories` (those present on either side) are ordered by how much they
    moved, largest first. `findings` are the memory findings by id; their `share_*` are null
    (a memory finding frees bytes, not step time)."""

    device: str
    peak_allocated: BytesChange
    peak_reserved: BytesChange
    leak_before: bool
    leak_after: bool
    categories: list[CategoryChange] = []
    growth_per_step_before: float | None = None
    growth_per_step_after: float | None = None
    """The median rise of allocated bytes from one steady-state step's start to the next."""
    findings: list[FindingChange] = []


class DiagnosisDiff(_Base, frozen=True, kw_only=True):
    """What moved between two diagnoses of the same job (`wallfinder diff BEFORE AFTER`).
    `notes` says what could not be compared, or only with care (another device, a CPU-only
    run beside a GPU one, another step source, no matched names)."""

    schema: str = DIFF_SCHEMA
    before_source: str
    after_source: str
    before_device: str | None
    after_device: str | None
    basis_before: Literal["gpu", "cpu"]
    basis_after: Literal["gpu", "cpu"]
    steps: StepChange
    breakdown: list[PartChange]
    verdict: VerdictChange
    findings: list[FindingChange] = []
    moved: list[NameChange] = []
    """Matched ops and kernels, by how much their time per step changed (largest first)."""
    matches: list[MatchCount] = []
    mfu: MfuChange
    notes: list[str] = []
    memory: MemoryChange | None = None
    """Memory before and after (null unless both runs profiled memory on the same device)."""

    @classmethod
    def from_json(cls, text: str | bytes) -> DiagnosisDiff:
        return msgspec.json.decode(text, type=cls)


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


SUM_TOLERANCE = 1e-9
"""How far fractions that must sum to a whole may miss it (float rounding)."""

STEP_TOLERANCE_S = 2e-9
"""How far a step's parts in seconds may miss its duration (nanosecond timestamps)."""


def _fraction(x: float) -> bool:
    return 0.0 <= x <= 1.0


def _amdahl(share: float) -> float:
    """The most removing `share` of the step can speed it up (as the findings bound it)."""
    return 1.0 / max(1.0 - min(share, 0.999), 1e-3)


HIDE_COMMUNICATION = ("exposed-comm", "host-collective-wait")
"""The findings whose fix hides communication (or the host's wait in it) behind compute."""
FUSE_CHAINS = "fusable-pointwise"
"""The finding whose fix fuses the `fusion` candidates."""


def _reach_violations(d: Diagnosis) -> list[str]:
    """No bound exceeds what its fix can reach given the other work in the step, as the
    Diagnosis itself shows it: a finding's bound is within Amdahl's over its `reach`; hidden
    communication is at most the compute not yet beside it (`Breakdown.comm_hidden`); a fused
    chain takes at least its roofline time (the bytes it still moves at the device's
    bandwidth), and the fusion finding saves at most what its candidates do."""
    out: list[str] = []
    b = d.breakdown
    # The findings' shares are of the recurring step: the step less its one-off start-up.
    steady = max(1.0 - b.idle_causes.get("startup", 0.0), 1e-9)
    step_s = b.per_step_ms.get("step", 0.0) / 1e3 * steady
    bandwidth = d.device.mem_bandwidth
    for c in d.fusion:
        if c.bytes_fused_at_least is None or not bandwidth:
            continue
        roof = c.bytes_fused_at_least / bandwidth
        if c.time_s - c.max_saving_s < roof * (1 - 1e-6) - STEP_TOLERANCE_S:
            out.append(
                f"fusion {c.kernels[:2]}: fused in {c.time_s - c.max_saving_s} s, under its "
                f"roofline time {roof} s"
            )
    for f in d.findings:
        if f.saves != "time":
            continue
        ceilings = [] if f.reach is None else [(f.reach, "its reach")]
        if f.id in HIDE_COMMUNICATION:
            hideable = max(b.compute - b.comm_hidden, 0.0) / steady
            ceilings.append((hideable, "the compute communication could hide behind"))
        if f.id == FUSE_CHAINS and step_s > 0:
            saving = sum(c.max_saving_s for c in d.fusion) / step_s
            ceilings.append((saving, "what fusing its chains saves"))
        for part, what in ceilings:
            if f.max_speedup > _amdahl(part) * (1 + 1e-6):
                out.append(
                    f"finding {f.id}: bound {f.max_speedup}x beyond {what} "
                    f"({part:.4f} of the step: {_amdahl(part)}x)"
                )
    return out


def _violations(d: Diagnosis) -> list[str]:
    out: list[str] = []
    b = d.breakdown
    parts = {"compute": b.compute, "comm_exposed": b.comm_exposed}
    parts |= {"copy_exposed": b.copy_exposed, "idle": b.idle}
    out += [f"breakdown {k} {v} is not a fraction" for k, v in parts.items() if not _fraction(v)]
    if abs(sum(parts.values()) - 1.0) > SUM_TOLERANCE:
        out.append(f"breakdown parts sum to {sum(parts.values())}, not 1")
    out += [
        f"idle cause {k} {v} is not a fraction"
        for k, v in b.idle_causes.items()
        if not _fraction(v)
    ]
    if not _fraction(b.graph_replayed):
        out.append(f"graph-replayed share {b.graph_replayed} is not a fraction")
    if abs(sum(b.idle_causes.values()) - b.idle) > SUM_TOLERANCE:
        out.append(f"idle causes sum to {sum(b.idle_causes.values())}, not idle {b.idle}")
    for step in b.steps:
        total = step.compute_s + step.comm_exposed_s + step.copy_exposed_s + step.idle_s
        if min(step.compute_s, step.comm_exposed_s, step.copy_exposed_s, step.idle_s) < 0:
            out.append(f"{step.step}: a part of the step is negative")
        if abs(total - step.duration_s) > STEP_TOLERANCE_S:
            out.append(f"{step.step}: parts sum to {total} s, not its {step.duration_s} s")
        if abs(sum(step.idle_causes_s.values()) - step.idle_s) > STEP_TOLERANCE_S:
            out.append(f"{step.step}: idle causes do not sum to its idle time")
    s = d.steps
    if s.count < 1 or s.total < s.count:
        out.append(f"steps: {s.count} kept of {s.total}")
    if not (0 < s.min_s <= s.median_s <= s.max_s):
        out.append(f"steps: min {s.min_s}, median {s.median_s}, max {s.max_s} out of order")
    classes = {c.cls for c in d.classes}
    if d.classes and abs(sum(c.share for c in d.classes) - 1.0) > SUM_TOLERANCE:
        out.append("class shares do not sum to 1")
    every = d.kernels + d.more_kernels
    if d.more_kernels and abs(sum(k.share for k in every) - 1.0) > SUM_TOLERANCE:
        out.append("the kernel table's shares do not sum to 1")
    for k in every:
        if d.classes and k.cls not in classes:
            out.append(f"kernel {k.name!r} has class {k.cls!r}, none of the classes")
        if k.time_s < 0 or not _fraction(k.share):
            out.append(f"kernel {k.name!r}: time {k.time_s} s, share {k.share}")
        if k.pct_of_roof is not None and not _fraction(k.pct_of_roof):
            out.append(f"kernel {k.name!r}: pct_of_roof {k.pct_of_roof} is not a fraction")
    for f in d.findings:
        if f.saves == "memory":
            continue  # bytes at the memory peak: no share of the step to bound
        if not _fraction(f.share):
            out.append(f"finding {f.id}: share {f.share} is not a fraction")
        if f.saves == "once" and f.max_speedup != 1.0:
            out.append(f"finding {f.id}: a one-off cost claims {f.max_speedup}x per step")
        amdahl = _amdahl(f.share)
        if not (1.0 <= f.max_speedup <= amdahl * (1 + SUM_TOLERANCE)):
            out.append(f"finding {f.id}: bound {f.max_speedup}x outside [1x, {amdahl}x]")
        if f.reach is not None and not 0.0 <= f.reach <= f.share + SUM_TOLERANCE:
            out.append(f"finding {f.id}: reach {f.reach} outside [0, its share {f.share}]")
        if f.replay_speedup is not None and not 1.0 <= f.replay_speedup <= f.max_speedup:
            out.append(f"finding {f.id}: replayed {f.replay_speedup}x outside its bound")
    out += _reach_violations(d)
    cp = d.critical_path
    if cp is not None and abs(sum(cp.shares.values()) - 1.0) > SUM_TOLERANCE:
        out.append(f"critical path shares sum to {sum(cp.shares.values())}, not 1")
    if len(d.verdict.questions) != 4:
        out.append(f"the verdict answers {len(d.verdict.questions)} questions, not 4")
    out += _phase_violations(d.phases) + _module_violations(d.modules)
    for m in d.memory.devices if d.memory else []:
        if sum(m.categories.values()) != m.peak_allocated:
            out.append(f"{m.device}: memory categories do not sum to the peak")
        if any(v < 0 for v in m.categories.values()):
            out.append(f"{m.device}: a memory category is negative")
        if m.timeline and max(p.allocated for p in m.timeline) != m.peak_allocated:
            out.append(f"{m.device}: the memory timeline misses the peak")
    return out


def _phase_violations(p: Phases | None) -> list[str]:
    """Phases tile the step; no time is negative."""
    if p is None:
        return []
    out = []
    if abs(sum(p.exposed.values()) - 1.0) > SUM_TOLERANCE:
        out.append(f"phases sum to {sum(p.exposed.values())} of the step, not 1")
    out += [f"phase {k} {v} is not a fraction" for k, v in p.exposed.items() if not _fraction(v)]
    for step in p.steps:
        if abs(sum(step.exposed_s.values()) - step.duration_s) > STEP_TOLERANCE_S:
            out.append(
                f"{step.step}: phases sum to {sum(step.exposed_s.values())} s, not its "
                f"{step.duration_s} s"
            )
        if min([*step.exposed_s.values(), *step.gpu_s.values(), 0.0]) < 0:
            out.append(f"{step.step}: a phase time is negative")
    return out


def _module_violations(m: Modules | None) -> list[str]:
    """Each module's time holds its children's; shares are fractions."""
    if m is None:
        return []
    out = []
    rows = {r.path: r for r in m.rows}
    children: dict[str, float] = {}
    for r in m.rows:
        if not _fraction(r.share):
            out.append(f"module {r.path}: share {r.share} is not a fraction")
        if r.parent is not None:
            if r.parent not in rows:
                out.append(f"module {r.path}: its parent {r.parent} is not listed")
            children[r.parent] = children.get(r.parent, 0.0) + r.forward_s + r.backward_s
    for path, total in children.items():
        parent = rows.get(path)
        if (
            parent is not None
            and total
            > (parent.forward_s + parent.backward_s) * (1 + SUM_TOLERANCE) + STEP_TOLERANCE_S
        ):
            out.append(f"module {path}: its children take {total} s, more than its own")
    return out
