"""CPU-only traces: op time that is the framework's fixed cost per op is host overhead, not
compute; autograd nodes take the class of the op they differentiate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracegen import TraceBuilder
from wallfinder import Diagnosis, analyze
from wallfinder.analysis.classify import KernelClass, classify_op
from wallfinder.analysis.dispatch import dispatch_sized
from wallfinder.analysis.thresholds import TimeThresholds
from wallfinder.trace import Kind, load_trace

NODE = "autograd::engine::evaluate_function: "


def cpu_builder() -> TraceBuilder:
    return TraceBuilder(device_name=None)


def tiny_ops(steps: int = 3, ops: int = 200) -> TraceBuilder:
    """1000 µs steps: 200 top-level ops of 3 µs (an aten::add calling aten::empty), 1 µs of
    Python between them, then 200 µs untraced."""
    b = cpu_builder()
    for s in range(steps):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        for k in range(ops):
            t = t0 + 4.0 * k
            b.cpu_op("aten::add", t, 3.0)
            b.cpu_op("aten::empty", t + 0.5, 0.5)
    return b


def load(b: TraceBuilder, tmp_path: Path) -> Diagnosis:
    return analyze(b.write(tmp_path / "t.json"))


def test_a_loop_of_tiny_ops_is_host_overhead_on_the_cpu(tmp_path: Path) -> None:
    d = load(tiny_ops(), tmp_path)
    assert d.breakdown.basis == "cpu"
    assert d.breakdown.compute == pytest.approx(0.0)
    assert d.breakdown.idle_causes["host_overhead"] == pytest.approx(0.6)
    assert d.breakdown.idle_causes["other"] == pytest.approx(0.4)
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "host_overhead")
    # The CPU view still shows where the thread's time went: 60% in ops.
    assert d.cpu is not None
    assert (d.cpu.ops, d.cpu.python) == pytest.approx((0.6, 0.0))
    assert [o.name for o in d.cpu.top_ops] == ["aten::add"]


def test_tiny_ops_get_the_launch_bound_finding_with_their_counts(tmp_path: Path) -> None:
    d = load(tiny_ops(), tmp_path)
    top = d.findings[0]
    assert top.id == "launch-bound"
    assert top.wall == "overhead"
    assert top.share == pytest.approx(0.6)
    assert "200 calls per step (400 ops, median call 3.0 µs)" in top.evidence
    assert "CUDA graphs" not in top.fix
    assert "whole batches" in top.fix


def test_a_long_op_around_small_helpers_is_compute(tmp_path: Path) -> None:
    # aten::linear for 900 µs: aten::t (1 µs) and aten::addmm (880 µs, itself calling a 1 µs
    # aten::resize_). The call does arithmetic, however many small ops it contains.
    b = cpu_builder()
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.cpu_op("aten::linear", t0, 900.0)
        b.cpu_op("aten::t", t0 + 1.0, 1.0)
        b.cpu_op("aten::addmm", t0 + 10.0, 880.0)
        b.cpu_op("aten::resize_", t0 + 11.0, 1.0)
    d = load(b, tmp_path)
    assert d.breakdown.compute == pytest.approx(0.9)
    assert d.breakdown.idle_causes["host_overhead"] == pytest.approx(0.0)
    assert d.verdict.wall == "compute"
    assert not [f for f in d.findings if f.id == "launch-bound"]


def test_an_autograd_node_with_many_helpers_and_one_large_op_is_compute(
    tmp_path: Path,
) -> None:
    # 12 helpers of 2 µs and one 60 µs mul inside one 90 µs node: 6.9 µs per op on average,
    # but the mul computes for 60 µs of its own.
    b = cpu_builder()
    for s in range(3):
        t0 = s * 100.0
        b.step(s + 1, t0, 100.0)
        b.cpu_op(NODE + "MulBackward0", t0, 90.0)
        for k in range(12):
            b.cpu_op("aten::view", t0 + 1.0 + 2.0 * k, 1.5)
        b.cpu_op("aten::mul", t0 + 26.0, 60.0)
    d = load(b, tmp_path)
    assert d.breakdown.compute == pytest.approx(0.9)
    assert d.classes[0].cls == "elementwise"


def test_dispatch_sized_calls_are_marked_with_all_their_ops(tmp_path: Path) -> None:
    b = cpu_builder()
    b.cpu_op("aten::add", 0.0, 5.0)  # tiny call with a tiny child
    b.cpu_op("aten::empty", 1.0, 1.0)
    b.cpu_op("aten::mm", 10.0, 50.0)  # own time 49 µs
    b.cpu_op("aten::resize_", 11.0, 1.0)
    b.cpu_op(
        "aten::add", 70.0, TimeThresholds().dispatch_self_ns / 1e3
    )  # exactly at the threshold: arithmetic
    ops = load_trace(b.write(tmp_path / "t.json")).of_kind(Kind.CPU_OP)
    d = dispatch_sized(ops, TimeThresholds().dispatch_self_ns)
    assert d.sized.tolist() == [True, True, False, False, False]
    assert d.top.tolist() == [True, False, True, False, True]
    assert d.tree_ops.tolist() == [2, 0, 2, 0, 1]


def test_dispatch_sized_survives_ops_that_are_not_well_nested(tmp_path: Path) -> None:
    b = cpu_builder()
    b.cpu_op("aten::a", 0.0, 10.0)
    b.cpu_op("aten::b", 5.0, 10.0)  # overlaps a without being inside it
    b.cpu_op("aten::c", 6.0, 0.0)  # zero length
    b.cpu_op("aten::d", 6.0, 2.0)
    ops = load_trace(b.write(tmp_path / "t.json")).of_kind(Kind.CPU_OP)
    d = dispatch_sized(ops, TimeThresholds().dispatch_self_ns)
    assert d.sized.shape == (4,)
    assert d.top.sum() == 1
    assert np.all(d.tree_ops >= 0)


def test_the_data_loading_finding_speaks_of_the_training_loop_on_the_cpu(
    tmp_path: Path,
) -> None:
    b = cpu_builder()
    for s in range(3):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.dataloader(t0, 700.0)
        b.cpu_op("aten::mm", t0 + 700.0, 300.0)
    d = load(b, tmp_path)
    top = d.findings[0]
    assert top.id == "data-loading"
    assert top.title == "The training loop waits for the DataLoader"
    assert "GPU" not in top.evidence
    assert "pin_memory" not in top.fix
    assert "GPU" not in d.verdict.reason


BACKWARD = [
    ("MulBackward0", KernelClass.ELEMENTWISE),
    ("AddmmBackward0", KernelClass.GEMM),
    ("MmBackward0", KernelClass.GEMM),
    ("NativeLayerNormBackward0", KernelClass.NORMALIZATION),
    ("LogSoftmaxBackward0", KernelClass.SOFTMAX),
    ("NllLossBackward0", KernelClass.REDUCTION),
    ("ConvolutionBackward0", KernelClass.CONVOLUTION),
    ("ScaledDotProductFlashAttentionBackward0", KernelClass.ATTENTION),
    ("ToCopyBackward0", KernelClass.COPY),
    ("TBackward0", KernelClass.OTHER),
    ("ExpandBackward0", KernelClass.OTHER),
]


@pytest.mark.parametrize(("node", "expected"), BACKWARD, ids=[n for n, _ in BACKWARD])
def test_an_autograd_node_has_the_class_of_the_op_it_differentiates(
    node: str, expected: KernelClass
) -> None:
    assert classify_op(NODE + node) is expected


def test_other_autograd_functions_keep_class_other() -> None:
    assert classify_op(NODE + "torch::autograd::AccumulateGrad") is KernelClass.OTHER
