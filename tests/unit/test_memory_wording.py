"""What the memory report says about what it matched: the frames an optimizer's state was
recognised by, and when the peak came, in time a person reads (not the clock's epoch)."""

from __future__ import annotations

from typing import Any

from test_memory_snapshot import PARAMETER, TRAIN, Builder, GiB, report_of

from wallfinder.report.memory import render_memory_markdown, render_memory_text

# As the real snapshot memory/cs336_ctx128_fullstep.pickle records it: the user's own
# optimizer (a torch.optim.Optimizer subclass) allocates its state in its `step`, which runs
# inside torch.optim's Optimizer.step wrapper.
USER_STEP = {"filename": "/home/u/project/cs336_basics/optimizers.py", "line": 82, "name": "step"}
WRAPPER = {
    "filename": "/venv/lib/python3.13/site-packages/torch/optim/optimizer.py",
    "line": 493,
    "name": "wrapper",
}
USER_OPTIMIZER = [USER_STEP, WRAPPER, TRAIN]
EPOCH_US = 1_748_730_220_159_619
"""A real snapshot's time stamps are microseconds since the epoch."""


def user_optimizer(start_us: int = EPOCH_US) -> Builder:
    b = Builder()
    b.time = start_us
    b.alloc(2 * GiB, PARAMETER)
    b.alloc(4 * GiB, USER_OPTIMIZER)
    b.alloc(4 * GiB, USER_OPTIMIZER)
    return b


def optimizer_finding(r: Any) -> Any:
    return next(f for f in r.findings if f.id == "memory-optimizer-state")


def test_optimizer_state_evidence_names_the_users_step_it_was_found_under() -> None:
    f = optimizer_finding(report_of(user_optimizer()))
    # Said by what matched: the stacks run through torch.optim's Optimizer.step, and the
    # allocations are the user's optimizer's (its call site named), not "torch/optim/ frames".
    assert "torch/optim/ frames" not in f.evidence
    assert "optimizer's step" in f.evidence
    assert "…/cs336_basics/optimizers.py:82 (step)" in f.evidence
    assert "8.00 GiB" in f.evidence


def test_the_peak_is_placed_in_time_from_the_historys_start() -> None:
    r = report_of(user_optimizer())
    (peak,) = r.peaks
    # Three allocations 10 µs apart: the last is the peak, 20 µs after the first.
    assert peak.time_s is not None
    assert abs(peak.time_s - 20e-6) < 1e-12
    text = render_memory_text(r, width=200)
    assert str(EPOCH_US)[:10] not in text
    assert "20.0 µs into the recorded history" in text
    assert "20.0 µs into the recorded history" in render_memory_markdown(r)


def test_a_history_without_time_stamps_gives_no_time() -> None:
    b = user_optimizer()
    for entry in b.trace:
        entry.pop("time_us")
    r = report_of(b)
    assert r.peaks[0].time_s is None
    assert "into the recorded history" not in render_memory_text(r, width=200)
