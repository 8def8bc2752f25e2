"""LLM serving's levers as findings (issue 34), the per-token estimates, overlap recognised
as overlap, the model's layer sequence as iterations, and the four shared serving traces."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_serving import H100, KV_BYTES, B, generate_trace

from invariants import assert_diagnosis_invariants
from realtraces import real_trace
from tracegen import TraceBuilder, training_trace
from wallfinder import ModelFlops, Options, analyze
from wallfinder.diagnosis import Diagnosis
from wallfinder.report import render

DECODE = "execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk5000sqsq32sqsk5000)"
MIXED = (
    "execute_544_context_1(sq512sk512sqsq262144sqsk262144)_generation_32(sq32sk5000sqsq32sqsk5000)"
)


def _ids(d: Diagnosis) -> list[str]:
    return [f.id for f in d.findings]


def _engine_trace(path: Path, kinds: list[str], *, frame: str = "", gap: float = 50.0) -> Path:
    """vLLM iterations by their ranges: a decode's forward is 500 µs of kernels, a mixed
    one's 2 ms; `gap` µs of host work after each; `frame` a Python frame of the engine."""
    b = TraceBuilder()
    t = 0.0
    for kind in kinds:
        busy = 2000.0 if kind == "mixed" else 500.0
        b.annotation(MIXED if kind == "mixed" else DECODE, t, busy + 30.0)
        if frame:
            b.host(frame, t + 1.0, 5.0, cat="python_function")
        b.cpu_op("aten::mm", t + 5.0, 10.0)
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t + 20.0, busy, launch_at=t + 5.0)
        t += 20.0 + busy + gap
    return b.write(path)


def test_mixed_iterations_much_slower_than_decode_are_prefill_interference(
    tmp_path: Path,
) -> None:
    d = analyze(_engine_trace(tmp_path / "mixed.json", ["decode", "mixed"] * 4))
    assert_diagnosis_invariants(d)
    found = next(f for f in d.findings if f.id == "serving-prefill-interference")
    assert "chunked-prefill" in found.fix
    assert found.max_speedup > 1.0
    same = analyze(_engine_trace(tmp_path / "decode.json", ["decode"] * 8))
    assert "serving-prefill-interference" not in _ids(same)


def test_host_work_between_engine_iterations_is_host_bound(tmp_path: Path) -> None:
    frame = "vllm/v1/worker/gpu_model_runner.py(2000): execute_model"
    d = analyze(_engine_trace(tmp_path / "host.json", ["decode"] * 8, frame=frame, gap=600.0))
    s = d.serving
    assert s is not None
    assert s.engine == "vLLM"
    assert s.host_share > 0.4
    found = next(f for f in d.findings if f.id == "serving-host-bound")
    assert "--async-scheduling" in found.fix
    assert found.share == pytest.approx(s.host_share, rel=0.2)
    assert s.between_share == pytest.approx(s.host_share, rel=0.1)


def test_idle_between_one_forwards_launches_is_not_the_engines_loop(tmp_path: Path) -> None:
    """A forward pass whose launches leave the GPU idle (an eager forward held up by its host)
    is the launch path's: CUDA graphs, not the engine's scheduling. Only the idle between
    two forward passes is `serving-host-bound`'s."""
    b = TraceBuilder()
    t = 0.0
    frame = "vllm/v1/worker/gpu_model_runner.py(2000): execute_model"
    for _ in range(8):
        b.annotation(DECODE, t, 1000.0)
        b.host(frame, t + 1.0, 5.0, cat="python_function")
        b.cpu_op("aten::mm", t + 5.0, 10.0)
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t + 20.0, 200.0, launch_at=t + 5.0)
        # The host works 400 µs inside the forward before its second launch.
        b.cpu_op("aten::add", t + 220.0, 400.0)
        b.cpu_op("aten::mm", t + 620.0, 10.0)
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t + 635.0, 300.0, launch_at=t + 620.0)
        t += 940.0
    d = analyze(b.write(tmp_path / "inside.json"))
    s = d.serving
    assert s is not None
    assert s.host_share > 0.3
    assert s.between_share < 0.05
    host = [f for f in d.findings if f.id == "serving-host-bound"]
    assert not host or host[0].share < 0.05


