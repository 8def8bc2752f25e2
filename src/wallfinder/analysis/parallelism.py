"""The job's parallelism strategies, from what one rank's trace holds.

Three kinds of evidence, each read once over the trace's columns (a test per distinct name,
then masks over the events):

- the process groups (`distributedInfo.pg_config`: name, description, size) and the groups the
  collectives' own arguments name;
- the collectives the host calls (the `c10d::` dispatcher ops every API goes through, and the
  functional collectives DTensor uses), by kind and by the phase of the step they are called
  in: all-gathers in the forward with reduce-scatters in the backward are sharded data
  parallel (FSDP / ZeRO-3); all-reduces in the backward alone are DDP (ZeRO-1/2 reduce the
  same way); all-reduces inside the forward are tensor parallel; send/recv are pipeline (or
  context) parallel; all-to-alls are expert parallel;
- the frameworks' own ranges: `FSDP::` (torch FSDP1/FSDP2), `DistributedDataParallel.forward`,
  torch.distributed.pipelining's `forward_one_chunk`/`backward_one_chunk`, ring attention,
  Megatron, DeepSpeed and torchtitan names.

Several strategies at once (2D/3D parallel) is the normal case: each is said with the lines of
evidence that name it. The strategies' own losses are rules (analysis/topics/sharding.py).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.accumulation import DDP_FORWARD
from wallfinder.analysis.classify import is_communication_kernel, is_communication_op
from wallfinder.analysis.collectives import DEFAULT_GROUP, collective_name
from wallfinder.analysis.gpu import COMM
from wallfinder.analysis.intervals import in_windows
from wallfinder.analysis.phases import BACKWARD, FORWARD, Attribution, is_grad_reducer
from wallfinder.analysis.roofline import outermost
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.diagnosis import COLLECTIVE_WORDS, Parallelism, ProcessGroup, Strategy
from wallfinder.trace import Events, Kind, Trace

I64 = npt.NDArray[np.int64]

HOST = (Kind.CPU_OP, Kind.ANNOTATION)
RANGES = (*HOST, Kind.PYTHON)
"""Where the frameworks' names are: their ranges, and their Python frames (`with_stack`)."""

FSDP_RANGE = "FSDP::"
"""The prefix of torch FSDP's own ranges (FSDP1 and FSDP2: `FSDP::all_gather (0)`,
`FSDP::pre_forward (1)`, `FSDP::post_backward_reduce (2)`)."""

_UNIT = re.compile(r"^FSDP::(\w+) \((\d+)\)$")
"""An FSDP2 range of one unit: `FSDP::all_gather (0)` (its name and the unit's index)."""

_PIPELINE = ("forward_one_chunk", "backward_one_chunk", "PipelineStage", "PipelineSchedule")
_MICROBATCH = re.compile(r"^(?:PP:|(?:Forward|Backward) \d+$)")
"""torch.distributed.pipelining's own ranges: `PP:<action>` around each action of the
runtime schedules, `Forward i`/`Backward i` around each microbatch of GPipe and 1F1B (names
generic enough that they count with the send/recv between stages only)."""


def _is_pipelining(name: str) -> bool:
    return any(p in name for p in _PIPELINE) or name.startswith("PP:")


_RING = ("ring_attention", "_templated_ring_attention", "context_parallel")
_FRAMEWORKS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("torch FSDP", lambda s: s.startswith(FSDP_RANGE)),
    ("torch DDP", lambda s: s == DDP_FORWARD),
    ("torch pipelining", _is_pipelining),
    # Megatron's layer names alone do not say Megatron: vLLM and SGLang borrow them.
    ("Megatron", lambda s: "megatron" in s.lower()),
    ("DeepSpeed", lambda s: "deepspeed" in s.lower() or "DeepSpeedEngine" in s),
    ("torchtitan", lambda s: "torchtitan" in s.lower()),
)

_TITLES = {
    "DDP": "data parallel, gradients all-reduced (DDP / ZeRO-1/2)",
    "FSDP": "fully sharded data parallel (FSDP / ZeRO-3)",
    "TP": "tensor parallel",
    "PP": "pipeline parallel",
    "EP": "expert parallel (or sharded embeddings: all-to-all)",
    "CP": "context parallel",
}
_ORDER = tuple(_TITLES)
_ZERO = {
    "DDP": (
        "ZeRO-1/2",
        "DeepSpeed ZeRO stage 1/2: optimizer states (and gradients) sharded, every gradient "
        "reduced across the data-parallel ranks",
    ),
    "FSDP": ("ZeRO-3", "DeepSpeed ZeRO stage 3: parameters sharded, gathered per use"),
}
"""DeepSpeed's names for the data-parallel layouts, where its frames are in the trace."""

