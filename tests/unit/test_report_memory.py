"""The memory profile in the three reports (terminal, Markdown, HTML): the peak and when, what
is live then by category and call site, growth and leaks, the allocator's reserving, the memory
findings with what each frees, other devices and notes; the HTML chart of the main device's
timeline. Every figure shown is the MemoryProfile's own."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from markdown_it import MarkdownIt

from tracegen import NASTY_NAME, training_trace
from wallfinder import Diagnosis, analyze
from wallfinder.diagnosis import (
    DeviceMemoryProfile,
    Finding,
    MemoryLeak,
    MemoryPoint,
    MemoryProfile,
    MemorySite,
    StepMemory,
)
from wallfinder.report import _format as fmt
from wallfinder.report._figures import MEMORY_COLOR
from wallfinder.report.html import render_html
from wallfinder.report.markdown import render_markdown
from wallfinder.report.terminal import render_text

MiB = 1 << 20
GiB = 1 << 30
SCRIPT = "<script>window.pwned=1</script>"


def cats(**given: int) -> dict[str, int]:
    return {
        "before_trace": 0,
        "activations": 0,
        "gradients": 0,
        "optimizer_state": 0,
        "temporaries": 0,
        "other": 0,
        **given,
    }


def step(label: str, start: float, *, warmup: bool = False) -> StepMemory:
    return StepMemory(
        step=label,
        start_s=start,
        end_s=start + 0.01,
        start_allocated=10 * GiB,
        end_allocated=10 * GiB,
        peak_allocated=40 * GiB,
        peak_reserved=60 * GiB,
        reserved_changes=2,
        warmup=warmup,
    )


TIMELINE = [
    MemoryPoint(
        t_s=0.001,
        allocated=11 * GiB,
        reserved=50 * GiB,
        categories=cats(before_trace=10 * GiB, temporaries=GiB),
    ),
    MemoryPoint(
        t_s=0.011,
        allocated=30 * GiB,
        reserved=55 * GiB,
        categories=cats(before_trace=10 * GiB, activations=20 * GiB),
    ),
    MemoryPoint(
        t_s=0.0123,
        allocated=40 * GiB,
        reserved=60 * GiB,
        categories=cats(
            before_trace=10 * GiB, activations=24 * GiB, gradients=4 * GiB, temporaries=2 * GiB
        ),
    ),
    MemoryPoint(
        t_s=0.025,
        allocated=14 * GiB,
        reserved=60 * GiB,
        categories=cats(before_trace=10 * GiB, gradients=4 * GiB),
    ),
]


def main_device(**changes: Any) -> DeviceMemoryProfile:
    """An H100's memory: 40 GiB allocated at the peak (half its 80 GiB), 60 GiB reserved, in
    the backward pass of step 2; a leak of 512 MiB per step."""
    device = DeviceMemoryProfile(
        device="cuda:0",
        events=1234,
        capacity=80 * GiB,
        capacity_source="datasheet: NVIDIA H100 80GB HBM3",
        peak_allocated=40 * GiB,
        peak_reserved=60 * GiB,
        peak_time_s=0.0123,
        peak_step="step 2",
        peak_phase="backward",
        peak_op="aten::mm",
        before_trace=10 * GiB,
        categories=cats(
            before_trace=10 * GiB, activations=24 * GiB, gradients=4 * GiB, temporaries=2 * GiB
        ),
        sites=[
            MemorySite(
                site="model.py(42): forward", category="activations", bytes=20 * GiB, count=48
            ),
            MemorySite(site="aten::mm", category="temporaries", bytes=2 * GiB, count=3),
            MemorySite(site="model.py(50): head", category="activations", bytes=4 * GiB, count=8),
            MemorySite(site="optim.py(7): step", category="gradients", bytes=4 * GiB, count=16),
            MemorySite(site="train.py(88): train", category="other", bytes=MiB, count=1),
            MemorySite(site="sixth.py(1): f", category="other", bytes=1024, count=1),
        ],
        steps=[step("step 1", 0.0, warmup=True), step("step 2", 0.01), step("step 3", 0.02)],
        growth_per_step=512 * MiB,
        leak=True,
        leak_sites=[
            MemoryLeak(
                site="train.py(88): train", op="aten::add", count=12, bytes=3 * GiB // 2, steps=3
            )
        ],
        reserved_at_peak=60 * GiB,
        reserved_grows=7,
        reserved_shrinks=2,
        steady_reserved_changes_per_step=1.5,
        timeline=TIMELINE,
    )
    return msgspec.structs.replace(device, **changes)


HOST = DeviceMemoryProfile(
    device="cpu",
    events=10,
    capacity=None,
    capacity_source=None,
    peak_allocated=3 * MiB,
    peak_reserved=0,
    peak_time_s=0.005,
    peak_step="step 1",
    peak_phase="forward",
    peak_op=None,
    before_trace=0,
)
FINDINGS = [
    Finding.memory(
        id="memory-activations",
        title="Activations fill most of the memory at the peak",
        evidence="activations are 24.0 GiB (60%) at the peak",
        fix="activation checkpointing",
        saving_bytes=24 * GiB,
        device="cuda:0",
    ),
    Finding.memory(
        id="memory-churn",
        title="The allocator gets and releases device memory every step",
        evidence="reserved memory changed 1.5 times per steady-state step",
        fix="no torch.cuda.empty_cache() in the loop",
        saving_bytes=None,
        device="cuda:0",
    ),
]
NOTE = "no Python stacks in the trace: call sites are ops"


def profile(**changes: Any) -> MemoryProfile:
    return MemoryProfile(devices=[main_device(**changes), HOST], findings=FINDINGS, notes=[NOTE])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Diagnosis:
    """A GPU diagnosis without memory events."""
    folder = tmp_path_factory.mktemp("memory")
    d = analyze(training_trace(4).write(folder / "trace.json"))
    assert d.memory is None
    return d


@pytest.fixture(scope="module")
def diagnosis(base: Diagnosis) -> Diagnosis:
    return msgspec.structs.replace(base, memory=profile())


def section(text: str, start: str, end: str) -> list[str]:
    """The lines of `text` from the one that starts with `start` to the one before `end`."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(start))
    last = next(i for i, line in enumerate(lines) if i > first and line.startswith(end))
    return lines[first:last]


