"""Fixtures the integration tests share: the session's one headless Chromium (Playwright's
sync API runs one instance per process, so every browser test module must use this one) and
the folder its screenshots go to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browsers import find_chromium, install_chromium


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')"
    )
    path = find_chromium()
    if path is None:
        path, why = install_chromium()
        if path is None:
            pytest.skip(
                f"no Chromium for the browser tests: {why}. Install Debian's chromium "
                "(apt-get install -y chromium) or set WALLFINDER_CHROMIUM"
            )
    with sync_api.sync_playwright() as playwright:
        try:
            chromium = playwright.chromium.launch(executable_path=path)
        except sync_api.Error as exc:
            pytest.skip(f"Chromium at {path} does not start: {str(exc).splitlines()[0]}")
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.getbasetemp() / "report-screenshots"
    folder.mkdir(exist_ok=True)
    return folder
