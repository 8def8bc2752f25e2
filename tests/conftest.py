"""Shared fixtures: the synthetic trace builder, hypothesis settings for the suite, and the
account of real-trace tests skipped for want of the traces (see realtraces.py)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from realtraces import ENV, MISSING, REQUIRE_ENV, TRACES
from tracegen import TraceBuilder

# No example database, and hypothesis's caches in the temporary folder: the tests write
# nothing into the repository.
set_hypothesis_home_dir(str(Path(tempfile.gettempdir()) / "wallfinder-tests-hypothesis"))
settings.register_profile("wallfinder", database=None, deadline=None)
settings.load_profile("wallfinder")


@pytest.fixture(autouse=True, scope="session")
def _cache_in_temp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """wallfinder's cache folder (parsed traces, nsys exports) in the session's temporary
    folder, for every test and the processes they start: the tests write nothing into the
    user's cache. Tests of the cache set their own."""
    before = os.environ.get("WALLFINDER_CACHE")
    os.environ["WALLFINDER_CACHE"] = str(tmp_path_factory.mktemp("wallfinder-cache"))
    yield
    if before is None:
        del os.environ["WALLFINDER_CACHE"]
    else:
        os.environ["WALLFINDER_CACHE"] = before


@pytest.fixture
def builder() -> TraceBuilder:
    """An empty trace builder for one rank on an H100."""
    return TraceBuilder()


@pytest.fixture
def write_trace(tmp_path: Path) -> Callable[..., Path]:
    """Write a builder's trace into the test's temporary folder under `name`."""

    def write(b: TraceBuilder, name: str = "trace.json", **options: object) -> Path:
        return b.write(tmp_path / name, **options)

    return write


# Real traces: one line saying how many of their tests were skipped and why, and a failed run
# where they are required (CI) -------------------------------------------------------------------


_skips: list[str] = []
"""The node ids of the tests skipped for want of the real traces, in this session."""


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr or "")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and MISSING in _skip_reason(report):
        _skips.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skips and os.environ.get(REQUIRE_ENV) and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    """The account comes last, under pytest's own count, where nobody misses it."""
    terminalreporter = config.pluginmanager.get_plugin("terminalreporter")
    if not _skips or terminalreporter is None:
        return
    line = (
        f"{len(_skips)} real-trace tests skipped: {MISSING} at {TRACES} "
        f"(set {ENV} to the folder of shared/traces)"
    )
    if os.environ.get(REQUIRE_ENV):
        terminalreporter.write_line(f"FAILED: {line}, and {REQUIRE_ENV} requires them", red=True)
    else:
        terminalreporter.write_line(line, yellow=True)
