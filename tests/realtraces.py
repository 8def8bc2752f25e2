"""Where the tests find the real profiler traces (see MANIFEST.md in that folder).

They are data from other projects, never part of the repository: `../shared/traces` beside
the clone, or the folder named by the WALLFINDER_TRACES environment variable. A test that needs
one skips with a reason that starts with `MISSING` when it is absent; conftest.py counts those
skips, says once how many there were and why, and fails the run when WALLFINDER_REQUIRE_TRACES
is set (CI sets it: there, a skipped real-trace test is a test that did not run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "WALLFINDER_TRACES"
REQUIRE_ENV = "WALLFINDER_REQUIRE_TRACES"
MISSING = "real traces not found"


def traces_dir() -> Path:
    """The folder of real traces: $WALLFINDER_TRACES, else ../shared/traces from the root."""
    given = os.environ.get(ENV)
    if given:
        return Path(given).expanduser().resolve()
    return Path(__file__).resolve().parents[1].parent / "shared" / "traces"


TRACES = traces_dir()


def missing_reason(relative: str = "") -> str:
    """Why a real-trace test is skipped: the folder is absent (one reason for all, which
    pytest's summary shows once), or one file in it is."""
    where = TRACES / relative if relative and TRACES.is_dir() else TRACES
    return f"{MISSING} at {where} (set {ENV} to the folder of shared/traces)"


def real_trace_params(pattern: str = "*.json.gz") -> list[object]:
    """Every real trace matching `pattern`, as pytest parameters named by their relative path;
    one skipped parameter when there are none."""
    files = sorted(TRACES.rglob(pattern)) if TRACES.is_dir() else []
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason=missing_reason()), id="none")]
    return [pytest.param(f, id=str(f.relative_to(TRACES))) for f in files]


def real_files(*patterns: str) -> list[Path]:
    """Every real file matching any of `patterns`, sorted (none when the folder is absent)."""
    if not TRACES.is_dir():
        return []
    return sorted({f for pattern in patterns for f in TRACES.rglob(pattern) if f.is_file()})


def real_trace(relative: str) -> Path:
    """The real trace at `relative` in the folder; the test is skipped when it is absent."""
    path = TRACES / relative
    if not path.exists():
        pytest.skip(missing_reason(relative))
    return path
