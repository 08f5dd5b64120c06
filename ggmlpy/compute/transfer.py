"""Async tensor transfers and copies between backends (``ggml_backend_tensor_set_async``...), which keep what
they read in use until the backend is synchronized.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .._ffi import CData, ffi, lib
from ..backend.backend import Backend, finish_backend, hold_until_sync, is_async
from ..backend.device import decode_str
from ..backend.probe import buffer_usable
from ..backend.transfer import as_numeric, checked_values, numpy_dtype, shape_problem
from ..core.args import int_arg
from ..core.handle import computing, Lifetime, raise_type, unwrap, using
from ..errors import GgmlStateError, GgmlValueError
from ..graph.nodes import tensor_label, tensor_memory
from ..graph.objects import as_tensor, Tensor
from .sched import Scheduler


def pending_message(fn: str, owner: Backend | Scheduler) -> str:
    if isinstance(owner, Scheduler):
        return f"{fn} (work still queued on the scheduler: call ggml_backend_sched_synchronize(sched) first)"
    return f"{fn} (work still queued on {owner.device.name}: call ggml_backend_synchronize(backend) first)"


# ---------------------------------------------------------------- argument checks

def backend_arg(backend: object, fn: str, name: str = "backend") -> CData:
    return unwrap(backend, Backend, f"{fn}({name})")


def _tensor_on(backend: Backend | None, tensor: object, fn: str, name: str = "tensor") -> tuple[Tensor, CData]:
    """(Tensor, pointer) of a tensor with memory in a backend buffer ``backend`` can use."""
    if not isinstance(tensor, Tensor):
        raise_type(f"{fn}({name})", "Tensor", tensor)
    t = as_tensor(tensor, f"{fn}({name})")
    p = t.ptr
    label = tensor_label(p)
    where = tensor_memory(p, f"{fn}: {label}")
    root = p.view_src if p.view_src != ffi.NULL else p
    if where != "backend":
        raise GgmlStateError(f"{fn}: {label} lives in context memory (a context made with no_alloc=False), not in a "
                             "backend buffer; these transfers work on tensors allocated with "
                             "ggml_backend_alloc_ctx_tensors (or by a scheduler or graph allocator). Use "
                             "ggml_backend_tensor_set_data / ggml_backend_tensor_get_data for this one")
    if p.buffer == ffi.NULL:
        raise GgmlStateError(f"{fn}: {label} is a view that ggml has not placed in its buffer yet; pass the tensor it "
                             f"views ({tensor_label(root)}) with a byte offset instead")
    if backend is not None and not buffer_usable(backend, root.buffer):
        buf = decode_str(lib.ggml_backend_buffer_name(root.buffer))
        raise GgmlStateError(f"{fn}: {label} lives in a {buf} buffer, which backend {backend.name} does not own; pass "
                             f"the backend the tensor was allocated on (a {buf} backend), or allocate the tensor on "
                             f"{backend.name} with ggml_backend_alloc_ctx_tensors")
    return t, p


def _held_handles(t: Tensor, p: CData) -> list[Lifetime]:
    """The handles that keep a tensor's header and memory: its keepers and the Buffer holding its memory."""
    root = p.view_src if p.view_src != ffi.NULL else p
    hs = list(t.keepers)
    for h in list(hs):
        for b in getattr(h, "buffers", ()):
            if b.alive and b.ptr == root.buffer:
                hs.append(b)
    return hs


def _byte_arg(fn: str, name: str, value: object, itemsize: int, dtype: np.dtype) -> int:
    v = int_arg(fn, name, value, 0)
    if v % itemsize:
        raise GgmlValueError(f"{fn}: {name} is in bytes and must be a multiple of the element size ({itemsize} bytes "
                             f"for {dtype}), got {v}; for element k pass {name}=k * {itemsize}")
    return v


