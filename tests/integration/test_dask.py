"""`--scheduler`: a folder of rank traces analysed on a real dask.distributed cluster gives the
same diagnosis, byte for byte, as the in-process analysis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracegen import TraceBuilder, training_trace
from wallfinder.api import analyze
from wallfinder.cli import main
from wallfinder.errors import WallfinderError

distributed = pytest.importorskip(
    "distributed", reason="dask.distributed is not installed (pip install 'wallfinder[dask]')"
)

pytestmark = pytest.mark.slow

NELEMS = 16 << 20
WORLD = 3


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """The address of a local cluster of two worker processes, like `dask scheduler` and two
    `dask worker`s (processes, so the options, paths and results really cross a pickle)."""
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        yield cluster.scheduler_address


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three ranks of a data-parallel job with skewed clocks and a late rank 2, plus a file
    that is not a trace (skipped, and named in the warnings)."""
    folder = tmp_path_factory.mktemp("job")
    for rank in range(WORLD):
        late = 250.0 if rank == 2 else 0.0
        b = TraceBuilder(rank=rank, world_size=WORLD, base_us=1_700_000_000 + 2000 * rank)
        training_trace(4, loader_us=100.0 + late, builder=b)
        for s in range(4):
            end = 2000.0 * (s + 1)
            b.nccl(end - 400.0 + late, 400.0 - late, collective="allreduce", nelems=NELEMS)
        b.write(folder / f"rank{rank}.json")
    (folder / "broken.json").write_text("[{")
    return folder


def test_a_cluster_gives_the_in_process_diagnosis(job: Path, scheduler: str) -> None:
    local = analyze(job)
    assert local.job is not None
    assert local.job.matched == 4  # the join really ran: every all-reduce matched
    assert [s.rank for s in local.job.stragglers] == [2]
    assert any("broken.json" in w for w in local.warnings)
    on_cluster = analyze(job, scheduler=scheduler)
    assert on_cluster.to_json() == local.to_json()


def test_the_cli_sends_the_ranks_to_the_scheduler(
    job: Path, scheduler: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    local = json.loads(analyze(job).to_json())
    # A relative path: the CLI makes it absolute before the workers see it.
    monkeypatch.chdir(job.parent)
    assert main(["analyze", job.name, "--format", "json", "--scheduler", scheduler]) == 0
    assert json.loads(capsys.readouterr().out) == local


def test_one_trace_on_a_cluster_is_analysed_as_one_trace(job: Path, scheduler: str) -> None:
    one = job / "rank0.json"
    assert analyze(one, scheduler=scheduler).to_json() == analyze(one).to_json()
    with pytest.raises(WallfinderError, match=r"broken\.json"):
        analyze(job / "broken.json", scheduler=scheduler)


def test_an_unreachable_scheduler_is_one_clear_error(
    job: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("wallfinder.api.SCHEDULER_TIMEOUT_S", 0.5)
    with pytest.raises(WallfinderError, match="cannot reach the dask scheduler"):
        analyze(job, scheduler="tcp://127.0.0.1:1")
