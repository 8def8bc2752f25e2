"""Data loading: the device waits while the host is in the DataLoader."""

from __future__ import annotations

from wallfinder.analysis.classify import DATALOADER_WORKERS, is_data_loading
from wallfinder.analysis.critpath import Change
from wallfinder.analysis.findings import (
    Facts,
    amdahl,
    call_sites,
    calls_in_steps,
    make_finding,
    ms_text,
)
from wallfinder.analysis.rules import rule
from wallfinder.diagnosis import Finding
from wallfinder.trace import Events, Kind


def _loader_calls(f: Facts) -> Events:
    """The DataLoader's `__next__` ranges in the steady steps."""
    return calls_in_steps(f, is_data_loading, (Kind.ANNOTATION, Kind.CPU_OP))


@rule(Facts, id="data-loading", replay=Change(data=True), work=_loader_calls)
def data_loading(f: Facts) -> Finding | None:
    share = f.share(f.breakdown.idle_causes.get("data_loading", 0.0))
    workers = f.trace.names_matching(lambda s: is_data_loading(s) and DATALOADER_WORKERS in s)
    if workers.size:
        fix = (
            "the DataLoader already uses worker processes but they cannot keep up: more "
            "num_workers, a larger prefetch_factor, persistent_workers=True, cheaper "
            "decoding/augmentation (or move it to the GPU), faster storage"
        )
    else:
        fix = (
            "load batches in the background: DataLoader(num_workers=4 or more, "
            + ("pin_memory=True, " if f.dev is not None else "")
            + "persistent_workers=True, prefetch_factor=2+); move decoding/augmentation off "
            "the training process"
        )
    # A CPU-only trace: the CPU is the device, and the training loop is what waits.
    waiter = "the GPU is idle while the host is" if f.dev is not None else "the training loop is"
    return make_finding(
        f,
        "data-loading",
        "overhead",
        "The GPU waits for the DataLoader"
        if f.dev is not None
        else "The training loop waits for the DataLoader",
        share,
        f"{share:.0%} of each step ({ms_text(share * f.step_s)}) {waiter} in the DataLoader's "
        "__next__" + call_sites(f, is_data_loading, (Kind.ANNOTATION, Kind.CPU_OP)),
        fix,
        speedup=amdahl(share),
    )
