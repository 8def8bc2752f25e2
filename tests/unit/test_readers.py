"""The reader registry: a file is read by the reader that recognises its first bytes, whatever
its name; a new format is one registered `Reader`, and what the analysis and the API ask of a
format (steps marked by ProfilerStep, a timeline Perfetto opens) comes from its reader."""

from __future__ import annotations

import dataclasses
import gzip
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsysgen import training_export
from tracegen import TraceBuilder, training_trace
from wallfinder import WallfinderError
from wallfinder.analysis import diagnose
from wallfinder.api import analyze_marked
from wallfinder.trace import Trace, load_trace, load_traces, readers
from wallfinder.trace.readers import Load, Reader, reader_for, reader_named, register

FAKE_MAGIC = b"#fake-trace\n"


@pytest.fixture
def fake_format(tmp_path: Path) -> Iterator[Path]:
    """A format of its own, registered for the test: a file that starts with FAKE_MAGIC and
    names a Kineto trace (with no ProfilerStep markers) read as that format."""
    b = TraceBuilder()
    for i in range(3):
        b.kernel("ampere_sgemm_128x64_nn", i * 1000.0 + 10.0, 900.0, launch_at=i * 1000.0 + 2.0)
    kineto = b.write(tmp_path / "inner.json")

    def read(path: Path, load: Load) -> list[Trace]:
        inner = Path(path.read_bytes()[len(FAKE_MAGIC) :].decode())
        return [dataclasses.replace(load_trace(inner), source=path.name, format="fake")]

    register(
        Reader(
            name="fake",
            title="a fake capture",
            recognises=lambda path, head: head.startswith(FAKE_MAGIC),
            read=read,
        )
    )
    path = tmp_path / "run.trace"
    path.write_bytes(FAKE_MAGIC + str(kineto).encode())
    try:
        yield path
    finally:
        del readers._READERS["fake"]
        readers._readers.cache_clear()


def test_a_file_is_read_by_the_reader_that_recognises_its_first_bytes(tmp_path: Path) -> None:
    export = training_export(3).write(tmp_path / "named-like-kineto.json")
    assert reader_for(export).name == "nsys"
    gz = tmp_path / "no-suffix"
    gz.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    assert reader_for(gz).name == "kineto"
    assert reader_for(tmp_path / "run.nsys-rep").name == "nsys"  # a report, by its name
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x00\x01 not a trace")
    # No reader recognises it: the fallback reader says why it is not a trace.
    assert reader_for(garbage).fallback
    with pytest.raises(WallfinderError, match="not JSON"):
        load_trace(garbage)


def test_what_a_format_records_comes_from_its_reader(tmp_path: Path) -> None:
    (nsys,) = load_traces(training_export(3).write(tmp_path / "run.sqlite"))
    kineto = load_trace(training_trace(3).write(tmp_path / "t.json"))
    assert (nsys.reader.name, kineto.reader.name) == ("nsys", "kineto")
    assert kineto.reader.profiler_steps
    assert kineto.reader.trace_events
    assert not nsys.reader.profiler_steps
    assert not nsys.reader.trace_events
    assert reader_named("no such format") is None


def test_a_new_format_is_one_registered_reader(fake_format: Path) -> None:
    (trace,) = load_traces(fake_format)
    assert trace.format == "fake"
    assert trace.reader.title == "a fake capture"
    d = diagnose(trace)
    assert d.trace_format == "fake"
    # Its writer has no ProfilerStep to ask for: the advice to add them is Kineto's alone.
    assert not any("use torch.profiler's schedule" in w for w in d.warnings)
    kineto = diagnose(load_trace(fake_format.parent / "inner.json"))
    assert any("use torch.profiler's schedule" in w for w in kineto.warnings)
    # Its file is no trace-event timeline: nothing to annotate, and it is said by its title.
    with pytest.raises(WallfinderError, match="not from a fake capture"):
        analyze_marked(fake_format)
