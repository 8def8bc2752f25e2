"""The critical path's walk (`critpath.path`: every node's binding edge read at once, the
path's position the running minimum of its events' times) against the walk it replaced, one
Python loop over the path's nodes (`walk_reference`): the same time in each category and the
same segments, on the critical-path fixtures' graphs under every what-if, and on generated
graphs with DataLoader and collective waits in the host's gaps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace
from test_critpath import (
    comm_exposed,
    gpu_bound,
    host_bound,
    late_collective,
    queue_full,
    sync_bound,
)
from test_findings import collective_on_the_host, ddp_accumulation, graph_replays, sync_in_loop
from test_onepass import graphs

import walk_reference
from tracegen import training_trace
from wallfinder import Options, analyze
from wallfinder.analysis.critpath import CATEGORIES, WHAT_IFS, StepGraph, replay
from wallfinder.analysis.critpath import path as critpath_path
from wallfinder.analysis.critpath import rank as critpath_rank
from wallfinder.analysis.critpath.change import UNCHANGED, Change, parse_what_if


def same_walk(g: StepGraph, change: Change) -> None:
    t = replay(g, change)
    # A window around the middle of the range: the segments kept are compared too.
    keep = (t.end // 3, 2 * t.end // 3)
    new, old = critpath_path.walk_path(g, t, keep), walk_reference.walk_path(g, t, keep)
    assert new.out == old.out
    assert new.segments() == old.segments()


BUILDERS: list[Any] = [
    host_bound,
    gpu_bound,
    sync_bound,
    comm_exposed,
    late_collective,
    queue_full,
    sync_in_loop,
    collective_on_the_host,
    graph_replays,
    lambda: ddp_accumulation(no_sync=False, queued=True),
    lambda: training_trace(6),
]


@pytest.mark.parametrize("block", [4096, 2])
@pytest.mark.parametrize("builder", BUILDERS)
def test_the_walk_gives_the_node_by_node_walks_path_under_every_what_if(
    builder: Any, block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(`block`: the nodes whose events are laid out at once; 2 cuts every path into many
    blocks, each starting where the one before left the path.)"""
    monkeypatch.setattr(critpath_path, "WALK_NODES", block)
    built: list[StepGraph] = []
    build_graph = critpath_rank.build_graph

    def keep(*args: Any, **kwargs: Any) -> StepGraph | None:
        g = build_graph(*args, **kwargs)
        if g is not None:
            built.append(g)
        return g

    monkeypatch.setattr(critpath_rank, "build_graph", keep)
    analyze(builder().write(tmp_path / "t.json"), Options())
    assert built
    g = built[0]
    for change in [UNCHANGED, *parse_what_if(",".join(w for w in WHAT_IFS if w != "microbatches"))]:
        same_walk(g, change)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(acyclic=True), st.data())
def test_the_walk_gives_the_node_by_node_walks_path_on_generated_graphs(
    drawn: tuple[StepGraph, dict[str, list[int]]], data: st.DataObject
) -> None:
    g, w = drawn
    n_calls, n_ops = g.gap.size, g.dur.size

    def ints(size: int, lo: int, hi: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        return np.array(data.draw(st.lists(st.integers(lo, hi), min_size=size, max_size=size)))

    gap = ints(n_calls, 0, 30)
    gap_data = np.minimum(ints(n_calls, 0, 30) * ints(n_calls, 0, 1), gap)
    gap_comm = np.minimum(ints(n_calls, 0, 30) * ints(n_calls, 0, 1), gap - gap_data)
    drained_by = np.array(w["drained_by"])
    sync = np.zeros(n_calls, bool)
    sync[drained_by[drained_by >= 0]] = True
    g = replace(
        g,
        gap=gap,
        gap_data=gap_data,
        gap_comm=gap_comm,
        after_data=ints(n_calls, 0, 30),
        cost=ints(n_calls, 0, 20),
        offset=gap - ints(n_calls, 0, 3) * ints(n_calls, 0, 1) * 5,
        sync=sync,
        lat=ints(n_ops, 0, 5),
        dur=ints(n_ops, 0, 40),
        cls=ints(n_ops, 0, len(CATEGORIES)).astype(np.int8),
        extra=ints(n_ops, 0, 10),
        dep_gap=ints(n_ops, 0, 5),
        drained_by=drained_by,
        tie_ns=data.draw(st.sampled_from([0, 3])),
        steps=1,
    )
    for change in (UNCHANGED, Change(sync=True), Change(host=2.0)):
        same_walk(g, change)
