"""Bounds a diagnosis must keep (`wallfinder check`, a CI gate): pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, fields

from wallfinder.analysis.diff import device_key
from wallfinder.diagnosis import DeviceMemoryProfile, Diagnosis
from wallfinder.errors import WallfinderError
from wallfinder.units import pct, size

__all__ = ["BoundCheck", "Bounds", "baseline_warning", "check"]


@dataclass(frozen=True)
class Bounds:
    """The bounds to check; None leaves one out. `max_step_ms` is in milliseconds (the median
    steady-state step); `min_mfu`, `max_idle`, `max_exposed_comm` and `max_regression` are
    fractions: of peak, of the step, and the median step's growth over a baseline's.

    The memory bounds are about the analysed device's memory profile (the trace's `[memory]`
    events): `max_peak_memory` caps its peak of allocated bytes, `max_peak_memory_share` that
    peak as a fraction of the device's capacity, and `no_memory_leak` (True) asks that
    allocated memory does not grow step over step (False or None leaves it out)."""

    max_step_ms: float | None = None
    min_mfu: float | None = None
    max_idle: float | None = None
    max_exposed_comm: float | None = None
    max_regression: float | None = None
    max_peak_memory: int | None = None
    max_peak_memory_share: float | None = None
    no_memory_leak: bool | None = None

    def __post_init__(self) -> None:
        # A share above 1 always holds (idle ≤ 150%) or never does (MFU ≥ 150%): a gate that
        # says nothing, so it is refused, as a negative bound is.
        for name in ("min_mfu", "max_idle", "max_exposed_comm", "max_peak_memory_share"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise WallfinderError(f"{name} must be a share from 0 to 1: {value!r}")
        for name in ("max_step_ms", "max_regression", "max_peak_memory"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise WallfinderError(f"{name} must be ≥ 0: {value!r}")

    def given(self) -> list[str]:
        """The names of the bounds that are set."""
        # `is`, not `in (None, False)`: a bound of 0.0 equals False and is set.
        return [
            f.name
            for f in fields(self)
            if getattr(self, f.name) is not None and getattr(self, f.name) is not False
        ]


@dataclass(frozen=True)
class BoundCheck:
    """One bound: its flag, whether it holds, and one line with the measured value."""

    flag: str
    held: bool
    line: str


def check(d: Diagnosis, bounds: Bounds, baseline: Diagnosis | None = None) -> list[BoundCheck]:
    """Each given bound checked against `d` (and `baseline` for `max_regression`), in the
    order of `Bounds`' fields. A bound whose figure is unknown (MFU without a device's peak,
    memory without a memory profile) does not hold: a gate that cannot measure must not pass
    silently."""
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
    out += _memory(d, bounds)
    return out


def baseline_warning(d: Diagnosis, baseline: Diagnosis | None) -> str | None:
    """One line when `baseline` ran on other hardware than `d` (a regression bound then
    measures the change of device as much as the change of code), else None."""
    if baseline is None or device_key(baseline) == device_key(d):
        return None
    return (
        f"the baseline ran on {baseline.device.name or 'an unknown device'} and this run on "
        f"{d.device.name or 'an unknown device'}: the step times compare different hardware"
    )


_NO_PROFILE = "no memory profile ([memory] events: profile with profile_memory=True)"


def _memory(d: Diagnosis, bounds: Bounds) -> list[BoundCheck]:
    """The memory bounds, on the analysed device (the memory profile's first)."""
    m = d.main_memory
    out: list[BoundCheck] = []
    if bounds.max_peak_memory is not None:
        flag, limit = "--max-peak-memory", bounds.max_peak_memory
        if m is None:
            line = f"{_NO_PROFILE} — cannot check {flag} {size(limit)}"
            out.append(BoundCheck(flag=flag, held=False, line=line))
        else:
            what = f"peak allocated memory {size(m.peak_allocated)} on {m.device}"
            out.append(_line(flag, m.peak_allocated <= limit, what, size(limit)))
    if bounds.max_peak_memory_share is not None:
        flag, share = "--max-peak-memory-share", bounds.max_peak_memory_share
        if m is None or not m.capacity:
            why = _NO_PROFILE if m is None else f"capacity of {m.device} unknown"
            line = f"{why} — cannot check {flag} {_pct(share)}"
            out.append(BoundCheck(flag=flag, held=False, line=line))
        else:
            used = m.peak_allocated / m.capacity
            what = (
                f"peak allocated memory {_pct(used)} of {m.device}'s {size(m.capacity)} "
                f"({size(m.peak_allocated)})"
            )
            out.append(_line(flag, used <= share, what, _pct(share)))
    if bounds.no_memory_leak:
        out.append(_leak(m))
    return out


def _leak(m: DeviceMemoryProfile | None) -> BoundCheck:
    flag = "--no-memory-leak"
    if m is None or m.growth_per_step is None:
        why = _NO_PROFILE if m is None else "too few steady-state steps to measure growth"
        return BoundCheck(flag=flag, held=False, line=f"{why} — cannot check {flag}")
    growth = f"allocated memory grows {size(m.growth_per_step)} per step on {m.device}"
    if m.leak:
        return BoundCheck(flag=flag, held=False, line=f"{growth}: a leak, against {flag}")
    return BoundCheck(flag=flag, held=True, line=f"{growth}: no leak, as {flag} asks")


def _line(flag: str, held: bool, what: str, limit: str) -> BoundCheck:
    return BoundCheck(flag=flag, held=held, line=f"{what} {'≤' if held else '>'} {flag} {limit}")


def _pct(x: float) -> str:
    return pct(x).replace(".0%", "%")
