"""`wallfinder serve`: the app over a LOGDIR built here from generated traces, driven by
Starlette's TestClient. The folder is polled and analysed explicitly (`Runs.poll`, `Runs.work`),
as the server's watcher thread does, so no test waits on the clock."""

from __future__ import annotations

import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from servedirs import LOADER_HEAVY, make_logdir
from tracegen import NASTY_NAME, training_trace
from wallfinder import analyze
from wallfinder.cli import main
from wallfinder.history import History
from wallfinder.report import render
from wallfinder.serve import DEFAULT_HOST
from wallfinder.serve.app import VIEWS, create_app
from wallfinder.serve.runs import Runs

with warnings.catch_warnings():
    # Starlette 1.x points to httpx2 for its test client; httpx (pinned) works the same.
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.testclient import TestClient


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    return make_logdir(tmp_path)


@pytest.fixture
def served(logdir: Path) -> Iterator[tuple[Runs, TestClient]]:
    runs = Runs.of(logdir)
    runs.poll()
    runs.work()
    with TestClient(create_app(runs)) as client:
        yield runs, client


def text(html: str) -> str:
    """The page's text, tags dropped and spaces folded."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_list_shows_each_run_with_its_verdict_and_step_time(
    served: tuple[Runs, TestClient],
) -> None:
    runs, client = served
    page = client.get("/")
    assert page.status_code == 200
    shown = text(page.text)
    for run in runs.all():
        assert run.name in shown
    w0 = runs.get("workers0")
    assert w0 is not None
    assert w0.diagnosis is not None
    d = w0.diagnosis
    assert d.verdict.wall == "overhead"
    row = re.search(r'data-run="workers0".*?</tr>', page.text, re.S)
    assert row is not None
    assert "overhead" in row.group(0)
    assert "data loading" in row.group(0)
    # The step time is the diagnosis's median, as the units module writes it.
    from wallfinder.units import duration

    assert duration(d.steps.median_s) in row.group(0)


def test_a_job_of_several_rank_files_is_one_run(served: tuple[Runs, TestClient]) -> None:
    runs, client = served
    job = runs.get("job")
    assert job is not None
    assert job.diagnosis is not None
    assert len(job.traces) == 2
    assert len(job.diagnosis.ranks) == 2
    assert "(2 ranks)" in text(client.get("/").text)
    distributed = client.get("/runs/job/distributed").text
    assert 'id="ranks"' in distributed


def test_a_broken_trace_is_that_runs_error_not_a_crash(served: tuple[Runs, TestClient]) -> None:
    runs, client = served
    broken = runs.get("broken")
    assert broken is not None
    assert broken.state == "error"
    assert broken.error is not None
    assert "host_13.19.pt.trace.json" in broken.error
    assert "Traceback" not in broken.error
    page = client.get("/runs/broken/overview")
    assert page.status_code == 200
    assert "could not be analysed" in page.text
    assert broken.error in text(page.text)
    # No machine path: only what is under LOGDIR, relative to it.
    assert str(runs.root) not in client.get("/").text
    assert str(runs.root) not in page.text


@pytest.mark.parametrize("view", list(VIEWS))
def test_each_view_renders_the_reports_sections_under_the_verdict(
    served: tuple[Runs, TestClient], view: str
) -> None:
    _, client = served
    page = client.get(f"/runs/workers0/{view}")
    assert page.status_code == 200
    assert 'id="verdict"' in page.text
    assert "OVERHEAD wall" in page.text
    assert f'aria-current="page">{VIEWS[view][0].replace("&", "&amp;")}<' in page.text
    # The view shows its own sections: the style hides every other one.
    style = re.search(r"<style>(.*?)</style>", page.text, re.S)
    assert style is not None
    for section in VIEWS[view][1]:
        assert f":not(#{section})" in style.group(1)
    # Only the app's own scripts and no inline script: the policy says so too.
    assert re.findall(r"<script(?![^>]*(src|application/json))", page.text) == []
    assert "connect-src 'self'" in page.headers["content-security-policy"]


def test_the_overview_has_the_four_questions_and_the_breakdown(
    served: tuple[Runs, TestClient],
) -> None:
    runs, client = served
    page = client.get("/runs/workers0/overview").text
    run = runs.get("workers0")
    assert run is not None
    assert run.diagnosis is not None
    for q in run.diagnosis.verdict.questions:
        assert q.question in page
    assert 'id="breakdown"' in page
    assert 'id="plot-steps"' in page


def test_compare_shows_the_diff_of_two_runs(served: tuple[Runs, TestClient]) -> None:
    _, client = served
    page = client.get("/compare", params={"before": "workers0", "after": "workers4"})
    assert page.status_code == 200
    assert "workers0" in page.text
    assert "workers4" in page.text
    assert "wall" in text(page.text).lower()
    assert client.get("/compare", params={"before": "workers0", "after": "nope"}).status_code == 404


def test_a_run_written_while_serving_appears_at_the_next_poll(
    served: tuple[Runs, TestClient], logdir: Path
) -> None:
    runs, client = served
    assert "late" not in text(client.get("/").text)
    training_trace().write(logdir / "late" / "host_14.20.pt.trace.json")
    runs.poll()
    listed = client.get("/api/runs").json()
    late = next(r for r in listed["runs"] if r["name"] == "late")
    assert late["state"] == "queued"
    assert listed["waiting"] == 1
    assert "Waiting to be analysed" in client.get("/runs/late/overview").text
    runs.work()
    late = next(r for r in client.get("/api/runs").json()["runs"] if r["name"] == "late")
    assert late["state"] == "ready"
    assert late["wall"] is not None
    assert "late" in text(client.get("/").text)


def test_a_changed_trace_is_analysed_again_and_a_removed_run_leaves(
    served: tuple[Runs, TestClient], logdir: Path
) -> None:
    runs, _ = served
    training_trace(loader_us=5.0).write(logdir / "workers0" / "host_11.17.pt.trace.json")
    runs.poll()
    changed = runs.get("workers0")
    assert changed is not None
    assert changed.state == "queued"
    runs.work()
    assert changed.diagnosis is not None
    assert changed.diagnosis.verdict.wall != "overhead"
    shutil.rmtree(logdir / "workers4")
    runs.poll()
    assert runs.get("workers4") is None


def test_a_saved_diagnosis_is_a_run(tmp_path: Path) -> None:
    trace = training_trace(loader_us=LOADER_HEAVY).write(tmp_path / "t.json")
    folder = tmp_path / "log" / "demo"
    folder.mkdir(parents=True)
    (folder / "diagnosis.json").write_text(render(analyze(trace), "json"))
    runs = Runs.of(tmp_path / "log")
    runs.poll()
    runs.work()
    run = runs.get("demo")
    assert run is not None
    assert run.saved == "demo/diagnosis.json"
    assert run.diagnosis is not None
    assert run.diagnosis.verdict.wall == "overhead"


def test_a_workers_profiling_cycles_are_its_latest_cycle_not_a_job(tmp_path: Path) -> None:
    """tensorboard_trace_handler writes one file per worker and profiling cycle
    (`{worker}.{ms}.pt.trace.json`): two cycles of one worker are not two ranks; the run is
    its newest cycle, as the profiler plugin opened it, and each rank's newest in a job."""
    folder = tmp_path / "log" / "cycles"
    training_trace(loader_us=LOADER_HEAVY).write(folder / "host_7.1700000001.pt.trace.json")
    training_trace(loader_us=5.0).write(folder / "host_7.1700000999.pt.trace.json")
    runs = Runs.of(tmp_path / "log")
    runs.poll()
    runs.work()
    run = runs.get("cycles")
    assert run is not None
    assert run.traces == ["cycles/host_7.1700000999.pt.trace.json"]
    assert run.diagnosis is not None
    assert not [w for w in run.diagnosis.warnings if "not one job" in w]
    assert run.diagnosis.verdict.cause != "data_loading"  # the newest cycle's, loader fixed


