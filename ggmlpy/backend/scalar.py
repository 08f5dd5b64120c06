"""Reading and writing single elements and filling tensors (ggmlR's ``ggml_get_f32_1d``...``ggml_new_i32``)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from .._ffi import CData, ffi, lib
from ..core.args import is_int
from ..core.handle import unwrap
from ..core.types import type_name
from ..errors import GgmlStateError, GgmlTypeError, GgmlValueError
from ..graph.nodes import tensor_label
from ..graph.objects import as_tensor, Context, Tensor
from ..graph.tensor import new_tensor
from .transfer import (
    as_numeric,
    checked_values,
    ggml_backend_tensor_get_data,
    NUMPY_DTYPES,
    refuse_complex,
    shape_problem,
    storage_of,
)


T = TypeVar("T")


_BF16 = int(lib.GGML_TYPE_BF16)
# BF16: its raw bits
_SCALAR_TYPES: dict[int, np.dtype] = {**{int(k): v for k, v in NUMPY_DTYPES.items()}, _BF16: np.dtype(np.uint16)}
_INT_TYPES = {int(lib.GGML_TYPE_I8), int(lib.GGML_TYPE_I16), int(lib.GGML_TYPE_I32), int(lib.GGML_TYPE_I64)}
_FLOAT_READ = {int(lib.GGML_TYPE_F32), int(lib.GGML_TYPE_F16), _BF16}
_I32 = np.iinfo(np.int32)


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bits, rounded to nearest even as ggml's GGML_FP32_TO_BF16 (NaN kept quiet)."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF
    return np.where(nan, (u >> 16) | 64, rounded).astype(np.uint16)


def _bf16_values(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _scalar_tensor(tensor: object, fn: str) -> tuple[CData, int, np.dtype]:
    """(pointer, ggml type, storage dtype) of an allocated tensor whose elements can be read one by one."""
    t = as_tensor(tensor, f"{fn}(tensor)").ptr
    typ = int(t.type)
    dtype = _SCALAR_TYPES.get(typ)
    if dtype is None:
        raise GgmlTypeError(f"{fn}: {tensor_label(t)} has type {type_name(typ).upper()}, whose elements cannot be "
                            "read or written one by one (expected F32, F16, BF16, F64, I8, I16, I32 or I64); "
                            "quantized tensors are read whole, dequantized (e.g. gguf_tensor_data)")
    storage_of(t)  # raises GgmlStateError for a tensor without memory
    return t, typ, dtype


def _index(fn: str, name: str, value: object, n: int) -> int:
    if not is_int(value):
        raise GgmlTypeError(f"{fn}: {name} must be an int, got {value!r}")
    v = int(value)
    if not 0 <= v < n:
        raise GgmlValueError(f"{fn}: {name} must be in [0, {n}) (0-based), got {v}")
    return v


def _offset_nd(t: CData, fn: str, idx: tuple[object, ...]) -> int:
    """Byte offset of element (i0, i1, i2, i3) from the tensor's data pointer (its strides: views too)."""
    off = 0
    for k, v in enumerate(idx):
        off += _index(fn, f"i{k}", v, int(t.ne[k])) * int(t.nb[k])
    return off


def _offset_1d(t: CData, fn: str, index: object) -> int:
    """Byte offset of the ``index``-th element in ggml order (ne[0] fastest), as ggml's ``*_1d`` helpers."""
    i = _index(fn, "i", index, int(lib.ggml_nelements(t)))
    idx = []
    for k in range(4):
        n = int(t.ne[k])
        idx.append(i % n)
        i //= n
    return sum(v * int(t.nb[k]) for k, v in enumerate(idx))


def _read_bytes(t: CData, offset: int, nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes, dtype=np.uint8)
    if storage_of(t) == "backend":
        lib.ggml_backend_tensor_get(t, ffi.from_buffer(raw), offset, nbytes)
    else:
        ffi.memmove(ffi.from_buffer(raw), ffi.cast("char *", t.data) + offset, nbytes)
    return raw


def _write_bytes(t: CData, offset: int, raw: np.ndarray) -> None:
    if storage_of(t) == "backend":
        lib.ggml_backend_tensor_set(t, ffi.from_buffer(raw), offset, raw.nbytes)
    else:
        ffi.memmove(ffi.cast("char *", t.data) + offset, ffi.from_buffer(raw), raw.nbytes)


def _read_one(t: CData, typ: int, dtype: np.dtype, offset: int) -> np.number:
    v = _read_bytes(t, offset, dtype.itemsize).view(dtype)
    return _bf16_values(v)[0] if typ == _BF16 else v[0]