_MEGATRON_TP = (
    "ColumnParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "_VocabParallelCrossEntropy",
    "LinearWithGradAccumulationAndAsyncCommunication",
)
"""Megatron's tensor-parallel layers and autograd functions, by the names its module ranges,
frames and backward nodes carry."""


def _is_megatron_tp(name: str) -> bool:
    return any(n in name for n in _MEGATRON_TP)


def _is_dp_group(group: ProcessGroup) -> bool:
    """A group `pg_config` describes as data parallel's alone (Megatron's
    `DATA_PARALLEL_GROUP`, not `TENSOR_AND_DATA_PARALLEL_GROUP`), of more than one rank."""
    desc = group.description.upper()
    return desc.startswith("DATA_PARALLEL") and (group.size or 0) > 1


def collective_kind(name: str) -> str:
    """The kind of a host collective call ("allreduce", "allgather", "reducescatter",
    "alltoall", "sendrecv", "recv", "broadcast", ...): the last part of its qualified name
    (`c10d::_allgather_base_`, `_c10d_functional::all_reduce`) in `collective_name`'s
    spelling."""
    kind = collective_name(name.rsplit(":", 1)[-1])
    return "sendrecv" if kind in ("recv", "isend", "irecv") else kind


class HostCollectives(msgspec.Struct, frozen=True):
    """The collectives the host calls in the steady steps: the outermost collective op per
    call (an `all_reduce` that calls `c10d::allreduce_` is one call), with its kind and the
    phase of the step it is called in (-1: not placed)."""

    calls: Events
    kind: npt.NDArray[np.str_]
    phase: npt.NDArray[np.int8]


def host_collectives(scope: Scope, attribution: Attribution | None) -> HostCollectives:
    """The steady steps' host collective calls (see `HostCollectives`); where the trace
    holds none, its collective kernels, placed by their launch."""
    trace = scope.trace
    codes = trace.names_matching(
        # The cheap test first: classifying every distinct string costs more than the rest.
        lambda s: (
            ("c10d" in s or s.startswith(("nccl:", "gloo:")))
            and is_communication_op(s)
            and collective_kind(s) not in ("wait", "barrier", "")
        ),
        (Kind.CPU_OP,),
    )
    ops = trace.named((Kind.CPU_OP,), codes)
    ops = ops.take(np.flatnonzero(in_windows(ops.ts, scope.window_start, scope.window_end)))
    top = np.zeros(len(ops), dtype=bool)
    thread = ops.thread
    for t in np.unique(thread).tolist():
        rows = np.flatnonzero(thread == t)
        top[rows] = outermost(ops.take(rows))
    ops = ops.take(np.flatnonzero(top))
    thread, at = ops.thread, ops.ts
    if not len(ops) and scope.dev is not None:
        # No host op names them (an Nsight export, a trace without CPU ops): the collective
        # kernels themselves, each placed where it was launched.
        dev = scope.dev
        rows = np.flatnonzero(scope.inside & (dev.cls == COMM) & (dev.launch_ts != NO_LAUNCH))
        ops, thread, at = dev.ops.take(rows), dev.launch_thread[rows], dev.launch_ts[rows]
    names, index = np.unique(ops.name, return_inverse=True)
    kinds = np.array([collective_kind(trace.strings[int(c)]) for c in names.tolist()], dtype=str)
    kind = kinds[index] if len(ops) else np.empty(0, dtype=str)
    phase = (
        attribution.place_calls(thread, at)[0]
        if attribution is not None and len(ops)
        else np.full(len(ops), -1, np.int8)
    )
    return HostCollectives(ops, kind, phase)


def fsdp_ranges(scope: Scope, *names: str) -> Events:
    """FSDP's per-unit ranges of the given names (`all_gather`, `all_gather_copy_out`,
    `pre_forward`, ...: `FSDP::NAME (i)`) in the steady steps, by start; `unit_of` reads
    each one's unit."""
    trace = scope.trace
    codes = trace.names_matching(
        lambda s: (m := _UNIT.match(s)) is not None and m.group(1) in names, HOST
    )
    ev = trace.named(HOST, codes)
    return ev.take(np.flatnonzero(in_windows(ev.ts, scope.window_start, scope.window_end)))


