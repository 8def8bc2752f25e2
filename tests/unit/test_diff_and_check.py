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
from wallfinder.cli.commands.check import parse_size
from wallfinder.diagnosis import (
    BytesChange,
    DeviceMemoryProfile,
    DiagnosisDiff,
    Finding,
    MemoryProfile,
    Mfu,
)
from wallfinder.errors import WallfinderError
from wallfinder.report import render_diff

GEMM = "volta_sgemm_128x64_nn"
MiB = 1 << 20
GiB = 1 << 30


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
    # The runs are named as the user gave them: the saved file, the trace.
    names = ("before-diagnosis.json", "after.json")
    assert x == diff(analyze(before_path), analyze(after_path), names=names)


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


# Memory in diff and check -------------------------------------------------------------------------


def with_memory(
    d: Diagnosis,
    *,
    peak: int,
    reserved: int,
    categories: dict[str, int],
    growth: float | None = 0.0,
    leak: bool = False,
    findings: tuple[str, ...] = (),
    device: str = "cuda:0",
    capacity: int | None = 80 * GiB,
) -> Diagnosis:
    """`d` with a memory profile of its analysed device built by hand."""
    profile = DeviceMemoryProfile(
        device=device,
        events=100,
        capacity=capacity,
        capacity_source=None if capacity is None else "datasheet",
        peak_allocated=peak,
        peak_reserved=reserved,
        peak_time_s=0.001,
        peak_step="step 2",
        peak_phase="backward",
        peak_op=None,
        before_trace=categories.get("before_trace", 0),
        categories=categories,
        growth_per_step=growth,
        leak=leak,
    )
    found = [
        Finding.memory(id=i, title=f"title of {i}", evidence="", fix="", device=device)
        for i in findings
    ]
    return msgspec.structs.replace(d, memory=MemoryProfile(devices=[profile], findings=found))


def leaking(d: Diagnosis) -> Diagnosis:
    """12 GiB at the peak, 8 GiB of it activations, growing 64 MiB a step."""
    return with_memory(
        d,
        peak=12 * GiB,
        reserved=14 * GiB,
        categories={"before_trace": 2 * GiB, "activations": 8 * GiB, "gradients": GiB}
        | {"temporaries": GiB},
        growth=64 * MiB,
        leak=True,
        findings=("memory-activations", "memory-leak", "memory-offload"),
    )


def checkpointed(d: Diagnosis) -> Diagnosis:
    """Activation checkpointing and no more leak: 6 GiB at the peak."""
    return with_memory(
        d,
        peak=6 * GiB,
        reserved=9 * GiB,
        categories={"before_trace": 2 * GiB, "activations": 2 * GiB, "gradients": GiB}
        | {"temporaries": 512 * MiB, "other": 512 * MiB},
        findings=("memory-offload", "memory-fragmentation"),
    )


@pytest.fixture
def memory_fixed(before_path: Path, after_path: Path) -> DiagnosisDiff:
    return diff(leaking(analyze(before_path)), checkpointed(analyze(after_path)))


def test_diff_gives_the_peak_memory_before_and_after(memory_fixed: DiagnosisDiff) -> None:
    m = memory_fixed.memory
    assert m is not None
    assert m.device == "cuda:0"
    assert m.peak_allocated == BytesChange(
        before=12 * GiB, after=6 * GiB, change_bytes=-6 * GiB, change=-0.5
    )
    assert m.peak_reserved == BytesChange(
        before=14 * GiB, after=9 * GiB, change_bytes=-5 * GiB, change=-5 / 14
    )
    assert memory_fixed.notes == []


def test_diff_orders_memory_categories_by_how_much_they_moved(
    memory_fixed: DiagnosisDiff,
) -> None:
    assert memory_fixed.memory is not None
    # Ties keep the categories' own order; optimizer state is on neither side: left out.
    assert [
        (c.category, c.before, c.after, c.change_bytes) for c in memory_fixed.memory.categories
    ] == [
        ("activations", 8 * GiB, 2 * GiB, -6 * GiB),
        ("temporaries", GiB, 512 * MiB, -512 * MiB),
        ("other", 0, 512 * MiB, 512 * MiB),
        ("before_trace", 2 * GiB, 2 * GiB, 0),
        ("gradients", GiB, GiB, 0),
    ]


