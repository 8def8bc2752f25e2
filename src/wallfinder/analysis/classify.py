"""Kernel and op classes: what kind of work a kernel does, from its name or its launching op.

Rules are checked in order and the first match wins, so specific patterns (attention,
convolution written as an implicit GEMM) come before general ones (GEMM, elementwise).
Classification runs once per distinct name, never per event.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from wallfinder.trace import Trace


class KernelClass(str, Enum):
    GEMM = "gemm"
    ATTENTION = "attention"
    CONVOLUTION = "convolution"
    DEPTHWISE = "depthwise_conv"
    """A depthwise convolution (one group per channel): a stencil over each channel, memory-
    bound (AI about 2 for a 3×3 in fp32), not a matmul: no tensor cores, no TF32."""
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    NORMALIZATION = "normalization"
    SOFTMAX = "softmax"
    COPY = "copy"
    COMMUNICATION = "communication"
    OTHER = "other"


MATMUL_CLASSES = frozenset({KernelClass.GEMM, KernelClass.ATTENTION, KernelClass.CONVOLUTION})
"""Classes whose kernels can run near the compute roof (tensor-core work)."""

COMM_FAMILIES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("NCCL/RCCL", ("nccl", "rccl"), "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgs)"),
    ("MSCCL/MSCCL++", ("msccl",), "mscclpp::allreduce8<__nv_bfloat16>"),
    ("NVSHMEM", ("nvshmem",), "nvshmemi_transfer_rma_nbi_translate_kernel"),
    (
        "DeepEP expert-parallel",
        ("internode::", "intranode::", "internode_ll::", "deep_ep::barrier"),
        "void deep_ep::internode::dispatch<false, 8, 2>(int4*, float*, int*, ...)",
    ),
    ("pplx expert-parallel", ("pplx::",), "pplx::dispatchKernel<unsigned char, 8>"),
    (
        "vLLM/SGLang custom all-reduce",
        ("cross_device_reduce", "quickreduce", "allreduce_fusion"),
        "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(...)",
    ),
    (
        "torch symmetric memory / c10d intra-node",
        ("c10d::", "symm_mem", "multimem_", "intra_node_comm"),
        "void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16, 8>(...)",
    ),
    (
        "Transformer Engine userbuffers",
        ("userbuffers",),
        "userbuffers_fp16_sum_inplace_gpu_rr_rs(int, int, int, int, int, int, void**, ...)",
    ),
    (
        "collective by name",
        (
            "allreduce",
            "all_reduce",
            "allgather",
            "all_gather",
            "reducescatter",
            "reduce_scatter",
            "alltoall",
            "all_to_all",
            "sendrecv",
        ),
        "custom_all_gather_kernel",
    ),
)
"""Communication kernel families: (family, lower-case name patterns, an example kernel name).
A kernel matching one is communication, so that overlapped transfers stay hidden and exposed
ones count as exposed communication, not as compute."""

_DEPTHWISE = ("depthwise", "dwconv", "dw_conv")
"""Depthwise convolution kernels and ops: PyTorch's native `conv_depthwise2d_*` kernels
(`aten::_conv_depthwise2d`), MIOpen's depthwise op, cuDNN/CUTLASS `dwconv` kernels."""

Rules = tuple[tuple[KernelClass, tuple[str, ...]], ...]
"""Classes and the name fragments that give them, tried in order: the first match wins."""

