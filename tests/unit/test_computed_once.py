"""What several analyses derive from one trace or one rank's facts is computed once per run
(issue 36): the communication ops' codes, the host rows' categories, the strategies' host
collectives (`Trace.once`, `Facts.once`). Counted calls, never times."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_parallelism import _tp

from tracegen import TraceBuilder, phased_training_trace
from wallfinder.analysis import classify, diagnose, gpu
from wallfinder.analysis.topics import sharding
from wallfinder.trace import Trace, dynamo, load_trace

STEPS = 4


def _counted(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[object]:
    """Replace `module.name` by a wrapper that records each call's first argument."""
    calls: list[object] = []
    real: Callable[..., Any] = getattr(module, name)

    def counting(*args: Any) -> Any:
        calls.append(args[0])
        return real(*args)

    monkeypatch.setattr(module, name, counting)
    return calls


def _tp_trace(tmp_path: Path) -> Trace:
    """A two-rank TP job's rank: an all-reduce inside each step's forward."""
    b = phased_training_trace(STEPS, builder=TraceBuilder(rank=0, world_size=2))
    for s in range(STEPS):
        _tp(b, s * 1000.0)
    return load_trace(b.write(tmp_path / "t.json.gz"))


def test_trace_once_computes_each_function_once(tmp_path: Path) -> None:
    trace = _tp_trace(tmp_path)
    calls: list[str] = []

    def first(t: Trace) -> int:
        calls.append("first")
        return len(t.strings)

    def second(t: Trace) -> str:
        calls.append("second")
        return t.source

    assert trace.once(first) == trace.once(first) == len(trace.strings)
    assert trace.once(second) == trace.once(second) == trace.source
    assert calls == ["first", "second"]


def test_the_communication_ops_host_categories_and_compile_ranges_are_found_once_per_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = _tp_trace(tmp_path)
    comm = _counted(monkeypatch, classify, "_communication_ops")
    categories = _counted(monkeypatch, gpu, "_host_category_table")
    compiles = _counted(monkeypatch, dynamo, "_compile_codes")
    d = diagnose(trace)
    assert "tp-allreduce-exposed" in [f.id for f in d.findings]  # (the rules that read them ran)
    assert len(comm) == 1
    assert len(categories) == 1
    assert len(compiles) == 1


def test_the_strategies_host_collectives_are_found_once_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read by the TP rule, its claim and its lever, and the experts' rule, claim and lever,
    # from the facts the critical path's levers are selected from and from those the
    # findings are made from: found once for both.
    trace = _tp_trace(tmp_path)
    calls = _counted(monkeypatch, sharding, "host_collectives")
    diagnose(trace)
    assert len(calls) == 1
