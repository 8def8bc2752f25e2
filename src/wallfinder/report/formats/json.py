"""The result contract: every result as its JSON (`to_json`), one line."""

from __future__ import annotations

from typing import Protocol

from wallfinder.report.formats import SUBJECTS, Format, RenderOptions


class _Contract(Protocol):
    def to_json(self) -> str: ...


def _json(result: _Contract, options: RenderOptions) -> str:
    return result.to_json() + "\n"


JSON = Format("json", rank=1)
JSON.draws(dict.fromkeys(SUBJECTS, _json))
