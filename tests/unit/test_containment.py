"""A bug in one optional view costs that view, not the verdict; a bug anywhere else is one
line and exit code 3 (the user's bad input stays exit code 2); `--debug` shows the
traceback."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import wallfinder.analysis as analysis
import wallfinder.analysis.findings as findings
import wallfinder.analysis.phases as phases
import wallfinder.analysis.rules as rules
from invariants import assert_diagnosis_invariants
from tracegen import TraceBuilder, phased_training_trace
from wallfinder import Diagnosis
from wallfinder.analysis import diagnose
from wallfinder.cli import main
from wallfinder.errors import DEBUG_ENV
from wallfinder.trace import load_trace


def broken(*_: Any, **__: Any) -> Any:
    raise KeyError("DistributedDataParallel.forward")


# Each optional view, and the function in whose module namespace it is looked up.
VIEWS: dict[str, tuple[Any, str]] = {
    "phases": (analysis, "attribute"),
    "modules": (phases, "_modules"),
    "fusion": (analysis, "fusion_candidates"),
    "timeline": (analysis, "step_timeline"),
    "critical path": (analysis, "critical_path"),
    "memory": (analysis, "memory_profile"),
}


def traced(tmp_path: Path) -> TraceBuilder:
    b = phased_training_trace(4)
    for s in range(4):  # memory events, so the memory view has something to show
        t0, addr = s * 1000.0, 0x1000 * (s + 1)
        b.memory(t0 + 150.0, addr, 1 << 20, 1 << 20, 2 << 20)
        b.memory(t0 + 900.0, addr, -(1 << 20), 0, 2 << 20)
    return b


def two_rank_job(tmp_path: Path) -> Path:
    """A folder of two ranks' traces of the phased training job."""
    job = tmp_path / "job"
    job.mkdir()
    for rank in range(2):
        b = phased_training_trace(3, builder=TraceBuilder(rank=rank, world_size=2))
        b.write(job / f"rank{rank}.json")
    return job


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    return traced(tmp_path).write(tmp_path / "t.json")


def what_the_verdict_says(d: Diagnosis) -> tuple[Any, ...]:
    return (d.verdict, d.steps, d.breakdown, d.classes, d.kernels, d.roofline, d.mfu)


@pytest.mark.parametrize("view", list(VIEWS))
def test_a_bug_in_one_view_leaves_the_view_out_and_the_verdict_as_it_was(
    view: str, trace_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    whole = diagnose(load_trace(trace_file))
    assert whole.not_computed == {}
    module, name = VIEWS[view]
    monkeypatch.setattr(module, name, broken)
    d = diagnose(load_trace(trace_file))
    assert d.not_computed == {
        view: "internal error: KeyError 'DistributedDataParallel.forward'; rerun with --debug"
    }
    assert what_the_verdict_says(d) == what_the_verdict_says(whole)
    assert_diagnosis_invariants(d)
    left_out: dict[str, Callable[[Diagnosis], object]] = {
        "phases": lambda x: x.phases,
        "modules": lambda x: x.modules,
        "fusion": lambda x: x.fusion or None,
        "timeline": lambda x: x.timeline,
        "critical path": lambda x: x.critical_path,
        "memory": lambda x: x.memory,
    }
    assert left_out[view](whole) is not None or view == "fusion"
    assert left_out[view](d) is None
    if view == "phases":
        assert d.modules is None  # the module table is made with the phases


def test_a_bug_in_one_rule_costs_that_finding_alone(
    trace_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    whole = diagnose(load_trace(trace_file))
    assert len(whole.findings) >= 2
    # The rule of the top finding fails: its finding is left out, the others stay.
    top = whole.findings[0]
    index = next(
        i
        for i, r in enumerate(rules.rules_for(findings.Facts))
        if r.name.replace("_", "-") == top.id
    )
    at = rules.RULES.index(rules.rules_for(findings.Facts)[index])
    patched = list(rules.RULES)
    patched[at] = rules.Rule(findings.Facts, broken)
    monkeypatch.setattr(rules, "RULES", patched)
    d = diagnose(load_trace(trace_file))
    assert list(d.not_computed) == ["finding broken"]
    assert d.verdict == whole.verdict
    assert sorted(f.id for f in d.findings) == sorted(f.id for f in whole.findings[1:])


@pytest.mark.parametrize("fmt", ["text", "md", "html", "json"])
def test_every_format_says_which_view_was_not_computed(
    fmt: str,
    trace_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.setattr(phases, "_modules", broken)
    out = tmp_path / f"report.{fmt}"
    assert main(["analyze", str(trace_file), "--format", fmt, "-o", str(out), "--no-cache"]) == 0
    text = out.read_text()
    assert "modules: not computed (internal error: KeyError" in text or (
        fmt == "json" and '"modules": "internal error: KeyError' in text
    )
    assert "Traceback" not in capsys.readouterr().err


def test_a_bug_outside_the_views_is_one_line_and_exit_code_3(
    trace_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.setattr(analysis, "decide", broken)
    assert main(["analyze", str(trace_file), "--no-cache"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert err.startswith("wallfinder: internal error: analyze on t.json")
    assert "KeyError 'DistributedDataParallel.forward'" in err
    assert "bug in wallfinder" in err
    assert "--debug" in err
    assert str(trace_file.parent) not in err  # the file's name, not the user's folders


def test_a_bug_in_a_rank_of_a_folder_names_that_rank_s_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    job = two_rank_job(tmp_path)
    monkeypatch.setattr(analysis, "decide", broken)
    assert main(["analyze", str(job), "--no-cache", "--workers", "1"]) == 3
    err = capsys.readouterr().err
    assert "analyze on rank0.json in analysis" in err


@pytest.mark.parametrize("how", ["flag", "flag after the command", "environment"])
def test_debug_shows_the_traceback_and_lets_a_view_s_bug_through(
    how: str, trace_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    monkeypatch.setattr(phases, "_modules", broken)
    argv = ["analyze", str(trace_file), "--no-cache"]
    if how == "flag":
        argv = ["--debug", *argv]
    elif how == "flag after the command":
        argv = [*argv, "--debug"]
    else:
        monkeypatch.setenv(DEBUG_ENV, "1")
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "_modules" in err
    if how != "environment":
        assert DEBUG_ENV not in os.environ  # the flag does not outlive the call


def test_a_bug_in_the_cross_rank_join_leaves_the_lowest_rank_s_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wallfinder.analysis.job as job_module
    from wallfinder import analyze

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    job = two_rank_job(tmp_path)
    whole = analyze(job, workers=1)
    assert whole.job is not None
    monkeypatch.setattr(job_module, "join", broken)
    d = analyze(job, workers=1)
    assert list(d.not_computed) == ["collectives"]
    assert d.job is None
    assert d.verdict == whole.verdict
    assert d.rank == 0
