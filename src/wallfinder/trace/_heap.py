"""Giving freed memory back to the system.

A parse frees hundreds of MB of small arrays (each chunk's columns) while it builds the
table's large ones. The C allocator (glibc's malloc) keeps small freed blocks in its heap for
reuse, and the large new columns are mapped apart from it, so without this the process holds
both: its RSS after a 1 GB parse was twice the table. `release_free_memory` asks glibc to
return the heap's free pages (`malloc_trim`); elsewhere (macOS, Windows, musl) it does
nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import cache

__all__ = ["release_free_memory"]


@cache
def _trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system; False where that cannot be done."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True