@pytest.mark.parametrize(
    "url",
    [
        "/runs/../../etc/passwd",
        "/runs/workers0/files/../../../etc/passwd",
        "/runs/workers0/files/..%2f..%2f..%2fetc%2fpasswd",
        "/runs/workers0/files/%2Fetc%2Fpasswd",
        "/runs/workers0/files/..%2fworkers4%2fhost_12.17.pt.trace.json.gz",
        "/runs/..%2f..%2f/overview",
        "/static/..%2fapp.py",
        "/static/%2Fetc%2Fpasswd",
    ],
)
def test_a_path_out_of_the_run_is_refused(served: tuple[Runs, TestClient], url: str) -> None:
    _, client = served
    page = client.get(url)
    assert page.status_code == 404
    assert "root:" not in page.text


def test_a_runs_own_files_and_its_annotated_trace_download(
    served: tuple[Runs, TestClient], logdir: Path
) -> None:
    _, client = served
    got = client.get("/runs/workers0/files/host_11.17.pt.trace.json")
    assert got.status_code == 200
    assert got.content == (logdir / "workers0" / "host_11.17.pt.trace.json").read_bytes()
    marks = client.get("/runs/workers0/marks.json")
    assert marks.status_code == 200
    assert "attachment" in marks.headers["content-disposition"]
    assert marks.json()["traceEvents"]


def test_a_symlink_out_of_logdir_is_not_a_run(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    training_trace().write(outside / "secret.pt.trace.json")
    logdir = tmp_path / "log"
    logdir.mkdir()
    (logdir / "escape").symlink_to(outside, target_is_directory=True)
    (logdir / "one.pt.trace.json").symlink_to(outside / "secret.pt.trace.json")
    runs = Runs.of(logdir)
    runs.poll()
    assert runs.all() == []


def test_names_from_the_trace_are_escaped(tmp_path: Path) -> None:
    logdir = tmp_path / "log"
    training_trace(kernels=(NASTY_NAME,)).write(logdir / "nasty" / "t.pt.trace.json")
    runs = Runs.of(logdir)
    runs.poll()
    runs.work()
    with TestClient(create_app(runs)) as client:
        page = client.get("/runs/nasty/kernels").text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_history_shows_a_recorded_jobs_trend(
    served: tuple[Runs, TestClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs, client = served
    db = tmp_path / "history.sqlite3"
    monkeypatch.setenv("WALLFINDER_DB", str(db))
    assert 'id="history"' not in client.get("/").text
    assert not db.exists()  # looking made no database
    with History(db) as h:
        for name in ("workers0", "workers4"):
            run = runs.get(name)
            assert run is not None
            assert run.diagnosis is not None
            h.record("resnet", run.diagnosis)
    assert "/history/resnet" in client.get("/").text
    trend = client.get("/history/resnet")
    assert trend.status_code == 200
    assert "resnet" in trend.text
    assert client.get("/history/other").status_code == 404


def test_the_command_refuses_a_missing_or_non_folder_logdir_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no such folder" in err
    file = tmp_path / "a.json"
    file.write_text("{}")
    assert main(["serve", str(file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "not a folder" in err


def test_it_listens_on_this_machine_only_by_default() -> None:
    from wallfinder.cli import build_parser

    args = build_parser(["serve", "x"]).parse_args(["serve", "x"])
    assert args.host == DEFAULT_HOST == "127.0.0.1"
