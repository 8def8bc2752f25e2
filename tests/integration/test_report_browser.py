"""The HTML report as a person sees it: headless Chromium opens the file from disk, the plots
draw, the verdict, roofline points and step bars are on the page, the console stays clean, no
request leaves the page, and a trace with `<script>` in its names runs no script.

Chromium is Debian's (`chromium`), driven by playwright with no browser download. Without it
the tests install it when that is clearly possible and quick (root, apt-get, the package known
to apt), and skip with the reason otherwise. Set WALLFINDER_CHROMIUM to use another Chromium,
or WALLFINDER_NO_BROWSER_INSTALL=1 to never install one. Each test saves a full-page screenshot
under pytest's temporary folder (`--basetemp`), in `report-screenshots/`, and prints its path.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from browsers import LOAD_TIMEOUT_MS
from realtraces import real_trace
from tracegen import DATALOADER, TraceBuilder, training_trace
from wallfinder import Diagnosis, analyze
from wallfinder.diagnosis import OpRoofRow
from wallfinder.report._figures import GL_POINTS
from wallfinder.report.html import render_html

pytestmark = pytest.mark.slow

SCRIPT_NAME = "k</script><script>window.pwned=1</script>"
IMG_NAME = '<img src=x onerror="window.pwned=2">'
ALERT_NAME = "<svg onload=alert(1)>'\"&amp;$x$"
FILE_NAME = "<img src=y onerror=window.pwned=3>.json"
GEMM = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>()"


@dataclass
class Seen:
    """A report open in the browser, and what happened while it loaded and was used."""

    page: Any
    url: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        """No console error, no script error, no dialog, no request but the file itself."""
        assert self.errors == []
        assert self.dialogs == []
        assert self.requests == [self.url]
        assert self.page.evaluate("typeof window.pwned") == "undefined"

    def shoot(self, folder: Path, name: str) -> Path:
        path = folder / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        print(f"screenshot: {path}")
        return path


@pytest.fixture
def open_report(browser: Any) -> Iterator[Any]:
    pages: list[Any] = []

    def open_(html: Path) -> Seen:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        pages.append(page)
        seen = Seen(page, html.resolve().as_uri())
        page.on(
            "console",
            lambda m: seen.errors.append(f"console {m.text}") if m.type == "error" else None,
        )
        page.on("pageerror", lambda e: seen.errors.append(f"page error {e}"))
        page.on("request", lambda r: seen.requests.append(r.url))

        def dialog(d: Any) -> None:
            seen.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", dialog)
        page.goto(seen.url)
        page.wait_for_function(
            "document.body.getAttribute('data-plots') !== null", timeout=LOAD_TIMEOUT_MS
        )
        assert page.get_attribute("body", "data-plots") == "ready"
        return seen

    yield open_
    for page in pages:
        page.close()


# Traces ----------------------------------------------------------------------------------------


def shaped_op(b: TraceBuilder, op: str, dims: list[Any], start: float, kernel: str) -> None:
    """A bf16 op with shapes and the 100 µs kernel it launches (joined by External id)."""
    event = b.host(op, start, 5.0, args={"Input Dims": dims, "Input type": ["c10::BFloat16"] * 2})
    b.kernel(kernel, start + 10.0, 100.0, launch_at=start + 1.0)
    b.events[-1]["args"]["External id"] = event["args"]["External id"]


def model_trace() -> TraceBuilder:
    """Five 1 ms steps on an A100: a DataLoader wait, then three matmuls and three adds of
    different shapes (six points on the roofline)."""
    b = TraceBuilder(device_name="NVIDIA A100-SXM4-80GB")
    for s in range(5):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.dataloader(t0, 200.0)
        t = t0 + 200.0
        for n in (1024, 2048, 4096):
            shaped_op(b, "aten::mm", [[n, 1024], [1024, 1024]], t, GEMM)
            shaped_op(b, "aten::add", [[n, 1024], [n, 1024]], t + 120.0, ADD)
            t += 240.0
    return b


def memory_trace() -> TraceBuilder:
    """model_trace with memory events: 2 GiB allocated before the trace and 4 GiB reserved;
    in each step, 256 MiB allocated in each of the first two matmuls, freed at its end."""
    b = model_trace()
    gib, block = 1 << 30, 256 << 20
    for s in range(5):
        t0 = s * 1000.0
        b.memory(t0 + 202.0, 0x1000, block, 2 * gib + block, 4 * gib)
        b.memory(t0 + 442.0, 0x2000, block, 2 * gib + 2 * block, 4 * gib)
        b.memory(t0 + 950.0, 0x2000, -block, 2 * gib + block, 4 * gib)
        b.memory(t0 + 951.0, 0x1000, -block, 2 * gib, 4 * gib)
    return b


def write_report(d: Diagnosis, folder: Path, name: str = "report.html") -> Path:
    path = folder / name
    path.write_text(render_html(d), encoding="utf-8")
    return path


def point(name: str, *, ai: float, flops: float) -> OpRoofRow:
    """A roofline point named `name` (name and shapes)."""
    return OpRoofRow(
        name=name,
        shapes=name,
        dtype="bf16",
        calls=1,
        time_s=1e-4,
        flops=flops,
        bytes=flops / ai,
        ai=ai,
        achieved_flops=flops / 1e-4,
        achieved_bandwidth=flops / ai / 1e-4,
        ridge=None,
        bound=None,
        pct_of_roof=None,
        cls="gemm",
    )


DRAWN_POINTS = """() => {
  const plot = document.getElementById('plot-roofline');
  if (!plot) return 0;
  const layers = plot.querySelectorAll('.scatterlayer .trace');
  return plot.data.reduce((n, trace, i) => n + (trace.mode === 'markers'
    ? layers[i].querySelectorAll('.points path.point').length : 0), 0);
}"""
"""The op points drawn on the roofline (SVG), not counting the ridges' markers."""


