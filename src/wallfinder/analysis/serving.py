"""LLM serving traces: the engine's iterations, prefill or decode, decode against the memory
bandwidth that bounds it.

A serving engine's unit of work is an iteration: one forward pass over the running batch.
They are found, in this order, from the engine's own ranges (vLLM's
`execute_N_context_C(...)_generation_G(...)`, SGLang's `step[DECODE bs=B]`, `execute_model`,
`forward_batch`), else from what each forward pass starts with: a CUDA/HIP graph launch (a
decode iteration replayed from its graph) or the model's embedding lookup (an eager forward,
whose token ids' shape says prefill or decode). A trace with a backward pass or an optimizer
step is training, never serving.

Decode reads every weight and the KV cache once per iteration for a handful of tokens: its
bound is the memory bandwidth, and its measure MBU (bytes read per iteration / its time /
peak bandwidth), the counterpart of prefill's MFU. The bytes are an estimate, said with their
basis: weights from the eager forwards' linear layers (a graph replay records no shapes) or
the user's parameter count, KV from the attention's K and V inputs.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from wallfinder.analysis.gpu import GRAPH_LAUNCHES, DeviceOps, breakdown
from wallfinder.analysis.scope import Scope
from wallfinder.analysis.steps import StepSpans, gpu_windows, launched_in
from wallfinder.analysis.thresholds import Thresholds
from wallfinder.analysis.verdict import few_steps
from wallfinder.diagnosis import (
    DecodeBandwidth,
    Device,
    IterationKind,
    IterationKinds,
    Serving,
    ServingIteration,
    Steps,
    Verdict,
)
from wallfinder.trace import NONE, Events, Kind, Trace
from wallfinder.units import util_pct

I64 = npt.NDArray[np.int64]
NS = 1e-9

SERVING_ITERATIONS = "serving iterations"

_VLLM_EXECUTE = re.compile(
    r"^execute_(\d+)_context_(\d+)\(sq(\d+)sk\d+.*?\)_generation_(\d+)\(sq(\d+)sk(\d+)"
)
"""vLLM's iteration range: tokens, then prefill (context) requests with their query tokens,
then decode (generation) requests with theirs and their KV length."""
_VLLM_EXECUTE_OLD = re.compile(r"^execute_context_(\d+)\((\d+)_\d+\)_generation_(\d+)\((\d+)\)")
"""vLLM's older iteration range: prefill (context) requests with their tokens (and the sum of
their squares), then decode (generation) requests with theirs."""
_SGLANG_STEP = re.compile(r"^step\[(\w+)(?:\s+bs=(\d+))?")
"""SGLang's iteration range: its forward mode (DECODE, EXTEND, MIXED, IDLE) and batch size."""
_ENGINE_RANGE = re.compile(r"^(execute_model|forward_batch\w*|forward_(?:extend|decode)\w*)$")
"""Engine ranges that mark an iteration without saying its kind."""
_MODES: dict[str, IterationKind] = {
    "decode": "decode",
    "extend": "prefill",
    "prefill": "prefill",
    "mixed": "mixed",
}
_EMBEDDING = "aten::embedding"
_LINEAR = "aten::linear"
_ATTENTION = frozenset({"aten::scaled_dot_product_attention"})
_GEMMS = frozenset({_LINEAR, "aten::mm", "aten::addmm", "aten::matmul", "aten::bmm"})
_ENGINES = (("vllm/", "vLLM"), ("sglang/", "SGLang"))
"""Python source paths that name the engine."""


class _Found(msgspec.Struct, frozen=True):
    """Iterations on the host, in time order: where each starts, its kind where the evidence
    says it, its tokens where recorded, whether a graph replayed it."""

    start: I64
    kind: list[IterationKind]
    tokens: list[int | None]
    graph: list[bool]
    evidence: str


def serving(scope: Scope) -> Serving | None:
    """The scope's trace read as an LLM serving trace (None: it is not one)."""
    trace = scope.trace
    engine = _engine(trace)
    if _training(trace):
        return None
    found = _engine_ranges(trace) or _forward_passes(trace) or _layer_passes(trace)
    if scope.dev is None or found is None:
        if engine is None:
            return None
        if scope.dev is not None:
            return Serving(
                engine=engine,
                evidence=f"Python frames of {engine}'s sources",
                note=f"{engine}'s worker, but no engine iteration was found in its ranges, "
                "graph launches or the model's first ops",
            )
        return Serving(
            engine=engine,
            evidence=f"Python frames of {engine}'s sources",
            note=(
                f"{engine}'s front-end process, with no device work: its iterations run in "
                "the engine core's worker process (profile that one, e.g. with "
                "VLLM_TORCH_PROFILER_DIR or SGLang's /start_profile)"
            ),
        )
    return _judged(scope, engine, found)


