"""Findings: built traces for each situation, with the verdict and the top finding asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_roofline import A100, MM_DIMS, op_with_kernel

from tracegen import TraceBuilder, training_trace
from wallfinder import Options, Thresholds, analyze
from wallfinder.analysis import MemoryThresholds, TimeThresholds
from wallfinder.api import analyze_marked
from wallfinder.report._format import tensor_core_fix
from wallfinder.units import short_kernel

GEMM = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32"


def test_a_starved_gpu_gets_the_data_loading_fix_first(tmp_path: Path) -> None:
    # Each step: 1000 µs in the DataLoader, then 2 kernels of 150 µs (period 1320 µs).
    d = analyze(training_trace(5, loader_us=1000.0).write(tmp_path / "t.json"))
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "data_loading")
    top = d.findings[0]
    assert top.id == "data-loading"
    assert top.share == pytest.approx(1000 / 1320, abs=1e-3)
    # Without the 1000 µs wait a 1320 µs step takes 320 µs: 1320 / 320 = 4.125x.
    assert top.max_speedup == pytest.approx(4.125, rel=1e-6)
    assert "num_workers" in top.fix


def sync_in_loop(steps: int = 4) -> TraceBuilder:
    """Each 300 µs step: a 100 µs kernel, the host blocked in cudaStreamSynchronize until it
    ends (.item()), then 150 µs of Python before the next launch."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 300.0
        b.step(s + 1, t0, 300.0)
        b.kernel(GEMM, t0 + 10.0, 100.0, launch_at=t0 + 2.0)
        b.cpu_op("aten::item", t0 + 8.0, 104.0)
        b.sync(t0 + 9.0, 102.0)
        b.kernel(GEMM, t0 + 270.0, 25.0, launch_at=t0 + 262.0)
    return b


def test_sync_in_the_loop_is_found_with_its_calls(tmp_path: Path) -> None:
    d = analyze(sync_in_loop().write(tmp_path / "t.json"))
    assert d.verdict.wall == "overhead"
    assert d.verdict.cause == "synchronization"
    top = d.findings[0]
    assert top.id == "sync-in-step"
    assert "cudaStreamSynchronize ×1/step" in top.evidence
    assert ".item()" in top.fix
    assert top.share == pytest.approx(d.breakdown.idle_causes["synchronization"])


def test_sync_in_the_loop_names_every_call_the_idle_attribution_counts(tmp_path: Path) -> None:
    # The host blocks in a synchronous cudaMemcpy (a blocking copy, no .item()): the idle it
    # causes is synchronisation, and the finding names the call behind it (one table of
    # synchronising calls for both).
    b = TraceBuilder()
    for s in range(4):
        t0 = s * 300.0
        b.step(s + 1, t0, 300.0)
        b.kernel(GEMM, t0 + 10.0, 100.0, launch_at=t0 + 2.0)
        b.sync(t0 + 9.0, 102.0, name="cudaMemcpy")
        b.kernel(GEMM, t0 + 270.0, 25.0, launch_at=t0 + 262.0)
    d = analyze(b.write(tmp_path / "t.json"))
    top = d.findings[0]
    assert top.id == "sync-in-step"
    assert "cudaMemcpy ×1/step" in top.evidence


