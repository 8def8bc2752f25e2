"""Build synthetic PyTorch profiler (Kineto) traces for tests.

A `TraceBuilder` collects events with times in microseconds relative to the start of the
trace; `write` (or `to_bytes`) lays them out the way Kineto's ChromeTraceLogger does, with one
keyword per format quirk real traces carry, so each quirk can be switched on alone:

    b = TraceBuilder(rank=0, world_size=2)
    b.step(1, 0.0, 100.0)
    b.kernel("volta_sgemm_128x64_nn", 20.0, 50.0, launch_at=10.0)
    path = b.write(tmp_path / "trace.json.gz", kernel_cat="Kernel", string_ids=True)

Kernels, memcpys and memsets are joined to their runtime call by a correlation id and carry
`device`, `stream`, `correlation` and `External id` in `args`, as Kineto writes them. A trace
without ProfilerStep annotations, or a CPU-only trace, is one where none were added.
"""

from __future__ import annotations

import copy
import gzip
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from wallfinder.trace import Trace

DATALOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
"""The annotation torch.profiler records around each DataLoader `__next__`."""

NASTY_NAME = 'void evil<"}, {", }, {>(<script>alert(1)</script>) [bold]x[/bold] \\ ü'
"""A name with an event-boundary pattern, HTML, rich markup, a backslash and non-ASCII text."""

_HIP_NAMES = {
    "cudaLaunchKernel": "hipLaunchKernel",
    "cudaMemcpyAsync": "hipMemcpyAsync",
    "cudaMemsetAsync": "hipMemsetAsync",
    "cudaStreamSynchronize": "hipStreamSynchronize",
    "cudaDeviceSynchronize": "hipDeviceSynchronize",
}
_HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "python_function")


