"""The HTML and Markdown reports without a browser: what the page holds, that it fetches nothing,
and that strings from the trace (kernel, op and file names, host events) render as inert text.

The same page in a real browser: tests/integration/test_report_browser.py."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import msgspec
import pytest
from markdown_it import MarkdownIt

from tracegen import NASTY_NAME, TraceBuilder, phased_training_trace, training_trace
from wallfinder import Diagnosis, analyze
from wallfinder.cli import main
from wallfinder.diagnosis import FusionCandidate, OpRoofRow, RankSummary, Spike
from wallfinder.report import FORMATS, render
from wallfinder.report._figures import GL_POINTS
from wallfinder.report.html import render_html
from wallfinder.report.markdown import code, render_markdown

SCRIPT_NAME = "k</script><script>window.pwned=1</script>"
IMG_NAME = '<img src=x onerror="window.pwned=2">'
QUOTES_NAME = "q\"'&amp;&<b>bold</b>$x$"
FILE_NAME = "<img src=x onerror=window.pwned=3>&'\"q.json"  # no "/": a file name
NASTY = (SCRIPT_NAME, IMG_NAME, QUOTES_NAME, NASTY_NAME)

# Our own markup in plot labels; anything else from a name must arrive escaped.
PLOT_TAGS = re.compile(r"<br>|</?b>|<extra></extra>")
PAGE_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "header",
    "div",
    "code",
    "main",
    "section",
    "h1",
    "h2",
    "h3",
    "small",
    "p",
    "ol",
    "ul",
    "li",
    "span",
    "nav",
    "a",
    "b",
    "article",
    "table",
    "caption",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "footer",
    "script",
    "dl",
    "dt",
    "dd",
}


class Page(HTMLParser):
    """The tags, attributes, script blocks and visible text of a page."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.text: list[str] = []
        self._in: str | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._in = tag
            if tag == "script":
                self.scripts.append((dict(attrs), ""))

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "script":
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)
        elif self._in is None:
            self.text.append(data)

    @property
    def visible(self) -> str:
        return "".join(self.text)


GEMM = "volta_sgemm_128x64_nn"


def shaped_op(b: TraceBuilder, op: str, dims: list[Any], start: float, kernel: str) -> None:
    """A bf16 op with shapes and the 50 µs kernel it launches (joined by External id)."""
    event = b.host(op, start, 5.0, args={"Input Dims": dims, "Input type": ["c10::BFloat16"] * 2})
    b.kernel(kernel, start + 10.0, 50.0, launch_at=start + 1.0)
    b.events[-1]["args"]["External id"] = event["args"]["External id"]


def nasty_trace(tmp_path: Path) -> Path:
    b = training_trace(4, kernels=("volta_sgemm_128x64_nn", *NASTY))
    return b.write(tmp_path / FILE_NAME)


def poisoned(d: Diagnosis) -> Diagnosis:
    """`d` with trace strings that hold markup in every place the page shows one: roofline
    ops, timeline host events, fusion chains, step labels, spikes, ranks, the device, notes."""
    replace = msgspec.structs.replace
    assert d.roofline is not None
    assert d.timeline is not None
    ops = [
        replace(o, name=NASTY[i % 4], shapes=NASTY[(i + 1) % 4])
        for i, o in enumerate(d.roofline.ops)
    ]
    if not ops:
        ops = [
            OpRoofRow(
                name=name,
                shapes=SCRIPT_NAME,
                dtype="bf16",
                calls=3,
                time_s=1e-3,
                flops=1e12,
                bytes=1e9,
                ai=1e3,
                achieved_flops=1e15,
                achieved_bandwidth=1e12,
                ridge=295.0,
                bound="compute",
                pct_of_roof=0.5,
                cls="gemm",
            )
            for name in NASTY
        ]
    gaps = [replace(g, host=NASTY[i % 4]) for i, g in enumerate(d.timeline.gaps)]
    steps = [replace(s, step=f"step {i} {SCRIPT_NAME}") for i, s in enumerate(d.breakdown.steps)]
    return replace(
        d,
        device=replace(d.device, name=IMG_NAME, note=SCRIPT_NAME),
        roofline=replace(d.roofline, ops=ops),
        timeline=replace(d.timeline, gaps=gaps, step=SCRIPT_NAME),
        breakdown=replace(d.breakdown, steps=steps),
        warnings=[*d.warnings, f"note about {SCRIPT_NAME}"],
        steps=replace(
            d.steps,
            spikes=[
                Spike(step=SCRIPT_NAME, duration_s=1e-3, excess_s=1e-4, part="x", kernels=[*NASTY])
            ],
        ),
        fusion=[
            FusionCandidate(
                kernels=[*NASTY, *NASTY],
                ops=[SCRIPT_NAME, IMG_NAME],
                occurrences_per_step=2.0,
                time_s=1e-4,
                bytes_unfused=None,
                bytes_fused_at_least=None,
                max_saving_s=5e-5,
                basis="test",
            )
        ],
        ranks=[
            RankSummary(
                source=FILE_NAME,
                rank=0,
                steps=4,
                median_step_s=1e-3,
                compute=0.5,
                idle=0.5,
                wall="overhead",
                cause="data_loading",
            )
        ],
    )