def test_tiny_kernels_make_the_step_launch_bound(tmp_path: Path) -> None:
    # 40 kernels of 3 µs, each launched by a 12 µs op: the GPU mostly waits for the host.
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 600.0
        b.step(s + 1, t0, 600.0)
        for k in range(40):
            t = t0 + 5.0 + 14.0 * k
            b.cpu_op("aten::add", t, 12.0)
            b.kernel("vectorized_elementwise_kernel", t + 11.0, 3.0, launch_at=t + 9.0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert d.verdict.wall == "overhead"
    launch = next(f for f in d.findings if f.id == "launch-bound")
    assert d.findings[0] is launch
    assert "40 kernels per step, 100% of them under 10 µs" in launch.evidence


def test_few_launches_with_long_host_work_between_them_is_host_work(tmp_path: Path) -> None:
    # Two 100 µs kernels per 2 ms step, the host 1.5 ms in its own range between them: the
    # GPU waits on the host's work, which fewer launches would not shorten.
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 2000.0
        b.step(s + 1, t0, 2000.0)
        b.kernel(GEMM, t0 + 10.0, 100.0, launch_at=t0 + 2.0)
        b.annotation("prepare_batch", t0 + 120.0, 1500.0)
        b.cpu_op("aten::add", t0 + 1700.0, 20.0)
        b.kernel(GEMM, t0 + 1730.0, 100.0, launch_at=t0 + 1720.0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "host_overhead")
    top = d.findings[0]
    assert top.id == "host-work"
    assert "2 kernels per step" in top.evidence
    assert "the host was in prepare_batch 1.50 ms/step" in top.evidence
    assert "torch.compile" in top.fix
    assert "would not help" in top.fix
    assert not any(f.id == "launch-bound" for f in d.findings)


def test_exposed_nccl_is_found(tmp_path: Path) -> None:
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 500.0
        b.step(s + 1, t0, 500.0)
        b.kernel(GEMM, t0 + 5.0, 200.0, launch_at=t0)
        b.nccl(t0 + 210.0, 280.0, launch_at=t0 + 100.0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "comm_exposed")
    assert d.findings[0].id == "exposed-comm"
    assert d.findings[0].share == pytest.approx(d.breakdown.comm_exposed)


def test_fp32_matmuls_get_a_bound_from_the_devices_peaks(tmp_path: Path) -> None:
    d = analyze(_fp32_gemm_trace(A100).write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "fp32-matmul")
    assert f.wall == "compute"
    # A100: tf32 156 TFLOP/s over fp32 19.5 → 8x; the matmuls are ~95% of the step.
    assert "speed up 8x" in f.evidence
    assert f.max_speedup == pytest.approx(1 / (1 - f.share + f.share / 8), rel=1e-3)


def _fp32_gemm_trace(device: str) -> TraceBuilder:
    """Three steps of one fp32 matmul on a SIMT (no tensor core) kernel."""
    b = TraceBuilder(device_name=device)
    for s in range(3):
        t0 = s * 2100.0
        b.step(s + 1, t0, 2100.0)
        op_with_kernel(
            b,
            "aten::mm",
            MM_DIMS,
            ["float", "float"],
            t0,
            "volta_sgemm_128x64_nn",
            t0 + 10.0,
            2000.0,
        )
    return b


_ENABLE_TF32 = ("allow_tf32", "set_float32_matmul_precision")
_BF16 = ("bfloat16", "bf16 autocast")


@pytest.mark.parametrize(
    ("device", "advice", "not_advised"),
    [
        # Volta has fp16 tensor cores only: no TF32, no bf16.
        ("Tesla V100-SXM2-16GB", ("fp16", "GradScaler"), (*_ENABLE_TF32, *_BF16)),
        # Turing likewise.
        ("Tesla T4", ("fp16", "GradScaler"), (*_ENABLE_TF32, *_BF16)),
        # CDNA2 matrix cores have bf16 but no xf32.
        ("AMD Instinct MI250X", ("bf16",), _ENABLE_TF32),
        ("NVIDIA A100-SXM4-80GB", ("allow_tf32", "bf16"), ()),
        # Tensor cores whose rates the vendor does not publish: no dtype is claimed.
        ("NVIDIA GB10", ("autocast",), (*_ENABLE_TF32, *_BF16, "GradScaler")),
    ],
)
def test_fp32_matmul_advice_follows_the_devices_peaks(
    tmp_path: Path, device: str, advice: tuple[str, ...], not_advised: tuple[str, ...]
) -> None:
    """Enabling TF32 is advice only for a device with TF32 peaks; without them, the fix is the
    autocast dtype the device has (fp16 with a GradScaler on Volta/Turing)."""
    d = analyze(_fp32_gemm_trace(device).write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "fp32-matmul")
    note = tensor_core_fix(d)
    for text in (f.fix, note):
        assert all(w in text for w in advice), text
        assert not any(w in text for w in not_advised), text


def test_fp32_matmul_bound_on_volta_is_its_fp16_tensor_core_ratio(tmp_path: Path) -> None:
    d = analyze(_fp32_gemm_trace("Tesla V100-SXM2-16GB").write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "fp32-matmul")
    # V100 SXM2: fp16 tensor cores 125 TFLOP/s over fp32 15.7 → 8x.
    assert "speed up 8x" in f.evidence


def test_findings_for_the_verdicts_wall_come_first(tmp_path: Path) -> None:
    d = analyze(training_trace(5, loader_us=1000.0).write(tmp_path / "t.json"))
    walls = [f.wall == d.verdict.wall for f in d.findings]
    assert walls == sorted(walls, reverse=True)
    mine = [f.max_speedup for f in d.findings if f.wall == d.verdict.wall]
    assert mine == sorted(mine, reverse=True)


def test_a_busy_gpu_has_no_overhead_findings(tmp_path: Path) -> None:
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.kernel(GEMM, t0 + 1.0, 998.0, launch_at=t0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert d.verdict.wall == "compute"
    assert [f for f in d.findings if f.wall == "overhead"] == []


def test_hand_written_attention_is_found(tmp_path: Path) -> None:
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.cpu_op("aten::bmm", t0 + 1.0, 5.0)
        b.kernel(GEMM, t0 + 10.0, 200.0, launch_at=t0 + 2.0)
        b.cpu_op("aten::_softmax", t0 + 8.0, 5.0)
        b.kernel("void cunn_SoftMaxForward<4, float>", t0 + 210.0, 300.0, launch_at=t0 + 9.0)
        b.cpu_op("aten::bmm", t0 + 14.0, 5.0)
        b.kernel(GEMM, t0 + 510.0, 200.0, launch_at=t0 + 15.0)
    d = analyze(b.write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "unfused-attention")
    assert "1 bmm → softmax → bmm sequences per step" in f.evidence
    # The softmax kernels' 300 µs over the mean step (the first window ends at its last kernel).
    assert f.share == pytest.approx(0.300 / d.breakdown.per_step_ms["step"])
    assert "scaled_dot_product_attention" in f.fix


def test_repeated_casts_are_found_with_their_ops(tmp_path: Path) -> None:
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        for k in range(4):
            b.cpu_op("aten::to", t0 + 5.0 + k * 10, 5.0)
            b.kernel(
                "void at::native::direct_copy_kernel_cuda",
                t0 + 10.0 + k * 200,
                150.0,
                launch_at=t0 + 6.0 + k * 10,
            )
    d = analyze(b.write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "repeated-casts")
    assert "aten::to ×4/step" in f.evidence
    assert f.share == pytest.approx(0.600 / d.breakdown.per_step_ms["step"])


def test_an_optimizer_step_with_many_small_kernels_is_found(tmp_path: Path) -> None:
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 2000.0
        b.step(s + 1, t0, 2000.0)
        b.kernel(GEMM, t0 + 5.0, 500.0, launch_at=t0)
        b.annotation("Optimizer.step#AdamW.step", t0 + 600.0, 1200.0)
        for k in range(100):
            t = t0 + 605.0 + k * 11.0
            b.kernel("multi_tensor_apply_kernel", t + 6.0, 4.0, launch_at=t)
    d = analyze(b.write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "slow-optimizer")
    assert "100 kernels per step" in f.evidence
    assert "fused=True" in f.fix


def test_warm_up_steps_are_a_one_off_cost(tmp_path: Path) -> None:
    # The first step takes 3000 µs (compilation, autotuning), the next four 300 µs each.
    b = TraceBuilder()
    t0 = 0.0
    for s, length in enumerate([3000.0, 300.0, 300.0, 300.0, 300.0]):
        b.step(s + 1, t0, length)
        b.kernel(GEMM, t0 + 5.0, length - 10.0, launch_at=t0 + 1.0)
        t0 += length
    d = analyze(b.write(tmp_path / "t.json"))
    assert [x.step for x in d.steps.dropped] == ["step 1"]
    f = next(x for x in d.findings if x.id == "warm-up")
    assert "one-off" in f.evidence
    # 2700 µs extra over a profiled window of 3000 + 4 × 300 µs.
    assert f.share == pytest.approx(2700 / 4200, rel=0.01)


def test_kernels_with_fewer_blocks_than_sms_are_found(tmp_path: Path) -> None:
    # On an A100 (108 SMs), 100 µs kernels of 27 blocks: at most 3/4 of their time is saved.
    b = TraceBuilder(device_name=A100)
    for s in range(3):
        t0 = s * 500.0
        b.step(s + 1, t0, 500.0)
        b.kernel("small_kernel", t0 + 5.0, 100.0, launch_at=t0)
        b.events[-1]["args"]["grid"] = [27, 1, 1]
        b.kernel("big_kernel", t0 + 110.0, 385.0, launch_at=t0 + 1.0)
        b.events[-1]["args"]["grid"] = [432, 1, 1]
    d = analyze(b.write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "tiny-grids")
    assert "1 kernels per step" in f.evidence
    assert "108 SMs" in f.evidence
    assert f.share == pytest.approx(0.075 / d.breakdown.per_step_ms["step"])


def test_small_grids_never_claim_more_than_the_compute_nor_count_collectives(
    tmp_path: Path,
) -> None:
    # Per 500 µs step on an A100: two 200 µs kernels of 1 block side by side on two streams
    # (200 µs of compute), and a 250 µs collective on 2 blocks (its channels, by design).
    b = TraceBuilder(device_name=A100)
    for s in range(3):
        t0 = s * 500.0
        b.step(s + 1, t0, 500.0)
        for stream in (7, 9):
            b.kernel("tiny_kernel", t0 + 5.0, 200.0, launch_at=t0, stream=stream)
            b.events[-1]["args"]["grid"] = [1, 1, 1]
        b.nccl(t0 + 240.0, 250.0, launch_at=t0 + 2.0)
        b.events[-1]["args"]["grid"] = [2, 1, 1]
    d = analyze(b.write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "tiny-grids")
    assert "2 kernels per step" in f.evidence  # not the collective
    assert f.share == pytest.approx(d.breakdown.compute)
    assert f.share < 0.45


def test_small_kernels_are_named_once_each_by_their_short_names(tmp_path: Path) -> None:
    # Two instantiations of one template read alike: the evidence names it once, then the next.
    b = TraceBuilder(device_name=A100)
    for s in range(3):
        t0 = s * 500.0
        b.step(s + 1, t0, 500.0)
        for k, name in enumerate(("void fill<1>(int)", "void fill<2>(int)", "void pad<4>(int)")):
            b.kernel(name, t0 + 5.0 + 40.0 * k, 30.0, launch_at=t0 + k)
            b.events[-1]["args"]["grid"] = [4, 1, 1]
    d = analyze(b.write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "tiny-grids")
    assert "e.g. fill, pad (the bound" in f.evidence


def test_memory_near_capacity_is_found_without_a_time_share(tmp_path: Path) -> None:
    b = model_trace_with_memory(reserved_gib=78.0)
    d = analyze(b.write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "memory-peak")
    assert (f.share, f.max_speedup) == (0.0, 1.0)
    assert "78.0 GiB" in f.evidence
    low = analyze(model_trace_with_memory(reserved_gib=20.0).write(tmp_path / "low.json"))
    assert all(x.id != "memory-peak" for x in low.findings)


def model_trace_with_memory(reserved_gib: float) -> TraceBuilder:
    b = TraceBuilder(device_name=A100)
    b.step(1, 0.0, 1000.0)
    b.kernel(GEMM, 5.0, 900.0, launch_at=0.0)
    b.events.append(
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": b.pid,
            "tid": b.tid,
            "ts": 10.0,
            "args": {
                "Device Type": 1,
                "Device Id": 0,
                "Addr": 1,
                "Bytes": 1 << 20,
                "Total Allocated": int(reserved_gib * 0.9 * 2**30),
                "Total Reserved": int(reserved_gib * 2**30),
            },
        }
    )
    return b


def test_idle_time_waiting_on_a_dependency_gets_its_own_finding(tmp_path: Path) -> None:
    # The second kernel was launched 400 µs before the GPU went idle: it waited on something.
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.kernel(GEMM, t0 + 5.0, 495.0, launch_at=t0)
        b.kernel(GEMM, t0 + 800.0, 195.0, launch_at=t0 + 100.0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "dependency_wait")
    assert d.findings[0].id == "dependency-wait"
    assert d.findings[0].share == pytest.approx(d.breakdown.idle_causes["dependency_wait"])
    # The kernel that ends each wait, its idle time and how long it sat launched (from its
    # launch call's return at 104 µs to its start at 800 µs).
    assert (
        f"the waits end at {short_kernel(GEMM)} 0.30 ms/step, launched a median 0.70 ms "
        "before it started" in d.findings[0].evidence
    )


def test_the_work_that_ends_dependency_waits_is_named_for_all_the_wait_the_share_counts(
    tmp_path: Path,
) -> None:
    # Each 1000 µs step: a GEMM on the GPU 20-100 µs, then an elementwise kernel whose launch
    # call ran 40-70 µs (it began 60 µs before the GPU went idle, so its work was queued) and
    # which starts only at 600 µs. The breakdown counts all of 100-600 µs as dependency wait;
    # the evidence names that kernel for all of it (0.50 ms/step), not for the part past its
    # launch call's return (0.48 ms/step: a second count of the same wait that disagreed).
    b = TraceBuilder()
    elementwise = "vectorized_elementwise_kernel"
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.kernel(GEMM, t0 + 20.0, 80.0, launch_at=t0 + 5.0)
        b.kernel(elementwise, t0 + 600.0, 300.0, launch_at=t0 + 40.0, launch_dur=30.0)
    d = analyze(b.write(tmp_path / "t.json"))
    wait = next(f for f in d.findings if f.id == "dependency-wait")
    per_step = d.breakdown.idle_causes["dependency_wait"] * d.breakdown.per_step_ms["step"]
    assert per_step == pytest.approx(0.50, abs=0.005)
    assert f"the waits end at {elementwise} {per_step:.2f} ms/step" in wait.evidence


def test_kernel_names_read_short_in_sentences() -> None:
    assert short_kernel("void at::native::reduce_kernel<512, 1>(at::native::ReduceOp<float>)") == (
        "at::native::reduce_kernel"
    )
    assert short_kernel("void (anonymous namespace)::softmax_warp_forward<float>(float*)") == (
        "softmax_warp_forward"
    )
    assert short_kernel("Memset (Device)") == "Memset (Device)"
    assert short_kernel("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD (Device -> Device)"
    # A return type other than void is no part of the name (it read "std::enable_if").
    enable_if = (
        "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
        "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long)"
    )
    assert short_kernel(enable_if) == "vllm::fused_add_rms_norm_kernel"
    assert short_kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*)") == (
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"
    )
    assert short_kernel("Cijk_" + "x" * 80) == "Cijk_" + "x" * 54 + "…"


