"""Event arguments decoded into types: an op call's shapes, dtypes and scalar inputs, a
kernel's grid, a collective's message. This is the one place that reads their recorded text;
`Trace.op_args`, `Trace.grid` and `Trace.collective` decode each distinct record once.

Kineto records an op's arguments as three parallel JSON lists: `Input Dims` (a shape per
argument: `[]` for scalars and absent optionals, a list of shapes for a TensorList), `Input
type` (the element type, or "Scalar", "ScalarList", "TensorList", "") and `Concrete Inputs`
(the text of scalar arguments, "" for tensors). `OpArgs` reads them once and answers a cost
model's questions ("the tensor at position 2", "the int list at position 4") with None whenever
the answer is not in the record, so a model never has to guess.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec

from wallfinder.dtypes import ELEMENT_BYTES, dtype_of_code, dtype_of_name
from wallfinder.trace.model import NONE

__all__ = [
    "MAX_DIM",
    "TENSOR_LIST_DTYPE",
    "CollectiveArgs",
    "OpArgs",
    "Tensor",
    "collective_of",
    "decode",
    "dtypes_of",
    "grid_of",
    "op_args_of",
    "read_op_args",
]

MAX_DIM = 2**63 - 1
"""Largest size a tensor dimension can have (sizes are int64 in PyTorch)."""

TENSOR_LIST_DTYPE = "fp32"
"""Kineto records no element type for a TensorList (its `Input type` is just "TensorList"),
so list elements are taken to be fp32: optimizer states and the master weights of
mixed-precision training are fp32. A bf16 optimizer moves half the bytes said."""

T = TypeVar("T")

BAD: Any = object()
"""What `decode` returns for text that is absent or not JSON (no JSON value is this)."""


def decode(raw: bytes) -> Any:
    """The JSON value of a recorded argument's text; `BAD` when it is empty or not JSON."""
    if not raw:
        return BAD
    try:
        return msgspec.json.decode(raw)
    except (ValueError, RecursionError):
        return BAD


class Tensor(msgspec.Struct, frozen=True):
    """A tensor argument: its shape and dtype key."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


class OpArgs:
    """The arguments of one op call, by position. `clean` is False when some argument looked
    like a tensor but its shape or dtype is unusable: the arguments' total bytes are then
    unknown. `lists` holds the TensorList arguments by position."""

    __slots__ = ("_concrete", "_scalars", "_tensors", "clean", "lists", "size")

    def __init__(
        self,
        tensors: list[Tensor | None],
        lists: dict[int, list[Tensor]],
        scalars: list[int],
        concrete: list[str | None] | None,
        clean: bool,
    ) -> None:
        self._tensors = tensors
        self._scalars = scalars
        self._concrete = concrete
        self.lists = lists
        self.size = len(tensors)
        self.clean = clean

    @classmethod
    def of(
        cls,
        shapes: Sequence[Sequence[int]],
        dtypes: Sequence[str],
        concrete: Sequence[str | None] | None = None,
    ) -> OpArgs:
        """The arguments of a call on tensors of these shapes and dtypes (keys or any spelling
        `wallfinder.dtypes` knows), read as if a trace had recorded them; `concrete`: the
        scalars' text by position, as `Concrete Inputs` records it ("True", "0.1", "")."""
        if len(shapes) != len(dtypes) or (concrete is not None and len(concrete) != len(shapes)):
            raise ValueError(f"{len(shapes)} shapes for {len(dtypes)} dtypes")
        values = None if concrete is None else list(concrete)
        return _op_args([list(s) for s in shapes], list(dtypes), values)

    def tensor(self, i: int) -> Tensor | None:
        """The tensor at position `i`; None when there is no usable tensor there."""
        return self._tensors[i] if 0 <= i < self.size else None

    def tensors(self) -> list[Tensor]:
        """Every tensor argument, in order (TensorList elements not included)."""
        return [t for t in self._tensors if t is not None]

    def tensor_list(self, i: int) -> list[Tensor] | None:
        """The TensorList at position `i` (elements typed `TENSOR_LIST_DTYPE`)."""
        return self.lists.get(i)

    def has_concrete(self) -> bool:
        """Whether `Concrete Inputs` was recorded for this call."""
        return self._concrete is not None

    def text(self, i: int) -> str | None:
        """The recorded text of the scalar at position `i`; None when unrecorded or None."""
        if self._concrete is None or not 0 <= i < self.size:
            return None
        return self._concrete[i] or None

    def flag(self, i: int) -> bool | None:
        return _parse_bool(self.text(i))

    def integer(self, i: int) -> int | None:
        return _parse_int(self.text(i))

    def number(self, i: int) -> float | None:
        text = self.text(i)
        if text is None or len(text) > 64:
            return None
        try:
            value = float(text)
        except ValueError:
            return None
        return value if math.isfinite(value) else None

    def ints(self, i: int) -> tuple[int, ...] | None:
        """An int list ("[2, 2]") or a single int ("2") at position `i`."""
        return self._items(i, _parse_int)

    def flags(self, i: int) -> tuple[bool, ...] | None:
        """A bool list ("[True, False, True]") at position `i`."""
        return self._items(i, _parse_bool)

    def _items(self, i: int, parse: Callable[[str], T | None]) -> tuple[T, ...] | None:
        """The list at position `i`, each item parsed; None when any item does not parse."""
        items = _list_items(self.text(i))
        if items is None:
            return None
        values = [parse(s) for s in items]
        return None if any(v is None for v in values) else tuple(v for v in values if v is not None)

    def floating_scalar(self) -> bool:
        """Whether a Python-number argument ("Scalar") was recorded as a float ("0.5")."""
        for i in self._scalars:
            text = self.text(i)
            if text is not None and _parse_int(text) is None and _parse_bool(text) is None:
                return True
        return False

    def dtype_arg(self, i: int) -> str | None:
        """A dtype argument at position `i` (a ScalarType code in the record)."""
        code = self.integer(i)
        return None if code is None else dtype_of_code(code)


