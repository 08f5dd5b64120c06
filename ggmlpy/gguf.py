"""GGUF files (gguf.h): save and load weights, read metadata.

A ``GgufContext`` owns one ``gguf_context``. ``gguf_add_tensor`` copies only the tensor's
header; its bytes are read when the file is written, so the context also remembers each
tensor and the memory it had, and ``gguf_write_to_file`` refuses tensors whose memory has
gone or moved since. Everything ggml would abort on (a duplicate tensor name, a strided
tensor, a key of the wrong type, an index out of range) is checked here first.

Saving and loading a model's weights with these is ``weights.py``.
"""
from __future__ import annotations

import logging
import math
import numbers
import os
import stat
import struct
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from ._ffi import ffi, ggml_logger, lib
from ._handle import Handle, free_handle, unwrap
from .context import Context, Tensor, as_tensor, c_string, check_fits_memory
from .data import _storage
from .errors import GgmlStateError, GgmlTypeError, GgmlValueError, GgufFileError, GgufFileNotFoundError, \
    GgufKeyError, expect

FLOAT32_MAX = float(np.finfo(np.float32).max)

GGUF_TYPE_UINT8, GGUF_TYPE_INT8 = lib.GGUF_TYPE_UINT8, lib.GGUF_TYPE_INT8
GGUF_TYPE_UINT16, GGUF_TYPE_INT16 = lib.GGUF_TYPE_UINT16, lib.GGUF_TYPE_INT16
GGUF_TYPE_UINT32, GGUF_TYPE_INT32 = lib.GGUF_TYPE_UINT32, lib.GGUF_TYPE_INT32
GGUF_TYPE_UINT64, GGUF_TYPE_INT64 = lib.GGUF_TYPE_UINT64, lib.GGUF_TYPE_INT64
GGUF_TYPE_FLOAT32, GGUF_TYPE_FLOAT64 = lib.GGUF_TYPE_FLOAT32, lib.GGUF_TYPE_FLOAT64
GGUF_TYPE_BOOL, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY = lib.GGUF_TYPE_BOOL, lib.GGUF_TYPE_STRING, lib.GGUF_TYPE_ARRAY
GGUF_KEY_GENERAL_ALIGNMENT = "general.alignment"
GGUF_TYPE_COUNT = int(getattr(lib, "GGUF_TYPE_COUNT", 13))

# Numeric GGUF value types: (C getter/setter suffix, numpy dtype); bool is one byte, 0 or 1.
_NUMERIC = {
    GGUF_TYPE_UINT8: ("u8", np.uint8), GGUF_TYPE_INT8: ("i8", np.int8), GGUF_TYPE_UINT16: ("u16", np.uint16),
    GGUF_TYPE_INT16: ("i16", np.int16), GGUF_TYPE_UINT32: ("u32", np.uint32), GGUF_TYPE_INT32: ("i32", np.int32),
    GGUF_TYPE_UINT64: ("u64", np.uint64), GGUF_TYPE_INT64: ("i64", np.int64), GGUF_TYPE_FLOAT32: ("f32", np.float32),
    GGUF_TYPE_FLOAT64: ("f64", np.float64), GGUF_TYPE_BOOL: ("bool", np.bool_),
}
_GGUF_DTYPES = {t: np.dtype(dt) for t, (_, dt) in _NUMERIC.items()}
_DTYPE_GGUF = {dt: t for t, dt in _GGUF_DTYPES.items()}
_DTYPE_GGUF[np.dtype(np.float16)] = GGUF_TYPE_FLOAT32  # no F16 value type: widen
_GETTERS = {t: getattr(lib, f"gguf_get_val_{sfx}") for t, (sfx, _) in _NUMERIC.items()}
_SETTERS = {t: getattr(lib, f"gguf_set_val_{sfx}") for t, (sfx, _) in _NUMERIC.items()}
_INT_RANGES = {t: (int(np.iinfo(dt).min), int(np.iinfo(dt).max) + 1)
               for t, dt in _GGUF_DTYPES.items() if np.issubdtype(dt, np.integer)}


def gguf_type_name(t: int) -> str:
    """The short name of a GGUF value type: ``"u8"``, ``"i32"``, ``"f32"``, ``"bool"``, ``"str"``, ``"arr"``, ...

    Arguments:
        t: a GGUF value type as returned by ``gguf_get_kv_type``.

    Value: a str.

    Example:
        >>> gguf_type_name(gguf_get_kv_type(g, "general.name"))
        'str'
    """
    if not isinstance(t, numbers.Integral) or isinstance(t, (bool, np.bool_)):
        raise GgmlTypeError(f"gguf_type_name: t must be an int GGUF type (gguf_get_kv_type), got {t!r}")
    name = lib.gguf_type_name(int(t)) if 0 <= t < GGUF_TYPE_COUNT else ffi.NULL
    if name == ffi.NULL:
        raise GgmlValueError(f"gguf_type_name: {t!r} is not a GGUF value type (0 to {GGUF_TYPE_COUNT - 1})")
    return ffi.string(name).decode()


