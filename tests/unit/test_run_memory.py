"""`wallfinder run --memory` without a GPU: which errors are out-of-memory deaths, what the
hook writes in its status file, the CUDA memory history and the snapshot dumped when the
program runs out (torch.cuda's functions replaced here), and what `wallfinder run` says."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from tracegen import training_trace
from wallfinder.capture import _hook
from wallfinder.capture.run import ProcessStatus, RunOutcome, RunSettings, _notes
from wallfinder.cli import main

torch = pytest.importorskip("torch")

CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB "
    "of which 1.19 GiB is free.\nSee documentation for Memory Management"
)
CPU_OOM = (
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you "
    "tried to allocate 1073741824 bytes."
)


def caused_by(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


def in_handling_of(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__context__ = inner
    return outer


@pytest.mark.parametrize(
    ("error", "oom"),
    [
        (torch.OutOfMemoryError(CUDA_OOM), True),
        (torch.cuda.OutOfMemoryError("HIP out of memory. Tried to allocate 20 MiB"), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError(CPU_OOM), True),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"), True),
        (MemoryError(), True),
        (caused_by(RuntimeError("backend='inductor' raised"), torch.OutOfMemoryError("x")), True),
        (RuntimeError("loss is nan at step 6"), False),
        (ValueError("batch is out of memory budget"), False),  # not an allocator's error
        (KeyboardInterrupt(), False),
        (in_handling_of(ValueError("cleanup failed"), torch.OutOfMemoryError("x")), False),
    ],
)
def test_out_of_memory_is_an_allocators_error_or_raised_from_one(
    error: BaseException, oom: bool
) -> None:
    assert (_hook.out_of_memory(error) is not None) == oom


def test_the_host_running_out_is_told_from_a_device() -> None:
    assert _hook.host_out_of_memory(RuntimeError(CPU_OOM))
    assert _hook.host_out_of_memory(MemoryError())
    assert not _hook.host_out_of_memory(torch.OutOfMemoryError(CUDA_OOM))


@pytest.fixture(autouse=True)
def no_earlier_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """No error left in `sys.last_exc`/`last_value` (pytest keeps a failed test's there), which
    `Session.finish` reads as the one that ended the program."""
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        monkeypatch.delattr(sys, name, raising=False)


def session(tmp_path: Path, *, memory: bool = True) -> _hook.Session:
    return _hook.Session(
        {
            "trace_dir": str(tmp_path / "traces"),
            "status_dir": str(tmp_path),
            "warmup": 3,
            "steps": 4,
            "memory": memory,
        }
    )


def finished(s: _hook.Session, tmp_path: Path) -> dict[str, Any]:
    s.finish()
    [path] = tmp_path.glob(f"{_hook.STATUS_PREFIX}*.json")
    status: dict[str, Any] = json.loads(path.read_text())
    return status


def raise_in(s: _hook.Session, error: BaseException) -> None:
    try:
        raise error
    except BaseException as exc:  # what the excepthook is given
        s.on_exception(type(exc), exc, exc.__traceback__)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """CUDA in use, with a `_dump_snapshot` that writes a small pickle; the paths it wrote."""
    dumped: list[str] = []

    def dump(path: str) -> None:
        Path(path).write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
        dumped.append(path)

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)
    return dumped


def test_without_cuda_an_oom_is_recorded_and_no_snapshot_is_tried(tmp_path: Path) -> None:
    s = session(tmp_path)
    raise_in(s, torch.OutOfMemoryError(CUDA_OOM))
    status = finished(s, tmp_path)
    assert status["error"] == "OutOfMemoryError: " + CUDA_OOM.splitlines()[0]
    assert status["oom"] is True
    assert status["oom_message"] == CUDA_OOM.splitlines()[0]
    assert status["snapshot"] is None
    assert status["snapshot_error"] is None
    assert status["memory_history"] is False
    assert not (tmp_path / "traces").exists()


def test_another_error_is_not_an_oom(tmp_path: Path, cuda: list[str]) -> None:
    s = session(tmp_path)
    raise_in(s, RuntimeError("loss is nan"))
    status = finished(s, tmp_path)
    assert (status["oom"], status["oom_message"], status["snapshot"]) == (False, None, None)
    assert cuda == []


def test_on_cuda_an_oom_dumps_the_snapshot_into_the_trace_folder(
    tmp_path: Path, cuda: list[str]
) -> None:
    s = session(tmp_path)
    raise_in(s, torch.OutOfMemoryError(CUDA_OOM))
    status = finished(s, tmp_path)
    assert status["snapshot"] == "memory_snapshot_rank0.pickle"
    assert cuda == [str(tmp_path / "traces" / "memory_snapshot_rank0.pickle")]
    assert (tmp_path / "traces" / status["snapshot"]).is_file()
    assert status["snapshot_error"] is None


@pytest.mark.parametrize(
    ("memory", "error"),
    [(False, torch.OutOfMemoryError(CUDA_OOM)), (True, RuntimeError(CPU_OOM))],
)
def test_no_snapshot_without_memory_or_when_the_host_ran_out(
    tmp_path: Path, cuda: list[str], memory: bool, error: BaseException
) -> None:
    s = session(tmp_path, memory=memory)
    raise_in(s, error)
    status = finished(s, tmp_path)
    assert status["oom"] is True
    assert status["snapshot"] is None
    assert cuda == []


def test_a_failed_dump_is_recorded_not_raised_and_leaves_no_half_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def dump(path: str) -> None:
        Path(path).write_bytes(b"\x80\x04half")
        raise RuntimeError("No space left on device")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)
    s = session(tmp_path)
    raise_in(s, torch.OutOfMemoryError(CUDA_OOM))
    status = finished(s, tmp_path)
    assert status["error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert status["snapshot"] is None
    assert status["snapshot_error"] == "RuntimeError: No space left on device"
    assert list((tmp_path / "traces").iterdir()) == []


def test_the_memory_history_starts_with_cuda_and_stops_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued: list[Any] = []
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(torch.cuda, "_lazy_call", queued.append)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: calls.append(kw))
    s = session(tmp_path)
    s.record_memory_history()
    assert calls == []  # nothing until the program starts CUDA
    [start] = queued
    start()  # torch's CUDA initialisation runs it
    assert calls == [
        {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 100_000}
    ]
    status = finished(s, tmp_path)
    assert calls[-1] == {"enabled": None}
    assert status["memory_history"] is True
    assert status["history_error"] is None


def test_a_history_that_cannot_start_is_recorded_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(**_: object) -> None:
        raise TypeError("_record_memory_history() got an unexpected keyword argument 'context'")

    monkeypatch.setattr(torch.cuda, "_lazy_call", lambda start: start())
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", refuse)
    s = session(tmp_path)
    s.record_memory_history()
    status = finished(s, tmp_path)
    assert status["memory_history"] is False
    assert status["history_error"].startswith("TypeError: _record_memory_history()")


def test_an_oom_the_excepthook_never_saw_is_found_at_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The program replaced sys.excepthook (rich tracebacks do): Python still keeps the error.
    error = torch.OutOfMemoryError(CUDA_OOM)
    monkeypatch.setattr(sys, "last_value", error, raising=False)
    status = finished(session(tmp_path), tmp_path)
    assert status["oom"] is True
    assert status["error"].startswith("OutOfMemoryError: CUDA out of memory")


def oom_status(steps: int = 6, **raw: object) -> ProcessStatus:
    return ProcessStatus.of(
        {
            "rank": 0,
            "steps": steps,
            "trace": "trace_rank0.json",
            "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "oom": True,
            "oom_message": "CUDA out of memory. Tried to allocate 2.00 GiB",
            **raw,
        }
    )


def test_notes_say_the_program_ran_out_of_memory() -> None:
    memory = RunSettings(steps=4, warmup=3, memory=True)
    notes = _notes(["python"], 1, [oom_status(10)], memory, [Path("trace_rank0.json")])
    assert notes == [
        "python exited with code 1",
        "the program ran out of memory after 10 steps: CUDA out of memory. Tried to allocate "
        "2.00 GiB",
    ]
    plain = RunSettings(steps=4, warmup=3)
    notes = _notes(["python"], 1, [oom_status(10)], plain, [Path("trace_rank0.json")])
    assert "run it again with --memory" in notes[-1]
    failed = oom_status(
        10, snapshot_error="OSError: disk full", history_error="TypeError: old torch"
    )
    notes = _notes(["python"], 1, [failed], memory, [Path("trace_rank0.json")])
    assert notes[-2:] == [
        "could not record the CUDA memory history: TypeError: old torch",
        "could not write the memory snapshot: OSError: disk full",
    ]


def test_memory_turns_on_python_stacks_unless_told_otherwise() -> None:
    assert RunSettings(memory=True).python_stacks
    assert not RunSettings(memory=True, stacks=False).python_stacks
    assert RunSettings(stacks=True).python_stacks
    assert not RunSettings().python_stacks


FRAMES = [{"filename": "project/train.py", "line": 40, "name": "train_step"}]


def write_snapshot(path: Path) -> Path:
    """An allocator snapshot that ran out: 6 GiB live from train.py, then an 8 GiB request."""
    path.parent.mkdir(parents=True, exist_ok=True)
    trace = [
        {"action": "alloc", "addr": 4096, "size": 6 << 30, "frames": FRAMES, "time_us": 10},
        {"action": "oom", "addr": 1 << 30, "size": 8 << 30, "frames": [], "time_us": 20},
    ]
    block = {"size": 6 << 30, "address": 4096, "state": "active_allocated", "frames": FRAMES}
    segment = {
        "device": 0,
        "address": 4096,
        "total_size": 6 << 30,
        "allocated_size": 6 << 30,
        "blocks": [block],
    }
    path.write_bytes(pickle.dumps({"segments": [segment], "device_traces": [trace]}))
    return path


def fake_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, trace: bool) -> Path:
    """`wallfinder run` whose program ran out of CUDA memory after 6 steps (no program runs)."""
    trace_dir = tmp_path / "traces"
    snapshot = write_snapshot(trace_dir / "memory_snapshot_rank0.pickle")
    traces = [training_trace(4).write(trace_dir / "trace_rank0.json")] if trace else []
    outcome = RunOutcome(
        exit_code=1,
        trace_dir=trace_dir,
        traces=traces,
        processes=[oom_status(snapshot=snapshot.name)],
        notes=["the program ran out of memory after 6 steps: CUDA out of memory."],
        snapshots=[snapshot],
    )
    from wallfinder.cli.commands import run as command

    monkeypatch.setattr(command, "require_torch", lambda _: None)
    monkeypatch.setattr(command, "prepare_trace_dir", lambda _: trace_dir)
    monkeypatch.setattr(command, "run_program", lambda *_: outcome)
    monkeypatch.setenv("COLUMNS", "120")
    return snapshot


def test_run_explains_the_snapshot_after_the_diagnosis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = fake_run(monkeypatch, tmp_path, trace=True)
    assert main(["run", "--memory", "--", "python", "train.py"]) == 1
    out, err = capsys.readouterr()
    assert main(["memory", str(snapshot)]) == 0
    alone = capsys.readouterr().out
    # The report `wallfinder memory` prints, after the diagnosis.
    assert out.index("wallfinder · trace_rank0.json") < out.index(alone)
    assert "OOM on device 0" in alone
    assert "project/train.py:40 (train_step)" in alone
    assert "the program ran out of memory after 6 steps" in err
    assert f"memory snapshot kept in {snapshot}\n" in err


def test_run_explains_the_snapshot_when_no_step_was_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_run(monkeypatch, tmp_path, trace=False)
    assert main(["run", "--memory", "--", "python", "train.py"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("wallfinder memory: ")
    assert "OOM on device 0" in out
    assert "no trace was written" in err


def test_run_as_json_keeps_one_document_and_names_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = fake_run(monkeypatch, tmp_path, trace=True)
    assert main(["run", "--memory", "--format", "json", "--", "train.py"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["schema"] == "wallfinder.diagnosis/2"
    assert f"wallfinder memory {snapshot} explains it" in err


def test_a_snapshot_that_cannot_be_read_does_not_hide_the_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = fake_run(monkeypatch, tmp_path, trace=False)
    snapshot.write_bytes(b"not a pickle")
    assert main(["run", "--memory", "--", "train.py"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "cannot explain the memory snapshot" in err
