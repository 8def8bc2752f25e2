"""Calibrated device profiles without torch: writing and loading one, laying it over the
datasheet, its effect on the roofline of a diagnosis, and the errors a bad file gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tracegen import TraceBuilder
from wallfinder import Options, WallfinderError, analyze
from wallfinder.capture.calibrate import CalibrationResult, Figure, Settings
from wallfinder.cli import main
from wallfinder.cli.commands.calibrate import render
from wallfinder.hardware import DeviceSpec, cpu_spec, get_spec, load_spec_file
from wallfinder.hardware.profile import (
    Calibration,
    load_device_profile,
    profile_toml,
    write_device_profile,
)

A100 = "NVIDIA A100-SXM4-80GB"
CPU_FP32 = 200e9
CPU_BF16 = 800e9
CPU_BANDWIDTH = 40e9
N = 512


def cpu_measured() -> DeviceSpec:
    return DeviceSpec(
        key="cpu-calibrated",
        name="AMD EPYC (calibrated)",
        vendor="cpu",
        peak_flops={"fp32": CPU_FP32, "bf16": CPU_BF16},
        mem_bandwidth=CPU_BANDWIDTH,
        source="calibrated",
    )


def cpu_calibration() -> Calibration:
    return Calibration(
        device="AMD EPYC",
        datasheet="cpu",
        date="2025-06-01T12:00:00Z",
        torch="2.13.0+cpu",
        backend="cpu",
        threads=2,
        matmul_sizes={"fp32": 2048, "bf16": 2048},
        copy_bytes=256 << 20,
        repetitions=5,
        warmup=2,
        launch_ops=5000,
        launch_latency=2.5e-6,
        launch_latency_kind="CPU op dispatch",
    )


@pytest.fixture
def cpu_profile(tmp_path: Path) -> Path:
    return write_device_profile(tmp_path / "cpu.toml", cpu_measured(), cpu_calibration())


@pytest.fixture
def a100_profile(tmp_path: Path) -> Path:
    """An A100 measured at fp32 (TF32 off) 18 TFLOP/s, bf16 250 TFLOP/s and 1.6 TB/s."""
    measured = DeviceSpec(
        key="a100-sxm4-80gb-calibrated",
        name=f"{A100} (calibrated)",
        vendor="nvidia",
        peak_flops={"fp32": 18e12, "bf16": 250e12},
        mem_bandwidth=1.6e12,
        tensor_cores=True,
        source="calibrated",
        names=(A100,),
    )
    calibration = Calibration(device=A100, datasheet="a100-sxm4-80gb", backend="cuda 12.4")
    return write_device_profile(tmp_path / "a100.toml", measured, calibration)


def cpu_mm_trace() -> TraceBuilder:
    """3 CPU steps of 2000 µs, each with a 1500 µs fp32 mm of two N×N matrices."""
    b = TraceBuilder(device_name=None)
    for s in range(3):
        t0 = s * 2000.0
        b.step(s + 1, t0, 2000.0)
        b.host(
            "aten::mm",
            t0 + 100.0,
            1500.0,
            args={"Input Dims": [[N, N], [N, N]], "Input type": ["float", "float"]},
        )
    return b


# --- the file ----------------------------------------------------------------------------------


def test_profile_round_trips_through_its_file(cpu_profile: Path) -> None:
    profile = load_device_profile(cpu_profile)
    assert profile.file == "cpu.toml"
    assert profile.calibration == cpu_calibration()
    spec = profile.spec
    assert (spec.key, spec.name, spec.vendor) == ("cpu-calibrated", "AMD EPYC (calibrated)", "cpu")
    assert dict(spec.peak_flops) == {"fp32": CPU_FP32, "bf16": CPU_BF16}
    assert spec.mem_bandwidth == CPU_BANDWIDTH


def test_profile_is_a_spec_file_of_the_measured_roofs(cpu_profile: Path) -> None:
    spec = load_spec_file(cpu_profile)
    assert dict(spec.peak_flops) == {"fp32": CPU_FP32, "bf16": CPU_BF16}
    assert spec.ridge("fp32") == pytest.approx(CPU_FP32 / CPU_BANDWIDTH)
    assert spec.source == (
        "user file: cpu.toml (wallfinder calibrate 2025-06-01T12:00:00Z, torch 2.13.0+cpu)"
    )


def test_profile_holds_no_machine_paths(cpu_profile: Path) -> None:
    text = cpu_profile.read_text(encoding="utf-8")
    assert str(cpu_profile.parent) not in text
    assert str(Path.home()) not in text


def test_names_with_quotes_backslashes_and_non_ascii_survive_the_file(tmp_path: Path) -> None:
    name = 'GPU "Ω" \\ x\x7f'
    measured = DeviceSpec(
        key="odd",
        name=name,
        vendor="other",
        peak_flops={"fp16": 1e12},
        mem_bandwidth=1e11,
        source="calibrated",
        names=(name,),
    )
    path = write_device_profile(tmp_path / "odd.toml", measured, Calibration(device=name))
    profile = load_device_profile(path)
    assert (profile.spec.name, profile.spec.names, profile.calibration.device) == (
        name,
        (name,),
        name,
    )


def test_a_toml_date_is_read_as_iso_text(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    text = profile_toml(cpu_measured(), Calibration()) + "date = 2025-06-01\n"
    path.write_text(text, encoding="utf-8")
    assert load_device_profile(path).calibration.date == "2025-06-01"


# --- laid over the datasheet -------------------------------------------------------------------


def test_measured_roofs_replace_the_datasheets_only_for_the_dtypes_measured(
    a100_profile: Path,
) -> None:
    datasheet = get_spec("a100-sxm4-80gb")
    spec = load_device_profile(a100_profile).over(None)
    assert spec.peak("fp32") == 18e12
    assert spec.peak("bf16") == 250e12
    for dtype in ("fp64", "tf32", "fp16", "int8"):
        assert spec.peak(dtype) == datasheet.peak(dtype)
    assert spec.mem_bandwidth == 1.6e12
    assert spec.ridge("bf16") == pytest.approx(250e12 / 1.6e12)
    assert spec.ridge("fp16") == pytest.approx(312e12 / 1.6e12)
    assert (spec.vendor, spec.sm_count, spec.tensor_cores) == ("nvidia", 108, True)
    assert spec.interconnect == datasheet.interconnect
    assert not spec.estimate
    assert spec.source == (
        "calibrated: fp32, bf16 peaks and memory bandwidth measured (a100.toml); "
        "fp64, tf32, fp16, int8 from a100-sxm4-80gb (datasheet)"
    )


def test_a_profile_without_a_datasheet_is_its_measured_roofs(tmp_path: Path) -> None:
    measured = DeviceSpec(
        key="x",
        name="X",
        vendor="other",
        peak_flops={"fp16": 1e12},
        mem_bandwidth=1e11,
        source="calibrated",
    )
    path = write_device_profile(tmp_path / "x.toml", measured, Calibration(device="X"))
    spec = load_device_profile(path).over(None)
    assert dict(spec.peak_flops) == {"fp16": 1e12}
    assert spec.source.startswith("calibrated: fp16 peaks and memory bandwidth measured")


def test_options_lay_the_profile_over_the_traces_device(a100_profile: Path, tmp_path: Path) -> None:
    b = TraceBuilder(device_name=A100)
    b.step(1, 0.0, 100.0)
    b.kernel("ampere_sgemm_128x64_nn", 20.0, 50.0, launch_at=10.0)
    d = analyze(b.write(tmp_path / "t.json"), Options(device_profile=a100_profile))
    assert d.device.peak_flops is not None
    assert d.device.peak_flops["bf16"] == 250e12
    assert d.device.peak_flops["tf32"] == 156e12
    assert d.device.mem_bandwidth == 1.6e12
    assert (d.device.spec_source or "").startswith("calibrated:")
    assert "(calibrated)" in (d.device.note or "")


def test_a_profile_of_another_device_is_refused(cpu_profile: Path, tmp_path: Path) -> None:
    b = TraceBuilder(device_name="NVIDIA H100 80GB HBM3")
    b.step(1, 0.0, 100.0)
    b.kernel("ampere_sgemm_128x64_nn", 20.0, 50.0, launch_at=10.0)
    with pytest.raises(WallfinderError, match=r"cpu\.toml was measured on AMD EPYC, but the trace"):
        analyze(b.write(tmp_path / "t.json"), Options(device_profile=cpu_profile))


def test_a_calibrated_cpu_profile_moves_the_ridge_of_a_cpu_trace(
    cpu_profile: Path, tmp_path: Path
) -> None:
    trace = cpu_mm_trace().write(tmp_path / "t.json")
    nominal = analyze(trace)
    calibrated = analyze(trace, Options(device_profile=cpu_profile))
    assert nominal.roofline is not None
    assert calibrated.roofline is not None
    cpu = cpu_spec()
    assert nominal.roofline.ridge["fp32"] == pytest.approx(cpu.ridge("fp32"))
    assert calibrated.roofline.ridge["fp32"] == pytest.approx(CPU_FP32 / CPU_BANDWIDTH)
    assert calibrated.roofline.ridge["bf16"] == pytest.approx(CPU_BF16 / CPU_BANDWIDTH)
    # fp64 was not measured: the estimate's peak over the measured bandwidth.
    assert calibrated.roofline.ridge["fp64"] == pytest.approx(cpu.peak_flops["fp64"] / 40e9)
    # MFU is against the measured fp32 peak: 2·N³ FLOP per 2000 µs step.
    assert calibrated.mfu.value == pytest.approx(2.0 * N**3 / 2000e-6 / CPU_FP32)
    assert calibrated.device.matched_spec == "AMD EPYC (calibrated)"
    assert (calibrated.device.spec_source or "").startswith("calibrated: fp32, bf16")
    assert "nominal estimate" not in (calibrated.device.note or "")
    assert "nominal estimate" in (nominal.device.note or "")
    # The verdict's fourth answer is judged against the measured peak, and no longer says that
    # its peak is a guess.
    assert "nominal estimate" in nominal.verdict.questions[3].detail
    assert "nominal estimate" not in calibrated.verdict.questions[3].detail


def test_analyze_takes_a_device_profile_flag(
    cpu_profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = cpu_mm_trace().write(tmp_path / "t.json")
    args = ["analyze", str(trace), "--format", "json", "--device-profile", str(cpu_profile)]
    assert main(args) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert out["roofline"]["ridge"]["fp32"] == pytest.approx(CPU_FP32 / CPU_BANDWIDTH)
    assert out["device"]["spec_source"].startswith("calibrated")


# --- bad files ---------------------------------------------------------------------------------

GOOD_SPEC = 'vendor = "cpu"\nmem_bandwidth = 4e10\n[peak_flops]\nfp32 = 2e11\n'

BAD_PROFILES = {
    "plain-spec-file": (GOOD_SPEC, r"not a calibrated device profile \(no \[calibration\] table\)"),
    "calibration-not-a-table": (
        "calibration = 3\n" + GOOD_SPEC,
        "calibration must be a table",
    ),
    "unknown-datasheet": (
        GOOD_SPEC + '[calibration]\ndatasheet = "a200"\n',
        "calibration.datasheet: unknown device 'a200'",
    ),
    "negative-latency": (
        GOOD_SPEC + "[calibration]\nlaunch_latency = -1e-6\n",
        "calibration.launch_latency must be a positive number",
    ),
    "text-threads": (
        GOOD_SPEC + '[calibration]\nthreads = "two"\n',
        "calibration.threads must be a positive whole number",
    ),
    "unknown-size-dtype": (
        GOOD_SPEC + "[calibration.matmul_sizes]\nfloat = 512\n",
        "calibration.matmul_sizes: unknown dtype 'float'",
    ),
    "fractional-size": (
        GOOD_SPEC + "[calibration.matmul_sizes]\nfp32 = 51.2\n",
        "calibration.matmul_sizes.fp32 must be a positive whole number",
    ),
    "misspelt-key": (
        GOOD_SPEC + '[calibration]\ndevise = "x"\n',
        "calibration.devise: unknown key",
    ),
    "no-bandwidth": (
        "[peak_flops]\nfp32 = 2e11\n[calibration]\n",
        "mem_bandwidth is missing",
    ),
    "not-toml": ("[calibration\n", "not valid TOML"),
}


@pytest.mark.parametrize(("text", "message"), BAD_PROFILES.values(), ids=list(BAD_PROFILES))
def test_bad_profile_is_one_line_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(WallfinderError, match=message) as info:
        load_device_profile(path)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("bad.toml: ")


def test_missing_profile(tmp_path: Path) -> None:
    with pytest.raises(WallfinderError, match="device profile not found"):
        load_device_profile(tmp_path / "nowhere.toml")


def test_cli_says_a_bad_profile_in_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = cpu_mm_trace().write(tmp_path / "t.json")
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD_SPEC, encoding="utf-8")
    assert main(["analyze", str(trace), "--device-profile", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("wallfinder: error: bad.toml: not a calibrated device profile")
    assert err.count("\n") == 1


# --- calibrate without torch -------------------------------------------------------------------


def test_calibrate_without_torch_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert main(["calibrate", "-o", str(tmp_path / "p.toml")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "wallfinder: error: calibrate measures the device with torch, which is not installed: "
        "pip install 'wallfinder[torch]'\n"
    )
    assert not (tmp_path / "p.toml").exists()


def test_the_calibrate_command_does_not_import_torch() -> None:
    code = "import sys, wallfinder.cli.commands.calibrate; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- a result, saved and shown -----------------------------------------------------------------


def cpu_result() -> CalibrationResult:
    cpu = cpu_spec()
    figures = (
        Figure(
            kind="matmul",
            label="matmul fp32",
            dtype="fp32",
            value=CPU_FP32,
            unit="FLOP/s",
            datasheet=cpu.peak_flops["fp32"],
            method="torch.mm n=2048",
        ),
        Figure(
            kind="matmul",
            label="matmul bf16",
            dtype="bf16",
            value=None,
            unit="FLOP/s",
            datasheet=None,
            method="not measured: no bf16",
        ),
        Figure(
            kind="copy",
            label="copy bandwidth",
            dtype=None,
            value=CPU_BANDWIDTH,
            unit="B/s",
            datasheet=cpu.mem_bandwidth,
            method="copy_ of 256 MiB",
        ),
        Figure(
            kind="launch",
            label="CPU op dispatch latency",
            dtype=None,
            value=2.5e-6,
            unit="s",
            datasheet=None,
            method="x.add_(1)",
        ),
    )
    return CalibrationResult(
        device="AMD EPYC",
        kind="cpu",
        backend="cpu",
        torch="2.13.0+cpu",
        date="2025-06-01T12:00:00Z",
        threads=2,
        datasheet=cpu,
        figures=figures,
        peak_flops={"fp32": CPU_FP32},
        mem_bandwidth=CPU_BANDWIDTH,
        launch_latency_s=2.5e-6,
        launch_latency_kind="CPU op dispatch",
        settings=Settings(quick=True).resolved(gpu=False),
        matmul_sizes={"fp32": 512},
    )


def test_a_result_saves_the_profile_analyze_reads(tmp_path: Path) -> None:
    path = cpu_result().save(tmp_path / "wallfinder-device.toml")
    profile = load_device_profile(path)
    assert dict(profile.spec.peak_flops) == {"fp32": CPU_FP32}
    assert profile.spec.mem_bandwidth == CPU_BANDWIDTH
    cal = profile.calibration
    assert (cal.datasheet, cal.threads, cal.repetitions, cal.warmup) == ("cpu", 2, 3, 1)
    assert (cal.copy_bytes, cal.launch_ops, dict(cal.matmul_sizes)) == (
        64 << 20,
        1000,
        {"fp32": 512},
    )
    assert cal.launch_latency == 2.5e-6
    assert profile.over(None).ridge("fp32") == pytest.approx(CPU_FP32 / CPU_BANDWIDTH)


def test_a_profile_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(WallfinderError, match="cannot write the device profile") as info:
        cpu_result().save(tmp_path)  # a folder
    assert "\n" not in str(info.value)


def test_the_table_shows_measured_against_the_datasheet() -> None:
    text = render(cpu_result(), Path("p.toml"), width=100)
    rows = {line.split("  ")[0]: line for line in text.splitlines()}
    assert "200 GFLOP/s" in rows["matmul fp32"]
    assert "1 TFLOP/s" in rows["matmul fp32"]
    assert "20%" in rows["matmul fp32"]  # 200 GFLOP/s of the 1 TFLOP/s estimate
    assert "not measured: no bf16" in rows["matmul bf16"]
    assert "40%" in rows["copy bandwidth"]  # 40 of 100 GB/s
    assert "2.50 µs" in rows["CPU op dispatch latency"]
    assert "% of estimate" in text  # the CPU's figures are an estimate, not a datasheet
    assert text.endswith(
        "saved p.toml: use it with `wallfinder analyze TRACE --device-profile p.toml`\n"
    )
    assert all(len(line) <= 100 for line in text.splitlines()[:-1])
