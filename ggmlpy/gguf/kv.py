"""GGUF metadata: finding, reading, setting and removing key-value pairs."""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Union

import numpy as np

from .._ffi import CData, ffi, lib
from ..core.args import c_string, FLOAT32_MAX, is_int, is_real
from ..errors import expect, GgmlTypeError, GgmlValueError, GgufKeyError
from .file import GgufContext, unwrap_gguf
from .header import (
    DTYPE_GGUF,
    GETTERS,
    GGUF_DTYPES,
    GGUF_KEY_GENERAL_ALIGNMENT,
    GGUF_TYPE_ARRAY,
    GGUF_TYPE_BOOL,
    GGUF_TYPE_FLOAT32,
    GGUF_TYPE_FLOAT64,
    GGUF_TYPE_INT32,
    GGUF_TYPE_INT64,
    gguf_type_name,
    GGUF_TYPE_STRING,
    GGUF_TYPE_UINT32,
    GGUF_TYPE_UINT64,
    INT_RANGES,
    SETTERS,
)
from .tensors import index_in


# a metadata value as gguf_get_val returns it (GGUF arrays as lists)
GgufValue = Union[bool, int, float, str, list[str], list[int], list[float], list[bool]]


def gguf_get_n_kv(ctx: GgufContext) -> int:
    """The number of metadata keys in a GGUF context.

    Arguments:
        ctx: [glossary: gguf]

    Value: an int.

    Example:
        >>> {gguf_get_key(g, i): gguf_get_val(g, i) for i in range(gguf_get_n_kv(g))}
    """
    return int(lib.gguf_get_n_kv(unwrap_gguf(ctx, "gguf_get_n_kv")))


def _key_bytes(key: object, fn: str) -> bytes:
    expect(isinstance(key, str), f"{fn}: key must be a str, got {key!r}", GgmlTypeError)
    expect(key != "", f"{fn}: key must be a non-empty str, got ''")
    return c_string(fn, "key", key)


def gguf_find_key(ctx: GgufContext, key: str) -> int:
    """The index of the metadata key ``key``, or -1 if the context has no such key.

    Arguments:
        ctx: [glossary: gguf]
        key: the key name, a non-empty str.

    Value: an int.

    Example:
        >>> gguf_find_key(g, "general.name") >= 0
        True
    """
    return int(lib.gguf_find_key(unwrap_gguf(ctx, "gguf_find_key"), _key_bytes(key, "gguf_find_key")))


def _key_id(ctx: GgufContext, key_id: object, fn: str) -> tuple[CData, int]:
    g = unwrap_gguf(ctx, fn)
    if isinstance(key_id, str):
        kid = int(lib.gguf_find_key(g, _key_bytes(key_id, fn)))
        if kid < 0:
            raise GgufKeyError(f"{fn}: no key {key_id!r} in this GGUF context")
        return g, kid
    return g, index_in(fn, "key_id", key_id, int(lib.gguf_get_n_kv(g)), "keys", " or a key name")


def gguf_get_key(ctx: GgufContext, key_id: int) -> str:
    """The name of a metadata key.

    Arguments:
        ctx: [glossary: gguf]
        key_id: the key's index in ``[0, gguf_get_n_kv(ctx))`` or its name (an unknown name raises
            GgufKeyError, an index out of range GgmlValueError).

    Value: a str.

    Example:
        >>> [gguf_get_key(g, i) for i in range(gguf_get_n_kv(g))]
    """
    g, kid = _key_id(ctx, key_id, "gguf_get_key")
    return ffi.string(lib.gguf_get_key(g, kid)).decode("utf-8", "replace")


def gguf_get_kv_type(ctx: GgufContext, key_id: int | str) -> int:
    """The GGUF value type of a metadata key, as an int (``gguf_type_name`` names it).

    Arguments:
        ctx: [glossary: gguf]
        key_id: the key's index in ``[0, gguf_get_n_kv(ctx))`` or its name (an unknown name raises
            GgufKeyError, an index out of range GgmlValueError).

    Value: an int GGUF type (``'arr'`` by name for arrays, whose values ``gguf_get_val`` returns as lists).

    Example:
        >>> gguf_type_name(gguf_get_kv_type(g, "general.alignment"))
        'u32'
    """
    g, kid = _key_id(ctx, key_id, "gguf_get_kv_type")
    return int(lib.gguf_get_kv_type(g, kid))


