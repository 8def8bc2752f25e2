"""Nsight Compute exports (`ncu --csv`): every form real files take is read into the same
figures, each launch gets its bound by counters, and beside a trace the roofline's estimate is
confirmed or refuted."""

from __future__ import annotations

import csv
import gzip
import io
import json
import shlex
import shutil
from pathlib import Path

import msgspec
import numpy as np
import pytest

from tracegen import TraceBuilder, training_trace
from wallfinder import WallfinderError
from wallfinder.analysis import Thresholds
from wallfinder.analysis.counters import BOUND_CODE, TIER_NAMES, place_counters
from wallfinder.analysis.gpu import device_ops
from wallfinder.api import Diagnosis, Options, analyze, analyze_counters, ncu_commands
from wallfinder.cli import main
from wallfinder.report.counters import shell_lines
from wallfinder.trace import base_name, load_ncu, load_trace, normalised_name

TH = Thresholds()

GEMM = "ampere_sgemm_128x128_tn"
ADD = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3>)"
)
ADD_NCU = (
    "void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char *, (int)3>>(int, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char *, (int)3>)"
)
SOFTMAX = "void <unnamed>::softmax_warp_forward<float, float, float, (int)5, (bool)0>(float *)"
SOFTMAX_TRACE = (
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 5, false>(float*)"
)

# Per kernel: its metrics as (raw name, display name, unit, value), in the export's units.
GEMM_METRICS = [
    ("gpu__time_duration.sum", "Duration", "usecond", "1,234.5"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "Compute (SM) Throughput", "%", "91.2"),
    (
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "Memory Throughput",
        "%",
        "40.1",
    ),
    ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "DRAM Throughput", "%", "22.0"),
    ("dram__bytes.sum", "DRAM Bytes", "Mbyte", "8.39"),
    ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", "Tensor", "%", "78.0"),
    ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum", "FFMA", "inst", "1,000,000"),
    ("sm__sass_thread_inst_executed_op_fadd_pred_on.sum", "FADD", "inst", "500"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "Achieved Occupancy", "%", "12.5"),
    ("launch__grid_size", "Grid Size", "", "108"),
    ("launch__block_size", "Block Size", "", "256"),
]
ADD_METRICS = [
    ("gpu__time_duration.sum", "Duration", "msecond", "0.2"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "Compute (SM) Throughput", "%", "15.0"),
    (
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "Memory Throughput",
        "%",
        "88.0",
    ),
    ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "DRAM Throughput", "%", "88.0"),
    ("lts__throughput.avg.pct_of_peak_sustained_elapsed", "L2 Cache Throughput", "%", "45.0"),
    ("dram__bytes.sum", "DRAM Bytes", "Gbyte", "0.3"),
    ("sm__sass_thread_inst_executed_op_fadd_pred_on.sum", "FADD", "inst", "25,000,000"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "Achieved Occupancy", "%", "n/a"),
]
SOFTMAX_METRICS = [
    ("gpu__time_duration.sum", "Duration", "nsecond", "4,096"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "Compute (SM) Throughput", "%", "3.0"),
    (
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "Memory Throughput",
        "%",
        "5.0",
    ),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "Achieved Occupancy", "%", "9.0"),
]
KERNELS = [(GEMM, GEMM_METRICS), (ADD_NCU, ADD_METRICS), (SOFTMAX, SOFTMAX_METRICS)]


def _csv(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return out.getvalue()


def details_page(*, old: bool = False, display: bool = False, comma: bool = False) -> str:
    """The default page: one row per metric per launch; `old` as a 2020-21 release wrote it
    (no Device/CC, `Kernel Time`, NVTX columns), `display` with the sections' display names,
    `comma` with decimal commas."""
    if old:
        head = ["ID", "Process ID", "Process Name", "Host Name", "thread Domain:Push/Pop_Range"]
        head += ["Kernel Name", "Kernel Time", "Context", "Stream"]
    else:
        head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context"]
        head += ["Stream", "Device", "CC"]
    head += ["Section Name", "Metric Name", "Metric Unit", "Metric Value"]
    head += ["Rule Name", "Rule Type", "Rule Description"]
    rows = [head]
    for i, (name, metrics) in enumerate(KERNELS):
        if old:
            ident = [str(i), "4242", "python3", "127.0.0.1", "fwd", name, "2021-Jan-01 1:00", "1"]
            ident += ["7"]
        else:
            ident = [str(i), "4242", "python3", "127.0.0.1", name, "1", "7", "0", "8.0"]
        for raw, shown, unit, value in metrics:
            if comma:
                value = value.replace(",", "_").replace(".", ",").replace("_", ".")
            section = (
                "GPU Speed Of Light Throughput" if display else "Command line profiler metrics"
            )
            rows.append([*ident, section, shown if display else raw, unit, value])
        rows.append([*ident, "SpeedOfLight", "", "", "", "SOLBottleneck", "WRN", "a rule row"])
    return _csv(rows)


SCALE = {"usecond": 1e-6, "msecond": 1e-3, "nsecond": 1e-9, "Mbyte": 1e6, "Gbyte": 1e9}


def raw_page() -> str:
    """`--page raw`: one row per launch, a column per metric, a units row under the header."""
    names = list(dict.fromkeys(raw for _, ms in KERNELS for raw, *_ in ms))
    units: dict[str, str] = {}
    for _, ms in KERNELS:
        for raw, _, unit, _ in ms:
            units.setdefault(raw, unit)
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream"]
    head += ["Block Size", "Grid Size", "Device", "CC", *names]
    rows = [head, ["", "", "", "", "", "", "", "", "", "", "", *(units[n] for n in names)]]
    for i, (name, metrics) in enumerate(KERNELS):
        # One unit per column: each value in its column's unit.
        values = {
            raw: value
            if unit == units[raw] or value == "n/a"
            else f"{float(value.replace(',', '')) * SCALE[unit] / SCALE[units[raw]]:.10g}"
            for raw, _, unit, value in metrics
        }
        rows.append(
            [
                str(i),
                "4242",
                "python3",
                "host",
                name,
                "1",
                "7",
                "(256, 1, 1)",
                "(108, 1, 1)",
                "0",
                "9.0",
                *(values.get(n, "n/a") for n in names),
            ]
        )
    return _csv(rows)


PREAMBLE = "=> loading model\nEpoch 1: loss 0.5\n==PROF== Connected to process 4242\n"
PREAMBLE += '==PROF== Profiling "kernel": 0%....50%....100% - 9 passes\n'
PREAMBLE += "==PROF== Disconnected from process 4242\n"


def write(tmp_path: Path, text: str, name: str = "kernels.csv") -> Path:
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text, encoding="utf-8")
    return path


