"""`wallfinder serve` as a person uses it: the real server (uvicorn, on a free port of
127.0.0.1, its watcher thread polling the folder) over a LOGDIR of generated runs, opened in
headless Chromium: the list shows the runs with their verdicts, a run's overview draws its
plots, a table sorts and filters, a view switches, and a run written while serving appears
without a reload by hand. The browser fixtures are the HTML report's (test_report_browser)."""

from __future__ import annotations

import socket
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browsers import LOAD_TIMEOUT_MS
from servedirs import make_logdir
from tracegen import training_trace

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import uvicorn

from wallfinder.serve import watch
from wallfinder.serve.app import create_app
from wallfinder.serve.runs import Runs

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The app served on 127.0.0.1, polling its folder every 0.2 s (so a new run shows soon;
    the test waits for what it shows, never for a time)."""
    logdir = make_logdir(tmp_path)
    runs = Runs.of(logdir)
    stop = threading.Event()
    watch(runs, stop, every_s=0.2)
    config = uvicorn.Config(
        create_app(runs), host="127.0.0.1", port=free_port(), log_level="warning"
    )
    app_server = uvicorn.Server(config)
    thread = threading.Thread(target=app_server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{config.port}", logdir
    finally:
        app_server.should_exit = True
        stop.set()
        thread.join(timeout=30)


def test_a_person_browses_the_runs_and_a_runs_overview(
    browser: Any,
    screenshots: Path,
    server: tuple[str, Path],
) -> None:
    url, logdir = server
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(url + "/")
    # The list fills in as the watcher diagnoses the runs (the page asks the app, and reloads).
    page.wait_for_selector('tr[data-run="workers0"].state-ready', timeout=LOAD_TIMEOUT_MS)
    page.wait_for_selector('tr[data-run="broken"].state-error', timeout=LOAD_TIMEOUT_MS)
    page.wait_for_selector('tr[data-run="job"].state-ready', timeout=LOAD_TIMEOUT_MS)
    assert "overhead" in page.inner_text('tr[data-run="workers0"]')
    assert "truncated" in page.inner_text('tr[data-run="broken"]')
    page.screenshot(path=str(screenshots / "serve-runs.png"), full_page=True)

    # A run copied in while it serves appears without a restart.
    training_trace().write(logdir / "late" / "host_9.1.pt.trace.json")
    page.wait_for_selector('tr[data-run="late"].state-ready', timeout=LOAD_TIMEOUT_MS)

    page.click('tr[data-run="workers0"] a')
    page.wait_for_function(
        "document.body.getAttribute('data-plots') !== null", timeout=LOAD_TIMEOUT_MS
    )
    assert page.get_attribute("body", "data-plots") == "ready"
    assert page.is_visible("#verdict")
    assert page.is_visible("#plot-steps .main-svg")
    assert not page.is_visible("#ranks")
    page.screenshot(path=str(screenshots / "serve-overview.png"), full_page=True)

    page.click("nav.tabs >> text=Kernels")
    page.wait_for_selector("#top table", state="visible", timeout=LOAD_TIMEOUT_MS)
    first = "#top tbody tr:not([hidden]) td:first-child"
    names = page.eval_on_selector_all(first, "cells => cells.map(c => c.textContent.trim())")
    page.click("#top thead th:first-child")
    page.click("#top thead th:first-child")  # descending, then ascending by name
    ascending = page.eval_on_selector_all(first, "cells => cells.map(c => c.textContent.trim())")
    assert ascending == sorted(names, key=str.lower)
    page.fill("#top .table-tools input", "gemm")
    shown = page.eval_on_selector_all(first, "cells => cells.map(c => c.textContent.trim())")
    assert shown
    assert all("gemm" in n.lower() for n in shown)

    assert errors == []
    assert all(r.startswith(url) for r in requests)
    page.close()
