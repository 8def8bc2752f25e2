"""The device's idle pieces are attributed once per rank (issue 36): the breakdown's idle
causes, the timeline's gaps and the rules that read the gaps all read the same pieces of the
scope's windows, and the timeline's step is that step's pieces of them."""

from __future__ import annotations

from pathlib import Path

import pytest

import wallfinder.analysis.gpu as gpu
from tracegen import TraceBuilder
from wallfinder import analyze
from wallfinder.analysis.gpu import device_ops, idle_pieces
from wallfinder.analysis.thresholds import Thresholds
from wallfinder.trace import load_traces


def stepped() -> TraceBuilder:
    """Six steps, each a DataLoader wait, a sync and a few kernels: idle gaps of several
    causes in every step."""
    b = TraceBuilder()
    host = 0.0
    for n in range(6):
        b.step(n, host, 400.0)
        b.dataloader(host + 1.0, 60.0 + 10.0 * n)
        at = host + 80.0 + 10.0 * n
        for _ in range(3):
            b.cpu_op("aten::mm", at, 20.0)
            b.kernel("volta_sgemm_128x64_nn", at + 15.0, 40.0, launch_at=at + 5.0)
            at += 30.0
        b.sync(at, 90.0)
        host += 400.0
    return b


def test_idle_pieces_are_attributed_once_per_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = []
    attribute = gpu._idle_pieces

    def counted(*args: object) -> gpu.IdlePieces:
        made.append(args)
        return attribute(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(gpu, "_idle_pieces", counted)
    d = analyze(stepped().write(tmp_path / "t.json"), workers=1)
    assert d.timeline is not None
    assert d.timeline.gaps
    assert d.breakdown.idle > 0
    assert len(made) == 1


def test_a_windows_pieces_are_those_of_all_windows_in_it(tmp_path: Path) -> None:
    [trace] = load_traces(stepped().write(tmp_path / "t.json"), cache=False)
    dev = device_ops(trace)
    assert dev is not None
    start = dev.ops.ts[:-1:3] - 50_000
    end = start + 300_000
    slack = Thresholds().slack
    every = idle_pieces(trace, dev, start, end, slack)
    assert idle_pieces(trace, dev, start, end, slack) is every
    one = every.of_window(2)
    assert one.start.size
    assert (one.window == 2).all()
    rows = every.window == 2
    assert (one.end == every.end[rows]).all()
    assert (one.op == every.op[rows]).all()
    for cause, ns in one.causes.items():
        assert (ns == every.causes[cause][rows]).all()
