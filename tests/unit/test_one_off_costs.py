"""One-off costs (issue 33): library start-up, module loading and JIT compiles, found by their
signatures whether or not their op repeats, are idle cause `startup`, named once in the
`warm-up` finding, and no bound or replay is computed over them."""

from __future__ import annotations

from pathlib import Path

import pytest

from invariants import assert_diagnosis_invariants
from tracegen import TraceBuilder, training_trace
from wallfinder import Diagnosis, analyze
from wallfinder.analysis import diagnose
from wallfinder.trace import Kind, load_trace

H100 = Path(__file__).resolve().parents[1] / "data" / "h100"
FUSED = "fused__autocast_to__15680171862954066917"


def checked(path: Path) -> Diagnosis:
    d = analyze(path, workers=1)
    assert_diagnosis_invariants(d)
    return d


def torchscript_first_forward() -> TraceBuilder:
    """A single forward at a new batch size, as the issue's trace shows it: eager ops, then
    one TorchScript function of 297 ms whose children (`fallback_function` around a
    `fused__autocast_to__…` op, 0.16 ms) are followed by a silent host stretch and the
    `cuLaunchKernel` of the freshly built fused kernel; then eager ops again."""
    b = TraceBuilder()
    host = 0.0
    for _ in range(3):
        b.cpu_op("aten::linear", host, 40.0)
        b.kernel("ampere_sgemm_64x64_nn", host + 30.0, 20.0, launch_at=host + 20.0)
        host += 60.0
    b.cpu_op("forward", 200.0, 297_000.0)
    b.cpu_op("fallback_function", 210.0, 90.0)
    b.cpu_op("fallback_function", 215.0, 80.0)
    b.cpu_op(FUSED, 220.0, 70.0)
    b.kernel(FUSED, 297_180.0, 7.0, launch_at=297_170.0, launch_dur=10.0, launcher="cuLaunchKernel")
    host = 297_300.0
    for _ in range(3):
        b.cpu_op("aten::linear", host, 40.0)
        b.kernel("ampere_sgemm_64x64_nn", host + 30.0, 20.0, launch_at=host + 20.0)
        host += 60.0
    return b


def test_a_torchscript_compile_is_a_one_off_jit_compile(tmp_path: Path) -> None:
    d = checked(torchscript_first_forward().write(tmp_path / "t.json"))
    causes = d.breakdown.idle_causes
    # The GPU waits 297 ms on the compile in a window of 297.5 ms: start-up, not host work.
    assert causes["startup"] > 0.99
    assert causes["host_overhead"] < 0.01
    [once] = [f for f in d.findings if f.id == "warm-up"]
    assert once.saves == "once"
    assert "JIT compile in forward 297" in once.evidence
    assert "keep shapes static or warm up each shape" in once.fix
    # No bound over the compile: what remains is a few small kernels and their launches.
    assert all(f.max_speedup < 5 for f in d.findings)
    # The replay keeps the compile as measured under every fix (a host cut halves host
    # work, not a compile): no what-if moves the step by more than its few kernels.
    path = d.critical_path
    assert path is not None
    assert path.what_if
    assert all(r.step_s > 0.99 * path.measured_step_s for r in path.what_if)
    assert any(n.startswith("one-off start-up: ") for n in path.notes)


def test_a_long_silent_stretch_before_an_eager_kernel_is_not_a_compile(tmp_path: Path) -> None:
    # The same shape with the framework's own kernel through the runtime's launch: nothing
    # says code was built or loaded, so the host's stretch stays host work.
    b = torchscript_first_forward()
    for e in b.events:
        if e["name"] in (FUSED, "cuLaunchKernel"):
            e["name"] = {"cuLaunchKernel": "cudaLaunchKernel"}.get(e["name"], "elementwise_kernel")
    d = checked(b.write(tmp_path / "t.json"))
    assert d.breakdown.idle_causes["startup"] == 0.0
    assert d.breakdown.idle_causes["host_overhead"] > 0.9


def library_first_call(repeats: bool) -> TraceBuilder:
    """An op whose first call holds cuBLAS's start-up: a cudaFree, CUPTI's module-loading
    record (on its own thread, as CUPTI writes it), then a long host stretch before its
    kernel; with `repeats`, later calls as short as usual."""
    b = TraceBuilder()
    b.cpu_op("aten::mm", 0.0, 80_000.0)
    b.runtime("cudaFree", 3_000.0, 30.0)
    b.host("Runtime Triggered Module Loading", 5_000.0, 250.0, cat="overhead", tid=0)
    b.kernel("ampere_sgemm_128x64_nn", 79_990.0, 7.0, launch_at=79_980.0)
    host = 80_100.0
    for _ in range(3 if repeats else 0):
        b.cpu_op("aten::mm", host, 40.0)
        b.kernel("ampere_sgemm_128x64_nn", host + 30.0, 20.0, launch_at=host + 20.0)
        host += 60.0
    b.cpu_op("aten::add", host, 40.0)
    b.kernel("elementwise_kernel", host + 30.0, 20.0, launch_at=host + 20.0)
    return b