@pytest.fixture
def nasty(tmp_path: Path) -> Diagnosis:
    return poisoned(analyze(nasty_trace(tmp_path)))


@pytest.fixture
def page(nasty: Diagnosis) -> str:
    return render_html(nasty)


def figures_of(text: str) -> dict[str, Any]:
    script = next(s for a, s in Page(text).scripts if a.get("id") == "wf-figures")
    figures: dict[str, Any] = json.loads(script)
    return figures


def csp_of(page: str) -> str:
    csp = next(
        a["content"] for _, a in Page(page).tags if a.get("http-equiv") == "Content-Security-Policy"
    )
    assert csp is not None
    return csp


def script_src(page: str) -> str:
    return next(d for d in csp_of(page).split(";") if d.strip().startswith("script-src"))


def strings_in(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


# The page: escaping ------------------------------------------------------------------------------


def test_html_report_has_no_markup_from_the_trace(page: str) -> None:
    p = Page(page)
    assert {tag for tag, _ in p.tags} <= PAGE_TAGS
    assert not [(t, k) for t, attrs in p.tags for k in attrs if k.startswith("on")]
    assert all((a.get("href") or "#").startswith("#") for t, a in p.tags if t == "a")
    # Three script blocks, all the page's own: the figures (data), plotly.js, the page script.
    assert [a.get("type") for a, _ in p.scripts] == ["application/json", None, None]
    assert not [a for a, _ in p.scripts if "src" in a]


def test_html_report_shows_trace_strings_as_text(page: str, nasty: Diagnosis) -> None:
    visible = Page(page).visible
    for name in NASTY:
        assert name in visible
    assert FILE_NAME in visible
    title = re.search(r"<title>(.*?)</title>", page, re.S)
    assert title is not None
    assert html.unescape(title.group(1)).count(FILE_NAME) == 1


def test_plot_labels_from_the_trace_are_escaped(page: str) -> None:
    strings = strings_in(figures_of(page))
    for s in strings:
        assert "<" not in PLOT_TAGS.sub("", s), s
        assert "$" not in s, s
    hover = " ".join(strings)
    assert html.escape(SCRIPT_NAME, quote=False) in hover
    assert html.escape(IMG_NAME, quote=False) in hover


def test_figure_data_cannot_close_its_script_block(page: str) -> None:
    block = page.split('<script type="application/json" id="wf-figures">', 1)[1]
    block = block.split("</script>", 1)[0]
    assert "<" not in block
    assert ">" not in block
    assert "&" not in block
    assert json.loads(block)


# The page: self-contained -----------------------------------------------------------------------


def test_html_report_fetches_nothing(page: str) -> None:
    p = Page(page)
    attrs = [(t, k, v or "") for t, a in p.tags for k, v in a.items()]
    assert not [x for x in attrs if x[1] in ("src", "srcset", "action", "data", "poster")]
    assert not [x for x in attrs if "http" in x[2] and x[1] != "content"]
    assert not [t for t, _ in p.tags if t in ("link", "img", "iframe", "object", "embed", "base")]
    style = re.search(r"<style>(.*?)</style>", page, re.S)
    assert style is not None
    assert "@import" not in style.group(1)
    assert "url(" not in style.group(1)
    assert "@font-face" not in style.group(1)
    # plotly.js inlined once.
    assert page.count("* plotly.js v") == 1


def test_content_security_policy_allows_only_the_pages_own_scripts(page: str) -> None:
    assert "default-src 'none'" in csp_of(page)
    scripts = script_src(page)
    assert "unsafe-inline" not in scripts
    assert "unsafe-eval" not in scripts  # no WebGL plot here
    for attrs, text in Page(page).scripts:
        if attrs.get("type") is None:
            digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
            assert f"'sha256-{digest}'" in scripts


def test_many_roofline_points_are_drawn_with_webgl(nasty: Diagnosis) -> None:
    r = nasty.roofline
    assert r is not None
    many = msgspec.structs.replace(r, more_ops=[r.ops[0]] * (GL_POINTS + 1))
    page = render_html(msgspec.structs.replace(nasty, roofline=many))
    roofline = figures_of(page)["plot-roofline"]
    assert {t["type"] for t in roofline["data"] if t.get("mode") == "markers"} == {"scattergl"}
    assert "'unsafe-eval'" in script_src(page)


# The page: what it shows ------------------------------------------------------------------------


def test_html_report_shows_every_section_of_the_diagnosis(tmp_path: Path) -> None:
    d = analyze(nasty_trace(tmp_path))
    page = render(d, "html")
    visible = Page(page).visible
    assert f"{d.verdict.wall.upper()} wall" in visible
    for q in d.verdict.questions:
        assert q.question in visible
        assert q.detail in visible
    for f in d.findings:
        assert f.title in visible
    for section in ("Step time", "One step on the device", "time per step", "Top kernels", "MFU"):
        assert section in visible
    figures = figures_of(page)
    # No costed op: no roofline plot.
    assert set(figures) == {"plot-steps", "plot-timeline", "plot-phases"}
    assert "Step by phase" in visible
    phases = figures["plot-phases"]["data"]
    assert d.phases is not None
    assert sum(t["y"][0] for t in phases) == pytest.approx(d.phases.steps[0].duration_s * 1e3)
    bars = figures["plot-steps"]["data"]
    assert all(len(t["y"]) == len(d.breakdown.steps) for t in bars)
    # The bars are the diagnosis's per-step figures, in milliseconds.
    compute = next(t for t in bars if t["name"] == "compute")
    assert compute["y"] == pytest.approx([s.compute_s * 1e3 for s in d.breakdown.steps])


def test_html_roofline_plots_each_costed_op(tmp_path: Path) -> None:
    b = TraceBuilder(device_name="NVIDIA A100-SXM4-80GB")
    for s in range(3):
        b.step(s + 1, s * 1000.0, 1000.0)
        shaped_op(b, "aten::mm", [[1024, 1024], [1024, 1024]], s * 1000.0 + 10.0, GEMM)
        shaped_op(b, "aten::mm", [[512, 1024], [1024, 1024]], s * 1000.0 + 100.0, GEMM)
    d = analyze(b.write(tmp_path / "t.json"))
    roofline = figures_of(render_html(d))["plot-roofline"]
    points = [t for t in roofline["data"] if t.get("mode") == "markers"]
    assert [t["name"] for t in points] == ["gemm"]
    assert sorted(points[0]["x"]) == sorted(o.ai for o in d.roofline.ops)  # type: ignore[union-attr]
    roofs = [t["name"] for t in roofline["data"] if t.get("legendgroup") == "roofs"]
    assert any(r.startswith("memory bandwidth") for r in roofs)
    assert any(r.startswith("bf16, fp16 peak") for r in roofs)  # one roof for equal peaks


def test_html_report_of_a_cpu_trace(tmp_path: Path) -> None:
    b = TraceBuilder(device_name=None)
    for s in range(3):
        b.step(s + 1, s * 100.0, 100.0)
        b.cpu_op("aten::add", s * 100.0 + 10.0, 50.0)
    d = analyze(b.write(tmp_path / "cpu.json"))
    visible = Page(render_html(d)).visible
    assert "CPU time per step" in visible
    assert "Top ops by CPU time" in visible


def test_html_report_is_deterministic(tmp_path: Path) -> None:
    d = analyze(nasty_trace(tmp_path))
    assert render_html(d) == render_html(Diagnosis.from_json(d.to_json()))


def test_html_size_is_plotly_and_a_little_more(tmp_path: Path) -> None:
    from plotly.offline import get_plotlyjs

    page = render_html(analyze(nasty_trace(tmp_path)))
    assert len(page.encode()) - len(get_plotlyjs().encode()) < 100_000


def job_folder(folder: Path) -> Path:
    """Two ranks of a data-parallel job (the test_collectives.py recipe): 4 steps, each ending
    in one all-reduce in a process group named with markup; rank 1 is 300 µs late to each (its
    data loading is slower) and its clock 3 ms ahead. File names hold markup too."""
    for rank, late_us in ((0, 0.0), (1, 300.0)):
        b = TraceBuilder(rank=rank, world_size=2, base_us=1_700_000_000 + 3000 * rank)
        training_trace(4, loader_us=100.0 + late_us, builder=b)
        for s in range(4):
            end = 2000.0 * (s + 1)
            b.nccl(
                end - 400.0 + late_us,
                400.0 - late_us,
                collective="allreduce",
                nelems=64 << 20,
                group=IMG_NAME,
            )
        b.write(folder / f"rank{rank}-{FILE_NAME}")
    return folder


def test_html_job_section_of_a_folder(tmp_path: Path) -> None:
    folder = job_folder(tmp_path / "job")
    out = tmp_path / "job.html"
    assert main(["analyze", str(folder), "--workers", "1", "--format", "html", "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    d = analyze(folder, workers=1)
    j = d.job
    assert j is not None
    assert [s.rank for s in j.stragglers] == [1]
    p = Page(page)
    assert ("section", {"id": "job", "class": "card job"}) in p.tags
    assert ("a", {"href": "#job"}) in p.tags
    visible = " ".join(p.visible.split())
    assert "Clock skew (estimated)" in visible
    assert f"{j.matched} matched across ranks, {j.unmatched} left out" in visible
    assert "rank 1: last to arrive at 100% of collectives" in visible
    assert " ".join(j.stragglers[0].doing.split()) in visible
    assert j.reason in visible
    # The collectives table: one row, the group's markup as text.
    body = page.split('<section id="job"', 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = [[c.strip() for c in Page(tr).text if c.strip()] for tr in body.split("<tr>")[1:]]
    c = j.collectives[0]
    assert rows == [
        [
            IMG_NAME,
            "allreduce",
            "2",
            "4",
            "134.2 MB",
            "0.40",
            f"{c.wait_s * 1e3:.2f}",
            "1.3 TB/s",
            "100%",
        ]
    ]
    # The rank table's job columns: rank 0 waits, rank 1 is last at every collective, its
    # clock is 3 ms ahead.
    ranks = Page(page.split('<section id="ranks"', 1)[1].split("</section>", 1)[0]).visible
    for column in ("wait ms/step", "last", "clock ms", "comm exposed"):
        assert column in ranks
    assert "+3.000" in ranks
    assert "100%" in ranks
    assert f"rank1-{FILE_NAME}" in ranks
    # Still inert and self-contained, the CSP still matches the page's scripts.
    test_html_report_has_no_markup_from_the_trace(page)
    test_html_report_fetches_nothing(page)
    test_content_security_policy_allows_only_the_pages_own_scripts(page)
    # A single trace has no job section.
    assert 'id="job"' not in render_html(analyze(nasty_trace(tmp_path)))


def test_html_job_strings_are_inert(tmp_path: Path) -> None:
    d = analyze(job_folder(tmp_path), workers=1)
    assert d.job is not None
    replace = msgspec.structs.replace
    job = replace(
        d.job,
        reason=SCRIPT_NAME,
        clock_basis=QUOTES_NAME,
        link=IMG_NAME,
        link_peak=450e9,
        notes=[NASTY_NAME],
        collectives=[replace(c, name=SCRIPT_NAME) for c in d.job.collectives],
        stragglers=[replace(s, doing=IMG_NAME) for s in d.job.stragglers],
    )
    page = render_html(replace(d, job=job))
    test_html_report_has_no_markup_from_the_trace(page)
    visible = Page(page).visible
    for name in NASTY:
        assert name in visible


# Markdown ----------------------------------------------------------------------------------------


def markdown_html(text: str) -> str:
    """The Markdown as GitHub would render it, raw HTML passed through (tables on)."""
    return MarkdownIt("commonmark").enable("table").render(text)


def test_markdown_summary_leads_with_the_verdict(tmp_path: Path) -> None:
    d = analyze(nasty_trace(tmp_path))
    md = render(d, "md")
    assert md.startswith(f"### wallfinder: **{d.verdict.wall.upper()} wall**")
    rendered = Page(markdown_html(md)).visible
    for q in d.verdict.questions:
        assert q.question in rendered
    assert "Step time" in rendered
    assert "Top kernels by GPU time" in rendered
    for f in d.findings:
        assert f.title in rendered
    assert len(md) < 20_000


def test_markdown_renders_trace_strings_inert(tmp_path: Path) -> None:
    d = poisoned(analyze(nasty_trace(tmp_path)))
    d = msgspec.structs.replace(
        d,
        findings=[
            msgspec.structs.replace(f, evidence=f"see {IMG_NAME} @someone") for f in d.findings
        ],
    )
    rendered = markdown_html(render_markdown(d))
    p = Page(rendered)
    assert {t for t, _ in p.tags} <= {
        "h3",
        "strong",
        "p",
        "code",
        "blockquote",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "ol",
        "li",
        "br",
        "details",
        "summary",
        "sub",
        "em",
        "ul",
    }
    visible = p.visible
    for name in (SCRIPT_NAME, IMG_NAME, FILE_NAME):
        assert name in visible
    assert "@someone" not in visible  # no mention
    # Every row of the kernels table keeps its five cells, whatever the names hold.
    table = rendered.split("<summary>", 1)[1]
    for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]:
        assert row.count("<td") == 5


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("aten::mm", "`aten::mm`"),
        ("a`b", "``a`b``"),
        ("`x", "`` `x ``"),
        ("a|b", "`a\\|b`"),
    ],
)
def test_markdown_code_spans_hold_any_name(name: str, expected: str) -> None:
    assert code(name, table=True) == expected


# CLI and formats ---------------------------------------------------------------------------------


def test_analyze_writes_html_and_markdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert {"html", "md"} <= set(FORMATS)
    trace = training_trace(4).write(tmp_path / "t.json")
    out = tmp_path / "report.html"
    assert main(["analyze", str(trace), "--format", "html", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert main(["analyze", str(trace), "--format", "md"]) == 0
    assert capsys.readouterr().out.startswith("### wallfinder:")


def test_trace_metadata_that_no_figure_needs_is_in_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "hunter2-SECRET"
    doc = json.loads(training_trace(4).to_bytes())
    doc["environment"] = {"AWS_SECRET_ACCESS_KEY": secret, "HOME": f"/home/{secret}"}
    doc["traceName"] = f"/home/{secret}/run/trace.json"
    doc["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": 2, "master": secret}
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(doc))
    for fmt in FORMATS:
        assert main(["analyze", str(trace), "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert secret not in out, fmt


def test_module_icicle_root_is_all_the_time_so_a_lone_module_keeps_its_share(
    tmp_path: Path,
) -> None:
    # One module with 550 of the step's 620 µs of device time, as hta/v100_2rank_test_rank0
    # has one (DistributedDataParallel.forward, 4.4% of its device time): an icicle's root is
    # its whole box, so the module must not be the root.
    d = analyze(phased_training_trace(4).write(tmp_path / "t.json"))
    assert d.modules is not None
    (icicle,) = figures_of(render_html(d))["plot-modules"]["data"]
    by_id = dict(zip(icicle["ids"], icicle["parents"], strict=True))
    roots = [i for i, parent in by_id.items() if parent == ""]
    assert len(roots) == 1
    (root,) = roots
    assert icicle["labels"][icicle["ids"].index(root)] == "all device time per step"
    assert by_id["Net_0"] == root
    none = icicle["labels"].index("in no module")
    assert icicle["parents"][none] == root
    assert icicle["values"][none] == pytest.approx(d.modules.unattributed_s * 1e3)
    assert d.modules.unattributed_s * 1e3 == pytest.approx(0.07)
