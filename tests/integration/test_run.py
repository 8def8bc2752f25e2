"""`wallfinder run` on real, unmodified programs (real torch on the CPU, in subprocesses):
what the user gets when the program works, raises, runs out of memory, exits early, never steps
an optimizer, runs too few steps, is stopped after the measured steps, or is killed."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from wallfinder.capture.run import RunSettings, run_program
from wallfinder.cli import main
from wallfinder.diagnosis import Diagnosis

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROGRAM = """\
import os, signal, sys, torch
steps, fault = int(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 8)
for i in range(1, steps + 1):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    if fault != "no-optimizer":
        opt.step()
    if i == 6 and fault == "raise":
        raise RuntimeError("loss is nan at step 6")
    if i == 6 and fault == "exit":
        sys.exit(3)
    if i == 6 and fault in ("SIGTERM", "SIGKILL"):
        os.kill(os.getpid(), getattr(signal, fault))
    if i == 6 and fault == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 ...")
print("finished", steps, "steps")
"""


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(PROGRAM)
    return path


def run_cli(
    tmp_path: Path, program: Path, *args: str, flags: tuple[str, ...] = ()
) -> tuple[int, dict[str, Any] | None]:
    report = tmp_path / "report.json"
    code = main(
        [
            "run",
            "--steps",
            "4",
            "--warmup",
            "3",
            "--trace-dir",
            str(tmp_path / "traces"),
            "--format",
            "json",
            "-o",
            str(report),
            *flags,
            "--",
            sys.executable,
            str(program),
            *args,
        ]
    )
    return code, (json.loads(report.read_text()) if report.exists() else None)


def test_an_unmodified_script_is_profiled_and_diagnosed(
    tmp_path: Path, program: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, d = run_cli(tmp_path, program, "10")
    assert code == 0
    assert d is not None
    assert d["steps"]["total"] == 4
    assert d["device"]["kind"] == "cpu"
    assert (tmp_path / "traces" / "trace_rank0.json").exists()
    out = capfd.readouterr()
    assert "finished 10 steps" in out.out  # the program ran to its end
    assert "traces kept in" in out.err


def test_modules_are_recorded_by_default_in_one_untimed_step_after_the_timed_ones(
    tmp_path: Path, program: Path
) -> None:
    # Before: off by default, and with --modules their hooks ran in every timed step.
    code, d = run_cli(tmp_path / "on", program, "10")
    assert code == 0
    assert d is not None
    assert d["modules"]["source"] == "modules"
    paths = {row["path"] for row in d["modules"]["rows"]}
    assert "Sequential_0" in paths
    assert d["steps"]["total"] == 4  # the module step is not a timed step
    trace = json.loads((tmp_path / "on" / "traces" / "trace_rank0.json").read_text())
    module_step = trace["wallfinder_module_step"]
    events = trace["traceEvents"]
    steps = {e["name"]: e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    ranges = [e for e in events if str(e.get("name", "")).startswith("nn.Module: ")]
    assert ranges
    step = steps[module_step]
    assert all(step["ts"] <= r["ts"] <= step["ts"] + step["dur"] for r in ranges)
    code, d = run_cli(tmp_path / "off", program, "10", flags=("--no-modules",))
    assert code == 0
    assert d is not None
    assert d["modules"] is None or d["modules"]["source"] != "modules"
    off = tmp_path / "off" / "traces" / "trace_rank0.json"
    assert "nn.Module: " not in off.read_text()


def test_a_script_that_raises_passes_its_exit_code_and_the_completed_steps_are_analysed(
    tmp_path: Path, program: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, d = run_cli(tmp_path, program, "10", "raise")
    assert code == 1
    err = capfd.readouterr().err
    assert "RuntimeError: loss is nan at step 6" in err  # the program's own traceback
    assert "the program raised RuntimeError: loss is nan at step 6 after 6 steps" in err
    assert "analysing the 3 profiled" in err
    assert d is not None
    # Steps 4-6 completed; the step the exception cut short is left out, and said so.
    assert d["steps"]["total"] == 3
    assert any("stopped during it" in w for w in d["warnings"])


def test_an_early_exit_code_is_passed_through(
    tmp_path: Path, program: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, d = run_cli(tmp_path, program, "10", "exit")
    assert code == 3
    assert "exited with code 3" in capfd.readouterr().err
    assert d is not None
    assert d["steps"]["total"] == 3


def test_a_program_without_an_optimizer_is_told_how_to_mark_steps(
    tmp_path: Path, program: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, d = run_cli(tmp_path, program, "10", "no-optimizer")
    assert code == 2
    assert d is None
    err = capfd.readouterr().err
    assert "never ran an optimizer step" in err
    assert "p.step()" in err


def test_too_few_steps_for_the_warmup_says_so(
    tmp_path: Path, program: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, d = run_cli(tmp_path, program, "2")
    assert code == 2
    assert d is None
    assert "ran 2 steps, fewer than the 3 warm-up + 4 profiled asked" in capfd.readouterr().err


def test_stop_after_ends_the_program_after_the_measured_steps(
    tmp_path: Path, program: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, d = run_cli(tmp_path, program, "100000", flags=("--stop-after",))
    assert code == 0
    out = capfd.readouterr()
    assert "finished" not in out.out
    assert "stopped the program after the 4 measured steps" in out.err
    assert d is not None
    assert d["steps"]["total"] == 4


def test_sigterm_writes_the_steps_recorded_so_far(
    tmp_path: Path, program: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, d = run_cli(tmp_path, program, "10", "SIGTERM")
    assert code == 128 + 15
    assert "stopped by SIGTERM after 6 steps" in capfd.readouterr().err
    assert d is not None
    assert d["steps"]["total"] == 3


def test_a_killed_program_is_reported_with_its_signal(
    tmp_path: Path, program: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, d = run_cli(tmp_path, program, "10", "SIGKILL")
    assert code == 128 + 9
    assert d is None
    err = capfd.readouterr().err
    assert "killed by SIGKILL" in err
    assert "no trace was written" in err


def test_memory_runs_give_the_peak_and_its_call_sites_in_source_lines(
    tmp_path: Path, program: Path
) -> None:
    code, d = run_cli(tmp_path, program, "10", flags=("--memory",))
    assert code == 0
    assert d is not None
    assert d["memory"] is not None
    [cpu] = d["memory"]["devices"]
    assert cpu["device"] == "cpu"
    assert cpu["peak_allocated"] > 0
    # --memory records Python stacks: call sites are the program's lines, not ops.
    assert any("train.py(" in s["site"] for s in cpu["sites"])


def test_a_program_that_runs_out_of_memory_is_told_so_with_its_steps_analysed(
    tmp_path: Path, program: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    code, d = run_cli(tmp_path, program, "10", "oom", flags=("--memory",))
    assert code == 1
    err = capfd.readouterr().err
    assert "torch.OutOfMemoryError: CUDA out of memory." in err  # the program's own traceback
    assert (
        "wallfinder: the program ran out of memory after 6 steps: CUDA out of memory. Tried to "
        "allocate 2.00 GiB. GPU 0 ...\n" in err
    )
    assert "the program raised" not in err
    assert "memory snapshot" not in err  # on the CPU, no CUDA allocator to snapshot
    assert d is not None
    assert d["steps"]["total"] == 3  # steps 4-6; the step it ran out in is left out
    assert d["memory"] is not None
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["trace_rank0.json"]


FAKE_CUDA = """\
import pickle, torch
# CUDA "in use" here: the snapshot torch would dump when the allocator ran out.
torch.cuda.is_initialized = lambda: True
FRAMES = [{"filename": "project/train.py", "line": 40, "name": "train_step"}]
def dump(path):
    trace = [
        {"action": "alloc", "addr": 4096, "size": 6 << 30, "frames": FRAMES, "time_us": 10},
        {"action": "oom", "addr": 1 << 30, "size": 8 << 30, "frames": [], "time_us": 20},
    ]
    block = {"size": 6 << 30, "address": 4096, "state": "active_allocated", "frames": FRAMES}
    segment = {"device": 0, "address": 4096, "total_size": 6 << 30, "blocks": [block]}
    with open(path, "wb") as f:
        pickle.dump({"segments": [segment], "device_traces": [trace]}, f)
