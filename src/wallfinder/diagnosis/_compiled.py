"""torch.compile in a diagnosis: the compiled regions of the trace, the eager code they can
be compared with, the kernels Inductor fused, the compile as a one-off cost, and what Dynamo
itself counted when `wallfinder run` asked it."""

from __future__ import annotations

from wallfinder.diagnosis._base import _Base


class DynamoBreak(_Base, frozen=True):
    """One graph break: Dynamo's reason (its first line) and the user's line it broke at
    (`file` a base name; "" and 0 when Dynamo gave no user frame), `count` times."""

    reason: str
    file: str = ""
    line: int = 0
    count: int = 1


class DynamoCompile(_Base, frozen=True):
    """One frame compile: Dynamo's compile id ("0/1": frame 0, its second compile), the
    function and where it is (`file` a base name), the seconds it took, and, for a
    recompile, the guard that failed (its first line)."""

    compile_id: str
    function: str = ""
    file: str = ""
    line: int = 0
    seconds: float = 0.0
    recompile_reason: str | None = None


class DynamoRecord(_Base, frozen=True):
    """Dynamo's counters and compile records for the process that wrote the trace: frames
    it compiled, unique graphs, graph breaks (by reason and line), the compiles (the first
    of each frame and its recompiles), and the compile seconds in all (frames, AOT
    autograd and Inductor, backward compiles included)."""

    frames: int = 0
    graphs: int = 0
    graph_breaks: list[DynamoBreak] = []
    compiles: list[DynamoCompile] = []
    compile_s: float = 0.0

    @property
    def recompiles(self) -> list[DynamoCompile]:
        """The compiles a failed guard caused."""
        return [c for c in self.compiles if c.recompile_reason]

    @property
    def break_count(self) -> int:
        return sum(b.count for b in self.graph_breaks)


class FusedKernel(_Base, frozen=True):
    """An Inductor kernel (`triton_poi_fused_add_mul_tanh_0`, `cpp_fused_*`): its kind and the
    ops its name says it fuses, its calls and time (device time; host time on the CPU) in the
    steady compiled calls."""

    name: str
    kind: str
    ops: list[str]
    calls: int
    time_s: float


class CodeRegion(_Base, frozen=True):
    """Calls of one piece of code: a compiled region (`Torch-Compiled Region: 0/0`, by
    compile id) or the eager code that repeats outside them. `calls` are the steady calls
    (a compiling call is not one); time per call from the first call's start to the last's
    end (its device work included); device time and kernels per call (0 on the CPU)."""

    name: str
    calls: int
    time_per_call_s: float
    device_per_call_s: float
    kernels_per_call: float
    ops: list[str] = []
    """The eager region's ops, in the order one call runs them (empty for a compiled one)."""


class CompiledCode(_Base, frozen=True):
    """torch.compile in the trace: its compiled regions and the eager region beside them
    (`speedup`: eager time per call / compiled, when both are there), the fused kernels,
    the share of the steady steps' device time (host time on the CPU) spent in compiled
    calls, and the compile the trace shows (`compile_s`: Dynamo, AOT autograd, Inductor,
    autotuning; a one-off cost, never part of the steady state). `dynamo` is what Dynamo
    counted, when `wallfinder run` recorded it."""

    regions: list[CodeRegion] = []
    eager: CodeRegion | None = None
    speedup: float | None = None
    share: float | None = None
    compile_s: float = 0.0
    compiling_calls: int = 0
    """Region calls that compiled (their first call, a recompile), set aside."""
    kernels: list[FusedKernel] = []
    dynamo: DynamoRecord | None = None
