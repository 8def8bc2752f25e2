"""Built-in demo workloads: small training jobs, each made to hit one wall on purpose, each
with a fixed variant that shows the same job after the fix.

    result = run_demo("dataloader", trace_dir="wallfinder-demo/dataloader")
    print(result.diagnosis.verdict.wall, result.expected.describe())

(`run_demo` is in `wallfinder.measure`: it profiles a workload and diagnoses it. This module
runs the workloads and analyses nothing.)

Every workload is an ordinary training loop with one optimizer, whose steps mark the profiled
steps. It runs on whatever device is present (CUDA and ROCm GPUs through `torch.cuda`, else the
CPU) with sizes that suit the device: a few seconds on a laptop CPU. What a workload expects is
written per kind of device, because the CPU honestly behaves differently: it runs ops
synchronously (so `.item()` costs it nothing), has no TF32, and is measured against a nominal
roof. Where the CPU cannot show a wall, its expectation is what the CPU really does, and says
why.

torch is imported inside the functions only: importing this module never loads it.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from wallfinder.capture import require_torch
from wallfinder.errors import WallfinderError

if TYPE_CHECKING:
    from wallfinder.diagnosis import Diagnosis, Wall

__all__ = [
    "CPU_THREADS",
    "DEFAULT",
    "DEVICES",
    "READ_S",
    "TINY_BATCH",
    "WAIT",
    "WARMUP",
    "WORKLOADS",
    "Expectation",
    "Workload",
    "default_device",
    "get",
    "prepare_demo",
    "require_torch",
]

Device = Literal["cpu", "cuda"]
DEVICES: tuple[Device, ...] = ("cpu", "cuda")


WAIT, WARMUP = 2, 3
"""Steps before the kept ones: two ignored (setup, DataLoader workers starting, a cold
machine's first iterations), three profiled and discarded (first-iteration allocations, kernel
selection, the profiler starting up)."""


@dataclass(frozen=True)
class Expectation:
    """What a workload's diagnosis should say on one kind of device: the wall, and where it is
    meaningful the verdict's cause and the id of the top finding (None: not asserted); `note`
    says why this device differs from the workload's headline, when it does. `faster`, for a
    fixed variant: whether its step is faster than as written, beyond the runs' noise (None:
    not asserted, e.g. where it depends on the CPU's instructions)."""

    wall: Wall
    cause: str | None = None
    finding: str | None = None
    note: str = ""
    faster: bool | None = None

    def describe(self) -> str:
        parts: list[str] = [self.wall]
        if self.cause:
            parts.append(f"cause {self.cause}")
        if self.finding:
            parts.append(f"top finding {self.finding}")
        return ", ".join(parts)

    def differences(self, d: Diagnosis) -> list[str]:
        """How `d` differs from this expectation (empty when it matches)."""
        out = []
        if d.verdict.wall != self.wall:
            out.append(f"wall {d.verdict.wall} (expected {self.wall})")
        if self.cause is not None and d.verdict.cause != self.cause:
            out.append(f"cause {d.verdict.cause} (expected {self.cause})")
        top = d.findings[0].id if d.findings else None
        if self.finding is not None and top != self.finding:
            out.append(f"top finding {top or 'none'} (expected {self.finding})")
        return out


Loop = Callable[[int, bool, str], None]
"""(steps, fixed, device): build the job and run `steps` optimizer steps."""


