"""The demo workloads on the CPU with real torch: the ground truth that the analysis is right on
real measurements, not only on built traces.

Each workload runs once as written and once fixed (module-scoped cache), on one thread: this
machine is shared, and with one thread another process cannot stall the step on a barrier.
A run whose steps come out unstable is measured again; if the machine stays too busy, the
walls are checked on the same trace with the stability question relaxed (the walls do not
depend on it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from wallfinder import Diagnosis, Options, Thresholds, analyze
from wallfinder.capture.workloads import WORKLOADS, DemoResult, run_demo
from wallfinder.cli import main

torch = pytest.importorskip("torch")

STEPS = 5
ATTEMPTS = 3

# (workload, fixed) -> (wall, cause or None, top finding or None): what the CPU really does.
CPU_VERDICTS = {
    ("dataloader", False): ("overhead", "data_loading", "data-loading"),
    ("dataloader", True): ("compute", None, None),
    ("tiny-ops", False): ("overhead", "host_overhead", "launch-bound"),
    ("tiny-ops", True): ("overhead", None, None),
    ("sync", False): ("compute", None, None),  # .item() is free on the CPU
    ("sync", True): ("compute", None, None),
    ("pointwise", False): ("bandwidth", "elementwise", None),
    ("pointwise", True): ("bandwidth", None, None),
    ("matmul", False): ("compute", None, None),
    ("matmul", True): ("compute", None, None),
    ("precision", False): ("compute", None, None),
    ("precision", True): ("compute", None, None),
}


class Runs:
    """Each (workload, fixed) profiled once per module, on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._done: dict[tuple[str, bool], tuple[DemoResult, Diagnosis]] = {}

    def __call__(self, name: str, fixed: bool) -> tuple[DemoResult, Diagnosis]:
        key = (name, fixed)
        if key not in self._done:
            self._done[key] = self._measure(name, fixed)
        return self._done[key]

    def _measure(self, name: str, fixed: bool) -> tuple[DemoResult, Diagnosis]:
        folder = self.root / f"{name}{'-fixed' if fixed else ''}"
        for attempt in range(ATTEMPTS):
            result = run_demo(
                name, fixed=fixed, device="cpu", steps=STEPS, trace_dir=folder / str(attempt)
            )
            if result.diagnosis.steps.stable:
                return result, result.diagnosis
        relaxed = Options(thresholds=Thresholds(max_cv=10.0))
        return result, analyze(result.trace_path, relaxed)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield Runs(tmp_path_factory.mktemp("demo"))
    finally:
        torch.set_num_threads(threads)


def fastest_ms(d: Diagnosis) -> float:
    """The fastest kept step: what the job costs when nothing else disturbs it (another
    program on the machine only ever adds time)."""
    return d.steps.min_s * 1e3


@pytest.mark.parametrize(
    ("name", "fixed"),
    list(CPU_VERDICTS),
    ids=[f"{n}{'-fixed' if f else ''}" for n, f in CPU_VERDICTS],
)
def test_workload_gets_its_verdict_on_the_cpu(runs: Runs, name: str, fixed: bool) -> None:
    result, d = runs(name, fixed)
    wall, cause, finding = CPU_VERDICTS[name, fixed]
    assert d.device.kind == "cpu"
    assert d.steps.count >= 3
    assert d.verdict.wall == wall, d.verdict.reason
    if cause is not None:
        assert d.verdict.cause == cause, d.verdict.reason
    if finding is not None:
        assert d.findings, d.verdict.reason
        assert d.findings[0].id == finding, [f.id for f in d.findings]
    # What the demo tells the user it expects is what the CPU does.
    assert result.expected.describe() == result.workload.expected("cpu", fixed).describe()
    assert result.expected.differences(d) == []


def test_every_workload_is_covered_on_the_cpu() -> None:
    assert {name for name, _ in CPU_VERDICTS} == set(WORKLOADS)
    for (name, fixed), (wall, cause, finding) in CPU_VERDICTS.items():
        expected = WORKLOADS[name].expected("cpu", fixed)
        assert (expected.wall, expected.cause, expected.finding) == (wall, cause, finding)