@pytest.mark.parametrize("repeats", [False, True])
def test_library_start_up_is_one_off_whether_or_not_its_op_repeats(
    tmp_path: Path, repeats: bool
) -> None:
    d = checked(library_first_call(repeats).write(tmp_path / "t.json"))
    [once] = [f for f in d.findings if f.id == "warm-up"]
    assert once.share > 0.95
    assert all(f.max_speedup < 5 for f in d.findings)
    if repeats:
        # Its later calls are short: the whole-trace start-up trim sets the first aside.
        assert "the first aten::mm took" in once.evidence
        return
    assert d.breakdown.idle_causes["startup"] > 0.95
    assert "library start-up in aten::mm 80" in once.evidence
    assert "(cudaFree, module loading)" in once.evidence
    assert d.verdict.reason.startswith("the window holds almost only one-off start-up")


def test_the_h100_first_run_is_library_start_up_never_a_600x_bound() -> None:
    # Judged by hand (tests/data/h100/README.md): aten::mm holds 84 ms of cuBLAS start-up
    # around a 7 µs kernel, aten::conv2d 450 ms of cuDNN's; every other op's first call
    # loads its kernel's code (CUPTI's "Lazy Function Loading"). Before: "host overhead 97%
    # ... 663.86x by replay".
    d = checked(H100 / "first_run_startup.json.gz")
    assert d.breakdown.idle_causes["startup"] > 0.99
    assert d.verdict.reason.startswith("the window holds almost only one-off start-up")
    assert all(f.max_speedup < 2 for f in d.findings)
    path = d.critical_path
    assert path is not None
    # Replayed with the start-up as measured: halving the host's work saves only the
    # recurring host time around the few kernels (it saved 664x when start-up was host work),
    # and the speed-ups are over that recurring time.
    host = next(r for r in path.what_if if r.change == "host:2")
    assert host.step_s > 0.99 * path.measured_step_s
    assert host.speedup > path.measured_step_s / host.step_s + 0.01  # over the recurring time
    assert all(f.replay_speedup is None or f.replay_speedup < 2 for f in d.findings)
    [once] = [f for f in d.findings if f.id == "warm-up"]
    assert (once.saves, once.max_speedup) == ("once", 1.0)
    assert "library start-up in aten::conv2d 449.92 ms (cudaFree" in once.evidence
    assert "aten::matmul 84.47 ms (cudaFree, cudaMalloc, module loading)" in once.evidence


def code_built_per_shape(calls: int, *, same_kernel: bool = True) -> TraceBuilder:
    """A decode loop whose attention builds its kernel for each new sequence length (cuDNN's
    SDPA on an H100, as the project's Hugging Face capture shows): every call of
    `aten::_cudnn_attention_forward` spends 50 ms on the host, CUPTI records a lazy function
    load inside it, then one 5 µs runtime-generated kernel; a short matmul after it. With
    `same_kernel` False each call loads a kernel of its own (first launches, as a GEMM's
    first shapes each load a new cuBLAS kernel)."""
    b = TraceBuilder()
    t = 0.0
    for _ in range(calls):
        b.cpu_op("aten::_cudnn_attention_forward", t, 50_000.0)
        b.host("Lazy Function Loading", t + 49_900.0, 45.0, cat="overhead", tid=0)
        b.kernel(
            "cudnn_generated_fort_native_sdpa_sm80_flash_fprop"
            + ("" if same_kernel else f"_{int(t)}"),
            t + 49_990.0,
            5.0,
            launch_at=t + 49_960.0,
        )
        b.cpu_op("aten::mm", t + 50_010.0, 40.0)
        b.kernel("ampere_sgemm_128x64_nn", t + 50_040.0, 20.0, launch_at=t + 50_030.0)
        t += 50_100.0
    return b


def test_code_built_for_every_new_shape_recurs_and_is_not_start_up(tmp_path: Path) -> None:
    """Start-up happens once per library or kernel: an op that loads code call after call
    builds it per shape, which recurs while shapes change. Only its first call is a one-off;
    the rest is the host's recurring time, named with the fix (static shapes)."""
    d = checked(code_built_per_shape(6).write(tmp_path / "t.json"))
    assert d.breakdown.idle_causes["startup"] < 0.25  # the first of six calls
    assert d.breakdown.idle_causes["host_overhead"] > 0.7
    host = next(f for f in d.findings if f.id in ("launch-bound", "host-work"))
    assert "aten::_cudnn_attention_forward in 6 calls" in host.evidence
    assert "building code for each new shape" in host.evidence
    assert host.fix.startswith("keep shapes static where code is built per shape")
    # Twice is still start-up (a first call, and a first call at one more shape).
    d2 = checked(code_built_per_shape(2).write(tmp_path / "t2.json"))
    assert d2.breakdown.idle_causes["startup"] > 0.9
    # The same op loading a different kernel at each of its first calls (a GEMM whose shapes
    # each take a new cuBLAS kernel, loaded lazily) is start-up in each: each kernel loads once.
    d3 = checked(code_built_per_shape(6, same_kernel=False).write(tmp_path / "t3.json"))
    assert d3.breakdown.idle_causes["startup"] > 0.9


def test_the_analysis_keeps_no_merged_copy_of_several_kinds(tmp_path: Path) -> None:
    """A copy of several kinds' rows (the host ops with the runtime calls) is the caller's
    alone: kept on the trace, each such copy would hold a large trace's memory for the whole
    analysis (190 MB of a 1 GB trace's for one of them)."""
    trace = load_trace(training_trace(4).write(tmp_path / "t.json"))
    diagnose(trace)
    kept = [key for key in trace._kind_cache if len(key) > 1]
    assert kept == []
    # The single-kind views are views: they share the table's memory.
    assert trace.of_kind(Kind.CPU_OP).ts.base is not None