@dataclass(frozen=True)
class Workload:
    """A demo training job: `wall` says in one line what it hits, `fix` what the fixed variant
    changes, `expect` what the diagnosis should say per kind of device (as written, fixed),
    `notes` how it works, and `unshown` why a kind of device cannot show the wall at all (the
    mechanism does not exist there)."""

    name: str
    wall: str
    fix: str
    expect: dict[Device, tuple[Expectation, Expectation]]
    notes: str
    loop: Loop
    unshown: dict[Device, str] = field(default_factory=dict)
    what_if: dict[Device, str] = field(default_factory=dict)
    """Per kind of device, the what-if (as `--what-if` takes it) that stands for the fix on
    the as-written run's dependency graph: the replay's prediction of the fixed step. None
    where the graph has no change for the fix (a precision change, fusion on the CPU)."""

    def expected(self, device: str, fixed: bool) -> Expectation:
        broken, good = self.expect[_kind(device)]
        return good if fixed else broken

    def what_if_for(self, device: str) -> str | None:
        """The what-if that stands for the fix on `device` (None: the graph has none)."""
        return self.what_if.get(_kind(device))

    def cannot_show(self, device: str) -> str:
        """Why `device` cannot show this workload's wall ("" when it can)."""
        return self.unshown.get(_kind(device), "")

    def run(self, steps: int, fixed: bool = False, device: str = "cpu") -> None:
        """Run `steps` training steps (optimizer steps) as written, or with the fix; on the CPU
        with torch's ops on one thread (see `CPU_THREADS`)."""
        require_torch("wallfinder demo")
        with _threads(None if _on_gpu(device) else CPU_THREADS):
            self.loop(steps, fixed, device)


# The loops ---------------------------------------------------------------------------------------
#
# Each builds its model and data, then runs `steps` optimizer steps; nothing else in it steps an
# optimizer, so a profiler that marks steps by optimizer steps sees exactly these.


def _torch() -> Any:
    """torch, imported when a workload runs (and typed loosely: the loops are demo code)."""
    import torch

    return torch


def _on_gpu(device: str) -> bool:
    return device.startswith("cuda")


def _kind(device: str) -> Device:
    return "cuda" if _on_gpu(device) else "cpu"


def _mlp(sizes: list[int], device: str) -> Any:
    torch = _torch()

    layers: list[Any] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        if i:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(a, b))
    return torch.nn.Sequential(*layers).to(device)


CPU_THREADS = 1
"""Threads for torch's ops when a workload runs on the CPU. One: the workloads' sizes then mean
the same on a laptop and on a 64-core server, and another program on a busy machine can slow
an op down but not stall every op on a barrier between threads (measured on a shared 2-core
machine: 29 ms steps on one thread, 19 to 210 ms on two)."""


@contextmanager
def _threads(count: int | None) -> Iterator[None]:
    """torch.set_num_threads(count) for the loop only (None: leave it): it is process-wide."""
    torch = _torch()

    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def _matmul_precision(precision: str) -> Iterator[None]:
    """torch.set_float32_matmul_precision for the loop only: it is process-wide state."""
    torch = _torch()

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


class _SlowBatches:
    """A dataset of whole batches that takes `read_s` to read each one, as from a network
    filesystem or an object store. The read is a sleep: it stands in for storage latency, so
    the demo behaves alike on every machine (what the profiler measures is real: the loop
    waits for it). A plain class, so that DataLoader workers can pickle it."""

    def __init__(self, count: int, batch: int, width: int, classes: int, read_s: float) -> None:
        self.count, self.batch, self.width, self.classes = count, batch, width, classes
        self.read_s = read_s

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        torch = _torch()

        time.sleep(self.read_s)
        g = torch.Generator().manual_seed(index)
        x = torch.randn(self.batch, self.width, generator=g)
        y = torch.randint(0, self.classes, (self.batch,), generator=g)
        return x, y


READ_S: dict[Device, float] = {"cuda": 0.030, "cpu": 0.150}
"""How long the dataloader workload takes to read one batch, per kind of device: several times
the model's step, so that the wait is the step's wall by a wide margin. On one CPU thread the
step is ~25 ms, and two or three times that on a busy machine: a 150 ms read is still most of
the step there. On GPUs the step is ~4 ms (H100, fp32) to ~30 ms (T4): a 30 ms read is at
least half of it. The fixed variant's workers read `LOADER_WORKERS` batches at a time: one
batch every 19 ms on the CPU and every 4 ms on GPUs, no slower than the step consumes them,
and with all of a short run's batches requested at once (see `PREFETCH`)."""

LOADER_WORKERS = 8
"""More workers than a small machine has cores is fine here: they wait on storage, not the CPU."""

PREFETCH = 4
"""Batches each worker reads ahead: with `LOADER_WORKERS`, 32 batches in flight, more than the
demo's default run (13 steps) asks for."""


