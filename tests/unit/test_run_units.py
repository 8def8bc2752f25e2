"""The parts of `wallfinder run` and the capture hook that need no torch: the command line it
runs, the schedule, which processes it measures, and the lines that say what happened."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from wallfinder import WallfinderError
from wallfinder.capture import _hook, require_torch
from wallfinder.capture.run import (
    ProcessStatus,
    RunSettings,
    _launcher,
    _notes,
    prepare_trace_dir,
    program_command,
)
from wallfinder.cli import main


def test_scripts_and_modules_run_on_this_python_and_other_commands_as_given() -> None:
    assert program_command(["--", "train.py", "--lr", "1"]) == [
        sys.executable,
        "train.py",
        "--lr",
        "1",
    ]
    assert program_command(["--epochs", "1"], "pkg.train") == [
        sys.executable,
        "-m",
        "pkg.train",
        "--epochs",
        "1",
    ]
    assert program_command(["python3", "x.py"]) == ["python3", "x.py"]
    with pytest.raises(WallfinderError, match="give the program to run"):
        program_command(["--"])


def test_torchrun_and_its_module_forms_are_launchers() -> None:
    assert _launcher(["/venv/bin/torchrun", "--nproc_per_node", "2", "t.py"])
    assert _launcher(["python", "-m", "torch.distributed.run", "t.py"])
    assert _launcher(["python", "-m", "torch.distributed.launch", "t.py"])
    assert not _launcher(["python", "t.py"])
    assert not _launcher(["python", "-m", "torchvision_train"])


@pytest.mark.parametrize(
    ("warmup", "expected"),
    [(1, (0, 0)), (2, (0, 1)), (3, (1, 1)), (5, (3, 1))],
)
def test_the_profiler_started_after_step_one_skips_the_rest_of_the_warmup(
    warmup: int, expected: tuple[int, int]
) -> None:
    wait, own = _hook.schedule_after_first_step(warmup)
    assert (wait, own) == expected
    # Step 1 is over when the profiler starts: the kept steps begin right after the warm-up.
    assert 1 + wait + own == warmup


def test_only_the_first_optimizer_marks_steps() -> None:
    first = _hook.FirstOptimizer()
    generator, discriminator = object(), object()
    assert [first(generator), first(discriminator), first(generator)] == [True, False, True]


def test_only_the_program_and_torchruns_workers_are_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(_hook.CONFIG_ENV, raising=False)
    monkeypatch.delenv(_hook.ACTIVE_ENV, raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert _hook._settings() is None  # not under wallfinder run
    monkeypatch.setenv(_hook.CONFIG_ENV, '{"ranked": false, "steps": 1}')
    assert _hook._settings() == {"ranked": False, "steps": 1}
    monkeypatch.setenv(_hook.ACTIVE_ENV, "123")  # a child of the measured process
    assert _hook._settings() is None
    monkeypatch.delenv(_hook.ACTIVE_ENV)
    monkeypatch.setenv(_hook.CONFIG_ENV, '{"ranked": true}')
    assert _hook._settings() is None  # the torchrun launcher itself
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert _hook._settings() == {"ranked": True}  # one of its workers


def test_a_trace_dir_that_holds_traces_is_refused(tmp_path: Path) -> None:
    (tmp_path / "trace_rank0.json").write_text("{}")
    with pytest.raises(WallfinderError, match="already holds traces"):
        prepare_trace_dir(tmp_path)
    fresh = prepare_trace_dir(tmp_path / "new" / "dir")
    assert fresh.is_dir()


def test_the_default_trace_dir_is_new_for_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    a, b = prepare_trace_dir(None), prepare_trace_dir(None)
    assert a != b
    assert a.parent == b.parent == Path("wallfinder-traces")


def status(rank: int = 0, steps: int = 10, **kw: object) -> ProcessStatus:
    base: dict[str, object] = {
        "trace": "trace_rank0.json",
        "durations": [],
        "stopped": False,
        "error": None,
        "signal": None,
        "trace_error": None,
    }
    return ProcessStatus(rank=rank, steps=steps, **{**base, **kw})  # type: ignore[arg-type]


def test_notes_say_what_happened_once_for_all_ranks_that_share_it() -> None:
    settings = RunSettings(steps=5, warmup=3)
    traces = [Path("trace_rank0.json")]
    cmd = ["torchrun"]
    assert _notes(cmd, 0, [status()], settings, traces) == []
    notes = _notes(
        cmd,
        1,
        [status(0, 6, error="ValueError: bad"), status(1, 6, error="ValueError: bad")],
        settings,
        traces,
    )
    assert notes == [
        "torchrun exited with code 1",
        "ranks 0, 1: the program raised ValueError: bad after 6 steps",
        "ranks 0, 1: ran 6 steps, fewer than the 3 warm-up + 5 profiled asked: analysing "
        "the 3 profiled",
    ]
    assert _notes(["python"], 137, [], settings, []) == [
        "python was killed by SIGKILL",
        "nothing was measured: the program ended before it imported torch, or was killed",
    ]
    assert _notes(["python"], 0, [], settings, []) == [
        "the program never imported torch: nothing was measured"
    ]


def test_run_settings_need_at_least_one_step_of_each() -> None:
    with pytest.raises(WallfinderError, match="at least 1"):
        RunSettings(steps=0)
    with pytest.raises(WallfinderError, match="at least 1"):
        RunSettings(warmup=0)


def test_without_torch_the_capture_commands_say_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch" else real(name, *a),
    )
    with pytest.raises(WallfinderError, match=r"pip install 'wallfinder\[torch\]'"):
        require_torch("wallfinder.profile")
    assert main(["run", "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "wallfinder run needs PyTorch" in err
