"""Device specs: the built-in catalogue's figures, matching trace device names to it, dtype
names, user spec files and the roofline arithmetic."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import wallfinder.hardware as hardware
from wallfinder import WallfinderError
from wallfinder.hardware import (
    DTYPES,
    DeviceSpec,
    _catalog,
    all_specs,
    cpu_spec,
    get_spec,
    load_spec_file,
    match_device,
    normalize_dtype,
)

GIB = 2**30

REQUIRED_KEYS = [
    "v100-sxm2-16gb",
    "v100-sxm2-32gb",
    "v100-pcie-16gb",
    "v100-pcie-32gb",
    "a100-sxm4-40gb",
    "a100-sxm4-80gb",
    "a100-pcie-40gb",
    "a100-pcie-80gb",
    "a10",
    "a10g",
    "l4",
    "l40s",
    "h100-sxm",
    "h100-pcie",
    "h100-nvl",
    "h200-sxm",
    "b200",
    "gb200",
    "rtx-2080-ti",
    "rtx-3090",
    "rtx-4090",
    "mi210",
    "mi250",
    "mi250x",
    "mi300x",
    "mi325x",
    "cpu",
]


# --- the catalogue ---------------------------------------------------------------------------


def test_public_api_is_what_all_says() -> None:
    assert sorted(hardware.__all__) == sorted(
        [
            "DTYPES",
            "DeviceEvidence",
            "DeviceSpec",
            "Vendor",
            "all_specs",
            "cpu_spec",
            "evidence_of",
            "family_members",
            "get_spec",
            "identify_device",
            "load_spec_file",
            "match_device",
            "mig_slice",
            "normalize_dtype",
            "normalize_name",
        ]
    )
    for name in hardware.__all__:
        assert hasattr(hardware, name)


def test_catalogue_has_every_required_device_once() -> None:
    keys = [s.key for s in all_specs()]
    assert len(keys) == len(set(keys))
    assert set(REQUIRED_KEYS) <= set(keys)


@pytest.mark.parametrize("spec", all_specs(), ids=lambda s: s.key)
def test_every_device_has_positive_figures_and_a_source(spec: DeviceSpec) -> None:
    assert spec.name
    assert spec.source.strip()
    assert spec.vendor in ("nvidia", "amd", "cpu")
    assert spec.mem_bandwidth > 0
    assert math.isfinite(spec.mem_bandwidth)
    assert "fp32" in spec.peak_flops
    assert set(spec.peak_flops) <= set(DTYPES)
    assert all(v > 0 and math.isfinite(v) for v in spec.peak_flops.values())
    assert all(v > 0 for v in spec.interconnect.values())
    for optional in (spec.mem_bytes, spec.sm_count, spec.l2_bytes, spec.pcie_gen):
        assert optional is None or optional > 0
    # Sparse figures halved or not, a tensor rate below the fp32 rate means a wrong column.
    for dtype in ("bf16", "fp16"):
        peak = spec.peak_flops.get(dtype)
        assert peak is None or peak >= spec.peak_flops["fp32"]


def test_sources_say_what_kind_of_figure_they_are() -> None:
    for spec in all_specs():
        kind = "estimate: " if spec.estimate else "datasheet: "
        assert spec.source.startswith(kind), spec.key


def test_catalogue_is_read_once() -> None:
    assert get_spec("l4") is get_spec("l4")
    assert all_specs() == all_specs()


# --- the two ridges the design is built on ---------------------------------------------------


def three_figures(x: float | None) -> str:
    assert x is not None
    return f"{x:.3g}"


def test_a100_80gb_bf16_ridge_is_153_flop_per_byte() -> None:
    spec = get_spec("a100-sxm4-80gb")
    assert spec.peak("bf16") == 312e12
    assert spec.mem_bandwidth == 2.039e12
    assert three_figures(spec.ridge("bf16")) == "153"


def test_h100_sxm_bf16_dense_ridge_is_295_flop_per_byte() -> None:
    spec = get_spec("h100-sxm")
    assert three_figures(spec.peak("bf16")) == "9.9e+14"  # dense, not the sparse 1979
    assert spec.mem_bandwidth == 3.35e12
    assert three_figures(spec.ridge("bf16")) == "295"


# --- known facts -----------------------------------------------------------------------------


def test_v100_has_tensor_cores_for_fp16_only() -> None:
    v100 = get_spec("v100-sxm2-16gb")
    assert v100.tensor_cores
    assert v100.peak("fp16") == 125e12
    assert v100.peak("fp32") == 15.7e12
    assert v100.peak("bf16") is None
    assert v100.peak("tf32") is None
    assert v100.peak("int8") is None
    assert v100.ridge("bf16") is None
    assert v100.attainable(10.0, "bf16") is None


def test_a100_40gb_and_80gb_differ_in_memory_not_compute() -> None:
    small, large = get_spec("a100-sxm4-40gb"), get_spec("a100-sxm4-80gb")
    assert small.peak_flops == large.peak_flops
    assert (small.mem_bandwidth, large.mem_bandwidth) == (1.555e12, 2.039e12)
    assert get_spec("a100-pcie-80gb").mem_bandwidth == 1.935e12


def test_sparse_only_datasheets_are_halved() -> None:
    assert get_spec("l4").peak("bf16") == 121e12  # datasheet: 242 with sparsity
    assert get_spec("h100-pcie").peak("fp8") == 1513e12  # datasheet: 3026 with sparsity
    assert get_spec("b200").peak("bf16") == 2.25e15  # datasheet: 4.5 PFLOP/s with sparsity


def test_consumer_and_older_chips_lack_the_newer_dtypes() -> None:
    turing = get_spec("rtx-2080-ti")
    assert turing.peak("bf16") is None
    assert turing.peak("tf32") is None
    assert turing.peak("fp16") == 53.8e12  # FP32 accumulate, as PyTorch uses
    assert get_spec("rtx-3090").peak("fp8") is None
    assert get_spec("rtx-4090").peak("fp8") == 330.3e12
    for cdna2 in ("mi210", "mi250", "mi250x"):
        assert get_spec(cdna2).peak("tf32") is None
        assert get_spec(cdna2).peak("fp8") is None


def test_mi250_figures_are_per_gcd() -> None:
    mi250, mi250x = get_spec("mi250"), get_spec("mi250x")
    assert mi250.peak("fp16") == pytest.approx(362.1e12 / 2)
    assert mi250x.peak("bf16") == pytest.approx(383e12 / 2)
    assert mi250.mem_bytes == mi250x.mem_bytes == 64 * GIB
    assert (mi250.sm_count, mi250x.sm_count) == (104, 110)
    assert "GCD" in mi250.name
    assert "GCD" in mi250x.name


def test_mi300x_and_its_successor() -> None:
    mi300x, mi325x = get_spec("mi300x"), get_spec("mi325x")
    assert mi300x.vendor == mi325x.vendor == "amd"
    assert mi300x.peak("bf16") == mi325x.peak("bf16") == 1307.4e12
    assert (mi300x.mem_bandwidth, mi325x.mem_bandwidth) == (5.3e12, 6e12)
    assert mi300x.interconnect["infinity_fabric"] == 896e9


def test_cpu_profile_is_a_labelled_estimate() -> None:
    cpu = cpu_spec()
    assert cpu is get_spec("cpu")
    assert cpu.estimate
    assert cpu.vendor == "cpu"
    assert not cpu.tensor_cores
    assert "estimate" in cpu.source
    assert cpu.peak("fp32") is not None
    assert cpu.peak("bf16") is None


def test_a10g_without_a_datasheet_is_an_estimate() -> None:
    assert get_spec("a10g").estimate
    assert not get_spec("a10").estimate


def test_every_gpu_has_matrix_units() -> None:
    gpus = [s for s in all_specs() if s.vendor != "cpu"]
    assert gpus
    assert all(s.tensor_cores for s in gpus)


# --- matching deviceProperties names -----------------------------------------------------------

# Every device name in the deviceProperties of the real traces in ../shared/traces, with the
# memory and SM/CU count the trace reports, so the match is checked against the hardware too.
TRACE_DEVICES = [
    ("NVIDIA A100-PG509-200", 42_297_524_224, 108, "a100-sxm4-40gb"),
    ("NVIDIA A100-SXM4-80GB", 84_990_623_744, 108, "a100-sxm4-80gb"),
    ("Tesla V100-SXM2-16GB", 16_945_512_448, 80, "v100-sxm2-16gb"),
    ("Tesla V100-SXM2-32GB", 34_079_637_504, 80, "v100-sxm2-32gb"),
    ("NVIDIA GeForce RTX 2080 Ti", 11_554_586_624, 68, "rtx-2080-ti"),
    ("AMD Instinct MI210", 68_702_699_520, 104, "mi210"),
    ("AMD Instinct MI300X", 206_141_652_992, 304, "mi300x"),
    ("NVIDIA B200", 191_503_138_816, 148, "b200"),
]


@pytest.mark.parametrize(("name", "total_mem", "units", "key"), TRACE_DEVICES)
def test_trace_device_names_match_the_right_device(
    name: str, total_mem: int, units: int, key: str
) -> None:
    spec = match_device(name)
    assert spec is not None
    assert spec.key == key
    assert spec.sm_count == units
    # The driver shows a little less than the datasheet's capacity, never more.
    assert spec.mem_bytes is not None
    assert 0.95 < total_mem / spec.mem_bytes <= 1.0


@pytest.mark.parametrize(
    ("name", "key"),
    [
        # names torch reports for devices that have no trace in ../shared/traces
        ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("NVIDIA A100-SXM-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("Tesla V100-PCIE-16GB", "v100-pcie-16gb"),
        ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H800", "h800-sxm"),
        ("NVIDIA H800 PCIe", "h800-pcie"),
        ("NVIDIA A800-SXM4-80GB", "a800-sxm4-80gb"),
        ("NVIDIA A800 80GB PCIe", "a800-pcie-80gb"),
        ("NVIDIA A800-PCIE-40GB", "a800-pcie-40gb"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("AMD Instinct MI300X VF", "mi300x"),
        ("AMD Instinct MI325X", "mi325x"),
        ("AMD Instinct MI250X", "mi250x"),
        # other spellings of the same devices
        ("  nvidia a100-sxm4-80gb ", "a100-sxm4-80gb"),
        ("A100 SXM4 80 GB", "a100-sxm4-80gb"),
        ("GeForce RTX 2080 Ti", "rtx-2080-ti"),
        ("A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("AMD Instinct MI210 VF", "mi210"),
        ("a100-sxm4-80gb", "a100-sxm4-80gb"),
        # a memory size written into a name that has none, when it is the device's size
        ("NVIDIA H200 141GB HBM3e", "h200-sxm"),
        ("NVIDIA B200 180GB", "b200"),
        ("NVIDIA A100-PCIE-80GB", "a100-pcie-80gb"),
    ],
)
def test_device_names_match(name: str, key: str) -> None:
    spec = match_device(name)
    assert spec is not None
    assert spec.key == key


@pytest.mark.parametrize(
    "name",
    [
        "",
        "   ",
        "AMD Radeon Graphics",  # ROCm's name for an MI250/MI250X GCD, among others
        "AMD Instinct MI250X/MI250",  # either board
        "NVIDIA A100",  # which of four?
        "NVIDIA H100",  # SXM, PCIe or NVL?
        "NVIDIA H100 94GB HBM3",  # a size that is not the H100 SXM's
        "NVIDIA H100 80GB HBM2e",  # a memory kind that is not the H100 SXM's
        "Tesla V100-SXM2-32GB-LS",
        "cpu",  # the CPU profile is never a trace's device
    ],
)
def test_unknown_or_ambiguous_names_match_nothing(name: str) -> None:
    assert match_device(name) is None


@pytest.mark.parametrize(
    ("name", "sibling"),
    [
        ("NVIDIA A800-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A800 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA A800-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA H800", "h100-sxm"),
    ],
)
def test_china_variants_have_their_siblings_compute_and_a_slower_nvlink(
    name: str, sibling: str
) -> None:
    """The A800 is A100 silicon and the H800 H100 silicon (the H800's FP64 cut aside) with
    NVLink cut to 400 GB/s: the same tensor peaks and memory, a slower link."""
    spec, twin = match_device(name), get_spec(sibling)
    assert spec is not None
    tensor = ("tf32", "bf16", "fp16", "fp8", "int8")
    assert {k: spec.peak_flops.get(k) for k in tensor} == {
        k: twin.peak_flops.get(k) for k in tensor
    }
    assert (spec.mem_bandwidth, spec.mem_bytes, spec.sm_count, spec.arch) == (
        twin.mem_bandwidth,
        twin.mem_bytes,
        twin.sm_count,
        twin.arch,
    )
    assert spec.interconnect["nvlink"] == 400e9 < twin.interconnect["nvlink"]


def test_unit_count_tells_apart_only_what_the_name_narrowed() -> None:
    assert match_device("AMD Instinct MI250X/MI250", sm_count=110) == get_spec("mi250x")
    assert match_device("AMD Instinct MI250X/MI250", sm_count=104) == get_spec("mi250")
    assert match_device("AMD Instinct MI250X/MI250", sm_count=96) is None
    # 104 CUs and 64 GB fit an MI250 GCD and an MI210 alike: still no match.
    assert match_device("AMD Radeon Graphics", sm_count=104) is None


def test_an_exact_name_is_matched_without_reading_the_whole_catalogue() -> None:
    # Every name, answered from the tables that quote it alone, is the spec the whole
    # catalogue gives; and the catalogue itself is not parsed for it (about 13 ms of TOML on
    # every analysis).
    names = [n for spec in all_specs() for n in spec.names]
    expected = [match_device(n) for n in names]
    for name, spec in zip(names, expected, strict=True):
        _catalog._catalog.cache_clear()
        _catalog._named_alone.cache_clear()
        assert match_device(name) == spec, name
        assert _catalog._catalog.cache_info().currsize == 0, name
    # A name it cannot answer alone (no table lists it) still goes to the whole catalogue.
    assert match_device("NVIDIA H100 80GB HBM3") == get_spec("h100-sxm")


def test_no_two_devices_share_a_name() -> None:
    seen: dict[str, str] = {}
    for spec in all_specs():
        for name in spec.names:
            assert seen.setdefault(hardware.normalize_name(name), spec.key) == spec.key
            assert match_device(name) is spec


# --- get_spec ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("h100-sxm", "h100-sxm"),
        ("H100-SXM", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("mi300x", "mi300x"),
        ("cpu", "cpu"),
    ],
)
def test_get_spec_takes_a_key_or_a_device_name(text: str, key: str) -> None:
    assert get_spec(text).key == key


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NVIDIA H100 SXM6", ["h100-sxm", "h800-sxm", "h200-sxm"]),
        ("rtx 3050", ["rtx-3060", "rtx-3070"]),
        ("NVIDIA L50", ["l40"]),
        ("mi400", ["mi300x", "mi250"]),
        ("some accelerator", ["h100-sxm", "mi300x"]),  # nothing close: every key
    ],
)
def test_get_spec_names_close_keys_for_an_unknown_device(text: str, expected: list[str]) -> None:
    with pytest.raises(WallfinderError, match="unknown device") as info:
        get_spec(text)
    message = str(info.value)
    assert "\n" not in message
    assert repr(text) in message
    for key in expected:
        assert key in message


def test_get_spec_says_why_an_ambiguous_name_is_refused() -> None:
    with pytest.raises(WallfinderError, match="ambiguous") as info:
        get_spec("AMD Radeon Graphics")
    assert "\n" not in str(info.value)
    assert "mi250, mi250x" in str(info.value)


# --- dtypes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "dtype"),
    [
        ("float", "fp32"),
        ("float32", "fp32"),
        ("torch.float32", "fp32"),
        ("double", "fp64"),
        ("c10::Half", "fp16"),
        ("Half", "fp16"),
        ("half", "fp16"),
        ("float16", "fp16"),
        ("torch.float16", "fp16"),
        ("c10::BFloat16", "bf16"),
        ("BFloat16", "bf16"),
        ("bfloat16", "bf16"),
        ("bf16", "bf16"),
        ("c10::Float8_e4m3fn", "fp8"),
        ("c10::Float8_e5m2", "fp8"),
        ("Float8_e4m3fnuz", "fp8"),
        ("torch.float8_e5m2fnuz", "fp8"),
        ("fp8", "fp8"),
        ("signed char", "int8"),
        ("int8", "int8"),
        ("tf32", "tf32"),
        ("TF32", "tf32"),
        (" FP16 ", "fp16"),
    ],
)
def test_normalize_dtype(text: str, dtype: str) -> None:
    assert normalize_dtype(text) == dtype


@pytest.mark.parametrize(
    "text",
    ["", "long int", "int", "bool", "unsigned char", "c10::complex<float>", "Scalar", "float128"],
)
def test_normalize_dtype_refuses_what_has_no_peak(text: str) -> None:
    assert normalize_dtype(text) is None


def test_every_canonical_dtype_normalizes_to_itself() -> None:
    assert all(normalize_dtype(d) == d for d in DTYPES)


def test_peak_takes_the_names_traces_use() -> None:
    spec = get_spec("a100-sxm4-80gb")
    assert spec.peak("c10::BFloat16") == spec.peak("bf16") == 312e12
    assert spec.peak("float") == 19.5e12
    assert spec.peak("long int") is None


# --- the roofline ------------------------------------------------------------------------------


def test_attainable_below_at_and_above_the_ridge() -> None:
    spec = get_spec("a100-sxm4-80gb")
    ridge = spec.ridge("bf16")
    assert ridge is not None
    assert spec.attainable(10.0, "bf16") == pytest.approx(10.0 * 2.039e12)
    assert spec.attainable(ridge, "bf16") == pytest.approx(312e12)
    assert spec.attainable(1000.0, "bf16") == 312e12
    assert spec.attainable(0.0, "bf16") == 0.0
    assert spec.attainable(math.inf, "bf16") == 312e12


@pytest.mark.parametrize("ai", [-1.0, math.nan])
def test_attainable_refuses_a_negative_intensity(ai: float) -> None:
    with pytest.raises(ValueError, match="arithmetic intensity"):
        get_spec("l4").attainable(ai, "bf16")


def test_specs_are_immutable_and_hashable() -> None:
    spec = get_spec("l4")
    with pytest.raises(TypeError):
        spec.peak_flops["bf16"] = 1.0  # type: ignore[index]
    assert {spec: 1}[get_spec("l4")] == 1
    assert "l4" in repr(spec)


# --- user spec files ---------------------------------------------------------------------------


def toml_entry(spec: DeviceSpec) -> str:
    """The spec as the body of a catalogue entry: what a user's spec file holds."""

    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, tuple):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    fields = ["key", "name", "vendor", "names", "estimate", "tensor_cores", "mem_bandwidth"]
    optional = ("mem_bytes", "sm_count", "l2_bytes", "l2_bandwidth", "pcie_gen", "arch")
    fields += [f for f in optional if getattr(spec, f)]
    lines = [f"{field} = {value(getattr(spec, field))}" for field in fields]
    for table in ("peak_flops", "interconnect"):
        lines.append(f"[{table}]")
        lines.extend(f"{k} = {v!r}" for k, v in getattr(spec, table).items())
    return "\n".join(lines) + "\n"


