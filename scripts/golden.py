#!/usr/bin/env python3
"""The golden outputs: `analyze --format json` of every trace in the shared folder (each file,
each rank folder, the Nsight Systems export), one JSON file each, to tell whether a change
moved any figure.

    scripts/golden.py write OUT [--traces DIR]   # write OUT/<trace>.json
    scripts/golden.py compare BEFORE AFTER        # which outputs differ, and their verdicts

A refactor that keeps behaviour leaves every file byte-identical; a change that moves a
verdict shows it here, for the note that says whether the new one is right."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from wallfinder.cli import main as wallfinder

ROOT = Path(__file__).resolve().parents[1]


def inputs(traces: Path) -> list[Path]:
    files = [
        p
        for p in sorted(traces.rglob("*"))
        if p.is_file() and (p.name.endswith((".json", ".json.gz", ".sqlite")))
    ]
    folders = sorted({p.parent for p in files if p.name.startswith("rank-")})
    return files + folders


def name_of(path: Path, traces: Path) -> str:
    return str(path.relative_to(traces)).replace("/", "__") + ".out.json"


def write(out: Path, traces: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for path in inputs(traces):
        target = out / name_of(path, traces)
        code = wallfinder(
            [
                "analyze",
                str(path),
                "--format",
                "json",
                "--no-cache",
                "--workers",
                "1",
                "-o",
                str(target),
            ]
        )
        if code != 0:
            target.write_text(json.dumps({"exit": code}))
        print(f"{code} {path.relative_to(traces)}", file=sys.stderr)
    return 0


def _headline(path: Path) -> str:
    d = json.loads(path.read_text())
    if "verdict" not in d:
        return f"exit {d.get('exit')}"
    top = d["findings"][0]["id"] if d.get("findings") else "-"
    return f"{d['verdict']['wall']} / {d['verdict']['cause']} / {top}"


def _old_keys(new: object, old: object) -> object:
    """`new` less the dict keys `old` lacks, at every depth: what a schema's added fields
    leave of an output."""
    if isinstance(new, dict) and isinstance(old, dict):
        return {k: _old_keys(v, old[k]) for k, v in new.items() if k in old}
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return [_old_keys(n, o) for n, o in zip(new, old, strict=True)]
    return new


def compare(before: Path, after: Path) -> int:
    moved = added = 0
    for a in sorted(before.glob("*.out.json")):
        b = after / a.name
        if not b.exists():
            print(f"missing after: {a.name}")
            moved += 1
        elif a.read_bytes() != b.read_bytes():
            old = json.loads(a.read_text())
            if _old_keys(json.loads(b.read_text()), old) == old:
                added += 1
                continue
            moved += 1
            ha, hb = _headline(a), _headline(b)
            print(f"differs: {a.name}: {ha}" + ("" if ha == hb else f"  ->  {hb}"))
    total = len(list(before.glob("*.out.json")))
    print(f"{moved} of {total} outputs differ; {added} more only add fields")
    return 1 if moved else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    w = sub.add_parser("write")
    w.add_argument("out", type=Path)
    w.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.what == "write":
        return write(args.out, args.traces)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
