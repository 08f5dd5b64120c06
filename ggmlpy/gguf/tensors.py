"""GGUF tensors: their names, types, shapes and sizes, adding them, and writing a file atomically."""
from __future__ import annotations

import os
import stat
import tempfile

from .._ffi import CData, ffi, lib
from ..backend.transfer import storage_of
from ..core.args import c_string, is_int
from ..core.paths import check_writable_path, fs_path, os_reason, path_bytes, PathArg
from ..errors import expect, GgmlStateError, GgmlTypeError, GgmlValueError, GgufFileError
from ..graph.objects import as_tensor, Tensor
from .file import captured_ggml_errors, GgufContext, open_header, tensor_addr, unwrap_gguf
from .header import data_extent


def gguf_get_n_tensors(ctx: GgufContext) -> int:
    """The number of tensors described in a GGUF context.

    Arguments:
        ctx: [glossary: gguf]

    Value: an int.

    Example:
        >>> [gguf_get_tensor_name(g, i) for i in range(gguf_get_n_tensors(g))]
    """
    return int(lib.gguf_get_n_tensors(unwrap_gguf(ctx, "gguf_get_n_tensors")))


def gguf_find_tensor(ctx: GgufContext, name: str) -> int:
    """The index of the tensor called ``name``, or -1 if the context has none.

    Arguments:
        ctx: [glossary: gguf]
        name: the tensor's name (a str).

    Value: an int.

    Example:
        >>> i = gguf_find_tensor(g, "dense.weight")
        >>> gguf_get_tensor_shape(g, i)
    """
    g = unwrap_gguf(ctx, "gguf_find_tensor")
    return int(lib.gguf_find_tensor(g, c_string("gguf_find_tensor", "name", name)))


def _tensor_id(ctx: GgufContext, tensor_id: object, fn: str) -> tuple[CData, int]:
    g = unwrap_gguf(ctx, fn)
    return g, index_in(fn, "tensor_id", tensor_id, int(lib.gguf_get_n_tensors(g)), "tensors")


def index_in(fn: str, name: str, value: object, n: int, items: str, alternative: str = "") -> int:
    """``value`` as an index into ``n`` keys or tensors (ggml aborts on one out of range)."""
    if not (is_int(value) and 0 <= value < n):
        raise GgmlValueError(f"{fn}: {name} must be an int in [0, {n}){alternative}, got {value!r}" if n else
                             f"{fn}: the GGUF context has no {items} (asked for {value!r})")
    return int(value)


def gguf_get_tensor_name(ctx: GgufContext, tensor_id: int) -> str:
    """The name of tensor number ``tensor_id``.

    Arguments:
        ctx: [glossary: gguf]
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
        ctx: [glossary: gguf]
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
        ctx: [glossary: gguf]
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
        ctx: [glossary: gguf]
        tensor_id: the tensor's index in ``[0, gguf_get_n_tensors(ctx))`` (else GgmlValueError); see
            ``gguf_find_tensor``.

    Value: an int.

    Example:
        >>> sum(gguf_get_tensor_size(g, i) for i in range(gguf_get_n_tensors(g)))
    """
    g, i = _tensor_id(ctx, tensor_id, "gguf_get_tensor_size")
    return int(lib.gguf_get_tensor_size(g, i))


