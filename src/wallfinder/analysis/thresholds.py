"""The one tree of thresholds: when a measurement answers a verdict's question or becomes a
finding.

`Thresholds` holds the verdict's thresholds at its top level and one frozen group per family
of findings: `steps` (which steps are warm-up, start-up or spikes, and how a trace without
step markers is cut into iterations), `slack` (how near two events must be for one to be read
as waiting on the other: the idle causes, the critical path's edges), `time` (findings that
cost step time, a rank's and a job's), `memory` (a trace's
`[memory]` events), `snapshot` (an allocator snapshot, `wallfinder memory`) and `job` (a job's
collectives). It reaches every rule through the facts the rule is given, so one
`Options(thresholds=...)` moves the verdict and the findings alike; no module keeps a copy of
a default. A group is replaced whole or in part::

    Thresholds(near_peak=0.8, memory=MemoryThresholds(near_capacity=0.95))
    msgspec.structs.replace(t, time=msgspec.structs.replace(t.time, min_share=0.05))
"""

from __future__ import annotations

import msgspec

__all__ = [
    "CounterThresholds",
    "JobThresholds",
    "MemoryThresholds",
    "PipelineThresholds",
    "SlackThresholds",
    "SnapshotThresholds",
    "StepThresholds",
    "Thresholds",
    "TimeThresholds",
]

MiB = 1 << 20
GiB = 1 << 30


class StepThresholds(msgspec.Struct, frozen=True):
    """Which steps are the steady state: warm-up, start-up and spikes; and how a trace without
    step markers is cut into iterations."""

    compile_share: float = 0.25
    """A step whose host time is at least this share in torch.compile's compiler ranges
    compiled in it (a recompile): set aside as a one-off (`steps.compiling_steps`)."""
    warmup_factor: float = 1.5
    """A leading step is warm-up when it takes this many times the median of the later steps."""
    max_warmup_share: float = 0.5
    """At most this share of the steps is ever dropped as warm-up."""
    min_iterations: int = 3
    """Optimizer steps (or repetitions of one sequence of annotations) needed to take them as
    the iterations of a trace without step markers."""
    startup_factor: float = 10.0
    """A first call is start-up when it takes this many times the median of the same op's
    later calls (CUDA context creation, lazy initialisation, cuDNN/cuBLAS handles,
    autotuning)..."""
    startup_min_ns: int = 50_000_000
    """...and at least this long..."""
    startup_min_share: float = 0.10
    """...and this share of the trace, starting in its first half."""
    spike_factor: float = 1.25
    """A steady-state step is a spike when it takes this many times the median one."""


class SlackThresholds(msgspec.Struct, frozen=True):
    """How near two events on the timeline must be for one to be read as waiting on the other:
    the device's idle causes (the breakdown, the timeline, the findings) and the critical
    path's edges."""

    queued_ns: int = 50_000
    """Work launched more than this long before a gap began was already queued: the gap is a
    dependency wait, not launch latency. Likewise, work that starts more than this long after
    its launch call returned was not held up by the launch path: the GPU was busy elsewhere or
    waiting (on another stream, an event, a peer, or work the trace did not record), and the
    time past this is a dependency wait too. A launch call longer than this whose op started
    this long after it returned blocked on a full launch queue."""
    drain_ns: int = 20_000
    """A sync call that ended at most this long before the GPU went idle is taken to have
    drained the launch queue: the host was blocked, so it had nothing queued when the GPU
    finished. The idle it caused is at most the time the host was blocked in it (the GPU work
    the host would otherwise have run ahead of); the rest of the wait is what the host did
    next."""
    edge_ns: int = 5_000
    """An op that started this long after its launch and stream allowed, within this long of
    another stream's op ending, waited for that op; a rank whose collective work ends this
    long after the next rank's is the job's lone binding rank."""
    tie_ns: int = 5_000
    """The critical path's walk takes an op's stream predecessor over its launch when the
    launch was binding by at most this much (a tie: both chains are as long)."""


