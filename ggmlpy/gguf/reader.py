"""GGUF files read the way ggmlR reads them: gguf_load, gguf_metadata, gguf_tensor_names/info/data.

``gguf_load`` opens a file through ``gguf.gguf_init_from_file`` (so it gets the same checks: regular
files only, sizes inside the file, names without NUL bytes, data that fits in memory) and returns a
``GgufFile``: a GGUF context that also holds the file's tensor data and knows its path, version and
counts. ``gguf_tensor_data`` returns a tensor's values as a numpy array in ggmlR's layout: an R array
with ``dim = ne[0:n_dims]`` is, in numpy's C order, the shape ``(ne[n_dims-1], ..., ne[0])``.
Quantized tensors are dequantized by ggml itself (its CPU ``get_rows`` kernel, which converts every
row with the type's ``to_float``).
"""
from __future__ import annotations

from typing import cast

import numpy as np

from .._ffi import CData, ffi, lib
from ..backend.backend import ggml_backend_cpu_init
from ..backend.transfer import numpy_shape
from ..core.args import c_string
from ..core.handle import computing, raise_type, using
from ..core.paths import PathArg
from ..core.sysmem import check_fits_memory
from ..core.types import type_name
from ..errors import GgmlStateError, GgmlTypeError, GgufKeyError
from ..graph.context import ggml_init
from .file import gguf_init_from_file, GgufContext
from .kv import gguf_get_key, gguf_get_n_kv, gguf_get_val


_PLAIN = {int(lib.GGML_TYPE_F32): np.float32, int(lib.GGML_TYPE_F16): np.float16, int(lib.GGML_TYPE_F64): np.float64,
          int(lib.GGML_TYPE_I8): np.int8, int(lib.GGML_TYPE_I16): np.int16, int(lib.GGML_TYPE_I32): np.int32,
          int(lib.GGML_TYPE_I64): np.int64}
_BF16 = int(lib.GGML_TYPE_BF16)


def dequantizable(typ: int) -> bool:
    """Whether ggml can convert rows of quantized type ``typ`` to F32: its type traits have a ``to_float``,
    which the CPU backend's ``get_rows`` calls (Q8_1 and Q8_K have none: get_rows would call NULL)."""
    if not bool(lib.ggml_is_quantized(typ)):
        return False
    traits = lib.ggml_get_type_traits(typ)
    return traits != ffi.NULL and traits.to_float != ffi.NULL


class GgufFile(GgufContext):
    """A GGUF file opened with ``gguf_load``: a GGUF context (every ``gguf_*`` function takes it) plus its
    tensor data (unless ``meta_only``), and ``path``, ``version``, ``n_tensors``, ``n_kv``, ``meta_only``.
    ``gguf_free`` (or the end of a ``with`` block) frees both."""
    kind = "gguf file (gguf_load)"
    path: str
    version: int
    n_tensors: int
    n_kv: int
    meta_only: bool

    def free(self) -> None:
        if self._ptr is None:
            return
        if self.ggml_ctx is not None:
            self.ggml_ctx.free()  # raises GgmlInUseError, freeing nothing, while its data is being read
        super().free()

    def __repr__(self) -> str:
        if self._ptr is None:
            return f"<GgufFile {self.path!r} (freed)>"
        extra = "; meta_only: tensor data not loaded" if self.meta_only else ""
        return (f"<GgufFile {self.path!r}: GGUF version {self.version}, {self.n_tensors} tensors, "
                f"{self.n_kv} metadata keys{extra}>")


def gguf_load(path: PathArg, meta_only: bool = False) -> GgufFile:
    """Open a GGUF file: its metadata, its tensor infos and (unless ``meta_only``) its tensor data.

    The file is checked before ggml reads it (see ``gguf_init_from_file``): it must be a regular,
    readable, valid GGUF file whose tensors' data lie inside it and fit in memory.

    Arguments:
        path: the file, a str or os.PathLike.
        meta_only: False (the default) also reads every tensor's data into memory; True reads the header
            only (cheap: enough for ``gguf_metadata``, ``gguf_tensor_names`` and ``gguf_tensor_info``, not
            for ``gguf_tensor_data``).

    Value: a GgufFile (a context manager; free it with ``gguf_free``) with the attributes ``path``,
    ``version``, ``n_tensors``, ``n_kv`` and ``meta_only``. Raises GgufFileNotFoundError for a missing
    file, GgufFileError for one that is not valid GGUF, truncated or not a regular file.

    Example:
        >>> with gguf_load("model.gguf") as g:
        ...     w = gguf_tensor_data(g, "dense.weight")
    """
    if not isinstance(meta_only, bool):
        raise GgmlTypeError(f"gguf_load: meta_only must be a bool, got {meta_only!r}")
    handle = gguf_init_from_file(path, no_alloc=meta_only)
    handle.__class__ = GgufFile  # the same handle (one owner of the C pointers), with gguf_load's attributes
    g = cast(GgufFile, handle)
    g.version = int(lib.gguf_get_version(g.ptr))
    g.n_tensors = int(lib.gguf_get_n_tensors(g.ptr))
    g.n_kv = int(lib.gguf_get_n_kv(g.ptr))
    g.meta_only = meta_only
    if not isinstance(g.path, str):
        g.path = str(path)
    return g


