"""The invariants every diagnosis keeps (`Diagnosis.violations`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wallfinder.diagnosis._result import Diagnosis
    from wallfinder.diagnosis._step import Modules, Phases


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
    held = [c.busy for c in d.classes if c.busy is not None]
    if held and abs(sum(held) - 1.0) > SUM_TOLERANCE:
        out.append("the classes' holds on the busy time do not sum to 1")
    for c in d.classes:
        if c.busy is not None and not (_fraction(c.busy) and 0 <= c.streaming <= c.busy):
            out.append(f"class {c.cls}: busy {c.busy}, streaming {c.streaming}")
        if not 0 <= c.beside <= c.share * (1 + SUM_TOLERANCE):
            out.append(f"class {c.cls}: beside {c.beside} is not within its share {c.share}")
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
