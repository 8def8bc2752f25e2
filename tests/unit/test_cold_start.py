"""What a command imports: `--help` and `analyze --format json` import only what they need
(not the HTML report, jinja2, rich, sqlite3 or calibration). Checked on `sys.modules` in a
fresh interpreter: behaviour, not timing (the times are `benchmarks/bench_cold_start.py`'s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import wallfinder
from tracegen import training_trace

HEAVY = (
    "jinja2",
    "rich",
    "sqlite3",
    "plotly",
    "wallfinder.report.html",
    "wallfinder.capture",
    # Read by `--counters` and `wallfinder counters` only.
    "wallfinder.trace._ncu",
    "csv",
    # Read by `wallfinder memory` only (a trace's memory events replay without it).
    "wallfinder.trace.snapshot",
)

_PROBE = """
import json, sys
from wallfinder.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
loaded = sorted({m for m in sys.modules if m.split(".")[0] != "wallfinder"} |
                {m for m in sys.modules if m.startswith("wallfinder.")})
print(json.dumps({"code": code, "modules": loaded}), file=sys.stderr)
"""


def imported_by(args: list[str]) -> tuple[int, set[str]]:
    """Run the CLI with `args` in a fresh interpreter: its exit code and the modules loaded."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, check=False
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return int(report["code"] or 0), set(report["modules"])


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_help_imports_no_command() -> None:
    code, modules = imported_by(["--help"])
    assert code == 0
    assert heavy(modules) == []
    assert not any(m.startswith("wallfinder.cli.commands.") for m in modules)
    assert "numpy" not in modules


def test_a_commands_help_imports_that_command_alone() -> None:
    code, modules = imported_by(["roofline", "--help"])
    assert code == 0
    commands = {m for m in modules if m.startswith("wallfinder.cli.commands.")}
    assert commands == {"wallfinder.cli.commands.roofline", "wallfinder.cli.commands.analyze"}
    assert heavy(modules) == []


def test_analyze_to_json_imports_no_report_or_history(tmp_path: Path) -> None:
    trace = training_trace(3).write(tmp_path / "trace.json")
    out = tmp_path / "out.json"
    code, modules = imported_by(["analyze", str(trace), "--format", "json", "-o", str(out)])
    assert code == 0
    assert json.loads(out.read_text())["verdict"]["wall"]
    assert heavy(modules) == []


@pytest.mark.parametrize("fmt", ["html", "text"])
def test_the_renderer_asked_for_is_still_imported(tmp_path: Path, fmt: str) -> None:
    trace = training_trace(3).write(tmp_path / "trace.json")
    out = tmp_path / f"out.{fmt}"
    code, modules = imported_by(["analyze", str(trace), "--format", fmt, "-o", str(out)])
    assert code == 0
    assert out.stat().st_size > 0
    assert ("jinja2" if fmt == "html" else "rich") in modules


def test_the_package_names_resolve_on_first_use() -> None:
    code = (
        "import sys, wallfinder; before = 'wallfinder.api' in sys.modules; "
        "f = wallfinder.analyze; print(before, 'wallfinder.api' in sys.modules, "
        "f is wallfinder.api.analyze, sorted(dir(wallfinder)) == sorted(wallfinder.__all__))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = wallfinder.nope  # type: ignore[attr-defined]


_GC_PROBE = """
import atexit, gc, sys
atexit.register(lambda: print(gc.isenabled(), gc.get_freeze_count() > 0, file=sys.stderr))
from wallfinder.cli import entry_point
entry_point()
"""


def test_the_program_freezes_its_imports_and_keeps_collecting() -> None:
    # The program (not `main`, which tests and callers run in their own processes) imports
    # the command with the collector paused, freezes what the import made, and collects again.
    done = subprocess.run(
        [sys.executable, "-c", _GC_PROBE, "roofline", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert done.stderr.strip().splitlines()[-1] == "True True"
    done = subprocess.run(
        [sys.executable, "-c", _GC_PROBE, "--help"], capture_output=True, text=True, check=False
    )
    assert done.stderr.strip().splitlines()[-1] == "True False"  # no command: nothing frozen


def test_the_library_imports_no_export_tooling() -> None:
    # `import wallfinder.api` (a notebook's start) needs neither the Nsight Compute reader nor
    # shutil (which imports bz2 and lzma): only exporting a profiler report runs a tool.
    code = (
        "import sys, wallfinder.api; "
        "print(sorted(m for m in ('csv', 'shutil', 'wallfinder.trace._ncu') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
