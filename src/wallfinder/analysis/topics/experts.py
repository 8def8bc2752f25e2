"""Expert parallel (MoE): the token exchange — all-to-all, or an expert-parallel library's
dispatch and combine kernels — that the step waits for, with expert parallel's own levers
(not the DDP bucket advice of `exposed-comm`). Hidden beside the expert GEMMs it is no wall:
its cost there is the SMs it takes from them, which the trace cannot time."""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from wallfinder.analysis.findings import (
    NO_ROWS,
    Facts,
    amdahl,
    make_finding,
    ms_text,
    once_per_facts,
)
from wallfinder.analysis.gpu import COMM
from wallfinder.analysis.intervals import Coverage
from wallfinder.analysis.parallelism import RANGES, is_dispatch_kernel
from wallfinder.analysis.rules import Claim, rule
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.analysis.topics.sharding import exposed_s, steady_collectives, strategy_claim
from wallfinder.diagnosis import Finding

NS = 1e-9


@once_per_facts
def _ep_rows(f: Facts) -> npt.NDArray[np.bool_]:
    """The steady steps' token-exchange kernels: dispatch/combine kernels by name, and the
    communication kernels launched inside the host's all-to-all calls (NCCL runs an
    all-to-all as send/recv kernels, whose names alone could be a pipeline's)."""
    if f.dev is None:
        return NO_ROWS
    dev, trace = f.dev, f.trace
    comm = f.inside & (dev.cls == COMM)
    names, index = np.unique(dev.ops.name, return_inverse=True)
    named = np.array([is_dispatch_kernel(trace.strings[int(c)]) for c in names.tolist()], bool)
    rows: npt.NDArray[np.bool_] = comm & named[index]
    host = steady_collectives(f)
    calls = host.calls.take(np.flatnonzero(host.kind == "alltoall"))
    at = np.flatnonzero(comm & ~rows & (dev.launch_ts != NO_LAUNCH))
    if not len(calls) or not at.size:
        return rows
    thread, launch = dev.launch_thread[at], dev.launch_ts[at]
    for t in np.unique(calls.thread).tolist():
        mine = calls.thread == t
        spans = Coverage.of(calls.ts[mine], calls.end[mine])
        here = thread == t
        rows[at[here][spans.covered(launch[here], launch[here] + 1) > 0]] = True
    return rows


def _moe(f: Facts, rows: npt.NDArray[np.bool_]) -> bool:
    """Whether the exchange is a mixture of experts': dispatch/combine kernels, or ranges or
    modules that name experts. An all-to-all alone is also how sharded embeddings (DLRM,
    TorchRec) look rows up: that stays exposed communication."""
    assert f.dev is not None
    trace = f.trace
    if any(is_dispatch_kernel(trace.strings[int(c)]) for c in np.unique(f.dev.ops.name[rows])):
        return True
    named = trace.names_matching(lambda s: _MOE.search(s) is not None)
    return bool(trace.named(RANGES, named).ts.size)


_MOE = re.compile(r"moe|expert|mixtral|deepseek", re.IGNORECASE)
"""Range and module names that say a mixture of experts runs (`MoE`, `experts.0`,
`MixtralSparseMoeBlock`, `DeepseekV3MoE`, `fused_moe`)."""


def _exchange(f: Facts) -> tuple[float, float] | None:
    """A mixture of experts' token exchange: its kernel time per step (their union over
    streams) and the part of it no compute runs beside, in seconds; None without such
    kernels or without a mixture of experts (`_moe`)."""
    rows = _ep_rows(f)
    if not rows.any() or not _moe(f, rows):
        return None
    assert f.dev is not None
    ops = f.dev.ops
    total = Coverage.of(ops.ts[rows], ops.end[rows]).total * NS / max(f.steps.count, 1)
    return total, exposed_s(f, rows)


def _ep_claim(f: Facts) -> Claim | None:
    found = _exchange(f)
    return None if found is None else strategy_claim(f, found[1], "the MoE token exchange")


@rule(Facts, id="ep-alltoall-exposed", work=_ep_rows, claims=_ep_claim)
def ep_alltoall_exposed(f: Facts) -> Finding | None:
    """Expert parallel's token exchange with no compute beside it: the step waits for the
    tokens to reach their experts (dispatch) and come back (combine)."""
    found = _exchange(f)
    if found is None or f.step_s <= 0:
        return None
    total, exposed = found
    share = f.share(exposed / f.step_s)
    if share < f.thresholds.time.min_share:
        return None
    hidden = max(total - exposed, 0.0)
    reach = min(share, f.hideable)
    return make_finding(
        f,
        "ep-alltoall-exposed",
        "overhead",
        "Expert parallel's token exchange is not hidden behind compute",
        share,
        f"{share:.0%} of each step ({ms_text(exposed)}) waits for the MoE token exchange "
        f"(all-to-all or dispatch/combine) with no compute beside it, of its "
        f"{ms_text(total)} per step; "
        + (
            f"{ms_text(hidden)} of it already runs beside compute, on SMs the GEMMs then do "
            "not have (the trace cannot time that cost)"
            if hidden > 0
            else "none of it runs beside compute"
        )
        + f"; the compute it could hide behind is {reach:.0%} of the step (the bound)",
        "overlap the exchange with compute: split the batch in two and run one half's "
        "dispatch/combine beside the other half's experts (two-micro-batch overlap, DualPipe-"
        "style schedules), or an expert-parallel library's overlapped kernels (DeepEP's "
        "hook-based receive, which takes no SMs while it waits); keep the expert-parallel "
        "group inside a node (NVLink) and balance the experts' load (a capacity factor, an "
        "auxiliary or loss-free balancing) so no rank's exchange waits for the busiest one",
        speedup=amdahl(reach),
        reach=reach,
    )
