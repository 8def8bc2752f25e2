"""Convolutions (issue 33): depthwise/grouped convolutions are costed with their groups and
sit in the bandwidth class by their AI, not tensor-core matmuls (no TF32 advice); a
convolution without shapes has an unknown bound, as a GEMM; an op without External id is
joined to the launch inside it by time."""

from __future__ import annotations

from pathlib import Path

from invariants import assert_diagnosis_invariants
from tracegen import TraceBuilder
from wallfinder import Diagnosis, analyze
from wallfinder.analysis.classify import KernelClass
from wallfinder.analysis.roofline import class_bound

H100 = Path(__file__).resolve().parents[1] / "data" / "h100"
DIMS = [[32, 256, 56, 56], [256, 1, 3, 3], [], [], [], [], []]
TYPES = ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"]
CONCRETE = ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "256"]


def checked(path: Path) -> Diagnosis:
    d = analyze(path, workers=1)
    assert_diagnosis_invariants(d)
    return d


def test_the_h100_depthwise_fixture_is_bandwidth_bound_without_tf32_advice() -> None:
    """Two depthwise convolutions trained in fp32 (tests/data/h100/README.md): PyTorch's
    native `conv_depthwise2d_*` kernels, memory-bound. Before: "matmuls streaming operands",
    the forward unmodelled (so compute-bound), and TF32 advice for fp32 matmuls."""
    d = checked(H100 / "depthwise_conv.json.gz")
    assert d.verdict.wall == "bandwidth"
    assert d.verdict.cause == "depthwise_conv"
    assert "fp32-matmul" not in {f.id for f in d.findings}
    assert all("allow_tf32" not in f.fix for f in d.findings)
    r = d.roofline
    assert r is not None
    # Every depthwise kernel has a cost (the forward's op is `aten::_conv_depthwise2d`) and is
    # bandwidth-bound by its AI (12.2 for the 7×7, 6.25 for the 5×5: below fp32's ridge).
    assert r.bandwidth_bound_share > 0.99
    assert r.costed_share > 0.99
    assert r.fp32_matmul_without_tensor_cores_s == 0
    forward = [o for o in r.ops if o.name == "aten::_conv_depthwise2d"]
    assert len(forward) == 2
    assert all(o.bound == "bandwidth" for o in forward)


def test_a_convolution_without_shapes_has_an_unknown_bound() -> None:
    assert class_bound(KernelClass.CONVOLUTION, "implicit_convolve_sgemm", 64) is None
    assert class_bound(KernelClass.DEPTHWISE, "conv_depthwise2d_forward_kernel", 64) == (
        "bandwidth"
    )


def test_a_conv_op_without_external_id_is_joined_to_its_launch_by_time(tmp_path: Path) -> None:
    """The issue's case: the op carries shapes and groups but no External id; the launch call
    inside it on the same thread gives its kernel the op's cost."""
    b = TraceBuilder()
    host = 0.0
    for _ in range(4):
        op = b.host(
            "aten::conv2d",
            host,
            40.0,
            args={"Input Dims": DIMS, "Input type": TYPES, "Concrete Inputs": CONCRETE},
        )
        del op["args"]["External id"]
        b.kernel("cudnn_depthwise_fprop_kernel", host + 30.0, 500.0, launch_at=host + 20.0)
        host += 600.0
    d = checked(b.write(tmp_path / "t.json"))
    r = d.roofline
    assert r is not None
    assert r.costed_share > 0.99
    [row] = r.ops
    assert row.name == "aten::conv2d"
    assert row.bound == "bandwidth"
    assert 2.0 < row.ai < 2.3
