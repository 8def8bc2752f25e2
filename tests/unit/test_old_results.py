"""Results saved by older releases keep loading: tests/data holds a diagnosis and a memory
report written by the release whose schemas were /1 (see the commit that added them: the
diagnosis is `analyze --format json` of test_memory_profile's
`training_with_memory(leak=MiB, churn=True)`), read here upgraded, and through diff, check and
history."""

from __future__ import annotations

import json
import sqlite3
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_memory_profile import MiB, training_with_memory

from wallfinder import analyze
from wallfinder.analysis.check import Bounds, check
from wallfinder.analysis.diff import diff
from wallfinder.api import load_diagnosis
from wallfinder.cli import main
from wallfinder.diagnosis import MEMORY_SCHEMA, SCHEMA, Diagnosis, MemoryReport
from wallfinder.history import History

DATA = Path(__file__).parent.parent / "data"
V1 = DATA / "diagnosis-v1.json"
MEMORY_V1 = DATA / "memory-v1.json"


def _without(rows: list[dict[str, Any]], added: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in added} for r in rows]


_ROOFLINE_V2 = (
    "matmul_bandwidth_share",
    "matmul_unknown_share",
    "latency_bound_share",
    "by_counters",
    "l2_bandwidth",
    "l2_bandwidth_estimate",
    "l2_fit_share",
    "l2_note",
)
_COUNTED = ("estimated_bound", "bound_basis", "fits_l2", "pct_of_l2_roof")
"""What hardware counters added to a kernel and an op row (additive)."""
_REPLAY = ("gain_basis", "replay_speedup", "wall_after")
"""The fields a finding's replayed gain added (additive: /2 files without them still load)."""
_REACH = ("reach",)
"""What a finding's reachable part of the step added (additive)."""
_TIMELINE = ("busy", "streaming", "beside")
"""What a class's weights on the device's timeline added (additive: None or 0 when absent)."""


def _as_v1(d: dict[str, Any]) -> dict[str, Any]:
    """A /2 JSON form as /1 wrote it: the findings, breakdown, verdict, blocks and leak sites
    without the fields /2 added (the memory model's blocks and leaks are shared with the
    snapshot's report)."""
    replay = (*_REPLAY, *_REACH)
    memory_only = ("wall", "share", "max_speedup", "saves", *replay)
    skip = ("trace_format", "counters", "critical_path", "phases", "modules", "not_computed")
    skip += ("more_kernels",)  # the kernel table past the top rows: kept from /2 on
    skip += ("parallelism",)  # the strategies found: kept from /2 on
    skip += ("compiled",)  # torch.compile's regions and counts: kept from /2 on
    skip += ("serving",)  # a serving trace's iterations, prefill/decode and MBU: from /2 on
    out = {k: v for k, v in d.items() if k not in skip}
    out["schema"] = "wallfinder.diagnosis/1"
    added = ("graph_replayed", "comm_hidden")
    out["breakdown"] = {k: v for k, v in d["breakdown"].items() if k not in added}
    # (`mechanism`: the parallel strategy a comm-bound verdict names, kept from /2 on.)
    out["verdict"] = {
        k: v for k, v in d["verdict"].items() if k not in ("thin_evidence", "mechanism")
    }
    if d.get("roofline"):
        out["roofline"] = _without([d["roofline"]], _ROOFLINE_V2)[0]
        for key in ("ops", "more_ops"):
            if key in out["roofline"]:
                out["roofline"][key] = _without(out["roofline"][key], _COUNTED[1:])
    out["kernels"] = _without(d["kernels"], _COUNTED[:1])
    out["classes"] = _without(d["classes"], _TIMELINE)
    out["findings"] = [
        {k: v for k, v in f.items() if k not in ("saves", "saving_bytes", "device", *replay)}
        for f in d["findings"]
    ]
    if d.get("memory"):
        out["memory"] = {
            **d["memory"],
            "findings": [
                {k: v for k, v in f.items() if k not in memory_only}
                for f in d["memory"]["findings"]
            ],
            "devices": [
                {
                    **m,
                    "largest": _without(m["largest"], ("device",)),
                    "leak_sites": _without(m["leak_sites"], ("category", "device")),
                }
                for m in d["memory"]["devices"]
            ],
        }
    return out


def test_a_v1_diagnosis_loads_as_v2_with_nothing_else_changed() -> None:
    text = V1.read_text()
    assert json.loads(text)["schema"] == "wallfinder.diagnosis/1"
    d = load_diagnosis(V1)
    assert d.schema == SCHEMA
    assert [(f.id, f.saves) for f in d.findings] == [
        ("data-loading", "time"),
        ("launch-bound", "time"),
        ("tiny-grids", "time"),
    ]
    assert d.memory is not None
    mem = d.memory.findings
    assert [f.id for f in mem] == ["memory-churn", "memory-leak"]
    for f in mem:
        assert (f.saves, f.wall, f.share, f.max_speedup, f.device) == (
            "memory",
            None,
            0.0,
            1.0,
            "cuda:0",
        )
    assert mem[0].saving_bytes is None
    assert mem[1].saving_bytes == 5 * MiB  # the growth over the steady steps
    assert _as_v1(json.loads(d.to_json())) == json.loads(text)
    # Saved again, it is a /2 file that reads back the same.
    assert Diagnosis.from_json(d.to_json()) == d


