"""A parallel strategy's lever as a what-if replayed on the step's graph (analysis/critpath/
lever.py): more microbatches for a pipeline's bubble, FSDP's prefetch, async TP. Each is
parsed, in the default table where the trace shows its strategy, and the gain of the finding
whose fix it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_critpath import comm_exposed
from test_parallelism import _fsdp_exposed, _tp_exposed

from tracegen import (
    FSDP_REDUCE_SCATTER_US,
    FSDP_UNIT_ELEMS,
    FSDP_UNITS,
    TraceBuilder,
    fsdp_gpu_trace,
    phased_training_trace,
)
from wallfinder import Options, analyze
from wallfinder.analysis import _diagnosed
from wallfinder.analysis.critpath import Change, covers, parse_what_if
from wallfinder.analysis.critpath.change import default_changes
from wallfinder.analysis.critpath.lever import hidden_by_compute
from wallfinder.diagnosis import CriticalPath, Diagnosis, Finding
from wallfinder.errors import WallfinderError
from wallfinder.hardware import get_spec
from wallfinder.trace import load_trace

US = 1e-6
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_kernel"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long)"


# Parsing --------------------------------------------------------------------------------------


def test_each_lever_parses_and_its_label_reads_back() -> None:
    assert parse_what_if("microbatches") == [Change(microbatches=0)]
    assert parse_what_if("microbatches:8") == [Change(microbatches=8)]
    assert parse_what_if("prefetch") == [Change(prefetch=True)]
    assert parse_what_if("async-tp") == [Change(async_tp=True)]
    for text in ("microbatches", "microbatches:8", "prefetch", "async-tp"):
        (change,) = parse_what_if(text)
        assert change.label == text
        assert parse_what_if(change.label) == [change]
    *_, combined = parse_what_if("prefetch,async-tp,data")
    assert combined.label == "data,prefetch,async-tp"


@pytest.mark.parametrize(
    "text",
    ["microbatches:0", "microbatches:x", "microbatches:2.5", "microbatches:50%", "prefetch:2"],
)
def test_a_bad_lever_argument_is_one_clear_error(text: str) -> None:
    with pytest.raises(WallfinderError) as e:
        parse_what_if(text)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("--what-if: ")


def test_a_finding_covers_its_levers_row_only_at_the_same_microbatches() -> None:
    assert covers(Change(prefetch=True), Change(prefetch=True))
    assert not covers(Change(prefetch=True), Change(async_tp=True))
    assert covers(Change(microbatches=0), Change(microbatches=0))
    # More microbatches than the finding's is a larger change: the finding does not cap it.
    assert not covers(Change(microbatches=0), Change(microbatches=16))


def test_the_default_table_adds_the_levers_the_trace_shows_on_either_device() -> None:
    cpu = default_changes("comm_exposed", False, levers=("async-tp", "microbatches"))
    assert [c.label for c in cpu] == ["data", "host:2", "microbatches", "async-tp"]
    gpu = default_changes("comm_exposed", True, levers=("prefetch",))
    assert [c.label for c in gpu][-2:] == ["overlap", "prefetch"]
    assert [c.label for c in default_changes("comm_exposed", True)][-1] == "overlap"


# What a collective hides -----------------------------------------------------------------------


def test_a_collective_hides_at_most_the_compute_before_it_taken_once() -> None:
    # In time order: compute 100, a gather of 30 (hidden: 30), compute 20, a gather of 50
    # (only the 20 before it: the 70 left of the first compute is not taken twice), then in
    # the next step a gather of 40 with no compute before it in its step.
    lever = np.array([0, 30, 0, 50, 40], dtype=float)
    compute = np.array([100, 0, 20, 0, 0], dtype=float)
    step = np.array([0, 0, 0, 0, 1])
    assert hidden_by_compute(lever, compute, step).tolist() == [0, 30, 0, 20, 0]


def test_a_stretch_of_several_pieces_shares_the_compute_before_it() -> None:
    # A gather in two pieces (its call, then the wait after it) behind 40 of compute.
    lever = np.array([0, 25, 25], dtype=float)
    compute = np.array([40, 0, 0], dtype=float)
    assert hidden_by_compute(lever, compute, np.zeros(3, np.intp)).tolist() == [0, 25, 15]


# Pipeline: more microbatches --------------------------------------------------------------------


def pipelined(*, wait_us: float = 50.0) -> TraceBuilder:
    """Rank 1 of a 2-stage GPipe job whose host runs ahead: each 700 µs step launches its
    work at once, then waits for the GPU (a stream synchronisation). Per microbatch (2), a
    SendRecv waits `wait_us` for the activations and the forward GEMM (100 µs) starts when
    it ends; then two backward GEMMs of 50 µs; the step ends 70 µs after the GPU drains."""
    b = TraceBuilder(rank=1, world_size=2)
    length = 30.0 + 2 * (wait_us + 100.0) + 2 * 50.0 + 71.0
    for s in range(4):
        t0 = s * length
        b.step(s + 1, t0, length)
        h = t0 + 2.0
        t = t0 + 30.0
        for i in range(2):
            b.annotation(f"Forward {i}", h, 8.0)
            b.nccl(t, wait_us, name=SENDRECV, launch_at=h + 1.0)
            b.kernel(GEMM, t + wait_us, 100.0, launch_at=h + 4.0)
            h += 9.0
            t += wait_us + 100.0
        for i in range(2):
            b.annotation(f"Backward {i}", h, 5.0)
            b.kernel(GEMM, t, 50.0, launch_at=h + 0.5)
            h += 6.0
            t += 50.0
        b.sync(h, t + 1.0 - h)
    return b


def _path(d: Diagnosis) -> CriticalPath:
    assert d.critical_path is not None, d.not_computed
    return d.critical_path


def _row(p: CriticalPath, change: str) -> float:
    (row,) = [r for r in p.what_if if r.change == change]
    return row.step_s


def _finding(d: Diagnosis, id: str) -> Finding:
    (f,) = [f for f in d.findings if f.id == id]
    return f


def test_more_microbatches_shrink_the_bubble_waits_by_m_over_big_m(tmp_path: Path) -> None:
    path = pipelined().write(tmp_path / "t.json")
    d, facts = _diagnosed(
        load_trace(path), None, spec=None, model=None, what_if="microbatches,microbatches:8"
    )
    assert facts.whatif is not None
    g, cuts = facts.whatif.graph, facts.whatif.cuts["microbatches"]
    # The two 50 µs waits of a step are under the 1/3 of it the schedule explains: all of
    # them bubble, and with m=2, M microbatches leave 2/M of it: M=4 takes 50 µs off each
    # step's waits, M=8 75 µs.
    assert float(cuts.op.sum()) / g.steps == pytest.approx(100_000)
    assert float(cuts.at(Change(microbatches=0)).op.sum()) / g.steps == pytest.approx(50_000)
    assert float(cuts.at(Change(microbatches=8)).op.sum()) / g.steps == pytest.approx(75_000)
    # Fewer microbatches grow the bubble: one microbatch doubles it.
    assert float(cuts.at(Change(microbatches=1)).op.sum()) / g.steps == pytest.approx(-100_000)
    p = _path(d)
    assert p.replayed_step_s == pytest.approx(p.measured_step_s, rel=1e-6)
    # The replay takes what the graph lets it: the waits are on the step's path (the GEMMs
    # wait for them), up to the launch path's latency the GEMMs keep.
    four, eight = _row(p, "microbatches"), _row(p, "microbatches:8")
    assert 0 < p.replayed_step_s - four <= 50 * US + 1e-9
    assert 0 < four - eight <= 25 * US + 1e-9
    assert facts.whatif.row(Change(microbatches=1)).step_s > p.replayed_step_s
    # The finding's gain is the default row's replay (twice the microbatches).
    bubble = _finding(d, "pipeline-bubble")
    assert bubble.gain_basis == "replay"
    assert bubble.replay_speedup == pytest.approx(p.replayed_step_s / four)
    assert "--what-if microbatches:M" in bubble.fix
    # In the default table, where the trace shows a pipeline.
    default = _path(analyze(path))
    assert "microbatches" in [r.change for r in default.what_if]


def test_only_the_bubble_the_schedule_explains_shrinks(tmp_path: Path) -> None:
    # 2 × 300 µs of waits a step: more than the 1/3 of the step the schedule explains, whose
    # bubble alone shrinks; the rest (a slower neighbour, the transfers) stays.
    path = pipelined(wait_us=300.0).write(tmp_path / "t.json")
    _, facts = _diagnosed(load_trace(path), None, spec=None, model=None, what_if=None)
    assert facts.whatif is not None
    g, cuts = facts.whatif.graph, facts.whatif.cuts["microbatches"]
    assert facts.step_s / 3 / 1e-9 < 600e3
    assert float(cuts.op.sum()) / g.steps == pytest.approx(facts.step_s / 3 / 1e-9, rel=1e-6)


def test_without_a_pipeline_microbatches_change_nothing_and_make_no_row(tmp_path: Path) -> None:
    path = phased_training_trace(4).write(tmp_path / "t.json")
    p = _path(analyze(path, Options(what_if="microbatches")))
    assert _row(p, "microbatches") == pytest.approx(p.replayed_step_s)
    assert "microbatches" not in [r.change for r in _path(analyze(path)).what_if]


# FSDP prefetch, async TP ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("add", "lever", "id", "hidden_us"),
    [
        # The first gather has only the input copy before it in its step (no compute); the
        # second hides behind Block_0's 100 µs GEMM (all 28 µs), the third behind Block_1's
        # 150 (all 56).
        (_fsdp_exposed, "prefetch", "fsdp-exposed-gather", 28 + 56),
        # Likewise the all-reduces: the first has no compute before it, the others hide.
        (_tp_exposed, "async-tp", "tp-allreduce-exposed", 38 + 56),
    ],
    ids=["fsdp", "tp"],
)
def test_a_hiding_lever_takes_off_each_collective_the_compute_before_it(
    tmp_path: Path, add: object, lever: str, id: str, hidden_us: int
) -> None:
    b = phased_training_trace(4, builder=TraceBuilder(rank=0, world_size=2))
    for s in range(4):
        add(b, s * 1000.0)  # type: ignore[operator]
    path = b.write(tmp_path / "t.json")
    d, facts = _diagnosed(load_trace(path), None, spec=None, model=None, what_if=None)
    assert facts.whatif is not None
    cuts = facts.whatif.cuts[lever]
    g = facts.whatif.graph
    assert float(cuts.op.sum()) / g.steps == pytest.approx(hidden_us * 1000, abs=1)
    # The row is in the default table; the finding's gain is its replay, never above the
    # compute its collectives can hide behind (its Amdahl bound).
    p = _path(d)
    assert lever in [r.change for r in p.what_if]
    assert _row(p, lever) <= p.replayed_step_s
    f = _finding(d, id)
    assert f.gain_basis == "replay"
    assert f.replay_speedup is not None
    assert 1.0 <= f.replay_speedup <= f.max_speedup


# FSDP: units merged ---------------------------------------------------------------------------

UNIT_TRANSFER_US = (FSDP_UNIT_ELEMS * 2) / 2 / 450e9 / US
"""Each unit's all-gather and reduce-scatter: 2 MiB of bf16; on 2 H100s (NVLink 450 GB/s one
way) each rank's link carries half of it, 2.33 µs: the rest of the kernel is its fixed cost."""


