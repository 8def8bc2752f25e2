"""Time `wallfinder analyze` against HolisticTraceAnalysis on the same traces, side by side.

For every trace and tool this prints the wall time, the throughput in MB/s of uncompressed trace
and the peak resident memory.  Each run happens in a fresh measuring process (this script
re-invoked with --measure), which starts the tool, waits for it and reads
getrusage(RUSAGE_CHILDREN), so no figure includes another run's memory or warm caches inside the
interpreter.

    python benchmarks/generate_trace.py -o /tmp/big.json --size-mb 1000
    /tmp/wfenv/bin/python benchmarks/bench_analyze.py --big /tmp/big.json \\
        --hta-python /tmp/htaenv/bin/python

wallfinder runs under the interpreter running this script; HTA under --hta-python, a separate
virtual env, so the two never share dependencies.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MB = 1_000_000
REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = REPO_ROOT.parent / "shared" / "traces"
RESULT_MARKER = "BENCH-RESULT "

# Runs under --hta-python.  TraceAnalysis loads every rank file in the folder; the idle-time
# breakdown defaults to rank 0 alone, so it is given the ranks actually loaded.
HTA_SCRIPT = """
import json, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
ranks = analysis.t.get_ranks()
temporal = analysis.get_temporal_breakdown(visualize=False)
idle, _ = analysis.get_idle_time_breakdown(ranks=ranks, visualize=False)
t3 = time.perf_counter()
row = temporal.iloc[0]
print(sys.argv[2] + json.dumps({
    "ranks": ranks,
    "import_s": round(t1 - t0, 3),
    "load_s": round(t2 - t1, 3),
    "analysis_s": round(t3 - t2, 3),
    "idle_pct": float(row["idle_time_pctg"]),
    "compute_pct": float(row["compute_time_pctg"]),
    "non_compute_pct": float(row["non_compute_time_pctg"]),
    "idle_rows": len(idle),
}))
"""

# The msgspec typed-decode floor: the whole text read (gunzipped) and decoded in one process
# into the structs wallfinder declares for an event, nothing else. Runs under this interpreter.
FLOOR_SCRIPT = """
import importlib.util, sys
import msgspec
try:
    from isal import igzip as gzip
except ImportError:
    import gzip
# wallfinder's event structs alone (the module, not the package, which imports numpy).
spec = importlib.util.spec_from_file_location("schema", sys.argv[3])
schema = importlib.util.module_from_spec(spec)
sys.modules["schema"] = schema
spec.loader.exec_module(schema)

class Document(msgspec.Struct):
    traceEvents: list[schema.Event] = []

with open(sys.argv[1], "rb") as raw:
    gzipped = raw.read(2) == b"\\x1f\\x8b"
    raw.seek(0)
    text = gzip.GzipFile(fileobj=raw).read() if gzipped else raw.read()
events = msgspec.json.decode(text, type=Document).traceEvents
del text
print(sys.argv[2] + '{"events": %d}' % len(events))
"""

# The same floor in a process that first imports numpy: what any tool holding its columns in
# numpy pays before its first figure (the floor's own work, plus numpy's import).
FLOOR_NUMPY_SCRIPT = "import numpy\n" + FLOOR_SCRIPT

# wallfinder's reader alone: its imports (numpy, the trace package) and the parse into columns,
# the cache off, no analysis. Against the floor, how close reading is; against the whole
# command, what the diagnosis adds.
READER_SCRIPT = """
import sys
from pathlib import Path
from wallfinder.trace import load_traces
traces = load_traces(Path(sys.argv[1]), cache=False)
print(sys.argv[2] + '{"events": %d}' % sum(len(t.events) for t in traces))
"""

# Where wallfinder's time goes on one trace, in one process: the imports, the parse (the cache
# off), the device's spec, each stage of the diagnosis and each what-if replay (recorded by
# `pipeline.timings()`, the analysis's opt-in timing hook), and the render to JSON.
STAGES_SCRIPT = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from wallfinder.analysis import diagnose
from wallfinder.analysis.pipeline import timings
from wallfinder.api import Options
from wallfinder.report import render
from wallfinder.trace import load_traces
rows = [("stage", "imports", time.perf_counter() - t0)]

def timed(name, make):
    start = time.perf_counter()
    out = make()
    rows.append(("stage", name, time.perf_counter() - start))
    return out

options = Options()
traces = timed("parse", lambda: load_traces(Path(sys.argv[1]), cache=False))
if len(traces) != 1:
    sys.exit("one trace per file: a capture of several processes is a job")
trace = traces[0]
given = timed("device spec", lambda: options.diagnose_options(trace))
with timings() as made:
    start = time.perf_counter()
    diagnosis = diagnose(trace, options.thresholds, **given)
    total = time.perf_counter() - start
rows += [(t.kind, t.name, t.seconds) for t in made]
staged = sum(t.seconds for t in made if t.kind == "stage")
rows.append(("stage", "diagnosis, unrecorded", total - staged))
timed("render", lambda: render(diagnosis, "json"))
print(sys.argv[2] + json.dumps({"rows": rows}))
"""