FORMS = {
    "details": lambda: details_page(),
    "details-display-names": lambda: details_page(display=True),
    "details-old-release-preamble": lambda: PREAMBLE + details_page(old=True),
    "details-decimal-comma": lambda: details_page(comma=True),
    "raw": raw_page,
    "raw-preamble": lambda: PREAMBLE + raw_page(),
}


@pytest.mark.parametrize("form", FORMS)
def test_every_form_reads_to_the_same_figures_in_base_units(tmp_path: Path, form: str) -> None:
    export = load_ncu(write(tmp_path, FORMS[form]()))
    assert [x.name for x in export.launches] == [GEMM, ADD_NCU, SOFTMAX]
    gemm, add, softmax = export.launches
    assert gemm["duration_s"] == pytest.approx(1234.5e-6)
    assert gemm["sm_pct"] == pytest.approx(0.912)
    assert gemm["memory_pct"] == pytest.approx(0.401)
    assert gemm["dram_bytes"] == pytest.approx(8.39e6)
    assert gemm["grid"] == 108
    assert gemm["block"] == 256
    assert add["duration_s"] == pytest.approx(0.2e-3)
    assert add["dram_bytes"] == pytest.approx(0.3e9)
    assert add["occupancy"] is None  # n/a
    assert softmax["duration_s"] == pytest.approx(4096e-9)
    if form != "details-display-names":  # FLOPs come from the SASS counters' raw names
        assert gemm.flops == pytest.approx(2 * 1_000_000 + 500)  # an FMA is two FLOPs
        assert gemm.flops_basis == "sass"
        assert add.flops == pytest.approx(25e6)


def test_thousands_grouped_by_spaces_with_a_decimal_comma(tmp_path: Path) -> None:
    rows = [
        ["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"],
        ["0", GEMM, "SOL", "Duration", "nsecond", "1\u202f234,5"],
        ["0", GEMM, "SOL", "Elapsed Cycles", "cycle", "2 469"],
    ]
    launch = load_ncu(write(tmp_path, _csv(rows))).launches[0]
    assert launch["duration_s"] == pytest.approx(1234.5e-9)
    assert launch["cycles"] == 2469


def test_an_old_release_keeps_its_nvtx_range_and_has_no_device(tmp_path: Path) -> None:
    export = load_ncu(write(tmp_path, PREAMBLE + details_page(old=True), "old.ncu.csv.gz"))
    assert export.launches[0].nvtx == "fwd"
    assert export.launches[0].device is None
    assert export.page == "details"


def test_counters_give_each_kernel_its_bound_with_the_numbers(tmp_path: Path) -> None:
    report = analyze_counters(write(tmp_path, raw_page()))
    gemm, add, softmax = report.kernels
    assert (gemm.bound, gemm.unit) == ("compute", "tensor")
    assert "SM 91.2%" in gemm.reason
    assert (add.bound, add.unit) == ("memory", "dram")
    assert add.dram_bytes_per_s == pytest.approx(0.3e9 / 0.2e-3)
    assert add.ai == pytest.approx(25e6 / 0.3e9)
    assert softmax.bound == "latency"
    assert "occupancy 9.0%" in (softmax.unit or "")
    assert "launch-sized" in (softmax.unit or "")


def with_values(text: str, launch: int, values: dict[str, str]) -> str:
    """A raw page with some of one launch's metrics changed."""
    rows = list(csv.reader(io.StringIO(text)))
    for metric, value in values.items():
        rows[2 + launch][rows[0].index(metric)] = value
    return _csv(rows)


