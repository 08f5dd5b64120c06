"""Weights files in GGUF: save and load the data of tensors living in any backend buffer (or in
context memory), matched by name, and read a file's tensors as numpy arrays with its metadata.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from io import BufferedReader

import numpy as np

from .._ffi import lib
from ..backend.transfer import check_rpc_transfer, NUMPY_DTYPES, write_array
from ..core.paths import fs_path, PathArg
from ..core.quants import dequantize_bytes, QuantizedArray
from ..core.sysmem import check_fits_memory
from ..core.types import type_name
from ..errors import BackendUnavailableError, expect, GgmlTypeError, GgmlValueError, GgufFileError, GgufKeyError
from ..graph.objects import as_tensor, Tensor
from ..graph.tensor import ggml_set_name
from .file import gguf_init_empty, gguf_init_from_file, GgufContext
from .header import check_data_in_file
from .kv import gguf_get_key, gguf_get_n_kv, gguf_get_val, gguf_set_val
from .tensors import (
    check_has_data,
    gguf_add_tensor,
    gguf_find_tensor,
    gguf_get_n_tensors,
    gguf_get_tensor_name,
    gguf_get_tensor_shape,
    gguf_get_tensor_size,
    gguf_get_tensor_type,
    gguf_write_to_file,
)


def _named_tensors(tensors: object, fn: str) -> list[tuple[str, Tensor]]:
    """(name, tensor) pairs from a list of named tensors or a dict name -> tensor."""
    pairs: list[tuple[str, Tensor]] = []
    if isinstance(tensors, dict):
        for key, tensor in tensors.items():
            tensor = as_tensor(tensor, f"{fn}(tensors[{key!r}])")
            expect(isinstance(key, str) and key != "", f"{fn}: dict keys must be non-empty names, got {key!r}",
                   GgmlTypeError)
            if tensor.name == "":
                ggml_set_name(tensor, key)
            elif tensor.name != key:
                raise GgmlValueError(f"{fn}: tensors[{key!r}] is already named '{tensor.name}'; "
                                     "use its name as the key or rename it with ggml_set_name")
            pairs.append((key, tensor))
    elif isinstance(tensors, (list, tuple)):
        for i, tensor in enumerate(tensors):
            tensor = as_tensor(tensor, f"{fn}(tensors[{i}])")
            expect(tensor.name != "", f"{fn}: tensors[{i}] {list(tensor.shape)} has no name; name it with "
                                      "ggml_set_name or pass a dict name -> tensor")
            pairs.append((tensor.name, tensor))
    else:
        raise GgmlTypeError(f"{fn}: tensors must be a list of Tensors or a dict name -> Tensor, "
                            f"got {type(tensors).__name__}")
    seen: set[str] = set()
    for name, _ in pairs:
        expect(name not in seen, f"{fn}: two tensors are named '{name}'; names must be unique")
        seen.add(name)
    return pairs


def ggml_save_weights_gguf(path: PathArg, tensors: Mapping[str, Tensor] | Sequence[Tensor],
                           metadata: dict | None = None) -> None:
    """Save tensors (from any backend buffer or context memory) to a GGUF file, with optional metadata.

    Each tensor is stored under its name, with its type and shape; ``ggml_load_weights_gguf`` reads
    them back into tensors of the same names. The data is read from the device when the file is
    written.

    Arguments:
        path: the file to write (a str or os.PathLike); an existing file is replaced.
        tensors: a list of named Tensors, or a dict name -> Tensor (an unnamed tensor takes its key as
            name). Names must be unique; tensors must be contiguous and allocated.
        metadata: an optional dict key -> bool/int/float/str or a 1-D list of one of them (default None),
            stored as GGUF key/values (see ``gguf_set_val``).

    Value: None. Raises GgmlValueError for duplicate or missing names, GgufFileError when the file
    cannot be written.

    Example:
        >>> ggml_save_weights_gguf("mlp.gguf", {"w1": w1, "b1": b1}, {"epochs": 10})
    """
    fn = "ggml_save_weights_gguf"
    p = fs_path(path, fn)
    pairs = _named_tensors(tensors, fn)
    expect(metadata is None or isinstance(metadata, dict),
           f"{fn}: metadata must be a dict or None, got {type(metadata).__name__}", GgmlTypeError)
    for _, tensor in pairs:  # ggml reads the data itself: a lost RPC server's tensors would be written as zeros
        check_rpc_transfer(tensor.ptr)
    with gguf_init_empty() as g:
        for key, value in (metadata or {}).items():
            gguf_set_val(g, key, value)
        for _, tensor in pairs:
            gguf_add_tensor(g, tensor)
        gguf_write_to_file(g, p)
    for _, tensor in pairs:  # lost while writing: say that this file is not to be trusted
        try:
            check_rpc_transfer(tensor.ptr)
        except BackendUnavailableError as exc:
            raise BackendUnavailableError(f"{fn}: {exc}; {os.fspath(path)!r} was written with zeros for the "
                                          "tensors of that server: do not use it") from None


def _metadata(g: GgufContext) -> dict:
    return {gguf_get_key(g, i): gguf_get_val(g, i) for i in range(gguf_get_n_kv(g))}


def _read_bytes(f: BufferedReader, offset: int, nbytes: int, name: str, path: str, fn: str) -> np.ndarray:
    try:
        buf = np.empty(nbytes, dtype=np.uint8)
    except MemoryError:
        raise GgmlValueError(f"{fn}: the {nbytes} bytes of tensor '{name}' of {path!r} do not fit in memory") from None
    f.seek(offset)
    if f.readinto(buf.data) != nbytes:
        raise GgufFileError(f"{fn}: {path!r} is truncated: the data of tensor '{name}' is incomplete")
    return buf


def ggml_load_weights_gguf(path: PathArg, tensors: Mapping[str, Tensor] | Sequence[Tensor]) -> dict:
    """Fill tensors with the data of the same-named tensors of a GGUF file; returns the file's metadata.

    Every tensor must exist in the file with the same type and shape (else an error naming it); the
    tensors' memory may be on any backend. Tensors of the file that are not asked for are ignored.

    Arguments:
        path: the GGUF file (a str or os.PathLike).
        tensors: a list of named Tensors, or a dict name -> Tensor, to fill (allocated, contiguous).

    Value: a dict of the file's metadata, key -> value (as ``gguf_get_val`` returns them). Raises
    GgufKeyError for a missing tensor, GgmlValueError for a type or shape mismatch, GgufFileError /
    GgufFileNotFoundError for a bad, truncated or missing file.

    Example:
        >>> meta = ggml_load_weights_gguf("mlp.gguf", {"w1": w1, "b1": b1})
    """
    fn = "ggml_load_weights_gguf"
    p = fs_path(path, fn)
    pairs = _named_tensors(tensors, fn)
    for _, tensor in pairs:
        check_has_data(tensor, fn)
    with gguf_init_from_file(p, no_alloc=True) as g:
        base = int(lib.gguf_get_data_offset(g.ptr))
        plan = []
        for name, tensor in pairs:
            i = gguf_find_tensor(g, name)
            if i < 0:
                have = [gguf_get_tensor_name(g, j) for j in range(gguf_get_n_tensors(g))]
                raise GgufKeyError(f"{fn}: tensor '{name}' is not in {p!r} (it has: {have})")
            ftype, fshape = gguf_get_tensor_type(g, i), gguf_get_tensor_shape(g, i)
            if ftype != tensor.type:
                raise GgmlValueError(f"{fn}: tensor '{name}' is {type_name(tensor.type)} but the file holds "
                                     f"{type_name(ftype)}")
            if fshape != tensor.shape:
                raise GgmlValueError(f"{fn}: tensor '{name}' has shape {list(tensor.shape)} but the file holds "
                                     f"{list(fshape)}")
            plan.append((name, tensor, base + int(lib.gguf_get_tensor_offset(g.ptr, i)), gguf_get_tensor_size(g, i)))
        size = os.path.getsize(p)
        for name, _, offset, nbytes in plan:
            if offset + nbytes > size:
                raise GgufFileError(f"{fn}: {p!r} is truncated: the data of tensor '{name}' is incomplete")
        with open(p, "rb") as f:
            for name, tensor, offset, nbytes in plan:
                write_array(tensor.ptr, _read_bytes(f, offset, nbytes, name, p, fn))
        return _metadata(g)


def _numpy_shape(shape: tuple[int, int, int, int]) -> tuple[int, ...]:
    dims = list(reversed(shape))
    while len(dims) > 1 and dims[0] == 1:
        dims.pop(0)
    return tuple(dims)


def _ggml_layout(flat: np.ndarray, shape: tuple[int, int, int, int]) -> np.ndarray:
    return flat.reshape(_numpy_shape(shape))


def gguf_read(path: PathArg, raw: bool = False, dequantize: bool = False) -> tuple[dict, dict]:
    """Read a whole GGUF file into numpy: ``(tensors, metadata)``.

    Tensors come back in ggml layout as numpy shape ``(ne3, ne2, ne1, ne0)`` with leading 1-axes dropped
    (a ``[784, 128]`` weight is a ``(128, 784)`` array); BF16 is widened to float32.

    Arguments:
        path: the GGUF file (a str or os.PathLike).
        raw: False (the default) converts each tensor to a typed array and raises GgmlTypeError for a
            type numpy cannot hold (quantized types); True returns every tensor's bytes as a 1-D uint8
            array instead.
        dequantize: True decodes quantized tensors (Q8_0, Q4_K, ...) to float32 with ggml's own decoders
            (default False: they raise, unless raw).

    Value: a tuple ``(tensors, metadata)``: dicts name -> numpy array and key -> value.

    Example:
        >>> tensors, meta = gguf_read("mlp.gguf")
        >>> tensors["w1"].shape
        (128, 784)
    """
    fn = "gguf_read"
    expect(isinstance(raw, bool), f"{fn}: raw must be a bool, got {raw!r}", GgmlTypeError)
    expect(isinstance(dequantize, bool), f"{fn}: dequantize must be a bool, got {dequantize!r}", GgmlTypeError)
    return read_gguf(path, fn, "raw" if raw else "decode" if dequantize else "raise")


def read_gguf(path: PathArg, fn: str, quantized: str) -> tuple[dict, dict]:
    """``gguf_read``, with quantized tensors (and only those, for ``quantized="keep"``) as ``quantized`` says:
    "raw" (every tensor's bytes), "decode" (float32), "keep" (``QuantizedArray``: type, bytes, shape), "raise"."""
    p = fs_path(path, fn)
    raw, dequantize = quantized == "raw", quantized == "decode"
    with gguf_init_from_file(p, no_alloc=True) as g:
        # the declared sizes must lie inside the file before anything is allocated for them
        check_data_in_file(g.ptr, os.path.getsize(p), p, fn)
        total = sum(gguf_get_tensor_size(g, i) for i in range(gguf_get_n_tensors(g)))
        check_fits_memory(fn, f"the tensors of {p!r}", 2 * total if not raw else total,
                          "read the tensors you need with ggml_load_weights_gguf instead")
        base = int(lib.gguf_get_data_offset(g.ptr))
        out: dict[str, np.ndarray | QuantizedArray] = {}
        with open(p, "rb") as f:
            for i in range(gguf_get_n_tensors(g)):
                name, t, shape = gguf_get_tensor_name(g, i), gguf_get_tensor_type(g, i), gguf_get_tensor_shape(g, i)
                buf = _read_bytes(f, base + int(lib.gguf_get_tensor_offset(g.ptr, i)), gguf_get_tensor_size(g, i),
                                  name, p, fn)
                if raw:
                    out[name] = buf
                elif t in NUMPY_DTYPES:
                    out[name] = _ggml_layout(buf.view(NUMPY_DTYPES[t]), shape)
                elif t == lib.GGML_TYPE_BF16:
                    out[name] = _ggml_layout((buf.view(np.uint16).astype(np.uint32) << 16).view(np.float32), shape)
                elif dequantize and lib.ggml_is_quantized(t):
                    n = int(np.prod(shape, dtype=np.int64))
                    out[name] = _ggml_layout(dequantize_bytes(t, bytes(buf), n), shape)
                elif quantized == "keep" and lib.ggml_is_quantized(t):
                    out[name] = QuantizedArray(t, bytes(buf), _numpy_shape(shape))
                else:
                    raise GgmlTypeError(f"{fn}: tensor '{name}' is {type_name(t)}, which numpy cannot hold; "
                                        "use gguf_read(path, raw=True) for its bytes")
        return out, _metadata(g)
