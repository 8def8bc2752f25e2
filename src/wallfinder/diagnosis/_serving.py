"""LLM serving in a diagnosis: the engine's iterations (forward passes over the running
batch), each prefill, decode or mixed; decode judged by the memory bandwidth it needs (MBU),
prefill by MFU; the host's time between iterations; decode's CUDA-graph coverage."""

from __future__ import annotations

from typing import Literal

from wallfinder.diagnosis._base import _Base

IterationKind = Literal["prefill", "decode", "mixed", "unknown"]


class ServingIteration(_Base, frozen=True):
    """One engine iteration: its window on the device's clock (from the end of the one before
    to the end of its own device work), the device's busy time in it, the tokens it ran
    (null: not recorded) and whether a CUDA/HIP graph replayed it."""

    kind: IterationKind
    start_s: float
    """From the first iteration's start."""
    duration_s: float
    busy_s: float
    tokens: int | None = None
    graph: bool = False
    warmup: bool = False
    """Most of its time is the device waiting on one-off start-up (the first forward's
    library set-up and code loading): set aside from the figures of its kind."""


class IterationKinds(_Base, frozen=True):
    """The iterations of one kind: how many, their time, median and device-busy time, and
    the tokens they ran (null: not recorded)."""

    kind: IterationKind
    count: int
    time_s: float
    median_s: float
    busy_s: float
    tokens: int | None = None
    warmup: int = 0
    """Iterations set aside as start-up (not in `time_s`, `median_s`, `busy_s`)."""


class DecodeBandwidth(_Base, frozen=True):
    """Decode against the memory bandwidth that bounds it, an estimate: the bytes one decode
    iteration reads (weights and KV cache, `basis` says from what) over its median time; `mbu`
    is that rate over the device's peak bandwidth (null: device unknown), `busy_mbu` the same
    over the device's busy time in the iteration (what its kernels achieved)."""

    bytes_per_iteration: float
    weight_bytes: float | None
    kv_bytes: float | None
    basis: str
    median_s: float
    bandwidth: float
    """Achieved B/s over the median decode iteration."""
    mbu: float | None = None
    busy_mbu: float | None = None
    kv_dtype: str | None = None
    """The KV cache's dtype, from the attention's K and V (null: not recorded)."""


class Serving(_Base, frozen=True):
    """An LLM serving trace read as engine iterations (`evidence`: what they were found
    from). `host_share` is the part of the iterations' time the device idled for the host
    (the engine's host work between forward passes: scheduling, sampling, detokenisation,
    Python, synchronisation), every idle cause in `host_causes` (fractions of the
    iterations' time); `graph_coverage` the share
    of decode iterations replayed from a CUDA/HIP graph."""

    engine: str | None
    evidence: str
    iterations: list[ServingIteration] = []
    kinds: list[IterationKinds] = []
    decode: DecodeBandwidth | None = None
    prefill_mfu: float | None = None
    prefill_basis: str = ""
    host_share: float = 0.0
    host_causes: dict[str, float] = {}
    graph_coverage: float | None = None
    note: str = ""
    """What the trace cannot show (a front-end process with no device work)."""
    wait_share: float = 0.0
    """The part of the iterations' time the device idled with its next work already queued
    (waiting on an event, another stream or thread): not the host's time between iterations,
    which `host_share` counts (from schema 2's later files: before, `host_share` held both)."""
    between_share: float = 0.0
    """The part of the iterations' time the device idled between forward passes: from one
    iteration's last device op to the next one's first (the engine's scheduling, input
    preparation, sampling, output processing). The rest of `host_share` is idle inside the
    forward passes, between its launches: the launch path's, not the engine's loop."""
    overlap: str = ""
    """The evidence that the engine's host work runs beside the device's (SGLang's overlap
    scheduler, vLLM's async scheduling, the next iteration's host work starting before the
    device finishes this one): overlap, not a wall ("": none seen)."""
    decode_note: str = ""
    """Why decode's bytes per iteration or its MBU are not known, or known only in part."""
    ttft_s: float | None = None
    """Time to first token, an estimate: the median prefill iteration (a request's first
    token is sampled at its end), queueing before it not seen (null: no prefill iteration)."""
    tpot_s: float | None = None
    """Time per output token, an estimate: the median decode iteration (each decodes one
    token per running sequence; null: fewer than two decode iterations)."""
    tokens_per_s: float | None = None
    """Decode's output tokens per second over its iterations (null: tokens not recorded)."""
    per_token_basis: str = ""
    """How the per-token estimates were made, or why they are unknown."""
