"""Moving data between numpy and tensors: the shape rule (numpy's row-major order against ggml's ne0
first), type conversion, and ``ggml_backend_tensor_set_data``/``get_data``.
"""
from __future__ import annotations

import sys
import types
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from .._ffi import CData, ffi, lib
from ..core.args import is_int
from ..core.handle import check_rpc_connections
from ..core.types import type_name
from ..errors import GgmlTypeError, GgmlValueError
from ..graph.nodes import tensor_label, tensor_memory
from ..graph.objects import as_tensor, Tensor


NUMPY_DTYPES: dict[int, np.dtype] = {
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


def storage_of(t: CData) -> str:
    """'backend' if the tensor lives in a backend buffer, 'host' if in context memory; raise if neither
    (see ``graph.nodes.tensor_memory``: a view follows the tensor it views)."""
    return tensor_memory(t)


def numpy_shape(ne: Tensor | Iterable[int]) -> tuple[int, ...]:
    """The numpy shape of a tensor (or of its ``ne``): ``(ne[3], ne[2], ne[1], ne[0])`` with leading 1-axes
    dropped, at least one axis (the shape ``ggml_tensor_to_numpy`` returns)."""
    shape = list(reversed(ne.shape if isinstance(ne, Tensor) else tuple(ne)))
    while len(shape) > 1 and shape[0] == 1:
        shape.pop(0)
    return tuple(int(n) for n in shape)


def _strip(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` without its leading 1-axes (possibly empty)."""
    k = 0
    while k < len(shape) and shape[k] == 1:
        k += 1
    return tuple(shape[k:])


def _fmt(shape: Iterable[int]) -> str:
    dims = tuple(int(n) for n in shape)
    return f"({dims[0]},)" if len(dims) == 1 else str(dims)


def _shape_fix(given: tuple[int, ...], expected: tuple[int, ...]) -> str:
    """The usual fix when an array of ``given`` shape holds the right count for ``expected``."""
    want = _strip(expected)
    if [n for n in given if n != 1] == [n for n in want if n != 1]:
        return f"only 1-axes differ: pass arr.reshape(-1), or reshape it to {_fmt(expected)}"
    if sum(n != 1 for n in given) == 1:
        return "it is a vector with extra 1-axes: pass arr.reshape(-1) if its order is ggml order (ne[0] fastest)"
    if _strip(tuple(reversed(given))) == want:
        return "it looks transposed: pass arr.T"
    if len(given) >= 2 and _strip(given[:-2] + (given[-1], given[-2])) == want:
        return "its last two axes look swapped: pass np.swapaxes(arr, -1, -2)"
    if sorted(_strip(given)) == sorted(want):
        return f"its axes look permuted: reorder them with np.transpose to {_fmt(expected)}"
    return f"reshape it to {_fmt(expected)} only if its C order already is ggml order (ne[0] fastest)"


def shape_problem(shape: Iterable[int], ne: Tensor | Iterable[int], offset: int | None = None,
                  source: str = "the data") -> str | None:
    """Why an array of numpy shape ``shape`` may not be written into a tensor (of ``ne``, or a Tensor), or None.

    The one rule for every write of user data into a tensor: the array has the tensor's numpy shape
    (``numpy_shape``), or is 1-D with exactly ``nelements`` values; extra leading 1-axes are allowed in
    both cases. Only a write at an explicit element ``offset`` may be partial: a 1-D array of at most
    ``nelements - offset`` values, or whole sub-arrays (its trailing axes those of the tensor) starting at
    a multiple of their size. The message says what was expected, what ``source`` gives and the usual fix."""
    shape = tuple(int(n) for n in shape)
    expected = numpy_shape(ne)
    if offset is None and shape == tuple(expected):   # the common case, checked once per batch: nothing to say
        return None
    n = int(np.prod(expected, dtype=np.int64))
    size = int(np.prod(shape, dtype=np.int64))
    given = _strip(shape)
    ne_list = [int(v) for v in (ne.shape if isinstance(ne, Tensor) else ne)]
    while len(ne_list) > 1 and ne_list[-1] == 1:
        ne_list.pop()
    desc = f"shape {_fmt(expected)} (ggml ne {ne_list})"
    if offset is None:
        if size != n:
            return f"expects {n} values (an array of {desc} or 1-D of {n}), {source} gives {size} (shape {_fmt(shape)})"
        if given == _strip(expected) or len(given) <= 1:
            return None
        return (f"expects an array of {desc} or a 1-D array of {n} values; {source} has shape {_fmt(shape)}: the "
                "right count but another layout (ggml order is the C order of the numpy shape): "
                f"{_shape_fix(shape, expected)}")
    if offset + size > n:
        return f"holds {n} elements (numpy {desc}); cannot write {size} values at offset {offset}"
    if size == n:  # a whole-tensor write at offset 0
        return shape_problem(shape, ne, None, source)
    if len(given) <= 1:
        return None
    inner = given[1:]
    if tuple(expected[len(expected) - len(inner):]) != inner or len(inner) >= len(expected):
        slabs = (f"whole sub-arrays of the tensor's numpy {desc}, of shape (k, {', '.join(map(str, expected[1:]))}) "
                 "or with fewer trailing axes" if len(expected) > 1 else f"(the tensor's numpy {desc} is 1-D)")
        return (f"a partial write takes a 1-D array or {slabs}; {source} has shape {_fmt(shape)}: pass arr.ravel() "
                "to write its values in C order")
    block = int(np.prod(inner, dtype=np.int64))
    if offset % block:
        return (f"a partial write of sub-arrays of shape {_fmt(inner)} must start at a multiple of {block}, got "
                f"offset {offset}; pass arr.ravel() to write its values at any offset")
    return None


def refuse_complex(arr: np.ndarray, dtype: np.dtype, what: str) -> None:
    """Raise a TypeError for complex data: writing it into a real tensor would drop the imaginary part."""
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise GgmlTypeError(f"{what}: complex data (dtype {arr.dtype}) cannot be written into a {dtype} tensor; "
                            "pass arr.real, arr.imag or np.abs(arr)")


def checked_values(arr: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """``arr`` converted to ``dtype`` (contiguous, flat), refusing a conversion that changes values: complex
    data, non-integral floats or values outside the type's range into integer tensors, finite values
    that overflow a float type to inf."""
    if arr.dtype == dtype and arr.flags.c_contiguous:   # the common case, once per batch: nothing can change
        return arr.reshape(-1)
    refuse_complex(arr, dtype, what)
    if np.issubdtype(dtype, np.integer) and arr.dtype != np.bool_ and arr.size:
        info = np.iinfo(dtype)
        if np.issubdtype(arr.dtype, np.floating):
            if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
                raise GgmlTypeError(f"{what}: the tensor holds integers ({dtype}), got non-integral floats; "
                                    "round them first (np.rint) if that is meant")
            # powers of two are exact in float: compare against them, not against iinfo's bounds rounded
            lo, hi = float(info.min), float(info.max) + 1.0
            bad = (arr < lo) | (arr >= hi)
        else:
            bad = (arr < info.min) | (arr > info.max)
        if bad.any():
            v = arr[bad].reshape(-1)[0]
            raise GgmlValueError(f"{what}: the tensor is {dtype}, which holds [{info.min}, {info.max}]; got {v} "
                                 f"({int(bad.sum())} of {arr.size} values outside that range), which would wrap "
                                 "around; use a wider integer type for the tensor or fix the values")
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(arr, dtype=dtype).reshape(-1)
    if np.issubdtype(dtype, np.floating) and np.issubdtype(arr.dtype, np.number) and out.size \
            and not np.can_cast(arr.dtype, dtype, "safe"):  # float32 into F32 cannot overflow: no scan per batch
        overflow = np.isinf(out) & np.isfinite(np.asarray(arr).reshape(-1))
        if overflow.any():
            v = np.asarray(arr).reshape(-1)[overflow][0]
            raise GgmlValueError(f"{what}: the tensor is {dtype}, whose largest finite value is "
                                 f"{float(np.finfo(dtype).max):g}; got {v}, which would become inf; scale the "
                                 "data or use an F32 tensor")
    return out


def check_rpc_transfer(t: CData) -> None:
    """After a read or write of a tensor: refuse the data of an RPC device whose server stopped answering
    (patches/0020 makes such transfers no-ops that read zeros)."""
    if lib.ggmlpy_rpc_lost_connections() and t.buffer != ffi.NULL \
            and ffi.string(lib.ggml_backend_buffer_name(t.buffer)).startswith(b"RPC"):
        check_rpc_connections()


def _not_an_array(data: object) -> str:
    """What ``data`` is, said the user's way, where numpy would only make a dtype-object array of it."""
    if isinstance(data, dict):
        return (f"a dict (keys {list(data)[:4]!r}): pass the arrays themselves (a list of them, in the model's input "
                "order, for several inputs)")
    if isinstance(data, (types.GeneratorType, map, filter, zip)) \
            or (hasattr(data, "__next__") and not hasattr(data, "__len__")):
        return (f"{type(data).__name__}, an iterator: arrays are read whole; stream batches with "
                "ggml_fit_generator (ggml_fit_opt_gen at the low level), or make an array first (np.stack(list(it)))")
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], dict):
        return "a list of dicts (records): make a DataFrame of them (pd.DataFrame(records)) or an array"
    return ""


def _pandas_columns(data: object) -> str:
    """Which pandas column (or Categorical) numpy could not read as numbers, and how to fix it."""
    pd = sys.modules.get("pandas")
    if pd is None:
        return ""
    if isinstance(data, (pd.Categorical, pd.CategoricalIndex)):
        return ("pandas categories: use their integer codes (.codes) as sparse labels, or one column per category "
                "(pd.get_dummies(..., dtype=float))")
    columns = data.items() if isinstance(data, pd.DataFrame) else [(getattr(data, "name", None), data)] \
        if isinstance(data, pd.Series) else []
    nullable = []
    for name, col in columns:
        label = f"column {name!r}" if isinstance(data, pd.DataFrame) else "a Series"
        if isinstance(col.dtype, pd.CategoricalDtype):
            return (f"{label} of categories: one column per category (pd.get_dummies(df, columns=[{name!r}], "
                    "dtype=float)) or the integer codes (.cat.codes)")
        if col.dtype.kind in "mM":
            return (f"{label} of dates or durations ({col.dtype}): convert it to a number of a chosen unit first, "
                    "e.g. (col - col.min()).dt.total_seconds()")
        if col.dtype == object or isinstance(col.dtype, pd.StringDtype):
            first = next((v for v in col if not isinstance(v, (int, float, np.number, bool, np.bool_))), None)
            if first is None and col.dtype == object:
                continue  # numbers held as Python objects: numpy reads these
            return f"{label} of {type(first).__name__} values ({first!r}): convert or encode it to numbers first"
        if getattr(col.dtype, "na_value", None) is pd.NA:
            if col.isna().any():
                return (f"{label} with {int(col.isna().sum())} missing values (pd.NA): fill them (.fillna(...)) or "
                        "drop those rows first")
            nullable.append((label, col.dtype))
    if nullable:
        label, dtype = nullable[0]
        return (f"{label} of pandas' nullable type {dtype}, which numpy reads as Python objects; without missing "
                "values, convert it to a numpy type first (df.astype('float32'), or .to_numpy(dtype='float32'))")
    return ""


def as_numeric(data: object, what: str) -> np.ndarray:
    """``data`` as a numpy array (of its own dtype, its own shape); refuses non-numeric data, times and
    durations (their raw integer counts are no measurement a model learns from) and masked values."""
    if isinstance(data, np.ma.MaskedArray) and np.ma.getmaskarray(data).any():
        raise GgmlTypeError(f"{what}: a masked array with {int(np.ma.getmaskarray(data).sum())} masked values; "
                            "numpy would drop the mask and write the hidden values. Fill them first "
                            "(data.filled(0), or the column mean), or drop those samples")
    kind = _not_an_array(data)
    if kind:
        raise GgmlTypeError(f"{what}: expected numeric data (an array, a list of numbers, a numeric DataFrame), got "
                            f"{kind}")
    try:
        arr = np.asarray(data)
    except Exception as exc:  # noqa: BLE001 - anything numpy cannot read
        ragged = isinstance(exc, ValueError) and "inhomogeneous" in str(exc)
        raise GgmlTypeError(f"{what}: expected an array-like, got {type(data).__name__}"
                            + (" of rows of different lengths (a ragged list): every row needs the same length"
                               if ragged else "")) from exc
    if arr.dtype.kind in "mM":  # numpy counts timedelta64 as an integer type
        raise GgmlTypeError(f"{what}: expected numeric data, got {arr.dtype} (dates or durations), which would be "
                            "written as raw counts of its unit; convert them to a number of a chosen unit first, "
                            "e.g. arr / np.timedelta64(1, 's') for seconds")
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        column = _pandas_columns(data)
        if column:
            raise GgmlTypeError(f"{what}: expected numeric data, got {column}")
        hint = ("; integers too large for int64 become Python objects" if arr.dtype == object and arr.size
                and all(isinstance(v, int) for v in arr.reshape(-1)) else "")
        raise GgmlTypeError(f"{what}: expected numeric data, got dtype {arr.dtype}{hint}")
    return arr


def ggml_backend_tensor_set_data(tensor: Tensor, data: npt.ArrayLike, offset: int | None = None) -> None:
    """Write ``data`` into the tensor, converted to its type, in C order (ggml layout).

    Arguments:
        tensor: an allocated, contiguous tensor of type F32, F16, F64, I8, I16, I32 or I64.
        data: any numeric array-like (numpy array, list, memoryview; bool is fine, complex is refused).
            It must have the tensor's numpy shape ``(ne[3], ne[2], ne[1], ne[0])`` without leading 1-axes
            (a batch of N samples of F features is an ``(N, F)`` array for a tensor ``[F, N]``), or be
            1-D with exactly ``nelements`` values; extra leading 1-axes are allowed. A transposed array
            with the right count is refused. Values must fit the type: integers in its range (no
            wrap-around), integral floats only for integer tensors, no finite value that overflows F16.
        offset: the element at which to start writing. Not given (None, the default): the whole tensor
            is written from element 0. Given explicitly (0 included): a partial write of a 1-D array of
            at most ``nelements - offset`` values, or of whole sub-arrays starting at a multiple of
            their size.

    Value: None. Raises ValueError on a shape, count or range that does not fit, TypeError on data of
    the wrong kind.

    Example:
        >>> t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 2)      # ne [3, 2]: numpy shape (2, 3)
        >>> ggml_backend_tensor_set_data(t, np.arange(6.0).reshape(2, 3))
        >>> ggml_backend_tensor_set_data(t, [9.0, 9.0], offset=4)  # the last two elements
    """
    t = as_tensor(tensor, "ggml_backend_tensor_set_data(tensor)").ptr
    dtype = numpy_dtype(tensor)
    if offset is not None and (not is_int(offset) or offset < 0):
        raise GgmlValueError(f"ggml_backend_tensor_set_data: offset must be an int >= 0 (or not given for a "
                             f"whole-tensor write), got {offset!r}")
    what = "ggml_backend_tensor_set_data: " + tensor_label(t)
    arr = as_numeric(data, f"{what} (data)")
    problem = shape_problem(arr.shape, tensor, None if offset is None else int(offset))
    if problem is not None:
        short = offset is None and arr.size < tensor.nelements()
        hint = "; for a partial write pass offset= explicitly" if short else ""
        raise GgmlValueError(f"{what}: {problem}{hint}")
    flat = checked_values(arr, dtype, what)
    write_array(t, flat, (offset or 0) * dtype.itemsize)


def write_array(t: CData, arr: np.ndarray, byte_offset: int = 0) -> None:
    """Copy a contiguous array of the right dtype into a checked tensor (no further checks)."""
    if not lib.ggml_is_contiguous(t):
        raise GgmlValueError("cannot write into a strided view; write into the tensor it views")
    if storage_of(t) == "backend":
        lib.ggml_backend_tensor_set(t, ffi.from_buffer(arr), byte_offset, arr.nbytes)
        check_rpc_transfer(t)
    else:
        ffi.memmove(ffi.cast("char *", t.data) + byte_offset, ffi.from_buffer(arr), arr.nbytes)


def read_bytes(t: CData) -> np.ndarray:
    """A contiguous tensor's bytes as a uint8 array, from any backend (a quantized weight, which numpy cannot
    hold as values)."""
    out = np.empty(int(lib.ggml_nbytes(t)), dtype=np.uint8)
    if storage_of(t) == "backend":
        lib.ggml_backend_tensor_get(t, ffi.from_buffer(out), 0, out.nbytes)
        check_rpc_transfer(t)
    else:
        ffi.memmove(ffi.from_buffer(out), ffi.cast("char *", t.data), out.nbytes)
    return out


def ggml_backend_tensor_get_data(tensor: Tensor, offset: int = 0, n_elements: int | None = None) -> np.ndarray:
    """A 1-D numpy copy of a tensor's elements in ggml order (ne[0] fastest), from any backend.

    Works for tensors in a backend buffer (CPU or GPU: the data is copied back) and in context
    memory, and for strided views (their elements in logical order). Reshape with
    ``ggml_tensor_to_numpy`` for the numpy-shaped array.

    Arguments:
        tensor: an allocated tensor of type F32, F16, F64, I8, I16, I32 or I64.
        offset: the first element to read (default 0).
        n_elements: how many elements to read, or None (the default) for all from ``offset`` on;
            ``offset + n_elements`` may not exceed the element count (else GgmlValueError).

    Value: a 1-D numpy array of the tensor's dtype (float32 for F32, ...).

    Example:
        >>> ggml_backend_sched_graph_compute(sched, gf)
        >>> y = ggml_backend_tensor_get_data(out)            # flat, ggml order
        >>> first = ggml_backend_tensor_get_data(out, 0, 10)
    """
    t = as_tensor(tensor, "ggml_backend_tensor_get_data(tensor)").ptr
    dtype = numpy_dtype(tensor)
    n = int(lib.ggml_nelements(t))
    for name, v in (("offset", offset), ("n_elements", n_elements)):
        if not (is_int(v) or (v is None and name == "n_elements")):
            raise GgmlTypeError(f"ggml_backend_tensor_get_data: {name} must be an int"
                                f"{' or None' if name == 'n_elements' else ''}, got {v!r}")
    offset = int(offset)
    count = n - offset if n_elements is None else int(n_elements)
    if offset < 0 or count < 0 or offset + count > n:
        raise GgmlValueError(f"ggml_backend_tensor_get_data: {tensor_label(t)} holds {n} elements; cannot read "
                             f"{count!r} from offset {offset!r} (offset >= 0, offset + n_elements <= {n})")
    if not lib.ggml_is_contiguous(t):
        # a strided view (e.g. the gradient of a transposed parameter): read its span of the viewed tensor
        return _read_strided(t, dtype)[offset:offset + count].copy()
    out = np.empty(count, dtype=dtype)
    if count:
        if storage_of(t) == "backend":
            lib.ggml_backend_tensor_get(t, ffi.from_buffer(out), offset * dtype.itemsize, out.nbytes)
            check_rpc_transfer(t)
        else:
            ffi.memmove(ffi.from_buffer(out), ffi.cast("char *", t.data) + offset * dtype.itemsize, out.nbytes)
    return out


def _read_strided(t: CData, dtype: np.dtype) -> np.ndarray:
    """All elements of a non-contiguous view, in ggml order."""
    src = t.view_src
    if src == ffi.NULL:
        raise GgmlValueError("cannot read a strided tensor that is not a view; apply ggml_cont in the graph")
    storage_of(t)  # raises if unallocated
    ne = [int(t.ne[i]) for i in range(4)]
    nb = [int(t.nb[i]) for i in range(4)]
    span = sum((n - 1) * b for n, b in zip(ne, nb)) + dtype.itemsize
    start = int(t.view_offs)
    if start + span > int(lib.ggml_nbytes(src)):
        raise GgmlValueError("the view reaches beyond the tensor it views")
    raw = np.empty(span, dtype=np.uint8)
    if storage_of(src) == "backend":
        lib.ggml_backend_tensor_get(src, ffi.from_buffer(raw), start, span)
        check_rpc_transfer(src)
    else:
        ffi.memmove(ffi.from_buffer(raw), ffi.cast("char *", src.data) + start, span)
    view = np.ndarray(tuple(reversed(ne)), dtype=dtype, buffer=raw, strides=tuple(reversed(nb)))
    return np.ascontiguousarray(view).reshape(-1)


def ggml_tensor_to_numpy(tensor: Tensor) -> np.ndarray:
    """A numpy copy of a tensor shaped ``(ne[3], ne[2], ne[1], ne[0])``, leading 1-axes dropped.

    The shape under which the tensor's data is in C order: an ``[F, N]`` tensor comes back as an
    ``(N, F)`` array, images ``[W, H, C, N]`` as ``(N, C, H, W)``.

    Arguments:
        tensor: an allocated tensor of type F32, F16, F64, I8, I16, I32 or I64.

    Value: a numpy array (at least 1-D).

    Example:
        >>> probs = ggml_tensor_to_numpy(out)               # out [10, 32] -> (32, 10)
    """
    return ggml_backend_tensor_get_data(tensor).reshape(numpy_shape(tensor))
