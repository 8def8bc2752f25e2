"""Roofline, MFU, fusion candidates and the calculator, on traces whose numbers are known."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracegen import TraceBuilder
from wallfinder import ModelFlops, Options, analyze
from wallfinder.analysis.roofline import enclosing_of
from wallfinder.cli import main
from wallfinder.cost import op_cost
from wallfinder.hardware import get_spec
from wallfinder.trace import NONE
from wallfinder.trace.args import read_op_args

A100 = "NVIDIA A100-SXM4-80GB"
N = 4096
MM_DIMS = [[N, N], [N, N]]
BF16 = ["c10::BFloat16", "c10::BFloat16"]
GEMM_KERNEL = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1"
ADD_KERNEL = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>()"


def op_with_kernel(
    b: TraceBuilder,
    op: str,
    dims: list[Any],
    types: list[str],
    start: float,
    kernel: str,
    kernel_start: float,
    kernel_us: float,
) -> None:
    """A CPU op with shapes, and the kernel it launches (joined by External id)."""
    event = b.host(op, start, 5.0, args={"Input Dims": dims, "Input type": types})
    b.kernel(kernel, kernel_start, kernel_us, launch_at=start + 1.0)
    b.events[-1]["args"]["External id"] = event["args"]["External id"]


def model_trace(steps: int = 3, *, device: str | None = A100, elementwise: int = 1) -> TraceBuilder:
    """Each 1500 µs step: an mm (1000 µs kernel) then `elementwise` adds (100 µs each)."""
    b = TraceBuilder(device_name=device)
    for s in range(steps):
        t0 = s * 1500.0
        b.step(s + 1, t0, 1500.0)
        op_with_kernel(b, "aten::mm", MM_DIMS, BF16, t0 + 10, GEMM_KERNEL, t0 + 20, 1000.0)
        t = t0 + 1030.0
        for _ in range(elementwise):
            op_with_kernel(b, "aten::add", MM_DIMS, BF16, t - 8, ADD_KERNEL, t, 100.0)
            t += 100.0
    return b


def test_roofline_places_ops_by_their_cost_and_the_device_roofs(tmp_path: Path) -> None:
    d = analyze(model_trace().write(tmp_path / "t.json"))
    spec = get_spec("a100-sxm4-80gb")
    assert d.device.matched_spec == spec.name
    r = d.roofline
    assert r is not None
    mm = next(o for o in r.ops if o.name == "aten::mm")
    flops = 2.0 * N**3
    nbytes = 3.0 * N * N * 2
    assert mm.calls == 3
    assert mm.flops == pytest.approx(3 * flops)
    assert mm.bytes == pytest.approx(3 * nbytes)
    assert mm.time_s == pytest.approx(3 * 1000e-6)
    assert mm.ai == pytest.approx(flops / nbytes)
    assert mm.bound == "compute"
    peak = spec.peak("bf16")
    assert peak is not None
    assert mm.achieved_flops == pytest.approx(flops / 1000e-6)
    assert mm.pct_of_roof == pytest.approx((flops / peak) / 1000e-6)
    add = next(o for o in r.ops if o.name == "aten::add")
    args = read_op_args(json.dumps(MM_DIMS).encode(), json.dumps(BF16).encode())
    cost = op_cost("aten::add", args)
    assert cost is not None
    assert add.bound == "bandwidth"
    assert add.pct_of_roof == pytest.approx((cost.bytes / spec.mem_bandwidth) / 100e-6)
    # Busy time: 1000 µs compute-bound, 100 µs bandwidth-bound per step.
    assert r.compute_bound_share == pytest.approx(1000 / 1100)
    assert r.bandwidth_bound_share == pytest.approx(100 / 1100)
    assert r.costed_share == pytest.approx(1.0)
    assert r.ridge["bf16"] == pytest.approx(peak / spec.mem_bandwidth)


def test_kernel_rows_carry_their_ops_cost(tmp_path: Path) -> None:
    d = analyze(model_trace().write(tmp_path / "t.json"))
    gemm = next(k for k in d.kernels if k.name == GEMM_KERNEL)
    assert gemm.flops == pytest.approx(3 * 2.0 * N**3)
    assert gemm.bound == "compute"
    assert gemm.bound_basis == "cost model"
    assert gemm.pct_of_roof is not None
    assert 0.0 < gemm.pct_of_roof <= 1.0


def test_mfu_counts_the_traces_matmul_flops_over_step_time(tmp_path: Path) -> None:
    d = analyze(model_trace().write(tmp_path / "t.json"))
    peak = get_spec("a100-sxm4-80gb").peak("bf16")
    assert peak is not None
    step = d.steps.mean_s
    assert d.mfu.flops_per_step == pytest.approx(2.0 * N**3)
    assert d.mfu.value == pytest.approx(2.0 * N**3 / step / peak)
    assert d.mfu.dtype == "bf16"
    assert "counted from the trace" in d.mfu.basis


def test_mfu_from_the_users_model_description(tmp_path: Path) -> None:
    path = model_trace().write(tmp_path / "t.json")
    d = analyze(path, Options(model=ModelFlops(params=1e9, tokens_per_step=1000)))
    assert d.mfu.flops_per_step == pytest.approx(6e12)
    assert "6·N·T" in d.mfu.basis
    d2 = analyze(path, Options(model=ModelFlops(flops_per_step=5e12)))
    assert d2.mfu.flops_per_step == 5e12


def test_an_a800_trace_gets_a_roofline(tmp_path: Path) -> None:
    """The A800 (A100 silicon, slower NVLink) is a known device: its ops get a roof."""
    d = analyze(model_trace(device="NVIDIA A800-SXM4-80GB").write(tmp_path / "t.json"))
    spec = get_spec("a800-sxm4-80gb")
    assert d.device.matched_spec == spec.name
    assert d.roofline is not None
    mm = next(o for o in d.roofline.ops if o.name == "aten::mm")
    peak = spec.peak("bf16")
    assert peak is not None
    assert mm.pct_of_roof == pytest.approx((2.0 * N**3 / peak) / 1000e-6)
    assert d.mfu.value is not None
    assert not any("unknown device" in w for w in d.warnings)


def test_unknown_device_leaves_roof_figures_null_and_says_so(tmp_path: Path) -> None:
    d = analyze(model_trace(device=None).write(tmp_path / "t.json"))
    assert d.device.matched_spec is None
    assert d.mfu.value is None
    assert d.roofline is not None
    assert all(o.pct_of_roof is None for o in d.roofline.ops)
    assert any("unknown device" in w for w in d.warnings)
    named = analyze(model_trace(device=None).write(tmp_path / "u.json"), Options(device="h100-sxm"))
    assert named.device.matched_spec == get_spec("h100-sxm").name
    assert named.mfu.value is not None


def test_fp32_matmul_on_simt_kernels_is_flagged_and_tensor_core_kernels_run_as_tf32(
    tmp_path: Path,
) -> None:
    fp32 = ["float", "float"]
    b = TraceBuilder(device_name=A100)
    b.step(1, 0.0, 3000.0)
    op_with_kernel(b, "aten::mm", MM_DIMS, fp32, 10, "volta_sgemm_128x64_nn", 20, 2000.0)
    d = analyze(b.write(tmp_path / "simt.json"))
    assert d.roofline is not None
    assert d.roofline.fp32_matmul_without_tensor_cores_share == pytest.approx(1.0)
    assert d.roofline.ops[0].dtype == "fp32"
    assert "without tensor cores" in d.verdict.questions[3].detail

    b = TraceBuilder(device_name=A100)
    b.step(1, 0.0, 3000.0)
    tc = "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4"
    op_with_kernel(b, "aten::mm", MM_DIMS, fp32, 10, tc, 20, 2000.0)
    d = analyze(b.write(tmp_path / "tf32.json"))
    assert d.roofline is not None
    assert d.roofline.fp32_matmul_without_tensor_cores_share == 0.0
    assert d.roofline.ops[0].dtype == "tf32"


def test_verdict_asks_whether_the_matmuls_are_near_peak(tmp_path: Path) -> None:
    # The mm runs at 44% of its roof: a compute wall below peak once the GPU is busy.
    b = model_trace()
    d = analyze(b.write(tmp_path / "t.json"), Options())
    q4 = d.verdict.questions[3]
    assert q4.value is not None
    assert q4.answer == "no"
    assert 0.4 < q4.value < 0.5


def test_repeated_runs_of_memory_bound_kernels_are_fusion_candidates(tmp_path: Path) -> None:
    d = analyze(model_trace(elementwise=3).write(tmp_path / "t.json"))
    assert len(d.fusion) == 1
    c = d.fusion[0]
    assert c.kernels == [ADD_KERNEL] * 3
    assert c.ops == ["aten::add"]
    assert c.occurrences_per_step == pytest.approx(1.0)
    assert c.time_s == pytest.approx(300e-6)
    # Fused, the run still moves its largest kernel's bytes: at most two thirds are saved.
    assert c.max_saving_s == pytest.approx(200e-6)
    assert c.bytes_unfused is not None
    assert c.bytes_fused_at_least is not None
    assert c.bytes_fused_at_least == pytest.approx(c.bytes_unfused / 3)


def test_a_single_memory_bound_kernel_is_no_fusion_candidate(tmp_path: Path) -> None:
    assert analyze(model_trace(elementwise=1).write(tmp_path / "t.json")).fusion == []


# The calculator ----------------------------------------------------------------------------


def roofline_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["roofline", *args, "--format", "json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_calculator_reproduces_the_ridges_of_the_design(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # DESIGN.md §1: A100 bf16 312 TFLOP/s / 2.039 TB/s ≈ 153; H100 SXM bf16 989 / 3.35 ≈ 295.
    a100 = roofline_json(capsys, "--device", "a100-sxm4-80gb", "--mnk", "4096,4096,4096")
    assert round(a100["ridge"]) == 153
    h100 = roofline_json(capsys, "--device", "h100-sxm", "--mnk", "4096,4096,4096")
    assert round(h100["ridge"]) == 295


def test_calculator_matmul_and_pointwise_ops(capsys: pytest.CaptureFixture[str]) -> None:
    mm = roofline_json(capsys, "--device", "a100-sxm4-80gb", "--mnk", "4096,4096,4096")
    assert mm["flops"] == 2 * 4096**3
    assert mm["bytes"] == 3 * 4096 * 4096 * 2
    assert mm["bound"] == "compute"
    assert mm["time_floor_s"] == pytest.approx(mm["flops"] / mm["peak_flops"])
    gelu = roofline_json(
        capsys, "--device", "a100-sxm4-80gb", "--op", "gelu", "--shape", "32,2048,4096"
    )
    assert gelu["bound"] == "bandwidth"
    assert gelu["bytes"] == 2 * 32 * 2048 * 4096 * 2
    assert gelu["time_floor_s"] == pytest.approx(gelu["bytes"] / gelu["mem_bandwidth"])
    given = roofline_json(
        capsys, "--device", "h100-sxm", "--flops", "1e12", "--bytes", "1e9", "--dtype", "fp16"
    )
    assert given["ai"] == pytest.approx(1000.0)
    assert given["bound"] == "compute"


def test_calculator_fusion_saves_the_intermediate_traffic(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = roofline_json(
        capsys, "--device", "a100-sxm4-80gb", "--fuse", "gelu,relu,neg", "--shape", "1024,1024"
    )
    size = 1024 * 1024 * 2
    assert out["bytes"] == 3 * 2 * size
    assert out["fused_bytes"] == 2 * size
    assert out["time_saved_s"] == pytest.approx(4 * size / out["mem_bandwidth"])


@pytest.mark.parametrize(
    "args",
    [
        ["--device", "a100-sxm4-80gb", "--mnk=-1,4,4"],
        ["--device", "a100-sxm4-80gb", "--mnk", "4,x,4"],
        ["--device", "a100-sxm4-80gb", "--op", "gelu", "--shape", "0,4"],
        ["--device", "no-such-gpu", "--mnk", "4,4,4"],
        ["--device", "a100-sxm4-80gb", "--mnk", "4,4,4", "--dtype", "fp4"],
        ["--device", "v100-sxm2-16gb", "--mnk", "4,4,4", "--dtype", "bf16"],
        ["--device", "a100-sxm4-80gb", "--flops", "1e9"],
        ["--device", "a100-sxm4-80gb", "--op", "no_such_op", "--shape", "4,4"],
        ["--mnk", "4,4,4"],
    ],
)
def test_calculator_rejects_impossible_input_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert main(["roofline", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wallfinder: error:")
    assert err.count("\n") == 1


def test_text_report_shows_the_roofline_and_mfu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(model_trace(elementwise=3).write(tmp_path / "t.json"))]) == 0
    out = capsys.readouterr().out
    assert "Top ops on the roofline" in out
    assert "aten::mm" in out
    assert "MFU " in out
    assert "Fusion candidates" in out


def test_op_times_are_right_when_the_kernels_start_long_after_the_trace(tmp_path: Path) -> None:
    # Regression: each op group's kernel union was computed on a shared time axis with the
    # groups shifted apart, but without subtracting the earliest kernel start; kernels that
    # began later than the kernels' span landed in another group's segment.
    b = model_trace(steps=2, elementwise=2)
    b.annotation("setup", -50_000.0, 10.0)  # the trace begins 50 ms before the first kernel
    d = analyze(b.write(tmp_path / "t.json"))
    assert d.roofline is not None
    times = {o.name: o.time_s for o in d.roofline.ops}
    assert times["aten::mm"] == pytest.approx(2 * 1000e-6)
    assert times["aten::add"] == pytest.approx(2 * 2 * 100e-6)


def test_cpu_only_trace_is_placed_on_the_cpu_profiles_roofline(tmp_path: Path) -> None:
    # 3 steps of 2000 µs; each runs a 1500 µs fp32 mm (2·N³ FLOPs for N = 512) on the CPU.
    n = 512
    b = TraceBuilder(device_name=None)
    for s in range(3):
        t0 = s * 2000.0
        b.step(s + 1, t0, 2000.0)
        b.host(
            "aten::mm",
            t0 + 100.0,
            1500.0,
            args={"Input Dims": [[n, n], [n, n]], "Input type": ["float", "float"]},
        )
    d = analyze(b.write(tmp_path / "t.json"))
    assert d.device.kind == "cpu"
    assert d.device.matched_spec is not None
    r = d.roofline
    assert r is not None
    mm = r.ops[0]
    assert (mm.name, mm.calls, mm.dtype) == ("aten::mm", 3, "fp32")
    assert mm.time_s == pytest.approx(3 * 1500e-6)
    assert d.mfu.flops_per_step == pytest.approx(2.0 * n**3)
    assert d.mfu.value == pytest.approx(2.0 * n**3 / 2000e-6 / d.device.peak_flops["fp32"])
    assert d.verdict.questions[3].answer in ("yes", "no")
    assert "nominal estimate" in (d.device.note or "")
    # The fourth answer says it was judged against an estimated peak, and how to measure it.
    assert "nominal estimate of the peak" in d.verdict.questions[3].detail
    assert "wallfinder calibrate" in d.verdict.questions[3].detail


SMALL = [[1024, 1024], [1024, 1024]]


def small_add_trace(device: str) -> TraceBuilder:
    """Each step: the 4096³ mm, then an add of two 1024² bf16 tensors (6 MiB, which fits in
    an A100's or H100's L2) that takes 2 µs: faster than memory's roof allows."""
    b = TraceBuilder(device_name=device)
    for s in range(3):
        t0 = s * 1500.0
        b.step(s + 1, t0, 1500.0)
        op_with_kernel(b, "aten::mm", MM_DIMS, BF16, t0 + 10, GEMM_KERNEL, t0 + 20, 1000.0)
        op_with_kernel(b, "aten::add", SMALL, BF16, t0 + 1022, ADD_KERNEL, t0 + 1030, 2.0)
    return b