def _gguf(x: object, fn: str) -> GgufContext:
    if not isinstance(x, GgufContext):
        raise_type(f"{fn}(x)", "gguf file (gguf_load)", x)
    _ = x.ptr  # raises if freed
    return x


def gguf_metadata(x: GgufFile) -> dict:
    """Every metadata key of a GGUF file and its value, as a dict (ggmlR's named list).

    Arguments:
        x: a GgufFile from ``gguf_load`` (any GGUF context is accepted).

    Value: a dict ``{key: value}`` in file order; values are int, float, bool, str, or lists for GGUF
    arrays.

    Example:
        >>> gguf_metadata(g)["general.architecture"]
        'llama'
    """
    _gguf(x, "gguf_metadata")
    return {gguf_get_key(x, i): gguf_get_val(x, i) for i in range(gguf_get_n_kv(x))}


def gguf_tensor_names(x: GgufFile) -> list[str]:
    """The names of the tensors of a GGUF file, in file order.

    Arguments:
        x: a GgufFile from ``gguf_load``.

    Value: a list of str.

    Example:
        >>> gguf_tensor_names(g)[:2]
        ['token_embd.weight', 'blk.0.attn_q.weight']
    """
    g = _gguf(x, "gguf_tensor_names").ptr
    return [ffi.string(lib.gguf_get_tensor_name(g, i)).decode("utf-8", "replace")
            for i in range(int(lib.gguf_get_n_tensors(g)))]


def _tensor_id(x: GgufContext, name: object, fn: str) -> int:
    if not isinstance(name, str):
        raise GgmlTypeError(f"{fn}: name must be a str (a tensor name, see gguf_tensor_names), got {name!r}")
    tid = int(lib.gguf_find_tensor(x.ptr, c_string(fn, "name", name)))
    if tid < 0:
        raise GgufKeyError(f"{fn}: no tensor named {name!r} in this GGUF file (see gguf_tensor_names)")
    return tid


def _ne(x: GgufContext, tid: int) -> tuple[int, ...]:
    """The tensor's ne up to its last dimension > 1 (at least one), as ggml_n_dims counts them."""
    ne_c = lib.gguf_get_tensor_ne(x.ptr, tid)
    ne = [int(ne_c[k]) for k in range(4)]
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(ne)


def gguf_tensor_info(x: GgufFile, name: str) -> dict:
    """Name, shape, type and size of one tensor of a GGUF file.

    Available with ``meta_only=True`` too (unlike ggmlR, which cannot give the shape then).

    Arguments:
        x: a GgufFile from ``gguf_load``.
        name: the tensor's name (else GgufKeyError).

    Value: a dict ``{"name": str, "shape": tuple of ints (ne[0] first, ggmlR's order; trailing 1s
    dropped), "type": ggml's type name such as "f32" or "q4_0", "size_bytes": int}``. The numpy shape
    of ``gguf_tensor_data`` is ``shape`` reversed.

    Example:
        >>> gguf_tensor_info(g, "dense.weight")
        {'name': 'dense.weight', 'shape': (784, 128), 'type': 'f32', 'size_bytes': 401408}
    """
    fn = "gguf_tensor_info"
    _gguf(x, fn)
    tid = _tensor_id(x, name, fn)
    return {"name": name, "shape": _ne(x, tid), "type": type_name(int(lib.gguf_get_tensor_type(x.ptr, tid))),
            "size_bytes": int(lib.gguf_get_tensor_size(x.ptr, tid))}


