"""An Nsight Compute export read against a diagnosis: `CounterReport`."""

from __future__ import annotations

from typing import Literal

import msgspec

from wallfinder.diagnosis._base import _Base
from wallfinder.diagnosis._step import Finding

COUNTERS_SCHEMA = "wallfinder.counters/1"


class CounterKernel(_Base, frozen=True):
    """One profiled launch in an Nsight Compute export, as its hardware counters measured it:
    rates per second, bytes, fractions of peak (null where the export did not carry the
    metric), and the bound the counters give, with the figures that decided it."""

    id: int
    name: str
    grid: int | None
    block: int | None
    duration_s: float | None
    """Per launch (for a summary page's row: the average over its `invocations`)."""
    sm_pct: float | None
    memory_pct: float | None
    dram_pct: float | None
    l1_pct: float | None
    l2_pct: float | None
    dram_bytes: float | None
    l2_bytes: float | None
    flops: float | None
    flops_basis: str | None
    """"sass": counted CUDA-core thread instructions (an FMA as two; tensor-pipe work is not
    in it); "flop_count": the export's FLOP counts."""
    tensor_pct: float | None
    tensor_instructions: float | None
    ai: float | None
    """FLOPs per DRAM byte (achieved arithmetic intensity)."""
    flops_per_s: float | None
    dram_bytes_per_s: float | None
    occupancy: float | None
    bound: Literal["compute", "memory", "latency"] | None
    unit: str | None
    """Where the bound sits: "dram", "l2", "l1" for memory; "tensor" or "cuda cores" for
    compute; for latency the reasons (low occupancy, launch-sized)."""
    reason: str
    """The figures that decided the bound, in words."""
    invocations: int = 1
    """Launches this row stands for (a summary page's `Invocations`; else 1)."""


class CounterCheck(_Base, frozen=True):
    """A trace's kernel beside its counters: the roofline's estimate (from shapes and the
    datasheet) and the counters' bound, confirmed or refuted."""

    kernel: str
    time_s: float
    """The kernel's time in the trace (as `KernelRow.time_s`)."""
    share: float
    """Its share of the trace's kernel time (as `KernelRow.share`)."""
    launches: int
    """How many profiled launches matched it."""
    matched_by: str
    """"name" (the normalised full name), "base name" (the qualified function name) or
    "function name" (without its namespaces, as `--print-kernel-base function` prints it)."""
    estimated_bound: str | None
    estimated_flops: float | None
    estimated_bytes: float | None
    pct_of_roof: float | None
    counter_bound: str | None
    counter_unit: str | None
    counted_flops: float | None
    counted_bytes: float | None
    flops_ratio: float | None
    """Cost model's FLOPs / counted FLOPs, per launch (null when either is missing)."""
    bytes_ratio: float | None
    """Cost model's bytes / counted DRAM bytes, per launch."""
    status: Literal["confirmed", "refuted", "no estimate", "no counters"]
    detail: str


class CounterReport(_Base, frozen=True, kw_only=True):
    """What an Nsight Compute export's counters say per kernel (`wallfinder counters`), and,
    beside a trace, which of the roofline's bounds they confirm or refute."""

    schema: str = COUNTERS_SCHEMA
    source: str
    page: str
    kernels: list[CounterKernel] = []
    checks: list[CounterCheck] = []
    unmatched_kernels: list[str] = []
    """Trace kernels (among the top by time) that no profiled launch matched."""
    unmatched_launches: int = 0
    """Profiled launches that matched no kernel of the trace."""
    findings: list[Finding] = []
    collect: list[str] = []
    """`ncu` command lines that would collect what is missing (for a trace: its top kernels
    by time)."""
    notes: list[str] = []
    mismatch: str | None = None
    """Why the export is not shown to be the trace's program (another device, or too few
    launches joined by launch size or order), where it is not: then nothing is joined and
    the counters change nothing in the diagnosis."""

    @classmethod
    def from_json(cls, text: str | bytes) -> CounterReport:
        return msgspec.json.decode(text, type=cls)
