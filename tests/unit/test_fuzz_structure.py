"""Loadable Kineto traces with odd structure: names that hold the path separators (`.`, `/`,
`:`), numbers, parentheses, unicode, 5 kB names, the same name at two depths, a range that is
both a step and a module; mis-nested and overlapping events on one thread; zero and negative
durations; kernels that start before their launch; flows to nowhere; correlation ids that
match nothing; string pids and tids; steps inside steps; missing args; several devices.

Whatever the structure, the analysis either refuses the trace with `WallfinderError` or gives
a diagnosis that keeps its invariants with every optional view computed (no internal error
anywhere, checked with `WALLFINDER_DEBUG=1` so nothing is contained); through the CLI the
exit code is 0 or 2, and each optional view is present or said as not computed.

The examples are derandomized (the same ones on every run, so CI is reproducible) and no
example database is written.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracegen import DATALOADER, MODULE, NASTY_NAME
from wallfinder import Diagnosis, WallfinderError
from wallfinder.analysis import diagnose
from wallfinder.analysis.views import VIEWS
from wallfinder.cli import main
from wallfinder.errors import DEBUG_ENV
from wallfinder.trace import load_trace

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=300)

HOST_PIDS: list[int | str] = [4242, "4242", "host"]
HOST_TIDS: list[int | str] = [4242, 4343, "4242", "autograd"]
ODD_NAMES = [
    "DistributedDataParallel.forward",
    "Torch-Compiled Region: 0/0",
    "a/b/c",
    "a.b",
    "a",
    "b",
    "layer(3).attn:q",
    "12",
    "ünïcødé ⚡ block",
    "",
    " ",
    "x" * 5000,
    "ProfilerStep#2",
    NASTY_NAME,
    DATALOADER,
    "Optimizer.step#SGD.step",
    "## forward ##",
]
names = st.sampled_from(ODD_NAMES)
KERNELS = [
    "volta_sgemm_128x64_nn",
    "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32",
    "vectorized_elementwise_kernel",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long)",
    "ncclKernel_AllGather_RING_LL_Sum_int8_t",
    "flash_fwd_kernel",
    "layer(3).attn:q",
]
CPU_OPS = [
    "aten::mm",
    "aten::add",
    "nccl:all_reduce",
    "aten::item",
    "aten::copy_",
    "c10d::allreduce_",
    "autograd::engine::evaluate_function: MmBackward0",
    "Optimizer.zero_grad#SGD.zero_grad",
]
RUNTIME = [
    "cudaLaunchKernel",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cuLaunchKernel",
    "cudaGraphLaunch",
]
times = st.integers(-50, 3000) | st.integers(-50, 3000).map(float) | st.floats(0, 3000)
durations = st.sampled_from([0.0, -1.0, -100.0]) | st.integers(1, 1500).map(float)
correlations = st.integers(0, 12)


@st.composite
def maybe_args(draw: st.DrawFn, args: dict[str, Any]) -> dict[str, Any] | None:
    """The event's args, some of them missing, or None: no args at all (see `without_none`)."""
    if draw(st.integers(0, 9)) == 0:
        return None
    keep = draw(st.lists(st.booleans(), min_size=len(args), max_size=len(args)))
    return {
        k: v for (k, v), kept in zip(args.items(), keep, strict=True) if kept or draw(st.booleans())
    }


def without_none(event: dict[str, Any]) -> dict[str, Any]:
    """The event without its keys whose value is None: an event without args has no `args`
    key (the profiler never writes `"args": null`)."""
    return {k: v for k, v in event.items() if v is not None}


dims = st.lists(st.integers(-1, 4096) | st.sampled_from([0, 1, 2**40]), max_size=4)
input_dims = st.lists(dims, max_size=4)
"""Shapes of an op's inputs, for the cost models: empty, scalar, zero, negative, huge."""