def unit_of(trace: Trace, ev: Events) -> I64:
    """The FSDP unit index of each of `ev`'s `FSDP::name (i)` ranges."""
    names, index = np.unique(ev.name, return_inverse=True)
    units = np.array(
        [int(m.group(2)) if (m := _UNIT.match(trace.strings[int(c)])) else -1 for c in names],
        dtype=np.int64,
    )
    result: I64 = units[index] if len(ev) else np.empty(0, np.int64)
    return result


def detect(scope: Scope, attribution: Attribution | None) -> Parallelism | None:
    """The strategies the trace shows, each with its evidence (None: no collective and no
    framework range: a single-process job)."""
    trace = scope.trace
    steps = max(scope.count, 1)
    host = host_collectives(scope, attribution)
    frameworks = [
        name
        for name, test in _FRAMEWORKS
        if trace.named(RANGES, trace.names_matching(test, RANGES)).ts.size
    ]
    groups = _groups(trace, host, steps)
    if not len(host.calls) and not frameworks:
        return None
    evidence: dict[str, list[str]] = {}

    def per_step(kind: str, phase: int | None = None) -> float:
        rows = host.kind == kind
        if phase is not None:
            rows &= host.phase == phase
        return int(rows.sum()) / steps

    def calls(kind: str, phase: int | None = None) -> str:
        where = {FORWARD: " in the forward", BACKWARD: " in the backward", None: ""}[phase]
        return f"{COLLECTIVE_WORDS.get(kind, kind)} ×{per_step(kind, phase):g}/step{where}"

    fsdp_ranges = _said(scope, lambda s: s.startswith(FSDP_RANGE), steps)
    gathers_fwd = per_step("allgather", FORWARD)
    scatters_bwd = per_step("reducescatter", BACKWARD)
    if fsdp_ranges:
        units = _units(trace)
        evidence.setdefault("FSDP", []).append(
            f"FSDP's own ranges ({fsdp_ranges})" + (f", {len(units)} units" if units else "")
        )
    if gathers_fwd and (scatters_bwd or fsdp_ranges):
        evidence.setdefault("FSDP", []).append(
            f"{calls('allgather', FORWARD)} (parameters gathered before their unit runs)"
            + (f", {calls('reducescatter', BACKWARD)}" if scatters_bwd else "")
        )
    sharded = "FSDP" in evidence
    reduces_fwd = per_step("allreduce", FORWARD)
    reduces_bwd = per_step("allreduce", BACKWARD)
    ddp_ranges = _said(scope, lambda s: s == DDP_FORWARD, steps)
    if ddp_ranges:
        evidence.setdefault("DDP", []).append(f"DDP's own ranges ({ddp_ranges})")
    # All-reduces in the backward are a replica's gradients, unless the forward all-reduces
    # too: then they are tensor parallel's (the input gradients of its column-parallel
    # layers), and data parallel beside it shows its own ranges or its own group.
    # Megatron's and DeepSpeed's own gradient reduction (their frames, with Python stacks),
    # and a data-parallel group `pg_config` names beside tensor parallel's.
    reducer = _said(scope, is_grad_reducer, steps)
    if reducer:
        evidence.setdefault("DDP", []).append(f"the gradient reduction's own frames ({reducer})")
    dp_group = next((g for g in groups if _is_dp_group(g)), None)
    if reduces_bwd and not sharded and (not reduces_fwd or ddp_ranges or reducer or dp_group):
        evidence.setdefault("DDP", []).append(
            f"{calls('allreduce', BACKWARD)} (gradients reduced across replicas)"
        )
    if scatters_bwd and not sharded and not gathers_fwd:
        evidence.setdefault("DDP", []).append(
            f"{calls('reducescatter', BACKWARD)} with no all-gather in the forward (gradients "
            "reduced to the rank that owns their shard of the optimizer: ZeRO-2)"
        )
    if "DDP" in evidence and dp_group is not None and dp_group.size:
        evidence["DDP"].append(f"process group {dp_group.description} of {dp_group.size}")
    if reduces_fwd:
        evidence.setdefault("TP", []).append(
            f"{calls('allreduce', FORWARD)} (partial outputs of a layer summed)"
            + (f", {calls('allreduce', BACKWARD)}" if reduces_bwd and "DDP" not in evidence else "")
        )
    tp_layers = _said(scope, _is_megatron_tp, steps)
    if tp_layers:
        evidence.setdefault("TP", []).append(f"Megatron-style tensor-parallel layers ({tp_layers})")
    # Sequence parallel pairs each reduce-scatter in the forward with an all-gather; a
    # reduce-scatter alone is another layout's (row-wise sharded embeddings pool that way).
    scatters_fwd = per_step("reducescatter", FORWARD)
    if scatters_fwd and gathers_fwd >= scatters_fwd and not sharded:
        evidence.setdefault("TP", []).append(
            f"{calls('reducescatter', FORWARD)} with {calls('allgather', FORWARD)} "
            "(sequence parallel)"
        )
    pipeline = _said(scope, _is_pipelining, steps)
    if not pipeline and per_step("sendrecv"):
        pipeline = _said(scope, lambda s: _MICROBATCH.match(s) is not None, steps)
    if not pipeline and per_step("sendrecv"):
        pipeline = _said(
            scope,
            lambda s: is_megatron_step(s, "forward_step") or is_megatron_step(s, "backward_step"),
            steps,
        )
    sendrecv = per_step("sendrecv")
    ring = _said(scope, lambda s: any(p in s for p in _RING), steps)
    if pipeline:
        evidence.setdefault("PP", []).append(f"pipelining's ranges ({pipeline})")
    if sendrecv and (pipeline or not ring):
        evidence.setdefault("PP", []).append(
            f"{calls('sendrecv')} (activations and gradients between stages)"
        )
    if ring:
        evidence.setdefault("CP", []).append(f"ring attention's ranges ({ring})")
    if per_step("alltoall"):
        evidence.setdefault("EP", []).append(
            f"{calls('alltoall')} (tokens to their experts, or rows to sharded embeddings)"
        )
    dispatch = _range_counts(scope, is_dispatch_kernel, kinds=(Kind.KERNEL,))
    if dispatch:
        evidence.setdefault("EP", []).append(f"dispatch/combine kernels ({_top(dispatch, steps)})")
    if evidence and len(groups) > 1:
        sizes = ", ".join(
            f"{g.name} of {g.size}" for g in groups if g.size is not None and g.size > 1
        )
        if sizes:
            first = next(iter(evidence))
            evidence[first].append(f"process groups: {sizes}")
    deepspeed = "DeepSpeed" in frameworks
    strategies = [
        Strategy(name=n, title=_TITLES[n], evidence=evidence[n])
        if not (deepspeed and n in _ZERO)
        else Strategy(name=_ZERO[n][0], title=_ZERO[n][1], evidence=evidence[n])
        for n in _ORDER
        if n in evidence
    ]
    return Parallelism(strategies=strategies, groups=groups, frameworks=frameworks)