def test_an_overlap_scheduler_is_said_as_overlap(tmp_path: Path) -> None:
    frame = "sglang/srt/managers/overlap_utils.py(130): resolve_future"
    d = analyze(_engine_trace(tmp_path / "sgl.json", ["decode"] * 4, frame=frame))
    s = d.serving
    assert s is not None
    assert "overlap scheduler" in s.overlap
    assert "overlapped" in render(d, "text")


def test_eager_generate_makes_small_batch_kv_dtype_and_eager_decode_findings(
    tmp_path: Path,
) -> None:
    d = analyze(generate_trace(tmp_path / "gen.json", 6, graph=False))
    s = d.serving
    assert s is not None
    assert s.decode is not None
    assert s.decode.kv_dtype == "bf16"
    ids = _ids(d)
    small = next(f for f in d.findings if f.id == "serving-small-batch")
    assert f"~{B} tokens each" in small.evidence
    assert "--max-num-seqs" in small.fix
    # Its KV cache is 11% of decode's bytes: too little to be worth fp8.
    assert s.decode.kv_bytes == KV_BYTES
    assert "serving-kv-dtype" not in ids
    assert "serving-eager-decode" in ids
    # Replayed from a graph, decode is not eager.
    graphed = analyze(generate_trace(tmp_path / "graph.json", 6, graph=True))
    assert "serving-eager-decode" not in _ids(graphed)


def test_a_bf16_kv_cache_that_is_a_third_of_decode_bytes_is_worth_fp8() -> None:
    d = analyze(H100 / "decode_loop.json.gz")
    s = d.serving
    assert s is not None
    assert s.decode is not None
    assert s.decode.kv_bytes is not None
    part = s.decode.kv_bytes / s.decode.bytes_per_iteration
    assert part > 0.2
    kv = next(f for f in d.findings if f.id == "serving-kv-dtype")
    assert f"KV cache is {part:.0%}" in kv.evidence
    assert ", bf16)" in kv.evidence
    assert "--kv-cache-dtype fp8" in kv.fix
    assert kv.max_speedup > 1.0


def test_ttft_and_tpot_are_estimated_from_the_iterations(tmp_path: Path) -> None:
    d = analyze(generate_trace(tmp_path / "gen.json", 6, graph=False))
    s = d.serving
    assert s is not None
    kinds = {k.kind: k for k in s.kinds}
    assert s.ttft_s == kinds["prefill"].median_s
    assert s.tpot_s == kinds["decode"].median_s
    assert s.tokens_per_s == pytest.approx(6 * B / kinds["decode"].time_s)
    assert "estimate" in render(d, "text").split("per token (")[1]
    one = analyze(_engine_trace(tmp_path / "one.json", ["decode"]))
    assert one.serving is not None
    assert one.serving.ttft_s is None
    assert one.serving.tpot_s is None
    assert "TTFT unknown" in one.serving.per_token_basis


def _layer_trace(path: Path, passes: int, *, kv: bool) -> Path:
    b = TraceBuilder()
    t = 0.0
    for _ in range(passes):
        for layer in range(4):
            if kv:
                b.annotation(f"layer_{layer}_kv_fetch", t, 20.0)
                t += 25.0
            b.annotation(f"layer_{layer}_forward", t, 200.0)
            b.cpu_op("aten::mm", t + 5.0, 10.0)
            b.kernel("ampere_sgemm_128x64_nn", t + 20.0, 150.0, launch_at=t + 5.0)
            t += 250.0
    return b.write(path)


def test_the_model_layer_sequence_is_the_iterations(tmp_path: Path) -> None:
    d = analyze(_layer_trace(tmp_path / "layers.json", 3, kv=False))
    s = d.serving
    assert s is not None
    assert [i.kind for i in s.iterations] == ["prefill", "decode", "decode"]
    assert "layer_0_forward" in s.evidence
    assert "inferred" in s.evidence
    kv = analyze(_layer_trace(tmp_path / "kv.json", 1, kv=True)).serving
    assert kv is not None
    assert [i.kind for i in kv.iterations] == ["decode"]
    assert "KV-cache read" in kv.evidence
    assert "MBU, unknown" in kv.decode_note


def test_training_makes_no_serving_finding(tmp_path: Path) -> None:
    d = analyze(training_trace(3).write(tmp_path / "train.json"))
    assert d.serving is None
    assert not [i for i in _ids(d) if i.startswith("serving-")]


