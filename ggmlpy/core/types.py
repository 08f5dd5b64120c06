"""ggml's tensor types: the ``GGML_TYPE_*`` constants, the type sets other modules test against, their numpy
dtypes, and ggmlR's type queries (``ggml_type_name``, ``ggml_type_size``, ``ggml_estimate_memory``...).
"""
from __future__ import annotations

from .._ffi import ffi, lib
from ..errors import GgmlTypeError, GgmlValueError
from .args import is_int


GGML_TYPE_F32 = lib.GGML_TYPE_F32
GGML_TYPE_F16 = lib.GGML_TYPE_F16
GGML_TYPE_BF16 = lib.GGML_TYPE_BF16
GGML_TYPE_I8 = lib.GGML_TYPE_I8
GGML_TYPE_I16 = lib.GGML_TYPE_I16
GGML_TYPE_I32 = lib.GGML_TYPE_I32
GGML_TYPE_I64 = lib.GGML_TYPE_I64
GGML_TYPE_F64 = lib.GGML_TYPE_F64
GGML_TYPE_Q4_0 = lib.GGML_TYPE_Q4_0
GGML_TYPE_Q4_1 = lib.GGML_TYPE_Q4_1
GGML_TYPE_Q5_0 = lib.GGML_TYPE_Q5_0
GGML_TYPE_Q5_1 = lib.GGML_TYPE_Q5_1
GGML_TYPE_Q8_0 = lib.GGML_TYPE_Q8_0
GGML_TYPE_Q8_1 = lib.GGML_TYPE_Q8_1
GGML_TYPE_Q2_K = lib.GGML_TYPE_Q2_K
GGML_TYPE_Q3_K = lib.GGML_TYPE_Q3_K
GGML_TYPE_Q4_K = lib.GGML_TYPE_Q4_K
GGML_TYPE_Q5_K = lib.GGML_TYPE_Q5_K
GGML_TYPE_Q6_K = lib.GGML_TYPE_Q6_K
GGML_TYPE_Q8_K = lib.GGML_TYPE_Q8_K
GGML_TYPE_IQ2_XXS = lib.GGML_TYPE_IQ2_XXS
GGML_TYPE_IQ2_XS = lib.GGML_TYPE_IQ2_XS
GGML_TYPE_IQ2_S = lib.GGML_TYPE_IQ2_S
GGML_TYPE_IQ3_XXS = lib.GGML_TYPE_IQ3_XXS
GGML_TYPE_IQ3_S = lib.GGML_TYPE_IQ3_S
GGML_TYPE_IQ1_S = lib.GGML_TYPE_IQ1_S
GGML_TYPE_IQ1_M = lib.GGML_TYPE_IQ1_M
GGML_TYPE_IQ4_NL = lib.GGML_TYPE_IQ4_NL
GGML_TYPE_IQ4_XS = lib.GGML_TYPE_IQ4_XS
GGML_TYPE_TQ1_0 = lib.GGML_TYPE_TQ1_0
GGML_TYPE_TQ2_0 = lib.GGML_TYPE_TQ2_0
GGML_TYPE_MXFP4 = lib.GGML_TYPE_MXFP4
GGML_TYPE_NVFP4 = lib.GGML_TYPE_NVFP4
GGML_TYPE_Q1_0 = lib.GGML_TYPE_Q1_0
GGML_TYPE_Q2_0 = lib.GGML_TYPE_Q2_0
PLAIN_TYPES = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_I8, GGML_TYPE_I16,
               GGML_TYPE_I32, GGML_TYPE_I64, GGML_TYPE_F64}
FLOAT_TYPES = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16}


def type_name(t: int) -> str:
    return ffi.string(lib.ggml_type_name(t)).decode()


_TYPE_COUNT = int(lib.GGML_TYPE_COUNT)


def checked_type(fn: str, type: object) -> int:
    """``type`` as a ggml type that exists (ggml indexes a table with it; removed types have no block size)."""
    if not is_int(type):
        raise GgmlTypeError(f"{fn}: type must be a GGML_TYPE_* int, got {type!r}")
    t = int(type)
    if not 0 <= t < _TYPE_COUNT or int(lib.ggml_blck_size(t)) == 0:
        raise GgmlValueError(f"{fn}: {t} is not a ggml type (GGML_TYPE_* values are in [0, {_TYPE_COUNT}), a few of "
                             "them removed)")
    return t


