"""The device a trace ran on: the names drivers write, MIG slices, family names a person types,
and inference from deviceProperties and kernel names — always said as inference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.realtraces import real_trace
from tests.tracegen import TraceBuilder

from wallfinder.api import Options, analyze
from wallfinder.cli import main
from wallfinder.hardware import (
    DeviceEvidence,
    all_specs,
    evidence_of,
    family_members,
    get_spec,
    identify_device,
    match_device,
)
from wallfinder.report import render

GIB = 2**30

# --- the catalogue -----------------------------------------------------------------------------


def test_every_accelerator_says_its_source_and_architecture() -> None:
    for spec in all_specs():
        if spec.vendor == "cpu":
            continue
        assert spec.source.split(":", 1)[0] in ("datasheet", "estimate"), spec.key
        assert len(spec.source) > len("datasheet: ") + 10, spec.key
        assert spec.arch, spec.key
        assert spec.peak_flops, spec.key


@pytest.mark.parametrize(
    "key",
    [
        "t4", "a30", "a40", "a16", "a2", "rtx-a6000", "l40", "rtx-6000-ada", "h800-sxm",
        "h800-pcie", "h20", "h200-nvl", "gh200", "gh200-144gb", "b300", "gb10", "v100s-pcie-32gb",
        "rtx-2060", "rtx-2070", "rtx-2080", "titan-rtx", "rtx-3060", "rtx-3080", "rtx-3090-ti",
        "rtx-4060", "rtx-4070", "rtx-4080", "rtx-5070", "rtx-5080", "rtx-5090", "mi100",
        "mi300a", "mi350x", "mi355x", "radeon-pro-w7900", "radeon-rx-7900-xtx",
    ],
)  # fmt: skip
def test_catalogue_knows_the_field(key: str) -> None:
    assert get_spec(key).key == key


def test_dense_not_sparse_figures_for_the_h100_class() -> None:
    # The datasheets quote 1,979 TFLOP/s bf16 "with sparsity": the catalogue halves it.
    assert get_spec("h800-sxm").peak("bf16") == pytest.approx(989.5e12)
    assert get_spec("gh200").peak("fp8") == pytest.approx(1979e12)
    # A figure NVIDIA does not publish is left out, not guessed.
    assert get_spec("gb10").peak("bf16") is None
    assert get_spec("b300").peak("int8") is None


# --- names drivers write -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Tesla T4", "t4"),
        ("NVIDIA T4", "t4"),
        ("NVIDIA H800", "h800-sxm"),
        ("NVIDIA H800 PCIe", "h800-pcie"),
        ("NVIDIA H20", "h20"),
        ("NVIDIA GB10", "gb10"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA GH200 144G HBM3e", "gh200-144gb"),
        ("Tesla V100-DGXS-32GB", "v100-sxm2-32gb"),
        ("Tesla V100-SXM3-32GB", "v100-sxm2-32gb"),
        ("tesla v100-sxm2-32gb", "v100-sxm2-32gb"),
        ("Tesla V100S-PCIE-32GB", "v100s-pcie-32gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA A100-PCIE-80GB", "a100-pcie-80gb"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada"),
        ("NVIDIA GeForce RTX 4060", "rtx-4060"),
        ("NVIDIA GeForce RTX 5090", "rtx-5090"),
        ("NVIDIA B300", "b300"),
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI300X VF", "mi300x"),
        ("AMD Instinct MI355X", "mi355x"),
        ("AMD Instinct MI100", "mi100"),
        ("AMD Radeon PRO W7900", "radeon-pro-w7900"),
        ("Radeon RX 7900 XTX", "radeon-rx-7900-xtx"),
    ],
)
def test_names_drivers_write_match_their_device(name: str, key: str) -> None:
    spec = match_device(name)
    assert spec is not None
    assert spec.key == key
    assert spec.matched is None  # the name said it: nothing to explain


def test_a_mig_slice_gets_its_share_of_the_gpu() -> None:
    whole = get_spec("h100-sxm")
    spec = match_device("NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    assert spec is not None
    assert spec.peak("bf16") == pytest.approx(whole.peak_flops["bf16"] / 7)
    assert spec.mem_bandwidth == pytest.approx(whole.mem_bandwidth / 8)  # 10 of 80 GB
    assert spec.mem_bytes == 10 * GIB
    assert spec.matched is not None
    assert "MIG 1g.10gb slice" in spec.matched
    # The trace's numSms, where it gives it, is the slice's exact share.
    counted = match_device("NVIDIA A100-SXM4-40GB MIG 1g.5gb", sm_count=14)
    assert counted is not None
    assert counted.peak("bf16") == pytest.approx(312e12 * 14 / 108)
    assert counted.matched is not None
    assert "14 of its 108 SMs" in counted.matched
    # An unknown GPU's slice is still unknown.
    assert match_device("NVIDIA Z999 MIG 1g.5gb") is None


# --- family names a person types ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "key", "others"),
    [
        ("A100", "a100-sxm4-80gb", ["a100-sxm4-40gb", "a100-pcie-40gb", "a100-pcie-80gb"]),
        ("H100", "h100-sxm", ["h100-pcie", "h100-nvl"]),
        ("mi300", "mi300x", ["mi300a"]),
    ],
)
def test_a_family_name_takes_the_common_variant_and_names_the_others(
    family: str, key: str, others: list[str]
) -> None:
    spec = get_spec(family)
    assert spec.key == key
    assert spec.matched is not None
    assert f"{family!r} is a family: took {key}" in spec.matched
    for other in others:
        assert other in spec.matched
    assert {s.key for s in family_members(family)} == {key, *others}


@pytest.mark.parametrize("family", ["A100", "H100"])
def test_roofline_takes_a_family_name(family: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["roofline", "--device", family, "--mnk", "4096,4096,4096", "--format", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == get_spec(family).name
    assert "is a family: took" in out["source"]
    assert out["peak_flops"] == get_spec(family).peak("bf16")


# --- inference ---------------------------------------------------------------------------------


def _trace(
    tmp_path: Path,
    name: str | None,
    props: dict[str, Any] | None,
    kernels: list[str],
) -> Path:
    b = TraceBuilder(device_name=name, device_properties=props)
    b.step(1, 0.0, 100.0)
    for i, kernel in enumerate(kernels):
        b.kernel(kernel, 10.0 + 20 * i, 10.0, launch_at=5.0 + 20 * i)
    return b.write(tmp_path / "t.json")


HIPBLASLT_90A = "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x1_SN_1LDSB0_ISA90a_WG32_8_1"
HIPBLASLT_942 = "Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_ISA942_WS64"
MI250_PROPS = {
    "name": "AMD Radeon Graphics",
    "totalGlobalMem": 68702699520,
    "computeMajor": 9,
    "computeMinor": 0,
    "warpSize": 64,
    "numSms": 104,
}


def test_an_mi250_the_driver_calls_radeon_graphics_is_inferred_and_said(tmp_path: Path) -> None:
    path = _trace(tmp_path, "AMD Radeon Graphics", MI250_PROPS, [HIPBLASLT_90A])
    d = analyze(path)
    # An MI210 and an MI250 GCD both have 104 CUs, 64 GB and gfx90a: the lower peaks are taken
    # and the other is named.
    assert d.device.matched_spec == get_spec("mi210").name
    assert d.device.note is not None
    assert "'AMD Radeon Graphics' names no one product" in d.device.note
    assert "inferred from" in d.device.note
    assert "104 compute units" in d.device.note
    assert "gfx90a" in d.device.note
    assert "also fit: mi250" in d.device.note
    assert "inferred from" in json.loads(d.to_json())["device"]["note"]
    for fmt in ("text", "md", "html"):
        assert "inferred from" in render(d, fmt)


def test_an_mi300x_trace_without_device_properties_is_inferred_from_its_kernels(
    tmp_path: Path,
) -> None:
    path = _trace(tmp_path, None, None, [HIPBLASLT_942])
    d = analyze(path)
    # gfx942 alone is an MI300A, MI300X or MI325X: the lowest peaks, the others named.
    assert d.device.name is None
    assert d.device.matched_spec == get_spec("mi300a").name
    note = d.device.note or ""
    assert "the trace names no device; inferred from kernel names built for gfx942" in note
    assert "mi300x" in note
    assert "mi325x" in note
    assert f"{get_spec('mi300a').name} (inferred)" in render(d, "md")


def test_device_properties_without_a_name_pin_the_device(tmp_path: Path) -> None:
    props = {"name": "", "totalGlobalMem": 206141652992, "computeMajor": 9, "computeMinor": 4}
    props |= {"warpSize": 64, "numSms": 304}
    d = analyze(_trace(tmp_path, None, props, [HIPBLASLT_942]))
    assert d.device.matched_spec == get_spec("mi300x").name
    assert "also fit" not in (d.device.note or "")


@pytest.mark.parametrize(
    ("evidence", "key"),
    [
        # A Hopper-only kernel (wgmma) and 78 SMs: an H20.
        (DeviceEvidence(sm_count=78, nvidia_arch=90), "h20"),
        # Compute capability, SMs and memory from deviceProperties alone.
        (
            DeviceEvidence(compute_capability=(9, 0), sm_count=132, mem_bytes=94 * GIB),
            "h100-nvl",
        ),
        (DeviceEvidence(compute_capability=(8, 0), sm_count=108, mem_bytes=79.2 * GIB), None),
        (DeviceEvidence(sm_count=148, nvidia_arch=100, mem_bytes=178.4 * GIB), "b200"),
        # A model name the catalogue has in several variants, narrowed by its SMs.
        (DeviceEvidence(name="NVIDIA H100", sm_count=114), "h100-pcie"),
        (DeviceEvidence(name="NVIDIA A100", mem_bytes=39.4 * GIB, sm_count=108), None),
    ],
)
def test_inference_narrows_by_what_the_trace_holds(
    evidence: DeviceEvidence, key: str | None
) -> None:
    spec = identify_device(evidence)
    if key is None:  # several fit: the lowest peaks, said
        assert spec is not None
        assert "also fit" in (spec.matched or "")
    else:
        assert spec is not None
        assert spec.key == key
        assert "inferred from" in (spec.matched or "")


def test_a100_40gb_boards_by_memory_take_the_lower_bandwidth() -> None:
    spec = identify_device(DeviceEvidence(name="NVIDIA A100", mem_bytes=39.4 * GIB, sm_count=108))
    assert spec is not None
    assert spec.key in ("a100-pcie-40gb", "a100-sxm4-40gb")
    assert "its model A100" in (spec.matched or "")


@pytest.mark.parametrize(
    "evidence",
    [
        DeviceEvidence(),  # nothing at all
        DeviceEvidence(nvidia_arch=80),  # sm80 kernels run on every GPU since Ampere
        DeviceEvidence(name="AMD Radeon Graphics"),  # a generic name and nothing else
        DeviceEvidence(name="NVIDIA GeForce RTX 4060 Laptop GPU", sm_count=24),  # other clocks
        DeviceEvidence(name="NVIDIA Z999", sm_count=132),  # an unknown model
        DeviceEvidence(name="NVIDIA A100-SXM4-64GB MIG 1g.8gb", sm_count=14),  # unknown GPU's slice
        DeviceEvidence(compute_capability=(9, 0), sm_count=7),  # nothing fits
    ],
)
def test_no_inference_without_evidence_that_narrows(evidence: DeviceEvidence) -> None:
    assert identify_device(evidence) is None


def test_evidence_reads_architecture_tags_from_kernel_names() -> None:
    e = evidence_of(
        None,
        {"numSms": 132, "computeMajor": 9, "computeMinor": 0, "warpSize": 32},
        ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "ampere_sgemm_64x64_nn"],
    )
    assert (e.sm_count, e.compute_capability, e.warp_size) == (132, (9, 0), 32)
    assert e.nvidia_arch == 90
    assert e.amd_targets == ()
    amd = evidence_of("", {}, [HIPBLASLT_942, "kernel_gfx90a_x", "cutlass::arch::Sm80"])
    assert amd.amd_targets == ("gfx90a", "gfx942")
    assert evidence_of(None, {}, ["void at::native::sm_100_kernel"]).nvidia_arch == 100
    assert evidence_of(None, {}, ["softmax_warp_forward", "asm80"]).nvidia_arch is None


def test_a_named_device_is_not_second_guessed(tmp_path: Path) -> None:
    path = _trace(tmp_path, "NVIDIA H100 80GB HBM3", None, ["sm80_xmma_gemm_f16f16"])
    d = analyze(path)
    assert d.device.matched_spec == get_spec("h100-sxm").name
    assert "inferred" not in (d.device.note or "")
    # --device wins over the trace, and a family name there is said as one.
    named = analyze(path, Options(device="A100"))
    assert named.device.matched_spec == get_spec("a100-sxm4-80gb").name
    assert "'A100' is a family" in (named.device.note or "")


# --- the real traces ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("relative", "key"),
    [
        ("hta/mi250_minitoy_train.json.gz", "mi210"),
        ("tracelens/vllm_decode_cudagraph_execution.json.gz", "mi300x"),
    ],
)
def test_real_traces_with_generic_or_missing_names_are_inferred(relative: str, key: str) -> None:
    d = analyze(real_trace(relative))
    assert d.device.matched_spec == get_spec(key).name
    assert "inferred from" in (d.device.note or "")