_KERNEL_RULES: Rules = (
    (KernelClass.COMMUNICATION, tuple(p for _, patterns, _ in COMM_FAMILIES for p in patterns)),
    (
        KernelClass.ATTENTION,
        ("flash", "fmha", "attention", "attn", "sdpa", "xformers", "mha_fwd", "mha_bwd"),
    ),
    (KernelClass.DEPTHWISE, _DEPTHWISE),
    (
        KernelClass.CONVOLUTION,
        (
            "conv",
            "implicit_gemm",
            "fprop",
            "dgrad",
            "wgrad",
            "winograd",
            "igemm",
            "scudnn",
        ),
    ),
    (
        KernelClass.GEMM,
        (
            "gemm",
            "cublas",
            "cutlass",
            "nvjet",
            "cijk_",
            "matmul",
            "s1688",
            "s16816",
            "h1688",
            "h16816",
            "wmma",
            "triton_tem_",
            "_mm_",
            "bmm",
            "splitkreduce",
            "sm90_xmma",
            "hipblaslt",
        ),
    ),
    (KernelClass.SOFTMAX, ("softmax",)),
    (
        KernelClass.NORMALIZATION,
        (
            "layer_norm",
            "layernorm",
            "batch_norm",
            "batchnorm",
            "bn_fw",
            "bn_bw",
            "group_norm",
            "groupnorm",
            "rms_norm",
            "rmsnorm",
            "instance_norm",
            "welford",
            "rowwisemoments",
            "norm_kernel",
            "normalization",
        ),
    ),
    (
        KernelClass.REDUCTION,
        (
            "reduce",
            "reduction",
            "triton_red_",
            "triton_per_",
            "argmax",
            "argmin",
            "cub::",
            "scan_kernel",
            "sum_kernel",
            "mean_kernel",
            "cross_entropy",
            "nll_loss",
            "topk",
            "sort",
        ),
    ),
    (
        KernelClass.COPY,
        (
            "memcpy",
            "memset",
            "copy",
            "catarraybatched",
            "cat_",
            "transpose",
            "permute",
            "contiguous",
        ),
    ),
    (
        KernelClass.ELEMENTWISE,
        (
            "elementwise",
            "vectorized",
            "unrolled",
            "pointwise",
            "triton_poi_",
            "triton_",
            "fill",
            "index",
            "gather",
            "scatter",
            "embedding",
            "dropout",
            "adam",
            "sgd",
            "foreach",
            "multi_tensor",
            "fused",
            "relu",
            "gelu",
            "silu",
            "sigmoid",
            "tanh",
            "add",
            "mul",
            "div",
            "where",
            "clamp",
            "cast",
            "exp",
            "sqrt",
            "neg",
            "pow",
            "rope",
            "rotary",
        ),
    ),
)

_OP_RULES: Rules = (
    (
        KernelClass.COMMUNICATION,
        (
            "nccl:",
            "gloo:",
            "c10d::",
            "record_param_comms",
            "all_reduce",
            "allreduce",
            "all_gather",
            "reduce_scatter",
            "all_to_all",
        ),
    ),
    (
        KernelClass.ATTENTION,
        ("scaled_dot_product", "flash_attention", "efficient_attention", "_flash_", "attention"),
    ),
    (KernelClass.DEPTHWISE, _DEPTHWISE),
    (KernelClass.CONVOLUTION, ("conv", "cudnn_convolution", "miopen_convolution")),
    (
        KernelClass.GEMM,
        (
            "aten::mm",
            "aten::addmm",
            "aten::bmm",
            "aten::baddbmm",
            "aten::matmul",
            "aten::linear",
            "aten::_scaled_mm",
            "aten::addbmm",
            "aten::einsum",
            "aten::dot",
            "aten::mv",
            "aten::addmv",
            "_int_mm",
            "mmbackward",
            "linearbackward",
        ),
    ),
    (KernelClass.SOFTMAX, ("softmax",)),
    (KernelClass.NORMALIZATION, ("norm",)),
    (
        KernelClass.REDUCTION,
        (
            "aten::sum",
            "aten::mean",
            "aten::max",
            "aten::min",
            "aten::argmax",
            "aten::argmin",
            "aten::amax",
            "aten::amin",
            "aten::prod",
            "aten::var",
            "aten::std",
            "aten::cumsum",
            "aten::topk",
            "aten::sort",
            "aten::all",
            "aten::any",
            "cross_entropy",
            "nll_loss",
        ),
    ),
    (
        KernelClass.COPY,
        (
            "aten::copy_",
            "aten::to",
            "aten::_to_copy",
            "aten::clone",
            "aten::contiguous",
            "aten::cat",
            "aten::stack",
            "aten::index_select",
            "memcpy",
            "memset",
            # FBGEMM's permutes of sparse features and pooled embeddings move data (a view's
            # aten::permute never gets here: it is a metadata op).
            "::permute_",
        ),
    ),
    (
        KernelClass.ELEMENTWISE,
        # "embedding": FBGEMM's table lookups (`fbgemm::split_embedding_*`), gathers of rows
        # bound by memory bandwidth, as aten::embedding is.
        ("aten::", "optimizer.step", "_foreach", "fused_", "embedding"),
    ),
)