@dataclass
class TraceBuilder:
    """Collects events of one rank's trace; times are µs from the start of the trace."""

    device_name: str | None = "NVIDIA H100 80GB HBM3"
    device: int = 0
    device_properties: dict[str, Any] | None = None
    """deviceProperties to write instead of the default (name and 85 GiB); `id` is added."""
    rank: int | None = None
    world_size: int | None = None
    pid: int = 4242
    tid: int = 4242
    base_us: int = 1_700_000_000
    events: list[dict[str, Any]] = field(default_factory=list)
    _next_id: int = 1

    def new_id(self) -> int:
        """A fresh correlation / External id."""
        value = self._next_id
        self._next_id += 1
        return value

    # Host side -------------------------------------------------------------------------------

    def host(
        self,
        name: str,
        start: float,
        dur: float,
        *,
        cat: str = "cpu_op",
        tid: int | None = None,
        args: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Any complete event on a host thread."""
        event = {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": self.pid,
            "tid": self.tid if tid is None else tid,
            "ts": start,
            "dur": dur,
            "args": {"External id": self.new_id(), **(args or {})},
        }
        self.events.append(event)
        return event

    def step(self, number: int, start: float, dur: float) -> None:
        """A `ProfilerStep#N` annotation on the main thread."""
        self.host(f"ProfilerStep#{number}", start, dur, cat="user_annotation")

    def cpu_op(self, name: str, start: float, dur: float, *, tid: int | None = None) -> None:
        self.host(name, start, dur, cat="cpu_op", tid=tid)

    def annotation(self, name: str, start: float, dur: float, *, tid: int | None = None) -> None:
        self.host(name, start, dur, cat="user_annotation", tid=tid)

    def dataloader(self, start: float, dur: float, *, tid: int | None = None) -> None:
        """The host waiting for the next batch of a single-process DataLoader."""
        self.host(DATALOADER, start, dur, cat="user_annotation", tid=tid)

    def runtime(
        self,
        name: str,
        start: float,
        dur: float,
        *,
        correlation: int | None = None,
        tid: int | None = None,
        cbid: int = 211,
    ) -> None:
        """A CUDA runtime call (renamed to its HIP twin by `write(hip=True)`)."""
        args = {"cbid": cbid}
        if correlation is not None:
            args["correlation"] = correlation
        self.host(name, start, dur, cat="cuda_runtime", tid=tid, args=args)

    def event_record(self, start: float, *, tid: int | None = None) -> int:
        """`cudaEventRecord` (CUPTI's cbid 135): an event marking the work queued so far on
        a stream, for another stream to wait on. Returns its correlation id, which the
        waits name."""
        correlation = self.new_id()
        self.runtime("cudaEventRecord", start, 1.0, correlation=correlation, tid=tid, cbid=135)
        return correlation

    def stream_wait(
        self, start: float, *, stream: int, on_stream: int, record: int, tid: int | None = None
    ) -> None:
        """`stream` waits for the event `record` (an `event_record`'s correlation) recorded
        on `on_stream`: the `cudaStreamWaitEvent` call (cbid 147) and the `cuda_sync`
        activity CUPTI records for it (`Stream Wait Event`, at the call, as Kineto writes
        it: the device does the waiting later, when it reaches the wait)."""
        correlation = self.new_id()
        self.runtime("cudaStreamWaitEvent", start, 1.0, correlation=correlation, tid=tid, cbid=147)
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_sync",
                "name": "Stream Wait Event",
                "pid": self.device,
                "tid": stream,
                "ts": start + 0.5,
                "dur": 0.5,
                "args": {
                    "External id": correlation,
                    "cuda_sync_kind": "Stream Wait Event",
                    "wait_on_stream": on_stream,
                    "wait_on_cuda_event_record_corr_id": record,
                    "wait_on_cuda_event_id": record,
                    "stream": stream,
                    "correlation": correlation,
                    "device": self.device,
                    "context": 1,
                },
            }
        )

    def sync(self, start: float, dur: float, *, name: str = "cudaStreamSynchronize") -> None:
        """The host blocked until the GPU drains its stream."""
        self.runtime(name, start, dur, correlation=self.new_id())

    def memory(
        self,
        at: float,
        addr: int,
        nbytes: int,
        total_allocated: int,
        total_reserved: int,
        *,
        device_type: int = 1,
        device: int | None = None,
        tid: int | None = None,
    ) -> None:
        """A `[memory]` instant (profile_memory=True): `nbytes` > 0 allocates the block at
        `addr`, < 0 frees it; the totals are the allocator's after it."""
        self.events.append(
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "s": "t",
                "name": "[memory]",
                "pid": self.pid,
                "tid": self.tid if tid is None else tid,
                "ts": at,
                "args": {
                    "Device Type": device_type,
                    "Device Id": (self.device if device is None else device)
                    if device_type != 0
                    else -1,
                    "Addr": addr,
                    "Bytes": nbytes,
                    "Total Allocated": total_allocated,
                    "Total Reserved": total_reserved,
                },
            }
        )

    # Device side -----------------------------------------------------------------------------

    def _device_event(
        self,
        cat: str,
        name: str,
        start: float,
        dur: float,
        *,
        stream: int,
        launch_at: float | None,
        launcher: str,
        launch_dur: float,
        extra: dict[str, Any] | None = None,
        launch_tid: int | None = None,
    ) -> int:
        correlation = self.new_id()
        external = self.new_id()
        if launch_at is not None:
            self.runtime(launcher, launch_at, launch_dur, correlation=correlation, tid=launch_tid)
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": self.device,
                "tid": stream,
                "ts": start,
                "dur": dur,
                "args": {
                    "External id": external,
                    "device": self.device,
                    "context": 1,
                    "stream": stream,
                    "correlation": correlation,
                    **(extra or {}),
                },
            }
        )
        return correlation

    def kernel(
        self,
        name: str,
        start: float,
        dur: float,
        *,
        launch_at: float | None = None,
        launch_dur: float = 4.0,
        stream: int = 7,
        args: dict[str, Any] | None = None,
        launch_tid: int | None = None,
        launcher: str = "cudaLaunchKernel",
    ) -> int:
        """A kernel; with `launch_at`, also its launch call, `launcher` (on thread
        `launch_tid`, the main thread by default); `args` are added to its args. Returns the
        correlation id."""
        return self._device_event(
            "kernel",
            name,
            start,
            dur,
            stream=stream,
            launch_at=launch_at,
            launcher=launcher,
            launch_dur=launch_dur,
            extra={"grid": [128, 1, 1], "block": [256, 1, 1], **(args or {})},
            launch_tid=launch_tid,
        )

    def nccl(
        self,
        start: float,
        dur: float,
        *,
        name: str = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long)",
        launch_at: float | None = None,
        stream: int = 28,
        collective: str | None = None,
        nelems: int = 0,
        dtype: str = "BFloat16",
        group: str = "0",
        group_size: int = 2,
        launch_tid: int | None = None,
    ) -> int:
        """An NCCL collective kernel on its own stream; with `collective`, with the arguments
        recent PyTorch releases record on it (`Collective name`, `In msg nelems`, ...)."""
        args = None
        if collective is not None:
            args = {
                "Collective name": collective,
                "In msg nelems": nelems,
                "Out msg nelems": nelems,
                "Group size": group_size,
                "dtype": dtype,
                "In split size": "[]",
                "Out split size": "[]",
                "Process Group Name": group,
                "Process Group Description": "default_pg",
                "Process Group Ranks": str(list(range(group_size))),
            }
        return self.kernel(
            name, start, dur, launch_at=launch_at, stream=stream, args=args, launch_tid=launch_tid
        )

    def memcpy(
        self,
        start: float,
        dur: float,
        nbytes: int,
        *,
        direction: str = "HtoD",
        launch_at: float | None = None,
        stream: int = 7,
    ) -> int:
        label = {"HtoD": "Pageable -> Device", "DtoH": "Device -> Pageable"}.get(
            direction, "Device -> Device"
        )
        return self._device_event(
            "gpu_memcpy",
            f"Memcpy {direction} ({label})",
            start,
            dur,
            stream=stream,
            launch_at=launch_at,
            launcher="cudaMemcpyAsync",
            launch_dur=4.0,
            extra={"bytes": nbytes, "memory bandwidth (GB/s)": 1.0},
        )

    def memset(
        self, start: float, dur: float, nbytes: int, *, launch_at: float | None = None
    ) -> int:
        return self._device_event(
            "gpu_memset",
            "Memset (Device)",
            start,
            dur,
            stream=7,
            launch_at=launch_at,
            launcher="cudaMemsetAsync",
            launch_dur=3.0,
            extra={"bytes": nbytes},
        )

    # Output ----------------------------------------------------------------------------------

    def header(self, *, device_properties: bool = True) -> dict[str, Any]:
        head: dict[str, Any] = {"schemaVersion": 1}
        if device_properties and self.device_properties is not None:
            head["deviceProperties"] = [{"id": self.device, **self.device_properties}]
        elif device_properties:
            props = [{"id": self.device, "name": self.device_name, "totalGlobalMem": 85 << 30}]
            head["deviceProperties"] = props if self.device_name is not None else []
        if self.rank is not None:
            head["distributedInfo"] = {
                "backend": "nccl",
                "rank": self.rank,
                "world_size": self.world_size,
            }
        return head

    def trace_events(
        self,
        *,
        string_ids: bool = False,
        bytes_key: str = "bytes",
        kernel_cat: str = "kernel",
        hip: bool = False,
        begin_end: bool = False,
        integer_ts: bool = False,
        metadata: bool = True,
    ) -> list[dict[str, Any]]:
        """The events as written, with the chosen quirks applied:

        - `string_ids`: pids and tids as strings ("4242") instead of integers;
        - `bytes_key`: the memcpy/memset size under "bytes" (Kineto) or "Bytes";
        - `kernel_cat`: the kernel category, "kernel" or "Kernel" (old PyTorch);
        - `hip`: HIP runtime names (`hipLaunchKernel`, ...) instead of CUDA ones;
        - `begin_end`: host events as B/E pairs in time order instead of X events;
        - `integer_ts`: whole-µs integer times instead of floats;
        - `metadata`: append process/thread name and label metadata events.
        """
        out: list[dict[str, Any]] = []
        paired: list[tuple[tuple[float, int, float], dict[str, Any]]] = []
        for source in self.events:
            event = copy.deepcopy(source)
            if event["cat"] == "kernel":
                event["cat"] = kernel_cat
            if hip and event["cat"] == "cuda_runtime":
                event["name"] = _HIP_NAMES.get(event["name"], event["name"])
            args = event["args"]
            if "bytes" in args and bytes_key != "bytes":
                args[bytes_key] = args.pop("bytes")
            event["ts"] = self._time(self.base_us + event["ts"], integer_ts)
            if "dur" in event:
                event["dur"] = self._time(event["dur"], integer_ts)
            if begin_end and event["cat"] in _HOST_CATS:
                # Written in time order, as a tracer emits them: at equal times an `E` comes
                # before a `B`, inner events close first and outer events open first.
                begin_ts, dur = event["ts"], event.pop("dur")
                end_ts = self._time(begin_ts + dur, integer_ts)
                event["ph"] = "B"
                end = {
                    "ph": "E",
                    "name": event["name"],
                    "cat": event["cat"],
                    "pid": event["pid"],
                    "tid": event["tid"],
                    "ts": end_ts,
                }
                paired.append(((begin_ts, 1, -dur), event))
                paired.append(((end_ts, 0, -begin_ts), end))
                continue
            out.append(event)
        out[:0] = [event for _, event in sorted(paired, key=lambda item: item[0])]
        if metadata:
            out.extend(self._metadata(integer_ts))
        if string_ids:
            for event in out:
                event["pid"] = str(event["pid"])
                event["tid"] = str(event["tid"])
        return out

    @staticmethod
    def _time(value: float, integer: bool) -> float | int:
        return round(value) if integer else float(value)

    def _metadata(self, integer_ts: bool) -> list[dict[str, Any]]:
        ts = self._time(self.base_us, integer_ts)
        return [
            {
                "name": "process_name",
                "ph": "M",
                "ts": ts,
                "pid": self.pid,
                "tid": 0,
                "args": {"name": "python3"},
            },
            {
                "name": "thread_name",
                "ph": "M",
                "ts": ts,
                "pid": self.pid,
                "tid": self.tid,
                "args": {"name": "thread 1 (python3)"},
            },
            {
                "name": "process_name",
                "ph": "M",
                "ts": ts,
                "pid": self.device,
                "tid": 0,
                "args": {"name": f"GPU {self.device}"},
            },
            {
                "name": "process_labels",
                "ph": "M",
                "ts": ts,
                "pid": self.device,
                "tid": 0,
                "args": {"labels": f"GPU {self.device}"},
            },
        ]

    def to_bytes(
        self,
        *,
        form: str = "object",
        closed: bool = True,
        tail_keys: bool = False,
        device_properties: bool = True,
        indent: int | None = None,
        **quirks: Any,
    ) -> bytes:
        """The trace's JSON text. `form` is "object" (Kineto's) or "array" (a bare array of
        events, without its closing bracket when `closed` is false); `tail_keys` writes
        `displayTimeUnit` and `baseTimeNanoseconds` after `traceEvents`, as Kineto does;
        other keywords are the quirks of `trace_events`."""
        events = self.trace_events(**quirks)
        separators = (", ", ": ") if indent is None else None
        if form == "array":
            text = json.dumps(events, indent=indent, separators=separators)
            if not closed:
                text = text.rstrip()[:-1]
            return text.encode()
        doc = self.header(device_properties=device_properties)
        doc["traceEvents"] = events
        if tail_keys:
            doc["traceName"] = "/tmp/libkineto_activities_4242.json"
            doc["displayTimeUnit"] = "ms"
            doc["baseTimeNanoseconds"] = 1_700_000_000_000_000_000
        return json.dumps(doc, indent=indent, separators=separators).encode()

    def write(self, path: Path, **options: Any) -> Path:
        """Write the trace to `path` (gzip-compressed when the name ends in `.gz`)."""
        data = self.to_bytes(**options)
        write_bytes(path, data)
        return path


