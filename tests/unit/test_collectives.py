"""The cross-rank join: collectives matched by group and order, clocks aligned from their end
times, transfer vs wait, the straggler, and what a folder of mixed or broken ranks gives."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tracegen import TraceBuilder, training_trace
from wallfinder.analysis import JobThresholds, Thresholds, TimeThresholds
from wallfinder.analysis.collectives import bus_factor, collective_name, rank_collectives
from wallfinder.analysis.verdict import job_verdict
from wallfinder.api import DASK_MISSING, Options, analyze
from wallfinder.diagnosis import Diagnosis, Verdict, Wall
from wallfinder.errors import WallfinderError
from wallfinder.trace import load_trace

NELEMS = 64 << 20  # 128 MiB of bf16


def rank_trace(
    rank: int, *, world: int = 2, late_us: float = 0.0, skew_us: int = 0, loader_us: float = 100.0
) -> TraceBuilder:
    """A rank of a data-parallel job: 4 steps, each ending in one all-reduce. A rank that is
    `late_us` late starts its all-reduce that much later (its step's data loading took longer);
    every rank's all-reduce ends at the same moment. `skew_us` shifts the rank's clock."""
    b = TraceBuilder(rank=rank, world_size=world, base_us=1_700_000_000 + skew_us)
    training_trace(4, loader_us=loader_us + late_us, builder=b)
    for s in range(4):
        end = 2000.0 * (s + 1)
        b.nccl(
            end - 400.0 + late_us,
            400.0 - late_us,
            collective="allreduce",
            nelems=NELEMS,
            group_size=world,
        )
    return b


def write_job(folder: Path, **late: float) -> Path:
    for rank in (0, 1):
        rank_trace(rank, late_us=late.get(f"r{rank}", 0.0), skew_us=3000 * rank).write(
            folder / f"rank{rank}.json"
        )
    return folder


def test_collective_names_of_every_spelling_are_one() -> None:
    assert collective_name("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)") == "allreduce"
    assert collective_name("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") == "reducescatter"
    assert collective_name("rcclkernel_allgather_ring") == "allgather"
    assert collective_name("gloo:all_reduce") == "allreduce"
    assert collective_name("_allgather_base") == "allgather"
    assert collective_name("nccl:all_to_all") == "alltoall"
    assert bus_factor("allreduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("allgather", 4) == pytest.approx(3 / 4)


def test_a_rank_records_its_collectives_with_size_and_group(tmp_path: Path) -> None:
    trace = load_trace(rank_trace(0).write(tmp_path / "r0.json"))
    c = rank_collectives(trace)
    assert len(c) == 4
    assert c.names == ["allreduce"]
    assert c.groups == ["0"]
    assert c.seq.tolist() == [0, 1, 2, 3]
    assert set(c.nbytes.tolist()) == {NELEMS * 2}
    assert set(c.size.tolist()) == {2}


def test_the_late_rank_is_the_straggler_and_the_wait_lands_on_the_others(
    tmp_path: Path,
) -> None:
    d = analyze(write_job(tmp_path, r1=300.0), workers=1)
    job = d.job
    assert job is not None
    assert job.matched == 4
    assert job.unmatched == 0
    # Rank 1's clock is 3 ms ahead: estimated from the collectives' ends.
    assert job.max_clock_skew_s == pytest.approx(0.003, abs=1e-6)
    assert [s.rank for s in job.stragglers] == [1]
    assert job.stragglers[0].late_share == 1.0
    assert "data loading" in job.stragglers[0].doing
    r0, r1 = d.ranks
    assert r0.wait_s == pytest.approx(300e-6, rel=0.01)
    assert r1.wait_s == pytest.approx(0.0)
    assert r1.late_share == 1.0
    assert r1.clock_offset_s == pytest.approx(0.003, abs=1e-6)
    row = job.collectives[0]
    assert (row.name, row.count, row.bytes, row.ranks) == ("allreduce", 4, NELEMS * 2, 2)
    assert row.transfer_s == pytest.approx(4 * 100e-6)
    # all-reduce: bus bandwidth = bytes / transfer time x 2(n-1)/n, against H100 NVLink 450 GB/s
    assert row.busbw == pytest.approx(NELEMS * 2 / 100e-6)
    assert job.link == "NVLink"
    assert job.link_peak == pytest.approx(450e9)
    assert row.pct_of_link == 1.0  # capped: the synthetic transfer is faster than the link
    assert d.findings[0].id == "straggler"
    assert job.cause == "straggler"
    assert Diagnosis.from_json(d.to_json()) == d


def test_a_balanced_job_has_no_straggler(tmp_path: Path) -> None:
    d = analyze(write_job(tmp_path), workers=1)
    assert d.job is not None
    assert d.job.stragglers == []
    assert all(r.wait_s == pytest.approx(0.0) for r in d.ranks)
    assert "straggler" not in [f.id for f in d.findings]


def test_collectives_that_disagree_in_size_are_left_out(tmp_path: Path) -> None:
    rank_trace(0).write(tmp_path / "rank0.json")
    rank_trace(0, world=2).write(tmp_path / "rank0.json")
    other = TraceBuilder(rank=1, world_size=2)
    training_trace(4, builder=other)
    for s in range(4):
        other.nccl(500.0 * s + 100.0, 50.0, collective="allreduce", nelems=NELEMS + s + 1)
    other.write(tmp_path / "rank1.json")
    d = analyze(tmp_path, workers=1)
    assert d.job is not None
    assert d.job.matched == 0
    assert d.job.unmatched == 8
    assert any("differ in name or size" in n for n in d.job.notes)


def test_a_folder_of_mixed_duplicate_and_broken_ranks_keeps_what_is_consistent(
    tmp_path: Path,
) -> None:
    write_job(tmp_path, r1=300.0)
    rank_trace(1, late_us=300.0, skew_us=3000).write(tmp_path / "rank1-copy.json")
    rank_trace(5, world=8).write(tmp_path / "other-job-rank5.json")
    text = (tmp_path / "rank0.json").read_bytes()
    (tmp_path / "truncated.json.gz").write_bytes(gzip.compress(text)[:300])
    d = analyze(tmp_path, workers=1)
    assert [r.rank for r in d.ranks] == [0, 1]
    skipped = [w for w in d.warnings if w.startswith("skipped")]
    assert len(skipped) == 3
    assert any("rank 1 again (kept rank1-copy.json)" in w for w in skipped)
    assert any("other-job-rank5.json: another job's rank (world size 8" in w for w in skipped)
    assert any("truncated.json.gz" in w for w in skipped)
    assert d.job is not None
    assert [s.rank for s in d.job.stragglers] == [1]


def test_a_missing_rank_is_said(tmp_path: Path) -> None:
    for rank in (0, 2):
        rank_trace(rank, world=4).write(tmp_path / f"rank{rank}.json")
    d = analyze(tmp_path, workers=1)
    assert d.job is not None
    assert any("2 of 4 ranks" in n and "missing: 1, 3" in n for n in d.job.notes)


def test_a_folder_with_nothing_readable_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("[{")
    (tmp_path / "b.json").write_text("not json")
    with pytest.raises(WallfinderError, match="no rank trace could be analysed"):
        analyze(tmp_path, workers=1)


def test_the_job_section_is_rendered(tmp_path: Path) -> None:
    from wallfinder.report import render

    d = analyze(write_job(tmp_path, r1=300.0), workers=1)
    for fmt in ("text", "md"):
        out = render(d, fmt)
        assert "Straggler: rank 1" in out
        assert "Clock skew (estimated)" in out
        assert "allreduce" in out


def test_each_rank_shows_its_peak_memory_when_its_trace_has_memory_events(
    tmp_path: Path,
) -> None:
    from wallfinder.report import render

    d = analyze(write_job(tmp_path), workers=1)
    assert [r.peak_allocated for r in d.ranks] == [None, None]
    assert "peak mem" not in render(d, "text")
    for rank, peak in ((0, 3 << 30), (1, 5 << 30)):
        b = rank_trace(rank, skew_us=3000 * rank)
        b.memory(50.0, 0x1000, peak, peak, peak)
        b.memory(60.0, 0x1000, -peak, 0, peak)
        b.write(tmp_path / f"rank{rank}.json")
    d = analyze(tmp_path, workers=1)
    assert [r.peak_allocated for r in d.ranks] == [3 << 30, 5 << 30]
    text = render(d, "text")
    assert "peak" in text
    assert "5.00 GiB" in text
    assert "| 5.00 GiB |" in render(d, "md")
    assert "5.00 GiB</td>" in render(d, "html")


def test_a_scheduler_without_dask_installed_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    with pytest.raises(WallfinderError, match=r"pip install 'wallfinder\[dask\]'"):
        analyze(write_job(tmp_path), scheduler="tcp://127.0.0.1:8786")


def test_the_cli_without_dask_installed_exits_2_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from wallfinder.cli import main

    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    folder = str(write_job(tmp_path))
    assert main(["analyze", folder, "--scheduler", "tcp://127.0.0.1:8786"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"wallfinder: error: {DASK_MISSING}"]


def test_the_job_thresholds_come_from_the_options(tmp_path: Path) -> None:
    # 128 MiB all-reduces are not small by default; under a 1 GiB bound they are.
    folder = write_job(tmp_path)
    assert "small-messages" not in [f.id for f in analyze(folder, workers=1).findings]
    big = Thresholds(job=JobThresholds(small_message_bytes=1 << 30))
    d = analyze(folder, Options(thresholds=big), workers=1)
    small = next(f for f in d.findings if f.id == "small-messages")
    assert "4 collectives under 1024 MiB" in small.evidence
    # A straggler must cost the others the time findings' minimum share of a step.
    late = write_job(tmp_path / "late", r1=300.0)
    strict = Thresholds(time=TimeThresholds(min_share=0.9))  # it costs about half a step
    d = analyze(late, Options(thresholds=strict), workers=1)
    assert d.job is not None
    assert d.job.stragglers == []


def test_a_folder_of_unrelated_traces_is_not_a_job(tmp_path: Path) -> None:
    # Two single-process runs: neither names a world size, so they are not ranks of a job.
    training_trace(4).write(tmp_path / "a.json")
    training_trace(5).write(tmp_path / "b.json")
    d = analyze(tmp_path, workers=1)
    assert d.job is None
    assert d.ranks == []
    assert (d.source, d.steps.total) == ("a.json", 4)
    assert any("not one job: a.json is analysed alone" in w for w in d.warnings)
    assert any(w.startswith("skipped b.json: it is not a rank of a job") for w in d.warnings)


def test_a_rank_on_another_kind_of_device_is_another_job(tmp_path: Path) -> None:
    write_job(tmp_path, r1=300.0)
    other = rank_trace(1, late_us=300.0)
    other.device_name = "AMD Instinct MI250X"
    other.write(tmp_path / "rank1-mi250.json")
    d = analyze(tmp_path, workers=1)
    assert [r.rank for r in d.ranks] == [0, 1]
    assert any(
        w.startswith("skipped rank1-mi250.json: it ran on AMD Instinct MI250X, the job on H100")
        for w in d.warnings
    )


def test_a_tie_between_the_ranks_walls_goes_to_the_lowest_rank_that_hits_one() -> None:
    """Two ranks hit the bandwidth wall and two the overhead wall, the lowest rank neither:
    the job's wall is the one the lowest of the tied ranks hits (rank 1's), and its cause
    likewise, whatever the interpreter's hash seed (a vote by set order depended on it)."""
    walls: list[tuple[Wall, str]] = [
        ("compute", "at peak"),
        ("bandwidth", "elementwise"),
        ("overhead", "host_overhead"),
        ("overhead", "data_loading"),
        ("bandwidth", "reduction"),
    ]
    verdicts = [Verdict(wall=w, cause=c, reason="", questions=[]) for w, c in walls]
    assert job_verdict(verdicts, [], None, Thresholds()) == (
        "bandwidth",
        "elementwise",
        "2 of 5 ranks hit the bandwidth wall (elementwise)",
    )
    # Once rank 0 is among the tied walls, its own wall wins (the wall named first).
    verdicts[0] = Verdict(wall="overhead", cause="startup", reason="", questions=[])
    assert job_verdict(verdicts, [], None, Thresholds())[:2] == ("overhead", "startup")