def _parse_int(text: str | None) -> int | None:
    # Python's int() accepts "1_000" and surrounding spaces; a record never has them, but they
    # are harmless. Long strings are refused before int() has to convert them.
    if text is None or len(text) > 32:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _parse_bool(text: str | None) -> bool | None:
    return {"True": True, "False": False, "true": True, "false": False}.get(text or "")


def _list_items(text: str | None) -> list[str] | None:
    if text is None:
        return None
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [s.strip() for s in inner.split(",")] if inner else []
    return [text]


def _shape(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list):
        return None
    # `type(d) is int` also refuses bools, which JSON `true` decodes to.
    if all(type(d) is int and 0 <= d <= MAX_DIM for d in value):
        return tuple(value)
    return None


def op_args_of(dims: Any, types: Any, concrete: Any = BAD) -> OpArgs | None:
    """The arguments recorded for one op call, from the decoded `Input Dims`, `Input type`
    and `Concrete Inputs` (`BAD` when absent); None when the shapes or types are missing or
    not parallel lists. An unusable `Concrete Inputs` is ignored (a cost model then works
    without scalar arguments)."""
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None
    texts: list[str | None] | None = None
    if isinstance(concrete, list) and len(concrete) == len(dims):
        texts = [s if isinstance(s, str) else None for s in concrete]
    return _op_args(dims, types, texts)


def read_op_args(dims: bytes, types: bytes, concrete: bytes = b"") -> OpArgs | None:
    """The arguments of an op call from the JSON text of its `Input Dims`, `Input type` and
    `Concrete Inputs` (b"" when unrecorded), as `Trace.op_args` reads them."""
    return op_args_of(decode(dims), decode(types), decode(concrete))


def _op_args(dims: list[Any], types: list[Any], concrete: list[str | None] | None) -> OpArgs:
    tensors: list[Tensor | None] = []
    lists: dict[int, list[Tensor]] = {}
    scalars: list[int] = []
    clean = True
    for i, (dim, name) in enumerate(zip(dims, types, strict=True)):
        tensor: Tensor | None = None
        if not isinstance(name, str):
            clean = False
        elif name == "Scalar":
            scalars.append(i)
            clean = clean and dim == []
        elif name == "TensorList":
            items = [_shape(d) for d in dim] if isinstance(dim, list) else [None]
            if any(s is None for s in items):
                clean = False
            else:
                lists[i] = [Tensor(s, TENSOR_LIST_DTYPE) for s in items if s is not None]
        else:
            dtype = dtype_of_name(name)
            shape = _shape(dim)
            if dtype is not None and shape is not None:
                tensor = Tensor(shape, dtype)
            elif dtype is not None or shape != ():
                # A tensor dtype with a bad shape, or a shape with no known dtype.
                clean = False
        tensors.append(tensor)
    return OpArgs(tensors, lists, scalars, concrete, clean)


