"""Damaged and arbitrary input: the loader either returns a `Trace` or raises
`WallfinderError`, never anything else (no crash, no hang, no other exception type)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any
from unittest import mock

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import wallfinder.trace._reader as reader_module
from tracegen import NASTY_NAME, TraceBuilder
from wallfinder import WallfinderError
from wallfinder.analysis import diagnose
from wallfinder.trace import Kind, Trace, load_trace

FUZZ = settings(max_examples=200, deadline=None, database=None)


def valid_trace() -> bytes:
    b = TraceBuilder(rank=0, world_size=2)
    b.step(1, 0.0, 300.0)
    b.cpu_op("aten::mm", 1.0, 5.0)
    b.kernel("volta_sgemm_128x64_nn", 10.0, 100.0, launch_at=2.0)
    b.kernel(NASTY_NAME, 120.0, 10.0, launch_at=3.0)
    b.memcpy(140.0, 5.0, 64, launch_at=4.0)
    b.sync(5.0, 150.0)
    return b.to_bytes(tail_keys=True)


PLAIN = valid_trace()
GZIP = gzip.compress(PLAIN, mtime=0)


def load_or_refuse(data: bytes, name: str = "t.json") -> Trace | None:
    """Load `data` written as `name` (as is: a `.gz` name gets no extra compression); None
    when the loader refused it with `WallfinderError`. Any other exception propagates."""
    with TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            return load_trace(path)
        except WallfinderError:
            return None


def test_the_unmodified_traces_load() -> None:
    plain = load_or_refuse(PLAIN)
    packed = load_or_refuse(GZIP, "t.json.gz")
    assert plain is not None
    assert packed is not None
    assert len(plain.of_kind(Kind.KERNEL)) == 2


# (a) truncation ---------------------------------------------------------------------------------


def test_plain_text_truncated_at_every_position_is_refused_or_loaded() -> None:
    for cut in range(len(PLAIN)):
        load_or_refuse(PLAIN[:cut])


def test_gzip_truncated_at_every_position_is_refused() -> None:
    for cut in range(len(GZIP)):
        assert load_or_refuse(GZIP[:cut], "t.json.gz") is None


@FUZZ
@given(st.data())
def test_plain_text_truncated_at_random_positions_in_pretty_form(data: st.DataObject) -> None:
    text = json.dumps(json.loads(PLAIN), indent=2).encode()
    cut = data.draw(st.integers(0, len(text)))
    load_or_refuse(text[:cut])


# (b) replaced bytes ----------------------------------------------------------------------------


@FUZZ
@given(
    st.lists(st.tuples(st.integers(0, len(PLAIN) - 1), st.integers(0, 255)), min_size=1, max_size=4)
)
def test_plain_text_with_replaced_bytes_is_refused_or_loaded(
    edits: list[tuple[int, int]],
) -> None:
    data = bytearray(PLAIN)
    for pos, value in edits:
        data[pos] = value
    load_or_refuse(bytes(data))


@FUZZ
@given(st.lists(st.tuples(st.integers(10, len(GZIP) - 1), st.integers(0, 7)), min_size=1))
def test_gzip_with_flipped_bits_is_refused_or_loaded_by_stdlib_gzip(
    flips: list[tuple[int, int]],
) -> None:
    data = bytearray(GZIP)
    for pos, bit in flips:
        data[pos] ^= 1 << bit
    with mock.patch.object(reader_module, "_fast_gzip", None):
        load_or_refuse(bytes(data), "t.json.gz")


@FUZZ
@given(st.lists(st.tuples(st.integers(10, len(GZIP) - 9), st.integers(0, 7)), min_size=1))
def test_gzip_with_flipped_bits_is_refused_or_loaded(flips: list[tuple[int, int]]) -> None:
    data = bytearray(GZIP)
    for pos, bit in flips:
        data[pos] ^= 1 << bit
    load_or_refuse(bytes(data), "t.json.gz")


@pytest.mark.parametrize("where", [b"volta_sgemm", b"NVIDIA H100", b"aten::mm"])
def test_invalid_utf8_inside_a_string_is_refused_or_loaded(where: bytes) -> None:
    # A single Latin-1 byte in a kernel name, in the header or in a CPU op name.
    pos = PLAIN.index(where) + 3
    load_or_refuse(PLAIN[:pos] + b"\xe9" + PLAIN[pos + 1 :])


# (c) inserted bytes ----------------------------------------------------------------------------


@FUZZ
@given(
    st.lists(
        st.tuples(st.integers(0, len(PLAIN)), st.binary(min_size=1, max_size=6)),
        min_size=1,
        max_size=3,
    )
)
def test_plain_text_with_inserted_bytes_is_refused_or_loaded(
    inserts: list[tuple[int, bytes]],
) -> None:
    data = PLAIN
    for pos, chunk in inserts:
        data = data[:pos] + chunk + data[pos:]
    load_or_refuse(data)


@FUZZ
@given(st.integers(0, len(PLAIN)), st.sampled_from([b"}", b"]", b",", b"{", b'"', b"}, {", b"\\"]))
def test_plain_text_with_inserted_json_punctuation_is_refused_or_loaded(
    pos: int, piece: bytes
) -> None:
    load_or_refuse(PLAIN[:pos] + piece + PLAIN[pos:])


# (d) arbitrary JSON values -------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
FIELDS = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "id", "args")
phases = st.sampled_from(["X", "B", "E", "M", "i", "I", "s", "f", "C", "n"])
categories = st.sampled_from(
    [
        "kernel",
        "Kernel",
        "cpu_op",
        "cuda_runtime",
        "gpu_memcpy",
        "gpu_memset",
        "user_annotation",
        "python_function",
    ]
)
arg_keys = st.sampled_from(
    [
        "correlation",
        "External id",
        "device",
        "stream",
        "bytes",
        "Bytes",
        "name",
        "labels",
        "Input Dims",
        "Device Id",
        "Total Allocated",
    ]
)


@st.composite
def events(draw: st.DrawFn) -> Any:
    """An event-like object: some fields plausible, others arbitrary JSON."""
    event: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from(FIELDS), unique=True)):
        plausible = {
            "ph": phases,
            "cat": categories,
            "ts": st.integers(0, 10**6) | st.floats(0, 1e6),
            "dur": st.integers(-10, 10**4) | st.floats(-1, 1e4),
            "pid": st.integers(0, 3) | st.text(max_size=3),
            "tid": st.integers(0, 3) | st.text(max_size=3),
            "args": st.dictionaries(arg_keys, json_values | st.integers()),
        }.get(key, json_values)
        event[key] = draw(plausible | json_values)
    return event


def document(trace_events: Any) -> bytes:
    return json.dumps({"schemaVersion": 1, "traceEvents": trace_events}).encode()


@FUZZ
@given(st.lists(json_values, max_size=6))
def test_arbitrary_json_values_as_events_are_refused_or_loaded(items: list[Any]) -> None:
    load_or_refuse(document(items))


@FUZZ
@given(json_values)
def test_arbitrary_json_value_as_trace_events_is_refused_or_loaded(value: Any) -> None:
    load_or_refuse(document(value))


@FUZZ
@given(json_values)
def test_arbitrary_json_document_is_refused_or_loaded(value: Any) -> None:
    load_or_refuse(json.dumps(value).encode())


@settings(FUZZ, max_examples=120)
@given(st.lists(events(), max_size=8), st.sampled_from([0, 1, 2, 3]))
def test_events_with_arbitrary_fields_are_refused_or_loaded(items: list[Any], at: int) -> None:
    # Mixed in with the events of a valid trace, at the start, middle or end.
    base = json.loads(PLAIN)["traceEvents"]
    cut = len(base) * at // 3
    load_or_refuse(document(base[:cut] + items + base[cut:]))


KERNEL_NAMES = ["volta_sgemm_128x64_nn", "vectorized_elementwise_kernel", "ncclDevKernel_AllReduce"]
NAMES = {
    "cpu_op": ["aten::mm", "aten::add", "nccl:all_reduce", "aten::item"],
    "user_annotation": [
        "ProfilerStep#1",
        "ProfilerStep#2",
        "ProfilerStep#3",
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
    ],
    "cuda_runtime": ["cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpyAsync"],
    "kernel": KERNEL_NAMES,
    "gpu_memcpy": ["Memcpy HtoD (Pageable -> Device)"],
    "gpu_memset": ["Memset (Device)"],
}


@st.composite
def work_events(draw: st.DrawFn) -> Any:
    """A plausible complete event at a random place, with random joins (correlation ids,
    devices, threads) and durations, some of them negative."""
    cat = draw(st.sampled_from(sorted(NAMES)))
    on_gpu = cat in ("kernel", "gpu_memcpy", "gpu_memset")
    args: dict[str, Any] = {}
    if cat in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime") and draw(st.booleans()):
        args["correlation"] = draw(st.integers(0, 6))
    if on_gpu and draw(st.booleans()):
        args["device"] = draw(st.integers(0, 1))
    if draw(st.booleans()):
        args["External id"] = draw(st.integers(0, 6))
    return {
        "ph": "X",
        "cat": cat,
        "name": draw(st.sampled_from(NAMES[cat])),
        "ts": draw(st.integers(0, 300)),
        "dur": draw(st.integers(-5, 200)),
        "pid": draw(st.integers(0, 1)) if on_gpu else 100,
        "tid": draw(st.sampled_from([7, 8] if on_gpu else [100, 101])),
        "args": args,
    }


@FUZZ
@given(st.lists(work_events(), min_size=1, max_size=14))
def test_analysis_of_arbitrary_work_gives_consistent_fractions_or_a_clear_error(
    items: list[Any],
) -> None:
    trace = load_or_refuse(document(items))
    assume(trace is not None)
    assert trace is not None
    try:
        d = diagnose(trace)
    except WallfinderError:
        return
    b = d.breakdown
    parts = [b.compute, b.comm_exposed, b.copy_exposed, b.idle]
    assert all(-1e-12 <= x <= 1.0 + 1e-12 for x in parts)
    assert abs(sum(b.idle_causes.values()) - b.idle) < 1e-9
    for step in b.steps:
        total = step.compute_s + step.comm_exposed_s + step.copy_exposed_s + step.idle_s
        assert total == pytest.approx(step.duration_s, abs=1e-12)
        assert sum(step.idle_causes_s.values()) == pytest.approx(step.idle_s, abs=1e-12)
    assert type(d).from_json(d.to_json()) == d


@pytest.mark.parametrize(
    ("key", "value"), [("correlation", 2**63), ("External id", 2**64), ("device", 1e20)]
)
def test_ids_outside_int64_are_refused_or_loaded(key: str, value: float) -> None:
    event = {
        "ph": "X",
        "cat": "kernel",
        "name": "k",
        "pid": 0,
        "tid": 7,
        "ts": 0,
        "dur": 5,
        "args": {key: value},
    }
    load_or_refuse(document([event]))
