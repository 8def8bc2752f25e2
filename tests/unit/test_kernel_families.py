"""Communication kernel families beyond NCCL, and matmuls whose bound only shapes can tell:
classified from names real libraries give their kernels, then seen through a whole analysis."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_roofline import A100, op_with_kernel

from tracegen import TraceBuilder
from wallfinder import analyze
from wallfinder.analysis.classify import (
    COMM_FAMILIES,
    KernelClass,
    classify_kernel,
    comm_family,
    kernel_tile,
)

# Kernel names as the libraries write them (templates and argument lists shortened).
COMMUNICATION_KERNELS = {
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)": "NCCL/RCCL",
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "NCCL/RCCL",
    "void mscclpp::allreduce8<__nv_bfloat16>(__nv_bfloat16*, ...)": "MSCCL/MSCCL++",
    "void nvshmemi_transfer_rma_nbi_translate_kernel(...)": "NVSHMEM",
    "void deep_ep::internode::dispatch<false, 8, 2, 512>(int4*, float*, int*, ...)": (
        "DeepEP expert-parallel"
    ),
    "void deep_ep::internode::combine<8, 2>(int4*, float*, ...)": "DeepEP expert-parallel",
    "void deep_ep::internode::notify_dispatch<true, 8>(int const*, int*, ...)": (
        "DeepEP expert-parallel"
    ),
    "void deep_ep::internode::cached_notify<8>(int, int, int, ...)": "DeepEP expert-parallel",
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, ...)": (
        "DeepEP expert-parallel"
    ),
    "void deep_ep::internode_ll::combine<false, 4096>(void*, ...)": "DeepEP expert-parallel",
    "void pplx::dispatchKernel<unsigned char, 8, 128>(...)": "pplx expert-parallel",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, ...)": (
        "vLLM/SGLang custom all-reduce"
    ),
    "void sglang::cross_device_reduce_2stage<half, 4>(sglang::RankData*, ...)": (
        "vLLM/SGLang custom all-reduce"
    ),
    "void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16, 8>(...)": (
        "torch symmetric memory / c10d intra-node"
    ),
    "void c10d::intra_node_comm::twoShotAllReduceKernel<16>(at::BFloat16*, ...)": (
        "torch symmetric memory / c10d intra-node"
    ),
    "userbuffers_fp16_sum_inplace_gpu_rr_rs(int, int, int, int, int, int, void**, ...)": (
        "Transformer Engine userbuffers"
    ),
}


@pytest.mark.parametrize("name", sorted(COMMUNICATION_KERNELS))
def test_communication_libraries_kernels_are_communication(name: str) -> None:
    assert classify_kernel(name) is KernelClass.COMMUNICATION
    assert comm_family(name) == COMMUNICATION_KERNELS[name]


def test_every_family_has_an_example_of_its_own() -> None:
    for family, _, example in COMM_FAMILIES:
        assert comm_family(example) == family
        assert classify_kernel(example) is KernelClass.COMMUNICATION


@pytest.mark.parametrize(
    "name",
    [
        # DeepEP's layout kernel counts tokens per rank: compute, not a transfer.
        "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, ...)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>()",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
    ],
)
def test_kernels_of_other_work_are_not_communication(name: str) -> None:
    assert classify_kernel(name) is not KernelClass.COMMUNICATION
    assert comm_family(name) is None


GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
DISPATCH = "void deep_ep::internode::dispatch<false, 8, 2, 512>(int4*, float*, int*)"


def test_an_exposed_expert_parallel_dispatch_is_exposed_communication(tmp_path: Path) -> None:
    # Each 1000 µs step: a 600 µs GEMM, then a 300 µs DeepEP dispatch on its own stream with
    # nothing beside it, then 100 µs idle.
    b = TraceBuilder()
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.kernel(GEMM, t0, 600.0, launch_at=t0)
        b.kernel(DISPATCH, t0 + 600.0, 300.0, launch_at=t0 + 5.0, stream=20)
    d = analyze(b.write(tmp_path / "t.json"))
    per_step = d.breakdown.per_step_ms
    assert per_step["comm_exposed"] == pytest.approx(0.3)
    assert per_step["compute"] == pytest.approx(0.6)
    # The busy time is all matmul: the dispatch no longer dilutes it as "other" compute.
    assert [c.cls for c in d.classes] == ["gemm", "communication"]
    d.self_check()


def _decode_trace(m: int, *, shapes: bool, kernel: str = GEMM) -> TraceBuilder:
    """Decode-like steps: 8 GEMMs of [m, 4096] x [4096, 4096] bf16 back to back, 50 µs each,
    the device busy throughout."""
    b = TraceBuilder(device_name=A100)
    dims = [[m, 4096], [4096, 4096]] if shapes else []
    types = ["c10::BFloat16", "c10::BFloat16"] if shapes else []
    for s in range(4):
        t0 = s * 410.0
        b.step(s + 1, t0, 410.0)
        for i in range(8):
            op_with_kernel(b, "aten::mm", dims, types, t0 + i * 50, kernel, t0 + 5 + i * 50, 50.0)
    return b


def test_a_gemm_with_no_shapes_has_an_unknown_bound_and_the_verdict_says_so(
    tmp_path: Path,
) -> None:
    d = analyze(_decode_trace(4, shapes=False).write(tmp_path / "t.json"))
    assert (d.kernels[0].bound, d.kernels[0].bound_basis) == (None, None)
    r = d.roofline
    assert r is not None
    assert r.compute_bound_share == 0.0
    assert r.matmul_unknown_share == pytest.approx(1.0)
    assert d.verdict.wall == "compute"
    assert d.verdict.cause == "matmul-bound (GEMM bound unknown: no shapes)"
    assert "shapes were not recorded" in d.verdict.reason
    assert "GEMMs whose bound is unknown" in d.verdict.questions[3].detail
    d.self_check()


def test_a_decode_step_whose_gemms_stream_weights_is_a_bandwidth_wall(tmp_path: Path) -> None:
    # M = 4: 2·4·4096·4096 FLOPs over ≈ 2·4096·4096 bytes of weights: AI ≈ 4, far below
    # the A100's bf16 ridge (312e12 / 2.039e12 ≈ 153).
    d = analyze(_decode_trace(4, shapes=True).write(tmp_path / "t.json"))
    r = d.roofline
    assert r is not None
    mm = r.ops[0]
    assert mm.bound == "bandwidth"
    weights_and_activations = 2 * (4 * 4096 * 2 + 4096 * 4096)
    assert mm.ai == pytest.approx(2 * 4 * 4096 * 4096 / weights_and_activations, rel=0.01)
    assert r.matmul_bandwidth_share == pytest.approx(1.0)
    assert d.verdict.wall == "bandwidth"
    assert d.verdict.cause == "matmuls streaming operands"
    assert d.verdict.questions[2].answer == "no"
    # On the timeline too: the GEMMs hold the busy time, all of it streaming.
    gemm = next(c for c in d.classes if c.cls == "gemm")
    assert (gemm.busy, gemm.streaming) == (pytest.approx(1.0), pytest.approx(1.0))
    d.self_check()


def test_the_same_gemm_with_a_training_batch_is_compute_bound(tmp_path: Path) -> None:
    d = analyze(_decode_trace(8192, shapes=True).write(tmp_path / "t.json"))
    assert d.roofline is not None
    assert d.roofline.ops[0].bound == "compute"
    assert d.verdict.wall == "compute"


def test_a_gemv_kernel_streams_its_operands_with_no_shapes(tmp_path: Path) -> None:
    gemv = "void gemv2T_kernel_val<int, int, __nv_bfloat16, float, 128, 16, 4, 4, false>(...)"
    d = analyze(_decode_trace(1, shapes=False, kernel=gemv).write(tmp_path / "t.json"))
    assert (d.kernels[0].bound, d.kernels[0].bound_basis) == ("bandwidth", "class")
    assert d.verdict.wall == "bandwidth"


@pytest.mark.parametrize(
    ("name", "tile"),
    [
        ("Cijk_Alik_Bljk_BBS_BH_MT16x16x256_MI16x16x16x1_SN_1LDSB0_APM1", (16, 16)),
        ("Cijk_Ailk_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0", (128, 128)),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x16x64_warpgroupsize1x1x1", (64, 16)),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", (64, 8)),
        ("volta_sgemm_64x64_nn", (64, 64)),
        ("ampere_fp16_s1688gemm_fp16_128x128_ldg8_relu_f2f_stages_32x1_tn", (128, 128)),
        # CUTLASS repeats its name in the argument list; its second pair is the K tile.
        (
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>("
            "cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1::Params)",
            (256, 64),
        ),
        # MIOpen's implicit-GEMM convolutions name other tiles: none is read.
        ("igemm_wrw_gtcx2_nhwc_bf16_bx0_ex1_bt256x128x16_wt32x32x8_ws2x1_wr2x2", None),
    ],
)
def test_gemm_kernel_names_give_their_tile(name: str, tile: tuple[int, int] | None) -> None:
    assert kernel_tile(name) == tile


def test_a_gemm_with_a_skinny_tile_streams_its_operands_with_no_shapes(tmp_path: Path) -> None:
    skinny = "Cijk_Alik_Bljk_BBS_BH_MT16x16x256_MI16x16x16x1_SN_1LDSB0_APM1"
    d = analyze(_decode_trace(1, shapes=False, kernel=skinny).write(tmp_path / "t.json"))
    assert (d.kernels[0].bound, d.kernels[0].bound_basis) == ("bandwidth", "class")
    assert d.verdict.wall == "bandwidth"
    wide = "Cijk_Ailk_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0"
    d = analyze(_decode_trace(1, shapes=False, kernel=wide).write(tmp_path / "w.json"))
    assert d.kernels[0].bound is None
