"""Real profiler traces from other projects (see ../shared/traces/MANIFEST.md): every one
loads and gives a diagnosis that keeps the invariants, and a few facts of them hold.

The traces are not part of the repository: they are found as tests/realtraces.py says, and
without them these tests are skipped (and the run says so once, at its end)."""

from __future__ import annotations

from pathlib import Path

import pytest

import wallfinder.trace._reader as reader_module
from invariants import (
    assert_diagnosis_invariants,
    assert_findings_bounded,
    assert_one_figure_per_fix,
    assert_phases_and_modules,
)
from realtraces import real_trace, real_trace_params
from tracegen import assert_same_trace
from wallfinder import Diagnosis, analyze
from wallfinder.analysis import diagnose
from wallfinder.api import analyze_memory
from wallfinder.cli import main
from wallfinder.trace import Kind, Trace, load_trace

_loaded: dict[Path, tuple[Trace, Diagnosis]] = {}


def loaded(path: Path) -> tuple[Trace, Diagnosis]:
    """Each real trace is loaded and diagnosed once per session."""
    if path not in _loaded:
        trace = load_trace(path)
        _loaded[path] = (trace, diagnose(trace))
    return _loaded[path]


@pytest.mark.parametrize("path", real_trace_params())
def test_real_trace_diagnosis_keeps_the_invariants(path: Path) -> None:
    trace, d = loaded(path)
    assert len(trace.events) > 0
    assert_diagnosis_invariants(d)
    assert_phases_and_modules(d)


def test_v100_memory_events_give_the_peak_and_what_was_live() -> None:
    _, d = loaded(real_trace("hta/v100_nccl_df_index_resolver.json.gz"))
    assert d.memory is not None
    m = d.memory.devices[0]
    assert m.device == "cuda:1"  # the rank's GPU, not the host memory events beside it
    # No --device: the capacity is the trace's own (deviceProperties), a V100-SXM2-32GB's.
    assert (m.capacity, m.capacity_source) == (34_089_730_048, "trace deviceProperties")
    assert (m.peak_allocated, m.peak_reserved) == (6_629_508_096, 12_782_141_440)
    # 4.1 GB were allocated before the trace (parameters and state); the rest is the step's.
    assert m.before_trace == 4_096_614_400
    assert m.peak_phase == "backward"
    assert m.categories["activations"] > m.categories["temporaries"] > 0
    # Allocated memory is the same at every step's start: no leak.
    assert {s.start_allocated for s in m.steps} == {4_096_614_400}
    assert not m.leak
    # 38% of the device's memory at its reserved peak: memory is not the limit.
    assert d.memory.findings == []
    assert any("memory is not the limit" in n for n in d.memory.notes)
    assert [x.device for x in d.memory.devices[1:]] == ["cpu"]


def test_mi300x_memory_events_are_on_the_hip_device_with_call_stacks() -> None:
    _, d = loaded(real_trace("tracelens/mi300x_normalization_layers.json.gz"))
    assert d.memory is not None
    m = d.memory.devices[0]
    assert m.device == "hip:0"
    assert m.capacity == 206_141_652_992
    assert any(" ← " in s.site and "forward" in s.site for s in m.sites)


SNAPSHOTS = [
    "cs336_ctx128_forward.pickle",
    "cs336_ctx128_forward_mixed.pickle",
    "cs336_ctx128_fullstep.pickle",
    "cs336_forward_b.pickle",
]


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_real_snapshots_name_the_parameters_and_see_no_leak_in_one_step(name: str) -> None:
    r = analyze_memory(real_trace(f"memory/{name}"))
    # Each history is one step (one forward pass, or one training step): what it keeps
    # alive is its working set, not growth across steps.
    assert r.leaks == []
    assert "memory-leak-suspect" not in {f.id for f in r.findings}
    assert any("holds one step" in n for n in r.notes)
    # The model's weights were allocated before recording began: no stack, alive through
    # the history, so parameters (and said so), not "other".
    (device,) = r.devices
    assert r.categories["parameters"] > 0.15 * device.allocated
    assert r.categories["other"] < 0.001 * device.allocated
    assert any("allocated before the history began" in n for n in r.notes)
    (peak,) = r.peaks
    assert peak.categories["parameters"] == r.categories["parameters"]


@pytest.mark.parametrize(
    "name", ["cs336_ctx128_forward.pickle", "cs336_ctx128_forward_mixed.pickle"]
)
def test_real_forward_only_snapshots_have_no_gradients(name: str) -> None:
    r = analyze_memory(real_trace(f"memory/{name}"))
    (peak,) = r.peaks
    assert r.categories["gradients"] == peak.categories["gradients"] == 0
    assert r.categories["activations"] > 0


