"""Real pipeline-parallel jobs: torch.distributed.pipelining's GPipe schedule over 2 stages
with 2 microbatches (and its 1F1B schedule with 4), on the CPU with gloo, profiled by
`wallfinder run -- torchrun`. Their stages wait for each other in send/recv: the pipeline's
bubble, (p−1)/(m+p−1) by theory (1/3 for GPipe's 2), which the diagnosis names with its fix
(more microbatches, another schedule), not "exposed communication" to overlap. How long each
stage waits is a measured figure of a busy machine: the test checks what is said of it, not
its size."""

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
@pytest.mark.parametrize(
    ("args", "said", "theory", "more"),
    [
        ((), "2 microbatches per step, 2 stages", "33%", "m=4 leaves 20%, m=8 leaves 11%"),
        # Schedule1F1B records no ranges: m is counted from the send/recv calls.
        (
            ("1f1b", "4"),
            "4 microbatches per step, 2 stages; m counted from the send/recv calls",
            "20%",
            "m=8 leaves 11%, m=16 leaves 6%",
        ),
    ],
    ids=["gpipe", "1f1b"],
)
def test_a_pipeline_job_is_diagnosed_by_its_bubble_against_the_schedules_theory(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    said: str,
    theory: str,
    more: str,
) -> None:
    from wallfinder.api import analyze

    monkeypatch.setenv("COLUMNS", "200")
    traces = tmp_path / "traces"
    argv = ["run", "--steps", "3", "--warmup", "2", "--trace-dir", str(traces)]
    code = main([*argv, "--", str(torchrun()), "--nproc-per-node", "2", str(JOB), *args])
    assert code == 0
    out, _ = capfd.readouterr()
    assert "• Pipeline stages wait for each other (the bubble)" in out
    for rank in (0, 1):
        d = analyze(traces / f"trace_rank{rank}.json")
        top = d.findings[0]
        assert top.id == "pipeline-bubble"
        assert top.evidence.startswith(f"a pipelined step ({said}")
        assert f"): {top.share:.0%} of each step" in top.evidence
        assert f"(p−1)/(m+p−1) = {theory} of the step" in top.evidence
        assert more in top.fix
        assert "1F1B" in top.fix
        assert all(f.id != "exposed-comm" for f in d.findings)
        # Twice the microbatches, replayed: the bubble waits shrink, the step with them; the
        # finding's gain is that replay, within its bound.
        path = d.critical_path
        assert path is not None
        (row,) = [r for r in path.what_if if r.change == "microbatches"]
        assert row.step_s < path.replayed_step_s
        assert top.gain_basis == "replay"
        assert top.replay_speedup is not None
        assert 1.0 < top.replay_speedup <= top.max_speedup
        assert any(n.startswith("microbatches: the pipeline's m=") for n in path.notes)
        # The verdict's words name the bubble where it is the exposed communication.
        if d.verdict.cause == "comm_exposed":
            m = said.split(" ")[0]
            assert d.verdict.mechanism == (
                f"the pipeline bubble (2 stages, {m} microbatches: {theory} by theory)"
            )