def test_two_steps_are_too_few_to_call_step_time_unstable(tmp_path: Path) -> None:
    b = TraceBuilder()
    t0 = 0.0
    for s, length in enumerate([300.0, 600.0]):
        b.step(s + 1, t0, length)
        b.kernel(GEMM, t0 + 2.0, length - 4.0, launch_at=t0)
        t0 += length
    d = analyze(b.write(tmp_path / "t.json"))
    assert d.verdict.questions[0].answer == "unknown"
    assert d.verdict.cause != "unstable"
    assert all(f.id != "unstable-steps" for f in d.findings)


def steps_of(lengths_us: list[float]) -> TraceBuilder:
    """Back-to-back steps of the given lengths, each one busy kernel."""
    b = TraceBuilder()
    t0 = 0.0
    for s, length in enumerate(lengths_us):
        b.step(s + 1, t0, length)
        b.kernel(GEMM, t0 + 2.0, length - 4.0, launch_at=t0)
        t0 += length
    return b


def test_unstable_steps_are_bounded_by_what_the_slow_steps_cost(tmp_path: Path) -> None:
    # Step windows end where their kernel ends (2 µs before the next step): 998 µs, then
    # 1000 µs, one of 1600 µs. Median 1000 µs: the slow step costs 600 µs of the 7598 µs.
    d = analyze(
        steps_of([1000.0, 1000.0, 1000.0, 1000.0, 1000.0, 1600.0, 1000.0]).write(
            tmp_path / "t.json"
        )
    )
    assert not d.steps.stable
    [f] = [f for f in d.findings if f.id == "unstable-steps"]
    assert f.share == pytest.approx(600 / 7598)
    # At the median the 7598 µs take 6998 µs: 7598 / 6998 = 1.0857x.
    assert f.max_speedup == pytest.approx(1.085739, rel=1e-6)