def test_real_training_step_snapshot_splits_the_model_state() -> None:
    r = analyze_memory(real_trace("memory/cs336_ctx128_fullstep.pickle"))
    cats = r.categories
    # AdamW: one gradient and two moments per parameter, all fp32, so each the same size.
    assert cats["gradients"] == pytest.approx(cats["parameters"], rel=0.01)
    assert cats["optimizer_state"] == pytest.approx(2 * cats["parameters"], rel=0.01)
    # The backward pass runs on autograd's thread, with C++ frames only.
    assert any(s.site.startswith("autograd backward (") for s in r.sites)
    # Gradients held until the optimizer step are no leak.
    assert r.leaks == []


@pytest.mark.parametrize("path", real_trace_params())
def test_real_trace_findings_claim_no_more_than_the_time_they_explain(path: Path) -> None:
    _, d = loaded(path)
    assert_findings_bounded(d)


@pytest.mark.parametrize("path", real_trace_params())
def test_real_trace_has_device_or_cpu_work_of_its_basis(path: Path) -> None:
    trace, d = loaded(path)
    device_work = len(trace.of_kind(Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET))
    if d.breakdown.basis == "gpu":
        assert device_work > 0
        assert d.kernels
    else:
        assert device_work == 0
        assert d.device.kind == "cpu"


# Facts of particular traces ---------------------------------------------------------------------


def test_v100_two_rank_trace_is_rank_1_of_2_with_6_steps() -> None:
    trace, d = loaded(real_trace("hta/v100_2rank_test_rank0.json.gz"))
    assert d.device.name == "Tesla V100-SXM2-16GB"
    assert (d.rank, d.world_size) == (1, 2)
    assert d.steps.total == 6
    assert d.steps.source == "ProfilerStep"
    assert trace.of_kind(Kind.KERNEL).name.size > 0


def test_cpu_only_trace_is_analysed_on_the_cpu_as_rank_34_of_300() -> None:
    _, d = loaded(real_trace("hta/cpu_only_rank34.json.gz"))
    assert d.breakdown.basis == "cpu"
    assert d.device.kind == "cpu"
    assert (d.rank, d.world_size) == (34, 300)


def test_cpu_only_trace_waits_for_gloo_on_two_other_threads() -> None:
    # The step's thread records no op for its 210 ms while gloo:all_reduce runs 173 ms on one
    # thread of the process and 170 ms on another: that is where the step goes.
    _, d = loaded(real_trace("hta/cpu_only_rank34.json.gz"))
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "comm_exposed")
    assert d.cpu is not None
    assert d.cpu.waiting_on_collectives == pytest.approx(d.breakdown.comm_exposed)
    assert d.breakdown.comm_exposed > d.breakdown.idle_causes["other"]
    top = d.findings[0]
    assert top.id == "exposed-comm"
    assert "gloo:all_reduce ×2/step on 2 threads other than the step's" in top.evidence
    # No compute in the step to hide it behind: hiding gains nothing, and the fix says what does.
    assert (top.reach, top.max_speedup) == (0.0, 1.0)
    assert top.fix.startswith("make the collectives cheaper")


def test_mi300x_communication_bound_is_what_its_compute_can_hide() -> None:
    # Its collectives take longer than its compute: hiding them can take at most the compute
    # no collective runs beside yet, far less than the exposed communication.
    _, d = loaded(real_trace("tracelens/mi300x_resnet_act_checkpoint.json.gz"))
    b = d.breakdown
    assert d.verdict.cause == "comm_exposed"
    f = d.findings[0]
    assert f.id == "exposed-comm"
    steady = 1.0 - b.idle_causes.get("startup", 0.0)
    assert f.reach == pytest.approx(min(b.comm_exposed, b.compute - b.comm_hidden) / steady)
    assert f.reach is not None
    assert f.reach < f.share / 2
    assert f.max_speedup == pytest.approx(1 / (1 - f.reach))
    assert d.critical_path is not None
    overlap = next(r for r in d.critical_path.what_if if r.change == "overlap")
    assert overlap.speedup <= f.max_speedup
    assert f"the `overlap` what-if replays {overlap.speedup:.2f}x" in f.evidence


def test_mi210_gpu_only_trace_loads_with_hip_names_and_kernels() -> None:
    trace, d = loaded(real_trace("tracelens/mi210_gpu_only.json.gz"))
    runtime = {trace.strings[c] for c in set(trace.of_kind(Kind.RUNTIME).name.tolist())}
    assert any(name.startswith("hip") for name in runtime)
    assert len(trace.of_kind(Kind.KERNEL)) > 0
    assert d.device.name == "AMD Instinct MI210"
    assert d.breakdown.basis == "gpu"
    assert d.kernels


def test_mi250_trace_joins_hip_launches_to_kernels() -> None:
    _, d = loaded(real_trace("hta/mi250_minitoy_train.json.gz"))
    assert d.breakdown.basis == "gpu"
    assert not any("no launch records" in w for w in d.warnings)


