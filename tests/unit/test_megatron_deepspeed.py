"""3D-parallel GPU jobs read by their strategy (issue 32): a Megatron TP2/PP2/DP2 job on 8
A800s whose stage 0 waits in NCCL SendRecv for its neighbour is the pipeline's bubble, not a
data-parallel gradient sync to overlap (it was: "exposed communication 48%" with DDP advice),
with p from Megatron's process groups or the SendRecv kernels' own arguments and m from its
`forward_step` frames."""

from __future__ import annotations

from pathlib import Path

import pytest

from paralleljobs import megatron_rank, zero_rank
from wallfinder import Options, analyze
from wallfinder.diagnosis import Diagnosis, Finding


def finding(d: Diagnosis, id: str) -> Finding | None:
    return next((f for f in d.findings if f.id == id), None)


@pytest.mark.parametrize("descs", [True, False], ids=["pg-descs", "kernel-args"])
def test_megatron_stage_0_waiting_in_sendrecv_is_the_pipeline_bubble(
    tmp_path: Path, descs: bool
) -> None:
    d = analyze(megatron_rank(0, descs=descs).write(tmp_path / "rank0.json"))
    top = d.findings[0]
    assert top.id == "pipeline-bubble"
    # 1 + 156 + 97 ms of each 622 ms step in SendRecv with nothing beside it.
    assert top.share == pytest.approx(254 / 622, abs=1e-3)
    assert "2 microbatches per step, 2 stages" in top.evidence
    assert "(p−1)/(m+p−1) = 33% of the step" in top.evidence
    assert d.verdict.mechanism == "the pipeline bubble (2 stages, 2 microbatches: 33% by theory)"
    # What is left of the exposed communication is the gradient sync's and the norm's.
    comm = finding(d, "exposed-comm")
    assert comm is not None
    assert comm.share == pytest.approx(46 / 622, abs=1e-3)
    assert d.parallelism is not None
    assert d.parallelism.names == ["DDP", "TP", "PP"]
    pp = next(s for s in d.parallelism.strategies if s.name == "PP")
    assert "forward_step ×2/step" in pp.evidence[0]
    tp = next(s for s in d.parallelism.strategies if s.name == "TP")
    assert any("Megatron-style tensor-parallel layers" in e for e in tp.evidence)
    assert "Megatron" in d.parallelism.frameworks  # its own frames name it


def test_megatron_without_python_stacks_is_a_bubble_of_unknown_m(tmp_path: Path) -> None:
    """Without the frames the trace holds no microbatch count, but its process groups name
    the pipeline's: the SendRecv wait is still the bubble, said with m unknown and no theory
    to read it against, and no `microbatches` what-if (it needs m)."""
    d = analyze(megatron_rank(0, stacks=False).write(tmp_path / "rank0.json"))
    bubble = finding(d, "pipeline-bubble")
    assert bubble is not None
    assert bubble.share == pytest.approx(254 / 622, abs=1e-3)
    assert "m unknown per step, 2 stages" in bubble.evidence
    assert "so m and the schedule's bubble (p−1)/(m+p−1) are unknown" in bubble.evidence
    assert d.verdict.mechanism == "the pipeline bubble (2 stages, m unknown)"
    assert d.critical_path is not None
    assert "microbatches" not in [r.change for r in d.critical_path.what_if]
    assert d.parallelism is not None
    assert "PP" in d.parallelism.names
    # Its layer names (ColumnParallelLinear, ...) say tensor parallel but not Megatron:
    # vLLM and SGLang borrow them, so the framework is named from a `megatron` path alone.
    tp = next(s for s in d.parallelism.strategies if s.name == "TP")
    assert any("Megatron-style tensor-parallel layers" in e for e in tp.evidence)
    assert "Megatron" not in d.parallelism.frameworks


def test_without_stacks_or_a_described_group_send_recv_is_not_called_a_bubble(
    tmp_path: Path,
) -> None:
    """SendRecv kernels alone (their group size recorded, no pipeline group described, no
    frames) could be a pipeline's or a ring's: no bubble is claimed."""
    d = analyze(megatron_rank(0, stacks=False, descs=False).write(tmp_path / "rank0.json"))
    assert finding(d, "pipeline-bubble") is None


def test_the_last_stage_waits_less_than_the_schedule(tmp_path: Path) -> None:
    d = analyze(megatron_rank(4).write(tmp_path / "rank4.json"))
    bubble = finding(d, "pipeline-bubble")
    assert bubble is not None
    assert bubble.share == pytest.approx(63 / 622, abs=1e-3)
    assert "another stage waits for it" in bubble.evidence