def _engine(trace: Trace) -> str | None:
    """The engine the trace's Python frames or ranges name (None: none named)."""
    codes = trace.distinct_names(Kind.PYTHON, Kind.ANNOTATION)
    names = [trace.strings[c] for c in codes.tolist()]
    for path, engine in _ENGINES:
        if any(path in n for n in names):
            return engine
    if any(_SGLANG_STEP.match(n) for n in names):
        return "SGLang"
    return None


def _training(trace: Trace) -> bool:
    """The trace runs a backward pass or an optimizer step: training, not serving."""
    codes = trace.distinct_names(Kind.CPU_OP, Kind.ANNOTATION)
    return any(
        "Backward" in (s := trace.strings[c]) or s.startswith("Optimizer.") for c in codes.tolist()
    )


def _engine_ranges(trace: Trace) -> _Found | None:
    """Iterations from the engine's own ranges (the family with the most instances)."""
    parsed_of = {
        code: parsed
        for code in trace.distinct_names(Kind.ANNOTATION, Kind.CPU_OP).tolist()
        if (parsed := _parse_range(trace.strings[code])) is not None
    }
    if not parsed_of:
        return None
    # Only the engine's ranges are copied, not every host op.
    rows = trace.named((Kind.ANNOTATION, Kind.CPU_OP), np.array(list(parsed_of), np.int32))
    families: dict[str, list[tuple[int, IterationKind, int | None]]] = {}
    for code, (family, kind, tokens) in parsed_of.items():
        for ts in rows.ts[rows.name == code].tolist():
            families.setdefault(family, []).append((int(ts), kind, tokens))
    if not families:
        return None
    family = max(families, key=lambda f: len(families[f]))
    found = sorted(families[family])
    graphs = _graph_launches(trace)
    start = np.array([f[0] for f in found], np.int64)
    ends = np.concatenate([start[1:], [np.iinfo(np.int64).max]])
    graph = [bool(((graphs >= a) & (graphs < b)).any()) for a, b in zip(start, ends, strict=True)]
    kinds: list[IterationKind] = [
        ("decode" if g else "unknown") if k == "unknown" else k
        for (_, k, _), g in zip(found, graph, strict=True)
    ]
    return _Found(start, kinds, [f[2] for f in found], graph, f"the engine's {family} ranges")


def _parse_range(name: str) -> tuple[str, IterationKind, int | None] | None:
    """(family, kind, tokens) of an engine range's name; None: not one."""
    m = _VLLM_EXECUTE.match(name)
    if m is not None:
        tokens, prefills, decodes = int(m[1]), int(m[2]), int(m[4])
        kind: IterationKind = (
            "mixed" if prefills and decodes else "prefill" if prefills else "decode"
        )
        return "execute_<tokens>_context_<n>_generation_<n>", kind, tokens
    m = _VLLM_EXECUTE_OLD.match(name)
    if m is not None:
        prefills, decodes = int(m[1]), int(m[3])
        kind = "mixed" if prefills and decodes else "prefill" if prefills else "decode"
        return "execute_context_<n>_generation_<n>", kind, int(m[2]) + int(m[4])
    m = _SGLANG_STEP.match(name)
    if m is not None:
        return "step[<mode>]", _MODES.get(m[1].lower(), "unknown"), None
    m = _ENGINE_RANGE.match(name)
    if m is not None:
        mode = next((k for k in _MODES if k in name.lower()), None)
        return m[1], _MODES[mode] if mode else "unknown", None
    return None


def _graph_launches(trace: Trace) -> I64:
    runtime = trace.named((Kind.RUNTIME,), trace.codes_of(GRAPH_LAUNCHES))
    return np.sort(runtime.ts.astype(np.int64))