def _dataloader_loop(steps: int, fixed: bool, device: str) -> None:
    torch = _torch()

    gpu = _on_gpu(device)
    batch, width, hidden = (2048, 256, 4096) if gpu else (256, 256, 1024)
    torch.manual_seed(0)
    model = _mlp([width, hidden, hidden, 10], device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = _SlowBatches(steps, batch, width, 10, read_s=READ_S["cuda" if gpu else "cpu"])
    with warnings.catch_warnings():
        # "This DataLoader will create 8 worker processes in total. Our suggested max number
        # of worker in current system is 2": true of CPU-bound workers; these wait on storage.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        loader = (
            torch.utils.data.DataLoader(
                data,
                batch_size=None,  # the dataset yields whole batches
                num_workers=LOADER_WORKERS,
                persistent_workers=True,
                prefetch_factor=PREFETCH,
                pin_memory=gpu,
            )
            if fixed
            else torch.utils.data.DataLoader(data, batch_size=None, num_workers=0)
        )
        batches = iter(loader)
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        logits = model(x.to(device, non_blocking=True))
        torch.nn.functional.cross_entropy(logits, y.to(device, non_blocking=True)).backward()
        opt.step()


TINY_BATCH = 128
"""The tiny-ops workload's batch: as written it runs the model once per sample, so the fix (one
pass for the batch) issues about 1/TINY_BATCH of the ops, and its what-if cuts the host's
per-op overhead by this factor."""


def _tiny_ops_loop(steps: int, fixed: bool, device: str) -> None:
    torch = _torch()

    nnf = torch.nn.functional
    batch, width = TINY_BATCH, 64
    torch.manual_seed(0)
    model = _mlp([width, width, width, 10], device)
    layers = [m for m in model if isinstance(m, torch.nn.Linear)]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def forward(h: Any) -> Any:
        # The layers' functions called directly: the modules' own Python would add time
        # between the ops that the profiler records as no op at all.
        for i, layer in enumerate(layers):
            h = nnf.linear(torch.relu(h) if i else h, layer.weight, layer.bias)
        return h

    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        if fixed:  # the whole batch in one pass: a few larger ops
            loss = nnf.cross_entropy(forward(x), y)
        else:  # one sample at a time: the same maths as thousands of tiny ops
            pairs = zip(x.split(1), y.split(1), strict=True)
            loss = torch.stack([nnf.cross_entropy(forward(a), b) for a, b in pairs]).mean()
        loss.backward()
        opt.step()