def ggml_type_name(type: int) -> str:
    """The short name of a ggml type: ``"f32"``, ``"f16"``, ``"q4_0"``, ``"i32"``, ...

    Arguments:
        type: a ``GGML_TYPE_*`` int (else GgmlValueError / GgmlTypeError).

    Value: a str.

    Example:
        >>> ggml_type_name(GGML_TYPE_Q4_0)
        'q4_0'
    """
    return ffi.string(lib.ggml_type_name(checked_type("ggml_type_name", type))).decode()


def ggml_type_size(type: int) -> int:
    """Bytes of one block of a type (one element for plain types; 18 bytes per 32 values for Q4_0).

    Arguments:
        type: a ``GGML_TYPE_*`` int.

    Value: an int (bytes).

    Example:
        >>> ggml_type_size(GGML_TYPE_F32)
        4
    """
    return int(lib.ggml_type_size(checked_type("ggml_type_size", type)))


def ggml_estimate_memory(type: int = lib.GGML_TYPE_F32, ne0: int | None = None, ne1: int = 1, ne2: int = 1,
                         ne3: int = 1) -> int:
    """The bytes to reserve for a tensor in a context with its own memory (``ggml_init(..., no_alloc=False)``):
    its header (``ggml_tensor_overhead()``), its data, and room for ggml's 16-byte alignment. The sum over
    a context's tensors is a ``mem_size`` that holds them.

    Unlike ggmlR, which counts 4 bytes per element whatever the type, this uses the type's real size
    (2 for F16, 18 bytes per 32 values for Q4_0, ...).

    Arguments:
        type: a ``GGML_TYPE_*`` int (default F32).
        ne0: elements along ne[0] (required; a multiple of the type's block size for quantized types).
        ne1, ne2, ne3: the other sizes (default 1).

    Value: an int (bytes).

    Example:
        >>> ggml_estimate_memory(GGML_TYPE_F32, 1000, 1000)   # 4,000,000 bytes of data + the header
    """
    fn = "ggml_estimate_memory"
    t = checked_type(fn, type)
    if ne0 is None:
        raise GgmlTypeError(f"{fn}: ne0 is required (the tensor's size along ne[0]), e.g. "
                            f"ggml_estimate_memory(GGML_TYPE_F32, 1000, 1000)")
    sizes = []
    for name, v in (("ne0", ne0), ("ne1", ne1), ("ne2", ne2), ("ne3", ne3)):
        if not is_int(v) or int(v) < 1:
            raise GgmlValueError(f"{fn}: {name} must be an int >= 1, got {v!r}")
        sizes.append(int(v))
    blck = int(lib.ggml_blck_size(t))
    if sizes[0] % blck:
        raise GgmlValueError(f"{fn}: ne0 must be a multiple of {blck} for {ggml_type_name(t)}, got {sizes[0]}")
    data = sizes[0] // blck * int(lib.ggml_type_size(t)) * sizes[1] * sizes[2] * sizes[3]
    return int(lib.ggml_tensor_overhead()) + data + 16


def ggml_blck_size(type: int) -> int:
    """The number of values in one block of a type (1 for plain types, 32 for Q4_0/Q8_0, 256 for K-quants).

    Arguments:
        type: a ``GGML_TYPE_*`` int.

    Value: an int.

    Example:
        >>> ggml_blck_size(GGML_TYPE_Q4_0)
        32
    """
    return int(lib.ggml_blck_size(checked_type("ggml_blck_size", type)))


def ggml_type_sizef(type: int) -> float:
    """Average bytes per value of a type: ``ggml_type_size / ggml_blck_size`` (fractional when quantized).

    Arguments:
        type: a ``GGML_TYPE_*`` int.

    Value: a float (4.0 for F32, 0.5625 for Q4_0).

    Example:
        >>> ggml_type_sizef(GGML_TYPE_F16)
        2.0
    """
    t = checked_type("ggml_type_sizef", type)
    return float(lib.ggml_type_size(t)) / float(lib.ggml_blck_size(t))


def ggml_is_quantized(type: int) -> bool:
    """Whether a type is a quantized (block) format such as Q4_0 or Q8_0.

    Arguments:
        type: a ``GGML_TYPE_*`` int.

    Value: a bool.

    Example:
        >>> ggml_is_quantized(GGML_TYPE_Q8_0), ggml_is_quantized(GGML_TYPE_F32)
        (True, False)
    """
    return bool(lib.ggml_is_quantized(checked_type("ggml_is_quantized", type)))
