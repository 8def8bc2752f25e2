"""`wallfinder serve LOGDIR`: a local web app over a folder of runs, what the retired
TensorBoard profiler plugin was, with wallfinder's verdict on top: the runs with their
verdicts, each run's views (the HTML report's sections and figures), the diff of two runs and
a job's history. New and changed runs are picked up while it serves (`Runs.poll`), and
diagnosed in a background thread, the parse cache making a second look instant.

The app is `wallfinder.serve.app.create_app(Runs.of(logdir))`; this module imports neither it
nor the server library until `serve` runs, so that `wallfinder serve --help` needs neither.
"""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from wallfinder.errors import WallfinderError

if TYPE_CHECKING:
    from wallfinder.serve.runs import Runs

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "POLL_S", "serve", "watch"]

DEFAULT_HOST = "127.0.0.1"
"""This machine only, unless `--host` says otherwise."""
DEFAULT_PORT = 6006
"""TensorBoard's port: where its users' bookmarks and SSH tunnels already point."""
POLL_S = 2.0
"""How often the folder is looked at again."""


def watch(runs: Runs, stop: threading.Event, every_s: float = POLL_S) -> threading.Thread:
    """Start a daemon thread that polls `runs`' folder and diagnoses what is new, until
    `stop` is set."""

    def loop() -> None:
        while not stop.is_set():
            runs.poll()
            runs.work()
            stop.wait(every_s)

    thread = threading.Thread(target=loop, name="wallfinder-serve-watch", daemon=True)
    thread.start()
    return thread


def serve(logdir: str | Path, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve `logdir`'s runs at http://host:port/ until interrupted (Ctrl-C).
    Raises `WallfinderError` when `logdir` is not a folder or the address cannot be used."""
    import uvicorn

    from wallfinder.serve.app import create_app
    from wallfinder.serve.runs import Runs

    runs = Runs.of(logdir)
    _check_free(host, port)
    runs.poll()  # the list is there at the first request; the diagnoses follow
    shown = f"[{host}]" if ":" in host else host
    n = len(runs.all())
    print(f"wallfinder serve: {n} run{'' if n == 1 else 's'} in {logdir}", file=sys.stderr)
    print(f"wallfinder serve: open http://{shown}:{port}/  (Ctrl-C stops it)", file=sys.stderr)
    stop = threading.Event()
    watch(runs, stop)
    try:
        uvicorn.run(create_app(runs), host=host, port=port, log_level="warning", access_log=False)
    finally:
        stop.set()


def _check_free(host: str, port: int) -> None:
    """Refuse, in one line, an address the server could not listen on (uvicorn would log it
    and exit 1)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise WallfinderError(f"--host {host}: not an address here ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            raise WallfinderError(
                f"cannot listen on {host}:{port} ({exc.strerror}): choose another --port"
            ) from None