def cells(lines: list[str]) -> list[list[str]]:
    """The cells of a rich table's body rows."""
    return [[c.strip() for c in line.split("│")] for line in lines if "│" in line]


# Terminal ---------------------------------------------------------------------------------------


def test_terminal_memory_section_shows_the_peak_categories_sites_leak_and_findings(
    diagnosis: Diagnosis,
) -> None:
    text = render_text(diagnosis, width=100)
    lines = section(text, "Memory cuda:0", "GPU time by kernel class")
    assert lines[:3] == [
        "Memory cuda:0 — peak 40.00 GiB allocated (50.0% of capacity), 60.00 GiB reserved (75.0%)",
        "  capacity 80.00 GiB (datasheet: NVIDIA H100 80GB HBM3)",
        "  at the peak: 12.3 ms into the trace, step 2, backward pass, in aten::mm",
    ]
    by_category = section(text, "Live at the peak by category", "Live at the peak by call site")
    # Largest first; optimizer state and other hold nothing: left out.
    assert cells(by_category) == [
        ["activations", "24.00 GiB", "60.0%"],
        ["before the trace (parameters, state)", "10.00 GiB", "25.0%"],
        ["gradients", "4.00 GiB", "10.0%"],
        ["temporaries", "2.00 GiB", "5.0%"],
    ]
    by_site = section(text, "Live at the peak by call site", "Reserved memory")
    assert cells(by_site) == [
        ["model.py(42): forward", "activations", "20.00 GiB", "48"],
        ["aten::mm", "temporaries", "2.00 GiB", "3"],
        ["model.py(50): head", "activations", "4.00 GiB", "8"],
        ["optim.py(7): step", "gradients", "4.00 GiB", "16"],
        ["train.py(88): train", "other (allocated between steps)", "1.00 MiB", "1"],
    ]
    assert "sixth.py" not in text  # at most five sites
    rest = section(text, "Reserved memory", "GPU time by kernel class")
    assert rest[:3] == [
        "Reserved memory grew 7 times and shrank 2 times in the trace (device mallocs and frees); "
        "1.5 changes",
        "per steady-state step",
        "LEAK: allocated memory grows by 512.00 MiB per step, in blocks never freed from these "
        "call sites:",
    ]
    assert "  • train.py(88): train (aten::add): 1.50 GiB in 12 blocks over 3 steps" in rest
    assert "• Activations fill most of the memory at the peak — frees at most 24.00 GiB" in rest
    assert "  evidence: activations are 24.0 GiB (60%) at the peak" in rest
    assert "  fix: activation checkpointing" in rest
    assert "• The allocator gets and releases device memory every step — bound unknown" in rest
    assert "other device cpu: peak 3.00 MiB allocated" in rest
    assert f"note: {NOTE}" in rest
    # The growth line is the leak line's when it leaks.
    assert "Growth per step" not in text