def gguf_get_val(ctx: GgufContext, key_id: int | str) -> GgufValue:
    """The value of a metadata key, converted to Python.

    Arguments:
        ctx: [glossary: gguf]
        key_id: the key's index in ``[0, gguf_get_n_kv(ctx))`` or its name (an unknown name raises
            GgufKeyError, an index out of range GgmlValueError).

    Value: an int, float, bool or str, or a list for GGUF arrays (of numbers, bools or str). Raises
    GgmlValueError for an array type ggmlpy cannot read (nested arrays).

    Example:
        >>> gguf_get_val(g, "general.name")
        'mnist-mlp'
    """
    fn = "gguf_get_val"
    g, kid = _key_id(ctx, key_id, fn)
    t = int(lib.gguf_get_kv_type(g, kid))
    if ctx.nul_values:
        key = ffi.string(lib.gguf_get_key(g, kid)).decode("utf-8", "replace")
        if key in ctx.nul_values:
            raise GgmlValueError(f"{fn}: the string value of key {key!r} holds a NUL byte, where C (and so ggml) cuts "
                                 "strings: it cannot be returned whole. Read the file with the gguf package, or set "
                                 "the key to a new value")
    if t == GGUF_TYPE_STRING:
        return ffi.string(lib.gguf_get_val_str(g, kid)).decode("utf-8", "replace")
    if t in GETTERS:
        return GETTERS[t](g, kid)
    if t == GGUF_TYPE_ARRAY:
        at, n = int(lib.gguf_get_arr_type(g, kid)), int(lib.gguf_get_arr_n(g, kid))
        if at == GGUF_TYPE_STRING:
            return [ffi.string(lib.gguf_get_arr_str(g, kid, i)).decode("utf-8", "replace") for i in range(n)]
        if at in GGUF_DTYPES:
            dt = GGUF_DTYPES[at]
            if n == 0:
                return []
            raw = ffi.buffer(lib.gguf_get_arr_data(g, kid), n * dt.itemsize)
            return np.frombuffer(raw, dtype=dt).tolist()
        raise GgmlValueError(f"{fn}: key {gguf_get_key(ctx, kid)!r} is an array of {gguf_type_name(at)}, "
                             "which ggmlpy cannot read")
    raise GgmlValueError(f"{fn}: key id {kid} has the unsupported type {t}")


def gguf_remove_key(ctx: GgufContext, key: str) -> int:
    """Remove the metadata key ``key`` from a context (nothing happens if it is absent).

    Arguments:
        ctx: [glossary: gguf]
        key: the key name, a non-empty str.

    Value: the key's former index, or -1 if it was absent.

    Example:
        >>> gguf_remove_key(g, "training.epochs")
    """
    g, kb = unwrap_gguf(ctx, "gguf_remove_key"), _key_bytes(key, "gguf_remove_key")
    ctx.nul_values.discard(key)
    return int(lib.gguf_remove_key(g, kb))


def _check_alignment_key(g: CData, key: str, gtype: int, value: object, fn: str) -> None:
    if key != GGUF_KEY_GENERAL_ALIGNMENT:
        return
    # ggml aborts unless it is a u32 power of 2; it also lays out the data with the alignment the
    # context was created with, so any other value would describe the file wrongly.
    current = int(lib.gguf_get_alignment(g))
    if gtype != GGUF_TYPE_UINT32 or value != current:
        raise GgmlValueError(f"{fn}: {key!r} must be a u32 equal to the context's alignment ({current}); "
                             f"got {value!r} as {gguf_type_name(gtype)}")


def _set_scalar(ctx: GgufContext, key: str, value: object, gtype: int, fn: str) -> None:
    g = unwrap_gguf(ctx, fn)
    kb = _key_bytes(key, fn)
    ctx.nul_values.discard(key)
    number: bool | int | float
    if gtype in INT_RANGES:
        if not is_int(value):
            raise GgmlTypeError(f"{fn}: value must be an int, got {value!r}")
        lo, hi = INT_RANGES[gtype]
        expect(lo <= int(value) < hi, f"{fn}: {value} is out of range for {gguf_type_name(gtype)} [{lo}, {hi - 1}]")
        number = int(value)
    elif gtype == GGUF_TYPE_BOOL:
        if not isinstance(value, (bool, np.bool_)):
            raise GgmlTypeError(f"{fn}: value must be a bool, got {value!r}")
        number = bool(value)
    else:
        if not is_real(value):
            raise GgmlTypeError(f"{fn}: value must be a number, got {value!r}")
        number = float(value)
        # a finite value beyond float32 would be stored as inf (the integer setters check their range too)
        expect(gtype != GGUF_TYPE_FLOAT32 or not math.isfinite(number) or abs(number) <= FLOAT32_MAX,
               f"{fn}: {number} is beyond f32's range (+-{FLOAT32_MAX:.4g}) and would be stored as inf; use "
               "gguf_set_val_f64")
    _check_alignment_key(g, key, gtype, number, fn)
    SETTERS[gtype](g, kb, number)