def _contiguous(p: CData, fn: str) -> None:
    if not lib.ggml_is_contiguous(p):
        raise GgmlValueError(f"{fn}: {tensor_label(p)} is a strided view; byte ranges of it are not its elements. "
                             "Transfer the tensor it views, or make it contiguous with ggml_cont in a graph")


def _byte_range(fn: str, p: CData, dtype: np.dtype, offset: object, size: object) -> tuple[int, int]:
    nbytes = int(lib.ggml_nbytes(p))
    off = _byte_arg(fn, "offset", offset, dtype.itemsize, dtype)
    n = nbytes - off if size is None else _byte_arg(fn, "size", size, dtype.itemsize, dtype)
    if off + n > nbytes or n < 0:
        raise GgmlValueError(f"{fn}: {tensor_label(p)} holds {nbytes} bytes; cannot read "
                             f"{n if size is not None else '-'} bytes from byte offset {off} "
                             f"(offset + size <= {nbytes})")
    return off, n


# ---------------------------------------------------------------- async transfers

def ggml_backend_tensor_set_async(backend: Backend, tensor: Tensor, data: npt.ArrayLike, offset: int | None = None,
                                  size: int | None = None) -> None:
    """Queue a write of ``data`` into a tensor on its backend, without waiting for it.

    ``data`` is converted and checked exactly as by ``ggml_backend_tensor_set_data`` (the tensor's numpy
    shape or a flat array of ``nelements`` values; a partial write when ``offset`` is given), then copied
    (later changes to ``data`` do not matter). On a device without async support (CPU, BLAS, RPC) the
    write happens at once. Until ``ggml_backend_synchronize(backend)`` the tensor's context and buffer
    cannot be freed (GgmlInUseError).

    Arguments:
        backend: the Backend whose memory holds the tensor (a tensor in another backend's buffer raises
            GgmlStateError).
        tensor: a contiguous tensor of type F32, F16, F64, I8, I16, I32 or I64 allocated in a backend
            buffer.
        data: any numeric array-like.
        offset: where to start writing, in bytes (as in ggmlR), a multiple of the element size. None (the
            default): a whole-tensor write from byte 0; given (0 included): a partial write, as
            ``ggml_backend_tensor_set_data`` with ``offset = offset // element size``.
        size: the number of bytes to write, as in ggmlR; None (the default) takes the data's size after
            conversion to the tensor's type. When given it must equal that size (GgmlValueError otherwise).

    Value: None.

    Example:
        >>> ggml_backend_tensor_set_async(gpu, x, np.ones((2, 3), np.float32))
        >>> ggml_backend_synchronize(gpu)
    """
    fn = "ggml_backend_tensor_set_async"
    b = backend_arg(backend, fn)
    t, p = _tensor_on(backend, tensor, fn)
    dtype = numpy_dtype(t)
    _contiguous(p, fn)
    elem_offset = None
    if offset is not None:
        elem_offset = _byte_arg(fn, "offset", offset, dtype.itemsize, dtype) // dtype.itemsize
    what = f"{fn}: {tensor_label(p)}"
    arr = as_numeric(data, f"{what} (data)")
    problem = shape_problem(arr.shape, t, elem_offset)
    if problem is not None:
        short = offset is None and arr.size < t.nelements()
        hint = "; for a partial write pass offset= (in bytes) explicitly" if short else ""
        raise GgmlValueError(f"{what}: {problem}{hint}")
    flat = checked_values(arr, dtype, what)
    if size is not None:
        n = int_arg(fn, "size", size, 0)
        if n != flat.nbytes:
            raise GgmlValueError(f"{fn}: size must be the byte count of the data in the tensor's type: {flat.nbytes} "
                                 f"({flat.size} values of {dtype.itemsize} bytes, {dtype}), got {n}; leave size out "
                                 "(None) to take it from the data")
    queued = is_async(backend)
    if queued and np.shares_memory(flat, arr):
        flat = flat.copy()  # the device reads it later: a change the caller makes meanwhile must not reach it
    start = (elem_offset or 0) * dtype.itemsize
    with using([backend, *t.keepers], fn):
        with computing([backend]):  # a backend's queue is not safe for two threads at once
            lib.ggml_backend_tensor_set_async(b, p, ffi.from_buffer(flat), start, flat.nbytes)
        if queued:
            hold_until_sync(backend, pending_message(fn, backend), _held_handles(t, p), (flat,))