def test_workers_take_the_data_loading_out_of_the_step(runs: Runs) -> None:
    _, broken = runs("dataloader", False)
    _, fixed = runs("dataloader", True)
    assert broken.breakdown.idle_causes["data_loading"] > 0.15
    assert (
        fixed.breakdown.idle_causes["data_loading"]
        < broken.breakdown.idle_causes["data_loading"] / 2
    )
    assert fastest_ms(fixed) < fastest_ms(broken)


def test_diff_of_the_dataloader_demo_and_its_fix_shows_what_moved(runs: Runs) -> None:
    from wallfinder.analysis.diff import diff

    _, broken = runs("dataloader", False)
    _, fixed = runs("dataloader", True)
    d = diff(broken, fixed)
    assert d.notes == []  # same device, same step source: everything compares
    # The wall moved off data loading; its share dropped; the step got faster, beyond the noise.
    assert (d.verdict.before_wall, d.verdict.before_cause) == ("overhead", "data_loading")
    assert d.verdict.after_cause != "data_loading"
    assert d.verdict.moved
    loading = next(p for p in d.breakdown if p.part == "idle:data_loading")
    assert loading.after < loading.before / 2
    assert d.steps.after_s < d.steps.before_s
    assert not d.steps.within_noise
    assert any(f.id == "data-loading" and f.status == "resolved" for f in d.findings) or any(
        f.id == "data-loading"
        and f.status == "remaining"
        and (f.share_after or 0) < (f.share_before or 0) / 2
        for f in d.findings
    )
    # Same model, same shapes: the ops are matched by name and shapes.
    assert any(m.kind in ("op", "cpu_op") and m.matched > 0 for m in d.matches)


def test_diff_of_the_tiny_ops_demo_and_its_fix_shows_the_overhead_shrinking(runs: Runs) -> None:
    from wallfinder.analysis.diff import diff

    _, broken = runs("tiny-ops", False)
    _, fixed = runs("tiny-ops", True)
    d = diff(broken, fixed)
    overhead = next(p for p in d.breakdown if p.part == "idle:host_overhead")
    # Batched, the per-op overhead per step falls with the number of ops: many times less time.
    assert overhead.after_s < overhead.before_s / 5
    assert d.steps.speedup is not None
    assert d.steps.speedup > 5
    assert not d.steps.within_noise


def test_batching_tiny_ops_makes_the_step_many_times_faster(runs: Runs) -> None:
    _, broken = runs("tiny-ops", False)
    _, fixed = runs("tiny-ops", True)
    assert broken.breakdown.idle_causes["host_overhead"] > 0.4
    assert fastest_ms(fixed) * 5 < fastest_ms(broken)
    assert fixed.breakdown.compute > broken.breakdown.compute


def test_fused_pointwise_ops_make_the_step_faster(runs: Runs) -> None:
    _, broken = runs("pointwise", False)
    _, fixed = runs("pointwise", True)
    assert fastest_ms(fixed) * 2 < fastest_ms(broken)


def test_item_every_step_costs_the_cpu_nothing(runs: Runs) -> None:
    for fixed in (False, True):
        _, d = runs("sync", fixed)
        assert d.breakdown.idle_causes["synchronization"] == 0.0
        assert "sync-in-step" not in [f.id for f in d.findings]


def _bf16_matmuls_are_fast_here() -> bool:
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


@pytest.mark.parametrize("name", ["matmul", "precision"])
def test_lower_precision_matmuls_are_faster_where_the_cpu_has_bf16(runs: Runs, name: str) -> None:
    if not _bf16_matmuls_are_fast_here():
        pytest.skip("this CPU has no bf16 matmul instructions: the fix cannot speed it up")
    _, broken = runs(name, False)
    _, fixed = runs(name, True)
    assert fastest_ms(fixed) < 0.85 * fastest_ms(broken)


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
    assert json.loads(captured.out)["schema"] == "wallfinder.diagnosis/1"
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