def test_terminal_memory_comes_after_the_breakdown_and_before_the_kernel_tables(
    diagnosis: Diagnosis,
) -> None:
    text = render_text(diagnosis, width=100)
    assert (
        text.index("GPU time per step")
        < text.index("Memory cuda:0")
        < text.index("GPU time by kernel class")
    )


def test_terminal_growth_without_a_leak_and_a_cpu_peak_without_reserved(
    base: Diagnosis,
) -> None:
    cpu = msgspec.structs.replace(
        HOST,
        categories=cats(activations=2 * MiB, temporaries=MiB),
        growth_per_step=4.0,
        steps=[step("step 1", 0.0)],
    )
    d = msgspec.structs.replace(base, memory=MemoryProfile(devices=[cpu]))
    text = render_text(d, width=100)
    lines = section(text, "Memory cpu", "GPU time by kernel class")
    assert lines[:2] == [
        "Memory cpu — peak 3.00 MiB allocated",
        "  at the peak: 5.00 ms into the trace, step 1, forward pass",
    ]
    assert cells(lines) == [
        ["activations", "2.00 MiB", "66.7%"],
        ["temporaries", "1.00 MiB", "33.3%"],
    ]
    assert (
        "Growth per step: +4 B (the trend of allocated bytes at the steady-state steps' "
        "boundaries)" in lines
    )
    assert "LEAK" not in text
    assert "Reserved memory" not in text
    assert "Memory findings" not in text


def test_terminal_memory_fits_the_width_and_prints_markup_literally(base: Diagnosis) -> None:
    sites = [
        MemorySite(site=NASTY_NAME, category="activations", bytes=GiB, count=1),
        MemorySite(site="[red]x.py(1)[/red]", category="activations", bytes=GiB, count=1),
    ]
    d = msgspec.structs.replace(base, memory=profile(sites=sites, peak_op=NASTY_NAME))
    for width in (60, 100, 160):
        text = render_text(d, width=width)
        assert max(len(line) for line in text.splitlines()) <= width
    text = render_text(d, width=200)
    assert f"in {NASTY_NAME}" in text
    assert " [red]x.py(1)[/red] " in text


def test_no_memory_no_memory_section(base: Diagnosis) -> None:
    text = render_text(base, width=100)
    assert not [line for line in text.splitlines() if line.startswith("Memory")]
    assert "Live at the peak" not in text
    assert "Memory" not in render_markdown(base)
    page = render_html(base)
    assert 'id="memory"' not in page
    assert 'href="#memory"' not in page
    assert "plot-memory" not in page


# Markdown ---------------------------------------------------------------------------------------