# ---------------------------------------------------------------- the context

class GgufContext(Handle):
    kind = "gguf context"

    def __init__(self, ptr: Any, path: str | None = None, ggml_ctx: Context | None = None) -> None:
        super().__init__(ptr, lib.gguf_free)
        self.path = path
        self.ggml_ctx = ggml_ctx  # tensors with the file's data (gguf_init_from_file(no_alloc=False))
        self._nul_values: set[str] = set()  # keys read from the file whose strings hold NUL bytes (C cuts them)
        # One entry per tensor info: (Tensor, data address, buffer address) for tensors added here,
        # None for tensors read from a file (their headers carry no data to write).
        self._sources: list[tuple[Tensor, int, int] | None] = [None] * int(lib.gguf_get_n_tensors(ptr))

    def _describe(self) -> str:
        if self._ptr is None:
            return ""
        where = f" {self.path!r}" if self.path else ""
        return f"{where} {lib.gguf_get_n_tensors(self._ptr)} tensors, {lib.gguf_get_n_kv(self._ptr)} keys"


class _FileDataContext(Context):
    """The ggml context gguf_init_from_file creates with no_alloc=False (host memory holding the data)."""

    def __init__(self, ptr: Any) -> None:  # noqa: D107 - not created with ggml_init
        Handle.__init__(self, ptr, lib.ggml_free)
        self.mem_size = int(lib.ggml_get_mem_size(ptr))
        self.no_alloc = False


def _addr(p: Any) -> int:
    return int(ffi.cast("uintptr_t", p))


def _fs_path(path: Any, fn: str) -> str:
    try:
        p = os.fspath(path)
    except TypeError:
        raise GgmlTypeError(f"{fn}: path must be a str or os.PathLike, got {type(path).__name__}") from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    expect(p != "" and "\0" not in p, f"{fn}: path must be a non-empty file name without NUL characters, got {p!r}")
    try:
        os.fsencode(p)
    except UnicodeEncodeError:
        raise GgmlValueError(f"{fn}: path {p!r} cannot be encoded for the file system (lone surrogate "
                             "characters)") from None
    return p


@contextmanager
def _ggml_errors() -> Iterator[list[str]]:
    """Collect ggml's error log lines during a call, to put ggml's reason into the exception."""
    lines: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = _Collect(logging.ERROR)
    ggml_logger.addHandler(handler)
    try:
        yield lines
    finally:
        ggml_logger.removeHandler(handler)


def _reason(lines: list[str]) -> str:
    return f" (ggml: {'; '.join(s.strip() for s in lines)})" if lines else ""


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


def _check_readable_file(p: str, fn: str) -> int:
    """Refuse what ggml cannot read as a GGUF file; returns the file's size. Only regular files: ggml seeks
    and asks for the size, and opening a FIFO (or a device) blocks until a writer comes, in C, where
    Ctrl-C cannot reach it."""
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise GgufFileNotFoundError(f"{fn}: no such file: {p!r}") from None
    except (OSError, ValueError) as exc:
        raise GgufFileError(f"{fn}: cannot access {p!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise GgufFileError(f"{fn}: {p!r} is {_file_kind(st.st_mode)}, not a GGUF file; ggmlpy reads regular files "
                            "only (a pipe or device cannot be seeked, and opening one can block forever): copy the "
                            "data to a file first")
    if not os.access(p, os.R_OK):
        raise GgufFileError(f"{fn}: {p!r} is not readable (permission denied)")
    return int(st.st_size)


def _check_writable_path(p: str, fn: str) -> None:
    """Writing to an existing FIFO or socket would block in C (waiting for a reader); a directory fails."""
    try:
        st = os.stat(p)
    except OSError:
        return  # a new file (a missing folder is reported by the write itself)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode)):  # a character device: /dev/null
        raise GgufFileError(f"{fn}: {p!r} is {_file_kind(st.st_mode)}; write GGUF to a regular file")


# ---------------------------------------------------------------- what ggml's reader does not check

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

    def take(fmt: str) -> Any:
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
        n, is_array = 1, False
        if t == GGUF_TYPE_ARRAY:
            t, n, is_array = take("<i"), take("<Q"), True
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


def _check_header(g: Any, p: str, fn: str) -> _Header:
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


def _data_extent(g: Any) -> int:
    """End of the data section that the tensor infos of GGUF context pointer ``g`` declare (in bytes)."""
    base = int(lib.gguf_get_data_offset(g))
    end = base
    for i in range(int(lib.gguf_get_n_tensors(g))):
        end = max(end, base + int(lib.gguf_get_tensor_offset(g, i)) + int(lib.gguf_get_tensor_size(g, i)))
    return end


def _check_data_in_file(g: Any, size: int, p: str, fn: str) -> None:
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


