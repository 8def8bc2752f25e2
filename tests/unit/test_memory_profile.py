"""Memory from a trace's `[memory]` events: peak, categories, growth, churn, findings."""

from __future__ import annotations

from pathlib import Path

from tracegen import TraceBuilder, training_trace
from wallfinder import Options, Thresholds, analyze
from wallfinder.analysis import MemoryThresholds
from wallfinder.diagnosis import PROFILE_CATEGORIES, Diagnosis

MiB = 1 << 20
GiB = 1 << 30
PERIOD = 420.0  # training_trace's step: 100 µs loader + 2 x (150 µs kernel + 10 µs)
AUTOGRAD_TID = 4343


class Allocator:
    """Writes `[memory]` events with the totals a caching allocator would report."""

    def __init__(self, b: TraceBuilder, baseline: int, reserved: int) -> None:
        self.b, self.total, self.reserved = b, baseline, reserved
        self.next_addr = 0x7F00_0000_0000

    def alloc(self, at: float, nbytes: int, *, tid: int | None = None) -> int:
        addr, self.next_addr = self.next_addr, self.next_addr + nbytes
        self.total += nbytes
        self.b.memory(at, addr, nbytes, self.total, self.reserved, tid=tid)
        return addr

    def free(self, at: float, addr: int, nbytes: int, *, tid: int | None = None) -> None:
        self.total -= nbytes
        self.b.memory(at, addr, -nbytes, self.total, self.reserved, tid=tid)


def training_with_memory(
    steps: int = 6,
    *,
    baseline: int = 10 * MiB,
    reserved: int = 64 * MiB,
    leak: int = 0,
    churn: bool = False,
    backward: bool = True,
) -> TraceBuilder:
    """training_trace's steps with a forward op, a backward pass on the autograd thread and
    an optimizer step, allocating: a 1 MiB activation (freed in backward) and a 256 KiB
    temporary in forward, a 512 KiB gradient in backward (freed by the next zero_grad), a
    128 KiB backward temporary, and 2 MiB of optimizer state in the first step only.
    `leak` bytes are allocated in each forward and never freed. Without `backward`, each
    step is a forward pass only (inference): the activation is freed at its end."""
    b = training_trace(steps)
    mem = Allocator(b, baseline, reserved)
    grad: int | None = None
    for s in range(steps):
        t0 = s * PERIOD
        b.cpu_op("aten::linear", t0 + 110, 40)
        act = mem.alloc(t0 + 112, MiB)
        tmp = mem.alloc(t0 + 114, 256 * 1024)
        mem.free(t0 + 116, tmp, 256 * 1024)
        if leak:
            mem.alloc(t0 + 118, leak)
        if not backward:
            mem.free(t0 + 300, act, MiB)
            continue
        b.cpu_op(
            "autograd::engine::evaluate_function: AddmmBackward0", t0 + 160, 90, tid=AUTOGRAD_TID
        )
        if churn:
            mem.reserved += 2 * MiB
        grad = mem.alloc(t0 + 165, 512 * 1024, tid=AUTOGRAD_TID)
        btmp = mem.alloc(t0 + 170, 128 * 1024, tid=AUTOGRAD_TID)
        mem.free(t0 + 200, act, MiB, tid=AUTOGRAD_TID)
        mem.free(t0 + 210, btmp, 128 * 1024, tid=AUTOGRAD_TID)
        if churn:
            mem.reserved -= 2 * MiB
        b.annotation("Optimizer.step#SGD.step", t0 + 300, 40)
        if s == 0:
            mem.alloc(t0 + 310, 2 * MiB)
        b.annotation("Optimizer.zero_grad#SGD.zero_grad", t0 + 350, 20)
        mem.free(t0 + 355, grad, 512 * 1024)
    return b


def diagnose(b: TraceBuilder, tmp_path: Path) -> Diagnosis:
    return analyze(b.write(tmp_path / "t.json"))