def test_a_working_set_that_fits_in_l2_is_placed_against_the_l2_roof(tmp_path: Path) -> None:
    spec = get_spec("a100-sxm4-80gb")
    assert spec.l2_bytes is not None
    assert spec.l2_bandwidth == pytest.approx(5120 * 1.41e9, rel=1e-3)  # whitepaper B/clk
    d = analyze(small_add_trace(A100).write(tmp_path / "t.json"))
    r = d.roofline
    assert r is not None
    add = next(o for o in r.ops if o.name == "aten::add")
    mm = next(o for o in r.ops if o.name == "aten::mm")
    assert add.fits_l2 is True
    assert mm.fits_l2 is False  # 3·4096²·2 bytes: 96 MiB
    assert mm.pct_of_l2_roof is None
    per_call = 3 * 1024 * 1024 * 2
    assert add.pct_of_roof == 1.0  # memory's roof would need 3.1 µs: it is not the roof
    assert add.pct_of_l2_roof == pytest.approx(per_call / spec.l2_bandwidth / 2e-6)
    assert r.l2_bandwidth == spec.l2_bandwidth
    assert not r.l2_bandwidth_estimate
    assert r.l2_fit_share == pytest.approx(2 / 1002)
    assert r.l2_note is not None
    assert "fits in the 40 MiB L2" in r.l2_note
    assert "derived from the whitepaper" in r.l2_note
    d.self_check()