def test_sglang_decode_is_overlap_and_says_why_mbu_is_unknown() -> None:
    d = analyze(real_trace("tracelens/mi300x_sglang_qwen3-8b_decode.json.gz"))
    assert_diagnosis_invariants(d)
    s = d.serving
    assert s is not None
    assert s.engine == "SGLang"
    assert [k.kind for k in s.kinds] == ["decode"]
    # The GPU's 463 ms wait is on an event (queued work), not host work between iterations.
    assert s.wait_share > 0.9
    assert s.host_share < 0.05
    assert "overlap scheduler" in s.overlap
    assert s.decode is None
    assert "graph replays" in s.decode_note
    assert "--params" in s.decode_note
    with_params = analyze(
        real_trace("tracelens/mi300x_sglang_qwen3-8b_decode.json.gz"),
        Options(model=ModelFlops(params=8.2e9)),
    ).serving
    assert with_params is not None
    assert with_params.decode is not None
    assert with_params.decode.mbu is not None
    assert with_params.decode.busy_mbu is not None


def test_vllm_decode_graph_on_an_unnamed_device() -> None:
    d = analyze(real_trace("tracelens/vllm_decode_cudagraph_execution.json.gz"))
    s = d.serving
    assert s is not None
    assert s.engine == "vLLM"
    assert [(k.kind, k.tokens) for k in s.kinds] == [("decode", 32)]
    assert s.graph_coverage == 1.0
    assert s.decode_note
    assert s.tokens_per_s is not None


def test_nsys_llama3_demo_is_read_as_a_decode_forward() -> None:
    d = analyze(real_trace("nsys/llama3_inference_demo.sqlite"))
    assert_diagnosis_invariants(d)
    s = d.serving
    assert s is not None
    assert [k.kind for k in s.kinds] == ["decode"]
    assert "layers 0-7" in s.evidence
    assert "no op shapes" in s.decode_note


def test_vllm_front_end_keeps_its_note() -> None:
    s = analyze(real_trace("other/gb10_vllm_frontend_cpu.json.gz")).serving
    assert s is not None
    assert s.engine == "vLLM"
    assert "front-end process" in s.note
    assert not s.iterations


def test_html_report_has_the_serving_section(tmp_path: Path) -> None:
    d = analyze(generate_trace(tmp_path / "gen.json", 6, graph=False))
    html = render(d, "html")
    assert '<section id="serving"' in html
    assert "LLM serving: 7 iterations (1 prefill, 6 decode)" in html
    assert "per token (estimates)" in html
    plain = analyze(training_trace(3).write(tmp_path / "train.json"))
    assert '<section id="serving"' not in render(plain, "html")


def test_b200_vllm_worker_is_a_prefill_of_888_tokens() -> None:
    s = analyze(real_trace("tracelens/b200_eager_rank0.json.gz")).serving
    assert s is not None
    assert not s.note
    assert [(k.kind, k.tokens) for k in s.kinds] == [("prefill", 888)]
    assert s.ttft_s == s.kinds[0].median_s


def _decodes(path: Path, busy: list[float]) -> Path:
    """vLLM decode iterations whose ranges differ as a running engine's do (the KV length
    grows by one each), so no repeated range reads as the profiler's steps."""
    b = TraceBuilder()
    t = 0.0
    for i, us in enumerate(busy):
        kv = 5000 + i
        name = f"execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk{kv}sqsq32sqsk{kv})"
        b.annotation(name, t, us + 30.0)
        b.cpu_op("aten::mm", t + 5.0, 10.0)
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t + 20.0, us, launch_at=t + 5.0)
        t += 70.0 + us
    return b.write(path)


def test_too_few_steps_ask_whether_the_work_is_stable_of_the_iterations(tmp_path: Path) -> None:
    """A serving trace with no ProfilerStep is one step; its unit of work is the iteration,
    so the first question is asked of its iterations, and one step no longer thins the
    verdict's evidence."""
    d = analyze(_decodes(tmp_path / "steady.json", [500.0] * 8))
    q1 = d.verdict.questions[0]
    assert d.steps.count == 1
    assert q1.answer == "yes"
    assert q1.value is not None
    assert q1.value < 0.05
    assert "decode iterations' CV" in q1.detail
    assert not any("steady-state step" in t for t in d.verdict.thin_evidence)
    uneven = analyze(_decodes(tmp_path / "uneven.json", [500.0, 500.0, 1500.0] * 2))
    uneven = uneven.verdict.questions[0]
    assert uneven.answer == "no"
    assert uneven.value is not None
    assert uneven.value > 0.3