torch.cuda.memory._dump_snapshot = dump
exec(open(__file__.replace("fake_cuda.py", "train.py")).read())
"""


def test_on_cuda_running_out_of_memory_keeps_the_snapshot_and_explains_it(
    tmp_path: Path,
    program: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "fake_cuda.py").write_text(FAKE_CUDA)
    monkeypatch.setenv("COLUMNS", "120")
    traces = tmp_path / "traces"
    argv = ["run", "--memory", "--steps", "2", "--warmup", "2", "--trace-dir", str(traces)]
    code = main([*argv, "--", sys.executable, str(tmp_path / "fake_cuda.py"), "10", "oom"])
    assert code == 1
    out, err = capfd.readouterr()
    snapshot = traces / "memory_snapshot_rank0.pickle"
    assert f"memory snapshot kept in {snapshot}" in err
    assert "the program ran out of memory after 6 steps" in err
    # The diagnosis of the recorded steps, then what `wallfinder memory` says of the snapshot.
    assert out.index("wallfinder · trace_rank0.json") < out.index("wallfinder memory: ")
    assert "OOM on device 0 at event 1: requested 8.00 GiB" in out
    assert "project/train.py:40 (train_step)" in out


def test_timer_only_times_the_steps_without_a_profiler(tmp_path: Path, program: Path) -> None:
    began = time.perf_counter()
    code, d = run_cli(tmp_path, program, "12", flags=("--timer-only",))
    elapsed = time.perf_counter() - began
    assert code == 0
    assert d is not None
    assert d["source"] == "step timer"
    assert d["total"] == 4
    # Whatever this machine's speed: the timed steps are real and fit inside the whole run.
    assert 0 < d["min_s"] <= d["median_s"] <= d["max_s"]
    assert d["median_s"] * d["count"] < elapsed
    assert not (tmp_path / "traces" / "trace_rank0.json").exists()


def test_module_form_and_the_programs_own_sitecustomize_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mytrain.py").write_text(PROGRAM)
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "sitecustomize-ran"
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(site))
    outcome = run_program(
        [sys.executable, "-m", "mytrain", "8"], RunSettings(steps=3, warmup=2), tmp_path / "t"
    )
    assert outcome.exit_code == 0
    assert [p.name for p in outcome.traces] == ["trace_rank0.json"]
    assert [(p.rank, p.steps) for p in outcome.processes] == [(0, 8)]
    assert marker.exists()


GLOO_SAFE_EXIT = (
    "import atexit, os\n"
    "atexit._run_exitfuncs()  # what a normal exit runs (wallfinder's hook writes its status)\n"
    "os._exit(0)\n"
)
"""How the test programs end. torch 2.13's gloo can abort a process in its C++ teardown after
the program is done ("terminate called without an active exception", exit -6): about 1 plain
`torchrun` run in 4 without a barrier before `destroy_process_group`, and still now and then
with one on a busy machine. The programs run the exit handlers, then skip that teardown."""


needs_torchrun = pytest.mark.skipif(
    shutil.which("torchrun") is None
    and not os.access(Path(sys.executable).with_name("torchrun"), os.X_OK),
    reason="torchrun is not installed",
)


@needs_torchrun
def test_torchrun_measures_each_worker_not_the_launcher(tmp_path: Path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for _ in range(7):\n"
        "    opt.zero_grad(); model(torch.randn(8, 32)).sum().backward(); opt.step()\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n" + GLOO_SAFE_EXIT
    )
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    outcome = run_program(
        [torchrun, "--nproc_per_node", "2", str(script)],
        RunSettings(steps=3, warmup=2),
        tmp_path / "t",
    )
    assert outcome.exit_code == 0
    assert [p.name for p in outcome.traces] == ["trace_rank0.json", "trace_rank1.json"]
    assert sorted(p.rank for p in outcome.processes) == [0, 1]


SLOW_RANK_SLEEP_S = 0.2
"""How long the slow rank's host stalls before each step: far longer than a step of this job
(a few ms), so that no load on the machine can make the other rank the late one."""

DDP_SLOW_RANK = (
    """\
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(6):
    if dist.get_rank() == int(os.environ["SLOW_RANK"]):
        time.sleep(float(os.environ["SLOW_RANK_SLEEP_S"]))  # the other waits in the all-reduce
    opt.zero_grad(); model(torch.randn(8, 32)).sum().backward(); opt.step()
