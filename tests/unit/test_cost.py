"""Cost models: one hand-computed cost per model (the arithmetic written out), robustness on
arbitrary input (a Cost or None, never an exception), and FLOPs checked against
`torch.utils.flop_counter` on the arguments the profiler really records (skipped without
torch)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wallfinder.cost import Cost, op_cost, supported_ops
from wallfinder.cost.elementwise import TRANSCENDENTAL_FLOPS
from wallfinder.cost.optimizer import ADAM_FLOPS
from wallfinder.dtypes import ELEMENT_BYTES
from wallfinder.trace.args import read_op_args

BF16, FP16, FP32, FP8, I64 = "c10::BFloat16", "c10::Half", "float", "c10::Float8_e4m3fn", "long int"
MODELS = {
    "gemm", "conv", "attention", "norm", "softmax", "elementwise", "reduction", "embedding",
    "loss", "optimizer", "copy", "grouped_conv",
}  # fmt: skip


def cost(name: str, dims: Any, types: Any, concrete: Any = None) -> Cost | None:
    """`op_cost` on the JSON of Python values, read as the loader reads it."""
    raw_concrete = b"" if concrete is None else json.dumps(concrete).encode()
    return raw_cost(name, json.dumps(dims).encode(), json.dumps(types).encode(), raw_concrete)


def raw_cost(name: str, dims: bytes, types: bytes, concrete: bytes = b"") -> Cost | None:
    """`op_cost` on a record's text, read as `Trace.op_args` reads it."""
    return op_cost(name, read_op_args(dims, types, concrete))


def known(name: str, dims: Any, types: Any, concrete: Any = None) -> Cost:
    result = cost(name, dims, types, concrete)
    assert result is not None, f"{name} {dims} has no cost"
    return result


# --- GEMM ------------------------------------------------------------------------------------


def test_mm_bf16() -> None:
    c = known("aten::mm", [[64, 128], [128, 256]], [BF16, BF16])
    assert c == Cost(2 * 64 * 128 * 256, (64 * 128 + 128 * 256 + 64 * 256) * 2, "bf16", "gemm")


def test_addmm_reads_the_bias_but_counts_no_flops_for_it() -> None:
    c = known("aten::addmm", [[256], [64, 128], [128, 256], [], []], [FP32] * 3 + ["Scalar"] * 2)
    assert c.flops == 2 * 64 * 128 * 256
    assert c.bytes == (256 + 64 * 128 + 128 * 256 + 64 * 256) * 4
    assert c.dtype == "fp32"  # TF32 cannot be seen in a trace


def test_bmm_and_baddbmm() -> None:
    c = known("aten::bmm", [[8, 64, 32], [8, 32, 16]], [FP16, FP16])
    assert c.flops == 2 * 8 * 64 * 16 * 32
    assert c.bytes == (8 * 64 * 32 + 8 * 32 * 16 + 8 * 64 * 16) * 2
    c = known(
        "aten::baddbmm", [[8, 64, 16], [8, 64, 32], [8, 32, 16], [], []], [FP16] * 3 + [""] * 2
    )
    assert c.flops == 2 * 8 * 64 * 16 * 32
    assert c.bytes == (8 * 64 * 16 + 8 * 64 * 32 + 8 * 32 * 16 + 8 * 64 * 16) * 2


def test_matmul_broadcasts_batch_dims_and_reads_each_operand_once() -> None:
    c = known("aten::matmul", [[2, 1, 4, 5], [3, 5, 6]], [FP32, FP32])
    assert c.flops == 2 * (2 * 3) * 4 * 6 * 5
    assert c.bytes == (2 * 1 * 4 * 5 + 3 * 5 * 6 + 2 * 3 * 4 * 6) * 4
    assert known("aten::matmul", [[5], [5, 6]], [FP32, FP32]).flops == 2 * 6 * 5
    assert cost("aten::matmul", [[2, 4, 5], [3, 5, 6]], [FP32, FP32]) is None  # 2 vs 3


def test_linear_weight_is_out_by_in() -> None:
    c = known("aten::linear", [[4, 8, 16], [32, 16], [32]], [BF16] * 3)
    assert c.flops == 2 * (4 * 8) * 32 * 16
    assert c.bytes == (4 * 8 * 16 + 32 * 16 + 32 + 4 * 8 * 32) * 2
    no_bias = known("aten::linear", [[4, 8, 16], [32, 16], []], [BF16, BF16, ""])
    assert no_bias.bytes == c.bytes - 32 * 2


def test_scaled_mm_is_fp8_with_the_recorded_output_dtype() -> None:
    types = [FP8, FP8, FP32, FP32, "", "", "Scalar", "Scalar"]
    dims = [[64, 128], [128, 256], [], [], [], [], [], []]
    c = known("aten::_scaled_mm", dims, types, ["", "", "", "", "", "", "15", "False"])
    assert c.flops == 2 * 64 * 128 * 256
    assert c.bytes == 64 * 128 + 128 * 256 + 4 + 4 + 64 * 256 * 2  # two fp32 scales, bf16 out
    assert c.dtype == "fp8"


def test_gemm_from_a_real_trace_and_autograd_nodes_without_shapes() -> None:
    c = known("aten::addmm", [[64], [4096, 2798], [2798, 64], [], []], [FP32] * 3 + ["Scalar"] * 2)
    assert c.flops == 2 * 4096 * 64 * 2798
    assert cost("AddmmBackward0", [[8, 5]], [FP32]) is None
    assert raw_cost("aten::mm", b"", b"") is None
    assert cost("aten::mm", [[4096, 64], [65, 2798]], [FP32, FP32]) is None  # K mismatch


