"""Pipeline parallelism: a stage waiting in send/recv for its neighbour is the schedule's
bubble (the pipeline-bubble finding, against (p−1)/(m+p−1)), not exposed communication to
overlap, and the two never count that time twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracegen import TraceBuilder
from wallfinder import analyze
from wallfinder.diagnosis import Diagnosis, Finding
from wallfinder.report.terminal import render_text

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_kernel"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long)"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long)"


def gpipe_stage(
    *, microbatches: int = 2, chunk: str = "Forward {i}", allreduce_us: float = 0.0
) -> TraceBuilder:
    """Rank 1 of a 2-stage GPipe job on a GPU. Each 1000 µs step: per microbatch a forward
    range whose SendRecv kernel waits 150 µs for the activations, then a 100 µs GEMM; the
    backward ranges the same with 50 µs GEMMs and no wait; then `allreduce_us` of an exposed
    all-reduce (a data-parallel gradient sync beside the pipeline)."""
    b = TraceBuilder(rank=1, world_size=2)
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        t = t0 + 10.0
        for i in range(microbatches):
            b.annotation(chunk.format(i=i), t, 260.0)
            b.nccl(t + 2.0, 150.0, name=SENDRECV, launch_at=t)
            b.kernel(GEMM, t + 155.0, 100.0, launch_at=t + 5.0)
            t += 265.0
        for i in range(microbatches):
            b.annotation(f"Backward {i}", t, 55.0)
            b.kernel(GEMM, t + 2.0, 50.0, launch_at=t)
            t += 60.0
        if allreduce_us:
            b.nccl(t + 5.0, allreduce_us, name=ALLREDUCE, launch_at=t)
    return b


def finding(d: Diagnosis, id: str) -> Finding | None:
    return next((f for f in d.findings if f.id == id), None)


def test_a_stage_waiting_in_sendrecv_is_the_bubble_against_the_schedules_theory(
    tmp_path: Path,
) -> None:
    d = analyze(gpipe_stage().write(tmp_path / "t.json"))
    bubble = finding(d, "pipeline-bubble")
    assert bubble is not None
    # All the exposed communication: 2 × 150 µs a step in SendRecv with no compute beside it.
    assert bubble.share == pytest.approx(d.breakdown.comm_exposed, abs=1e-6)
    assert d.breakdown.per_step_ms["comm_exposed"] == pytest.approx(0.30, abs=1e-3)
    assert "2 microbatches per step, 2 stages" in bubble.evidence
    assert "(p−1)/(m+p−1) = 33% of the step" in bubble.evidence
    assert "m=4 leaves 20%, m=8 leaves 11%" in bubble.fix
    # Its gain is the `microbatches` what-if's, replayed on the graph (tests/unit/
    # test_levers.py): here the host's launches set the pace, so the waits' shrinking moves
    # no step.
    assert "`--what-if microbatches:M` replays the step with M" in bubble.fix
    assert bubble.gain_basis == "replay"
    assert "interleaved 1F1B" in bubble.fix
    assert "zero bubble" in bubble.fix
    # The wait is the bubble's, not collectives to overlap: exposed-comm does not claim it.
    assert finding(d, "exposed-comm") is None


def test_exposed_comm_keeps_only_what_the_bubble_does_not_claim(tmp_path: Path) -> None:
    d = analyze(gpipe_stage(allreduce_us=100.0).write(tmp_path / "t.json"))
    bubble, comm = finding(d, "pipeline-bubble"), finding(d, "exposed-comm")
    assert bubble is not None
    assert comm is not None
    # 300 µs a step of SendRecv, 100 µs of all-reduce.
    assert comm.share / bubble.share == pytest.approx(1 / 3, abs=1e-3)
    assert bubble.share + comm.share == pytest.approx(d.breakdown.comm_exposed, abs=1e-6)


def test_the_verdict_names_the_bubble_when_it_is_most_of_the_exposed_comm(
    tmp_path: Path,
) -> None:
    d = analyze(gpipe_stage().write(tmp_path / "t.json"))
    assert d.findings[0].id == "pipeline-bubble"
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "comm_exposed")
    assert d.verdict.mechanism == "the pipeline bubble (2 stages, 2 microbatches: 33% by theory)"
    assert (
        "OVERHEAD wall — exposed communication — the pipeline bubble (2 stages, 2 "
        "microbatches: 33% by theory)"
    ) in render_text(d, width=200)


def test_the_verdict_names_no_bubble_that_is_the_lesser_part_of_the_exposed_comm(
    tmp_path: Path,
) -> None:
    # 400 µs of exposed all-reduce a step against the bubble's 300: the verdict keeps its
    # plain words. (The all-reduce's finding is bounded by the compute it could hide behind,
    # the 300 µs of GEMMs: a tie, which the strategy's own finding wins.)
    d = analyze(gpipe_stage(allreduce_us=400.0).write(tmp_path / "t.json"))
    assert [f.id for f in d.findings[:2]] == ["pipeline-bubble", "exposed-comm"]
    assert d.findings[0].max_speedup == d.findings[1].max_speedup
    assert d.verdict.cause == "comm_exposed"
    assert d.verdict.mechanism == ""


def test_sendrecv_without_a_schedules_ranges_is_not_read_as_a_pipeline(tmp_path: Path) -> None:
    # The same kernels under ranges no pipeline schedule records: ring attention, a user's
    # own exchange; their wait stays exposed communication.
    d = analyze(gpipe_stage(chunk="my_block {i}").write(tmp_path / "t.json"))
    assert finding(d, "pipeline-bubble") is None
    comm = finding(d, "exposed-comm")
    assert comm is not None
    assert comm.share == pytest.approx(d.breakdown.comm_exposed, abs=1e-6)


def test_a_multi_stage_schedules_actions_count_microbatches_and_stages_per_rank(
    tmp_path: Path,
) -> None:
    # An interleaved schedule's `PP:<stage><action><microbatch>` ranges: stages 1 and 3 on
    # this rank (v = 2), microbatches 0 and 1 each.
    b = TraceBuilder(rank=1, world_size=2)
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        t = t0 + 10.0
        for stage, mb in ((1, 0), (1, 1), (3, 0), (3, 1)):
            b.annotation(f"PP:{stage}F{mb}", t, 200.0)
            b.nccl(t + 2.0, 100.0, name=SENDRECV, launch_at=t)
            b.kernel(GEMM, t + 105.0, 90.0, launch_at=t + 5.0)
            t += 205.0
        b.annotation("PP:3B1", t, 60.0)
        b.kernel(GEMM, t + 2.0, 50.0, launch_at=t)
    d = analyze(b.write(tmp_path / "t.json"))
    bubble = finding(d, "pipeline-bubble")
    assert bubble is not None
    assert bubble.share == pytest.approx(d.breakdown.comm_exposed, abs=1e-6)
    assert d.breakdown.per_step_ms["comm_exposed"] == pytest.approx(0.40, abs=1e-3)
    assert "2 microbatches per step, 2 stages on this rank (interleaved), 2 stages" in (
        bubble.evidence
    )
    # (p−1)/(v·m+p−1) = 1/(2·2+1)
    assert "(p−1)/(v·m+p−1) = 20% of the step" in bubble.evidence


def test_a_cpu_stage_blocked_in_gloo_send_and_recv_is_the_bubble(tmp_path: Path) -> None:
    """torch.distributed.pipelining on the CPU with gloo: the main thread blocks in
    `c10d::send` / `c10d::recv_` and their `gloo:` work inside the microbatch ranges."""
    b = TraceBuilder(device_name=None, rank=0, world_size=2)
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.annotation("Forward 0", t0 + 10.0, 300.0)
        b.cpu_op("aten::mm", t0 + 20.0, 200.0)
        b.cpu_op("c10d::send", t0 + 230.0, 50.0)
        b.annotation("Forward 1", t0 + 320.0, 300.0)
        b.cpu_op("aten::mm", t0 + 330.0, 200.0)
        b.cpu_op("c10d::send", t0 + 540.0, 10.0)
        b.annotation("gloo:send", t0 + 550.0, 40.0)
        b.annotation("Backward 0", t0 + 630.0, 300.0)
        b.cpu_op("c10d::recv_", t0 + 640.0, 5.0)
        b.annotation("gloo:recv", t0 + 645.0, 150.0)
        b.cpu_op("aten::mm", t0 + 800.0, 120.0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert d.breakdown.basis == "cpu"
    bubble = finding(d, "pipeline-bubble")
    assert bubble is not None
    # 50 + 10 + 40 + 5 + 150 µs of each step.
    assert d.breakdown.per_step_ms["comm_exposed"] == pytest.approx(0.255, abs=1e-3)
    assert bubble.share == pytest.approx(d.breakdown.comm_exposed, abs=1e-6)
    assert "2 microbatches per step, 2 stages" in bubble.evidence
    assert finding(d, "exposed-comm") is None


def cpu_1f1b_stage(*, allreduce: bool = False) -> TraceBuilder:
    """The first of 2 stages of a schedule that records no ranges (Schedule1F1B up to torch
    2.13), on the CPU with gloo: per step 3 microbatches, each a forward, a blocking
    `c10d::send` of its activations and later a `c10d::recv_` of their gradients; with
    `allreduce`, a data-parallel gradient all-reduce too."""
    b = TraceBuilder(device_name=None, rank=0, world_size=2)
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        t = t0 + 10.0
        for _ in range(3):
            b.cpu_op("aten::mm", t, 100.0)
            b.cpu_op("c10d::send", t + 100.0, 60.0)
            b.cpu_op("c10d::recv_", t + 160.0, 40.0)
            b.cpu_op("aten::mm", t + 200.0, 100.0)
            t += 300.0
        if allreduce:
            b.cpu_op("c10d::allreduce_", t, 50.0)
    return b


def test_a_schedule_without_ranges_is_read_from_its_transfers_on_two_stages(
    tmp_path: Path,
) -> None:
    d = analyze(cpu_1f1b_stage().write(tmp_path / "t.json"))
    bubble = finding(d, "pipeline-bubble")
    assert bubble is not None
    assert bubble.share == pytest.approx(d.breakdown.comm_exposed, abs=1e-6)
    # 6 send/recv calls a step: 3 microbatches, one each way.
    assert "3 microbatches per step, 2 stages; m counted from the send/recv calls" in (
        bubble.evidence
    )
    assert "(p−1)/(m+p−1) = 25% of the step" in bubble.evidence
    assert finding(d, "exposed-comm") is None


def test_transfers_beside_other_collectives_are_not_read_as_a_pipeline(tmp_path: Path) -> None:
    # Without the schedule's ranges, send/recv beside a gradient all-reduce could be any use
    # of point-to-point: left to exposed communication.
    d = analyze(cpu_1f1b_stage(allreduce=True).write(tmp_path / "t.json"))
    assert finding(d, "pipeline-bubble") is None
    comm = finding(d, "exposed-comm")
    assert comm is not None
    assert comm.share == pytest.approx(d.breakdown.comm_exposed, abs=1e-6)


def test_a_users_range_named_like_a_transfer_is_no_wait(tmp_path: Path) -> None:
    # Chunk ranges, and the user's own `send_metrics` range: no collective, no bubble.
    b = TraceBuilder(device_name=None, rank=0, world_size=2)
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.annotation("Forward 0", t0 + 10.0, 300.0)
        b.cpu_op("aten::mm", t0 + 20.0, 200.0)
        b.annotation("send_metrics", t0 + 400.0, 400.0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert finding(d, "pipeline-bubble") is None


def test_a_cpu_stages_wait_for_gradients_is_not_backward_compute(tmp_path: Path) -> None:
    """Stage 0 of a 2-stage GPipe job on the CPU (as torch.distributed.pipelining records it
    with gloo): inside each `Backward i` range the main thread first blocks in `gloo:recv` for
    its neighbour's gradients (a range, not an op), then runs the autograd nodes. That wait
    is the bubble, not backward compute: the backward is the nodes' 2 × 60 µs (under twice
    the forward's), and backward-heavy does not fire (it did, when the wait went to the phase
    of the node after it: 580 µs of backward)."""
    b = TraceBuilder(device_name=None, rank=0, world_size=2)
    node = "autograd::engine::evaluate_function: AddmmBackward0"
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        t = t0 + 10.0
        for i in range(2):
            b.annotation(f"Forward {i}", t, 100.0)
            b.cpu_op("aten::addmm", t + 5.0, 30.0)
            b.cpu_op("c10d::send", t + 40.0, 5.0)
            b.annotation("gloo:send", t + 45.0, 20.0)
            t += 110.0
        for i in range(2):
            b.annotation(f"Backward {i}", t, 300.0)
            b.cpu_op("c10d::recv_", t + 2.0, 3.0)
            b.annotation("gloo:recv", t + 5.0, 230.0)
            b.host(node, t + 235.0, 60.0, args={"Sequence number": 7, "Fwd thread id": 1})
            t += 310.0
    d = analyze(b.write(tmp_path / "t.json"))
    assert d.phases is not None
    exposed = d.phases.exposed_s
    assert exposed["backward"] == pytest.approx(120e-6, rel=0.05)
    assert exposed["forward"] >= 60e-6  # its ops and the host's gaps before them
    assert exposed["communication"] >= 460e-6
    assert finding(d, "backward-heavy") is None
    assert finding(d, "pipeline-bubble") is not None