def test_spec_file_round_trip_for_every_device(tmp_path: Path) -> None:
    for spec in all_specs():
        path = tmp_path / f"{spec.key}.toml"
        path.write_text(toml_entry(spec), encoding="utf-8")
        loaded = load_spec_file(path)
        assert loaded.source == f"user file: {path.name}"
        assert loaded == DeviceSpec(**{**vars(spec), "source": loaded.source})


def test_spec_file_defaults_and_source(tmp_path: Path) -> None:
    path = tmp_path / "my-gpu.toml"
    path.write_text(
        'source = "measured by hand"\nmem_bandwidth = 1e12\n[peak_flops]\nbf16 = 100e12\n',
        encoding="utf-8",
    )
    spec = load_spec_file(path)
    assert (spec.key, spec.name, spec.vendor) == ("my-gpu", "my-gpu", "other")
    assert spec.source == "user file: my-gpu.toml (measured by hand)"
    assert spec.ridge("bf16") == 100.0
    assert not spec.tensor_cores
    assert not spec.estimate
    assert spec.mem_bytes is None
    assert spec.interconnect == {}


def test_spec_file_may_keep_the_catalogue_header(tmp_path: Path) -> None:
    path = tmp_path / "copied.toml"
    path.write_text(
        "[devices.my-a100]\nmem_bandwidth = 2e12\n[devices.my-a100.peak_flops]\nfp32 = 19.5e12\n",
        encoding="utf-8",
    )
    spec = load_spec_file(path)
    assert spec.key == "my-a100"
    assert spec.peak("fp32") == 19.5e12