@st.composite
def begin_end(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A range as B/E events: paired, or a B without its E, or an E without its B."""
    event = draw(host_event())
    begin = {k: v for k, v in event.items() if k != "dur"} | {"ph": "B"}
    end = {k: v for k, v in begin.items() if k != "args"}
    end.update(ph="E", ts=event["ts"] + event["dur"])
    return draw(st.sampled_from([[begin, end], [begin, end], [begin], [end], [end, begin]]))


@st.composite
def gpu_annotation(draw: st.DrawFn) -> dict[str, Any]:
    """A `gpu_user_annotation` range on a device's stream."""
    return {
        "ph": "X",
        "cat": "gpu_user_annotation",
        "name": draw(names),
        "pid": draw(st.integers(0, 2)),
        "tid": draw(st.sampled_from([7, 28])),
        "ts": draw(times),
        "dur": draw(durations),
        "args": {"External id": draw(correlations)},
    }


@st.composite
def host_event(draw: st.DrawFn) -> dict[str, Any]:
    cat = draw(st.sampled_from(["cpu_op", "user_annotation", "python_function", "cuda_runtime"]))
    if cat == "cpu_op":
        name = draw(st.sampled_from(CPU_OPS) | names)
    elif cat == "python_function":
        name = draw(names.map(lambda n: MODULE + n) | names)
    elif cat == "cuda_runtime":
        name = draw(st.sampled_from(RUNTIME))
    else:
        name = draw(names | st.integers(0, 5).map(lambda n: f"ProfilerStep#{n}"))
    args: dict[str, Any] = {"External id": draw(correlations)}
    if cat == "cuda_runtime":
        args["correlation"] = draw(correlations)
    if cat == "cpu_op":
        args["Sequence number"] = draw(st.integers(0, 4))
        args["Fwd thread id"] = draw(st.integers(0, 2))
        args["Input Dims"] = draw(input_dims)
        args["Input type"] = draw(st.sampled_from([["float", "float"], ["c10::BFloat16"], []]))
    return without_none(
        {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": draw(st.sampled_from(HOST_PIDS)),
            "tid": draw(st.sampled_from(HOST_TIDS)),
            "ts": draw(times),
            "dur": draw(durations),
            "args": draw(maybe_args(args)),
        }
    )


@st.composite
def device_event(draw: st.DrawFn) -> dict[str, Any]:
    cat = draw(st.sampled_from(["kernel", "kernel", "Kernel", "gpu_memcpy", "gpu_memset"]))
    device = draw(st.integers(0, 2))
    stream = draw(st.sampled_from([7, 28, 7, 13]))
    if cat == "gpu_memcpy":
        name = draw(
            st.sampled_from(["Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH", "Memcpy DtoD"])
        )
    elif cat == "gpu_memset":
        name = "Memset (Device)"
    else:
        name = draw(st.sampled_from(KERNELS))
    args: dict[str, Any] = {
        "External id": draw(correlations),
        "device": device,
        "stream": stream,
        "correlation": draw(correlations),
    }
    if cat.startswith("gpu_"):
        args["bytes"] = draw(st.integers(0, 1 << 24))
    else:
        args["grid"] = [draw(st.integers(0, 256)), 1, 1]
        args["block"] = [256, 1, 1]
    if "nccl" in name and draw(st.booleans()):
        args["Collective name"] = "allreduce"
        args["In msg nelems"] = draw(st.integers(0, 1 << 20))
        args["Group size"] = draw(st.integers(1, 8))
        args["dtype"] = "BFloat16"
    pid: int | str = draw(st.sampled_from([device, str(device)]))
    return without_none(
        {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": pid,
            "tid": draw(st.sampled_from([stream, str(stream)])),
            "ts": draw(times),
            "dur": draw(durations),
            "args": draw(maybe_args(args)),
        }
    )


@st.composite
def launched_kernel(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A launch and its kernel joined by a correlation id; the kernel may start before its
    launch, and another launch may share the id."""
    kernel = draw(device_event())
    launch = draw(host_event())
    correlation = draw(correlations)
    launch.update(cat="cuda_runtime", name="cudaLaunchKernel", args={"correlation": correlation})
    kernel["args"] = {**kernel.get("args", {}), "correlation": correlation}
    return [launch, kernel]


@st.composite
def flow(draw: st.DrawFn) -> dict[str, Any]:
    """A flow start or finish, with an id that may match nothing."""
    return {
        "ph": draw(st.sampled_from(["s", "f", "t"])),
        "id": draw(correlations),
        "pid": draw(st.sampled_from([*HOST_PIDS, 0, 1])),
        "tid": draw(st.sampled_from(HOST_TIDS)),
        "ts": draw(times),
        "cat": draw(st.sampled_from(["ac2g", "fwdbwd", ""])),
        "name": draw(st.sampled_from(["ac2g", "fwdbwd", ""])),
        "bp": "e",
    }


@st.composite
def memory_event(draw: st.DrawFn) -> dict[str, Any]:
    device_type = draw(st.sampled_from([0, 1, 1]))
    return without_none(
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": draw(st.sampled_from(HOST_PIDS)),
            "tid": draw(st.sampled_from(HOST_TIDS)),
            "ts": draw(times),
            "args": draw(
                maybe_args(
                    {
                        "Device Type": device_type,
                        "Device Id": draw(st.integers(-1, 2)),
                        "Addr": draw(st.integers(0, 4)) * 0x1000,
                        "Bytes": draw(st.integers(-(1 << 22), 1 << 22)),
                        "Total Allocated": draw(st.integers(-(1 << 20), 1 << 24)),
                        "Total Reserved": draw(st.integers(0, 1 << 25)),
                    }
                )
            ),
        }
    )


@st.composite
def steps(draw: st.DrawFn) -> list[dict[str, Any]]:
    """ProfilerStep ranges: in a row, overlapping, nested, repeated, or a step that is also
    a module (the same range recorded as `nn.Module: ProfilerStep#N`)."""
    out: list[dict[str, Any]] = []
    start = draw(st.integers(-10, 100))
    for number in range(draw(st.integers(0, 5))):
        length = draw(st.sampled_from([500.0, 500.0, 0.0, -5.0, 250.0, 1200.0]))
        at = float(start + number * 500 + draw(st.sampled_from([0, 0, -100, 100])))
        label = f"ProfilerStep#{draw(st.sampled_from([number, number, 1, 10**12]))}"
        event = {
            "ph": "X",
            "cat": draw(st.sampled_from(["user_annotation", "user_annotation", "cpu_op"])),
            "name": label,
            "pid": 4242,
            "tid": 4242,
            "ts": at,
            "dur": length,
            "args": {"External id": number},
        }
        out.append(event)
        if draw(st.integers(0, 4)) == 0:
            out.append({**event, "cat": "python_function", "name": MODULE + label})
    return out


@st.composite
def regular_work(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Kernels launched in order every 100 µs, so most traces have device work to diagnose."""
    out: list[dict[str, Any]] = []
    for i in range(draw(st.integers(0, 20))):
        at = i * 100.0
        correlation = 1000 + i
        out.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 4242,
                "tid": 4242,
                "ts": at,
                "dur": 5.0,
                "args": {"correlation": correlation, "External id": correlation},
            }
        )
        out.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": draw(st.sampled_from(KERNELS)),
                "pid": 0,
                "tid": 7,
                "ts": at + 10.0,
                "dur": 60.0,
                "args": {"correlation": correlation, "device": 0, "stream": 7},
            }
        )
    return out


