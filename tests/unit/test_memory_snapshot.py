"""`wallfinder memory`: allocator snapshots built here in torch's documented format, loaded
safely, analysed, and rendered by the CLI."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from wallfinder.analysis import SnapshotThresholds, Thresholds
from wallfinder.analysis.memory import call_site, category, memory_report
from wallfinder.api import Options, analyze_memory
from wallfinder.cli import main
from wallfinder.errors import WallfinderError
from wallfinder.trace.snapshot import SnapshotFrame, load_snapshot, parse_snapshot

GiB = 1024**3
MiB = 1024**2

TRAIN = {"filename": "project/train.py", "line": 40, "name": "train_step"}
MODEL = {"filename": "project/model.py", "line": 12, "name": "forward"}
LOG = {"filename": "project/train.py", "line": 55, "name": "log_loss"}
LINEAR = {
    "filename": "/venv/site-packages/torch/nn/modules/linear.py",
    "line": 9,
    "name": "forward",
}
CALL = {
    "filename": "/venv/site-packages/torch/nn/modules/module.py",
    "line": 1,
    "name": "_call_impl",
}
APPLY = {"filename": "/venv/site-packages/torch/nn/modules/module.py", "line": 2, "name": "_apply"}
TO = {"filename": "/venv/site-packages/torch/nn/modules/module.py", "line": 3, "name": "to"}
ADAM = {"filename": "/venv/site-packages/torch/optim/adam.py", "line": 5, "name": "_init_group"}
BACKWARD = {
    "filename": "/venv/site-packages/torch/autograd/graph.py",
    "line": 7,
    "name": "_engine_run_backward",
}

ACTIVATION = [LINEAR, CALL, MODEL, CALL, TRAIN]
PARAMETER = [APPLY, TO, TRAIN]
OPTIMIZER = [ADAM, TRAIN]
GRADIENT = [BACKWARD, TRAIN]


class Builder:
    """A snapshot in the format of torch.cuda.memory._snapshot(): segments of blocks, and a
    recorded history per device."""

    def __init__(self) -> None:
        self.segments: list[dict[str, Any]] = []
        self.trace: list[dict[str, Any]] = []
        self.addr = 0x7F0000000000
        self.time = 0

    def segment(self, blocks: list[tuple[int, str, list[dict[str, Any]]]], device: int = 0) -> None:
        base = self.addr
        out = []
        for size, state, frames in blocks:
            out.append(
                {
                    "size": size,
                    "requested_size": size,
                    "address": self.addr,
                    "state": state,
                    "frames": frames,
                }
            )
            self.addr += size
        total = sum(b["size"] for b in out)
        allocated = sum(b["size"] for b in out if b["state"] != "inactive")
        self.segments.append(
            {
                "device": device,
                "address": base,
                "total_size": total,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": allocated,
                "stream": 0,
                "segment_type": "large",
                "blocks": out,
            }
        )

    def alloc(self, size: int, frames: list[dict[str, Any]]) -> int:
        self.addr += size
        self._event("alloc", self.addr, size, frames)
        return self.addr

    def free(self, addr: int, size: int) -> None:
        self._event("free_requested", addr, size, [])
        self._event("free_completed", addr, size, [])

    def oom(self, requested: int, device_free: int) -> None:
        self._event("oom", device_free, requested, [])

    def _event(self, action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        self.time += 10
        self.trace.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": 0,
                "frames": frames,
                "time_us": self.time,
            }
        )

    def snapshot(self) -> dict[str, Any]:
        return {"segments": self.segments, "device_traces": [self.trace] if self.trace else []}

    def write(self, path: Path, *, compress: bool = False) -> Path:
        data = pickle.dumps(self.snapshot())
        path.write_bytes(gzip.compress(data) if compress else data)
        return path


def training(steps: int = 6, leak: bool = True) -> Builder:
    """Parameters and optimizer state once, then steps whose activations are freed; with
    `leak`, each step keeps one tensor from the logging call site."""
    b = Builder()
    b.alloc(2 * GiB, PARAMETER)
    b.alloc(4 * GiB, OPTIMIZER)
    for _ in range(steps):
        acts = [(b.alloc(3 * GiB, ACTIVATION), 3 * GiB) for _ in range(2)]
        grad = b.alloc(1 * GiB, GRADIENT)
        for addr, size in acts:
            b.free(addr, size)
        b.free(grad, 1 * GiB)
        if leak:
            b.alloc(8 * MiB, [LOG])
    return b


def report_of(b: Builder, **kwargs: Any) -> Any:
    return memory_report(parse_snapshot(pickle.dumps(b.snapshot())), **kwargs)


def test_call_site_is_the_first_frame_outside_torch_else_the_innermost() -> None:
    frames = [SnapshotFrame(**f) for f in ACTIVATION]
    assert call_site(frames) == "project/model.py:12 (forward)"
    assert call_site([SnapshotFrame(**LINEAR)]) == "torch/nn/modules/linear.py:9 (forward)"
    assert call_site([]).startswith("unknown")


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        (ACTIVATION, "activations"),
        (PARAMETER, "parameters"),
        (OPTIMIZER, "optimizer_state"),
        (GRADIENT, "gradients"),
        ([TRAIN], "other"),
    ],
)
def test_categories_are_guessed_from_the_stack(frames: list[dict[str, Any]], expected: str) -> None:
    assert category([SnapshotFrame(**f) for f in frames]) == expected


def test_peak_is_found_with_the_call_sites_live_then() -> None:
    r = report_of(training(steps=3, leak=False))
    (peak,) = r.peaks
    # parameters 2 + optimizer 4 + two activations 3+3 + gradient 1
    assert peak.bytes == 13 * GiB
    assert peak.baseline == 0
    assert peak.time_us is not None
    assert r.peaks[0].sites[0].site == "project/model.py:12 (forward)"
    assert peak.sites[0].bytes == 6 * GiB
    assert peak.sites[0].count == 2
    assert peak.categories["activations"] == 6 * GiB
    assert peak.categories["optimizer_state"] == 4 * GiB
    assert peak.categories["parameters"] == 2 * GiB
    assert peak.categories["gradients"] == 1 * GiB
    assert peak.growth == 6 * GiB  # parameters and optimizer state stay
    assert not r.leaks


def test_history_that_starts_late_takes_its_baseline_from_the_segments() -> None:
    b = Builder()
    b.segment([(5 * GiB, "active_allocated", PARAMETER)])
    a = b.alloc(1 * GiB, ACTIVATION)
    b.free(a, 1 * GiB)
    (peak,) = report_of(b).peaks
    assert peak.baseline == 5 * GiB
    assert peak.bytes == 6 * GiB


def test_activations_dominating_the_peak_is_a_finding() -> None:
    th = Thresholds(snapshot=SnapshotThresholds(activation_share=0.4))
    r = report_of(training(leak=False), thresholds=th)
    assert "memory-activations" in {f.id for f in r.findings}
    r = report_of(training(leak=False))  # 6 of 13 GiB: under one half
    assert "memory-activations" not in {f.id for f in r.findings}


def test_the_snapshot_thresholds_come_from_the_options(tmp_path: Path) -> None:
    path = training(leak=False).write(tmp_path / "snap.pickle")
    assert "memory-activations" not in {f.id for f in analyze_memory(path).findings}
    th = Thresholds(snapshot=SnapshotThresholds(activation_share=0.4))
    found = analyze_memory(path, Options(thresholds=th)).findings
    assert "memory-activations" in {f.id for f in found}


def test_live_blocks_of_the_segments_are_grouped_by_call_site_and_category() -> None:
    b = Builder()
    b.segment([(2 * GiB, "active_allocated", PARAMETER), (6 * GiB, "active_allocated", OPTIMIZER)])
    b.segment(
        [(1 * GiB, "active_allocated", ACTIVATION), (1 * GiB, "active_allocated", ACTIVATION)]
    )
    r = report_of(b)
    (device,) = r.devices
    assert device.reserved == device.allocated == 10 * GiB
    assert r.categories["optimizer_state"] == 6 * GiB
    assert (r.sites[0].site, r.sites[0].category) == (
        "project/train.py:40 (train_step)",
        "optimizer_state",
    )
    assert {s.site: s.count for s in r.sites}["project/model.py:12 (forward)"] == 2
    assert r.largest[0].bytes == 6 * GiB
    assert r.largest[0].category == "optimizer_state"
    ids = {f.id for f in r.findings}
    assert "memory-optimizer-state" in ids
    assert "memory-fragmentation" not in ids
    assert any("no allocation history" in n for n in r.notes)


def test_fragmented_cache_is_a_finding() -> None:
    b = Builder()
    for _ in range(4):
        b.segment([(512 * MiB, "active_allocated", ACTIVATION), (1 * GiB, "inactive", [])])
    r = report_of(b)
    (device,) = r.devices
    assert device.free == 4 * GiB
    assert device.segments == 4
    assert device.largest_free_block == 1 * GiB
    (finding,) = [f for f in r.findings if f.id == "memory-fragmentation"]
    assert "expandable_segments:True" in finding.fix
    assert finding.saving_bytes == 4 * GiB
    assert finding.device == "cuda:0"


def test_a_call_site_that_keeps_allocating_over_the_steps_is_a_leak_suspect() -> None:
    r = report_of(training(steps=6, leak=True))
    (leak,) = r.leaks
    assert leak.site == "project/train.py:55 (log_loss)"
    # The last step's block is its own working set until a later step ends with it alive.
    assert (leak.count, leak.steps) == (5, 5)
    assert leak.bytes == 40 * MiB
    # parameters and optimizer state are never freed too, but they were allocated once
    (finding,) = [f for f in r.findings if f.id == "memory-leak-suspect"]
    assert finding.saving_bytes == 40 * MiB
    assert "allocated in 5 steps and still alive at the end of later ones" in finding.evidence
    assert r.peaks[0].growth == 6 * GiB + 48 * MiB


def test_oom_is_reported_with_its_request() -> None:
    b = training(steps=1, leak=False)
    b.oom(requested=5 * GiB, device_free=1 * GiB)
    r = report_of(b)
    (oom,) = r.ooms
    assert oom.requested == 5 * GiB
    assert oom.device_free == 1 * GiB
    assert oom.allocated == 6 * GiB
    assert r.findings[0].id == "memory-oom"


def test_missing_keys_are_tolerated() -> None:
    raw = {"segments": [{"blocks": [{"size": 10, "state": "active_allocated"}]}]}
    r = memory_report(parse_snapshot(pickle.dumps(raw)))
    assert r.devices[0].allocated == 10
    assert r.sites[0].site.startswith("unknown")


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


class _OpensFile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "x": _RunsCode(marker)}))
    with pytest.raises(WallfinderError, match=r"asks for os\.system \(refused: a pickle can run"):
        load_snapshot(path)
    path.write_bytes(pickle.dumps(_OpensFile(marker), protocol=0))
    with pytest.raises(WallfinderError, match=r"asks for (builtins|io)\.open"):
        load_snapshot(path)
    assert not marker.exists()


def damaged_deflate() -> bytes:
    """A gzip file whose compressed data is garbage after a valid header."""
    good = gzip.compress(pickle.dumps({"segments": list(range(1000))}))
    return good[:10] + bytes(b ^ 0x5A for b in good[10:-8]) + good[-8:]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty file"),
        (pickle.dumps({"segments": []})[:-5], "truncated pickle"),
        (b"hello, this is a text file\n", "not a pickle"),
        (b'{"traceEvents": []}', "a JSON file, not an allocator snapshot.*wallfinder analyze"),
        (gzip.compress(b'  [{"ph": "X"}]'), "a JSON file, not an allocator snapshot"),
        (pickle.dumps([1, 2, 3]), "not an allocator snapshot: a pickled list"),
        (pickle.dumps({"a": 1}), "not an allocator snapshot"),
        (pickle.dumps({"segments": "no"}), "not a plain allocator snapshot"),
        (gzip.compress(pickle.dumps({"segments": []}))[:-12], "truncated or damaged gzip"),
        (damaged_deflate(), "truncated or damaged gzip"),
    ],
)
def test_bad_files_give_one_clear_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(content)
    with pytest.raises(WallfinderError, match=message):
        load_snapshot(path)


def test_size_guard_refuses_big_files(tmp_path: Path) -> None:
    path = training().write(tmp_path / "snap.pickle")
    with pytest.raises(WallfinderError, match="too big"):
        load_snapshot(path, max_bytes=100)
    gz = training().write(tmp_path / "snap.pickle.gz", compress=True)
    with pytest.raises(WallfinderError, match="too big"):
        load_snapshot(gz, max_bytes=100)


def test_gzip_snapshots_load_like_plain_ones(tmp_path: Path) -> None:
    plain = load_snapshot(training().write(tmp_path / "a.pickle"))
    packed = load_snapshot(training().write(tmp_path / "b.pickle.gz", compress=True))
    assert plain == packed


def test_cli_prints_the_report_in_each_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    b = training(steps=6, leak=True)
    b.segment([(512 * MiB, "active_allocated", ACTIVATION), (2 * GiB, "inactive", [])])
    path = b.write(tmp_path / "snap.pickle")
    assert main(["memory", str(path)]) == 0
    text = capsys.readouterr().out
    assert "peak on device 0: 13.04 GiB" in text
    assert "project/model.py:12 (forward)" in text
    assert "leak suspects" in text
    assert "expandable_segments:True" in text
    assert main(["memory", str(path), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "wallfinder.memory/2"
    assert data["peaks"][0]["bytes"] == 13 * GiB + 5 * 8 * MiB
    out = tmp_path / "report.md"
    assert main(["memory", str(path), "--format", "md", "-o", str(out)]) == 0
    assert out.read_text().startswith("## wallfinder memory")


def test_cli_bad_snapshot_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(_RunsCode(tmp_path / "pwned")))
    assert main(["memory", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "refused: a pickle can run code" in err
    assert main(["memory", str(tmp_path / "missing.pickle")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert not (tmp_path / "pwned").exists()


def test_call_sites_keep_no_machine_folders(tmp_path: Path) -> None:
    installed = tmp_path / "lib" / "python3.11" / "site-packages" / "torch" / "nn"
    frames = [
        SnapshotFrame(str(installed / "functional.py"), 10, "linear"),
        SnapshotFrame(str(tmp_path / "project" / "model.py"), 12, "forward"),
    ]
    assert call_site(frames) == "…/project/model.py:12 (forward)"
    assert call_site(frames[:1]) == "torch/nn/functional.py:10 (linear)"
    assert call_site([SnapshotFrame("C:\\Users\\someone\\w\\t.py", 3, "f")]) == "…/w/t.py:3 (f)"


def cpp(name: str) -> dict[str, Any]:
    """A C++ frame, as `_record_memory_history(stacks="all")` records them."""
    return {"filename": "??", "line": 0, "name": name}


ALLOCATOR = cpp("torch::unwind::unwind()")
ENGINE_NODE = cpp("torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)")
ENGINE = cpp("torch::autograd::Engine::evaluate_function(std::shared_ptr<GraphTask>&, ...)")
ENGINE_THREAD = [ALLOCATOR, ENGINE_NODE, ENGINE]
COMPILED = [
    {"filename": "/tmp/torchinductor_u/ab/cab.py", "line": 80, "name": "call"},
    {
        "filename": "/venv/site-packages/torch/_inductor/output_code.py",
        "line": 9,
        "name": "__call__",
    },
    {
        "filename": "/venv/site-packages/torch/_functorch/_aot_autograd/runtime_wrappers.py",
        "line": 3,
        "name": "forward",
    },
    {"filename": "/venv/site-packages/torch/autograd/function.py", "line": 575, "name": "apply"},
    {"filename": "/venv/site-packages/torch/_dynamo/eval_frame.py", "line": 1, "name": "_fn"},
    TRAIN,
]
NO_GRAD = [
    LINEAR,
    CALL,
    MODEL,
    CALL,
    {"filename": "/venv/site-packages/torch/autograd/grad_mode.py", "line": 3, "name": "wrapper"},
    TRAIN,
]
BUILD = {"filename": "project/model.py", "line": 5, "name": "__init__"}
EMBED = {"filename": "project/model.py", "line": 30, "name": "forward"}
LAYER = {"filename": "project/model.py", "line": 20, "name": "forward"}
LOOP = {"filename": "project/infer.py", "line": 9, "name": "predict"}
# A two-level model: the outermost forward allocates (the embedding), then each layer does.
TOP = [EMBED, CALL, LOOP]
IN_LAYER = [LINEAR, CALL, LAYER, CALL, EMBED, CALL, LOOP]


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        (ENGINE_THREAD, "gradients"),  # the backward pass on autograd's thread
        (COMPILED, "activations"),  # a compiled forward is no backward
        (NO_GRAD, "activations"),  # nor is a no_grad decorator under torch/autograd/
        (
            [{"filename": "/venv/torch/nn/parameter.py", "line": 1, "name": "__new__"}, BUILD],
            "parameters",
        ),
        (
            [
                {
                    "filename": "/venv/torch/nn/modules/module.py",
                    "line": 1,
                    "name": "load_state_dict",
                }
            ],
            "parameters",
        ),
    ],
)
def test_gradients_need_a_backward_pass_on_the_stack(
    frames: list[dict[str, Any]], expected: str
) -> None:
    assert category([SnapshotFrame(**f) for f in frames]) == expected


def test_a_backward_allocation_without_python_frames_is_named_by_its_autograd_node() -> None:
    frames = [SnapshotFrame(**f) for f in ENGINE_THREAD]
    assert call_site(frames) == "autograd backward (MmBackward0, no Python stack)"
    frames = [SnapshotFrame(**f) for f in (ALLOCATOR, ENGINE)]
    assert call_site(frames) == "autograd backward (no Python stack)"


def test_blocks_without_a_stack_from_before_the_history_are_parameters_and_said() -> None:
    b = Builder()
    b.segment([(4 * GiB, "active_allocated", []), (1 * GiB, "active_allocated", ACTIVATION)])
    a = b.alloc(2 * GiB, ACTIVATION)
    b.free(a, 2 * GiB)
    r = report_of(b)
    assert r.categories["parameters"] == 4 * GiB
    assert r.categories["other"] == 0
    (peak,) = r.peaks
    # What predates the history is live at its peak too, and counted there.
    assert peak.categories["parameters"] == 4 * GiB
    assert peak.categories["activations"] == 3 * GiB
    assert any("allocated before the history began" in n for n in r.notes)


def test_without_a_history_a_block_without_stack_is_other_and_said() -> None:
    b = Builder()
    b.segment([(4 * GiB, "active_allocated", [])])
    r = report_of(b)
    assert r.categories["other"] == 4 * GiB
    assert any("no history to date them" in n for n in r.notes)


def test_blocks_made_before_the_first_forward_and_kept_are_parameters() -> None:
    b = Builder()
    weight = b.alloc(1 * GiB, [BUILD, TRAIN])  # a custom module's constructor: no nn frame
    scratch = b.alloc(256 * MiB, [TRAIN])
    b.free(scratch, 256 * MiB)
    act = b.alloc(2 * GiB, ACTIVATION)
    b.free(act, 2 * GiB)
    later = b.alloc(64 * MiB, [LOG])
    b.addr = weight  # the segments hold the live blocks at their addresses
    b.segment([(1 * GiB, "active_allocated", [BUILD, TRAIN])])
    b.addr = later
    b.segment([(64 * MiB, "active_allocated", [LOG])])
    r = report_of(b)
    (peak,) = r.peaks
    assert peak.categories["parameters"] == 1 * GiB
    assert peak.categories["other"] == 0  # the scratch block was freed before the peak
    assert r.categories["parameters"] == 1 * GiB
    assert r.categories["other"] == 64 * MiB  # allocated after the forward pass began
    assert any("before the first forward pass and never freed" in n for n in r.notes)
    assert later


def test_a_forward_pass_keeping_its_activations_is_no_leak_and_has_no_gradients() -> None:
    b = Builder()
    b.segment([(8 * GiB, "active_allocated", [])])
    b.alloc(64 * MiB, TOP)
    for _ in range(24):  # 24 layers, each keeping what it made, through the whole history
        b.alloc(256 * MiB, IN_LAYER)
        b.alloc(128 * MiB, COMPILED)
    r = report_of(b)
    assert not r.leaks
    assert "memory-leak-suspect" not in {f.id for f in r.findings}
    assert any("holds one step" in n for n in r.notes)
    (peak,) = r.peaks
    assert peak.categories["gradients"] == 0
    assert peak.categories["activations"] == 64 * MiB + 24 * 384 * MiB
    assert peak.categories["parameters"] == 8 * GiB


def training_steps(steps: int, *, keep_loss: bool) -> Builder:
    """Steps of forward, backward on autograd's thread and an optimizer step: activations
    freed in the backward pass, gradients held until the next step's zero_grad (set to
    None), optimizer state made in the first step; with `keep_loss`, each step's loss is
    kept for good."""
    b = Builder()
    b.alloc(2 * GiB, PARAMETER)
    grads: list[int] = []
    for step in range(steps):
        for g in grads:
            b.free(g, 1 * GiB)
        acts = [b.alloc(512 * MiB, TOP)] + [b.alloc(512 * MiB, IN_LAYER) for _ in range(3)]
        if keep_loss:
            b.alloc(4 * MiB, [LOG])
        grads = [b.alloc(1 * GiB, ENGINE_THREAD) for _ in range(2)]
        for a in acts:
            b.free(a, 512 * MiB)
        if step == 0:
            b.alloc(4 * GiB, OPTIMIZER)
    return b


def test_gradients_held_until_the_optimizer_step_are_not_a_leak() -> None:
    r = report_of(training_steps(8, keep_loss=False))
    assert not r.leaks
    (peak,) = r.peaks
    assert peak.categories["gradients"] == 2 * GiB
    assert peak.categories["activations"] == 2 * GiB


def test_a_loss_kept_every_step_is_growth_across_steps() -> None:
    r = report_of(training_steps(8, keep_loss=True))
    (leak,) = r.leaks
    assert leak.site == "project/train.py:55 (log_loss)"
    assert (leak.count, leak.steps, leak.bytes) == (7, 7, 28 * MiB)


def test_a_forward_only_loop_keeping_its_outputs_is_growth_across_passes() -> None:
    b = Builder()
    for _ in range(6):  # six inference passes, each keeping its 32 MiB output
        acts = [b.alloc(64 * MiB, TOP)] + [b.alloc(64 * MiB, IN_LAYER) for _ in range(4)]
        for a in acts:
            b.free(a, 64 * MiB)
        b.alloc(32 * MiB, [LINEAR, CALL, EMBED, CALL, LOOP])
    r = report_of(b)
    (leak,) = r.leaks
    assert leak.site == "project/model.py:30 (forward)"
    assert leak.steps == 5
    assert leak.category == "activations"