def gguf_set_val_str(ctx: GgufContext, key: str, value: str) -> None:
    """Set ``key`` to a string value (replacing any previous value of that key).

    Arguments:
        ctx: [glossary: gguf]
        key: [glossary]
        value: a str without NUL characters.

    Value: None. Raises GgmlTypeError for a value of the wrong kind, GgmlValueError for one out of range.
    ``general.alignment`` may only be set to the context's alignment, as a u32.

    Example:
        >>> gguf_set_val_str(g, "general.name", "mnist-mlp")
    """
    fn = "gguf_set_val_str"
    g = unwrap_gguf(ctx, fn)
    kb = _key_bytes(key, fn)
    ctx.nul_values.discard(key)
    raw = c_string(fn, "value", value)
    _check_alignment_key(g, key, GGUF_TYPE_STRING, value, fn)
    lib.gguf_set_val_str(g, kb, raw)


def gguf_set_val_i32(ctx: GgufContext, key: str, value: int) -> None:
    """Set ``key`` to a signed 32-bit integer (i32) value (replacing any previous value of that key).

    Arguments:
        ctx: [glossary: gguf]
        key: [glossary]
        value: an int in [-2**31, 2**31 - 1].

    Value: None. Raises GgmlTypeError for a value of the wrong kind, GgmlValueError for one out of range.
    ``general.alignment`` may only be set to the context's alignment, as a u32.

    Example:
        >>> gguf_set_val_i32(g, "training.epochs", 10)
    """
    _set_scalar(ctx, key, value, GGUF_TYPE_INT32, "gguf_set_val_i32")


def gguf_set_val_u32(ctx: GgufContext, key: str, value: int) -> None:
    """Set ``key`` to a unsigned 32-bit integer (u32) value (replacing any previous value of that key).

    Arguments:
        ctx: [glossary: gguf]
        key: [glossary]
        value: an int in [0, 2**32 - 1].

    Value: None. Raises GgmlTypeError for a value of the wrong kind, GgmlValueError for one out of range.
    ``general.alignment`` may only be set to the context's alignment, as a u32.

    Example:
        >>> gguf_set_val_u32(g, "model.n_classes", 10)
    """
    _set_scalar(ctx, key, value, GGUF_TYPE_UINT32, "gguf_set_val_u32")


def gguf_set_val_i64(ctx: GgufContext, key: str, value: int) -> None:
    """Set ``key`` to a signed 64-bit integer (i64) value (replacing any previous value of that key).

    Arguments:
        ctx: [glossary: gguf]
        key: [glossary]
        value: an int in [-2**63, 2**63 - 1].

    Value: None. Raises GgmlTypeError for a value of the wrong kind, GgmlValueError for one out of range.
    ``general.alignment`` may only be set to the context's alignment, as a u32.

    Example:
        >>> gguf_set_val_i64(g, "training.samples", 6_000_000_000)
    """
    _set_scalar(ctx, key, value, GGUF_TYPE_INT64, "gguf_set_val_i64")


def gguf_set_val_f32(ctx: GgufContext, key: str, value: float) -> None:
    """Set ``key`` to a 32-bit float (f32) value (replacing any previous value of that key).

    Arguments:
        ctx: [glossary: gguf]
        key: [glossary]
        value: a real number (stored in single precision).

    Value: None. Raises GgmlTypeError for a value of the wrong kind, GgmlValueError for one out of range.
    ``general.alignment`` may only be set to the context's alignment, as a u32.

    Example:
        >>> gguf_set_val_f32(g, "training.lr", 1e-3)
    """
    _set_scalar(ctx, key, value, GGUF_TYPE_FLOAT32, "gguf_set_val_f32")


def gguf_set_val_f64(ctx: GgufContext, key: str, value: float) -> None:
    """Set ``key`` to a 64-bit float (f64) value (replacing any previous value of that key).

    Arguments:
        ctx: [glossary: gguf]
        key: [glossary]
        value: a real number.

    Value: None. Raises GgmlTypeError for a value of the wrong kind, GgmlValueError for one out of range.
    ``general.alignment`` may only be set to the context's alignment, as a u32.

    Example:
        >>> gguf_set_val_f64(g, "training.loss", 0.0312)
    """
    _set_scalar(ctx, key, value, GGUF_TYPE_FLOAT64, "gguf_set_val_f64")


