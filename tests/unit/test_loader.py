"""The loader: one test per trace-format quirk, and chunked / parallel parsing giving exactly
the result of a single-chunk parse."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wallfinder.trace._reader as reader_module
import wallfinder.trace.readers.kineto as trace_module
from tracegen import DATALOADER, NASTY_NAME, TraceBuilder, assert_same_trace, training_trace
from wallfinder.analysis import diagnose
from wallfinder.errors import WallfinderError
from wallfinder.trace import (
    NONE,
    Kind,
    Trace,
    find_trace_files,
    load_trace,
    thread_key,
    thread_mask,
)
from wallfinder.trace.model import thread_codes


def counts(t: Trace) -> dict[Kind, int]:
    """Number of events per kind (kinds with none left out)."""
    found = np.bincount(t.events.kind, minlength=len(Kind))
    return {k: int(found[k]) for k in Kind if found[k]}


def names_of(t: Trace, kind: Kind) -> list[str]:
    return [t.strings[c] for c in t.of_kind(kind).name.tolist()]


def small_trace() -> TraceBuilder:
    """One step: an op launching a kernel, a memcpy, a memset and a sync; 2 host metadata and
    2 device metadata events are added on writing."""
    b = TraceBuilder(rank=1, world_size=4)
    b.step(1, 0.0, 2000.0)
    b.cpu_op("aten::mm", 10.0, 20.0)
    b.kernel("volta_sgemm_128x64_nn", 1000.5, 2.25, launch_at=12.0)
    b.memcpy(1100.0, 10.0, 4096, launch_at=40.0)
    b.memset(1200.0, 5.0, 512, launch_at=50.0)
    b.sync(60.0, 1200.0)
    return b


SMALL_COUNTS = {
    Kind.ANNOTATION: 1,
    Kind.CPU_OP: 1,
    Kind.RUNTIME: 4,
    Kind.KERNEL: 1,
    Kind.MEMCPY: 1,
    Kind.MEMSET: 1,
}
"""Rows per kind of `small_trace()`. Its 4 metadata events and its flows are not rows: the
loader reads the process labels from the metadata and drops both (see `columns_of`)."""


# The object form and its contents ---------------------------------------------------------------


def test_object_form_loads_every_event_with_its_kind(tmp_path: Path) -> None:
    t = load_trace(small_trace().write(tmp_path / "t.json"))
    assert counts(t) == SMALL_COUNTS
    assert t.source == "t.json"


def test_metadata_events_give_process_labels_not_rows(tmp_path: Path) -> None:
    t = load_trace(small_trace().write(tmp_path / "t.json"))
    assert Kind.METADATA not in counts(t)
    labels = {t.ids[pid]: label for pid, label in t.process_labels.items()}
    assert "GPU 0" in labels.values()


def test_times_are_integer_ns_from_the_origin(tmp_path: Path) -> None:
    t = load_trace(small_trace().write(tmp_path / "t.json"))
    assert t.origin_us == 1_700_000_000.0
    k = t.of_kind(Kind.KERNEL)
    assert k.ts.dtype == np.int64
    assert k.ts.tolist() == [1_000_500]
    assert k.dur.tolist() == [2_250]
    assert k.end.tolist() == [1_002_750]
    step = t.of_kind(Kind.ANNOTATION)
    assert (step.ts.tolist(), step.dur.tolist()) == ([0], [2_000_000])


def test_kernel_args_are_read_into_columns(tmp_path: Path) -> None:
    b = small_trace()
    t = load_trace(b.write(tmp_path / "t.json"))
    k = t.of_kind(Kind.KERNEL)
    assert k.device.tolist() == [0]
    assert k.stream.tolist() == [7]
    launches = t.of_kind(Kind.RUNTIME)
    launch = launches.take(launches.name == t.code_of("cudaLaunchKernel"))
    assert k.correlation.tolist() == launch.correlation.tolist()
    assert k.external_id[0] != NONE
    # Columns a kind does not carry stay NONE.
    assert t.of_kind(Kind.CPU_OP).correlation.tolist() == [NONE]
    assert k.nbytes.tolist() == [NONE]


def test_device_name_and_rank_come_from_the_header(tmp_path: Path) -> None:
    t = load_trace(small_trace().write(tmp_path / "t.json"))
    assert t.device_name == "NVIDIA H100 80GB HBM3"
    assert (t.rank, t.world_size) == (1, 4)
    assert t.distributed["backend"] == "nccl"


def test_gpu_process_label_is_read_from_metadata(tmp_path: Path) -> None:
    t = load_trace(small_trace().write(tmp_path / "t.json"))
    assert {t.ids[pid]: label for pid, label in t.process_labels.items()} == {0: "GPU 0"}


def test_memcpy_and_memset_bytes_are_read(tmp_path: Path) -> None:
    t = load_trace(small_trace().write(tmp_path / "t.json"))
    assert t.of_kind(Kind.MEMCPY).nbytes.tolist() == [4096]
    assert t.of_kind(Kind.MEMSET).nbytes.tolist() == [512]


def test_gzip_and_plain_text_give_the_same_trace(tmp_path: Path) -> None:
    b = small_trace()
    assert_same_trace(
        load_trace(b.write(tmp_path / "t.json")), load_trace(b.write(tmp_path / "t.json.gz"))
    )


# One test per quirk ----------------------------------------------------------------------------


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "no-closing-bracket"])
def test_bare_array_form_gives_the_events_of_the_object_form(tmp_path: Path, closed: bool) -> None:
    b = small_trace()
    whole = load_trace(b.write(tmp_path / "object.json"))
    bare = load_trace(b.write(tmp_path / "bare.json", form="array", closed=closed))
    assert counts(bare) == SMALL_COUNTS
    np.testing.assert_array_equal(bare.events.ts, whole.events.ts)
    np.testing.assert_array_equal(bare.events.dur, whole.events.dur)
    assert bare.device_properties == []
    assert bare.rank is None


def test_bare_array_without_closing_bracket_after_a_trailing_comma_loads(tmp_path: Path) -> None:
    text = small_trace().to_bytes(form="array", closed=False).rstrip() + b",\n"
    path = tmp_path / "bare.json"
    path.write_bytes(text)
    assert counts(load_trace(path)) == SMALL_COUNTS


def test_string_pids_and_tids_load_and_keep_their_text(tmp_path: Path) -> None:
    t = load_trace(small_trace().write(tmp_path / "t.json", string_ids=True))
    assert counts(t) == SMALL_COUNTS
    assert "4242" in t.ids
    host = t.of_kind(Kind.CPU_OP)
    assert t.ids[int(host.pid[0])] == "4242"


def test_string_pids_still_join_launches_to_kernels(tmp_path: Path) -> None:
    b = training_trace(3)
    plain = diagnose(load_trace(b.write(tmp_path / "a.json")))
    quirky = diagnose(load_trace(b.write(tmp_path / "b.json", string_ids=True)))
    assert quirky.breakdown == plain.breakdown


@pytest.mark.parametrize("key", ["bytes", "Bytes"])
def test_memcpy_bytes_are_read_from_either_key(tmp_path: Path, key: str) -> None:
    t = load_trace(small_trace().write(tmp_path / "t.json", bytes_key=key))
    assert t.of_kind(Kind.MEMCPY).nbytes.tolist() == [4096]
    assert t.of_kind(Kind.MEMSET).nbytes.tolist() == [512]


def test_lowercase_bytes_wins_when_both_keys_are_present(tmp_path: Path) -> None:
    b = small_trace()
    for event in b.events:
        if event["cat"] == "gpu_memcpy":
            event["args"]["Bytes"] = 1
    t = load_trace(b.write(tmp_path / "t.json"))
    assert t.of_kind(Kind.MEMCPY).nbytes.tolist() == [4096]


@pytest.mark.parametrize("category", ["kernel", "Kernel"])
def test_kernel_category_is_read_in_either_case(tmp_path: Path, category: str) -> None:
    t = load_trace(small_trace().write(tmp_path / "t.json", kernel_cat=category))
    assert counts(t) == SMALL_COUNTS
    assert names_of(t, Kind.KERNEL) == ["volta_sgemm_128x64_nn"]


@pytest.mark.parametrize("category", ["cuda_runtime", "cuda_driver", "hip_runtime", "Runtime"])
def test_runtime_categories_are_all_runtime_calls(tmp_path: Path, category: str) -> None:
    b = small_trace()
    for event in b.events:
        if event["cat"] == "cuda_runtime":
            event["cat"] = category
    assert counts(load_trace(b.write(tmp_path / "t.json")))[Kind.RUNTIME] == 4


def test_hip_runtime_names_load_and_join_their_kernels(tmp_path: Path) -> None:
    b = training_trace(3)
    t = load_trace(b.write(tmp_path / "t.json", hip=True))
    assert set(names_of(t, Kind.RUNTIME)) == {"hipLaunchKernel"}
    d = diagnose(t)
    cuda = diagnose(load_trace(b.write(tmp_path / "cuda.json")))
    assert d.breakdown == cuda.breakdown
    assert d.breakdown.idle_causes["launch_latency"] > 0


def test_hip_synchronize_counts_as_synchronization(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0.0, 300.0)
    b.kernel("volta_sgemm_128x64_nn", 10.0, 100.0, launch_at=0.0)
    b.sync(5.0, 107.0)
    b.kernel("volta_sgemm_128x64_nn", 160.0, 100.0, launch_at=150.0)
    d = diagnose(load_trace(b.write(tmp_path / "t.json", hip=True)))
    causes = d.breakdown.steps[0].idle_causes_s
    assert causes["synchronization"] == pytest.approx(40e-6)


def test_trace_without_device_properties_has_no_device_name(tmp_path: Path) -> None:
    t = load_trace(small_trace().write(tmp_path / "t.json", device_properties=False))
    assert t.device_properties == []
    assert t.device_name is None
    d = diagnose(t)
    assert d.device.name is None
    assert d.device.note is not None


def test_trace_without_profiler_steps_is_one_window(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.cpu_op("aten::mm", 0.0, 20.0)
    b.kernel("volta_sgemm_128x64_nn", 30.0, 100.0, launch_at=5.0)
    t = load_trace(b.write(tmp_path / "t.json"))
    assert Kind.ANNOTATION not in counts(t)
    d = diagnose(t)
    assert d.steps.total == 1
    assert d.steps.source.startswith("whole trace")
    assert any("ProfilerStep" in w for w in d.warnings)


def test_cpu_only_trace_loads_with_no_device_events(tmp_path: Path) -> None:
    b = TraceBuilder(device_name=None)
    b.step(1, 0.0, 100.0)
    b.cpu_op("aten::add", 10.0, 50.0)
    t = load_trace(b.write(tmp_path / "t.json"))
    assert counts(t) == {Kind.CPU_OP: 1, Kind.ANNOTATION: 1}


def test_begin_end_pairs_become_complete_events(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0.0, 100.0)
    b.cpu_op("aten::linear", 10.0, 50.0)
    b.cpu_op("aten::mm", 20.0, 30.0)  # nested inside aten::linear
    b.kernel("volta_sgemm_128x64_nn", 30.0, 40.0, launch_at=25.0)
    t = load_trace(b.write(tmp_path / "t.json", begin_end=True))
    assert counts(t) == {
        Kind.ANNOTATION: 1,
        Kind.CPU_OP: 2,
        Kind.RUNTIME: 1,
        Kind.KERNEL: 1,
    }
    by_name = {
        t.strings[n]: (ts, dur)
        for n, ts, dur in zip(
            t.events.name.tolist(), t.events.ts.tolist(), t.events.dur.tolist(), strict=True
        )
    }
    assert by_name["ProfilerStep#1"] == (0, 100_000)
    assert by_name["aten::linear"] == (10_000, 50_000)
    assert by_name["aten::mm"] == (20_000, 30_000)
    assert by_name["cudaLaunchKernel"] == (25_000, 4_000)
    assert by_name["volta_sgemm_128x64_nn"] == (30_000, 40_000)


def test_begin_end_pairs_on_different_threads_pair_separately(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.cpu_op("aten::a", 0.0, 100.0, tid=1)
    b.cpu_op("aten::b", 10.0, 20.0, tid=2)
    t = load_trace(b.write(tmp_path / "t.json", begin_end=True))
    ops = t.of_kind(Kind.CPU_OP)
    assert ops.dur.tolist() == [100_000, 20_000]


def test_back_to_back_begin_end_pairs_keep_their_durations(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0.0, 100.0)
    b.step(2, 100.0, 100.0)
    t = load_trace(b.write(tmp_path / "t.json", begin_end=True))
    steps = t.of_kind(Kind.ANNOTATION)
    assert steps.ts.tolist() == [0, 100_000]
    assert steps.dur.tolist() == [100_000, 100_000]


def test_keys_after_trace_events_are_read(tmp_path: Path) -> None:
    t = load_trace(small_trace().write(tmp_path / "t.json", tail_keys=True))
    assert counts(t) == SMALL_COUNTS
    assert t.base_time_ns == 1_700_000_000_000_000_000
    assert (t.rank, t.world_size) == (1, 4)


def test_integer_and_fractional_timestamps_give_the_same_nanoseconds(tmp_path: Path) -> None:
    b = training_trace(2)
    as_int = load_trace(b.write(tmp_path / "int.json", integer_ts=True))
    as_float = load_trace(b.write(tmp_path / "float.json"))
    assert b'"ts": 1700000000,' in (tmp_path / "int.json").read_bytes()
    assert b'"ts": 1700000000.0,' in (tmp_path / "float.json").read_bytes()
    assert_same_trace(as_int, as_float)


def test_pretty_printed_and_compact_json_give_the_same_trace(tmp_path: Path) -> None:
    b = small_trace()
    b.kernel(NASTY_NAME, 1500.0, 10.0, launch_at=70.0)
    compact = load_trace(b.write(tmp_path / "compact.json"))
    pretty = load_trace(b.write(tmp_path / "pretty.json", indent=2))
    assert b'\n  "traceEvents": [\n' in (tmp_path / "pretty.json").read_bytes()
    assert_same_trace(compact, pretty)


def test_names_with_json_boundaries_html_and_markup_are_kept_verbatim(tmp_path: Path) -> None:
    b = small_trace()
    b.kernel(NASTY_NAME, 1500.0, 10.0, launch_at=70.0)
    b.cpu_op(NASTY_NAME, 80.0, 5.0)
    t = load_trace(b.write(tmp_path / "t.json"))
    assert NASTY_NAME in names_of(t, Kind.KERNEL)
    assert names_of(t, Kind.CPU_OP).count(NASTY_NAME) == 1


def test_a_utf8_byte_order_mark_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + small_trace().to_bytes())
    assert counts(load_trace(path)) == SMALL_COUNTS


def test_find_trace_files_lists_a_folder_in_name_order(tmp_path: Path) -> None:
    b = small_trace()
    b.write(tmp_path / "rank-1.json.gz")
    b.write(tmp_path / "rank-0.json")
    (tmp_path / "notes.txt").write_text("not a trace")
    assert [p.name for p in find_trace_files(tmp_path)] == ["rank-0.json", "rank-1.json.gz"]
    assert find_trace_files(tmp_path / "rank-0.json") == [tmp_path / "rank-0.json"]


# Chunked and parallel parsing ------------------------------------------------------------------


def chunky_trace(steps: int) -> TraceBuilder:
    """A training trace with strings that contain the event-boundary pattern `}, {`: kernel
    and op names, and, in each step, an op whose pattern lies 200+ bytes into the event (so a
    reader cutting 128 bytes into an event cuts there)."""
    b = training_trace(steps, kernels=("volta_sgemm_128x64_nn", NASTY_NAME, "triton_poi_0"))
    b.cpu_op(NASTY_NAME, 1.0, 1.0)
    for s in range(steps):
        args = {"Module Hierarchy": "m" * 200, "Call stack": NASTY_NAME}
        b.host("aten::empty", s * 580.0 + 50.0, 1.0, args=args)
    return b


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"indent": 1},
        {"form": "array"},
        {"form": "array", "closed": False},
        {"tail_keys": True},
        {"begin_end": True},
    ],
    ids=["object", "pretty", "array", "array-unclosed", "tail-keys", "begin-end"],
)
@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_parsing_in_many_small_chunks_gives_the_single_chunk_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, object], suffix: str
) -> None:
    path = chunky_trace(6).write(tmp_path / f"t{suffix}", **options)
    whole = load_trace(path)
    monkeypatch.setattr(reader_module, "BLOCK", 256)
    chunked = load_trace(path)
    assert_same_trace(chunked, whole)


def test_small_chunks_really_cut_the_text_at_false_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The premise of the chunked tests: with a tiny block the reader yields many cuts, and
    # some of them fall at a `}, {` inside a name, so their text is not valid JSON.
    path = chunky_trace(3).write(tmp_path / "t.json")
    monkeypatch.setattr(reader_module, "BLOCK", 256)
    pieces = list(reader_module.ChunkReader(path).chunks())
    cuts = [p.framed for p in pieces if isinstance(p, reader_module.Cut)]
    assert len(cuts) > 20

    def parses(text: bytes) -> bool:
        try:
            json.loads(text)
        except ValueError:
            return False
        return True

    false_cuts = [text for text in cuts if not parses(text)]
    assert false_cuts
    assert any(b"evil<" in text for text in false_cuts)


def test_chunked_parse_of_a_file_not_in_time_order_gives_the_same_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = training_trace(6)
    # Later events first in the file: the earliest time is in the last chunk, and the time
    # origin (hence every time and the launch joins) must not depend on where chunks end.
    b.events.reverse()
    path = b.write(tmp_path / "t.json")
    whole = load_trace(path)
    monkeypatch.setattr(reader_module, "BLOCK", 256)
    chunked = load_trace(path)
    assert chunked.origin_us == whole.origin_us
    assert diagnose(chunked) == diagnose(whole)


def test_a_file_not_in_time_order_gives_the_diagnosis_of_the_ordered_file(
    tmp_path: Path,
) -> None:
    # Regression: with the origin at the first timestamp in file order, events earlier than
    # it got negative times, their launch times read as "no launch record", and the idle time
    # they explain was reported as unexplained. Compared with the ordered file, not with
    # another parse of the same file (which is wrong the same way).
    ordered = training_trace(6)
    shuffled = training_trace(6)
    shuffled.events.reverse()
    d_ordered = diagnose(load_trace(ordered.write(tmp_path / "ordered.json")))
    d_shuffled = diagnose(load_trace(shuffled.write(tmp_path / "reversed.json")))
    assert d_shuffled.breakdown == d_ordered.breakdown
    assert d_shuffled.breakdown.idle_causes["other"] == 0.0
    assert d_shuffled.breakdown.idle_causes["data_loading"] > 0.0


def test_parallel_parse_with_two_workers_gives_the_serial_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = chunky_trace(300).write(tmp_path / "t.json.gz")
    serial = load_trace(path, workers=1)
    assert len(serial.events) > 3000
    monkeypatch.setattr(reader_module, "BLOCK", 16 << 10)
    monkeypatch.setattr(trace_module, "PARALLEL_FROM_BYTES", 1)
    parallel = load_trace(path, workers=2)
    assert_same_trace(parallel, serial)


def test_progress_is_reported_up_to_the_file_size(tmp_path: Path) -> None:
    path = chunky_trace(20).write(tmp_path / "t.json")
    seen: list[tuple[int, int]] = []
    load_trace(path, lambda done, total: seen.append((done, total)))
    assert seen
    assert seen[-1] == (path.stat().st_size, path.stat().st_size)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_dataloader_annotation_is_a_host_annotation(
    builder: TraceBuilder, write_trace: Callable[..., Path]
) -> None:
    builder.dataloader(0.0, 10.0)
    t = load_trace(write_trace(builder, "loader.json.gz"))
    assert names_of(t, Kind.ANNOTATION) == [DATALOADER]


def test_memory_events_become_samples_in_ns(tmp_path: Path) -> None:
    b = small_trace()
    b.events.append(
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "name": "[memory]",
            "pid": b.pid,
            "tid": b.tid,
            "ts": 12.5,
            "args": {
                "Device Id": 0,
                "Device Type": 1,
                "Addr": 4096,
                "Bytes": 512,
                "Total Allocated": 1 << 20,
                "Total Reserved": 2 << 20,
            },
        }
    )
    t = load_trace(b.write(tmp_path / "t.json"))
    assert counts(t)[Kind.MEMORY] == 1
    m = t.memory
    assert len(m) == 1
    assert (m.ts[0], m.device_type[0], m.device_id[0], m.addr[0], m.bytes[0]) == (
        12_500,
        1,
        0,
        4096,
        512,
    )
    assert (m.total_allocated[0], m.total_reserved[0]) == (1 << 20, 2 << 20)
    assert m.thread[0] == t.events.thread[t.events.kind == Kind.MEMORY][0]


def test_parallel_parse_of_a_plain_file_in_regions_gives_the_serial_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Plain files are split into byte regions that the workers read themselves; with tiny
    # regions some cuts fall on the `}, {` inside event names and must be undone.
    path = chunky_trace(300).write(tmp_path / "t.json")
    serial = load_trace(path, workers=1)
    monkeypatch.setattr(reader_module, "REGION", 2 << 10)
    monkeypatch.setattr(reader_module, "TAIL", 1 << 10)
    pieces = list(reader_module.ChunkReader(path, regions=True).chunks())
    regions = [p for p in pieces if isinstance(p, reader_module.Region)]
    assert len(regions) > 20
    assert any(r.decode().problem is not None for r in regions), "no false cut was exercised"
    parallel = load_trace(path, workers=2)
    assert_same_trace(parallel, serial)


def test_the_end_of_a_stream_is_cut_into_small_pieces_that_parse_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At the end of a gzip stream the reader keeps cutting (so workers, not the parent,
    # decode the last megabytes); cuts there may fall inside names or past the array's end
    # (into the keys after it) and must be undone like any false cut.
    path = chunky_trace(300).write(tmp_path / "t.json.gz", tail_keys=True)
    serial = load_trace(path, workers=1)
    monkeypatch.setattr(reader_module, "BLOCK", 64 << 10)
    monkeypatch.setattr(reader_module, "TAIL", 1 << 10)
    pieces = list(reader_module.ChunkReader(path).chunks())
    remainder = pieces[-1]
    assert isinstance(remainder, reader_module.Remainder)
    assert len(remainder.text) <= 8 << 10
    assert sum(isinstance(p, reader_module.Cut) for p in pieces) > 10
    assert_same_trace(load_trace(path, workers=2), serial)
    assert_same_trace(load_trace(path, workers=1), serial)


@pytest.mark.parametrize("name", ["t.json.gz", "t.json"])
def test_parse_by_three_processes_gives_the_serial_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # This process and two helpers claim pieces as they reach them; small pieces make many
    # claims and false cuts (gzip: cut here; plain: regions each side reads itself).
    path = chunky_trace(300).write(tmp_path / name, tail_keys=True)
    serial = load_trace(path, workers=1)
    monkeypatch.setattr(reader_module, "BLOCK", 16 << 10)
    monkeypatch.setattr(reader_module, "REGION", 4 << 10)
    monkeypatch.setattr(reader_module, "TAIL", 2 << 10)
    assert_same_trace(load_trace(path, workers=3), serial)
    assert not multiprocessing.active_children()


def _claim_and_die(path: Path, claims: Any, number: int, results: Any) -> None:
    """A helper that claims the first pieces and is gone before sending any of them."""
    for index in range(3):
        claims.claim(index, number)
    os._exit(1)


def _parse_beside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, helper: Any) -> None:
    """A trace of many small pieces parsed beside one helper that runs `helper` instead of
    `_help`: the same trace as the serial parse."""
    path = chunky_trace(300).write(tmp_path / "t.json.gz")
    serial = load_trace(path, workers=1)
    monkeypatch.setattr(reader_module, "BLOCK", 16 << 10)
    monkeypatch.setattr(trace_module, "_help", helper)
    assert_same_trace(load_trace(path, workers=2), serial)


def _claim_and_send_other_pieces(path: Path, claims: Any, number: int, results: Any) -> None:
    """A helper whose file is not the one this process reads (it changed in between)."""
    for index in range(3):
        claims.claim(index, number)
        results.send(((1, 0, b"another piece"), trace_module.Chunk(count=1)))


def test_chunks_of_pieces_that_differ_from_this_process_s_are_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _parse_beside(tmp_path, monkeypatch, _claim_and_send_other_pieces)


def _claim_and_stall(path: Path, claims: Any, number: int, results: Any) -> None:
    """A helper that claims the first pieces and then gets no core (a busy machine)."""
    for index in range(3):
        claims.claim(index, number)
    time.sleep(60)


def test_pieces_claimed_by_a_stalled_helper_are_decoded_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _parse_beside(tmp_path, monkeypatch, _claim_and_stall)
    assert not multiprocessing.active_children()


def test_pieces_claimed_by_a_helper_that_dies_are_decoded_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _parse_beside(tmp_path, monkeypatch, _claim_and_die)


def test_a_damaged_file_read_by_helpers_fails_in_one_line_and_stops_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = chunky_trace(300).write(tmp_path / "t.json.gz").read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(whole[: len(whole) // 2])
    monkeypatch.setattr(reader_module, "BLOCK", 16 << 10)
    with pytest.raises(WallfinderError) as serial:
        load_trace(path, workers=1)
    with pytest.raises(WallfinderError) as parallel:
        load_trace(path, workers=2)
    assert str(parallel.value) == str(serial.value)
    assert not multiprocessing.active_children()


def _parse_in_a_pool_worker(path: Path) -> tuple[int, int]:
    trace = load_trace(path, workers=2)
    return len(trace.events), trace_module._processes(1 << 40, None)


def test_a_daemonic_pool_worker_parses_alone(tmp_path: Path) -> None:
    # Rank analyses run in process pools; a daemonic worker may not start processes at all.
    path = chunky_trace(30).write(tmp_path / "t.json.gz")
    with multiprocessing.get_context("fork").Pool(1) as pool:
        events, default = pool.apply(_parse_in_a_pool_worker, (path,))
    assert events == len(load_trace(path, workers=1).events)
    assert default == 1


def test_helpers_decode_by_default_from_the_threshold_where_this_process_can_fork(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace_module, "_available_cores", lambda: 4)
    small, large = trace_module.PARALLEL_FROM_BYTES, trace_module.PARALLEL_FROM_BYTES + 1
    assert trace_module._processes(large, 3) == 3
    assert trace_module._processes(small, 3) == 3
    assert trace_module._processes(small, None) == 1
    forks = trace_module.process_context().get_start_method() == "fork"
    assert trace_module._processes(large, None) == (4 if forks else 1)
    # Spawned helpers start an interpreter each: they pay only on larger traces.
    monkeypatch.setattr(
        trace_module, "process_context", lambda: multiprocessing.get_context("spawn")
    )
    assert trace_module._processes(large, None) == 1
    assert trace_module._processes(trace_module.SPAWNED_FROM_BYTES + 1, None) == 4


def test_thread_codes_are_the_pid_and_tid_codes_of_a_thread_key() -> None:
    pid, tid = np.array([0, 3, 70000], np.int32), np.array([5, 0, 2**31 - 1], np.int32)
    keys = thread_key(pid, tid).tolist()
    assert [thread_codes(k) for k in keys] == list(zip(pid.tolist(), tid.tolist(), strict=True))
    # The rows on a thread, found from the codes: those whose key is the thread's.
    for k in keys:
        assert thread_mask(pid, tid, k).tolist() == (thread_key(pid, tid) == k).tolist()


def test_extent_and_rows_on_a_thread_read_the_table_in_place(tmp_path: Path) -> None:
    t = load_trace(training_trace(steps=3).write(tmp_path / "t.json"))
    host = (Kind.CPU_OP, Kind.RUNTIME)
    merged = t.of_kind(*host)
    assert t.extent(*host) == (int(merged.ts.min()), int(merged.end.max()))
    assert t.extent(Kind.MEMSET) is None
    thread = int(merged.thread[0])
    mine = t.on_thread(host, thread)
    on = merged.thread == thread
    assert mine.ts.tolist() == merged.ts[on].tolist()
    assert mine.name.tolist() == merged.name[on].tolist()
    assert len(t.on_thread(host, thread_key(np.array([999]), np.array([0]))[0])) == 0
