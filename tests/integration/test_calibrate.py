"""`wallfinder calibrate` with real torch on the CPU, in its quick mode: the printed table,
the saved profile, and the profile moving the ridge of a CPU trace's roofline."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

from tracegen import TraceBuilder
from wallfinder.cli import main
from wallfinder.hardware import cpu_spec
from wallfinder.hardware.profile import load_device_profile

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

N = 512


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """One quick calibration of this CPU (shared by the tests): its JSON and the profile."""
    path = tmp_path_factory.mktemp("calibrate") / "cpu.toml"
    out = io.StringIO()  # capsys is per test; this calibration is per module
    with contextlib.redirect_stdout(out):
        code = main(["calibrate", "--quick", "--cpu", "-o", str(path), "--format", "json"])
    assert code == 0
    result: dict[str, Any] = json.loads(out.getvalue())
    return result, path


def test_quick_calibration_measures_each_cpu_roof(
    calibrated: tuple[dict[str, Any], Path],
) -> None:
    result, path = calibrated
    assert result["schema"] == "wallfinder.calibration/1"
    assert result["kind"] == "cpu"
    assert result["threads"] == torch.get_num_threads()
    assert result["datasheet"]["key"] == "cpu"
    assert result["profile"] == str(path)
    fp32 = result["peak_flops"]["fp32"]
    # What was measured is a rate and a time, whatever this machine's speed or load today
    # (how they compare with the datasheet is a benchmark figure, printed by calibrate itself).
    assert 0 < fp32 < math.inf
    assert 0 < result["mem_bandwidth"] < math.inf
    assert 0 < result["launch_latency_s"] < math.inf
    assert result["launch_latency_kind"] == "CPU op dispatch"
    assert result["settings"]["matmul_sizes"]["fp32"] == N
    assert result["settings"]["copy_bytes"] == 64 << 20
    figures = {f["label"]: f for f in result["figures"]}
    assert list(figures) == [
        "matmul fp32",
        "matmul bf16",
        "copy bandwidth",
        "CPU op dispatch latency",
    ]
    assert figures["matmul fp32"]["value"] == fp32
    assert figures["matmul fp32"]["datasheet"] == cpu_spec().peak_flops["fp32"]
    assert figures["matmul fp32"]["of_datasheet"] == pytest.approx(fp32 / 1e12)
    assert figures["copy bandwidth"]["of_datasheet"] == pytest.approx(
        result["mem_bandwidth"] / cpu_spec().mem_bandwidth
    )


def test_saved_profile_loads_with_the_measured_figures(
    calibrated: tuple[dict[str, Any], Path],
) -> None:
    result, path = calibrated
    profile = load_device_profile(path)
    assert dict(profile.spec.peak_flops) == result["peak_flops"]
    assert profile.spec.mem_bandwidth == result["mem_bandwidth"]
    assert profile.spec.vendor == "cpu"
    cal = profile.calibration
    assert (cal.datasheet, cal.backend, cal.torch) == ("cpu", "cpu", str(torch.__version__))
    assert cal.launch_latency == result["launch_latency_s"]
    assert (cal.repetitions, cal.warmup, cal.launch_ops) == (3, 1, 1000)


def test_analyze_with_the_profile_puts_the_ridge_at_measured_peak_over_bandwidth(
    calibrated: tuple[dict[str, Any], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    result, path = calibrated
    b = TraceBuilder(device_name=None)
    for s in range(3):
        b.step(s + 1, s * 2000.0, 2000.0)
        b.host(
            "aten::mm",
            s * 2000.0 + 100.0,
            1500.0,
            args={"Input Dims": [[N, N], [N, N]], "Input type": ["float", "float"]},
        )
    trace = str(b.write(tmp_path / "cpu.json"))
    assert main(["analyze", trace, "--format", "json"]) == 0
    nominal = json.loads(capsys.readouterr().out)
    assert main(["analyze", trace, "--format", "json", "--device-profile", str(path)]) == 0
    calibrated_ = json.loads(capsys.readouterr().out)
    measured = result["peak_flops"]["fp32"] / result["mem_bandwidth"]
    assert nominal["roofline"]["ridge"]["fp32"] == pytest.approx(cpu_spec().ridge("fp32"))
    assert calibrated_["roofline"]["ridge"]["fp32"] == pytest.approx(measured)
    assert calibrated_["device"]["peak_flops"]["fp32"] == result["peak_flops"]["fp32"]
    assert calibrated_["device"]["spec_source"].startswith("calibrated: fp32")


def test_the_table_shows_each_figure_against_the_estimate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.toml"
    assert main(["calibrate", "--quick", "--cpu", "-o", str(path)]) == 0
    out = capsys.readouterr().out
    profile = load_device_profile(path)
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    fp32 = profile.spec.peak_flops["fp32"]
    assert f"{fp32 / 1e12:.0%}" in rows["matmul fp32"]  # % of the 1 TFLOP/s estimate
    assert "torch.mm n=512" in rows["matmul fp32"]
    assert "copy_ of 64 MiB" in rows["copy bandwidth"]
    latency = profile.calibration.launch_latency
    assert latency is not None
    assert f"{latency * 1e6:.2f} µs" in rows["CPU op dispatch latency"]
    assert "% of estimate" in out
    assert out.endswith(
        f"saved {path}: use it with `wallfinder analyze TRACE --device-profile {path}`\n"
    )
