"""LLM serving (issue 34): the levers of an inference engine, read from its iterations
(`analysis/serving.py`). Decode too small a batch for the bandwidth it pays for, prefill
chunks holding decode back, the GPU idle for the engine's host work between forward passes,
a 16-bit KV cache where fp8 halves its bytes, and decode run eagerly where a graph would
replay it. Only a serving trace has iterations: a training trace never makes these.

Each share is of the recurring step (the trace's window when, as in every engine profile,
it has no ProfilerStep); each bound is Amdahl's over that share."""

from __future__ import annotations

from wallfinder.analysis.findings import Facts, amdahl, make_finding, ms_text
from wallfinder.analysis.rules import rule
from wallfinder.analysis.serving import NOT_HOST
from wallfinder.diagnosis import Finding, IterationKinds, Serving
from wallfinder.units import util_pct

_FP8_KV = frozenset({"bf16", "fp16", "fp32"})
"""KV cache dtypes that an fp8 cache at least halves."""


def _kind(s: Serving, kind: str) -> IterationKinds | None:
    return next((k for k in s.kinds if k.kind == kind), None)


def _share(f: Facts, seconds: float) -> float:
    """`seconds` lost over the whole trace as a share of the recurring step."""
    per_step = seconds / max(f.steps.count, 1)
    return f.share(per_step / f.step_s) if f.step_s > 0 else 0.0


def _steady_seconds(s: Serving) -> float:
    return sum(k.time_s for k in s.kinds)


@rule(Facts, id="serving-small-batch")
def serving_small_batch(f: Facts) -> Finding | None:
    """Decode reads every weight once per iteration for each token of its batch: with few
    sequences running, that read is shared by few tokens and the iteration runs below the
    bandwidth that bounds it. A larger batch costs the iteration little and multiplies the
    tokens it makes."""
    s, t = f.serving, f.thresholds.serving
    d = s.decode if s is not None else None
    decode = _kind(s, "decode") if s is not None else None
    if s is None or d is None or decode is None or d.busy_mbu is None:
        return None
    steady = decode.count - decode.warmup
    if decode.tokens is None or steady <= 0:
        return None
    batch = decode.tokens / steady
    if batch > t.small_batch or d.busy_mbu >= t.low_mbu:
        return None
    below = decode.busy_s * (1.0 - d.busy_mbu)
    share = _share(f, below)
    return make_finding(
        f,
        "serving-small-batch",
        "bandwidth",
        "Decode batches too few sequences for the bandwidth it reads",
        share,
        f"decode iterations run ~{batch:.0f} tokens each (one per running sequence) and read "
        f"~{d.bytes_per_iteration / 1e9:.2f} GB each at MBU {util_pct(d.busy_mbu)} of the peak "
        f"bandwidth over the GPU's busy time; {ms_text(below)} of decode's busy "
        f"{ms_text(decode.busy_s)} is below the bandwidth roof ({share:.0%} of the step; "
        f"an estimate: {d.basis})",
        "run more sequences per decode iteration: raise the engine's batch limit (vLLM "
        "--max-num-seqs, SGLang --max-running-requests) and the clients' concurrency, and "
        "leave the KV cache room for them (vLLM --gpu-memory-utilization, SGLang "
        "--mem-fraction-static); the weights' read is then shared by more tokens, so tokens "
        "per second grow at about the same iteration time",
        speedup=amdahl(share),
    )


@rule(Facts, id="serving-prefill-interference")
def serving_prefill_interference(f: Facts) -> Finding | None:
    """Mixed (chunked-prefill) iterations much slower than pure decode: the running
    sequences' next tokens wait for the prompt chunk computed beside them."""
    s, t = f.serving, f.thresholds.serving
    if s is None:
        return None
    mixed, decode = _kind(s, "mixed"), _kind(s, "decode")
    if mixed is None or decode is None or decode.median_s <= 0:
        return None
    ratio = mixed.median_s / decode.median_s
    if ratio < t.interference:
        return None
    steady = mixed.count - mixed.warmup
    excess = (mixed.median_s - decode.median_s) * steady
    share = _share(f, excess)
    return make_finding(
        f,
        "serving-prefill-interference",
        "compute",
        "Prefill chunks hold decode back",
        share,
        f"{steady} mixed iterations (a prompt chunk beside the running decodes) take a median "
        f"{ms_text(mixed.median_s)}, {ratio:.1f}x the pure decode's {ms_text(decode.median_s)}: "
        f"the running sequences wait {ms_text(excess)} in all for the prompts' chunks "
        f"({share:.0%} of the step)",
        "bound the prefill work per iteration: a smaller chunked-prefill size (vLLM "
        "--max-num-batched-tokens, SGLang --chunked-prefill-size) keeps each mixed iteration "
        "near a decode's time at the cost of a longer time to first token; with many long "
        "prompts, disaggregate prefill from decode (separate instances)",
        speedup=amdahl(share),
    )