def test_without_an_l2_bandwidth_the_l2_roof_is_an_estimate_and_says_so(tmp_path: Path) -> None:
    spec = get_spec("h100-sxm")
    assert spec.l2_bandwidth is None
    assert spec.l2_bytes is not None
    d = analyze(small_add_trace("NVIDIA H100 80GB HBM3").write(tmp_path / "t.json"))
    r = d.roofline
    assert r is not None
    assert r.l2_bandwidth == pytest.approx(2 * spec.mem_bandwidth)
    assert r.l2_bandwidth_estimate
    assert r.l2_note is not None
    assert "estimate: twice the memory bandwidth" in r.l2_note


def test_a_kernel_the_counters_call_compute_bound_breaks_a_fusion_run(tmp_path: Path) -> None:
    """Three adds a step form a fusion run; the counters of one step's launches (in launch
    order: mm, add, add, add) call the middle add compute-bound, so no run of two is left."""
    trace = model_trace(elementwise=3).write(tmp_path / "t.json")
    rows = [["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]]
    for i, (name, sm, mem) in enumerate(
        [(GEMM_KERNEL, 90, 40), (ADD_KERNEL, 10, 85), (ADD_KERNEL, 85, 10), (ADD_KERNEL, 10, 85)]
    ):
        rows += [
            [str(i), name, "SOL", "Duration", "usecond", "100"],
            [str(i), name, "SOL", "Compute (SM) Throughput", "%", str(sm)],
            [str(i), name, "SOL", "Memory Throughput", "%", str(mem)],
        ]
    export = tmp_path / "kernels.csv"
    export.write_text("\n".join(",".join(f'"{v}"' for v in row) for row in rows) + "\n")
    assert len(analyze(trace).fusion) == 1
    d = analyze(trace, Options(counters=export))
    d.self_check()
    assert d.fusion == []
    assert d.roofline is not None
    assert d.roofline.by_counters == [
        "at::native::vectorized_elementwise_kernel: estimate bandwidth, counters compute "
        f"({100 / 1300:.1%} of kernel time)"
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 30)),
        min_size=1,
        max_size=25,
        unique_by=lambda e: e[1] * 3 + e[0],
    ),
    st.lists(st.tuples(st.integers(0, 3), st.integers(-2, 70)), min_size=1, max_size=10),
    st.randoms(use_true_random=False),
)
def test_enclosing_of_finds_the_latest_starting_event_around_each_time(
    events: list[tuple[int, int]], queries: list[tuple[int, int]], rnd: random.Random
) -> None:
    # Distinct starts per thread; lengths from the start, so nesting and siblings both occur.
    events = sorted(events, key=lambda e: e[1])
    thread = np.array([e[0] for e in events], np.int64)
    ts = np.array([e[1] for e in events], np.int64)
    end = ts + (ts * 7 + thread * 5) % 13
    q_thread = np.array([q[0] for q in queries], np.int64)
    q_t = np.array([q[1] for q in queries], np.int64)
    want = []
    for qt, t in queries:
        around = [i for i in range(ts.size) if thread[i] == qt and ts[i] <= t <= end[i]]
        want.append(max(around, key=lambda i: ts[i]) if around else NONE)
    # In start order (the rows of one kind) and in any other order: the same events.
    assert enclosing_of(thread, ts, end, q_thread, q_t).tolist() == want
    perm = list(range(ts.size))
    rnd.shuffle(perm)
    p = np.array(perm)
    got = enclosing_of(thread[p], ts[p], end[p], q_thread, q_t)
    assert [int(p[g]) if g >= 0 else NONE for g in got.tolist()] == want


