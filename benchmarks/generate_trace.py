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
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

MB = 1_000_000
TARGET_STEPS = 30
MIN_STEPS = 20
TOLERANCE = 0.05

NUM_GPUS = 8
NUM_SMS = 132
PEAK_FLOP_PER_NS = 989_000.0  # H100 SXM dense bf16
HBM_BYTES_PER_NS = 3350.0
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
K_OP = 0  # cpu_op or user_annotation: External id, Ev Idx
K_SEQ = 1  # cpu_op that carries an autograd Sequence number
K_PY = 2  # python_function: Python parent id, Python id, Ev Idx

# What an op does for autograd.
AG_NONE = 0
AG_FWD = 1  # creates a backward node: fwdbwd flow start, backward queued
AG_EVAL = 2  # autograd::engine::evaluate_function wrapper of a backward node
AG_NODE = 3  # the backward node itself: fwdbwd flow end
AG_MARK = 4  # emits nothing: queues per-block gradient work (AccumulateGrad, DDP all-reduce)

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
}


def _ts(ns: int) -> str:
    return "%d.%03d" % (ns // 1000, ns % 1000)


def _esc(text: str) -> str:
    """Makes static text safe to embed in a %-template."""
    return text.replace("%", "%%")


# --------------------------------------------------------------------------------------------
# Shapes: each op input is (concrete value, type, strides, dims) as record_shapes prints them.

Input = tuple[str, str, str, str]


def _strides(dims: tuple[int, ...]) -> list[int]:
    out = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        out[i] = out[i + 1] * dims[i + 1]
    return out


def _t(*dims: int, dtype: str = BF16, strides: tuple[int, ...] | None = None) -> Input:
    s = list(strides) if strides is not None else _strides(dims)
    return ("", dtype, str(s), str(list(dims)))


def _s(value: object) -> Input:
    return (str(value), "Scalar", "[]", "[]")


def _sl(values: list[int]) -> Input:
    return (str(values), "ScalarList", "[]", "[]")


NONE_INPUT: Input = ("", "", "[]", "[]")


def _shape_args(inputs: tuple[Input, ...]) -> str:
    if not inputs:
        return ""
    concrete = ", ".join('"%s"' % i[0] for i in inputs)
    types = ", ".join('"%s"' % i[1] for i in inputs)
    strides = ", ".join(i[2] for i in inputs)
    dims = ", ".join(i[3] for i in inputs)
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


def _elementwise(name: str, numel: int, vec: int = 4) -> Kernel:
    return Kernel(name, (max(1, numel // (128 * vec * 4)), 1, 1), (128, 1, 1), 28, 0)


def _gemm(name: str, regs: int = 168, smem: int = 213_248, threads: int = 384) -> Kernel:
    # Hopper cuBLAS kernels are persistent: one CTA per SM.
    return Kernel(name, (NUM_SMS, 1, 1), (threads, 1, 1), regs, smem)


_AT = "at::native::"
_ANON = "at::native::(anonymous namespace)::"
_DIRECT_COPY = (
    f"{_AT}direct_copy_kernel_cuda(at::TensorIteratorBase&)::{{lambda()#3}}::operator()() const"
    "::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1}"
)
_NOCAST = f"{_AT}gpu_kernel_impl_nocast<{_DIRECT_COPY}>(at::TensorIteratorBase&, {_DIRECT_COPY} const&)"
_FLASH_BWD_TRAITS = (
    "Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, "
    "Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >"
)
_SUM_OP = (
    f"{_AT}ReduceOp<c10::BFloat16, {_AT}func_wrapper_t<c10::BFloat16, {_AT}sum_functor<"
    "c10::BFloat16, float, c10::BFloat16>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>"
    ", unsigned int, c10::BFloat16, 4, 4>"
)


def _binary(functor: str, arity: int = 3) -> str:
    return (
        f"void {_AT}vectorized_elementwise_kernel<4, {functor}, std::array<char*, {arity}ul> >"
        f"(int, {functor}, std::array<char*, {arity}ul>)"
    )


_MUL = f"{_AT}BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, {_AT}binary_internal::MulFunctor<float> >"
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
K_CAST = _elementwise(
    f"void {_AT}unrolled_elementwise_kernel<{_AT}direct_copy_kernel_cuda(at::TensorIteratorBase&)"
    "::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, "
    "std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, "
    f"TrivialOffsetCalculator<1, unsigned int>, {_AT}memory::LoadWithCast<1>, "
    f"{_AT}memory::StoreWithCast<1> >(int, ...)",
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
K_TRITON_BWD_SUM = Kernel(
    "triton_red_fused_mul_sum_2", (HIDDEN // 64, 1, 1), (64, 8, 1), 40, 1_024
)
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
K_FUSED_ADAMW = Kernel(
    f"void {_ANON}multi_tensor_apply_kernel<{_ANON}FusedOptimizerTensorListMetadata<4>, {_ANON}"
    "FusedAdamMathFunctor<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>, double, double, "
    "double, double, double, bool, float const*, float const*>(...)",
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
# The op-tree the generator replays


@dataclass(slots=True)
class Site:
    """A preformatted event template for one named CPU-side event on one thread."""

    kind: int
    fmt: str


@dataclass(slots=True)
class Call:
    """A CUDA runtime/driver call made by an op, and the GPU activity it enqueues, if any."""

    mode: int
    fmt: str  # runtime event (+ ac2g flow start), with External id
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
    site: Site | None
    pre_ns: int = 2000
    post_ns: int = 800
    children: tuple[Op, ...] = ()
    calls: tuple[Call, ...] = ()
    autograd: int = AG_NONE
    grad: Op | None = None  # backward tree queued by AG_FWD / AG_MARK ops
    grad_acc: Op | None = None  # AG_MARK: backward tree for later micro-batches
    grad_sync: Op | None = None  # AG_MARK: DDP all-reduce, last micro-batch only
    alloc: int = 0  # bytes allocated (AG_FWD) or released (its backward) on the GPU
    span: bool = False  # also emit a gpu_user_annotation over the GPU work it launched
    span_name: str = ""


class _Thread:
    __slots__ = ("ext_stack", "now", "py_stack", "tid")

    def __init__(self, tid: int, now: int) -> None:
        self.tid = tid
        self.now = now
        self.ext_stack: list[int] = []
        self.py_stack: list[int] = []


class _Builder:
    """Builds Sites, Calls and Op trees with every static byte of their events precomputed."""

    def __init__(self, pid: int, main_tid: int, bwd_tid: int) -> None:
        self.pid = pid
        self.main = main_tid
        self.bwd = bwd_tid
        self._kernel_fmt: dict[tuple[str, int], str] = {}

    def _head(self, cat: str, name: str, tid: int) -> str:
        return _esc(
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {self.pid}, '
            f'"tid": {tid},\n    "ts": '
        )

    def site(self, tid: int, name: str, inputs: tuple[Input, ...] = (), seq: bool = False) -> Site:
        shapes = _esc(_shape_args(inputs))
        body = '%d.%03d, "dur": %d.%03d,\n    "args": {\n      "External id": %d,'
        body += '"Record function id": 0, '
        if seq:
            fwd_thread = 1 if tid == self.bwd else 0
            body += '"Sequence number": %d, "Fwd thread id": ' + str(fwd_thread) + ", "
        fmt = self._head("cpu_op", name, tid) + body + shapes + '"Ev Idx": %d\n    }\n  }'
        return Site(K_SEQ if seq else K_OP, fmt)

    def annotation_site(self, tid: int, name: str) -> Site:
        fmt = self._head("user_annotation", name, tid) + (
            '%d.%03d, "dur": %d.%03d,\n    "args": {\n      "External id": %d,'
            '"Record function id": 0, "Ev Idx": %d\n    }\n  }'
        )
        return Site(K_OP, fmt)

    def py_site(self, tid: int, name: str) -> Site:
        module = ' "Python module id": 0,' if name.startswith("nn.Module: ") else ""
        fmt = self._head("python_function", name, tid) + (
            '%d.%03d, "dur": %d.%03d,\n    "args": {\n      "Python parent id": %d, '
            '"Python id": %d,' + module + ' "Ev Idx": %d\n    }\n  }'
        )
        return Site(K_PY, fmt)

    # ---- calls

    def _runtime_fmt(self, tid: int, api: str, flow: bool) -> tuple[str, str]:
        cat = "cuda_driver" if api.startswith("cu") and not api.startswith("cuda") else "cuda_runtime"
        head = self._head(cat, api, tid) + '%d.%03d, "dur": %d.%03d,\n    "args": {\n      '
        tail = f'      "cbid": {CBID[api]}, "correlation": %d\n    }}\n  }}'
        with_ext = head + '"External id": %d,' + tail
        without_ext = head + tail
        if flow:
            with_ext += (
                ',\n  {\n    "ph": "s", "id": %d, "pid": '
                + str(self.pid)
                + ', "tid": '
                + str(tid)
                + ', "ts": %d.%03d,\n    "cat": "ac2g", "name": "ac2g"\n  }'
            )
        return with_ext, without_ext

    def _gpu_head(self, cat: str, name: str, stream: int) -> str:
        return _esc(
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": 0, "tid": {stream},\n'
            '    "ts": '
        ) + '%d.%03d, "dur": %d.%03d,\n    "args": {\n      "External id": %d,'

    def _flow_end(self, stream: int) -> str:
        return (
            ',\n  {\n    "ph": "f", "id": %d, "pid": 0, "tid": '
            + str(stream)
            + ', "ts": %d.%03d,\n    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }'
        )

    def kernel_fmt(self, kernel: Kernel, stream: int, extra_args: str = "") -> str:
        key = (kernel.name + extra_args, stream)
        cached = self._kernel_fmt.get(key)
        if cached is None:
            cached = (
                self._gpu_head("kernel", kernel.name, stream)
                + '      "queued": 0, "device": 0, "context": 1,      "stream": '
                + str(stream)
                + ', "correlation": %d,'
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
        return Call(
            C_GPU,
            fmt,
            noext,
            api_ns,
            stream,
            self.kernel_fmt(kernel, stream, extra_args),
            gpu_ns,
            skew_ns=skew_ns,
        )

    def transfer(
        self, tid: int, name: str, nbytes: int, gbps: float, stream: int, blocking: bool = False
    ) -> Call:
        memset = name.startswith("Memset")
        api = "cudaMemsetAsync" if memset else "cudaMemcpyAsync"
        fmt, noext = self._runtime_fmt(tid, api, flow=True)
        gpu_fmt = (
            self._gpu_head("gpu_memset" if memset else "gpu_memcpy", name, stream)
            + '      "device": 0, "context": 1,      "stream": '
            + str(stream)
            + ', "correlation": %d,      "bytes": '
            + str(nbytes)
            + ', "memory bandwidth (GB/s)": %s\n    }\n  }'
            + self._flow_end(stream)
        )
        gpu_ns = int(nbytes / gbps) + 1200
        api_ns = 4500 if memset else 9000
        return Call(
            C_GPU, fmt, noext, api_ns, stream, gpu_fmt, gpu_ns, nbytes, blocking=blocking
        )

    def runtime(
        self, tid: int, api: str, mode: int, api_ns: int, stream: int = COMPUTE_STREAM, src: int = 0
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
        post: int = 900,
    ) -> Op:
        return Op(self.site(tid, name, inputs), pre, post, children, calls)

    def kop(
        self,
        tid: int,
        name: str,
        inputs: tuple[Input, ...],
        kernel: Kernel,
        gpu_ns: int,
        *children: Op,
        pre: int = 6000,
    ) -> Op:
        """An op whose only GPU work is one kernel launch on the compute stream."""
        return self.op(
            tid, name, inputs, *children, calls=(self.launch(tid, kernel, gpu_ns),), pre=pre
        )

    def fwd(self, op: Op, grad: Op, alloc: int = 0) -> Op:
        """Marks a forward op as the creator of an autograd node whose backward is `grad`."""
        op.site = self.site(self.main, _site_name(op.site), _site_inputs.get(id(op.site), ()), True)
        op.autograd = AG_FWD
        op.grad = grad
        op.alloc = alloc
        if alloc:
            grad.alloc = -alloc
        return op

    def bwd(self, node: str, inputs: tuple[Input, ...], *children: Op, calls: tuple[Call, ...] = ()) -> Op:
        """A backward node as the autograd engine runs it, wrapped in evaluate_function."""
        inner = Op(self.site(self.bwd, node, inputs, True), 3000, 900, children, calls, AG_NODE)
        outer_site = self.site(self.bwd, "autograd::engine::evaluate_function: " + node, (), True)
        return Op(outer_site, 1500, 1200, (inner,), autograd=AG_EVAL)

    def py(self, tid: int, name: str, *children: Op, pre: int = 1500, calls: tuple[Call, ...] = ()) -> Op:
        return Op(self.py_site(tid, name), pre, 700, children, calls)

    def annotation(self, tid: int, name: str, *children: Op, span: bool = False, pre: int = 3000) -> Op:
        return Op(self.annotation_site(tid, name), pre, 1500, children, span=span, span_name=name)


# fwd() re-creates a site with a Sequence number; these remember what a site was built from.
_site_names: dict[int, str] = {}
_site_inputs: dict[int, tuple[Input, ...]] = {}


def _site_name(site: Site | None) -> str:
    assert site is not None
    return _site_names[id(site)]


class _RecordingBuilder(_Builder):
    def site(self, tid: int, name: str, inputs: tuple[Input, ...] = (), seq: bool = False) -> Site:
        s = super().site(tid, name, inputs, seq)
        _site_names[id(s)] = name
        _site_inputs[id(s)] = inputs
        return s
