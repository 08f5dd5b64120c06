"""What ggml's GGUF reader does, done first in Python: the header is scanned and checked (counts, sizes, data
extent) so that a malformed file raises instead of aborting.
"""
from __future__ import annotations

import struct

import numpy as np

from .._ffi import CData, ffi, lib
from ..core.args import is_int
from ..errors import GgmlTypeError, GgmlValueError, GgufFileError


GGUF_TYPE_UINT8, GGUF_TYPE_INT8 = lib.GGUF_TYPE_UINT8, lib.GGUF_TYPE_INT8
GGUF_TYPE_UINT16, GGUF_TYPE_INT16 = lib.GGUF_TYPE_UINT16, lib.GGUF_TYPE_INT16
GGUF_TYPE_UINT32, GGUF_TYPE_INT32 = lib.GGUF_TYPE_UINT32, lib.GGUF_TYPE_INT32
GGUF_TYPE_UINT64, GGUF_TYPE_INT64 = lib.GGUF_TYPE_UINT64, lib.GGUF_TYPE_INT64
GGUF_TYPE_FLOAT32, GGUF_TYPE_FLOAT64 = lib.GGUF_TYPE_FLOAT32, lib.GGUF_TYPE_FLOAT64
GGUF_TYPE_BOOL, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY = lib.GGUF_TYPE_BOOL, lib.GGUF_TYPE_STRING, lib.GGUF_TYPE_ARRAY
GGUF_KEY_GENERAL_ALIGNMENT = "general.alignment"
GGUF_TYPE_COUNT = int(getattr(lib, "GGUF_TYPE_COUNT", 13))

# Numeric GGUF value types: (C getter/setter suffix, numpy dtype); bool is one byte, 0 or 1.
_NUMERIC: dict[int, tuple[str, type[np.generic]]] = {
    GGUF_TYPE_UINT8: ("u8", np.uint8), GGUF_TYPE_INT8: ("i8", np.int8), GGUF_TYPE_UINT16: ("u16", np.uint16),
    GGUF_TYPE_INT16: ("i16", np.int16), GGUF_TYPE_UINT32: ("u32", np.uint32), GGUF_TYPE_INT32: ("i32", np.int32),
    GGUF_TYPE_UINT64: ("u64", np.uint64), GGUF_TYPE_INT64: ("i64", np.int64), GGUF_TYPE_FLOAT32: ("f32", np.float32),
    GGUF_TYPE_FLOAT64: ("f64", np.float64), GGUF_TYPE_BOOL: ("bool", np.bool_),
}
GGUF_DTYPES: dict[int, np.dtype] = {t: np.dtype(dt) for t, (_, dt) in _NUMERIC.items()}
DTYPE_GGUF: dict[np.dtype, int] = {dt: t for t, dt in GGUF_DTYPES.items()}
DTYPE_GGUF[np.dtype(np.float16)] = GGUF_TYPE_FLOAT32  # no F16 value type: widen
GETTERS = {t: getattr(lib, f"gguf_get_val_{sfx}") for t, (sfx, _) in _NUMERIC.items()}
SETTERS = {t: getattr(lib, f"gguf_set_val_{sfx}") for t, (sfx, _) in _NUMERIC.items()}
INT_RANGES = {t: (int(np.iinfo(dt).min), int(np.iinfo(dt).max) + 1)
               for t, dt in GGUF_DTYPES.items() if np.issubdtype(dt, np.integer)}


def gguf_type_name(t: int) -> str:
    """The short name of a GGUF value type: ``"u8"``, ``"i32"``, ``"f32"``, ``"bool"``, ``"str"``, ``"arr"``, ...

    Arguments:
        t: a GGUF value type as returned by ``gguf_get_kv_type``.

    Value: a str.

    Example:
        >>> gguf_type_name(gguf_get_kv_type(g, "general.name"))
        'str'
    """
    if not is_int(t):
        raise GgmlTypeError(f"gguf_type_name: t must be an int GGUF type (gguf_get_kv_type), got {t!r}")
    name = lib.gguf_type_name(int(t)) if 0 <= t < GGUF_TYPE_COUNT else ffi.NULL
    if name == ffi.NULL:
        raise GgmlValueError(f"gguf_type_name: {t!r} is not a GGUF value type (0 to {GGUF_TYPE_COUNT - 1})")
    return ffi.string(name).decode()


