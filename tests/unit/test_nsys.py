"""Nsight Systems exports read into the trace model: the tables and their schema variants, steps
from NVTX ranges, ranks from processes, `.nsys-rep` reports through `nsys export`, bad input,
and the environment an export carries never reaching any output."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from invariants import assert_diagnosis_invariants
from nsysgen import SECRET, NsysBuilder, training_export
from tracegen import training_trace
from wallfinder import WallfinderError, analyze
from wallfinder.api import Options, diff
from wallfinder.cli import main
from wallfinder.trace import Kind, load_trace, load_traces


@pytest.fixture(params=["2024", "2021"])
def export(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return training_export(5, variant=request.param).write(tmp_path / "run.sqlite")


def test_tables_are_read_into_the_trace_model(tmp_path: Path) -> None:
    path = training_export(3).write(tmp_path / "run.sqlite")
    (trace,) = load_traces(path)
    assert trace.format == "nsys"
    ev = trace.events
    names = {trace.strings[c] for c in ev.name}
    # Runtime names lose nsys's version suffix; copies are named as Kineto names them.
    assert {
        "cudaLaunchKernel",
        "cudaDeviceSynchronize",
        "Memcpy HtoD (Pageable -> Device)",
    } <= names
    assert "Memset (Device)" in names
    # nsys's "<unnamed>" namespace is spelled as Kineto spells it.
    assert any("(anonymous namespace)::vectorized" in n for n in names)
    kernels = trace.of_kind(Kind.KERNEL)
    assert len(kernels) == 24
    assert trace.grid(int(kernels.grid[0])) in ((128, 1, 1), (64, 1, 1))
    assert {trace.threads(int(b)) for b in kernels.block} == {128}  # blockX·blockY·blockZ
    # Every device op joins its launch call by correlation id.
    runtime = trace.of_kind(Kind.RUNTIME)
    device_ops = trace.of_kind(Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
    assert np.isin(device_ops.correlation, runtime.correlation).all()
    assert len(trace.of_kind(Kind.GPU_SYNC)) == 3
    assert trace.device_name == "NVIDIA A100-SXM4-80GB"
    assert len(trace.of_kind(Kind.ANNOTATION)) == 3
    assert {trace.strings[c] for c in trace.of_kind(Kind.ANNOTATION).cat} == {"wallfinder-tests"}
    assert {trace.strings[c] for c in trace.of_kind(Kind.OTHER).cat} == {"osrt"}
    assert "GPU 0" in trace.process_labels.values()


def test_both_schema_variants_give_the_steps_and_the_same_breakdown(export: Path) -> None:
    d = analyze(export)
    assert_diagnosis_invariants(d)
    assert d.trace_format == "nsys"
    assert d.steps.source == "train_step ranges"
    assert d.steps.total == 5
    assert d.device.matched_spec is not None
    reference = analyze(training_export(5).write(export.with_name("ref.sqlite")))
    assert d.breakdown.per_step_ms == reference.breakdown.per_step_ms
    assert d.kernels[0].name == reference.kernels[0].name


def test_a_missing_column_or_table_is_said(tmp_path: Path) -> None:
    path = training_export(3, variant="2021").write(tmp_path / "old.sqlite")
    warnings = analyze(path).warnings
    assert "NVTX_EVENTS has no domainId column" in warnings
    tables = {"StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "TARGET_INFO_GPU"}
    bare = training_export(3).write(tmp_path / "bare.sqlite", tables=tables)
    d = analyze(bare)
    assert_diagnosis_invariants(d)
    assert any("no CUPTI_ACTIVITY_KIND_RUNTIME, NVTX_EVENTS tables" in w for w in d.warnings)


def test_step_range_names_another_range_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    b = training_export(4)
    for i in range(4):
        b.nvtx(4242, f"forward {i}", 1_000_000 + i * 10, 1_000_000 + i * 10 + 5)
    path = b.write(tmp_path / "run.sqlite")
    d = analyze(path, Options(step_range="forward"))
    assert d.steps.source == "forward ranges"
    assert d.steps.total == 4
    with pytest.raises(WallfinderError, match="no range or annotation is named 'nope'"):
        analyze(path, Options(step_range="nope"))


def test_without_a_step_range_the_capture_is_one_window(tmp_path: Path) -> None:
    b = NsysBuilder()
    b.device(0)
    b.process(7)
    b.nvtx(7, "weight_streaming_demo", 0, 3_000_000)
    b.kernel(7, 0, "ampere_sgemm_128x64_nn", 10_000, 20_000, 1_000_000)
    d = analyze(b.write(tmp_path / "demo.sqlite"))
    assert d.steps.total == 1
    assert any("no NVTX range repeats like a step" in w for w in d.warnings)
    assert not any("ProfilerStep" in w for w in d.warnings)


def test_step_range_applies_to_kineto_traces_too(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(training_trace(4).to_bytes())
    d = analyze(path, Options(step_range="ProfilerStep"))
    assert d.steps.source == "ProfilerStep ranges"
    assert d.steps.total == 4


def test_emit_nvtx_op_ranges_are_cpu_ops(tmp_path: Path) -> None:
    b = training_export(2)
    b.nvtx(4242, "aten::mm, seq = 12, op_id = 40", 1_000_100, 1_000_900)
    (trace,) = load_traces(b.write(tmp_path / "run.sqlite"))
    ops = trace.of_kind(Kind.CPU_OP)
    assert [trace.strings[c] for c in ops.name] == ["aten::mm"]


def test_each_gpu_process_is_a_rank(tmp_path: Path) -> None:
    b = training_export(4, pid=100, device=0)
    training_export(4, pid=200, device=1, builder=b)
    path = b.write(tmp_path / "job.sqlite")
    traces = load_traces(path)
    assert [(t.rank, t.world_size) for t in traces] == [(0, 2), (1, 2)]
    assert all(len(t.of_kind(Kind.KERNEL)) == 32 for t in traces)
    d = analyze(path)
    assert_diagnosis_invariants(d)
    assert len(d.ranks) == 2
    with pytest.raises(WallfinderError, match="holds 2 GPU processes"):
        load_trace(path)


def test_diff_of_an_nsys_capture_and_a_kineto_trace_says_what_compares(tmp_path: Path) -> None:
    nsys = analyze(training_export(4).write(tmp_path / "run.sqlite"))
    kineto_path = tmp_path / "run.json"
    kineto_path.write_bytes(training_trace(4).to_bytes())
    result = diff(analyze(kineto_path), nsys)
    note = next(n for n in result.notes if "Nsight Systems" in n)
    assert "a torch.profiler trace before, an Nsight Systems capture after" in note
    assert "not comparable are the op-level figures" in note


# --- Bad input: one line, exit code 2 -------------------------------------------------------


def _not_nsys(path: Path) -> None:
    con = sqlite3.connect(path)
    with con:
        con.execute("CREATE TABLE notes (id INTEGER, text TEXT)")
        con.execute("INSERT INTO notes VALUES (1, ?)", (SECRET,))
    con.close()


def _truncated(path: Path) -> None:
    b = training_export(200)
    b.write(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def _no_gpu(path: Path) -> None:
    b = NsysBuilder()
    b.process(5)
    b.runtime(5, "cudaGetDeviceCount", 0, 1_000)
    b.nvtx(5, "setup", 0, 1_000_000)
    b.write(path)


def _header_only(path: Path) -> None:
    training_export(2).write(path)
    path.write_bytes(path.read_bytes()[:100])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_not_nsys, "a SQLite database but not an Nsight Systems export"),
        (_truncated, "not a readable SQLite database"),
        (_header_only, "not a readable SQLite database"),
        (_no_gpu, "the export has no GPU activity"),
    ],
    ids=["not-nsys", "truncated", "header-only", "no-gpu"],
)
def test_bad_exports_get_one_line_and_exit_2(
    make: object, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.sqlite"
    make(path)  # type: ignore[operator]
    with pytest.raises(WallfinderError, match=message):
        analyze(path)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message in err
    assert SECRET not in err


# --- Reports (.nsys-rep) --------------------------------------------------------------------


def test_a_report_without_nsys_says_how_to_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"not read")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["analyze", str(report)]) == 2
    err = capsys.readouterr().err
    assert "needs the nsys command on PATH" in err
    assert "nsys export --type sqlite" in err


def _fake_nsys(folder: Path, export: Path, calls: Path) -> None:
    """An `nsys` that 'exports' by copying a prepared export to --output, and counts calls."""
    folder.mkdir()
    script = folder / "nsys"
    script.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        f"open({str(calls)!r}, 'a').write('x')\n"
        "args = sys.argv[1:]\n"
        f"shutil.copy({str(export)!r}, args[args.index('--output') + 1])\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_a_report_is_exported_to_the_cache_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = training_export(3).write(tmp_path / "prepared.sqlite")
    calls = tmp_path / "calls"
    _fake_nsys(tmp_path / "bin", prepared, calls)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    cache = tmp_path / "cache"
    monkeypatch.setenv("WALLFINDER_CACHE", str(cache))
    reports = tmp_path / "reports"
    reports.mkdir()
    report = reports / "run.nsys-rep"
    report.write_bytes(b"a report")
    first = analyze(report)
    second = analyze(report)
    assert first.steps.total == second.steps.total == 3
    assert calls.read_text() == "x"  # exported once, then read from the cache
    assert sorted(p.name for p in reports.iterdir()) == ["run.nsys-rep"]  # never in place
    (cached,) = (cache / "nsys").iterdir()
    cached.write_bytes(b"damaged")  # a damaged entry is made again
    assert analyze(report).steps.total == 3
    assert calls.read_text() == "xx"


# --- Secrets --------------------------------------------------------------------------------


def test_a_planted_token_reaches_no_output_record_or_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = training_export(4).write(tmp_path / "run.sqlite")
    with sqlite3.connect(path) as con:  # the token is really in the export
        assert con.execute("SELECT count(*) FROM StringIds WHERE value LIKE ?", (f"%{SECRET}%",))
    assert SECRET.encode() in path.read_bytes()
    kineto = tmp_path / "run.json"
    kineto.write_bytes(training_trace(4).to_bytes())
    db = tmp_path / "history.sqlite3"
    outputs = []
    for fmt in ("text", "json", "md", "html"):
        out = tmp_path / f"report.{fmt}"
        args = ["analyze", str(path), "--format", fmt, "-o", str(out)]
        assert main([*args, "--record", "nsys", "--db", str(db)]) == 0
        outputs.append(out.read_bytes())
    assert main(["diff", str(kineto), str(path), "--format", "json"]) == 0
    assert main(["history", "nsys", "--db", str(db)]) == 0
    assert main(["check", str(path), "--max-idle", "0.01"]) in (0, 1)
    assert main(["analyze", str(path), "--step-range", "nope"]) == 2
    captured = capsys.readouterr()
    for text in (*outputs, db.read_bytes(), captured.out.encode(), captured.err.encode()):
        assert SECRET.encode() not in text
    (trace,) = load_traces(path)
    assert not any(SECRET in s for s in trace.strings)
    assert not any(SECRET in str(v) for v in trace.process_labels.values())
    assert SECRET not in json.dumps(trace.device_properties)
