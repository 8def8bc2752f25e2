"""The roofline calculator (`wallfinder roofline`) answers the questions a roofline tutorial
asks, with the arithmetic worked by hand beside each figure: the extra bytes of an unfused
MatMul + LayerNorm + Dropout, a GEMM's arithmetic intensity and bound on a named device, and
the time a memory-bound op takes at the device's bandwidth. Then each op it can cost, the
rules of a chain, and how durations are written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from wallfinder.cli import main
from wallfinder.cost.elementwise import TRANSCENDENTAL_FLOPS
from wallfinder.units import duration

# The tutorial's tensor: [32, 2048, 4096] fp16.
ELEMENTS = 32 * 2048 * 4096  # 268,435,456
TENSOR_BYTES = ELEMENTS * 2  # 536,870,912 B = 512 MiB
H100_BANDWIDTH = 3.35e12  # H100 SXM HBM3, datasheet
H100_FP16 = 989.5e12  # H100 SXM dense fp16/bf16 tensor, datasheet (1979 sparse, halved)
A100_BANDWIDTH = 2.039e12  # A100 80GB SXM HBM2e, datasheet


def roofline(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["roofline", *args, "--format", "json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def roofline_text(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["roofline", *args]) == 0
    return capsys.readouterr().out


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["roofline", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wallfinder: error:")
    assert err.count("\n") == 1
    return err


# --- The tutorial's three checkpoint questions --------------------------------------------------

CHAIN = ("--device", "h100-sxm", "--dtype", "fp16", "--shape", "32,2048,4096")


def test_tutorial_unfused_matmul_layer_norm_dropout_moves_2_gib_more(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # "An unfused MatMul + LayerNorm + Dropout on [32, 2048, 4096] fp16: how many extra bytes?"
    out = roofline(capsys, *CHAIN, "--fuse", "matmul,layer_norm,dropout")
    assert out["mem_bandwidth"] == H100_BANDWIDTH
    # Unfused, the matmul writes T1 (512 MiB), layer_norm reads T1 and writes T2, dropout
    # reads T2. Fused, T1 and T2 stay on chip: two intermediates, each written and read back:
    # 2 × 2 × 536,870,912 B = 2,147,483,648 B = 2 GiB.
    assert out["extra_bytes"] == 2 * 2 * TENSOR_BYTES == 2**31
    # At 3.35 TB/s: 2,147,483,648 / 3.35e12 = 641.0 µs.
    assert out["extra_bytes_time_s"] == pytest.approx(641.04e-6, rel=1e-4)
    # What each op moves alone. The matmul's K is not given: taken as N = 4096, said so.
    # matmul: A [65536, 4096] + B [4096, 4096] read, C [65536, 4096] written, 2 B each:
    #   (2 × 268,435,456 + 16,777,216) × 2 = 1,107,296,256 B.
    # layer_norm: x read, weight and bias [4096] read, y written: (2 × 268,435,456 + 8192) × 2.
    # dropout (training): x read, y written (2 B each), a one-byte mask: 268,435,456 × 5.
    mm, ln, drop = out["ops"]
    assert mm["bytes"] == (2 * ELEMENTS + 4096 * 4096) * 2 == 1_107_296_256
    assert mm["flops"] == 2 * 65536 * 4096 * 4096
    assert ln["bytes"] == (2 * ELEMENTS + 2 * 4096) * 2
    assert drop["bytes"] == ELEMENTS * 5
    assert out["bytes"] == mm["bytes"] + ln["bytes"] + drop["bytes"]
    # Fused: A and B and the LN weights read once, the output and the mask written once.
    assert out["fused_bytes"] == out["bytes"] - 2**31
    assert out["fused_bytes"] == (ELEMENTS + 4096 * 4096 + 2 * 4096 + ELEMENTS) * 2 + ELEMENTS
    # The assumption and the training mode are said.
    assert any("K not given, taken as N = 4096" in n for n in out["notes"])
    assert any("dropout as in training" in n for n in out["notes"])
    text = roofline_text(capsys, *CHAIN, "--fuse", "matmul,layer_norm,dropout")
    assert "unfused moves 2.00 GiB more (2.15 GB), 641 µs at 3.35 TB/s" in text
    assert "e+" not in text


def test_tutorial_chain_with_mnk_gives_the_same_extra_bytes_and_no_assumption(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The extra bytes do not depend on K: with K = 1024 they are still 2 GiB; the matmul's
    # own cost does: 2 · 65536 · 4096 · 1024 FLOPs.
    out = roofline(
        capsys, *CHAIN, "--fuse", "matmul,layer_norm,dropout", "--mnk", "65536,4096,1024"
    )
    assert out["extra_bytes"] == 2**31
    assert out["ops"][0]["flops"] == 2 * 65536 * 4096 * 1024
    assert not any("K not given" in n for n in out["notes"])
    # Without --shape, the matmul's [M, N] is the chain's tensor.
    flat = roofline(
        capsys, "--device", "h100-sxm", "--dtype", "fp16", "--mnk", "65536,4096,4096",
        "--fuse", "matmul,layer_norm,dropout",
    )  # fmt: skip
    assert flat["extra_bytes"] == 2**31


def test_tutorial_gemm_intensity_and_bound_on_h100(capsys: pytest.CaptureFixture[str]) -> None:
    # "What is the arithmetic intensity of a 4096 × 4096 × 4096 fp16 GEMM, and is it compute-
    # or bandwidth-bound on an H100 SXM?"
    out = roofline(capsys, "--device", "h100-sxm", "--dtype", "fp16", "--mnk", "4096,4096,4096")
    # FLOPs 2·M·N·K = 2 · 4096³ = 137,438,953,472; bytes (MK + KN + MN) · 2 = 3 · 4096² · 2
    # = 100,663,296; AI = 137,438,953,472 / 100,663,296 = 1365.3 FLOP/B.
    assert out["flops"] == 137_438_953_472
    assert out["bytes"] == 100_663_296
    assert out["ai"] == pytest.approx(1365.33, abs=0.01)
    # Ridge 989.5e12 / 3.35e12 = 295.4 FLOP/B < 1365: compute-bound, 137.4e9 / 989.5e12 = 139 µs.
    assert out["peak_flops"] == H100_FP16
    assert out["ridge"] == pytest.approx(295.37, abs=0.01)
    assert out["bound"] == "compute"
    assert out["time_floor_s"] == pytest.approx(138.90e-6, rel=1e-4)
    # The same weights for one token (M = 1, a decode step): FLOPs 2 · 4096² = 33,554,432;
    # bytes (4096 + 4096² + 4096) · 2 = 33,570,816; AI 0.9995: bandwidth-bound, and its floor
    # is the weights' read: 33,570,816 / 3.35e12 = 10.02 µs.
    decode = roofline(capsys, "--device", "h100-sxm", "--dtype", "fp16", "--mnk", "1,4096,4096")
    assert decode["ai"] == pytest.approx(0.9995, abs=1e-4)
    assert decode["bound"] == "bandwidth"
    assert decode["time_floor_s"] == pytest.approx(10.021e-6, rel=1e-4)
    text = roofline_text(
        capsys, "--device", "h100-sxm", "--dtype", "fp16", "--mnk", "4096,4096,4096"
    )
    assert "arithmetic intensity 1365 FLOP/B" in text
    assert "compute-bound" in text
    assert "time floor 139 µs" in text


def test_tutorial_memory_bound_op_time_at_the_bandwidth(capsys: pytest.CaptureFixture[str]) -> None:
    # "How long does a GELU on a [32, 2048, 4096] fp16 tensor take on an A100 80GB?"
    out = roofline(
        capsys, "--device", "a100-sxm4-80gb", "--dtype", "fp16", "--op", "gelu",
        "--shape", "32,2048,4096",
    )  # fmt: skip
    # Read 512 MiB, write 512 MiB: 1,073,741,824 B. AI = (4 + 4) FLOPs / 4 B = 2: far under the
    # ridge (312e12 / 2.039e12 = 153), so the time is the bytes at the bandwidth:
    # 1,073,741,824 / 2.039e12 = 526.6 µs.
    assert out["mem_bandwidth"] == A100_BANDWIDTH
    assert out["bytes"] == 2 * TENSOR_BYTES
    assert out["ai"] == 2.0
    assert out["bound"] == "bandwidth"
    assert out["time_floor_s"] == pytest.approx(526.60e-6, rel=1e-4)
    text = roofline_text(
        capsys, "--device", "a100-sxm4-80gb", "--dtype", "fp16", "--op", "gelu",
        "--shape", "32,2048,4096",
    )  # fmt: skip
    assert "time floor 527 µs" in text


# --- Each op the calculator costs ---------------------------------------------------------------

N, D = 1024, 512  # a [1024, 512] bf16 tensor: 524,288 elements, 1 MiB
EL = N * D
EXP = TRANSCENDENTAL_FLOPS


@pytest.mark.parametrize(
    ("op", "flops", "nbytes"),
    [
        # Unary pointwise: read x, write y, 2 B each.
        ("gelu", EL * (EXP + 4), EL * 4),
        ("silu", EL * (EXP + 3), EL * 4),
        ("relu", EL, EL * 4),
        # Binary with a scalar operand: the same traffic.
        ("add", EL, EL * 4),
        ("mul", EL, EL * 4),
        # residual_add reads a second [1024, 512]; bias_add a [512] bias.
        ("residual_add", EL, EL * 6),
        ("bias_add", EL, EL * 4 + D * 2),
        # Norms over the last dimension: statistics 4 + affine 1 (RMS: 3 + 1); weight, bias read.
        ("layer_norm", EL * 5, EL * 4 + 2 * D * 2),
        ("rms_norm", EL * 4, EL * 4 + D * 2),
        # Over channels (dim 1: 512): weight, bias and (batch norm) running mean and variance.
        ("group_norm", EL * 5, EL * 4 + 2 * D * 2),
        ("batch_norm", EL * 5, EL * 4 + 4 * D * 2),
        # Softmax: max, subtract, exp, sum, divide.
        ("softmax", EL * (EXP + 4), EL * 4),
        # Dropout in training: draw, compare, scale; x, y and a one-byte mask.
        ("dropout", EL * 3, EL * 5),
        # A cast: read bf16, write fp32.
        ("to:fp32", 0, EL * (2 + 4)),
    ],
)
def test_each_op_is_costed_as_the_profiler_would_record_it(
    capsys: pytest.CaptureFixture[str], op: str, flops: int, nbytes: int
) -> None:
    out = roofline(capsys, "--device", "h100-sxm", "--op", op, "--shape", f"{N},{D}")
    assert (out["flops"], out["bytes"]) == (flops, nbytes)


# --- Chains -----------------------------------------------------------------------------------


def test_a_cast_in_a_chain_changes_the_intermediates_dtype(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # gelu (bf16) → to:fp32 → softmax (fp32). Intermediates: gelu's bf16 output (2 B) and the
    # cast's fp32 output (4 B), each written and read back: (2 + 4) · 2 · EL.
    out = roofline(
        capsys, "--device", "h100-sxm", "--fuse", "gelu,to:fp32,softmax", "--shape", f"{N},{D}"
    )
    assert out["extra_bytes"] == (2 + 4) * 2 * EL
    assert out["ops"][2]["bytes"] == EL * 8  # fp32 in, fp32 out
    # Fused: bf16 read once, fp32 written once.
    assert out["fused_bytes"] == EL * (2 + 4)


def test_unfused_floor_is_each_ops_own_and_fusion_saves_the_difference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = roofline(capsys, *CHAIN, "--fuse", "matmul,gelu,residual_add")
    floors = [o["time_floor_s"] for o in out["ops"]]
    assert out["time_floor_s"] == pytest.approx(sum(floors))
    # The matmul is compute-bound and the others bandwidth-bound, each alone.
    assert [o["bound"] for o in out["ops"]] == ["compute", "bandwidth", "bandwidth"]
    # Fused, the chain's FLOPs at the peak outweigh its bytes at the bandwidth.
    assert out["fused_time_floor_s"] == pytest.approx(out["flops"] / out["peak_flops"])
    assert out["time_saved_s"] == pytest.approx(out["time_floor_s"] - out["fused_time_floor_s"])
    # residual_add's second operand is read fused too: only the two intermediates are extra.
    assert out["extra_bytes"] == 2 * 2 * TENSOR_BYTES


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fuse", "layer_norm,matmul", "--shape", "4,4"], "a matmul can only start"),
        (["--fuse", "matmul,gelu"], "needs the matmul's output shape"),
        (["--fuse", "gelu,relu", "--shape", "4,4", "--mnk", "4,4,4"], "this --fuse chain has none"),
        (
            ["--fuse", "matmul,gelu", "--shape", "32,2048,4096", "--mnk", "8192,4096,4096"],
            "that needs M = 32·2048 = 65536 and N = 4096",
        ),
        (["--fuse", "gelu,to", "--shape", "4,4"], "say the dtype to cast to"),
        (["--fuse", "gelu,to:fp99", "--shape", "4,4"], "say the dtype to cast to"),
        (["--fuse", "group_norm,relu", "--shape", "4096"], "give --shape N,C"),
        (["--op", "matmul", "--shape", "4,4"], "needs --mnk M,N,K"),
        (["--fuse", "gelu", "--shape", "4,4"], "at least two ops"),
        (["--fuse", "glu,relu", "--shape", "4,4"], "a --fuse chain keeps one shape"),
    ],
)
def test_a_chain_that_cannot_be_costed_is_refused_with_what_is_missing(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert message in refused(capsys, "--device", "h100-sxm", *args)


# --- Durations --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (4.9e-3, "4.90 ms"),
        (6.4104e-4, "641 µs"),
        (1.0021e-5, "10.0 µs"),
        (9.9996e-6, "10.0 µs"),
        (9.996e-4, "1.00 ms"),  # 999.6 µs rounds to 1000 µs: one unit up
        (2.5e-6, "2.50 µs"),
        (8.5e-7, "850 ns"),
        (1.25, "1.25 s"),
        (4900.0, "4900 s"),
        (0.0, "0 s"),
        (-2e-3, "-2.00 ms"),
        (1e-12, "< 1 ns"),
        (None, "?"),
    ],
)
def test_durations_read_as_people_write_them(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--flops", "-1e12", "--bytes", "1e9"), "must be non-negative numbers, not -1e+12 FLOPs"),
        (("--flops", "1e12", "--bytes", "-5"), "not 1e+12 FLOPs and -5 bytes"),
        (("--op", "gelu", "--shape", "-32,4096"), "--shape must be positive integers"),
        (("--mnk", "-1,2,3"), "--mnk must be positive integers"),
    ],
)
def test_a_negative_number_is_read_as_a_value_and_refused_for_what_it_is(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    """argparse before 3.13 took `-1e12` for an option ("expected one argument")."""
    err = refused(capsys, "--device", "a100", *args)
    assert message in err
    assert "expected one argument" not in err


def test_a_dtype_not_named_is_said_to_be_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    """`--op gelu` alone is costed in bf16; the output says it assumed so, first."""
    out = roofline(capsys, "--device", "a100", "--op", "gelu", "--shape", "32,4096")
    assert out["dtype"] == "bf16"
    assert out["notes"][0] == "no dtype named: bf16 assumed (the default; --dtype names another)"
    text = roofline_text(capsys, "--device", "a100", "--op", "gelu", "--shape", "32,4096")
    assert "note: no dtype named: bf16 assumed" in text
    named = roofline(
        capsys, "--device", "a100", "--op", "gelu", "--shape", "32,4096", "--dtype", "bf16"
    )
    assert not any("no dtype named" in n for n in named["notes"])
    fused = roofline(capsys, "--device", "a100", "--fuse", "gelu,add", "--shape", "32,4096")
    assert fused["notes"][0].startswith("no dtype named: bf16 assumed")
