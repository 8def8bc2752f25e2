"""The cache of parsed traces: a second load of an unchanged file reads the cache and gives
the same trace and the same report; a changed file, another parser, a damaged or truncated
entry are never used (rebuilt instead); `--no-cache` neither reads nor writes it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wallfinder.trace.readers.kineto as trace_module
from realtraces import real_trace
from tracegen import decoded_columns, training_trace
from wallfinder import Options, analyze
from wallfinder.cli import main
from wallfinder.trace import Trace, _cache, load_trace
from wallfinder.trace.model import MEMORY_COLUMNS


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of the test's own, with every trace large enough to be cached."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("WALLFINDER_CACHE", str(folder))
    monkeypatch.setattr(_cache, "FROM_BYTES", 0)
    return folder / "parsed"


class Calls:
    """Counts the calls of `module.name`, which it wraps for the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> None:
        self.count = 0
        function = getattr(module, name)

        def counted(*args: Any) -> Any:
            self.count += 1
            return function(*args)

        monkeypatch.setattr(module, name, counted)


Parses = Calls
"""The parses `load_trace` does (reads of the cache are not parses)."""


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Parses:
    return Calls(monkeypatch, trace_module, "_assemble")


def a_trace(tmp_path: Path, name: str = "trace.json") -> Path:
    b = training_trace(4)
    b.memory(50.0, 0x1000, 4096, 4096, 1 << 20)
    b.memory(60.0, 0x1000, -4096, 0, 1 << 20)
    b.nccl(200.0, 40.0)
    return b.write(tmp_path / name)


def same(a: Trace, b: Trace) -> None:
    assert decoded_columns(a) == decoded_columns(b)
    for column in MEMORY_COLUMNS:
        assert np.array_equal(getattr(a.memory, column), getattr(b.memory, column))
    for attribute in (
        "source",
        "origin_us",
        "device_properties",
        "distributed",
        "base_time_ns",
        "process_labels",
        "warnings",
        "cut_step",
    ):
        assert getattr(a, attribute) == getattr(b, attribute), attribute


def test_the_second_load_reads_the_cache(tmp_path: Path, cache: Path, parses: Parses) -> None:
    path = a_trace(tmp_path)
    first = load_trace(path, cache=True)
    assert len(list(cache.iterdir())) == 1
    second = load_trace(path, cache=True)
    assert parses.count == 1
    same(first, second)
    assert len(second.memory) == 2
    second.events.dur[0] += 1  # columns are the trace's own to change: copy on write
    assert load_trace(path, cache=True).events.dur[0] == first.events.dur[0]


def test_a_report_from_the_cache_is_the_same(tmp_path: Path, cache: Path) -> None:
    path = a_trace(tmp_path)
    parsed = analyze(path).to_json()
    assert analyze(path, Options(cache=True)).to_json() == parsed  # writes
    assert analyze(path, Options(cache=True)).to_json() == parsed  # reads
    assert len(list(cache.iterdir())) == 1


def test_a_real_trace_round_trips(tmp_path: Path, cache: Path, parses: Parses) -> None:
    path = real_trace("hta/a100_nccl_data.json.gz")
    first = load_trace(path, cache=True)
    same(first, load_trace(path, cache=True))
    assert parses.count == 1


def test_a_copy_under_another_name_is_named_as_itself(tmp_path: Path, cache: Path) -> None:
    path = a_trace(tmp_path)
    load_trace(path, cache=True)
    copy = tmp_path / "renamed.json"
    copy.write_bytes(path.read_bytes())
    os.utime(copy, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    assert load_trace(copy, cache=True).source == "renamed.json"


def test_a_changed_file_is_parsed_again(tmp_path: Path, cache: Path, parses: Parses) -> None:
    path = a_trace(tmp_path)
    load_trace(path, cache=True)
    training_trace(5).write(path)  # rewritten in place
    assert load_trace(path, cache=True).events.kind.size == load_trace(path).events.kind.size
    assert parses.count == 3
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # touched
    load_trace(path, cache=True)
    assert parses.count == 4


def test_another_parser_never_reads_the_entry(
    tmp_path: Path, cache: Path, parses: Parses, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = a_trace(tmp_path)
    load_trace(path, cache=True)
    monkeypatch.setattr(_cache, "parser_id", lambda: "another-parser")
    load_trace(path, cache=True)
    assert parses.count == 2


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # truncated
        lambda data: b"",  # empty
        lambda data: data[:30] + b"\xff" * 40 + data[70:],  # a garbled header
        lambda data: b"not a cache entry" + data,
    ],
    ids=["truncated", "empty", "garbled-header", "foreign"],
)
def test_a_damaged_entry_is_rebuilt_not_used(
    tmp_path: Path, cache: Path, parses: Parses, damage: object
) -> None:
    path = a_trace(tmp_path)
    first = load_trace(path, cache=True)
    (entry,) = cache.iterdir()
    entry.write_bytes(damage(entry.read_bytes()))  # type: ignore[operator]
    same(first, load_trace(path, cache=True))
    assert parses.count == 2
    same(first, load_trace(path, cache=True))  # the rebuilt entry is read
    assert parses.count == 2


def test_small_traces_are_not_cached(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_cache, "FROM_BYTES", 1 << 30)
    load_trace(a_trace(tmp_path), cache=True)
    assert not cache.exists()


def test_an_unwritable_cache_leaves_the_analysis_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("WALLFINDER_CACHE", str(blocker))  # a file: no folder can be made in it
    monkeypatch.setattr(_cache, "FROM_BYTES", 0)
    path = a_trace(tmp_path)
    assert len(load_trace(path, cache=True).events.kind) == len(load_trace(path).events.kind)


def test_the_cli_caches_unless_told_not_to(
    tmp_path: Path, cache: Path, parses: Parses, capsys: pytest.CaptureFixture[str]
) -> None:
    path = a_trace(tmp_path)
    assert main(["analyze", str(path), "--format", "json", "--no-cache"]) == 0
    assert not cache.exists()
    assert main(["analyze", str(path), "--format", "json"]) == 0
    assert main(["diff", str(path), str(path), "--format", "json"]) == 0
    assert main(["analyze", str(path), "--format", "json", "--no-cache"]) == 0
    assert parses.count == 3  # the first, the cached one's, and the last
    outputs = capsys.readouterr().out
    assert outputs.count('"schema"') == 4


def test_the_entries_used_longest_ago_are_evicted(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = [a_trace(tmp_path, f"t{i}.json") for i in range(3)]
    for i, path in enumerate(paths):  # distinct files with entries of one size
        training_trace(4, loader_us=100.0 + i).write(path)
        load_trace(path, cache=True)
    entries = sorted(cache.iterdir(), key=lambda e: e.stat().st_mtime_ns)
    for age, entry in enumerate(entries):  # the first written is the oldest
        os.utime(entry, ns=(age * 10**9, age * 10**9))
    load_trace(paths[0], cache=True)  # read: now the most recently used
    size = entries[0].stat().st_size
    monkeypatch.setattr(_cache, "LIMIT_BYTES", 2 * size + size // 2)
    fourth = training_trace(4, loader_us=200.0).write(tmp_path / "t3.json")
    load_trace(fourth, cache=True)
    left = {e.name for e in cache.iterdir()}
    assert len(left) == 2
    assert entries[0].name in left  # used last, kept
    assert entries[1].name not in left
    assert entries[2].name not in left
