"""The job's parallelism: the strategies its trace shows, each with the evidence that names it."""

from __future__ import annotations

from wallfinder.diagnosis._base import _Base

COLLECTIVE_WORDS = {
    "allreduce": "all-reduce",
    "allgather": "all-gather",
    "reducescatter": "reduce-scatter",
    "alltoall": "all-to-all",
    "sendrecv": "send/recv",
}
"""How the evidence and the reports spell the collectives' kinds."""


class Strategy(_Base, frozen=True):
    """One parallelism strategy found in the trace."""

    name: str
    """"DDP", "FSDP", "TP", "PP", "EP" or "CP"."""
    title: str
    """What it is, in words ("fully sharded data parallel (FSDP / ZeRO-3)")."""
    evidence: list[str] = []
    """What in the trace names it, one line each (ranges, collectives per phase, groups)."""


class ProcessGroup(_Base, frozen=True):
    """A process group the trace declares (`distributedInfo`) or its collectives name."""

    name: str
    size: int | None = None
    description: str = ""
    collectives: dict[str, float] = {}
    """Its collectives per steady step, by kind ("allreduce": 2.0)."""


class Parallelism(_Base, frozen=True, kw_only=True):
    """How the job is parallelised, from what one rank's trace holds: several strategies at
    once (2D/3D parallel) is the normal case; empty `strategies` means none was seen."""

    strategies: list[Strategy] = []
    groups: list[ProcessGroup] = []
    frameworks: list[str] = []
    """Frameworks whose own ranges the trace holds (torch FSDP, DDP, pipelining, Megatron,
    DeepSpeed, torchtitan)."""

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.strategies]