@rule(Facts, id="serving-host-bound")
def serving_host_bound(f: Facts) -> Finding | None:
    """The GPU idle between forward passes for the engine's host work: scheduling, input
    preparation, sampling, detokenisation, Python. Queued work waiting on an event (an
    overlap scheduler's other thread) is not counted: that is overlap, not a wall."""
    s = f.serving
    if s is None or s.engine is None or not s.kinds:
        return None
    # Only the idle between forward passes is the engine's loop: idle between one forward's
    # launches is the launch path's (`launch-bound`, CUDA graphs), whatever engine runs it.
    between = min(s.between_share, s.host_share)
    seconds = between * _steady_seconds(s)
    # Never more than the step's own host-caused idle: the iterations may hold time the
    # step leaves out (a one-off start-up inside the first one), and the bound is of the step.
    host = sum(v for k, v in f.breakdown.idle_causes.items() if k not in NOT_HOST)
    share = min(_share(f, seconds), f.share(host))
    if share <= 0:
        return None
    inside = s.host_share - between
    overlap = (
        f"; the engine already overlaps ({s.overlap}): what is left is host work it does not hide"
        if s.overlap
        else "; no overlap of the host's work with the GPU's is seen"
    )
    return make_finding(
        f,
        "serving-host-bound",
        "overhead",
        f"{s.engine}'s host work between iterations leaves the GPU idle",
        share,
        f"between forward passes the GPU idles {between:.0%} of the "
        f"iterations' time ({ms_text(seconds)}) while {s.engine}'s host prepares inputs, "
        f"schedules and samples{overlap}"
        + (
            f"; the GPU's other {inside:.0%} idle for the host is inside the forward passes, "
            "between their launches (the launch path's)"
            if inside >= 0.005
            else ""
        ),
        "overlap the host with the GPU: vLLM --async-scheduling (the next step scheduled "
        "while this one runs) and its output processing off the loop; SGLang's overlap "
        "scheduler (on unless --disable-overlap-schedule); fewer host calls per iteration "
        "(CUDA graphs cover the forward's launches), detokenisation in its own process",
        speedup=amdahl(share),
    )


@rule(Facts, id="serving-kv-dtype")
def serving_kv_dtype(f: Facts) -> Finding | None:
    """A 16-bit KV cache that is a real share of what decode reads: an fp8 cache halves its
    bytes, and decode, bound by its bytes, about as much of their time."""
    s, t = f.serving, f.thresholds.serving
    d = s.decode if s is not None else None
    decode = _kind(s, "decode") if s is not None else None
    if d is None or decode is None or not d.kv_bytes or d.kv_dtype not in _FP8_KV:
        return None
    part = d.kv_bytes / d.bytes_per_iteration
    if part < t.kv_share:
        return None
    # fp8 keeps half of a 16-bit cache's bytes (a quarter of fp32's): decode's busy time,
    # bound by its bytes, loses that part of the KV's share.
    saved = part * (0.75 if d.kv_dtype == "fp32" else 0.5)
    seconds = decode.busy_s * saved
    share = _share(f, seconds)
    return make_finding(
        f,
        "serving-kv-dtype",
        "bandwidth",
        f"Decode reads its KV cache in {d.kv_dtype}",
        share,
        f"the KV cache is {part:.0%} of the ~{d.bytes_per_iteration / 1e9:.2f} GB each decode "
        f"iteration reads ({d.kv_bytes / 1e9:.2f} GB, {d.kv_dtype}); an fp8 cache saves "
        f"~{ms_text(seconds)} of decode's busy {ms_text(decode.busy_s)} ({share:.0%} of the "
        f"step; an estimate: {d.basis})",
        "store the KV cache in fp8 (vLLM --kv-cache-dtype fp8, SGLang --kv-cache-dtype "
        "fp8_e4m3), which halves its bytes and doubles the sequences that fit; check the "
        "model's accuracy with it (scaled fp8 where the engine calibrates the scales)",
        speedup=amdahl(share),
    )


@rule(Facts, id="serving-eager-decode")
def serving_eager_decode(f: Facts) -> Finding | None:
    """Decode iterations run eagerly, each launching the whole forward from Python, where a
    CUDA graph would replay them with one launch: their GPU idle is the launches' and the
    host's time."""
    s = f.serving
    if s is None or s.graph_coverage is None or s.graph_coverage >= 1.0:
        return None
    eager = [i for i in s.iterations if i.kind == "decode" and not i.graph and not i.warmup]
    if len(eager) < 2:
        return None
    idle = sum(max(i.duration_s - i.busy_s, 0.0) for i in eager)
    share = _share(f, idle)
    return make_finding(
        f,
        "serving-eager-decode",
        "overhead",
        "Decode runs eagerly where a CUDA graph would replay it",
        share,
        f"{len(eager)} decode iterations ({1.0 - s.graph_coverage:.0%} of them) launch their "
        f"forward eagerly; the GPU idles {ms_text(idle)} in them waiting for the launches "
        f"and the host ({share:.0%} of the step)",
        "replay decode from CUDA graphs: vLLM without --enforce-eager (and a capture size "
        "that covers the batch), SGLang without --disable-cuda-graph (--cuda-graph-max-bs at "
        "least the batch), Hugging Face generate with a static KV cache and torch.compile "
        '(mode="reduce-overhead")',
        speedup=amdahl(share),
    )