# --- Convolution -----------------------------------------------------------------------------

CONV_TYPES = [BF16, BF16, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList"]
CONV_TYPES += ["Scalar"]


def test_grouped_strided_conv2d() -> None:
    dims = [[8, 16, 32, 32], [32, 8, 3, 3], [], [], [], [], [], [], []]
    concrete = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "2"]
    c = known("aten::convolution", dims, CONV_TYPES, concrete)
    out = (32 + 2 * 1 - 1 * (3 - 1) - 1) // 2 + 1  # 16
    assert c.flops == 2 * 8 * 32 * (16 // 2) * 3 * 3 * out * out
    assert c.bytes == (8 * 16 * 32 * 32 + 32 * 8 * 3 * 3 + 8 * 32 * out * out) * 2
    # Two groups: a grouped convolution, not a tensor-core matmul.
    assert c.model == "grouped_conv"
    # Without Concrete Inputs the output size is unknown: no cost.
    assert cost("aten::convolution", dims, CONV_TYPES) is None


def test_depthwise_conv_is_costed_with_its_groups_and_is_memory_bound() -> None:
    """FLOPs = 2·N·C_out·H_out·W_out·(C_in/groups)·K_h·K_w; bytes of input, weight, output.
    A 3×3 depthwise convolution in fp32 has AI ≈ 2 (issue 33)."""
    n, c, h, k = 32, 256, 56, 3
    dims = [[n, c, h, h], [c, 1, k, k], [], [], [], [], []]
    concrete = ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", str(c)]
    conv2d = known("aten::conv2d", dims, [FP32, FP32, *CONV_TYPES[2:7]], concrete)
    assert conv2d.flops == 2 * n * c * h * h * (c // c) * k * k
    assert conv2d.bytes == (2 * n * c * h * h + c * k * k) * 4
    assert conv2d.model == "grouped_conv"
    assert 2.0 < conv2d.flops / conv2d.bytes < 2.3
    # The native CUDA kernels' op records no groups: a depthwise op has one per channel.
    native = known(
        "aten::_conv_depthwise2d",
        [[n, c, h, h], [c, 1, k, k], [], [], [], [], []],
        [FP32, FP32, "ScalarList", "", "ScalarList", "ScalarList", "ScalarList"],
        ["", "", f"[{k}, {k}]", "", "[1, 1]", "[1, 1]", "[1, 1]"],
    )
    assert (native.flops, native.bytes, native.model) == (
        conv2d.flops,
        conv2d.bytes,
        "grouped_conv",
    )


def test_transposed_conv_counts_input_positions() -> None:
    dims = [[2, 4, 5, 5], [4, 3, 3, 3], [], [], [], [], [], [], []]
    concrete = ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "True", "[0, 0]", "1"]
    c = known("aten::convolution", dims, [FP32, FP32, *CONV_TYPES[2:]], concrete)
    out = (5 - 1) * 2 - 0 + 1 * (3 - 1) + 0 + 1  # 11
    assert c.flops == 2 * 2 * (5 * 5) * (3 * 3) * 4 * 3
    assert c.bytes == (2 * 4 * 5 * 5 + 4 * 3 * 3 * 3 + 2 * 3 * out * out) * 4


def test_conv_backward_is_one_forward_per_gradient() -> None:
    dims = [[8, 32, 16, 16], [8, 16, 32, 32], [32, 8, 3, 3]] + [[]] * 8
    types = [BF16] * 3 + ["ScalarList"] * 4 + ["Scalar", "ScalarList", "Scalar", "ScalarList"]
    concrete = ["", "", "", "[0]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "2"]
    forward = 2 * 8 * (16 * 16) * 32 * 8 * 3 * 3
    both = known("aten::convolution_backward", dims, types, [*concrete, "[True, True, False]"])
    assert both.flops == 2 * forward
    go, x, w = 8 * 32 * 16 * 16, 8 * 16 * 32 * 32, 32 * 8 * 3 * 3
    assert both.bytes == (go + w + x + x + w) * 2  # read grad, w, x; write grad x, grad w
    first_layer = known(
        "aten::convolution_backward", dims, types, [*concrete, "[False, True, False]"]
    )
    assert first_layer.flops == forward
    assert first_layer.bytes == (go + x + w) * 2
    # Without the mask both gradients are assumed, and the flag comes from the shapes.
    assert known("aten::convolution_backward", dims, types).flops == 2 * forward


# --- Attention -------------------------------------------------------------------------------


def test_sdpa_causal_gqa() -> None:
    q, kv = [2, 8, 128, 64], [2, 2, 128, 64]
    dims = [q, kv, kv, [], [], [], [], []]
    types = [BF16, BF16, BF16, "", "Scalar", "Scalar", "", "Scalar"]
    name = "aten::scaled_dot_product_attention"
    causal = known(name, dims, types, ["", "", "", "", "0.", "True", "", "True"])
    full = known(name, dims, types, ["", "", "", "", "0.", "False", "", "True"])
    assert full.flops == 4 * 2 * 8 * 128 * 128 * 64  # Q heads, not KV heads
    assert causal.flops == full.flops / 2
    assert full.bytes == (2 * 8 * 128 * 64 * 2 + 2 * 2 * 2 * 128 * 64) * 2  # q, out; k, v
    assert full.model == "attention"


def test_flash_attention_forward_is_batch_seq_heads_dim() -> None:
    # As in a real MI300X trace: [B, S, H, D].
    q = [8, 4096, 16, 128]
    dims = [q, q, q] + [[]] * 12
    types = [BF16] * 3 + ["", "", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"]
    types += [""] * 4
    concrete = [
        "",
        "",
        "",
        "",
        "",
        "4096",
        "4096",
        "0.",
        "False",
        "False",
        "0.0884",
        "",
        "",
        "",
        "",
    ]
    c = known("aten::_flash_attention_forward", dims, types, concrete)
    assert c.flops == 4 * 8 * 16 * 4096 * 4096 * 128
    packed = [[256, 16, 128]] * 3 + [[3], [3]] + [[]] * 10  # variable lengths: unknowable
    assert (
        cost("aten::_flash_attention_forward", packed, [BF16] * 3 + ["int"] * 2 + types[5:]) is None
    )


def test_attention_backward_is_two_and_a_half_forwards() -> None:
    q, kv = [2, 8, 128, 64], [2, 2, 128, 64]
    dims = [q, q, kv, kv, q, [2, 8, 128], [], [], [], [], [], [], [], [], []]
    types = [BF16] * 5 + [FP32, "", "", "Scalar", "Scalar", "Scalar", "Scalar", "", "", ""]
    concrete = ["", "", "", "", "", "", "", "", "128", "128", "0.", "False", "", "", ""]
    c = known("aten::_scaled_dot_product_flash_attention_backward", dims, types, concrete)
    assert c.flops == 2.5 * (4 * 2 * 8 * 128 * 128 * 64)
    reads = (3 * 2 * 8 * 128 * 64 + 2 * 2 * 2 * 128 * 64) * 2 + 2 * 8 * 128 * 4
    writes = (2 * 8 * 128 * 64 + 2 * 2 * 2 * 128 * 64) * 2  # dQ, dK, dV
    assert c.bytes == reads + writes


# --- Norms, softmax --------------------------------------------------------------------------


def test_layer_norm_and_rms_norm() -> None:
    c = known("aten::native_layer_norm", [[4, 16], [], [16], [16], []], [FP32, "", FP32, FP32, ""])
    assert c.flops == 4 * 16 * (4 + 1)  # statistics and normalisation 4, affine 1
    assert c.bytes == (4 * 16 + 16 + 16 + 4 * 16) * 4
    rms = known("aten::_fused_rms_norm", [[8, 16, 32, 32], [], [32, 32], []], [FP32, "", FP32, ""])
    assert rms.flops == 8 * 16 * 32 * 32 * (3 + 1)
    assert rms.bytes == (2 * 8 * 16 * 32 * 32 + 32 * 32) * 4


def test_batch_norm_training_and_eval() -> None:
    dims = [[2, 3, 4, 4], [3], [3], [3], [3], [], [], []]
    types = [FP32] * 5 + ["Scalar"] * 3
    train = known("aten::native_batch_norm", dims, types, [""] * 5 + ["True", "0.1", "1e-05"])
    evaluation = known("aten::native_batch_norm", dims, types, [""] * 5 + ["False", "0.1", "1e-05"])
    assert train.flops == 2 * 3 * 16 * (4 + 1)
    assert evaluation.flops == 2 * 3 * 16 * (1 + 1)
    assert train.bytes == (2 * 2 * 3 * 16 + 4 * 3) * 4


def test_layer_norm_backward_from_a_real_trace() -> None:
    dims = [[1024, 512], [1024, 512], [], [1024, 1], [1024, 1], [512], [512], []]
    types = [FP32, FP32, "", FP32, FP32, FP32, FP32, ""]
    c = known("aten::native_layer_norm_backward", dims, types)
    assert c.flops == 2 * 1024 * 512 * (4 + 1)
    reads = 2 * 1024 * 512 + 2 * 1024 + 2 * 512
    writes = 1024 * 512 + 2 * 512  # grad input, grad weight, grad bias
    assert c.bytes == (reads + writes) * 4
    masked = known(
        "aten::native_layer_norm_backward", dims, types, [""] * 7 + ["[True, False, False]"]
    )
    assert masked.bytes == (reads + 1024 * 512) * 4


def test_softmax_forward_and_backward() -> None:
    exp = TRANSCENDENTAL_FLOPS
    c = known(
        "aten::_softmax", [[4, 1000], [], []], [BF16, "Scalar", "Scalar"], ["", "-1", "False"]
    )
    assert c.flops == 4 * 1000 * (1 + 1 + exp + 1 + 1)  # max, subtract, exp, sum, divide
    assert c.bytes == 4 * 1000 * 2 * 2
    half = known(
        "aten::_softmax", [[4, 1000], [], []], [FP16, "Scalar", "Scalar"], ["", "-1", "True"]
    )
    assert half.bytes == 4 * 1000 * (2 + 4)  # half_to_float writes fp32
    back = known(
        "aten::_softmax_backward_data",
        [[4, 1000], [4, 1000], [], []],
        [FP32, FP32, "Scalar", "Scalar"],
    )
    assert back.flops == 4 * 1000 * 4
    assert back.bytes == 3 * 4 * 1000 * 4
    assert back.model == "softmax"


# --- Elementwise, reductions -----------------------------------------------------------------


def test_binary_op_broadcasts() -> None:
    c = known("aten::add", [[4096, 1], [1, 512], []], [BF16, BF16, "Scalar"], ["", "", "1"])
    assert c == Cost(4096 * 512, (4096 + 512 + 4096 * 512) * 2, "bf16", "elementwise")
    inplace = known("aten::add_", [[4, 4], [4], []], [FP32, FP32, "Scalar"])
    assert inplace.bytes == (16 + 4 + 16) * 4
    assert cost("aten::add_", [[4], [4, 4], []], [FP32, FP32, "Scalar"]) is None  # self too small


def test_heavier_pointwise_ops_and_output_dtypes() -> None:
    exp = TRANSCENDENTAL_FLOPS
    assert known("aten::gelu", [[8, 16], []], [BF16, ""]).flops == 8 * 16 * (exp + 4)
    assert known("aten::sigmoid", [[8, 16]], [FP32]).flops == 8 * 16 * (exp + 2)
    assert known("aten::silu_", [[8, 16]], [FP32]).flops == 8 * 16 * (exp + 3)
    assert known("aten::tanh", [[8, 16]], [FP32]).flops == 8 * 16 * exp
    eq = known("aten::eq", [[1024], [1024]], [I64, I64])
    assert eq.bytes == 1024 * 8 * 2 + 1024 * 1  # a bool result
    # A long tensor times a Python float computes and writes fp32.
    scaled = known("aten::mul", [[10], []], [I64, "Scalar"], ["", "0.5"])
    assert (scaled.dtype, scaled.bytes) == ("fp32", 10 * 8 + 10 * 4)
    assert known("aten::pow", [[10], []], [FP32, "Scalar"], ["", "2"]).flops == 10 * 1


def test_reductions() -> None:
    types = [FP32, "ScalarList", "Scalar", ""]
    c = known("aten::sum", [[8, 16], [], [], []], types, ["", "[1]", "True", ""])
    assert c == Cost(8 * 16, (8 * 16 + 8) * 4, "fp32", "reduction")
    # Dims unrecorded: the (small) output is left out, a lower bound.
    assert known("aten::mean", [[8, 16], [], [], []], types).bytes == 8 * 16 * 4
    var_mean = known("aten::var_mean", [[8, 16], [], [], []], types, ["", "[1]", "True", "False"])
    assert var_mean.flops == 8 * 16 * 4
    assert var_mean.bytes == (8 * 16 + 2 * 8) * 4
    max_dim = known("aten::max", [[8, 16], [], []], [FP32, "Scalar", "Scalar"], ["", "1", "False"])
    assert max_dim.bytes == 8 * 16 * 4 + 8 * (4 + 8)  # values and int64 indices
    other = known("aten::max", [[8, 16], [8, 16]], [FP32, FP32])
    assert other.model == "elementwise"


# --- Embedding, loss, optimizer, copy --------------------------------------------------------


def test_embedding_moves_gathered_rows_only() -> None:
    types = [BF16, I64, "Scalar", "Scalar", "Scalar"]
    c = known(
        "aten::embedding",
        [[25136, 2880], [888], [], [], []],
        types,
        ["", "", "-1", "False", "False"],
    )
    assert c == Cost(0, 888 * 8 + 2 * 888 * 2880 * 2, "bf16", "embedding")
    back = known(
        "aten::embedding_dense_backward",
        [[1, 3, 4], [1, 3], [], [], []],
        [FP32, I64, "Scalar", "Scalar", "Scalar"],
        ["", "", "10", "-1", "False"],
    )
    assert back.flops == 3 * 4  # one add per gradient element
    assert back.bytes == 3 * 4 * 4 + 3 * 8 + 10 * 4 * 4  # the whole [10, 4] gradient written


def test_losses() -> None:
    ce_types = [FP32, I64, "", "Scalar", "Scalar", "Scalar"]
    ce = known(
        "aten::cross_entropy_loss",
        [[4, 16], [4], [], [], [], []],
        ce_types,
        ["", "", "", "1", "-100", "0."],
    )
    assert ce.flops == 4 * 16 * (TRANSCENDENTAL_FLOPS + 4) + 4
    assert ce.bytes == 4 * 16 * 4 + 4 * 8 + 4
    nll = known(
        "aten::nll_loss_forward", [[4, 16], [4], [], [], []], [FP32, I64, "", "Scalar", "Scalar"]
    )
    assert nll == Cost(4, 4 * 8 + 4 * 4 + 4, "fp32", "loss")  # targets, 4 gathered scores, out
    mse = known("aten::mse_loss", [[5, 128], [5, 128], []], [FP32, FP32, "Scalar"], ["", "", "1"])
    assert mse.flops == 5 * 128 * 3
    assert mse.bytes == 2 * 5 * 128 * 4 + 4


def test_fused_adamw_and_foreach() -> None:
    # As the profiler records torch.optim.AdamW(fused=True) on a [4, 4] weight and a [4] bias.
    params = [[4, 4], [4]]
    dims = [params] * 4 + [[], [[], []]] + [[]] * 9
    types = ["TensorList"] * 6 + ["Scalar"] * 7 + ["", ""]
    c = known("aten::_fused_adamw_", dims, types)
    n = 4 * 4 + 4
    assert c == Cost(n * ADAM_FLOPS, n * (4 + 3) * 4, "fp32", "optimizer")  # 4 read, 3 written
    foreach = known(
        "aten::_foreach_add_",
        [[[128, 128], [128]], [[128, 128], [128]], []],
        ["TensorList", "TensorList", "Scalar"],
    )
    n = 128 * 128 + 128
    assert foreach == Cost(n, (2 * n + n) * 4, "fp32", "optimizer")
    # Older profilers record no list shapes.
    assert cost("aten::_foreach_add_", [[], [], []], ["TensorList", "TensorList", "Scalar"]) is None


def test_copies_and_casts() -> None:
    c = known("aten::copy_", [[8, 16], [8, 16], []], [BF16, FP32, "Scalar"], ["", "", "False"])
    assert c == Cost(0, 8 * 16 * 4 + 8 * 16 * 2, "fp32", "copy")  # read fp32, write bf16
    to_types = [FP32, "Scalar", "", "", "", "Scalar", ""]
    cast = known(
        "aten::_to_copy", [[8, 16]] + [[]] * 6, to_types, ["", "15", "", "", "", "False", ""]
    )
    assert cast.bytes == 8 * 16 * (4 + 2)
    # Destination dtype unrecorded: taken to be the source's.
    assert (
        known("aten::to", [[8, 16]] + [[]] * 4, [FP32, "Scalar", "Scalar", "Scalar", ""]).bytes
        == 8 * 16 * 8
    )
    assert known("aten::clone", [[4096, 64], []], [FP32, "Scalar"]).bytes == 2 * 4096 * 64 * 4


# --- Dropout, random fills and the other pointwise and norm ops -----------------------------


def test_dropout_in_training_writes_its_output_and_a_one_byte_mask() -> None:
    # dropout(input, p, train) on [32, 2048, 4096] fp16: 268,435,456 elements.
    n = 32 * 2048 * 4096
    dims, types = [[32, 2048, 4096], [], []], [FP16, "Scalar", "Scalar"]
    train = known("aten::dropout", dims, types, ["", "0.1", "True"])
    # Read 2 B + write 2 B + a bool mask 1 B per element; draw, compare, scale: 3 FLOPs.
    assert train == Cost(3 * n, n * (2 + 2 + 1), "fp16", "elementwise")
    # The same cost as the fused kernel it calls on a GPU.
    assert known("aten::native_dropout", dims, types, ["", "0.1", "True"]) == train
    # In evaluation dropout returns its input: no work, no cost; and so unrecorded, since the
    # record cannot tell (an inference trace's dropout: 1 µs, no kernel, no child op).
    assert cost("aten::dropout", dims, types, ["", "0.1", "False"]) is None
    assert cost("aten::dropout", dims, types) is None


def test_feature_dropout_draws_one_number_per_channel() -> None:
    # Dropout2d on [8, 64, 32, 32] fp32: noise [8, 64, 1, 1] written then read, x read, out written.
    dims, types = [[8, 64, 32, 32], [], []], [FP32, "Scalar", "Scalar"]
    c = known("aten::feature_dropout", dims, types, ["", "0.2", "True"])
    n, channels = 8 * 64 * 32 * 32, 8 * 64
    assert c.bytes == (2 * n + 2 * channels) * 4
    assert c.flops == 3 * channels + n  # a draw, compare and scale per channel; a multiply each


def test_random_fills_write_the_tensor_and_count_the_draw_and_its_transform() -> None:
    exp = TRANSCENDENTAL_FLOPS
    normal = known("aten::normal_", [[1024, 1024], [], [], []], [BF16, "Scalar", "Scalar", ""])
    # Nothing read; written once in bf16; a draw (1) and Box-Muller: log, sqrt, cos + 2.
    assert normal == Cost(1024 * 1024 * (1 + 3 * exp + 2), 1024 * 1024 * 2, "bf16", "elementwise")
    uniform = known("aten::uniform_", [[100], [], [], []], [FP32, "Scalar", "Scalar", ""])
    assert (uniform.flops, uniform.bytes) == (100 * 2, 100 * 4)
    # bernoulli_(self, p) with a tensor p reads p.
    assert known("aten::bernoulli_", [[100], [100], []], [FP32, FP32, ""]).bytes == 2 * 100 * 4
    assert known("aten::bernoulli", [[100], []], [FP32, ""]).bytes == 2 * 100 * 4


def test_glu_writes_half_its_input() -> None:
    exp = TRANSCENDENTAL_FLOPS
    c = known("aten::glu", [[16, 1024], []], [BF16, "Scalar"], ["", "-1"])
    # Output [16, 512]: a · sigmoid(b), sigmoid exp + 2, then a multiply.
    assert c == Cost(16 * 512 * (exp + 3), (16 * 1024 + 16 * 512) * 2, "bf16", "elementwise")
    assert cost("aten::glu", [[3], []], [BF16, "Scalar"]) is None  # an odd size does not split


def test_more_pointwise_ops_have_models() -> None:
    exp = TRANSCENDENTAL_FLOPS
    two = [[64, 64], [64, 64]]
    assert known("aten::atan2", two, [FP32, FP32]) == Cost(
        64 * 64 * exp, 3 * 64 * 64 * 4, "fp32", "elementwise"
    )
    assert known("aten::selu", [[64, 64]], [BF16]).flops == 64 * 64 * (exp + 4)
    assert known("aten::log_sigmoid", [[64, 64]], [BF16]).flops == 64 * 64 * (2 * exp + 2)
    assert known("aten::softshrink", [[64, 64], []], [BF16, "Scalar"]).flops == 64 * 64 * 2
    assert known("aten::xlogy", two, [FP32, FP32]).flops == 64 * 64 * (exp + 1)
    # _prelu_kernel(x, weight[C, 1, 1]): the weight broadcast over channels, read once.
    prelu = known("aten::_prelu_kernel", [[8, 16, 4, 4], [16, 1, 1]], [FP16, FP16])
    assert prelu.bytes == (2 * 8 * 16 * 4 * 4 + 16) * 2
    for name in ("aten::asin", "aten::sinh", "aten::atanh", "aten::lgamma", "aten::atan_"):
        assert known(name, [[10]], [FP32]).flops == 10 * exp


def test_type_as_copies_only_when_the_dtypes_differ() -> None:
    assert known("aten::type_as", [[8, 16], [1]], [BF16, FP32]).bytes == 8 * 16 * (2 + 4)
    assert cost("aten::type_as", [[8, 16], [1]], [FP32, FP32]) is None  # returns self


def test_batch_norm_with_update_is_training() -> None:
    dims = [[2, 3, 4, 4], [3], [3], [3], [3], [], []]
    types = [FP32] * 5 + ["Scalar"] * 2
    c = known("aten::_batch_norm_with_update", dims, types)
    assert c.flops == 2 * 3 * 16 * (4 + 1)  # statistics 4, affine 1
    assert c.bytes == (2 * 2 * 3 * 16 + 4 * 3) * 4


# --- Robustness ------------------------------------------------------------------------------

NAMES = sorted(supported_ops())
TYPE_NAMES = [BF16, FP16, FP32, FP8, I64, "double", "int", "bool", "signed char", "unsigned char"]
TYPE_NAMES += ["Scalar", "ScalarList", "TensorList", "", "c10::complex<float>", "nonsense"]


def check(result: Cost | None) -> None:
    if result is not None:
        assert isinstance(result, Cost)
        assert math.isfinite(result.flops)
        assert math.isfinite(result.bytes)
        assert result.flops >= 0
        assert result.bytes >= 0
        assert result.model in MODELS
        assert result.dtype in ELEMENT_BYTES


def test_unknown_ops_garbage_and_edge_sizes() -> None:
    assert cost("aten::not_an_op", [[2, 2]], [FP32]) is None
    assert raw_cost("aten::mm", b"[[2, 2], [2, 2]", b'["float", "float"]') is None  # truncated
    assert raw_cost("aten::mm", b"[" * 100_000, b"[]") is None  # nesting too deep to decode
    assert raw_cost("aten::mm", b"{}", b"{}") is None
    assert cost("aten::mm", [[2, 2], [2, 2]], [FP32]) is None  # lists of different lengths
    assert cost("aten::mm", [[2, -2], [-2, 2]], [FP32, FP32]) is None
    assert cost("aten::mm", [[2, 2.0], [2, 2]], [FP32, FP32]) is None
    assert cost("aten::mm", [[2, True], [True, 2]], [FP32, FP32]) is None
    assert cost("aten::mm", [[2, 2], [2, 2]], [FP32, "nonsense"]) is None
    assert op_cost(None, None) is None  # type: ignore[arg-type]
    # Sizes whose product no float holds.
    huge = [2**63 - 1] * 20
    assert cost("aten::add", [huge, huge], [FP32, FP32]) is None
    assert cost("aten::mm", [[2**70, 2], [2, 2]], [FP32, FP32]) is None  # beyond int64
    # Empty tensors cost nothing, which is a cost, not an unknown.
    assert cost("aten::mm", [[0, 128], [128, 256]], [FP32, FP32]) == Cost(
        0, 128 * 256 * 4, "fp32", "gemm"
    )
    # A garbled Concrete Inputs is ignored, not fatal.
    assert known("aten::mm", [[2, 3], [3, 4]], [FP32, FP32], ["x"]).flops == 2 * 2 * 3 * 4


def test_the_package_never_imports_torch() -> None:
    code = "import sys, wallfinder.cost; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@settings(max_examples=400)
@given(
    st.sampled_from(NAMES), st.binary(max_size=64), st.binary(max_size=64), st.binary(max_size=64)
)
def test_random_bytes_never_raise(name: str, dims: bytes, types: bytes, concrete: bytes) -> None:
    check(raw_cost(name, dims, types, concrete))


_sizes = st.one_of(
    st.integers(0, 8), st.integers(-3, 3), st.integers(2**60, 2**66), st.sampled_from([1, 4, 128])
)
_shape = st.lists(_sizes, max_size=5)
_dim = st.one_of(
    _shape, st.lists(_shape, max_size=3), st.none(), st.text(max_size=3), st.floats(), st.booleans()
)
_text = st.one_of(
    st.sampled_from(["", "True", "False", "1", "-1", "0.", "[2, 2]", "[1]", "[True, False, True]"]),
    st.sampled_from(["15", "6", "[0, 0]", "nan", "1e400", "[", "[,]", "9" * 40]),
    st.text(max_size=8),
    st.none(),
    st.integers(),
)


@settings(max_examples=400)
@given(
    st.sampled_from(NAMES),
    st.lists(
        st.tuples(_dim, st.one_of(st.sampled_from(TYPE_NAMES), st.integers()), _text), max_size=12
    ),
    st.booleans(),
)
def test_random_records_never_raise(
    name: str, args: list[tuple[Any, Any, Any]], with_concrete: bool
) -> None:
    dims = [a[0] for a in args]
    types = [a[1] for a in args]
    concrete = [a[2] for a in args] if with_concrete else None
    check(cost(name, dims, types, concrete))


# --- Against torch.utils.flop_counter ---------------------------------------------------------
# Each case runs an op under the profiler as a real capture does (record_shapes), costs the op
# from the arguments the exported trace recorded, and compares with FlopCounterMode on the same
# call. CUDA-only attention ops run on meta tensors: the profiler records them all the same.

Run = Callable[[Any], object]  # runs an op, given the torch module


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch")


def recorded(torch: Any, run: Run, tmp_path: Path) -> dict[str, list[Cost | None]]:
    """Profile `run`, export the chrome trace, and cost every CPU op in it, by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run(torch)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    costs: dict[str, list[Cost | None]] = {}
    for event in json.loads(path.read_text())["traceEvents"]:
        if event.get("cat") == "cpu_op":
            args = event["args"]
            raw = [
                json.dumps(args[key]).encode() if key in args else b""
                for key in ("Input Dims", "Input type", "Concrete Inputs")
            ]
            costs.setdefault(event["name"], []).append(raw_cost(event["name"], *raw))
    return costs


def counted(torch: Any, run: Run) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        run(torch)
    return int(counter.get_total_flops())


def ours(torch: Any, run: Run, name: str, tmp_path: Path) -> float:
    costs = recorded(torch, run, tmp_path).get(name)
    assert costs, f"{name} was not recorded"
    assert costs[0] is not None, f"{name} has no cost"
    return costs[0].flops


def _scaled_mm(t: Any) -> object:
    a = t.randn(64, 128).to(t.float8_e4m3fn)
    b = t.randn(256, 128).to(t.float8_e4m3fn).t()
    return t._scaled_mm(a, b, t.ones(()), t.ones(()), out_dtype=t.bfloat16)


GEMM_CASES: dict[str, tuple[str, Run]] = {
    "mm": ("aten::mm", lambda t: t.mm(t.randn(64, 32), t.randn(32, 48))),
    "addmm": ("aten::addmm", lambda t: t.addmm(t.randn(48), t.randn(64, 32), t.randn(32, 48))),
    "bmm": ("aten::bmm", lambda t: t.bmm(t.randn(3, 4, 5), t.randn(3, 5, 6))),
    "baddbmm": (
        "aten::baddbmm",
        lambda t: t.baddbmm(t.randn(3, 4, 6), t.randn(3, 4, 5), t.randn(3, 5, 6)),
    ),
    "linear": (
        "aten::linear",
        lambda t: t.nn.functional.linear(t.randn(2, 8, 16), t.randn(5, 16), t.randn(5)),
    ),
    "matmul broadcast": ("aten::matmul", lambda t: t.matmul(t.randn(2, 1, 4, 5), t.randn(3, 5, 6))),
    "matmul fold": ("aten::matmul", lambda t: t.matmul(t.randn(2, 3, 4, 5), t.randn(5, 6))),
    "matmul vector-matrix": ("aten::matmul", lambda t: t.matmul(t.randn(5), t.randn(5, 6))),
    "scaled_mm fp8": ("aten::_scaled_mm", _scaled_mm),
}


@pytest.mark.parametrize("case", list(GEMM_CASES))
def test_gemm_matches_flop_counter(torch: Any, tmp_path: Path, case: str) -> None:
    name, run = GEMM_CASES[case]
    assert ours(torch, run, name, tmp_path) == counted(torch, run)


def test_matrix_vector_products_which_flop_counter_does_not_count(
    torch: Any, tmp_path: Path
) -> None:
    # flop_counter has no formula for mv and dot, so it counts 0; they are 2·M·K.
    def run(t: Any) -> object:
        return t.matmul(t.randn(3, 4, 5), t.randn(5))

    assert counted(torch, run) == 0
    assert ours(torch, run, "aten::matmul", tmp_path) == 2 * (3 * 4) * 5
    assert ours(torch, lambda t: t.mv(t.randn(4, 5), t.randn(5)), "aten::mv", tmp_path) == 2 * 4 * 5


def _conv2d(**kw: Any) -> Run:
    groups = kw.get("groups", 1)
    return lambda t: t.nn.functional.conv2d(
        t.randn(2, 4, 10, 10), t.randn(6, 4 // groups, 3, 3), t.randn(6), **kw
    )


CONV_CASES: dict[str, Run] = {
    "2d stride padding groups": _conv2d(stride=2, padding=1, groups=2),
    "2d dilation": _conv2d(padding=2, dilation=2),
    "2d padding same": _conv2d(padding="same"),
    "1d": lambda t: t.nn.functional.conv1d(t.randn(2, 4, 17), t.randn(8, 4, 5), stride=3),
    "3d": lambda t: t.nn.functional.conv3d(
        t.randn(1, 2, 6, 6, 6), t.randn(4, 2, 3, 3, 3), padding=1
    ),
    "transposed": lambda t: t.nn.functional.conv_transpose2d(
        t.randn(2, 4, 5, 5), t.randn(4, 3, 3, 3), stride=2, padding=1, output_padding=1
    ),
    "transposed groups": lambda t: t.nn.functional.conv_transpose2d(
        t.randn(2, 4, 5, 5), t.randn(4, 3, 3, 3), stride=2, groups=2
    ),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_forward_matches_flop_counter(torch: Any, tmp_path: Path, case: str) -> None:
    run = CONV_CASES[case]
    costs = recorded(torch, run, tmp_path)
    expected = counted(torch, run)
    for name in ("aten::convolution", "aten::_convolution"):
        found = costs[name][0]
        assert found is not None
        assert found.flops == expected


@pytest.mark.parametrize(("transposed", "groups"), [(False, 1), (True, 1), (False, 2), (True, 2)])
def test_conv_backward_against_flop_counter(
    torch: Any, tmp_path: Path, transposed: bool, groups: int
) -> None:
    functional = torch.nn.functional
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    shape = (4, 6 // groups, 3, 3) if transposed else (6, 4 // groups, 3, 3)
    w = torch.randn(shape, requires_grad=True)
    conv = functional.conv_transpose2d if transposed else functional.conv2d

    def forward(t: Any) -> Any:
        return conv(x, w, stride=2, groups=groups)

    one_forward = counted(torch, forward)
    y = forward(torch)
    grad = torch.ones_like(y)
    backward = counted(torch, lambda t: y.backward(grad, retain_graph=True))
    # Input and weight gradients (the output mask flop_counter also sees): one forward each.
    assert ours(torch, lambda t: y.backward(grad), "aten::convolution_backward", tmp_path) == (
        2 * one_forward
    )
    # flop_counter counts the weight gradient of a grouped convolution `groups` times.
    assert backward == one_forward + groups * one_forward


def _qkv(torch: Any, kv_heads: int, layout: str = "bhsd") -> tuple[Any, Any, Any]:
    """Q with 8 heads and 128 positions, K and V with `kv_heads` heads and 96 positions."""

    def make(heads: int, seq: int) -> Any:
        shape = (2, heads, seq, 64) if layout == "bhsd" else (2, seq, heads, 64)
        return torch.empty(shape, device="meta", dtype=torch.bfloat16)

    return make(8, 128), make(kv_heads, 96), make(kv_heads, 96)


ATTENTION_FORWARD: dict[str, Callable[[Any, Any, Any, Any, bool], object]] = {
    "_scaled_dot_product_flash_attention": lambda op, q, k, v, causal: op(q, k, v, 0.0, causal),
    "_scaled_dot_product_efficient_attention": (
        lambda op, q, k, v, causal: op(q, k, v, None, True, 0.0, causal)
    ),
    "_scaled_dot_product_cudnn_attention": (
        lambda op, q, k, v, causal: op(q, k, v, None, True, 0.0, causal)
    ),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [8, 2])
@pytest.mark.parametrize("op", list(ATTENTION_FORWARD))
def test_attention_forward_matches_flop_counter(
    torch: Any, tmp_path: Path, op: str, kv_heads: int, causal: bool
) -> None:
    q, k, v = _qkv(torch, kv_heads)

    def run(t: Any) -> object:
        return ATTENTION_FORWARD[op](getattr(t.ops.aten, op), q, k, v, causal)

    # flop_counter ignores the causal mask; the kernels skip the masked half.
    expected = counted(torch, run) / (2 if causal else 1)
    assert ours(torch, run, f"aten::{op}", tmp_path) == expected


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [8, 2])
def test_attention_backward_matches_flop_counter(
    torch: Any, tmp_path: Path, kv_heads: int, causal: bool
) -> None:
    aten = torch.ops.aten
    q, k, v = _qkv(torch, kv_heads)
    divisor = 2 if causal else 1
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = (
        aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
    )
    grad = torch.empty_like(out)

    def flash(t: Any) -> object:
        return aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset
        )

    name = "aten::_scaled_dot_product_flash_attention_backward"
    assert ours(torch, flash, name, tmp_path) == counted(torch, flash) / divisor

    e_out, e_lse, e_seed, e_offset = aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, causal
    )

    def efficient(t: Any) -> object:
        mask = [True, True, True, False]
        return aten._scaled_dot_product_efficient_attention_backward(
            grad, q, k, v, None, e_out, e_lse, e_seed, e_offset, 0.0, mask, causal
        )

    name = "aten::_scaled_dot_product_efficient_attention_backward"
    assert ours(torch, efficient, name, tmp_path) == counted(torch, efficient) / divisor


def test_cpu_sdpa_and_flash_layout_against_flop_counter(torch: Any, tmp_path: Path) -> None:
    """flop_counter has no formula for the CPU kernels, and reads the [B, S, H, D] inputs of
    `_flash_attention_forward`/`_efficient_attention_forward` as [B, H, S, D] (so it miscounts
    them, or fails on grouped-query shapes): compare with its count of the [B, H, S, D] flash
    op on the same attention."""
    aten = torch.ops.aten
    q, k, v = _qkv(torch, 2)
    forward = counted(torch, lambda t: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True))
    causal = forward / 2
    qc, kc, vc = (torch.randn(x.shape, requires_grad=True) for x in (q, k, v))

    def cpu(t: Any) -> None:
        functional = t.nn.functional
        functional.scaled_dot_product_attention(
            qc, kc, vc, is_causal=True, enable_gqa=True
        ).sum().backward()

    costs = recorded(torch, cpu, tmp_path)
    flops = {name: found[0].flops for name, found in costs.items() if found[0] is not None}
    assert flops["aten::scaled_dot_product_attention"] == causal
    assert flops["aten::_scaled_dot_product_flash_attention_for_cpu"] == causal
    assert flops["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] == 2.5 * causal

    qs, ks, vs = _qkv(torch, 2, layout="bshd")

    def flash(t: Any) -> object:
        return aten._flash_attention_forward(qs, ks, vs, None, None, 128, 96, 0.0, True, False)

    def efficient(t: Any) -> object:
        return aten._efficient_attention_forward(
            qs, ks, vs, None, None, None, None, None, 0.0, 1, True
        )

    assert ours(torch, flash, "aten::_flash_attention_forward", tmp_path) == causal
    assert ours(torch, efficient, "aten::_efficient_attention_forward", tmp_path) == causal


def test_attention_argument_positions_match_the_schemas(torch: Any) -> None:
    """Where each attention op keeps is_causal and its sequence offsets, per this torch."""
    from wallfinder.cost.attention import _SIGNATURES

    for name, sig in _SIGNATURES.items():
        schema = getattr(torch.ops.aten, name.removeprefix("aten::")).default._schema
        names = [a.name for a in schema.arguments]
        assert names[sig.causal] == ("custom_mask_type" if sig.mask_type else "is_causal"), name
        if sig.varlen is not None:
            assert names[sig.varlen] in ("cum_seq_q", "cu_seqlens_q"), name
