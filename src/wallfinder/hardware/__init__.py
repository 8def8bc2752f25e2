"""What the device can do: datasheet peaks per dtype, memory bandwidth, caches and links — the
roofs the analyses measure a trace against.

    >>> from wallfinder.hardware import match_device
    >>> spec = match_device("NVIDIA A100-SXM4-80GB")      # a trace's deviceProperties name
    >>> spec.peak("bf16"), spec.ridge("bf16")             # 312e12 FLOP/s, ~153 FLOP/byte
    >>> spec.attainable(ai=40.0, dtype="c10::BFloat16")   # 40 x 2.039e12 B/s: bandwidth-bound

The built-in catalogue (`specs.toml` next to this module) holds the vendors' dense peaks for the
GPUs people train on, each with its source. A device that is not in it, or a board whose clocks
differ, is described by a TOML file in the format of one catalogue entry, read with
`load_spec_file`::

    key = "my-gpu"                 # optional: the file name without .toml
    name = "My GPU"                # optional: the key
    vendor = "nvidia"              # optional: nvidia | amd | cpu | other (the default)
    source = "vendor datasheet"    # optional: shown after "user file: NAME"
    names = ["NVIDIA My GPU"]      # optional: what torch reports as the device's name
    estimate = false               # optional: true when the figures are not a datasheet's
    tensor_cores = true            # optional, default false: has matrix units
    mem_bandwidth = 2.039e12       # required: peak memory bandwidth, bytes/s
    mem_bytes = 85_899_345_920     # optional: memory size, bytes
    sm_count = 108                 # optional: SMs (NVIDIA) or compute units (AMD)
    l2_bytes = 41_943_040          # optional: L2 cache, bytes
    l2_bandwidth = 7.2e12          # optional: L2 read bandwidth, bytes/s (else 2x memory's)
    pcie_gen = 4                   # optional: PCIe generation
    arch = "8.0"                   # optional: compute capability (NVIDIA) or gfx target (AMD)

    [peak_flops]                   # required, at least one: dense peak FLOP/s (int8: OP/s)
    fp64 = 19.5e12                 # keys among fp64 fp32 tf32 bf16 fp16 fp8 int8;
    fp32 = 19.5e12                 # fp32 is the rate without tensor cores,
    bf16 = 312e12                  # the others are tensor-core rates

    [interconnect]                 # optional: aggregate bidirectional bytes/s per link kind
    nvlink = 600e9
    pcie = 64e9

Every figure must be a positive number; an unknown key, an unknown dtype or a missing
bandwidth is a `WallfinderError` naming the field. An entry copied from `specs.toml` with its
``[devices.<key>]`` header is read too.

A calibrated profile (`wallfinder calibrate`) is a spec file with the measured roofs and a
``[calibration]`` table; `wallfinder.hardware.profile` reads it and lays it over the
datasheet (`load_device_profile(path).over(spec)`). As a plain spec file, the table is ignored.
"""

from __future__ import annotations

import os

from wallfinder.hardware._catalog import (
    all_specs,
    cpu_spec,
    family_members,
    get_spec,
    match_device,
    mig_slice,
    normalize_name,
)
from wallfinder.hardware._infer import DeviceEvidence, evidence_of, identify_device
from wallfinder.hardware._spec import DTYPES, DeviceSpec, Vendor, normalize_dtype
from wallfinder.hardware._toml import read_spec_file

__all__ = [
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


def load_spec_file(path: str | os.PathLike[str]) -> DeviceSpec:
    """The device described by a TOML spec file (the format is in this module's docstring);
    its `source` is ``"user file: NAME"``. Any problem with the file is a `WallfinderError`
    with one line naming it."""
    return read_spec_file(path)
