"""`wallfinder diff` (what moved between two runs) and `wallfinder check` (a CI gate)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from tracegen import TraceBuilder
from wallfinder import Diagnosis, analyze
from wallfinder.analysis.check import Bounds, check
from wallfinder.analysis.diff import diff
from wallfinder.api import load_diagnosis
from wallfinder.cli import main
from wallfinder.diagnosis import DiagnosisDiff, Mfu
from wallfinder.errors import WallfinderError
from wallfinder.report import render_diff

GEMM = "volta_sgemm_128x64_nn"


def loader_bound(loader_us: float = 1000.0, steps: int = 4) -> TraceBuilder:
    """Each step: the DataLoader for `loader_us`, then a launched 250 µs GEMM."""
    b = TraceBuilder()
    period = loader_us + 256.0
    for s in range(steps):
        t0 = s * period
        b.step(s + 1, t0, period)
        b.dataloader(t0, loader_us)
        b.kernel(GEMM, t0 + loader_us + 6.0, 250.0, launch_at=t0 + loader_us)
    return b


def gemm_bound(steps: int = 4) -> TraceBuilder:
    """Each 256 µs step fully busy with GEMMs launched well ahead."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 256.0
        b.step(s + 1, t0, 256.0)
        b.kernel(GEMM, t0, 250.0, launch_at=t0)
        b.kernel(GEMM, t0 + 250.0, 6.0, launch_at=t0)
    return b


def cpu_only(steps: int = 4) -> TraceBuilder:
    b = TraceBuilder(device_name=None)
    for s in range(steps):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.dataloader(t0, 700.0)
        b.cpu_op("aten::mm", t0 + 700.0, 300.0)
    return b


@pytest.fixture
def before_path(tmp_path: Path) -> Path:
    return loader_bound().write(tmp_path / "before.json")


@pytest.fixture
def after_path(tmp_path: Path) -> Path:
    return gemm_bound().write(tmp_path / "after.json")


@pytest.fixture
def fixed(before_path: Path, after_path: Path) -> DiagnosisDiff:
    return diff(analyze(before_path), analyze(after_path))


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


# diff -------------------------------------------------------------------------------------------


def test_removing_the_data_loading_wait_moves_the_wall_to_compute(fixed: DiagnosisDiff) -> None:
    v = fixed.verdict
    assert (v.before_wall, v.before_cause) == ("overhead", "data_loading")
    assert v.after_wall == "compute"
    assert v.moved


def test_removing_the_data_loading_wait_makes_the_step_faster(fixed: DiagnosisDiff) -> None:
    s = fixed.steps
    assert s.before_s == pytest.approx(1256e-6)
    assert s.after_s == pytest.approx(256e-6)
    assert s.change == pytest.approx(-1000 / 1256)
    assert s.speedup == pytest.approx(1256 / 256)
    assert not s.within_noise
    assert "beyond the noise" in s.note


def test_the_data_loading_share_drops_in_the_breakdown(fixed: DiagnosisDiff) -> None:
    rows = {p.part: p for p in fixed.breakdown}
    assert rows["idle:data_loading"].before == pytest.approx(1000 / 1256)
    assert rows["idle:data_loading"].after == 0.0
    assert rows["idle:data_loading"].before_s == pytest.approx(1000e-6)
    assert rows["compute"].after == pytest.approx(1.0)
    assert [p.part for p in fixed.breakdown][:4] == [
        "compute",
        "comm_exposed",
        "copy_exposed",
        "idle",
    ]


def test_the_data_loading_finding_is_resolved(fixed: DiagnosisDiff) -> None:
    found = {f.id: f for f in fixed.findings}
    assert found["data-loading"].status == "resolved"
    assert found["data-loading"].share_before == pytest.approx(1000 / 1256)
    assert found["data-loading"].share_after is None


def test_kernels_are_matched_by_name_with_their_time_per_step(fixed: DiagnosisDiff) -> None:
    (kernels,) = [m for m in fixed.matches if m.kind == "kernel"]
    assert (kernels.matched, kernels.before_only, kernels.after_only) == (1, 0, 0)
    (gemm,) = [m for m in fixed.moved if m.kind == "kernel"]
    assert gemm.before_s == pytest.approx(250e-6)
    assert gemm.after_s == pytest.approx(256e-6)
    assert fixed.notes == []


