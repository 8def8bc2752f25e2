"""Module and range paths from names that hold the path's own separators, numbers,
parentheses, unicode, very long names, the same name at two depths, and ranges re-run on
other threads: the module table is built (a path is a tuple of names, never a joined string
parsed back), every row's parent is listed, and the rows roll up to their parents."""

from __future__ import annotations

from pathlib import Path

import pytest

from invariants import assert_diagnosis_invariants, assert_phases_and_modules
from tracegen import TraceBuilder
from wallfinder import Diagnosis, analyze
from wallfinder.analysis.phases import _collapsed

GEMM = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32"
US = 1e-6


def ranged_trace(layout: list[tuple[str, float, float, int]], steps: int = 3) -> TraceBuilder:
    """Steps of 1000 µs; in each, the `record_function` ranges of `layout` (name, start and
    length in µs from the step's start, thread), and a 50 µs GEMM launched at 400 µs on the
    main thread."""
    b = TraceBuilder()
    for s in range(steps):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        for name, start, dur, tid in layout:
            b.annotation(name, t0 + start, dur, tid=tid)
        b.host("aten::mm", t0 + 400.0, 8.0)
        b.kernel(GEMM, t0 + 420.0, 50.0, launch_at=t0 + 402.0)
    return b


def analysed(b: TraceBuilder, tmp_path: Path) -> Diagnosis:
    d = analyze(b.write(tmp_path / "t.json"))
    assert_diagnosis_invariants(d)
    assert_phases_and_modules(d)
    assert d.not_computed == {}
    return d


MAIN, OTHER, THIRD = 4242, 7, 8

NAMES = [
    "DistributedDataParallel.forward",
    "Torch-Compiled Region: 0/0",
    "a/b/c",
    "layer(3).attn:q",
    "ünïcødé ⚡ block",
    "x" * 5000,
]


@pytest.mark.parametrize("name", NAMES, ids=lambda n: n[:24])
def test_a_range_re_run_on_other_threads_with_a_separator_in_its_name(
    tmp_path: Path, name: str
) -> None:
    # The main thread: `outer` > NAME (around the GEMM's launch); the autograd-like thread:
    # NAME > `child` (an orphan re-rooted under outer); a third thread: `child` alone (an
    # orphan whose only nested path was under the orphan NAME before it was re-rooted).
    layout = [
        ("outer", 300.0, 300.0, MAIN),
        (name, 350.0, 200.0, MAIN),
        (name, 600.0, 100.0, OTHER),
        ("child", 610.0, 50.0, OTHER),
        ("child", 700.0, 50.0, THIRD),
    ]
    d = analysed(ranged_trace(layout), tmp_path)
    assert d.modules is not None
    rows = {r.path: r for r in d.modules.rows}
    outer = rows["outer"]
    assert outer.forward_s + outer.backward_s == pytest.approx(50 * US)
    # The GEMM ran inside NAME, under outer: NAME's row is outer's child, whatever NAME holds.
    (inner,) = [r for r in d.modules.rows if r.parent == "outer"]
    assert inner.names == ["outer", name]
    assert inner.forward_s == pytest.approx(50 * US)


def test_the_same_name_at_two_depths_and_a_step_inside_a_module(tmp_path: Path) -> None:
    layout = [
        ("block", 300.0, 300.0, MAIN),
        ("block", 350.0, 200.0, MAIN),  # block inside block
        ("ProfilerStep#99", 380.0, 100.0, MAIN),  # a step range inside a module
        ("block.0", 390.0, 80.0, MAIN),
    ]
    d = analysed(ranged_trace(layout), tmp_path)
    assert d.modules is not None
    names = [r.names for r in d.modules.rows]
    assert ["block", "block", "block.0"] in names
    assert len({r.path for r in d.modules.rows}) == len(d.modules.rows)


def test_collapsed_rows_come_from_tuples_whatever_the_names_hold() -> None:
    paths = [("Net", "Block_0", "a/b"), ("Net", "Block_1", "a/b"), ("Net/Block_0",)]
    rows = _collapsed(paths)
    assert rows[("Net", "Block_0", "a/b")] == ("Net", "Block_*", "a/b")
    assert rows[("Net", "Block_1", "a/b")] == ("Net", "Block_*", "a/b")
    assert rows[("Net/Block_0",)] == ("Net/Block_0",)
    assert rows[("Net",)] == ("Net",)  # every prefix has its row
