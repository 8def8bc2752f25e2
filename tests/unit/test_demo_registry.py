"""The demo's registry of workloads and the parts of `wallfinder demo` that need no torch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tracegen import TraceBuilder
from wallfinder import analyze
from wallfinder.analysis.critpath import parse_what_if
from wallfinder.capture.workloads import DEFAULT, DEVICES, WORKLOADS, Expectation, get
from wallfinder.cli import main

NAMES = ["dataloader", "tiny-ops", "sync", "pointwise", "matmul", "precision"]
WALLS = {"compute", "bandwidth", "overhead"}


def test_the_registry_has_one_workload_per_wall_and_cause() -> None:
    assert list(WORKLOADS) == NAMES
    assert DEFAULT == "dataloader"
    assert DEVICES == ("cpu", "cuda")


@pytest.mark.parametrize("name", NAMES)
def test_each_workload_says_its_wall_its_fix_and_what_it_expects_on_each_device(
    name: str,
) -> None:
    w = get(name)
    assert w.name == name
    assert w.wall.split(":")[0].split(",")[0] in WALLS
    assert w.fix
    assert w.notes
    assert set(w.expect) == set(DEVICES)
    for device in DEVICES:
        for fixed in (False, True):
            assert w.expected(device, fixed).wall in WALLS


def test_a_gpu_name_with_an_index_gets_the_gpu_expectation() -> None:
    w = get("sync")
    assert w.expected("cuda:1", False) == w.expect["cuda"][0]
    assert w.expected("cpu", True) == w.expect["cpu"][1]


def test_each_as_written_workload_expects_its_headline_wall_on_a_gpu() -> None:
    for w in WORKLOADS.values():
        assert w.wall.startswith(w.expect["cuda"][0].wall), w.name


def cpu_loader_bound() -> TraceBuilder:
    b = TraceBuilder(device_name=None)
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.dataloader(t0, 700.0)
        b.cpu_op("aten::mm", t0 + 700.0, 300.0)
    return b


def test_an_expectation_lists_what_differs(tmp_path: Path) -> None:
    d = analyze(cpu_loader_bound().write(tmp_path / "t.json"))
    assert Expectation("overhead", "data_loading", "data-loading").differences(d) == []
    assert Expectation("overhead").differences(d) == []
    assert Expectation("compute", "at peak", "fp32-matmul").differences(d) == [
        "wall overhead (expected compute)",
        "cause data_loading (expected at peak)",
        "top finding data-loading (expected fp32-matmul)",
    ]
    assert Expectation("overhead", "data_loading").describe() == "overhead, cause data_loading"


def test_demo_list_names_every_workload_and_its_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--list"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        assert f"  {name} " in out
    assert out.count("fix: ") == len(NAMES)


def test_an_unknown_workload_is_one_line_and_exit_code_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--workload", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no demo workload 'nope'" in err
    assert "dataloader, tiny-ops" in err


def test_without_torch_the_demo_says_how_to_install_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    find_spec = importlib.util.find_spec

    def no_torch(name: str, *args: object) -> object:
        return None if name == "torch" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_torch)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "pip install 'wallfinder[torch]'" in err
    # --list needs no torch.
    assert main(["demo", "--list"]) == 0


@pytest.mark.parametrize("flag", [["--steps", "0"], ["--device", "tpu"], ["--compare", "--fixed"]])
def test_bad_demo_flags_are_usage_errors(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *flag]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_importing_the_demo_does_not_import_torch() -> None:
    code = (
        "import sys, wallfinder.capture.workloads, wallfinder.cli.commands.demo; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_wall_the_cpu_cannot_have_is_named_with_the_reason() -> None:
    unshown = {name for name, w in WORKLOADS.items() if w.cannot_show("cpu")}
    assert unshown == {"sync", "precision"}
    assert "synchronously" in get("sync").cannot_show("cpu")
    assert "TF32" in get("precision").cannot_show("cpu")
    assert all(not w.cannot_show("cuda:0") for w in WORKLOADS.values())


@pytest.mark.parametrize("name", NAMES)
def test_each_what_if_that_stands_for_a_fix_is_one_the_replay_takes(name: str) -> None:
    w = get(name)
    assert set(w.what_if) <= set(DEVICES)
    for device in DEVICES:
        text = w.what_if_for(device)
        if text is not None:
            assert len(parse_what_if(text)) == 1  # one change, its row in the table