def gguf_init_empty() -> GgufContext:
    """A new, empty GGUF context, to fill with metadata and tensors and write to a file.

    Set metadata with ``gguf_set_val`` (or the typed ``gguf_set_val_*``), add tensors with
    ``gguf_add_tensor``, then ``gguf_write_to_file``. ``ggml_save_weights_gguf`` does all three.

    Value: a GgufContext handle (a context manager; freed with ``gguf_free``).

    Example:
        >>> with gguf_init_empty() as g:
        ...     gguf_set_val(g, "general.name", "mnist-mlp")
        ...     gguf_add_tensor(g, w)
        ...     gguf_write_to_file(g, "model.gguf")
    """
    return GgufContext(lib.gguf_init_empty())


def gguf_init_from_file(path: Any, no_alloc: bool = True) -> GgufContext:
    """Open a GGUF file: read its metadata and tensor infos, and with ``no_alloc=False`` its data.

    The file is checked before ggml allocates anything for it: it must be a regular file (a FIFO or a
    device is refused: opening one could block forever), keys and tensor names must be UTF-8 without
    NUL bytes (C would cut them, merging two keys), and with ``no_alloc=False`` every tensor's data
    must lie inside the file and fit in the available memory.

    Arguments:
        path: the file, a str or os.PathLike.
        no_alloc: True (the default) reads the header only (metadata, tensor names, types, shapes);
            False also loads every tensor's data into a new ggml context in host memory, available as
            ``.ggml_ctx`` (find tensors there with ``ggml_get_tensor(g.ggml_ctx, name)``).

    Value: a GgufContext handle (a context manager). Raises GgufFileNotFoundError for a missing file,
    GgufFileError for one that is unreadable, not a regular file, truncated or not valid GGUF (with
    ggml's reason), GgmlValueError when its data would not fit in memory.

    Example:
        >>> with gguf_init_from_file("model.gguf") as g:
        ...     names = [gguf_get_tensor_name(g, i) for i in range(gguf_get_n_tensors(g))]
    """
    fn = "gguf_init_from_file"
    p = _fs_path(path, fn)
    expect(isinstance(no_alloc, bool), f"{fn}: no_alloc must be a bool, got {no_alloc!r}", GgmlTypeError)
    size = _check_readable_file(p, fn)
    # The header first, without data: ggml checks its structure and allocates nothing beyond the file's size.
    header = _open_header(p, fn)
    try:
        exact = _check_header(header.ptr, p, fn)
        if not no_alloc:
            # ggml would allocate the declared data size at once and abort when that fails: a size field
            # flipped to a huge value must be caught here, before the C call.
            _check_data_in_file(header.ptr, size, p, fn)
            need = _data_extent(header.ptr) - int(lib.gguf_get_data_offset(header.ptr)) + \
                (int(lib.gguf_get_n_tensors(header.ptr)) + 1) * int(lib.ggml_tensor_overhead())
    except BaseException:
        header.free()
        raise
    if no_alloc:
        header._nul_values = exact.nul_values
        return header
    header.free()
    check_fits_memory(fn, f"the data of {p!r}", need, "open it with no_alloc=True and load the tensors you need "
                      "into backend tensors with ggml_load_weights_gguf")
    ctx_out = ffi.new("struct ggml_context **")
    params = ffi.new("struct gguf_init_params *", {"no_alloc": False, "ctx": ctx_out})
    with _ggml_errors() as lines:
        ptr = lib.gguf_init_from_file(_path_bytes(p), params[0])
    if ptr == ffi.NULL:
        raise GgufFileError(f"{fn}: {p!r} could not be loaded{_reason(lines)}")
    ggml_ctx = _FileDataContext(ctx_out[0]) if ctx_out[0] != ffi.NULL else None
    g = GgufContext(ptr, path=p, ggml_ctx=ggml_ctx)
    g._nul_values = exact.nul_values
    return g


def _open_header(p: str, fn: str) -> GgufContext:
    params = ffi.new("struct gguf_init_params *", {"no_alloc": True, "ctx": ffi.NULL})
    with _ggml_errors() as lines:
        ptr = lib.gguf_init_from_file(_path_bytes(p), params[0])
    if ptr == ffi.NULL:
        raise GgufFileError(f"{fn}: {p!r} is not a valid GGUF file{_reason(lines)}")
    return GgufContext(ptr, path=p)


def gguf_free(ctx: GgufContext) -> None:
    """Free a GGUF context.

    Idempotent: freeing twice does nothing. As in C, the ggml context of a ``gguf_init_from_file``
    load with ``no_alloc=False`` (``.ggml_ctx``) lives on: free it with ``ggml_free`` (or let it be
    collected). A ``gguf_load`` result is freed whole, its tensor data included (ggmlR's ``gguf_free``).

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file``, ``gguf_init_empty`` or ``gguf_load``).

    Value: None.

    Example:
        >>> gguf_free(g)
    """
    free_handle(ctx, GgufContext, "gguf_free(ctx)")


def _gctx(ctx: Any, fn: str) -> Any:
    return unwrap(ctx, GgufContext, f"{fn}(ctx)")