def write_bytes(path: Path, data: bytes) -> Path:
    """Write `data` to `path`, gzip-compressed when the name ends in `.gz`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return path


def training_trace(
    steps: int = 4,
    *,
    loader_us: float = 100.0,
    kernels: tuple[str, ...] = ("volta_sgemm_128x64_nn", "vectorized_elementwise_kernel"),
    kernel_us: float = 150.0,
    builder: TraceBuilder | None = None,
) -> TraceBuilder:
    """A small, regular training trace whose breakdown is known exactly.

    Each step lasts `loader_us + n * (kernel_us + 10)` µs (n kernels): the host waits for the
    DataLoader for `loader_us`, then for each kernel runs an 8 µs op that calls
    `cudaLaunchKernel` 2 µs in; the kernel starts 10 µs after the op. Per step the GPU
    computes `n * kernel_us` and is idle `loader_us + 10 n`: `loader_us` data loading, `2 n`
    host overhead and `8 n` launch latency.
    """
    b = builder or TraceBuilder()
    period = loader_us + len(kernels) * (kernel_us + 10.0)
    for s in range(steps):
        t0 = s * period
        b.step(s + 1, t0, period)
        b.dataloader(t0, loader_us)
        t = t0 + loader_us
        for name in kernels:
            b.cpu_op("aten::mm" if "gemm" in name else "aten::add", t, 8.0)
            b.kernel(name, t + 10.0, kernel_us, launch_at=t + 2.0)
            t += kernel_us + 10.0
    return b


MOE_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
MOE_NORM = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
MOE_DISPATCH = "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, ...)"
MOE_COMBINE = "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(int4*, float*, ...)"


def moe_trace(steps: int = 4, *, hidden: bool = True) -> TraceBuilder:
    """An expert-parallel (MoE) training step on an H800 whose timeline is known exactly.

    Each 1000 µs step: the GPU idles 10 µs, then one stream computes for 960 µs (four GEMMs,
    780 µs, between three 60 µs pointwise kernels, 180 µs); the dispatch/combine kernels (820
    µs in all, 46% of the summed kernel time) run on their own stream. `hidden`: beside the
    compute (790 µs of it; the last combine runs 30 µs past it: 3% exposed), as the
    expert-parallel overlap runs them on SMs of their own. Else after the compute, on the
    timeline alone (the step then lasts 1790 µs, 46% of it exposed communication).
    """
    b = TraceBuilder(device_name="NVIDIA H800")
    period = 1000.0 if hidden else 1790.0
    for s in range(steps):
        t0 = s * period
        b.step(s + 1, t0, period)
        t = t0 + 10.0
        for k, gemm in enumerate((200.0, 200.0, 200.0, 180.0)):
            b.kernel(MOE_GEMM, t, gemm, launch_at=t0 + 2.0 + k)
            t += gemm
            if k < 3:
                b.kernel(MOE_NORM, t, 60.0, launch_at=t0 + 2.5 + k)
                t += 60.0
        # Where compute ends (t0 + 970) the exposed part of the last combine begins.
        comm = (
            [(15.0, 200.0), (275.0, 200.0), (535.0, 200.0), (780.0, 220.0)]
            if hidden
            else [(970.0, 200.0), (1170.0, 200.0), (1370.0, 200.0), (1570.0, 220.0)]
        )
        for k, (at, dur) in enumerate(comm):
            name = MOE_DISPATCH if k % 2 == 0 else MOE_COMBINE
            b.kernel(name, t0 + at, dur, launch_at=t0 + 1.0 + k, stream=28)
    return b


MODULE = "nn.Module: "
"""The prefix of the `python_function` ranges `with_modules`/`with_stack` traces record
around each module's forward."""
AUTOGRAD_TID = 4343
"""The autograd engine's thread in `phased_training_trace`."""