def test_identical_runs_change_nothing_within_the_noise(before_path: Path) -> None:
    d = analyze(before_path)
    x = diff(d, d)
    assert x.steps.change_s == 0.0
    assert x.steps.within_noise
    assert "within the noise" in x.steps.note
    assert not x.verdict.moved
    assert {f.status for f in x.findings} == {"remaining"}
    assert all(m.change_s == 0.0 for m in x.moved)
    assert all(p.before == p.after for p in x.breakdown)
    assert x.mfu.change in (None, 0.0)


def test_a_change_smaller_than_the_step_spread_is_within_the_noise(tmp_path: Path) -> None:
    def run(lengths: list[float], name: str) -> Diagnosis:
        b = TraceBuilder()
        t0 = 0.0
        for s, length in enumerate(lengths):
            b.step(s + 1, t0, length)
            b.kernel(GEMM, t0, length, launch_at=t0)
            t0 += length
        return analyze(b.write(tmp_path / name))

    x = diff(run([300.0, 400.0, 500.0, 400.0], "a.json"), run([310.0, 410.0, 490.0], "b.json"))
    assert x.steps.change_s == pytest.approx(10e-6)
    assert x.steps.within_noise


def test_a_saved_diagnosis_is_read_back_as_input(tmp_path: Path, before_path: Path) -> None:
    d = analyze(before_path)
    saved = tmp_path / "before-diagnosis.json"
    saved.write_text(d.to_json())
    assert load_diagnosis(saved) == d


