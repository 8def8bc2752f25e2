"""Launch calls joined to the kernels they launched when the trace has no correlation ids: by
the `ac2g` flow events, else by External id in order; CPU ops joined to kernels by time when
the kernels' External ids do not name them. Which join was used is said."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_roofline import A100, MM_DIMS, op_with_kernel

from tracegen import TraceBuilder, write_bytes
from wallfinder import analyze
from wallfinder.analysis.gpu import device_ops
from wallfinder.analysis.steps import NO_LAUNCH
from wallfinder.trace import load_trace

GEMM = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1"
BF16 = ["c10::BFloat16", "c10::BFloat16"]


def _steps() -> TraceBuilder:
    """4 steps of 1000 µs: an mm launched at +10 µs runs 500 µs from +300 µs (the GPU idles
    first: the host is late), each kernel's External id its op's (Kineto's form)."""
    b = TraceBuilder(device_name=A100)
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        op_with_kernel(b, "aten::mm", MM_DIMS, BF16, t0 + 9.0, GEMM, t0 + 300.0, 500.0)
    return b


def _write(b: TraceBuilder, path: Path, *, flows: bool, runtime_external: bool) -> Path:
    """The trace with every correlation id removed; with `flows`, the ac2g flow events
    Kineto writes for each launch (start at the call, end at the kernel, id the correlation
    id); with `runtime_external`, each launch call carries its kernel's External id."""
    events = b.trace_events()
    by_corr: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        corr = e.get("args", {}).pop("correlation", None)
        if corr is not None:
            by_corr.setdefault(corr, []).append(e)
    extra = []
    for corr, pair in by_corr.items():
        if len(pair) != 2:  # a launch call whose kernel was not recorded
            continue
        call, kernel = pair
        if runtime_external:
            call["args"]["External id"] = kernel["args"]["External id"]
        else:
            call["args"].pop("External id", None)
        if flows:
            for ph, at in (("s", call), ("f", kernel)):
                flow = {"ph": ph, "id": corr, "pid": at["pid"], "tid": at["tid"], "ts": at["ts"]}
                extra.append({**flow, "cat": "ac2g", "name": "ac2g"})
                if ph == "f":
                    extra[-1]["bp"] = "e"
    doc = b.header()
    doc["traceEvents"] = events + extra
    return write_bytes(path, json.dumps(doc).encode())


@pytest.mark.parametrize(
    ("flows", "runtime_external", "how"),
    [(True, False, "ac2g flow events"), (False, True, "External ids, in order")],
)
def test_launches_are_joined_without_correlation_ids(
    tmp_path: Path, flows: bool, runtime_external: bool, how: str
) -> None:
    path = _write(_steps(), tmp_path / "t.json", flows=flows, runtime_external=runtime_external)
    trace = load_trace(path)
    dev = device_ops(trace)
    assert dev is not None
    assert (dev.launch_ts != NO_LAUNCH).all()
    # Each kernel's launch is its own step's call, 10 µs into the step.
    step_starts = np.arange(4) * 1_000_000
    assert (dev.launch_ts - dev.launch_ts.min() == step_starts).all()
    assert any(how in w for w in trace.warnings)
    d = analyze(path)
    assert any(how in w for w in d.warnings)
    assert not any(w.startswith("no launch records") for w in d.warnings)
    # The same figures as the trace with its correlation ids: idle causes, roofline, verdict.
    joined = analyze(_steps().write(tmp_path / "with_ids.json"))
    assert d.breakdown.idle_causes == pytest.approx(joined.breakdown.idle_causes)
    assert d.roofline == joined.roofline
    assert (d.verdict.wall, d.verdict.cause) == (joined.verdict.wall, joined.verdict.cause)
    d.self_check()


def test_external_ids_whose_counts_disagree_are_not_guessed(tmp_path: Path) -> None:
    b = _steps()
    # A second launch call in the first step's op, with the same External id, that launched
    # nothing recorded: that id's calls and kernels no longer pair one to one.
    first_op = next(e for e in b.events if e["name"] == "aten::mm")
    b.runtime("cudaLaunchKernel", 12.0, 2.0, correlation=b.new_id())
    b.events[-1]["args"]["External id"] = first_op["args"]["External id"]
    path = _write(b, tmp_path / "t.json", flows=False, runtime_external=True)
    dev = device_ops(load_trace(path))
    assert dev is not None
    assert (dev.launch_ts == NO_LAUNCH).sum() == 1
    assert (dev.launch_ts != NO_LAUNCH).sum() == 3


def test_a_trace_with_correlation_ids_is_joined_by_them_and_says_nothing(tmp_path: Path) -> None:
    trace = load_trace(_steps().write(tmp_path / "t.json"))
    assert trace.warnings == []


def test_kernel_external_ids_of_unrelated_ops_are_not_trusted(tmp_path: Path) -> None:
    # Older traces reuse the correlation id as the kernels' External id, which can be the id
    # of an unrelated op elsewhere in the trace; the op around the launch call launched it.
    b = _steps()
    kernels = [e for e in b.events if e["cat"] == "kernel"]
    for i, kernel in enumerate(kernels):
        # The kernel's id is an aten::transpose's far later, as the real traces show.
        kernel["args"]["External id"] = 100_000 + i
        b.host("aten::transpose", 5000.0 + 10 * i, 5.0)
        b.events[-1]["args"]["External id"] = 100_000 + i
    path = b.write(tmp_path / "t.json")
    d = analyze(path)
    assert d.roofline is not None
    assert [o.name for o in d.roofline.ops] == ["aten::mm"]
    assert any("External ids do not name the ops" in w for w in d.warnings)