@st.composite
def nested_ranges(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Ranges on one thread, properly nested or mis-nested (a child that outlives its
    parent), with the same name at two depths."""
    out: list[dict[str, Any]] = []
    start, end = 0.0, 2000.0
    cat = draw(st.sampled_from(["user_annotation", "python_function"]))
    tid = draw(st.sampled_from(HOST_TIDS))
    for _ in range(draw(st.integers(0, 5))):
        name = draw(names)
        width = end - start
        a = start + draw(st.floats(0, 0.4)) * width
        b = a + draw(st.floats(0.1, 1.3)) * (end - a)
        out.append(
            {
                "ph": "X",
                "cat": cat,
                "name": MODULE + name if cat == "python_function" else name,
                "pid": 4242,
                "tid": tid,
                "ts": a,
                "dur": b - a,
                "args": {"External id": draw(correlations)},
            }
        )
        start, end = a, b
    return out


@st.composite
def odd_traces(draw: st.DrawFn) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    events += draw(steps())
    events += draw(regular_work())
    events += draw(nested_ranges())
    for batch in draw(
        st.lists(
            st.one_of(
                host_event().map(lambda e: [e]),
                device_event().map(lambda e: [e]),
                launched_kernel(),
                flow().map(lambda e: [e]),
                memory_event().map(lambda e: [e]),
                begin_end(),
                gpu_annotation().map(lambda e: [e]),
            ),
            max_size=25,
        )
    ):
        events += batch
    events = draw(st.permutations(events)) if draw(st.booleans()) else events
    doc: dict[str, Any] = {"schemaVersion": 1}
    devices = draw(st.lists(st.integers(0, 2), unique=True, max_size=3))
    doc["deviceProperties"] = [
        {"id": d, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85 << 30} for d in devices
    ]
    if draw(st.booleans()):
        world = draw(st.integers(1, 8))
        doc["distributedInfo"] = {
            "backend": "nccl",
            "rank": draw(st.integers(0, world - 1)),
            "world_size": world,
        }
    doc["traceEvents"] = events
    doc["baseTimeNanoseconds"] = 1_700_000_000_000_000_000
    return doc


def written(doc: dict[str, Any], folder: str) -> Path:
    path = Path(folder) / "t.json"
    path.write_text(json.dumps(doc))
    return path


@FUZZ
@given(odd_traces())
def test_odd_structure_is_diagnosed_with_every_view_or_refused(doc: dict[str, Any]) -> None:
    # With debug on nothing is contained: an internal error in any view propagates.
    with pytest.MonkeyPatch.context() as mp, TemporaryDirectory() as folder:
        mp.setenv(DEBUG_ENV, "1")
        try:
            d = diagnose(load_trace(written(doc, folder)))
        except WallfinderError:
            return
    d.self_check()
    assert d.not_computed == {}
    assert Diagnosis.from_json(d.to_json()) == d


OPTIONAL = {
    "phases": "phases",
    "modules": "modules",
    "timeline": "timeline",
    "critical path": "critical_path",
    "memory": "memory",
    "counters": "counters",
}


@settings(FUZZ, max_examples=100)
@given(odd_traces())
def test_odd_structure_through_the_cli_exits_0_or_2(doc: dict[str, Any]) -> None:
    with pytest.MonkeyPatch.context() as mp, TemporaryDirectory() as folder:
        mp.delenv(DEBUG_ENV, raising=False)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["analyze", str(written(doc, folder)), "--format", "json", "--no-cache"])
    assert code in (0, 2), err.getvalue()
    assert "Traceback" not in err.getvalue()
    if code == 2:
        assert err.getvalue().count("\n") == 1
        return
    result = json.loads(out.getvalue())
    not_computed = result["not_computed"]
    assert set(not_computed) <= set(VIEWS) | {"collectives"} | {
        k for k in not_computed if k.startswith("finding ")
    }
    for view, field in OPTIONAL.items():
        # Present, or absent: for want of data (null) or said as not computed.
        if view in not_computed:
            assert result[field] is None
    if "fusion" in not_computed:
        assert result["fusion"] == []
