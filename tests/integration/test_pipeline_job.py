"""A real pipeline-parallel job: torch.distributed.pipelining's GPipe schedule over 2 stages
with 2 microbatches, on the CPU with gloo, profiled by `wallfinder run -- torchrun`. Its
stages wait for each other in send/recv: the pipeline's bubble, (p−1)/(m+p−1) = 1/3 by
theory, which the diagnosis names with its fix (more microbatches, another schedule), not
"exposed communication" to overlap. How long each stage waits is a measured figure of a busy
machine: the test checks what is said of it, not its size."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from wallfinder.cli import main

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

JOB = Path(__file__).parent.parent / "data" / "jobs" / "pipeline_gpipe.py"


def torchrun() -> str | None:
    beside = Path(sys.executable).with_name("torchrun")
    return shutil.which("torchrun") or (str(beside) if os.access(beside, os.X_OK) else None)


@pytest.mark.skipif(torchrun() is None, reason="torchrun is not installed")
def test_a_gpipe_job_is_diagnosed_by_its_bubble_against_the_schedules_theory(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from wallfinder.api import analyze

    monkeypatch.setenv("COLUMNS", "200")
    traces = tmp_path / "traces"
    argv = ["run", "--steps", "3", "--warmup", "2", "--trace-dir", str(traces)]
    code = main([*argv, "--", str(torchrun()), "--nproc-per-node", "2", str(JOB)])
    assert code == 0
    out, _ = capfd.readouterr()
    assert "• Pipeline stages wait for each other (the bubble)" in out
    for rank in (0, 1):
        d = analyze(traces / f"trace_rank{rank}.json")
        top = d.findings[0]
        assert top.id == "pipeline-bubble"
        said = f"a pipelined step (2 microbatches per step, 2 stages): {top.share:.0%} of each step"
        assert top.evidence.startswith(said)
        assert "(p−1)/(m+p−1) = 33% of the step" in top.evidence
        assert "m=4 leaves 20%, m=8 leaves 11%" in top.fix
        assert "1F1B" in top.fix
        assert all(f.id != "exposed-comm" for f in d.findings)
