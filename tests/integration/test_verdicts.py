"""The verdict of every shared real trace, judged by hand once and then pinned.

Each row is what `wallfinder analyze PATH --format json` says of one trace in
../shared/traces (MANIFEST.md there): `verdict.wall`, `verdict.cause` (the category the
headline names, not its words or figures) and `findings[0].id` (None: no finding). Each was
read against the trace's breakdown, its kernels and the idle causes behind the headline, and
the comment above it says why it is right. A row judged wrong keeps the verdict it should
give and is marked xfail(strict=True) with the reason: fixing the analysis turns it into a
failure to unmark. A change to the analysis that moves a row is a change to review here,
with the trace in hand, not a number to copy.

The figures quoted in the comments are shares of the steady step, as the diagnosis gave them
when the rows were judged; the rows assert only the categories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from realtraces import TRACES, real_trace
from wallfinder import Diagnosis, analyze

_diagnosed: dict[Path, Diagnosis] = {}


def diagnosis(relative: str) -> Diagnosis:
    """Each trace (or job folder) is analysed once per session, as the CLI does."""
    path = real_trace(relative)
    if path not in _diagnosed:
        _diagnosed[path] = analyze(path)
    return _diagnosed[path]


def row(relative: str, wall: str, cause: str, top: str | None, *, wrong: str | None = None) -> Any:
    """One judged trace; `wrong`: why its verdict was judged wrong (the row then holds the
    verdict the trace calls for, and fails until the analysis gives it)."""
    marks = [pytest.mark.xfail(strict=True, reason=wrong)] if wrong else []
    return pytest.param(relative, wall, cause, top, marks=marks, id=relative)


VERDICTS = [
    # --- HolisticTraceAnalysis -------------------------------------------------------------
    # Rank 0 of 16 (NCCL SendRecv, Adam): the GPU computes 17% of the step and sits idle 64%
    # with its next work already queued (the waits end at device memsets launched a median
    # 130 ms earlier, not at the host); exposed communication, next, is 15%.
    row("hta/a100-80gb_16rank_rank0.json.gz", "overhead", "dependency_wait", "dependency-wait"),
    # Rank 3 of 8 (embedding tables, NCCL): compute 60%; exposed communication 19% (SendRecv
    # and all-reduce with nothing beside them) beats host overhead 9% and copies 4%.
    row("hta/a100_8rank_control_rank0.json.gz", "overhead", "comm_exposed", "exposed-comm"),
    # AlexNet, no step markers: 40 s of context and cuDNN set-up trimmed; in the 183 ms left
    # the GPU computes 5%, the host runs its ops and Python between launches 54% (the rest is
    # 76 ms of cudaFree after the last kernel, which nothing ties to a wait).
    row("hta/a100_alexnet.json.gz", "overhead", "host_overhead", "host-work"),
    # One 3 ms step of four tiny kernels and a copy: the host is in aten::ones/aten::empty
    # (2.2 ms) while the GPU idles; the syncs the trace is about cost 1% (the spin kernel
    # keeps them short).
    row("hta/a100_cuda_event_sync.json.gz", "overhead", "host_overhead", "host-work"),
    # 900 kernels a step, median 16 µs, launched 1.8 µs before they start (a shallow queue):
    # the GPU waits for the host's CPU ops 67% of the step; comm 6%.
    row("hta/a100_nccl_data.json.gz", "overhead", "host_overhead", "launch-bound"),
    # One 2 µs Triton kernel in a 1.36 ms step: the rest is the host getting to it.
    row("hta/a100_triton_example.json.gz", "overhead", "host_overhead", "host-work"),
    # CPU-only rank 34 of 300: the main thread records nothing inside its 210 ms step, while
    # gloo all-reduces run on gloo's two threads for 173 ms of it (82%).
    # The main thread records nothing while they run and waits for each (every cycle is the
    # all-reduce plus ~40 ms), so they are exposed communication (85% of the step with both
    # threads' union), with no recorded compute to hide them behind (the bound is 1.00x).
    row("hta/cpu_only_rank34.json.gz", "overhead", "comm_exposed", "exposed-comm"),
    # Two steps on an MI250: the first launches load code (70% of the time, start-up, set
    # aside); of the rest the host between launches is 59% (18% of the whole), compute 4%.
    row("hta/mi250_minitoy_train.json.gz", "overhead", "host_overhead", "launch-bound"),
    # MTIA (no CUDA kernels): the CPU side, 1512 eager calls a step with no op computing
    # 10 µs: Python between ops 43%, op time 37%, collectives 20%.
    row("hta/mtia_rank0.json.gz", "overhead", "host_overhead", "launch-bound"),
    # Rank 1 of 2: exposed copies 13% (DtoD and pinned HtoD memcpy, 93 + 67 ms over the
    # steps) beat exposed communication 10%; compute 74%. Steps vary (CV 12%) but the slow
    # steps' cost, 6%, is smaller than either loss.
    row("hta/v100_2rank_test_rank0.json.gz", "overhead", "copy_exposed", "exposed-copies"),
    # 2020 NCCL kernels: the host between launches 28% (+7% launch latency) beats exposed
    # communication 21%; compute 36%.
    row("hta/v100_nccl_df_index_resolver.json.gz", "overhead", "host_overhead", "launch-bound"),
    # A DDP ResNet in fp32: busy 97%, convolutions and GEMMs 64% of it; no shapes, so how near
    # peak is unknown; the largest gain left is fusing the pointwise chains (10%).
    row(
        "hta/v100_ns_resolution_rank0.json.gz",
        "compute",
        # Its convolutions carry no shapes: their bound is unknown, as a GEMM's (issue 33).
        "matmul-bound (GEMM bound unknown: no shapes)",
        "fusable-pointwise",
    ),
    # Two ranks of a 128-rank job, analysed as one job: idle with work queued 32% (the waits
    # end at SendRecv and FP8 dequantise kernels launched 50 ms before they start), exposed
    # communication 27%, compute 17%.
    row("hta/sampled_128rank_job", "overhead", "dependency_wait", "dependency-wait"),
    # --- Nsight Systems ----------------------------------------------------------------------
    # Llama 3 inference demo: over the 0.77 s capture the GPU computes 3%; the host's Python
    # and ops between launches are 93% of it.
    row("nsys/llama3_inference_demo.sqlite", "overhead", "host_overhead", "host-work"),
    # --- other projects ----------------------------------------------------------------------
    # Particle transformer forward, its first GPU run: start-up trimmed (91%); busy 96%, the
    # GEMMs skinny (all of them bandwidth-bound), so memory-bound work: elementwise 28% just
    # above copies 27% and norms 20%.
    row(
        "other/a100pcie_part_first_gpu_run.json.gz", "bandwidth", "elementwise", "fusable-pointwise"
    ),
    # The same at batch 128: busy 81%, GEMMs 16% and all streaming; elementwise 29% leads.
    row(
        "other/a100pcie_part_forward_bs128.json.gz", "bandwidth", "elementwise", "fusable-pointwise"
    ),
    # At batch 2 the kernels are too short to keep the GPU busy (15%): host overhead 51% and
    # launch latency 15%.
    row("other/a100pcie_part_forward_bs2.json.gz", "overhead", "host_overhead", "launch-bound"),
    # At batch 512: as the first run (busy 96%, streaming GEMMs, elementwise 28% leads).
    row(
        "other/a100pcie_part_forward_bs512.json.gz", "bandwidth", "elementwise", "fusable-pointwise"
    ),
    # CPU inference of an image classifier: ops 87% of the time, 80% of it convolutions and
    # matmuls; no CPU peak known to measure them against.
    row(
        "other/cpu_image_classifier_inference.json.gz",
        "compute",
        "matmul-bound (how near peak: unknown)",
        "launch-bound",
    ),
    # vLLM's front-end process (no device work): its main thread sits 23.86 s of 23.91 s
    # inside uvloop's run with 0.05 s of Python recorded under it; the pool threads block in
    # SimpleQueue.get: the process waits for the engine, it is not busy. The loop's own time
    # (no frame under it) is its wait for the next event, as a blocking call is.
    row(
        "other/gb10_vllm_frontend_cpu.json.gz",
        "overhead",
        "other",
        None,
    ),
    # Runtime calls and no kernels: the host spends 185 ms of the 211 ms window blocked in
    # cudaDeviceSynchronize, waiting for GPU work the profiler did not record.
    # No finding: the sync waits for GPU work the trace lacks, which removing it would not
    # remove (the verdict's confidence says the kernels were not recorded).
    row("other/rtx3090_runtime_only.json.gz", "overhead", "synchronization", None),
    # No kernels recorded: the CPU side is busy 100%, aten::randn 80% and aten::to 20%, no
    # matmul: by the design's rule (busy, not in matmuls) the bandwidth wall, elementwise.
    row("other/rtx4060_no_kernels_2steps.json.gz", "bandwidth", "elementwise", None),
    # PINNs on the CPU (the GPU never used): busy 98%; GEMMs 63% of it but a quarter of that
    # streaming, so 47% compute-bound against 53% memory-bound (tanh and autograd pointwise).
    row("other/v100_pinns_no_gpu_activity.json.gz", "bandwidth", "elementwise", None),
    # --- param -------------------------------------------------------------------------------
    # Linear layers, steps from the optimizer: busy 37%; the host between launches 40% and
    # launch latency 13% of each step.
    row("param/rtx2080ti_linear.json.gz", "overhead", "host_overhead", "launch-bound"),
    # ResNet with a single-process DataLoader: the GPU waits for the next batch 49% of a step.
    row("param/rtx2080ti_resnet.json.gz", "overhead", "data_loading", "data-loading"),
    # --- TraceLens ---------------------------------------------------------------------------
    # Eager decode on a B200: busy 10%; host overhead 69% and launch latency 11%; the host's
    # wait in collectives 6%.
    row("tracelens/b200_eager_rank0.json.gz", "overhead", "host_overhead", "launch-bound"),
    # GPU events only, a bf16 CNN's training step: busy 89%, convolutions 30% of it; batch
    # norm kernels 27% lead the memory-bound rest.
    row("tracelens/mi210_gpu_only.json.gz", "bandwidth", "normalization", "fusable-pointwise"),
    # Ten small norm layers: the first round's code loading set aside; then the host between
    # tiny kernels 69% and launch latency 19%.
    row(
        "tracelens/mi300x_normalization_layers.json.gz", "overhead", "host_overhead", "launch-bound"
    ),
    # Activation checkpointing on 8 MI300X: RCCL kernels with nothing beside them 62% of the
    # step, compute 34%.
    row(
        "tracelens/mi300x_resnet_act_checkpoint.json.gz", "overhead", "comm_exposed", "exposed-comm"
    ),
    # SGLang decode step: one kernel (resolve_future_token_ids) waits 463 ms after its launch
    # while the host blocks in a copy: the GPU idles 98% with work queued on an event the
    # trace does not hold (the overlap scheduler's previous batch).
    row(
        "tracelens/mi300x_sglang_qwen3-8b_decode.json.gz",
        "overhead",
        "dependency_wait",
        "dependency-wait",
    ),
    # torch.compile'd block: busy 97%, GEMMs and attention 93% of it, at 36% of their roof.
    row(
        "tracelens/mi300x_torch_compile_triton.json.gz",
        "compute",
        "below peak: precision/shape/kernel",
        "matmul-below-roof",
    ),
    # vLLM decode replaying CUDA graphs: busy 56%; idle with work queued 41% (a DtoD copy
    # launched 7.7 ms before it starts); the host between replays 3%.
    row(
        "tracelens/vllm_decode_cudagraph_execution.json.gz",
        "overhead",
        "dependency_wait",
        "dependency-wait",
    ),
]
"""Each: trace or job folder, verdict.wall, verdict.cause, findings[0].id, judged by hand."""

NOT_DIAGNOSED = {
    "other/empty_trace.json": "records no activity: one clear error "
    "(test_real_traces.test_a_trace_that_recorded_nothing_is_one_clear_error)",
}
"""Shared traces with no verdict to judge, and why."""

JOBS = ["hta/sampled_128rank_job"]
"""Folders analysed as one job: their rank files have no rows of their own."""


@pytest.mark.parametrize(("relative", "wall", "cause", "top"), VERDICTS)
def test_the_verdict_of_each_shared_trace_is_the_one_judged_by_hand(
    relative: str, wall: str, cause: str, top: str | None
) -> None:
    d = diagnosis(relative)
    first = d.findings[0].id if d.findings else None
    assert (d.verdict.wall, d.verdict.cause, first) == (wall, cause, top)


def test_every_shared_trace_has_a_judged_verdict() -> None:
    """A trace added to the shared folder needs its row (or its reason for having none)."""
    if not TRACES.is_dir():
        real_trace("")  # skips, saying where the traces were looked for
    files = {
        str(p.relative_to(TRACES))
        for pattern in ("*.json.gz", "*.json", "*.sqlite")
        for p in TRACES.rglob(pattern)
    }
    in_jobs = {f for f in files if any(f.startswith(f"{job}/") for job in JOBS)}
    judged = {str(r.values[0]) for r in VERDICTS}
    assert files - in_jobs - set(NOT_DIAGNOSED) == judged - set(JOBS)
    assert set(JOBS) <= judged
