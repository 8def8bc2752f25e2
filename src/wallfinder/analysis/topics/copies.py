"""Copies: memory copies the device waits on, and tensors cast or copied over and over."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.findings import (
    NO_ROWS,
    Facts,
    amdahl,
    call_sites,
    host_calls,
    make_finding,
    ms_text,
)
from wallfinder.analysis.gpu import COPY
from wallfinder.analysis.rules import rule
from wallfinder.diagnosis import Finding
from wallfinder.trace import Kind


def _copy_rows(f: Facts) -> npt.NDArray[np.bool_]:
    """The steady steps' memory copies."""
    if f.dev is None:
        return NO_ROWS
    rows: npt.NDArray[np.bool_] = f.inside & (f.dev.ops.kind == Kind.MEMCPY)
    return rows


@rule(Facts, id="exposed-copies", work=_copy_rows)
def exposed_copies(f: Facts) -> Finding | None:
    share = f.share(f.breakdown.copy_exposed)
    if f.dev is None:
        return None
    copies = _copy_rows(f)
    names = [f.trace.strings[int(c)] for c in np.unique(f.dev.ops.name[copies])]
    pageable = [n for n in names if "Pageable" in n]
    detail = f"; copies from pageable memory: {', '.join(pageable)}" if pageable else ""
    return make_finding(
        f,
        "exposed-copies",
        "overhead",
        "Memory copies stall the GPU" + (" (pageable host memory)" if pageable else ""),
        share,
        f"{share:.0%} of each step ({ms_text(share * f.step_s)}) the GPU only copies "
        f"memory{detail}",
        "pin host memory (DataLoader pin_memory=True, tensor.pin_memory()) and copy with "
        "non_blocking=True; keep tensors on the device instead of moving them each step",
        speedup=amdahl(share),
    )


_CAST_NAMES = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::contiguous", "aten::clone")


def _cast_rows(f: Facts) -> npt.NDArray[np.bool_]:
    """The steady steps' copy/cast kernels (not memcpy)."""
    if f.dev is None:
        return NO_ROWS
    rows: npt.NDArray[np.bool_] = f.inside & (f.dev.ops.kind == Kind.KERNEL) & (f.dev.cls == COPY)
    return rows


@rule(Facts, id="repeated-casts", work=_cast_rows)
def repeated_casts(f: Facts) -> Finding | None:
    if f.dev is None or f.step_s <= 0:
        return None
    calls = host_calls(f, _CAST_NAMES)
    copy_kernels = _cast_rows(f)
    seconds = float(f.dev.ops.dur[copy_kernels].sum()) * 1e-9 / max(f.steps.count, 1)
    share = seconds / f.step_s
    listed = ", ".join(f"{n} ×{c:.0f}/step" for n, c, _ in calls[:3]) or "copy kernels"
    return make_finding(
        f,
        "repeated-casts",
        "bandwidth",
        "Tensors are cast or copied over and over",
        share,
        f"{listed}; copy/cast kernels take {ms_text(seconds)} per step"
        + call_sites(f, _CAST_NAMES, (Kind.CPU_OP,)),
        "cast once: model.to(device, dtype) before the loop, inputs created in the dtype and "
        "device they are used in, no .float()/.half()/.contiguous() round trips in the step",
        speedup=amdahl(share),
    )
