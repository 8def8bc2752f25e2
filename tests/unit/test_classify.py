"""Kernel and op classes from real-world names."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallfinder.analysis import classify
from wallfinder.analysis.classify import MATMUL_CLASSES, KernelClass, classify_kernel, classify_op

K = KernelClass

KERNELS = [
    # cuBLAS, cuBLASLt, CUTLASS, nvjet, hipBLASLt
    ("volta_sgemm_128x64_nn", K.GEMM),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", K.GEMM),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", K.GEMM),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", K.GEMM),
    ("Cijk_Ailk_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0", K.GEMM),
    ("triton_tem_fused_mm_0", K.GEMM),
    # attention
    ("flash_fwd_kernel", K.ATTENTION),
    (
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
        "false, cutlass::bfloat16_t>, false, true, false>(Flash_fwd_params)",
        K.ATTENTION,
    ),
    (
        "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)",
        K.ATTENTION,
    ),
    # convolution (cuDNN implicit GEMM and winograd)
    (
        "sm80_xmma_fprop_implicit_gemm_indexed_f16f16_f16f32_f32_nhwckrsc_nhwc_"
        "tilesize128x128x32_stage4_warpsize2x2x1_g1_tensor16x8x16_alignc4",
        K.CONVOLUTION,
    ),
    (
        "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>"
        "(cudnn::winograd_nonfused::WinogradDataParams<float, float>)",
        K.CONVOLUTION,
    ),
    # NCCL / RCCL
    (
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        K.COMMUNICATION,
    ),
    (
        "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        K.COMMUNICATION,
    ),
    ("void rccl_main_kernel<1, 3>(ncclDevComm*, unsigned long, ncclWork*)", K.COMMUNICATION),
    ("rcclGenericKernel<1>", K.COMMUNICATION),
    # Triton (torch.compile)
    ("triton_poi_fused_add_0", K.ELEMENTWISE),
    ("triton_red_fused_sum_1", K.REDUCTION),
    ("triton_per_fused_native_layer_norm_0", K.NORMALIZATION),
    # ATen
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
        "at::detail::Array<char*, 3>)",
        K.ELEMENTWISE,
    ),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
        K.SOFTMAX,
    ),
    (
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>"
        "(int, float, float const*, float const*, float const*, float*, float*, float*)",
        K.NORMALIZATION,
    ),
    (
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
        "at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >",
        K.REDUCTION,
    ),
    # copies
    ("Memcpy HtoD (Pageable -> Device)", K.COPY),
    ("Memcpy DtoH (Device -> Pinned)", K.COPY),
    ("Memset (Device)", K.COPY),
]


@pytest.mark.parametrize(("name", "expected"), KERNELS, ids=[n[:40] for n, _ in KERNELS])
def test_kernel_name_gets_its_class(name: str, expected: KernelClass) -> None:
    assert classify_kernel(name) is expected


OPS = [
    ("aten::mm", K.GEMM),
    ("aten::addmm", K.GEMM),
    ("aten::linear", K.GEMM),
    ("aten::bmm", K.GEMM),
    ("nccl:all_reduce", K.COMMUNICATION),
    ("gloo:all_reduce", K.COMMUNICATION),
    ("c10d::allreduce_", K.COMMUNICATION),
    ("record_param_comms", K.COMMUNICATION),
    ("aten::scaled_dot_product_attention", K.ATTENTION),
    ("aten::conv2d", K.CONVOLUTION),
    ("aten::cudnn_convolution", K.CONVOLUTION),
    ("aten::_softmax", K.SOFTMAX),
    ("aten::layer_norm", K.NORMALIZATION),
    ("aten::sum", K.REDUCTION),
    ("aten::copy_", K.COPY),
    ("aten::add_", K.ELEMENTWISE),
    ("aten::mul", K.ELEMENTWISE),
    ("aten::view", K.OTHER),
    ("aten::empty", K.OTHER),
    ("aten::reshape", K.OTHER),
    ("cudaLaunchKernel", K.OTHER),
]


@pytest.mark.parametrize(("name", "expected"), OPS, ids=[n for n, _ in OPS])
def test_op_name_gets_its_class(name: str, expected: KernelClass) -> None:
    assert classify_op(name) is expected


def test_kernel_classification_ignores_case() -> None:
    assert classify_kernel("VOLTA_SGEMM_128X64_NN") is K.GEMM
    assert classify_kernel("NCCLDEVKERNEL_ALLREDUCE") is K.COMMUNICATION


def test_unknown_kernel_name_is_other() -> None:
    assert classify_kernel("my_custom_kernel") is K.OTHER
    assert classify_kernel("") is K.OTHER


def test_every_class_value_is_one_of_the_eleven_names() -> None:
    assert {c.value for c in KernelClass} == {
        "gemm",
        "attention",
        "convolution",
        "depthwise_conv",
        "elementwise",
        "reduction",
        "normalization",
        "softmax",
        "copy",
        "communication",
        "other",
    }


# Substring rules must not match inside unrelated words (regressions found on real names).


def test_inductor_pointwise_kernel_named_after_convert_element_type_is_elementwise() -> None:
    # Inductor names fused kernels after the ops they contain; dtype casts are
    # `convert_element_type`. This is a cast, not a convolution (a matmul class).
    assert classify_kernel("triton_poi_fused_convert_element_type_0") is K.ELEMENTWISE


def test_vllm_fused_add_rms_norm_kernel_is_normalization() -> None:
    # Verbatim from the real trace tracelens/b200_eager_rank0.json.gz.
    name = (
        "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
        "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, "
        "c10::BFloat16*, c10::BFloat16 const*, float, int, int)"
    )
    assert classify_kernel(name) is K.NORMALIZATION


def test_aten_broadcast_tensors_is_not_communication() -> None:
    # aten::broadcast_tensors appears in hta/a100-80gb_16rank_rank0.json.gz; it only expands
    # views, so it must not count as a collective (communication time on the host).
    assert classify_op("aten::broadcast_tensors") is not K.COMMUNICATION


# FBGEMM (TorchRec's embedding library): its namespace holds "gemm", but these kernels gather
# embedding rows or shuffle sparse features; none is a matmul. Names verbatim from the real
# traces hta/a100-80gb_16rank_rank0 and hta/a100_8rank_control_rank0 (parameter lists cut).
FBGEMM_KERNELS = [
    ("void fbgemm_gpu::permute_2D_data_kernel<false, int, int, float>(int, int, int*)", K.COPY),
    ("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*)", K.COPY),
    ("void fbgemm_gpu::permute_indices_weights_kernel<true, int, float>(int, int)", K.COPY),
    (
        "void split_embedding_codegen_forward_unweighted_kernel<float, float, float, false, "
        "long, 1ul, 16ul>(at::GenericPackedTensorAccessor<float, 1ul, at::RestrictPtrTraits, "
        "long>)",
        K.ELEMENTWISE,
    ),
    (
        "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1"
        "<float, float, float, 1ul, 16>(at::GenericPackedTensorAccessor<float, 2ul, "
        "at::RestrictPtrTraits, long>)",
        K.ELEMENTWISE,
    ),
]


@pytest.mark.parametrize(
    ("name", "expected"), FBGEMM_KERNELS, ids=[n[5:50] for n, _ in FBGEMM_KERNELS]
)
def test_fbgemm_embedding_and_permute_kernels_are_not_gemm(
    name: str, expected: KernelClass
) -> None:
    assert classify_kernel(name) is expected


def test_fbgemm_kernels_with_no_class_in_their_name_take_their_ops_class() -> None:
    # Not gemm by the namespace: left to the launching op (an fbgemm op with no rule: other).
    kernel = "void fbgemm_gpu::_block_bucketize_sparse_features_cuda_kernel1<int, int>(int)"
    assert classify_kernel(kernel) is K.OTHER


def test_a_cutlass_gemm_built_by_fbgemm_is_still_gemm() -> None:
    # FBGEMM's own GPU matmuls (fp8 rowwise) are CUTLASS kernels: their names say so.
    name = (
        "void cutlass::device_kernel<fbgemm_gpu::f8f8bf16_rowwise_impl::GemmUniversal<"
        "cute::tuple<int, int, int>>>(fbgemm_gpu::Params)"
    )
    assert classify_kernel(name) is K.GEMM


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("fbgemm::permute_2D_sparse_data", K.COPY),
        ("fbgemm::permute_sparse_features", K.COPY),
        ("fbgemm::permute_pooled_embs_auto_grad", K.COPY),
        ("fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function", K.ELEMENTWISE),
        ("fbgemm::split_embedding_codegen_forward_cpu", K.ELEMENTWISE),
    ],
)
def test_fbgemm_embedding_and_permute_ops_get_their_class(name: str, expected: KernelClass) -> None:
    assert classify_op(name) is expected


def test_depthwise_convolutions_are_their_own_class_not_a_matmul() -> None:
    """Depthwise kernels are stencils per channel, memory-bound, with no tensor cores: not a
    matmul class (issue 33). The native kernels and their op by name."""
    for name in (
        "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel<5, float, int>",
        "void at::native::(anonymous namespace)::conv_depthwise2d_grad_weight_kernel<float>",
    ):
        assert classify_kernel(name) is K.DEPTHWISE
    assert classify_op("aten::_conv_depthwise2d") is K.DEPTHWISE
    assert K.DEPTHWISE not in MATMUL_CLASSES
    assert classify_kernel("implicit_convolve_sgemm") is K.CONVOLUTION


# The communication tests over every distinct name of a trace try no class after
# communication's: the same answer as classifying, on every listed name and on names built
# from the needles of several classes (the first class in the rules' order wins), with the
# "convert" and "fbgemm" cuts, autograd nodes and metadata ops.
_NEEDLES = [
    n for rules in (classify._OP_RULES, classify._KERNEL_RULES) for _, ns in rules for n in ns
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from([*_NEEDLES, "convert", "fbgemm", "Backward0", "aten::", "NCCL", "_", " "]),
        max_size=4,
    ).map("".join)
)
def test_the_communication_tests_answer_as_classifying_does(name: str) -> None:
    for text in (name, f"autograd::engine::evaluate_function: {name}Backward0", name.upper()):
        assert classify.is_communication_op(text) is (classify_op(text) is K.COMMUNICATION)
        assert classify.is_communication_kernel(text) is (classify_kernel(text) is K.COMMUNICATION)


@pytest.mark.parametrize("name", [n for n, _ in KERNELS + OPS] + ["aten::view", "allconvertreduce"])
def test_the_communication_tests_answer_as_classifying_does_on_known_names(name: str) -> None:
    assert classify.is_communication_op(name) is (classify_op(name) is K.COMMUNICATION)
    assert classify.is_communication_kernel(name) is (classify_kernel(name) is K.COMMUNICATION)
