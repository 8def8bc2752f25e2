"""Fusion: chains of memory-bound kernels, and attention written by hand."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.classify import KernelClass
from wallfinder.analysis.critpath import Change
from wallfinder.analysis.findings import NO_ROWS, Facts, amdahl, make_finding, ms_text, named_rows
from wallfinder.analysis.gpu import CLASSES
from wallfinder.analysis.rules import rule
from wallfinder.diagnosis import Finding
from wallfinder.trace import Kind


def _fused_rows(f: Facts) -> npt.NDArray[np.bool_]:
    """The steady steps' kernels of the fusable chains."""
    if f.dev is None:
        return NO_ROWS
    return named_rows(f, [k for c in f.fusion for k in c.kernels])


@rule(Facts, id="fusable-pointwise", replay=Change(fuse=True), work=_fused_rows)
def fusion(f: Facts) -> Finding | None:
    if not f.fusion or f.step_s <= 0:
        return None
    saving = sum(c.max_saving_s for c in f.fusion)
    share = saving / f.step_s
    top = f.fusion[0]
    ops = ", ".join(top.ops[:4]) or "unknown ops"
    where = _where_kernels(f, top.kernels)
    return make_finding(
        f,
        "fusable-pointwise",
        "bandwidth",
        "Chains of memory-bound kernels could be fused",
        share,
        f"{len(f.fusion)} repeated runs of memory-bound kernels; the costliest ({ops}) takes "
        f"{ms_text(top.time_s)} per step{where}; fusing could save at most "
        f"{ms_text(saving)} per step",
        "torch.compile the model (Inductor fuses pointwise/norm chains); or use fused ops "
        "(fused LayerNorm/RMSNorm, fused optimizer)",
        speedup=amdahl(share),
    )


def _where_kernels(f: Facts, names: list[str]) -> str:
    """The module and phase most of the named kernels' time sits in ("" when unknown)."""
    a = f.attribution
    if a is None or f.dev is None:
        return ""
    return a.where(named_rows(f, names), f.dev.ops.dur.astype(np.float64))


_SOFTMAX = CLASSES.index(KernelClass.SOFTMAX)


def _softmax_rows(f: Facts) -> npt.NDArray[np.bool_]:
    """The steady steps' softmax kernels."""
    if f.dev is None:
        return NO_ROWS
    rows: npt.NDArray[np.bool_] = f.inside & (f.dev.cls == _SOFTMAX)
    return rows


@rule(Facts, id="unfused-attention", work=_softmax_rows)
def unfused_attention(f: Facts) -> Finding | None:
    """bmm/matmul → softmax → bmm/matmul on one thread: attention written by hand."""
    if f.dev is None or f.step_s <= 0:
        return None
    ops = f.trace.of_kind(Kind.CPU_OP)
    matmul = f.trace.names_matching(lambda s: s in ("aten::bmm", "aten::matmul"))
    softmax = f.trace.names_matching(lambda s: s in ("aten::softmax", "aten::_softmax"))
    if matmul.size == 0 or softmax.size == 0:
        return None
    relevant = np.isin(ops.name, np.concatenate([matmul, softmax]))
    rows = np.flatnonzero(relevant)
    thread = ops.thread
    order = rows[np.lexsort((ops.ts[rows], thread[rows]))]
    names = ops.name[order]
    by_thread = thread[order]
    # follows[i]: row i is on the same thread as row i − 1.
    follows = np.concatenate([[False], by_thread[1:] == by_thread[:-1]])
    is_mm = np.isin(names, matmul)
    is_sm = np.isin(names, softmax)
    pattern = is_sm[1:-1] & is_mm[:-2] & is_mm[2:] & follows[1:-1] & follows[2:]
    count = int(pattern.sum())
    if count == 0:
        return None
    softmax_kernels = _softmax_rows(f)
    seconds = float(f.dev.ops.dur[softmax_kernels].sum()) * 1e-9 / max(f.steps.count, 1)
    share = seconds / f.step_s
    return make_finding(
        f,
        "unfused-attention",
        "bandwidth",
        "Attention is computed unfused (bmm → softmax → bmm)",
        share,
        f"{f.per_step(count):.0f} bmm → softmax → bmm sequences per step; the softmax kernels "
        f"alone take {ms_text(seconds)} per step and the score matrix goes through memory "
        "(the bound counts only the softmax time)",
        "use torch.nn.functional.scaled_dot_product_attention (flash/memory-efficient "
        "kernels keep the scores on chip)",
        speedup=amdahl(share),
    )