class TimeThresholds(msgspec.Struct, frozen=True):
    """When step time lost becomes a finding (a rank's findings and a job's)."""

    min_share: float = 0.02
    """Findings that explain less than this share of the step are not reported; a rank whose
    lateness costs the others less than this share is no straggler."""
    short_kernel_ns: int = 10_000
    """Kernels shorter than this are launch-overhead sized: the host can hardly keep up."""
    optimizer_kernels: float = 50.0
    """An optimizer step launching at least this many kernels per step is slow-optimizer."""
    forward_over_backward: float = 1.0
    """A forward taking more device time than this times its backward is forward-heavy (a
    backward usually takes about twice its forward)."""
    backward_over_forward: float = 2.5
    """A backward taking more device time than this times its forward is backward-heavy."""
    optimizer_share: float = 0.1
    """An optimizer step exposing at least this share of the step is optimizer-heavy."""
    slow_launch_ns: int = 1_000_000
    """A launch call this long is not the launch path's usual cost (microseconds): a first
    launch loading the kernel's code, or a host stalled inside the runtime."""
    replay_error: float = 0.1
    """A graph whose unchanged replay misses the measured step by more than this (a fraction)
    lacks dependencies the trace does not show: findings keep their Amdahl bounds instead of
    a replayed gain."""
    replay_nodes: int = 100_000
    """The critical path and its what-ifs replay at most this many host calls and device ops:
    steady steps holding more are cut to the consecutive steps around the timeline's step
    that fit (at least that step), since each replay's cost grows with the graph and steady
    steps repeat one another."""
    host_work_per_launch_ns: int = 200_000
    """Host time the GPU waited for, per kernel launched, beyond this is the host's own work
    between launches (the launch path costs tens of microseconds per eager op): the fix is to
    move or overlap that work, not to cut launches."""
    dispatch_self_ns: int = 10_000
    """No op of a dispatch-sized CPU call (its op tree) runs this long on its own. An eager
    op's fixed cost on the CPU is a few µs (more while the profiler records shapes); an op
    whose own time stays under 10 µs spends about half of it or more in that fixed cost. The
    CPU counterpart of the launch-sized kernels of a GPU trace."""
    first_launch_factor: float = 10.0
    """A kernel's first launch whose call takes at least `slow_launch_ns` and this many times
    the median call of its launch API loads the kernel's code (a code object, a lazily
    loaded module, a JIT-compiled kernel): a one-off cost, so the GPU's wait for it is
    start-up, not launch latency."""
    recurring_one_off: int = 3
    """An op whose calls hold start-up or JIT signatures this many times or more on one
    thread builds code per shape, again and again: only its first such call is a one-off."""
    jit_stretch_ns: int = 1_000_000
    """The first launch of a kernel built at run time (through the driver API, or named
    `fused_*`/`triton_*`) after at least this long in which its thread recorded nothing is a
    JIT compile (a TorchScript fuser, NVRTC, Triton): a one-off cost. An eager op's host work
    between two recorded calls is microseconds; a compile is tens to hundreds of ms."""


class MemoryThresholds(msgspec.Struct, frozen=True):
    """When a trace's memory events (`profile_memory=True`) become a finding, and how much the
    memory profile lists."""

    near_capacity: float = 0.9
    """Reserved memory at this share of the device's capacity is near full: the memory-peak
    finding, and enough for the model's state to be worth offloading or sharding."""
    pressure: float = 0.5
    """Below this share of a known capacity, memory is not the limit: the fixes that trade
    time for memory (checkpointing, smaller micro-batches, offload) are not suggested."""
    activation_share: float = 0.4
    state_share: float = 0.4
    fp32_share: float = 0.5
    fragmentation_ratio: float = 1.3
    fragmentation_bytes: int = 256 * MiB
    fragmentation_capacity_share: float = 0.05
    leak_share: float = 0.0
    """Growth over the steady-state steps, as a fraction of the peak, that can be a leak (a
    steady rise of `leak_bytes` is one already: the finding says when it fills the device)."""
    leak_bytes: int = 64 * 1024
    leak_drops: float = 0.25
    """At most this share of step boundaries may see the level fall in a leak."""
    churn_per_step: float = 1.0
    top: int = 10
    timeline_points: int = 300


class SnapshotThresholds(msgspec.Struct, frozen=True):
    """When a pattern of an allocator snapshot (`wallfinder memory`) becomes a finding, and
    how much the report lists."""

    fragmentation_ratio: float = 1.5
    fragmentation_free: int = GiB
    activation_share: float = 0.5
    optimizer_share: float = 0.3
    optimizer_bytes: int = GiB
    leak_min_count: int = 3
    top: int = 10


class JobThresholds(msgspec.Struct, frozen=True):
    """When a job's collectives become a finding or its verdict."""

    small_message_bytes: int = MiB
    """Below this a collective's time is mostly latency (NCCL's ring reaches bandwidth near
    several MB per message)."""
    wait_wall_share: float = 0.10
    """Ranks waiting for each other in collectives for this share of a step (and no single
    straggler) makes communication wait the job's verdict."""
    tie_ns: int = 1_000
    """Ranks reaching a collective within this long of each other arrive together: a tie is
    nobody's lateness (the clocks are aligned by an estimate no finer than this)."""
    straggler_steps: float = 0.5
    """A straggler is last at most of a step's collectives (those where someone was last) in
    more than this share of the steps that have any."""
    straggler_noise: float = 2.0
    """... and late by more than this many times the noise: the larger of the median lateness
    of the other ranks at the collectives where they were last (a symmetric job whose ranks
    take turns arriving last is late by about as much each time, whoever is last) and the
    spread of the steps' lengths (on a busy host arrivals jitter as much as steps do)."""