dist.barrier()
dist.destroy_process_group()
"""
    + GLOO_SAFE_EXIT
)


def torchrun_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow_rank: int) -> Diagnosis:
    """Two gloo ranks on the CPU, profiled by `wallfinder run`; `slow_rank` stalls
    SLOW_RANK_SLEEP_S before each step."""
    from wallfinder.api import analyze

    script = tmp_path / "ddp.py"
    script.write_text(DDP_SLOW_RANK)
    monkeypatch.setenv("SLOW_RANK", str(slow_rank))
    monkeypatch.setenv("SLOW_RANK_SLEEP_S", str(SLOW_RANK_SLEEP_S))
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    outcome = run_program(
        [torchrun, "--nproc_per_node", "2", str(script)],
        RunSettings(steps=3, warmup=2),
        tmp_path / "t",
    )
    assert outcome.exit_code == 0
    return analyze(outcome.trace_dir, workers=1)


@needs_torchrun
@pytest.mark.parametrize("slow", [0, 1])
def test_torchrun_job_with_a_slow_rank_names_it_the_straggler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: int
) -> None:
    d = torchrun_job(tmp_path, monkeypatch, slow)
    job = d.job
    assert job is not None
    assert job.matched >= 3
    assert [s.rank for s in job.stragglers] == [slow]
    assert job.stragglers[0].late_share >= 0.6
    assert d.findings[0].id == "straggler"
    # The stall lands on the rank that waits for it, not on the one that causes it. (How long
    # each waits, and the clocks' skew, are measured figures: benchmarks/bench_real_runs.py.)
    by_rank = {r.rank: r for r in d.ranks}
    late, waiting = by_rank[slow], by_rank[1 - slow]
    assert waiting.wait_s is not None
    assert late.wait_s is not None
    assert waiting.wait_s > late.wait_s