def phased_training_trace(
    steps: int = 4,
    *,
    modules: bool = True,
    backward: bool = True,
    recompute: bool = False,
    backward_us: tuple[float, float] = (100.0, 200.0),
    builder: TraceBuilder | None = None,
) -> TraceBuilder:
    """A training trace whose phases and module times are known exactly.

    Each 1000 µs step (µs from the step's start): the DataLoader 0–100; a host-to-device copy
    launched at 100, on the GPU 105–125; the forward of `Net_0` with two blocks, `Block_0`
    (its `Linear_0` launching a 100 µs GEMM, 160–260) and `Block_1` (`Linear_1`, a 150 µs
    GEMM, 300–450); with `backward`, the backward on the autograd thread (`AUTOGRAD_TID`):
    `evaluate_function: MmBackward0` nodes linked by `Sequence number` and `Fwd thread id` to
    the two forward `aten::mm` ops, Block_1's first (its kernel 510–710 by default), then
    Block_0's (730–830) (`backward_us`: their lengths); then `Optimizer.step#SGD.step`
    launching a 50 µs kernel, 870–920. With `recompute`, each backward node first re-runs
    its block's forward (a module range on the autograd thread, activation checkpointing)
    launching a 30 µs GEMM at the node's start. Without `modules` the blocks are
    `record_function` ranges named `layers.0`/`layers.1` and there is no Net_0 range.

    In steady state the GPU time is input copy 20, forward 250, backward 300 (by default),
    optimizer 50 µs; exposed (idle to the phase the GPU waited for, the DataLoader's 100 µs
    to data wait): data wait 100, input copy 105, forward 325, backward 380, optimizer 90.
    """
    b = builder or TraceBuilder()
    gemm = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32"

    def module(name: str, start: float, dur: float, tid: int | None = None) -> None:
        if modules:
            b.host(MODULE + name, start, dur, cat="python_function", tid=tid)

    def mm(start: float, seq: int, tid: int | None = None, fwd_thread: int = 0) -> None:
        b.host(
            "aten::mm",
            start,
            8.0,
            tid=tid,
            args={"Sequence number": seq, "Fwd thread id": fwd_thread},
        )

    for s in range(steps):
        t0 = s * 1000.0
        seq = 10 + 2 * s
        b.step(s + 1, t0, 1000.0)
        b.dataloader(t0, 100.0)
        b.memcpy(t0 + 105.0, 20.0, 1 << 20, launch_at=t0 + 100.0)
        module("Net_0", t0 + 130.0, 300.0)
        blocks = ((0, 140.0, 160.0, 100.0), (1, 280.0, 300.0, 150.0))
        for i, start, kernel_at, kernel_us in blocks:
            if modules:
                module(f"Block_{i}", t0 + start, 140.0)
                module(f"Linear_{i}", t0 + start + 5.0, 130.0)
            else:
                b.annotation(f"layers.{i}", t0 + start, 140.0)
            mm(t0 + start + 10.0, seq + i)
            b.kernel(gemm, t0 + kernel_at, kernel_us, launch_at=t0 + start + 12.0)
        if backward:
            at = t0 + 500.0
            for i, kernel_us in ((1, backward_us[1]), (0, backward_us[0])):
                node = "autograd::engine::evaluate_function: MmBackward0"
                args = {"Sequence number": seq + i, "Fwd thread id": 1}
                b.host(node, at, 40.0, tid=AUTOGRAD_TID, args=args)
                kernel_at = at + 10.0
                if recompute:
                    module(f"Block_{i}", at + 1.0, 10.0, tid=AUTOGRAD_TID)
                    b.kernel(gemm, at + 10.0, 30.0, launch_at=at + 2.0, launch_tid=AUTOGRAD_TID)
                    kernel_at = at + 40.0
                launch = at + (15.0 if recompute else 5.0)  # after the re-run's range
                b.kernel(gemm, kernel_at, kernel_us, launch_at=launch, launch_tid=AUTOGRAD_TID)
                at = kernel_at + kernel_us + 10.0
        b.annotation("Optimizer.step#SGD.step", t0 + 850.0, 100.0)
        b.kernel("vectorized_elementwise_kernel", t0 + 870.0, 50.0, launch_at=t0 + 860.0)
    return b


