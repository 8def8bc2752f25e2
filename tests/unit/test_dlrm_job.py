"""A data-parallel DLRM job of 8 ranks on V100s, as a public benchmark suite recorded it (one
Kineto trace per rank, NCCL all-reduces, `record_function` ranges named like
`DistributedDataParallel.forward`, `## forward ##`, `DLRM_Net.forward` and torch.compile's
`Torch-Compiled Region: 0/0`): its folder is diagnosed as one job, on the communication wall,
with the slow rank named and the module rows of its ranges. Names with the module path's
separators inside once took the whole diagnosis down with a KeyError (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracegen import AUTOGRAD_TID, TraceBuilder
from wallfinder.cli import main

WORLD = 8
SLOW = 5
"""The straggler: its forward and backward kernels take `SLOWER` times as long."""
SLOWER = 1.5
STEP_US = 9300.0
DEVICE = "Tesla V100-SXM2-16GB"
GEMM = "volta_sgemm_128x64_nn"
EMBEDDING = "void embedding_bag_kernel<float, long>(long const*, float const*, float*)"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
FORWARD_US = (500.0, 500.0, 500.0)
"""The forward's kernels (embedding bag, bottom MLP GEMM, top MLP GEMM) on a healthy rank."""
BACKWARD_US = (1000.0, 1000.0, 500.0)
BUCKETS = ((6_553_600, 1500.0), (4_000_000, 1000.0))
"""DDP's gradient buckets: fp32 elements, and the all-reduce's transfer time in µs."""


def dlrm_rank(rank: int) -> TraceBuilder:
    """One rank's trace: 4 steps of `STEP_US`, in the job's time (the rank's clock is skewed by
    700 µs a rank; the collectives' ends align it).

    Each step: the DataLoader (0–200) and the batch's copy; on the main thread
    `DistributedDataParallel.forward` > `## forward ##` > `DLRM_Net.forward` > `Torch-Compiled
    Region: 0/0` around the forward's ops, whose kernels run from 400 µs; the backward on the
    autograd thread, inside the compiled region re-run there, its kernels right after the
    forward's; then DDP's two bucket all-reduces, launched from the autograd thread, on the
    NCCL stream from the end of the rank's backward until the last rank has arrived and the
    bucket is transferred (every rank's ends at the same moment); the optimizer's kernel after
    them, and the host waits for it (`loss.item()`). The straggler's compute is `SLOWER` times
    as long, so every other rank waits in the first all-reduce."""
    b = TraceBuilder(
        device_name=DEVICE, rank=rank, world_size=WORLD, base_us=1_700_000_000 + 700 * rank
    )
    k = SLOWER if rank == SLOW else 1.0
    # The moment the last rank reaches the all-reduce: the same on every rank.
    last_arrival = 400.0 + SLOWER * (sum(FORWARD_US) + sum(BACKWARD_US))
    for s in range(4):
        t0 = s * STEP_US
        seq = 100 * s
        b.step(s + 1, t0, STEP_US)
        b.dataloader(t0, 200.0)
        b.memcpy(t0 + 210.0, 50.0, 4 << 20, launch_at=t0 + 202.0)
        # Forward: the ranges nest on the main thread, each op launches one kernel.
        b.annotation("DistributedDataParallel.forward", t0 + 300.0, 1000.0)
        b.annotation("## forward ##", t0 + 310.0, 980.0)
        b.annotation("DLRM_Net.forward", t0 + 320.0, 960.0)
        b.annotation("Torch-Compiled Region: 0/0", t0 + 330.0, 940.0)
        gpu = t0 + 400.0
        ops = ("aten::embedding_bag", "aten::mm", "aten::mm")
        for i, (op, name, us) in enumerate(
            zip(ops, (EMBEDDING, GEMM, GEMM), FORWARD_US, strict=True)
        ):
            at = t0 + 340.0 + 100.0 * i
            b.host(op, at, 20.0, args={"Sequence number": seq + i, "Fwd thread id": 0})
            b.kernel(name, gpu, us * k, launch_at=at + 5.0)
            gpu += us * k
        # Backward on the autograd thread, inside the compiled region's backward.
        b.annotation("Torch-Compiled Region: 0/0", t0 + 1400.0, 700.0, tid=AUTOGRAD_TID)
        nodes = ("MmBackward0", "MmBackward0", "EmbeddingBagBackward0")
        for j, (node, us) in enumerate(zip(nodes, BACKWARD_US, strict=True)):
            at = t0 + 1420.0 + 200.0 * j
            args = {"Sequence number": seq + 2 - j, "Fwd thread id": 1}
            b.host(
                f"autograd::engine::evaluate_function: {node}",
                at,
                100.0,
                tid=AUTOGRAD_TID,
                args=args,
            )
            name = EMBEDDING if node.startswith("Embedding") else GEMM
            b.kernel(name, gpu, us * k, launch_at=at + 10.0, launch_tid=AUTOGRAD_TID)
            gpu += us * k
        # DDP's bucket all-reduces, from the reducer's hook on the autograd thread.
        arrive, end = gpu, t0 + last_arrival
        for j, (nelems, transfer_us) in enumerate(BUCKETS):
            at = t0 + 2150.0 + 100.0 * j
            b.annotation("nccl:all_reduce", at, 60.0, tid=AUTOGRAD_TID)
            b.host("record_param_comms", at + 5.0, 40.0, tid=AUTOGRAD_TID)
            end += transfer_us
            b.kernel(
                ALLREDUCE,
                arrive,
                end - arrive,
                launch_at=at + 10.0,
                launch_tid=AUTOGRAD_TID,
                stream=28,
                args=collective_args(nelems),
            )
            arrive = end
        b.annotation("Optimizer.step#SGD.step", t0 + 2400.0, 100.0)
        b.kernel("vectorized_elementwise_kernel", end + 50.0, 200.0, launch_at=t0 + 2410.0)
        b.host("aten::item", t0 + 2520.0, end + 260.0 - (t0 + 2520.0))
        b.sync(t0 + 2530.0, end + 245.0 - (t0 + 2530.0))
    return b


