"""What `wallfinder diff` calls things: each moved row once, under a name that tells it apart
(template instances of one kernel, an op on the CPU), and the runs by what tells them apart
(their folders, when the files are named alike)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracegen import TraceBuilder
from wallfinder import analyze
from wallfinder.analysis.diff import diff, run_names
from wallfinder.cli import main
from wallfinder.report import render_diff
from wallfinder.units import kernel_labels

# Verbatim from the real traces other/a100pcie_part_forward_bs128 and _bs512: three template
# instances of one ATen kernel, all "elementwise_kernel" once shortened.
ADD_FLOAT = (
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<"
    "at::native::CUDAFunctor_add<float> >(at::TensorIteratorBase&, "
    "at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1}>(int, "
    "at::native::gpu_kernel_impl<at::native::CUDAFunctor_add<float> >(at::TensorIteratorBase&, "
    "at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1})"
)
ADD_HALF = (
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
    "at::native::CUDAFunctor_add<c10::Half> >(at::TensorIteratorBase&, "
    "at::native::CUDAFunctor_add<c10::Half> const&)::{lambda(int)#1}>(int, "
    "at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add<c10::Half> >"
    "(at::TensorIteratorBase&, at::native::CUDAFunctor_add<c10::Half> const&)::{lambda(int)#1})"
)
COPY_HALF = (
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
    "const::{lambda()#10}::operator()() const::{lambda(c10::Half)#1}>(at::TensorIteratorBase&, "
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
    "const::{lambda()#10}::operator()() const::{lambda(c10::Half)#1} const&)::{lambda(int)#1}>"
    "(int, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#10}::operator()() "
    "const::{lambda(c10::Half)#1}>(at::TensorIteratorBase&)::{lambda(int)#1})"
)
UNROLLED = (
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#{}}::operator()() "
    "const::{lambda({})#1}, at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned "
    "int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, "
    "at::native::memory::StoreWithCast<1> >(int)"
)
UNROLLED_HALF = UNROLLED.replace("#{}", "#10").replace("({})", "(c10::Half)")
UNROLLED_FLOAT = UNROLLED.replace("#{}", "#7").replace("({})", "(float)")


def test_template_instances_of_one_kernel_get_labels_that_tell_them_apart() -> None:
    labels = kernel_labels([ADD_FLOAT, ADD_HALF, COPY_HALF, UNROLLED_HALF, UNROLLED_FLOAT])
    assert labels == [
        "at::native::elementwise_kernel<CUDAFunctor_add, float>",
        "at::native::elementwise_kernel<CUDAFunctor_add, Half>",
        "at::native::elementwise_kernel<direct_copy_kernel_cuda, Half>",
        # The lambdas' numbers (#10, #7) are their places in the source: not told.
        "at::native::unrolled_elementwise_kernel<Half>",
        "at::native::unrolled_elementwise_kernel<float>",
    ]


def test_a_kernel_alone_under_its_short_name_keeps_the_short_name() -> None:
    assert kernel_labels([ADD_FLOAT, "volta_sgemm_128x64_nn", ADD_FLOAT]) == [
        "at::native::elementwise_kernel",
        "volta_sgemm_128x64_nn",
        "at::native::elementwise_kernel",
    ]


def test_kernels_whose_words_agree_are_numbered() -> None:
    a = "void k<int, float>(int)"
    b = "void k<float, int>(int)"
    assert kernel_labels([a, b]) == ["k #1", "k #2"]


def two_instances(add_us: float, copy_us: float) -> TraceBuilder:
    """Each 1000 µs step: a GEMM and two instances of ATen's elementwise_kernel."""
    b = TraceBuilder()
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        b.kernel("volta_sgemm_128x64_nn", t0 + 10.0, 300.0, launch_at=t0 + 5.0)
        b.kernel(ADD_HALF, t0 + 320.0, add_us, launch_at=t0 + 6.0)
        b.kernel(COPY_HALF, t0 + 330.0 + add_us, copy_us, launch_at=t0 + 7.0)
    return b


@pytest.fixture
def instances_moved(tmp_path: Path) -> str:
    before = analyze(two_instances(200.0, 100.0).write(tmp_path / "a" / "trace.json"))
    after = analyze(two_instances(50.0, 20.0).write(tmp_path / "b" / "trace.json"))
    return render_diff(diff(before, after), "text", width=120)


