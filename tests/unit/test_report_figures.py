"""What the Diagnosis carries for the HTML report's figures: the device timeline of one
representative step (busy spans, idle gaps with their causes and the host's activity) and every
costed op's point on the roofline, with its class."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracegen import DATALOADER, TraceBuilder
from wallfinder import Diagnosis, analyze
from wallfinder.analysis import timeline as timeline_module
from wallfinder.analysis.roofline import TOP_OPS

GEMM = "volta_sgemm_128x64_nn"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>()"
US = 1e-6


def varied_trace(loaders: tuple[float, ...] = (300.0, 100.0, 160.0, 200.0, 120.0)) -> TraceBuilder:
    """Steps that differ only in their DataLoader wait. In each: the DataLoader for `loader`
    µs, then per kernel an 8 µs op that launches it 2 µs in; the kernel (150 µs) starts 10 µs
    after the op. Steps last `loader` + 320 µs: 620, 420, 480, 520, 440 (median: step 3)."""
    b = TraceBuilder()
    t0 = 0.0
    for s, loader in enumerate(loaders):
        b.step(s + 1, t0, loader + 320.0)
        b.dataloader(t0, loader)
        t = t0 + loader
        for op, kernel in (("aten::mm", GEMM), ("aten::add", ADD)):
            b.cpu_op(op, t, 8.0)
            b.kernel(kernel, t + 10.0, 150.0, launch_at=t + 2.0)
            t += 160.0
        t0 += loader + 320.0
    return b


def diagnose_trace(b: TraceBuilder, tmp_path: Path) -> Diagnosis:
    return analyze(b.write(tmp_path / "trace.json"))


def assert_gaps_add_up(d: Diagnosis) -> None:
    """The timeline's gaps, listed and unlisted, are the step's idle time, cause by cause."""
    t = d.timeline
    assert t is not None
    step = next(s for s in d.breakdown.steps if s.step == t.step)
    listed = sum(g.end_s - g.start_s for g in t.gaps)
    assert listed + t.unlisted_gap_s == pytest.approx(step.idle_s, abs=1e-12)
    for g in t.gaps:
        assert sum(g.causes_s.values()) == pytest.approx(g.end_s - g.start_s, abs=1e-12)
        assert g.end_s - g.start_s >= t.resolution_s
    if t.unlisted_gaps == 0:
        for cause, seconds in step.idle_causes_s.items():
            in_gaps = sum(g.causes_s.get(cause, 0.0) for g in t.gaps)
            assert in_gaps == pytest.approx(seconds, abs=1e-12), cause
    starts = [g.start_s for g in t.gaps]
    assert starts == sorted(starts)


def test_timeline_is_the_median_step_with_its_gaps_causes_and_host_activity(
    tmp_path: Path,
) -> None:
    d = diagnose_trace(varied_trace(), tmp_path)
    t = d.timeline
    assert t is not None
    assert t.step == "step 3"
    assert t.duration_s == pytest.approx(480 * US)
    assert t.start_s == pytest.approx((620 + 420) * US)
    # The GPU waits 170 µs for the DataLoader, the op and the launch, then 10 µs between the
    # kernels (2 µs of op before the launch, 8 µs of launch latency).
    first, second = t.gaps
    assert (first.start_s, first.end_s) == pytest.approx((0.0, 170 * US))
    assert first.causes_s == pytest.approx(
        {"data_loading": 160 * US, "host_overhead": 2 * US, "launch_latency": 8 * US}
    )
    assert first.host == DATALOADER
    assert (second.start_s, second.end_s) == pytest.approx((320 * US, 330 * US))
    assert second.causes_s == pytest.approx({"host_overhead": 2 * US, "launch_latency": 8 * US})
    assert second.host == "aten::add"
    assert [(s.lane, s.cls, s.ops) for s in t.spans] == [
        ("compute", "gemm", 1),
        ("compute", "elementwise", 1),
    ]
    spans = [x for s in t.spans for x in (s.start_s, s.end_s, s.busy_s)]
    assert spans == pytest.approx([170 * US, 320 * US, 150 * US, 330 * US, 480 * US, 150 * US])
    assert t.unlisted_gaps == 0
    assert_gaps_add_up(d)


def test_timeline_gap_with_work_already_queued_names_no_host_activity(tmp_path: Path) -> None:
    # The second kernel is launched right after the first (queued), but waits 200 µs for a
    # dependency: the GPU was not waiting for the host.
    b = TraceBuilder()
    for s in range(3):
        t0 = s * 600.0
        b.step(s + 1, t0, 600.0)
        b.cpu_op("aten::mm", t0, 8.0)
        b.kernel(GEMM, t0 + 10.0, 150.0, launch_at=t0 + 2.0)
        b.cpu_op("aten::add", t0 + 20.0, 8.0)
        b.kernel(ADD, t0 + 360.0, 150.0, launch_at=t0 + 22.0)
    d = diagnose_trace(b, tmp_path)
    t = d.timeline
    assert t is not None
    wait = next(g for g in t.gaps if "dependency_wait" in g.causes_s)
    assert wait.end_s - wait.start_s == pytest.approx(200 * US)
    assert wait.causes_s == pytest.approx({"dependency_wait": 200 * US})
    assert wait.host is None
    assert_gaps_add_up(d)


def test_timeline_stays_small_however_many_gaps_and_kernels_a_step_has(tmp_path: Path) -> None:
    # One step, 250 kernels of 10 µs with gaps of 100 to 160 µs between them: more gaps than
    # are listed, each longer than the resolution.
    b = TraceBuilder()
    t = 0.0
    launches = []
    for i in range(250):
        gap = 100.0 + (i % 7) * 10.0
        launches.append((t + gap, i))
        t += gap + 10.0
    b.step(1, 0.0, t)
    for start, i in launches:
        b.cpu_op("aten::add", start - 5.0, 4.0)
        b.kernel(ADD if i % 2 else GEMM, start, 10.0, launch_at=start - 4.0)
    d = diagnose_trace(b, tmp_path)
    tl = d.timeline
    assert tl is not None
    assert len(tl.gaps) == timeline_module.MAX_GAPS
    assert tl.unlisted_gaps == 250 - timeline_module.MAX_GAPS
    # The longest gaps are the ones listed.
    shortest_listed = min(g.end_s - g.start_s for g in tl.gaps)
    assert shortest_listed == pytest.approx(110 * US)
    assert sum(g.end_s - g.start_s > 115 * US for g in tl.gaps) == 178  # all from 120 µs up
    assert len(tl.spans) == 250
    assert_gaps_add_up(d)


def test_timeline_merges_spans_until_they_fit(tmp_path: Path) -> None:
    # 450 kernels of 5 µs every 100 µs: at the finest resolution (90 µs) each would be a span.
    b = TraceBuilder()
    b.step(1, 0.0, 45_000.0)
    for i in range(450):
        start = 50.0 + i * 100.0
        b.cpu_op("aten::add", start - 6.0, 4.0)
        b.kernel(ADD, start, 5.0, launch_at=start - 4.0)
    d = diagnose_trace(b, tmp_path)
    tl = d.timeline
    assert tl is not None
    assert len(tl.spans) <= timeline_module.MAX_SPANS
    assert tl.resolution_s > tl.duration_s / timeline_module.FINEST
    assert sum(s.busy_s for s in tl.spans) == pytest.approx(450 * 5 * US)
    assert sum(s.ops for s in tl.spans) == 450
    assert_gaps_add_up(d)


def test_timeline_of_a_trace_with_no_device_is_null(tmp_path: Path) -> None:
    b = TraceBuilder(device_name=None)
    for s in range(3):
        b.step(s + 1, s * 100.0, 100.0)
        b.cpu_op("aten::add", s * 100.0 + 10.0, 50.0)
    assert diagnose_trace(b, tmp_path).timeline is None


# Roofline points -------------------------------------------------------------------------------


def shaped_op(b: TraceBuilder, op: str, dims: list[Any], start: float, kernel: str) -> None:
    """A bf16 op with shapes and the 50 µs kernel it launches (joined by External id)."""
    event = b.host(op, start, 5.0, args={"Input Dims": dims, "Input type": ["c10::BFloat16"] * 2})
    b.kernel(kernel, start + 10.0, 50.0, launch_at=start + 1.0)
    b.events[-1]["args"]["External id"] = event["args"]["External id"]


def test_roofline_keeps_every_costed_op_with_its_class(tmp_path: Path) -> None:
    # Per step: one mm and 20 adds of distinct shapes, 21 op signatures in all.
    b = TraceBuilder(device_name="NVIDIA A100-SXM4-80GB")
    for s in range(3):
        t0 = s * 2000.0
        b.step(s + 1, t0, 2000.0)
        shaped_op(b, "aten::mm", [[1024, 1024], [1024, 1024]], t0 + 10.0, GEMM)
        for k in range(20):
            n = 256 * (k + 1)
            shaped_op(b, "aten::add", [[n, 512], [n, 512]], t0 + 100.0 + 80.0 * k, ADD)
    d = diagnose_trace(b, tmp_path)
    r = d.roofline
    assert r is not None
    rows = [*r.ops, *r.more_ops]
    assert len(r.ops) == TOP_OPS
    assert len(rows) == 21
    assert {(o.name, o.cls) for o in rows} == {("aten::mm", "gemm"), ("aten::add", "elementwise")}
    assert len({o.shapes for o in rows}) == 21
    times = [o.time_s for o in rows]
    assert times == sorted(times, reverse=True)


def test_cpu_roofline_ops_have_their_class(tmp_path: Path) -> None:
    b = TraceBuilder(device_name=None)
    for s in range(3):
        b.step(s + 1, s * 2000.0, 2000.0)
        b.host(
            "aten::mm",
            s * 2000.0 + 100.0,
            1500.0,
            args={"Input Dims": [[256, 256], [256, 256]], "Input type": ["float", "float"]},
        )
    r = diagnose_trace(b, tmp_path).roofline
    assert r is not None
    assert [(o.name, o.cls) for o in r.ops] == [("aten::mm", "gemm")]


def test_a_diagnosis_written_before_these_fields_still_loads(tmp_path: Path) -> None:
    b = TraceBuilder(device_name="NVIDIA A100-SXM4-80GB")
    for s in range(3):
        b.step(s + 1, s * 1000.0, 1000.0)
        shaped_op(b, "aten::mm", [[1024, 1024], [1024, 1024]], s * 1000.0 + 10.0, GEMM)
    old: dict[str, Any] = json.loads(diagnose_trace(b, tmp_path).to_json())
    del old["timeline"]
    del old["roofline"]["more_ops"]
    for row in old["roofline"]["ops"]:
        del row["class"]
    d = Diagnosis.from_json(json.dumps(old))
    assert d.timeline is None
    assert d.roofline is not None
    assert d.roofline.more_ops == []
    assert [o.cls for o in d.roofline.ops] == [None]
