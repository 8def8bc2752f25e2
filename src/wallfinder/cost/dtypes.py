"""Dtypes as traces spell them: Kineto's `Input type` strings and the ScalarType codes that
`Concrete Inputs` carries for dtype arguments, mapped to wallfinder's dtype keys.

The keys "fp64", "fp32", "bf16", "fp16", "fp8" and "int8" are the ones with datasheet peaks;
the others ("int64", "bool", ...) name tensors whose ops never run on matrix units.
"""

from __future__ import annotations

ELEMENT_BYTES: dict[str, int] = {
    "fp64": 8,
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    # torch.float4_e2m1fn_x2: one element is a byte holding two 4-bit values.
    "fp4": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "bool": 1,
    "complex32": 4,
    "complex64": 8,
    "complex128": 16,
}
"""Bytes per element of each dtype key."""

# `Input type` is c10's demangled C++ type name of the tensor's element type, which differs
# between compilers ("long" and "long int" both occur in real traces; MSVC writes "__int64").
_TYPE_NAMES: dict[str, str] = {
    "double": "fp64",
    "float": "fp32",
    "c10::BFloat16": "bf16",
    "c10::Half": "fp16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
    "c10::Float8_e8m0fnu": "fp8",
    "c10::Float4_e2m1fn_x2": "fp4",
    "signed char": "int8",
    "c10::qint8": "int8",
    "unsigned char": "uint8",
    "c10::quint8": "uint8",
    "c10::quint4x2": "uint8",
    "c10::quint2x4": "uint8",
    "short": "int16",
    "short int": "int16",
    "unsigned short": "uint16",
    "short unsigned int": "uint16",
    "unsigned short int": "uint16",
    "int": "int32",
    "c10::qint32": "int32",
    "unsigned int": "uint32",
    "long": "int64",
    "long int": "int64",
    "long long": "int64",
    "long long int": "int64",
    "__int64": "int64",
    "unsigned long": "uint64",
    "long unsigned int": "uint64",
    "unsigned long int": "uint64",
    "unsigned long long": "uint64",
    "unsigned __int64": "uint64",
    "bool": "bool",
    "c10::complex<c10::Half>": "complex32",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
}

# c10::ScalarType codes, as `Concrete Inputs` writes a dtype argument ("15" is bfloat16).
_SCALAR_TYPE_CODES: dict[int, str] = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "fp16",
    6: "fp32",
    7: "fp64",
    8: "complex32",
    9: "complex64",
    10: "complex128",
    11: "bool",
    12: "int8",  # QInt8
    13: "uint8",  # QUInt8
    14: "int32",  # QInt32
    15: "bf16",
    23: "fp8",  # Float8_e5m2
    24: "fp8",  # Float8_e4m3fn
    25: "fp8",  # Float8_e5m2fnuz
    26: "fp8",  # Float8_e4m3fnuz
    27: "uint16",
    28: "uint32",
    29: "uint64",
    44: "fp8",  # Float8_e8m0fnu
    45: "fp4",  # Float4_e2m1fn_x2
}

_FLOATING = frozenset({"fp64", "fp32", "bf16", "fp16", "fp8", "fp4"})
_COMPLEX = frozenset({"complex32", "complex64", "complex128"})


def dtype_of_type_name(name: str) -> str | None:
    """The dtype key of an `Input type` string, or None when it names no tensor dtype
    ("Scalar", "ScalarList", "TensorList", "", or a type this table does not know)."""
    key = _TYPE_NAMES.get(name)
    if key is None and name.startswith(("class ", "struct ")):
        # MSVC spells class types with their keyword: "struct c10::BFloat16".
        key = _TYPE_NAMES.get(name.partition(" ")[2])
    return key


def dtype_of_code(code: int) -> str | None:
    """The dtype key of a c10::ScalarType code, or None for an unknown code."""
    return _SCALAR_TYPE_CODES.get(code)


def category(dtype: str) -> int:
    """Type-promotion category: 0 bool, 1 integer, 2 floating, 3 complex."""
    if dtype == "bool":
        return 0
    if dtype in _COMPLEX:
        return 3
    if dtype in _FLOATING:
        return 2
    return 1


def promote(a: str, b: str) -> str:
    """The dtype of an op on `a` and `b`, by PyTorch's promotion for tensors of equal rank:
    the higher category wins, then the wider type; bf16 with fp16 gives fp32."""
    ca, cb = category(a), category(b)
    if ca != cb:
        return a if ca > cb else b
    if {a, b} == {"bf16", "fp16"}:
        return "fp32"
    return a if ELEMENT_BYTES[a] >= ELEMENT_BYTES[b] else b