def _encode(fn: str, t: CData, typ: int, dtype: np.dtype, values: np.ndarray) -> np.ndarray:
    """``values`` in the tensor's storage format, refusing what would change them (see ``checked_values``)."""
    what = f"{fn}: {tensor_label(t)}"
    if typ == _BF16:
        refuse_complex(values, dtype, what)
        return _bf16_bits(checked_values(values, np.dtype(np.float32), what))
    return checked_values(values, dtype, what)


def _number(fn: str, value: object, integer: bool = False) -> float | np.integer | np.floating:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        kind = "an int" if integer else "a real number"
        raise GgmlTypeError(f"{fn}: value must be {kind}, got {value!r}")
    if integer:
        if not is_int(value):
            raise GgmlTypeError(f"{fn}: value must be an int (a 32-bit integer, as ggml's int32_t), got {value!r}; "
                                "use the *_f32 form for real numbers")
        if not _I32.min <= int(value) <= _I32.max:
            raise GgmlValueError(f"{fn}: value must be a 32-bit integer in [{_I32.min}, {_I32.max}], got {value}")
        return int(value)
    return value


def _as_int(fn: str, v: np.number) -> int:
    """A stored value as ggml's get_i32 returns it: integers as they are, floats truncated toward zero."""
    if isinstance(v, (np.floating, float)):
        if not np.isfinite(v):
            raise GgmlValueError(f"{fn}: the element is {float(v)}, which has no integer value; read it with the "
                                 "*_f32 form")
        return int(np.trunc(v))
    return int(v)


def _set_one(fn: str, tensor: Tensor, value: object, where: Callable[[CData], int], integer: bool) -> None:
    t, typ, dtype = _scalar_tensor(tensor, fn)
    value = _number(fn, value, integer)
    offset = where(t)
    _write_bytes(t, offset, np.ascontiguousarray(_encode(fn, t, typ, dtype, np.asarray([value]))).view(np.uint8))


def ggml_get_f32_1d(tensor: Tensor, i: int) -> float:
    """Element ``i`` of a tensor (in ggml order, ne[0] fastest) as a float.

    Works for tensors in context memory and in any backend buffer (the element is copied back), for
    views, and for every plain type (integers are converted). ggml's C helper of this name reads host
    memory only and aborts on a bad type; this one checks first.

    Arguments:
        tensor: an allocated Tensor of type F32, F16, BF16, F64, I8, I16, I32 or I64 (else GgmlTypeError;
            one without memory raises GgmlStateError).
        i: the element index, an int in ``[0, ggml_nelements(tensor))`` (0-based; else GgmlValueError).

    Value: a Python float.

    Example:
        >>> t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 2); ggml_set_f32(t, range(6))
        >>> ggml_get_f32_1d(t, 4)
        4.0
    """
    fn = "ggml_get_f32_1d"
    t, typ, dtype = _scalar_tensor(tensor, fn)
    return float(_read_one(t, typ, dtype, _offset_1d(t, fn, i)))


def ggml_set_f32_1d(tensor: Tensor, i: int, value: float) -> None:
    """Set element ``i`` of a tensor (in ggml order, ne[0] fastest) to a number.

    Arguments:
        tensor: an allocated Tensor of type F32, F16, BF16, F64, I8, I16, I32 or I64 (else GgmlTypeError).
        i: [glossary: element]
        value: a real number; integer tensors take integral values in their range only, and a value that
            would overflow the type (inf in F16) is refused (GgmlValueError / GgmlTypeError).

    Value: None.

    Example:
        >>> ggml_set_f32_1d(t, 4, 2.5)
    """
    fn = "ggml_set_f32_1d"
    _set_one(fn, tensor, value, lambda t: _offset_1d(t, fn, i), False)


def ggml_get_i32_1d(tensor: Tensor, i: int) -> int:
    """Element ``i`` of a tensor (in ggml order) as an int.

    Float elements are truncated toward zero, as ggml's C helper does (NaN and inf raise
    GgmlValueError).

    Arguments:
        tensor: [glossary: data]
        i: [glossary: element]

    Value: a Python int.

    Example:
        >>> idx = ggml_new_i32(ctx, 7)
        >>> ggml_get_i32_1d(idx, 0)
        7
    """
    fn = "ggml_get_i32_1d"
    t, typ, dtype = _scalar_tensor(tensor, fn)
    return _as_int(fn, _read_one(t, typ, dtype, _offset_1d(t, fn, i)))