def check_has_data(tensor: Tensor, fn: str) -> CData:
    """The tensor's pointer, if it is contiguous and has memory its bytes can be read from or written to."""
    t = tensor.ptr
    label = f"tensor '{tensor.name}'" if tensor.name else "an unnamed tensor"
    if not lib.ggml_is_contiguous(t):
        raise GgmlValueError(f"{fn}: {label} is a strided view; GGUF stores contiguous tensors only "
                             "(apply ggml_cont, or use the tensor it views)")
    try:
        storage = storage_of(t)
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
        ctx: [glossary: gguf]
        tensor: a named (``ggml_set_name``), contiguous tensor that has memory (in a backend buffer or
            a context); the name must be new to the context.

    Value: None. Raises GgmlValueError for an unnamed, duplicate or strided tensor, GgmlStateError for
    one without memory.

    Example:
        >>> gguf_add_tensor(g, ggml_set_name(w, "dense.weight"))
    """
    fn = "gguf_add_tensor"
    g = unwrap_gguf(ctx, fn)
    tensor = as_tensor(tensor, f"{fn}(tensor)")
    name = tensor.name
    expect(name != "", f"{fn}: the tensor has no name; GGUF finds tensors by name (use ggml_set_name first)")
    if lib.gguf_find_tensor(g, name.encode()) != -1:
        raise GgmlValueError(f"{fn}: duplicate tensor name '{name}': the GGUF context already has a tensor "
                             "of that name")
    t = check_has_data(tensor, fn)
    lib.gguf_add_tensor(g, t)
    ctx.sources.append((tensor, tensor_addr(t.data), tensor_addr(t.buffer)))


def gguf_write_to_file(ctx: GgufContext, path: PathArg, only_meta: bool = False) -> None:
    """Write a GGUF context to ``path``: metadata, tensor infos and (unless ``only_meta``) tensor data.

    Arguments:
        ctx: [glossary: gguf]
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
    g = unwrap_gguf(ctx, fn)
    p = fs_path(path, fn)
    check_writable_path(p, fn)
    expect(isinstance(only_meta, bool), f"{fn}: only_meta must be a bool, got {only_meta!r}", GgmlTypeError)
    if not only_meta:
        for i, src in enumerate(ctx.sources):
            name = ffi.string(lib.gguf_get_tensor_name(g, i)).decode("utf-8", "replace")
            if src is None:
                raise GgmlStateError(f"{fn}: tensor '{name}' was read from a file without its data; write with "
                                     "only_meta=True, or add tensors that hold data to a new context")
            tensor, data, buffer = src
            if not tensor.owner.alive:
                raise GgmlStateError(f"{fn}: tensor '{name}' belongs to a {tensor.owner.kind} that has been freed")
            t = tensor.ptr
            if t.data == ffi.NULL or tensor_addr(t.data) != data or tensor_addr(t.buffer) != buffer:
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
        with open_header(path, "gguf_write_to_file") as back:
            return only_meta or size >= data_extent(back.ptr), size
    except GgufFileError:
        return False, size


def _write_in_place(g: CData, target: str, p: str, only_meta: bool, fn: str) -> None:
    """The fallback when no new file can be made beside ``target``: ggml overwrites it, then it is checked."""
    with captured_ggml_errors() as lines:
        ok = lib.gguf_write_to_file(g, path_bytes(target), only_meta)
    complete, size = _complete(target, only_meta)
    if not ok or not complete:
        raise GgufFileError(f"{fn}: could not write {p!r}{os_reason(lines) if not ok else ''}: only {size} bytes "
                            "reached the disk (is it full?); the file is incomplete")


def _write_to_device(g: CData, p: str, only_meta: bool, fn: str) -> None:
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


def _write_replacing(g: CData, p: str, only_meta: bool, fn: str) -> None:
    """Write to a new file beside ``p``, check it reads back whole, then rename it over ``p``: ggml does not
    check its last writes (a full disk left a truncated file and no error), and a failed write must not
    destroy the file that was there."""
    target = os.path.realpath(p)  # a symlink keeps pointing at the new file
    folder, base = os.path.split(target)
    try:
        # the temporary name stays short: a legal file name of up to 255 bytes leaves no room for a suffix
        fd, tmp = tempfile.mkstemp(prefix=f".{base[:48]}.", suffix=".tmp", dir=folder or ".")
    except PermissionError:
        if not os.path.isfile(target):
            raise GgufFileError(f"{fn}: could not write {p!r}: permission denied in its folder") from None
        _write_in_place(g, target, p, only_meta, fn)  # a writable file in a folder we may not write to
        return
    except OSError as exc:
        raise GgufFileError(f"{fn}: could not write {p!r}: {exc.strerror or exc}") from None
    os.close(fd)
    try:
        with captured_ggml_errors() as lines:
            ok = lib.gguf_write_to_file(g, path_bytes(tmp), only_meta)
        if not ok:
            raise GgufFileError(f"{fn}: could not write {p!r}{os_reason(lines)}")
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