def test_diff_says_the_leak_was_fixed_and_which_memory_findings_moved(
    memory_fixed: DiagnosisDiff,
) -> None:
    m = memory_fixed.memory
    assert m is not None
    assert (m.leak_before, m.leak_after) == (True, False)
    assert (m.growth_per_step_before, m.growth_per_step_after) == (64 * MiB, 0.0)
    assert [(f.id, f.status) for f in m.findings] == [
        ("memory-activations", "resolved"),
        ("memory-leak", "resolved"),
        ("memory-fragmentation", "new"),
        ("memory-offload", "remaining"),
    ]
    assert all(f.share_before is None and f.share_after is None for f in m.findings)
    assert m.findings[0].title == "title of memory-activations"


def test_diff_renders_a_short_memory_part_in_text_and_markdown(
    memory_fixed: DiagnosisDiff,
) -> None:
    text = render_diff(memory_fixed, "text", width=200)
    lines = text.splitlines()
    start = lines.index("Memory cuda:0")
    assert lines[start + 1 : start + 6] == [
        "peak allocated 12.00 GiB → 6.00 GiB (-6.00 GiB, -50.0%)",
        "peak reserved 14.00 GiB → 9.00 GiB (-5.00 GiB, -35.7%)",
        "moved most at the peak: activations -6.00 GiB (8.00 GiB → 2.00 GiB), temporaries "
        "-512.00 MiB (1.00 GiB → 512.00 MiB), other +512.00 MiB (0 B → 512.00 MiB)",
        "leak fixed: allocated memory grew 64.00 MiB per step before, 0 B after",
        "memory findings resolved: memory-activations, memory-leak; new: memory-fragmentation; "
        "remaining: memory-offload",
    ]
    assert all(
        len(line) <= 100 for line in render_diff(memory_fixed, "text", width=100).splitlines()
    )
    md = render_diff(memory_fixed, "md")
    assert (
        "\n**Memory** `cuda:0`\n\n- peak allocated 12.00 GiB → 6.00 GiB (-6.00 GiB, -50.0%)\n" in md
    )
    assert "- leak fixed: allocated memory grew 64.00 MiB per step before, 0 B after\n" in md


def test_diff_leaves_out_reserved_memory_when_neither_run_recorded_it(
    before_path: Path, after_path: Path
) -> None:
    def cpu(d: Diagnosis, peak: int) -> Diagnosis:
        # The CPU allocator reports no reserved total, and a CPU has no known capacity.
        cats = {"activations": peak}
        return with_memory(d, peak=peak, reserved=0, categories=cats, device="cpu", capacity=None)

    x = diff(cpu(analyze(before_path), 4 * MiB), cpu(analyze(after_path), 4 * MiB))
    assert x.memory is not None
    assert x.memory.peak_reserved == BytesChange(before=0, after=0, change_bytes=0, change=None)
    text = render_diff(x, "text", width=100)
    assert "peak allocated 4.00 MiB → 4.00 MiB (unchanged)\nno category moved at the peak\n" in text
    assert "reserved" not in text
    assert "no leak before or after\nno memory findings before or after" in text


def test_diff_html_page_has_a_memory_card(
    memory_fixed: DiagnosisDiff, fixed: DiagnosisDiff
) -> None:
    from test_report_html import Page

    visible = " ".join(Page(render_diff(memory_fixed, "html")).visible.split())
    assert "Memory cuda:0, at the peak of allocated bytes" in visible
    assert "12.00 GiB → 6.00 GiB (−6.00 GiB, −50.0%)" in visible
    assert "leak fixed: allocated memory grew 64.00 MiB per step before, 0 B after" in visible
    assert "activations 8.00 GiB 2.00 GiB −6.00 GiB" in visible
    assert "resolved memory-activations title of memory-activations" in visible
    assert "at the peak of allocated bytes" not in Page(render_diff(fixed, "html")).visible


def test_diff_memory_change_survives_json(memory_fixed: DiagnosisDiff) -> None:
    assert DiagnosisDiff.from_json(memory_fixed.to_json()) == memory_fixed
    old = json.loads(memory_fixed.to_json())
    del old["memory"]  # a diff written before memory was compared
    assert DiagnosisDiff.from_json(json.dumps(old)).memory is None


