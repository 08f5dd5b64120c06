"""GGUF contexts (``GgufContext``): creating and opening them, paths, and what ggml's reader refuses."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from .._ffi import CData, ffi, ggml_logger, lib
from ..core.handle import free_handle, Handle, unwrap
from ..core.paths import check_readable_file, fs_path, os_reason, path_bytes, PathArg
from ..core.sysmem import check_fits_memory
from ..errors import expect, GgmlTypeError, GgufFileError
from ..graph.objects import Context, Tensor
from .header import check_data_in_file, check_header, data_extent


class GgufContext(Handle):
    kind = "gguf context"

    def __init__(self, ptr: CData, path: str | None = None, ggml_ctx: Context | None = None) -> None:
        super().__init__(ptr, lib.gguf_free)
        self.path = path
        self.ggml_ctx = ggml_ctx  # tensors with the file's data (gguf_init_from_file(no_alloc=False))
        self.nul_values: set[str] = set()  # keys read from the file whose strings hold NUL bytes (C cuts them)
        # One entry per tensor info: (Tensor, data address, buffer address) for tensors added here,
        # None for tensors read from a file (their headers carry no data to write).
        self.sources: list[tuple[Tensor, int, int] | None] = [None] * int(lib.gguf_get_n_tensors(ptr))

    def _describe(self) -> str:
        if self._ptr is None:
            return ""
        where = f" {self.path!r}" if self.path else ""
        return f"{where} {lib.gguf_get_n_tensors(self._ptr)} tensors, {lib.gguf_get_n_kv(self._ptr)} keys"


class _FileDataContext(Context):
    """The ggml context gguf_init_from_file creates with no_alloc=False (host memory holding the data)."""

    def __init__(self, ptr: CData) -> None:  # noqa: D107 - not created with ggml_init
        Handle.__init__(self, ptr, lib.ggml_free)
        self.mem_size = int(lib.ggml_get_mem_size(ptr))
        self.no_alloc = False


def tensor_addr(p: CData) -> int:
    return int(ffi.cast("uintptr_t", p))


@contextmanager
def captured_ggml_errors() -> Iterator[list[str]]:
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


def gguf_init_from_file(path: PathArg, no_alloc: bool = True) -> GgufContext:
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
    p = fs_path(path, fn)
    expect(isinstance(no_alloc, bool), f"{fn}: no_alloc must be a bool, got {no_alloc!r}", GgmlTypeError)
    size = check_readable_file(p, fn)
    # The header first, without data: ggml checks its structure and allocates nothing beyond the file's size.
    header = open_header(p, fn)
    try:
        exact = check_header(header.ptr, p, fn)
        if not no_alloc:
            # ggml would allocate the declared data size at once and abort when that fails: a size field
            # flipped to a huge value must be caught here, before the C call.
            check_data_in_file(header.ptr, size, p, fn)
            need = data_extent(header.ptr) - int(lib.gguf_get_data_offset(header.ptr)) + \
                (int(lib.gguf_get_n_tensors(header.ptr)) + 1) * int(lib.ggml_tensor_overhead())
    except BaseException:
        header.free()
        raise
    if no_alloc:
        header.nul_values = exact.nul_values
        return header
    header.free()
    check_fits_memory(fn, f"the data of {p!r}", need, "open it with no_alloc=True and load the tensors you need "
                      "into backend tensors with ggml_load_weights_gguf")
    ctx_out = ffi.new("struct ggml_context **")
    params = ffi.new("struct gguf_init_params *", {"no_alloc": False, "ctx": ctx_out})
    with captured_ggml_errors() as lines:
        ptr = lib.gguf_init_from_file(path_bytes(p), params[0])
    if ptr == ffi.NULL:
        raise GgufFileError(f"{fn}: {p!r} could not be loaded{os_reason(lines)}")
    ggml_ctx = _FileDataContext(ctx_out[0]) if ctx_out[0] != ffi.NULL else None
    g = GgufContext(ptr, path=p, ggml_ctx=ggml_ctx)
    g.nul_values = exact.nul_values
    return g


def open_header(p: str, fn: str) -> GgufContext:
    params = ffi.new("struct gguf_init_params *", {"no_alloc": True, "ctx": ffi.NULL})
    with captured_ggml_errors() as lines:
        ptr = lib.gguf_init_from_file(path_bytes(p), params[0])
    if ptr == ffi.NULL:
        raise GgufFileError(f"{fn}: {p!r} is not a valid GGUF file{os_reason(lines)}")
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


def unwrap_gguf(ctx: object, fn: str) -> CData:
    return unwrap(ctx, GgufContext, f"{fn}(ctx)")