SYNC_OPS = (
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::is_nonzero",
    "aten::equal",
    "aten::nonzero",
)
"""Ops that read a device value on the host, so wait for the device to compute it (`.item()`,
`if tensor:`, data-dependent shapes)."""
SYNC_RUNTIME = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "hipStreamSynchronize",
    "hipDeviceSynchronize",
    "hipEventSynchronize",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpy2D",
    "cuMemcpyDtoH_v2",
    "hipMemcpy",
    "hipMemcpyWithStream",
    "hipMemcpyDtoH",
)
"""Runtime (and driver) calls that return only after device work is done: synchronisations
and blocking copies."""
SYNC_CALLS = SYNC_OPS + SYNC_RUNTIME
"""The one table of synchronising calls: the host blocked until the device catches up (the
idle cause `synchronization`, the sync-in-step finding, the what-if's sync edges, the stalls
a forward waits on). In this order where counts tie in a finding's list."""

EVENT_SYNCS = frozenset({"cudaEventSynchronize", "hipEventSynchronize", "cuEventSynchronize"})
"""The synchronising calls that wait for one recorded event, not for a value or a stream: the
ones frameworks make themselves (collectives' and timers' events), which a forward's stalls
leave out (on a real DDP trace, eight per step in the forward cost 27 µs in all)."""

DATALOADER_WORKERS = "_MultiProcessingDataLoaderIter"
"""In the name of the range torch.profiler records around a DataLoader's `__next__` when
the DataLoader has worker processes (`_SingleProcessDataLoaderIter` without)."""


def is_data_loading(name: str) -> bool:
    """A range or op of the host waiting for the DataLoader's next batch: the one definition
    of DataLoader markers (`enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`,
    its multiprocessing twin, and the DataLoaders' own names for it)."""
    lowered = name.lower()
    return "dataloader" in lowered and ("__next__" in lowered or lowered.startswith("enumerate("))


def _match(text: str, rules: Rules) -> KernelClass:
    # "convert" (Inductor's convert_element_type, vLLM's _typeConvert) is not a convolution,
    # and "fbgemm" (TorchRec's embedding library, `fbgemm_gpu::`) is not a GEMM: its kernels
    # gather embedding rows and permute sparse features; its own matmuls are CUTLASS kernels,
    # named so.
    lowered = text.lower().replace("convert", "").replace("fbgemm", "")
    for cls, needles in rules:
        if any(n in lowered for n in needles):
            return cls
    return KernelClass.OTHER


def _up_to(rules: Rules, wanted: KernelClass) -> Rules:
    """The rules tried before `wanted`'s and its own: `_match(text, _up_to(rules, wanted)) is
    wanted` is `_match(text, rules) is wanted` (a class after it never decides that), at one
    class's needles, not all ten classes' (most names are of no class). Communication comes
    first, for a test of it over every distinct name of a trace."""
    i = next(i for i, (cls, _) in enumerate(rules) if cls is wanted)
    return rules[: i + 1]


_KERNEL_COMMUNICATION = _up_to(_KERNEL_RULES, KernelClass.COMMUNICATION)
_OP_COMMUNICATION = _up_to(_OP_RULES, KernelClass.COMMUNICATION)


def classify_kernel(name: str) -> KernelClass:
    """The class of a GPU kernel from its name (cuBLAS/cuBLASLt/CUTLASS/nvjet, hipBLASLt
    `Cijk_`, flash/fmha, cuDNN/MIOpen, NCCL/RCCL, Triton and ATen kernel names)."""
    return _match(name, _KERNEL_RULES)


def is_communication_kernel(name: str) -> bool:
    """`classify_kernel(name) is KernelClass.COMMUNICATION`, without trying the other classes."""
    return _match(name, _KERNEL_COMMUNICATION) is KernelClass.COMMUNICATION


def comm_family(name: str) -> str | None:
    """The communication library family of a kernel name (`COMM_FAMILIES`), or None."""
    lowered = name.lower()
    for family, patterns, _ in COMM_FAMILIES:
        if any(p in lowered for p in patterns):
            return family
    return None