def test_sampled_job_folder_gives_two_ranks() -> None:
    folder = real_trace("hta/sampled_128rank_job")
    d = analyze(folder)
    assert [r.rank for r in d.ranks] == [0, 1]
    assert (d.rank, d.world_size) == (0, 128)
    assert d.device.name is None
    # The two ranks' collectives match one to one; their clocks agree to well under a ms; the
    # 126 missing ranks are said, and the wait lands on both ranks (no single one to blame).
    job = d.job
    assert job is not None
    assert (job.ranks, job.world_size) == (2, 128)
    assert job.matched == 10
    assert job.unmatched == 0
    assert job.max_clock_skew_s is not None
    assert 0 < job.max_clock_skew_s < 1e-3
    assert any("missing" in n for n in job.notes)
    assert job.stragglers == []
    assert all(r.wait_s is not None and r.wait_s > 0 for r in d.ranks)
    # The path is one rank's, the findings another's: the table still agrees with them.
    assert_one_figure_per_fix(d)


def test_trace_without_profiler_steps_sets_its_start_up_aside() -> None:
    # No step markers, no optimizer: one window, after a 30 s first `.to()` (CUDA context)
    # and the first convolutions' cuDNN set-up, which are start-up, not the job's wall.
    _, d = loaded(real_trace("hta/a100_alexnet.json.gz"))
    assert d.steps.source.startswith("whole trace")
    assert (d.steps.total, d.steps.count) == (2, 1)
    [startup] = d.steps.dropped
    assert startup.step == "start-up"
    assert "the first aten::to took 29.94 s" in startup.reason
    assert "the first aten::conv2d took 10.84 s" in startup.reason
    assert d.verdict.confidence == "low"
    warmup = next(f for f in d.findings if f.id == "warm-up")
    assert (warmup.saves, warmup.max_speedup) == ("once", 1.0)
    assert all(f.max_speedup < 3 for f in d.findings)  # was "up to 263.90x faster"


def test_first_launches_loading_code_are_start_up_not_launch_latency() -> None:
    # No markers, no optimizer: the annotated sequence of ten norm layers repeats 3 times.
    # The first iteration holds 1.09 s of first launches loading code objects (the slowest a
    # reduce kernel's first hipLaunchKernel, 21.69 ms; later launches take 3-10 µs), and 66 ms
    # more of host work inside the ops around them (the one-off stretch is the op that loads,
    # issue 33): start-up, set aside with its iteration. It was "launch latency", and the
    # launch-bound bound 35.26x.
    _, d = loaded(real_trace("tracelens/mi300x_normalization_layers.json.gz"))
    assert d.steps.source == "repeated annotations (no ProfilerStep)"
    first = d.breakdown.steps[0]
    assert first.warmup
    assert first.idle_causes_s["startup"] == pytest.approx(1.156, abs=0.005)
    assert first.idle_causes_s["launch_latency"] < 1e-3
    causes = d.breakdown.idle_causes
    assert causes["startup"] == 0.0
    # What recurs is the host between tiny kernels: CPU ops and Python.
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "host_overhead")
    launch = next(f for f in d.findings if f.id == "launch-bound")
    assert launch.share == pytest.approx(causes["host_overhead"] + causes["launch_latency"])
    assert launch.max_speedup < 10
    once = next(f for f in d.findings if f.id == "warm-up")
    assert (once.saves, once.max_speedup) == ("once", 1.0)


def test_a_short_trace_s_first_launch_is_start_up() -> None:
    # Two steps, too few to set the first aside: its 6.54 ms first hipLaunchKernel (later
    # calls 6 µs) was 72% of the time as "launch latency".
    _, d = loaded(real_trace("hta/mi250_minitoy_train.json.gz"))
    assert d.breakdown.idle_causes["startup"] > 0.6
    assert d.verdict.cause == "host_overhead"
    assert next(f for f in d.findings if f.id == "launch-bound").max_speedup < 3


# Chunked and parallel parsing of real files -----------------------------------------------------


def test_real_trace_parsed_in_small_chunks_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    path = real_trace("hta/a100_nccl_data.json.gz")
    whole, _ = loaded(path)
    monkeypatch.setattr(reader_module, "BLOCK", 256 << 10)
    assert_same_trace(load_trace(path), whole)


def test_real_trace_parsed_by_two_workers_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    path = real_trace("hta/v100_2rank_test_rank0.json.gz")
    whole, d = loaded(path)
    monkeypatch.setattr(reader_module, "BLOCK", 1 << 20)
    parallel = load_trace(path, workers=2)
    assert_same_trace(parallel, whole)
    assert diagnose(parallel) == d


