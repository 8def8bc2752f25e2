"""`analyze --export DIR`: the diagnosis's tables as CSV (and Parquet with pyarrow), read back
and checked against the diagnosis and against the trace's known phases and modules."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import msgspec
import pytest
from test_report_and_cli import run_cli

from tracegen import phased_training_trace, training_trace
from wallfinder import Diagnosis, analyze
from wallfinder.analysis import TOP_ROWS
from wallfinder.report.export import PARQUET_MISSING, export_tables, tables

US = 1e-6
TABLES = ("kernels", "ops", "modules", "phases", "roofline")


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def exported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Diagnosis, str]:
    trace = phased_training_trace(5).write(tmp_path / "t.json")
    folder = tmp_path / "tables"
    code, out, err = run_cli(
        ["analyze", str(trace), "--format", "json", "--export", str(folder)], capsys
    )
    assert code == 0
    return folder, Diagnosis.from_json(out), err


def test_export_writes_every_table_as_csv_and_parquet(
    exported: tuple[Path, Diagnosis, str],
) -> None:
    folder, _, err = exported
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        f"{t}.{ext}" for t in TABLES for ext in ("csv", "parquet")
    )
    assert err.count("\n") == 1
    assert "wrote 10 files" in err
    assert "(CSV and Parquet)" in err


def test_the_phase_table_holds_each_steps_known_phases(
    exported: tuple[Path, Diagnosis, str],
) -> None:
    folder, d, _ = exported
    rows = read_csv(folder / "phases.csv")
    assert d.phases is not None
    assert [r["step"] for r in rows] == [s.step for s in d.phases.steps]
    steady = rows[-1]
    assert float(steady["duration_s"]) == pytest.approx(1000 * US)
    assert float(steady["forward_exposed_s"]) == pytest.approx(325 * US)
    assert float(steady["backward_exposed_s"]) == pytest.approx(380 * US)
    assert float(steady["backward_gpu_s"]) == pytest.approx(300 * US)
    assert float(steady["optimizer_gpu_s"]) == pytest.approx(50 * US)
    exposed = [float(v) for k, v in steady.items() if k.endswith("_exposed_s")]
    assert sum(exposed) == pytest.approx(float(steady["duration_s"]))


def test_the_module_table_holds_the_module_tree(exported: tuple[Path, Diagnosis, str]) -> None:
    folder, d, _ = exported
    rows = {r["path"]: r for r in read_csv(folder / "modules.csv")}
    assert d.modules is not None
    assert set(rows) == {m.path for m in d.modules.rows}
    for m in d.modules.rows:
        row = rows[m.path]
        assert row["parent"] == (m.parent or "")
        assert float(row["forward_s"]) == pytest.approx(m.forward_s)
        assert float(row["backward_s"]) == pytest.approx(m.backward_s)
        assert float(row["gemm_s"]) == pytest.approx(m.classes.get("gemm", 0.0))
    # The two blocks' GEMMs, forward and backward, per step.
    top = next(r for r in rows.values() if not r["parent"])
    assert float(top["forward_s"]) == pytest.approx(250 * US)
    assert float(top["backward_s"]) == pytest.approx(300 * US)


def test_the_kernel_and_op_tables_match_the_diagnosis(
    exported: tuple[Path, Diagnosis, str],
) -> None:
    folder, d, _ = exported
    kernels = read_csv(folder / "kernels.csv")
    assert [(k["name"], k["class"]) for k in kernels] == [(k.name, k.cls) for k in d.kernels]
    assert [float(k["time_s"]) for k in kernels] == pytest.approx([k.time_s for k in d.kernels])
    ops = read_csv(folder / "ops.csv")
    assert d.roofline is not None
    assert [o["name"] for o in ops] == [o.name for o in d.roofline.ops + d.roofline.more_ops]


def test_parquet_tables_have_the_csv_columns_and_rows(
    exported: tuple[Path, Diagnosis, str],
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    folder, _, _ = exported
    for name in TABLES:
        table = pq.read_table(folder / f"{name}.parquet")
        rows = read_csv(folder / f"{name}.csv")
        with (folder / f"{name}.csv").open(encoding="utf-8") as f:
            header = f.readline().strip().split(",")
        assert table.column_names == header
        assert table.num_rows == len(rows)
    phases = pq.read_table(folder / "phases.parquet").to_pylist()
    assert phases[-1]["warmup"] is False
    assert phases[-1]["forward_exposed_s"] == pytest.approx(325 * US)


def test_every_table_keeps_its_columns_when_the_trace_gives_it_no_rows(tmp_path: Path) -> None:
    d = analyze(phased_training_trace(2).write(tmp_path / "t.json"))
    empty = msgspec.structs.replace(
        d,
        kernels=[],
        roofline=None,
        modules=None,
        phases=None,
        device=msgspec.structs.replace(d.device, peak_flops=None),
    )
    result = export_tables(empty, tmp_path / "out", parquet=False)
    assert result.note is None
    for table in tables(empty):
        with (tmp_path / "out" / f"{table.name}.csv").open(encoding="utf-8") as f:
            lines = f.read().splitlines()
        assert lines == [",".join(name for name, _ in table.columns)]


def test_without_pyarrow_the_tables_are_csv_and_a_note_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    trace = phased_training_trace(3).write(tmp_path / "t.json")
    code, _, err = run_cli(["analyze", str(trace), "--export", str(tmp_path / "x")], capsys)
    assert code == 0
    assert sorted(p.suffix for p in (tmp_path / "x").iterdir()) == [".csv"] * len(TABLES)
    assert err.strip().splitlines() == [
        f"wallfinder: wrote {len(TABLES)} files to {tmp_path / 'x'} (CSV only: {PARQUET_MISSING})"
    ]


def test_an_unwritable_export_folder_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = phased_training_trace(2).write(tmp_path / "t.json")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, _, err = run_cli(["analyze", str(trace), "--export", str(blocker / "sub")], capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("wallfinder: error: ")
    assert "cannot write the tables" in err


def test_the_kernel_table_is_every_kernel_not_the_top_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Twenty kernels, more than the report's top rows: the export has all twenty, their
    shares summing to the whole, in the diagnosis's order (its top rows, then the rest)."""
    names = tuple(f"kernel_{i:02d}" for i in range(TOP_ROWS + 5))
    trace = training_trace(3, kernels=names).write(tmp_path / "t.json")
    folder = tmp_path / "tables"
    code, out, _ = run_cli(
        ["analyze", str(trace), "--format", "json", "--export", str(folder)], capsys
    )
    assert code == 0
    d = Diagnosis.from_json(out)
    d.self_check()
    assert len(d.kernels) == TOP_ROWS
    rows = read_csv(folder / "kernels.csv")
    assert sorted(r["name"] for r in rows) == sorted(names)
    assert [r["name"] for r in rows] == [k.name for k in d.kernels + d.more_kernels]
    assert sum(float(r["share"]) for r in rows) == pytest.approx(1.0)