class CounterThresholds(msgspec.Struct, frozen=True):
    """How a kernel's hardware counters (an Nsight Compute export) decide its bound."""

    busy: float = 0.60
    """A unit (the SMs, or memory at any level) at this share of its peak is what limits the
    kernel (Nsight Compute's own guidance: above 60% of speed-of-light a unit is the limiter);
    a kernel with neither unit this busy is latency-bound."""
    tensor_active: float = 0.20
    """A compute-bound kernel whose tensor pipe is active this share of its cycles runs on the
    tensor cores (with no such figure: any tensor-pipe instructions)."""
    low_occupancy: float = 0.25
    """Achieved occupancy below this is named as a reason a latency-bound kernel is so."""
    refuted_share: float = 0.20
    """The roofline estimate refuted for at least this share of the matched kernels' time is
    a finding."""
    model_tolerance: float = 0.25
    """The cost model's bytes or FLOPs differ from the counted ones when off by more than this
    fraction."""
    top: int = 5
    """How many kernels, by time, get an `ncu` command to collect their counters."""
    same_program: float = 0.5
    """An export is shown to be the trace's program when more than this share of its profiled
    launches join the trace's kernels by their launch size (grid and block) or in launch
    order, on the same device; otherwise its counters change nothing (a kernel name alone is
    shared by every PyTorch program)."""


class PipelineThresholds(msgspec.Struct, frozen=True):
    """How a pipelined step's wait for its neighbour is read against its schedule's theory."""

    excess: float = 0.05
    """A stage waiting more (or less) than the schedule's bubble by more than this share of
    the step is said to: the transfers themselves or an unbalanced stage account for it."""
    imbalance: float = 0.05
    """Pipelined ranks whose compute per step differs by more than this share of their mean
    are unbalanced stages (the slowest sets the pace): the job's pipeline-imbalance."""


class ServingThresholds(msgspec.Struct, frozen=True):
    """When an LLM serving trace's iterations make a serving finding."""

    low_mbu: float = 0.5
    """Decode reading its bytes at less than this share of the peak bandwidth (over its busy
    time) runs below the bandwidth that bounds it."""
    small_batch: int = 64
    """Decode iterations of at most this many tokens (one per running sequence) leave the
    weights' read to few tokens: a larger batch shares it."""
    interference: float = 1.5
    """Mixed (chunked-prefill) iterations at least this many times the pure decode's median
    hold the running sequences' tokens back."""
    kv_share: float = 0.2
    """KV cache bytes at least this share of a decode iteration's are worth halving (fp8)."""


class Thresholds(msgspec.Struct, frozen=True):
    """Named, documented thresholds: the verdict's at the top level, the findings' in groups.
    See the module's docstring."""

    max_cv: float = 0.10
    """Steps are stable when their coefficient of variation is at most this."""
    min_steps: int = 3
    """With fewer steady-state steps, a coefficient of variation says nothing: whether steps
    are stable is unknown (the verdict's first answer, its evidence, the unstable-steps
    finding)."""
    min_busy: float = 0.75
    """The device is busy when compute kernels cover at least this share of the step; below
    it, the overhead wall (idle, exposed communication and copies) decides."""
    startup_only: float = 0.9
    """A window whose one-off start-up (idle cause `startup`) is at least this share holds
    almost no steady state: the verdict says so first, and asks for steady steps."""
    min_matmul: float = 0.50
    """The busy time is in matmuls when GEMM, attention and convolution take at least this
    share of it; below it, the bandwidth wall decides."""
    near_peak: float = 0.60
    """The matmuls are near peak when their time-weighted % of roof is at least this; each
    compute-bound matmul op below it is in the matmul-below-roof finding."""
    min_costed_share: float = 0.5
    """Below this share of busy time with a cost model, how near peak the work runs is a
    guess: a compute or bandwidth verdict rests on thin evidence."""
    skinny_tile: int = 16
    """A GEMM kernel whose tile is at most this wide in M or N was chosen for a skinny problem
    (the libraries' heuristics pick such tiles for a handful of rows: decode, small batches):
    with no cost, it is bandwidth-bound."""
    steps: StepThresholds = msgspec.field(default_factory=StepThresholds)
    slack: SlackThresholds = msgspec.field(default_factory=SlackThresholds)
    time: TimeThresholds = msgspec.field(default_factory=TimeThresholds)
    memory: MemoryThresholds = msgspec.field(default_factory=MemoryThresholds)
    snapshot: SnapshotThresholds = msgspec.field(default_factory=SnapshotThresholds)
    job: JobThresholds = msgspec.field(default_factory=JobThresholds)
    counters: CounterThresholds = msgspec.field(default_factory=CounterThresholds)
    pipeline: PipelineThresholds = msgspec.field(default_factory=PipelineThresholds)
    serving: ServingThresholds = msgspec.field(default_factory=ServingThresholds)