def test_markdown_memory_section(diagnosis: Diagnosis) -> None:
    md = render_markdown(diagnosis)
    lines = md.splitlines()
    first = lines.index("#### Memory on `cuda:0`")
    assert lines[first + 2 : first + 5] == [
        "**peak 40.00 GiB allocated (50.0% of capacity), 60.00 GiB reserved (75.0%)**  ",
        "capacity 80.00 GiB (datasheet: NVIDIA H100 80GB HBM3)  ",
        "at the peak: 12.3 ms into the trace, step 2, backward pass, in aten::mm",
    ]
    table = lines.index("| live at the peak | bytes | share |")
    assert lines[table + 2 : table + 7] == [
        "| activations | 24.00 GiB | 60.0% |",
        "| before the trace (parameters, state) | 10.00 GiB | 25.0% |",
        "| gradients | 4.00 GiB | 10.0% |",
        "| temporaries | 2.00 GiB | 5.0% |",
        "",
    ]
    sites = lines.index("| call site | category | bytes | blocks |")
    assert lines[sites + 2] == "| `model.py(42): forward` | activations | 20.00 GiB | 48 |"
    assert lines[sites + 7] == ""  # five sites
    for expected in (
        "- Reserved memory grew 7 times and shrank 2 times in the trace (device mallocs and "
        "frees); 1.5 changes per steady-state step",
        "- ⚠️ **LEAK**: allocated memory grows by 512.00 MiB per step, in blocks never freed "
        "from these call sites:",
        "  - train.py(88): train (aten::add): 1.50 GiB in 12 blocks over 3 steps",
        "1. **Activations fill most of the memory at the peak** — frees at most 24.00 GiB  ",
        "   evidence: activations are 24.0 GiB (60%) at the peak  ",
        "2. **The allocator gets and releases device memory every step** — bound unknown  ",
        "- other device cpu: peak 3.00 MiB allocated",
        f"- _note:_ {NOTE}",
    ):
        assert expected in lines
    # Before the top kernels, after the fixes.
    assert md.index("**What to fix**") < md.index("#### Memory") < md.index("Top kernels by GPU")


def test_markdown_memory_strings_are_inert(base: Diagnosis) -> None:
    sites = [MemorySite(site=SCRIPT, category="activations", bytes=GiB, count=1)]
    leaks = [MemoryLeak(site=SCRIPT, op="@someone", count=1, bytes=GiB, steps=3)]
    d = msgspec.structs.replace(
        base, memory=profile(sites=sites, leak_sites=leaks, peak_op="**bold** <b>x</b>")
    )
    html = MarkdownIt("commonmark").enable("table").render(render_markdown(d))
    assert "<script>" not in html
    assert "<b>x</b>" not in html
    assert "@someone" not in html  # no mention: a word joiner follows the @


# HTML -------------------------------------------------------------------------------------------


def figures_of(page: str) -> dict[str, Any]:
    block = page.split('<script type="application/json" id="wf-figures">', 1)[1]
    figures: dict[str, Any] = json.loads(block.split("</script>", 1)[0])
    return figures


def visible(page: str) -> str:
    """The page's text without tags, scripts and styles, whitespace collapsed."""
    body = page.split("<main>", 1)[1].split("</main>", 1)[0]
    text = re.sub(r"<[^>]+>", " ", body)
    for entity, char in (("&lt;", "<"), ("&gt;", ">"), ("&#39;", "'"), ("&#34;", '"')):
        text = text.replace(entity, char)
    return " ".join(text.replace("&amp;", "&").split())


def test_html_memory_section_shows_the_same_content(diagnosis: Diagnosis) -> None:
    page = render_html(diagnosis)
    assert '<a href="#memory">Memory</a>' in page
    assert '<div id="plot-memory" class="plot"' in page
    text = visible(page)
    for expected in (
        "Memory cuda:0, from the trace's memory events",
        "Peak 40.00 GiB allocated (50.0% of capacity), 60.00 GiB reserved (75.0%)",
        "Capacity 80.00 GiB (datasheet: NVIDIA H100 80GB HBM3)",
        "When 12.3 ms into the trace, step 2, backward pass, in aten::mm",
        "LEAK : allocated memory grows by 512.00 MiB per step",
        "train.py(88): train (aten::add): 1.50 GiB in 12 blocks over 3 steps",
        "before the trace (parameters, state) 10.00 GiB 25.0%",
        "activations 24.00 GiB 60.0%",
        "model.py(42): forward activations 20.00 GiB 48",
        "Reserved memory grew 7 times and shrank 2 times in the trace",
        "Activations fill most of the memory at the peak frees at most 24.00 GiB",
        "The allocator gets and releases device memory every step bound unknown",
        "Evidence activations are 24.0 GiB (60%) at the peak",
        "Other device cpu: peak 3.00 MiB allocated",
        NOTE,
    ):
        assert expected in text, expected
    assert "sixth.py" not in text
    assert text.index("Memory cuda:0") < text.index("Top kernels by GPU time")