# ---------------------------------------------------------------- keys and values

def gguf_get_n_kv(ctx: GgufContext) -> int:
    """The number of metadata keys in a GGUF context.

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).

    Value: an int.

    Example:
        >>> {gguf_get_key(g, i): gguf_get_val(g, i) for i in range(gguf_get_n_kv(g))}
    """
    return int(lib.gguf_get_n_kv(_gctx(ctx, "gguf_get_n_kv")))


def _path_bytes(p: Any) -> bytes:
    raw = os.fsencode(p)
    if b"\0" in raw:
        raise GgmlValueError(f"a file path must not contain NUL characters, got {p!r}")
    return raw


def _key_bytes(key: Any, fn: str) -> bytes:
    expect(isinstance(key, str), f"{fn}: key must be a str, got {key!r}", GgmlTypeError)
    expect(key != "", f"{fn}: key must be a non-empty str, got ''")
    return c_string(fn, "key", key)


def gguf_find_key(ctx: GgufContext, key: str) -> int:
    """The index of the metadata key ``key``, or -1 if the context has no such key.

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        key: the key name, a non-empty str.

    Value: an int.

    Example:
        >>> gguf_find_key(g, "general.name") >= 0
        True
    """
    return int(lib.gguf_find_key(_gctx(ctx, "gguf_find_key"), _key_bytes(key, "gguf_find_key")))


def _key_id(ctx: GgufContext, key_id: Any, fn: str) -> tuple[Any, int]:
    g = _gctx(ctx, fn)
    if isinstance(key_id, str):
        kid = int(lib.gguf_find_key(g, _key_bytes(key_id, fn)))
        if kid < 0:
            raise GgufKeyError(f"{fn}: no key {key_id!r} in this GGUF context")
        return g, kid
    return g, _index_in(fn, "key_id", key_id, int(lib.gguf_get_n_kv(g)), "keys", " or a key name")


def gguf_get_key(ctx: GgufContext, key_id: int) -> str:
    """The name of a metadata key.

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
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
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        key_id: the key's index in ``[0, gguf_get_n_kv(ctx))`` or its name (an unknown name raises
            GgufKeyError, an index out of range GgmlValueError).

    Value: an int GGUF type (``'arr'`` by name for arrays, whose values ``gguf_get_val`` returns as lists).

    Example:
        >>> gguf_type_name(gguf_get_kv_type(g, "general.alignment"))
        'u32'
    """
    g, kid = _key_id(ctx, key_id, "gguf_get_kv_type")
    return int(lib.gguf_get_kv_type(g, kid))


def gguf_get_val(ctx: GgufContext, key_id: int | str) -> Any:
    """The value of a metadata key, converted to Python.

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
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
    if ctx._nul_values:
        key = ffi.string(lib.gguf_get_key(g, kid)).decode("utf-8", "replace")
        if key in ctx._nul_values:
            raise GgmlValueError(f"{fn}: the string value of key {key!r} holds a NUL byte, where C (and so ggml) cuts "
                                 "strings: it cannot be returned whole. Read the file with the gguf package, or set "
                                 "the key to a new value")
    if t == GGUF_TYPE_STRING:
        return ffi.string(lib.gguf_get_val_str(g, kid)).decode("utf-8", "replace")
    if t in _GETTERS:
        return _GETTERS[t](g, kid)
    if t == GGUF_TYPE_ARRAY:
        at, n = int(lib.gguf_get_arr_type(g, kid)), int(lib.gguf_get_arr_n(g, kid))
        if at == GGUF_TYPE_STRING:
            return [ffi.string(lib.gguf_get_arr_str(g, kid, i)).decode("utf-8", "replace") for i in range(n)]
        if at in _GGUF_DTYPES:
            dt = _GGUF_DTYPES[at]
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
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        key: the key name, a non-empty str.

    Value: the key's former index, or -1 if it was absent.

    Example:
        >>> gguf_remove_key(g, "training.epochs")
    """
    g, kb = _gctx(ctx, "gguf_remove_key"), _key_bytes(key, "gguf_remove_key")
    ctx._nul_values.discard(key)
    return int(lib.gguf_remove_key(g, kb))


def _check_alignment_key(g: Any, key: str, gtype: int, value: Any, fn: str) -> None:
    if key != GGUF_KEY_GENERAL_ALIGNMENT:
        return
    # ggml aborts unless it is a u32 power of 2; it also lays out the data with the alignment the
    # context was created with, so any other value would describe the file wrongly.
    current = int(lib.gguf_get_alignment(g))
    if gtype != GGUF_TYPE_UINT32 or value != current:
        raise GgmlValueError(f"{fn}: {key!r} must be a u32 equal to the context's alignment ({current}); "
                             f"got {value!r} as {gguf_type_name(gtype)}")


