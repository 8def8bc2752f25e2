"""`wallfinder serve LOGDIR`: a local web app over a folder of runs (what the TensorBoard
profiler plugin was), with the verdict on top."""

from __future__ import annotations

import argparse
import importlib.util

from wallfinder.errors import WallfinderError


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    from wallfinder.serve import DEFAULT_HOST, DEFAULT_PORT

    parser.add_argument(
        "logdir",
        help="the folder of runs: one folder per run, holding its trace files "
        "(*.pt.trace.json[.gz], one per rank), Nsight Systems exports or a saved diagnosis.json",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"the port to listen on ({DEFAULT_PORT})"
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"the address to listen on ({DEFAULT_HOST}: this machine only; 0.0.0.0 shows "
        "your traces to the network)",
    )


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("starlette") is None or importlib.util.find_spec("uvicorn") is None:
        raise WallfinderError(
            "wallfinder serve needs starlette and uvicorn: pip install 'wallfinder[serve]'"
        )
    from wallfinder.serve import serve

    serve(args.logdir, host=args.host, port=args.port)
    return 0