def is_dispatch_kernel(name: str) -> bool:
    """An expert-parallel library's dispatch or combine kernel (DeepEP's, by name)."""
    low = name.lower()
    return ("dispatch" in low or "combine" in low) and is_communication_kernel(name)


def _range_counts(
    scope: Scope, test: Callable[[str], bool], kinds: tuple[Kind, ...] = RANGES
) -> Counter[str]:
    """How many events of each name that `test` accepts the steady steps hold."""
    trace = scope.trace
    ev = trace.named(kinds, trace.names_matching(test, kinds))
    ev = ev.take(np.flatnonzero(in_windows(ev.ts, scope.window_start, scope.window_end)))
    names, counts = np.unique(ev.name, return_counts=True)
    return Counter(
        {
            trace.strings[int(c)]: int(n)
            for c, n in zip(names.tolist(), counts.tolist(), strict=True)
        }
    )


def _said(scope: Scope, test: Callable[[str], bool], steps: int) -> str:
    """The ranges `test` accepts, in words: per steady step, or where the steady steps hold
    none (ranges recorded in other steps only), their count in the whole trace."""
    counts = _range_counts(scope, test)
    if counts:
        return _top(counts, steps)
    trace = scope.trace
    ev = trace.named(RANGES, trace.names_matching(test, RANGES))
    names, n = np.unique(ev.name, return_counts=True)
    whole = Counter(
        {trace.strings[int(c)]: int(k) for c, k in zip(names.tolist(), n.tolist(), strict=True)}
    )
    return _top(whole, 1).replace("/step", "") + " in the trace" if whole else ""


def _top(counts: Counter[str], steps: int, n: int = 2) -> str:
    """The `n` most frequent names of `counts` with their counts per step (FSDP's unit
    numbers and pipelining's microbatch numbers folded)."""
    folded: Counter[str] = Counter()
    for name, k in counts.items():
        folded[re.sub(r" \d+$", " i", re.sub(r" \(\d+\)$", " (i)", name))] += k
    return ", ".join(f"{name} ×{k / steps:g}/step" for name, k in folded.most_common(n))