STEP_US = 2000.0
ENDS_US = (1100.0, 1550.0, 2000.0)
"""Where each step's three all-reduces end (every rank's at the same moment)."""


def turns_job(
    folder: Path,
    late: list[list[list[float]]],
    longer: list[list[list[float]]] | None = None,
    idle_us: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0),
) -> Path:
    """A 2-rank job of 4 steps of `STEP_US` (and `idle_us[step]` more, idle at its start),
    each with its compute and then three all-reduces (`ENDS_US`) of 400 µs on a rank that is
    on time: `late[rank][step][k]` is how late (µs)
    the rank reaches the step's k-th all-reduce (it starts that much later, and ends with the
    others), `longer[rank][step][k]` how much later than the others' its end is recorded (a
    rank whose kernel lingers). Rank 1's clock is 3 ms ahead."""
    for rank in (0, 1):
        b = TraceBuilder(rank=rank, world_size=2, base_us=1_700_000_000 + 3000 * rank)
        for s in range(4):
            b.step(s + 1, s * STEP_US + sum(idle_us[:s]), STEP_US + idle_us[s])
            t0 = s * STEP_US + sum(idle_us[: s + 1])
            b.dataloader(t0, 100.0)
            b.cpu_op("aten::mm", t0 + 100.0, 8.0)
            b.kernel("volta_sgemm_128x64_nn", t0 + 110.0, 500.0, launch_at=t0 + 102.0)
            for k, end in enumerate(ENDS_US):
                delay = late[rank][s][k]
                extra = longer[rank][s][k] if longer is not None else 0.0
                b.nccl(
                    t0 + end - 400.0 + delay,
                    400.0 - delay + extra,
                    collective="allreduce",
                    nelems=NELEMS,
                )
        b.write(folder / f"rank{rank}.json")
    return folder


