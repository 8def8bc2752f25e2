"""The result contract: every result as its JSON (`to_json`), one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wallfinder.report.formats import (
    CALCULATION,
    COUNTERS,
    DIAGNOSIS,
    DIFF,
    MEMORY,
    STEPS,
    Format,
    RenderOptions,
)

if TYPE_CHECKING:
    from wallfinder.diagnosis import (
        Calculation,
        CounterReport,
        Diagnosis,
        DiagnosisDiff,
        MemoryReport,
        Steps,
    )

JSON = Format("json", rank=1)


@JSON.renders(DIAGNOSIS)
def _diagnosis(d: Diagnosis, options: RenderOptions) -> str:
    return d.to_json() + "\n"


@JSON.renders(DIFF)
def _diff(x: DiagnosisDiff, options: RenderOptions) -> str:
    return x.to_json() + "\n"


@JSON.renders(MEMORY)
def _memory(r: MemoryReport, options: RenderOptions) -> str:
    return r.to_json() + "\n"


@JSON.renders(COUNTERS)
def _counters(r: CounterReport, options: RenderOptions) -> str:
    return r.to_json() + "\n"


@JSON.renders(STEPS)
def _steps(s: Steps, options: RenderOptions) -> str:
    return s.to_json() + "\n"


@JSON.renders(CALCULATION)
def _calculation(c: Calculation, options: RenderOptions) -> str:
    return c.to_json() + "\n"
