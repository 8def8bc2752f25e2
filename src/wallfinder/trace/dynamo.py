"""What torch.compile itself said about a profiled program, and the names its runtime and its
compiler give the ranges and kernels of a trace: format knowledge, kept here.

`wallfinder run` asks Dynamo (in the measured process, before the trace is written) for its
counters and compile records, and writes them into the trace's top-level JSON under
`wallfinder_dynamo` (`DYNAMO_KEY`), kept as `Trace.dynamo` (`diagnosis.DynamoRecord`
is its form). File names
in it are base names only: a trace is shared, a machine's paths are not.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from wallfinder.trace.model import Trace

__all__ = [
    "DYNAMO_KEY",
    "compile_codes",
    "compile_range",
    "dynamo_range",
    "fused_kernel",
    "region_codes",
    "region_name",
    "runtime_range",
]

DYNAMO_KEY = "wallfinder_dynamo"
"""The trace's top-level key that holds what Dynamo counted (written by `wallfinder run`)."""


# Names the runtime gives its ranges. `Torch-Compiled Region: 0/1` (frame 0, compile 1) wraps
# each call of compiled code, `TorchDynamo Cache Lookup` each guard check, `## Call
# CompiledFxGraph <hash> ##` each Inductor graph's call, `CompiledFunction[Backward]` AOT
# autograd's forward and backward; the rest are their parts.
_REGION = re.compile(r"^Torch-Compiled Region: (\d+/\d+)$")
_RUNTIME = re.compile(
    r"^(TorchDynamo Cache Lookup|Torch-Compiled Region: |## Call CompiledFxGraph |"
    r"CompiledFunction(Backward)?$|Pregraph bytecode$|AOTDispatcher Runtime Wrapper)"
)
# Names of the compiler's own ranges (`dynamo_timed`): `entire_frame_compile`,
# `_compile.compile_inner (dynamo_timed)`, `inductor_compile_data: ..., compile_id=0/0`, ...
_COMPILE = re.compile(
    r"(\(dynamo_timed\)$|compile_id=\d+/\d+$|^entire_frame_compile$|^backend_compile$|"
    r"^inductor_compile$|^async_compile\.|^CachingAutotuner\.|^compile_fx)"
)


def region_name(name: str) -> str | None:
    """The compile id of a `Torch-Compiled Region: 0/1` range ("0/1"), else None."""
    found = _REGION.match(name)
    return found.group(1) if found else None


def dynamo_range(name: str) -> bool:
    """A range Dynamo's runtime opens (a guard check, a region, AOT autograd's functions) or
    a range of the compiler at work: never a step. (An Inductor graph's call, `## Call
    CompiledFxGraph`, runs once per call of its graph, as a `record_function` would.)"""
    return (runtime_range(name) and not name.startswith("## Call ")) or compile_range(name)


def runtime_range(name: str) -> bool:
    """A range the torch.compile runtime opens around compiled code (a region, a guard
    check, a graph's call, AOT autograd's functions): a mark of compiled code, never of a
    step."""
    return _RUNTIME.match(name) is not None


def compile_range(name: str) -> bool:
    """A range of the compiler at work (Dynamo tracing, AOT autograd, Inductor, autotuning):
    a one-off cost, never a step."""
    return _COMPILE.search(name) is not None


def compile_codes(trace: Trace) -> npt.NDArray[np.int32]:
    """The codes of the trace's names `compile_range` accepts (read-only), found once per
    trace: the steps, the compiling steps and the compiled code's view all read them."""
    return trace.once(_compile_codes)


def region_codes(trace: Trace) -> npt.NDArray[np.int32]:
    """The codes of the trace's `Torch-Compiled Region` names (`region_name`; read-only),
    found once per trace."""
    return trace.once(_region_codes)


def _compile_codes(trace: Trace) -> npt.NDArray[np.int32]:
    codes = trace.names_matching(compile_range)
    codes.setflags(write=False)  # (shared by every caller)
    return codes


def _region_codes(trace: Trace) -> npt.NDArray[np.int32]:
    codes = trace.names_matching(lambda s: region_name(s) is not None)
    codes.setflags(write=False)  # (shared by every caller)
    return codes


_FUSED = re.compile(r"^(?:triton_(poi|red|per|tem|for|spl)_|cpp_)fused(?:_(.+?))?(?:_\d+)?$")
_KINDS = {
    "poi": "pointwise",
    "red": "reduction",
    "per": "persistent reduction",
    "tem": "template",
    "for": "foreach",
    "spl": "split scan",
    None: "CPU",
}
# aten ops whose names hold underscores, so that a kernel name splits into them, not into
# their words (Inductor joins its nodes' op names with "_"); the longest are tried first.
_MULTIWORD = sorted(
    (
        "_softmax",
        "constant_pad_nd",
        "_log_softmax",
        "_softmax_backward_data",
        "_log_softmax_backward_data",
        "prepare_softmax_online",
        "_unsafe_view",
        "_to_copy",
        "native_layer_norm",
        "native_layer_norm_backward",
        "native_group_norm",
        "native_batch_norm",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_functional",
        "native_batch_norm_backward",
        "native_dropout",
        "native_dropout_backward",
        "gelu_backward",
        "silu_backward",
        "sigmoid_backward",
        "tanh_backward",
        "threshold_backward",
        "embedding_dense_backward",
        "nll_loss_forward",
        "nll_loss_backward",
        "scalar_tensor",
        "index_put",
        "index_select",
        "clamp_min",
        "clamp_max",
        "full_like",
        "zeros_like",
        "ones_like",
        "new_zeros",
        "var_mean",
        "max_pool2d_with_indices",
        "max_pool2d_with_indices_backward",
        "avg_pool2d",
        "adaptive_avg_pool2d",
        "convolution_backward",
        "scatter_add",
        "slice_scatter",
        "select_scatter",
        "where_self",
        "logical_not",
        "bitwise_and",
        "rand_like",
        "randn_like",
        "inductor_random",
        "inductor_lookup_seed",
        "inductor_seeds",
    ),
    key=len,
    reverse=True,
)
_OP = re.compile("|".join(re.escape(w) for w in _MULTIWORD) + r"|[A-Za-z0-9]+")


def fused_kernel(name: str) -> tuple[str, list[str]] | None:
    """An Inductor kernel's kind and the ops it fuses, read from its name
    (`triton_poi_fused_add_mul_tanh_0` → ("pointwise", ["add", "mul", "tanh"]); `cpp_fused_*`
    on the CPU); None for any other name."""
    found = _FUSED.match(name)
    if found is None:
        return None
    words = (m.group(0) for m in _OP.finditer(found.group(2) or ""))
    ops = list(dict.fromkeys(w for w in words if not w.isdigit()))  # ("fused_0": a number)
    return _KINDS.get(found.group(1), "CPU"), ops
