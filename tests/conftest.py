"""Shared fixtures: the synthetic trace builder, and hypothesis settings for the suite."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from tracegen import TraceBuilder

# No example database, and hypothesis's caches in the temporary folder: the tests write
# nothing into the repository.
set_hypothesis_home_dir(str(Path(tempfile.gettempdir()) / "wallfinder-tests-hypothesis"))
settings.register_profile("wallfinder", database=None, deadline=None)
settings.load_profile("wallfinder")


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
