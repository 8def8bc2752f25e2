"""torch.compile in a trace (issue 33): compiled regions named and compared with the eager
code beside them, Inductor kernels read as the ops they fuse, the compile set aside as a
one-off cost, Dynamo's ranges never taken as steps, and what `wallfinder run` recorded of
Dynamo rendered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from invariants import assert_diagnosis_invariants
from tracegen import TraceBuilder
from wallfinder import Diagnosis, analyze
from wallfinder.report import render
from wallfinder.trace.dynamo import dynamo_range, fused_kernel

H100 = Path(__file__).resolve().parents[1] / "data" / "h100"

GEMM = "sm90_xmma_gemm_f32f32_f32f32_f32_nn_n"
FUSED = "triton_poi_fused_add_mul_tanh_0"
EAGER_OPS = (("aten::mm", GEMM, 100.0), ("aten::mul", "elementwise<mul>", 20.0))
EAGER_OPS += (("aten::add", "elementwise<add>", 20.0), ("aten::tanh", "elementwise<tanh>", 20.0))
COMPILE_US = 50_000.0
CALLS = 6
REGION_US, CALL_US = 150.0, 160.0


def issue_trace(path: Path) -> Path:
    """The issue's structure: a function run eagerly CALLS times, then compiled (the
    compile, then CALLS compiled calls), each call behind a `TorchDynamo Cache Lookup`
    annotation, no ProfilerStep."""
    b = TraceBuilder()
    t = 0.0
    for _ in range(CALLS):
        for op, kernel, dur in EAGER_OPS:
            b.cpu_op(op, t, 8.0)
            b.kernel(kernel, t + 10.0, dur, launch_at=t + 2.0)
            t += dur + 12.0
    b.annotation("TorchDynamo Cache Lookup", t, 1.0)
    b.cpu_op("entire_frame_compile", t + 2.0, COMPILE_US)
    t += COMPILE_US + 10.0
    for _ in range(CALLS):
        b.annotation("TorchDynamo Cache Lookup", t, 1.0)
        b.cpu_op("Torch-Compiled Region: 0/0", t + 2.0, REGION_US)
        b.cpu_op("aten::mm", t + 4.0, 8.0)
        b.kernel(GEMM, t + 14.0, 100.0, launch_at=t + 6.0)
        b.cpu_op(FUSED, t + 20.0, 8.0)
        b.kernel(FUSED, t + 116.0, 25.0, launch_at=t + 22.0)
        t += CALL_US
    return b.write(path)


def test_inductor_kernel_names_say_the_ops_they_fuse() -> None:
    assert fused_kernel(FUSED) == ("pointwise", ["add", "mul", "tanh"])
    assert fused_kernel("triton_per_fused__softmax_exp_prepare_softmax_online_sub_1") == (
        "persistent reduction",
        ["_softmax", "exp", "prepare_softmax_online", "sub"],
    )
    assert fused_kernel("triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1") == (
        "reduction",
        ["_unsafe_view", "add", "mean", "mul", "pow", "rsqrt"],
    )
    assert fused_kernel("cpp_fused_add_relu_0") == ("CPU", ["add", "relu"])
    assert fused_kernel("triton_poi_fused_0") == ("pointwise", [])
    assert fused_kernel("triton_poi_fused_constant_pad_nd_1") == ("pointwise", ["constant_pad_nd"])
    assert fused_kernel("aten::mm") is None


def test_dynamo_ranges_are_never_steps() -> None:
    for name in (
        "TorchDynamo Cache Lookup",
        "Torch-Compiled Region: 0/1",
        "CompiledFunction",
        "CompiledFunctionBackward",
        "entire_frame_compile",
        "inductor_compile_data: fn_name=compile_fx_inner, compile_id=0/0",
    ):
        assert dynamo_range(name), name
    assert not dynamo_range("ProfilerStep#3")
    assert not dynamo_range("forward")


def test_the_issue_structure_keeps_eager_compares_it_and_sets_the_compile_aside(
    tmp_path: Path,
) -> None:
    # Before: the steps were cut on the repeated cache lookup, the eager half and the
    # compile one warm-up step; nothing said compiled code was there.
    d = analyze(issue_trace(tmp_path / "t.json"), workers=1)
    assert_diagnosis_invariants(d)
    assert "repeated annotations" not in d.steps.source
    assert [s.step for s in d.steps.dropped] == ["compile"]
    assert "torch.compile compiling" in d.steps.dropped[0].reason
    assert d.steps.dropped[0].duration_s == pytest.approx(COMPILE_US * 1e-6, rel=0.01)
    c = d.compiled
    assert c is not None
    assert c.eager is not None
    [region] = c.regions
    assert (region.name, region.calls, region.kernels_per_call) == ("compiled 0/0", CALLS, 2)
    assert (c.eager.calls, c.eager.kernels_per_call) == (CALLS, 4)
    assert c.eager.ops == ["mm", "mul", "add", "tanh"]
    # Per call: its start to the end of its work and its kernels, cut at the next call.
    # An eager call ends with its last kernel, 2 µs before the next call's first op.
    eager_mean = sum(dur + 12.0 for _, _, dur in EAGER_OPS) - 2.0
    assert c.eager.time_per_call_s == pytest.approx(eager_mean * 1e-6)
    assert region.time_per_call_s == pytest.approx(REGION_US * 1e-6)  # its kernels end inside
    assert c.speedup == pytest.approx(eager_mean / REGION_US)
    [kernel] = c.kernels
    assert (kernel.name, kernel.ops, kernel.calls) == (FUSED, ["add", "mul", "tanh"], CALLS)
    assert c.compile_s == pytest.approx(COMPILE_US * 1e-6)
    text = render(d, "text")
    assert "compiled vs eager" in text
    assert "fuses add + mul + tanh" in text


def test_eager_then_compiled_h100_capture_compares_the_two() -> None:
    # tests/data/capture/eager_vs_compiled.py: 10 eager calls, then 10 compiled, the first
    # of which compiled (5 s of Dynamo and Inductor, then autotuning inside the call).
    d = analyze(H100 / "eager_vs_compiled.json.gz", workers=1)
    assert_diagnosis_invariants(d)
    assert d.verdict.wall == "compute"  # the compiled calls' wall, as before
    c = d.compiled
    assert c is not None
    assert c.eager is not None
    [region] = c.regions
    assert (c.eager.calls, region.calls, c.compiling_calls) == (10, 9, 1)
    # Eager launches 13 kernels a call; Inductor's graph 5 (3 GEMM parts and 2 fused).
    assert (c.eager.kernels_per_call, region.kernels_per_call) == (13, 5)
    assert c.speedup is not None
    assert c.speedup > 1.2
    assert c.compile_s > 4.5  # entire_frame_compile alone is 4.88 s
    fused = {k.name: k.ops for k in c.kernels}
    assert fused["triton_poi_fused_add_mul_tanh_0"] == ["add", "mul", "tanh"]
    assert all(k.calls == 9 for k in c.kernels)  # autotuning's runs are not the calls'


def test_what_run_recorded_of_dynamo_is_read_and_rendered(tmp_path: Path) -> None:
    record = {
        "frames": 10,
        "graphs": 5,
        "graph_breaks": [{"reason": "Unsupported Tensor.item()", "file": "t.py", "line": 13}],
        "compiles": [
            {"compile_id": "0/0", "function": "forward", "file": "t.py", "line": 11},
            {
                "compile_id": "0/1",
                "function": "forward",
                "file": "t.py",
                "line": 11,
                "seconds": 0.2,
                "recompile_reason": "0/0: tensor 'x' size mismatch at index 0",
            },
        ],
        "compile_s": 2.5,
    }
    path = issue_trace(tmp_path / "t.json")
    data = json.loads(path.read_text())
    data["wallfinder_dynamo"] = record
    path.write_text(json.dumps(data))
    d = analyze(path, workers=1)
    assert d.compiled is not None
    assert d.compiled.dynamo is not None
    assert [r.compile_id for r in d.compiled.dynamo.recompiles] == ["0/1"]
    for fmt in ("text", "md", "html"):
        out = render(d, fmt)
        assert "graph break at t.py:13" in out, fmt
        assert "size mismatch at index 0" in out, fmt


def test_a_diagnosis_saved_before_compiled_code_was_kept_loads(tmp_path: Path) -> None:
    d = analyze(issue_trace(tmp_path / "t.json"), workers=1)
    old = d.to_dict()
    del old["compiled"]
    assert Diagnosis.from_json(json.dumps(old)).compiled is None


BREAK_RECORD = {
    "frames": 2,
    "graphs": 2,
    "graph_breaks": [{"reason": "Unsupported Tensor.item()", "file": "t.py", "line": 13}],
    "compiles": [
        {"compile_id": "0/0", "function": "forward", "file": "t.py", "line": 11},
        {"compile_id": "1/0", "function": "torch_dynamo_resume_in_forward_at_13"},
    ],
}


def test_a_graph_break_in_the_steady_loop_is_a_finding_with_its_line(tmp_path: Path) -> None:
    # Each step: frame 0's call holds its graph (180 µs), the break's eager code, then the
    # resumed frame's call: 300 µs from the call's start to the resume, 120 µs of it eager.
    b = TraceBuilder()
    for s in range(4):
        t = s * 1000.0
        b.step(s + 1, t, 1000.0)
        b.cpu_op("Torch-Compiled Region: 0/0", t + 10.0, 490.0)
        b.annotation("## Call CompiledFxGraph a ##", t + 20.0, 180.0)
        b.kernel(GEMM, t + 30.0, 150.0, launch_at=t + 25.0)
        b.cpu_op("aten::item", t + 210.0, 90.0)
        b.cpu_op("Torch-Compiled Region: 1/0", t + 310.0, 170.0)
        b.annotation("## Call CompiledFxGraph b ##", t + 320.0, 150.0)
        b.kernel(FUSED, t + 330.0, 100.0, launch_at=t + 325.0)
    path = b.write(tmp_path / "t.json")
    data = json.loads(path.read_text())
    data["wallfinder_dynamo"] = BREAK_RECORD
    path.write_text(json.dumps(data))
    d = analyze(path, workers=1)
    assert_diagnosis_invariants(d)
    [finding] = [f for f in d.findings if f.id == "graph-break"]
    assert "graph break at t.py:13" in finding.evidence
    assert "0.12 ms per step" in finding.evidence
    # Without the record, no line to name: no finding.
    del data["wallfinder_dynamo"]
    path.write_text(json.dumps(data))
    assert not [f for f in analyze(path, workers=1).findings if f.id == "graph-break"]


def test_the_module_step_is_the_module_tables_and_no_timed_step(tmp_path: Path) -> None:
    # `wallfinder run` records its timed steps without module hooks, then one module step
    # with them, named in the trace: the steps are the timed ones, the table the module step's.
    from tracegen import training_trace

    b = training_trace(5)
    period = 100.0 + 2 * 160.0  # training_trace's step: loader, then two kernels
    b.annotation("nn.Module: Net_0", 4 * period + 1.0, period - 2.0)
    b.annotation("nn.Module: blocks.0", 4 * period + 100.0, 160.0)
    path = b.write(tmp_path / "t.json")
    data = json.loads(path.read_text())
    data["wallfinder_module_step"] = "ProfilerStep#5"
    path.write_text(json.dumps(data))
    d = analyze(path, workers=1)
    assert_diagnosis_invariants(d)
    assert d.steps.total == 4
    assert d.modules is not None
    assert "from step 5" in d.modules.note
    assert {r.path for r in d.modules.rows} >= {"Net_0", "Net_0/blocks.0"}


def test_a_training_loops_eager_code_leaves_out_its_compiled_calls_and_recompiles(
    tmp_path: Path,
) -> None:
    """A loop of 5 steps: each runs `aten::randn` (eager, 100 µs, one kernel), the compiled
    model (its region, 300 µs, one kernel) and `aten::add_` (eager, 100 µs, one kernel); step
    4 recompiles inside its region call (Dynamo's range, 5 ms). The eager code per step is its
    own 200 µs and 2 kernels: not the region's time, kernels or the compile, and the step that
    recompiled is set aside as a one-off."""
    b = TraceBuilder()
    t = 0.0
    for s in range(5):
        compiling = 5000.0 if s == 3 else 0.0
        length = 600.0 + compiling
        b.step(s + 1, t, length)
        b.cpu_op("aten::randn", t + 10.0, 100.0)
        b.kernel("elementwise_kernel", t + 20.0, 50.0, launch_at=t + 15.0)
        b.cpu_op("Torch-Compiled Region: 0/0", t + 120.0, 300.0 + compiling)
        if compiling:
            b.annotation("entire_frame_compile", t + 125.0, compiling - 10.0)
        b.kernel(GEMM, t + 130.0 + compiling, 250.0, launch_at=t + 125.0 + compiling)
        b.cpu_op("aten::add_", t + 430.0 + compiling, 100.0)
        b.kernel("elementwise_kernel", t + 440.0 + compiling, 50.0, launch_at=t + 435.0 + compiling)
        t += length
    d = analyze(b.write(tmp_path / "t.json"), workers=1)
    assert any(s.reason.startswith("compiled for ") for s in d.steps.dropped)
    [once] = [f for f in d.findings if f.id == "warm-up"]
    assert once.title == "Compiling takes a share of the profiled time"
    assert d.compiled is not None
    eager = d.compiled.eager
    assert eager is not None
    assert eager.calls == 4  # the step that recompiled is the compile's
    assert eager.kernels_per_call == 2
    assert eager.time_per_call_s < 0.3e-3  # its own 200 µs and the gaps, not the region's