def _sync_loop(steps: int, fixed: bool, device: str) -> None:
    torch = _torch()

    gpu = _on_gpu(device)
    batch, width, hidden = (4096, 512, 4096) if gpu else (256, 256, 1024)
    torch.manual_seed(0)
    model = _mlp([width, hidden, hidden, 10], device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    pool = torch.randn(4 * batch, width, generator=g)
    labels = torch.randint(0, 10, (4 * batch,), generator=g)
    rounds = 1  # of host-side augmentation per batch; sized to the GPU after the first steps
    running = torch.zeros((), device=device)
    for step in range(steps):
        # The host makes each batch itself (sampling and augmenting on the CPU, as small
        # scripts and RL loops do): work that overlaps the GPU's, unless the host waits first.
        began = time.perf_counter()
        rows = torch.randint(0, pool.shape[0], (batch,), generator=g)
        x = pool[rows]
        for _ in range(rounds):
            x = (x * 1.01 + 0.01 * torch.randn(x.shape, generator=g)).clamp_(-4.0, 4.0)
        host_s = (time.perf_counter() - began) / rounds
        timing = gpu and step == 1
        if timing:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        opt.zero_grad(set_to_none=True)
        logits = model(x.to(device, non_blocking=True))
        loss = torch.nn.functional.cross_entropy(logits, labels[rows].to(device))
        loss.backward()
        opt.step()
        if fixed:  # keep the running loss on the device; read it once, after the loop
            running += loss.detach()
        else:  # log the loss every step: .item() waits for the GPU to finish the step
            running += loss.item()
        if timing:
            # GPUs differ far more than their hosts: give the host about 70% of the GPU's
            # time per step, so that without the wait it hides behind the GPU's work.
            end.record()
            end.synchronize()
            gpu_s = start.elapsed_time(end) / 1e3
            rounds = max(1, min(64, round(0.7 * gpu_s / max(host_s, 1e-6))))
    float(running)


def _pointwise_loop(steps: int, fixed: bool, device: str) -> None:
    torch = _torch()

    nnf = torch.nn.functional
    gpu = _on_gpu(device)
    rows, width, blocks = (1 << 17, 128, 4) if gpu else (1024, 128, 8)
    torch.manual_seed(0)
    # Blocks of a per-feature scale and shift, LayerNorm and GELU: the pointwise part of a
    # transformer layer, without its matmuls.
    scales = torch.nn.ParameterList(torch.ones(width, device=device) for _ in range(blocks))
    shifts = torch.nn.ParameterList(torch.zeros(width, device=device) for _ in range(blocks))
    norms = torch.nn.ModuleList(torch.nn.LayerNorm(width, device=device) for _ in range(blocks))
    opt = torch.optim.SGD([*scales, *shifts, *norms.parameters()], lr=1e-3)
    x = torch.randn(rows, width, device=device)
    y = torch.randn(rows, width, device=device)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        h = x
        for scale, shift, norm in zip(scales, shifts, norms, strict=True):
            h = h * scale + shift
            if fixed:  # one fused kernel each, forward and backward
                h = nnf.gelu(
                    nnf.layer_norm(h, (width,), norm.weight, norm.bias), approximate="tanh"
                )
            else:  # the same maths written out: a dozen kernels, each a trip through memory
                h = _gelu_by_hand(_layer_norm_by_hand(h, norm.weight, norm.bias))
        nnf.mse_loss(h, y).backward()
        opt.step()


def _gelu_by_hand(x: Any) -> Any:
    torch = _torch()

    return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def _layer_norm_by_hand(x: Any, weight: Any, bias: Any) -> Any:
    mean = x.mean(-1, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(-1, keepdim=True)
    return centred / (var + 1e-5).sqrt() * weight + bias


def _matmul_job(device: str) -> tuple[Any, Any, Any, Any]:
    torch = _torch()

    batch, width, hidden = (4096, 4096, 8192) if _on_gpu(device) else (256, 512, 1024)
    torch.manual_seed(0)
    model = _mlp([width, hidden, hidden, width], device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=device)
    y = torch.randn(batch, width, device=device)
    return model, opt, x, y


def _matmul_loop(steps: int, fixed: bool, device: str) -> None:
    torch = _torch()

    model, opt, x, y = _matmul_job(device)
    # As written: fp32, with TF32 allowed ("high"), already a GPU's fastest fp32 path. Fixed:
    # bf16 autocast, the lever left at the compute wall: a lower precision raises the roof.
    dev_type = "cuda" if _on_gpu(device) else "cpu"
    with (
        _matmul_precision("high"),
        torch.autocast(dev_type, dtype=torch.bfloat16, enabled=fixed),
    ):
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x).float(), y).backward()
            opt.step()


def _precision_loop(steps: int, fixed: bool, device: str) -> None:
    torch = _torch()

    model, opt, x, y = _matmul_job(device)
    # As written: fp32 matmuls at full precision ("highest": TF32 off, PyTorch's default).
    # Fixed on GPUs: TF32 ("high"). CPUs have no TF32; their counterpart lets oneDNN compute
    # fp32 matmuls in bf16 ("medium"), faster on CPUs with bf16 instructions.
    precision = ("high" if _on_gpu(device) else "medium") if fixed else "highest"
    with _matmul_precision(precision):
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()


# The registry ------------------------------------------------------------------------------------

