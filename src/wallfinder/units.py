"""How byte counts are written, in every layer: one formatter, so the evidence of a finding,
a check's line and a report's table say the same size the same way."""

from __future__ import annotations

__all__ = ["size"]

_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def size(n: float | None) -> str:
    """Bytes in binary units: 512 B, 1.50 KiB, 6.17 GiB; "?" when unknown."""
    if n is None:
        return "?"
    for unit, scale in _UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"