def test_html_memory_chart_stacks_categories_with_reserved_peak_and_steps(
    diagnosis: Diagnosis,
) -> None:
    figure = figures_of(render_html(diagnosis))["plot-memory"]
    data, layout = figure["data"], figure["layout"]
    names = [t["name"] for t in data]
    # Categories with bytes at some point (not optimizer state, not other), then the totals.
    assert names == [
        "before the trace (parameters, state)",
        "activations",
        "gradients",
        "temporaries",
        "allocated",
        "reserved",
        "peak",
        "capacity 80.00 GiB",
    ]
    x = [p.t_s for p in TIMELINE]
    stacked = [t for t in data if t.get("stackgroup") == "allocated"]
    assert len(stacked) == 4
    order = ("before_trace", "activations", "gradients", "temporaries")
    for trace, cat in zip(stacked, order, strict=True):
        assert trace["x"] == x
        assert trace["y"] == [p.categories[cat] for p in TIMELINE]
        assert trace["line"]["color"] == MEMORY_COLOR[cat]
    reserved = data[names.index("reserved")]
    assert reserved["y"] == [p.reserved for p in TIMELINE]
    assert "stackgroup" not in reserved
    peak = data[names.index("peak")]
    assert (peak["x"], peak["y"]) == ([0.0123], [40 * GiB])
    (note,) = [a for a in layout["annotations"] if a["text"].startswith("peak")]
    assert note["text"] == "peak 40.00 GiB · step 2, backward"
    assert (note["x"], note["y"]) == (0.0123, 40 * GiB)
    # Step starts (and the last step's end) as lines; the warm-up step shaded and labelled.
    lines = [s["x0"] for s in layout["shapes"] if s["type"] == "line"]
    assert lines == pytest.approx([0.0, 0.01, 0.02, 0.03])
    assert [(s["x0"], s["x1"]) for s in layout["shapes"] if s["type"] == "rect"] == [(0.0, 0.01)]
    labels = [a["text"] for a in layout["annotations"] if a.get("yref") == "paper"]
    assert labels == ["step 1 (warm-up)", "step 2", "step 3"]
    # Bytes on the y axis with binary units; the capacity (reserved is 75% of it) fits.
    assert layout["yaxis"]["ticktext"] == ["0", "20 GiB", "40 GiB", "60 GiB", "80 GiB", "100 GiB"]
    assert layout["yaxis"]["tickvals"] == [k * 20 * GiB for k in range(6)]
    assert data[names.index("capacity 80.00 GiB")]["visible"] is True


def test_html_memory_chart_of_many_steps_labels_some_and_marks_all(base: Diagnosis) -> None:
    steps = [step(f"step {i}", i * 0.01) for i in range(40)]
    d = msgspec.structs.replace(base, memory=profile(steps=steps))
    layout = figures_of(render_html(d))["plot-memory"]["layout"]
    assert len([s for s in layout["shapes"] if s["type"] == "line"]) == 41
    labels = [a["text"] for a in layout["annotations"] if a.get("yref") == "paper"]
    assert labels == [f"step {i}" for i in range(0, 40, 4)]


def test_html_memory_chart_of_a_few_bytes_has_byte_ticks(base: Diagnosis) -> None:
    point = MemoryPoint(t_s=0.001, allocated=48, reserved=0, categories=cats(temporaries=48))
    cpu = msgspec.structs.replace(
        HOST, peak_allocated=48, categories=cats(temporaries=48), timeline=[point]
    )
    figure = figures_of(
        render_html(msgspec.structs.replace(base, memory=MemoryProfile(devices=[cpu])))
    )
    layout = figure["plot-memory"]["layout"]
    assert layout["yaxis"]["ticktext"] == ["0", "20 B", "40 B", "60 B"]
    assert "reserved" not in [t["name"] for t in figure["plot-memory"]["data"]]