def _fixed_ns(us: float) -> float:
    return (us - UNIT_TRANSFER_US) * 1000


def _fsdp_job(
    tmp_path: Path, *, args: bool = True, prefetch: bool = False, what_if: str | None = None
) -> tuple[Diagnosis, Any]:
    b = fsdp_gpu_trace(4, prefetch=prefetch, args=args)
    return _diagnosed(
        load_trace(b.write(tmp_path / "t.json")),
        None,
        spec=get_spec(b.device_name or ""),
        model=None,
        what_if=what_if,
    )


def test_merging_units_saves_each_merged_collectives_fixed_cost(tmp_path: Path) -> None:
    """Each collective's fixed cost is its time less its bytes at the link's peak; merging
    units in pairs leaves the second of each run of a kind unpaid: unit 1's all-gather and
    the backward's second reduce-scatter (unit 1's); in threes also unit 2's all-gather and
    unit 0's reduce-scatter. The trace's stream waits put the gathers on the step's path (each
    runs after the previous unit's GEMM, which its own unit's GEMM waits for) and the last
    reduce-scatter (the optimizer waits for it); the others run beside a backward GEMM."""
    d, facts = _diagnosed_units(tmp_path, "units-merged,units-merged:3")
    cuts, g = facts.whatif.cuts["units-merged"], facts.whatif.graph
    (g0, _, _), (g1, _, _), (g2, _, _) = FSDP_UNITS
    rs = FSDP_REDUCE_SCATTER_US
    pairs = _fixed_ns(g1) + _fixed_ns(rs)
    threes = pairs + _fixed_ns(g2) + _fixed_ns(rs)
    assert float(cuts.at(Change(units_merged=0)).op.sum()) / g.steps == pytest.approx(pairs)
    assert float(cuts.at(Change(units_merged=3)).op.sum()) / g.steps == pytest.approx(threes)
    p = _path(d)
    assert p.replayed_step_s == pytest.approx(p.measured_step_s, rel=1e-6)
    two, three = _row(p, "units-merged"), _row(p, "units-merged:3")
    # The replay shortens the step by the fixed costs on its path, not the hidden ones.
    on_path_two = _fixed_ns(g1) * 1e-9
    on_path_three = (_fixed_ns(g1) + _fixed_ns(g2) + _fixed_ns(rs)) * 1e-9
    assert p.replayed_step_s - two == pytest.approx(on_path_two, rel=0.02)
    assert p.replayed_step_s - three == pytest.approx(on_path_three, rel=0.02)
    f = _finding(d, "fsdp-small-units")
    assert f.gain_basis == "replay"
    assert f.replay_speedup == pytest.approx(p.replayed_step_s / two)
    assert 1.0 < f.replay_speedup <= f.max_speedup
    total_ms = (g0 + g1 + g2 + 3 * rs) / 1000
    assert f"3 FSDP units, 6 of their collectives per step taking {total_ms:.2f} ms" in f.evidence
    assert "(median per unit: all-gather 2.00 MiB, reduce-scatter 2.00 MiB)" in f.evidence
    assert "NVLink's peak (450 GB/s one way)" in f.evidence
    gather = _finding(d, "fsdp-exposed-gather")
    assert f"merging adjacent units in pairs saves {pairs / 1e6:.2f} ms per step" in gather.evidence
    # In the default table where the trace shows what the estimate needs.
    assert "units-merged" in [r.change for r in _path(analyze(tmp_path / "t.json")).what_if]