ON_TIME = [[0.0, 0.0, 0.0]] * 4


def test_ranks_that_take_turns_arriving_last_by_a_little_have_no_straggler(
    tmp_path: Path,
) -> None:
    """A symmetric job on a busy host: whoever is last is late by 40-90 µs. By chance rank 1
    is last at 9 of the 12 all-reduces, at most of them in every step, and causes more than
    twice rank 0's wait; but it is late by about as much as rank 0 is when rank 0 is last:
    noise, not a straggler."""
    r0 = [[60.0, 0.0, 0.0], [0.0, 80.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 90.0]]
    r1 = [[0.0, 80.0, 60.0], [70.0, 0.0, 90.0], [90.0, 60.0, 40.0], [50.0, 70.0, 0.0]]
    d = analyze(turns_job(tmp_path, [r0, r1]), workers=1)
    assert d.job is not None
    assert d.job.stragglers == []
    assert "straggler" not in [f.id for f in d.findings]


def test_ranks_that_arrive_together_have_no_straggler_even_when_their_ends_differ(
    tmp_path: Path,
) -> None:
    """Both ranks reach every all-reduce at the same moment; at half of them one rank's kernel
    is recorded 100 µs longer. A tie is nobody's lateness: the first rank used to be "last"
    at every one of them, and the straggler."""
    longer0 = [[100.0, 0.0, 100.0], [0.0, 100.0, 0.0]] * 2
    longer1 = [[0.0, 100.0, 0.0], [100.0, 0.0, 100.0]] * 2
    d = analyze(turns_job(tmp_path, [ON_TIME, ON_TIME], [longer0, longer1]), workers=1)
    assert d.job is not None
    assert d.job.stragglers == []
    assert [r.late_share for r in d.ranks] == [0.0, 0.0]


