"""Run history: recording runs into SQLite, the trend over them, `wallfinder history`."""

from __future__ import annotations

import html
import json
import multiprocessing
import re
import sqlite3
import sys
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec
import pytest
from test_diff_and_check import GiB, checkpointed, gemm_bound, leaking, loader_bound
from test_report_html import (
    test_content_security_policy_allows_only_the_pages_own_scripts as check_csp,
)
from test_report_html import test_figure_data_cannot_close_its_script_block as check_figure_json
from test_report_html import test_html_report_fetches_nothing as check_fetches_nothing

from wallfinder import Diagnosis, analyze
from wallfinder.cli import main
from wallfinder.errors import WallfinderError
from wallfinder.history import (
    MIGRATIONS,
    SCHEMA_VERSION,
    History,
    default_db_path,
    resolve_db_path,
)
from wallfinder.report.history import render_history

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def slow(tmp_path: Path) -> Diagnosis:
    return analyze(loader_bound().write(tmp_path / "slow.json"))


@pytest.fixture
def fast(tmp_path: Path) -> Diagnosis:
    return analyze(gemm_bound().write(tmp_path / "fast.json"))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "history.sqlite3"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


# Recording and the trend ------------------------------------------------------------------------


def test_two_recorded_runs_show_the_step_getting_faster(
    db: Path, slow: Diagnosis, fast: Diagnosis
) -> None:
    with History(db) as h:
        first = h.record("resnet", slow, commit="a" * 40, host="box", recorded_at=T0)
        h.record("resnet", fast, commit="b" * 40, host="box", recorded_at=T0 + timedelta(hours=1))
        trend = h.trend("resnet")
        stored = h.diagnosis(first.id)
    assert [r.run.commit for r in trend.runs] == ["a" * 40, "b" * 40]
    assert trend.first_s == slow.steps.median_s
    assert trend.last_s == fast.steps.median_s
    assert trend.change == pytest.approx(fast.steps.median_s / slow.steps.median_s - 1)
    assert trend.change < 0
    assert trend.runs[0].change is None
    assert trend.runs[1].change == pytest.approx(trend.change)
    assert trend.best.step_s == fast.steps.median_s
    assert trend.worst.step_s == slow.steps.median_s
    assert trend.runs[0].run.wall == slow.verdict.wall == "overhead"
    assert trend.runs[0].run.idle == slow.breakdown.idle
    assert trend.runs[0].run.recorded_at == "2026-05-01T12:00:00+00:00"
    assert trend.runs[0].run.host == "box"
    assert stored.steps == slow.steps
    assert stored.verdict == slow.verdict


def test_last_n_keeps_the_newest_runs_oldest_first(db: Path, slow: Diagnosis) -> None:
    with History(db) as h:
        for i in range(5):
            h.record("job", slow, recorded_at=T0 + timedelta(minutes=i))
        h.record("other", slow)
        runs = h.runs("job", last=2)
        names = h.names()
    assert [r.recorded_at[11:16] for r in runs] == ["12:03", "12:04"]
    assert [(n.name, n.runs) for n in names] == [("job", 5), ("other", 1)]


def test_no_absolute_path_is_stored(tmp_path: Path, db: Path) -> None:
    folder = tmp_path / "secret-project" / "traces"
    folder.mkdir(parents=True)
    path = loader_bound().write(folder / "rank0.json")
    # A diagnosis that quotes the trace's full path (as one made elsewhere may).
    d = analyze(path)
    d = msgspec.structs.replace(d, source=str(path), warnings=[f"{path}: a note"])
    with History(db) as h:
        run = h.record("job", d)
        assert run.source == "rank0.json"
    con = sqlite3.connect(db)
    rows = con.execute("SELECT source, diagnosis FROM runs").fetchall()
    con.close()
    source, blob = rows[0]
    assert source == "rank0.json"
    text = zlib.decompress(blob).decode()
    assert "secret-project" not in text
    assert str(tmp_path) not in text
    assert json.loads(text)["source"] == "rank0.json"
    assert json.loads(text)["warnings"] == ["rank0.json: a note"]


def test_database_is_in_wal_mode(db: Path, slow: Diagnosis) -> None:
    with History(db) as h:
        h.record("job", slow)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    con.close()


def test_a_run_with_a_memory_profile_keeps_its_peak_allocated(
    db: Path, slow: Diagnosis, fast: Diagnosis
) -> None:
    with History(db) as h:
        h.record("job", leaking(slow), recorded_at=T0)
        h.record("job", fast, recorded_at=T0 + timedelta(hours=1))
        runs = h.runs("job")
    assert [r.peak_allocated for r in runs] == [12 * GiB, None]
    con = sqlite3.connect(db)
    assert con.execute("SELECT peak_allocated FROM runs ORDER BY id").fetchall() == [
        (12 * GiB,),
        (None,),
    ]
    con.close()


