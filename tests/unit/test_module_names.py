"""Module rows read as the user's classes: `trace.names.module_name`, the name a module range
gives its row in the module tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracegen import TraceBuilder
from wallfinder import analyze
from wallfinder.trace.names import module_name

# Verbatim from the real trace hta/sampled_128rank_job/rank-0 (record_function ranges a
# torch.package'd DPER3 model writes around its modules).
PACKAGED = "<class '<torch_package_0>.dper3.modules.position_weighted.PositionWeighted'>"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (PACKAGED, "PositionWeighted"),
        (
            "<class '<torch_package_0>.dper3.modules.grouped_embedding._FeatureProcessorWrapper'>",
            "_FeatureProcessorWrapper",
        ),
        ("<class 'model.Foo'>", "Foo"),
        ("<class 'Foo'>", "Foo"),
        # An instance suffix or a prefix around the repr stays.
        ("<class '<torch_package_1>.model.Foo'>_3", "Foo_3"),
        # Any other name is left as it is.
        ("Block_0", "Block_0"),
        ("layers.0", "layers.0"),
        ("train.py(42): step", "train.py(42): step"),
        ("<lambda>", "<lambda>"),
    ],
)
def test_a_class_repr_reads_as_the_class_name(name: str, expected: str) -> None:
    assert module_name(name) == expected


def packaged_trace(steps: int = 3) -> TraceBuilder:
    """Each 1000 µs step: a range named as the real packaged model names its module, around
    an op launching a 400 µs GEMM."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.annotation(PACKAGED, t0 + 10.0, 100.0)
        b.cpu_op("aten::mm", t0 + 20.0, 10.0)
        b.kernel("volta_sgemm_128x64_nn", t0 + 50.0, 400.0, launch_at=t0 + 25.0)
    return b


def test_module_rows_of_a_packaged_model_read_as_its_classes(tmp_path: Path) -> None:
    d = analyze(packaged_trace().write(tmp_path / "t.json"))
    assert d.modules is not None
    assert [r.path for r in d.modules.rows] == ["PositionWeighted"]
