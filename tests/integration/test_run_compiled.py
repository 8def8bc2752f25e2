"""`wallfinder run` of a torch.compile'd training loop on the CPU (Inductor): the graph break
named with its file:line, the recompile a batch-size change causes with its guard, and the
compile time as a one-off cost, from what Dynamo itself counted (issue 33)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from wallfinder.capture.run import RunSettings, run_program
from wallfinder.measure import diagnose_run
from wallfinder.report import render

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROGRAM = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 8)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if float(h.mean()) > 1e9:  # data-dependent: a graph break
            h = h * 0
        return self.b(h)


torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = torch.compile(model)
for n in [16] * 5 + [24] * 5:  # the batch size changes once: a recompile
    loss = step(torch.randn(n, 32)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""
BREAK_LINE = 13


def test_a_compiled_job_names_its_graph_break_recompile_and_compile_time(
    tmp_path: Path,
) -> None:
    program = tmp_path / "train.py"
    program.write_text(PROGRAM)
    outcome = run_program(
        [sys.executable, str(program)], RunSettings(steps=4, warmup=3), tmp_path / "traces"
    )
    assert outcome.exit_code == 0, outcome.notes
    d = diagnose_run(outcome)
    assert d is not None
    assert d.compiled is not None
    dyn = d.compiled.dynamo
    assert dyn is not None
    assert dyn.graphs >= 2
    assert dyn.compile_s > 0
    [brk] = dyn.graph_breaks
    assert (brk.file, brk.line) == ("train.py", BREAK_LINE)
    assert "item()" in brk.reason
    sizes = [r for r in dyn.recompiles if "size mismatch" in (r.recompile_reason or "")]
    assert sizes
    assert all(r.file == "train.py" for r in sizes)
    # The step that recompiled for the new batch size is a one-off, set aside, never read
    # as the steady state (it made the steps "unstable").
    recompiled = [s for s in d.steps.dropped if s.reason.startswith("compiled for ")]
    assert recompiled, d.steps.dropped
    steady = [b.duration_s for b in d.breakdown.steps if not b.warmup]
    assert steady
    assert max(steady) < recompiled[0].duration_s / 2
    # The break runs in every steady step: a finding, with its line.
    [finding] = [f for f in d.findings if f.id == "graph-break"]
    assert f"train.py:{BREAK_LINE}" in finding.evidence
    text = render(d, "text")
    assert f"graph break at train.py:{BREAK_LINE}" in text
    assert "one-off" in text
    # No machine path reaches the trace or the report.
    raw = outcome.traces[0].read_text()
    # Compiled code opens no module range, and the hooks would make Dynamo recompile: no
    # module step is recorded for a compiled program.
    assert "wallfinder_module_step" not in raw
    assert str(tmp_path) not in d.compiled.to_json()
    assert str(tmp_path) not in text
    assert str(program) not in raw.split('"wallfinder_dynamo"', 1)[-1][:4000]
