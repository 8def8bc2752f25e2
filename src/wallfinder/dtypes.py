"""Dtypes, in every layer: wallfinder's dtype keys ("fp32", "bf16", ...), their element sizes,
and every spelling traces and people use for them, in one table.

Traces spell one dtype many ways: a CPU op's `Input type` is c10's demangled C++ name of the
element type ("float", "c10::BFloat16"; compilers differ: "long" and "long int" both occur,
MSVC writes "__int64" and "struct c10::BFloat16"); a dtype argument in `Concrete Inputs` is a
c10::ScalarType code ("15" is bfloat16); a collective's `dtype` is the ScalarType's name
("BFloat16", "Float", "Long"); people type torch names ("torch.bfloat16", "float16") or the
keys themselves. Lookups ignore case, spacing and the `c10::`, `at::` and `torch.` prefixes.

The keys "fp64", "fp32", "tf32", "bf16", "fp16", "fp8" and "int8" are the ones devices have
datasheet peaks for (`PEAK_DTYPES`); the others ("int64", "bool", ...) name tensors whose ops
never run on matrix units. "tf32" is a math mode on fp32 tensors, never a tensor's dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

__all__ = [
    "ELEMENT_BYTES",
    "PEAK_DTYPES",
    "category",
    "dtype_of_code",
    "dtype_of_name",
    "peak_dtype",
    "promote",
    "storage_dtype",
    "torch_name",
]

BOOL, INTEGER, FLOATING, COMPLEX = 0, 1, 2, 3
"""Type-promotion categories, in PyTorch's order."""


class _DType(NamedTuple):
    key: str
    size: int
    """Bytes per element. torch.float4_e2m1fn_x2: one element is a byte holding two values."""
    category: int
    codes: tuple[int, ...]
    """c10::ScalarType codes (the quantized types count as their storage type)."""
    names: tuple[str, ...]
    """Spellings besides the key: C++ `Input type` names, ScalarType names, torch names."""


_TABLE = (
    _DType("fp64", 8, FLOATING, (7,), ("double", "float64", "f64")),
    _DType("fp32", 4, FLOATING, (6,), ("float", "float32", "f32")),
    _DType("bf16", 2, FLOATING, (15,), ("c10::BFloat16", "bfloat16")),
    _DType("fp16", 2, FLOATING, (5,), ("c10::Half", "half", "float16", "f16")),
    # Every float8 variant runs on the same fp8 units (names not listed: see `_FP8_PREFIXES`).
    _DType(
        "fp8",
        1,
        FLOATING,
        (23, 24, 25, 26, 44),
        (
            "c10::Float8_e5m2",
            "c10::Float8_e4m3fn",
            "c10::Float8_e5m2fnuz",
            "c10::Float8_e4m3fnuz",
            "c10::Float8_e8m0fnu",
        ),
    ),
    _DType("fp4", 1, FLOATING, (45,), ("c10::Float4_e2m1fn_x2",)),
    # torch's int8 is C++ `signed char`, ScalarType `Char`.
    _DType("int8", 1, INTEGER, (1, 12), ("signed char", "char", "i8", "c10::qint8")),
    _DType(
        "uint8",
        1,
        INTEGER,
        (0, 13),
        ("unsigned char", "byte", "c10::quint8", "c10::quint4x2", "c10::quint2x4"),
    ),
    _DType("int16", 2, INTEGER, (2,), ("short", "short int")),
    _DType(
        "uint16", 2, INTEGER, (27,), ("unsigned short", "short unsigned int", "unsigned short int")
    ),
    _DType("int32", 4, INTEGER, (3, 14), ("int", "c10::qint32")),
    _DType("uint32", 4, INTEGER, (28,), ("unsigned int",)),
    _DType(
        "int64",
        8,
        INTEGER,
        (4,),
        ("long", "long int", "long long", "long long int", "__int64"),
    ),
    _DType(
        "uint64",
        8,
        INTEGER,
        (29,),
        (
            "unsigned long",
            "long unsigned int",
            "unsigned long int",
            "unsigned long long",
            "unsigned __int64",
        ),
    ),
    _DType("bool", 1, BOOL, (11,), ()),
    _DType("complex32", 4, COMPLEX, (8,), ("c10::complex<c10::Half>", "ComplexHalf", "chalf")),
    _DType("complex64", 8, COMPLEX, (9,), ("c10::complex<float>", "ComplexFloat", "cfloat")),
    _DType("complex128", 16, COMPLEX, (10,), ("c10::complex<double>", "ComplexDouble", "cdouble")),
)