def _forward_passes(trace: Trace) -> _Found | None:
    """Iterations from what each forward pass starts with: a graph launch (decode replayed)
    or the model's embedding lookup (eager: one token per sequence is decode, more is
    prefill). None unless the trace shows decode: graph replays of a model with an
    embedding or attention, or an eager forward of one token per sequence."""
    graphs = _graph_launches(trace)
    ops = trace.of_kind(Kind.CPU_OP)
    embedding = ops.take(np.flatnonzero(ops.name == trace.code_of(_EMBEDDING)))
    gemm_ts = np.sort(ops.ts[np.isin(ops.name, trace.codes_of(_GEMMS))].astype(np.int64))
    rows: list[tuple[int, IterationKind, int | None, bool]] = [
        (int(ts), "decode", None, True) for ts in graphs.tolist()
    ]
    last = None
    sequences: list[tuple[int, int]] = []
    for i in range(len(embedding)):
        ts = int(embedding.ts[i])
        # A second lookup before any matmul (a position embedding) is the same forward's.
        if last is not None and not _between(gemm_ts, last, ts) and not _between(graphs, last, ts):
            continue
        last = ts
        kind, tokens, seqs = _eager_kind(trace, embedding, i)
        rows.append((ts, kind, tokens, False))
        if seqs is not None:
            sequences.append((ts, seqs))
    # A graph replay records no shapes: it decodes one token for each sequence of the eager
    # forward before it (the prefill that started them, or the eager decode it was captured
    # from), an inference the evidence says.
    replayed_tokens = False
    if sequences:
        at = np.array([t for t, _ in sequences], np.int64)
        for r, (ts, kind, tokens, graph) in enumerate(rows):
            j = int(np.searchsorted(at, ts, side="right")) - 1
            if graph and tokens is None and j >= 0:
                rows[r] = (ts, kind, sequences[j][1], graph)
                replayed_tokens = True
    rows.sort()
    eager_decode = any(k == "decode" and not g for _, k, _, g in rows)
    llm = len(embedding) > 0 or bool(np.isin(ops.name, trace.codes_of(_ATTENTION)).any())
    if len(rows) < 2 or not (eager_decode or (graphs.size >= 2 and llm)):
        return None
    evidence = " and ".join(
        w
        for w, n in (
            ("CUDA/HIP graph launches (decode replayed)", graphs.size),
            (f"the model's first op ({_EMBEDDING}: its token ids)", len(embedding)),
        )
        if n
    ) + (
        "; a replay's tokens: one per sequence of the eager forward before it"
        if replayed_tokens
        else ""
    )
    return _Found(
        np.array([r[0] for r in rows], np.int64),
        [r[1] for r in rows],
        [r[2] for r in rows],
        [r[3] for r in rows],
        evidence,
    )


_LAYER_FORWARD = re.compile(
    r"^(?:model\.)?(?:layers?|blocks?|decoder_layers?|transformer_blocks?)[._\[]?(\d+)\]?"
    r"[._ ]?(?:forward|fwd)$",
    re.IGNORECASE,
)
"""A range around one decoder layer's forward (`layer_3_forward`, `layers.3.forward`): the
model's repeated layer sequence, where the engine names no iteration."""
_KV_READ = re.compile(r"kv[_ ]?(?:cache[_ ]?)?(?:fetch|read|load|h2d)", re.IGNORECASE)
"""A range that brings a layer's KV cache in before its attention: a forward over cached
tokens (decode), not the prompt's first pass, which writes the cache."""
_PHASE_WORDS: tuple[tuple[str, IterationKind], ...] = (
    ("prefill", "prefill"),
    ("prompt", "prefill"),
    ("decode", "decode"),
    ("generat", "decode"),
)


