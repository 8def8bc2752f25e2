"""The one dtype table: every spelling traces and people use maps to one key and size, as each
of the tables it replaced (cost models, calculator, hardware peaks, collectives) said."""

from __future__ import annotations

import pytest

from wallfinder.dtypes import (
    ELEMENT_BYTES,
    PEAK_DTYPES,
    category,
    dtype_of_code,
    dtype_of_name,
    peak_dtype,
    promote,
    storage_dtype,
    torch_name,
)

# `Input type` spellings (c10's demangled C++ names, as several compilers write them).
INPUT_TYPES = {
    "double": "fp64",
    "float": "fp32",
    "c10::BFloat16": "bf16",
    "struct c10::BFloat16": "bf16",
    "c10::Half": "fp16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
    "c10::Float8_e8m0fnu": "fp8",
    "c10::Float4_e2m1fn_x2": "fp4",
    "signed char": "int8",
    "c10::qint8": "int8",
    "unsigned char": "uint8",
    "c10::quint4x2": "uint8",
    "short int": "int16",
    "short unsigned int": "uint16",
    "int": "int32",
    "c10::qint32": "int32",
    "unsigned int": "uint32",
    "long": "int64",
    "long int": "int64",
    "long long": "int64",
    "__int64": "int64",
    "long unsigned int": "uint64",
    "unsigned __int64": "uint64",
    "bool": "bool",
    "c10::complex<c10::Half>": "complex32",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
}

# A collective's `dtype`: the ScalarType's name.
SCALAR_TYPE_NAMES = {
    "Double": "fp64",
    "Float": "fp32",
    "BFloat16": "bf16",
    "Half": "fp16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "Float8_e4m3fn": "fp8",
}

TORCH_NAMES = {
    "torch.float32": "fp32",
    "torch.float": "fp32",
    "torch.float64": "fp64",
    "torch.bfloat16": "bf16",
    "torch.float16": "fp16",
    "torch.half": "fp16",
    "torch.int64": "int64",
    "torch.uint8": "uint8",
    "torch.complex64": "complex64",
    "torch.cdouble": "complex128",
}


@pytest.mark.parametrize(
    ("name", "key"), [*INPUT_TYPES.items(), *SCALAR_TYPE_NAMES.items(), *TORCH_NAMES.items()]
)
def test_every_spelling_names_its_key(name: str, key: str) -> None:
    assert dtype_of_name(name) == key
    assert dtype_of_name(f"  {name.upper()} ") == key


@pytest.mark.parametrize("name", ["", "Scalar", "ScalarList", "TensorList", "tf32", "nonsense"])
def test_what_names_no_tensor_dtype(name: str) -> None:
    assert dtype_of_name(name) is None


def test_scalar_type_codes() -> None:
    assert [dtype_of_code(c) for c in (0, 1, 4, 5, 6, 7, 11, 15, 24, 45)] == [
        "uint8", "int8", "int64", "fp16", "fp32", "fp64", "bool", "bf16", "fp8", "fp4",
    ]  # fmt: skip
    assert dtype_of_code(99) is None


def test_element_sizes() -> None:
    assert ELEMENT_BYTES["fp32"] == ELEMENT_BYTES["int32"] == 4
    assert ELEMENT_BYTES["bf16"] == ELEMENT_BYTES["fp16"] == 2
    assert ELEMENT_BYTES["fp8"] == ELEMENT_BYTES["int8"] == ELEMENT_BYTES["bool"] == 1
    assert ELEMENT_BYTES["int64"] == ELEMENT_BYTES["complex64"] == 8
    assert ELEMENT_BYTES["complex128"] == 16
    assert "tf32" not in ELEMENT_BYTES  # a math mode, stored as fp32
    assert storage_dtype("tf32") == "fp32"
    assert storage_dtype("bf16") == "bf16"


def test_peak_dtypes_are_the_keys_with_peaks() -> None:
    assert peak_dtype("c10::BFloat16") == "bf16"
    assert peak_dtype("TensorFloat-32") == "tf32"
    assert peak_dtype("long int") is None
    assert peak_dtype("c10::complex<float>") is None
    assert all(peak_dtype(d) == d for d in PEAK_DTYPES)


def test_every_peak_dtype_names_the_torch_dtype_its_matmuls_take() -> None:
    # calibrate multiplies tensors of these dtypes to measure each peak
    assert torch_name("tf32") == torch_name("fp32") == "float32"
    assert (torch_name("bf16"), torch_name("fp16")) == ("bfloat16", "float16")
    assert all(torch_name(d) for d in PEAK_DTYPES)
    assert torch_name("int64") is None
    torch = pytest.importorskip("torch")
    assert all(hasattr(torch, torch_name(d) or "") for d in PEAK_DTYPES)


def test_promotion() -> None:
    assert (category("bool"), category("int64"), category("bf16")) == (0, 1, 2)
    assert category("complex64") == 3
    assert promote("bf16", "fp16") == "fp32"
    assert promote("int64", "fp16") == "fp16"
    assert promote("fp32", "fp64") == "fp64"