def test_a_cached_working_set_is_memory_bound_at_l2(tmp_path: Path) -> None:
    dram, l2 = "gpu__dram_throughput", "lts__throughput"
    text = with_values(
        raw_page(),
        1,
        {
            f"{dram}.avg.pct_of_peak_sustained_elapsed": "20.0",
            f"{l2}.avg.pct_of_peak_sustained_elapsed": "88.0",
        },
    )
    add = analyze_counters(write(tmp_path, text)).kernels[1]
    assert (add.bound, add.unit) == ("memory", "l2")


def test_duration_from_cycles_and_clock_when_no_duration_is_collected(tmp_path: Path) -> None:
    rows = [
        ["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"],
        ["0", GEMM, "m", "sm__cycles_elapsed.avg", "cycle", "9,000"],
        ["0", GEMM, "m", "sm__cycles_elapsed.avg.per_second", "cycle/usecond", "1,500"],
    ]
    launch = load_ncu(write(tmp_path, _csv(rows))).launches[0]
    assert launch["duration_s"] == pytest.approx(9000 / 1.5e9)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"traceEvents": []}\n', "not an Nsight Compute CSV export"),
        ("a,b,c\n1,2,3\n", "not an Nsight Compute CSV export"),
        ('"ID","Name","Value"\n"1","x","3"\n', "none of its columns is an ncu metric"),
        (details_page()[:-120], "truncated"),
        (details_page().splitlines()[0] + "\n", "no kernel launches"),
    ],
    ids=["json", "other-csv", "id-and-name-csv", "truncated", "header-only"],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, needle: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(WallfinderError, match=needle):
        load_ncu(path)
    assert main(["counters", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_a_report_without_ncu_on_path_says_how_to_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    report = tmp_path / "run.ncu-rep"
    report.write_bytes(b"\x00binary")
    with pytest.raises(WallfinderError, match=r"ncu --import .* --csv --page raw"):
        load_ncu(report)


def test_kernel_names_of_ncu_and_the_profiler_normalise_alike() -> None:
    assert normalised_name(ADD) == normalised_name(ADD_NCU)
    assert normalised_name(SOFTMAX) != normalised_name(SOFTMAX_TRACE)  # template args differ
    assert base_name(SOFTMAX) == base_name(SOFTMAX_TRACE) == "anon::softmax_warp_forward"
    assert base_name(ADD) == "at::native::vectorized_elementwise_kernel"
    mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEEEEviT0_"
    assert base_name(mangled) == base_name(ADD)
    assert base_name("_Z12scale_kernelPfi") == "scale_kernel"
    assert base_name("_ZN12_GLOBAL__N_17softmaxEv") == "anon::softmax"


SAME_DEVICE = "NVIDIA A100-SXM4-80GB"
"""The device of `details_page` (compute capability 8.0)."""


def same_program(device: str = SAME_DEVICE) -> TraceBuilder:
    """A trace of the program `details_page` profiled: its three kernels, in its launch order,
    on its device."""
    builder = TraceBuilder(device_name=device)
    return training_trace(4, kernels=(GEMM, ADD, SOFTMAX_TRACE), builder=builder)


def matching_trace(tmp_path: Path) -> Diagnosis:
    """A trace of the same program as the export: the same three kernels."""
    path = tmp_path / "trace.json"
    path.write_bytes(same_program().to_bytes())
    return analyze(path)


def test_the_join_confirms_and_refutes_the_estimate(tmp_path: Path) -> None:
    d = matching_trace(tmp_path)
    report = analyze_counters(write(tmp_path, details_page()), diagnosis=d)
    checks = {c.kernel: c for c in report.checks}
    assert set(checks) == {GEMM, ADD, SOFTMAX_TRACE}
    assert checks[ADD].matched_by == "name"
    assert checks[ADD].status == "confirmed"  # estimate bandwidth, counters memory
    assert checks[SOFTMAX_TRACE].matched_by == "base name"
    assert checks[SOFTMAX_TRACE].status == "refuted"  # estimate bandwidth, counters latency
    assert checks[GEMM].status == "no estimate"  # no shapes: the estimate says nothing
    assert report.unmatched_kernels == []
    assert report.unmatched_launches == 0
    assert [f.id for f in report.findings] == ["roofline-refuted"]


def test_a_function_name_alone_matches_the_trace_kernel(tmp_path: Path) -> None:
    """`ncu --print-kernel-base function` prints no namespaces, templates or parameters."""
    d = matching_trace(tmp_path)
    text = details_page().replace(SOFTMAX, "softmax_warp_forward")
    report = analyze_counters(write(tmp_path, text), diagnosis=d)
    check = next(c for c in report.checks if c.kernel == SOFTMAX_TRACE)
    assert check.matched_by == "function name"
    assert check.counter_bound == "latency"


def test_analyze_with_counters_adds_them_to_the_diagnosis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.json"
    trace.write_bytes(same_program().to_bytes())
    export = write(tmp_path, details_page())
    assert main(["analyze", str(trace), "--counters", str(export), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["counters"]["schema"] == "wallfinder.counters/1"
    assert {c["status"] for c in doc["counters"]["checks"]} == {
        "confirmed",
        "refuted",
        "no estimate",
    }
    Diagnosis.from_json(json.dumps(doc)).self_check()
    assert main(["analyze", str(trace), "--counters", str(export)]) == 0
    text = capsys.readouterr().out
    assert "the roofline's estimate beside the counters" in text
    assert "refuted" in text
    page = tmp_path / "report.html"
    args = ["analyze", str(trace), "--counters", str(export), "--format", "html", "-o", str(page)]
    assert main(args) == 0
    html = page.read_text(encoding="utf-8")
    assert 'id="counters"' in html
    assert ">refuted<" in html
    assert 'id="plot-counter-roofline"' in html  # the measured points, beside the estimate
    assert main(["analyze", str(trace), "--counters", str(export), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "| `softmax_warp_forward` | bandwidth | latency | refuted |" in md


def test_counters_command_prints_a_table_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = write(tmp_path, raw_page())
    assert main(["counters", str(export)]) == 0
    text = capsys.readouterr().out
    assert "compute (tensor)" in text
    assert "memory (dram)" in text
    assert "latency" in text
    assert main(["counters", str(export), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [k["bound"] for k in doc["kernels"]] == ["compute", "memory", "latency"]
    page = tmp_path / "counters.html"
    assert main(["counters", str(export), "--format", "html", "-o", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    assert html.count('<tr><td class="num">') == 3
    assert "compute (tensor)" in html


def test_collect_prints_the_ncu_commands_for_the_top_kernels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.json"
    trace.write_bytes(training_trace(4, kernels=(GEMM, ADD)).to_bytes())
    assert main(["counters", "--collect", "--trace", str(trace)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all("--launch-count 1" in line and "dram__bytes.sum" in line for line in lines)
    assert "regex:ampere_sgemm_128x128_tn" in lines[0] or "regex:ampere_sgemm" in lines[1]
    assert "regex:vectorized_elementwise_kernel" in "\n".join(lines)
    assert "--launch-skip 1" in lines[0]  # one launch per step: the first step skipped
    generic = ncu_commands()
    assert len(generic) == 1
    assert "--kernel-name" not in generic[0]


def test_missing_counters_are_said_with_the_command_to_collect_them(tmp_path: Path) -> None:
    rows = [
        ["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"],
        ["0", GEMM, "m", "launch__grid_size", "", "108"],
    ]
    report = analyze_counters(write(tmp_path, _csv(rows)))
    assert report.kernels[0].bound is None
    assert any("sm_pct" in n for n in report.notes)
    assert report.collect
    assert report.collect[0].startswith("ncu --csv --page raw --metrics")


N = 4096
MM_KERNEL = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1"


def mm_diagnosis(tmp_path: Path) -> Diagnosis:
    """Three steps of one bf16 N³ mm (a 1000 µs kernel) on an A100: the roofline estimates it
    compute-bound, 2·N³ FLOPs and 3·N²·2 bytes a call."""
    b = TraceBuilder(device_name="NVIDIA A100-SXM4-80GB")
    for s in range(3):
        t0 = s * 1500.0
        b.step(s + 1, t0, 1500.0)
        event = b.host(
            "aten::mm",
            t0 + 10,
            5.0,
            args={"Input Dims": [[N, N], [N, N]], "Input type": ["c10::BFloat16"] * 2},
        )
        b.kernel(MM_KERNEL, t0 + 20, 1000.0, launch_at=t0 + 11)
        b.events[-1]["args"]["External id"] = event["args"]["External id"]
    return analyze(b.write(tmp_path / "t.json"))


def test_the_cost_models_flops_and_bytes_are_set_against_the_counted(tmp_path: Path) -> None:
    """A bf16 4096³ mm on an A100 (estimate: compute, 2·N³ FLOPs, 3·N²·2 bytes): counters that
    count half the FLOPs and four times the bytes, the SMs busy, confirm the bound and say by
    how much the cost model is off."""
    d = mm_diagnosis(tmp_path)
    flops, nbytes = 2.0 * N**3, 3.0 * N * N * 2
    rows = [
        ["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"],
        *(
            [str(i), MM_KERNEL, "m", metric, unit, value]
            for i in range(2)
            for metric, unit, value in (
                ("gpu__time_duration.sum", "msecond", "1"),
                ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "80"),
                ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "%", "30"),
                ("dram__bytes.sum", "byte", f"{4 * nbytes:.0f}"),
                ("flop_count_hp", "", f"{flops / 2:.0f}"),
            )
        ),
    ]
    report = analyze_counters(write(tmp_path, _csv(rows)), diagnosis=d)
    (check,) = report.checks
    assert check.status == "confirmed"
    assert check.launches == 2
    assert check.estimated_flops == pytest.approx(flops)
    assert check.flops_ratio == pytest.approx(2.0)
    assert check.bytes_ratio == pytest.approx(0.25)
    assert "FLOPs 2.00x the counted" in check.detail
    assert "bytes 0.25x the counted" in check.detail
    assert report.findings == []


def test_a_report_is_exported_by_ncu_into_the_cache_never_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in `ncu` that prints a raw page for `--import`: the report is read through it,
    once, into the cache folder."""
    page = write(tmp_path, raw_page(), "page.csv")
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    cat = shutil.which("cat")
    fake.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n"{cat}" "{page}"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.setenv("WALLFINDER_CACHE", str(tmp_path / "cache"))
    reports = tmp_path / "reports"
    reports.mkdir()
    report = reports / "run.ncu-rep"
    report.write_bytes(b"\x00a binary report")
    for _ in range(2):
        export = load_ncu(report)
        assert [x.name for x in export.launches] == [GEMM, ADD_NCU, SOFTMAX]
    assert calls.read_text().splitlines() == [f"--import {report} --csv --page raw"]
    assert sorted(p.name for p in reports.iterdir()) == ["run.ncu-rep"]
    assert len(list((tmp_path / "cache" / "ncu").glob("*.csv"))) == 1


def test_a_per_kernel_summary_page_reads_its_averages_and_invocations(tmp_path: Path) -> None:
    """`ncu --print-summary per-kernel --csv`: one row per kernel and metric, Minimum,
    Maximum and Average over its Invocations."""
    head = ["ID", "Process ID", "Kernel Name", "Invocations", "Section Name", "Metric Name"]
    head += ["Metric Unit", "Minimum", "Maximum", "Average"]
    rows = [head]
    for raw, _, unit, value in ADD_METRICS:
        rows.append(["0", "42", ADD_NCU, "12", "m", raw, unit, "n/a", "n/a", value])
    report = analyze_counters(write(tmp_path, _csv(rows)))
    assert report.page == "summary"
    (add,) = report.kernels
    assert add.invocations == 12
    assert add.duration_s == pytest.approx(0.2e-3)
    assert (add.bound, add.unit) == ("memory", "dram")


@pytest.mark.parametrize("keep", [0.1, 0.37, 0.5, 0.73, 0.99])
def test_a_file_cut_anywhere_is_read_or_refused_in_one_line(tmp_path: Path, keep: float) -> None:
    text = PREAMBLE + details_page()
    path = write(tmp_path, text[: int(len(text) * keep)])
    error: WallfinderError | None = None
    try:
        launches = load_ncu(path).launches
    except WallfinderError as exc:
        error = exc
    if error is None:
        assert launches
    else:
        assert "\n" not in str(error)


def test_a_field_past_the_csv_limit_is_refused_in_one_line(tmp_path: Path) -> None:
    text = details_page().replace(GEMM, "k" * 200_000)
    with pytest.raises(WallfinderError, match="not readable as CSV"):
        load_ncu(write(tmp_path, text))


def test_a_command_broken_over_lines_pastes_into_a_shell_as_the_same_arguments() -> None:
    command = ncu_commands()[0]
    broken = shell_lines(command, width=72)
    assert max(len(line) for line in broken.splitlines()) <= 73  # the backslash past it
    # The shell removes each backslash-newline before it splits the words.
    assert shlex.split(broken.replace("\\\n", "")) == shlex.split(command)


def test_newer_short_units_and_an_export_trimmed_to_fewer_columns(tmp_path: Path) -> None:
    """Newer releases write `ns`/`us`/`ms` and `Gbyte/s`; an export trimmed to the kernel and
    metric columns (no ID) starts a launch where a metric comes round again."""
    rows = [["Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]]
    for duration, unit in (("12.40", "us"), ("853,984", "ns"), ("76.30", "ms")):
        rows += [
            [GEMM, "SOL", "Duration", unit, duration],
            [GEMM, "SOL", "Compute (SM) Throughput", "%", "77.11"],
            [GEMM, "SOL", "Memory Throughput", "%", "38.38"],
            [GEMM, "MWA", "Memory Throughput", "Gbyte/s", "1,200.00"],
            [GEMM, "SOL", "", "", ""],  # rule rows
            [GEMM, "SOL", "", "", ""],
        ]
    launches = load_ncu(write(tmp_path, _csv(rows))).launches
    assert len(launches) == 3
    assert [x["duration_s"] for x in launches] == [
        pytest.approx(12.40e-6),
        pytest.approx(853_984e-9),
        pytest.approx(76.30e-3),
    ]
    assert launches[0]["memory_pct"] == pytest.approx(0.3838)
    assert launches[0]["dram_bytes_per_s"] == pytest.approx(1.2e12)
    k = analyze_counters(write(tmp_path, _csv(rows))).kernels[0]
    assert k.dram_bytes == pytest.approx(1.2e12 * 12.40e-6)
    assert (k.bound, k.unit) == ("compute", "cuda cores")


def test_a_refuted_matmul_is_said_against_the_verdicts_fourth_question(tmp_path: Path) -> None:
    """A bf16 mm the roofline calls compute-bound whose counters find neither unit busy."""
    d = mm_diagnosis(tmp_path)
    rows = [
        ["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"],
        ["0", MM_KERNEL, "SOL", "Duration", "ms", "1"],
        ["0", MM_KERNEL, "SOL", "Compute (SM) Throughput", "%", "30"],
        ["0", MM_KERNEL, "SOL", "Memory Throughput", "%", "20"],
    ]
    report = analyze_counters(write(tmp_path, _csv(rows)), diagnosis=d)
    assert [c.status for c in report.checks] == ["refuted"]
    assert any("fourth question counts 1 matmul kernel(s)" in n for n in report.notes)
    assert [f.id for f in report.findings] == ["roofline-refuted"]


def _mm_trace(
    tmp_path: Path, grids: list[int], dur_us: float = 500.0, blocks: list[int] | None = None
) -> Path:
    """Steps of bf16 N³ mm calls on an A100, one kernel per grid in `grids` a step: at 500 µs
    each runs at ~88% of its roof (2·N³ FLOPs in 0.44 ms at 312 TFLOP/s), near peak."""
    b = TraceBuilder(device_name="NVIDIA A100-SXM4-80GB")
    step = 100.0 + len(grids) * (dur_us + 50.0)
    for s in range(3):
        t0 = s * step
        b.step(s + 1, t0, step)
        for i, (grid, block) in enumerate(zip(grids, blocks or [256] * len(grids), strict=True)):
            at = t0 + 10 + i * (dur_us + 50.0)
            event = b.host(
                "aten::mm",
                at,
                5.0,
                args={"Input Dims": [[N, N], [N, N]], "Input type": ["c10::BFloat16"] * 2},
            )
            size = {"grid": [grid, 1, 1], "block": [block, 1, 1]}
            b.kernel(MM_KERNEL, at + 10, dur_us, launch_at=at + 1, args=size)
            b.events[-1]["args"]["External id"] = event["args"]["External id"]
    return b.write(tmp_path / "t.json")


def _mm_export(
    tmp_path: Path, launches: list[tuple[int, float, float]], blocks: list[int] | None = None
) -> Path:
    """A details page of `MM_KERNEL` launches, each (grid blocks, SM %, memory %), with
    `blocks` their Block Size where given."""
    rows = [["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]]
    for i, (grid, sm, mem) in enumerate(launches):
        if blocks is not None:
            rows.append([str(i), MM_KERNEL, "Launch", "Block Size", "", str(blocks[i])])
        rows += [
            [str(i), MM_KERNEL, "SOL", "Duration", "usecond", "500"],
            [str(i), MM_KERNEL, "SOL", "Compute (SM) Throughput", "%", str(sm)],
            [str(i), MM_KERNEL, "SOL", "Memory Throughput", "%", str(mem)],
            [str(i), MM_KERNEL, "Launch", "Grid Size", "", str(grid)],
        ]
    return write(tmp_path, _csv(rows))


def test_a_refuted_bound_flips_the_fourth_question_and_says_which_kernels_moved(
    tmp_path: Path,
) -> None:
    """The roofline puts the mm near peak; its counters find neither unit busy (latency-
    bound at 30% SM): the fourth question turns to no, on the counted figure, and says so."""
    trace = _mm_trace(tmp_path, [108])
    before = analyze(trace)
    assert before.verdict.questions[3].answer == "yes"
    export = _mm_export(tmp_path, [(108, 30.0, 20.0)])
    d = analyze(trace, Options(counters=export))
    d.self_check()
    q4 = d.verdict.questions[3]
    assert q4.answer == "no"
    assert q4.value == pytest.approx(0.30)
    assert "re-placed by hardware counters" in q4.detail
    assert "estimate compute, counters latency" in q4.detail
    assert d.verdict.cause == "below peak: precision/shape/kernel"
    assert d.roofline is not None
    assert d.roofline.latency_bound_share == pytest.approx(1.0)
    row = next(k for k in d.kernels if k.name == MM_KERNEL)
    assert (row.bound, row.bound_basis, row.estimated_bound) == ("latency", "counters", "compute")
    # The finding that used the estimate uses the counted bound and % of roof.
    below = next(f for f in d.findings if f.id == "matmul-below-roof")
    assert "at 30% of roof (latency-bound by counters)" in below.evidence
    assert d.counters is not None
    assert d.counters.mismatch is None  # joined by grid: the same program
    assert [(c.status, c.estimated_bound, c.counter_bound) for c in d.counters.checks] == [
        ("refuted", "compute", "latency")
    ]


def test_a_matmul_the_counters_call_memory_bound_leaves_the_matmul_share(tmp_path: Path) -> None:
    """Counted memory-bound, the mm streams its operands: the third question's bandwidth
    share, not a compute-bound matmul, so the wall is bandwidth."""
    trace = _mm_trace(tmp_path, [108])
    d = analyze(trace, Options(counters=_mm_export(tmp_path, [(108, 30.0, 85.0)])))
    d.self_check()
    assert d.verdict.questions[2].answer == "no"
    assert d.verdict.wall == "bandwidth"
    assert d.roofline is not None
    assert d.roofline.matmul_bandwidth_share == pytest.approx(1.0)
    assert d.roofline.pct_of_roof_matmul is None


def test_launches_pair_by_grid_before_name_and_in_launch_order(tmp_path: Path) -> None:
    """Two same-name mm kernels a step with grids 64 and 216; the export profiled them in the
    other order. Each pairs with the launch of its grid: the 216-block one is latency-bound,
    the 64-block one compute-bound."""
    trace = _mm_trace(tmp_path, [64, 216])
    export = _mm_export(tmp_path, [(216, 30.0, 20.0), (64, 90.0, 30.0)])
    d = analyze(trace, Options(counters=export))
    assert d.counters is not None
    (check,) = d.counters.checks
    assert check.matched_by == "name and grid"
    assert check.launches == 2
    assert d.roofline is not None
    assert d.roofline.latency_bound_share == pytest.approx(0.5)
    # Without grids in the export the launches pair by name, in launch order.
    text = export.read_text().replace('"Grid Size"', '"Something"')
    d = analyze(trace, Options(counters=write(tmp_path, text)))
    assert d.counters is not None
    assert d.counters.mismatch is None  # the launches follow each other as the kernels do
    assert d.counters.checks[0].matched_by == "name"
    assert d.roofline is not None
    assert d.roofline.latency_bound_share == pytest.approx(0.5)


def test_counters_in_markdown_and_the_measured_points_on_the_html_roofline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = write(tmp_path, raw_page())
    assert main(["counters", str(export), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("### Hardware counters: `kernels.csv`")
    rows = [line for line in md.splitlines() if line.startswith("| 0 ") or line.startswith("| 1 ")]
    assert len(rows) == 2
    assert rows[0].endswith("| compute (tensor) |")
    assert rows[1].endswith("| memory (dram) |")
    assert "| latency |" in md  # a latency-bound launch's reasons are not its unit
    page = tmp_path / "counters.html"
    assert main(["counters", str(export), "--format", "html", "-o", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    figures = json.loads(html.split('id="wf-figures"', 1)[1].split(">", 1)[1].split("</script>")[0])
    points = figures["plot-counter-roofline"]["data"]
    # The launches with counted FLOPs and DRAM bytes, at their achieved AI and FLOP/s.
    report = analyze_counters(export)
    placed = {k.id: k for k in report.kernels if k.ai and k.flops_per_s}
    assert sorted(x for trace in points for x in trace["x"]) == sorted(
        k.ai for k in placed.values()
    )
    assert {trace["name"] for trace in points} == {f"{k.bound}-bound" for k in placed.values()}
    assert 'id="plot-counter-roofline"' in html


def test_a_function_name_several_trace_kernels_share_joins_none_of_them(tmp_path: Path) -> None:
    """`vectorized_elementwise_kernel` alone could be the add or the mul: neither is
    re-placed by it, and both are said unmatched."""
    mul = ADD.replace("CUDAFunctor_add", "MulFunctor")
    trace = tmp_path / "trace.json"
    trace.write_bytes(training_trace(4, kernels=(GEMM, ADD, mul)).to_bytes())
    rows = [["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]]
    rows += [
        ["0", "vectorized_elementwise_kernel", "SOL", "Duration", "usecond", "5"],
        ["0", "vectorized_elementwise_kernel", "SOL", "Compute (SM) Throughput", "%", "90"],
        ["0", "vectorized_elementwise_kernel", "SOL", "Memory Throughput", "%", "10"],
    ]
    d = analyze(trace, Options(counters=write(tmp_path, _csv(rows))))
    assert d.counters is not None
    assert d.counters.checks == []
    assert {ADD, mul} <= set(d.counters.unmatched_kernels)
    assert d.roofline is not None
    assert d.roofline.by_counters == []


def test_same_grid_launches_pair_by_block_where_both_sides_carry_it(tmp_path: Path) -> None:
    """Two mm kernels a step, both 108 blocks, of 128 and 256 threads; the export has them the
    other way round. Paired by block, every 128-thread kernel takes the latency-bound launch;
    without blocks in the export they pair by position, the first of each step with the
    first launch."""
    path = _mm_trace(tmp_path, [108, 108], blocks=[128, 256])
    trace = load_trace(path)
    dev = device_ops(trace)
    assert dev is not None
    threads = np.array([trace.threads(int(b)) for b in dev.ops.block])
    launches = [(108, 90.0, 30.0), (108, 30.0, 20.0)]
    placed = place_counters(trace, dev, load_ncu(_mm_export(tmp_path, launches, [256, 128])), TH)
    assert set(placed.bound[threads == 128].tolist()) == {BOUND_CODE["latency"]}
    assert set(placed.bound[threads == 256].tolist()) == {BOUND_CODE["compute"]}
    assert {TIER_NAMES[t] for t in placed.tier.tolist()} == {"name and grid"}
    placed = place_counters(trace, dev, load_ncu(_mm_export(tmp_path, launches)), TH)
    assert set(placed.bound[threads == 128].tolist()) == {BOUND_CODE["compute"]}
    d = analyze(path, Options(counters=_mm_export(tmp_path, launches, [256, 128])))
    assert d.counters is not None
    assert d.counters.checks[0].matched_by == "name and grid"


def test_counters_with_a_trace_joins_launch_by_launch_as_analyze_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _mm_trace(tmp_path, [64, 216])
    export = _mm_export(tmp_path, [(216, 30.0, 20.0), (64, 90.0, 30.0)])
    assert main(["counters", str(export), "--trace", str(trace), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(c["matched_by"], c["launches"]) for c in doc["checks"]] == [("name and grid", 2)]
    assert any("place these kernels by their counters" in n for n in doc["notes"])


def test_an_export_of_another_program_joined_by_name_alone_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The mm kernel's name is in both, but the profiled launch ran a 64-block grid where
    every kernel of the trace runs 108: nothing shows the export is this program, so it is
    said not to match and the diagnosis is the one without counters (the fourth question
    stays yes; before, the name alone flipped it)."""
    trace = _mm_trace(tmp_path, [108])
    export = _mm_export(tmp_path, [(64, 30.0, 20.0)])
    d = analyze(trace, Options(counters=export))
    d.self_check()
    assert d.counters is not None
    assert d.counters.mismatch is not None
    assert "the export does not match this trace" in d.counters.mismatch
    assert "of its 1 profiled launches, 0 join" in d.counters.mismatch
    assert (d.counters.checks, d.counters.findings) == ([], [])
    assert d.counters.unmatched_kernels == [MM_KERNEL]
    assert d.counters.unmatched_launches == 1
    assert d.counters.collect  # how to collect this program's own counters
    assert msgspec.structs.replace(d, counters=None) == analyze(trace)
    assert d.verdict.questions[3].answer == "yes"
    assert main(["analyze", str(trace), "--counters", str(export)]) == 0
    text = capsys.readouterr().out
    assert "the export does not match this trace" in text
    assert "refuted" not in text
    assert main(["analyze", str(trace), "--counters", str(export), "--format", "md"]) == 0
    assert "the export does not match this trace" in capsys.readouterr().out


def test_an_export_from_another_device_changes_nothing(tmp_path: Path) -> None:
    """The same kernels in the same order, but the export ran on compute capability 8.0 and
    the trace on an H100 (9.0): not the same program's counters, joined or saved."""
    path = tmp_path / "trace.json"
    path.write_bytes(same_program("NVIDIA H100 80GB HBM3").to_bytes())
    export = write(tmp_path, details_page())
    d = analyze(path, Options(counters=export))
    assert d.counters is not None
    assert d.counters.mismatch is not None
    assert "compute capability 8.0 and the trace's device is 9.0" in d.counters.mismatch
    assert d.counters.checks == []
    assert msgspec.structs.replace(d, counters=None) == analyze(path)
    saved = analyze_counters(export, diagnosis=analyze(path))
    assert saved.mismatch == d.counters.mismatch
    assert (saved.checks, saved.findings) == ([], [])
    # The export's own CC column is read; older releases have none.
    assert {x.capability for x in load_ncu(export).launches} == {"8.0"}
    old = load_ncu(write(tmp_path, details_page(old=True), "old.csv"))
    assert {x.capability for x in old.launches} == {None}


def test_the_same_program_on_its_device_still_joins(tmp_path: Path) -> None:
    """`details_page` beside its own program on its A100: joined by launch order (two of its
    three launches carry no grid), the estimates confirmed and refuted."""
    path = tmp_path / "trace.json"
    path.write_bytes(same_program().to_bytes())
    d = analyze(path, Options(counters=write(tmp_path, details_page())))
    assert d.counters is not None
    assert d.counters.mismatch is None
    assert {c.status for c in d.counters.checks} == {"confirmed", "refuted", "no estimate"}
    assert d.roofline is not None
    assert d.roofline.by_counters  # the refuted softmax is placed by its counters


def test_a_tie_between_units_goes_to_the_first_launch_not_to_string_hashing() -> None:
    # Tied units were chosen in a set's order, which changes with each process's string
    # hashing (PYTHONHASHSEED): the same export and trace gave another report on each run.
    from wallfinder.analysis.counters import _check
    from wallfinder.diagnosis import CounterKernel, KernelRow

    figures = dict.fromkeys(
        (
            *("grid", "block", "sm_pct", "memory_pct", "dram_pct", "l1_pct", "l2_pct"),
            *("dram_bytes", "l2_bytes", "flops", "flops_basis", "tensor_pct", "ai"),
            *("tensor_instructions", "flops_per_s", "dram_bytes_per_s", "occupancy"),
        )
    )
    launches = [
        CounterKernel(
            id=i,
            name="k",
            duration_s=1e-6,
            bound="latency",
            unit=f"unit {i:02d}",
            reason="",
            **figures,
        )
        for i in range(30)
    ]
    row = KernelRow(name="k", cls="elementwise", count=30, time_s=3e-5, share=1.0)
    assert _check(row, "name", launches, TH.counters).counter_unit == "unit 00"
