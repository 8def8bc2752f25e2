"""Giving freed memory back: on glibc `malloc_trim` is called; where it is missing (macOS,
Windows, musl) nothing is, and a large parse gives the same table either way."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

import wallfinder.trace.readers.kineto as trace_package
from tracegen import decoded_columns, training_trace
from wallfinder.trace import Events, _columns, _heap, _reader, load_trace


def test_glibc_trims_and_elsewhere_nothing_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(_heap, "_trim", lambda: calls.append)
    assert _heap.release_free_memory() is True
    assert calls == [0]
    monkeypatch.setattr(_heap, "_trim", lambda: None)
    assert _heap.release_free_memory() is False


def test_the_trim_is_found_on_linux_and_not_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    _heap._trim.cache_clear()
    monkeypatch.setattr(sys, "platform", "darwin")
    assert _heap._trim() is None
    _heap._trim.cache_clear()
    monkeypatch.undo()
    found: Callable[[int], int] | None = _heap._trim()
    if sys.platform.startswith("linux"):
        assert found is not None
    _heap._trim.cache_clear()


def test_a_table_is_the_same_with_and_without_trims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = training_trace(6).write(tmp_path / "t.json")
    monkeypatch.setattr(_reader, "BLOCK", 1 << 14)  # several chunks, stacked
    trims: list[str] = []

    def trim(where: str) -> Callable[[], bool]:
        def call() -> bool:
            trims.append(where)
            return True

        return call

    monkeypatch.setattr(_columns, "release_free_memory", trim("table"))
    monkeypatch.setattr(trace_package, "release_free_memory", trim("parse"))
    trimmed = load_trace(path, cache=False, workers=1)
    # Before the table is stacked, after each column stacked but the first two, after the parse.
    assert trims.count("table") == 1 + len(fields(Events)) - 2
    assert trims.count("parse") == 1
    monkeypatch.setattr(_columns, "release_free_memory", lambda: False)  # not glibc
    monkeypatch.setattr(trace_package, "release_free_memory", lambda: False)
    untrimmed = load_trace(path, cache=False, workers=1)
    assert decoded_columns(trimmed) == decoded_columns(untrimmed)
    assert np.array_equal(trimmed.events.ts, untrimmed.events.ts)