def test_diff_of_runs_on_different_devices_says_so_and_still_compares_steps() -> None:
    from wallfinder.analysis.diff import diff
    from wallfinder.report import render_diff

    before = loaded(real_trace("hta/a100_8rank_control_rank0.json.gz"))[1]
    after = loaded(real_trace("hta/v100_2rank_test_rank0.json.gz"))[1]
    x = diff(before, after)
    assert any(n.startswith("different devices (NVIDIA A100") and "V100" in n for n in x.notes)
    assert x.steps.before_s == before.steps.median_s
    assert x.steps.after_s == after.steps.median_s
    rows = {p.part: p for p in x.breakdown}
    assert rows["compute"].before == before.breakdown.compute
    assert rows["idle"].after == after.breakdown.idle
    (kernels,) = [m for m in x.matches if m.kind == "kernel"]
    assert kernels.matched > 0
    assert kernels.matched + kernels.before_only == len({k.name for k in before.kernels})
    text = render_diff(x, "text", width=100)
    assert f"kernels: {kernels.matched} matched by name" in text
    assert "note: different devices" in text


def test_a_trace_that_recorded_nothing_is_one_clear_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A real trace written by a profiler stopped before the job ran: its own span and instants.
    path = real_trace("other/empty_trace.json")
    assert main(["analyze", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert "recorded no activity" in err


def test_real_nsys_export_matches_its_own_tables() -> None:
    """The llama3 inference demo's export (nsys 2024.6): the figures wallfinder gives are the
    export's own, summed by SQL, and none of its environment reaches the diagnosis."""
    import sqlite3

    path = real_trace("nsys/llama3_inference_demo.sqlite")
    d = analyze(path)
    assert_diagnosis_invariants(d)
    assert d.trace_format == "nsys"
    assert d.device.name == "NVIDIA GeForce RTX 4060 Ti"
    with sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True) as con:
        kernel_ns = con.execute(
            "SELECT sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL"
        ).fetchone()[0]
        top = con.execute(
            "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
            "ON s.id = k.demangledName GROUP BY 1 ORDER BY sum(k.end - k.start) DESC LIMIT 1"
        ).fetchone()[0]
        environment = [
            r[0]
            for r in con.execute(
                "SELECT value FROM StringIds WHERE value LIKE '%=%' AND length(value) > 12"
            )
        ]
    # One window over the capture (its NVTX ranges name layers, not steps): every kernel in it.
    assert d.steps.total == 1
    assert d.breakdown.per_step_ms["compute"] == pytest.approx(kernel_ns / 1e6)
    assert d.kernels[0].name == top
    assert d.breakdown.idle > 0.9
    text = d.to_json()
    assert environment
    assert not any(env in text for env in environment)


@pytest.mark.parametrize("path", real_trace_params())
def test_replaying_the_unchanged_graph_reproduces_the_measured_step(path: Path) -> None:
    """On every real trace with device work, the step's dependency graph replayed as recorded
    gives the measured mean step within 3% (benchmarks/bench_critpath.py prints the error of
    each). Whether a trace has a device graph is read from the trace itself, never from what
    the code under test returned: a trace with kernels whose critical path came back empty is
    a failure, not a skip. (Every trace that loads has at least one window, so "no steps" is
    never the reason: a trace without step markers is one window over the whole trace.)"""
    trace, d = loaded(path)
    if len(trace.of_kind(Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)) == 0:
        pytest.skip("no device work in this trace: no device graph to replay")
    cp = d.critical_path
    assert cp is not None
    assert abs(cp.replay_error) <= 0.03
    # The error the diagnosis reports is (replayed - measured) / measured, over the measured
    # step the steps' own statistics give (the mean steady window, where the graph holds every
    # steady step): a wrong denominator, or a measured step of the graph's own, fails here.
    if cp.steps == d.steps.count:
        assert cp.measured_step_s == pytest.approx(d.steps.mean_s, rel=1e-9)
    assert cp.replay_error * cp.measured_step_s == pytest.approx(
        cp.replayed_step_s - cp.measured_step_s, rel=1e-9, abs=1e-15
    )
    assert sum(cp.shares.values()) == pytest.approx(1.0)


def test_a_starved_resnet_gains_its_data_wait_by_replay() -> None:
    """The RTX 2080 Ti ResNet waits for its DataLoader: the replay puts the data wait on the
    critical path, and removing it is worth what Amdahl's bound says (the wait is serial
    with everything else), the compute wall after it."""
    _, d = loaded(real_trace("param/rtx2080ti_resnet.json.gz"))
    cp = d.critical_path
    assert cp is not None
    assert max(cp.shares, key=lambda k: cp.shares[k]) == "data"
    finding = next(f for f in d.findings if f.id == "data-loading")
    assert finding.gain_basis == "replay"
    assert finding.replay_speedup == pytest.approx(finding.max_speedup, rel=0.01)
    assert finding.wall_after == "compute"
