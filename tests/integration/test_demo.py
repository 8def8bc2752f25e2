"""The demo workloads, run for real on the CPU with real torch: each writes its trace and gets a
diagnosis that keeps its invariants, and a workload whose mechanism is forced far past any
machine's noise gets the wall it was built to show.

What is not asserted here, because it is a measurement of this machine on this day: which wall
each workload but the default shows at its normal size, and how much faster its fix makes it.
The default (dataloader) workload is sized so that its wall dominates by a wide margin on any
CPU, however busy, and its pair is asserted to move the wall.
`benchmarks/bench_real_runs.py` prints those figures; the verdict logic itself is tested on
traces whose timings the tests set (tests/unit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from invariants import assert_diagnosis_invariants, assert_findings_bounded
from wallfinder import Diagnosis
from wallfinder.capture.workloads import WORKLOADS
from wallfinder.cli import main
from wallfinder.measure import run_demo

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

STEPS = 3
CASES = [(name, fixed) for name in WORKLOADS for fixed in (False, True)]


@pytest.mark.parametrize(
    ("name", "fixed"), CASES, ids=[f"{n}{'-fixed' if f else ''}" for n, f in CASES]
)
def test_each_workload_writes_its_trace_and_a_well_formed_diagnosis(
    tmp_path: Path, name: str, fixed: bool
) -> None:
    result = run_demo(name, fixed=fixed, device="cpu", steps=STEPS, trace_dir=tmp_path)
    assert result.trace_path.is_file()
    assert result.trace_path.parent == tmp_path
    d = result.diagnosis
    assert d.device.kind == "cpu"
    # The profiled steps are exactly the schedule's active ones, marked by optimizer steps.
    assert d.steps.source == "ProfilerStep"
    assert d.steps.total == STEPS
    assert_diagnosis_invariants(d)
    assert_findings_bounded(d)
    assert result.expected == WORKLOADS[name].expected("cpu", fixed)


def test_demo_compare_moves_the_dataloader_wall_from_data_loading_to_compute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The workload's own sizes: the read is several times the step's compute, however busy
    # the machine, and the fixed run's workers keep up with the step.
    args = ["demo", "--compare", "--steps", str(STEPS), "--device", "cpu", "--out", str(tmp_path)]
    assert main(args) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dataloader",
        "dataloader-diff.html",
        "dataloader-fixed",
    ]
    before, after = (
        Diagnosis.from_json((tmp_path / folder / "diagnosis.json").read_text())
        for folder in ("dataloader", "dataloader-fixed")
    )
    assert (before.verdict.wall, before.verdict.cause) == ("overhead", "data_loading")
    assert before.findings[0].id == "data-loading"
    b = before.breakdown
    assert b.idle_causes["data_loading"] > b.compute
    assert after.verdict.wall == "compute", after.verdict.reason
    assert after.breakdown.idle_causes.get("data_loading", 0.0) < b.idle_causes["data_loading"] / 4
    for d in (before, after):
        assert_diagnosis_invariants(d)
    out = capsys.readouterr().out
    assert "Wall the wall moved from overhead (data loading" in out
    # The last row: what the job was made to show, and that this run showed it.
    result = out[out.rindex("\n  result ") :].split()
    assert " ".join(result[:16]) == (
        "result as made to show: the wall moved from overhead to compute, and the step is"
    )
    assert result[-1] == "faster"


# The command -----------------------------------------------------------------------------------


def test_demo_command_writes_trace_diagnosis_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo"
    code = main(
        ["demo", "--workload", "sync", "--steps", "3", "--device", "cpu", "--out", str(out)]
    )
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "diagnosis.json",
        "report.html",
        "trace_rank0.json",
    ]
    d = Diagnosis.from_json((out / "diagnosis.json").read_text())
    assert d.device.kind == "cpu"
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "verdict" in page
    stdout = capsys.readouterr().out
    assert "verdict" in stdout
    assert str(out / "report.html") in stdout
    assert "expected     compute" in stdout
    assert "wallfinder demo --workload sync --fixed" in stdout


def test_demo_command_with_json_keeps_stdout_one_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo"
    args = ["demo", "--workload", "matmul", "--fixed", "--steps", "3", "--device", "cpu"]
    code = main([*args, "--out", str(out), "--format", "json"])
    assert code == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["schema"] == "wallfinder.diagnosis/2"
    assert str(out / "diagnosis.json") in captured.err
    assert "expected     compute" in captured.err
    assert "found " in captured.err


def test_demo_command_writes_the_report_to_a_file_with_o(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.txt"
    args = ["demo", "--workload", "sync", "--steps", "3", "--device", "cpu"]
    code = main([*args, "--out", str(tmp_path / "demo"), "-o", str(report)])
    assert code == 0
    assert "verdict" in report.read_text()
    stdout = capsys.readouterr().out
    assert "verdict" not in stdout
    assert "Files:" in stdout