class _Header:
    """What ggmlpy checks in a GGUF header beyond ggml's own checks (ggml cuts strings at NUL bytes)."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.nul_values: set[str] = set()    # keys whose string value(s) hold a NUL byte
        self.tensor_names: list[bytes] = []
        self.tensor_ne: list[list[int]] = []  # each tensor's shape, as written (before ggml's int64 products)


_SCALAR_SIZES = {GGUF_TYPE_UINT8: 1, GGUF_TYPE_INT8: 1, GGUF_TYPE_BOOL: 1, GGUF_TYPE_UINT16: 2,
                 GGUF_TYPE_INT16: 2, GGUF_TYPE_UINT32: 4, GGUF_TYPE_INT32: 4, GGUF_TYPE_FLOAT32: 4,
                 GGUF_TYPE_UINT64: 8, GGUF_TYPE_INT64: 8, GGUF_TYPE_FLOAT64: 8}


def _scan_header(raw: bytes) -> _Header:
    """Walk the header ggml has just accepted (``raw``: the file up to its data section) and collect the raw
    bytes of keys, string values and tensor names. Raises ValueError/struct.error if it does not parse."""
    h = _Header()
    pos = 0

    def take(fmt: str) -> int:
        nonlocal pos
        v = struct.unpack_from(fmt, raw, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string() -> bytes:
        nonlocal pos
        n = take("<Q")
        if n > len(raw) - pos:
            raise ValueError("string beyond the header")
        s = bytes(raw[pos:pos + n])
        pos += n
        return s

    if raw[:4] != b"GGUF":
        raise ValueError("bad magic")
    pos = 8  # magic, version
    n_tensors, n_kv = take("<q"), take("<q")
    for _ in range(n_kv):
        key = string()
        h.keys.append(key)
        t = take("<i")
        n = 1
        if t == GGUF_TYPE_ARRAY:
            t, n = take("<i"), take("<Q")
        if t == GGUF_TYPE_STRING:
            for _ in range(n):
                if b"\0" in string():
                    h.nul_values.add(key.decode("utf-8", "replace"))
        elif t in _SCALAR_SIZES:
            pos += n * _SCALAR_SIZES[t]
            if pos > len(raw):
                raise ValueError("value beyond the header")
        else:
            raise ValueError(f"value type {t}")
    for _ in range(n_tensors):
        h.tensor_names.append(string())
        n_dims = take("<I")
        if n_dims > 8:
            raise ValueError(f"{n_dims} dimensions")
        h.tensor_ne.append([take("<q") for _ in range(n_dims)])
        pos += 4 + 8  # type, offset
    if pos > len(raw):
        raise ValueError("tensor infos beyond the header")
    return h


def check_header(g: CData, p: str, fn: str) -> _Header:
    """Refuse keys and tensor names that ggml would cut at a NUL byte (two keys could merge into one, a
    tensor be found under another name) or that are not UTF-8 (they would be shown and matched wrongly)."""
    end = int(lib.gguf_get_data_offset(g))
    try:
        with open(p, "rb") as f:
            raw = f.read(end)
        h = _scan_header(raw)
    except (OSError, ValueError, struct.error) as exc:
        raise GgufFileError(f"{fn}: {p!r}: its header could not be read again ({exc}); was the file changed "
                            "while being read?") from None
    for what, names in (("key", h.keys), ("tensor name", h.tensor_names)):
        for i, name in enumerate(names):
            problem = "a NUL byte" if b"\0" in name else None
            if problem is None:
                try:
                    name.decode("utf-8")
                except UnicodeDecodeError:
                    problem = "bytes that are not UTF-8"
            if problem:
                cut = name.split(b"\0")[0]
                raise GgufFileError(f"{fn}: {p!r} is corrupt: {what} #{i} {name!r} holds {problem}; ggml would "
                                    f"read it as {cut!r} (two names could merge into one). Rewrite the file with "
                                    "valid names")
    return h


def data_extent(g: CData) -> int:
    """End of the data section that the tensor infos of GGUF context pointer ``g`` declare (in bytes)."""
    base = int(lib.gguf_get_data_offset(g))
    end = base
    for i in range(int(lib.gguf_get_n_tensors(g))):
        end = max(end, base + int(lib.gguf_get_tensor_offset(g, i)) + int(lib.gguf_get_tensor_size(g, i)))
    return end


def check_data_in_file(g: CData, size: int, p: str, fn: str) -> None:
    """Every tensor's data must lie inside the file (a truncated file, or a size field flipped to a huge
    value, would make ggml allocate and read beyond it)."""
    base = int(lib.gguf_get_data_offset(g))
    for i in range(int(lib.gguf_get_n_tensors(g))):
        offset = base + int(lib.gguf_get_tensor_offset(g, i))
        nbytes = int(lib.gguf_get_tensor_size(g, i))
        if offset + nbytes > size:
            name = ffi.string(lib.gguf_get_tensor_name(g, i)).decode("utf-8", "replace")
            raise GgufFileError(f"{fn}: {p!r} is truncated or corrupt: tensor '{name}' declares {nbytes} bytes of "
                                f"data at offset {offset}, but the file has only {size} bytes (a header written "
                                "with only_meta=True has no data: open it with no_alloc=True)")
