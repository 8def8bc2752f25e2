"""The base of every result type and the schema versions `from_json` reads and upgrades."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

SCHEMA = "wallfinder.diagnosis/2"
_DIAGNOSIS_V1 = "wallfinder.diagnosis/1"
DIAGNOSIS_SCHEMAS = (_DIAGNOSIS_V1, SCHEMA)
"""Every diagnosis schema `Diagnosis.from_json` reads. /2: one `Finding` type for every
finding (`saves`, `saving_bytes`, `device`), where /1 had a memory finding type of its own;
the memory profile's blocks, sites and leak sites are the memory model's `MemoryBlock`,
`MemorySite` and `MemoryLeak` (shared with the snapshot's report), which only add fields
with defaults to what /1 wrote."""

Wall = Literal["compute", "bandwidth", "overhead"]
Answer = Literal["yes", "no", "unknown"]


class _Base(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=False):
    def to_json(self, *, indent: int = 2) -> str:
        """The JSON form (the contract), indented."""
        return msgspec.json.format(msgspec.json.encode(self), indent=indent).decode()


class _Schema(msgspec.Struct):
    """Only the `schema` key of a saved result: which version to read it as."""

    schema: str = ""


def _upgrade_memory_findings(holder: dict[str, Any]) -> None:
    """/1 → /2 in place: the memory findings under `holder["findings"]` (a /1 `MemoryFinding`:
    id, title, evidence, fix, saving_bytes, device) as `Finding`s that save memory."""
    holder["findings"] = [
        {"wall": None, "share": 0.0, "max_speedup": 1.0, **f, "saves": "memory"}
        for f in holder.get("findings") or []
    ]


_SNAPSHOT_V1_CATEGORY = {"unknown": "other"}
"""/1 → /2: snapshot categories renamed to the one vocabulary (`MEMORY_CATEGORIES`)."""


def _upgrade_snapshot_categories(report: dict[str, Any]) -> None:
    """/1 → /2 in place: the category names of a memory report (its `categories` dicts, and
    the `category` of its sites, blocks and leaks) in the one vocabulary."""

    def renamed(cats: dict[str, int]) -> dict[str, int]:
        return {_SNAPSHOT_V1_CATEGORY.get(k, k): v for k, v in cats.items()}

    def listed(holder: dict[str, Any], key: str) -> list[dict[str, Any]]:
        return list(holder.get(key) or [])

    peaks = listed(report, "peaks")
    for holder in [report, *listed(report, "devices"), *peaks]:
        if isinstance(holder.get("categories"), dict):
            holder["categories"] = renamed(holder["categories"])
    rows = listed(report, "sites") + listed(report, "largest") + listed(report, "leaks")
    rows += [s for p in peaks for s in listed(p, "sites")]
    for row in rows:
        if isinstance(row.get("category"), str):
            row["category"] = _SNAPSHOT_V1_CATEGORY.get(row["category"], row["category"])
