"""Names imported on first use, so that a command imports only what it needs: `wallfinder
--help` must not pay for the analyses, the HTML report or calibration."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_attributes(module: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` for `module`: each name in `where` is imported from the
    module `where[name]` names on first use, then kept as an ordinary attribute."""

    def attribute(name: str) -> Any:
        source = where.get(name)
        if source is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(import_module(source), name)
        setattr(sys.modules[module], name, value)
        return value

    return attribute