def ggml_set_i32_1d(tensor: Tensor, i: int, value: int) -> None:
    """Set element ``i`` of a tensor (in ggml order) to an integer.

    Arguments:
        tensor: [glossary: data]
        i: [glossary: element]
        value: an int in the 32-bit range (ggml's int32_t) that the tensor's type can hold (an I8 tensor:
            [-128, 127]); else GgmlValueError, and GgmlTypeError for a non-integer.

    Value: None.

    Example:
        >>> rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 4)
        >>> ggml_set_i32_1d(rows, 0, 3)
    """
    fn = "ggml_set_i32_1d"
    _set_one(fn, tensor, value, lambda t: _offset_1d(t, fn, i), True)


def ggml_get_f32_nd(tensor: Tensor, i0: int, i1: int = 0, i2: int = 0, i3: int = 0) -> float:
    """The element at ``[i0, i1, i2, i3]`` (0-based, ne[0] first) of a tensor, as a float.

    Follows the tensor's strides, so it reads transposed and permuted views at their logical
    positions. Any plain type is converted to float (as ggmlR's helper).

    Arguments:
        tensor: an allocated Tensor of type F32, F16, BF16, F64, I8, I16, I32 or I64.
        i0, i1, i2, i3: the index along each dimension, ints with ``0 <= ik < ne[k]`` (i1, i2, i3
            default to 0); else GgmlValueError.

    Value: a Python float.

    Example:
        >>> m = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 2); ggml_set_f32(m, range(6))
        >>> ggml_get_f32_nd(m, 1, 1)                 # element 1 + 3 * 1
        4.0
    """
    fn = "ggml_get_f32_nd"
    t, typ, dtype = _scalar_tensor(tensor, fn)
    return float(_read_one(t, typ, dtype, _offset_nd(t, fn, (i0, i1, i2, i3))))


def _required(fn: str, value: T | None) -> T:
    if value is None:
        raise GgmlTypeError(f"{fn}: value is required (pass it by name: {fn}(tensor, i0, i1, value=...))")
    return value


def ggml_set_f32_nd(tensor: Tensor, i0: int, i1: int = 0, i2: int = 0, i3: int = 0, value: float | None = None) \
        -> None:
    """Set the element at ``[i0, i1, i2, i3]`` (0-based) of a tensor to a number.

    Arguments:
        tensor: an allocated Tensor of type F32, F16, BF16, F64, I8, I16, I32 or I64.
        i0, i1, i2, i3: the index along each dimension (``0 <= ik < ne[k]``; i1, i2, i3 default to 0).
        value: the number (required; pass it by name as in ggmlR: ``value=``). Integer tensors take
            integral values in their range only.

    Value: None.

    Example:
        >>> ggml_set_f32_nd(m, 2, 1, value=9.5)
    """
    fn = "ggml_set_f32_nd"
    _set_one(fn, tensor, _required(fn, value), lambda t: _offset_nd(t, fn, (i0, i1, i2, i3)), False)


def ggml_get_i32_nd(tensor: Tensor, i0: int, i1: int = 0, i2: int = 0, i3: int = 0) -> int:
    """The element at ``[i0, i1, i2, i3]`` (0-based) of a tensor, as an int (floats truncated toward zero).

    Arguments:
        tensor: [glossary: data]
        i0, i1, i2, i3: the index along each dimension (``0 <= ik < ne[k]``; i1, i2, i3 default to 0).

    Value: a Python int.

    Example:
        >>> ggml_get_i32_nd(ids, 0, 1)
    """
    fn = "ggml_get_i32_nd"
    t, typ, dtype = _scalar_tensor(tensor, fn)
    return _as_int(fn, _read_one(t, typ, dtype, _offset_nd(t, fn, (i0, i1, i2, i3))))


def ggml_set_i32_nd(tensor: Tensor, i0: int, i1: int = 0, i2: int = 0, i3: int = 0, value: int | None = None) \
        -> None:
    """Set the element at ``[i0, i1, i2, i3]`` (0-based) of a tensor to an integer.

    Arguments:
        tensor: [glossary: data]
        i0, i1, i2, i3: the index along each dimension (``0 <= ik < ne[k]``; i1, i2, i3 default to 0).
        value: an int in the 32-bit range that the tensor's type can hold (required; pass it by name).

    Value: None.

    Example:
        >>> ggml_set_i32_nd(ids, 0, 1, value=42)
    """
    fn = "ggml_set_i32_nd"
    _set_one(fn, tensor, _required(fn, value), lambda t: _offset_nd(t, fn, (i0, i1, i2, i3)), True)