# Whether this wallfinder has a cache of parsed traces (then the parse is timed with it off,
# and the second look with it on).
CACHE_PROBE_SCRIPT = "from wallfinder.cli import main; main(['analyze', '--help'])"

WALLFINDER_VERSION_SCRIPT = (
    "import importlib.metadata as m, wallfinder; print(m.version('wallfinder'))"
)
HTA_VERSION_SCRIPT = (
    "import importlib.metadata as m, hta.trace_analysis; print(m.version('HolisticTraceAnalysis'))"
)


def redact(text: str) -> str:
    """Reduces every absolute path in `text` to its file name."""
    return re.sub(r"(?<![\w.])(?:/[\w.+@~-]+)+/?", lambda m: Path(m.group(0)).name or "/", text)


def uncompressed_size(path: Path) -> int:
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    size = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            size += len(chunk)
    return size


def largest_shared_trace() -> Path | None:
    if not SHARED_TRACES.is_dir():
        return None
    traces = [p for p in SHARED_TRACES.rglob("*") if p.name.endswith((".json", ".json.gz"))]
    return max(traces, key=uncompressed_size, default=None)


# --------------------------------------------------------------------------------------------
# Measuring one run (inside the fresh measuring process)


def _tree_rss_bytes(root: int) -> int:
    """The memory of `root` and its descendants, each page once: the root's VmRSS plus each
    descendant's private pages (`Private_Clean` + `Private_Dirty` of its smaps_rollup). A
    forked worker shares its parent's pages until either writes them; those are the parent's
    RSS already (summing VmRSS counted them once per process). Missed: pages two workers
    still share after the parent let them go (what it held when it forked them, a few MB).
    Where smaps_rollup cannot be read (kernels before 4.14) a descendant's VmRSS is added
    instead, an upper bound."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The command name may contain spaces and parentheses; the ppid follows the last ')'.
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sum(_kib(pid, pid != root) * 1024 for pid in tree)


def _kib(pid: int, private: bool) -> int:
    """A process's resident KiB: all of it, or (`private`) the pages no other process maps."""
    if private:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            rollup = ""
        found = re.findall(r"^Private_(?:Clean|Dirty):\s+(\d+) kB", rollup, re.MULTILINE)
        if found:
            return sum(int(k) for k in found)
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) if match else 0