def collective_args(nelems: int) -> dict[str, object]:
    """The arguments Kineto records on an NCCL kernel (PyTorch 2.x)."""
    return {
        "Collective name": "allreduce",
        "In msg nelems": nelems,
        "Out msg nelems": nelems,
        "Group size": WORLD,
        "dtype": "Float",
        "In split size": "[]",
        "Out split size": "[]",
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
        "Process Group Ranks": str(list(range(WORLD))),
    }


def test_a_dlrm_job_with_dotted_range_names_is_one_communication_bound_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "dlrm"
    for rank in range(WORLD):
        dlrm_rank(rank).write(folder / f"rank-{rank}.json.gz")
    code = main(["analyze", str(folder), "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    d = json.loads(out)
    assert d["not_computed"] == {}
    job = d["job"]
    assert (job["ranks"], job["world_size"], len(d["ranks"])) == (WORLD, WORLD, WORLD)
    assert job["matched"] == 4 * len(BUCKETS)
    assert job["unmatched"] == 0
    # The job waits in its all-reduces for the slow rank: the communication/overhead wall.
    assert job["wall"] == "overhead"
    assert job["cause"] == "straggler"
    (slow,) = job["stragglers"]
    assert slow["rank"] == SLOW
    # Each of the other ranks waits for it as long as its compute is longer than theirs, per
    # step: that is what it costs the job's step, not that wait summed over the 7 ranks.
    wait_us = (SLOWER - 1.0) * (sum(FORWARD_US) + sum(BACKWARD_US))
    assert slow["wait_caused_s"] == pytest.approx(wait_us * 1e-6, rel=0.01)
    assert slow["share"] == pytest.approx(wait_us / STEP_US, rel=0.01)
    findings = {f["id"]: f for f in d["findings"]}
    bound = STEP_US / (STEP_US - wait_us)  # Amdahl's: the others' wait removed
    assert findings["straggler"]["max_speedup"] == pytest.approx(bound, rel=0.01)
    # The all-reduce is not overlapped with the backward on any rank: its transfer and the
    # wait, 4.5 ms of rank 0's step, the largest bound.
    assert d["findings"][0]["id"] == "exposed-comm"
    # Rank 0 (the job's own figures) spends most of its step in the all-reduce.
    assert (d["verdict"]["wall"], d["verdict"]["cause"]) == ("overhead", "comm_exposed")
    ranks = {r["rank"]: r for r in d["ranks"]}
    assert ranks[SLOW]["wait_s"] == pytest.approx(0.0)
    for rank in set(ranks) - {SLOW}:
        assert ranks[rank]["wait_s"] == pytest.approx(wait_us * 1e-6, rel=0.01)
    # The module rows: the ranges, nested as on the main thread, whatever their names hold
    # (`## forward ##` is a framework's phase marker, not a module: left out of the rows).
    rows = {tuple(r["names"]): r for r in d["modules"]["rows"]}
    ddp = ("DistributedDataParallel.forward",)
    assert set(rows) == {
        ddp,
        (*ddp, "DLRM_Net.forward"),
        (*ddp, "DLRM_Net.forward", "Torch-Compiled Region: 0/0"),
    }
    # Its forward kernels, and the backward's, tied to the forward ops by sequence number.
    assert rows[ddp]["forward_s"] == pytest.approx(sum(FORWARD_US) * 1e-6)
    assert rows[ddp]["backward_s"] == pytest.approx(sum(BACKWARD_US) * 1e-6)


def test_an_expert_parallel_jobs_straggler_is_read_as_expert_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same job with a MoE token exchange beside its forward (DeepEP's dispatch kernel on
    its own stream, on every rank): the slow rank computes more at every step, which in an
    expert-parallel job is most often its experts receiving more tokens, so the straggler's
    finding says so and leads its fix with balancing the experts' load."""
    from tracegen import MOE_DISPATCH

    folder = tmp_path / "moe"
    for rank in range(WORLD):
        b = dlrm_rank(rank)
        for s in range(4):
            t0 = s * STEP_US
            b.kernel(MOE_DISPATCH, t0 + 450.0, 100.0, launch_at=t0 + 310.0, stream=28)
        b.write(folder / f"rank-{rank}.json.gz")
    assert main(["analyze", str(folder), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "EP" in [s["name"] for s in d["parallelism"]["strategies"]]
    straggler = next(f for f in d["findings"] if f["id"] == "straggler")
    assert "computing: " in straggler["evidence"]
    assert "one whose experts receive more tokens" in straggler["evidence"]
    assert straggler["fix"].startswith("balance the experts' load")
    # Without the exchange (the DDP job above) the straggler's fix is the generic one.
    for rank in range(WORLD):
        dlrm_rank(rank).write(tmp_path / "ddp" / f"rank-{rank}.json.gz")
    assert main(["analyze", str(tmp_path / "ddp"), "--format", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    plain_straggler = next(f for f in plain["findings"] if f["id"] == "straggler")
    assert "experts" not in plain_straggler["evidence"] + plain_straggler["fix"]
