"""The serving section in plain sentences, shared by the terminal and Markdown: the engine's
iterations by kind, decode against the memory bandwidth (MBU), prefill's MFU, the host time
between iterations and decode's CUDA-graph coverage. Every figure is the diagnosis's."""

from __future__ import annotations

from wallfinder.diagnosis import Diagnosis, IterationKinds, Serving
from wallfinder.units import util_pct


def serving_head(d: Diagnosis) -> str:
    """One line ("" when the trace is not a serving trace)."""
    s = d.serving
    if s is None:
        return ""
    who = f"{s.engine} " if s.engine else ""
    if not s.iterations:
        return f"LLM serving: {who}trace with no iterations"
    counts = ", ".join(f"{k.count} {k.kind}" for k in s.kinds)
    return f"LLM serving: {len(s.iterations)} {who}iterations ({counts})"


def _kind(k: IterationKinds) -> str:
    tokens = f", {k.tokens} tokens" if k.tokens is not None else ""
    aside = f" ({k.warmup} start-up iteration set aside)" if k.warmup else ""
    return (
        f"{k.kind}: {k.count} iterations, median {k.median_s * 1e3:.2f} ms, "
        f"{k.time_s * 1e3:.1f} ms in all, GPU busy {k.busy_s * 1e3:.1f} ms{tokens}{aside}"
    )


def serving_lines(d: Diagnosis) -> list[str]:
    """The evidence, each kind, decode's bandwidth, prefill's MFU, the host's time."""
    s = d.serving
    if s is None:
        return []
    if s.note:
        return [s.note]
    out = [f"iterations found from {s.evidence}", *(_kind(k) for k in s.kinds)]
    b = s.decode
    if b is not None:
        parts = []
        if b.weight_bytes is not None:
            parts.append(f"weights {b.weight_bytes / 1e9:.2f} GB")
        if b.kv_bytes is not None:
            parts.append(f"KV cache {b.kv_bytes / 1e9:.2f} GB")
        mbu = (
            f"MBU {util_pct(b.mbu)} of the peak bandwidth"
            + (
                f" ({util_pct(b.busy_mbu)} over the GPU's busy time)"
                if b.busy_mbu is not None
                else ""
            )
            if b.mbu is not None
            else "MBU unknown (device unknown)"
        )
        out.append(
            f"decode reads ~{b.bytes_per_iteration / 1e9:.2f} GB per iteration "
            f"({', '.join(parts)}) in {b.median_s * 1e3:.2f} ms: "
            f"{b.bandwidth / 1e12:.2f} TB/s, {mbu} — an estimate: {b.basis}"
        )
    if s.decode_note:
        out.append(s.decode_note)
    if s.prefill_mfu is not None:
        out.append(f"prefill at MFU {util_pct(s.prefill_mfu)} ({s.prefill_basis})")
    causes = ", ".join(
        f"{k.replace('_', ' ')} {v:.0%}"
        for k, v in sorted(s.host_causes.items(), key=lambda kv: -kv[1])
    )
    out.append(
        f"the GPU idles {s.host_share:.0%} of the iterations' time for the host, "
        f"{min(s.between_share, s.host_share):.0%} between forward passes (the engine's "
        "scheduling, input preparation, sampling, Python)"
        + (
            f" and {s.wait_share:.0%} with its next work queued (waiting on an event or "
            "another stream: not host time)"
            if s.wait_share
            else ""
        )
        + (f"; every idle cause: {causes}" if causes else "")
    )
    if s.overlap:
        out.append(f"overlapped: the engine's host work runs beside the GPU's ({s.overlap})")
    if s.graph_coverage is not None:
        out.append(f"{s.graph_coverage:.0%} of decode iterations replayed from a CUDA/HIP graph")
    out.append(_per_token_line(s))
    return out


def _per_token_line(s: Serving) -> str:
    figures = [
        f"{name} ~{v * 1e3:.2f} ms"
        for name, v in (("TTFT", s.ttft_s), ("TPOT", s.tpot_s))
        if v is not None
    ]
    if s.tokens_per_s is not None:
        figures.append(f"{s.tokens_per_s:,.0f} decode tokens/s")
    head = f"per token (estimates): {', '.join(figures)}" if figures else "per token"
    return f"{head} — {s.per_token_basis}"
