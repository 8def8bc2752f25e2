"""The web app over a log folder's runs (Starlette): the list of runs, each run's views framed
around the HTML report's own sections and figures, the diff of two runs, a job's history, and
the run's files to download. Every page is rendered by wallfinder's renderers from the
Diagnosis; this module computes no figure.

What it serves: its own pages and bundled scripts (plotly, the report's script and style, its
own), and a run's files by their names in the run list, never a path from the request, so
nothing outside LOGDIR can be reached (`..`, absolute paths and symlinks out find no run).
Names from traces reach the page escaped by the template engine, as in the report.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from wallfinder import __version__, report
from wallfinder.api import analyze_marked, diff, run_names
from wallfinder.errors import WallfinderError
from wallfinder.history import History, resolve_db_path
from wallfinder.report import _format as fmt
from wallfinder.report._figures import WALL_COLOR
from wallfinder.report.annotated import marks_document
from wallfinder.report.history import render_history
from wallfinder.report.html import figures_json, report_context, template_environment, uses_webgl
from wallfinder.serve.runs import Run, Runs

VIEWS: dict[str, tuple[str, tuple[str, ...]]] = {
    "overview": ("Overview", ("findings", "steps", "breakdown", "mfu", "compiled", "notes")),
    "operators": ("Operators", ("roofline", "classes")),
    "kernels": ("Kernels", ("top", "roofline", "fusion", "counters")),
    "phases": ("Phases & modules", ("phases", "modules", "timeline")),
    "memory": ("Memory", ("memory",)),
    "distributed": ("Distributed", ("job", "parallelism", "ranks")),
    "critical-path": ("Critical path & what-if", ("what-if", "timeline")),
}
"""Each view of a run: its tab's label and the report's sections it shows (by their ids in
report.html), under the verdict, which every view shows."""

_STATIC = {
    "report.css": ("wallfinder.report", "report.css", "text/css"),
    "report.js": ("wallfinder.report", "report.js", "text/javascript"),
    "serve.css": ("wallfinder.serve", "serve.css", "text/css"),
    "serve.js": ("wallfinder.serve", "serve.js", "text/javascript"),
}


def create_app(runs: Runs) -> Starlette:
    """The app over `runs` (what keeps them fresh is the caller's: `serve.watch`)."""
    pages = _Pages(runs)
    return Starlette(
        routes=[
            Route("/", pages.index),
            Route("/api/runs", pages.api_runs),
            Route("/favicon.ico", pages.no_icon),
            Route("/static/{asset}", pages.static),
            Route("/compare", pages.compare),
            Route("/history/{job}", pages.history),
            Route("/runs/{name}", pages.run_home),
            Route("/runs/{name}/files/{file:path}", pages.file),
            Route("/runs/{name}/marks.json", pages.marks),
            Route("/runs/{name}/{view}", pages.run_view),
        ]
    )


def _csp(*, webgl: bool = False) -> str:
    """The policy of every page the app renders: its own scripts and styles only, requests
    only to itself. (WebGL plots need 'unsafe-eval', as in the report.)"""
    return (
        "default-src 'none'; script-src 'self'" + (" 'unsafe-eval'" if webgl else "") + "; "
        "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; font-src data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )


def _html(text: str, *, webgl: bool = False, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        text,
        status_code=status,
        headers={"Content-Security-Policy": _csp(webgl=webgl), "Referrer-Policy": "no-referrer"},
    )


def _asset(package: str, name: str) -> str:
    return resources.files(package).joinpath("templates").joinpath(name).read_text("utf-8")


def _own_template(name: str) -> str | None:
    """The app's template `name`, or None for the report's (the next loader's)."""
    path = resources.files("wallfinder.serve").joinpath("templates").joinpath(name)
    return path.read_text("utf-8") if path.is_file() else None


@cache
def _environment() -> jinja2.Environment:
    """The report's environment with the app's templates first: its `page.html` (the app's
    frame, scripts loaded from the app) stands in for the report's, so `report.html` renders
    inside the app as it is."""
    base = template_environment()
    assert base.loader is not None
    own = jinja2.FunctionLoader(_own_template)
    return base.overlay(loader=jinja2.ChoiceLoader([own, base.loader]))


@cache
def _plotly_js() -> bytes:
    from plotly.offline import get_plotlyjs

    js: str = get_plotlyjs()
    return js.encode()


def _hidden_sections(view: str) -> Markup:
    """The style that shows `view`'s sections of the report (and the verdict) only."""
    shown = "".join(f":not(#{s})" for s in ("verdict", "empty-view", *VIEWS[view][1]))
    return Markup(f"main > section{shown} {{ display: none; }}")


class _Pages:
    def __init__(self, runs: Runs) -> None:
        self.runs = runs

    def _render(self, template: str, **context: Any) -> str:
        context.setdefault("figures", figures_json({}))
        context.setdefault("hidden", "")
        context.setdefault("tabs", [])
        context.setdefault("view", "")
        context.setdefault("page", template.removesuffix(".html"))
        return (
            _environment()
            .get_template(template)
            .render(logdir=self.runs.root.name, version=__version__, **context)
        )

    def _missing(self, what: str) -> HTMLResponse:
        return _html(self._render("message.html", title="Not found", message=what), status=404)

    async def index(self, request: Request) -> Response:
        runs = self.runs.all()
        return _html(
            self._render(
                "index.html",
                runs=[_row(r) for r in runs],
                ready=[r.name for r in runs if r.state == "ready"],
                waiting=self.runs.waiting(),
                stamp=_stamp(runs),
                jobs=_history_names(),
                wall_color=WALL_COLOR,
            )
        )

    async def api_runs(self, request: Request) -> Response:
        runs = self.runs.all()
        return JSONResponse(
            {"stamp": _stamp(runs), "waiting": self.runs.waiting(), "runs": [_row(r) for r in runs]}
        )

    async def no_icon(self, request: Request) -> Response:
        """No icon (browsers ask for one): an empty answer, not a 404 in the console."""
        return Response(status_code=204)

    async def static(self, request: Request) -> Response:
        asset = request.path_params["asset"]
        headers = {"Cache-Control": "max-age=3600"}
        if asset == "plotly.js":
            return Response(_plotly_js(), media_type="text/javascript", headers=headers)
        if asset not in _STATIC:
            return self._missing("No such file.")
        package, name, media = _STATIC[asset]
        return Response(_asset(package, name), media_type=media, headers=headers)

    async def run_home(self, request: Request) -> Response:
        run = self.runs.get(request.path_params["name"])
        if run is None:
            return self._missing("No such run in this folder.")
        return RedirectResponse(f"{request.url.path}/overview", status_code=303)

    def run_view(self, request: Request) -> Response:
        run = self.runs.get(request.path_params["name"])
        view = request.path_params["view"]
        if run is None or view not in VIEWS:
            return self._missing("No such run or view in this folder.")
        tabs = [(key, label) for key, (label, _) in VIEWS.items()]
        if run.diagnosis is None:
            return _html(self._render("pending.html", run=_row(run), tabs=tabs, view=view))
        figures, context = report_context(run.diagnosis)
        text = self._render(
            "run.html",
            figures=figures_json(figures),
            hidden=_hidden_sections(view),
            tabs=tabs,
            view=view,
            run=_row(run),
            marks=_markable(run),
            run_files=[Path(f).name for f in run.files],
            **context,
        )
        return _html(text, webgl=uses_webgl(figures))

    async def file(self, request: Request) -> Response:
        """One of the run's own files, by its name in the run list (never a path joined from
        the request)."""
        run = self.runs.get(request.path_params["name"])
        wanted = request.path_params["file"]
        found = [f for f in run.files if Path(f).name == wanted] if run else []
        if not found:
            return self._missing("No such file in this run.")
        return FileResponse(self.runs.root / found[0], filename=wanted)

    def marks(self, request: Request) -> Response:
        """The annotated trace's marks (steps, idle gaps, findings' kernels, the critical
        path), to open in Perfetto beside the run's trace."""
        run = self.runs.get(request.path_params["name"])
        if run is None or not _markable(run):
            return self._missing("No annotated trace for this run (one Kineto trace file only).")
        try:
            _, marks = analyze_marked(self.runs.root / run.traces[0], self.runs.options)
        except WallfinderError as exc:
            return _html(self._render("message.html", title="No annotated trace", message=str(exc)))
        body = json.dumps(marks_document(marks), separators=(",", ":"))
        stem = Path(run.traces[0]).name.removesuffix(".gz").removesuffix(".json")
        return Response(
            body,
            media_type="application/json",
            headers={"Content-Disposition": f'attachment; filename="{stem}.wallfinder.json"'},
        )

    def compare(self, request: Request) -> Response:
        before = self.runs.get(request.query_params.get("before", ""))
        after = self.runs.get(request.query_params.get("after", ""))
        if before is None or after is None:
            return self._missing("Pick two runs of this folder to compare.")
        if before.diagnosis is None or after.diagnosis is None:
            return _html(
                self._render(
                    "message.html",
                    title="Not ready",
                    message="Both runs must be analysed (without error) to compare them.",
                )
            )
        x = diff(before.diagnosis, after.diagnosis, names=run_names(before.name, after.name))
        # The diff's own page: self-contained, with its own policy (its inline scripts).
        return HTMLResponse(report.render_diff(x, "html"))

    def history(self, request: Request) -> Response:
        job = request.path_params["job"]
        if job not in _history_names():
            return self._missing("No runs recorded under this name.")
        with History(resolve_db_path()) as h:
            trend = h.trend(job)
        return HTMLResponse(render_history(trend, "html"))


def _row(run: Run) -> dict[str, Any]:
    """What the run list shows of a run: every figure is its diagnosis's own."""
    d = run.diagnosis
    return {
        "name": run.name,
        "state": run.state,
        "error": run.error,
        "date": run.date,
        "files": len(run.traces),
        "saved": run.saved is not None,
        "wall": d.verdict.wall if d else None,
        "cause": fmt.verdict_label(d.verdict, d.breakdown.basis) if d else None,
        "step": fmt.duration(d.steps.median_s) if d else None,
        "ranks": len(d.ranks) if d else None,
    }


def _stamp(runs: list[Run]) -> str:
    """What changes when the list should be drawn again (a run added, gone or analysed)."""
    return ";".join(f"{r.name}:{r.state}:{len(r.signature)}" for r in runs)


def _markable(run: Run) -> bool:
    """Whether the run has an annotated trace: one Kineto trace file (not an nsys export)."""
    traces = run.traces
    return len(traces) == 1 and traces[0].endswith((".json", ".json.gz"))


def _history_names() -> list[str]:
    """The jobs the history database holds, when there is one (never made by looking)."""
    path = resolve_db_path()
    if not path.is_file():
        return []
    try:
        with History(path) as h:
            return [n.name for n in h.names()]
    except WallfinderError:
        return []
