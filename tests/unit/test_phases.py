"""Phases and modules: built traces with a known forward/backward/optimizer split and a
known module tree (backward on the autograd thread, repeated blocks)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
from test_report_html import figures_of
from test_roofline import A100, MM_DIMS, op_with_kernel

from invariants import assert_diagnosis_invariants, assert_phases_and_modules
from realtraces import real_trace
from tracegen import AUTOGRAD_TID, MODULE, TraceBuilder, phased_training_trace
from wallfinder import Diagnosis, analyze
from wallfinder.analysis import Thresholds, TimeThresholds, diagnose
from wallfinder.trace import load_trace

US = 1e-6


def analysed(b: TraceBuilder, tmp_path: Path) -> Diagnosis:
    d = analyze(b.write(tmp_path / "t.json"))
    assert_diagnosis_invariants(d)
    assert_phases_and_modules(d)
    return d


def test_the_trace_reader_decodes_the_autograd_links(tmp_path: Path) -> None:
    t = load_trace(phased_training_trace(2).write(tmp_path / "t.json.gz"))
    ev = t.events
    mm = ev.name == t.code_of("aten::mm")
    node = ev.name == t.code_of("autograd::engine::evaluate_function: MmBackward0")
    assert sorted(ev.seq[mm].tolist()) == [10, 11, 12, 13]
    assert set(ev.fwd_thread[mm].tolist()) == {0}
    assert sorted(ev.seq[node].tolist()) == [10, 11, 12, 13]
    assert set(ev.fwd_thread[node].tolist()) == {1}
    assert (ev.seq[~(mm | node)] == -1).all()  # absent: NONE


def test_phases_split_each_step_into_its_known_parts(tmp_path: Path) -> None:
    d = analysed(phased_training_trace(5), tmp_path)
    p = d.phases
    assert p is not None
    assert p.basis == "gpu"
    for step in p.steps[1:]:  # the first step's window starts at the trace's start
        assert step.duration_s == pytest.approx(1000 * US)
        exposed = {k: v / US for k, v in step.exposed_s.items() if v}
        assert exposed == pytest.approx(
            {"data_wait": 100, "input_copy": 105, "forward": 325, "backward": 380, "optimizer": 90}
        )
        gpu = {k: v / US for k, v in step.gpu_s.items() if v}
        assert gpu == pytest.approx(
            {"input_copy": 20, "forward": 250, "backward": 300, "optimizer": 50}
        )
    assert sum(p.exposed.values()) == pytest.approx(1.0)
    assert p.gpu_s["backward"] == pytest.approx(300 * US)
    assert not p.unsplit
    joined = "; ".join(p.evidence)
    for seen in ("autograd backward ops (2 per step)", "Optimizer.step#", "DataLoader", "10 of 10"):
        assert seen in joined


def test_backward_kernels_on_the_autograd_thread_go_to_the_module_of_their_forward_op(
    tmp_path: Path,
) -> None:
    d = analysed(phased_training_trace(4), tmp_path)
    m = d.modules
    assert m is not None
    assert m.source == "modules"
    rows = {r.path: r for r in m.rows}
    assert list(rows) == ["Net_0", "Net_0/Block_*", "Net_0/Block_*/Linear_*"]
    net, blocks, linear = rows.values()
    # Two blocks, one row: forward 100 + 150 µs, backward 100 + 200 µs (on another thread).
    assert (blocks.instances, blocks.parent, blocks.depth) == (2, "Net_0", 1)
    assert blocks.forward_s == pytest.approx(250 * US)
    assert blocks.backward_s == pytest.approx(300 * US)
    assert blocks.classes == pytest.approx({"gemm": 550 * US})
    assert blocks.spread is not None
    assert (blocks.spread.count, blocks.spread.outlier) == (2, "Block_1")
    assert (blocks.spread.min_s, blocks.spread.max_s) == pytest.approx((200 * US, 350 * US))
    assert linear.forward_s + linear.backward_s == pytest.approx(550 * US)
    assert net.forward_s == pytest.approx(250 * US)
    # The GEMMs are the modules' only kernels: 550 of the step's 620 µs of device time.
    assert net.share == pytest.approx(550 / 620)
    assert m.unattributed_s == pytest.approx(70 * US)


def test_without_module_records_record_function_ranges_stand_in(tmp_path: Path) -> None:
    d = analysed(phased_training_trace(4, modules=False), tmp_path)
    assert d.modules is not None
    assert d.modules.source == "record_function"
    assert "no module records" in d.modules.note
    (row,) = d.modules.rows  # layers.0 and layers.1: one repeated block
    assert (row.path, row.instances) == ("layers.*", 2)
    assert row.forward_s == pytest.approx(250 * US)
    assert row.backward_s == pytest.approx(300 * US)
    assert row.spread is not None
    assert row.spread.outlier == "layers.1"


def test_the_compilers_own_ranges_are_not_modules(tmp_path: Path) -> None:
    """torch.compile's compiler at work records ranges of its own (Inductor's autotuning,
    Dynamo's `dynamo_timed` stages): a one-off, never a module row beside the model's."""
    b = phased_training_trace(4, modules=False)
    for s in range(4):
        b.annotation(
            "CachingAutotuner.benchmark_all_configs_data: kernel_name=triton_poi_fused_0",
            s * 1000.0 + 140.0,
            50.0,
        )
    d = analysed(b, tmp_path)
    assert d.modules is not None
    assert [r.path for r in d.modules.rows] == ["layers.*"]


def test_a_trace_without_backward_says_what_it_could_not_split(tmp_path: Path) -> None:
    d = analysed(phased_training_trace(4, modules=False, backward=False), tmp_path)
    p = d.phases
    assert p is not None
    assert p.exposed["backward"] == 0.0
    assert p.unsplit
    assert "no autograd backward ops" in p.unsplit[0]
    assert not any(f.id in ("forward-heavy", "backward-heavy") for f in d.findings)


def test_recomputation_inside_the_backward_makes_a_backward_heavy_finding(
    tmp_path: Path,
) -> None:
    d = analysed(phased_training_trace(4, recompute=True, backward_us=(300.0, 400.0)), tmp_path)
    found = {f.id: f for f in d.findings}
    f = found["backward-heavy"]
    assert "re-run inside the backward" in f.evidence
    assert "0.06 ms per step of recomputation" in f.evidence  # two 30 µs re-runs per step
    # The re-run blocks on the autograd thread keep their place in the tree (Net_0/Block_*),
    # and their time is the blocks' backward: 300 + 400 µs of gradients, 2 × 30 of re-runs.
    assert d.modules is not None
    assert [r.path for r in d.modules.rows if r.depth == 0] == ["Net_0"]
    blocks = next(r for r in d.modules.rows if r.path == "Net_0/Block_*")
    assert blocks.backward_s == pytest.approx(760 * US)
    step_s = d.breakdown.per_step_ms["step"] / 1e3
    assert f.share == pytest.approx(60 * US / step_s, rel=1e-3)


def test_a_plain_slow_backward_is_bounded_by_its_excess_over_twice_the_forward(
    tmp_path: Path,
) -> None:
    d = analysed(phased_training_trace(4, backward_us=(300.0, 400.0)), tmp_path)
    f = {f.id: f for f in d.findings}["backward-heavy"]
    assert "no recomputation is visible" in f.evidence
    # Backward 700 µs against forward 250: the bound is 700 − 2 × 250 = 200 µs of the step.
    step_s = d.breakdown.per_step_ms["step"] / 1e3
    assert f.share == pytest.approx(200 * US / step_s, rel=1e-3)


def test_a_forward_stalled_on_the_host_is_forward_heavy(tmp_path: Path) -> None:
    b = phased_training_trace(4)
    for s in range(4):  # an .item() in Block_1: the host blocks 130 µs before its launch
        t0 = s * 1000.0
        b.cpu_op("aten::item", t0 + 282.0, 5.0)
    d = analysed(b, tmp_path)
    # Forward exposed 325 µs against backward 380: not forward-heavy.
    assert "forward-heavy" not in {f.id for f in d.findings}
    slow = phased_training_trace(4, backward_us=(20.0, 30.0))
    for s in range(4):
        slow.cpu_op("aten::item", s * 1000.0 + 282.0, 5.0)
    d = analysed(slow, tmp_path)
    f = {f.id: f for f in d.findings}["forward-heavy"]
    assert "aten::item ×1/step" in f.evidence
    assert f.max_speedup >= 1.0


def test_a_forward_slow_only_from_launching_its_ops_is_left_to_launch_bound(
    tmp_path: Path,
) -> None:
    # The same short backward, no synchronising call in the forward: its idle is the host
    # launching the forward (launch-bound's time), so forward-heavy does not count it again.
    d = analysed(phased_training_trace(4, backward_us=(20.0, 30.0)), tmp_path)
    ids = {f.id for f in d.findings}
    assert "forward-heavy" not in ids
    assert ids & {"launch-bound", "host-work"}


def test_the_optimizer_step_as_a_large_share_is_a_finding(tmp_path: Path) -> None:
    t = load_trace(phased_training_trace(4).write(tmp_path / "t.json"))
    # The optimizer exposes 90 µs of each 1000 µs step: under the default 10%, over 5%.
    assert "optimizer-heavy" not in {f.id for f in diagnose(t).findings}
    low = Thresholds(time=TimeThresholds(optimizer_share=0.05))
    f = {f.id: f for f in diagnose(t, low).findings}["optimizer-heavy"]
    assert "Optimizer.step#SGD.step" in f.evidence
    assert "the bound removes it all" in f.evidence
    assert f.share == pytest.approx(0.09, abs=0.005)
    assert f.max_speedup == pytest.approx(1 / (1 - f.share))
    assert "foreach" in f.fix


def test_a_sync_in_a_module_is_named_with_its_module_and_phase(tmp_path: Path) -> None:
    b = phased_training_trace(4)
    for s in range(4):  # Linear_0 waits for its GEMM (.item()): the GPU idles until 300
        t0 = s * 1000.0
        b.cpu_op("aten::item", t0 + 154.0, 108.0)
        b.sync(t0 + 155.0, 106.0)
    d = analysed(b, tmp_path)
    f = {f.id: f for f in d.findings}["sync-in-step"]
    assert "(mostly in module Net_0/Block_*/Linear_*, the forward phase)" in f.evidence


def test_broken_phases_and_modules_are_caught_by_the_self_check(tmp_path: Path) -> None:
    d = analysed(phased_training_trace(4), tmp_path)
    assert d.phases is not None
    assert d.modules is not None
    steps = list(d.phases.steps)
    steps[2] = msgspec.structs.replace(
        steps[2], exposed_s={**steps[2].exposed_s, "forward": steps[2].exposed_s["forward"] * 2}
    )
    broken = msgspec.structs.replace(d, phases=msgspec.structs.replace(d.phases, steps=steps))
    assert any("phases sum to" in v for v in broken.violations())
    rows = list(d.modules.rows)
    rows[-1] = msgspec.structs.replace(rows[-1], backward_s=1.0)
    bad = msgspec.structs.replace(d, modules=msgspec.structs.replace(d.modules, rows=rows))
    assert any("children take" in v for v in bad.violations())


def test_phases_and_modules_survive_json(tmp_path: Path) -> None:
    d = analysed(phased_training_trace(4), tmp_path)
    data = msgspec.json.decode(d.to_json())
    assert set(data["phases"]["exposed"]) == {
        "data_wait",
        "input_copy",
        "forward",
        "backward",
        "optimizer",
        "communication",
        "other",
    }
    assert data["modules"]["rows"][1]["spread"]["outlier"] == "Block_1"
    assert Diagnosis.from_json(d.to_json()) == d


def test_reports_show_the_phase_bar_and_the_module_table(tmp_path: Path) -> None:
    from wallfinder.report.html import render_html
    from wallfinder.report.markdown import render_markdown
    from wallfinder.report.terminal import render_text

    d = analysed(phased_training_trace(4), tmp_path)
    text = render_text(d, width=100)
    assert "Step by phase" in text
    assert "backward" in text
    assert "Block_*" in text
    assert "Block_1 (2×)" in text
    md = render_markdown(d)
    assert "| backward |" in md
    assert "Block_*" in md
    html = render_html(d)
    assert 'id="plot-phases"' in html
    assert "Time per module" in html
    (icicle,) = figures_of(html)["plot-modules"]["data"]
    assert icicle["type"] == "icicle"
    # Under the root (all the device time) the time in no module, then the modules.
    root = icicle["ids"][0]
    assert icicle["ids"][2:] == ["Net_0", "Net_0/Block_*", "Net_0/Block_*/Linear_*"]
    assert icicle["parents"] == ["", root, root, "Net_0", "Net_0/Block_*"]
    # Each module's own time beside its children (remainder branches): all in the Linears.
    assert icicle["values"] == pytest.approx([0.0, 0.07, 0.0, 0.0, 0.55])


def test_real_trace_phases_match_a_hand_count() -> None:
    # Counted from the JSON by a separate script (kernel → its launch call → inside an
    # autograd evaluate_function range on that thread: backward; an Optimizer range:
    # optimizer; before the step's first backward range: forward): ProfilerStep#101 has
    # 62.83 ms of backward kernels, 30.10 ms of forward and 1.10 ms of optimizer.
    trace = load_trace(real_trace("hta/v100_ns_resolution_rank0.json.gz"))
    d = diagnose(trace)
    assert d.phases is not None
    assert d.phases.gpu_s["backward"] == pytest.approx(62.8e-3, rel=0.01)
    assert d.phases.gpu_s["forward"] == pytest.approx(30.1e-3, rel=0.01)
    assert d.phases.gpu_s["optimizer"] == pytest.approx(1.1e-3, rel=0.02)
    assert_phases_and_modules(d)


def test_real_checkpointed_resnet_collapses_its_blocks() -> None:
    d = diagnose(load_trace(real_trace("tracelens/mi300x_resnet_act_checkpoint.json.gz")))
    assert d.modules is not None
    assert d.modules.source == "modules"
    blocks = [r for r in d.modules.rows if r.path.endswith("/BasicBlock_*")]
    assert blocks
    assert blocks[0].instances == 8
    assert blocks[0].spread is not None
    assert blocks[0].backward_s > 0
    assert_phases_and_modules(d)


def test_threads_are_matched_by_shared_sequence_numbers(tmp_path: Path) -> None:
    # The autograd thread's nodes name forward thread 1, the profiler's id, which is no
    # trace thread id: the forward thread is the one whose ops share their numbers.
    t = load_trace(phased_training_trace(2).write(tmp_path / "t.json"))
    node = t.events.name == t.code_of("autograd::engine::evaluate_function: MmBackward0")
    assert set(np.array(t.ids)[t.events.tid[node]].tolist()) == {AUTOGRAD_TID}
    d = diagnose(t)
    assert d.phases is not None
    assert "4 of 4 backward autograd nodes" in "; ".join(d.phases.evidence)


def test_an_fp32_matmul_finding_names_its_module(tmp_path: Path) -> None:
    b = TraceBuilder(device_name=A100)
    for s in range(3):
        t0 = s * 2100.0
        b.step(s + 1, t0, 2100.0)
        b.host(MODULE + "Linear_0", t0, 20.0, cat="python_function")
        op_with_kernel(
            b,
            "aten::mm",
            MM_DIMS,
            ["float", "float"],
            t0 + 2,
            "volta_sgemm_128x64_nn",
            t0 + 10,
            2000,
        )
    d = analysed(b, tmp_path)
    f = next(x for x in d.findings if x.id == "fp32-matmul")
    assert "CUDA cores (mostly in module Linear_0, the forward phase)" in f.evidence


def test_a_gradient_sync_after_the_backward_that_overlaps_nothing_is_named(
    tmp_path: Path,
) -> None:
    b = phased_training_trace(4)
    for s in range(4):  # a 30 µs all-reduce after the last backward kernel (ends at 830)
        t0 = s * 1000.0
        b.nccl(t0 + 832.0, 30.0, launch_at=t0 + 826.0)
    d = analysed(b, tmp_path)
    f = {f.id: f for f in d.findings}["exposed-comm"]
    assert (
        "; 0.03 ms per step of it (ncclDevKernel_AllReduce_Sum_bf16_RING_LL) between the last "
        "backward kernel and the optimizer step" in f.evidence
    )
    step_s = d.breakdown.per_step_ms["step"] / 1e3
    assert f.share == pytest.approx(30 * US / step_s, rel=1e-3)
    # Under the backward instead, it hides: nothing exposed after the backward to name.
    hidden = phased_training_trace(4)
    for s in range(4):
        hidden.nccl(s * 1000.0 + 600.0, 30.0, launch_at=s * 1000.0 + 590.0)
    assert not any(
        "between the last backward kernel" in f.evidence
        for f in analysed(hidden, tmp_path).findings
    )


def test_a_cpu_run_counts_the_backward_of_another_thread(tmp_path: Path) -> None:
    # Each 1000 µs step on the CPU: the forward's mm 0–200 on the main thread, the backward
    # on the autograd thread 250–750 (the main thread waits, in no op), the optimizer's add_
    # 810–890 inside Optimizer.step.
    b = TraceBuilder(device_name=None)
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.host("aten::mm", t0, 200.0, args={"Sequence number": s, "Fwd thread id": 0})
        node = "autograd::engine::evaluate_function: MmBackward0"
        args = {"Sequence number": s, "Fwd thread id": 1}
        b.host(node, t0 + 250.0, 500.0, tid=AUTOGRAD_TID, args=args)
        b.annotation("Optimizer.step#SGD.step", t0 + 800.0, 100.0)
        b.cpu_op("aten::add_", t0 + 810.0, 80.0)
    d = analysed(b, tmp_path)
    p = d.phases
    assert p is not None
    assert p.basis == "cpu"
    assert p.gpu_s == {}
    # Gaps go to the work that follows: 200–250 to backward, 750–810 to the optimizer,
    # 890–1000 to the next step's forward.
    for step in p.steps[:-1]:
        exposed = {k: v / US for k, v in step.exposed_s.items() if v}
        assert exposed == pytest.approx({"forward": 310, "backward": 550, "optimizer": 140})


def test_without_module_or_record_function_ranges_the_users_call_sites_stand_in(
    tmp_path: Path,
) -> None:
    b = phased_training_trace(5, modules=False)
    b.events = [e for e in b.events if e["name"] not in ("layers.0", "layers.1")]
    for s in range(5):
        t0 = s * 1000.0
        frame = "python_function"
        b.host("/srv/proj/train.py(30): train_step", t0 + 95.0, 870.0, cat=frame)
        # torch's own frame around the model's is not the user's: it is no call site.
        torch_frame = "/usr/lib/python3/site-packages/torch/nn/modules/module.py(1500): _call_impl"
        b.host(torch_frame, t0 + 135.0, 300.0, cat=frame)
        b.host("/srv/proj/model.py(12): attention", t0 + 140.0, 140.0, cat=frame)
        b.host("/srv/proj/model.py(20): mlp", t0 + 280.0, 140.0, cat=frame)
    d = analysed(b, tmp_path)
    m = d.modules
    assert m is not None
    assert m.source == "call sites"
    assert "call sites" in m.note
    rows = {r.path: r for r in m.rows}
    attention = rows["train.py(30): train_step/model.py(12): attention"]
    mlp = rows["train.py(30): train_step/model.py(20): mlp"]
    assert attention.forward_s == pytest.approx(100 * US)
    assert attention.backward_s == pytest.approx(100 * US)  # by the autograd sequence number
    assert mlp.forward_s == pytest.approx(150 * US)
    assert mlp.backward_s == pytest.approx(200 * US)
    assert not any("srv" in p or "proj" in p or "_call_impl" in p for p in rows)
    # A call site marks no forward work: the phases are those of the trace without them.
    p = d.phases
    assert p is not None
    exposed = {k: v / US for k, v in p.steps[-1].exposed_s.items() if v}
    assert exposed == pytest.approx(
        {"data_wait": 100, "input_copy": 105, "forward": 325, "backward": 380, "optimizer": 90}
    )
