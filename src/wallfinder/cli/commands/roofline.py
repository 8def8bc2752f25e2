"""`wallfinder roofline`: the roofline calculator for an op, a shape and a dtype on a device."""

from __future__ import annotations

import argparse
import sys

from wallfinder.api import (
    DEFAULT_DTYPE,
    Calculation,
    calculate,
    cost_of,
    dtype_defaulted,
    fusion,
)
from wallfinder.cli.commands.analyze import add_device_options
from wallfinder.errors import WallfinderError
from wallfinder.hardware import DeviceSpec, get_spec, load_spec_file
from wallfinder.hardware.profile import load_device_profile
from wallfinder.report import render_calculation


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 32,2048,4096: {text!r}") from None


def prepare_parser(parser: argparse.ArgumentParser) -> None:
    add_device_options(parser)
    parser.add_argument(
        "--dtype",
        help=f"fp64, fp32, tf32, bf16, fp16, fp8, int8 (default: {DEFAULT_DTYPE}, said so)",
    )
    parser.add_argument(
        "--op",
        help="an op: matmul, gelu, silu, add, layer_norm, rms_norm, softmax, dropout, "
        "residual_add, bias_add, to:fp32, ...",
    )
    parser.add_argument("--shape", type=_ints, default=(), help="tensor shape, e.g. 32,2048,4096")
    parser.add_argument("--mnk", type=_ints, help="matmul sizes M,N,K")
    parser.add_argument("--flops-per-element", type=float, help="FLOPs per element (--op)")
    parser.add_argument("--flops", type=float, help="FLOPs, with --bytes, instead of --op")
    parser.add_argument("--bytes", type=float, help="bytes moved, with --flops")
    parser.add_argument(
        "--fuse",
        help="a chain of ops on one --shape tensor, each fed the last one's output, e.g. "
        "matmul,layer_norm,dropout or gelu,residual_add (add, mul: a scalar operand; bias_add, "
        "residual_add: a tensor; to:fp32 casts); a first matmul writes --shape, K from --mnk",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")


def _spec(args: argparse.Namespace) -> DeviceSpec:
    spec = None
    if args.spec is not None:
        spec = load_spec_file(args.spec)
    elif args.device is not None:
        spec = get_spec(args.device)
    elif args.device_profile is None:
        raise WallfinderError(
            "name the device with --device (e.g. H100 or h100-sxm), or give --spec FILE or "
            "--device-profile FILE"
        )
    if args.device_profile is not None:
        return load_device_profile(args.device_profile).over(spec)
    assert spec is not None
    return spec


def _mnk(sizes: tuple[int, ...] | None) -> tuple[int, int, int] | None:
    if sizes is None:
        return None
    if len(sizes) != 3:
        raise WallfinderError(f"--mnk takes three sizes M,N,K, got {list(sizes)}")
    return (sizes[0], sizes[1], sizes[2])


def compute(args: argparse.Namespace) -> Calculation:
    result = _compute(args, args.dtype or DEFAULT_DTYPE)
    return result if args.dtype is not None else dtype_defaulted(result)


def _compute(args: argparse.Namespace, dtype: str) -> Calculation:
    spec = _spec(args)
    mnk = _mnk(args.mnk)
    if args.fuse:
        ops = [op.strip() for op in args.fuse.split(",")]
        return fusion(spec, dtype, ops, args.shape, mnk=mnk)
    if args.flops is not None or args.bytes is not None:
        if args.flops is None or args.bytes is None:
            raise WallfinderError("--flops and --bytes go together")
        return calculate(spec, dtype, args.flops, args.bytes, what="given FLOPs and bytes")
    if args.op is None and args.mnk is None:
        raise WallfinderError(
            "say what to compute: --op (with --shape or --mnk), --flops and --bytes, or --fuse"
        )
    op = args.op or "matmul"
    cost = cost_of(op, dtype, shape=args.shape, mnk=mnk, flops_per_element=args.flops_per_element)
    what = f"{op} {list(mnk) if mnk else list(args.shape)}"
    return calculate(spec, dtype, cost.flops, cost.bytes, what=what)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(render_calculation(compute(args), args.format))
    return 0