def _set_scalar(ctx: GgufContext, key: str, value: Any, gtype: int, fn: str) -> None:
    g = _gctx(ctx, fn)
    kb = _key_bytes(key, fn)
    ctx._nul_values.discard(key)
    if gtype in _INT_RANGES:
        expect(isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)),
               f"{fn}: value must be an int, got {value!r}", GgmlTypeError)
        lo, hi = _INT_RANGES[gtype]
        expect(lo <= int(value) < hi, f"{fn}: {value} is out of range for {gguf_type_name(gtype)} [{lo}, {hi - 1}]")
        value = int(value)
    elif gtype == GGUF_TYPE_BOOL:
        expect(isinstance(value, (bool, np.bool_)), f"{fn}: value must be a bool, got {value!r}", GgmlTypeError)
        value = bool(value)
    else:
        expect(isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)),
               f"{fn}: value must be a number, got {value!r}", GgmlTypeError)
        value = float(value)
        # a finite value beyond float32 would be stored as inf (the integer setters check their range too)
        expect(gtype != GGUF_TYPE_FLOAT32 or not math.isfinite(value) or abs(value) <= FLOAT32_MAX,
               f"{fn}: {value} is beyond f32's range (+-{FLOAT32_MAX:.4g}) and would be stored as inf; use "
               "gguf_set_val_f64")
    _check_alignment_key(g, key, gtype, value, fn)
    _SETTERS[gtype](g, kb, value)


def gguf_set_val_str(ctx: GgufContext, key: str, value: str) -> None:
    """Set ``key`` to a string value (replacing any previous value of that key).

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        key: a non-empty str without NUL characters, e.g. ``"general.name"``.
        value: a str without NUL characters.

    Value: None. Raises GgmlTypeError for a value of the wrong kind, GgmlValueError for one out of range.
    ``general.alignment`` may only be set to the context's alignment, as a u32.

    Example:
        >>> gguf_set_val_str(g, "general.name", "mnist-mlp")
    """
    fn = "gguf_set_val_str"
    g = _gctx(ctx, fn)
    kb = _key_bytes(key, fn)
    ctx._nul_values.discard(key)
    raw = c_string(fn, "value", value)
    _check_alignment_key(g, key, GGUF_TYPE_STRING, value, fn)
    lib.gguf_set_val_str(g, kb, raw)


def gguf_set_val_i32(ctx: GgufContext, key: str, value: int) -> None:
    """Set ``key`` to a signed 32-bit integer (i32) value (replacing any previous value of that key).

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        key: a non-empty str without NUL characters, e.g. ``"general.name"``.
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
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        key: a non-empty str without NUL characters, e.g. ``"general.name"``.
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
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        key: a non-empty str without NUL characters, e.g. ``"general.name"``.
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
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        key: a non-empty str without NUL characters, e.g. ``"general.name"``.
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
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        key: a non-empty str without NUL characters, e.g. ``"general.name"``.
        value: a real number.

    Value: None. Raises GgmlTypeError for a value of the wrong kind, GgmlValueError for one out of range.
    ``general.alignment`` may only be set to the context's alignment, as a u32.

    Example:
        >>> gguf_set_val_f64(g, "training.loss", 0.0312)
    """
    _set_scalar(ctx, key, value, GGUF_TYPE_FLOAT64, "gguf_set_val_f64")


def gguf_set_val_bool(ctx: GgufContext, key: str, value: bool) -> None:
    """Set ``key`` to a boolean value (replacing any previous value of that key).

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        key: a non-empty str without NUL characters, e.g. ``"general.name"``.
        value: a bool (or numpy bool).

    Value: None. Raises GgmlTypeError for a value of the wrong kind, GgmlValueError for one out of range.
    ``general.alignment`` may only be set to the context's alignment, as a u32.

    Example:
        >>> gguf_set_val_bool(g, "model.normalised", True)
    """
    _set_scalar(ctx, key, value, GGUF_TYPE_BOOL, "gguf_set_val_bool")


def _int_type(values: list[int]) -> int:
    for t in (GGUF_TYPE_INT32, GGUF_TYPE_INT64, GGUF_TYPE_UINT64):
        lo, hi = _INT_RANGES[t]
        if all(lo <= v < hi for v in values):
            return t
    raise GgmlValueError(f"integers out of the 64-bit range: {values[:4]!r}")