def hover_lines(page: Any) -> list[str]:
    """The lines of the roofline's hover label, as drawn."""
    lines: list[str] = page.evaluate(
        "[...document.querySelectorAll('#plot-roofline .hoverlayer .hovertext tspan.line')]"
        ".map(t => t.textContent)"
    )
    return lines


def svg_texts(page: Any, selector: str) -> list[str]:
    """The text of the SVG elements `selector` finds (SVG has no innerText)."""
    texts: list[str] = page.evaluate(
        f"[...document.querySelectorAll({selector!r})].map(t => t.textContent)"
    )
    return texts


def plotted_ops(d: Diagnosis) -> int:
    r = d.roofline
    assert r is not None
    return sum(1 for o in (*r.ops, *r.more_ops) if o.ai and o.flops > 0)


# Tests -----------------------------------------------------------------------------------------


def test_report_draws_verdict_roofline_points_and_step_bars(
    open_report: Any, screenshots: Path, tmp_path: Path
) -> None:
    d = analyze(model_trace().write(tmp_path / "model.json"))
    seen = open_report(write_report(d, tmp_path))
    page = seen.page
    verdict = page.inner_text("#verdict")
    assert f"{d.verdict.wall.upper()} wall" in verdict
    assert "data loading (DataLoader)" in verdict
    for q in d.verdict.questions:
        assert q.question in verdict
    # Each costed op is a drawn point on the roofline.
    assert page.evaluate(DRAWN_POINTS) == plotted_ops(d) == 6
    points = page.locator("#plot-roofline .scatterlayer .trace:first-child .points path.point")
    assert all((points.nth(i).bounding_box() or {}).get("width", 0) > 0 for i in range(3))
    # A stacked bar per step and part; each step's bars reach the step's length.
    bars = page.locator("#plot-steps .barlayer .point path")
    parts = len(page.evaluate("document.getElementById('plot-steps').data"))
    assert bars.count() == len(d.breakdown.steps) * parts
    assert page.locator("#plot-timeline .barlayer .point path").count() >= 3
    assert DATALOADER in page.inner_text("#timeline table")
    # Hovering a point names its op and shapes.
    points.first.hover(force=True)  # plotly's drag layer takes the pointer events
    page.wait_for_selector("#plot-roofline .hoverlayer .hovertext")
    assert hover_lines(page)[0] == "aten::mm"
    # The tables sort.
    page.click("#top th:has-text('calls')")
    calls = [int(x) for x in page.locator("#top tbody td:nth-child(3)").all_inner_texts()]
    assert calls == sorted(calls, reverse=True)
    seen.assert_clean()
    seen.shoot(screenshots, "model")