def test_a_rank_late_in_most_steps_by_more_than_the_noise_is_the_straggler(
    tmp_path: Path,
) -> None:
    """Rank 1 is 300 µs late at every all-reduce of 3 steps; in the other, rank 0 is 40 µs
    late at one."""
    r0 = [[0.0, 0.0, 0.0]] * 3 + [[40.0, 0.0, 0.0]]
    r1 = [[300.0, 300.0, 300.0]] * 3 + [[0.0, 0.0, 0.0]]
    d = analyze(turns_job(tmp_path, [r0, r1]), workers=1)
    assert d.job is not None
    (s,) = d.job.stragglers
    assert (s.rank, s.late_steps, s.steps) == (1, 3, 4)
    assert s.lateness_s == pytest.approx(300e-6)
    assert s.noise_s == pytest.approx(40e-6)
    straggler = next(f for f in d.findings if f.id == "straggler")
    assert (
        "(at most of those a rank is last at in 3 of 4 steps), by a median 0.300 ms, beyond "
        "the noise (the others' lead when last 0.040 ms, the steps' spread 0.000 ms)"
    ) in straggler.evidence
    assert Diagnosis.from_json(d.to_json()) == d


def test_a_rank_late_in_one_step_only_is_an_unstable_step_not_a_straggler(
    tmp_path: Path,
) -> None:
    r1 = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [300.0, 300.0, 300.0], [0.0, 0.0, 0.0]]
    d = analyze(turns_job(tmp_path, [ON_TIME, r1]), workers=1)
    assert d.job is not None
    assert d.job.stragglers == []
    assert d.ranks[1].late_share == pytest.approx(3 / 12)


def test_a_rank_late_by_less_than_the_steps_vary_is_no_straggler(tmp_path: Path) -> None:
    """Rank 1 is 300 µs late at every all-reduce, but the steps' lengths vary by more than
    that (a host idle 0-3 ms at their start): on a busy host that is chance, not a straggler.
    With steady steps it is one."""
    r1 = [[300.0, 300.0, 300.0]] * 4
    d = analyze(turns_job(tmp_path, [ON_TIME, r1], idle_us=(0.0, 1000.0, 0.0, 3000.0)), workers=1)
    assert d.job is not None
    assert d.job.stragglers == []
    d = analyze(turns_job(tmp_path / "steady", [ON_TIME, r1]), workers=1)
    assert d.job is not None
    assert [s.rank for s in d.job.stragglers] == [1]
