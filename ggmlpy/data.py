"""Moving data between numpy and tensors, in ggml layout (ne[0] fastest = C order of a
``(..., ne[1], ne[0])`` array)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ._ffi import ffi, lib
from .context import Tensor, as_tensor, type_name
from .errors import GgmlStateError, GgmlTypeError, GgmlValueError

NUMPY_DTYPES = {
    lib.GGML_TYPE_F32: np.dtype(np.float32),
    lib.GGML_TYPE_F16: np.dtype(np.float16),
    lib.GGML_TYPE_F64: np.dtype(np.float64),
    lib.GGML_TYPE_I8: np.dtype(np.int8),
    lib.GGML_TYPE_I16: np.dtype(np.int16),
    lib.GGML_TYPE_I32: np.dtype(np.int32),
    lib.GGML_TYPE_I64: np.dtype(np.int64),
}


def numpy_dtype(tensor: Tensor) -> np.dtype:
    dtype = NUMPY_DTYPES.get(tensor.type)
    if dtype is None:
        raise GgmlTypeError(f"tensors of type {type_name(tensor.type)} cannot be read or written as numpy arrays "
                            f"(supported: {', '.join(type_name(t) for t in NUMPY_DTYPES)})")
    return dtype


def _storage(t: Any) -> str:
    """'backend' if the tensor lives in a backend buffer, 'host' if in context memory; raise if neither."""
    owner = t.view_src if t.view_src != ffi.NULL else t
    if t.data == ffi.NULL:
        raise GgmlStateError("the tensor has no memory: allocate its context with ggml_backend_alloc_ctx_tensors "
                             "(or create the context with no_alloc=False), and do not use it after freeing its buffer")
    return "backend" if (t.buffer != ffi.NULL or owner.buffer != ffi.NULL) else "host"


def _as_array(data: Any, dtype: np.dtype, what: str) -> np.ndarray:
    try:
        arr = np.asarray(data)
    except Exception as exc:  # noqa: BLE001 - anything numpy cannot read
        raise GgmlTypeError(f"{what}: expected an array-like, got {type(data).__name__}") from exc
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise GgmlTypeError(f"{what}: expected numeric data, got dtype {arr.dtype}")
    if np.issubdtype(dtype, np.integer) and np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise GgmlTypeError(f"{what}: the tensor holds integers, got non-integral floats")
    return np.ascontiguousarray(arr, dtype=dtype).reshape(-1)


def ggml_backend_tensor_set_data(tensor: Tensor, data: Any, offset: int = 0) -> None:
    """Write ``data`` (any array-like, converted to the tensor's type, C order) at element ``offset``."""
    t = as_tensor(tensor, "ggml_backend_tensor_set_data(tensor)").ptr
    dtype = numpy_dtype(tensor)
    arr = _as_array(data, dtype, "ggml_backend_tensor_set_data(data)")
    n = int(lib.ggml_nelements(t))
    if not isinstance(offset, int) or offset < 0 or offset + arr.size > n:
        raise GgmlValueError(f"ggml_backend_tensor_set_data: tensor '{tensor.name}' {list(tensor.shape)} holds {n} "
                             f"elements; cannot write {arr.size} at offset {offset!r}")
    write_array(t, arr, offset * dtype.itemsize)


def write_array(t: Any, arr: np.ndarray, byte_offset: int = 0) -> None:
    """Copy a contiguous array of the right dtype into a checked tensor (no further checks)."""
    if not lib.ggml_is_contiguous(t):
        raise GgmlValueError("cannot write into a strided view; write into the tensor it views")
    if _storage(t) == "backend":
        lib.ggml_backend_tensor_set(t, ffi.from_buffer(arr), byte_offset, arr.nbytes)
    else:
        ffi.memmove(ffi.cast("char *", t.data) + byte_offset, ffi.from_buffer(arr), arr.nbytes)


def ggml_backend_tensor_get_data(tensor: Tensor, offset: int = 0, n_elements: int | None = None) -> np.ndarray:
    """A 1-D numpy copy of the tensor's elements in ggml order (ne[0] fastest)."""
    t = as_tensor(tensor, "ggml_backend_tensor_get_data(tensor)").ptr
    dtype = numpy_dtype(tensor)
    n = int(lib.ggml_nelements(t))
    count = n - offset if n_elements is None else n_elements
    if not isinstance(offset, int) or offset < 0 or not isinstance(count, int) or count < 0 or offset + count > n:
        raise GgmlValueError(f"ggml_backend_tensor_get_data: tensor '{tensor.name}' holds {n} elements; cannot read "
                             f"{count!r} from offset {offset!r}")
    if not lib.ggml_is_contiguous(t):
        # a strided view (e.g. the gradient of a transposed parameter): read its span of the viewed tensor
        return _read_strided(t, dtype)[offset:offset + count].copy()
    out = np.empty(count, dtype=dtype)
    if count:
        if _storage(t) == "backend":
            lib.ggml_backend_tensor_get(t, ffi.from_buffer(out), offset * dtype.itemsize, out.nbytes)
        else:
            ffi.memmove(ffi.from_buffer(out), ffi.cast("char *", t.data) + offset * dtype.itemsize, out.nbytes)
    return out


def _read_strided(t: Any, dtype: np.dtype) -> np.ndarray:
    """All elements of a non-contiguous view, in ggml order."""
    src = t.view_src
    if src == ffi.NULL:
        raise GgmlValueError("cannot read a strided tensor that is not a view; apply ggml_cont in the graph")
    _storage(t)  # raises if unallocated
    ne = [int(t.ne[i]) for i in range(4)]
    nb = [int(t.nb[i]) for i in range(4)]
    span = sum((n - 1) * b for n, b in zip(ne, nb)) + dtype.itemsize
    start = int(t.view_offs)
    if start + span > int(lib.ggml_nbytes(src)):
        raise GgmlValueError("the view reaches beyond the tensor it views")
    raw = np.empty(span, dtype=np.uint8)
    if _storage(src) == "backend":
        lib.ggml_backend_tensor_get(src, ffi.from_buffer(raw), start, span)
    else:
        ffi.memmove(ffi.from_buffer(raw), ffi.cast("char *", src.data) + start, span)
    view = np.ndarray(tuple(reversed(ne)), dtype=dtype, buffer=raw, strides=tuple(reversed(nb)))
    return np.ascontiguousarray(view).reshape(-1)


def ggml_tensor_to_numpy(tensor: Tensor) -> np.ndarray:
    """The tensor as an array of shape ``(ne[3], ne[2], ne[1], ne[0])`` with leading 1-axes dropped."""
    flat = ggml_backend_tensor_get_data(tensor)
    shape = list(reversed(tensor.shape))
    while len(shape) > 1 and shape[0] == 1:
        shape.pop(0)
    return flat.reshape(shape)


def ggml_set_f32(tensor: Tensor, value: float) -> None:
    """Fill a float tensor with one value."""
    ggml_backend_tensor_set_data(tensor, np.full(as_tensor(tensor, "ggml_set_f32(tensor)").nelements(), value))
