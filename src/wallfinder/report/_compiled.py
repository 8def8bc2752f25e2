"""The torch.compile section in plain sentences, shared by the terminal, Markdown and HTML:
the compiled and eager regions compared, the fused kernels, the compile as a one-off cost,
and what Dynamo counted (graphs, graph breaks with their lines, recompiles with their
guards)."""

from __future__ import annotations

from wallfinder.diagnosis import CodeRegion, Diagnosis


def compiled_head(d: Diagnosis) -> str:
    """One line ("" when the diagnosis has no compiled code)."""
    c = d.compiled
    if c is None:
        return ""
    parts = []
    if c.share is not None:
        parts.append(f"{c.share:.0%} of the steady steps' work in compiled regions")
    if c.compile_s > 0 or (c.dynamo is not None and c.dynamo.compile_s > 0):
        seconds = max(c.compile_s, c.dynamo.compile_s if c.dynamo is not None else 0.0)
        parts.append(f"compiling took {seconds:.2f} s (one-off, not in the steady state)")
    if not c.regions and c.eager is None:
        parts.append("Inductor kernels, no compiled region recorded")
    return "torch.compile" + (": " + "; ".join(parts) if parts else "")


def _region(r: CodeRegion) -> str:
    device = (
        f", device {r.device_per_call_s * 1e3:.3f} ms and {r.kernels_per_call:g} kernels per call"
        if r.kernels_per_call
        else ""
    )
    return f"{r.name}: {r.calls} calls, {r.time_per_call_s * 1e3:.3f} ms per call{device}"


def compiled_lines(d: Diagnosis) -> list[str]:
    """The regions, their comparison, the fused kernels, then Dynamo's counts, one item per
    line."""
    c = d.compiled
    if c is None:
        return []
    lines = [_region(r) for r in c.regions]
    if c.eager is not None:
        ops = " → ".join(c.eager.ops[:8]) + (" …" if len(c.eager.ops) > 8 else "")
        lines.append(f"{_region(c.eager)} (outside the compiled regions: {ops})")
    if c.speedup is not None:
        lines.append(f"compiled vs eager: {c.speedup:.2f}x faster per call")
    if c.compiling_calls:
        lines.append(
            f"{c.compiling_calls} region call(s) compiled or autotuned: set aside as one-off"
        )
    lines += [
        f"{k.name} ({k.kind}"
        + (f") fuses {' + '.join(k.ops)}" if k.ops else ", its ops unnamed)")
        + f": {k.calls} calls, "
        f"{k.time_s * 1e3:.3f} ms in all"
        for k in c.kernels
    ]
    dyn = c.dynamo
    if dyn is None:
        return lines
    lines.append(
        f"Dynamo: {dyn.frames} frames compiled into {dyn.graphs} graphs, "
        f"{dyn.break_count} graph break(s), {len(dyn.recompiles)} recompile(s), "
        f"{dyn.compile_s:.2f} s compiling (one-off)"
    )
    for b in dyn.graph_breaks:
        where = f" at {b.file}:{b.line}" if b.file else ""
        lines.append(f"graph break{where} (×{b.count}): {b.reason}")
    for r in dyn.recompiles:
        where = f" ({r.file}:{r.line})" if r.file else ""
        lines.append(
            f"recompile {r.compile_id} of {r.function}{where}, {r.seconds:.2f} s: "
            f"{r.recompile_reason}"
        )
    return lines