def _set_array(g: Any, key: str, kb: bytes, value: Any, fn: str) -> None:
    arr = value if isinstance(value, np.ndarray) else None
    items = list(value) if arr is None else None
    if items is not None and items and all(isinstance(v, str) for v in items):
        raws = [c_string(fn, f"value[{i}]", v) for i, v in enumerate(items)]
        _check_alignment_key(g, key, GGUF_TYPE_ARRAY, value, fn)
        keep = [ffi.new("char[]", v) for v in raws]
        lib.gguf_set_arr_str(g, kb, ffi.new("const char *[]", keep), len(keep))
        return
    if items is not None:
        if all(isinstance(v, (bool, np.bool_)) for v in items) and items:
            arr = np.asarray(items, dtype=np.bool_)
        elif all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in items):
            ints = [int(v) for v in items]
            arr = np.asarray(ints, dtype=_GGUF_DTYPES[_int_type(ints)])
        elif all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in items):
            arr = np.asarray(items, dtype=np.float64)
        else:
            raise GgmlTypeError(f"{fn}: a list value must hold only str, only bool or only numbers; key {key!r}")
    expect(arr.ndim == 1, f"{fn}: array values must be 1-D, key {key!r} has shape {arr.shape}")
    gtype = _DTYPE_GGUF.get(arr.dtype)
    if gtype is None:
        raise GgmlTypeError(f"{fn}: arrays of dtype {arr.dtype} cannot be stored (key {key!r})")
    arr = np.ascontiguousarray(arr, dtype=_GGUF_DTYPES[gtype])
    _check_alignment_key(g, key, GGUF_TYPE_ARRAY, value, fn)
    lib.gguf_set_arr_data(g, kb, gtype, ffi.from_buffer(arr) if arr.size else ffi.NULL, arr.size)


def gguf_set_val(ctx: GgufContext, key: str, value: Any) -> None:
    """Set metadata ``key`` to ``value`` with the GGUF type that fits it.

    bool -> bool; str -> str; int -> i32, else i64, else u64 (``general.alignment``: u32); float -> f64;
    a numpy scalar -> its own type; a 1-D list/tuple/array of str, bools or numbers -> a GGUF array.
    The typed ``gguf_set_val_i32`` ... ``gguf_set_val_str`` choose the type explicitly.

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        key: a non-empty str without NUL characters.
        value: a bool, int, float, str, numpy scalar, or a 1-D list/tuple/array of one kind of those.

    Value: None. Raises GgmlTypeError for a value that cannot be stored.

    Example:
        >>> gguf_set_val(g, "training.epochs", 10)
        >>> gguf_set_val(g, "labels", ["cat", "dog"])
    """
    fn = "gguf_set_val"
    g = _gctx(ctx, fn)
    kb = _key_bytes(key, fn)
    ctx._nul_values.discard(key)
    if isinstance(value, (bool, np.bool_)):
        return gguf_set_val_bool(ctx, key, value)
    if isinstance(value, str):
        return gguf_set_val_str(ctx, key, value)
    if isinstance(value, np.generic) and value.dtype in _DTYPE_GGUF:
        return _set_scalar(ctx, key, value.item(), _DTYPE_GGUF[value.dtype], fn)
    if isinstance(value, numbers.Integral):
        t = GGUF_TYPE_UINT32 if key == GGUF_KEY_GENERAL_ALIGNMENT else _int_type([int(value)])
        return _set_scalar(ctx, key, value, t, fn)
    if isinstance(value, numbers.Real):
        return _set_scalar(ctx, key, value, GGUF_TYPE_FLOAT64, fn)
    if isinstance(value, (list, tuple, np.ndarray)):
        return _set_array(g, key, kb, value, fn)
    raise GgmlTypeError(f"{fn}: cannot store a {type(value).__name__} under {key!r} "
                        "(use bool, int, float, str, or a list of one of them)")


# ---------------------------------------------------------------- tensors

def gguf_get_n_tensors(ctx: GgufContext) -> int:
    """The number of tensors described in a GGUF context.

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).

    Value: an int.

    Example:
        >>> [gguf_get_tensor_name(g, i) for i in range(gguf_get_n_tensors(g))]
    """
    return int(lib.gguf_get_n_tensors(_gctx(ctx, "gguf_get_n_tensors")))


def gguf_find_tensor(ctx: GgufContext, name: str) -> int:
    """The index of the tensor called ``name``, or -1 if the context has none.

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        name: the tensor's name (a str).

    Value: an int.

    Example:
        >>> i = gguf_find_tensor(g, "dense.weight")
        >>> gguf_get_tensor_shape(g, i)
    """
    g = _gctx(ctx, "gguf_find_tensor")
    return int(lib.gguf_find_tensor(g, c_string("gguf_find_tensor", "name", name)))


def _tensor_id(ctx: GgufContext, tensor_id: Any, fn: str) -> tuple[Any, int]:
    g = _gctx(ctx, fn)
    return g, _index_in(fn, "tensor_id", tensor_id, int(lib.gguf_get_n_tensors(g)), "tensors")


def _index_in(fn: str, name: str, value: Any, n: int, items: str, alternative: str = "") -> int:
    """``value`` as an index into ``n`` keys or tensors (ggml aborts on one out of range)."""
    expect(isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value < n,
           f"{fn}: {name} must be an int in [0, {n}){alternative}, got {value!r}" if n else
           f"{fn}: the GGUF context has no {items} (asked for {value!r})")
    return int(value)


