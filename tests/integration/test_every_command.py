"""Every real input in ../shared/traces through every command that reads it, as a user types
it: `analyze` (each trace file and each folder, in every format, with `--export` and
`--annotate`, with `--counters`), `diff` of pairs, `check` of a run against itself, `memory` on
the allocator snapshots, `counters` on the Nsight Compute exports.

None may end in exit 1 or 3 or print a traceback: each ends with 0 (a report), or with 2 and one
line for the one input that is honestly bad (a trace that recorded nothing), and no optional
view of any real trace is left out for an internal error (`not_computed` is empty).

The calls are in-process `main(argv)` calls. Every trace's parse and diagnosis go into the
session's cache (conftest.py: a temporary folder), not only a large one's, so that a trace
read by several commands is parsed and diagnosed once for each set of options, and each
format renders that diagnosis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

import wallfinder.trace._cache as cache_module
from realtraces import TRACES, missing_reason, real_files
from wallfinder.cli import main
from wallfinder.errors import DEBUG_ENV
from wallfinder.report import COUNTER_FORMATS, DIFF_FORMATS, FORMATS, MEMORY_FORMATS

BAD_INPUTS = {"other/empty_trace.json"}
"""Inputs that are honestly bad: every command says so in one line and exits 2."""

TRACE_FILES = real_files("*.json.gz", "*.json", "*.sqlite")
KINETO_FILES = [f for f in TRACE_FILES if f.suffix != ".sqlite"]
FOLDERS = sorted(
    {f.parent for f in TRACE_FILES if sum(g.parent == f.parent for g in TRACE_FILES) >= 2}
)
"""Every folder of two traces or more: a job's rank traces (hta/sampled_128rank_job), and
the collection's own folders of unrelated traces (hta, other, ...), which are analysed as one
of them with a note saying why."""
SNAPSHOTS = real_files("*.pickle")
NCU_EXPORTS = real_files("*.ncu.csv", "*.ncu.csv.gz")

TMP = "{tmp}"
"""In an argument: the test's temporary folder."""


@dataclass(frozen=True)
class Run:
    """One command line: its inputs are real files or folders, its outputs under TMP."""

    args: tuple[str | Path, ...]

    @property
    def inputs(self) -> list[Path]:
        return [a for a in self.args if isinstance(a, Path)]

    @property
    def bad(self) -> bool:
        return any(rel(p) in BAD_INPUTS for p in self.inputs)

    def argv(self, tmp: Path) -> list[str]:
        return [str(a).replace(TMP, str(tmp)) for a in self.args]

    @property
    def slow(self) -> bool:
        """A folder of the collection: each of its traces is diagnosed on every run (a folder's
        result is not cached), seconds each; its traces are in the fast lane one by one."""
        return any(p.is_dir() and p.parent == TRACES for p in self.inputs)

    @property
    def id(self) -> str:
        words = [rel(a) if isinstance(a, Path) else a for a in self.args]
        return " ".join(w for w in words if TMP not in w)


def rel(path: Path) -> str:
    return str(path.relative_to(TRACES))


def real(path: str) -> Path:
    return TRACES / path


def runs() -> list[Run]:
    inputs = [*TRACE_FILES, *FOLDERS]
    out: list[Run] = []
    for path in inputs:
        out += [Run(("analyze", path, "--format", fmt)) for fmt in FORMATS]
        out.append(Run(("analyze", path, "--export", f"{TMP}/tables", "-o", f"{TMP}/report")))
        # Against itself, the regression bound holds: exit 0, never 1.
        out.append(Run(("check", path, "--baseline", path, "--max-regression", "0")))
    out += [Run(("analyze", path, "--annotate", f"{TMP}/marks.json.gz")) for path in KINETO_FILES]
    # Each trace before and after its neighbour in the folder's order: every one on both
    # sides, across devices, units and kinds of run.
    out += [
        Run(("diff", before, after, "--format", "json")) for before, after in pairwise(TRACE_FILES)
    ]
    # Pairs that are runs of one job or one model, in every format.
    pairs = [
        ("hta/a100_8rank_control_rank0.json.gz", "hta/v100_2rank_test_rank0.json.gz"),
        ("other/a100pcie_part_forward_bs2.json.gz", "other/a100pcie_part_forward_bs512.json.gz"),
        ("hta/sampled_128rank_job/rank-0.json.gz", "hta/sampled_128rank_job"),
        ("param/rtx2080ti_linear.json.gz", "nsys/llama3_inference_demo.sqlite"),
    ]
    for before, after in pairs:
        if real(before).exists() and real(after).exists():
            out += [
                Run(("diff", real(before), real(after), "--format", fmt)) for fmt in DIFF_FORMATS
            ]
    for snapshot in SNAPSHOTS:
        out += [Run(("memory", snapshot, "--format", fmt)) for fmt in MEMORY_FORMATS]
    # The counters alone, beside a trace file, and beside a job's folder (joined by name).
    beside = [real("hta/a100_alexnet.json.gz"), real("hta/sampled_128rank_job")]
    for export in NCU_EXPORTS:
        out += [Run(("counters", export, "--format", fmt)) for fmt in COUNTER_FORMATS]
        for trace in filter(Path.exists, beside):
            if trace.is_file():
                out.append(Run(("counters", export, "--trace", trace, "--format", "json")))
            out.append(Run(("analyze", trace, "--counters", export, "--format", "json")))
    return out


def params() -> list[object]:
    found = runs()
    if not found:
        return [pytest.param(None, marks=pytest.mark.skip(reason=missing_reason()), id="none")]
    return [pytest.param(r, id=r.id, marks=[pytest.mark.slow] if r.slow else []) for r in found]


@pytest.fixture(autouse=True, scope="module")
def _cache_every_trace() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cache_module, "FROM_BYTES", 0)
        yield


@pytest.mark.parametrize("run", params())
def test_every_command_on_every_real_input_gives_a_report_or_one_line(
    run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without --debug: the views' boundaries contain their errors, as for a user.
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    code = main(run.argv(tmp_path))
    out, err = capsys.readouterr()
    if "-o" in run.args and code == 0:
        out += (tmp_path / "report").read_text(encoding="utf-8")
    assert "Traceback" not in out + err
    # Neither exit 3 nor a view left out ("modules: not computed (internal error: …)").
    assert "internal error" not in out + err, err
    if run.bad:
        assert code == 2
        assert len(err.strip().splitlines()) == 1, err
        return
    assert code == 0, err
    if run.args[0] == "analyze" and "json" in run.args:
        assert json.loads(out)["not_computed"] == {}
    if "--export" in run.args:
        assert any((tmp_path / "tables").glob("*.csv"))
    if "--annotate" in run.args:
        assert (tmp_path / "marks.json.gz").stat().st_size > 0