def _layer_passes(trace: Trace) -> _Found | None:
    """Iterations from the model's repeated layer sequence in the ranges (an Nsight export's
    NVTX `layer_<i>_forward`): a forward pass runs its layers in order, and the next pass
    starts where the layer index falls back. Its kind from the ranges inside it: a phase's
    name (prefill, decode), else a KV-cache read before attention (decode); else, with
    several passes, the first is the prompt's (prefill) and the rest per-token (decode)."""
    rows = trace.of_kind(Kind.ANNOTATION)
    codes = np.unique(rows.name).tolist()
    layer = {c: int(m[1]) for c in codes if (m := _LAYER_FORWARD.match(trace.strings[c]))}
    if len(set(layer.values())) < 2:
        return None
    mine = rows.take(np.flatnonzero(np.isin(rows.name, list(layer))))
    index = [layer[c] for c in mine.name.tolist()]
    starts = [0] + [i for i in range(1, len(index)) if index[i] <= index[i - 1]]
    start = mine.ts[starts].astype(np.int64)
    ends = np.concatenate([start[1:], [np.iinfo(np.int64).max]])
    kv = np.isin(rows.name, [c for c in codes if _KV_READ.search(trace.strings[c])])
    kinds: list[IterationKind] = []
    why = set()
    for a, b in zip(start.tolist(), ends.tolist(), strict=True):
        window = (rows.ts >= a) & (rows.ts < b)
        names = " ".join(trace.strings[c].lower() for c in np.unique(rows.name[window]).tolist())
        kind = next((k for w, k in _PHASE_WORDS if w in names), None)
        if kind is not None:
            why.add("the phase its ranges name")
        elif kv[window].any():
            kind = "decode"
            why.add("a KV-cache read before attention (a forward over cached tokens: decode)")
        kinds.append(kind or "unknown")
    if "unknown" in kinds and len(kinds) > 1:
        kinds = [
            "prefill" if i == 0 else "decode" if k == "unknown" else k for i, k in enumerate(kinds)
        ]
        why.add("the first pass over the prompt, one token per pass after it (inferred)")
    first = trace.strings[int(mine.name[0])]
    return _Found(
        start,
        kinds,
        [None] * len(kinds),
        [False] * len(kinds),
        f"the model's repeated layer sequence (ranges like {first!r}, layers "
        f"{min(index)}-{max(index)} per pass)"
        + (f"; kind from {' and '.join(sorted(why))}" if why else "; kind not shown"),
    )


def _between(sorted_ts: I64, a: int, b: int) -> bool:
    return bool(np.searchsorted(sorted_ts, b) > np.searchsorted(sorted_ts, a, side="right"))


def _eager_kind(
    trace: Trace, embedding: Events, i: int
) -> tuple[IterationKind, int | None, int | None]:
    """An eager forward's kind, tokens and sequences from its embedding's token ids:
    [sequences, tokens each]."""
    args = trace.op_args(int(embedding.input_dims[i]), int(embedding.input_type[i]))
    ids = args.tensor(1) if args is not None and args.size > 1 else None
    if ids is None or ids.ndim == 0:
        return "unknown", None, None
    if ids.ndim == 1:  # flattened tokens (varlen engines): the kind is not in the shape
        return "unknown", ids.numel, None
    return ("decode" if ids.shape[-1] == 1 else "prefill"), ids.numel, int(ids.shape[0])


class _Bytes(msgspec.Struct, frozen=True):
    """What one eager forward's recorded shapes say it reads and computes."""

    weights: float
    kv: float
    flops: float
    dtype: str | None
    kv_dtype: str | None = None


