"""torch.compile: a graph break in the steady loop, named with the user's line."""

from __future__ import annotations

from wallfinder.analysis.compiled import break_cost, dynamo_record
from wallfinder.analysis.findings import Facts, amdahl, ms_text
from wallfinder.analysis.rules import rule
from wallfinder.diagnosis import Finding


@rule(Facts, id="graph-break")
def graph_break(f: Facts) -> Finding | None:
    """A graph break Dynamo reported (`wallfinder run` records them) whose resumed frame runs
    in the steady steps: each step leaves compiled code at the break, runs the code there
    eagerly, checks the next graph's guards and enters it. Found whatever its share, since
    Dynamo says it is there; bounded by the eager stretches at the breaks."""
    record = dynamo_record(f.trace.dynamo)
    if record is None or not record.graph_breaks:
        return None
    cost = break_cost(f.scope, record)
    if cost is None:
        return None
    share = f.share(min(cost.seconds_per_step / max(f.step_s, 1e-12), 1.0))
    where = "; ".join(
        (f"{b.file}:{b.line}" if b.file else "a line Dynamo did not name") + f" ({b.reason})"
        for b in record.graph_breaks[:3]
    )
    return Finding(
        id="graph-break",
        wall="overhead",
        title="A graph break splits the compiled model in the steady loop",
        share=share,
        max_speedup=amdahl(share),
        evidence=(
            f"graph break at {where}; {cost.resumes_per_step:g} resumed graph call(s) per step "
            f"after {ms_text(cost.seconds_per_step)} per step of eager code and guard checks "
            f"between the compiled graphs; Dynamo made {record.graphs} graphs of "
            f"{record.frames} frames"
        ),
        fix=(
            "keep the break's line out of the compiled code or make it traceable: no "
            "Python branch on a tensor's value (torch.where / torch.cond), no .item()/float() "
            "of a tensor inside the model (or torch._dynamo.config.capture_scalar_outputs = "
            "True), then check with torch._dynamo.explain(model)(inputs) or "
            "torch.compile(fullgraph=True)"
        ),
    )