def test_script_in_trace_names_does_not_run(
    open_report: Any, screenshots: Path, tmp_path: Path
) -> None:
    b = training_trace(4, kernels=(GEMM, SCRIPT_NAME, IMG_NAME, ALERT_NAME))
    d = analyze(b.write(tmp_path / FILE_NAME))
    r = d.roofline
    t = d.timeline
    assert r is not None
    assert t is not None
    # Names in every place the page draws one: roofline points, timeline host events.
    names = (SCRIPT_NAME, IMG_NAME, ALERT_NAME)
    ops = [point(name, ai=10.0 ** (i + 1), flops=1e12 * (i + 1)) for i, name in enumerate(names)]
    gaps = [msgspec.structs.replace(g, host=names[i % 3]) for i, g in enumerate(t.gaps)]
    d = msgspec.structs.replace(
        d,
        roofline=msgspec.structs.replace(r, ops=ops),
        timeline=msgspec.structs.replace(t, gaps=gaps),
    )
    seen = open_report(write_report(d, tmp_path, "nasty.html"))
    page = seen.page
    text = page.inner_text("body")
    for name in (SCRIPT_NAME, IMG_NAME, ALERT_NAME, FILE_NAME):
        assert name in text
    # Plotly draws the hover labels with the names in them: still text, shown as written.
    points = page.locator("#plot-roofline .scatterlayer .trace:first-child .points path.point")
    assert points.count() == 3
    for i in range(3):
        points.nth(i).hover(force=True)
        page.wait_for_selector("#plot-roofline .hoverlayer .hovertext")
        assert hover_lines(page)[0] in names
    bars = page.locator("#plot-timeline .barlayer .point")
    for i in range(bars.count()):
        bars.nth(i).hover(force=True)
    assert page.evaluate("document.querySelectorAll('img, iframe, svg [onload]').length") == 0
    seen.assert_clean()
    seen.shoot(screenshots, "script-in-names")


