"""The step's dependency graph, its critical path, and what-if replay.

One module per stage:

- `model`: the graph (`StepGraph`) and what the stages share (constants, CATEGORIES);
- `graph`: the graph built from the device's ops and the host's runtime calls, with the
  edges the trace's timing shows from `edges`; `cpu`: the graph when the CPU is the device;
- `timing`: replay, the graph re-timed by max-plus scans iterated to the fixed point (or in
  one pass in dependency order, `onepass`), with a what-if's `change` applied;
- `path`: the critical path walked back through the replay, its time by category and its
  wall; `drawn`: its segments on the timeline's step;
- `change`: the what-ifs `--what-if` takes; `lever`: a parallel strategy's lever (more
  microbatches, prefetch, async TP), the work its rule selects and what it takes off the
  graph's nodes; `whatif`: replays on demand and the findings
  and table rows they give; `rank`: a rank's critical path and what-if table;
- `job`: a job's ranks replayed together, joined at their collectives, and its path.
"""

from __future__ import annotations

from wallfinder.analysis.critpath.change import (
    ACCUM,
    ASYNC_TP,
    MICROBATCHES,
    OVERLAP,
    PREFETCH,
    WHAT_IFS,
    Change,
    covers,
    parse_what_if,
)
from wallfinder.analysis.critpath.cpu import cpu_graph
from wallfinder.analysis.critpath.graph import build_graph
from wallfinder.analysis.critpath.job import JobReplay, job_path, job_replay
from wallfinder.analysis.critpath.model import CATEGORIES, MAX_ROUNDS, StepGraph
from wallfinder.analysis.critpath.path import path_shares
from wallfinder.analysis.critpath.rank import critical_path
from wallfinder.analysis.critpath.timing import Timing, replay
from wallfinder.analysis.critpath.whatif import (
    WhatIf,
    consistent_rows,
    with_replay,
)

__all__ = [
    "ACCUM",
    "ASYNC_TP",
    "CATEGORIES",
    "MAX_ROUNDS",
    "MICROBATCHES",
    "OVERLAP",
    "PREFETCH",
    "WHAT_IFS",
    "Change",
    "JobReplay",
    "StepGraph",
    "Timing",
    "WhatIf",
    "build_graph",
    "consistent_rows",
    "covers",
    "cpu_graph",
    "critical_path",
    "job_path",
    "job_replay",
    "parse_what_if",
    "path_shares",
    "replay",
    "with_replay",
]
