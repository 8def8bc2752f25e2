"""Bounds a diagnosis must keep (`wallfinder check`, a CI gate): pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, fields

from wallfinder.diagnosis import Diagnosis
from wallfinder.errors import WallfinderError

__all__ = ["BoundCheck", "Bounds", "check"]


@dataclass(frozen=True)
class Bounds:
    """The bounds to check; None leaves one out. `max_step_ms` is in milliseconds (the median
    steady-state step); the others are fractions: `min_mfu` of peak, `max_idle` and
    `max_exposed_comm` of the step, `max_regression` the median step's growth over a
    baseline's."""

    max_step_ms: float | None = None
    min_mfu: float | None = None
    max_idle: float | None = None
    max_exposed_comm: float | None = None
    max_regression: float | None = None

    def given(self) -> list[str]:
        """The names of the bounds that are set."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]


@dataclass(frozen=True)
class BoundCheck:
    """One bound: its flag, whether it holds, and one line with the measured value."""

    flag: str
    held: bool
    line: str


def check(d: Diagnosis, bounds: Bounds, baseline: Diagnosis | None = None) -> list[BoundCheck]:
    """Each given bound checked against `d` (and `baseline` for `max_regression`), in the
    order of `Bounds`' fields. A bound whose figure is unknown (MFU without a device's peak)
    does not hold: a gate that cannot measure must not pass silently."""
    out: list[BoundCheck] = []
    step_ms = d.steps.median_s * 1e3
    if bounds.max_step_ms is not None:
        limit = bounds.max_step_ms
        held = step_ms <= limit
        out.append(_line("--max-step-ms", held, f"step time {step_ms:.2f} ms", f"{limit:g}"))
    if bounds.min_mfu is not None:
        flag, limit = "--min-mfu", bounds.min_mfu
        if d.mfu.value is None:
            line = f"MFU unknown ({d.mfu.basis}) — cannot check {flag} {_pct(limit)}"
            out.append(BoundCheck(flag=flag, held=False, line=line))
        else:
            held = d.mfu.value >= limit
            sign = "≥" if held else "<"
            line = f"MFU {_pct(d.mfu.value)} {sign} {flag} {_pct(limit)}"
            out.append(BoundCheck(flag=flag, held=held, line=line))
    if bounds.max_idle is not None:
        idle = d.breakdown.idle
        what = f"idle {_pct(idle)} of the step"
        out.append(_line("--max-idle", idle <= bounds.max_idle, what, _pct(bounds.max_idle)))
    if bounds.max_exposed_comm is not None:
        comm, limit = d.breakdown.comm_exposed, bounds.max_exposed_comm
        what = f"exposed communication {_pct(comm)} of the step"
        out.append(_line("--max-exposed-comm", comm <= limit, what, _pct(limit)))
    if bounds.max_regression is not None:
        if baseline is None:
            raise WallfinderError("--max-regression needs a --baseline to compare with")
        was = baseline.steps.median_s
        growth = step_ms / 1e3 / was - 1 if was > 0 else 0.0
        verb = "grew" if growth >= 0 else "shrank"
        what = (
            f"step time {verb} {_pct(abs(growth))} over the baseline "
            f"({was * 1e3:.2f} → {step_ms:.2f} ms)"
        )
        limit_text = _pct(bounds.max_regression)
        out.append(_line("--max-regression", growth <= bounds.max_regression, what, limit_text))
    return out


def _line(flag: str, held: bool, what: str, limit: str) -> BoundCheck:
    return BoundCheck(flag=flag, held=held, line=f"{what} {'≤' if held else '>'} {flag} {limit}")


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%".replace(".0%", "%")