def test_merging_prefetched_units_gains_nothing_where_their_gathers_are_hidden(
    tmp_path: Path,
) -> None:
    # Prefetched, unit 1's all-gather runs beside unit 0's GEMM and the second
    # reduce-scatter beside a backward GEMM: what merging pairs cuts is off the step's path.
    d, facts = _diagnosed_units(tmp_path, "units-merged", prefetch=True)
    p = _path(d)
    assert float(facts.whatif.cuts["units-merged"].at(Change(units_merged=0)).op.sum()) > 0
    assert _row(p, "units-merged") == pytest.approx(p.replayed_step_s, rel=1e-9)


def _diagnosed_units(
    tmp_path: Path, what_if: str, *, prefetch: bool = False
) -> tuple[Diagnosis, Any]:
    d, facts = _fsdp_job(tmp_path, prefetch=prefetch, what_if=what_if)
    assert facts.whatif is not None
    return d, facts


def test_without_message_sizes_merging_units_is_said_unknown(tmp_path: Path) -> None:
    d, facts = _fsdp_job(tmp_path, args=False)
    assert facts.whatif is not None
    assert "units-merged" not in facts.whatif.cuts
    assert not [f for f in d.findings if f.id == "fsdp-small-units"]
    gather = _finding(d, "fsdp-exposed-gather")
    assert (
        "merging adjacent units: what it saves is unknown here (the collectives record no "
        "message size" in gather.evidence
    )


