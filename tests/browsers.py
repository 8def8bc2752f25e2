"""Headless Chromium for the browser tests (the HTML report's, `serve`'s): where to find it,
how to install it where that is clearly possible, and how long a page may take to load.
The session's one browser is the fixture in tests/integration/conftest.py: Playwright's sync
API runs one instance per process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CHROMIUMS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
LOAD_TIMEOUT_MS = 20_000


def find_chromium() -> str | None:
    given = os.environ.get("WALLFINDER_CHROMIUM")
    if given:
        return given if Path(given).exists() else None
    for name in CHROMIUMS:
        path = shutil.which(name)
        if path:
            return path
    return None


def install_chromium() -> tuple[str | None, str]:
    """Debian's chromium through apt-get, only where that is clearly possible and quick: on
    Linux, as root, with apt already knowing the package (no index download). The path, or
    None and why not."""
    if os.environ.get("WALLFINDER_NO_BROWSER_INSTALL"):
        return None, "WALLFINDER_NO_BROWSER_INSTALL is set"
    if not sys.platform.startswith("linux") or shutil.which("apt-get") is None:
        return None, "no apt-get to install it with"
    if os.geteuid() != 0:
        return None, "not root, so apt-get cannot install it"
    try:
        policy = subprocess.run(
            ["apt-cache", "policy", "chromium"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"apt-cache failed ({exc})"
    if "Candidate:" not in policy.stdout or "Candidate: (none)" in policy.stdout:
        return None, "apt knows no chromium package (apt-get update first)"
    try:
        done = subprocess.run(
            ["apt-get", "install", "-y", "-q", "chromium"],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"apt-get install chromium failed ({exc})"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"apt-get install chromium failed: {last}"
    path = find_chromium()
    return path, "" if path else "apt-get installed chromium but it is not on PATH"