def dtypes_of(types: Any) -> tuple[str | None, ...] | None:
    """The dtype key of each argument of a decoded `Input type` (None where an argument is no
    tensor: "Scalar", "", a TensorList); None when the record is not a list."""
    if not isinstance(types, list):
        return None
    return tuple(dtype_of_name(t) if isinstance(t, str) else None for t in types)


def grid_of(grid: Any) -> tuple[int, ...] | None:
    """A kernel's decoded `grid` ([x, y, z] blocks); None unless it is a list of positive
    integers."""
    if not isinstance(grid, list) or not all(isinstance(v, int) and v > 0 for v in grid):
        return None
    return tuple(int(v) for v in grid)


class CollectiveArgs(msgspec.Struct, frozen=True):
    """What a collective's event records about it (NCCL kernels and `record_param_comms` ops
    of recent PyTorch releases): integers are NONE (-1) where the record has none."""

    name: str
    """`Collective name` as recorded ("allreduce", "_allgather_base"), "" when absent."""
    in_nelems: int
    out_nelems: int
    dtype: str | None
    """The dtype key of the message's elements, None when absent or unknown."""
    group_size: int
    group: str
    """`Process Group Name`, "" when absent."""
    group_ranks: str
    """`Process Group Ranks` as recorded ("[0, 1, 2, 3]"), "" when absent."""
    seq: int

    @property
    def nbytes(self) -> int:
        """The message's size in bytes: the larger of its input and output element counts
        times the element size; NONE when no count or the element size is unknown."""
        counts = [n for n in (self.in_nelems, self.out_nelems) if n >= 0]
        width = ELEMENT_BYTES.get(self.dtype) if self.dtype is not None else None
        return max(counts) * width if counts and width else NONE


def collective_of(values: Any) -> CollectiveArgs | None:
    """Decoded collective arguments: the JSON array the loader stores for an event with a
    `Collective name` (name, in and out element counts, dtype, group size, group name, group
    ranks, sequence number); None for anything else."""
    if not isinstance(values, list) or len(values) < 8:
        return None
    name, n_in, n_out, dtype, size, group, ranks, seq = values[:8]
    return CollectiveArgs(
        name=str(name or ""),
        in_nelems=_count(n_in),
        out_nelems=_count(n_out),
        dtype=dtype_of_name(dtype) if isinstance(dtype, str) else None,
        # bool is an int here as it always was: `true` reads as 1.
        group_size=int(size) if isinstance(size, int) else NONE,
        group=str(group) if group not in (None, "") else "",
        group_ranks=str(ranks) if ranks not in (None, "") else "",
        seq=_count(seq),
    )


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int) and value >= 0 else NONE


class ArgsTable:
    """Typed views of a trace's table of recorded argument texts (`Trace.raw`): each text is
    decoded on first use and kept, so a trace that repeats one record a million times decodes
    it once. Behind `Trace.op_args`, `Trace.grid`, `Trace.collective` and the rest."""

    def __init__(self, raw: Sequence[bytes]) -> None:
        self._raw = raw
        self._values: dict[int, Any] = {}
        self._op_args: dict[tuple[int, int, int], OpArgs | None] = {}
        self._collectives: dict[int, CollectiveArgs | None] = {}
        self._dtypes: dict[int, tuple[str | None, ...] | None] = {}

    def value(self, code: int) -> Any:
        """The decoded JSON of text `code`; `BAD` when it is empty or not JSON."""
        try:
            return self._values[code]
        except KeyError:
            value = self._values[code] = decode(self._raw[code])
            return value

    def op_args(self, dims: int, types: int, concrete: int) -> OpArgs | None:
        key = (dims, types, concrete)
        try:
            return self._op_args[key]
        except KeyError:
            args = op_args_of(self.value(dims), self.value(types), self.value(concrete))
            self._op_args[key] = args
            return args

    def dtypes(self, types: int) -> tuple[str | None, ...] | None:
        try:
            return self._dtypes[types]
        except KeyError:
            found = self._dtypes[types] = dtypes_of(self.value(types))
            return found

    def grid(self, code: int) -> tuple[int, ...] | None:
        return grid_of(self.value(code))

    def text(self, code: int) -> str:
        return self._raw[code].decode("utf-8", "replace")

    def collective(self, code: int) -> CollectiveArgs | None:
        try:
            return self._collectives[code]
        except KeyError:
            args = self._collectives[code] = collective_of(self.value(code))
            return args