def gguf_get_tensor_name(ctx: GgufContext, tensor_id: int) -> str:
    """The name of tensor number ``tensor_id``.

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        tensor_id: the tensor's index in ``[0, gguf_get_n_tensors(ctx))`` (else GgmlValueError); see
            ``gguf_find_tensor``.

    Value: a str.

    Example:
        >>> gguf_get_tensor_name(g, 0)
        'dense.weight'
    """
    g, i = _tensor_id(ctx, tensor_id, "gguf_get_tensor_name")
    return ffi.string(lib.gguf_get_tensor_name(g, i)).decode("utf-8", "replace")


def gguf_get_tensor_type(ctx: GgufContext, tensor_id: int) -> int:
    """The ggml type of tensor number ``tensor_id`` (a ``GGML_TYPE_*`` int, quantized types included).

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        tensor_id: the tensor's index in ``[0, gguf_get_n_tensors(ctx))`` (else GgmlValueError); see
            ``gguf_find_tensor``.

    Value: an int.

    Example:
        >>> gguf_get_tensor_type(g, 0) == GGML_TYPE_F32
        True
    """
    g, i = _tensor_id(ctx, tensor_id, "gguf_get_tensor_type")
    return int(lib.gguf_get_tensor_type(g, i))


def gguf_get_tensor_shape(ctx: GgufContext, tensor_id: int) -> tuple[int, int, int, int]:
    """The shape ``(ne0, ne1, ne2, ne3)`` of tensor number ``tensor_id``, like ``ggml_tensor_shape``.

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        tensor_id: the tensor's index in ``[0, gguf_get_n_tensors(ctx))`` (else GgmlValueError); see
            ``gguf_find_tensor``.

    Value: a tuple of four ints (unused dimensions are 1).

    Example:
        >>> gguf_get_tensor_shape(g, gguf_find_tensor(g, "dense.weight"))
        (784, 128, 1, 1)
    """
    g, i = _tensor_id(ctx, tensor_id, "gguf_get_tensor_shape")
    ne = lib.gguf_get_tensor_ne(g, i)
    return (int(ne[0]), int(ne[1]), int(ne[2]), int(ne[3]))


def gguf_get_tensor_size(ctx: GgufContext, tensor_id: int) -> int:
    """The size in bytes of the data of tensor number ``tensor_id``.

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        tensor_id: the tensor's index in ``[0, gguf_get_n_tensors(ctx))`` (else GgmlValueError); see
            ``gguf_find_tensor``.

    Value: an int.

    Example:
        >>> sum(gguf_get_tensor_size(g, i) for i in range(gguf_get_n_tensors(g)))
    """
    g, i = _tensor_id(ctx, tensor_id, "gguf_get_tensor_size")
    return int(lib.gguf_get_tensor_size(g, i))


def _check_has_data(tensor: Tensor, fn: str) -> Any:
    """The tensor's pointer, if it is contiguous and has memory its bytes can be read from or written to."""
    t = tensor.ptr
    label = f"tensor '{tensor.name}'" if tensor.name else "an unnamed tensor"
    if not lib.ggml_is_contiguous(t):
        raise GgmlValueError(f"{fn}: {label} is a strided view; GGUF stores contiguous tensors only "
                             "(apply ggml_cont, or use the tensor it views)")
    try:
        storage = _storage(t)
    except GgmlStateError as exc:
        raise GgmlStateError(f"{fn}: {label}: {exc}") from None
    if storage == "backend" and t.buffer == ffi.NULL:
        raise GgmlStateError(f"{fn}: {label} is a view whose buffer is not set (allocate it with the context)")
    return t


def gguf_add_tensor(ctx: GgufContext, tensor: Tensor) -> None:
    """Add a tensor (its name, type, shape, and later its data) to a GGUF context being written.

    Only the header is copied now; the data is read when ``gguf_write_to_file`` runs, so keep the
    tensor and its memory alive until then (a tensor freed or moved in between is refused then).

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        tensor: a named (``ggml_set_name``), contiguous tensor that has memory (in a backend buffer or
            a context); the name must be new to the context.

    Value: None. Raises GgmlValueError for an unnamed, duplicate or strided tensor, GgmlStateError for
    one without memory.

    Example:
        >>> gguf_add_tensor(g, ggml_set_name(w, "dense.weight"))
    """
    fn = "gguf_add_tensor"
    g = _gctx(ctx, fn)
    tensor = as_tensor(tensor, f"{fn}(tensor)")
    name = tensor.name
    expect(name != "", f"{fn}: the tensor has no name; GGUF finds tensors by name (use ggml_set_name first)")
    if lib.gguf_find_tensor(g, name.encode()) != -1:
        raise GgmlValueError(f"{fn}: duplicate tensor name '{name}': the GGUF context already has a tensor "
                             "of that name")
    t = _check_has_data(tensor, fn)
    lib.gguf_add_tensor(g, t)
    ctx._sources.append((tensor, _addr(t.data), _addr(t.buffer)))