def test_units_merged_parses_with_its_k() -> None:
    assert parse_what_if("units-merged") == [Change(units_merged=0)]
    assert parse_what_if("units-merged:4") == [Change(units_merged=4)]
    assert parse_what_if("units-merged:4")[0].label == "units-merged:4"
    for bad in ("units-merged:1", "units-merged:2.5", "units-merged:x"):
        with pytest.raises(WallfinderError):
            parse_what_if(bad)
    assert not covers(Change(units_merged=0), Change(units_merged=4))


def test_exposed_gradient_sync_gets_the_levers_of_the_strategy_the_trace_shows(
    tmp_path: Path,
) -> None:
    """FSDP's last reduce-scatter, exposed before the optimizer, is told FSDP's levers, not
    DDP's bucket sizes; a job whose strategy is DDP keeps the bucket advice."""
    d = analyze(fsdp_gpu_trace(4).write(tmp_path / "fsdp.json"))
    assert d.parallelism is not None
    assert "FSDP" in {s.name for s in d.parallelism.strategies}
    exposed = next(f for f in d.findings if f.id == "exposed-comm")
    assert "reduce_dtype" in exposed.fix
    assert "bucket_cap_mb" not in exposed.fix
    ddp = analyze(comm_exposed().write(tmp_path / "ddp.json"))
    advice = next(f for f in ddp.findings if f.id == "exposed-comm").fix
    assert "bucket_cap_mb" in advice