GOOD = "mem_bandwidth = 2e12\n[peak_flops]\nbf16 = 312e12\n"

BAD_FILES = {
    "missing-bandwidth": ("[peak_flops]\nbf16 = 312e12\n", "mem_bandwidth is missing"),
    "negative-bandwidth": (
        "mem_bandwidth = -2e12\n[peak_flops]\nbf16 = 1e12\n",
        "mem_bandwidth must be a positive number",
    ),
    "zero-bandwidth": (
        "mem_bandwidth = 0\n[peak_flops]\nbf16 = 1e12\n",
        "mem_bandwidth must be a positive number",
    ),
    "text-bandwidth": (
        'mem_bandwidth = "2 TB/s"\n[peak_flops]\nbf16 = 1e12\n',
        "mem_bandwidth must be a positive number",
    ),
    "boolean-bandwidth": (
        "mem_bandwidth = true\n[peak_flops]\nbf16 = 1e12\n",
        "mem_bandwidth must be a positive number",
    ),
    "nan-peak": ("mem_bandwidth = 2e12\n[peak_flops]\nbf16 = nan\n", "peak_flops.bf16 must be"),
    "infinite-peak": (
        "mem_bandwidth = 2e12\n[peak_flops]\nbf16 = inf\n",
        "peak_flops.bf16 must be",
    ),
    "negative-peak": (
        "mem_bandwidth = 2e12\n[peak_flops]\nbf16 = -312e12\n",
        "peak_flops.bf16 must be a positive number",
    ),
    "text-peak": (
        'mem_bandwidth = 2e12\n[peak_flops]\nbf16 = "fast"\n',
        "peak_flops.bf16 must be a positive number",
    ),
    "unknown-dtype": (
        "mem_bandwidth = 2e12\n[peak_flops]\nbfloat16 = 312e12\n",
        "unknown dtype 'bfloat16' in peak_flops .did you mean bf16",
    ),
    "unknown-dtype-no-hint": (
        "mem_bandwidth = 2e12\n[peak_flops]\nfp4 = 1e15\n",
        "unknown dtype 'fp4'",
    ),
    "no-peaks": ("mem_bandwidth = 2e12\n", "peak_flops is missing"),
    "empty-peaks": ("mem_bandwidth = 2e12\n[peak_flops]\n", "peak_flops is empty"),
    "peaks-not-a-table": ("mem_bandwidth = 2e12\npeak_flops = 1e12\n", "peak_flops must be"),
    "misspelt-key": (
        "mem_bandwith = 2e12\n[peak_flops]\nbf16 = 1e12\n",
        "unknown key 'mem_bandwith'",
    ),
    "negative-link": (GOOD + "[interconnect]\nnvlink = -1\n", "interconnect.nvlink must be"),
    "fractional-sm-count": ("sm_count = 10.5\n" + GOOD, "sm_count must be a positive whole"),
    "zero-sm-count": ("sm_count = 0\n" + GOOD, "sm_count must be a positive whole"),
    "unknown-vendor": ('vendor = "intel"\n' + GOOD, "vendor must be one of"),
    "names-not-a-list": ('names = "NVIDIA X"\n' + GOOD, "names must be a list"),
    "flag-not-boolean": ('tensor_cores = "yes"\n' + GOOD, "tensor_cores must be true or false"),
    "empty-key": ('key = ""\n' + GOOD, "key must be a non-empty string"),
    "not-toml": ("mem_bandwidth = = 2\n", "not valid TOML"),
    "not-utf8": ("\udcff", "not UTF-8"),
}


@pytest.mark.parametrize(("text", "message"), BAD_FILES.values(), ids=list(BAD_FILES))
def test_spec_file_errors_are_one_line_naming_the_file(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(WallfinderError, match=message) as info:
        load_spec_file(path)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("bad.toml: ")


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(WallfinderError, match="device spec file not found"):
        load_spec_file(tmp_path / "nowhere.toml")


def test_spec_file_that_is_a_folder(tmp_path: Path) -> None:
    with pytest.raises(WallfinderError, match="cannot read device spec file"):
        load_spec_file(tmp_path)
