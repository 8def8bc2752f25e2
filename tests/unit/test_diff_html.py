"""`wallfinder diff --format html`: one self-contained page rendered from the DiagnosisDiff."""

from __future__ import annotations

import html
import json
from pathlib import Path

import msgspec
import pytest
from test_diff_and_check import gemm_bound, loader_bound
from test_report_html import PAGE_TAGS, Page
from test_report_html import (
    test_content_security_policy_allows_only_the_pages_own_scripts as check_csp,
)
from test_report_html import test_figure_data_cannot_close_its_script_block as check_figure_json
from test_report_html import test_html_report_fetches_nothing as check_fetches_nothing

from wallfinder import analyze
from wallfinder.analysis.diff import diff
from wallfinder.cli import main
from wallfinder.diagnosis import DiagnosisDiff, NameChange
from wallfinder.report import DIFF_FORMATS, render_diff

SCRIPT = "<script>alert(1)</script>"


@pytest.fixture
def before_path(tmp_path: Path) -> Path:
    return loader_bound().write(tmp_path / "before.json")


@pytest.fixture
def after_path(tmp_path: Path) -> Path:
    return gemm_bound().write(tmp_path / "after.json")


@pytest.fixture
def fixed(before_path: Path, after_path: Path) -> DiagnosisDiff:
    return diff(analyze(before_path), analyze(after_path))


@pytest.fixture
def page(fixed: DiagnosisDiff) -> str:
    return render_diff(fixed, "html")


def test_html_is_a_diff_format() -> None:
    assert "html" in DIFF_FORMATS


def test_page_shows_the_verdict_move_and_the_step_change(page: str, fixed: DiagnosisDiff) -> None:
    visible = " ".join(Page(page).visible.split())
    assert fixed.verdict.moved
    assert "the wall moved from overhead (data loading, DataLoader) to compute" in visible
    assert "OVERHEAD wall" in visible
    assert "COMPUTE wall" in visible
    s = fixed.steps
    assert f"{s.before_s * 1e3:.2f} → {s.after_s * 1e3:.2f}" in visible
    assert f"{s.speedup:.2f}x faster" in visible
    assert s.note in visible
    assert "before.json" in visible
    assert "after.json" in visible


def test_page_lists_findings_by_status_and_the_moved_names(
    page: str,
    fixed: DiagnosisDiff,
) -> None:
    p = Page(page)
    visible = p.visible
    assert [f.status for f in fixed.findings if f.id == "data-loading"] == ["resolved"]
    assert 'class="status status-resolved">resolved<' in page
    assert "data-loading" in visible
    assert fixed.moved
    first = fixed.moved[0]
    assert f'title="{html.escape(first.name)}"' in page
    assert f"{first.change_s * 1e3:+.2f}".replace("-", "−") in visible
    assert 'id="moved"' in page
    # Match counts and MFU.
    assert "matched by name" in visible
    assert "MFU" in visible


def test_page_draws_the_breakdown_before_and_after(page: str, fixed: DiagnosisDiff) -> None:
    block = page.split('<script type="application/json" id="wf-figures">', 1)[1]
    figure = json.loads(block.split("</script>", 1)[0])["plot-breakdown"]
    assert [t["name"] for t in figure["data"]] == ["before", "after"]
    assert figure["layout"]["barmode"] == "group"
    compute = next(p for p in fixed.breakdown if p.part == "compute")
    assert figure["data"][0]["x"][0] == pytest.approx(compute.before_s * 1e3)
    assert figure["data"][1]["x"][0] == pytest.approx(compute.after_s * 1e3)


def test_page_is_self_contained(page: str) -> None:
    assert "default-src 'none'" in html.unescape(page)
    check_fetches_nothing(page)
    check_csp(page)
    check_figure_json(page)


def test_notes_are_shown_first(fixed: DiagnosisDiff) -> None:
    noted = msgspec.structs.replace(fixed, notes=["different devices (A before, B after)"])
    page = render_diff(noted, "html")
    assert 'id="notes"' in page
    assert page.index('id="notes"') < page.index('id="step"')
    assert "different devices (A before, B after)" in Page(page).visible


def test_names_with_markup_are_inert(fixed: DiagnosisDiff) -> None:
    long_name = "void evil_kernel<" + SCRIPT + "x" * 200 + ">(float*)"
    moved = [
        NameChange(
            kind="kernel", name=long_name, shapes=None, before_s=1e-3, after_s=2e-3, change_s=1e-3
        ),
        NameChange(
            kind="op", name=SCRIPT, shapes=f"[[{SCRIPT}]]", before_s=1e-3, after_s=0, change_s=-1e-3
        ),
    ]
    x = msgspec.structs.replace(
        fixed, moved=moved, before_source=SCRIPT, notes=[SCRIPT], before_device=SCRIPT
    )
    page = render_diff(x, "html")
    assert "<script>alert" not in page
    p = Page(page)
    assert {tag for tag, _ in p.tags} <= PAGE_TAGS
    assert [a.get("type") for a, _ in p.scripts] == ["application/json", None, None]
    assert not [(t, k) for t, attrs in p.tags for k in attrs if k.startswith("on")]
    assert SCRIPT in p.visible
    # The kernel is shown short, its whole name in the tooltip.
    assert "evil_kernel" in p.visible
    titles = [a.get("title") for t, a in p.tags if t == "code" and a.get("title")]
    assert long_name in titles
    check_csp(page)


def test_cli_writes_the_html_diff(
    before_path: Path,
    after_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "diff.html"
    code = main(["diff", str(before_path), str(after_path), "--format", "html", "-o", str(out)])
    assert code == 0
    assert capsys.readouterr().err == ""
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    check_fetches_nothing(page)
