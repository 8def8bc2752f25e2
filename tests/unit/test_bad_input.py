"""Input a user can get wrong: every case raises `WallfinderError` with one line from the
library, and the CLI turns it into exit code 2 and one line on stderr (a traceback only with
`--debug`)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

import wallfinder.trace._reader as reader_module
from tracegen import TraceBuilder, training_trace
from wallfinder import WallfinderError, analyze
from wallfinder.cli import main
from wallfinder.trace import load_trace


def valid_text() -> bytes:
    return training_trace(3).to_bytes()


def without(key: str) -> bytes:
    b = TraceBuilder()
    b.step(1, 0.0, 100.0)
    b.cpu_op("aten::mm", 10.0, 20.0)
    doc = json.loads(b.to_bytes())
    del doc["traceEvents"][1][key]  # the aten::mm X event
    return json.dumps(doc).encode()


def mixed_units() -> bytes:
    """Host times in µs, device times in ns (1000x): a writer that mixed units."""
    b = training_trace(3)
    for event in b.events:
        if event["cat"] == "kernel":
            event["ts"] = (b.base_us + event["ts"]) * 1000.0 - b.base_us
    return b.to_bytes()


def only_metadata() -> bytes:
    doc = json.loads(TraceBuilder().to_bytes())
    assert {e["ph"] for e in doc["traceEvents"]} == {"M"}
    return json.dumps(doc).encode()


def truncated_gzip() -> bytes:
    data = gzip.compress(valid_text())
    return data[: len(data) // 2]


def raw_file(path: Path, data: bytes) -> Path:
    """Write `data` as is (a `.gz` name does not compress it again)."""
    path.write_bytes(data)
    return path


def profiler_span_only() -> bytes:
    """What a profiler writes when it was stopped before the job ran anything: its own
    `Trace` span, a metadata event and its instants."""
    events = [
        {
            "ph": "X",
            "cat": "Trace",
            "name": "PyTorch Profiler (0)",
            "pid": 1,
            "tid": 1,
            "ts": 100.0,
            "dur": 1000.0,
        },
        {"ph": "M", "name": "process_sort_index", "pid": 1, "args": {"sort_index": 1}},
        {
            "ph": "i",
            "s": "g",
            "name": "Iteration Start: PyTorch Profiler",
            "pid": 1,
            "tid": 1,
            "ts": 100.0,
        },
        {"ph": "i", "s": "g", "name": "Record Window End", "pid": 1, "tid": 1, "ts": 1100.0},
    ]
    return json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()


def test_a_trace_that_recorded_no_activity_says_so(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "t.json", profiler_span_only())
    with pytest.raises(WallfinderError, match="recorded no activity"):
        analyze(path)


# name: (file name, the file's bytes)
CASES: dict[str, tuple[str, Callable[[], bytes]]] = {
    "empty-file": ("t.json", lambda: b""),
    "whitespace-only": ("t.json", lambda: b"  \n\t "),
    "not-json": ("t.json", lambda: b"hello"),
    "binary-garbage": ("t.json", lambda: bytes(range(256))),
    "truncated-gzip": ("t.json.gz", truncated_gzip),
    "corrupt-gzip": ("t.json.gz", lambda: b"\x1f\x8b\x08\x00" + b"\x00" * 40),
    "gzip-of-not-json": ("t.json.gz", lambda: gzip.compress(b"hello")),
    "truncated-json": ("t.json", lambda: valid_text()[: len(valid_text()) // 2]),
    "truncated-json-in-header": ("t.json", lambda: valid_text()[:30]),
    "truncated-after-array": (
        "t.json",
        lambda: valid_text()[: valid_text().rindex(b"]") + 1],
    ),
    "object-not-a-trace": ("t.json", lambda: b'{"a": 1}'),
    "array-of-numbers": ("t.json", lambda: b"[1, 2]"),
    "json-string": ("t.json", lambda: b'"traceEvents"'),
    "trace-events-empty": ("t.json", lambda: b'{"schemaVersion": 1, "traceEvents": []}'),
    "trace-events-absent": ("t.json", lambda: b'{"schemaVersion": 1, "deviceProperties": []}'),
    "trace-events-not-a-list": ("t.json", lambda: b'{"traceEvents": {"ph": "X"}}'),
    "event-with-wrong-types": (
        "t.json",
        lambda: b'{"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": 1}]}',
    ),
    "x-event-without-ts": ("t.json", lambda: without("ts")),
    "x-event-without-dur": ("t.json", lambda: without("dur")),
    "only-metadata": ("t.json", only_metadata),
    "only-the-profilers-own-span": ("t.json", profiler_span_only),
    "mixed-time-units": ("t.json", mixed_units),
}


@pytest.fixture(params=sorted(CASES))
def bad_trace(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    name, make = CASES[request.param]
    return raw_file(tmp_path / name, make())


def assert_one_line(exc: WallfinderError) -> None:
    message = str(exc)
    assert message.strip()
    assert "\n" not in message
    assert "Traceback" not in message


def test_load_trace_raises_a_one_line_error(bad_trace: Path) -> None:
    with pytest.raises(WallfinderError) as info:
        load_trace(bad_trace)
    assert_one_line(info.value)


def test_analyze_raises_a_one_line_error(bad_trace: Path) -> None:
    with pytest.raises(WallfinderError) as info:
        analyze(bad_trace)
    assert_one_line(info.value)


def test_cli_exits_2_with_one_error_line_and_no_traceback(
    bad_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(bad_trace)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("wallfinder: error: ")
    assert "Traceback" not in err
    assert 'File "' not in err


def test_cli_debug_flag_shows_the_traceback(
    bad_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--debug", "analyze", str(bad_trace)]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "WallfinderError" in err
    assert err.splitlines()[-1].startswith("wallfinder: error: ")


# Specific messages ------------------------------------------------------------------------------


def message_of(path: Path) -> str:
    with pytest.raises(WallfinderError) as info:
        load_trace(path)
    return str(info.value)


def test_missing_file_is_named_in_the_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json.gz"
    assert "no such file" in message_of(missing)
    with pytest.raises(WallfinderError, match="no such file"):
        analyze(missing)


def test_missing_file_via_cli_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("wallfinder: error: ")
    assert "no such file" in err


def test_folder_without_traces_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "readme.txt").write_text("no traces here")
    with pytest.raises(WallfinderError, match="no trace files"):
        analyze(tmp_path)
    with pytest.raises(WallfinderError, match="folder"):
        load_trace(tmp_path)
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no trace files" in err


def test_folder_where_every_rank_is_corrupt_is_an_error(tmp_path: Path) -> None:
    raw_file(tmp_path / "rank-0.json", b"hello")
    raw_file(tmp_path / "rank-1.json.gz", truncated_gzip())
    with pytest.raises(WallfinderError, match="no rank trace could be analysed") as info:
        analyze(tmp_path)
    assert_one_line(info.value)


def test_empty_file_says_it_is_empty(tmp_path: Path) -> None:
    assert "empty" in message_of(raw_file(tmp_path / "t.json", b""))


def test_truncated_gzip_says_the_download_is_incomplete(tmp_path: Path) -> None:
    message = message_of(raw_file(tmp_path / "t.json.gz", truncated_gzip()))
    assert "truncated" in message or "ends early" in message


def test_truncated_json_says_it_ends_early(tmp_path: Path) -> None:
    text = valid_text()
    assert "ends early" in message_of(raw_file(tmp_path / "t.json", text[: len(text) // 2]))


def test_not_a_trace_names_what_the_json_has(tmp_path: Path) -> None:
    message = message_of(raw_file(tmp_path / "t.json", b'{"a": 1}'))
    assert "traceEvents" in message
    assert "a" in message


def test_missing_ts_names_the_event(tmp_path: Path) -> None:
    message = message_of(raw_file(tmp_path / "t.json", without("ts")))
    assert "aten::mm" in message
    assert "'ts'" in message


def test_mixed_time_units_are_refused_with_the_factor(tmp_path: Path) -> None:
    message = message_of(raw_file(tmp_path / "t.json", mixed_units()))
    assert "mixed time units" in message


def test_error_message_stays_one_line_when_a_key_has_a_newline(tmp_path: Path) -> None:
    with pytest.raises(WallfinderError) as info:
        load_trace(raw_file(tmp_path / "t.json", b'{"trace\\nEvents": []}'))
    assert_one_line(info.value)


def test_corrupt_gzip_is_a_one_line_error_with_stdlib_gzip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_module, "_fast_gzip", None)
    path = raw_file(tmp_path / "t.json.gz", b"\x1f\x8b\x08\x00" + b"\x00" * 40)
    assert "gzip" in message_of(path)


def test_truncated_json_error_names_the_file(tmp_path: Path) -> None:
    text = valid_text()
    message = message_of(raw_file(tmp_path / "run.json", text[: len(text) // 2]))
    assert message.startswith("run.json: ")


@pytest.mark.parametrize("workers", ["-3", "0"])
def test_workers_below_one_are_refused_in_one_line(
    tmp_path: Path, workers: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--workers -3` ran as if it were not given; for a folder it broke in the process pool."""
    trace = raw_file(tmp_path / "t.json", valid_text())
    folder = tmp_path / "job"
    folder.mkdir()
    for rank in range(2):
        raw_file(folder / f"rank{rank}.json", valid_text())
    for path in (trace, folder):
        assert main(["analyze", str(path), "--workers", workers]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert (
            err == f"wallfinder: error: workers must be a number of processes ≥ 1, not {workers}\n"
        )
    with pytest.raises(WallfinderError, match="≥ 1, not -3"):
        load_trace(trace, workers=-3)
    with pytest.raises(WallfinderError, match="≥ 1, not 0"):
        analyze(folder, workers=0)
