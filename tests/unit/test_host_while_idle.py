"""Host ops while the GPU is idle are host work (issue 33): a loop on CPU tensors after the
last kernel, with no launch to end the GPU's wait, is host overhead named by its ops in the
host-work finding, not time the trace cannot explain."""

from __future__ import annotations

from pathlib import Path

from invariants import assert_diagnosis_invariants
from tracegen import TraceBuilder
from wallfinder import Diagnosis, analyze


def checked(path: Path) -> Diagnosis:
    d = analyze(path, workers=1)
    assert_diagnosis_invariants(d)
    return d


def cpu_sum_loop(*, ranged: bool = False) -> TraceBuilder:
    """The issue's case: a few kernels, then a loop summing on CPU tensors, 4,095 `aten::add_`
    on the main thread (8 µs each, 2 µs of Python between them) with no launch among them, so
    the GPU stays idle to the end of the window. With `ranged`, a benchmark-style range spans
    the whole run."""
    b = TraceBuilder()
    host = 0.0
    for _ in range(4):
        b.cpu_op("aten::mm", host, 20.0)
        b.kernel("volta_sgemm_128x64_nn", host + 15.0, 30.0, launch_at=host + 5.0)
        host += 60.0
    for _ in range(4095):
        b.cpu_op("aten::add_", host, 8.0)
        host += 10.0
    if ranged:
        b.annotation("[param|benchmark]", 0.0, host)
    return b


def test_cpu_tensor_ops_after_the_last_kernel_are_host_work(tmp_path: Path) -> None:
    d = checked(cpu_sum_loop().write(tmp_path / "t.json"))
    causes = d.breakdown.idle_causes
    # 4,095 × 8 µs of add_ in a window of 41.2 ms: host overhead; the Python between them
    # (2 µs each, in no op) stays unexplained.
    assert 0.78 < causes["host_overhead"] < 0.81
    assert causes["other"] < 0.21
    assert d.verdict.wall == "overhead"
    assert d.verdict.cause == "host_overhead"
    [host] = [f for f in d.findings if f.id == "host-work"]
    assert "aten::add_ 32.76 ms/step (launched no GPU work: compute on CPU tensors)" in (
        host.evidence
    )
    # aten::mm launched the kernels: no CPU-tensor note on it.
    assert "aten::mm 0.06 ms/step," in host.evidence


def test_a_range_around_the_idle_tail_is_not_host_work_without_a_launch(tmp_path: Path) -> None:
    """A whole-run range says nothing of what the thread did past the last kernel: only its
    ops do, so the Python between the add_ calls (8.2 ms) stays unexplained under it."""
    ranged = checked(cpu_sum_loop(ranged=True).write(tmp_path / "b.json")).breakdown.idle_causes
    assert 0.78 < ranged["host_overhead"] < 0.81
    assert ranged["other"] > 0.19
