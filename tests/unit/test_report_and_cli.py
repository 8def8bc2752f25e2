"""The terminal report, the JSON contract, the HTML form, the public API and the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import wallfinder
from tracegen import NASTY_NAME, TraceBuilder, training_trace
from wallfinder import Diagnosis, analyze
from wallfinder.cli import main
from wallfinder.report import render
from wallfinder.report.terminal import render_text

MARKUP_NAME = "k[bold]x[/bold]"
HTML_NAME = "k<script>alert(1)</script>"


def gpu_trace(tmp_path: Path, name: str = "trace.json.gz") -> Path:
    b = training_trace(4, kernels=("volta_sgemm_128x64_nn", MARKUP_NAME, HTML_NAME))
    return b.write(tmp_path / name)


@pytest.fixture
def trace_path(tmp_path: Path) -> Path:
    return gpu_trace(tmp_path)


@pytest.fixture
def diagnosis(trace_path: Path) -> Diagnosis:
    return analyze(trace_path)


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


# The terminal report ----------------------------------------------------------------------------


def test_text_report_leads_with_the_verdict(diagnosis: Diagnosis) -> None:
    text = render_text(diagnosis, width=100)
    first_lines = "\n".join(text.splitlines()[:5])
    assert f"{diagnosis.verdict.wall.upper()} wall" in first_lines
    assert "trace.json.gz" in text.splitlines()[0]
    assert "NVIDIA H100 80GB HBM3" in text.splitlines()[0]
    for q in diagnosis.verdict.questions:
        assert q.question in text


def test_text_report_has_the_breakdown_rows(diagnosis: Diagnosis) -> None:
    text = render_text(diagnosis, width=100)
    for label in ("compute", "exposed communication", "exposed copies", "GPU idle"):
        assert label in text
    assert "data loading (DataLoader)" in text
    assert "launch latency" in text
    assert f"{diagnosis.breakdown.compute * 100:.1f}%" in text


def test_text_report_lists_the_kernels(diagnosis: Diagnosis) -> None:
    text = render_text(diagnosis, width=100)
    assert "volta_sgemm_128x64_nn" in text
    assert "Top kernels by GPU time" in text
    assert "GPU time by kernel class" in text


def test_text_report_prints_markup_in_names_literally(diagnosis: Diagnosis) -> None:
    text = render_text(diagnosis, width=100)
    assert MARKUP_NAME in text
    assert HTML_NAME in text


def test_text_report_prints_markup_in_the_file_name_literally(tmp_path: Path) -> None:
    d = analyze(gpu_trace(tmp_path, "[bold]run[red].json"))
    assert "[bold]run[red].json" in render_text(d, width=100)


def test_text_report_lines_fit_the_width(diagnosis: Diagnosis) -> None:
    for width in (60, 100, 160):
        text = render_text(diagnosis, width=width)
        assert max(len(line) for line in text.splitlines()) <= width


def test_text_report_is_plain_unless_colour_is_asked_for(diagnosis: Diagnosis) -> None:
    assert "\x1b[" not in render_text(diagnosis, width=100)
    assert "\x1b[" in render_text(diagnosis, width=100, color=True)


def test_text_report_is_deterministic(trace_path: Path) -> None:
    assert render_text(analyze(trace_path), width=100) == render_text(
        analyze(trace_path), width=100
    )


def test_cpu_report_shows_cpu_rows_and_ops(tmp_path: Path) -> None:
    b = TraceBuilder(device_name=None)
    for s in range(3):
        b.step(s + 1, s * 100.0, 100.0)
        b.dataloader(s * 100.0, 60.0)
        b.cpu_op("aten::mm", s * 100.0 + 60.0, 30.0)
    text = render_text(analyze(b.write(tmp_path / "cpu.json")), width=100)
    assert "CPU time per step" in text
    assert "ops doing arithmetic" in text
    assert "data loading (DataLoader)" in text
    assert "Top CPU ops" in text
    assert "aten::mm" in text
    assert "Top kernels" not in text


def test_folder_report_has_a_rank_table(tmp_path: Path) -> None:
    for r in (0, 1):
        training_trace(3, builder=TraceBuilder(rank=r, world_size=2)).write(
            tmp_path / f"rank-{r}.json"
        )
    text = render_text(analyze(tmp_path), width=100)
    assert "Ranks" in text
    assert "rank-0.json" in text
    assert "rank-1.json" in text


def test_bandwidth_verdict_on_unknown_kernels_is_not_called_unexplained(tmp_path: Path) -> None:
    b = TraceBuilder()
    for s in range(3):
        b.step(s + 1, s * 100.0, 100.0)
        b.kernel("my_custom_kernel", s * 100.0, 100.0, launch_at=s * 100.0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert (d.verdict.wall, d.verdict.cause) == ("bandwidth", "other")
    verdict_line = next(line for line in render_text(d, width=100).splitlines() if " wall " in line)
    assert "BANDWIDTH wall" in verdict_line
    assert "unexplained" not in verdict_line


# The JSON contract ------------------------------------------------------------------------------


def test_json_output_keeps_the_contract(
    trace_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["analyze", str(trace_path), "--format", "json"], capsys)
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["schema"] == "wallfinder.diagnosis/2"
    assert {"name", "matched_spec", "peak_flops", "mem_bandwidth"} <= set(doc["device"])
    assert doc["device"]["name"] == "NVIDIA H100 80GB HBM3"
    assert {"count", "median_s", "cv", "stable"} <= set(doc["steps"])
    assert isinstance(doc["steps"]["count"], int)
    assert isinstance(doc["steps"]["stable"], bool)
    breakdown = doc["breakdown"]
    assert {"compute", "comm_exposed", "copy_exposed", "idle", "idle_causes"} <= set(breakdown)
    parts = [breakdown[k] for k in ("compute", "comm_exposed", "copy_exposed", "idle")]
    assert sum(parts) == pytest.approx(1.0)
    assert sum(breakdown["idle_causes"].values()) == pytest.approx(breakdown["idle"])
    verdict = doc["verdict"]
    assert verdict["wall"] in ("compute", "bandwidth", "overhead")
    assert isinstance(verdict["cause"], str)
    assert len(verdict["questions"]) == 4
    for q in verdict["questions"]:
        assert {"question", "answer", "value"} <= set(q)
        assert q["answer"] in ("yes", "no", "unknown")
    assert isinstance(doc["findings"], list)
    assert doc["kernels"]
    for k in doc["kernels"]:
        assert {"name", "class", "time_s", "flops", "bytes", "ai", "bound", "pct_of_roof"} <= set(k)
    assert {k["name"] for k in doc["kernels"]} >= {MARKUP_NAME, HTML_NAME}
    assert {"value", "basis"} <= set(doc["mfu"])


def test_json_shares_are_fractions(diagnosis: Diagnosis) -> None:
    doc = json.loads(diagnosis.to_json())
    shares = [doc["breakdown"][k] for k in ("compute", "comm_exposed", "copy_exposed", "idle")]
    shares += list(doc["breakdown"]["idle_causes"].values())
    shares += [k["share"] for k in doc["kernels"]] + [c["share"] for c in doc["classes"]]
    assert all(0.0 <= s <= 1.0 for s in shares)


def test_output_file_gets_the_report(
    trace_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "report.json"
    code, out, err = run_cli(
        ["analyze", str(trace_path), "--format", "json", "-o", str(target)], capsys
    )
    assert (code, out, err) == (0, "", "")
    assert json.loads(target.read_text())["schema"] == "wallfinder.diagnosis/2"
    assert Diagnosis.from_json(target.read_text()) == analyze(trace_path)


def test_output_file_that_cannot_be_written_is_a_one_line_error(
    trace_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["analyze", str(trace_path), "-o", str(tmp_path)], capsys)
    assert code == 2
    assert err.startswith("wallfinder: error: ")
    assert err.count("\n") == 1


def test_text_is_the_default_cli_format(
    trace_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["analyze", str(trace_path)], capsys)
    assert code == 0
    assert out == render_text(analyze(trace_path), width=100)
    assert out == render(analyze(trace_path), "text")


def test_diagnosis_round_trips_through_json(diagnosis: Diagnosis) -> None:
    assert Diagnosis.from_json(diagnosis.to_json()) == diagnosis
    assert Diagnosis.from_json(diagnosis.to_json().encode()) == diagnosis
    assert json.loads(diagnosis.to_json()) == diagnosis.to_dict()


def test_cpu_and_folder_diagnoses_round_trip_through_json(tmp_path: Path) -> None:
    b = TraceBuilder(device_name=None)
    b.step(1, 0.0, 100.0)
    b.cpu_op("aten::mm", 10.0, 30.0)
    cpu = analyze(b.write(tmp_path / "cpu" / "t.json"))
    assert Diagnosis.from_json(cpu.to_json()) == cpu
    for r in (0, 1):
        training_trace(3, builder=TraceBuilder(rank=r, world_size=2)).write(
            tmp_path / "ranks" / f"rank-{r}.json"
        )
    ranks = analyze(tmp_path / "ranks")
    assert Diagnosis.from_json(ranks.to_json()) == ranks


# HTML -------------------------------------------------------------------------------------------


def test_html_form_escapes_names(tmp_path: Path) -> None:
    b = training_trace(3, kernels=("volta_sgemm_128x64_nn", HTML_NAME, NASTY_NAME))
    html = analyze(b.write(tmp_path / "t.json"))._repr_html_()
    assert html.startswith("<pre")
    assert "<script>" not in html
    assert "k&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "volta_sgemm_128x64_nn" in html


def test_html_form_has_only_formatting_tags(diagnosis: Diagnosis) -> None:
    tags = set(re.findall(r"</?([a-zA-Z]+)", diagnosis._repr_html_()))
    assert tags <= {"pre", "span", "code", "div"}


# Public API and paths ---------------------------------------------------------------------------


def test_public_api_is_exactly_the_documented_names() -> None:
    assert wallfinder.__all__ == [
        "Diagnosis",
        "ModelFlops",
        "Options",
        "Profile",
        "StepTimer",
        "Thresholds",
        "WallfinderError",
        "__version__",
        "analyze",
        "profile",
    ]
    for name in wallfinder.__all__:
        assert hasattr(wallfinder, name)
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", wallfinder.__version__)


def test_cli_version_flag_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert wallfinder.__version__ in capsys.readouterr().out


def test_no_absolute_path_appears_in_any_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "job"
    for r in (0, 1):
        training_trace(3, builder=TraceBuilder(rank=r, world_size=2)).write(
            folder / f"rank-{r}.json.gz"
        )
    (folder / "rank-2.json").write_bytes(b"hello")
    single = gpu_trace(tmp_path)
    for target in (single, folder):
        d = analyze(target)
        outputs = [render_text(d, width=200), d.to_json(), d._repr_html_()]
        for fmt in ("text", "json"):
            code, out, err = run_cli(["analyze", str(target), "--format", fmt], capsys)
            assert code == 0
            outputs += [out, err]
        for text in outputs:
            assert str(tmp_path) not in text
            assert str(tmp_path.resolve()) not in text
    assert analyze(single).source == "trace.json.gz"
