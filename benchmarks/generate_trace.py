"""Generate a large, realistic PyTorch profiler (Kineto) trace for benchmarking trace analysers.

The trace imitates what ``torch.profiler`` writes on rank 0 of an 8-GPU data-parallel job training
a 24-block vision transformer in bf16 on H100s, with record_shapes, with_stack and profile_memory
on: ProfilerStep#N annotations, a data-loading gap at the start of every step, python frames,
forward ops on the main thread and backward ops on the autograd thread linked by fwdbwd flows,
runtime/driver calls linked to kernels, memcpys and memsets by correlation id and ac2g flows, NCCL
all-reduces on their own stream, [memory] instant events, gpu_user_annotation spans and the
metadata Kineto appends at the end.  Events are laid out byte for byte the way Kineto's
ChromeTraceLogger prints them.

The file is written one profiler step at a time, so memory stays bounded by the size of a step,
and the output depends only on --seed and --size-mb.

    python benchmarks/generate_trace.py -o /tmp/big.json --size-mb 1000
    python benchmarks/generate_trace.py -o /tmp/small.json --size-mb 50 --check
    python benchmarks/generate_trace.py -o job/rank3.json --size-mb 8 --rank 3 --world-size 64
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import io
import itertools
import json
import math
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MB = 1_000_000
TARGET_STEPS = 30
MIN_STEPS = 20
TOLERANCE = 0.05

NUM_GPUS = 8
NUM_SMS = 132
PEAK_FLOP_PER_NS = 989_000.0  # H100 SXM dense bf16
HBM_BYTES_PER_NS = 3350.0
WORLD_SIZE = 8
RANK = 0
COMPUTE_STREAM = 7
COPY_STREAM = 24
NCCL_STREAM = 28
STREAMS = (COMPUTE_STREAM, COPY_STREAM, NCCL_STREAM)

# Model and batch: ViT with 14x14 patches on 448x448 images, 8 images per micro-batch.
LAYERS = 24
BATCH = 8
PATCHES = 1024
TOKENS = BATCH * PATCHES
HIDDEN = 2048
HEADS = 16
HEAD_DIM = HIDDEN // HEADS
FFN = 4 * HIDDEN
CLASSES = 1000
BF16 = "c10::BFloat16"
PARAMS_PER_LAYER = 4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN + 9 * HIDDEN + FFN

# Event kinds: how a site's template is filled in.
K_OP = 0  # cpu_op: External id, Ev Idx
K_SEQ = 1  # cpu_op that carries an autograd Sequence number
K_PY = 2  # python_function: Python parent id, Python id, Ev Idx
K_ANNOTATION = 3  # user_annotation: like K_OP, but launches inside it link to the enclosing cpu_op

# What an op does for autograd.
AG_NONE = 0
AG_FWD = 1  # creates a backward node: fwdbwd flow start, backward queued
AG_EVAL = 2  # autograd::engine::evaluate_function wrapper of a backward node
AG_NODE = 3  # the backward node itself: fwdbwd flow end
AG_MARK = 4  # emits nothing: queues per-block gradient work (AccumulateGrad, DDP all-reduce)
AG_BACKWARD = 5  # emits nothing: runs the queued backward on the autograd thread, then resumes

# Runtime call behaviours.
C_GPU = 0  # launches a kernel, memcpy or memset
C_SYNC_STREAM = 1
C_SYNC_DEVICE = 2
C_RECORD = 3  # cudaEventRecord on `stream`
C_WAIT = 4  # `stream` waits for the event last recorded on `src`
C_PLAIN = 5

CBID = {
    "cudaMalloc": 20,
    "cudaFree": 22,
    "cudaMemcpyAsync": 41,
    "cudaMemsetAsync": 51,
    "cudaStreamSynchronize": 131,
    "cudaEventRecord": 135,
    "cudaStreamWaitEvent": 147,
    "cudaDeviceSynchronize": 165,
    "cudaLaunchKernel": 211,
    "cudaLaunchKernelExC": 430,
    "cuLaunchKernel": 307,
    "cudaFuncSetAttribute": 273,
}


def _ts(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def _esc(text: str) -> str:
    """Makes static text safe to embed in a %-template."""
    return text.replace("%", "%%")


# --------------------------------------------------------------------------------------------
# Shapes: each op input is (concrete value, type, strides, dims) as record_shapes prints them.


@dataclass(frozen=True)
class Input:
    concrete: str
    dtype: str
    strides: str
    dims: str


def _strides(dims: tuple[int, ...]) -> list[int]:
    out = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        out[i] = out[i + 1] * dims[i + 1]
    return out


def _t(*dims: int, dtype: str = BF16, strides: tuple[int, ...] | None = None) -> Input:
    s = list(strides) if strides is not None else _strides(dims)
    return Input("", dtype, str(s), str(list(dims)))


def _tl(count: int, *dims: int) -> Input:
    """A TensorList of `count` same-shaped tensors."""
    return Input("", "TensorList", str([_strides(dims)] * count), str([list(dims)] * count))


NONE_INPUT = Input("", "", "[]", "[]")


def _in(*args: object) -> tuple[Input, ...]:
    """Op inputs from shorthand: a tuple of ints is a bf16 tensor of that shape, a list a
    ScalarList, None an omitted optional argument, anything else but an Input a Scalar."""
    out = []
    for arg in args:
        if isinstance(arg, Input):
            out.append(arg)
        elif isinstance(arg, tuple):
            out.append(_t(*arg))
        elif isinstance(arg, list):
            out.append(Input(str(arg), "ScalarList", "[]", "[]"))
        elif arg is None:
            out.append(NONE_INPUT)
        else:
            out.append(Input(str(arg), "Scalar", "[]", "[]"))
    return tuple(out)


def _shape_args(inputs: tuple[Input, ...]) -> str:
    if not inputs:
        return ""
    concrete = ", ".join(f'"{i.concrete}"' for i in inputs)
    types = ", ".join(f'"{i.dtype}"' for i in inputs)
    strides = ", ".join(i.strides for i in inputs)
    dims = ", ".join(i.dims for i in inputs)
    return (
        f'"Concrete Inputs": [{concrete}], "Input type": [{types}], '
        f'"Input Strides": [{strides}], "Input Dims": [{dims}], '
    )


# --------------------------------------------------------------------------------------------
# Kernels


@dataclass(frozen=True)
class Kernel:
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers: int
    shared_mem: int

    def launch_args(self) -> str:
        """The static part of the kernel's args, as CUPTI reports them."""
        blocks = self.grid[0] * self.grid[1] * self.grid[2]
        warps_per_block = math.ceil(self.block[0] * self.block[1] * self.block[2] / 32)
        blocks_per_sm = blocks / NUM_SMS
        warps_per_sm = blocks_per_sm * warps_per_block
        reg_limited_warps = 65536 // max(1, self.registers * 32)
        occupancy = int(100 * min(64.0, warps_per_sm, float(reg_limited_warps)) / 64)
        return (
            f'      "registers per thread": {self.registers},      '
            f'"shared memory": {self.shared_mem},      '
            f'"blocks per SM": {blocks_per_sm:.6g},      "warps per SM": {warps_per_sm:.6g},      '
            f'"grid": [{self.grid[0]}, {self.grid[1]}, {self.grid[2]}],      '
            f'"block": [{self.block[0]}, {self.block[1]}, {self.block[2]}],      '
            f'"est. achieved occupancy %": {occupancy}'
        )