def gguf_set_val_bool(ctx: GgufContext, key: str, value: bool | np.bool_) -> None:
    """Set ``key`` to a boolean value (replacing any previous value of that key).

    Arguments:
        ctx: [glossary: gguf]
        key: [glossary]
        value: a bool (or numpy bool).

    Value: None. Raises GgmlTypeError for a value of the wrong kind, GgmlValueError for one out of range.
    ``general.alignment`` may only be set to the context's alignment, as a u32.

    Example:
        >>> gguf_set_val_bool(g, "model.normalised", True)
    """
    _set_scalar(ctx, key, value, GGUF_TYPE_BOOL, "gguf_set_val_bool")


def _int_type(values: list[int]) -> int:
    for t in (GGUF_TYPE_INT32, GGUF_TYPE_INT64, GGUF_TYPE_UINT64):
        lo, hi = INT_RANGES[t]
        if all(lo <= v < hi for v in values):
            return t
    raise GgmlValueError(f"integers out of the 64-bit range: {values[:4]!r}")


def _set_array(g: CData, key: str, kb: bytes, value: Sequence[object] | np.ndarray, fn: str) -> None:
    if isinstance(value, np.ndarray):
        arr = value
    else:
        items = list(value)
        if items and all(isinstance(v, str) for v in items):
            raws = [c_string(fn, f"value[{i}]", v) for i, v in enumerate(items)]
            _check_alignment_key(g, key, GGUF_TYPE_ARRAY, value, fn)
            keep = [ffi.new("char[]", v) for v in raws]
            lib.gguf_set_arr_str(g, kb, ffi.new("const char *[]", keep), len(keep))
            return
        if all(isinstance(v, (bool, np.bool_)) for v in items) and items:
            arr = np.asarray(items, dtype=np.bool_)
        elif all(is_int(v) for v in items):
            ints = [int(v) for v in items if is_int(v)]  # all of them
            arr = np.asarray(ints, dtype=GGUF_DTYPES[_int_type(ints)])
        elif all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in items):
            arr = np.asarray(items, dtype=np.float64)
        else:
            raise GgmlTypeError(f"{fn}: a list value must hold only str, only bool or only numbers; key {key!r}")
    expect(arr.ndim == 1, f"{fn}: array values must be 1-D, key {key!r} has shape {arr.shape}")
    gtype = DTYPE_GGUF.get(arr.dtype)
    if gtype is None:
        raise GgmlTypeError(f"{fn}: arrays of dtype {arr.dtype} cannot be stored (key {key!r})")
    arr = np.ascontiguousarray(arr, dtype=GGUF_DTYPES[gtype])
    _check_alignment_key(g, key, GGUF_TYPE_ARRAY, value, fn)
    lib.gguf_set_arr_data(g, kb, gtype, ffi.from_buffer(arr) if arr.size else ffi.NULL, arr.size)


def gguf_set_val(ctx: GgufContext, key: str, value: object) -> None:
    """Set metadata ``key`` to ``value`` with the GGUF type that fits it.

    bool -> bool; str -> str; int -> i32, else i64, else u64 (``general.alignment``: u32); float -> f64;
    a numpy scalar -> its own type; a 1-D list/tuple/array of str, bools or numbers -> a GGUF array.
    The typed ``gguf_set_val_i32`` ... ``gguf_set_val_str`` choose the type explicitly.

    Arguments:
        ctx: [glossary: gguf]
        key: a non-empty str without NUL characters.
        value: a bool, int, float, str, numpy scalar, or a 1-D list/tuple/array of one kind of those.

    Value: None. Raises GgmlTypeError for a value that cannot be stored.

    Example:
        >>> gguf_set_val(g, "training.epochs", 10)
        >>> gguf_set_val(g, "labels", ["cat", "dog"])
    """
    fn = "gguf_set_val"
    g = unwrap_gguf(ctx, fn)
    kb = _key_bytes(key, fn)
    ctx.nul_values.discard(key)
    if isinstance(value, (bool, np.bool_)):
        return gguf_set_val_bool(ctx, key, value)
    if isinstance(value, str):
        return gguf_set_val_str(ctx, key, value)
    if isinstance(value, np.generic) and value.dtype in DTYPE_GGUF:
        return _set_scalar(ctx, key, value.item(), DTYPE_GGUF[value.dtype], fn)
    if isinstance(value, numbers.Integral):
        t = GGUF_TYPE_UINT32 if key == GGUF_KEY_GENERAL_ALIGNMENT else _int_type([int(value)])
        return _set_scalar(ctx, key, value, t, fn)
    if isinstance(value, numbers.Real):
        return _set_scalar(ctx, key, value, GGUF_TYPE_FLOAT64, fn)
    if isinstance(value, (list, tuple, np.ndarray)):
        return _set_array(g, key, kb, value, fn)
    raise GgmlTypeError(f"{fn}: cannot store a {type(value).__name__} under {key!r} "
                        "(use bool, int, float, str, or a list of one of them)")
