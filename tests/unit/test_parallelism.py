"""The parallelism strategy found from what a trace holds (analysis/parallelism.py), and the
sharding rules (analysis/topics/sharding.py), on built traces: each strategy's collectives
placed in the phase of the step that names it, with or without the framework's ranges."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from realtraces import real_trace
from tracegen import AUTOGRAD_TID, TraceBuilder, phased_training_trace
from wallfinder import Diagnosis
from wallfinder.analysis import diagnose
from wallfinder.diagnosis import Parallelism
from wallfinder.report.html import render_html
from wallfinder.report.markdown import render_markdown
from wallfinder.report.terminal import render_text
from wallfinder.trace import load_trace

STEPS = 4
GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long)"
REDUCE_SCATTER = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*, unsigned long)"
ALL_TO_ALL = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long)"
SEND_RECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long)"
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long)"

Add = Callable[[TraceBuilder, float], None]
"""What a strategy adds to each step of `phased_training_trace` (at the step's start, µs):
the forward runs 130–430 on the main thread (Block_0 140–280, Block_1 280–420), the backward
500–930 on the autograd thread."""


def _ddp(b: TraceBuilder, t0: float) -> None:
    # The gradients' all-reduce, called from the backward's hook on the autograd thread.
    b.cpu_op("c10d::allreduce_", t0 + 505.0, 4.0, tid=AUTOGRAD_TID)
    b.nccl(t0 + 520.0, 30.0)


def _fsdp(b: TraceBuilder, t0: float) -> None:
    # Each block's parameters gathered in its pre-forward, on demand (no prefetch); the
    # gradients reduce-scattered in the backward. The first gather waits 132-157, with no
    # compute beside it.
    for unit, at in ((0, 141.0), (1, 281.0)):
        b.annotation(f"FSDP::pre_forward ({unit})", t0 + at - 10.0, 9.0)
        b.annotation(f"FSDP::all_gather ({unit})", t0 + at - 9.0, 6.0)
        b.cpu_op("c10d::_allgather_base_", t0 + at - 8.0, 4.0)
    b.kernel(GATHER, t0 + 132.0, 25.0, launch_at=t0 + 133.0, stream=28)
    b.cpu_op("c10d::_reduce_scatter_base_", t0 + 505.0, 4.0, tid=AUTOGRAD_TID)
    b.kernel(REDUCE_SCATTER, t0 + 520.0, 30.0, launch_at=t0 + 506.0, stream=28)


def _tp(b: TraceBuilder, t0: float) -> None:
    # The row-parallel layer's partial outputs summed inside the forward (Linear_1), the next
    # layer waiting: no compute beside it, 455-495.
    b.cpu_op("_c10d_functional::all_reduce", t0 + 395.0, 5.0)
    b.cpu_op("c10d::allreduce_", t0 + 396.0, 3.0)
    b.kernel(
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long)",
        t0 + 455.0,
        40.0,
        launch_at=t0 + 397.0,
        stream=28,
    )


def _ep(b: TraceBuilder, t0: float) -> None:
    b.cpu_op("c10d::alltoall_base_", t0 + 290.0, 4.0)
    b.kernel(ALL_TO_ALL, t0 + 455.0, 20.0, launch_at=t0 + 291.0, stream=28)


def _pp(b: TraceBuilder, t0: float) -> None:
    b.annotation("PipelineSchedule.forward_one_chunk", t0 + 135.0, 290.0)
    b.cpu_op("c10d::send", t0 + 421.0, 3.0)
    b.annotation("PipelineSchedule.backward_one_chunk", t0 + 500.0, 330.0)
    b.cpu_op("c10d::recv_", t0 + 501.0, 3.0)


def _gpipe(b: TraceBuilder, t0: float) -> None:
    # torch.distributed.pipelining's GPipe: `Forward i`/`Backward i` around each microbatch,
    # the activations received from the previous stage inside.
    b.annotation("Forward 0", t0 + 135.0, 290.0)
    b.cpu_op("c10d::recv_", t0 + 136.0, 3.0)
    b.annotation("Backward 0", t0 + 500.0, 330.0)
    b.cpu_op("c10d::send", t0 + 501.0, 3.0)


def _zero2(b: TraceBuilder, t0: float) -> None:
    # The gradients reduce-scattered in the backward to the rank that owns their optimizer
    # shard, with no all-gather in the forward (the parameters are whole on every rank).
    b.cpu_op("c10d::_reduce_scatter_base_", t0 + 505.0, 4.0, tid=AUTOGRAD_TID)
    b.kernel(REDUCE_SCATTER, t0 + 520.0, 30.0, launch_at=t0 + 506.0, stream=28)


_STAGE_1_AND_2 = "deepspeed/runtime/zero/stage_1_and_2.py(1180): "


def _deepspeed_zero1(b: TraceBuilder, t0: float) -> None:
    # DeepSpeed ZeRO-1/2 with Python stacks: the engine's forward, and its bucketed
    # gradient reduction (reduce_ipg_grads > average_tensor) all-reducing in the backward.
    b.host("deepspeed/runtime/engine.py(1900): forward", t0 + 131.0, 298.0, cat="python_function")
    b.host(
        _STAGE_1_AND_2 + "reduce_ipg_grads",
        t0 + 503.0,
        8.0,
        cat="python_function",
        tid=AUTOGRAD_TID,
    )
    b.host(
        _STAGE_1_AND_2 + "average_tensor", t0 + 504.0, 6.0, cat="python_function", tid=AUTOGRAD_TID
    )
    _ddp(b, t0)


def _deepspeed_zero3(b: TraceBuilder, t0: float) -> None:
    # DeepSpeed ZeRO-3: no FSDP ranges; the parameters gathered in the forward, the
    # gradients reduce-scattered in the backward, the engine's frames.
    b.host("deepspeed/runtime/engine.py(1900): forward", t0 + 131.0, 298.0, cat="python_function")
    for at in (141.0, 281.0):
        b.cpu_op("c10d::_allgather_base_", t0 + at - 8.0, 4.0)
    b.kernel(GATHER, t0 + 132.0, 25.0, launch_at=t0 + 133.0, stream=28)
    _zero2(b, t0)


def _diagnosed(tmp_path: Path, *adds: Add) -> Diagnosis:
    b = phased_training_trace(STEPS, builder=TraceBuilder(rank=0, world_size=2))
    for s in range(STEPS):
        for add in adds:
            add(b, s * 1000.0)
    d = diagnose(load_trace(b.write(tmp_path / "t.json.gz")))
    d.self_check()
    return d


def _found(d: Diagnosis) -> Parallelism:
    assert d.parallelism is not None, d.not_computed
    return d.parallelism


@pytest.mark.parametrize(
    ("adds", "names", "said"),
    [
        ((_ddp,), ["DDP"], "all-reduce ×1/step in the backward"),
        ((_fsdp,), ["FSDP"], "all-gather ×2/step in the forward"),
        ((_tp,), ["TP"], "all-reduce ×1/step in the forward"),
        ((_ep,), ["EP"], "all-to-all ×1/step"),
        ((_pp,), ["PP"], "pipelining's ranges (PipelineSchedule.forward_one_chunk ×1/step"),
        ((_gpipe,), ["PP"], "pipelining's ranges (Forward i ×1/step, Backward i ×1/step)"),
        ((_tp, _ddp, _pp), ["TP", "PP"], "send/recv ×2/step"),
        ((_zero2,), ["DDP"], "no all-gather in the forward (gradients reduced to the rank"),
        ((_deepspeed_zero1,), ["ZeRO-1/2"], "the gradient reduction's own frames ("),
        ((_deepspeed_zero3,), ["ZeRO-3"], "all-gather ×2/step in the forward"),
    ],
    ids=["ddp", "fsdp", "tp", "ep", "pp", "gpipe", "tp+pp", "zero2", "ds-zero1", "ds-zero3"],
)
def test_the_strategy_is_named_from_the_collectives_phase_and_ranges(
    tmp_path: Path, adds: tuple[Add, ...], names: list[str], said: str
) -> None:
    p = _found(_diagnosed(tmp_path, *adds))
    assert p.names == names
    assert any(said in line for s in p.strategies for line in s.evidence), p.strategies


def _ddp_kernels_only(b: TraceBuilder, t0: float) -> None:
    # The gradients' all-reduce kernel launched from the backward, no host collective op.
    b.kernel(
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long)",
        t0 + 520.0,
        30.0,
        launch_at=t0 + 506.0,
        launch_tid=AUTOGRAD_TID,
        stream=28,
    )


def test_without_host_collectives_the_kernels_name_the_strategy(tmp_path: Path) -> None:
    (ddp,) = _found(_diagnosed(tmp_path, _ddp_kernels_only)).strategies
    assert ddp.name == "DDP"
    assert ddp.evidence == [
        "all-reduce ×1/step in the backward (gradients reduced across replicas)"
    ]


def test_fsdp_is_named_by_its_own_ranges(tmp_path: Path) -> None:
    (fsdp,) = _found(_diagnosed(tmp_path, _fsdp)).strategies
    assert "FSDP / ZeRO-3" in fsdp.title
    assert fsdp.evidence[0].startswith("FSDP's own ranges (")
    assert "FSDP::all_gather (i) ×2/step" in fsdp.evidence[0]
    assert "2 units" in fsdp.evidence[0]


def test_a_job_without_collectives_has_no_parallelism(tmp_path: Path) -> None:
    assert _diagnosed(tmp_path).parallelism is None


def test_the_process_groups_come_from_distributed_info(tmp_path: Path) -> None:
    b = phased_training_trace(STEPS, builder=TraceBuilder(rank=0, world_size=2))
    for s in range(STEPS):
        _ddp(b, s * 1000.0)
    path = b.write(tmp_path / "t.json")
    data = json.loads(path.read_text())
    data["distributedInfo"]["pg_config"] = [
        {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}
    ]
    path.write_text(json.dumps(data))
    (group,) = _found(diagnose(load_trace(path))).groups
    assert (group.name, group.description, group.size) == ("0", "default_pg", 2)
    assert group.collectives == {"allreduce": 1.0}


def test_tp_allreduce_in_the_forward_is_its_own_finding(tmp_path: Path) -> None:
    d = _diagnosed(tmp_path, _tp)
    (f,) = [f for f in d.findings if f.id == "tp-allreduce-exposed"]
    # The all-reduce runs 40 µs of each 1000 µs step with no compute beside it.
    assert f.share == pytest.approx(0.04, abs=0.002)
    assert "1 all-reduces/step inside the forward" in f.evidence
    assert "async TP" in f.fix
    assert "bucket" not in f.fix


def test_fsdp_gather_before_its_unit_is_its_own_finding(tmp_path: Path) -> None:
    d = _diagnosed(tmp_path, _fsdp)
    (f,) = [f for f in d.findings if f.id == "fsdp-exposed-gather"]
    assert f.share == pytest.approx(0.025, abs=0.002)  # 25 µs of 1000, nothing beside it
    assert "2 of 2 per step issued by their own unit's pre-forward (no forward prefetch)" in (
        f.evidence
    )
    # Unit 0's gather kernel, launched inside its FSDP::all_gather (0) range, 25 µs a step.
    assert "before a unit's forward: unit 0 0.03 ms;" in f.evidence
    assert "set_modules_to_forward_prefetch" in f.fix
    # Not a tensor-parallel job: its collectives in the forward are FSDP's all-gathers.
    assert "tp-allreduce-exposed" not in [x.id for x in d.findings]


def test_ddp_gradients_make_no_sharding_finding(tmp_path: Path) -> None:
    ids = [f.id for f in _diagnosed(tmp_path, _ddp).findings]
    assert "tp-allreduce-exposed" not in ids
    assert "fsdp-exposed-gather" not in ids


# Strategies whose communication is the step's largest loss: the forward's idle gaps (125-160,
# 260-300, 450-510 in `phased_training_trace`) filled with it, 112-122 µs a step against the
# DataLoader's 100.


def _fsdp_exposed(b: TraceBuilder, t0: float) -> None:
    # Three units' parameters gathered on demand, each in its own pre-forward: 26 + 28 + 56 µs
    # with no compute beside them.
    for unit, at, start, us in (
        (0, 141.0, 132.0, 28.0),
        (1, 281.0, 272.0, 28.0),
        (2, 430.0, 452.0, 56.0),
    ):
        b.annotation(f"FSDP::pre_forward ({unit})", t0 + at - 10.0, 9.0)
        b.annotation(f"FSDP::all_gather ({unit})", t0 + at - 9.0, 6.0)
        b.cpu_op("c10d::_allgather_base_", t0 + at - 8.0, 4.0)
        b.kernel(GATHER, t0 + start, us, launch_at=t0 + at - 7.0, stream=28)


def _tp_exposed(b: TraceBuilder, t0: float) -> None:
    # Three row-parallel layers' all-reduces inside the forward: 28 + 38 + 56 µs exposed.
    for call, start, us in ((131.0, 132.0, 28.0), (261.0, 262.0, 38.0), (397.0, 452.0, 56.0)):
        b.cpu_op("c10d::allreduce_", t0 + call, 1.0)
        b.kernel(ALL_REDUCE, t0 + start, us, launch_at=t0 + call + 0.5, stream=28)


def _ddp_exposed(b: TraceBuilder, t0: float) -> None:
    # A gradient all-reduce of the backward with no compute beside it (830-870 is idle):
    # generic exposed communication, no strategy's own loss.
    b.cpu_op("c10d::allreduce_", t0 + 831.0, 1.0, tid=AUTOGRAD_TID)
    b.kernel(ALL_REDUCE, t0 + 832.0, 34.0, launch_at=t0 + 831.5, launch_tid=AUTOGRAD_TID, stream=28)


@pytest.mark.parametrize(
    ("strategy", "id", "words"),
    [
        (_fsdp_exposed, "fsdp-exposed-gather", "FSDP all-gathers not prefetched"),
        (_tp_exposed, "tp-allreduce-exposed", "TP all-reduces in the forward"),
    ],
    ids=["fsdp", "tp"],
)
@pytest.mark.parametrize("ddp", [False, True], ids=["alone", "with-ddp"])
def test_the_strategys_own_finding_leads_and_takes_its_share_out_of_exposed_comm(
    tmp_path: Path, strategy: Add, id: str, words: str, ddp: bool
) -> None:
    d = _diagnosed(tmp_path, strategy, *((_ddp_exposed,) if ddp else ()))
    top = d.findings[0]
    assert top.id == id
    comm = next((f for f in d.findings if f.id == "exposed-comm"), None)
    # Nothing counted twice: the strategy's finding and the generic one share the exposed
    # communication (the generic one keeps only the DDP all-reduce's 34 µs, when there is one).
    rest = comm.share if comm is not None else 0.0
    assert top.share + rest == pytest.approx(d.breakdown.comm_exposed, abs=1e-6)
    assert (comm is not None) == ddp
    if comm is not None:
        assert comm.share * d.breakdown.per_step_ms["step"] == pytest.approx(0.034, abs=1e-3)
    # The verdict names the mechanism that is most of its cause; its wall and cause stay.
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "comm_exposed")
    assert d.verdict.mechanism == words
    assert f"OVERHEAD wall — exposed communication — {words}" in (render_text(d, width=200))
    assert words in render_markdown(d).splitlines()[0]
    assert words in render_html(d)
    loaded = json.loads(d.to_json())
    assert loaded["verdict"]["cause"] == "comm_exposed"
    del loaded["verdict"]["mechanism"]  # a result saved before the field: it loads, empty
    assert Diagnosis.from_json(json.dumps(loaded)).verdict.mechanism == ""


def _tiny_gather(b: TraceBuilder, t0: float) -> None:
    # A 10 µs all-gather kernel launched in the forward: 1% of the step, too small to be a
    # finding of its own.
    b.kernel(GATHER, t0 + 132.0, 10.0, launch_at=t0 + 131.0, stream=28)


def test_a_strategys_loss_too_small_to_be_a_finding_claims_nothing(tmp_path: Path) -> None:
    d = _diagnosed(tmp_path, _tiny_gather, _ddp_exposed)
    ids = [f.id for f in d.findings]
    assert "fsdp-exposed-gather" not in ids
    (comm,) = [f for f in d.findings if f.id == "exposed-comm"]
    # All 44 µs of exposed communication stay the generic finding's: none goes missing.
    assert comm.share == pytest.approx(d.breakdown.comm_exposed, abs=1e-6)
    assert comm.share * d.breakdown.per_step_ms["step"] == pytest.approx(0.044, abs=1e-3)


def test_a_strategy_that_explains_little_of_the_exposed_comm_is_not_the_verdicts(
    tmp_path: Path,
) -> None:
    # The TP all-reduce's 40 µs beside the DataLoader's 100: the verdict is not about
    # communication, so it names no mechanism.
    d = _diagnosed(tmp_path, _tp)
    assert d.verdict.cause != "comm_exposed"
    assert d.verdict.mechanism == ""
    assert d.findings[[f.id for f in d.findings].index("tp-allreduce-exposed")].share == (
        pytest.approx(d.breakdown.comm_exposed, abs=1e-6)
    )
    assert "exposed-comm" not in [f.id for f in d.findings]


def test_parallelism_renders_in_every_format_and_loads_from_json(tmp_path: Path) -> None:
    d = _diagnosed(tmp_path, _tp, _ddp, _pp)
    text = render_text(d, width=80)
    assert "Parallelism: TP + PP" in text
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "Parallelism: TP" in render_markdown(d)
    assert 'id="parallelism"' in render_html(d)
    assert Diagnosis.from_json(d.to_json()).parallelism == d.parallelism
    old = d.to_dict()
    del old["parallelism"]
    assert Diagnosis.from_json(json.dumps(old)).parallelism is None


@pytest.mark.parametrize(
    ("relative", "names"),
    [
        ("hta/a100_8rank_control_rank0.json.gz", ["DDP"]),
        # A DLRM-style job: DDP for the dense part, all-to-alls for the sharded embeddings,
        # and reduce-scatters in the forward with no all-gather beside them: not sequence
        # parallel.
        ("hta/a100-80gb_16rank_rank0.json.gz", ["DDP", "EP"]),
        ("other/a100pcie_part_forward_bs128.json.gz", None),
    ],
)
def test_the_strategies_of_real_traces(relative: str, names: list[str] | None) -> None:
    d = diagnose(load_trace(real_trace(relative)))
    assert (d.parallelism.names if d.parallelism else None) == names