def test_steps_faster_than_the_median_claim_no_gain(tmp_path: Path) -> None:
    # Unstable because two steps ran fast: running every step at the median would make the
    # job slower, so no instability finding claims a gain (never a bound under 1x).
    d = analyze(
        steps_of([1000.0, 1000.0, 1000.0, 400.0, 1000.0, 400.0, 1000.0]).write(tmp_path / "t.json")
    )
    assert not d.steps.stable
    assert all(f.id != "unstable-steps" for f in d.findings)
    assert all(f.max_speedup >= 1.0 for f in d.findings)


def loader_steps(waits_us: list[float], kernel_us: float = 500.0) -> TraceBuilder:
    """Steps that wait `waits_us[i]` for the DataLoader, then run one GEMM launched at once."""
    b = TraceBuilder()
    t0 = 0.0
    for s, wait in enumerate(waits_us):
        length = wait + kernel_us + 10.0
        b.step(s + 1, t0, length)
        b.dataloader(t0, wait)
        b.kernel(GEMM, t0 + wait + 5.0, kernel_us, launch_at=t0 + wait)
        t0 += length
    return b


def test_slow_steps_that_wait_longer_for_data_keep_data_loading_the_wall(tmp_path: Path) -> None:
    # A loader that cannot keep up: every third step waits 2 ms instead of 0.6 ms.
    waits = [600.0, 600.0, 2000.0] * 3
    d = analyze(loader_steps(waits).write(tmp_path / "t.json"))
    assert not d.steps.stable
    assert d.verdict.questions[0].answer == "no"
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "data_loading")
    assert "step time is unstable" in d.verdict.reason
    assert "grew mostly in idle: data loading" in d.verdict.reason
    assert d.findings[0].id == "data-loading"


def test_an_unstable_busy_job_keeps_the_wall_of_its_typical_step(tmp_path: Path) -> None:
    # GEMM-busy steps; one step ran far faster than the rest (a smaller last batch): the job
    # is compute-bound, and no step is "slow".
    d = analyze(steps_of([1000.0] * 6 + [300.0]).write(tmp_path / "t.json"))
    assert not d.steps.stable
    assert d.verdict.wall == "compute"
    assert "with no step much slower than the median" in d.verdict.reason
    assert all(f.id != "unstable-steps" for f in d.findings)


def test_slow_steps_that_cost_more_than_anything_else_head_the_verdict(tmp_path: Path) -> None:
    # GEMM-busy steps of 1 ms; two of eight stall 3 ms with the GPU idle and nothing in the
    # trace to say why: the stalls cost more than any other loss.
    b = TraceBuilder()
    t0 = 0.0
    for s in range(8):
        stall = 3000.0 if s in (3, 6) else 0.0
        b.step(s + 1, t0, 1000.0 + stall)
        b.kernel(GEMM, t0 + stall + 2.0, 996.0, launch_at=t0 + stall)
        t0 += 1000.0 + stall
    d = analyze(b.write(tmp_path / "t.json"))
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "unstable")
    top = d.findings[0]
    assert top.id == "unstable-steps"
    assert top.share == pytest.approx(6000 / 14000, abs=1e-3)
    assert "more than any other loss" in d.verdict.reason


def test_a_busy_gpu_in_pointwise_chains_is_bandwidth_bound_with_fusion_first(
    tmp_path: Path,
) -> None:
    # Each 1000 µs step: three back-to-back pointwise kernels of 320 µs on one stream.
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        for k, name in enumerate(("add_kernel", "mul_kernel", "relu_kernel")):
            b.kernel(
                f"void at::native::vectorized_elementwise_kernel<{name}>",
                t0 + 20.0 + k * 320,
                320.0,
                launch_at=t0 + k,
            )
    d = analyze(b.write(tmp_path / "t.json"))
    assert (d.verdict.wall, d.verdict.cause) == ("bandwidth", "elementwise")
    top = d.findings[0]
    assert top.id == "fusable-pointwise"
    assert top.wall == "bandwidth"
    # Without shapes the bound comes from kernel times: all but the longest kernel's time.
    assert top.share == pytest.approx(0.640 / d.breakdown.per_step_ms["step"], rel=1e-3)


def test_a_dataloader_wait_after_a_drained_sync_is_data_loading(tmp_path: Path) -> None:
    # Regression (found checking a real ResNet trace by hand): the step ends in .item(), the
    # GPU drains, then the host spends 500 µs in a multi-process DataLoader. The wait is data
    # loading; only the host time outside the DataLoader belongs to the synchronisation.
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.kernel(GEMM, t0 + 10.0, 300.0, launch_at=t0 + 2.0)
        b.sync(t0 + 5.0, 306.0)
        b.host(
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
            t0 + 320.0,
            500.0,
            cat="user_annotation",
        )
        b.kernel(GEMM, t0 + 850.0, 140.0, launch_at=t0 + 840.0)
    d = analyze(b.write(tmp_path / "t.json"))
    causes = d.breakdown.idle_causes
    assert causes["data_loading"] > causes["synchronization"]
    step_ms = d.breakdown.per_step_ms["step"]
    assert causes["data_loading"] * step_ms == pytest.approx(0.5, rel=0.05)
    top = d.findings[0]
    assert top.id == "data-loading"
    assert "already uses worker processes" in top.fix


def test_sync_findings_name_the_users_call_site_when_stacks_are_recorded(
    tmp_path: Path,
) -> None:
    b = sync_in_loop()
    for s in range(4):
        t0 = s * 300.0
        b.host("train.py(42): train_step", t0 + 1.0, 250.0, cat="python_function")
        b.host("torch/_tensor.py(100): item", t0 + 7.0, 106.0, cat="python_function")
        b.host("contextlib.py(132): __enter__", t0 + 7.5, 105.0, cat="python_function")
    d = analyze(b.write(tmp_path / "t.json"))
    top = d.findings[0]
    assert top.id == "sync-in-step"
    assert "called from train.py(42): train_step" in top.evidence
    assert "torch/_tensor.py" not in top.evidence
    assert "contextlib" not in top.evidence


def test_compute_bound_matmuls_below_their_roof_are_found(tmp_path: Path) -> None:
    # The roofline test's mm runs at ~44% of the A100's bf16 roof.
    from test_roofline import model_trace

    d = analyze(model_trace().write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "matmul-below-roof")
    assert f.wall == "compute"
    assert "aten::mm [[4096,4096],[4096,4096]] bf16 at 44% of roof" in f.evidence
    roof = next(o for o in d.roofline.ops if o.name == "aten::mm") if d.roofline else None
    assert roof is not None
    assert roof.pct_of_roof is not None
    saved = roof.time_s * (1 - roof.pct_of_roof) / d.steps.count
    assert f.share == pytest.approx(saved / (d.breakdown.per_step_ms["step"] / 1e3))