def _shapes(trace: Trace, start: I64, end: I64) -> list[_Bytes | None]:
    """Per host span [start, end): the bytes of its linear layers' weights, of its
    attention's K and V, and the linear layers' FLOPs (None: no linear layer recorded)."""
    ops = trace.of_kind(Kind.CPU_OP)
    linear = ops.take(np.flatnonzero(ops.name == trace.code_of(_LINEAR)))
    attention = ops.take(np.flatnonzero(np.isin(ops.name, trace.codes_of(_ATTENTION))))
    out: list[_Bytes | None] = []
    for a, b in zip(start.tolist(), end.tolist(), strict=True):
        weights = flops = kv = 0.0
        dtype = kv_dtype = None
        lo, hi = np.searchsorted(linear.ts, [a, b])
        for j in range(int(lo), int(hi)):
            args = trace.op_args(int(linear.input_dims[j]), int(linear.input_type[j]))
            x, w = (args.tensor(0), args.tensor(1)) if args and args.size > 1 else (None, None)
            if x is None or w is None or w.ndim != 2:
                continue
            weights += w.nbytes
            flops += 2.0 * (x.numel // max(x.shape[-1], 1)) * w.shape[0] * w.shape[1]
            dtype = w.dtype
        lo, hi = np.searchsorted(attention.ts, [a, b])
        for j in range(int(lo), int(hi)):
            args = trace.op_args(int(attention.input_dims[j]), int(attention.input_type[j]))
            for t in (args.tensor(1), args.tensor(2)) if args and args.size > 2 else ():
                kv += t.nbytes if t is not None else 0
                kv_dtype = t.dtype if t is not None else kv_dtype
        out.append(_Bytes(weights, kv, flops, dtype, kv_dtype) if weights > 0 else None)
    return out


def _judged(scope: Scope, engine: str | None, found: _Found) -> Serving:
    trace, dev = scope.trace, scope.gpu
    host = trace.extent(Kind.CPU_OP, Kind.RUNTIME, Kind.ANNOTATION, Kind.PYTHON)
    last = max(host[1] if host else 0, int(found.start[-1]) + 1)
    cpu_end = np.concatenate([found.start[1:], [last]]).astype(np.int64)
    labels = [f"iteration {k}" for k in range(found.start.size)]
    spans = StepSpans(labels, found.start, cpu_end, SERVING_ITERATIONS)
    start, end = gpu_windows(spans, dev.ops, dev.launch_ts)
    wb = breakdown(trace, dev, start, end, scope.thresholds.slack)
    duration = (end - start).astype(np.float64) * NS
    idle = wb.idle.astype(np.float64) * NS
    between = np.minimum(_before_first_op(found.start, cpu_end, dev, start, end) * NS, idle)
    busy = duration - idle
    # The first iteration of a kind whose time is mostly one-off start-up (library set-up,
    # code loading on first launches) is set aside: it says nothing of the steady ones.
    startup = wb.idle_causes.get("startup", np.zeros(start.size)) * NS
    first = np.zeros(start.size, dtype=bool)
    first[[found.kind.index(k) for k in set(found.kind)]] = True
    warmup = first & (startup > 0.5 * duration)
    shapes = _shapes(trace, found.start, cpu_end)
    iterations = [
        ServingIteration(
            kind=found.kind[i],
            start_s=float(start[i] - start[0]) * NS,
            duration_s=float(duration[i]),
            busy_s=float(busy[i]),
            tokens=found.tokens[i],
            graph=found.graph[i],
            warmup=bool(warmup[i]),
        )
        for i in range(start.size)
    ]
    kinds = []
    for kind in ("prefill", "decode", "mixed", "unknown"):
        every = [i for i in range(start.size) if found.kind[i] == kind]
        if not every:
            continue
        mine = [i for i in every if not warmup[i]] or every
        tokens = [found.tokens[i] for i in mine]
        kinds.append(
            IterationKinds(
                kind=kind,
                count=len(every),
                time_s=float(duration[mine].sum()),
                median_s=float(np.median(duration[mine])),
                busy_s=float(busy[mine].sum()),
                tokens=sum(t for t in tokens if t is not None) if None not in tokens else None,
                warmup=len(every) - len(mine),
            )
        )
    steady = ~warmup if (~warmup).any() else np.ones(start.size, dtype=bool)
    total = float(duration[steady].sum()) or 1.0
    decodes = [i for i in range(start.size) if found.kind[i] == "decode" and steady[i]]
    mfu, mfu_basis = _prefill(scope, found, shapes, np.where(steady, duration, 0.0))
    causes = {
        k: float(v[steady].sum()) * NS / total
        for k, v in wb.idle_causes.items()
        if v[steady].sum() > 0
    }
    decode, decode_note = _decode(scope, found, shapes, duration, busy, decodes)
    return Serving(
        engine=engine,
        evidence=found.evidence,
        iterations=iterations,
        kinds=kinds,
        decode=decode,
        decode_note=decode_note,
        prefill_mfu=mfu,
        prefill_basis=mfu_basis,
        # The device waiting on work already queued (an event another thread records, a
        # stream) is not the host's time between iterations: an overlap scheduler's wait.
        host_share=sum(v for k, v in causes.items() if k not in NOT_HOST),
        between_share=float(between[steady].sum()) / total,
        wait_share=sum(v for k, v in causes.items() if k in _WAITS),
        host_causes=causes,
        graph_coverage=sum(found.graph[i] for i in decodes) / len(decodes) if decodes else None,
        overlap=_overlap(trace, found.start, end),
        **_per_token(kinds, iterations),
    )


def _before_first_op(cpu_start: I64, cpu_end: I64, dev: DeviceOps, start: I64, end: I64) -> I64:
    """Per iteration window [start, end): the time before its first device op starts, from
    the last one of the iteration before (the windows' start): the device idle between two
    forward passes, while the engine schedules, prepares inputs, samples and processes
    output. A device op belongs to the iteration whose host span launched it."""
    of, mine = launched_in(cpu_start, cpu_end, dev.ops, dev.launch_ts)
    first = end.copy()
    np.minimum.at(first, of[mine], dev.ops.ts[mine])
    gap: I64 = np.clip(first, start, end) - start
    return gap


_WAITS = frozenset({"dependency_wait", "communication_wait"})
NOT_HOST = _WAITS | {"startup"}
"""Idle causes that are not the engine's host work between iterations: queued work waiting
(on an event, a stream, a peer) and one-off start-up."""

_OVERLAP_NAMES = (
    (
        "overlap_utils.py",
        "SGLang's overlap scheduler: its future token ids let it schedule the next batch "
        "while the GPU runs this one",
    ),
    ("record_batch_in_overlap", "SGLang's overlap scheduler"),
    ("event_loop_overlap", "SGLang's overlap scheduler"),
    ("async_scheduling", "vLLM's async scheduling"),
    ("AsyncGPUModelRunnerOutput", "vLLM's async output processing"),
    ("async_output", "vLLM's async output processing"),
)
"""Host frames or ranges that say the engine overlaps its host work with the device's."""


def _overlap(trace: Trace, start: I64, gpu_end: I64) -> str:
    """Evidence that the engine's host work runs beside the device's: an overlap
    scheduler's own frames, or the next iteration's host work starting before the device
    has finished this one ("" when neither)."""
    codes = trace.distinct_names(Kind.PYTHON, Kind.ANNOTATION, Kind.KERNEL)
    names = [trace.strings[c] for c in codes.tolist()]
    said = next((w for key, w in _OVERLAP_NAMES if any(key in n for n in names)), "")
    early = int((start[1:] < gpu_end[:-1]).sum()) if start.size > 1 else 0
    timed = (
        f"the next iteration's host work starts before the device finishes the current one "
        f"in {early} of {start.size - 1}"
        if early and 2 * early >= start.size - 1
        else ""
    )
    return "; ".join(w for w in (said, timed) if w)


def _per_token(kinds: list[IterationKinds], iterations: list[ServingIteration]) -> dict[str, Any]:
    """TTFT, TPOT and decode tokens/s estimated from the iterations (None: the trace cannot
    say), with how."""
    by = {k.kind: k for k in kinds}
    prefill, decode = by.get("prefill"), by.get("decode")
    ttft = prefill.median_s if prefill is not None else None
    tpot = decode.median_s if decode is not None and decode.count - decode.warmup >= 2 else None
    rate = (
        decode.tokens / decode.time_s
        if decode is not None and decode.tokens is not None and decode.time_s > 0
        else None
    )
    words = [
        "TTFT ~ the median prefill iteration (queueing before it not seen)"
        if ttft is not None
        else "TTFT unknown: no prefill iteration in the trace",
        "TPOT ~ the median decode iteration (one token per running sequence each)"
        if tpot is not None
        else "TPOT unknown: fewer than two decode iterations (a token's time is the time "
        "between iterations)",
    ]
    if rate is not None:
        words.append("tokens/s: decode's tokens over its iterations' time")
    return {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "tokens_per_s": rate,
        "per_token_basis": "; ".join(words),
    }


def _decode(
    scope: Scope,
    found: _Found,
    shapes: list[_Bytes | None],
    duration: npt.NDArray[np.float64],
    busy: npt.NDArray[np.float64],
    decodes: list[int],
) -> tuple[DecodeBandwidth | None, str]:
    """Bytes per decode iteration, from its own shapes, else from the eager forward before
    it (a graph replay records none), else weights from the user's parameter count; and why
    the bytes or the MBU are not known, or known only in part."""
    if not decodes:
        return None, ""
    weights: list[float] = []
    kv: list[float] = []
    kv_dtypes: list[str] = []
    borrowed = own = 0
    # A graph replay's own shapes are only its eager remainder (the LM head, sampling): the
    # whole model's are those of an eager forward.
    eager = [s if not g else None for s, g in zip(shapes, found.graph, strict=True)]
    for i in decodes:
        mine = eager[i]
        if mine is None:
            before = [s for s in eager[:i] if s is not None]
            mine = before[-1] if before else next((s for s in eager if s is not None), None)
            borrowed += mine is not None
        else:
            own += 1
        if mine is not None:
            weights.append(mine.weights)
            kv.append(mine.kv)
            kv_dtypes += [mine.kv_dtype] if mine.kv_dtype else []
    params = scope.model.params
    if weights:
        basis = "weights from the linear layers' shapes and KV from the attention's K and V " + (
            "in each eager decode iteration"
            if not borrowed
            else "in the eager forward before each graph replay (a replay records no "
            "shapes; its KV may differ)"
            if not own
            else "in the eager iterations (graph replays take the forward before theirs)"
        )
        w, k = float(np.median(weights)), float(np.median(kv))
    elif params is not None:
        w, k = 2.0 * params, 0.0
        basis = "weights from --params at 2 bytes each (16-bit); KV cache not known (no shapes)"
    else:
        return None, _no_bytes(scope.trace, found, decodes)
    total = w + k
    median = float(np.median(duration[decodes]))
    busy_median = float(np.median(busy[decodes]))
    peak = scope.spec.mem_bandwidth if scope.spec is not None else None
    bandwidth = total / median if median > 0 else 0.0
    note = (
        ""
        if peak
        else "MBU unknown: the device's peak bandwidth is not known (name it with --device); "
        "the achieved bandwidth stands"
    )
    if not weights:
        note = "; ".join(
            w for w in (note, "the KV cache's bytes are not counted (no attention shapes)") if w
        )
    return DecodeBandwidth(
        bytes_per_iteration=total,
        weight_bytes=w,
        kv_bytes=k if weights else None,
        basis=basis,
        median_s=median,
        bandwidth=bandwidth,
        mbu=bandwidth / peak if peak else None,
        busy_mbu=total / busy_median / peak if peak and busy_median > 0 else None,
        kv_dtype=kv_dtypes[-1] if kv_dtypes else None,
    ), note


def _no_bytes(trace: Trace, found: _Found, decodes: list[int]) -> str:
    """Why decode's bytes per iteration are not known."""
    shaped = bool((trace.of_kind(Kind.CPU_OP).input_dims != NONE).any())
    why = (
        "its iterations are CUDA/HIP graph replays, which record no shapes, and the trace "
        "holds no eager forward of the model to read the weights from"
        if all(found.graph[i] for i in decodes) and shaped
        else "the trace records no op shapes (record_shapes off, or an Nsight export)"
        if not shaped
        else "no linear layer with recorded shapes runs in its iterations"
    )
    return (
        f"decode's bytes per iteration, so its MBU, unknown: {why}; give the parameter count "
        "(--params N) to count the weights"
    )


def _prefill(
    scope: Scope, found: _Found, shapes: list[_Bytes | None], duration: npt.NDArray[np.float64]
) -> tuple[float | None, str]:
    """Prefill's MFU: its linear layers' FLOPs over its time, at the peak of their dtype."""
    mine = [
        i
        for i, k in enumerate(found.kind)
        if k == "prefill" and shapes[i] is not None and duration[i] > 0
    ]
    spec = scope.spec
    if not mine or spec is None:
        return None, ""
    flops = sum(s.flops for i in mine if (s := shapes[i]) is not None)
    dtype = next(s.dtype for i in mine if (s := shapes[i]) is not None)
    peak = spec.peak(dtype) if dtype else None
    if not peak:
        return None, f"no peak for {dtype}"
    return (
        flops / float(duration[mine].sum()) / peak,
        f"linear layers' FLOPs (2·M·N·K, attention not counted) at the {dtype} peak",
    )


def serving_verdict(
    verdict: Verdict, found: Serving, device: Device, steps: Steps, thresholds: Thresholds
) -> Verdict:
    """The verdict of a serving trace: its first question asked of its iterations where the
    steps are too few to answer it, its third and fourth of prefill and decode (decode by
    MBU, prefill by MFU) where the trace shows them; the wall unchanged."""
    if not found.kinds or len(verdict.questions) < 4:
        return verdict
    verdict = _stable_iterations(verdict, found, steps, thresholds)
    total = sum(k.busy_s for k in found.kinds) or 1.0
    split = ", ".join(f"{k.kind} {k.busy_s / total:.0%} ({k.count})" for k in found.kinds)
    q1, q2, q3, q4 = verdict.questions[:4]
    q3 = msgspec.structs.replace(
        q3,
        detail=f"{q3.detail}; serving: busy time by iteration kind (count): {split}",
    )
    words = []
    d = found.decode
    if d is not None:
        words.append(
            f"decode reads ~{d.bytes_per_iteration / 1e9:.2f} GB per iteration in "
            f"{d.median_s * 1e3:.2f} ms: {d.bandwidth / 1e12:.2f} TB/s"
            + (f", MBU {util_pct(d.mbu)} of peak bandwidth" if d.mbu is not None else "")
            + (f" ({util_pct(d.busy_mbu)} over its busy time)" if d.busy_mbu is not None else "")
            + f" (estimate: {d.basis})"
        )
    if found.prefill_mfu is not None:
        words.append(f"prefill at MFU {util_pct(found.prefill_mfu)} ({found.prefill_basis})")
    if words:
        q4 = msgspec.structs.replace(q4, detail=f"{q4.detail}; serving: {'; '.join(words)}")
    verdict = msgspec.structs.replace(verdict, questions=[q1, q2, q3, q4, *verdict.questions[4:]])
    return _decode_wall(verdict, found, device, total)


def _stable_iterations(
    verdict: Verdict, found: Serving, steps: Steps, thresholds: Thresholds
) -> Verdict:
    """A serving trace's unit of work is the engine iteration: where the profiled steps are
    too few to say whether the work is stable (a trace with no ProfilerStep is one window),
    the first question is asked of the iterations of its most common kind (each kind apart:
    a prefill and a decode are different work), and the steps' count no longer makes the
    verdict rest on thin evidence."""
    q1 = verdict.questions[0]
    if q1.answer != "unknown":
        return verdict
    kind = max(found.kinds, key=lambda k: k.count - k.warmup)
    times = np.array(
        [i.duration_s for i in found.iterations if i.kind == kind.kind and not i.warmup]
    )
    if times.size < thresholds.min_steps or times.mean() <= 0:
        return verdict
    cv = float(times.std() / times.mean())
    q1 = msgspec.structs.replace(
        q1,
        answer="yes" if cv <= thresholds.max_cv else "no",
        value=cv,
        detail=f"{q1.detail}; serving: {kind.kind} iterations' CV {cv:.1%} over {times.size} "
        "(an iteration is the engine's unit of work)",
    )
    thin = [t for t in verdict.thin_evidence if t != few_steps(steps.count)]
    return msgspec.structs.replace(
        verdict, questions=[q1, *verdict.questions[1:]], thin_evidence=thin
    )


def _decode_wall(verdict: Verdict, found: Serving, device: Device, busy_s: float) -> Verdict:
    """A busy serving step that is mostly decode is on the bandwidth wall, whatever share of
    it the matmul classes take: a decode iteration reads every weight and the KV cache to
    compute a few tokens, about `tokens` FLOPs per byte of bf16 weights, far below the
    device's ridge (its peak FLOP/s over its bandwidth) at any batch an engine runs. Its
    matmuls carry no shapes when a graph replays them, so the kernel roofline alone reads
    them as compute at peak. Only a verdict of the compute wall moves: overhead stays."""
    d = found.decode
    decode = next((k for k in found.kinds if k.kind == "decode"), None)
    if verdict.wall != "compute" or d is None or decode is None or not d.weight_bytes:
        return verdict
    if decode.busy_s < 0.5 * busy_s:
        return verdict
    tokens = [i.tokens for i in found.iterations if i.kind == "decode" and i.tokens]
    peaks = device.peak_flops or {}
    peak = peaks.get("bf16") or max(peaks.values(), default=0.0)  # the weights' 2-byte dtype
    if not tokens or not peak or not device.mem_bandwidth:
        return verdict
    batch = float(np.median(tokens))
    # 2 FLOPs per weight per token; bf16/fp16 weights: 2 bytes each.
    intensity = 2.0 * batch * (d.weight_bytes / 2.0) / d.bytes_per_iteration
    ridge = peak / device.mem_bandwidth
    if intensity >= ridge:
        return verdict
    mbu = "" if d.busy_mbu is None else f", MBU {util_pct(d.busy_mbu)} over its busy time"
    return msgspec.structs.replace(
        verdict,
        wall="bandwidth",
        cause="decode",
        reason=(
            f"decode takes {decode.busy_s / busy_s:.0%} of the serving busy time, streaming "
            f"weights and KV cache: each decode iteration reads "
            f"~{d.bytes_per_iteration / 1e9:.2f} GB for {batch:.0f} tokens: "
            f"about {intensity:.0f} FLOPs per byte against the device's ridge of "
            f"{ridge:.0f}, so decode is bound by memory bandwidth{mbu} (an estimate: "
            f"{d.basis}); the matmul kernels' own roofline read it as compute "
            f"({verdict.cause}) for want of shapes"
        ),
    )