def _is_scalar(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating, np.bool_, bool)) or \
        (isinstance(value, np.ndarray) and value.ndim == 0)


def _fill(fn: str, tensor: Tensor, value: object, integer: bool) -> None:
    t, typ, dtype = _scalar_tensor(tensor, fn)
    if isinstance(value, np.ndarray):
        value = value.item()
    value = _number(fn, value, integer)
    if not lib.ggml_is_contiguous(t):
        raise GgmlValueError(f"{fn}: {tensor_label(t)} is a strided view; fill the tensor it views, or set its "
                             "elements one by one (ggml_set_f32_nd)")
    n = int(lib.ggml_nelements(t))
    one = _encode(fn, t, typ, dtype, np.asarray([value]))
    _write_bytes(t, 0, np.ascontiguousarray(np.repeat(one, n)).view(np.uint8))


def _set_all(fn: str, tensor: Tensor, data: npt.ArrayLike, integer: bool) -> None:
    t, typ, dtype = _scalar_tensor(tensor, fn)
    arr = as_numeric(data, f"{fn} (data)")
    if integer and arr.size:
        if np.issubdtype(arr.dtype, np.floating) and (not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr))):
            raise GgmlTypeError(f"{fn}: data must hold integers, got non-integral values; round them first (np.rint) "
                                "or use ggml_set_f32")
        if np.any(arr < _I32.min) or np.any(arr > _I32.max):
            raise GgmlValueError(f"{fn}: data must hold 32-bit integers (ggml's int32_t)")
    n = int(lib.ggml_nelements(t))
    if arr.size != n:  # neither form: not one number (a fill), not one value per element (ggmlR's data form)
        raise GgmlTypeError(f"{fn}: value must be a number (to fill the tensor) or an array-like of exactly {n} "
                            f"values, one per element of {tensor_label(t)} (ggmlR's data form); got {arr.size} values")
    problem = shape_problem(arr.shape, tensor, None)
    if problem is not None:
        raise GgmlValueError(f"{fn}: {tensor_label(t)} {problem}")
    if not lib.ggml_is_contiguous(t):
        raise GgmlValueError(f"{fn}: {tensor_label(t)} is a strided view; write the tensor it views")
    _write_bytes(t, 0, np.ascontiguousarray(_encode(fn, t, typ, dtype, arr.reshape(-1))).view(np.uint8))


def ggml_set_f32(tensor: Tensor, value: npt.ArrayLike) -> None:
    """Fill a tensor with one number, or (ggmlR's form) set all its elements from a sequence.

    ``ggml_set_f32(t, 0.0)`` fills every element (ggml's C function); ``ggml_set_f32(t, [1, 2, 3])``
    writes ``nelements`` values in ggml order, as ggmlR's ``ggml_set_f32(tensor, data)``.

    Arguments:
        tensor: an allocated, contiguous Tensor of type F32, F16, BF16, F64, I8, I16, I32 or I64 (integer
            tensors take integral values in range only).
        value: a number, or an array-like of exactly ``ggml_nelements(tensor)`` numbers (the tensor's
            numpy shape or 1-D; another count raises GgmlTypeError, a transposed layout GgmlValueError).

    Value: None.

    Example:
        >>> ggml_set_f32(bias, 0.0)
        >>> a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 5); ggml_set_f32(a, [1, 2, 3, 4, 5])
    """
    fn = "ggml_set_f32"
    if _is_scalar(value):
        _fill(fn, tensor, value, False)
    else:
        _set_all(fn, tensor, value, False)


def ggml_set_i32(tensor: Tensor, value: npt.ArrayLike) -> None:
    """Fill a tensor with one integer, or (ggmlR's form) set all its elements from a sequence of integers.

    Arguments:
        tensor: an allocated, contiguous Tensor of type I8, I16, I32, I64, F32, F16, BF16 or F64 (typically
            I32: row indices, positions).
        value: an int (32-bit), or an array-like of exactly ``ggml_nelements(tensor)`` integers in ggml
            order (non-integral values raise GgmlTypeError, a wrong count GgmlValueError).

    Value: None.

    Example:
        >>> pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 10)
        >>> ggml_set_i32(pos, range(10))
    """
    fn = "ggml_set_i32"
    if _is_scalar(value):
        _fill(fn, tensor, value, True)
    else:
        _set_all(fn, tensor, value, True)


