"""LLM serving traces (issue 34): engine iterations found from the trace's evidence, each
prefill, decode or mixed; decode judged by the bytes it reads per iteration (MBU), prefill by
MFU; the host's time between iterations; decode's graph coverage."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from invariants import assert_diagnosis_invariants
from tracegen import TraceBuilder, training_trace
from wallfinder import analyze
from wallfinder.report import render

H100 = Path(__file__).resolve().parents[1] / "data" / "h100"

B, T, D, V, HEADS, CACHE = 4, 64, 1024, 32000, 8, 512
LINEARS = ((3 * D, D), (D, D), (8 * D, D), (D, 4 * D))
"""Each layer's weights [out, in]."""
LAYERS = 2
BF16 = 2
WEIGHT_BYTES = LAYERS * sum(o * i for o, i in LINEARS) * BF16 + V * D * BF16  # + LM head
KV_BYTES = LAYERS * 2 * B * HEADS * CACHE * (D // HEADS) * BF16


def _op(b: TraceBuilder, name: str, t: float, dims: list[list[int]], types: list[str]) -> None:
    b.host(name, t, 5.0, args={"Input Dims": dims, "Input type": types})


def _eager_forward(b: TraceBuilder, t: float, tokens: int) -> float:
    """One eager forward of `tokens` per sequence: its embedding, linear layers, attention
    and their kernels; returns when it ends."""
    bf, long = "c10::BFloat16", "long int"
    _op(b, "aten::embedding", t, [[V, D], [B, tokens]], [bf, long])
    t += 10.0
    for _ in range(LAYERS):
        for out, inner in LINEARS:
            _op(b, "aten::linear", t, [[B, tokens, inner], [out, inner], []], [bf, bf, ""])
            b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t + 20.0, 30.0 * tokens, launch_at=t)
            t += 30.0 * tokens + 25.0
        kv = [B, HEADS, CACHE, D // HEADS]
        _op(
            b,
            "aten::scaled_dot_product_attention",
            t,
            [[B, HEADS, tokens, D // HEADS], kv, kv],
            [bf, bf, bf],
        )
        b.kernel("pytorch_flash::flash_fwd_kernel", t + 20.0, 40.0, launch_at=t)
        t += 65.0
    _op(b, "aten::linear", t, [[B, D], [V, D], []], [bf, bf, ""])
    b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t + 20.0, 80.0, launch_at=t)
    return t + 120.0


def _sample(b: TraceBuilder, t: float) -> float:
    """Greedy sampling on the host's side: an argmax, then host work (the gap)."""
    b.cpu_op("aten::argmax", t, 5.0)
    b.kernel("reduce_kernel<argmax>", t + 10.0, 5.0, launch_at=t)
    return t + 200.0


def generate_trace(path: Path, decodes: int, *, graph: bool) -> Path:
    """A prefill of T tokens per sequence, then `decodes` decode iterations: eager (one
    token per sequence through the model) or each replayed from one CUDA graph."""
    b = TraceBuilder()
    t = _sample(b, _eager_forward(b, 100.0, T))
    for _ in range(decodes):
        if graph:
            corr = b.new_id()
            b.runtime("cudaGraphLaunch", t, 10.0, correlation=corr)
            for k in range(20):
                b.kernel("gemv_bf16", t + 15.0 + 40.0 * k, 38.0, launcher="cudaGraphLaunch")
            t += 15.0 + 40.0 * 20
        else:
            t = _eager_forward(b, t, 1)
        t = _sample(b, t)
    return b.write(path)


def test_eager_generate_is_one_prefill_then_decodes_with_tokens(tmp_path: Path) -> None:
    d = analyze(generate_trace(tmp_path / "gen.json", 6, graph=False))
    assert_diagnosis_invariants(d)
    s = d.serving
    assert s is not None
    assert [(k.kind, k.count, k.tokens) for k in s.kinds] == [
        ("prefill", 1, B * T),
        ("decode", 6, 6 * B),
    ]
    assert s.graph_coverage == 0.0
    assert "aten::embedding" in s.evidence


def test_decode_bytes_are_weights_and_kv_from_the_shapes(tmp_path: Path) -> None:
    d = analyze(generate_trace(tmp_path / "gen.json", 6, graph=False))
    s = d.serving
    assert s is not None
    assert s.decode is not None
    assert s.decode.weight_bytes == WEIGHT_BYTES
    assert s.decode.kv_bytes == KV_BYTES
    assert d.device.mem_bandwidth is not None
    assert s.decode.mbu is not None
    assert s.decode.bandwidth == pytest.approx(s.decode.bytes_per_iteration / s.decode.median_s)
    assert s.decode.mbu == pytest.approx(s.decode.bandwidth / d.device.mem_bandwidth)
    assert 0 < s.decode.mbu <= s.decode.busy_mbu  # type: ignore[operator]
    assert s.prefill_mfu is not None
    assert 0 < s.prefill_mfu < 1


def test_graph_replays_are_decode_iterations_judged_by_the_eager_forward(tmp_path: Path) -> None:
    d = analyze(generate_trace(tmp_path / "graph.json", 5, graph=True))
    assert_diagnosis_invariants(d)
    s = d.serving
    assert s is not None
    assert s.decode is not None
    assert [(k.kind, k.count) for k in s.kinds] == [("prefill", 1), ("decode", 5)]
    assert s.graph_coverage == 1.0
    assert all(i.graph for i in s.iterations if i.kind == "decode")
    assert s.decode.weight_bytes == WEIGHT_BYTES
    assert "before each graph replay" in s.decode.basis
    # The host's sampling between replays is time the GPU idles.
    assert s.host_share > 0


def test_serving_verdict_asks_decode_by_mbu(tmp_path: Path) -> None:
    d = analyze(generate_trace(tmp_path / "gen.json", 6, graph=False))
    q3, q4 = d.verdict.questions[2], d.verdict.questions[3]
    assert "decode" in q3.detail
    assert "prefill" in q3.detail
    assert "MBU" in q4.detail
    assert "prefill at MFU" in q4.detail
    text = render(d, "text")
    assert "LLM serving: 7 iterations (1 prefill, 6 decode)" in text
    assert "LLM serving" in render(d, "md")


def test_engine_ranges_say_prefill_decode_and_mixed(tmp_path: Path) -> None:
    b = TraceBuilder()
    names = (
        "execute_512_context_1(sq512sk512sqsq262144sqsk262144)_generation_0(sq0sk0sqsq0sqsk0)",
        "execute_40_context_1(sq8sk8sqsq64sqsk64)_generation_32(sq32sk5000sqsq32sqsk5000)",
        "execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk5032sqsq32sqsk5032)",
        "execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk5064sqsq32sqsk5064)",
    )
    t = 0.0
    for name in names:
        b.annotation(name, t, 900.0)
        b.cpu_op("aten::mm", t + 5.0, 10.0)
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", t + 20.0, 500.0, launch_at=t + 5.0)
        t += 1000.0
    d = analyze(b.write(tmp_path / "vllm.json"))
    s = d.serving
    assert s is not None
    assert [i.kind for i in s.iterations] == ["prefill", "mixed", "decode", "decode"]
    assert [i.tokens for i in s.iterations] == [512, 40, 32, 32]
    assert "execute_" in s.evidence


def test_training_and_plain_inference_are_not_serving(tmp_path: Path) -> None:
    assert analyze(training_trace(3).write(tmp_path / "train.json")).serving is None
    b = TraceBuilder()  # an eager forward repeated, never one token per sequence: no decode
    t = 0.0
    for _ in range(3):
        t = _eager_forward(b, t, T) + 50.0
    assert analyze(b.write(tmp_path / "bert.json")).serving is None


def test_h100_decode_loop_reads_as_its_facts() -> None:
    """The captured decoder (tests/data/capture/decode_loop.py): 2 request batches, each a
    prefill then 24 decode iterations replayed from one CUDA graph."""
    facts = json.loads((H100 / "decode_loop.facts.json").read_text())
    d = analyze(H100 / "decode_loop.json.gz")
    s = d.serving
    assert s is not None
    assert s.decode is not None
    batches, per = facts["request_batches"], facts["decode_iterations_per_request_batch"]
    kinds = {k.kind: k for k in s.kinds}
    assert set(kinds) == {"prefill", "decode"}
    assert kinds["prefill"].count == batches
    assert kinds["prefill"].tokens == facts["batch"] * facts["prompt_tokens"]  # steady one
    assert kinds["decode"].count == batches * per
    assert s.graph_coverage == 1.0
    # The KV cache the attention reads is the whole cache allocated; the weights read are the
    # linear layers' (all the parameters but the embedding table and the norms).
    assert s.decode.kv_bytes == facts["kv_cache_bytes_allocated"]
    assert s.decode.weight_bytes is not None
    assert 0.85 * facts["weight_bytes"] < s.decode.weight_bytes < facts["weight_bytes"]
    assert s.decode.mbu is not None
    assert 0.2 < s.decode.mbu < 1
    assert "MBU" in d.verdict.questions[3].detail
    # Decode is most of the busy time, at one token per sequence (the facts' batch, read from
    # the prefill before the graph replays): ~6 FLOPs per byte read, far below the H100's
    # bf16 ridge (989.5 TFLOP/s over 3.35 TB/s = 295): the bandwidth wall, though the graph's
    # GEMMs, with no shapes, read as matmuls at peak.
    assert {i.tokens for i in s.iterations if i.kind == "decode"} == {facts["batch"]}
    assert (d.verdict.wall, d.verdict.cause) == ("bandwidth", "decode")
    assert "for 8 tokens: about 6 FLOPs per byte against the device's ridge of 295" in (
        d.verdict.reason
    )


def test_a_compute_bound_prefill_heavy_trace_keeps_its_wall(tmp_path: Path) -> None:
    """The decode wall needs decode to hold most of the busy time: a trace that is mostly
    prefill keeps the kernels' verdict."""
    from wallfinder.analysis.serving import _decode_wall
    from wallfinder.diagnosis import (
        DecodeBandwidth,
        Device,
        IterationKinds,
        Serving,
        ServingIteration,
        Verdict,
    )

    verdict = Verdict(wall="compute", cause="at peak", reason="", questions=[])
    decode = DecodeBandwidth(
        bytes_per_iteration=2e9,
        weight_bytes=1.5e9,
        kv_bytes=0.5e9,
        basis="",
        median_s=1e-3,
        bandwidth=2e12,
    )
    device = Device(name="H100", kind="gpu", peak_flops={"bf16": 989.5e12}, mem_bandwidth=3.35e12)

    def served(decode_busy: float) -> Serving:
        return Serving(
            engine=None,
            evidence="",
            iterations=[ServingIteration("decode", 0.0, 1e-3, 1e-3, tokens=8)],
            kinds=[
                IterationKinds("prefill", 1, 1.0, 1.0, 1.0 - decode_busy),
                IterationKinds("decode", 10, 1.0, 1e-3, decode_busy),
            ],
            decode=decode,
        )

    assert _decode_wall(verdict, served(0.3), device, 1.0).wall == "compute"
    assert _decode_wall(verdict, served(0.7), device, 1.0).wall == "bandwidth"
    overhead = msgspec.structs.replace(verdict, wall="overhead")
    assert _decode_wall(overhead, served(0.7), device, 1.0).wall == "overhead"