FSDP_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long)"
FSDP_REDUCE_SCATTER = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long)"
FSDP_UNITS = ((28.0, 100.0, 100.0), (28.0, 150.0, 200.0), (56.0, 100.0, 100.0))
"""Per FSDP unit of `fsdp_gpu_trace`: its all-gather's, forward GEMM's and backward GEMM's µs."""
FSDP_REDUCE_SCATTER_US = 30.0
FSDP_UNIT_ELEMS = 1 << 20
"""Each unit's parameters: 1 Mi bf16 elements (2 MiB gathered, 2 MiB reduce-scattered)."""


def fsdp_gpu_trace(
    steps: int = 4,
    *,
    prefetch: bool = False,
    args: bool = True,
    builder: TraceBuilder | None = None,
) -> TraceBuilder:
    """Rank 0 of a 2-rank FSDP2 job on a GPU whose host runs ahead (`FSDP_UNITS`: three units,
    reshard_after_forward=False, so no backward re-gathers), with the stream waits the job
    records, as CUPTI writes them (`cudaEventRecord`, `cudaStreamWaitEvent` and its
    `Stream Wait Event`):

    - each unit's forward GEMM (compute stream 7) waits for its all-gather (NCCL stream 28):
      the all-gather's event, waited on in `FSDP::all_gather_copy_out (i)`;
    - on demand (`prefetch` False) each all-gather is issued in its own unit's
      `FSDP::pre_forward (i)` from the compute stream, so the NCCL stream first waits for the
      compute queued before it: every gather runs after the previous unit's GEMM, exposed.
      With `prefetch` each unit's pre-forward issues the next unit's all-gather from its own
      stream, which runs beside this unit's GEMM (the first unit's alone is exposed);
    - in the backward (the autograd thread), each unit's reduce-scatter waits for its
      gradients (an event after its backward GEMM) and runs beside the next backward GEMM;
      the optimizer waits for the last one (an event after it), and the host waits for the
      GPU at the step's end (`cudaStreamSynchronize`): the GPU sets the step's pace.

    With `args` the collective kernels carry their arguments (`Collective name`, sizes)."""
    b = builder or TraceBuilder(rank=0, world_size=2)
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_kernel"
    compute, nccl = 7, 28
    full = {"grid": [1056, 1, 1]}  # (grids that fill the H100's 132 SMs: no small-grid finding)

    free = {compute: 0.0, nccl: 0.0}  # when each stream's queued work ends
    gathered: list[float] = []  # per unit of the step: when its all-gather ends

    def gather(unit: int, h: float, on_demand: bool) -> None:
        b.annotation(f"FSDP::all_gather ({unit})", h, 9.0)
        b.cpu_op("c10d::_allgather_base_", h + 1.0, 7.0)
        after = 0.0
        if on_demand:
            # Issued from the compute stream: the NCCL stream waits for its queued work.
            record = b.event_record(h + 1.5)
            b.stream_wait(h + 2.5, stream=nccl, on_stream=compute, record=record)
            after = free[compute]
        start = max(h + 7.5, free[nccl], after)
        us = FSDP_UNITS[unit][0]
        b.nccl(
            start,
            us,
            name=FSDP_GATHER,
            launch_at=h + 4.0,
            collective="_allgather_base" if args else None,
            nelems=FSDP_UNIT_ELEMS,
        )
        free[nccl] = start + us
        gathered.append(free[nccl])

    t0 = 0.0
    for s in range(steps):
        seq = 10 + len(FSDP_UNITS) * s
        h = t0 + 2.0  # the host's cursor
        gathered.clear()
        b.annotation("FSDP::root_pre_forward", h, 1.0)
        h += 2.0
        module_start = h
        for unit, (_, fwd_us, _) in enumerate(FSDP_UNITS):
            b.annotation(f"FSDP::pre_forward ({unit})", h, 20.0)
            if not prefetch or unit == 0:
                gather(unit, h + 1.0, not prefetch)
            if prefetch and unit + 1 < len(FSDP_UNITS):
                gather(unit + 1, h + 1.0 + (10.0 if unit == 0 else 0.0), False)
            # The unit's compute waits for its gather: the gather stream's event after it.
            b.annotation(f"FSDP::all_gather_copy_out ({unit})", h + 21.0, 4.0)
            record = b.event_record(h + 21.5, tid=None)
            b.stream_wait(h + 22.5, stream=compute, on_stream=nccl, record=record)
            b.host(MODULE + f"Block_{unit}", h + 26.0, 12.0, cat="python_function")
            b.host(
                "aten::mm", h + 27.0, 9.0, args={"Sequence number": seq + unit, "Fwd thread id": 0}
            )
            start = max(h + 32.0, free[compute], gathered[unit])
            b.kernel(gemm, start, fwd_us, launch_at=h + 28.0, args=full)
            free[compute] = start + fwd_us
            h += 40.0
        b.host(MODULE + "Net_0", module_start, h - module_start, cat="python_function")
        # The backward on the autograd thread, the last unit first.
        at = h + 5.0
        for unit in reversed(range(len(FSDP_UNITS))):
            node = "autograd::engine::evaluate_function: MmBackward0"
            node_args = {"Sequence number": seq + unit, "Fwd thread id": 1}
            b.host(node, at, 30.0, tid=AUTOGRAD_TID, args=node_args)
            bwd_us = FSDP_UNITS[unit][2]
            start = max(at + 6.0, free[compute])
            b.kernel(gemm, start, bwd_us, launch_at=at + 2.0, launch_tid=AUTOGRAD_TID, args=full)
            free[compute] = start + bwd_us
            # The reduce-scatter waits for the unit's gradients: an event after its GEMM.
            b.annotation(f"FSDP::post_backward_reduce ({unit})", at + 12.0, 16.0, tid=AUTOGRAD_TID)
            b.cpu_op("c10d::_reduce_scatter_base_", at + 13.0, 12.0, tid=AUTOGRAD_TID)
            record = b.event_record(at + 13.5, tid=AUTOGRAD_TID)
            b.stream_wait(
                at + 14.5, stream=nccl, on_stream=compute, record=record, tid=AUTOGRAD_TID
            )
            start = max(at + 20.0, free[nccl], free[compute])
            b.nccl(
                start,
                FSDP_REDUCE_SCATTER_US,
                name=FSDP_REDUCE_SCATTER,
                launch_at=at + 16.0,
                collective="_reduce_scatter_base" if args else None,
                nelems=FSDP_UNIT_ELEMS,
                launch_tid=AUTOGRAD_TID,
            )
            free[nccl] = start + FSDP_REDUCE_SCATTER_US
            at += 35.0
        # The optimizer waits for the last reduce-scatter, then the host for the GPU.
        h = at + 5.0
        b.annotation("Optimizer.step#AdamW.step", h, 20.0)
        record = b.event_record(h + 1.0)
        b.stream_wait(h + 2.0, stream=compute, on_stream=nccl, record=record)
        start = max(h + 8.0, free[compute], free[nccl])
        b.kernel("vectorized_elementwise_kernel", start, 50.0, launch_at=h + 4.0, args=full)
        free[compute] = start + 50.0
        b.sync(h + 21.0, free[compute] + 1.0 - (h + 21.0))
        length = free[compute] + 10.0 - t0
        b.step(s + 1, t0, length)
        t0 += length
    return b


