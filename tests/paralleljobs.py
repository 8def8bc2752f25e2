"""Generated traces of the 3D-parallel GPU jobs issue 32 names, faithful to what their Kineto
traces hold (one trace per rank; times in µs from the trace's start):

- `megatron_rank`: a Megatron-LM job on 8 A800s, tensor parallel 2 × pipeline parallel 2 ×
  data parallel 2 (ranks 0–3 hold stage 0, 4–7 stage 1; Megatron's rank order), 2
  microbatches per step under its 1F1B schedule. Megatron records no schedule ranges: a
  trace with Python stacks holds its `forward_step`/`backward_step` frames, its p2p calls
  (`send_forward_recv_backward`, ...) and its tensor-parallel layers (`ColumnParallelLinear`,
  `RowParallelLinear`, `_VocabParallelCrossEntropy`, the backward's
  `LinearWithGradAccumulationAndAsyncCommunicationBackward` nodes); NCCL's SendRecv kernels
  carry the pipeline group's arguments; `distributedInfo.pg_config` names Megatron's groups
  (`group_desc`, Megatron-core since 2024) where `descs` is set, "undefined" before.
- `zero_rank`: a DeepSpeed ZeRO-1/2 rank whose gradient reduction runs after the whole
  backward (no overlap_comm): `reduce_ipg_grads`/`average_tensor` frames, reduce-scatters of
  the gradient buckets on the NCCL stream with nothing beside them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracegen import AUTOGRAD_TID, MODULE, TraceBuilder

A800 = "NVIDIA A800-SXM4-80GB"
GEMM = "ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_nn"
SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclWorkElem)"
REDUCE_SCATTER = "ncclKernel_ReduceScatter_RING_LL_Sum_bf16(ncclWorkElem)"
ADAM = "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>"
SCHEDULES = "megatron/core/pipeline_parallel/schedules.py"
P2P = "megatron/core/pipeline_parallel/p2p_communication.py"
NODE = "autograd::engine::evaluate_function: "

STEP_MS = 622.0
MEGATRON_GROUPS = (
    ("0", "default_pg", 8),
    ("1", "TENSOR_MODEL_PARALLEL_GROUP", 2),
    ("2", "PIPELINE_MODEL_PARALLEL_GROUP", 2),
    ("3", "DATA_PARALLEL_GROUP", 2),
    ("4", "MODEL_PARALLEL_GROUP", 4),
)
STAGE_MS = ((60.0, 120.0), (72.0, 144.0))
"""Per stage, one microbatch's forward and backward (the last stage holds the vocabulary's
projection and cross entropy: 20% more)."""


@dataclass
class RankBuilder(TraceBuilder):
    """A TraceBuilder whose `distributedInfo` carries more (process groups), its times in
    ms."""

    distributed: dict[str, Any] = field(default_factory=dict)
    scale: float = 1000.0
    """Times given in ms (µs × 1000)."""

    def host(self, name: str, start: float, dur: float, **kw: Any) -> dict[str, Any]:
        return super().host(name, start * self.scale, dur * self.scale, **kw)

    def _device_event(self, cat: str, name: str, start: float, dur: float, **kw: Any) -> int:
        kw["launch_dur"] = kw["launch_dur"] / self.scale  # µs, as host() scales it
        return super()._device_event(cat, name, start * self.scale, dur * self.scale, **kw)

    def header(self, *, device_properties: bool = True) -> dict[str, Any]:
        head = super().header(device_properties=device_properties)
        head.setdefault("distributedInfo", {}).update(self.distributed)
        return head


def _args(group: tuple[str, str, int], name: str, nelems: int) -> dict[str, Any]:
    pg, desc, size = group
    return {
        "Collective name": name,
        "In msg nelems": nelems,
        "Out msg nelems": nelems,
        "Group size": size,
        "dtype": "BFloat16",
        "In split size": "[]",
        "Out split size": "[]",
        "Process Group Name": pg,
        "Process Group Description": desc,
        "Process Group Ranks": "[]",
    }


def megatron_rank(rank: int, *, descs: bool = True, stacks: bool = True) -> RankBuilder:
    """Rank `rank` of the Megatron TP2/PP2/DP2 job: 4 steps of 622 ms. Stage 0 (ranks 0–3)
    runs F0, sends it, F1, then waits in `send_forward_recv_backward` until stage 1 has run
    F0 and B0 (156 ms), B0, waits in `recv_backward` for B1's gradients (97 ms), B1: 255 ms
    of each step in SendRecv with nothing beside it. Stage 1 (ranks 4–7) waits 61 ms for
    F0's activations, then runs F0 B0 F1 B1 back to back (the slowest stage sets the pace),
    then waits in the model-parallel group's gradient-norm all-reduce for stage 0's last
    backward. Each forward ends with RowParallelLinear's tensor-parallel all-reduce, each
    backward with ColumnParallelLinear's; after the pipeline, the data-parallel group's
    gradient all-reduce (Megatron's DDP, `finish_grad_sync`) and Adam. `descs`: the groups'
    descriptions in `pg_config` (else "undefined"); `stacks`: the Python frames recorded."""
    groups = [
        {
            "pg_name": pg,
            "pg_desc": desc if descs or desc == "default_pg" else "undefined",
            "backend_config": "cuda:nccl",
            "pg_size": size,
            "ranks": "[]",
        }
        for pg, desc, size in MEGATRON_GROUPS
    ]
    b = RankBuilder(
        device_name=A800,
        rank=rank,
        world_size=8,
        distributed={"pg_count": len(groups), "pg_config": groups, "nccl_version": "2.18.1"},
    )
    tp, pp, dp, mp = MEGATRON_GROUPS[1:]
    stage = rank // 4
    fwd, bwd = STAGE_MS[stage]

    def frame(name: str, start: float, dur: float, tid: int | None = None) -> None:
        if stacks:
            b.host(name, start, dur, cat="python_function", tid=tid)

    def launch(at: float) -> float:
        return at - 0.02

    def forward(i: int, at: float) -> None:
        frame(f"{SCHEDULES}(250): forward_step", at, fwd)
        gemm = (fwd - fwd / 6) / 2
        for k, layer in enumerate(("ColumnParallelLinear", "RowParallelLinear")):
            start = at + k * gemm
            b.host(f"{MODULE}{layer}_{k}", start - 0.05, gemm, cat="python_function")
            b.host("aten::mm", start + 0.01, 0.02, args={"Sequence number": 100 * i + k})
            b.kernel(GEMM, start, gemm, launch_at=launch(start))
        if stage == 1:
            b.host(f"{MODULE}_VocabParallelCrossEntropy", at + 2 * gemm - 1.0, 0.5)
        start = at + 2 * gemm
        b.host("c10d::allreduce_", start - 0.03, 0.02)
        b.kernel(
            ALLREDUCE,
            start,
            fwd / 6,
            launch_at=launch(start),
            stream=28,
            args=_args(tp, "allreduce", 1 << 22),
        )

    def backward(i: int, at: float) -> None:
        frame(f"{SCHEDULES}(330): backward_step", at, bwd)
        gemm = (bwd - bwd / 6) / 2
        for k in range(2):
            start = at + k * gemm
            node = "LinearWithGradAccumulationAndAsyncCommunicationBackward"
            args = {"Sequence number": 100 * i + 1 - k, "Fwd thread id": 1}
            b.host(NODE + node, start - 0.05, gemm, tid=AUTOGRAD_TID, args=args)
            b.kernel(GEMM, start, gemm, launch_at=launch(start), launch_tid=AUTOGRAD_TID)
        start = at + 2 * gemm
        node = NODE + "_ReduceFromModelParallelRegionBackward"
        b.host(node, start - 0.05, 0.04, tid=AUTOGRAD_TID, args={"Fwd thread id": 1})
        b.host("c10d::allreduce_", start - 0.03, 0.02, tid=AUTOGRAD_TID)
        b.kernel(
            ALLREDUCE,
            start,
            bwd / 6,
            launch_at=launch(start),
            stream=28,
            launch_tid=AUTOGRAD_TID,
            args=_args(tp, "allreduce", 1 << 22),
        )

    def p2p(name: str, at: float, dur: float, ops: tuple[str, ...]) -> None:
        frame(f"{P2P}(400): {name}", at - 0.05, dur + 0.05)
        for op in ops:
            b.host(op, at - 0.04, 0.01)
            b.host("nccl:" + op.split("::")[1].rstrip("_"), at - 0.03, 0.01, cat="user_annotation")
        b.kernel(
            SENDRECV, at, dur, launch_at=launch(at), stream=30, args=_args(pp, "send", 1 << 23)
        )
        b.sync(at, dur, name="cudaDeviceSynchronize")

    for s in range(4):
        t0 = s * STEP_MS
        b.step(s + 1, t0 - 0.1, STEP_MS)  # the host a little ahead of its first kernel
        if stage == 0:
            forward(0, t0)
            p2p("send_forward", t0 + 60.0, 1.0, ("c10d::send",))
            forward(1, t0 + 61.0)
            p2p("send_forward_recv_backward", t0 + 121.0, 156.0, ("c10d::send", "c10d::recv_"))
            backward(0, t0 + 277.0)
            p2p("recv_backward", t0 + 397.0, 97.0, ("c10d::recv_",))
            backward(1, t0 + 494.0)
            tail, norm = t0 + 614.0, 2.0
        else:
            p2p("recv_forward", t0, 61.0, ("c10d::recv_",))
            forward(0, t0 + 61.0)
            backward(0, t0 + 133.0)
            p2p("send_backward_recv_forward", t0 + 277.0, 1.0, ("c10d::send", "c10d::recv_"))
            forward(1, t0 + 278.0)
            backward(1, t0 + 350.0)
            p2p("send_backward", t0 + 494.0, 1.0, ("c10d::send",))
            tail, norm = t0 + 495.0, 121.0
        frame(
            "megatron/core/distributed/distributed_data_parallel.py(300): finish_grad_sync",
            tail,
            4.0,
        )
        b.host("c10d::allreduce_", tail - 0.03, 0.02)
        b.kernel(
            ALLREDUCE,
            tail,
            4.0,
            launch_at=launch(tail),
            stream=28,
            args=_args(dp, "allreduce", 1 << 24),
        )
        b.host("c10d::allreduce_", tail + 3.97, 0.02)
        b.kernel(
            ALLREDUCE,
            tail + 4.0,
            norm,
            launch_at=launch(tail + 4.0),
            stream=28,
            args=_args(mp, "allreduce", 1),
        )
        b.annotation("Optimizer.step#FusedAdam.step", t0 + 619.9, 2.0)
        b.kernel(ADAM, t0 + 620.0, 2.0, launch_at=t0 + 619.95)
    return b


ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::DivFunctor<float>>"
CAST = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>"
STAGE_1_AND_2 = "deepspeed/runtime/zero/stage_1_and_2.py(1180): "
ZERO_STEP_MS = 100.0


def zero_rank(rank: int, *, reduce_ms: float = 25.0, cast_ms: float = 30.0) -> RankBuilder:
    """Rank `rank` of a DeepSpeed ZeRO-1 job on 2 A800s (no overlap_comm): 4 steps of 100 ms.
    The forward (25 ms) and the backward (40 ms) are GEMMs with fp32→bf16 casts between them
    (`cast_ms` of copy kernels a step, on the compute stream); after the whole backward, on the
    main thread, `reduce_ipg_grads` > `average_tensor` scale the gradient buckets and
    reduce-scatter them, `reduce_ms` with nothing beside them; then Adam."""
    b = RankBuilder(device_name=A800, rank=rank, world_size=2)
    dp = ("0", "default_pg", 2)

    def run(at: float, name: str, ms: float, tid: int | None = None) -> None:
        b.host(name, at - 0.05, 0.04, tid=tid)
        b.kernel(GEMM if name == "aten::mm" else CAST, at, ms, launch_at=at - 0.02, launch_tid=tid)

    for s in range(4):
        t0 = s * ZERO_STEP_MS
        b.step(s + 1, t0 - 0.1, ZERO_STEP_MS)
        b.host("deepspeed/runtime/engine.py(1900): forward", t0, 25.0, cat="python_function")
        run(t0 + 0.1, "aten::_to_copy", cast_ms / 4)
        run(t0 + 0.1 + cast_ms / 4, "aten::mm", 24.9 - cast_ms / 4)
        back = t0 + 25.0
        b.host(NODE + "MmBackward0", back, 40.0, tid=AUTOGRAD_TID, args={"Fwd thread id": 1})
        run(back + 0.1, "aten::_to_copy", 3 * cast_ms / 4, AUTOGRAD_TID)
        run(back + 0.1 + 3 * cast_ms / 4, "aten::mm", 39.9 - 3 * cast_ms / 4, AUTOGRAD_TID)
        tail = t0 + 65.0
        b.host(STAGE_1_AND_2 + "reduce_ipg_grads", tail, reduce_ms + 0.5, cat="python_function")
        b.host(STAGE_1_AND_2 + "average_tensor", tail + 0.1, reduce_ms, cat="python_function")
        # The bucket scaled by 1/world size before it is reduced: no module, no autograd node.
        b.host("aten::div_", tail + 0.11, 0.02)
        b.kernel(ELEMENTWISE, tail + 0.12, 0.15, launch_at=tail + 0.115)
        b.host("c10d::_reduce_scatter_base_", tail + 0.2, 0.02)
        b.kernel(
            REDUCE_SCATTER,
            tail + 0.3,
            reduce_ms,
            launch_at=tail + 0.21,
            stream=28,
            args=_args(dp, "_reduce_scatter_base", 1 << 26),
        )
        opt = tail + reduce_ms + 1.0
        b.annotation("Optimizer.step#DeepSpeedZeroOptimizer.step", opt, 2.0)
        b.kernel(ADAM, opt + 0.1, 2.0, launch_at=opt + 0.05)
    return b