def _units(trace: Trace) -> set[int]:
    matches = (_UNIT.match(s) for s in trace.strings)
    return {int(m.group(2)) for m in matches if m is not None and m.group(1) == "all_gather"}


def _groups(trace: Trace, host: HostCollectives, steps: int) -> list[ProcessGroup]:
    """The process groups `distributedInfo` declares, and with only one, its collectives
    per step by kind (the host calls do not name their group: with several, they are not
    divided among them)."""
    names, counts = np.unique(host.kind, return_counts=True)
    kinds = {str(k): int(n) / steps for k, n in zip(names.tolist(), counts.tolist(), strict=True)}
    config = trace.distributed.get("pg_config")
    groups = []
    if isinstance(config, list):
        for pg in config:
            if not isinstance(pg, dict):
                continue
            size = pg.get("pg_size")
            groups.append(
                ProcessGroup(
                    name=str(pg.get("pg_name", "")),
                    size=size if isinstance(size, int) else None,
                    description=str(pg.get("pg_desc", "")),
                )
            )
    if not groups and kinds:
        groups.append(ProcessGroup(name=DEFAULT_GROUP, size=trace.world_size))
    if len(groups) == 1 and kinds:
        groups[0] = ProcessGroup(
            name=groups[0].name,
            size=groups[0].size,
            description=groups[0].description,
            collectives=kinds,
        )
    return groups


_PIPELINE_GROUP = "PIPELINE"
"""How Megatron describes its pipeline group in `distributedInfo.pg_config`
(`PIPELINE_MODEL_PARALLEL_GROUP`, its `group_desc` since 2024)."""


def described_pipeline_group(trace: Trace) -> int | None:
    """The size of the process group `pg_config` describes as the pipeline's (Megatron's
    `PIPELINE_MODEL_PARALLEL_GROUP`), None where none is described: the one statement in a
    trace that its point-to-point transfers are a pipeline's, whatever else it records."""
    config = trace.distributed.get("pg_config")
    if isinstance(config, list):
        for pg in config:
            desc = pg.get("pg_desc") if isinstance(pg, dict) else None
            size = pg.get("pg_size") if isinstance(pg, dict) else None
            if isinstance(desc, str) and _PIPELINE_GROUP in desc.upper() and isinstance(size, int):
                return size
    return None


def pipeline_group_size(trace: Trace, is_p2p: Callable[[str], bool]) -> int | None:
    """p, the pipeline's stages, where the trace says it beside other process groups: the
    size of the group `pg_config` describes as the pipeline's, else the one group size the
    point-to-point transfers' own arguments record (`Group size` on a SendRecv kernel or
    its `record_param_comms`); None when neither says it (several sizes, or none)."""
    described = described_pipeline_group(trace)
    if described is not None:
        return described
    sent = (Kind.KERNEL, Kind.CPU_OP, Kind.ANNOTATION)
    ev = trace.named(sent, trace.names_matching(is_p2p, sent))
    sizes = set()
    for code in np.unique(ev.comm[ev.comm != 0]).tolist():
        args = trace.collective(int(code))
        if args is not None and args.group_size > 1:
            sizes.add(args.group_size)
    return sizes.pop() if len(sizes) == 1 else None


def is_megatron_step(name: str, action: str) -> bool:
    """Megatron's schedule function `action` (`forward_step`, `backward_step`) as the Python
    tracer records it (`megatron/core/pipeline_parallel/schedules.py(250): forward_step`):
    one call per microbatch and model chunk, whichever schedule runs them."""
    return name.endswith(f": {action}") and "megatron" in name


def megatron_microbatches(scope: Scope) -> int | None:
    """m from Megatron's `forward_step` frames: their count per steady step (None without
    them in the steady steps)."""
    trace = scope.trace
    frames = (Kind.PYTHON, Kind.ANNOTATION)
    ev = trace.named(
        frames, trace.names_matching(lambda s: is_megatron_step(s, "forward_step"), frames)
    )
    start, end = scope.window_start, scope.window_end
    inside = in_windows(ev.ts, start, end)
    if not inside.any():
        return None
    window = np.searchsorted(start, ev.ts[inside], side="right") - 1
    return round(int(inside.sum()) / np.unique(window).size)
