"""Parallel jobs run for real (torch on the CPU, two gloo ranks under torchrun, profiled by
`wallfinder run`): the strategy is named from the trace with its evidence, and its own loss is
a finding with its share. The jobs are tests/data/jobs/*.py, small enough for a few seconds."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from wallfinder.cli import main

pytest.importorskip("torch")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("torchrun") is None
        and not os.access(Path(sys.executable).with_name("torchrun"), os.X_OK),
        reason="torchrun is not installed",
    ),
]

JOBS = Path(__file__).parents[1] / "data" / "jobs"


def run_job(tmp_path: Path, script: str) -> dict[str, Any]:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    report = tmp_path / "report.json"
    code = main(
        [
            "run",
            "--steps",
            "3",
            "--warmup",
            "2",
            "--trace-dir",
            str(tmp_path / "traces"),
            "--format",
            "json",
            "-o",
            str(report),
            "--",
            torchrun,
            "--nproc-per-node",
            "2",
            str(JOBS / script),
        ]
    )
    assert code == 0
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def _strategy(d: dict[str, Any], name: str) -> dict[str, Any]:
    (s,) = [s for s in d["parallelism"]["strategies"] if s["name"] == name]
    return s


def test_an_fsdp2_job_is_named_fsdp_with_its_exposed_gathers(tmp_path: Path) -> None:
    d = run_job(tmp_path, "fsdp2_job.py")
    fsdp = _strategy(d, "FSDP")
    assert any("FSDP's own ranges" in e and "3 units" in e for e in fsdp["evidence"])
    assert any("all-gather ×3/step in the forward" in e for e in fsdp["evidence"])
    (f,) = [f for f in d["findings"] if f["id"] == "fsdp-exposed-gather"]
    # CPU collectives block the main thread: the gathers are a share of the step, per unit.
    assert 0.02 <= f["share"] < 1
    assert "unit 0" in f["evidence"]
    assert "unit 2" in f["evidence"]
    assert "no forward prefetch" in f["evidence"]
    # FSDP's own finding takes its gathers out of the generic exposed-comm, and ranks before
    # it: the two add up to the breakdown's exposed communication, nothing counted twice.
    # (Which finding is first overall moves with the busy machine's timing.)
    _adds_up(d, f)
    _lever_moves_the_step(d, f, "prefetch")
    exposed = d["breakdown"]["comm_exposed"]
    if d["verdict"]["cause"] == "comm_exposed" and f["share"] > exposed / 2:
        assert d["verdict"]["mechanism"] == "FSDP all-gathers not prefetched"


def _lever_moves_the_step(d: dict[str, Any], own: dict[str, Any], lever: str) -> None:
    """The strategy's lever is a row of the default what-if table, replayed faster than the
    unchanged graph, and the finding's gain is that replay, within its bound."""
    path = d["critical_path"]
    (row,) = [r for r in path["what_if"] if r["change"] == lever]
    assert row["step_s"] < path["replayed_step_s"]
    assert own["gain_basis"] == "replay"
    assert 1.0 < own["replay_speedup"] <= own["max_speedup"]


def _adds_up(d: dict[str, Any], own: dict[str, Any]) -> None:
    """The strategy's finding `own` and exposed-comm share the exposed communication (all of
    it `own`'s where it claims more than the breakdown holds)."""
    ids = [f["id"] for f in d["findings"]]
    if "exposed-comm" in ids:
        assert ids.index(own["id"]) < ids.index("exposed-comm")
    rest = sum(f["share"] for f in d["findings"] if f["id"] == "exposed-comm")
    exposed = d["breakdown"]["comm_exposed"]
    assert own["share"] + rest == pytest.approx(max(own["share"], exposed), abs=0.005)


def test_a_tensor_parallel_job_is_named_tp_with_its_forward_all_reduces(tmp_path: Path) -> None:
    d = run_job(tmp_path, "tp_job.py")
    assert [s["name"] for s in d["parallelism"]["strategies"]] == ["TP"]
    tp = _strategy(d, "TP")
    # Two MLPs, each with one row-parallel layer: two all-reduces per forward.
    assert any("all-reduce ×2/step in the forward" in e for e in tp["evidence"])
    (f,) = [f for f in d["findings"] if f["id"] == "tp-allreduce-exposed"]
    assert 0.02 <= f["share"] < 1
    assert "2 all-reduces/step inside the forward" in f["evidence"]
    _adds_up(d, f)
    _lever_moves_the_step(d, f, "async-tp")