@pytest.mark.parametrize(
    ("device", "types", "precisions"),
    [
        ("NVIDIA A100-SXM4-80GB", ["c10::BFloat16"] * 2, "(bf16)"),  # Ampere has no fp8
        ("NVIDIA H100 80GB HBM3", ["c10::BFloat16"] * 2, "(bf16, fp8 with _scaled_mm)"),
        ("Tesla V100-SXM2-16GB", ["c10::Half"] * 2, "(fp16 with a GradScaler)"),
    ],
)
def test_matmul_below_roof_names_only_precisions_the_device_has(
    tmp_path: Path, device: str, types: list[str], precisions: str
) -> None:
    b = TraceBuilder(device_name=device)
    for s in range(3):
        t0 = s * 2100.0
        b.step(s + 1, t0, 2100.0)
        # 2 * 4096^3 FLOP in 2 ms: 69 TFLOP/s, below 60% of each device's roof.
        op_with_kernel(b, "aten::mm", MM_DIMS, types, t0, "sm80_xmma_gemm", t0 + 10.0, 2000.0)
    d = analyze(b.write(tmp_path / "t.json"))
    f = next(x for x in d.findings if x.id == "matmul-below-roof")
    assert f"use the lowest precision that trains {precisions}," in f.fix


def test_near_peak_moves_the_matmul_below_roof_finding_with_the_verdict(tmp_path: Path) -> None:
    # The mm runs at ~44% of its roof: below the default 60%, above 40%. The finding and the
    # verdict's fourth question read the one threshold (the finding used to keep the default).
    from test_roofline import model_trace

    path = model_trace().write(tmp_path / "t.json")
    default = analyze(path)
    assert default.verdict.questions[3].answer == "no"
    assert "matmul-below-roof" in {f.id for f in default.findings}
    lowered = analyze(path, Options(thresholds=Thresholds(near_peak=0.4)))
    assert lowered.verdict.questions[3].answer == "yes"
    assert "matmul-below-roof" not in {f.id for f in lowered.findings}


def collective_on_the_host(steps: int = 4) -> TraceBuilder:
    """Each 400 µs step: a 100 µs kernel, then the host inside an all_reduce (c10d's op with
    the ops the profiler records inside it) for 200 µs, then the next kernel's launch."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 400.0
        b.step(s + 1, t0, 400.0)
        b.cpu_op("aten::mm", t0, 8.0)
        b.kernel(GEMM, t0 + 10.0, 100.0, launch_at=t0 + 2.0)
        b.cpu_op("c10d::allreduce_", t0 + 120.0, 200.0)
        b.cpu_op("record_param_comms", t0 + 121.0, 198.0)
        b.annotation("nccl:all_reduce", t0 + 122.0, 196.0)
        b.cpu_op("aten::add", t0 + 330.0, 8.0)
        b.kernel("vectorized_elementwise_kernel", t0 + 340.0, 50.0, launch_at=t0 + 332.0)
    return b


def test_a_host_blocked_in_a_collective_gets_its_finding(tmp_path: Path) -> None:
    d = analyze(collective_on_the_host().write(tmp_path / "t.json"))
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "communication_wait")
    top = d.findings[0]
    assert top.id == "host-collective-wait"
    assert top.share == pytest.approx(d.breakdown.idle_causes["communication_wait"])
    # 200 µs in each of 4 steps, whose windows take 1590 µs: the first from its CPU start (0)
    # to its last kernel's end (390 µs), each later one 400 µs on from there.
    assert top.share == pytest.approx(800 / 1590, rel=1e-6)
    # Not blocked, the host could queue only the step's 150 µs of kernels meanwhile: 600 µs
    # of the 1590 can come off, 1590 / 990 = 1.6061x (not the 2.0127x of the whole wait).
    assert top.reach == pytest.approx(d.breakdown.compute)
    assert top.reach == pytest.approx(600 / 1590, rel=1e-6)
    assert top.max_speedup == pytest.approx(1590 / 990, rel=1e-6)
    assert "all the work that could run while the host waits" in top.evidence
    # The collective the program called, not the ops recorded inside it.
    assert "inside a collective: c10d::allreduce_ ×1/step" in top.evidence
    assert "record_param_comms" not in top.evidence
    assert "async_op=True" in top.fix


def test_a_collective_wait_under_min_share_is_not_reported(tmp_path: Path) -> None:
    path = collective_on_the_host().write(tmp_path / "t.json")
    high = Thresholds(time=TimeThresholds(min_share=0.9))
    assert all(
        f.id != "host-collective-wait" for f in analyze(path, Options(thresholds=high)).findings
    )


def test_memory_peak_reads_the_memory_thresholds(tmp_path: Path) -> None:
    path = model_trace_with_memory(reserved_gib=78.0).write(tmp_path / "t.json")  # 97.5%
    full = Thresholds(memory=MemoryThresholds(near_capacity=0.99))
    assert all(f.id != "memory-peak" for f in analyze(path, Options(thresholds=full)).findings)


def graph_replays(steps: int = 4) -> TraceBuilder:
    """Each 1000 µs step: 400 µs of host work, one `cudaGraphLaunch`, then the 20 kernels of
    25 µs it replays (all correlated to that launch)."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.cpu_op("aten::index_select", t0, 400.0)
        graph = b.new_id()
        b.runtime("cudaGraphLaunch", t0 + 405.0, 20.0, correlation=graph)
        for k in range(20):
            b.kernel(GEMM, t0 + 430.0 + 25.0 * k, 25.0, args={"correlation": graph})
    return b


def test_work_replayed_from_a_cuda_graph_is_never_told_to_use_cuda_graphs(
    tmp_path: Path,
) -> None:
    d = analyze(graph_replays().write(tmp_path / "t.json"))
    assert d.breakdown.graph_replayed == pytest.approx(1.0)
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "host_overhead")
    top = d.findings[0]
    assert top.id == "launch-bound"
    assert "100% of kernel time is already replayed from CUDA/HIP graphs" in top.evidence
    assert "CUDA graphs" not in top.fix
    assert "between graph replays" in top.fix


def test_kernels_launched_one_by_one_are_not_graph_replays(tmp_path: Path) -> None:
    d = analyze(training_trace(4).write(tmp_path / "t.json"))
    assert d.breakdown.graph_replayed == 0.0


