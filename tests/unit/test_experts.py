"""Expert parallel's own loss (analysis/topics/experts.py): a mixture of experts' token
exchange (dispatch/combine kernels, or all-to-all launched from the host's all-to-all calls)
with no compute beside it is its own finding with expert parallel's levers; hidden beside the
GEMMs it is no wall; an all-to-all alone (sharded embeddings) stays exposed communication."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_parallelism import ALL_TO_ALL, STEPS

from tracegen import MODULE, TraceBuilder, moe_trace, phased_training_trace
from wallfinder import Diagnosis, analyze
from wallfinder.diagnosis import Finding


def finding(d: Diagnosis, id: str) -> Finding | None:
    return next((f for f in d.findings if f.id == id), None)


def test_an_exchange_after_the_compute_is_expert_parallels_loss(tmp_path: Path) -> None:
    """`moe_trace(hidden=False)`: 960 µs of compute, then 820 µs of dispatch/combine alone,
    in a 1790 µs step."""
    d = analyze(moe_trace(hidden=False).write(tmp_path / "t.json"))
    d.self_check()
    ep = finding(d, "ep-alltoall-exposed")
    assert ep is not None
    assert ep.share == pytest.approx(820 / 1790, abs=1e-3)
    assert "none of it runs beside compute" in ep.evidence
    assert "two-micro-batch overlap" in ep.fix
    # It claims the exposed communication it explains: nothing left to exposed-comm.
    assert finding(d, "exposed-comm") is None
    assert d.verdict.mechanism == "the MoE token exchange"
    assert d.parallelism is not None
    assert d.parallelism.names == ["EP"]


def test_an_exchange_beside_the_gemms_is_no_wall(tmp_path: Path) -> None:
    """`moe_trace(hidden=True)`: the same kernels beside the compute, 30 µs of the last
    combine past it (3% exposed): the finding is that 3%, and the rest is said hidden."""
    d = analyze(moe_trace(hidden=True).write(tmp_path / "t.json"))
    assert d.verdict.wall == "compute"
    ep = finding(d, "ep-alltoall-exposed")
    assert ep is not None
    assert ep.share == pytest.approx(30 / 1000, abs=1e-3)
    assert "0.79 ms of it already runs beside compute" in ep.evidence


def _all_to_all(b: TraceBuilder, t0: float, *, moe: bool) -> None:
    # The host's all-to-all in the forward; NCCL runs it as a SendRecv kernel, 455-555 µs
    # of each 1000 µs step, after the forward's compute and before the backward's.
    if moe:
        b.host(MODULE + "MoELayer_0", t0 + 285.0, 130.0, cat="python_function")
    b.cpu_op("c10d::alltoall_base_", t0 + 290.0, 4.0)
    b.kernel(ALL_TO_ALL, t0 + 455.0, 40.0, launch_at=t0 + 291.0, stream=28)


@pytest.mark.parametrize("moe", [True, False], ids=["moe", "embeddings"])
def test_an_all_to_all_is_experts_only_where_the_trace_names_them(
    tmp_path: Path, moe: bool
) -> None:
    b = phased_training_trace(STEPS, builder=TraceBuilder(rank=0, world_size=2))
    for s in range(STEPS):
        _all_to_all(b, s * 1000.0, moe=moe)
    d = analyze(b.write(tmp_path / "t.json.gz"))
    ep = finding(d, "ep-alltoall-exposed")
    if moe:
        assert ep is not None
        assert ep.share == pytest.approx(40 / 1000, abs=2e-3)
    else:
        assert ep is None  # sharded embeddings look rows up the same way
        assert finding(d, "exposed-comm") is not None
