"""Measure this device's real roofs: matmul FLOP/s per dtype, copy bandwidth and launch
latency, each with warm-up, synchronisation and the best of several timed repetitions.

    >>> result = calibrate(Settings(quick=True))
    >>> result.peak_flops["fp32"], result.mem_bandwidth
    >>> result.save("wallfinder-device.toml")     # a profile for analyze --device-profile

On a GPU (CUDA, or ROCm, which torch presents as CUDA) it measures the GPU; without one, the
CPU. torch is imported only when a calibration starts.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import platform
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from wallfinder.capture import INSTALL_TORCH
from wallfinder.dtypes import torch_name
from wallfinder.errors import WallfinderError
from wallfinder.hardware import DeviceSpec, cpu_spec, match_device
from wallfinder.hardware.profile import Calibration, write_device_profile

__all__ = [
    "SCHEMA",
    "CalibrationResult",
    "Figure",
    "Settings",
    "calibrate",
]

SCHEMA = "wallfinder.calibration/1"

_GPU_DTYPES = ("fp32", "tf32", "bf16", "fp16")
# fp16 matmuls on a CPU run on a slow fallback path nobody trains with: not a roof.
_CPU_DTYPES = ("fp32", "bf16")
_MIN_REPETITION_S = 0.01
"""Each timed repetition runs the operation back to back until it lasts about this long, so
that the clock's resolution and a single launch do not count."""
_PROBE_N = 512
_MIB = 1 << 20

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What to measure and how long. Sizes left None take the device's default: n×n matmuls
    with n = 8192 on a GPU and 2048 on a CPU (2048 and 512 with `quick`); a copy of 1 GiB on a
    GPU and 256 MiB on a CPU (128 and 64 MiB with `quick`)."""

    quick: bool = False
    matmul_size: int | None = None
    copy_bytes: int | None = None
    repetitions: int | None = None
    """Timed repetitions; the best is kept (5, or 3 with `quick`)."""
    warmup: int | None = None
    """Untimed runs first (2, or 1 with `quick`)."""
    launch_ops: int | None = None
    """Tiny ops per launch-latency loop (5000, or 1000 with `quick`)."""
    cpu_budget_s: float | None = None
    """On a CPU, a dtype whose matmuls would take longer than this in all (a slow bf16 path)
    is measured at a smaller size, and says so (10 s, or 1 s with `quick`)."""
    device_index: int | None = None
    cpu: bool = False
    """Measure the CPU even when a GPU is present."""

    def resolved(self, gpu: bool) -> Settings:
        """These settings with every default filled in for a GPU or a CPU."""
        q = self.quick
        return Settings(
            quick=q,
            matmul_size=self.matmul_size
            or ((2048 if q else 8192) if gpu else (512 if q else 2048)),
            copy_bytes=self.copy_bytes
            or ((128 if q else 1024) if gpu else (64 if q else 256)) * _MIB,
            repetitions=self.repetitions or (3 if q else 5),
            warmup=self.warmup if self.warmup is not None else (1 if q else 2),
            launch_ops=self.launch_ops or (1000 if q else 5000),
            cpu_budget_s=self.cpu_budget_s or (1.0 if q else 10.0),
            device_index=self.device_index,
            cpu=self.cpu,
        )


Kind = Literal["matmul", "copy", "launch"]


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One measured figure, the datasheet's beside it, and how it was measured. `value` is
    None when it could not be measured (`method` says why)."""

    kind: Kind
    label: str
    dtype: str | None
    value: float | None
    unit: str
    datasheet: float | None
    method: str

    @property
    def of_datasheet(self) -> float | None:
        """measured / datasheet, when both are known."""
        if self.value is None or not self.datasheet:
            return None
        return self.value / self.datasheet

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "label": self.label,
            "dtype": self.dtype,
            "value": self.value,
            "unit": self.unit,
            "datasheet": self.datasheet,
            "of_datasheet": self.of_datasheet,
            "method": self.method,
        }