def ggml_get_f32(tensor: Tensor) -> np.ndarray:
    """All elements of a float tensor as a 1-D float32 array, in ggml order (ggmlR's ``ggml_get_f32``).

    Arguments:
        tensor: an allocated Tensor of type F32, F16 or BF16 (else GgmlTypeError: use ``ggml_get_i32``
            for integer tensors, ``ggml_backend_tensor_get_data`` for any type).

    Value: a 1-D numpy float32 array of ``ggml_nelements(tensor)`` values.

    Example:
        >>> graph = ggml_build_forward_expand(ctx, c); ggml_graph_compute(ctx, graph)
        >>> ggml_get_f32(c)
    """
    fn = "ggml_get_f32"
    t, typ, dtype = _scalar_tensor(tensor, fn)
    if typ not in _FLOAT_READ:
        raise GgmlTypeError(f"{fn}: expected a F32, F16 or BF16 tensor, got {tensor_label(t)}; use ggml_get_i32 for "
                            "integer tensors or ggml_backend_tensor_get_data for any type")
    if typ == _BF16:
        if not lib.ggml_is_contiguous(t):
            raise GgmlValueError(f"{fn}: {tensor_label(t)} is a strided BF16 view; read the tensor it views")
        return _bf16_values(_read_bytes(t, 0, int(lib.ggml_nbytes(t))).view(np.uint16)).copy()
    return ggml_backend_tensor_get_data(tensor).astype(np.float32, copy=False)


def ggml_get_i32(tensor: Tensor) -> np.ndarray:
    """All elements of an integer tensor as a 1-D int32 array, in ggml order (ggmlR's ``ggml_get_i32``).

    Arguments:
        tensor: an allocated Tensor of type I32, I16 or I8 (else GgmlTypeError: ``ggml_get_f32`` reads
            float tensors, ``ggml_backend_tensor_get_data`` any type, I64 included).

    Value: a 1-D numpy int32 array.

    Example:
        >>> ggml_get_i32(ggml_argmax(ctx, logits))
    """
    fn = "ggml_get_i32"
    t, typ, dtype = _scalar_tensor(tensor, fn)
    if typ not in (int(lib.GGML_TYPE_I32), int(lib.GGML_TYPE_I16), int(lib.GGML_TYPE_I8)):
        raise GgmlTypeError(f"{fn}: expected an I32, I16 or I8 tensor, got {tensor_label(t)}; use ggml_get_f32 for "
                            "float tensors or ggml_backend_tensor_get_data for any type")
    return ggml_backend_tensor_get_data(tensor).astype(np.int32, copy=False)


def _new_scalar(fn: str, ctx: Context, value: object, integer: bool) -> Tensor:
    unwrap(ctx, Context, f"{fn}(ctx)")
    value = _number(fn, value, integer)
    if ctx.no_alloc:
        raise GgmlStateError(f"{fn}: the context has no_alloc=True, so the new tensor would have no memory to hold "
                             "the value (ggml asserts this); create the context with no_alloc=False, or create a "
                             "1-element tensor with ggml_new_tensor_1d, allocate it and set it with ggml_set_f32")
    typ = int(lib.GGML_TYPE_I32 if integer else lib.GGML_TYPE_F32)
    encoded = checked_values(np.asarray([value]), NUMPY_DTYPES[typ], fn)  # before the tensor is created
    tensor = new_tensor(ctx, typ, (1,))
    _write_bytes(tensor.ptr, 0, encoded.view(np.uint8))
    return tensor


def ggml_new_f32(ctx: Context, value: float) -> Tensor:
    """A new 1-element F32 tensor in ``ctx`` holding ``value``.

    Arguments:
        ctx: a Context created with ``no_alloc=False`` (the value needs memory; else GgmlStateError).
        value: a real number that fits F32 (a finite value overflowing to inf raises GgmlValueError).

    Value: a Tensor of shape ``[1, 1, 1, 1]``.

    Example:
        >>> s = ggml_new_f32(ctx, 3.14)
        >>> ggml_get_f32(s)
    """
    return _new_scalar("ggml_new_f32", ctx, value, False)


def ggml_new_i32(ctx: Context, value: int) -> Tensor:
    """A new 1-element I32 tensor in ``ctx`` holding ``value``.

    Arguments:
        ctx: a Context created with ``no_alloc=False`` (else GgmlStateError).
        value: an int in the 32-bit range (else GgmlValueError; a non-integer raises GgmlTypeError).

    Value: a Tensor of shape ``[1, 1, 1, 1]``.

    Example:
        >>> k = ggml_new_i32(ctx, 42)
        >>> ggml_get_i32(k)
    """
    return _new_scalar("ggml_new_i32", ctx, value, True)