def test_diff_notes_memory_on_one_side_only(before_path: Path, after_path: Path) -> None:
    d_before, d_after = analyze(before_path), analyze(after_path)
    x = diff(leaking(d_before), d_after)
    assert x.memory is None
    assert x.notes == [
        "only the run before has a memory profile ([memory] events, recorded with "
        "profile_memory=True): memory cannot be compared"
    ]
    (note,) = diff(d_before, checkpointed(d_after)).notes
    assert note.startswith("only the run after has a memory profile")
    assert diff(d_before, d_after).memory is None


def test_diff_notes_memory_profiled_on_different_devices(
    before_path: Path, after_path: Path
) -> None:
    after = with_memory(analyze(after_path), peak=GiB, reserved=GiB, categories={}, device="cuda:1")
    x = diff(leaking(analyze(before_path)), after)
    assert x.memory is None
    assert x.notes == [
        "memory was profiled on different devices (cuda:0 before, cuda:1 after): memory "
        "cannot be compared"
    ]


def memory_trace(*, leak: bool) -> TraceBuilder:
    """Five steps, each allocating 64 MiB of temporaries and 8 MiB it keeps to the end of the
    step; with `leak`, the 8 MiB is never freed."""
    b = TraceBuilder()
    total = 0

    def event(at: float, addr: int, nbytes: int) -> None:
        nonlocal total
        total += nbytes
        b.memory(at, addr, nbytes, total, 256 * MiB)

    for s in range(5):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.cpu_op("aten::mm", t0 + 10.0, 100.0)
        event(t0 + 20.0, 0x1000 + s, 64 * MiB)
        event(t0 + 30.0, 0x2000 + s, 8 * MiB)
        b.kernel(GEMM, t0 + 200.0, 700.0, launch_at=t0 + 15.0)
        event(t0 + 900.0, 0x1000 + s, -64 * MiB)
        if not leak:
            event(t0 + 950.0, 0x2000 + s, -8 * MiB)
    return b


def test_diff_of_traces_with_memory_events_shows_the_leak_fixed(tmp_path: Path) -> None:
    before = analyze(memory_trace(leak=True).write(tmp_path / "leak.json"))
    after = analyze(memory_trace(leak=False).write(tmp_path / "fixed.json"))
    m = diff(before, after).memory
    assert m is not None
    # The leak keeps 4 x 8 MiB from earlier steps at the last step's peak.
    assert m.peak_allocated == BytesChange(
        before=104 * MiB, after=72 * MiB, change_bytes=-32 * MiB, change=-32 / 104
    )
    assert (m.peak_reserved.before, m.peak_reserved.after) == (256 * MiB, 256 * MiB)
    assert (m.leak_before, m.leak_after) == (True, False)
    assert m.growth_per_step_before == 8 * MiB
    assert ("memory-leak", "resolved") in [(f.id, f.status) for f in m.findings]
    assert sum(c.before for c in m.categories) == 104 * MiB


def test_check_max_peak_memory_holds_and_breaks(before_path: Path) -> None:
    d = leaking(analyze(before_path))
    (held,) = check(d, Bounds(max_peak_memory=16 * GiB))
    assert (held.held, held.line) == (
        True,
        "peak allocated memory 12.00 GiB on cuda:0 ≤ --max-peak-memory 16.00 GiB",
    )
    (broken,) = check(d, Bounds(max_peak_memory=8 * GiB))
    assert (broken.held, broken.line) == (
        False,
        "peak allocated memory 12.00 GiB on cuda:0 > --max-peak-memory 8.00 GiB",
    )


def test_check_max_peak_memory_share_of_capacity(before_path: Path) -> None:
    d = leaking(analyze(before_path))  # 12 of 80 GiB: 15%
    (held,) = check(d, Bounds(max_peak_memory_share=0.2))
    assert held.held
    assert held.line == (
        "peak allocated memory 15% of cuda:0's 80.00 GiB (12.00 GiB) ≤ --max-peak-memory-share 20%"
    )
    (broken,) = check(d, Bounds(max_peak_memory_share=0.1))
    assert not broken.held
    assert broken.line.endswith("> --max-peak-memory-share 10%")
    no_capacity = with_memory(d, peak=GiB, reserved=GiB, categories={}, capacity=None)
    (unknown,) = check(no_capacity, Bounds(max_peak_memory_share=0.9))
    assert (unknown.held, unknown.line) == (
        False,
        "capacity of cuda:0 unknown — cannot check --max-peak-memory-share 90%",
    )


