"""The cost type and the parsed arguments of one op call, shared by every cost model.

Kineto records an op's arguments as three parallel JSON lists: `Input Dims` (a shape per
argument: `[]` for scalars and absent optionals, a list of shapes for a TensorList), `Input
type` (the element type, or "Scalar", "ScalarList", "TensorList", "") and `Concrete Inputs`
(the text of scalar arguments, "" for tensors). `Args` reads them once and answers the models'
questions ("the tensor at position 2", "the int list at position 4") with None whenever the
answer is not in the record, so a model never has to guess.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from wallfinder.cost.dtypes import ELEMENT_BYTES, dtype_of_code, dtype_of_type_name

MAX_DIM = 2**63 - 1
"""Largest size a tensor dimension can have (sizes are int64 in PyTorch)."""

TENSOR_LIST_DTYPE = "fp32"
"""Kineto records no element type for a TensorList (its `Input type` is just "TensorList"),
so list elements are taken to be fp32: optimizer states and the master weights of
mixed-precision training are fp32. A bf16 optimizer moves half the bytes said."""


@dataclass(frozen=True)
class Cost:
    """The work one op call does, from the shapes and dtypes its trace event recorded.

    `flops` counts a multiply-add as 2, as `torch.utils.flop_counter` does. `bytes` is the
    minimum DRAM traffic: every input read once and every output written once. It is a lower
    bound: re-reads (tiles of a matmul, a second pass over a norm's input), caches and
    intermediates are ignored. `dtype` is the key of the dtype the op computes in, from its
    main inputs ("fp64", "fp32", "bf16", "fp16", "fp8", "int8" have datasheet peaks; integer
    and bool tensors give keys such as "int64"); a trace cannot show TF32, so fp32 matmuls say
    "fp32". `model` names the cost model that produced it: "gemm", "conv", "attention", "norm",
    "softmax", "elementwise", "reduction", "embedding", "loss", "optimizer" or "copy".
    """

    flops: float
    bytes: float
    dtype: str
    model: str


def make_cost(flops: float, nbytes: float, dtype: str, model: str) -> Cost | None:
    """A `Cost`, or None when either number does not fit a finite float."""
    try:
        f, b = float(flops), float(nbytes)
    except OverflowError:
        return None
    if not (math.isfinite(f) and math.isfinite(b)) or f < 0 or b < 0:
        return None
    return Cost(f, b, dtype, model)


@dataclass(frozen=True, slots=True)
class Tensor:
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


class Args:
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
        items = _list_items(self.text(i))
        if items is None:
            return None
        values = [_parse_int(s) for s in items]
        return None if any(v is None for v in values) else tuple(v for v in values if v is not None)

    def flags(self, i: int) -> tuple[bool, ...] | None:
        """A bool list ("[True, False, True]") at position `i`."""
        items = _list_items(self.text(i))
        if items is None:
            return None
        values = [_parse_bool(s) for s in items]
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


def parse_args(input_dims: bytes, input_type: bytes, concrete_inputs: bytes) -> Args | None:
    """The arguments recorded for one op call; None when the shapes or types are missing,
    not JSON, or not parallel lists. An unusable `Concrete Inputs` is ignored (the models
    then work without scalar arguments)."""
    try:
        dims = msgspec.json.decode(input_dims) if input_dims else None
        types = msgspec.json.decode(input_type) if input_type else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None
    concrete: list[str | None] | None = None
    if concrete_inputs:
        try:
            raw = msgspec.json.decode(concrete_inputs)
        except (ValueError, RecursionError):
            raw = None
        if isinstance(raw, list) and len(raw) == len(dims):
            concrete = [s if isinstance(s, str) else None for s in raw]
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
            dtype = dtype_of_type_name(name)
            shape = _shape(dim)
            if dtype is not None and shape is not None:
                tensor = Tensor(shape, dtype)
            elif dtype is not None or shape != ():
                # A tensor dtype with a bad shape, or a shape with no known dtype.
                clean = False
        tensors.append(tensor)
    return Args(tensors, lists, scalars, concrete, clean)


def broadcast(shapes: Iterable[Sequence[int]]) -> tuple[int, ...] | None:
    """The broadcast of `shapes` (NumPy/PyTorch rules); None when they do not broadcast."""
    out: list[int] = []
    for shape in shapes:
        if len(shape) > len(out):
            out = [1] * (len(shape) - len(out)) + out
        offset = len(out) - len(shape)
        for j, d in enumerate(shape):
            o = out[offset + j]
            if o == 1:
                out[offset + j] = d
            elif d not in (1, o):
                return None
    return tuple(out)


Model = Callable[[Args], Cost | None]
"""A cost model: the cost of one call from its arguments, or None when they do not say."""