def test_diff_accepts_a_saved_diagnosis_beside_a_trace(
    tmp_path: Path, before_path: Path, after_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "before-diagnosis.json"
    saved.write_text(analyze(before_path).to_json())
    code, out, _ = run_cli(["diff", str(saved), str(after_path), "--format", "json"], capsys)
    assert code == 0
    x = DiagnosisDiff.from_json(out)
    assert x.schema == "wallfinder.diff/1"
    assert json.loads(out)["verdict"]["before_cause"] == "data_loading"
    assert x == diff(analyze(before_path), analyze(after_path))


def test_a_saved_diff_is_not_taken_for_a_diagnosis(tmp_path: Path, fixed: DiagnosisDiff) -> None:
    saved = tmp_path / "diff.json"
    saved.write_text(fixed.to_json())
    with pytest.raises(WallfinderError, match=r"wallfinder\.diff/1 file, not a diagnosis"):
        load_diagnosis(saved)


def test_cpu_only_beside_gpu_says_what_cannot_be_compared(tmp_path: Path, after_path: Path) -> None:
    x = diff(analyze(cpu_only().write(tmp_path / "cpu.json")), analyze(after_path))
    assert (x.basis_before, x.basis_after) == ("cpu", "gpu")
    assert any("CPU-only" in n and "kernels cannot be matched" in n for n in x.notes)
    assert x.moved == []
    assert x.matches == []
    assert x.steps.before_s == pytest.approx(1e-3)


def test_different_devices_are_noted(tmp_path: Path, before_path: Path) -> None:
    b = TraceBuilder(device_name="NVIDIA A100-SXM4-80GB")
    for s in range(3):
        b.step(s + 1, s * 256.0, 256.0)
        b.kernel(GEMM, s * 256.0, 256.0, launch_at=s * 256.0)
    x = diff(analyze(before_path), analyze(b.write(tmp_path / "a100.json")))
    (note,) = x.notes
    assert note.startswith("different devices (NVIDIA H100 80GB HBM3 before, NVIDIA A100")
    assert x.steps.after_s == pytest.approx(256e-6)


def test_diff_reports_render_in_every_format(fixed: DiagnosisDiff) -> None:
    text = render_diff(fixed, "text", width=100)
    assert "the wall moved from overhead (data loading, DataLoader) to compute" in text
    assert "resolved" in text
    assert "data-loading" in text
    assert all(len(line) <= 100 for line in text.splitlines())
    md = render_diff(fixed, "md")
    assert md.startswith("### wallfinder diff: the wall moved from overhead")
    assert "| resolved | `data-loading`" in md
    assert json.loads(render_diff(fixed, "json"))["schema"] == "wallfinder.diff/1"


def test_diff_of_a_missing_file_is_a_one_line_error(
    tmp_path: Path, after_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["diff", str(tmp_path / "nope.json"), str(after_path)], capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert "nope.json" in err


# check ------------------------------------------------------------------------------------------


def test_check_bounds_that_hold_and_that_break(before_path: Path) -> None:
    d = analyze(before_path)  # 1.256 ms steps, 80% idle, no communication
    held = check(d, Bounds(max_step_ms=2.0, max_idle=0.9, max_exposed_comm=0.0))
    assert [r.held for r in held] == [True, True, True]
    broken = check(d, Bounds(max_step_ms=1.0, max_idle=0.5))
    assert [r.line for r in broken] == [
        "step time 1.26 ms > --max-step-ms 1",
        "idle 80.1% of the step > --max-idle 50%",
    ]


def test_check_min_mfu_holds_fails_and_fails_when_unknown(before_path: Path) -> None:
    d = analyze(before_path)
    measured = msgspec.structs.replace(d, mfu=Mfu(value=0.3, basis="given"))
    assert check(measured, Bounds(min_mfu=0.25))[0].line == "MFU 30% ≥ --min-mfu 25%"
    (low,) = check(measured, Bounds(min_mfu=0.4))
    assert (low.held, low.line) == (False, "MFU 30% < --min-mfu 40%")
    unknown = msgspec.structs.replace(d, mfu=Mfu(value=None, basis="no peak"))
    (r,) = check(unknown, Bounds(min_mfu=0.1))
    assert not r.held
    assert r.line == "MFU unknown (no peak) — cannot check --min-mfu 10%"


def test_check_exits_0_with_one_line_when_all_bounds_hold(
    before_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["check", str(before_path), "--max-step-ms", "2"], capsys)
    assert code == 0
    assert out == "all 1 bounds hold: step time 1.26 ms ≤ --max-step-ms 2\n"


def test_check_exits_1_naming_each_broken_bound(
    before_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["check", str(before_path), "--max-step-ms", "1", "--max-idle", "10%"]
    args += ["--max-exposed-comm", "0.05"]
    code, out, _ = run_cli(args, capsys)
    assert code == 1
    assert out.splitlines() == [
        "step time 1.26 ms > --max-step-ms 1",
        "idle 80.1% of the step > --max-idle 10%",
    ]


@pytest.mark.parametrize(
    ("target", "args", "message"),
    [
        ("nope.json", ["--max-step-ms", "1"], "no such file"),
        ("t.json", [], "no bound to check"),
        ("t.json", ["--max-regression", "5%"], "--baseline and --max-regression go together"),
    ],
)
def test_check_exits_2_for_bad_input(
    target: str,
    args: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    gemm_bound().write(tmp_path / "t.json")
    code, out, err = run_cli(["check", target, *args], capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("wallfinder: error:")
    assert message in err
    assert err.count("\n") == 1


def test_check_rejects_a_fraction_that_is_not_one(
    after_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["check", str(after_path), "--max-idle", "lots"], capsys)
    assert code == 2
    assert "not a fraction" in err


def test_check_fails_a_regression_over_the_baseline(
    before_path: Path,
    after_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["check", str(before_path), "--baseline", str(after_path), "--max-regression", "5%"]
    code, out, _ = run_cli(args, capsys)
    assert code == 1
    assert out == (
        "step time grew 390.6% over the baseline (0.26 → 1.26 ms) > --max-regression 5%\n"
    )
    faster = ["check", str(after_path), "--baseline", str(before_path), "--max-regression", "0.05"]
    assert run_cli(faster, capsys)[0] == 0


def test_check_reads_bounds_from_pyproject_and_flags_win(
    before_path: Path,
    after_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        "[tool.wallfinder.check]\n"
        'max-step-ms = 1.0\nmax-idle = "50%"\nbaseline = "../after.json"\nmax-regression = 0.05\n'
    )
    monkeypatch.chdir(project / "sub")
    code, out, _ = run_cli(["check", str(before_path)], capsys)
    assert code == 1
    assert [line.split(" > ")[1] for line in out.splitlines()] == [
        "--max-step-ms 1",
        "--max-idle 50%",
        "--max-regression 5%",
    ]
    assert run_cli(["check", str(after_path), "--max-step-ms", "2"], capsys)[0] == 0


def test_check_config_file_with_an_unknown_key_is_one_clear_error(
    after_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.wallfinder.check]\nmax-step = 3\n")
    code, _, err = run_cli(["check", str(after_path), "--config", str(config)], capsys)
    assert code == 2
    assert "unknown key 'max-step' in [tool.wallfinder.check]" in err
    assert "max-step-ms" in err
