"""`Trace.names_matching` with `kinds` tests only the names those kinds' rows use (issue 36:
on a trace of long kernel names, a host-range test over every distinct string spent most of
its time on the kernels' names), and what `named` keeps with it is what it kept without."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tracegen import phased_training_trace
from wallfinder.trace import Kind, Trace, load_trace

KINDS = [(Kind.CPU_OP,), (Kind.ANNOTATION, Kind.CPU_OP), (Kind.KERNEL,), (Kind.RUNTIME,)]


def _trace(tmp_path: Path) -> Trace:
    return load_trace(phased_training_trace(3).write(tmp_path / "t.json.gz"))


def test_a_test_of_some_kinds_names_sees_only_their_names(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    for kinds in KINDS:
        seen: list[str] = []
        trace.names_matching(seen.append, kinds)
        used = {trace.strings[int(c)] for k in kinds for c in trace.of_kind(k).name}
        assert used
        assert set(seen) == used
        assert len(seen) == len(used)
        assert len(seen) < len(trace.strings)


def test_the_rows_named_are_those_named_without_kinds(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    tests = [lambda s: "a" in s, lambda s: s.startswith(("aten::", "cuda")), lambda s: True]
    for kinds in KINDS:
        for test in tests:
            some = trace.names_matching(test, kinds)
            every = trace.names_matching(test)
            assert np.all(np.diff(some) > 0)  # sorted, each once
            assert set(some.tolist()) <= set(every.tolist())
            a, b = trace.named(kinds, some), trace.named(kinds, every)
            assert np.array_equal(a.ts, b.ts)
            assert np.array_equal(a.name, b.name)