def test_the_peak_is_split_into_categories_by_when_blocks_live(tmp_path: Path) -> None:
    d = diagnose(training_with_memory(), tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    assert m.device == "cuda:0"
    # The optimizer state exists from the first optimizer step: the peak (first reached) is
    # in step 2's backward pass, with the gradient and the backward temporary allocated and
    # the activation not yet freed.
    assert m.peak_step == "step 2"
    assert m.peak_phase == "backward"
    assert m.peak_op == "autograd::engine::evaluate_function: AddmmBackward0"
    assert m.categories == {
        "parameters": 0,
        "before_trace": 10 * MiB,
        "activations": MiB,
        "retained": 0,
        "gradients": 512 * 1024,
        "optimizer_state": 2 * MiB,
        "temporaries": 128 * 1024,
        "other": 0,
    }
    assert list(m.categories) == list(PROFILE_CATEGORIES)
    assert m.peak_allocated == sum(m.categories.values())
    assert m.before_trace == 10 * MiB
    assert m.largest[0].bytes == 2 * MiB
    assert m.largest[0].category == "optimizer_state"
    assert m.largest[0].phase == "optimizer"
    assert not m.leak
    assert m.growth_per_step == 0
    assert [s.start_allocated for s in m.steps][1:] == [10 * MiB + 2 * MiB] * 5
    # No Python stacks: call sites are ops, and the notes say how to get source lines.
    assert {s.site for s in m.sites} >= {"aten::linear"}
    assert any("with_stack" in n for n in d.memory.notes)


def test_blocks_made_before_the_first_step_and_kept_are_parameters(tmp_path: Path) -> None:
    # The allocator's totals count the 8 MiB the model takes from the start.
    b = training_with_memory(baseline=8 * MiB)
    # The model moved to the device before the loop, and a scratch block freed in step 1.
    b.memory(-80, 0x10_0000, 8 * MiB, 8 * MiB, 64 * MiB)
    b.memory(-60, 0x20_0000, MiB, 9 * MiB, 64 * MiB)
    b.memory(30, 0x20_0000, -MiB, 8 * MiB, 64 * MiB)
    d = diagnose(b, tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    assert m.categories["parameters"] == 8 * MiB
    assert m.categories["before_trace"] == m.categories["other"] == 0
    assert m.categories["gradients"] == 512 * 1024
    assert m.peak_allocated == sum(m.categories.values())


def test_a_forward_only_run_has_no_gradients_and_no_leak(tmp_path: Path) -> None:
    d = diagnose(training_with_memory(backward=False), tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    assert m.categories["gradients"] == 0
    assert m.peak_phase == "forward"
    assert not m.leak
    assert [s.start_allocated for s in m.steps] == [10 * MiB] * 6


def test_a_forward_only_run_keeping_outputs_is_a_leak(tmp_path: Path) -> None:
    d = diagnose(training_with_memory(leak=MiB, backward=False), tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    assert m.leak
    assert m.categories["gradients"] == 0
    assert m.leak_sites[0].steps >= 4


def test_gradients_held_into_the_next_step_are_not_a_leak(tmp_path: Path) -> None:
    """Gradients set to None by the next step's zero_grad: each step's start holds the last
    step's gradients, the same amount every time."""
    b = training_trace(6)
    mem = Allocator(b, 10 * MiB, 64 * MiB)
    grad: int | None = None
    for s in range(6):
        t0 = s * PERIOD
        b.annotation("Optimizer.zero_grad#SGD.zero_grad", t0 + 102, 4)
        if grad is not None:
            mem.free(t0 + 103, grad, 4 * MiB)
        b.cpu_op("aten::linear", t0 + 110, 40)
        act = mem.alloc(t0 + 112, MiB)
        b.cpu_op(
            "autograd::engine::evaluate_function: AddmmBackward0", t0 + 160, 90, tid=AUTOGRAD_TID
        )
        grad = mem.alloc(t0 + 165, 4 * MiB, tid=AUTOGRAD_TID)
        mem.free(t0 + 200, act, MiB, tid=AUTOGRAD_TID)
        b.annotation("Optimizer.step#SGD.step", t0 + 300, 40)
    d = diagnose(b, tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    assert [s.start_allocated for s in m.steps][1:] == [14 * MiB] * 5
    assert not m.leak
    assert m.leak_sites == []
    assert m.categories["gradients"] == 4 * MiB


def test_capacity_comes_from_the_datasheet_else_the_trace(tmp_path: Path) -> None:
    d = diagnose(training_with_memory(), tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    assert m.capacity == 80 * GiB
    assert m.capacity_source is not None
    assert m.capacity_source.startswith("datasheet")
    b = training_with_memory()
    b.device_name = "Some Future Accelerator"
    d = diagnose(b, tmp_path)
    assert d.memory is not None
    assert d.memory.devices[0].capacity == 85 * GiB  # the builder's totalGlobalMem
    assert d.memory.devices[0].capacity_source == "trace deviceProperties"


def test_memory_rising_at_every_step_start_is_a_leak_with_its_site(tmp_path: Path) -> None:
    d = diagnose(training_with_memory(leak=MiB), tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    assert m.leak
    assert m.growth_per_step == MiB
    assert m.leak_sites[0].site == "aten::linear"
    assert m.leak_sites[0].bytes >= 4 * MiB
    assert m.leak_sites[0].steps >= 4
    # At the peak (the last step's backward pass), the blocks of the earlier steps are kept.
    assert m.peak_step == "step 6"
    assert m.categories["retained"] == 5 * MiB
    assert m.categories["activations"] == MiB + MiB  # this step's, and its leaked block
    leak = next(f for f in d.memory.findings if f.id == "memory-leak")
    assert leak.saving_bytes == m.growth_per_step * (len(m.steps) - 1)
    assert "1.00 MiB per step" in leak.evidence
    assert "full in about" in leak.evidence  # a capacity is known: when it runs out


def test_a_small_steady_rise_is_not_a_leak(tmp_path: Path) -> None:
    d = diagnose(training_with_memory(leak=512), tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    assert m.growth_per_step == 512
    assert not m.leak
    assert "memory-leak" not in {f.id for f in d.memory.findings}


def test_reserved_memory_changing_every_step_is_churn(tmp_path: Path) -> None:
    d = diagnose(training_with_memory(churn=True), tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    assert m.steady_reserved_changes_per_step == 2.0
    assert m.reserved_grows == m.reserved_shrinks == 6
    assert "memory-churn" in {f.id for f in d.memory.findings}


def test_reserved_far_above_allocated_is_fragmentation_with_its_bound(tmp_path: Path) -> None:
    d = diagnose(training_with_memory(reserved=60 * GiB), tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    f = next(f for f in d.memory.findings if f.id == "memory-fragmentation")
    assert f.saving_bytes == 60 * GiB - m.peak_allocated
    assert "expandable_segments" in f.fix


def test_near_capacity_state_heavy_memory_suggests_offload_or_sharding(tmp_path: Path) -> None:
    b = training_with_memory(baseline=70 * GiB, reserved=78 * GiB)
    d = diagnose(b, tmp_path)
    assert d.memory is not None
    ids = {f.id for f in d.memory.findings}
    assert "memory-offload" in ids
    assert "memory-activations" not in ids  # 1 MiB of 70 GiB
    peak = next(f for f in d.findings if f.id == "memory-peak")
    assert "step 2, backward" in peak.evidence
    b.rank, b.world_size = 0, 8
    d = diagnose(b, tmp_path)
    assert d.memory is not None
    shard = next(f for f in d.memory.findings if f.id == "memory-shard-state")
    state = sum(
        d.memory.devices[0].categories[c] for c in ("before_trace", "optimizer_state", "gradients")
    )
    assert shard.saving_bytes == int(state * 7 / 8)


def test_activation_heavy_memory_gets_checkpointing_and_micro_batch(tmp_path: Path) -> None:
    d = diagnose(training_with_memory(baseline=0), tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    findings = {f.id: f for f in d.memory.findings}
    # Activations: 1 MiB of 3.625 MiB at the peak, under the 40% threshold with the 2 MiB of
    # optimizer state; no finding.
    assert m.categories["activations"] == MiB
    assert "memory-activations" not in findings
    b = training_trace(4)
    mem = Allocator(b, 0, 48 * GiB)  # over half the H100's 80 GiB: memory is the limit
    for s in range(4):
        t0 = s * PERIOD
        b.cpu_op("aten::linear", t0 + 110, 40)
        act = mem.alloc(t0 + 112, 8 * MiB)
        b.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 160, 90)
        tmp = mem.alloc(t0 + 165, 2 * MiB)
        mem.free(t0 + 170, tmp, 2 * MiB)
        mem.free(t0 + 200, act, 8 * MiB)
    d = diagnose(b, tmp_path)
    assert d.memory is not None
    findings = {f.id: f for f in d.memory.findings}
    assert findings["memory-activations"].saving_bytes == 8 * MiB
    assert findings["memory-micro-batch"].saving_bytes == 5 * MiB  # (8 + 2) / 2
    # No recorded input types: nothing says the activations are fp32.
    assert "memory-bf16" not in findings


def test_memory_well_under_capacity_gets_no_fix_that_costs_time(tmp_path: Path) -> None:
    b = training_trace(4)
    mem = Allocator(b, 0, 64 * MiB)
    for s in range(4):
        t0 = s * PERIOD
        b.cpu_op("aten::linear", t0 + 110, 40)
        act = mem.alloc(t0 + 112, 8 * MiB)
        b.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 160, 90)
        mem.free(t0 + 200, act, 8 * MiB)
    d = diagnose(b, tmp_path)
    assert d.memory is not None
    assert d.memory.devices[0].categories["activations"] == 8 * MiB
    assert d.memory.findings == []
    assert any("memory is not the limit" in n for n in d.memory.notes)


def test_timeline_keeps_the_peak_and_is_bounded(tmp_path: Path) -> None:
    d = diagnose(training_with_memory(steps=40), tmp_path)
    assert d.memory is not None
    m = d.memory.devices[0]
    times = [p.t_s for p in m.timeline]
    assert times == sorted(times)
    assert len(m.timeline) <= 300 + 3
    assert max(p.allocated for p in m.timeline) == m.peak_allocated
    peak = next(p for p in m.timeline if p.allocated == m.peak_allocated)
    assert sum(peak.categories.values()) == m.peak_allocated


def test_cpu_memory_counts_only_blocks_allocated_in_the_trace(tmp_path: Path) -> None:
    b = TraceBuilder(device_name=None)
    for s in range(4):
        t0 = s * 100.0
        b.step(s + 1, t0, 100)
        b.cpu_op("aten::mm", t0 + 10, 50)
        # The CPU's own totals count blocks of earlier profiling sessions: ignored.
        b.memory(t0 + 20, 0x1000, 4096, 10 * MiB + 4096, 0, device_type=0)
        b.memory(t0 + 30, 0x9000, -8192, 10 * MiB, 0, device_type=0)  # an earlier block
        b.memory(t0 + 40, 0x1000, -4096, 10 * MiB - 8192, 0, device_type=0)
    d = diagnose(b, tmp_path)
    assert d.device.kind == "cpu"
    assert d.memory is not None
    m = d.memory.devices[0]
    assert m.device == "cpu"
    assert m.peak_allocated == 4096
    assert m.before_trace == 0
    assert m.capacity is None
    assert m.peak_op == "aten::mm"
    assert any("only host memory allocated while it records" in n for n in d.memory.notes)


def test_traces_without_usable_memory_events_have_no_memory_profile(tmp_path: Path) -> None:
    assert diagnose(training_trace(3), tmp_path).memory is None
    b = training_trace(3)
    b.events.append(
        {
            "ph": "i",
            "cat": "cpu_instant_event",
            "name": "[memory]",
            "pid": b.pid,
            "tid": b.tid,
            "ts": 5.0,
            "args": {"Device Id": 0},
        }
    )
    assert diagnose(b, tmp_path).memory is None


def test_the_memory_profile_round_trips_through_json(tmp_path: Path) -> None:
    d = diagnose(training_with_memory(leak=MiB), tmp_path)
    again = Diagnosis.from_json(d.to_json())
    assert again.memory == d.memory


def test_call_sites_keep_no_machine_folders(tmp_path: Path) -> None:
    script = tmp_path / "project" / "train.py"  # an absolute path on this machine
    b = training_trace(3)
    mem = Allocator(b, 0, 64 * MiB)
    for s in range(3):
        t0 = s * PERIOD
        b.host(f"{script}(12): main", t0 + 105, 50, cat="python_function")
        b.cpu_op("aten::linear", t0 + 110, 40)
        mem.free(t0 + 130, mem.alloc(t0 + 112, MiB), MiB)
    d = diagnose(b, tmp_path)
    assert d.memory is not None
    assert [s.site for s in d.memory.devices[0].sites] == ["…/project/train.py(12): main"]
    assert str(tmp_path) not in d.to_json()


def test_memory_thresholds_come_from_the_options(tmp_path: Path) -> None:
    path = training_with_memory(churn=True).write(tmp_path / "t.json")
    calm = Thresholds(memory=MemoryThresholds(churn_per_step=3.0))  # the trace has 2 a step
    d = analyze(path, Options(thresholds=calm))
    assert d.memory is not None
    assert d.memory.devices[0].steady_reserved_changes_per_step == 2.0
    assert "memory-churn" not in {f.id for f in d.memory.findings}


def test_totals_that_disagree_with_the_events_still_split_the_peak(tmp_path: Path) -> None:
    # Found by the structure fuzzer: events missing from a trace leave the allocator's total
    # and the replayed blocks apart. Categories are a split of the allocator's peak: what it
    # counts but no event shows is `other`; what events show but it does not count is taken
    # from the least certain categories; an impossible negative total is not a usable event.
    b = training_trace(3)
    b.memory(10.0, 0x1000, 1 * MiB, 0, 8 * MiB)  # a block the allocator's total does not count
    b.memory(500.0, 0x2000, 1 * MiB, 5 * MiB, 8 * MiB)  # 4 MiB counted that no event shows
    b.memory(600.0, 0x3000, 1 * MiB, -1, 8 * MiB)
    d = analyze(b.write(tmp_path / "t.json"))
    d.self_check()
    assert d.memory is not None
    (device,) = d.memory.devices
    assert device.events == 2
    assert device.peak_allocated == 5 * MiB
    assert sum(device.categories.values()) == 5 * MiB
    assert device.categories["other"] >= 3 * MiB
    assert any("categories are partial" in note for note in d.memory.notes)
    for point in device.timeline:
        assert sum(point.categories.values()) == point.allocated