def ggml_backend_tensor_get_async(backend: Backend, tensor: Tensor, offset: int = 0,
                                  size: int | None = None) -> np.ndarray:
    """Queue a read of a tensor's bytes into a new numpy array, without waiting for it.

    The array is filled once ``ggml_backend_synchronize(backend)`` returns (at once on a device
    without async support: CPU, BLAS, RPC); the backend keeps it alive until then. Until that
    synchronize the tensor's context and buffer cannot be freed (GgmlInUseError).

    Arguments:
        backend: the Backend whose memory holds the tensor (a tensor in another backend's buffer raises
            GgmlStateError).
        tensor: a contiguous tensor of type F32, F16, F64, I8, I16, I32 or I64 allocated in a backend
            buffer.
        offset: the first byte to read (default 0), a multiple of the element size.
        size: the number of bytes to read (ggmlR requires it); None (the default) reads to the end of the
            tensor. A multiple of the element size; ``offset + size`` may not exceed ``ggml_nbytes``.

    Value: a 1-D numpy array of the tensor's dtype with ``size / element size`` elements, in ggml order,
    valid after ``ggml_backend_synchronize(backend)``.

    Example:
        >>> y = ggml_backend_tensor_get_async(gpu, out)
        >>> ggml_backend_synchronize(gpu)
        >>> y[:3]
    """
    return _get_async("ggml_backend_tensor_get_async", backend, tensor, offset, size)