def test_a_fused_chain_is_never_promised_faster_than_its_roofline_time(tmp_path: Path) -> None:
    # Three 4096x4096 bf16 adds a step, each moving 100.7 MB in 30 µs: faster than the A100's
    # 2.039 TB/s as the cost model counts their bytes (caches). At that rate the fused run
    # would move its largest add's bytes in 30 µs; at the roof they take 49.4 µs.
    b = TraceBuilder(device_name=A100)
    for s in range(3):
        t0 = s * 1500.0
        b.step(s + 1, t0, 1500.0)
        op_with_kernel(b, "aten::mm", MM_DIMS, BF16, t0 + 10, GEMM_KERNEL, t0 + 20, 1000.0)
        for k in range(3):
            t = t0 + 1030.0 + 30.0 * k
            op_with_kernel(b, "aten::add", MM_DIMS, BF16, t - 8, ADD_KERNEL, t, 30.0)
    d = analyze(b.write(tmp_path / "t.json"))
    d.self_check()
    [c] = d.fusion
    assert c.bytes_fused_at_least is not None
    assert d.device.mem_bandwidth
    roof = c.bytes_fused_at_least / d.device.mem_bandwidth
    assert roof == pytest.approx(3 * N * N * 2 / 2.039e12, rel=1e-3)
    assert c.time_s - c.max_saving_s == pytest.approx(roof)
    f = next(x for x in d.findings if x.id == "fusable-pointwise")
    assert f.share * d.breakdown.per_step_ms["step"] * 1e-3 == pytest.approx(c.max_saving_s)


def test_each_op_row_names_its_kernels_and_the_html_table_shows_them(tmp_path: Path) -> None:
    """The operators table (the report's, and `serve`'s Operators view) lists each op's
    kernels, by their time in it."""
    from wallfinder.report._format import short_kernel
    from wallfinder.report.html import render_html

    d = analyze(model_trace().write(tmp_path / "t.json"))
    assert d.roofline is not None
    mm = next(o for o in d.roofline.ops if o.name == "aten::mm")
    add = next(o for o in d.roofline.ops if o.name == "aten::add")
    assert mm.kernels == [GEMM_KERNEL]
    assert add.kernels == [ADD_KERNEL]
    html = render_html(d)
    assert f"kernels: {short_kernel(GEMM_KERNEL)}" in html