def _elementwise(name: str, numel: int) -> Kernel:
    # 128 threads, each handling 4 vectors of 4 elements.
    return Kernel(name, (max(1, numel // (128 * 16)), 1, 1), (128, 1, 1), 28, 0)


def _gemm(name: str, regs: int = 168, smem: int = 213_248, threads: int = 384) -> Kernel:
    # Hopper cuBLAS kernels are persistent: one CTA per SM.
    return Kernel(name, (NUM_SMS, 1, 1), (threads, 1, 1), regs, smem)


_AT = "at::native::"
_ANON = "at::native::(anonymous namespace)::"
_DIRECT_COPY = (
    f"{_AT}direct_copy_kernel_cuda(at::TensorIteratorBase&)::{{lambda()#3}}::operator()() const"
    "::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}"
)
_NOCAST = (
    f"{_AT}gpu_kernel_impl_nocast<{_DIRECT_COPY}>(at::TensorIteratorBase&, {_DIRECT_COPY} const&)"
)
_FLASH_BWD_TRAITS = (
    "Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, "
    "Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >"
)
_SUM_OP = (
    f"{_AT}ReduceOp<c10::BFloat16, {_AT}func_wrapper_t<c10::BFloat16, {_AT}sum_functor<"
    "c10::BFloat16, float, c10::BFloat16>::operator()(at::TensorIterator&)::"
    "{lambda(float, float)#1}>"
    ", unsigned int, c10::BFloat16, 4, 4>"
)


def _binary(functor: str, arity: int = 3) -> str:
    return (
        f"void {_AT}vectorized_elementwise_kernel<4, {functor}, std::array<char*, {arity}ul> >"
        f"(int, {functor}, std::array<char*, {arity}ul>)"
    )


_MUL = (
    f"{_AT}BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
    f"{_AT}binary_internal::MulFunctor<float> >"
)
_RELU = (
    f"{_ANON}launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
    f"{_AT}detail::ClampLimits)::{{lambda()#1}}::operator()() const::{{lambda()#7}}::operator()() "
    "const::{lambda(c10::BFloat16)#1}"
)
_THRESHOLD = (
    f"{_ANON}threshold_kernel_impl<c10::BFloat16>(at::TensorIteratorBase&, c10::BFloat16, "
    "c10::BFloat16)::{lambda(c10::BFloat16, c10::BFloat16)#1}"
)
_ACT = TOKENS * HIDDEN
_ACT_FFN = TOKENS * FFN

K_GEMM_FWD = _gemm(
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_"
    "execute_segment_k_off_kernel__5x_cublas"
)
K_GEMM_FWD_NVJET = _gemm("nvjet_tst_256x128_64x4_2x1_v_bz_coopB_bias_TNT", 168, 215_040)
K_GEMM_DGRAD = _gemm(
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x128x64_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas",
    168,
    181_248,
    256,
)
K_GEMM_WGRAD = _gemm(
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_warpgroupsize2x1x1_"
    "execute_segment_k_off_kernel__5x_cublas"
)
K_GEMM_SMALL = Kernel(
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_bf16_64x64_32x6_tn_align8>"
    "(cutlass_80_tensorop_s1688gemm_bf16_64x64_32x6_tn_align8::Params)",
    (16, 1, 1),
    (128, 1, 1),
    230,
    73_728,
)
K_ADD = _elementwise(_binary(f"{_AT}CUDAFunctor_add<c10::BFloat16>"), _ACT)
K_MUL = _elementwise(_binary(_MUL), _ACT_FFN)
K_RELU = _elementwise(_binary(_RELU, 2), _ACT_FFN)
K_THRESHOLD_BWD = _elementwise(_binary(_THRESHOLD), _ACT_FFN)
K_FILL = Kernel(_binary(f"{_AT}FillFunctor<float>", 1), (1, 1, 1), (64, 1, 1), 16, 0)
K_DIV = Kernel(
    _binary(f"{_AT}BinaryFunctor<float, float, float, {_AT}binary_internal::DivFunctor<float> >"),
    (1, 1, 1),
    (64, 1, 1),
    20,
    0,
)
K_COPY = _elementwise(
    f"void {_AT}elementwise_kernel<128, 4, {_NOCAST}::{{lambda(int)#1}}>"
    f"(int, {_NOCAST}::{{lambda(int)#1}})",
    _ACT,
)
_CAST = (
    f"{_AT}direct_copy_kernel_cuda(at::TensorIteratorBase&)::{{lambda()#3}}::operator()() const"
    "::{lambda()#7}::operator()() const::{lambda(float)#1}"
)
_CAST_ARGS = (
    "std::array<char*, 2ul>, {}TrivialOffsetCalculator<1, unsigned int>, "
    f"TrivialOffsetCalculator<1, unsigned int>, {_AT}memory::LoadWithCast<1>, "
    f"{_AT}memory::StoreWithCast<1>"
)
K_CAST = _elementwise(
    f"void {_AT}unrolled_elementwise_kernel<{_CAST}, {_CAST_ARGS.format('4, ')} >"
    f"(int, {_CAST}, {_CAST_ARGS.format('')})",
    BATCH * 3 * 448 * 448,
)
K_LAYER_NORM = Kernel(
    f"void {_ANON}vectorized_layer_norm_kernel<c10::BFloat16, float, false>(int, float, "
    "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
    "c10::BFloat16*)",
    (TOKENS, 1, 1),
    (256, 1, 1),
    30,
    0,
)
K_LAYER_NORM_BWD_INPUT = Kernel(
    f"void {_ANON}layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>(c10::BFloat16 "
    "const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, "
    "c10::BFloat16*, int)",
    (TOKENS, 1, 1),
    (256, 1, 1),
    40,
    0,
)
K_LAYER_NORM_BWD_GAMMA = Kernel(
    f"void {_ANON}GammaBetaBackwardCUDAKernelTemplate<c10::BFloat16, float, 32u, 32u, 256u, "
    "false, true, false>(long, long, c10::BFloat16 const*, c10::BFloat16 const*, float const*, "
    "float const*, c10::BFloat16*, c10::BFloat16*)",
    (64, 1, 1),
    (32, 32, 1),
    64,
    8_448,
)
K_FLASH_FWD = Kernel(
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
    "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, "
    "false, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
    (PATCHES // 128, BATCH, HEADS),
    (128, 1, 1),
    255,
    49_152,
)
K_FLASH_BWD_DOT = Kernel(
    f"void pytorch_flash::flash_bwd_dot_do_o_kernel<true, {_FLASH_BWD_TRAITS} >"
    "(pytorch_flash::Flash_bwd_params)",
    (PATCHES // 128, BATCH, HEADS),
    (256, 1, 1),
    40,
    0,
)
K_FLASH_BWD = Kernel(
    f"void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<{_FLASH_BWD_TRAITS}, "
    "false, false, false, false, false, true, false>(pytorch_flash::Flash_bwd_params)",
    (PATCHES // 128, BATCH, HEADS),
    (256, 1, 1),
    255,
    114_688,
)
K_FLASH_BWD_CONVERT = Kernel(
    f"void pytorch_flash::flash_bwd_convert_dq_kernel<{_FLASH_BWD_TRAITS} >"
    "(pytorch_flash::Flash_bwd_params, int)",
    (PATCHES // 128, BATCH, HEADS),
    (256, 1, 1),
    64,
    32_768,
)
K_SOFTMAX = Kernel(
    f"void {_ANON}cunn_SoftMaxForward<4, c10::BFloat16, float, c10::BFloat16, "
    f"{_ANON}SoftMaxForwardEpilogue>(c10::BFloat16*, c10::BFloat16 const*, int)",
    (BATCH, 1, 1),
    (512, 1, 1),
    38,
    0,
)
K_LOG_SOFTMAX = Kernel(
    f"void {_ANON}cunn_SoftMaxForward<4, c10::BFloat16, float, float, "
    f"{_ANON}LogSoftMaxForwardEpilogue>(float*, c10::BFloat16 const*, int)",
    (BATCH, 1, 1),
    (512, 1, 1),
    38,
    0,
)
K_LOG_SOFTMAX_BWD = Kernel(
    f"void {_ANON}cunn_SoftMaxBackward<4, float, float, float, "
    f"{_ANON}LogSoftMaxBackwardEpilogue>(float*, float const*, float const*, int)",
    (BATCH, 1, 1),
    (512, 1, 1),
    32,
    0,
)
K_NLL = Kernel(
    f"void {_ANON}nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, "
    "float const*, long const*, float const*, bool, long, long, long, long)",
    (1, 1, 1),
    (32, 1, 1),
    24,
    2_048,
)
K_NLL_BWD = Kernel(
    f"void {_ANON}nll_loss_backward_reduce_cuda_kernel_2d<float, long>(float*, float const*, "
    "long const*, float const*, float const*, bool, int, int, long, long)",
    (1, 1, 1),
    (32, 1, 1),
    22,
    0,
)
K_REDUCE_MEAN = Kernel(
    f"void {_AT}reduce_kernel<512, 1, {_AT}ReduceOp<c10::BFloat16, {_AT}MeanOps<float, float, "
    f"float, float>, unsigned int, c10::BFloat16, 4, 4> >({_AT}ReduceOp<c10::BFloat16, "
    f"{_AT}MeanOps<float, float, float, float>, unsigned int, c10::BFloat16, 4, 4>)",
    (HIDDEN // 16, BATCH, 1),
    (16, 32, 1),
    32,
    2_048,
)
K_REDUCE_SUM = Kernel(
    f"void {_AT}reduce_kernel<128, 4, {_SUM_OP} >({_SUM_OP})",
    (HIDDEN // 32, 8, 1),
    (32, 4, 1),
    40,
    2_048,
)
K_ARGMAX = Kernel(
    f"void {_AT}reduce_kernel<512, 1, {_AT}ReduceOp<c10::BFloat16, {_AT}ArgMaxOps<float>, "
    f"unsigned int, long, 4, 4> >({_AT}ReduceOp<c10::BFloat16, {_AT}ArgMaxOps<float>, "
    "unsigned int, long, 4, 4>)",
    (1, 8, 1),
    (32, 16, 1),
    32,
    4_096,
)
K_CONV_LAYOUT = Kernel(
    "void cudnn::ops::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true, "
    "(cudnnKernelDataType_t)0>(cudnn::ops::nchw2nhwc_params_t<float>, __nv_bfloat16 const*, "
    "__nv_bfloat16*)",
    (1568, 1, 8),
    (256, 1, 1),
    22,
    0,
)
K_CONV_FPROP = _gemm(
    "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nchw_tilesize128x128x64_"
    "warpgroupsize1x1x1_g1_execute_kernel__5x_cudnn",
    168,
    180_224,
    256,
)
K_CONV_WGRAD = _gemm(
    "sm90_xmma_wgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nchw_tilesize128x128x64_"
    "warpgroupsize1x1x1_g1_execute_kernel__5x_cudnn",
    168,
    180_224,
    256,
)
K_TRITON_FWD = Kernel("triton_poi_fused_add_mul_0", (_ACT // 1024, 1, 1), (256, 1, 1), 24, 0)
K_TRITON_BWD_MUL = Kernel("triton_poi_fused_mul_1", (_ACT // 1024, 1, 1), (256, 1, 1), 22, 0)
K_TRITON_BWD_SUM = Kernel("triton_red_fused_mul_sum_2", (HIDDEN // 64, 1, 1), (64, 8, 1), 40, 1_024)
K_FOREACH_NORM = Kernel(
    f"void {_ANON}multi_tensor_apply_kernel<{_ANON}TensorListMetadata<1>, {_ANON}LpNormFunctor<"
    f"c10::BFloat16, ({_ANON}NormType)1, float, float>, float*, int>({_ANON}TensorListMetadata<1>"
    f", {_ANON}LpNormFunctor<c10::BFloat16, ({_ANON}NormType)1, float, float>, float*, int)",
    (320, 1, 1),
    (512, 1, 1),
    32,
    2_048,
)
K_FOREACH_MUL = Kernel(
    f"void {_ANON}multi_tensor_apply_kernel<{_ANON}TensorListMetadata<1>, {_ANON}"
    "BinaryOpScalarTensorFunctor<c10::BFloat16, 1, 1, 0>, std::multiplies<float>, float*>("
    f"{_ANON}TensorListMetadata<1>, {_ANON}BinaryOpScalarTensorFunctor<c10::BFloat16, 1, 1, 0>, "
    "std::multiplies<float>, float*)",
    (320, 1, 1),
    (512, 1, 1),
    26,
    0,
)
_ADAMW_ARGS = (
    f"{_ANON}FusedOptimizerTensorListMetadata<4>, {_ANON}FusedAdamMathFunctor<c10::BFloat16, 4, "
    "(at::native::ADAM_MODE)1, false>, double, double, double, double, double, bool, "
    "float const*, float const*"
)
K_FUSED_ADAMW = Kernel(
    f"void {_ANON}multi_tensor_apply_kernel<{_ADAMW_ARGS}>({_ADAMW_ARGS})",
    (320, 1, 1),
    (512, 1, 1),
    72,
    0,
)
K_NCCL = Kernel(
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    (24, 1, 1),
    (640, 1, 1),
    96,
    103_808,
)


def _gemm_ns(m: int, n: int, k: int, efficiency: float = 0.62) -> int:
    return int(2 * m * n * k / (PEAK_FLOP_PER_NS * efficiency))


def _mem_ns(nbytes: int, efficiency: float = 0.82) -> int:
    return int(nbytes / (HBM_BYTES_PER_NS * efficiency)) + 1500


# --------------------------------------------------------------------------------------------
# The op tree the generator replays


@dataclass(slots=True)
class Site:
    """A preformatted event template for one named CPU-side event on one thread."""

    kind: int
    fmt: str


@dataclass(slots=True)
class Call:
    """A CUDA runtime/driver call made by an op, and the GPU activity it enqueues, if any."""

    mode: int
    fmt: str  # the runtime event (and its ac2g flow start), with External id
    fmt_noext: str  # the same without External id, for calls made outside any cpu_op
    api_ns: int
    stream: int = COMPUTE_STREAM
    gpu_fmt: str = ""
    gpu_ns: int = 0
    nbytes: int = 0  # memcpy/memset size; 0 for kernels
    src: int = COMPUTE_STREAM
    blocking: bool = False
    skew_ns: int = 0  # extra random wait, for collectives waiting on slower ranks


@dataclass(slots=True)
class Op:
    """A CPU-side event with its nested ops, in call order; `site` None groups without emitting."""

    site: Site | None
    pre_ns: int = 2500
    post_ns: int = 900
    children: tuple[Op, ...] = ()
    calls: tuple[Call, ...] = ()
    autograd: int = AG_NONE
    grad: Op | None = None  # backward tree queued by AG_FWD and AG_MARK ops
    grad_acc: Op | None = None  # AG_MARK: backward tree for the later micro-batches
    grad_sync: Op | None = None  # AG_MARK: the DDP all-reduce, last micro-batch only
    alloc: int = 0  # GPU bytes allocated (AG_FWD) or released (by its backward)
    span: str = ""  # name of the gpu_user_annotation covering the GPU work it launched


class _Thread:
    __slots__ = ("ext_stack", "now", "py_stack", "tid")

    def __init__(self, tid: int, now: int) -> None:
        self.tid = tid
        self.now = now
        self.ext_stack: list[int] = []
        # Top-level frames hang off a frame opened before profiling began, as in real traces.
        self.py_stack: list[int] = [1]


class _Builder:
    """Builds Sites, Calls and Ops with every static byte of their events precomputed."""

    def __init__(self, pid: int, main_tid: int, bwd_tid: int) -> None:
        self.pid = pid
        self.main_tid = main_tid
        self.bwd_tid = bwd_tid
        self._kernel_fmt: dict[tuple[str, int], str] = {}

    def _head(self, cat: str, name: str, tid: int) -> str:
        return _esc(
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {self.pid}, '
            f'"tid": {tid},\n    "ts": '
        )

    def site(
        self,
        tid: int,
        name: str,
        inputs: tuple[Input, ...] = (),
        seq: bool = False,
        extra: str = "",
    ) -> Site:
        body = '%d.%03d, "dur": %d.%03d,\n    "args": {\n      "External id": %d,'
        body += '"Record function id": 0, '
        if seq:
            fwd_thread = 1 if tid == self.bwd_tid else 0
            body += f'"Sequence number": %d, "Fwd thread id": {fwd_thread}, '
        fmt = self._head("cpu_op", name, tid) + body + _esc(_shape_args(inputs) + extra)
        return Site(K_SEQ if seq else K_OP, fmt + '"Ev Idx": %d\n    }\n  }')

    def annotation_site(self, tid: int, name: str) -> Site:
        fmt = self._head("user_annotation", name, tid) + (
            '%d.%03d, "dur": %d.%03d,\n    "args": {\n      "External id": %d,'
            '"Record function id": 0, "Ev Idx": %d\n    }\n  }'
        )
        return Site(K_ANNOTATION, fmt)

    def py_site(self, tid: int, name: str) -> Site:
        module = ' "Python module id": 0,' if name.startswith("nn.Module: ") else ""
        fmt = self._head("python_function", name, tid) + (
            '%d.%03d, "dur": %d.%03d,\n    "args": {\n      "Python parent id": %d, '
            f'"Python id": %d,{module} "Ev Idx": %d\n    }}\n  }}'
        )
        return Site(K_PY, fmt)

    # ---- calls

    def _runtime_fmt(self, tid: int, api: str, flow: bool) -> tuple[str, str]:
        cat = "cuda_driver" if api.startswith("cuL") else "cuda_runtime"
        head = self._head(cat, api, tid) + '%d.%03d, "dur": %d.%03d,\n    "args": {\n      '
        # Kineto strips the newlines CUPTI metadata starts with, leaving runs of spaces.
        tail = f'      "cbid": {CBID[api]}, "correlation": %d\n    }}\n  }}'
        with_ext = head + '"External id": %d,' + tail
        if flow:
            with_ext += (
                f',\n  {{\n    "ph": "s", "id": %d, "pid": {self.pid}, "tid": {tid}, '
                '"ts": %d.%03d,\n    "cat": "ac2g", "name": "ac2g"\n  }'
            )
        return with_ext, head + tail

    @staticmethod
    def _gpu_head(cat: str, name: str, stream: int) -> str:
        return (
            _esc(
                f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": 0, '
                f'"tid": {stream},\n'
                '    "ts": '
            )
            + '%d.%03d, "dur": %d.%03d,\n    "args": {\n      "External id": %d,'
        )

    @staticmethod
    def _flow_end(stream: int) -> str:
        return (
            f',\n  {{\n    "ph": "f", "id": %d, "pid": 0, "tid": {stream}, "ts": %d.%03d,\n'
            '    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }'
        )

    def _kernel_template(self, kernel: Kernel, stream: int, extra_args: str) -> str:
        key = (kernel.name + extra_args, stream)
        cached = self._kernel_fmt.get(key)
        if cached is None:
            cached = (
                self._gpu_head("kernel", kernel.name, stream)
                + f'      "queued": 0, "device": 0, "context": 1,      "stream": {stream}, '
                + '"correlation": %d,'
                + _esc(kernel.launch_args() + extra_args)
                + "\n    }\n  }"
                + self._flow_end(stream)
            )
            self._kernel_fmt[key] = cached
        return cached

    def launch(
        self,
        tid: int,
        kernel: Kernel,
        gpu_ns: int,
        stream: int = COMPUTE_STREAM,
        api: str = "cudaLaunchKernel",
        extra_args: str = "",
        skew_ns: int = 0,
    ) -> Call:
        fmt, noext = self._runtime_fmt(tid, api, flow=True)
        api_ns = {"cudaLaunchKernel": 3800, "cuLaunchKernel": 5200}.get(api, 6500)
        gpu_fmt = self._kernel_template(kernel, stream, extra_args)
        return Call(C_GPU, fmt, noext, api_ns, stream, gpu_fmt, gpu_ns, skew_ns=skew_ns)

    def transfer(
        self, tid: int, name: str, nbytes: int, gbps: float, stream: int, blocking: bool = False
    ) -> Call:
        memset = name.startswith("Memset")
        fmt, noext = self._runtime_fmt(
            tid, "cudaMemsetAsync" if memset else "cudaMemcpyAsync", True
        )
        gpu_fmt = (
            self._gpu_head("gpu_memset" if memset else "gpu_memcpy", name, stream)
            + f'      "device": 0, "context": 1,      "stream": {stream}, "correlation": %d,'
            + f'      "bytes": {nbytes}, "memory bandwidth (GB/s)": %s\n    }}\n  }}'
            + self._flow_end(stream)
        )
        api_ns = 4500 if memset else 9000
        gpu_ns = int(nbytes / gbps) + 1200
        return Call(C_GPU, fmt, noext, api_ns, stream, gpu_fmt, gpu_ns, nbytes, blocking=blocking)

    def runtime(
        self,
        tid: int,
        api: str,
        mode: int,
        api_ns: int,
        stream: int = COMPUTE_STREAM,
        src: int = COMPUTE_STREAM,
    ) -> Call:
        fmt, noext = self._runtime_fmt(tid, api, flow=False)
        return Call(mode, fmt, noext, api_ns, stream, src=src)

    # ---- ops

    def op(
        self,
        tid: int,
        name: str,
        inputs: tuple[Input, ...] = (),
        *children: Op,
        calls: tuple[Call, ...] = (),
        pre: int = 2500,
        grad: Op | None = None,
        alloc: int = 0,
    ) -> Op:
        """A cpu_op; given `grad`, it creates an autograd node whose backward is `grad`."""
        op = Op(self.site(tid, name, inputs, grad is not None), pre, 900, children, calls)
        if grad is not None:
            op.autograd = AG_FWD
            op.grad = grad
            op.alloc = alloc
            grad.alloc = -alloc
        return op

    def kop(
        self,
        tid: int,
        name: str,
        inputs: tuple[Input, ...],
        kernel: Kernel,
        gpu_ns: int,
        *children: Op,
        grad: Op | None = None,
        alloc: int = 0,
    ) -> Op:
        """A cpu_op that launches one kernel on the compute stream after its children."""
        call = self.launch(tid, kernel, gpu_ns)
        return self.op(
            tid, name, inputs, *children, calls=(call,), pre=6000, grad=grad, alloc=alloc
        )

    def bwd(
        self, node: str, inputs: tuple[Input, ...], *children: Op, calls: tuple[Call, ...] = ()
    ) -> Op:
        """A backward node as the autograd engine runs it, wrapped in evaluate_function."""
        inner = Op(self.site(self.bwd_tid, node, inputs, True), 3000, 900, children, calls, AG_NODE)
        outer = self.site(self.bwd_tid, "autograd::engine::evaluate_function: " + node, (), True)
        return Op(outer, 1500, 1200, (inner,), autograd=AG_EVAL)

    def py(
        self, tid: int, name: str, *children: Op, pre: int = 1500, calls: tuple[Call, ...] = ()
    ) -> Op:
        return Op(self.py_site(tid, name), pre, 700, children, calls)

    def annotation(
        self,
        tid: int,
        name: str,
        *children: Op,
        calls: tuple[Call, ...] = (),
        span: bool = False,
        pre: int = 3000,
    ) -> Op:
        site = self.annotation_site(tid, name)
        return Op(site, pre, 1500, children, calls, span=name if span else "")


# --------------------------------------------------------------------------------------------
# The model: one micro-batch of a data-parallel ViT training step, as op trees


@dataclass
class Model:
    zero_grad: Op
    micro_batch: Op
    ddp_finalize: Op
    clip_and_step: Op
    metrics: Op
    device_sync: Op
    empty_cache: Op


_X = (BATCH, PATCHES, HIDDEN)
_FFN = (TOKENS, FFN)
_HEADS = (BATCH, HEADS, PATCHES, HEAD_DIM)
_QKV = (3, BATCH, HEADS, PATCHES, HEAD_DIM)
_IMAGE = (BATCH, 3, 448, 448)
_CONV_W = (HIDDEN, 3, 14, 14)
_CONV_OUT = (BATCH, HIDDEN, 32, 32)
_LOGITS = (BATCH, CLASSES)
_ACT_BYTES = _ACT * 2
_FFN_BYTES = _ACT_FFN * 2
_LAYER_PARAMS = [(HIDDEN,)] * 4 + [
    (3 * HIDDEN, HIDDEN), (3 * HIDDEN,), (HIDDEN, HIDDEN), (HIDDEN,),
    (FFN, HIDDEN), (FFN,), (HIDDEN, FFN), (HIDDEN,), (HIDDEN,),
]  # fmt: skip
# Patch embedding, position embedding, final norm and classifier head.
_OTHER_PARAMS = [
    _CONV_W, (HIDDEN,), (1, PATCHES, HIDDEN), (HIDDEN,), (HIDDEN,), (CLASSES, HIDDEN), (CLASSES,),
]  # fmt: skip


def _f32(*dims: int) -> Input:
    return _t(*dims, dtype="float")


def _i64(*dims: int) -> Input:
    return _t(*dims, dtype="long int")


def _build_model(b: _Builder, layers: int) -> Model:
    # The op trees are laid out by hand, like the call stacks they describe.
    # fmt: off
    m, w = b.main_tid, b.bwd_tid

    # ---- ops that only touch metadata

    def as_strided(tid: int, dims: tuple[int, ...]) -> Op:
        return b.op(tid, "aten::as_strided", _in(dims, list(dims), _strides(dims), None), pre=1500)

    def transpose(tid: int, dims: tuple[int, ...], grad: Op | None = None) -> Op:
        return b.op(tid, "aten::transpose", _in(dims, 0, 1), as_strided(tid, dims), grad=grad)

    def view(tid: int, dims: tuple[int, ...]) -> Op:
        return b.op(tid, "aten::view", _in(dims, list(dims)), pre=1800)

    def empty(tid: int, dims: tuple[int, ...], name: str = "aten::empty") -> Op:
        return b.op(tid, name, _in(list(dims), 15, 0, None, False, None), pre=3000)

    def t_op(tid: int, out: int, inp: int, grad: Op | None = None) -> Op:
        return b.op(tid, "aten::t", _in((out, inp)), transpose(tid, (out, inp)), grad=grad)

    # ---- gradient bookkeeping on the autograd thread

    def accumulate(dims: tuple[int, ...], first: bool) -> Op:
        if first:  # the first gradient is stolen, not added
            inner = b.op(w, "aten::detach", _in(dims), b.op(w, "detach", _in(dims), pre=1200))
        else:
            numel = math.prod(dims)
            add = _elementwise(K_ADD.name, numel)
            inner = b.kop(w, "aten::add_", _in(dims, dims, 1), add, _mem_ns(6 * numel))
        node = b.op(w, "torch::autograd::AccumulateGrad", _in(dims), inner, pre=2000)
        name = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
        return Op(b.site(w, name), 1200, 800, (node,))

    group = (
        f'"Process Group Name": "0", "Process Group Description": "default_pg", '
        f'"Process Group Ranks": "{list(range(WORLD_SIZE))}"'
    )
    splits = '"In split size": "[]", "Out split size": "[]"'

    def all_reduce(params: list[tuple[int, ...]]) -> Op:
        """DDP's bucket all-reduce, run from the autograd thread once a bucket's grads are ready."""
        numel = sum(math.prod(p) for p in params)
        sizes = f'"In msg nelems": {numel}, "Out msg nelems": {numel}, "Group size": {WORLD_SIZE}'
        collective = f'"Collective name": "allreduce", {sizes}, "dtype": "BFloat16"'
        # Kineto copies the collective's metadata from record_param_comms onto the kernel.
        kernel_args = f", {collective}, {splits}, {group}"
        ranks = f'"Rank": {RANK}, "Global rank start": 0, "Global rank stride": 1'
        comm_args = f"{collective}, {ranks}, {splits}, {group}, "
        comm_site = b.site(w, "record_param_comms", _in((numel,)), extra=comm_args)
        ring_ns = int(2 * (WORLD_SIZE - 1) / WORLD_SIZE * numel * 2 / 180.0) + 12_000
        nccl = b.launch(
            w, K_NCCL, ring_ns, NCCL_STREAM, "cudaLaunchKernelExC", kernel_args, skew_ns=300_000
        )
        # The kernel waits on the compute stream, which has the bucket's gradients.
        enqueue = (
            b.runtime(w, "cudaEventRecord", C_RECORD, 2000, COMPUTE_STREAM),
            b.runtime(w, "cudaStreamWaitEvent", C_WAIT, 1800, NCCL_STREAM, COMPUTE_STREAM),
            nccl,
            b.runtime(w, "cudaEventRecord", C_RECORD, 2000, NCCL_STREAM),
        )
        annotation = b.annotation(w, "nccl:all_reduce", calls=enqueue, span=True, pre=8000)
        flatten = b.transfer(w, "Memcpy DtoD (Device -> Device)", numel * 2, 1300.0, COMPUTE_STREAM)
        divide = _elementwise(K_DIV.name, numel)
        return Op(
            None,
            children=(
                b.op(w, "aten::copy_", _in((numel,), (numel,), False), calls=(flatten,), pre=5000),
                b.kop(w, "aten::div_", _in((numel,), WORLD_SIZE), divide, _mem_ns(4 * numel)),
                b.op(w, "c10d::allreduce_", (), Op(comm_site, 12_000, 15_000, (annotation,))),
            ),
        )

    def gradient_work(params: list[tuple[int, ...]]) -> Op:
        """Marks where a group of parameters' gradients become ready in the backward pass."""
        return Op(
            None,
            autograd=AG_MARK,
            grad=Op(None, children=tuple(accumulate(p, True) for p in params)),
            grad_acc=Op(None, children=tuple(accumulate(p, False) for p in params)),
            grad_sync=all_reduce(params),
        )

    # ---- transformer block

    def linear(index: int, inp: int, out: int, kernel: Kernel, alloc: int) -> Op:
        flops = (TOKENS, out, inp)
        wgrad_in = (_t(out, TOKENS, strides=(1, out)), _t(TOKENS, inp))
        grad = b.bwd(
            "AddmmBackward0",
            _in((TOKENS, out)),
            t_op(w, inp, out),
            b.kop(w, "aten::mm", _in((TOKENS, out), (out, inp)), K_GEMM_DGRAD, _gemm_ns(*flops)),
            t_op(w, TOKENS, out),
            b.kop(w, "aten::mm", wgrad_in, K_GEMM_WGRAD, _gemm_ns(*flops, 0.58)),
            b.kop(w, "aten::sum", _in((TOKENS, out), [0], True, None), K_REDUCE_SUM,
                  _mem_ns(2 * TOKENS * out)),
            view(w, (1, out)),
            t_op(w, out, inp),
        )
        weight_t = _t(inp, out, strides=(1, inp))
        addmm = b.kop(
            m, "aten::addmm", _in((out,), (TOKENS, inp), weight_t, 1, 1), kernel,
            _gemm_ns(*flops), grad=grad, alloc=alloc,
        )
        t_grad = b.bwd("TBackward0", _in(weight_t), t_op(w, inp, out))
        return b.py(
            m,
            f"nn.Module: Linear_{index}",
            b.py(
                m,
                "torch/nn/modules/linear.py(125): forward",
                b.op(
                    m, "aten::linear", _in((BATCH, PATCHES, inp), (out, inp), (out,)),
                    t_op(m, out, inp, grad=t_grad), view(m, (BATCH, PATCHES, inp)), addmm,
                    view(m, (TOKENS, out)), pre=4000,
                ),
            ),
        )

    ln_grad = b.bwd(
        "NativeLayerNormBackward0",
        _in(_X),
        b.op(
            w, "aten::native_layer_norm_backward",
            _in(_X, _X, [HIDDEN], _f32(BATCH, PATCHES, 1), _f32(BATCH, PATCHES, 1), (HIDDEN,),
                (HIDDEN,), None),
            empty(w, _X, "aten::empty_like"), empty(w, (HIDDEN,), "aten::empty_like"),
            empty(w, (HIDDEN,), "aten::empty_like"),
            calls=(
                b.launch(w, K_LAYER_NORM_BWD_INPUT, _mem_ns(4 * _ACT_BYTES)),
                b.launch(w, K_LAYER_NORM_BWD_GAMMA, _mem_ns(2 * _ACT_BYTES)),
            ),
            pre=5000,
        ),
    )

    def layer_norm(index: int) -> Op:
        native = b.kop(
            m, "aten::native_layer_norm", _in(_X, [HIDDEN], (HIDDEN,), (HIDDEN,), 1e-06),
            K_LAYER_NORM, _mem_ns(2 * _ACT_BYTES), empty(m, _X, "aten::empty_like"),
            empty(m, (BATCH, PATCHES, 1)), empty(m, (BATCH, PATCHES, 1)),
            grad=ln_grad, alloc=_ACT_BYTES,
        )
        inputs = _in(_X, [HIDDEN], (HIDDEN,), (HIDDEN,), 1e-06, True)
        return b.py(
            m,
            f"nn.Module: LayerNorm_{index}",
            b.py(
                m,
                "torch/nn/modules/normalization.py(217): forward",
                b.op(m, "aten::layer_norm", inputs, native),
            ),
        )

    qkv_strides = (HIDDEN, 3 * HIDDEN * PATCHES, HEAD_DIM, 3 * HIDDEN, 1)
    q = _t(*_HEADS, strides=qkv_strides[1:])  # a head-major view into the fused qkv output
    heads_last_strides = (HIDDEN * PATCHES, HEAD_DIM, HEAD_DIM * PATCHES, 1)
    heads_last = _t(BATCH, PATCHES, HEADS, HEAD_DIM, strides=heads_last_strides)
    flash_fwd_ns = _gemm_ns(4 * BATCH * HEADS, PATCHES * PATCHES, HEAD_DIM, 0.5)
    # flash-attention raises its kernels' shared-memory limit before every launch.
    smem_limit = (b.runtime(m, "cudaFuncSetAttribute", C_PLAIN, 2200),)
    smem_limit_bwd = (b.runtime(w, "cudaFuncSetAttribute", C_PLAIN, 2200),)
    flash_grad = b.bwd(
        "ScaledDotProductFlashAttentionBackward0",
        _in(_HEADS),
        b.op(
            w, "aten::_scaled_dot_product_flash_attention_backward", (q,) * 5,
            b.op(
                w, "aten::_flash_attention_backward", _in(*[_HEADS] * 5),
                empty(w, _HEADS, "aten::empty_like"), empty(w, _HEADS, "aten::empty_like"),
                empty(w, _HEADS, "aten::empty_like"),
                b.op(
                    w, "aten::zeros", _in(list(_HEADS), 6), empty(w, _HEADS),
                    calls=(b.transfer(w, "Memset (Device)", _ACT * 4, 2600.0, COMPUTE_STREAM),),
                ),
                calls=(
                    b.launch(w, K_FLASH_BWD_DOT, _mem_ns(2 * _ACT_BYTES)),
                    *smem_limit_bwd,
                    b.launch(w, K_FLASH_BWD, int(flash_fwd_ns * 2.6)),
                    b.launch(w, K_FLASH_BWD_CONVERT, _mem_ns(3 * _ACT_BYTES)),
                ),
                pre=9000,
            ),
            pre=4000,
        ),
    )
    heads_in = (BATCH, PATCHES, HEADS, HEAD_DIM)
    flash = b.op(
        m, "aten::_flash_attention_forward",
        _in(heads_in, heads_in, heads_in, None, None, PATCHES, PATCHES, 0.0, False, False),
        empty(m, heads_in, "aten::empty_like"), empty(m, (BATCH, HEADS, PATCHES)),
        calls=(*smem_limit, b.launch(m, K_FLASH_FWD, flash_fwd_ns)), pre=7000,
    )
    sdpa = b.op(
        m, "aten::scaled_dot_product_attention", _in(q, q, q, None, 0.0, False, None, False),
        b.op(
            m, "aten::_scaled_dot_product_flash_attention", _in(q, q, q, 0.0, False, False, None),
            transpose(m, _HEADS), transpose(m, _HEADS), transpose(m, _HEADS), flash,
            transpose(m, heads_in), pre=5000, grad=flash_grad, alloc=_ACT_BYTES,
        ),
        pre=3500,
    )
    merge_heads = b.op(
        m, "aten::reshape", _in(heads_last, list(_X)),
        b.op(
            m, "aten::clone", _in(heads_last, 0), empty(m, heads_in, "aten::empty_like"),
            b.kop(m, "aten::copy_", _in(_X, _X, False), K_COPY, _mem_ns(2 * _ACT_BYTES)),
        ),
        b.op(m, "aten::_unsafe_view", _in(_X, list(_X))),
        grad=b.bwd(
            "UnsafeViewBackward0", _in(_X),
            b.op(w, "aten::reshape", _in(_X, list(_HEADS)), view(w, _HEADS)),
        ),
        alloc=_ACT_BYTES,
    )
    split = (BATCH, PATCHES, 3, HEADS, HEAD_DIM)
    qkv = _t(*_QKV, strides=qkv_strides)
    selects = [b.op(m, "aten::select", _in(qkv, 0, i), as_strided(m, _HEADS)) for i in range(3)]
    split_heads = (
        view(m, split),
        b.op(
            m, "aten::permute", _in(split, [2, 0, 3, 1, 4]), as_strided(m, _QKV),
            grad=b.bwd(
                "PermuteBackward0", _in(_QKV),
                b.op(w, "aten::permute", _in(_QKV, [1, 3, 0, 2, 4]), as_strided(w, _QKV)),
            ),
        ),
        b.op(
            m, "aten::unbind", _in(qkv, 0), *selects,
            grad=b.bwd(
                "UnbindBackward0", _in(_HEADS),
                b.op(
                    w, "aten::stack", _in(_HEADS, 0),
                    b.kop(w, "aten::cat", _in(_HEADS, 0), K_COPY, _mem_ns(6 * _ACT_BYTES)),
                ),
            ),
        ),
    )
    ffn_3 = _mem_ns(3 * _FFN_BYTES)
    relu = b.op(
        m, "aten::relu", _in(_FFN),
        b.kop(m, "aten::clamp_min", _in(_FFN, 0), K_RELU, _mem_ns(2 * _FFN_BYTES)),
        grad=b.bwd(
            "ReluBackward0", _in(_FFN),
            b.kop(w, "aten::threshold_backward", _in(_FFN, _FFN, 0), K_THRESHOLD_BWD, ffn_3),
        ),
        alloc=_FFN_BYTES,
    )
    square = b.kop(
        m, "aten::mul", _in(_FFN, _FFN), K_MUL, ffn_3,
        grad=b.bwd(
            "MulBackward0", _in(_FFN),
            b.kop(w, "aten::mul", _in(_FFN, _FFN), K_MUL, ffn_3),
            b.kop(w, "aten::mul", _in(_FFN, _FFN), K_MUL, ffn_3),
            b.kop(w, "aten::add", _in(_FFN, _FFN, 1), K_ADD, ffn_3),
        ),
        alloc=_FFN_BYTES,
    )
    graph = "## Call CompiledFxGraph ckz7ozcd6sjxqdjxnlqfrw43ezfbokysewlj4ng4sq2zbizwj5fy ##"
    act_2, act_3 = _mem_ns(2 * _ACT_BYTES), _mem_ns(3 * _ACT_BYTES)
    compiled = b.annotation(
        m, "Torch-Compiled Region: 0/1",
        b.op(
            m, "CompiledFunction", _in(_X, _X, (HIDDEN,)),
            b.annotation(
                m, graph,
                b.py(
                    m, "torch/_inductor/output_code.py(584): __call__",
                    calls=(b.launch(m, K_TRITON_FWD, act_3, api="cuLaunchKernel"),),
                ),
                pre=12_000,
            ),
            pre=15_000,
            grad=b.bwd(
                "CompiledFunctionBackward", _in(_X),
                b.annotation(
                    w, graph,
                    calls=(
                        b.launch(w, K_TRITON_BWD_MUL, act_3, api="cuLaunchKernel"),
                        b.launch(w, K_TRITON_BWD_SUM, act_2, api="cuLaunchKernel"),
                    ),
                    pre=9000,
                ),
            ),
            alloc=_ACT_BYTES,
        ),
        pre=9000,
    )
    residual_grad = b.bwd("AddBackward0", _in(_X))
    residual = b.kop(
        m, "aten::add", _in(_X, _X, 1), K_ADD, act_3, grad=residual_grad, alloc=_ACT_BYTES
    )
    block_gradients = gradient_work(_LAYER_PARAMS)

    def block(i: int) -> Op:
        attention = b.py(
            m, f"nn.Module: Attention_{i}",
            b.py(
                m, "models/vit.py(74): forward",
                linear(4 * i, HIDDEN, 3 * HIDDEN, K_GEMM_FWD, 3 * _ACT_BYTES), *split_heads, sdpa,
                merge_heads, linear(4 * i + 1, HIDDEN, HIDDEN, K_GEMM_FWD_NVJET, _ACT_BYTES),
            ),
        )
        mlp = b.py(
            m, f"nn.Module: Mlp_{i}",
            b.py(
                m, "models/vit.py(40): forward",
                linear(4 * i + 2, HIDDEN, FFN, K_GEMM_FWD, _FFN_BYTES),
                b.py(m, f"nn.Module: ReLU_{i}", relu), square,
                linear(4 * i + 3, FFN, HIDDEN, K_GEMM_FWD_NVJET, _ACT_BYTES),
            ),
        )
        return b.py(
            m, f"nn.Module: Block_{i}", block_gradients,
            b.py(
                m, "models/vit.py(121): forward",
                layer_norm(2 * i), attention, residual, layer_norm(2 * i + 1), mlp, compiled,
            ),
        )

    # ---- patch embedding, head and loss

    conv_args = ([14, 14], [0, 0], [1, 1], False, [0, 0], 1)
    conv = b.op(
        m, "aten::convolution", _in(_IMAGE, _CONV_W, (HIDDEN,), *conv_args),
        b.op(
            m, "aten::_convolution", _in(_IMAGE, _CONV_W, (HIDDEN,), *conv_args, False, False,
                                         True, True),
            b.op(
                m, "aten::cudnn_convolution",
                _in(_IMAGE, _CONV_W, [0, 0], [14, 14], [1, 1], 1, False, True, True),
                empty(m, _CONV_OUT),
                calls=(
                    b.launch(m, K_CONV_LAYOUT, _mem_ns(4 * math.prod(_IMAGE))),
                    b.launch(m, K_CONV_FPROP, _gemm_ns(TOKENS, HIDDEN, 588, 0.45)),
                ),
                pre=25_000,
            ),
            view(m, (1, HIDDEN, 1, 1)),
            b.kop(m, "aten::add_", _in(_CONV_OUT, (1, HIDDEN, 1, 1), 1), K_ADD, act_3),
        ),
        grad=b.bwd(
            "ConvolutionBackward0", _in(_CONV_OUT),
            b.op(
                w, "aten::convolution_backward",
                _in(_CONV_OUT, _IMAGE, _CONV_W, [HIDDEN], *conv_args, [0, 1, 1]),
                empty(w, _CONV_W, "aten::empty_like"),
                calls=(
                    b.launch(w, K_CONV_WGRAD, _gemm_ns(TOKENS, HIDDEN, 588, 0.4)),
                    b.launch(w, K_REDUCE_SUM, _mem_ns(_ACT_BYTES)),
                ),
                pre=12_000,
            ),
        ),
        alloc=_ACT_BYTES,
    )
    patch_embed = b.py(
        m, "nn.Module: PatchEmbed_0",
        b.py(
            m, "timm/layers/patch_embed.py(131): forward",
            b.py(
                m, "nn.Module: Conv2d_0",
                b.op(m, "aten::conv2d", _in(_IMAGE, _CONV_W, (HIDDEN,), *conv_args[:3], 1), conv),
            ),
            b.op(m, "aten::flatten", _in(_CONV_OUT, 2, -1), view(m, (BATCH, HIDDEN, PATCHES))),
            transpose(
                m, (BATCH, HIDDEN, PATCHES),
                grad=b.bwd("TransposeBackward0", _in(_X), transpose(w, _X)),
            ),
        ),
    )
    pos_embed = b.kop(
        m, "aten::add", _in(_X, (1, PATCHES, HIDDEN), 1), K_ADD, act_3, grad=residual_grad,
        alloc=_ACT_BYTES,
    )
    head_ns = _gemm_ns(BATCH, CLASSES, HIDDEN, 0.05)
    head_weight_t = _t(HIDDEN, CLASSES, strides=(1, HIDDEN))
    head = (
        layer_norm(2 * layers),
        b.kop(
            m, "aten::mean", _in(_X, [1], False, None), K_REDUCE_MEAN, _mem_ns(_ACT_BYTES),
            grad=b.bwd(
                "MeanBackward1", _in((BATCH, HIDDEN)),
                b.op(w, "aten::expand", _in((BATCH, 1, HIDDEN), list(_X)), as_strided(w, _X)),
                b.kop(w, "aten::div", _in(_X, PATCHES), K_ADD, _mem_ns(2 * _ACT_BYTES)),
            ),
            alloc=BATCH * HIDDEN * 2,
        ),
        b.py(
            m, f"nn.Module: Linear_{4 * layers}",
            b.op(
                m, "aten::linear", _in((BATCH, HIDDEN), (CLASSES, HIDDEN), (CLASSES,)),
                t_op(m, CLASSES, HIDDEN),
                b.kop(
                    m, "aten::addmm", _in((CLASSES,), (BATCH, HIDDEN), head_weight_t, 1, 1),
                    K_GEMM_SMALL, head_ns,
                    grad=b.bwd(
                        "AddmmBackward0", _in(_LOGITS),
                        b.kop(w, "aten::mm", _in(_LOGITS, (CLASSES, HIDDEN)), K_GEMM_SMALL,
                              head_ns),
                        b.kop(w, "aten::mm", _in(_t(CLASSES, BATCH, strides=(1, CLASSES)),
                                                 (BATCH, HIDDEN)), K_GEMM_SMALL, head_ns),
                        b.kop(w, "aten::sum", _in(_LOGITS, [0], True, None), K_REDUCE_SUM, 3000),
                    ),
                    alloc=BATCH * CLASSES * 2,
                ),
            ),
        ),
    )
    nll_in = _in(_f32(*_LOGITS), _i64(BATCH), None, 1, -100)
    nll_grad = b.bwd(
        "NllLossBackward0", _in(_f32()),
        b.op(
            w, "aten::nll_loss_backward", _in(_f32(), _f32(*_LOGITS), _i64(BATCH)),
            b.op(
                w, "aten::zero_", _in(_f32(*_LOGITS)),
                b.kop(w, "aten::fill_", _in(_f32(*_LOGITS), 0), K_FILL, 2100),
            ),
            calls=(b.launch(w, K_NLL_BWD, 2600),),
        ),
    )
    log_softmax_grad = b.bwd(
        "LogSoftmaxBackward0", _in(_f32(*_LOGITS)),
        b.kop(
            w, "aten::_log_softmax_backward_data", _in(_f32(*_LOGITS), _f32(*_LOGITS), 1, 15),
            K_LOG_SOFTMAX_BWD, 3800,
        ),
    )
    loss = b.py(
        m, "torch/nn/functional.py(3462): cross_entropy",
        b.op(
            m, "aten::cross_entropy_loss", _in(_LOGITS, _i64(BATCH), None, 1, -100, 0.0),
            b.op(
                m, "aten::log_softmax", _in(_LOGITS, 1, None),
                b.kop(
                    m, "aten::_log_softmax", _in(_LOGITS, 1, False), K_LOG_SOFTMAX, 4200,
                    grad=log_softmax_grad, alloc=BATCH * CLASSES * 4,
                ),
            ),
            b.op(
                m, "aten::nll_loss_nd", nll_in,
                b.op(
                    m, "aten::nll_loss", nll_in,
                    b.kop(m, "aten::nll_loss_forward", nll_in, K_NLL, 3500, grad=nll_grad,
                          alloc=512),
                ),
            ),
        ),
    )
    # Gradient accumulation divides the loss by the number of micro-batches.
    scale = b.kop(
        m, "aten::div", _in(_f32(), 4), K_DIV, 1900,
        grad=b.bwd("DivBackward0", _in(_f32()), b.kop(w, "aten::div", _in(_f32(), 4), K_DIV, 1900)),
        alloc=512,
    )
    forward = b.annotation(
        m, "DistributedDataParallel.forward",
        b.py(
            m, "nn.Module: DistributedDataParallel_0",
            b.py(
                m, "torch/nn/parallel/distributed.py(1622): _run_ddp_forward",
                gradient_work(_OTHER_PARAMS), patch_embed, pos_embed,
                *(block(i) for i in range(layers)), *head,
            ),
        ),
        span=True,
    )

    # ---- data loading and host-to-device copies: a CPU-only stretch the GPU waits on

    sample = b.py(
        m, "data/imagenet.py(57): __getitem__",
        b.py(m, "PIL/Image.py(3431): open", pre=120_000),
        b.py(
            m, "torchvision/transforms/transforms.py(95): __call__",
            b.op(m, "aten::empty", _in([448, 448, 3], 0, 0), pre=4000),
            b.op(
                m, "aten::permute", _in(_t(448, 448, 3, dtype="unsigned char"), [2, 0, 1]),
                as_strided(m, (3, 448, 448)),
            ),
            b.op(m, "aten::div", _in(_t(3, 448, 448, dtype="unsigned char"), 255), pre=180_000),
            b.op(m, "aten::sub", _in(_f32(3, 448, 448), _f32(3, 1, 1), 1), pre=140_000),
            pre=250_000,
        ),
        pre=40_000,
    )
    images = _f32(*_IMAGE)
    loader = b.annotation(
        m, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        b.py(
            m, "torch/utils/data/dataloader.py(733): __next__",
            b.py(
                m, "torch/utils/data/dataloader.py(789): _next_data",
                b.py(m, "torch/utils/data/_utils/fetch.py(52): fetch", *(sample,) * BATCH),
                b.py(
                    m, "torch/utils/data/_utils/collate.py(398): default_collate",
                    b.op(
                        m, "aten::stack", _in(_tl(BATCH, 3, 448, 448), 0),
                        b.op(m, "aten::cat", _in(_tl(BATCH, 3, 448, 448), 0), pre=1_400_000),
                    ),
                ),
                b.py(
                    m, "torch/utils/data/_utils/pin_memory.py(71): pin_memory",
                    b.op(
                        m, "aten::pin_memory", _in(images, None),
                        b.op(
                            m, "aten::_pin_memory", _in(images, None), empty(m, _IMAGE),
                            b.op(m, "aten::copy_", _in(images, images, False), pre=900_000),
                        ),
                    ),
                ),
            ),
        ),
    )

    def to(dims: tuple[int, ...], dtype: str, copy: Op, *args: object) -> Op:
        """Tensor.to(): a new tensor, filled by `copy`."""
        src = _t(*dims, dtype=dtype)
        return b.op(
            m, "aten::to", _in(src, *args),
            b.op(m, "aten::_to_copy", _in(src, *args), empty(m, dims, "aten::empty_strided"), copy),
        )

    to_cuda = (6, 0, None, None, True, False, None)
    pinned_copy = b.transfer(
        m, "Memcpy HtoD (Pinned -> Device)", 4 * math.prod(_IMAGE), 22.0, COPY_STREAM
    )
    label_copy = b.transfer(m, "Memcpy HtoD (Pageable -> Device)", 8 * BATCH, 0.05, COMPUTE_STREAM)
    cast = b.kop(
        m, "aten::copy_", _in(_IMAGE, images, False), K_CAST, _mem_ns(6 * math.prod(_IMAGE))
    )
    h2d = (
        to(_IMAGE, "float", b.op(m, "aten::copy_", _in(_IMAGE, images, True),
                                 calls=(pinned_copy,)), *to_cuda),
        b.py(
            m, "torch/cuda/streams.py(93): wait_stream",
            calls=(
                b.runtime(m, "cudaEventRecord", C_RECORD, 2200, COPY_STREAM),
                b.runtime(m, "cudaStreamWaitEvent", C_WAIT, 1900, COMPUTE_STREAM, COPY_STREAM),
            ),
        ),
        to((BATCH,), "long int", b.op(m, "aten::copy_", _in(_i64(BATCH), _i64(BATCH), False),
                                      calls=(label_copy,)), *to_cuda),
        to(_IMAGE, "float", cast, 15),
    )
    backward = b.py(
        m, "torch/_tensor.py(648): backward",
        b.py(
            m, "torch/autograd/__init__.py(353): backward",
            b.py(
                m, "torch/autograd/graph.py(824): _engine_run_backward",
                b.op(
                    m, "aten::ones_like", _in(_f32(), 6), empty(m, (), "aten::empty_like"),
                    b.kop(m, "aten::fill_", _in(_f32(), 1), K_FILL, 2000),
                ),
                Op(None, autograd=AG_BACKWARD),
            ),
        ),
    )
    micro_batch = b.py(m, "train.py(142): train_step", loader, *h2d, forward, loss, scale, backward)

    # ---- once per step: gradient clipping, optimizer, metrics

    n_tensors = layers * len(_LAYER_PARAMS) + len(_OTHER_PARAMS)
    all_params = layers * PARAMS_PER_LAYER + sum(math.prod(p) for p in _OTHER_PARAMS)
    chunks = layers + 1
    grads = _tl(4, HIDDEN)

    def per_chunk(kernel: Kernel, bytes_per_param: int) -> tuple[Call, ...]:
        """One multi_tensor_apply launch per chunk of the parameters."""
        ns = _mem_ns(all_params * bytes_per_param // chunks)
        return tuple(b.launch(m, kernel, ns) for _ in range(chunks))

    scalar = _f32()
    clip = b.py(
        m, "torch/nn/utils/clip_grad.py(38): _no_grad_wrapper",
        b.py(
            m, "torch/nn/utils/clip_grad.py(161): clip_grad_norm_",
            b.op(m, "aten::_foreach_norm", _in(grads, 2, None), calls=per_chunk(K_FOREACH_NORM, 2),
                 pre=40_000),
            b.op(
                m, "aten::stack", _in(_tl(n_tensors), 0),
                b.kop(m, "aten::cat", _in(_tl(n_tensors), 0), K_COPY, 2400),
            ),
            b.kop(m, "aten::linalg_vector_norm", _in(_f32(n_tensors), 2, None, False, None),
                  K_ARGMAX, 2600),
            b.kop(m, "aten::add", _in(scalar, 1e-06, 1), K_DIV, 1800),
            b.kop(m, "aten::reciprocal", _in(scalar), K_DIV, 1800),
            b.kop(m, "aten::mul", _in(scalar, 1.0), K_DIV, 1800),
            b.kop(m, "aten::clamp", _in(scalar, None, 1.0), K_DIV, 1800),
            b.op(m, "aten::_foreach_mul_", _in(grads, scalar), calls=per_chunk(K_FOREACH_MUL, 4),
                 pre=35_000),
        ),
    )
    step = b.annotation(
        m, "Optimizer.step#AdamW.step",
        b.py(
            m, "torch/optim/optimizer.py(485): wrapper",
            b.py(
                m, "torch/optim/adamw.py(209): step",
                b.py(
                    m, "torch/optim/adamw.py(752): adamw",
                    b.op(m, "aten::_foreach_add_", _in(grads, 1), pre=60_000),
                    b.op(m, "aten::_fused_adamw_", _in(grads, grads, grads, grads),
                         calls=per_chunk(K_FUSED_ADAMW, 22), pre=80_000),
                    pre=30_000,
                ),
                pre=50_000,
            ),
        ),
        span=True,
    )
    # .item() copies to pageable memory, so cudaMemcpyAsync blocks until the GPU catches up.
    item_copy = b.transfer(
        m, "Memcpy DtoH (Device -> Pageable)", 8, 0.004, COMPUTE_STREAM, blocking=True
    )
    loss_copy = b.transfer(m, "Memcpy DtoH (Device -> Pinned)", 4, 0.003, COMPUTE_STREAM)
    metrics = b.py(
        m, "train.py(188): log_metrics",
        b.op(
            m, "aten::softmax", _in(_LOGITS, -1, None),
            b.kop(m, "aten::_softmax", _in(_LOGITS, -1, False), K_SOFTMAX, 4100),
        ),
        b.kop(m, "aten::argmax", _in(_LOGITS, -1, False), K_ARGMAX, 3900),
        b.kop(m, "aten::eq", _in(_i64(BATCH), _i64(BATCH)), K_DIV, 1800),
        b.kop(m, "aten::sum", _in(_t(BATCH, dtype="bool"), None), K_REDUCE_SUM, 3000),
        b.op(
            m, "aten::item", _in(_i64()),
            b.op(
                m, "aten::_local_scalar_dense", _in(_i64()),
                calls=(item_copy, b.runtime(m, "cudaStreamSynchronize", C_SYNC_STREAM, 3500)),
            ),
        ),
        to((), "float", b.op(m, "aten::copy_", _in(scalar, scalar, True), calls=(loss_copy,)),
           *to_cuda),
    )
    # fmt: on
    return Model(
        zero_grad=b.annotation(
            m,
            "Optimizer.zero_grad#AdamW.zero_grad",
            b.py(m, "torch/optim/optimizer.py(957): zero_grad", pre=250_000),
        ),
        micro_batch=micro_batch,
        ddp_finalize=Op(
            None,
            calls=(
                b.runtime(w, "cudaEventRecord", C_RECORD, 2000, NCCL_STREAM),
                b.runtime(w, "cudaStreamWaitEvent", C_WAIT, 1800, COMPUTE_STREAM, NCCL_STREAM),
            ),
        ),
        clip_and_step=Op(None, children=(clip, step)),
        metrics=metrics,
        device_sync=b.py(
            m,
            "torch/cuda/__init__.py(985): synchronize",
            calls=(b.runtime(m, "cudaDeviceSynchronize", C_SYNC_DEVICE, 6000),),
        ),
        empty_cache=b.py(
            m,
            "torch/cuda/memory.py(192): empty_cache",
            calls=tuple(b.runtime(m, "cudaFree", C_PLAIN, 120_000) for _ in range(4)),
        ),
    )


# --------------------------------------------------------------------------------------------
# Replaying the model: a CPU-thread and GPU-stream timeline simulation

_Frame = tuple[int, int, int, int, int, int, list[int] | None]


class TraceGenerator:
    """Emits one profiler step at a time, simulating two CPU threads and three GPU streams.

    Time is kept in integer nanoseconds since the epoch and printed as microseconds with three
    decimals, like Kineto.  A kernel starts once its launch call has been issued and its stream
    has drained, so a slow CPU shows up as GPU idle time and a slow GPU lets the CPU run ahead
    until the next synchronisation.
    """

    def __init__(self, seed: int, layers: int, micro_batches: int) -> None:
        rng = random.Random(seed)
        self._rand = rng.random
        self.pid = 1000 + rng.randrange(4_000_000)
        bwd_tid = self.pid + 37 + rng.randrange(9000)
        self.start_ns = 1_712_000_000_000_000_000 + rng.randrange(10**15)
        self.base_ns = (self.start_ns // 10**9 - 3) * 10**9
        self.micro_batches = micro_batches
        self.step_number = 3 + rng.randrange(40)

        b = _Builder(self.pid, self.pid, bwd_tid)
        self._builder = b
        self._model = _build_model(b, layers)
        self._main = _Thread(self.pid, self.start_ns + 1_000_000)
        self._bwd = _Thread(bwd_tid, self.start_ns + 1_000_000)
        self._free = [self.start_ns] * (max(STREAMS) + 1)  # when each stream drains
        self._recorded = [self.start_ns] * (max(STREAMS) + 1)  # last cudaEventRecord per stream
        self._malloc = b.runtime(self.pid, "cudaMalloc", C_PLAIN, 160_000)

        self._ext = 1
        self._corr = 1 + rng.randrange(500)
        self._ev = 0
        self._py_id = 2
        self._seq = 1 + rng.randrange(100_000)
        self._flow = 1
        self._cur_seq = 0
        self._cur_flow = 0
        self._first = True
        self._last = True
        self._saved: list[tuple[int, int, Op | None]] = []
        self._trackers: list[list[int]] = []
        self._cpu: list[str] = []
        self._gpu: list[str] = []

        # bf16 weights and gradients plus AdamW's two fp32 moments: 12 bytes per parameter.
        param_bytes = (layers * PARAMS_PER_LAYER + 30 * HIDDEN * HIDDEN) * 12
        self._allocated = param_bytes
        # Profiling starts after warm-up: the caching allocator already holds enough for the
        # activations, so only the steps after an empty_cache() call cudaMalloc again.
        self._reserved = param_bytes + layers * 24 * _ACT_BYTES + (1 << 30)
        self._addrs: list[int] = []
        self._addr_cursor = 0

        pid = self.pid
        self._fwd_flow = (
            f'  {{\n    "ph": "s", "id": %d, "pid": {pid}, "tid": {pid}, "ts": %d.%03d,\n'
            '    "cat": "fwdbwd", "name": "fwdbwd"\n  }'
        )
        self._bwd_flow = (
            f'  {{\n    "ph": "f", "id": %d, "pid": {pid}, "tid": {bwd_tid}, "ts": %d.%03d,\n'
            '    "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"\n  }'
        )
        # [memory] events keep integer timestamps, one of the quirks consumers must accept.
        self._mem_fmt = (
            '  {\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",\n'
            f'    "pid": {pid}, "tid": {pid},\n    "ts": %d,\n    "args": {{\n'
            '      "Total Reserved": %d, "Total Allocated": %d, "Bytes": %d, "Device Id": 0, '
            '"Device Type": 1, "Addr": %d, "Ev Idx": %d\n    }\n  }'
        )
        self._gpu_annotation_fmt = (
            '  {\n    "ph": "X", "cat": "gpu_user_annotation", "name": "%s", "pid": 0, '
            '"tid": %d,\n    "ts": %d.%03d, "dur": %d.%03d,\n    "args": {\n'
            '      "External id": %d\n    }\n  }'
        )
        self._overhead_fmt = (
            '  {\n    "ph": "X", "cat": "overhead", "name": "Activity Buffer Request", '
            '"pid": -1, "tid": 0,\n    "ts": %d.%03d, "dur": %d.%03d\n  }'
        )

    # ---- replay

    def _enter(self, th: _Thread, op: Op, site: Site) -> _Frame:
        rand = self._rand
        start = th.now + 300 + int(900 * rand())
        pre = op.pre_ns
        th.now = start + pre - pre // 5 + int(pre * 0.6 * rand())
        cpu = self._cpu
        slot = len(cpu)
        cpu.append("")
        ev = self._ev
        self._ev = ev + 1
        kind = site.kind
        seq = 0
        if kind == K_PY:
            ident = th.py_stack[-1]
            py_id = self._py_id
            self._py_id = py_id + 1
            th.py_stack.append(py_id)
        else:
            ident = self._ext
            self._ext = ident + 1
            py_id = 0
            if kind != K_ANNOTATION:
                th.ext_stack.append(ident)
            if kind == K_SEQ:
                autograd = op.autograd
                if autograd == AG_FWD:
                    seq = self._seq
                    self._seq = seq + 1
                    flow = self._flow
                    self._flow = flow + 1
                    cpu.append(self._fwd_flow % (flow, start // 1000, start % 1000))
                    self._saved.append((seq, flow, op.grad))
                else:
                    seq = self._cur_seq
                    if autograd == AG_NODE:
                        cpu.append(self._bwd_flow % (self._cur_flow, start // 1000, start % 1000))
        if op.alloc:
            self._memory(th, op.alloc)
        tracker = None
        if op.span:
            tracker = [-1, 0, 0]
            self._trackers.append(tracker)
        return (slot, start, ident, py_id, ev, seq, tracker)

    def _exit(self, th: _Thread, op: Op, site: Site, frame: _Frame) -> None:
        slot, start, ident, py_id, ev, seq, tracker = frame
        kind = site.kind
        if kind == K_PY:
            th.py_stack.pop()
        elif kind != K_ANNOTATION:
            th.ext_stack.pop()
        post = op.post_ns
        th.now += post - post // 5 + int(post * 0.6 * self._rand())
        dur = th.now - start
        if tracker is not None:
            self._trackers.pop()
            if tracker[0] >= 0:
                # Kineto widens GPU annotations by 1 ns on each side.
                lo = tracker[0] - 1
                width = tracker[1] - lo + 1
                self._gpu.append(
                    self._gpu_annotation_fmt
                    % (
                        op.span,
                        tracker[2],
                        lo // 1000,
                        lo % 1000,
                        width // 1000,
                        width % 1000,
                        ident,
                    )
                )
        times = (start // 1000, start % 1000, dur // 1000, dur % 1000)
        if kind == K_PY:
            self._cpu[slot] = site.fmt % (*times, ident, py_id, ev)
        elif kind == K_SEQ:
            self._cpu[slot] = site.fmt % (*times, ident, seq, ev)
        else:
            self._cpu[slot] = site.fmt % (*times, ident, ev)

    def _run(self, th: _Thread, op: Op) -> None:
        site = op.site
        if site is None:
            if op.autograd == AG_MARK:
                self._queue_block_grads(op)
            elif op.autograd == AG_BACKWARD:
                self._backward(th)
            for child in op.children:
                self._run(th, child)
            for call in op.calls:
                self._call(th, call)
            return
        frame = self._enter(th, op, site)
        for child in op.children:
            self._run(th, child)
        for call in op.calls:
            self._call(th, call)
        self._exit(th, op, site, frame)

    def _queue_block_grads(self, op: Op) -> None:
        # Queued before the block's own nodes, so the backward pass reaches them last.
        if self._last:
            self._saved.append((0, 0, op.grad_sync))
        self._saved.append((0, 0, op.grad if self._first else op.grad_acc))

    def _backward(self, th: _Thread) -> None:
        """Runs the queued backward nodes on the autograd thread while `th` waits for them."""
        bwd = self._bwd
        bwd.now = max(bwd.now, th.now) + 18_000 + int(15_000 * self._rand())
        saved = self._saved
        while saved:
            self._cur_seq, self._cur_flow, grad = saved.pop()
            if grad is not None:
                self._run(bwd, grad)
        if self._last:
            self._run(bwd, self._model.ddp_finalize)
        th.now = bwd.now + 12_000 + int(10_000 * self._rand())

    def _call(self, th: _Thread, call: Call) -> None:
        rand = self._rand
        ts = th.now + 400 + int(600 * rand())
        api = call.api_ns + int(call.api_ns * 0.5 * rand())
        corr = self._corr
        # CUPTI also numbers the calls Kineto filters out, so correlation ids have gaps.
        self._corr = corr + 1 + (rand() < 0.08)
        ext = th.ext_stack[-1] if th.ext_stack else 0
        mode = call.mode
        free = self._free
        stream = call.stream
        if mode == C_GPU:
            ready = ts + 2000 + int(2500 * rand())
            begin = max(ready, free[stream] + 700 + int(1100 * rand()))
            gpu_ns = call.gpu_ns
            dur = gpu_ns - gpu_ns // 20 + int(gpu_ns * 0.15 * rand())
            if call.skew_ns:
                dur += int(call.skew_ns * rand() * rand())
            end = begin + dur
            free[stream] = end
            if call.blocking:
                api = max(api, end - ts + 2500)
            for tracker in self._trackers:
                if tracker[0] < 0:
                    tracker[0] = begin
                    tracker[2] = stream
                tracker[1] = end
            times = (begin // 1000, begin % 1000, dur // 1000, dur % 1000)
            if call.nbytes:
                bandwidth = repr(call.nbytes / dur)  # bytes per ns is GB/s
                gpu = call.gpu_fmt % (*times, ext, corr, bandwidth, corr, *times[:2])
            else:
                gpu = call.gpu_fmt % (*times, ext, corr, corr, *times[:2])
            self._gpu.append(gpu)
            api_times = (ts // 1000, ts % 1000, api // 1000, api % 1000)
            self._gpu.append(call.fmt % (*api_times, ext, corr, corr, *api_times[:2]))
        else:
            if mode == C_SYNC_STREAM:
                api = max(api, free[stream] - ts + 3000)
            elif mode == C_SYNC_DEVICE:
                api = max(api, max(free) - ts + 4000)
            elif mode == C_RECORD:
                self._recorded[stream] = free[stream]
            elif mode == C_WAIT:
                free[stream] = max(free[stream], self._recorded[call.src])
            times = (ts // 1000, ts % 1000, api // 1000, api % 1000)
            if ext:
                self._gpu.append(call.fmt % (*times, ext, corr))
            else:
                self._gpu.append(call.fmt_noext % (*times, corr))
        th.now = ts + api

    def _memory(self, th: _Thread, nbytes: int) -> None:
        if nbytes > 0:
            # Block addresses from the caching allocator: 512-byte aligned, reused cyclically.
            self._addr_cursor = (self._addr_cursor + nbytes + 511) // 512 * 512 % (1 << 36)
            addr = 0x7F2A_0000_0000 + self._addr_cursor
            self._addrs.append(addr)
            self._allocated += nbytes
            if self._allocated > self._reserved:
                segment = 20 << 20
                self._reserved += (self._allocated - self._reserved) // segment * segment + segment
                self._call(th, self._malloc)
        else:
            addr = self._addrs.pop()
            self._allocated += nbytes
        ev = self._ev
        self._ev = ev + 1
        self._cpu.append(
            self._mem_fmt % (th.now // 1000, self._reserved, self._allocated, nbytes, addr, ev)
        )

    def step(self) -> list[str]:
        """Generates one ProfilerStep; returns its events, CPU side first as Kineto orders them."""
        self._cpu = []
        self._gpu = []
        main = self._main
        model = self._model
        rand = self._rand
        main.now += 60_000 + int(120_000 * rand())
        name = f"ProfilerStep#{self.step_number}"
        step_op = Op(self._builder.annotation_site(main.tid, name), 4000, 3000, span=name)
        assert step_op.site is not None
        frame = self._enter(main, step_op, step_op.site)
        self._run(main, model.zero_grad)
        for micro_batch in range(self.micro_batches):
            self._first = micro_batch == 0
            self._last = micro_batch == self.micro_batches - 1
            self._run(main, model.micro_batch)
        self._run(main, model.clip_and_step)
        self._run(main, model.metrics)
        if self.step_number % 5 == 4:
            self._run(main, model.device_sync)
        if self.step_number % 12 == 11:
            self._run(main, model.empty_cache)
            self._reserved = ((self._allocated >> 21) + 1) << 21
        self._exit(main, step_op, step_op.site, frame)
        if rand() < 0.25:
            ts = self._free[COMPUTE_STREAM] - int(2_000_000 * rand())
            dur = 400_000 + int(1_500_000 * rand())
            self._gpu.append(self._overhead_fmt % (ts // 1000, ts % 1000, dur // 1000, dur % 1000))
        self.step_number += 1
        return self._cpu + self._gpu

    # ---- the parts of the file around the events

    def header(self, trace_id: str) -> str:
        device = (
            '    {{\n      "id": {i}, "name": "NVIDIA H100 80GB HBM3", '
            '"totalGlobalMem": 85045379072,\n'
            '      "computeMajor": 9, "computeMinor": 0,\n'
            '      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,\n'
            '      "regsPerBlock": 65536, "warpSize": 32,\n'
            f'      "sharedMemPerBlock": 49152, "numSms": {NUM_SMS}\n'
            '    , "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448, '
            '"sharedMemPerMultiprocessor": 233472\n    }}'
        )
        devices = ",\n".join(device.format(i=i) for i in range(NUM_GPUS))
        ranks = list(range(WORLD_SIZE))
        dist = (
            f'{{"backend": "nccl", "rank": {RANK}, "world_size": {WORLD_SIZE}, "pg_count": 1, '
            f'"pg_config": [{{"pg_name": "0", "pg_desc": "default_pg", "backend_config": '
            f'"cuda:nccl", "pg_size": {WORLD_SIZE}, "ranks": {ranks}}}], "nccl_version": "2.21.5"}}'
        )
        return (
            '\n{\n  "schemaVersion": 1,\n  "deviceProperties": [\n'
            + devices
            + '\n  ],\n  "cupti_version": 24,\n  "cuda_runtime_version": 12040,\n'
            + '  "cuda_driver_version": 12040,\n'
            + f'  "distributedInfo": {dist},\n'
            + '  "record_shapes": 1,\n  "profile_memory": 1,\n  "with_stack": 1,\n'
            + f'  "trace_id": "{trace_id}",\n  "traceEvents": [\n'
        )

    def trailer(self) -> list[str]:
        """Kineto's closing events: process/thread metadata, the trace span and its markers."""

        def meta(name: str, pid: int, tid: int, key: str, value: object) -> str:
            return (
                f'  {{\n    "name": "{name}", "ph": "M", "ts": {self.start_ns // 1000}, '
                f'"pid": {pid}, "tid": {tid},\n    "args": {{\n      "{key}": {value}\n    }}\n  }}'
            )

        out = []
        processes = [(self.pid, '"CPU"', self.pid)]
        processes += [(i, f'"GPU {i}"', 16777216 + i) for i in range(NUM_GPUS)]
        for pid, label, order in processes:
            out.append(meta("process_name", pid, 0, "name", '"python3.11"'))
            out.append(meta("process_labels", pid, 0, "labels", label))
            out.append(meta("process_sort_index", pid, 0, "sort_index", order))
        threads = [(0, s, f'"stream {s} "') for s in STREAMS] + [
            (self.pid, self._main.tid, f'"thread {self._main.tid} (python)"'),
            (self.pid, self._bwd.tid, f'"thread {self._bwd.tid} (pt_autograd_0)"'),
        ]
        for pid, tid, name in threads:
            out.append(meta("thread_name", pid, tid, "name", name))
            out.append(meta("thread_sort_index", pid, tid, "sort_index", tid))
        end = max(self._main.now, self._bwd.now, *self._free) + 1_000_000
        begin = _ts(self.start_ns)
        return [
            *out,
            f'  {{\n    "ph": "X", "cat": "Trace", "ts": {begin}, '
            f'"dur": {_ts(end - self.start_ns)},\n'
            '    "pid": "Spans", "tid": "PyTorch Profiler",\n    "name": "PyTorch Profiler (0)",\n'
            '    "args": {\n      "Op count": 0\n    }\n  }',
            f'  {{\n    "name": "process_sort_index", "ph": "M", "ts": {begin},\n'
            '    "pid": "Spans", "tid": 0,\n    "args": {\n      "sort_index": 536870912\n'
            "    }\n  }",
            '  {\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
            f'    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": {begin}\n  }}',
            '  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n'
            f'    "pid": "", "tid": "", "ts": {_ts(end)}\n  }}',
        ]

    def footer(self, trace_name: str) -> str:
        return (
            f'\n  ],\n  "traceName": "{trace_name}",\n  "displayTimeUnit": "ms",\n'
            f'  "baseTimeNanoseconds": {self.base_ns}\n}}\n'
        )


# --------------------------------------------------------------------------------------------
# Writing


class _Writer:
    """Encodes and writes whole steps at once and counts what it wrote."""

    def __init__(self, raw: io.BufferedIOBase) -> None:
        self._raw = raw
        self.bytes = 0
        self.events = 0
        self._first = True

    def text(self, text: str) -> None:
        data = text.encode("ascii")
        self._raw.write(data)
        self.bytes += len(data)

    def events_of(self, items: list[str]) -> None:
        if not items:
            return
        body = ",\n".join(items)
        self.text(body if self._first else ",\n" + body)
        self._first = False
        # Every event, and nothing else, ends with a newline and a two-space-indented brace.
        self.events += body.count("\n  }")


def _step_bytes(seed: int, layers: int, micro_batches: int) -> int:
    events = TraceGenerator(seed, layers, micro_batches).step()
    return sum(map(len, events)) + 2 * len(events)


def plan(target_bytes: int, seed: int) -> tuple[int, int]:
    """Picks (layers, micro-batches per step) so that about TARGET_STEPS steps fill the target."""
    one = _step_bytes(seed, LAYERS, 1)
    per_micro_batch = _step_bytes(seed, LAYERS, 2) - one
    per_step_overhead = one - per_micro_batch
    wanted = target_bytes / TARGET_STEPS
    if wanted >= one:
        return LAYERS, max(1, round((wanted - per_step_overhead) / per_micro_batch))
    # Too small for the full model at TARGET_STEPS: keep the steps, shrink the model.
    per_layer = per_micro_batch / LAYERS
    return max(1, min(LAYERS, int((wanted - per_step_overhead) / per_layer))), 1


@dataclass
class Result:
    path: Path
    bytes: int
    events: int
    steps: int
    layers: int
    micro_batches: int
    seconds: float


def generate(
    path: Path, target_bytes: int, seed: int, compress: bool, *, rank: int = 0, world_size: int = 8
) -> Result:
    """Writes one rank's trace. The ranks of one job (same seed and size, one `world_size`)
    share their NCCL collectives: the same group, order and sizes on every rank."""
    # The model builder and the header read the job's shape from these module constants.
    global RANK, WORLD_SIZE
    RANK, WORLD_SIZE = rank, world_size
    began = time.perf_counter()
    layers, micro_batches = plan(target_bytes, seed)
    gen = TraceGenerator(seed, layers, micro_batches)
    # Named from the inputs rather than the output path, so that only they decide the bytes.
    name = f"rank{RANK}.seed{seed}.pt.trace.json"
    closing = len(",\n".join(gen.trailer())) + len(gen.footer(name)) + 2
    steps = 0
    raw: io.BufferedIOBase
    # gzip's default level is slow on a gigabyte; 6 is what the gzip tool uses.
    with gzip.open(path, "wb", compresslevel=6) if compress else open(path, "wb") as raw:
        writer = _Writer(raw)
        writer.text(gen.header(f"{seed}-{target_bytes}"))
        opening = writer.bytes
        while True:
            writer.events_of(gen.step())
            steps += 1
            per_step = (writer.bytes - opening) / steps
            # Stop where the final size lands nearest the target.
            if writer.bytes + closing + per_step / 2 >= target_bytes:
                break
        writer.events_of(gen.trailer())
        writer.text(gen.footer(name))
    return Result(
        path, writer.bytes, writer.events, steps, layers, micro_batches, time.perf_counter() - began
    )


# --------------------------------------------------------------------------------------------
# Self-check


def check(path: Path, target_bytes: int | None = None) -> bool:
    """Re-reads a generated trace with json and checks its structure; prints what it found.

    Loads the whole file, so it is meant for traces of tens of megabytes.
    """
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    problems: list[str] = []
    required = (
        "schemaVersion",
        "deviceProperties",
        "distributedInfo",
        "traceEvents",
        "traceName",
        "displayTimeUnit",
        "baseTimeNanoseconds",
    )
    problems += [f"top-level key {key!r} missing" for key in required if key not in doc]
    events: list[dict[str, Any]] = doc.get("traceEvents", [])

    counts = Counter((e.get("ph", ""), e.get("cat", "")) for e in events)
    per_event = len(raw) / max(1, len(events))
    print(f"{len(events):,} events, {len(raw) / MB:.1f} MB, {per_event:.0f} B/event")
    for (ph, cat), n in counts.most_common():
        print(f"  {ph:2} {cat or '(none)':22} {n:>10,}")

    launches: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            launches[e["args"]["correlation"]] = e
    unmatched = early = wrong_ext = 0
    by_stream: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        by_stream[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
        launch = launches.get(e["args"]["correlation"])
        if launch is None:
            unmatched += 1
        elif e["ts"] < launch["ts"]:
            early += 1
        elif launch["args"].get("External id") != e["args"]["External id"]:
            wrong_ext += 1
    if unmatched:
        problems.append(f"{unmatched} GPU activities have no runtime call with their correlation")
    if early:
        problems.append(f"{early} GPU activities start before their launch call")
    if wrong_ext:
        problems.append(f"{wrong_ext} GPU activities disagree with their launch on External id")
    overlaps = 0
    for spans in by_stream.values():
        spans.sort()
        # Doubles near 1.7e15 us are exact to 0.25 us only.
        overlaps += sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1] - 0.5)
    if overlaps:
        problems.append(f"{overlaps} GPU activities overlap the previous one on their stream")

    for cat in ("ac2g", "fwdbwd"):
        starts = {e["id"] for e in events if e.get("cat") == cat and e["ph"] == "s"}
        ends = [e["id"] for e in events if e.get("cat") == cat and e["ph"] == "f"]
        if not ends or any(i not in starts for i in ends):
            problems.append(f"{cat}: flow ends without a start, or no flows at all")

    steps = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    print(f"{len(steps)} ProfilerSteps")
    if len(steps) < MIN_STEPS:
        problems.append(f"only {len(steps)} ProfilerSteps, expected at least {MIN_STEPS}")
    starts_at = [s for s, _ in steps]
    outside = 0
    for e in events:
        if e.get("cat") not in ("cpu_op", "python_function", "cuda_runtime", "cuda_driver"):
            continue
        i = bisect.bisect_right(starts_at, e["ts"] + 0.5) - 1
        if i < 0 or e["ts"] + e["dur"] > steps[i][1] + 0.5:
            outside += 1
    if outside:
        problems.append(f"{outside} CPU events lie outside every ProfilerStep")
    if any(e["args"]["Total Allocated"] < 0 for e in events if e.get("name") == "[memory]"):
        problems.append("[memory] Total Allocated goes negative")

    if target_bytes is not None and abs(len(raw) - target_bytes) > TOLERANCE * target_bytes:
        problems.append(f"size {len(raw):,} B is not within 5% of {target_bytes:,} B")
    for problem in problems:
        print("PROBLEM:", problem)
    print("check passed" if not problems else "check FAILED")
    return not problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write a large, realistic PyTorch profiler (Kineto) JSON trace."
    )
    parser.add_argument("-o", "--output", type=Path, required=True, help="trace file to write")
    parser.add_argument(
        "--size-mb",
        type=float,
        default=1000.0,
        help="uncompressed size to aim for, in MB of 10^6 bytes (hit within 5%%; default 1000)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--rank", type=int, default=RANK, help=f"this trace's rank (default {RANK})"
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=WORLD_SIZE,
        help=f"ranks in the job; every rank's collectives match (default {WORLD_SIZE})",
    )
    parser.add_argument(
        "--gzip", action="store_true", help="write gzip-compressed JSON; adds .gz if missing"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="re-read the written trace with json and validate it (loads it whole)",
    )
    args = parser.parse_args(argv)
    path: Path = args.output
    if args.gzip and path.suffix != ".gz":
        path = path.with_name(path.name + ".gz")
    target = int(args.size_mb * MB)
    if not 0 <= args.rank < args.world_size:
        parser.error(f"--rank must lie in [0, --world-size): {args.rank}")
    result = generate(
        path, target, args.seed, args.gzip, rank=args.rank, world_size=args.world_size
    )
    print(
        f"wrote {result.path}: {result.bytes / MB:.1f} MB uncompressed, {result.events:,} events, "
        f"{result.steps} steps of {result.micro_batches} micro-batch(es) x {result.layers} layers, "
        f"in {result.seconds:.1f} s ({result.bytes / MB / result.seconds:.0f} MB/s)"
    )
    if args.check:
        return 0 if check(path, target) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
