"""On a trace with no device kernels, time the main thread spends waiting is not host work:
a device sync is synchronisation (the device's own work, unrecorded, not a fix's gain), a
blocking Python call (a queue's get, poll, sleep) is waiting; and the profiler's own spans
never make their thread the main one."""

from __future__ import annotations

from pathlib import Path

import pytest

from invariants import assert_diagnosis_invariants
from tracegen import TraceBuilder
from wallfinder import analyze
from wallfinder.report import render

MAIN = 4242


def test_a_runtime_only_trace_blocked_in_a_device_sync_is_synchronisation(
    tmp_path: Path,
) -> None:
    # Runtime calls and no kernels: 1000 µs on the main thread, 850 of them blocked in
    # cudaDeviceSynchronize; the profiler's own span covers the whole capture on its thread.
    b = TraceBuilder()
    b.host("PyTorch Profiler (0)", 0.0, 5000.0, cat="Trace", tid=99)
    b.runtime("cudaGetDeviceCount", 0.0, 50.0)
    b.runtime("cudaDeviceSynchronize", 100.0, 850.0)
    b.runtime("cudaGetDeviceProperties_v2", 960.0, 40.0)
    d = analyze(b.write(tmp_path / "t.json"))
    assert_diagnosis_invariants(d)
    assert d.breakdown.basis == "cpu"
    assert d.steps.median_s == pytest.approx(1000e-6)  # the runtime thread, not the span's
    assert d.breakdown.idle_causes["synchronization"] == pytest.approx(0.85)
    assert d.breakdown.idle_causes["host_overhead"] == pytest.approx(0.09)
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "synchronization")
    # The device's work is not recorded: removing the sync would not remove it.
    assert "sync-in-step" not in [f.id for f in d.findings]


def test_a_thread_blocked_in_a_queue_get_is_waiting_not_python(tmp_path: Path) -> None:
    # CPU only. Each 1000 µs step: a 200 µs op, then the loop's Python frame holds a 600 µs
    # SimpleQueue.get (the thread waits for work) and 100 µs of its own Python after it.
    b = TraceBuilder(device_name=None)
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.cpu_op("aten::mm", t0 + 10.0, 200.0)
        b.host("serve.py(40): loop", t0 + 250.0, 720.0, cat="python_function")
        b.host(
            "<built-in method get of _queue.SimpleQueue object at 0x7f00>",
            t0 + 260.0,
            600.0,
            cat="python_function",
        )
    d = analyze(b.write(tmp_path / "t.json"))
    assert_diagnosis_invariants(d)
    causes = d.breakdown.idle_causes
    # The loop's 720 µs less the 600 µs wait under it: 120 µs of Python a step.
    assert causes["host_overhead"] == pytest.approx(0.12)
    # The wait and the 80 µs the trace records nothing in: other.
    assert causes["other"] == pytest.approx(0.68)
    assert d.breakdown.compute == pytest.approx(0.20)


@pytest.mark.parametrize(
    "loop", ["uvloop/__init__.py(96): run", "asyncio/base_events.py(640): run_forever"]
)
def test_an_event_loop_with_nothing_to_run_is_waiting_and_its_callbacks_are_work(
    tmp_path: Path, loop: str
) -> None:
    """An asyncio server's main thread sits in its event loop's run frame: the loop's own
    time, no frame under it, is its wait for the next event (epoll in uvloop's C), as a
    blocking call is; each callback it runs is a frame under it, and is work."""
    b = TraceBuilder(device_name=None)
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.host("cli/serve.py(122): cmd", t0 + 1.0, 998.0, cat="python_function")
        b.host(loop, t0 + 2.0, 996.0, cat="python_function")
        # Two callbacks a step: 150 µs of a request handler, 50 µs of an output handler.
        b.host("app/handlers.py(10): handle", t0 + 100.0, 150.0, cat="python_function")
        b.host("app/output.py(20): output_handler", t0 + 600.0, 50.0, cat="python_function")
    d = analyze(b.write(tmp_path / "t.json"))
    assert_diagnosis_invariants(d)
    causes = d.breakdown.idle_causes
    # The callbacks' 200 µs are Python work; the loop's other 796 µs are its wait, with the
    # 4 µs its enclosing frames hold alone (serve's and the step's edges).
    assert causes["host_overhead"] == pytest.approx(0.202, abs=0.003)
    assert causes["other"] == pytest.approx(0.798, abs=0.003)
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "other")
    # Said as the wait it is, not as time the trace does not explain.
    assert "waiting or untraced time" in d.verdict.reason
    assert "OVERHEAD wall — waiting or untraced" in render(d, "text")
