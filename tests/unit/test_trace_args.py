"""Event arguments read through the Trace's typed accessors: an op's shapes, dtypes and scalar
inputs, a kernel's grid, a collective's arguments, each record decoded once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracegen import TraceBuilder
from wallfinder.trace import NONE, CollectiveArgs, Kind, OpArgs, Tensor, Trace, load_trace
from wallfinder.trace.args import read_op_args

BF16 = "c10::BFloat16"


def op_trace(tmp_path: Path) -> Trace:
    """Two calls of one `aten::mm` record, a `aten::add` with a scalar, and an op whose
    record is not parallel lists."""
    b = TraceBuilder()
    mm = {"Input Dims": [[64, 128], [128, 256]], "Input type": [BF16, BF16]}
    b.host("aten::mm", 0.0, 10.0, args=mm)
    b.host("aten::mm", 20.0, 10.0, args=mm)
    add = {
        "Input Dims": [[8], [], []],
        "Input type": ["float", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "2", "0.5"],
    }
    b.host("aten::add", 40.0, 10.0, args=add)
    b.host("aten::bad", 60.0, 10.0, args={"Input Dims": [[8]], "Input type": ["float", "int"]})
    b.kernel("k", 100.0, 5.0)
    return load_trace(b.write(tmp_path / "t.json"))


def codes(t: Trace, name: str) -> tuple[int, int, int]:
    ops = t.of_kind(Kind.CPU_OP)
    i = [t.strings[c] for c in ops.name.tolist()].index(name)
    return int(ops.input_dims[i]), int(ops.input_type[i]), int(ops.concrete_inputs[i])


def test_an_ops_shapes_and_dtypes_are_decoded_once_per_record(tmp_path: Path) -> None:
    t = op_trace(tmp_path)
    args = t.op_args(*codes(t, "aten::mm"))
    assert args is not None
    assert args.tensors() == [Tensor((64, 128), "bf16"), Tensor((128, 256), "bf16")]
    assert not args.has_concrete()
    # Both calls share the record's codes, and the decoded arguments.
    assert t.op_args(*codes(t, "aten::mm")) is args
    assert t.input_dtypes(codes(t, "aten::mm")[1]) == ("bf16", "bf16")
    assert t.shapes_text(codes(t, "aten::mm")[0]) == "[[64, 128], [128, 256]]"  # as written


def test_scalar_inputs_are_read_as_recorded(tmp_path: Path) -> None:
    t = op_trace(tmp_path)
    args = t.op_args(*codes(t, "aten::add"))
    assert args is not None
    assert args.tensor(0) == Tensor((8,), "fp32")
    assert args.integer(1) == 2
    assert args.number(2) == 0.5
    assert args.floating_scalar()
    assert t.input_dtypes(codes(t, "aten::add")[1]) == ("fp32", None, None)


def test_records_that_say_nothing_usable_give_none(tmp_path: Path) -> None:
    t = op_trace(tmp_path)
    assert t.op_args(*codes(t, "aten::bad")) is None
    assert t.op_args(0, 0, 0) is None
    assert t.input_dtypes(0) is None
    assert read_op_args(b"[[2, 2]", b'["float"]') is None  # not JSON


def test_a_kernels_grid_and_its_blocks(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.kernel("a", 0.0, 5.0, args={"grid": [27, 2, 1]})
    b.kernel("b", 10.0, 5.0, args={"grid": [0, 1, 1]})
    b.kernel("c", 20.0, 5.0, args={"grid": "unknown"})
    t = load_trace(b.write(tmp_path / "t.json"))
    kernels = t.of_kind(Kind.KERNEL)
    grids = [t.grid(int(c)) for c in kernels.grid.tolist()]
    assert grids == [(27, 2, 1), None, None]
    assert [t.blocks(int(c)) for c in kernels.grid.tolist()] == [54, 0, 0]
    assert t.grid(0) is None


def test_a_collectives_arguments(tmp_path: Path) -> None:
    b = TraceBuilder(rank=0, world_size=4)
    b.nccl(0.0, 100.0, collective="allreduce", nelems=1024, group="7", group_size=4)
    b.nccl(200.0, 100.0, collective="allgather", nelems=8, dtype="ComplexDouble")
    b.nccl(400.0, 100.0, collective="broadcast", nelems=8, dtype="NotAType")
    b.nccl(600.0, 100.0)  # no arguments recorded
    t = load_trace(b.write(tmp_path / "t.json"))
    found = [t.collective(int(c)) for c in t.of_kind(Kind.KERNEL).comm.tolist()]
    assert found[0] == CollectiveArgs(
        name="allreduce",
        in_nelems=1024,
        out_nelems=1024,
        dtype="bf16",
        group_size=4,
        group="7",
        group_ranks="[0, 1, 2, 3]",
        seq=NONE,
    )
    assert found[0] is not None
    assert found[0].nbytes == 2048
    assert found[1] is not None
    assert found[1].nbytes == 8 * 16
    assert found[2] is not None
    assert (found[2].dtype, found[2].nbytes) == (None, NONE)
    assert found[3] is None


def test_op_args_of_a_users_shapes_read_as_a_recorded_call() -> None:
    built = OpArgs.of([(64, 128), (128, 256)], ["bf16", "bf16"])
    recorded = read_op_args(b"[[64, 128], [128, 256]]", b'["c10::BFloat16", "c10::BFloat16"]')
    assert recorded is not None
    assert built.tensors() == recorded.tensors()
    assert built.clean
    assert recorded.clean
    beyond_int64 = OpArgs.of([(2**70, 2)], ["fp32"])
    assert beyond_int64.tensor(0) is None
    assert not beyond_int64.clean
    with pytest.raises(ValueError, match="2 shapes for 1 dtypes"):
        OpArgs.of([(1,), (2,)], ["fp32"])