def test_a_verdict_on_one_window_without_launch_records_says_its_evidence_is_thin(
    tmp_path: Path,
) -> None:
    b = TraceBuilder(device_name=None)
    b.kernel(GEMM, 10.0, 500.0)  # no step marker, no launch record, no device name
    b.kernel(GEMM, 600.0, 300.0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert d.verdict.confidence == "low"
    thin = " | ".join(d.verdict.thin_evidence)
    assert "1 steady-state step:" in thin
    assert "no launch records" in thin
    assert "unknown device" in thin


def test_a_verdict_on_several_steps_of_a_known_device_has_no_thin_evidence(
    tmp_path: Path,
) -> None:
    d = analyze(training_trace(5).write(tmp_path / "t.json"))
    assert d.verdict.thin_evidence == []
    assert d.verdict.confidence == "high"


def test_a_gpu_job_whose_kernels_were_not_recorded_says_it_is_the_cpu_side_only(
    tmp_path: Path,
) -> None:
    b = TraceBuilder()
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.cpu_op("aten::mm", t0 + 10.0, 600.0)
        b.runtime("cudaLaunchKernel", t0 + 20.0, 5.0, correlation=b.new_id())
    d = analyze(b.write(tmp_path / "t.json"))
    assert d.device.kind == "cpu"
    assert d.verdict.confidence == "low"
    assert any("no kernel was recorded" in t for t in d.verdict.thin_evidence)


def test_one_stalled_step_does_not_take_the_wall_from_a_busy_bandwidth_bound_job(
    tmp_path: Path,
) -> None:
    # Memory-bound kernels keep the GPU busy; one step of eight stalls 1.5 ms for nothing the
    # trace shows. The stall is a finding and a note, the wall stays bandwidth.
    add = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>()"
    b = TraceBuilder()
    t0 = 0.0
    for s in range(8):
        stall = 1500.0 if s == 4 else 0.0
        b.step(s + 1, t0, 1000.0 + stall)
        b.kernel(add, t0 + stall + 2.0, 996.0, launch_at=t0 + stall)
        t0 += 1000.0 + stall
    d = analyze(b.write(tmp_path / "t.json"))
    assert not d.steps.stable
    assert d.verdict.wall == "bandwidth"
    assert "step time is unstable" in d.verdict.reason
    assert any(f.id == "unstable-steps" for f in d.findings)


def churn(steps: int, markers: bool = True) -> TraceBuilder:
    """Each 1000 µs of work: a GEMM, and a 200 µs cudaMalloc and cudaFree on the host before
    it; with `markers`, each a ProfilerStep."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 1000.0
        if markers:
            b.step(s + 1, t0, 1000.0)
        b.runtime("cudaMalloc", t0 + 10.0, 100.0, correlation=b.new_id())
        b.runtime("cudaFree", t0 + 120.0, 100.0, correlation=b.new_id())
        b.kernel(GEMM, t0 + 240.0, 700.0, launch_at=t0 + 230.0)
    return b


def test_allocations_in_every_step_are_churn(tmp_path: Path) -> None:
    d = analyze(churn(4).write(tmp_path / "t.json"))
    [f] = [f for f in d.findings if f.id == "allocator-churn"]
    assert "cudaMalloc ×1/step" in f.evidence


def test_allocations_in_one_window_are_not_called_churn(tmp_path: Path) -> None:
    # Without steps, first allocations cannot be told from allocations every step.
    d = analyze(churn(4, markers=False).write(tmp_path / "t.json"))
    assert d.steps.count == 1
    assert all(f.id != "allocator-churn" for f in d.findings)


def first_launches_load_code(
    rounds: int = 4, *, slow_round: int = 0, slow_us: float = 3000.0
) -> TraceBuilder:
    """No markers: `rounds` rounds of five 200 µs GEMM kernels of five names, the host
    launching each 10 µs after the last (4 µs calls) and the GPU running them back to back.
    In round `slow_round` every launch call takes `slow_us`: in the first round, the first
    launch of each kernel loading its code; in a later one, the host stalling in the runtime.
    Each slow call leaves the GPU idle."""
    b = TraceBuilder()
    host = gpu_free = 0.0
    for r in range(rounds):
        for j in range(5):
            call = slow_us if r == slow_round else 4.0
            start = max(host + call + 5.0, gpu_free)
            b.kernel(f"{GEMM}_{j}", start, 200.0, launch_at=host, launch_dur=call)
            gpu_free = start + 200.0
            host += call + 6.0
    return b


def test_slow_first_launches_are_start_up_not_launch_latency(tmp_path: Path) -> None:
    d = analyze(first_launches_load_code().write(tmp_path / "t.json"))
    d.self_check()
    assert d.steps.count == 1  # 15 ms of slow launches: below the whole-trace start-up trim
    causes = d.breakdown.idle_causes
    # The GPU's wait for the five code loads is start-up; nothing is left as launch latency.
    step_ms = d.breakdown.per_step_ms["step"]
    # Idle from the first call to its kernel (3.005 ms), then from each kernel's end to the
    # next (3.005 − 0.2 + 0.001 ms, four times).
    assert causes["startup"] * step_ms == pytest.approx(3.005 + 4 * 2.806, rel=1e-3)
    assert causes["launch_latency"] < 0.01
    # The steady state, without the one-off, is the GEMMs back to back: the compute wall.
    assert d.verdict.wall == "compute"
    assert "without its one-off start-up" in d.verdict.questions[1].detail
    assert d.verdict.questions[1].value == pytest.approx(
        d.breakdown.compute / (1 - causes["startup"])
    )
    assert all(f.id != "launch-bound" for f in d.findings)
    [once] = [f for f in d.findings if f.id == "warm-up"]
    assert (once.saves, once.max_speedup) == ("once", 1.0)
    assert once.share == pytest.approx(causes["startup"], rel=1e-6)
    assert "5 first launch(es) of a kernel loading its code" in once.evidence


def test_slow_later_launches_are_not_start_up(tmp_path: Path) -> None:
    # The same calls, slow in the third round instead of the first: a host stalling in the
    # runtime, which can recur. It stays in the steady state and the step is overhead-bound.
    d = analyze(first_launches_load_code(slow_round=2).write(tmp_path / "t.json"))
    d.self_check()
    assert d.breakdown.idle_causes["startup"] == 0.0
    assert d.verdict.wall == "overhead"
    assert d.verdict.questions[1].value == pytest.approx(d.breakdown.compute)
    assert all(f.id != "warm-up" for f in d.findings)


def test_the_first_launch_factor_is_a_threshold(tmp_path: Path) -> None:
    path = first_launches_load_code().write(tmp_path / "t.json")
    never = Thresholds(time=TimeThresholds(first_launch_factor=1e6))
    d = analyze(path, Options(thresholds=never))
    assert d.breakdown.idle_causes["startup"] == 0.0
    assert d.verdict.wall == "overhead"


def test_launch_bound_share_is_of_the_step_without_its_start_up(tmp_path: Path) -> None:
    # Code loading in the first round, then rounds whose launches come 300 µs apart: the GPU
    # waits for the host in every round, and the bound is over the recurring time.
    b = first_launches_load_code(rounds=2)
    host = 16_500.0  # the GPU ends the first two rounds at 16.2 ms
    for j in range(5):
        b.cpu_op("aten::mm", host, 300.0)
        b.kernel(f"{GEMM}_{j}", host + 305.0, 200.0, launch_at=host + 296.0)
        host += 500.0
    d = analyze(b.write(tmp_path / "t.json"))
    d.self_check()
    causes = d.breakdown.idle_causes
    assert causes["startup"] > 0.5
    [launch] = [f for f in d.findings if f.id == "launch-bound"]
    recurring = causes["host_overhead"] + causes["launch_latency"]
    assert launch.share == pytest.approx(recurring / (1 - causes["startup"]))
    # The window runs from the first launch (0) to the last kernel's end (16.5 ms + 4 × 500 µs
    # + 505 µs = 19005 µs), 14229 µs of it start-up (3005 + 4 × 2806 µs, as in the test above):
    # 4776 µs recur. The GPU waits for the host 305 µs before the first new kernel (the host
    # starts at 16.5 ms, the kernel at 16.805 ms) and 300 µs before each of the other four:
    # 1505 µs, a share of 1505 / 4776; without it, 4776 / 3271 = 1.4601x.
    assert launch.share == pytest.approx(1505 / 4776, rel=1e-6)
    assert launch.max_speedup == pytest.approx(1.460104, rel=1e-6)
    assert "start-up, a one-off cost left out of this share" in launch.evidence


def test_exposed_comm_bound_is_what_the_compute_beside_it_can_hide(tmp_path: Path) -> None:
    # Each 500 µs step: 200 µs of GEMM, then a 280 µs all-reduce with nothing beside it.
    # Hidden, the all-reduce can only run beside those 200 µs: at most 200 µs of its 280
    # can come off the step (40%: 1.67x, not the 2.27x of its whole 56%).
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 500.0
        b.step(s + 1, t0, 500.0)
        b.kernel(GEMM, t0 + 5.0, 200.0, launch_at=t0)
        b.nccl(t0 + 210.0, 280.0, launch_at=t0 + 100.0)
    d = analyze(b.write(tmp_path / "t.json"))
    d.self_check()
    top = d.findings[0]
    assert top.id == "exposed-comm"
    assert top.share == pytest.approx(d.breakdown.comm_exposed)
    assert d.breakdown.comm_hidden == 0.0
    assert top.reach == pytest.approx(d.breakdown.compute)
    # Amdahl's law over the reach, written out (not the code's own amdahl()).
    assert top.max_speedup == pytest.approx(1 / (1 - top.reach), rel=1e-6)
    assert top.max_speedup < 1 / (1 - top.share) - 0.4
    assert "hiding it behind compute can save at most 0.20 ms per step" in top.evidence
    assert "the other 0.08 ms must come off the collectives themselves" in top.evidence
    assert "compression" in top.fix
    # Exposed communication is the wall's cause: the default what-if table replays `overlap`,
    # no faster than the bound, and the finding says what that replay gives.
    assert d.critical_path is not None
    row = next(r for r in d.critical_path.what_if if r.change == "overlap")
    assert row.speedup <= top.max_speedup + 1e-9
    assert f"the `overlap` what-if replays {row.speedup:.2f}x" in top.evidence


def test_communication_already_beside_compute_cannot_hide_behind_it_again(
    tmp_path: Path,
) -> None:
    # Each 1000 µs step: 400 µs of GEMM and a 600 µs all-reduce that overlaps its last 100 µs.
    # 500 µs are exposed, but only the 300 µs of compute no collective runs beside yet can
    # take more of it.
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.kernel(GEMM, t0 + 5.0, 400.0, launch_at=t0 + 1.0)
        b.nccl(t0 + 305.0, 600.0, launch_at=t0 + 2.0)
    d = analyze(b.write(tmp_path / "t.json"))
    d.self_check()
    b = d.breakdown
    # (Shares of the mean step: the first step's window is shorter.)
    assert b.comm_hidden == pytest.approx(b.compute * 100 / 400)
    assert b.comm_exposed == pytest.approx(b.compute * 500 / 400)
    f = next(x for x in d.findings if x.id == "exposed-comm")
    assert f.reach == pytest.approx(b.compute * 300 / 400)
    assert f.max_speedup == pytest.approx(1 / (1 - f.reach))


def cpu_step_with_gloo_beside(steps: int = 3) -> TraceBuilder:
    """A CPU-only trace. Each 1000 µs step on the main thread: a 200 µs aten::mm, then
    nothing recorded while gloo:all_reduce runs 600 µs on another thread of the process (its
    last 50 µs beside a 100 µs aten::mm), and a 60 µs gloo:all_reduce of another process."""
    b = TraceBuilder(device_name=None)
    for s in range(steps):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.cpu_op("aten::mm", t0 + 10.0, 200.0)
        b.annotation("gloo:all_reduce", t0 + 300.0, 600.0, tid=77)
        b.cpu_op("aten::mm", t0 + 850.0, 100.0)
        other = b.host("gloo:all_reduce", t0 + 920.0, 60.0, cat="user_annotation", tid=78)
        other["pid"] = 999
    return b


def test_a_cpu_step_waiting_for_gloo_on_another_thread_is_communication(
    tmp_path: Path,
) -> None:
    d = analyze(cpu_step_with_gloo_beside().write(tmp_path / "t.json"))
    d.self_check()
    b = d.breakdown
    assert b.basis == "cpu"
    # 550 µs of the all-reduce has no op of the main thread beside it; 50 µs is hidden; the
    # other process's collective is no wait of this one.
    assert b.comm_exposed == pytest.approx(0.55, abs=1e-3)
    assert b.comm_hidden == pytest.approx(0.05, abs=1e-3)
    assert b.compute == pytest.approx(0.30, abs=1e-3)
    assert b.idle_causes["other"] == pytest.approx(0.15, abs=1e-3)
    assert d.cpu is not None
    assert d.cpu.waiting_on_collectives == pytest.approx(0.55, abs=1e-3)
    assert d.cpu.ops == pytest.approx(0.30, abs=1e-3)
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "comm_exposed")
    top = d.findings[0]
    assert top.id == "exposed-comm"
    assert "gloo:all_reduce ×1/step on 1 thread other than the step's" in top.evidence
    # Hidden, it could run beside the 250 µs of compute no collective runs beside yet.
    assert top.reach == pytest.approx(0.25, abs=1e-3)
    assert top.max_speedup == pytest.approx(1 / 0.75, rel=1e-3)


def test_a_cpu_step_with_nothing_to_hide_gloo_behind_says_so(tmp_path: Path) -> None:
    # Each 1000 µs step: gloo runs 900 µs on another thread, the main thread records nothing.
    b = TraceBuilder(device_name=None)
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.cpu_op("aten::empty", t0 + 2.0, 3.0)
        b.annotation("gloo:all_reduce", t0 + 50.0, 900.0, tid=77)
    d = analyze(b.write(tmp_path / "t.json"))
    d.self_check()
    assert d.verdict.cause == "comm_exposed"
    top = d.findings[0]
    assert top.id == "exposed-comm"
    assert top.max_speedup == 1.0
    assert "hiding it behind compute can save nothing" in top.evidence
    assert top.fix.startswith("make the collectives cheaper")


DDP_FORWARD = "DistributedDataParallel.forward"


def ddp_accumulation(*, no_sync: bool, steps: int = 4, queued: bool = False) -> TraceBuilder:
    """DDP with gradient accumulation: each 2000 µs step runs two micro-steps (a forward
    range `DistributedDataParallel.forward` with a 100 µs GEMM, a 200 µs backward GEMM) and
    one optimizer step (1300-1400 µs). The gradients' 150 µs all-reduce runs after each
    micro-step's backward (410-560 and 1110-1260 µs) with nothing beside it; with `no_sync`,
    only after the last one (the first micro-step ran under `model.no_sync()`).

    `queued`: the same work with the device setting the step. Each 1000 µs step, the host
    launches it all in its first 45 µs (micro-steps' forwards at 0 and 20 µs, the optimizer
    step at 40 µs) and blocks in a sync until the device drains (45-971 µs), then 29 µs of
    host work. On the device, one after the other: GEMMs 20-120 and 120-320, the all-reduce
    320-470 (it waits for the backward GEMM), the next micro-step's GEMMs 470-570 and 570-770
    (DDP's stream waits for the all-reduce), the last all-reduce 770-920 and the optimizer's
    kernel 920-970; with `no_sync`, the second micro-step starts at 320 and the step is
    850 µs."""
    if queued:
        return _ddp_accumulation_queued(no_sync=no_sync, steps=steps)
    b = TraceBuilder(rank=0, world_size=2)
    for s in range(steps):
        t0 = s * 2000.0
        b.step(s + 1, t0, 2000.0)
        for micro, at in enumerate((t0, t0 + 700.0)):
            b.annotation(DDP_FORWARD, at, 150.0)
            b.kernel(GEMM, at + 20.0, 100.0, launch_at=at + 10.0)
            b.kernel(GEMM, at + 200.0, 200.0, launch_at=at + 190.0)
            if micro == 1 or not no_sync:
                b.nccl(at + 410.0, 150.0, launch_at=at + 405.0)
        b.annotation("Optimizer.step#SGD.step", t0 + 1300.0, 100.0)
        b.kernel("vectorized_elementwise_kernel", t0 + 1310.0, 50.0, launch_at=t0 + 1305.0)
    return b


def _ddp_accumulation_queued(*, no_sync: bool, steps: int) -> TraceBuilder:
    b = TraceBuilder(rank=0, world_size=2)
    period = 850.0 if no_sync else 1000.0
    for s in range(steps):
        t0 = s * period
        b.step(s + 1, t0, period)
        device = t0 + 20.0  # where the device's next op starts
        for micro, at in enumerate((t0, t0 + 20.0)):
            b.annotation(DDP_FORWARD, at, 12.0)
            b.kernel(GEMM, device, 100.0, launch_at=at + 1.0, launch_dur=1.0)
            b.kernel(GEMM, device + 100.0, 200.0, launch_at=at + 6.0, launch_dur=1.0)
            device += 300.0
            if micro == 1 or not no_sync:
                # Launched from the backward, after the forward range has ended (an
                # all-reduce inside the forward would be tensor parallel's).
                b.nccl(device, 150.0, launch_at=at + 13.0)
                device += 150.0
        b.annotation("Optimizer.step#SGD.step", t0 + 40.0, 10.0)
        b.kernel("vectorized_elementwise_kernel", device, 50.0, launch_at=t0 + 41.0, launch_dur=1.0)
        b.sync(t0 + 45.0, device + 51.0 - (t0 + 45.0))
        b.cpu_op("optimizer_host_work", device + 51.0, t0 + period - (device + 51.0))
    return b


def test_gradients_all_reduced_at_every_micro_step_are_found(tmp_path: Path) -> None:
    d, marks = analyze_marked(ddp_accumulation(no_sync=False).write(tmp_path / "t.json"))
    found = next(f for f in d.findings if f.id == "grad-sync-per-micro-step")
    # The first micro-step's all-reduce, 150 µs of each step with no compute beside it, is
    # what no_sync() removes (the steps' mean is 1840 µs: the windows tile the GPU's
    # timeline, and the first ends with its last kernel, at 1360 µs).
    assert d.breakdown.per_step_ms["step"] == pytest.approx(1.84)
    assert found.share == pytest.approx(0.150 / 1.84)
    assert found.max_speedup == pytest.approx(1.84 / (1.84 - 0.150))
    assert "2 micro-steps per optimizer step" in found.evidence
    assert "no_sync()" in found.fix
    # Replayed without those all-reduces (`accum`), the step is as long: the host paces it
    # (it launches the second micro-step's GEMM at 710 µs, after the all-reduce ended at 560).
    assert found.gain_basis == "replay"
    assert found.replay_speedup == pytest.approx(1.0)
    # Its evidence on the timeline: the all-reduce of each step's first micro-step.
    mine = [m for m in marks.marks if m.track == "finding: grad-sync-per-micro-step"]
    starts = [m.ts_us - marks.marks[0].ts_us for m in mine]
    assert starts == pytest.approx([s * 2000.0 + 410.0 for s in range(4)])


def test_the_per_micro_step_sync_gains_what_the_replay_without_it_gives(tmp_path: Path) -> None:
    d = analyze(ddp_accumulation(no_sync=False, queued=True).write(tmp_path / "t.json"))
    d.self_check()  # (among them: no what-if row gains more than the finding for its fix)
    found = next(f for f in d.findings if f.id == "grad-sync-per-micro-step")
    # The windows tile the device's timeline: three 1000 µs steps and the last ending with its
    # optimizer kernel at 970 µs, a mean of 992.5 µs. Without the first micro-step's all-reduce
    # (320-470 µs) the second micro-step starts at 320: each step 150 µs shorter (850 µs, the
    # last 820), a mean of 842.5 µs.
    path = d.critical_path
    assert path is not None
    assert path.measured_step_s == pytest.approx(992.5e-6)
    accum = next(r for r in path.what_if if r.change == "accum")
    assert accum.step_s == pytest.approx(842.5e-6)
    assert found.gain_basis == "replay"
    assert found.replay_speedup == pytest.approx(992.5 / 842.5)
    # Within its bound: the all-reduce's 150 µs have no compute beside them.
    assert found.replay_speedup <= found.max_speedup
    assert found.max_speedup == pytest.approx(992.5 / (992.5 - 150.0))
    # The replay is what the same work under no_sync() measures.
    fixed = analyze(ddp_accumulation(no_sync=True, queued=True).write(tmp_path / "n.json"))
    assert fixed.critical_path is not None
    assert fixed.critical_path.measured_step_s == pytest.approx(accum.step_s)


def test_gradient_accumulation_under_no_sync_is_not_flagged(tmp_path: Path) -> None:
    d = analyze(ddp_accumulation(no_sync=True).write(tmp_path / "t.json"))
    assert all(f.id != "grad-sync-per-micro-step" for f in d.findings)
    # The one all-reduce per optimizer step is still exposed communication.
    assert any(f.id == "exposed-comm" for f in d.findings)