def test_many_roofline_points_draw_with_webgl(
    open_report: Any, screenshots: Path, tmp_path: Path
) -> None:
    d = analyze(model_trace().write(tmp_path / "model.json"))
    r = d.roofline
    assert r is not None
    spread = [
        msgspec.structs.replace(o, ai=(o.ai or 1.0) * (1 + k / 500), time_s=o.time_s / 50)
        for k in range(GL_POINTS // 5)
        for o in r.ops
    ]
    d = msgspec.structs.replace(d, roofline=msgspec.structs.replace(r, more_ops=spread))
    seen = open_report(write_report(d, tmp_path, "webgl.html"))
    page = seen.page
    if not page.evaluate("!!document.createElement('canvas').getContext('webgl')"):
        pytest.skip("this Chromium has no WebGL")
    assert "WebGL is not supported" not in page.inner_text("#plot-roofline")
    assert page.locator("#plot-roofline canvas").count() >= 1
    seen.assert_clean()
    seen.shoot(screenshots, "webgl")


def test_memory_chart_draws_stacked_categories_reserved_and_the_peak(
    open_report: Any, screenshots: Path, tmp_path: Path
) -> None:
    d = analyze(memory_trace().write(tmp_path / "memory.json"))
    assert d.memory is not None
    m = d.memory.devices[0]
    seen = open_report(write_report(d, tmp_path, "memory.html"))
    page = seen.page
    assert "Memory" in page.inner_text("#memory h2")
    data = page.evaluate("document.getElementById('plot-memory').data")
    names = [t["name"] for t in data]
    stacked = [t for t in data if t.get("stackgroup")]
    assert stacked
    assert {"allocated", "reserved", "peak"} <= set(names)
    # Every trace is drawn in SVG: the stacked areas filled, the lines stroked, the peak marked.
    drawn = [t for t in data if t.get("visible", True) is True]  # not "legendonly"
    assert page.locator("#plot-memory .scatterlayer .trace").count() == len(drawn)
    assert page.locator("#plot-memory .scatterlayer .trace path.js-fill").count() >= len(stacked)
    assert page.locator("#plot-memory .scatterlayer .trace path.js-line").count() >= len(stacked)
    assert page.locator("#plot-memory .scatterlayer .trace .points path.point").count() >= 1
    labels = svg_texts(page, "#plot-memory .annotation-text")
    assert any(label.startswith("peak ") for label in labels)
    assert [s.step for s in m.steps] == [x for x in labels if x.startswith("step ")]
    assert "GiB" in " ".join(svg_texts(page, "#plot-memory .ytick text"))
    # Hovering the chart lists the categories and totals at that time.
    page.locator("#plot-memory .nsewdrag").hover(force=True)  # its centre
    page.wait_for_selector("#plot-memory .hoverlayer text")
    hover = " ".join(svg_texts(page, "#plot-memory .hoverlayer text"))
    assert "allocated: " in hover
    seen.assert_clean()
    seen.shoot(screenshots, "memory")


@pytest.mark.parametrize(
    "relative", ["hta/a100-80gb_16rank_rank0.json.gz", "hta/cpu_only_rank34.json.gz"]
)
def test_real_trace_report_in_a_browser(
    open_report: Any, screenshots: Path, tmp_path: Path, relative: str
) -> None:
    trace = real_trace(relative)
    d = analyze(trace)
    seen = open_report(write_report(d, tmp_path))
    page = seen.page
    assert f"{d.verdict.wall.upper()} wall" in page.inner_text("#verdict")
    assert page.locator("#plot-steps .barlayer .point path").count() >= d.steps.total
    if d.timeline is not None:
        assert page.locator("#plot-timeline .barlayer .point path").count() >= 1
    assert page.evaluate(DRAWN_POINTS) == (plotted_ops(d) if d.roofline else 0)
    seen.assert_clean()
    seen.shoot(screenshots, Path(relative).name.removesuffix(".json.gz"))


FUSION_GEOMETRY = """() => {
  const card = document.querySelector('#fusion').getBoundingClientRect();
  const table = document.querySelector('#fusion table');
  const box = table.getBoundingClientRect();
  const heads = [...table.querySelectorAll('thead th')].map(h => h.getBoundingClientRect().width);
  const first = table.querySelector('tbody td');
  const line = parseFloat(getComputedStyle(first).lineHeight);
  const rows = [...table.querySelectorAll('tbody tr')].map(r => r.getBoundingClientRect().height);
  const names = [...table.querySelectorAll('tbody td:first-child code.name')];
  return {
    card: [card.left, card.right], table: [box.left, box.right], heads, line, rows,
    names: names.length, broken: names.filter(n => n.getClientRects().length > 1).length,
    page: document.documentElement.scrollWidth, viewport: window.innerWidth,
  };
}"""
"""Where the fusion table lies in its card, its columns' widths, its rows' heights and line
height, and how many kernel names are drawn over more than one line."""

ICICLE_SLICES = """() => [...document.querySelectorAll('#plot-modules g.slice')].map(g => {
  const r = g.querySelector('path.surface').getBoundingClientRect();
  return {id: g.__data__.data.data.id, label: g.textContent, width: r.width};
})"""
"""The module icicle's drawn slices: plotly's id, label and width of each."""


def test_fusion_table_and_module_icicle_keep_their_shape(
    open_report: Any, screenshots: Path, tmp_path: Path
) -> None:
    # hta/v100_2rank_test_rank0: five fusion chains of up to 189 kernels, beside op names such
    # as torch::autograd::CppNode<fbgemm_gpu::PermutePooledEmbsFunction<...> > that cannot
    # break; and one module (DistributedDataParallel.forward) with 4.4% of the device time.
    # The names had broken letter by letter in a 70 px column, rows ran up to 930 px tall, and
    # the icicle drew the lone module over the whole box.
    d = analyze(real_trace("hta/v100_2rank_test_rank0.json.gz"))
    assert d.fusion
    assert d.modules is not None
    seen = open_report(write_report(d, tmp_path))
    page = seen.page
    g = page.evaluate(FUSION_GEOMETRY)
    shot = seen.shoot(screenshots, "fusion-and-modules")
    print(f"fusion table: {g}")
    # The table lies within its card, and the page does not scroll sideways.
    assert g["card"][0] <= g["table"][0], shot
    assert g["table"][1] <= g["card"][1], shot
    assert g["page"] <= g["viewport"]
    # The kernels column is the widest, at least 40% of the table: every kernel name whole on
    # one line.
    width = g["table"][1] - g["table"][0]
    assert g["heads"][0] == max(g["heads"]) >= 0.4 * width
    assert g["names"] >= 3 * len(d.fusion)
    assert g["broken"] == 0
    # No row taller than ten lines of text.
    assert len(g["rows"]) == len(d.fusion)
    assert max(g["rows"]) <= 10 * g["line"]
    # The icicle's root is all the device time: the module's width is its share of it, and
    # the time in no module lies beside it.
    slices = {s["label"]: s for s in page.evaluate(ICICLE_SLICES)}
    root = slices["all device time per step"]["width"]
    (top,) = [r for r in d.modules.rows if r.parent is None]
    assert top.share < 0.05
    assert slices[top.path]["width"] / root == pytest.approx(top.share, abs=0.005)
    none = slices["in no module"]["width"] / root
    assert none == pytest.approx(1 - top.share, abs=0.005)
    seen.assert_clean()