def test_check_no_memory_leak(before_path: Path) -> None:
    d = analyze(before_path)
    (leak,) = check(leaking(d), Bounds(no_memory_leak=True))
    assert (leak.held, leak.line) == (
        False,
        "allocated memory grows 64.00 MiB per step on cuda:0: a leak, against --no-memory-leak",
    )
    (fine,) = check(checkpointed(d), Bounds(no_memory_leak=True))
    assert (fine.held, fine.line) == (
        True,
        "allocated memory grows 0 B per step on cuda:0: no leak, as --no-memory-leak asks",
    )
    few_steps = with_memory(d, peak=GiB, reserved=GiB, categories={}, growth=None)
    (unknown,) = check(few_steps, Bounds(no_memory_leak=True))
    assert not unknown.held
    assert unknown.line == (
        "too few steady-state steps to measure growth — cannot check --no-memory-leak"
    )
    assert check(leaking(d), Bounds(no_memory_leak=False)) == []


def test_check_memory_bounds_fail_clearly_without_a_memory_profile(before_path: Path) -> None:
    d = analyze(before_path)
    assert d.memory is None
    results = check(
        d, Bounds(max_peak_memory=20 * GiB, max_peak_memory_share=0.9, no_memory_leak=True)
    )
    why = "no memory profile ([memory] events: profile with profile_memory=True) — cannot check"
    assert [(r.held, r.line) for r in results] == [
        (False, f"{why} --max-peak-memory 20.00 GiB"),
        (False, f"{why} --max-peak-memory-share 90%"),
        (False, f"{why} --no-memory-leak"),
    ]


def test_bounds_given_counts_a_zero_bound_but_not_a_false_flag() -> None:
    assert Bounds(max_idle=0.0, no_memory_leak=False).given() == ["max_idle"]
    assert Bounds(no_memory_leak=True, max_peak_memory=1).given() == [
        "max_peak_memory",
        "no_memory_leak",
    ]


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("20GiB", 20 * GiB),
        ("20 GiB", 20 * GiB),
        ("0.5gib", GiB // 2),
        ("512MB", 512_000_000),
        ("1e9", 1_000_000_000),
        ("4096", 4096),
        (2048, 2048),
        (2e10, 20_000_000_000),
    ],
)
def test_sizes_are_bytes_or_a_number_with_a_unit(value: object, size: int) -> None:
    assert parse_size(value) == size


@pytest.mark.parametrize("value", ["lots", "20G", "-1GiB", "0", True, [1]])
def test_a_size_that_is_not_one_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(value)