@dataclass(frozen=True, kw_only=True)
class CalibrationResult:
    """What `calibrate` measured on one device."""

    device: str
    """The device's name as torch reports it (a CPU: its model name)."""
    kind: Literal["gpu", "cpu"]
    backend: str
    torch: str
    date: str
    threads: int | None
    datasheet: DeviceSpec | None
    """The built-in spec of this device (for a CPU: the nominal estimate), or None."""
    figures: tuple[Figure, ...]
    peak_flops: dict[str, float]
    mem_bandwidth: float
    launch_latency_s: float
    launch_latency_kind: str
    settings: Settings
    matmul_sizes: dict[str, int] = field(default_factory=dict)

    @property
    def notes(self) -> list[str]:
        """How the figures were timed, in words."""
        if self.kind == "gpu":
            clock = "CUDA events around synchronised runs"
            launch = "what the host pays per kernel launch from Python (launch latency)"
        else:
            clock = "the wall clock"
            launch = "a CPU op's dispatch overhead from Python (a CPU launches no kernels)"
        return [
            f"matmul and copy: {clock}; a run repeats the op back to back for about "
            f"{_MIN_REPETITION_S * 1e3:g} ms (at least once, at most 100 times); the best run "
            "counts.",
            f"latency: wall clock around a loop of tiny ops ended by a synchronisation: {launch}.",
        ]

    def spec(self) -> DeviceSpec:
        """The measured roofs as a device spec (the measured dtypes only)."""
        if not self.peak_flops:
            raise WallfinderError(
                "no matmul dtype could be measured on this device: no profile to save"
            )
        ds = self.datasheet
        if ds is not None:
            key, vendor, cores = ds.key, ds.vendor, ds.tensor_cores
        else:
            key = re.sub(r"[^a-z0-9]+", "-", self.device.lower()).strip("-") or "device"
            vendor = "amd" if self.backend.startswith("rocm") else "nvidia"
            cores = False
        return DeviceSpec(
            key=f"{key}-calibrated",
            name=f"{self.device} (calibrated)",
            vendor=vendor,
            peak_flops=self.peak_flops,
            mem_bandwidth=self.mem_bandwidth,
            tensor_cores=cores,
            source="calibrated",
            names=(self.device,) if self.kind == "gpu" else (),
        )

    def calibration(self) -> Calibration:
        """How the roofs were measured, for the profile's ``[calibration]`` table."""
        s = self.settings
        return Calibration(
            device=self.device,
            datasheet=self.datasheet.key if self.datasheet is not None else None,
            date=self.date,
            torch=self.torch,
            backend=self.backend,
            threads=self.threads,
            matmul_sizes=self.matmul_sizes,
            copy_bytes=s.copy_bytes,
            repetitions=s.repetitions,
            warmup=s.warmup,
            launch_ops=s.launch_ops,
            launch_latency=self.launch_latency_s,
            launch_latency_kind=self.launch_latency_kind,
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile that `analyze --device-profile` reads."""
        return write_device_profile(path, self.spec(), self.calibration())

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready data (rates per second, latency in seconds)."""
        ds = self.datasheet
        s = self.settings
        return {
            "schema": SCHEMA,
            "device": self.device,
            "kind": self.kind,
            "backend": self.backend,
            "torch": self.torch,
            "date": self.date,
            "threads": self.threads,
            "datasheet": None
            if ds is None
            else {"key": ds.key, "name": ds.name, "source": ds.source, "estimate": ds.estimate},
            "peak_flops": dict(self.peak_flops),
            "mem_bandwidth": self.mem_bandwidth,
            "launch_latency_s": self.launch_latency_s,
            "launch_latency_kind": self.launch_latency_kind,
            "figures": [f.to_dict() for f in self.figures],
            "notes": self.notes,
            "settings": {
                "matmul_sizes": dict(self.matmul_sizes),
                "copy_bytes": s.copy_bytes,
                "repetitions": s.repetitions,
                "warmup": s.warmup,
                "launch_ops": s.launch_ops,
            },
        }


def calibrate(
    settings: Settings | None = None, progress: Progress | None = None
) -> CalibrationResult:
    """Measure the roofs of the GPU (`settings.device_index`, or the current one) or, without
    a GPU or with `settings.cpu`, of the CPU. `progress` hears what is being measured."""
    torch = _import_torch()
    settings = settings or Settings()
    device = _select(torch, settings)
    gpu = device.type == "cuda"
    s = settings.resolved(gpu)
    say = progress or (lambda _: None)
    if gpu:
        props = torch.cuda.get_device_properties(device)
        name = str(props.name).strip()
        datasheet = match_device(name, sm_count=int(props.multi_processor_count))
        hip = getattr(torch.version, "hip", None)
        backend = f"rocm {hip}" if hip else f"cuda {torch.version.cuda}"
        threads = None
    else:
        name = _cpu_name()
        datasheet = cpu_spec()
        backend = "cpu"
        threads = int(torch.get_num_threads())
    timer = _Timer(torch, device)
    figures: list[Figure] = []
    peaks: dict[str, float] = {}
    sizes: dict[str, int] = {}
    with _on_device(torch, device), torch.inference_mode():
        for dtype in _GPU_DTYPES if gpu else _CPU_DTYPES:
            peak = datasheet.peak_flops.get(dtype) if datasheet is not None else None
            rate: float | None = None
            method = _unsupported(torch, device, dtype) or ""
            if not method:
                say(f"matmul {dtype}")
                try:
                    rate, sizes[dtype], method = _matmul(torch, timer, device, dtype, s)
                    peaks[dtype] = rate
                except RuntimeError as exc:  # a dtype this build cannot multiply here, or OOM
                    method = f"not measured: {_first_line(exc)}"
            figures.append(
                Figure(
                    kind="matmul",
                    label=f"matmul {dtype}",
                    dtype=dtype,
                    value=rate,
                    unit="FLOP/s",
                    datasheet=peak,
                    method=method,
                )
            )
        say("copy bandwidth")
        bandwidth, copy_bytes, method = _copy(torch, timer, device, s)
        figures.append(
            Figure(
                kind="copy",
                label="copy bandwidth",
                dtype=None,
                value=bandwidth,
                unit="B/s",
                datasheet=datasheet.mem_bandwidth if datasheet is not None else None,
                method=method,
            )
        )
        say("launch latency")
        latency, method = _launch(torch, timer, device, s)
        kind = "GPU kernel launch" if gpu else "CPU op dispatch"
        figures.append(
            Figure(
                kind="launch",
                label=f"{kind} latency",
                dtype=None,
                value=latency,
                unit="s",
                datasheet=None,
                method=method,
            )
        )
    return CalibrationResult(
        device=name,
        kind="gpu" if gpu else "cpu",
        backend=backend,
        torch=str(torch.__version__),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        threads=threads,
        datasheet=datasheet,
        figures=tuple(figures),
        peak_flops=peaks,
        mem_bandwidth=bandwidth,
        launch_latency_s=latency,
        launch_latency_kind=kind,
        settings=dataclasses.replace(s, copy_bytes=copy_bytes),
        matmul_sizes=sizes,
    )


# --- torch, lazily ---------------------------------------------------------------------------


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise WallfinderError(
            f"calibrate measures the device with torch, which is not installed: {INSTALL_TORCH}"
        ) from None
    return torch


def _select(torch: Any, s: Settings) -> Any:
    if s.cpu:
        if s.device_index is not None:
            raise WallfinderError("--device-index and --cpu go separately: pick one device")
        return torch.device("cpu")
    if torch.cuda.is_available():  # ROCm builds present their GPUs as CUDA too
        count = int(torch.cuda.device_count())
        index = s.device_index if s.device_index is not None else int(torch.cuda.current_device())
        if not 0 <= index < count:
            raise WallfinderError(
                f"--device-index {index}: torch sees {count} GPU(s), numbered 0 to {count - 1}"
            )
        return torch.device("cuda", index)
    if s.device_index is not None:
        raise WallfinderError(
            f"--device-index {s.device_index}: torch sees no GPU here (without the flag, "
            "calibrate measures the CPU)"
        )
    return torch.device("cpu")


@contextmanager
def _on_device(torch: Any, device: Any) -> Iterator[None]:
    if device.type == "cuda":
        with torch.cuda.device(device):
            yield
    else:
        yield


def _cpu_name() -> str:
    """The CPU's model name (no host name, nothing else about the machine)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip() or "CPU"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:120] if text else type(exc).__name__


def _unsupported(torch: Any, device: Any, dtype: str) -> str | None:
    """Why `dtype` is not measured on this device, or None when it is."""
    if device.type != "cuda":
        return None
    if dtype == "tf32":
        if getattr(torch.version, "hip", None):
            return "not measured: allow_tf32 does not select TF32 kernels on every ROCm build"
        if torch.cuda.get_device_capability(device)[0] < 8:
            return "not measured: no TF32 before compute capability 8.0 (Ampere)"
    if dtype == "bf16":
        try:
            native = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch before 2.4 has no including_emulation
            native = bool(torch.cuda.is_bf16_supported())
        if not native:
            return "not measured: no native bf16 on this GPU"
    return None


class _Timer:
    """Seconds per call of an operation: CUDA events around back-to-back calls on a GPU, the
    wall clock on a CPU; synchronised before every measurement."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch = torch
        self.device = device
        self.gpu = device.type == "cuda"

    def sync(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize(self.device)

    def per_call(self, fn: Callable[[], object], calls: int) -> float:
        self.sync()
        if self.gpu:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3 / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls

    def best(self, fn: Callable[[], object], s: Settings) -> tuple[float, int]:
        """The best time per call over `s.repetitions` timed repetitions after `s.warmup`
        untimed calls, and the calls per repetition."""
        for _ in range(s.warmup or 0):
            fn()
        once = self.per_call(fn, 1)
        calls = max(1, min(100, math.ceil(_MIN_REPETITION_S / max(once, 1e-9))))
        return min(self.per_call(fn, calls) for _ in range(s.repetitions or 1)), calls


@contextmanager
def _tf32(torch: Any, device: Any, on: bool) -> Iterator[None]:
    """fp32 matmuls with TF32 on or off (the caller's setting restored after)."""
    if device.type != "cuda":
        yield
        return
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = on
    try:
        yield
    finally:
        matmul.allow_tf32 = before


def _matmul(
    torch: Any, timer: _Timer, device: Any, dtype: str, s: Settings
) -> tuple[float, int, str]:
    """FLOP/s of torch.mm on n×n matrices of `dtype`, the n used and how it was measured."""
    name = torch_name(dtype)
    if name is None:
        raise WallfinderError(f"calibrate: no torch dtype computes {dtype!r}")
    tdtype = getattr(torch, name)
    n = s.matmul_size or 0
    note = ""

    def operands(size: int) -> tuple[Any, Any, Any]:
        a = torch.randn(size, size, device=device).to(tdtype)
        b = torch.randn(size, size, device=device).to(tdtype)
        return a, b, torch.empty(size, size, device=device, dtype=tdtype)

    with _tf32(torch, device, dtype == "tf32"):
        if not timer.gpu and n > _PROBE_N:
            # A CPU without fast kernels for a dtype could take minutes at full size: time a
            # small one first (a small matmul runs below the peak, so this errs on the safe
            # side) and shrink n to what fits in the budget.
            a, b, c = operands(_PROBE_N)
            torch.mm(a, b, out=c)
            probe = min(timer.per_call(lambda: torch.mm(a, b, out=c), 1) for _ in range(3))
            runs = (s.warmup or 0) + 1 + (s.repetitions or 1)
            fits = _PROBE_N * ((s.cpu_budget_s or 1.0) / (runs * max(probe, 1e-9))) ** (1 / 3)
            if fits < n:
                note = f" (not {n}: over {s.cpu_budget_s:g} s)"
                n = max(_PROBE_N, int(fits) // 64 * 64)
        a, b, c = operands(n)
        seconds, calls = timer.best(lambda: torch.mm(a, b, out=c), s)
    mode = {"fp32": ", TF32 off", "tf32": ", TF32 on"}.get(dtype, "") if timer.gpu else ""
    method = f"torch.mm n={n}{note}{mode}: 2n³ FLOP / {_runs(s, calls)}"
    return 2.0 * n**3 / seconds, n, method


def _runs(s: Settings, calls: int) -> str:
    each = f"×{calls} " if calls > 1 else ""
    return f"best of {s.repetitions} {each}after {s.warmup} warm-up"


def _copy(torch: Any, timer: _Timer, device: Any, s: Settings) -> tuple[float, int, str]:
    """Bytes/s of a device-to-device tensor copy (bytes read + bytes written)."""
    nbytes = s.copy_bytes or _MIB
    if timer.gpu:
        free, _ = torch.cuda.mem_get_info(device)
        nbytes = max(_MIB, min(nbytes, int(free) // 4 // _MIB * _MIB))
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds, calls = timer.best(lambda: dst.copy_(src), s)
    method = f"copy_ of {_size(nbytes)}: bytes read + written / {_runs(s, calls)}"
    return 2.0 * nbytes / seconds, nbytes, method


def _launch(torch: Any, timer: _Timer, device: Any, s: Settings) -> tuple[float, str]:
    """Mean seconds per tiny op in a synchronised loop: the launch latency a GPU's host pays
    per kernel, or a CPU op's dispatch overhead."""
    ops = s.launch_ops or 1
    x = torch.zeros(1, device=device)

    def loop() -> None:
        for _ in range(ops):
            x.add_(1.0)

    for _ in range(s.warmup or 0):
        loop()
    best = math.inf
    for _ in range(s.repetitions or 1):
        timer.sync()
        t0 = time.perf_counter()
        loop()
        timer.sync()
        best = min(best, (time.perf_counter() - t0) / ops)
    method = f"x.add_(1) on 1 element, {ops} in a synchronised loop: mean, best of {s.repetitions}"
    return best, method


def _size(nbytes: int) -> str:
    if nbytes >= 1 << 30 and nbytes % (1 << 30) == 0:
        return f"{nbytes >> 30} GiB"
    return f"{nbytes / _MIB:g} MiB"