def test_diff_tells_template_instances_of_one_kernel_apart(instances_moved: str) -> None:
    moved = instances_moved.split("Moved most", 1)[1]
    # Both are Half: the functor alone tells them apart.
    assert "elementwise_kernel<CUDAFunctor_add>" in moved
    assert "elementwise_kernel<direct_copy_kernel_cuda>" in moved


def test_diff_html_tells_template_instances_of_one_kernel_apart(tmp_path: Path) -> None:
    before = analyze(two_instances(200.0, 100.0).write(tmp_path / "a" / "trace.json"))
    after = analyze(two_instances(50.0, 20.0).write(tmp_path / "b" / "trace.json"))
    page = render_diff(diff(before, after), "html")
    assert "elementwise_kernel&lt;CUDAFunctor_add&gt;" in page
    assert "elementwise_kernel&lt;direct_copy_kernel_cuda&gt;" in page


def cpu_linear(linear_us: float) -> TraceBuilder:
    """A CPU-only run: each 1000 µs step an aten::linear with shapes (costed on the roofline)
    and an aten::relu."""
    b = TraceBuilder(device_name=None)
    for s in range(4):
        t0 = s * 1000.0
        b.step(s + 1, t0, 1000.0)
        dims = [[256, 1024], [1024, 1024], [1024]]
        b.host(
            "aten::linear",
            t0 + 10,
            linear_us,
            args={"Input Dims": dims, "Input type": ["float"] * 3},
        )
        relu = {"Input Dims": [[256, 1024]], "Input type": ["float"]}
        b.host("aten::relu", t0 + 20 + linear_us, 50.0, args=relu)
    return b


def test_an_op_of_a_cpu_run_is_matched_once_not_as_a_cpu_op_and_an_op(tmp_path: Path) -> None:
    # As `demo --compare` showed aten::linear: a "CPU op" row (by name) and an "op" row (by
    # name and shapes), the same time twice.
    before = analyze(cpu_linear(600.0).write(tmp_path / "a.json"))
    after = analyze(cpu_linear(300.0).write(tmp_path / "b.json"))
    assert before.cpu is not None
    assert before.roofline is not None
    x = diff(before, after)
    linear = [m for m in x.moved if m.name == "aten::linear"]
    assert [(m.kind, m.shapes) for m in linear] == [("op", "[[256, 1024], [1024, 1024], [1024]]")]
    assert linear[0].change_s == pytest.approx(-300e-6)
    assert {m.kind for m in x.matches} == {"cpu_op", "op"}
    cpu_ops = next(m for m in x.matches if m.kind == "cpu_op")
    assert cpu_ops.matched == 0  # both ops are listed by shapes


@pytest.mark.parametrize(
    ("before", "after", "names"),
    [
        (
            "/runs/demo/trace_rank0.json",
            "/runs/demo-fixed/trace_rank0.json",
            ("demo/trace_rank0.json", "demo-fixed/trace_rank0.json"),
        ),
        ("/x/a/run/t.json", "/x/b/run/t.json", ("a/run/t.json", "b/run/t.json")),
        ("/traces/v100.json.gz", "/traces/a100.json.gz", ("v100.json.gz", "a100.json.gz")),
        ("t.json", "b/t.json", ("t.json", "b/t.json")),
        ("runs/one", "runs/two/", ("one", "two")),
        # One file twice: its name, never the whole path.
        ("/home/me/t.json", "/home/me/t.json", ("t.json", "t.json")),
    ],
)
def test_runs_are_named_by_the_last_parts_of_their_paths_that_differ(
    before: str, after: str, names: tuple[str, str]
) -> None:
    assert run_names(before, after) == names


def test_diff_header_names_the_runs_folders_when_the_files_are_named_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = two_instances(200.0, 100.0).write(tmp_path / "baseline" / "trace_rank0.json")
    b = two_instances(50.0, 20.0).write(tmp_path / "fused" / "trace_rank0.json")
    assert main(["diff", str(a), str(b)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "baseline/trace_rank0.json → fused/trace_rank0.json" in head
    assert str(tmp_path) not in head
    page = tmp_path / "diff.html"
    assert main(["diff", str(a), str(b), "--format", "html", "-o", str(page)]) == 0
    html = page.read_text()
    assert "<code>baseline/trace_rank0.json</code> → <code>fused/trace_rank0.json</code>" in html
