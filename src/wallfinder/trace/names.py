"""How a module's range name reads: the profiler writes some module names as Python's repr of
the class, and that is format knowledge, kept here."""

from __future__ import annotations

import re

__all__ = ["module_name"]

_CLASS_REPR = re.compile(r"<class '([^']*)'>")
"""`repr(cls)`: what record_function ranges named after a module's class hold. A model saved
with torch.package has classes in a mangled package (`<torch_package_0>.dper3.modules.Foo`),
whose own `<`, `>` and dots must not end the match early."""


def module_name(name: str) -> str:
    """A module range's name as a row of the module tree reads it: a class's repr
    (`<class '<torch_package_0>.model.blocks.Foo'>`) becomes the class's own name (`Foo`),
    whatever surrounds it (an instance suffix stays); any other name is returned unchanged."""
    return _CLASS_REPR.sub(lambda m: m.group(1).rpartition(".")[2] or m.group(0), name)