_SAME_ON_CPU = "both variants are the same compute-bound job there"
_CPU_ROOF = (
    "On the CPU, how near peak the matmuls run is measured against a nominal CPU roof (give "
    "wallfinder analyze --spec FILE for yours), so the cause is not asserted."
)

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload(
            name="dataloader",
            wall="overhead: a slow DataLoader with num_workers=0 (each step waits for its batch)",
            fix=f"DataLoader(num_workers={LOADER_WORKERS}, persistent_workers=True, "
            f"prefetch_factor={PREFETCH}, pin_memory on GPUs): batches are read in the background",
            expect={
                "cpu": (
                    Expectation("overhead", "data_loading", "data-loading"),
                    Expectation("compute", faster=True),
                ),
                "cuda": (
                    Expectation("overhead", "data_loading", "data-loading"),
                    Expectation("compute", faster=True),
                ),
            },
            notes=f"Each batch takes {READ_S['cuda'] * 1e3:g} ms to read on a GPU run, "
            f"{READ_S['cpu'] * 1e3:g} ms on the CPU (a sleep standing in for slow storage). "
            f"Without workers the loop waits for every read; with {LOADER_WORKERS}, the reads "
            "overlap the training step, and the step is the model's alone.",
            loop=_dataloader_loop,
            what_if={"cpu": "data", "cuda": "data"},
        ),
        Workload(
            name="tiny-ops",
            wall="overhead: many tiny ops (the batch processed one sample at a time)",
            fix="process the whole batch in one pass: a few larger ops instead of thousands "
            "of tiny ones",
            expect={
                "cpu": (
                    Expectation(
                        "overhead",
                        finding="launch-bound",
                        note="the Python between the tiny ops runs in no recorded op: on a "
                        "busy CPU the verdict's cause can read 'unexplained', and the top "
                        "finding names the per-op overhead",
                    ),
                    Expectation(
                        "overhead",
                        note="a model this small is mostly per-op overhead even when "
                        "batched; the step is many times faster",
                        faster=True,
                    ),
                ),
                "cuda": (
                    Expectation("overhead", "host_overhead", "launch-bound"),
                    Expectation(
                        "overhead",
                        note="a model this small cannot keep a GPU busy even when "
                        "batched; the step is many times faster",
                        faster=True,
                    ),
                ),
            },
            notes="Per sample, each op does a few thousand FLOPs: its time is the framework's "
            "fixed cost per op (Python, dispatch, autograd, a kernel launch on GPUs).",
            loop=_tiny_ops_loop,
            what_if={"cpu": f"host:{TINY_BATCH}", "cuda": f"host:{TINY_BATCH}"},
        ),
        Workload(
            name="sync",
            wall="overhead: .item() every step (the GPU idles while the host prepares the "
            "next batch)",
            fix="keep the running loss on the device and read it once, after the loop",
            expect={
                "cpu": (
                    Expectation("compute", note=_SAME_ON_CPU),
                    Expectation("compute", note=_SAME_ON_CPU),
                ),
                "cuda": (
                    Expectation("overhead", "synchronization", "sync-in-step"),
                    Expectation("compute", faster=True),
                ),
            },
            notes="A GPU runs ops asynchronously: without the .item(), the host samples and "
            "augments the next batch while the GPU trains on this one; with it, the host first "
            "waits for the GPU, then the GPU waits for the host. On GPUs the host's share of "
            "the work is sized to the GPU's speed after the first steps.",
            loop=_sync_loop,
            what_if={"cpu": "sync", "cuda": "sync"},
            unshown={
                "cpu": "the CPU runs ops synchronously: .item() has no device to wait for, so "
                "it costs nothing"
            },
        ),
        Workload(
            name="pointwise",
            wall="bandwidth: LayerNorm and GELU written out by hand (a chain of pointwise ops "
            "on large activations)",
            fix="the fused built-ins F.layer_norm and F.gelu (torch.compile fuses such chains "
            "in general)",
            expect={
                "cpu": (
                    Expectation(
                        "bandwidth",
                        "elementwise",
                        note="the fusion finding needs device kernels: none on the CPU",
                    ),
                    Expectation("bandwidth", faster=True),
                ),
                "cuda": (
                    Expectation("bandwidth", "elementwise", "fusable-pointwise"),
                    Expectation("bandwidth", faster=True),
                ),
            },
            notes="Each written-out op reads and writes the whole activation: a dozen trips "
            "through memory where the fused op makes one or two. Still memory-bound after the "
            "fix (normalisation and activations are), with far fewer bytes moved.",
            loop=_pointwise_loop,
            what_if={"cuda": "fuse"},
        ),
        Workload(
            name="matmul",
            wall="compute: large matmuls (an MLP with wide layers)",
            fix="torch.autocast(dtype=torch.bfloat16): a lower precision raises the roof",
            expect={
                "cpu": (
                    Expectation("compute", note=_CPU_ROOF),
                    Expectation(
                        "compute",
                        note=_CPU_ROOF + " bf16 is faster only on CPUs "
                        "with bf16 instructions (AVX512-BF16, AMX).",
                    ),
                ),
                "cuda": (Expectation("compute"), Expectation("compute", faster=True)),
            },
            notes="The wall to be at: the device is busy with matmuls. fp32 runs in TF32 on "
            "GPUs that have it; bf16 doubles the roof again.",
            loop=_matmul_loop,
        ),
        Workload(
            name="precision",
            wall="compute, below peak: fp32 matmuls with TF32 off",
            fix="torch.set_float32_matmul_precision('high') (TF32) on GPUs; 'medium' on CPUs "
            "(oneDNN may then compute fp32 matmuls in bf16)",
            expect={
                "cpu": (
                    Expectation("compute", note=_CPU_ROOF),
                    Expectation("compute", note="faster only on CPUs with bf16 instructions"),
                ),
                "cuda": (
                    Expectation("compute", "below peak: precision/shape/kernel", "fp32-matmul"),
                    Expectation("compute", faster=True),
                ),
            },
            notes="TF32 runs fp32 matmuls on the tensor cores of NVIDIA GPUs from Ampere on, "
            "several times faster than fp32 on their CUDA cores.",
            loop=_precision_loop,
            unshown={"cpu": "CPUs have no TF32: there is no faster fp32 matmul path to leave off"},
        ),
    ]
}