def test_cli_check_memory_bounds_on_saved_diagnoses(
    before_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    d = analyze(before_path)
    leaky, fixed = tmp_path / "leaky.json", tmp_path / "fixed.json"
    leaky.write_text(leaking(d).to_json())
    fixed.write_text(checkpointed(d).to_json())
    bounds = ["--max-peak-memory", "20GiB", "--max-peak-memory-share", "90%", "--no-memory-leak"]
    code, out, _ = run_cli(["check", str(leaky), *bounds], capsys)
    assert code == 1
    assert out == (
        "allocated memory grows 64.00 MiB per step on cuda:0: a leak, against --no-memory-leak\n"
    )
    code, out, _ = run_cli(["check", str(fixed), *bounds], capsys)
    assert code == 0
    assert out.startswith("all 3 bounds hold: peak allocated memory 6.00 GiB on cuda:0 ≤ ")


def test_cli_check_memory_bound_on_a_trace_without_memory_fails_in_one_line(
    before_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["check", str(before_path), "--max-peak-memory", "1GiB"], capsys)
    assert code == 1
    assert err == ""
    assert out == (
        "no memory profile ([memory] events: profile with profile_memory=True) — cannot check "
        "--max-peak-memory 1.00 GiB\n"
    )


def test_cli_check_reads_memory_bounds_from_pyproject_and_flags_win(
    before_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    saved = tmp_path / "run.json"
    saved.write_text(leaking(analyze(before_path)).to_json())
    (tmp_path / "pyproject.toml").write_text(
        "[tool.wallfinder.check]\n"
        'max-peak-memory = "10GiB"\nmax-peak-memory-share = 0.1\nno-memory-leak = true\n'
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["check", str(saved)], capsys)
    assert code == 1
    leak = "allocated memory grows 64.00 MiB per step on cuda:0: a leak, against --no-memory-leak"
    share = (
        "peak allocated memory 15% of cuda:0's 80.00 GiB (12.00 GiB) > --max-peak-memory-share 10%"
    )
    assert out.splitlines() == [
        "peak allocated memory 12.00 GiB on cuda:0 > --max-peak-memory 10.00 GiB",
        share,
        leak,
    ]
    code, out, _ = run_cli(["check", str(saved), "--max-peak-memory", "16384MiB"], capsys)
    assert code == 1
    assert out.splitlines() == [share, leak]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('max-peak-memory = "lots"', "max-peak-memory: not a size: 'lots'"),
        ("max-peak-memory-share = 1.5", "max-peak-memory-share: must be a share from 0 to 1"),
        ('no-memory-leak = "yes"', "no-memory-leak: must be true or false: 'yes'"),
    ],
)
def test_cli_check_bad_memory_bounds_in_config_are_one_clear_error(
    config: str,
    message: str,
    after_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    file = tmp_path / "pyproject.toml"
    file.write_text(f"[tool.wallfinder.check]\n{config}\n")
    code, out, err = run_cli(["check", str(after_path), "--config", str(file)], capsys)
    assert code == 2
    assert out == ""
    assert message in err
    assert err.count("\n") == 1


def test_cli_check_bad_memory_flags_exit_2(
    after_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["check", str(after_path), "--max-peak-memory", "20G"], capsys)
    assert code == 2
    assert "not a size: '20G'" in err
    code, _, err = run_cli(["check", str(after_path), "--max-peak-memory-share", "120%"], capsys)
    assert code == 2
    assert "must be a share from 0 to 1" in err


@pytest.mark.parametrize("flag", ["--max-idle", "--min-mfu", "--max-exposed-comm"])
@pytest.mark.parametrize("value", ["150%", "1.5"])
def test_check_refuses_a_share_of_the_step_above_the_whole(
    flag: str, value: str, after_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Idle can never exceed 150% of the step (nor MFU reach it): such a bound says nothing,
    so it is bad input, not "all 1 bounds hold"."""
    code, out, err = run_cli(["check", str(after_path), flag, value], capsys)
    assert (code, out) == (2, "")
    assert f"argument {flag}: must be a share from 0 to 1: '{value}'" in err
    assert err.count("\n") == 1


def test_check_refuses_a_share_above_the_whole_in_config_and_from_python(
    after_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "pyproject.toml"
    file.write_text('[tool.wallfinder.check]\nmax-idle = "150%"\n')
    code, out, err = run_cli(["check", str(after_path), "--config", str(file)], capsys)
    assert (code, out) == (2, "")
    assert "max-idle: must be a share from 0 to 1" in err
    with pytest.raises(WallfinderError, match=r"max_idle must be a share from 0 to 1: 1\.5"):
        Bounds(max_idle=1.5)
    with pytest.raises(WallfinderError, match="max_regression must be ≥ 0"):
        Bounds(max_regression=-0.1)
    assert Bounds(max_regression=1.5).given() == ["max_regression"]  # a 2.5x step: allowed


def test_check_warns_in_one_line_when_the_baseline_ran_on_another_gpu(
    before_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = loader_bound()
    other.device_name = "NVIDIA A100-SXM4-80GB"
    a100 = other.write(tmp_path / "a100.json")
    args = ["check", str(before_path), "--baseline", str(a100), "--max-regression", "5%"]
    code, out, err = run_cli(args, capsys)
    assert code == 0
    assert out.startswith("all 1 bounds hold")
    assert err == (
        "wallfinder: warning: the baseline ran on NVIDIA A100-SXM4-80GB and this run on "
        "NVIDIA H100 80GB HBM3: the step times compare different hardware\n"
    )
    same = ["check", str(before_path), "--baseline", str(before_path), "--max-regression", "5%"]
    assert run_cli(same, capsys)[2] == ""