def test_the_job_names_its_slowest_stage_and_what_a_balanced_split_saves(
    tmp_path: Path,
) -> None:
    """The 8 ranks as one job: stage 1 (ranks 4–7) computes 60 + 120 ms of GEMMs a
    microbatch where stage 0 computes 50 + 100 (their tensor-parallel all-reduces aside), so
    its 360 ms a step are 30 ms (9%) over the 330 ms mean; the split at the mean saves at
    least those 30 ms of the 622 ms step."""
    for rank in range(8):
        megatron_rank(rank).write(tmp_path / f"rank{rank}.json")
    d = analyze(tmp_path)
    imbalance = finding(d, "pipeline-imbalance")
    assert imbalance is not None
    assert imbalance.share == pytest.approx(30 / 622, abs=1e-3)
    assert "rank 0 300.00 ms (100.00 ms forward, 200.00 ms backward), bubble 41%" in (
        imbalance.evidence
    )
    assert "rank 4 360.00 ms (120.00 ms forward, 240.00 ms backward), bubble 10%" in (
        imbalance.evidence
    )
    assert "rank 4's stage is the slowest, 30.00 ms (9%) over their mean of 330.00 ms" in (
        imbalance.evidence
    )
    assert "an estimate from the measured stage times" in imbalance.evidence
    # The job's wait in collectives leaves the bubble out (the two findings above name it):
    # counted in, stage 0's 254 ms in SendRecv made "ranks wait for each other" 37% of
    # the step. What is left is the ranks' wait at the collectives that span both stages.
    wait = finding(d, "collective-wait")
    bubble = finding(d, "pipeline-bubble")
    assert bubble is not None
    assert wait is None or wait.share < bubble.share / 2


def test_a_zero1_jobs_exposed_gradient_reduction_leads_when_it_is_the_wall(
    tmp_path: Path,
) -> None:
    """A DeepSpeed ZeRO-1 job (2 ranks) whose reduce-scatters run after the whole backward,
    25% of the step with nothing beside them: the wall is that exposed communication, so
    its finding leads the job's findings, ahead of the casts' larger bound (30% of the step
    in copy kernels, the bandwidth wall's finding). The job's findings were ranked by bound
    alone, the casts first."""
    for rank in range(2):
        zero_rank(rank).write(tmp_path / f"rank{rank}.json")
    d = analyze(tmp_path)
    assert d.verdict.wall == "overhead"
    assert d.verdict.cause == "comm_exposed"
    ids = [f.id for f in d.findings]
    assert ids.index("exposed-comm") < ids.index("repeated-casts")
    casts, comm = finding(d, "repeated-casts"), finding(d, "exposed-comm")
    assert casts is not None
    assert comm is not None
    assert casts.max_speedup > comm.max_speedup
    # The same order as the rank's own.
    alone = analyze(tmp_path / "rank0.json")
    mine = [f.id for f in alone.findings]
    assert [i for i in ids if i in mine] == [i for i in mine if i in ids]


def test_a_zero1_reduction_after_the_backward_is_communication_not_other(tmp_path: Path) -> None:
    """The bucket's scaling inside `average_tensor` (on the main thread after backward(), in
    no module and no autograd node) was "other": it is the gradient sync's work."""
    d = analyze(zero_rank(0).write(tmp_path / "rank0.json"))
    assert d.phases is not None
    assert d.phases.exposed_s["other"] == 0.0
    # The reduce-scatter (25 ms) and the scaling before it (0.15 ms, and the 0.02 ms the GPU
    # waited for its launch) a step.
    assert d.phases.gpu_s["communication"] == pytest.approx(0.02515, abs=1e-9)
    assert any("gradient reduction frames" in e for e in d.phases.evidence)


def test_a_jobs_lever_what_if_is_the_rank_that_gains_least(tmp_path: Path) -> None:
    """`--what-if microbatches:4` on the 8-rank job: stage 0 (the path's rank 0) replays its
    154 ms a step of bubble waits shrunk to half, stage 1 only its 63 ms; the ranks meet at
    every step's collectives, so the job's row is stage 1's (it was rank 0's alone)."""
    for rank in range(8):
        megatron_rank(rank).write(tmp_path / f"rank{rank}.json")
    options = Options(what_if="microbatches:4")
    job = analyze(tmp_path, options)
    assert job.critical_path is not None
    (row,) = [r for r in job.critical_path.what_if if r.change == "microbatches:4"]
    speedups = {}
    for rank in (0, 4):
        alone = analyze(tmp_path / f"rank{rank}.json", options).critical_path
        assert alone is not None
        (mine,) = [r for r in alone.what_if if r.change == "microbatches:4"]
        speedups[rank] = mine.speedup
    assert speedups[4] < speedups[0]
    assert row.speedup == pytest.approx(speedups[4])
    assert any("microbatches:4 (rank 4's" in n for n in job.critical_path.notes)
