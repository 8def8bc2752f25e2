"""The parallelism section in plain sentences, shared by the terminal, Markdown and HTML."""

from __future__ import annotations

from wallfinder.diagnosis import COLLECTIVE_WORDS, Diagnosis, ProcessGroup


def parallelism_head(d: Diagnosis) -> str:
    """One line: the strategies found ("" when the diagnosis has no parallelism)."""
    p = d.parallelism
    if p is None:
        return ""
    if not p.strategies:
        return "Parallelism: no strategy recognised"
    return "Parallelism: " + " + ".join(s.name for s in p.strategies)


def parallelism_lines(d: Diagnosis) -> list[str]:
    """Each strategy with its evidence, then the process groups, one item per line."""
    p = d.parallelism
    if p is None:
        return []
    lines = [f"{s.name}, {s.title}: " + "; ".join(s.evidence) for s in p.strategies]
    lines += [group_line(g) for g in p.groups]
    if p.frameworks:
        lines.append("framework ranges: " + ", ".join(p.frameworks))
    return lines


def group_line(g: ProcessGroup) -> str:
    label = g.name + (f" ({g.description})" if g.description else "")
    size = f" of {g.size} ranks" if g.size is not None else ""
    calls = ", ".join(f"{COLLECTIVE_WORDS.get(k, k)} ×{n:g}" for k, n in g.collectives.items())
    return f"process group {label}{size}" + (f": {calls} per step" if calls else "")
