"""The one allocate/free replay both memory sources use, and the one category vocabulary."""

from __future__ import annotations

import numpy as np

from wallfinder.analysis.allocations import Replay, rank_sites
from wallfinder.diagnosis import MEMORY_CATEGORIES, PROFILE_CATEGORIES, SNAPSHOT_CATEGORIES
from wallfinder.trace.snapshot import ALLOC, FREE, OOM, OTHER, TraceEntry, history


def _replay(events: list[tuple[int, int, int]]) -> Replay:
    addr, size, action = (np.array(c, dtype=np.int64) for c in zip(*events, strict=True))
    return Replay.of(addr, size, action)


def test_each_free_ends_the_allocation_before_it_at_its_address() -> None:
    r = _replay(
        [
            (0x10, 8, ALLOC),  # 0: freed at 2
            (0x20, 4, ALLOC),  # 1: never freed
            (0x10, 8, FREE),  # 2
            (0x30, 2, FREE),  # 3: of a block from before the history
            (0x10, 1, OOM),  # 4: not part of the replay
            (0x10, 16, ALLOC),  # 5: the address reused, freed at 6
            (0x10, 16, FREE),  # 6
        ]
    )
    assert r.level.tolist() == [8, 12, 4, 2, 2, 18, 2]
    assert r.free_of.tolist() == [2, -1, -1, -1, -1, 6, -1]
    assert r.live_after(0).tolist() == [0]
    assert r.live_after(2).tolist() == [1]
    assert r.live_after(5).tolist() == [1, 5]
    assert r.from_before().tolist() == [False, False, False, True, False, False, False]


def test_a_snapshots_history_frees_blocks_when_their_free_completes() -> None:
    entries = [
        TraceEntry(action="alloc", addr=1, size=8),
        TraceEntry(action="free_requested", addr=1, size=8),
        TraceEntry(action="segment_alloc", addr=1, size=64),
        TraceEntry(action="free_completed", addr=1, size=8),
        TraceEntry(action="oom", addr=5, size=100),
    ]
    h = history(entries)
    assert h.action.tolist() == [ALLOC, OTHER, OTHER, FREE, OOM]
    r = Replay.of(h.addr, h.size, h.action)
    assert r.level.tolist() == [8, 8, 8, 0, 0]
    assert r.free_of[0] == 3


def test_sites_are_ranked_by_bytes_one_row_per_site_and_category() -> None:
    sites = rank_sites(
        [
            ("a", "activations", 4),
            ("a", "gradients", 8),
            ("a", "activations", 6),
            ("b", "other", 1),
        ],
        top=2,
    )
    assert [(s.site, s.category, s.bytes, s.count) for s in sites] == [
        ("a", "activations", 10, 2),
        ("a", "gradients", 8, 1),
    ]


def test_each_source_names_its_categories_from_the_one_vocabulary() -> None:
    assert set(SNAPSHOT_CATEGORIES) | set(PROFILE_CATEGORIES) == set(MEMORY_CATEGORIES)
    assert list(PROFILE_CATEGORIES) == [c for c in MEMORY_CATEGORIES if c in PROFILE_CATEGORIES]
