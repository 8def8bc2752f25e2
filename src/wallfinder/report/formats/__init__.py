"""The renderers, one module per output format: each declares its `Format` and, for each kind
of result it can show (a `Subject`: a diagnosis, a diff, a memory report, ...), a renderer
`render(result, options) -> str`, registered with `Format.renders`.

Adding a format is one module in this package, found by its place here. A format module
imports only this one when it is loaded (the lists of formats are built at start-up, for
`--help`); its renderer imports what draws it (rich, jinja2) when it is called.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

if TYPE_CHECKING:
    from wallfinder.diagnosis import (
        Calculation,
        CounterReport,
        Diagnosis,
        DiagnosisDiff,
        MemoryReport,
        Steps,
    )

__all__ = [
    "CALCULATION",
    "COUNTERS",
    "DIAGNOSIS",
    "DIFF",
    "MEMORY",
    "STEPS",
    "SUBJECTS",
    "Drawn",
    "Format",
    "RenderOptions",
    "Subject",
    "formats_of",
    "rendered",
]

T = TypeVar("T")


class RenderOptions(msgspec.Struct, frozen=True):
    """What a renderer may be told besides its result."""

    width: int | None = None
    """The terminal's width in columns, for the text format (None: the console's own)."""


Renderer = Callable[[T, RenderOptions], str]


class Subject(msgspec.Struct, Generic[T], frozen=True):
    """A kind of result that formats render (its type is `T`)."""

    name: str
    """What an unknown format is said as: "unknown {name} format"."""
    otherwise: str | None = None
    """The format that renders it in any format it has no renderer for; None: an unknown
    format is a ValueError."""


DIAGNOSIS: Subject[Diagnosis] = Subject("report")
DIFF: Subject[DiagnosisDiff] = Subject("diff")
MEMORY: Subject[MemoryReport] = Subject("memory")
COUNTERS: Subject[CounterReport] = Subject("counters")
STEPS: Subject[Steps] = Subject("steps", otherwise="text")
CALCULATION: Subject[Calculation] = Subject("calculation", otherwise="text")
SUBJECTS: tuple[Subject[Any], ...] = (DIAGNOSIS, DIFF, MEMORY, COUNTERS, STEPS, CALCULATION)
"""Every kind of result (the JSON format renders them all)."""


class Format(msgspec.Struct, frozen=True, eq=False):
    """One output format, and its renderers by subject."""

    name: str
    """The format's name, as `--format` takes it."""
    rank: int
    """Where it stands in the lists of formats (`--help`'s choices): lower first."""
    renderers: dict[Subject[Any], Renderer[Any]] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name in _FORMATS:
            raise ValueError(f"two formats are named {self.name!r}")
        _FORMATS[self.name] = self
        _formats.cache_clear()

    def renders(self, subject: Subject[T]) -> Callable[[Renderer[T]], Renderer[T]]:
        """Register the decorated function as this format's renderer of `subject`."""

        def register(render: Renderer[T]) -> Renderer[T]:
            self.renderers[subject] = render
            return render

        return register

    def draws(self, renderers: dict[Subject[Any], Renderer[Any]]) -> None:
        """Register a renderer for each subject of `renderers`."""
        self.renderers.update(renderers)


class Drawn(msgspec.Struct, frozen=True):
    """A renderer that calls `function` of `wallfinder.report.{module}` with the result (and
    the width, where `width`), importing that module only when it is called: what draws a
    format (rich, jinja2) is not loaded to list the formats. (Named by strings, the function
    is checked by the tests, which resolve every registered one.)"""

    module: str
    function: str
    width: bool = False

    def draw(self) -> Callable[..., str]:
        """The function that draws, its module imported."""
        draw: Callable[..., str] = getattr(
            importlib.import_module(f"wallfinder.report.{self.module}"), self.function
        )
        return draw

    def __call__(self, result: Any, options: RenderOptions) -> str:
        draw = self.draw()
        return draw(result, width=options.width) if self.width else draw(result)


_FORMATS: dict[str, Format] = {}


@cache
def _formats() -> tuple[Format, ...]:
    """Every format by rank; the package's modules imported on first use."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return tuple(sorted(_FORMATS.values(), key=lambda f: (f.rank, f.name)))


def formats_of(subject: Subject[Any]) -> tuple[str, ...]:
    """The formats that render `subject`, by rank."""
    return tuple(f.name for f in _formats() if subject in f.renderers)


def rendered(subject: Subject[T], result: T, fmt: str, options: RenderOptions) -> str:
    """`result` in format `fmt`. Raises ValueError for a format that does not render it."""
    known = {f.name: f for f in _formats()}
    chosen = known.get(fmt)
    render = chosen.renderers.get(subject) if chosen is not None else None
    if render is None and subject.otherwise is not None:
        render = known[subject.otherwise].renderers[subject]
    if render is None:
        raise ValueError(
            f"unknown {subject.name} format {fmt!r}: one of {', '.join(formats_of(subject))}"
        )
    return render(result, options)