STREAMING_MATMUL_HINTS = (
    "gemv",
    "skinny",
    "wvsplitk",
    "llgemm",
    "splitkv",
    "paged_attention",
    "pagedattention",
    "decode_attention",
    "batchdecode",
    "flash_decoding",
)
"""Name parts of matmul-class kernels built for skinny shapes (GEMV, decode attention): they
stream their operands, so their bound is memory bandwidth even with no shapes recorded."""


_TILES = (
    re.compile(r"_MT(\d+)x(\d+)x\d+"),  # hipBLASLt / Tensile macro tile
    re.compile(r"tilesize(\d+)x(\d+)x\d+"),  # cuBLAS xmma
    re.compile(r"nvjet_[a-z]+_(\d+)x(\d+)_"),  # cuBLASLt nvjet
    re.compile(r"gemm_(?:[a-z]+\d*_)?(\d+)x(\d+)_"),  # cuBLAS sgemm/s1688gemm, CUTLASS
)


def kernel_tile(name: str) -> tuple[int, int] | None:
    """The M×N tile a GEMM library kernel's name gives (hipBLASLt `MT64x16x64`, xmma
    `tilesize128x128x64`, nvjet `nvjet_tst_64x16_`, cuBLAS/CUTLASS `gemm_128x64_`), or None."""
    for pattern in _TILES:
        found = pattern.search(name)
        if found:
            return int(found.group(1)), int(found.group(2))
    return None


def streams_operands(name: str, cls: KernelClass, skinny_tile: int) -> bool:
    """A matmul-class kernel whose name says it is built for skinny shapes: a GEMV, split-KV
    or decode-attention kernel, or a GEMM whose tile is at most `skinny_tile` wide
    (`Thresholds.skinny_tile`)."""
    lowered = name.lower()
    if any(h in lowered for h in STREAMING_MATMUL_HINTS):
        return True
    tile = kernel_tile(name) if cls is KernelClass.GEMM else None
    return tile is not None and min(tile) <= skinny_tile


def classify_op(name: str) -> KernelClass:
    """The class of a CPU-side op (`aten::mm`, `nccl:all_reduce`, ...). An autograd node
    (`autograd::engine::evaluate_function: MulBackward0`) has the class of the op it
    differentiates (`aten::mul`): on CPU-only traces these nodes hold the whole backward pass."""
    name = _differentiated(name)
    if name in _METADATA_OPS:
        return KernelClass.OTHER
    return _match(name, _OP_RULES)


def is_communication_op(name: str) -> bool:
    """`classify_op(name) is KernelClass.COMMUNICATION`, without trying the other classes."""
    name = _differentiated(name)
    return (
        name not in _METADATA_OPS and _match(name, _OP_COMMUNICATION) is KernelClass.COMMUNICATION
    )


def _differentiated(name: str) -> str:
    """The op an autograd node differentiates (`aten::mul` for `...: MulBackward0`), else
    `name`."""
    backward = _BACKWARD_NODE.match(name)
    if backward is not None:
        return "aten::" + _CAMEL_WORD.sub("_", backward.group(1)).lower()
    return name


def communication_ops(trace: Trace) -> npt.NDArray[np.int32]:
    """The codes of the trace's names that `classify_op` calls communication (read-only):
    classified once per trace, though the collectives' findings, the phases and a CPU-only
    trace's work all read them."""
    return trace.once(_communication_ops)


def _communication_ops(trace: Trace) -> npt.NDArray[np.int32]:
    codes = trace.names_matching(is_communication_op)
    codes.setflags(write=False)  # (shared by every caller)
    return codes


_BACKWARD_NODE = re.compile(r"autograd::engine::evaluate_function: (\w+?)Backward\d*$")
_CAMEL_WORD = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


# Ops that only change a tensor's metadata or allocate: they launch no work worth a class.
_METADATA_OPS = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::view",
        "aten::reshape",
        "aten::t",
        "aten::as_strided",
        "aten::expand",
        "aten::slice",
        "aten::select",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::transpose",
        "aten::permute",
        "aten::detach",
        "aten::alias",
        "aten::resize_",
        "aten::_unsafe_view",
        "aten::lift_fresh",
        "aten::numpy_T",
        "aten::split",
        "aten::chunk",
        "aten::unbind",
        "aten::narrow",
    }
)