def gguf_write_to_file(ctx: GgufContext, path: Any, only_meta: bool = False) -> None:
    """Write a GGUF context to ``path``: metadata, tensor infos and (unless ``only_meta``) tensor data.

    Arguments:
        ctx: a GGUF context (``gguf_init_from_file`` or ``gguf_init_empty``).
        path: the file to create or overwrite (a str or os.PathLike).
        only_meta: False (the default) writes the tensors' data too, read now from the tensors added
            with ``gguf_add_tensor``; True writes metadata and tensor infos only (the only choice for a
            context read from a file without its data).

    Value: None. Raises GgmlStateError when a tensor's memory was freed or moved since it was added,
    GgufFileError when the file cannot be written.

    Example:
        >>> gguf_write_to_file(g, "model.gguf")
    """
    fn = "gguf_write_to_file"
    g = _gctx(ctx, fn)
    p = _fs_path(path, fn)
    _check_writable_path(p, fn)
    expect(isinstance(only_meta, bool), f"{fn}: only_meta must be a bool, got {only_meta!r}", GgmlTypeError)
    if not only_meta:
        for i, src in enumerate(ctx._sources):
            name = ffi.string(lib.gguf_get_tensor_name(g, i)).decode("utf-8", "replace")
            if src is None:
                raise GgmlStateError(f"{fn}: tensor '{name}' was read from a file without its data; write with "
                                     "only_meta=True, or add tensors that hold data to a new context")
            tensor, data, buffer = src
            if not tensor.owner.alive:
                raise GgmlStateError(f"{fn}: tensor '{name}' belongs to a {tensor.owner.kind} that has been freed")
            t = tensor.ptr
            if t.data == ffi.NULL or _addr(t.data) != data or _addr(t.buffer) != buffer:
                raise GgmlStateError(f"{fn}: the memory of tensor '{name}' was freed or moved after gguf_add_tensor; "
                                     "add it to a new GGUF context")
    if _is_device(p):  # /dev/null, a tape: cannot be replaced; the checked file is copied onto it by Python
        _write_to_device(g, p, only_meta, fn)
        return
    _write_replacing(g, p, only_meta, fn)


def _complete(path: str, only_meta: bool) -> tuple[bool, int]:
    """(whether the GGUF file at ``path`` reads back whole, its size)."""
    size = os.path.getsize(path)
    try:
        with _open_header(path, "gguf_write_to_file") as back:
            return only_meta or size >= _data_extent(back.ptr), size
    except GgufFileError:
        return False, size


def _write_in_place(g: Any, target: str, p: str, only_meta: bool, fn: str) -> None:
    """The fallback when no new file can be made beside ``target``: ggml overwrites it, then it is checked."""
    with _ggml_errors() as lines:
        ok = lib.gguf_write_to_file(g, _path_bytes(target), only_meta)
    complete, size = _complete(target, only_meta)
    if not ok or not complete:
        raise GgufFileError(f"{fn}: could not write {p!r}{_reason(lines) if not ok else ''}: only {size} bytes reached "
                            "the disk (is it full?); the file is incomplete")


def _write_to_device(g: Any, p: str, only_meta: bool, fn: str) -> None:
    """ggml does not check its last writes (onto /dev/full it reported success): write a checked file in the
    temporary folder, then copy it with Python, whose writes raise."""
    import shutil
    with tempfile.TemporaryDirectory(prefix="ggmlpy-gguf-") as tmp:
        staged = os.path.join(tmp, "out.gguf")
        _write_replacing(g, staged, only_meta, fn)
        try:
            with open(staged, "rb") as src, open(p, "wb") as dst:
                shutil.copyfileobj(src, dst)
        except OSError as exc:
            raise GgufFileError(f"{fn}: could not write {p!r}: {exc.strerror or exc}") from None


def _is_device(p: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(p).st_mode)
    except OSError:
        return False


def _write_replacing(g: Any, p: str, only_meta: bool, fn: str) -> None:
    """Write to a new file beside ``p``, check it reads back whole, then rename it over ``p``: ggml does not
    check its last writes (a full disk left a truncated file and no error), and a failed write must not
    destroy the file that was there."""
    target = os.path.realpath(p)  # a symlink keeps pointing at the new file
    folder, base = os.path.split(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=folder or ".")
    except PermissionError:
        if not os.path.isfile(target):
            raise GgufFileError(f"{fn}: could not write {p!r}: permission denied in its folder") from None
        _write_in_place(g, target, p, only_meta, fn)  # a writable file in a folder we may not write to
        return
    except OSError as exc:
        raise GgufFileError(f"{fn}: could not write {p!r}: {exc.strerror or exc}") from None
    os.close(fd)
    try:
        with _ggml_errors() as lines:
            ok = lib.gguf_write_to_file(g, _path_bytes(tmp), only_meta)
        if not ok:
            raise GgufFileError(f"{fn}: could not write {p!r}{_reason(lines)}")
        complete, size = _complete(tmp, only_meta)
        if not complete:
            raise GgufFileError(f"{fn}: could not write {p!r}: only {size} bytes reached the disk (is it full, or "
                                "over a file size limit?); the file that was there is unchanged")
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