DEFAULT = "dataloader"
"""The workload `wallfinder demo` runs when none is named: the most common reason a real
training job is slow, and a clear before and after on any device."""


def get(name: str) -> Workload:
    """The workload called `name`; an unknown name is a `WallfinderError` listing the names."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise WallfinderError(
            f"no demo workload {name!r}: choose one of {', '.join(WORKLOADS)}"
        ) from None


def default_device() -> Device:
    """ "cuda" when a CUDA or ROCm GPU is present, else "cpu"."""
    require_torch("wallfinder demo")
    torch = _torch()

    return "cuda" if torch.cuda.is_available() else "cpu"


def _check_device(device: str) -> Device:
    torch = _torch()

    if device not in DEVICES:
        raise WallfinderError(f"unknown demo device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise WallfinderError(
            "no CUDA or ROCm GPU is available to torch here (torch.cuda.is_available() is "
            "False): run the demo with --device cpu"
        )
    return "cuda" if device == "cuda" else "cpu"


M_MMAP_THRESHOLD = -3
"""mallopt's parameter number for the mmap threshold (glibc's malloc.h)."""


def _steady_heap() -> None:
    """On glibc, serve allocations of 128 KiB and more (CPU tensors) by mmap, for the rest of
    the process.

    glibc raises its mmap threshold as large blocks are freed, so CPU tensors come from the
    heap; while the profiler records, its many small, long-lived allocations are carved out of
    the freed tensors' blocks, the heap fragments, and each profiled step touches fresh pages
    and runs slower than the last (measured on the pointwise workload: 60 ms, then 300 ms,
    then over 400 ms per step). A fixed threshold keeps tensors apart from the profiler's
    records: steady steps, each paying its page faults, as the first steps of any job do."""
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has it, as a no-op)
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt(M_MMAP_THRESHOLD, 128 * 1024)


def prepare_demo(name: str, *, device: str | None, steps: int) -> tuple[Workload, Device]:
    """The workload called `name` and the device to run it on (default: the GPU when there is
    one), ready to be profiled for `steps` steps after `WAIT` ignored and `WARMUP` warm-up
    steps. On the CPU under glibc this fixes the process's malloc mmap threshold (see
    `_steady_heap`)."""
    workload = get(name)
    if steps < 1:
        raise WallfinderError("the demo needs at least 1 profiled step")
    require_torch("wallfinder demo")
    # Kineto prints progress lines of its own on stderr (level 5, "USDT"); the demo's output is
    # the diagnosis. A level the user set wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    dev = _check_device(device or default_device())
    if dev == "cpu":
        _steady_heap()
    return workload, dev
