"""Real Nsight Compute exports (shared/traces/ncu): each is read, every launch classified, and
the bounds agree with the file's own throughput figures (checked by hand: tiny inference and
attention kernels of a few microseconds, no unit near its peak)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from realtraces import real_trace, real_trace_params
from tracegen import TraceBuilder, training_trace
from wallfinder.api import Options, analyze, analyze_counters
from wallfinder.cli import main


@pytest.mark.parametrize("path", real_trace_params("ncu/*.csv*"))
def test_every_real_export_is_read_and_every_launch_classified(path: Path | None) -> None:
    assert path is not None
    report = analyze_counters(path)
    assert report.kernels
    for k in report.kernels:
        assert k.duration_s is not None
        assert 0 < k.duration_s < 1e-3
        assert k.bound is not None
        assert k.reason
        busiest = max(k.sm_pct or 0.0, k.memory_pct or 0.0)
        # The file's own SOL figures: the bound follows the busier unit, or neither is busy.
        assert (k.bound == "latency") == (busiest < 0.6)


def test_the_2020_export_with_program_output_and_nvtx_columns() -> None:
    report = analyze_counters(real_trace("ncu/ampere_gcn_inference_2020.ncu.csv"))
    assert len(report.kernels) == 14
    sgemm = next(k for k in report.kernels if k.name == "ampere_sgemm_32x32_sliced1x4_tn")
    # 16,704 ns (a thousands comma), SM 40.5%, memory 47.7%: neither unit is busy.
    assert sgemm.duration_s == pytest.approx(16_704e-9)
    assert (sgemm.sm_pct, sgemm.memory_pct) == (pytest.approx(0.4054), pytest.approx(0.4772))
    assert sgemm.bound == "latency"


def test_the_2021_bert_exports_count_flops_and_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    path = real_trace("ncu/a100_bert_attention_torch.ncu.csv.gz")
    report = analyze_counters(path)
    assert len(report.kernels) == 26
    sgemm = report.kernels[6]
    assert sgemm.name == "ampere_sgemm_32x32_sliced1x4_tn"
    assert sgemm.flops_basis == "sass"
    assert sgemm.flops == pytest.approx(8_847_360)
    assert sgemm.dram_bytes == pytest.approx(303_360)
    # No duration metric in this collection: elapsed cycles over the SM clock.
    assert sgemm.duration_s == pytest.approx(9583.22 / 998_252_314.81)
    assert main(["counters", str(path), "--format", "json"]) == 0
    assert '"schema": "wallfinder.counters/1"' in capsys.readouterr().out


def test_a_trace_of_the_real_exports_kernels_is_joined_launch_for_launch(tmp_path: Path) -> None:
    """A trace built with the real export's kernels, in its launch order: every kernel
    matches by its whole name, and the elementwise kernels the roofline calls bandwidth-bound
    are refuted (the counters find them latency-bound: a few µs, no unit busy)."""
    path = real_trace("ncu/a100_bert_attention_torch.ncu.csv.gz")
    names = tuple(dict.fromkeys(k.name for k in analyze_counters(path).kernels))
    trace = tmp_path / "trace.json"
    trace.write_bytes(training_trace(2, kernels=names).to_bytes())
    report = analyze_counters(path, diagnosis=analyze(trace))
    assert report.unmatched_kernels == []
    assert {c.matched_by for c in report.checks} == {"name"}
    assert sum(c.launches for c in report.checks) + report.unmatched_launches == 26
    assert {c.counter_bound for c in report.checks} == {"latency"}
    assert "refuted" in {c.status for c in report.checks}


def test_an_unrelated_programs_export_changes_nothing_in_the_diagnosis() -> None:
    """A 14-launch GCN inference's export beside an 8-rank recommender's rank: three of the
    trace's top kernels share its kernels' names (vectorized_elementwise_kernel,
    reduce_kernel, elementwise_kernel), which before re-placed them as latency-bound, refuted
    their estimates and rewrote the fourth question. Nothing else joins them: said, and the
    diagnosis is the one without counters."""
    trace = real_trace("hta/a100_8rank_control_rank0.json.gz")
    export = real_trace("ncu/ampere_gcn_inference_2020.ncu.csv")
    d = analyze(trace, Options(counters=export))
    assert d.counters is not None
    assert d.counters.mismatch is not None
    assert "of its 14 profiled launches, 1 join" in d.counters.mismatch
    assert (d.counters.checks, d.counters.findings) == ([], [])
    assert msgspec.structs.replace(d, counters=None) == analyze(trace)


def test_a_trace_of_the_real_exports_launches_joins_in_launch_order(tmp_path: Path) -> None:
    """The BERT export (no grids or device columns) beside a trace that runs its 26 launches
    in order on an A100: shown the same program by launch order, and its counters re-place
    the kernels they measured."""
    path = real_trace("ncu/a100_bert_attention_torch.ncu.csv.gz")
    names = tuple(k.name for k in analyze_counters(path).kernels)
    trace = tmp_path / "trace.json"
    builder = TraceBuilder(device_name="NVIDIA A100-SXM4-80GB")
    trace.write_bytes(training_trace(2, kernels=names, builder=builder).to_bytes())
    d = analyze(trace, Options(counters=path))
    assert d.counters is not None
    assert d.counters.mismatch is None
    assert d.counters.unmatched_launches == 0
    assert d.roofline is not None
    assert d.roofline.by_counters
