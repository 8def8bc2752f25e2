"""The pipeline as a declared list of stages: each runs once, in order, reading the parts of
the stages before it; an optional view's internal error is contained by the runner (its part
None, said in `not_computed`), the user's bad input is not."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import wallfinder.analysis as analysis
from tracegen import training_trace
from wallfinder import WallfinderError
from wallfinder.analysis import diagnose
from wallfinder.analysis.pipeline import Stage, Upstream, View, run, timings
from wallfinder.analysis.views import Views
from wallfinder.trace import load_trace


def a_scope() -> Any:
    return SimpleNamespace(views=Views())  # all the runner reads of a scope


def test_stages_run_once_in_order_and_a_failing_view_costs_only_its_part() -> None:
    calls: list[str] = []

    def first(scope: Any, up: Upstream) -> int:
        calls.append("first")
        return 2

    def broken(scope: Any, up: Upstream) -> int:
        calls.append("broken")
        return up[first_stage] // 0

    first_stage: Stage[Upstream, int] = Stage("first", first)
    broken_view: View[Upstream, int] = View("phases", broken)
    last_stage: Stage[Upstream, tuple[int, int | None]] = Stage(
        "last", lambda scope, up: (up[first_stage] + 1, up[broken_view])
    )
    scope, up = a_scope(), Upstream()
    run((first_stage, broken_view, last_stage), scope, up)
    assert calls == ["first", "broken"]
    assert up[last_stage] == (3, None)
    assert scope.views.failed["phases"].startswith("internal error: ZeroDivisionError")


def test_a_stage_that_fails_fails_the_diagnosis_and_bad_input_passes_a_view() -> None:
    def bad_input(scope: Any, up: Upstream) -> None:
        raise WallfinderError("a bad --what-if")

    with pytest.raises(WallfinderError, match="bad --what-if"):
        run((View("critical path", bad_input),), a_scope(), Upstream())
    with pytest.raises(ZeroDivisionError):
        run((Stage("verdict", lambda scope, up: 1 // 0),), a_scope(), Upstream())


def test_a_reading_of_a_stage_not_run_yet_is_an_error_of_the_list() -> None:
    later: Stage[Upstream, int] = Stage("later", lambda scope, up: 1)
    with pytest.raises(KeyError):
        run((Stage("early", lambda scope, up: up[later]), later), a_scope(), Upstream())


def test_a_diagnosis_runs_each_declared_stage_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = load_trace(training_trace(5).write(tmp_path / "t.json"))
    counts = [0] * len(analysis.STAGES)

    def counted(i: int, stage: Any) -> Any:
        def run_once(scope: Any, up: Any) -> Any:
            counts[i] += 1
            return stage.run(scope, up)

        return type(stage)(stage.name, run_once, stage.frees)

    wrapped = tuple(counted(i, s) for i, s in enumerate(analysis.STAGES))
    # The stages read each other's parts by stage: the wrapped ones stand in for them.
    for name, value in vars(analysis).copy().items():
        if isinstance(value, Stage | View) and value in analysis.STAGES:
            monkeypatch.setattr(analysis, name, wrapped[analysis.STAGES.index(value)])
    monkeypatch.setattr(analysis, "STAGES", wrapped)
    d = diagnose(trace)
    assert counts == [1] * len(wrapped)
    assert d.critical_path is not None
    assert d.phases is not None


def test_the_timing_hook_records_every_stage_by_name_and_nothing_when_off(
    tmp_path: Path,
) -> None:
    """Inside `timings()` each stage of the list (and the steps around it: the scope, the
    device model, the findings) is recorded under its name, in the order it ran; outside it
    nothing is."""
    trace = load_trace(training_trace(4).write(tmp_path / "t.json"))
    with timings() as made:
        diagnose(trace)
    stages = [t.name for t in made if t.kind == "stage"]
    assert stages == [
        "cpu steps",
        "device ops",
        "device model",
        "scope",
        *(s.name for s in analysis.STAGES),
        "findings",
    ]
    assert {"graph", "replay unchanged", "walk unchanged"} <= {
        t.name for t in made if t.kind == "part"
    }
    outside: list[object] = []
    with timings() as outside_made:
        pass
    diagnose(trace)
    assert outside_made == outside == []