def test_a_v1_diagnosis_is_what_this_release_finds_in_the_same_trace(tmp_path: Path) -> None:
    old = load_diagnosis(V1)
    new = analyze(training_with_memory(leak=MiB, churn=True).write(tmp_path / "training.json"))

    def claims(d: Diagnosis) -> list[tuple[object, ...]]:
        # What a script relies on; the evidence's wording may improve between releases (the
        # launch-to-start figure is now measured from the end of the launch call).
        return [(f.id, f.wall, f.share, f.max_speedup, f.fix, f.saves) for f in d.findings]

    assert claims(old) == claims(new)
    assert old.memory is not None
    assert new.memory is not None
    assert old.memory.findings == new.memory.findings


def test_a_v1_diagnosis_diffs_and_checks_against_a_new_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    trace = training_with_memory(leak=MiB, churn=True).write(tmp_path / "training.json")
    x = diff(load_diagnosis(V1), analyze(trace))
    assert {(f.id, f.status) for f in x.findings} == {
        ("data-loading", "remaining"),
        ("launch-bound", "remaining"),
        ("tiny-grids", "remaining"),
    }
    assert x.memory is not None
    assert [(f.id, f.status) for f in x.memory.findings] == [
        ("memory-churn", "remaining"),
        ("memory-leak", "remaining"),
    ]
    assert main(["diff", str(V1), str(trace)]) == 0
    out = capsys.readouterr().out
    assert "memory findings remaining: memory-churn, memory-leak" in out
    [leak] = check(load_diagnosis(V1), Bounds(no_memory_leak=True))
    assert not leak.held
    assert main(["check", str(V1), "--no-memory-leak"]) == 1
    assert "a leak, against --no-memory-leak" in capsys.readouterr().out


def test_a_v1_diagnosis_stored_in_the_history_loads(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite3"
    with History(db) as history:
        run = history.record("job", load_diagnosis(V1), commit=None, host=None)
    # As a release with schema /1 stored it: its own JSON, compressed.
    with sqlite3.connect(db) as con:
        con.execute(
            "UPDATE runs SET diagnosis = ? WHERE id = ?",
            (zlib.compress(V1.read_bytes()), run.id),
        )
    con.close()
    with History(db) as history:
        assert history.diagnosis(run.id) == load_diagnosis(V1)


def test_a_v1_memory_report_loads_as_v2() -> None:
    text = MEMORY_V1.read_text()
    r = MemoryReport.from_json(text)
    assert r.schema == MEMORY_SCHEMA
    assert [(f.id, f.saves, f.wall, f.device) for f in r.findings] == [
        ("memory-fragmentation", "memory", None, "cuda:0"),
        ("memory-optimizer-state", "memory", None, None),
        ("memory-leak-suspect", "memory", None, None),
    ]
    # /1's "unknown" category is the one vocabulary's "other".
    assert list(r.categories) == [
        "parameters",
        "optimizer_state",
        "gradients",
        "activations",
        "other",
    ]
    assert [s.category for s in r.leaks] == ["other"]
    again = msgspec.json.decode(r.to_json())
    for f in again["findings"]:
        for key in ("wall", "share", "max_speedup", "saves", *_REPLAY, *_REACH):
            del f[key]
    assert _memory_as_v1({**again, "schema": "wallfinder.memory/1"}) == json.loads(text)


def _memory_as_v1(d: dict[str, Any]) -> dict[str, Any]:
    """A /2 memory report as /1 wrote it: "other" named "unknown", and the blocks and leaks
    without the fields the memory model added."""

    def v1(cats: dict[str, int]) -> dict[str, int]:
        return {("unknown" if k == "other" else k): v for k, v in cats.items()}

    def v1_rows(rows: list[dict[str, Any]], added: tuple[str, ...]) -> list[dict[str, Any]]:
        return [
            {**r, "category": "unknown" if r["category"] == "other" else r["category"]}
            for r in _without(rows, added)
        ]

    return {
        **d,
        "categories": v1(d["categories"]),
        "devices": [{**x, "categories": v1(x["categories"])} for x in d["devices"]],
        "peaks": [
            {**p, "categories": v1(p["categories"]), "sites": v1_rows(p["sites"], ())}
            for p in _without(d["peaks"], ("time_s",))
        ],
        "sites": v1_rows(d["sites"], ()),
        "largest": v1_rows(d["largest"], ("op", "step", "phase")),
        "leaks": v1_rows(d["leaks"], ("op", "steps")),
    }