def test_history_shows_peak_memory_only_when_a_run_profiled_it(
    db: Path, slow: Diagnosis, fast: Diagnosis
) -> None:
    with History(db) as h:
        h.record("memory", leaking(slow), recorded_at=T0)
        h.record("memory", checkpointed(fast), recorded_at=T0 + timedelta(hours=1))
        h.record("memory", fast, recorded_at=T0 + timedelta(hours=2))
        h.record("time", slow, recorded_at=T0)
        with_memory, without = h.trend("memory"), h.trend("time")
    text = render_history(with_memory, "text", width=200)
    header, *rows = text.splitlines()[2:6]
    assert re.search(r"idle\s+peak alloc\s+wall · cause", header)
    peaks = [re.findall(r"\s(\S+ GiB|—)\s+\w+:", row) for row in rows]
    assert peaks == [["12.00 GiB"], ["6.00 GiB"], ["—"]]
    assert "peak alloc" not in render_history(without, "text", width=200)
    md = render_history(with_memory, "md")
    assert "| idle | peak alloc | wall · cause |\n|--:|---|---|--:|--:|--:|--:|--:|---|" in md
    assert "| 12.00 GiB | overhead: data loading (DataLoader) |" in md
    assert "peak alloc" not in render_history(without, "md")


def test_history_html_plots_peak_memory_when_a_run_profiled_it(
    db: Path, slow: Diagnosis, fast: Diagnosis
) -> None:
    with History(db) as h:
        h.record("memory", leaking(slow), recorded_at=T0)
        h.record("memory", fast, recorded_at=T0 + timedelta(hours=1))
        h.record("time", slow, recorded_at=T0)
        page = render_history(h.trend("memory"), "html")
        plain = render_history(h.trend("time"), "html")
    check_figure_json(page)
    check_csp(page)
    check_fetches_nothing(page)
    (figure_json,) = re.findall(r'id="wf-figures"[^>]*>(.*?)</script>', page, re.S)
    figures = json.loads(figure_json)
    assert figures["plot-memory"]["data"][0]["y"] == [12.0, None]
    assert 'id="plot-memory"' in page
    assert '<td class="num" data-v="12884901888">12.00 GiB</td>' in page
    assert 'id="plot-memory"' not in plain
    assert "peak alloc" not in plain


def _write_runs(db: str, diagnosis_json: bytes, worker: int, barrier: object) -> None:
    d = Diagnosis.from_json(diagnosis_json)
    barrier.wait()  # type: ignore[attr-defined]
    for i in range(10):
        with History(Path(db)) as h:
            h.record("parallel", d, host=f"worker{worker}", commit=f"{i:040x}")


