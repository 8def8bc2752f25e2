"""`analyze --annotate FILE`: a companion trace of wallfinder's marks that Perfetto and
chrome://tracing open beside the trace, in its clock, carrying none of its arguments."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from test_report_and_cli import run_cli

from realtraces import real_trace
from tracegen import TraceBuilder, phased_training_trace, training_trace
from wallfinder.api import analyze_marked

SECRET = "hf_SECRETTOKEN123"
PHASES = ("ts", "dur", "pid", "tid", "name", "ph")


def read_events(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    doc = json.loads(data)
    assert isinstance(doc["traceEvents"], list)
    return list(doc["traceEvents"])


def annotated(
    b: TraceBuilder, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str = "m.json"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """The trace's events, the companion's, and what the CLI said on stderr."""
    trace = b.write(tmp_path / "t.json")
    out = tmp_path / name
    code, _, err = run_cli(["analyze", str(trace), "--annotate", str(out)], capsys)
    assert code == 0
    return read_events(trace), read_events(out), err


def tracks(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The companion's marks by track name."""
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names.values()}
    for e in events:
        if e["ph"] != "M":
            out[names[e["tid"]]].append(e)
    return out


def test_the_companion_is_valid_trace_event_json_on_a_process_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original, events, err = annotated(training_trace(5), tmp_path, capsys, "m.json.gz")
    marks = [e for e in events if e["ph"] != "M"]
    assert err.startswith(f"wallfinder: wrote {len(marks)} marks to ")
    for e in events:
        assert e["ph"] in ("M", "X", "i")
        if e["ph"] == "X":
            assert isinstance(e["ts"], float | int)
            assert e["dur"] > 0
    pids = {e["pid"] for e in events}
    assert len(pids) == 1
    assert pids.isdisjoint(e.get("pid") for e in original)
    process = [e for e in events if e["name"] == "process_name"]
    assert [p["args"]["name"] for p in process] == ["wallfinder"]


def test_the_steps_and_the_steady_state_are_marked_in_the_traces_clock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original, events, _ = annotated(training_trace(5), tmp_path, capsys)
    steps = tracks(events)["steps"]
    profiler = sorted(
        (e["ts"], e["dur"]) for e in original if e["name"].startswith("ProfilerStep#")
    )
    marked = [(s["ts"], s["dur"]) for s in steps if s["name"].startswith("step ")]
    assert marked == profiler  # the GPU windows tile the steps here
    (steady,) = [s for s in steps if s["name"] == "steady state"]
    assert steady["ts"] == pytest.approx(profiler[0][0])
    assert steady["ts"] + steady["dur"] == pytest.approx(sum(profiler[-1]))
    assert "wall: overhead" in steady["args"]["wallfinder"]


def test_idle_gaps_are_marked_with_their_causes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original, events, _ = annotated(training_trace(5), tmp_path, capsys)
    gaps = tracks(events)["idle gaps"]
    loading = [g for g in gaps if g["name"] == "idle: data loading"]
    loaders = sorted(e["ts"] for e in original if "DataLoader" in e["name"])
    # Each step's 100 µs DataLoader wait, and the 10 µs until the first kernel starts.
    assert [g["ts"] for g in loading] == pytest.approx(loaders)
    assert [g["dur"] for g in loading] == [110.0] * len(loaders)
    assert loading[0]["args"]["wallfinder"].startswith("data loading 100 µs")


def test_each_findings_kernels_or_calls_are_marked_where_the_trace_has_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original, events, _ = annotated(phased_training_trace(5), tmp_path, capsys)
    by_track = tracks(events)
    copies = by_track["finding: exposed-copies"]
    memcpys = sorted(e["ts"] for e in original if e.get("cat") == "gpu_memcpy")
    assert [c["ts"] for c in copies] == pytest.approx(memcpys)
    assert all("Memory copies stall the GPU" in c["args"]["wallfinder"] for c in copies)
    loading = by_track["finding: data-loading"]
    assert {m["name"] for m in loading} == {
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    }
    assert len(loading) == 5
    # Every marked kernel or call is an event of the trace, by name and start.
    known = {(e["name"], round(float(e["ts"]), 3)) for e in original if "ts" in e}
    for track, marks in by_track.items():
        if track.startswith("finding: "):
            assert {(m["name"], round(m["ts"], 3)) for m in marks} <= known


def test_no_argument_of_the_trace_is_carried_into_the_companion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = phased_training_trace(3)
    b.host("aten::mm", 10.0, 5.0, args={"Call stack": f"/srv/{SECRET}/train.py"})
    b.kernel("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 20.0, 5.0, launch_at=11.0)
    _, events, _ = annotated(b, tmp_path, capsys, "m.json.gz")
    raw = gzip.decompress((tmp_path / "m.json.gz").read_bytes()).decode()
    assert SECRET not in raw
    assert "/home/" not in raw
    assert {k for e in events for k in e.get("args", {})} <= {"name", "sort_index", "wallfinder"}


def test_a_folder_or_a_scheduler_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for rank in (0, 1):
        training_trace(2).write(tmp_path / "job" / f"rank{rank}.json")
    code, _, err = run_cli(
        ["analyze", str(tmp_path / "job"), "--annotate", str(tmp_path / "m.json")], capsys
    )
    assert code == 2
    assert err.count("\n") == 1
    assert "one trace file, not a folder of 2" in err
    assert not (tmp_path / "m.json").exists()


def test_a_real_trace_gets_its_critical_path_and_findings_marked() -> None:
    d, marks = analyze_marked(real_trace("hta/a100-80gb_16rank_rank0.json.gz"))
    d.self_check()
    by_track: dict[str, int] = {}
    for m in marks.marks:
        by_track[m.track] = by_track.get(m.track, 0) + 1
    assert by_track["critical path"] > 0
    assert by_track["steps"] == d.steps.total + 1  # each step and the steady state
    assert 0 < by_track["idle gaps"] <= 50
    marked = {t.removeprefix("finding: ") for t in by_track if t.startswith("finding: ")}
    assert marked <= {f.id for f in d.findings}
    assert {"exposed-comm", "dependency-wait"} <= marked