_MATH_MODES: dict[str, tuple[str, ...]] = {"tf32": ("tf32", "tensorfloat32", "tensorfloat-32")}
"""Names a user types for a math mode: a peak key, never a tensor's dtype."""

PEAK_DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
"""The dtypes a device has peaks for. fp32 is the rate without tensor cores; tf32, bf16, fp16,
fp8 and int8 are tensor-core (matrix-core) rates; int8 is in OP/s."""

ELEMENT_BYTES: Mapping[str, int] = MappingProxyType({d.key: d.size for d in _TABLE})
"""Bytes per element of each tensor dtype key."""

_CATEGORY = {d.key: d.category for d in _TABLE}
_CODES = {code: d.key for d in _TABLE for code in d.codes}
_TORCH = {
    "fp64": "float64",
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "float8_e4m3fn",
    "int8": "int8",
}
"""The torch dtype a peak key's matmuls take (fp8: the variant matmuls accept)."""
_FP8_PREFIXES = ("float8", "fp8", "e4m3", "e5m2")
_NAMESPACES = ("c10::", "at::", "torch.")


def _normal(text: str) -> str:
    name = " ".join(text.strip().lower().split())
    if name.startswith(("class ", "struct ")):
        # MSVC spells class types with their keyword: "struct c10::BFloat16".
        name = name.partition(" ")[2]
    for namespace in _NAMESPACES:
        if name.startswith(namespace):
            name = name[len(namespace) :]
    return name


def _names() -> dict[str, str]:
    table: dict[str, str] = {}
    spellings = [(d.key, (d.key, *d.names)) for d in _TABLE] + list(_MATH_MODES.items())
    for key, names in spellings:
        for name in names:
            normal = _normal(name)
            if table.setdefault(normal, key) != key:  # pragma: no cover - a table typo
                raise AssertionError(f"dtype name {name!r} spells both {table[normal]} and {key}")
    return table


_NAMES = _names()


def _key(text: str) -> str | None:
    name = _normal(text)
    if name.startswith(_FP8_PREFIXES):
        return "fp8"
    return _NAMES.get(name)


def dtype_of_name(name: str) -> str | None:
    """The tensor dtype key of any spelling ("c10::BFloat16", "long int", "Float",
    "torch.float16", "bf16"), or None when it names no tensor dtype ("Scalar", "TensorList",
    "", "tf32", or a type this table does not know)."""
    key = _key(name)
    return key if key in ELEMENT_BYTES else None


def peak_dtype(text: str) -> str | None:
    """The dtype whose peak applies (one of `PEAK_DTYPES`) for a name seen in a trace or typed
    by a user: ``"float"`` → ``"fp32"``, ``"c10::BFloat16"`` → ``"bf16"``, ``"c10::Half"`` →
    ``"fp16"``, ``"c10::Float8_e4m3fn"`` → ``"fp8"``, ``"signed char"`` → ``"int8"``, ``"TF32"``
    → ``"tf32"``; None for anything else (integers other than int8, complex, bool, empty)."""
    key = _key(text)
    return key if key in PEAK_DTYPES else None


def dtype_of_code(code: int) -> str | None:
    """The dtype key of a c10::ScalarType code, or None for an unknown code."""
    return _CODES.get(code)


def storage_dtype(key: str) -> str:
    """The tensor dtype a peak key computes on: tf32 is a math mode on fp32 tensors."""
    return "fp32" if key in _MATH_MODES else key


def torch_name(key: str) -> str | None:
    """The name of the `torch` dtype whose tensors a peak key computes on ("tf32" and "fp32":
    "float32"), or None for a key with no peak."""
    return _TORCH.get(storage_dtype(key))


def category(dtype: str) -> int:
    """Type-promotion category of a dtype key: 0 bool, 1 integer, 2 floating, 3 complex."""
    return _CATEGORY.get(dtype, INTEGER)


def promote(a: str, b: str) -> str:
    """The dtype of an op on `a` and `b`, by PyTorch's promotion for tensors of equal rank:
    the higher category wins, then the wider type; bf16 with fp16 gives fp32."""
    ca, cb = category(a), category(b)
    if ca != cb:
        return a if ca > cb else b
    if {a, b} == {"bf16", "fp16"}:
        return "fp32"
    return a if ELEMENT_BYTES[a] >= ELEMENT_BYTES[b] else b