def test_parallel_writers_do_not_lose_or_corrupt_runs(db: Path, slow: Diagnosis) -> None:
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    barrier = ctx.Barrier(4)
    payload = slow.to_json().encode()
    procs = [ctx.Process(target=_write_runs, args=(str(db), payload, w, barrier)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 40
    per_worker = con.execute("SELECT host, COUNT(*) FROM runs GROUP BY host").fetchall()
    con.close()
    assert sorted(per_worker) == [(f"worker{w}", 10) for w in range(4)]


# Schema versions --------------------------------------------------------------------------------


def test_a_version_1_database_is_migrated(db: Path) -> None:
    db.parent.mkdir(parents=True)
    con = sqlite3.connect(db, isolation_level=None)
    MIGRATIONS[0](con)
    con.execute("PRAGMA user_version = 1")
    con.execute(
        "INSERT INTO runs (name, recorded_at, source, git_commit, step_s, cv, mfu, idle, wall, "
        "cause, diagnosis) VALUES ('old', '2025-01-01T00:00:00+00:00', 't.json', NULL, 0.01, "
        "0.02, NULL, 0.5, 'overhead', 'data_loading', x'00')"
    )
    con.close()
    assert SCHEMA_VERSION > 1
    with History(db) as h:
        runs = h.runs("old")
    assert len(runs) == 1
    assert runs[0].host is None
    assert runs[0].comm_exposed is None
    assert runs[0].step_s == 0.01
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    con.close()


def test_a_version_2_database_gets_peak_memory_from_the_stored_diagnoses(
    db: Path, slow: Diagnosis
) -> None:
    db.parent.mkdir(parents=True)
    con = sqlite3.connect(db, isolation_level=None)
    MIGRATIONS[0](con)
    MIGRATIONS[1](con)
    con.execute("PRAGMA user_version = 2")
    blobs = [
        zlib.compress(msgspec.json.encode(leaking(slow))),  # recorded with a memory profile
        zlib.compress(msgspec.json.encode(slow)),  # without one
        b"\x00",  # a blob that does not read back
    ]
    for blob in blobs:
        con.execute(
            "INSERT INTO runs (name, recorded_at, source, git_commit, step_s, cv, mfu, idle, "
            "wall, cause, diagnosis) VALUES ('old', '2026-01-01T00:00:00+00:00', 't.json', "
            "NULL, 0.01, 0.02, NULL, 0.5, 'overhead', 'data_loading', ?)",
            (blob,),
        )
    con.close()
    assert SCHEMA_VERSION == 3
    with History(db) as h:
        runs = h.runs("old")
    assert [r.peak_allocated for r in runs] == [12 * GiB, None, None]
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    con.close()


def test_a_database_newer_than_the_code_is_refused(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    History(db).close()
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.commit()
    con.close()
    with pytest.raises(WallfinderError, match="newer than this wallfinder"):
        History(db)
    code, _, err = run_cli(["history", "--db", str(db)], capsys)
    assert code == 2
    assert err.count("\n") == 1


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "h.sqlite3"
    bad.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(WallfinderError, match="not a usable history database"):
        History(bad)


def test_database_path_from_flag_env_or_user_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("WALLFINDER_DB", raising=False)
    if sys.platform not in ("win32", "darwin"):
        assert default_db_path() == tmp_path / "xdg" / "wallfinder" / "history.sqlite3"
    assert resolve_db_path(None) == default_db_path()
    monkeypatch.setenv("WALLFINDER_DB", str(tmp_path / "env.sqlite3"))
    assert resolve_db_path(None) == tmp_path / "env.sqlite3"
    assert resolve_db_path(tmp_path / "flag.sqlite3") == tmp_path / "flag.sqlite3"


# The command line -------------------------------------------------------------------------------


@pytest.fixture
def recorded(
    tmp_path: Path, db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Path:
    monkeypatch.chdir(tmp_path)  # not a git repository: no commit
    for name, builder in (("slow.json", loader_bound()), ("fast.json", gemm_bound())):
        trace = builder.write(tmp_path / name)
        code, _, err = run_cli(
            ["analyze", str(trace), "--format", "json", "--record", "job", "--db", str(db)], capsys
        )
        assert code == 0
        assert "recorded as 'job'" in err
    return db


def test_cli_history_text(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["history", "job", "--db", str(recorded)], capsys)
    assert code == 0
    assert "wallfinder history: job (2 runs)" in out
    assert re.search(r"Step \d+\.\d\d → \d+\.\d\d ms \(−\d+\.\d%\) over 2 runs; best", out)
    assert "overhead: data loading" in out
    code, out, _ = run_cli(["history", "--db", str(recorded)], capsys)
    assert code == 0
    assert re.search(r"job\s+2\s", out)


def test_cli_history_json(recorded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        ["history", "job", "--db", str(recorded), "--format", "json", "--last", "1"], capsys
    )
    assert code == 0
    data = json.loads(out)
    assert data["schema"] == "wallfinder.history/1"
    assert len(data["runs"]) == 1
    assert data["runs"][0]["run"]["source"] == "fast.json"
    assert data["runs"][0]["run"]["commit"] is None


def test_cli_history_html_is_self_contained(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "history.html"
    code, _, _ = run_cli(
        ["history", "job", "--db", str(recorded), "--format", "html", "-o", str(out_file)], capsys
    )
    assert code == 0
    page = out_file.read_text(encoding="utf-8")
    assert "Content-Security-Policy" in page
    assert "default-src 'none'" in html.unescape(page)
    # The report page's own checks: no src/href/link, no http(s) in attributes, plotly once,
    # scripts allowed by hash only, no markup in the figures' JSON.
    check_fetches_nothing(page)
    check_csp(page)
    check_figure_json(page)
    assert 'id="plot-step"' in page


def test_html_escapes_the_job_name(db: Path, slow: Diagnosis) -> None:
    with History(db) as h:
        h.record("<script>alert(1)</script>", slow)
        page = render_history(h.trend("<script>alert(1)</script>"), "html")
    assert "<script>alert(1)" not in page
    assert "&lt;script&gt;alert(1)" in page


def test_cli_unknown_name_is_one_line_and_exit_2(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["history", "nope", "--db", str(recorded)], capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert "'nope'" in err
    assert "job" in err


def test_cli_db_without_record_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = loader_bound().write(tmp_path / "t.json")
    code, _, err = run_cli(["analyze", str(trace), "--db", str(tmp_path / "x.db")], capsys)
    assert code == 2
    assert "--record" in err
    assert not (tmp_path / "x.db").exists()
