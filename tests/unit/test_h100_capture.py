"""A real H100 trace this project captured itself (tests/data/capture/ddp_compiled_job.py
under `wallfinder run --modules`, on one H100, world size 1): a compiled MLP in
DistributedDataParallel. Its ranges carry the names that once broke the module view
(`DistributedDataParallel.forward`, `CompiledFunction`, `## Call CompiledFxGraph … ##`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from invariants import assert_diagnosis_invariants, assert_phases_and_modules
from wallfinder import Diagnosis, analyze

CAPTURE = Path(__file__).resolve().parents[1] / "data" / "h100_ddp_compiled.json.gz"


def checked(path: Path) -> Diagnosis:
    d = analyze(path, workers=1)
    assert_diagnosis_invariants(d)
    assert_phases_and_modules(d)
    assert d.not_computed == {}
    return d


def test_the_compiled_ddp_job_is_host_bound_with_its_module_tree() -> None:
    d = checked(CAPTURE)
    assert d.device.matched_spec == "NVIDIA H100 SXM"
    assert (d.rank, d.world_size, d.steps.count) == (0, 1, 3)
    # Judged by hand: 33 kernels a step, most under 10 µs, on a 6.7 ms step whose GPU
    # computes for 28% of it; the host is between launches the rest of the time.
    assert (d.verdict.wall, d.verdict.cause) == ("overhead", "host_overhead")
    assert d.findings[0].id == "launch-bound"
    assert d.modules is not None
    names = [r.names for r in d.modules.rows]
    assert ["DistributedDataParallel_0", "OptimizedModule_0"] in names
    for r in d.modules.rows:
        assert r.path == "/".join(r.names)
        assert r.parent == ("/".join(r.names[:-1]) or None)


def test_without_module_records_its_dotted_ranges_are_the_module_rows(tmp_path: Path) -> None:
    data = json.loads(gzip.decompress(CAPTURE.read_bytes()))
    data["traceEvents"] = [
        e for e in data["traceEvents"] if not str(e.get("name", "")).startswith("nn.Module: ")
    ]
    bare = tmp_path / "no_modules.json"
    bare.write_text(json.dumps(data))
    d = checked(bare)
    assert d.modules is not None
    assert d.modules.source == "record_function"
    names = [r.names for r in d.modules.rows]
    assert ["DLRM_Net.forward", "DistributedDataParallel.forward"] in names