def _get_async(fn: str, backend: Backend, tensor: Tensor, offset: object, size: object) -> np.ndarray:
    b = backend_arg(backend, fn)
    t, p = _tensor_on(backend, tensor, fn)
    dtype = numpy_dtype(t)
    _contiguous(p, fn)
    off, n = _byte_range(fn, p, dtype, offset, size)
    out = np.empty(n // dtype.itemsize, dtype=dtype)
    with using([backend, *t.keepers], fn):
        with computing([backend]):
            lib.ggml_backend_tensor_get_async(b, p, ffi.from_buffer(out), off, n)
        if is_async(backend):
            hold_until_sync(backend, pending_message(fn, backend), _held_handles(t, p), (out,))
    return out


def ggml_backend_tensor_get_and_sync(backend: Backend | None, tensor: Tensor, offset: int = 0,
                                     size: int | None = None) -> bytes:
    """Read a tensor's raw bytes from a backend and wait for them (``get_async`` plus ``synchronize``).

    Arguments:
        backend: the Backend whose memory holds the tensor, or None for a plain synchronous read (which also
            works for tensors in context memory).
        tensor: a contiguous tensor with memory (of any type with whole-byte elements numpy can hold: F32,
            F16, F64, I8, I16, I32, I64).
        offset: the first byte to read (default 0), a multiple of the element size.
        size: the number of bytes (ggmlR requires it); None (the default) reads to the end.

    Value: a bytes object (ggmlR's raw vector); ``np.frombuffer(b, np.float32)`` gives the values of an F32
    tensor.

    Example:
        >>> raw = ggml_backend_tensor_get_and_sync(cpu, x)
        >>> np.frombuffer(raw, np.float32)
    """
    fn = "ggml_backend_tensor_get_and_sync"
    if backend is not None:
        out = _get_async(fn, backend, tensor, offset, size)
        finish_backend(backend)
        return out.tobytes()
    t = as_tensor(tensor, f"{fn}(tensor)")
    p = t.ptr
    dtype = numpy_dtype(t)
    where = tensor_memory(p, f"{fn}: {tensor_label(p)}")
    _contiguous(p, fn)
    off, n = _byte_range(fn, p, dtype, offset, size)
    out = np.empty(n, dtype=np.uint8)
    with using(t.keepers, fn):
        if n and where == "backend":
            lib.ggml_backend_tensor_get(p, ffi.from_buffer(out), off, n)
        elif n:
            ffi.memmove(ffi.from_buffer(out), ffi.cast("char *", p.data) + off, n)
    return out.tobytes()


def _same_layout(fn: str, src: CData, dst: CData) -> None:
    same = src.type == dst.type and all(src.ne[i] == dst.ne[i] and src.nb[i] == dst.nb[i] for i in range(4))
    if not same:
        def desc(p: CData) -> str:
            return f"{tensor_label(p)} ne {[int(p.ne[i]) for i in range(4)]} nb {[int(p.nb[i]) for i in range(4)]}"
        raise GgmlValueError(f"{fn}: src and dst must have the same type, shape and strides; got src {desc(src)}, "
                             f"dst {desc(dst)}. Copy through numpy (ggml_backend_tensor_get_data, then "
                             "ggml_backend_tensor_set_data) or with ggml_cpy in a graph to convert")


def ggml_backend_tensor_copy_async(backend_src: Backend, backend_dst: Backend, src: Tensor, dst: Tensor) -> None:
    """Queue a copy of one tensor into another, possibly on another device, without waiting for it.

    ggml copies on the device when it can (two tensors of one Vulkan device) and otherwise synchronizes
    both backends and copies at once. Until ``ggml_backend_synchronize(backend_dst)`` both tensors'
    contexts and buffers cannot be freed (GgmlInUseError).

    Arguments:
        backend_src: the Backend whose memory holds ``src``.
        backend_dst: the Backend whose memory holds ``dst``.
        src: a tensor allocated in a backend buffer.
        dst: a tensor allocated in a backend buffer, with the same type, shape and strides as ``src``
            (else GgmlValueError).

    Value: None.

    Example:
        >>> ggml_backend_tensor_copy_async(cpu, gpu, x_cpu, x_gpu)
        >>> ggml_backend_synchronize(gpu)
    """
    fn = "ggml_backend_tensor_copy_async"
    bs = backend_arg(backend_src, fn, "backend_src")
    bd = backend_arg(backend_dst, fn, "backend_dst")
    ts, ps = _tensor_on(backend_src, src, fn, "src")
    td, pd = _tensor_on(backend_dst, dst, fn, "dst")
    _same_layout(fn, ps, pd)
    with using([backend_src, backend_dst, *ts.keepers, *td.keepers], fn):
        with computing([backend_src, backend_dst]):
            lib.ggml_backend_tensor_copy_async(bs, bd, ps, pd)
        if is_async(backend_dst) or is_async(backend_src):
            hold_until_sync(backend_dst, pending_message(fn, backend_dst),
                            [*_held_handles(ts, ps), *_held_handles(td, pd)])


def ggml_backend_tensor_copy(src: Tensor, dst: Tensor) -> None:
    """Copy one tensor into another, across devices if need be, and wait for it.

    Arguments:
        src: a tensor allocated in a backend buffer (any backend).
        dst: a tensor allocated in a backend buffer (any backend) with the same type, shape and strides as
            ``src`` (else GgmlValueError).

    Value: None.

    Example:
        >>> ggml_backend_tensor_copy(w_cpu, w_gpu)          # upload weights kept on the CPU
    """
    fn = "ggml_backend_tensor_copy"
    ts, ps = _tensor_on(None, src, fn, "src")
    td, pd = _tensor_on(None, dst, fn, "dst")
    _same_layout(fn, ps, pd)
    with using([*ts.keepers, *td.keepers], fn):
        lib.ggml_backend_tensor_copy(ps, pd)