def test_html_memory_table_colours_match_the_chart(diagnosis: Diagnosis) -> None:
    page = render_html(diagnosis)
    table = page.split("Live at the peak by category", 1)[1].split("</table>", 1)[0]
    for cat in ("before_trace", "activations", "gradients", "temporaries"):
        assert f"background: {MEMORY_COLOR[cat]}" in table


def test_html_memory_without_timeline_has_no_chart(base: Diagnosis) -> None:
    d = msgspec.structs.replace(base, memory=profile(timeline=[]))
    page = render_html(d)
    assert "plot-memory" not in figures_of(page)
    assert 'id="plot-memory"' not in page
    assert 'id="memory"' in page
    assert "Peak 40.00 GiB allocated" in visible(page)


def test_html_memory_strings_are_escaped(base: Diagnosis) -> None:
    sites = [MemorySite(site=SCRIPT, category="activations", bytes=GiB, count=1)]
    leaks = [MemoryLeak(site=SCRIPT, op=None, count=1, bytes=GiB, steps=3)]
    steps = [step(SCRIPT, 0.0), step("step $x$", 0.01)]
    d = msgspec.structs.replace(
        base,
        memory=profile(
            sites=sites, leak_sites=leaks, steps=steps, peak_step=SCRIPT, peak_op=SCRIPT
        ),
    )
    page = render_html(d)
    assert SCRIPT not in page.split('id="wf-figures"')[0]
    assert SCRIPT in visible(page)
    strings: list[str] = []

    def collect(value: object) -> None:
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif isinstance(value, list):
            for v in value:
                collect(v)

    collect(figures_of(page)["plot-memory"])
    for s in strings:
        assert "<" not in re.sub(r"<br>|<extra></extra>", "", s), s
        assert "$" not in s, s


def test_byte_sizes_use_binary_units() -> None:
    assert [fmt.size(n) for n in (0, 512, 1536, 3 * MiB, 6 * GiB + GiB // 2, 2 << 40)] == [
        "0 B",
        "512 B",
        "1.50 KiB",
        "3.00 MiB",
        "6.50 GiB",
        "2.00 TiB",
    ]
    assert fmt.size(None) == "?"


# From a trace -----------------------------------------------------------------------------------


def test_reports_show_the_memory_analysed_from_a_trace(tmp_path: Path) -> None:
    # Each 420 µs step allocates a 64 MiB block in its op and frees it at the step's end, on
    # top of 1 GiB allocated before the trace; the allocator holds 2 GiB.
    b = training_trace(4)
    for s in range(4):
        t0 = s * 420.0
        b.memory(t0 + 102.0, 0x1000, 64 * MiB, GiB + 64 * MiB, 2 * GiB)
        b.memory(t0 + 400.0, 0x1000, -64 * MiB, GiB, 2 * GiB)
    d = analyze(b.write(tmp_path / "t.json"))
    m = d.main_memory
    assert m is not None
    assert (m.device, m.peak_allocated, m.peak_reserved) == ("cuda:0", GiB + 64 * MiB, 2 * GiB)
    text = render_text(d, width=120)
    assert "Memory cuda:0 — peak 1.06 GiB allocated (1.3% of capacity), 2.00 GiB reserved" in text
    assert cells(section(text, "Live at the peak by category", "Live at the peak by call"))[0] == [
        "before the trace (parameters, state)",
        "1.00 GiB",
        "94.1%",
    ]
    assert "**peak 1.06 GiB allocated" in render_markdown(d)
    figure = figures_of(render_html(d))["plot-memory"]
    allocated = next(t for t in figure["data"] if t["name"] == "allocated")
    assert allocated["y"] == [p.allocated for p in m.timeline]
    assert max(allocated["y"]) == GiB + 64 * MiB