def decoded_columns(t: Trace) -> dict[str, list[Any]]:
    """Every column of the trace's events, with codes replaced by what they stand for
    (codes are an encoding: two loads of one file may number the same strings differently).
    Raw JSON columns compare by value: pretty-printed and compact files differ in spacing."""
    raw = [json.dumps(json.loads(r)) if r else "" for r in t.raw]
    tables: dict[str, list[Any]] = {
        "name": list(t.strings),
        "cat": list(t.strings),
        "pid": list(t.ids),
        "tid": list(t.ids),
        "input_dims": raw,
        "input_type": raw,
        "concrete_inputs": raw,
        "grid": raw,
        "block": raw,
        "comm": raw,
    }
    out: dict[str, list[Any]] = {}
    for f in fields(t.events):
        column = getattr(t.events, f.name).tolist()
        table = tables.get(f.name)
        out[f.name] = column if table is None else [table[c] for c in column]
    return out


def assert_same_trace(a: Trace, b: Trace) -> None:
    """Two loads of the same trace agree on every column (decoded), and on the metadata."""
    left, right = decoded_columns(a), decoded_columns(b)
    for name, column in left.items():
        assert column == right[name], f"column {name!r} differs"
    assert sorted(a.strings) == sorted(b.strings)
    assert a.origin_us == b.origin_us
    assert a.device_properties == b.device_properties
    assert a.distributed == b.distributed
    assert a.base_time_ns == b.base_time_ns
    assert {a.ids[k]: v for k, v in a.process_labels.items()} == {
        b.ids[k]: v for k, v in b.process_labels.items()
    }
    for column in ("ts", "device_type", "device_id", "addr", "bytes", "total_allocated"):
        assert (getattr(a.memory, column) == getattr(b.memory, column)).all()
    assert [a.ids[p] for p in a.memory.thread >> 32] == [b.ids[p] for p in b.memory.thread >> 32]