def measure(command: list[str], timeout: float) -> dict[str, Any]:
    """Runs `command` once; reports wall time, peak RSS and the tail of its output."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # so a timeout can kill the tool's worker processes too
    )
    peak_tree = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        while not done.wait(0.2):
            peak_tree = max(peak_tree, _tree_rss_bytes(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    if Path("/proc").is_dir():
        sampler.start()
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    # ru_maxrss is the largest single process among the waited-for descendants, in KiB on Linux.
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    stdout = out.decode(errors="replace")
    summary = next(
        (
            line[len(RESULT_MARKER) :]
            for line in stdout.splitlines()
            if line.startswith(RESULT_MARKER)
        ),
        None,
    )
    return {
        "returncode": proc.returncode,
        "timed_out": timed_out,
        "wall_s": wall,
        "peak_rss_bytes": peak,
        "peak_tree_rss_bytes": max(peak_tree, peak),
        "summary": json.loads(summary) if summary else None,
        "stderr_tail": err.decode(errors="replace")[-3000:],
    }


# --------------------------------------------------------------------------------------------
# The benchmark


@dataclass
class Run:
    tool: str
    status: str  # "ok", "timeout", "failed" or "skipped"
    wall_s: float | None = None
    mb_per_s: float | None = None
    peak_rss_mb: float | None = None
    peak_tree_rss_mb: float | None = None
    note: str = ""
    details: dict[str, Any] | None = None


def run_measured(command: list[str], timeout: float) -> dict[str, Any]:
    """Measures `command` from a fresh process, so RUSAGE_CHILDREN sees this run alone."""
    spec = json.dumps({"command": command, "timeout": timeout})
    child = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--measure", spec],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(child.stdout)
    return result


FOOTPRINT_SCRIPT = "import wallfinder.api, wallfinder.cli.commands.analyze"
"""wallfinder's footprint: the interpreter with what `analyze` imports, reading no trace (the
memory goal for traces of tens of MB is this plus the uncompressed file)."""


def footprint_mb(repeat: int, timeout: float) -> float | None:
    """The peak RSS (MB) of FOOTPRINT_SCRIPT, the median of `repeat` runs; None if it fails."""
    peaks = []
    for _ in range(max(repeat, 1)):
        m = run_measured([sys.executable, "-c", FOOTPRINT_SCRIPT], timeout)
        if m["returncode"] != 0:
            return None
        peaks.append(m["peak_rss_bytes"] / MB)
    return float(statistics.median(peaks))


NEW_QUESTION_DEVICES = ["H100", "A100", "B200", "V100", "MI300X", "L40S", "H200"]
"""The devices the "new question" runs name in turn (one per run, so each misses the cache of
diagnoses and reads the cached parse)."""


def best_of(
    tool: str,
    command: list[str],
    size: int,
    repeat: int,
    timeout: float,
    median: bool = False,
    vary: list[list[str]] | None = None,
) -> Run:
    """The fastest of `repeat` runs, or with `median` the run of median wall time (on a busy
    machine the fastest run is luck; the median is what a user sees). `vary`: arguments added
    to the command, the next of them each run (so that no run answers the one before's
    question)."""
    runs: list[Run] = []
    for i in range(repeat):
        m = run_measured(command + (vary[i % len(vary)] if vary else []), timeout)
        if m["timed_out"]:
            return Run(tool, "timeout", note=f"did not finish in {timeout:g} s")
        if m["returncode"] != 0:
            lines = [line for line in m["stderr_tail"].splitlines() if line.strip()]
            reason = redact(lines[-1]) if lines else f"exit status {m['returncode']}"
            return Run(tool, "failed", note=reason[:200])
        run = Run(
            tool,
            "ok",
            wall_s=m["wall_s"],
            mb_per_s=size / MB / m["wall_s"],
            peak_rss_mb=m["peak_rss_bytes"] / MB,
            peak_tree_rss_mb=m["peak_tree_rss_bytes"] / MB,
            details=m["summary"],
        )
        runs.append(run)
    runs.sort(key=lambda r: r.wall_s or 0.0)
    return runs[(len(runs) - 1) // 2] if median else runs[0]


def probe(python: str, code: str) -> tuple[str | None, str]:
    """Runs `code` under `python`; returns (its output, '') or (None, why it failed)."""
    try:
        done = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=300, check=False
        )
    except OSError as exc:
        return None, f"cannot run the interpreter ({exc.strerror})"
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return None, redact(lines[-1]) if lines else f"exit status {done.returncode}"
    return done.stdout.strip(), ""


def hta_folder(trace: Path, parent: Path) -> Path:
    """A folder holding only `trace`, named so HTA picks it up.

    HTA loads every *.json and *.gz file of a folder and takes each one's rank from the first
    `"rank": N` in its text, defaulting to 0; the file name does not matter beyond its suffix.
    """
    folder = Path(tempfile.mkdtemp(prefix="hta-", dir=parent))
    link = folder / ("trace.json.gz" if trace.name.endswith(".gz") else "trace.json")
    try:
        link.symlink_to(trace.resolve())
    except OSError:
        shutil.copyfile(trace, link)
    return folder


def benchmark_file(
    trace: Path,
    hta_python: str | None,
    run_wallfinder: bool,
    floor: bool,
    cache_flags: list[str],
    repeat: int,
    timeout: float,
    scratch: Path,
    median: bool = False,
    cached: bool = True,
    footprint: float | None = None,
    stages: bool = True,
) -> dict[str, Any]:
    size = uncompressed_size(trace)
    print(f"\n{trace.name}: {size / MB:.1f} MB uncompressed", flush=True)
    runs: list[Run] = []
    costed: list[tuple[str, str, float]] = []
    if run_wallfinder:
        command = [
            sys.executable,
            "-m",
            "wallfinder",
            "analyze",
            str(trace),
            "--format",
            "json",
            "-o",
            os.devnull,
        ]
        runs.append(best_of("wallfinder", command + cache_flags, size, repeat, timeout, median))
        print(f"  wallfinder: {describe(runs[-1])}", flush=True)
        if cache_flags and cached:
            # The second look: one run fills the cache (in the scratch folder), then timed.
            run_measured(command, timeout)
            runs.append(best_of("wf cached", command, size, repeat, timeout, median))
            print(f"  wf cached:  {describe(runs[-1])}", flush=True)
            # A new question of the cached parse: another device, diagnosed afresh.
            devices = [["--device", d] for d in NEW_QUESTION_DEVICES]
            runs.append(best_of("wf new q", command, size, repeat, timeout, median, devices))
            print(f"  wf new q:   {describe(runs[-1])}", flush=True)
        if stages:
            command = [sys.executable, "-c", STAGES_SCRIPT, str(trace), RESULT_MARKER]
            cost = best_of("stages", command, size, repeat, timeout, median)
            if cost.details is None:
                print(f"  stages:     {cost.status}: {cost.note}", flush=True)
            else:
                costed = [tuple(row) for row in cost.details["rows"]]
                print(stage_table(costed), flush=True)
        if floor:
            schema = REPO_ROOT / "src" / "wallfinder" / "trace" / "_schema.py"
            command = [sys.executable, "-c", FLOOR_SCRIPT, str(trace), RESULT_MARKER, str(schema)]
            runs.append(best_of("msgspec", command, size, repeat, timeout, median))
            print(f"  msgspec:    {describe(runs[-1])}", flush=True)
            command = [sys.executable, "-c", FLOOR_NUMPY_SCRIPT, *command[3:]]
            runs.append(best_of("+numpy", command, size, repeat, timeout, median))
            print(f"  +numpy:     {describe(runs[-1])}", flush=True)
            if run_wallfinder:
                command = [sys.executable, "-c", READER_SCRIPT, str(trace), RESULT_MARKER]
                runs.append(best_of("reader", command, size, repeat, timeout, median))
                print(f"  reader:     {describe(runs[-1])}", flush=True)
    if hta_python:
        folder = hta_folder(trace, scratch)
        command = [hta_python, "-c", HTA_SCRIPT, str(folder), RESULT_MARKER]
        runs.append(best_of("HTA", command, size, repeat, timeout, median))
        print(f"  HTA:        {describe(runs[-1])}", flush=True)
    speeds = {r.tool: r.mb_per_s for r in runs if r.mb_per_s}
    ratio = (
        speeds["wallfinder"] / speeds["HTA"] if "wallfinder" in speeds and "HTA" in speeds else None
    )
    walls = {r.tool: r.wall_s for r in runs if r.wall_s}
    over_floor = (
        walls["wallfinder"] / walls["msgspec"]
        if "wallfinder" in walls and "msgspec" in walls
        else None
    )
    peaks = {r.tool: r.peak_tree_rss_mb for r in runs if r.peak_tree_rss_mb}
    return {
        "file": trace.name,
        "uncompressed_mb": size / MB,
        "runs": [asdict(r) for r in runs],
        "stages": [{"kind": k, "name": n, "seconds": t} for k, n, t in costed],
        "throughput_ratio_wallfinder_over_hta": ratio,
        "wall_ratio_wallfinder_over_msgspec_floor": over_floor,
        # The floor with numpy imported, and wallfinder's reader alone, over the floor.
        "wall_ratio_numpy_floor_over_msgspec_floor": _over(walls, "+numpy", "msgspec"),
        "wall_ratio_reader_over_msgspec_floor": _over(walls, "reader", "msgspec"),
        # wallfinder's workers count: its whole process tree against HTA's.
        "peak_memory_ratio_hta_over_wallfinder": (
            peaks["HTA"] / peaks["wallfinder"] if "HTA" in peaks and "wallfinder" in peaks else None
        ),
        "peak_memory_wallfinder_over_file": (
            peaks["wallfinder"] * MB / size if "wallfinder" in peaks else None
        ),
        # The goal on traces of tens of MB: at most the footprint plus the file (<= 0 is met).
        "peak_memory_over_footprint_plus_file_mb": (
            peaks["wallfinder"] - footprint - size / MB
            if "wallfinder" in peaks and footprint is not None
            else None
        ),
        # The second look (the same question, then another device) against the first.
        "second_look_over_first": (
            walls["wf cached"] / walls["wallfinder"]
            if "wf cached" in walls and "wallfinder" in walls
            else None
        ),
        "new_question_over_first": (
            walls["wf new q"] / walls["wallfinder"]
            if "wf new q" in walls and "wallfinder" in walls
            else None
        ),
    }


def _over(walls: dict[str, float], tool: str, base: str) -> float | None:
    return walls[tool] / walls[base] if tool in walls and base in walls else None


def stage_table(rows: list[tuple[str, str, float]]) -> str:
    """Where one process's time went: each stage (the imports, the parse, each stage of the
    diagnosis, the render) with its seconds and share of the whole, the parts recorded inside
    the critical path's stage under it, then the what-if replays (each one's replay and walk),
    how many and their total."""
    # (A name twice, the CPU's graph and the critical path both "critical path", is one row.)
    stages: dict[str, float] = {}
    for kind, name, t in rows:
        if kind == "stage":
            stages[name] = stages.get(name, 0.0) + t
    total = sum(stages.values()) or 1.0
    lines = [f"  {'stage':34} {'seconds':>8} {'share':>6}"]
    lines += [f"  {name:34} {t:8.3f} {t / total:6.1%}" for name, t in stages.items()]
    parts = [(n, t) for kind, n, t in rows if kind == "part"]
    if parts:
        lines.append("  inside the critical path:")
        lines += [f"    {n:32} {t:8.3f} {t / total:6.1%}" for n, t in parts]
    replays = [(n, t) for kind, n, t in rows if kind == "replay"]
    spent = sum(t for _, t in replays)
    lines.append(
        f"  what-if replays: {len(replays)}, {spent:.3f} s in all ({spent / total:.1%})"
        + ("" if replays else " (each what-if here moves nothing on the graph)")
    )
    lines += [f"    {n:32} {t:8.3f} {t / total:6.1%}" for n, t in replays]
    lines.append(f"  {'total':34} {total:8.3f}")
    return "\n".join(lines)


def describe(run: Run) -> str:
    if run.status != "ok":
        return f"{run.status}: {run.note}"
    text = (
        f"{run.wall_s:.2f} s, {run.mb_per_s:.1f} MB/s, peak RSS {run.peak_rss_mb:.0f} MB "
        f"(process tree {run.peak_tree_rss_mb:.0f} MB)"
    )
    if (
        run.details and "import_s" in run.details
    ):  # HTA's own account of where its time went, and what it found
        d = run.details
        text += (
            f"\n              import {d['import_s']:.1f} s, load {d['load_s']:.1f} s, "
            f"analyses {d['analysis_s']:.1f} s; GPU idle {d['idle_pct']:.1f}%, "
            f"compute {d['compute_pct']:.1f}%, non-compute {d['non_compute_pct']:.1f}%"
        )
    return text


def print_table(results: list[dict[str, Any]]) -> None:
    header = (
        f"{'file':34} {'MB':>8}  {'tool':10} {'wall s':>8} {'MB/s':>8} "
        f"{'peak RSS MB':>12} {'tree RSS MB':>12}"
    )
    print("\n" + header)
    print("-" * len(header))
    for result in results:
        for run in result["runs"]:
            prefix = f"{result['file'][:34]:34} {result['uncompressed_mb']:8.1f}  {run['tool']:10}"
            if run["status"] == "ok":
                print(
                    f"{prefix} {run['wall_s']:8.2f} {run['mb_per_s']:8.1f} "
                    f"{run['peak_rss_mb']:12.0f} {run['peak_tree_rss_mb']:12.0f}"
                )
            else:
                print(f"{prefix} {run['status']}: {run['note']}")
        ratio = result["throughput_ratio_wallfinder_over_hta"]
        if ratio is not None:
            print(f"{'':34} {'':8}  wallfinder throughput = {ratio:.1f} x HTA's")
        over_floor = result.get("wall_ratio_wallfinder_over_msgspec_floor")
        if over_floor is not None:
            print(f"{'':34} {'':8}  wallfinder wall time = {over_floor:.2f} x the msgspec floor")
        for key, what in (
            ("wall_ratio_numpy_floor_over_msgspec_floor", "the floor with numpy imported"),
            ("wall_ratio_reader_over_msgspec_floor", "wallfinder's reader alone"),
        ):
            if result.get(key) is not None:
                print(f"{'':34} {'':8}  {what} = {result[key]:.2f} x the msgspec floor")
        less = result.get("peak_memory_ratio_hta_over_wallfinder")
        if less is not None:
            print(f"{'':34} {'':8}  wallfinder peak memory (tree) = {less:.1f} x less than HTA's")
        of_file = result.get("peak_memory_wallfinder_over_file")
        if of_file is not None:
            print(f"{'':34} {'':8}  wallfinder peak memory (tree) = {of_file:.2f} x the file")
        over = result.get("peak_memory_over_footprint_plus_file_mb")
        if over is not None:
            print(
                f"{'':34} {'':8}  wallfinder peak memory (tree) = {abs(over):.1f} MB "
                f"{'over' if over > 0 else 'under'} its footprint + the file"
            )
        again, new = result.get("second_look_over_first"), result.get("new_question_over_first")
        if again is not None and new is not None:
            print(
                f"{'':34} {'':8}  second look = {again:.0%} of the first; "
                f"another --device = {new:.0%}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Time wallfinder analyze and HolisticTraceAnalysis on the same traces."
    )
    parser.add_argument(
        "files",
        nargs="*",
        type=Path,
        help="traces to time (default: --big and the largest trace in ../shared/traces)",
    )
    parser.add_argument("--big", type=Path, help="a large generated trace to include by default")
    parser.add_argument("--hta-python", help="python of a virtual env with HTA installed")
    parser.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds allowed per run (default 1800)"
    )
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help=(
            "skip the msgspec floor (the file decoded into wallfinder's event structs alone), "
            "the same with numpy imported, and wallfinder's reader alone"
        ),
    )
    parser.add_argument("--repeat", type=int, default=1, help="take the best of N runs")
    parser.add_argument(
        "--median", action="store_true", help="with --repeat, the median run, not the best"
    )
    parser.add_argument(
        "--no-cached",
        action="store_true",
        help="skip the second look (the run with the cache of parsed traces filled)",
    )
    parser.add_argument(
        "--no-stages",
        action="store_true",
        help="skip the per-stage table (one more process per trace: the parse, each stage of "
        "the diagnosis, each what-if replay and the render, timed inside it)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.measure:
        spec = json.loads(args.measure)
        print(json.dumps(measure(spec["command"], spec["timeout"])))
        return 0

    files: list[Path] = list(args.files)
    if not files:
        if args.big:
            files.append(args.big)
        shared = largest_shared_trace()
        if shared is None:
            print("no ../shared/traces folder next to the repository: no real trace to time")
        else:
            files.append(shared)
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        print(f"not found: {', '.join(missing)}")
        return 2
    if not files:
        print("nothing to time: give trace files or --big")
        return 2

    wallfinder_version, why_not = probe(sys.executable, WALLFINDER_VERSION_SCRIPT)
    if wallfinder_version is None:
        print(f"wallfinder skipped: not importable by this interpreter: {why_not}")
    else:
        print(f"wallfinder {wallfinder_version}")
    hta_version: str | None = None
    if not args.hta_python:
        print("HTA skipped: no --hta-python given")
    else:
        hta_version, why_not = probe(args.hta_python, HTA_VERSION_SCRIPT)
        if hta_version is None:
            print(f"HTA skipped: not importable by --hta-python: {why_not}")
        else:
            print(f"HolisticTraceAnalysis {hta_version}")
    print(f"{os.cpu_count()} CPUs, Python {platform.python_version()}, timeout {args.timeout:g} s")
    if wallfinder_version is None and hta_version is None:
        print("neither tool can run: nothing to time")
        return 1

    # An installed package has its bytecode compiled; a sandbox may forbid writing it
    # (PYTHONDONTWRITEBYTECODE), which would time compiling the source on every run.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    help_text, _ = probe(sys.executable, CACHE_PROBE_SCRIPT)
    cache_flags = ["--no-cache"] if help_text and "--no-cache" in help_text else []
    footprint = footprint_mb(args.repeat, args.timeout) if wallfinder_version is not None else None
    if footprint is not None:
        print(
            "wallfinder's footprint (the interpreter with what analyze imports): "
            f"{footprint:.1f} MB"
        )
    with tempfile.TemporaryDirectory(prefix="bench-analyze-") as scratch:
        os.environ["WALLFINDER_CACHE"] = str(Path(scratch) / "cache")
        results = [
            benchmark_file(
                trace,
                args.hta_python if hta_version else None,
                wallfinder_version is not None,
                wallfinder_version is not None and not args.no_floor,
                cache_flags,
                args.repeat,
                args.timeout,
                Path(scratch),
                args.median,
                not args.no_cached,
                footprint,
                not args.no_stages,
            )
            for trace in files
        ]
    print_table(results)
    if args.json:
        report = {
            "wallfinder_version": wallfinder_version,
            "hta_version": hta_version,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "repeat": args.repeat,
            "statistic": "median" if args.median else "best",
            "timeout_s": args.timeout,
            "footprint_mb": footprint,
            "results": results,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