def gguf_tensor_data(x: GgufFile, name: str) -> np.ndarray:
    """The values of one tensor of a GGUF file as a numpy array, dequantized if needed.

    The layout is ggmlR's: ggmlR's array has ``dim = shape`` (ne[0] first, column-major), which is the
    numpy C-order shape ``shape[::-1]``: a ``[784, 128]`` weight comes back as a ``(128, 784)`` array,
    element ``[j, i]`` being ggml's ``(i, j)``.

    Arguments:
        x: a GgufFile from ``gguf_load`` with ``meta_only=False`` (else GgmlStateError).
        name: the tensor's name (else GgufKeyError).

    Value: a numpy array: float32 for F32, F16, BF16 and quantized tensors (Q4_0, Q8_0, K-quants, ...,
    converted by ggml's own dequantization), float64 for F64, the integer dtype for I8/I16/I32/I64.
    Raises GgmlTypeError for a type ggml cannot convert (naming it).

    Example:
        >>> w = gguf_tensor_data(g, "dense.weight")          # ne [784, 128] -> shape (128, 784)
    """
    fn = "gguf_tensor_data"
    _gguf(x, fn)
    tid = _tensor_id(x, name, fn)
    if getattr(x, "meta_only", False) or x.ggml_ctx is None:
        raise GgmlStateError(f"{fn}: the GGUF file was loaded with meta_only=True, tensor data not available; "
                             "reload it with gguf_load(path, meta_only=False)")
    ctx = x.ggml_ctx
    t = lib.ggml_get_tensor(ctx.ptr, c_string(fn, "name", name))
    if t == ffi.NULL or t.data == ffi.NULL:
        raise GgmlStateError(f"{fn}: the data of tensor {name!r} is not loaded")
    typ = int(t.type)
    shape = numpy_shape(_ne(x, tid))
    n = int(lib.ggml_nelements(t))
    with using([x, ctx], fn):
        if typ in _PLAIN:
            out = np.frombuffer(ffi.buffer(t.data, int(lib.ggml_nbytes(t))), dtype=_PLAIN[typ]).copy()
            if typ == int(lib.GGML_TYPE_F16):
                out = out.astype(np.float32)
        elif typ == _BF16:
            bits = np.frombuffer(ffi.buffer(t.data, 2 * n), dtype=np.uint16)
            out = (bits.astype(np.uint32) << 16).view(np.float32)
        elif dequantizable(typ):
            out = _dequantize(t, n, fn, name)
        else:
            raise GgmlTypeError(f"{fn}: tensor {name!r} has type {type_name(typ)}, which ggml cannot convert to "
                                "numbers (no row dequantization for it)")
    return out.reshape(shape)


def _dequantize(t: CData, n: int, fn: str, name: str) -> np.ndarray:
    """All values of quantized tensor pointer ``t`` (host memory) as float32, converted by ggml: ``get_rows`` of
    every row on the CPU backend."""
    ne0 = int(t.ne[0])
    nrows = n // ne0
    data = 4 * n + 4 * nrows
    check_fits_memory(fn, f"dequantizing tensor {name!r}", data, "read fewer or smaller tensors at a time")
    graph_bytes = int(lib.ggml_graph_overhead_custom(8, False))
    work = ggml_init(data + graph_bytes + 8 * int(lib.ggml_tensor_overhead()) + 4096, no_alloc=False)
    cpu = ggml_backend_cpu_init()
    try:
        w = work.ptr
        rows = lib.ggml_reshape_2d(w, t, ne0, nrows)  # the file's tensors are contiguous
        ids = lib.ggml_new_tensor_1d(w, lib.GGML_TYPE_I32, nrows)
        idx = np.arange(nrows, dtype=np.int32)
        ffi.memmove(ids.data, ffi.from_buffer(idx), idx.nbytes)
        out = lib.ggml_get_rows(w, rows, ids)
        if not lib.ggml_backend_supports_op(cpu.ptr, out):
            raise GgmlTypeError(f"{fn}: tensor {name!r} has type {type_name(int(t.type))}, which ggml's CPU backend "
                                "cannot dequantize")
        graph = lib.ggml_new_graph_custom(w, 8, False)
        lib.ggml_build_forward_expand(graph, out)
        with computing([cpu]):
            status = lib.ggml_backend_graph_compute(cpu.ptr, graph)
        if status != lib.GGML_STATUS_SUCCESS:
            raise GgmlStateError(f"{fn}: ggml could not dequantize tensor {name!r} (status {status})")
        return np.frombuffer(ffi.buffer(out.data, 4 * n), dtype=np.float32).copy()
    finally:
        cpu.free()
        work.free()
