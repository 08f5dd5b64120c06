"""Asynchronous backend work: events, async tensor reads and writes, async compute and graph plans.

An asynchronous call only queues work on a device that can run it asynchronously (its
``ggml_backend_dev_get_props(...)["caps"]["async"]``: Vulkan, CUDA); on the others (CPU, BLAS, RPC) ggml does
the work at once. Until the backend (or, for a scheduler, the scheduler) is synchronized, the queued work
still points at Python memory and at tensors, so ggmlpy keeps them: the backend holds the numpy arrays an
async read fills or an async write reads, and the tensors' contexts and buffers are marked in use, so freeing
them raises GgmlInUseError instead of pulling memory out from under the device. ``ggml_backend_synchronize``
(``ggml_backend_sched_synchronize`` for a scheduler) ends that; freeing the backend synchronizes it first.
"""
from __future__ import annotations

import functools
import weakref
from typing import Any

import numpy as np

from ._ffi import ffi, lib
from ._checks import _tensor_label, backend_runs, buffer_usable, check_graph_ready, int_arg, tensor_memory
from ._handle import Handle, _LOCK, _unique, computing, free_handle, raise_type, unwrap, using
from .backend import Backend, Device, _as_device, _str
from .backend_registry import device_caps
from .context import Graph, Tensor, as_tensor
from .data import as_numeric, checked_values, numpy_dtype, shape_problem
from .errors import GgmlStateError, GgmlTypeError, GgmlValueError
from .sched import (Scheduler, _check_indices, _exclusive, _graph_ptr, _record, _reserve_first, _sched, _unallocated,
                    check_status, reapply_tensor_backends)


# ---------------------------------------------------------------- pending work

def _is_async(backend: Backend) -> bool:
    """Whether ``backend``'s device may leave work queued after an async call returns."""
    cached = backend.__dict__.get("_caps_async")
    if cached is None:
        cached = backend.__dict__["_caps_async"] = device_caps(backend.device)["async"]
    return cached


def _hold(owner: Handle, what: str, handles: Any, keep: tuple = ()) -> None:
    """Record work queued on ``owner`` (a Backend or Scheduler) until it is synchronized: ``handles`` are marked
    in use by ``what`` (freeing them raises GgmlInUseError) and ``keep`` (numpy arrays, graphs) stays referenced."""
    hs = _unique(handles)
    with _LOCK:
        for h in hs:
            h._users.append(what)
        pending = owner.__dict__.get("_async_pending")
        if pending is None:
            # one list per owner for its lifetime; an owner collected without a synchronize unmarks them too
            pending = owner.__dict__["_async_pending"] = []
            weakref.finalize(owner, _unmark, pending)
        pending.append((what, hs, keep))


def _unmark(pending: list) -> None:
    with _LOCK:
        for what, hs, _keep in pending:
            for h in hs:
                try:
                    h._users.remove(what)
                except ValueError:
                    pass
        pending.clear()


def _release(owner: Handle) -> None:
    pending = owner.__dict__.get("_async_pending")
    if pending:
        _unmark(pending)


def finish_backend(backend: Backend) -> None:
    """Synchronize ``backend`` (waiting for its other computations in this process first), then let go of what its
    async calls held, and finish the events recorded on it (ggml's Vulkan event keeps a pointer into the
    backend's command pool until it is synchronized)."""
    ptr = backend.ptr
    with computing([backend]):
        lib.ggml_backend_synchronize(ptr)
        for ev in list(backend.__dict__.get("_recorded_events", ())):
            if ev._ptr is not None and ev._state["recorded_on"] is backend:
                lib.ggml_backend_event_synchronize(ev._ptr)
                ev._state["recorded_on"] = None
    _release(backend)


def _pending(fn: str, owner: Handle) -> str:
    if isinstance(owner, Scheduler):
        return f"{fn} (work still queued on the scheduler: call ggml_backend_sched_synchronize(sched) first)"
    return f"{fn} (work still queued on {owner.device.name}: call ggml_backend_synchronize(backend) first)"


# ---------------------------------------------------------------- argument checks

def _backend(backend: Any, fn: str, name: str = "backend") -> Any:
    return unwrap(backend, Backend, f"{fn}({name})")


def _tensor_on(backend: Backend, tensor: Any, fn: str, name: str = "tensor") -> tuple[Tensor, Any]:
    """(Tensor, pointer) of a tensor with memory in a backend buffer ``backend`` can use."""
    if not isinstance(tensor, Tensor):
        raise_type(f"{fn}({name})", "Tensor", tensor)
    t = as_tensor(tensor, f"{fn}({name})")
    p = t.ptr
    label = _tensor_label(p)
    where = tensor_memory(p, f"{fn}: {label}")
    root = p.view_src if p.view_src != ffi.NULL else p
    if where != "backend":
        raise GgmlStateError(f"{fn}: {label} lives in context memory (a context made with no_alloc=False), not in a "
                             "backend buffer; these transfers work on tensors allocated with "
                             "ggml_backend_alloc_ctx_tensors (or by a scheduler or graph allocator). Use "
                             "ggml_backend_tensor_set_data / ggml_backend_tensor_get_data for this one")
    if p.buffer == ffi.NULL:
        raise GgmlStateError(f"{fn}: {label} is a view that ggml has not placed in its buffer yet; pass the tensor it "
                             f"views ({_tensor_label(root)}) with a byte offset instead")
    if backend is not None and not buffer_usable(backend, root.buffer):
        buf = _str(lib.ggml_backend_buffer_name(root.buffer))
        raise GgmlStateError(f"{fn}: {label} lives in a {buf} buffer, which backend {backend.name} does not own; pass "
                             f"the backend the tensor was allocated on (a {buf} backend), or allocate the tensor on "
                             f"{backend.name} with ggml_backend_alloc_ctx_tensors")
    return t, p


def _held_handles(t: Tensor, p: Any) -> list:
    """The handles that keep a tensor's header and memory: its keepers and the Buffer holding its memory."""
    root = p.view_src if p.view_src != ffi.NULL else p
    hs = list(t.keepers)
    for h in list(hs):
        for b in getattr(h, "_buffers", ()):
            if b._ptr is not None and b._ptr == root.buffer:
                hs.append(b)
    return hs


def _byte_arg(fn: str, name: str, value: Any, itemsize: int, dtype: Any) -> int:
    v = int_arg(fn, name, value, 0)
    if v % itemsize:
        raise GgmlValueError(f"{fn}: {name} is in bytes and must be a multiple of the element size ({itemsize} bytes "
                             f"for {dtype}), got {v}; for element k pass {name}=k * {itemsize}")
    return v


def _contiguous(p: Any, fn: str) -> None:
    if not lib.ggml_is_contiguous(p):
        raise GgmlValueError(f"{fn}: {_tensor_label(p)} is a strided view; byte ranges of it are not its elements. "
                             "Transfer the tensor it views, or make it contiguous with ggml_cont in a graph")


def _byte_range(fn: str, p: Any, dtype: Any, offset: Any, size: Any) -> tuple[int, int]:
    nbytes = int(lib.ggml_nbytes(p))
    off = _byte_arg(fn, "offset", offset, dtype.itemsize, dtype)
    n = nbytes - off if size is None else _byte_arg(fn, "size", size, dtype.itemsize, dtype)
    if off + n > nbytes or n < 0:
        raise GgmlValueError(f"{fn}: {_tensor_label(p)} holds {nbytes} bytes; cannot read {n if size is not None else '-'} "
                             f"bytes from byte offset {off} (offset + size <= {nbytes})")
    return off, n


# ---------------------------------------------------------------- async transfers

def ggml_backend_tensor_set_async(backend: Backend, tensor: Tensor, data: Any, offset: int | None = None,
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
    b = _backend(backend, fn)
    t, p = _tensor_on(backend, tensor, fn)
    dtype = numpy_dtype(t)
    _contiguous(p, fn)
    elem_offset = None
    if offset is not None:
        elem_offset = _byte_arg(fn, "offset", offset, dtype.itemsize, dtype) // dtype.itemsize
    what = f"{fn}: {_tensor_label(p)}"
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
    queued = _is_async(backend)
    if queued and np.shares_memory(flat, arr):
        flat = flat.copy()  # the device reads it later: a change the caller makes meanwhile must not reach it
    start = (elem_offset or 0) * dtype.itemsize
    with using([backend, *t.keepers], fn):
        with computing([backend]):  # a backend's queue is not safe for two threads at once
            lib.ggml_backend_tensor_set_async(b, p, ffi.from_buffer(flat), start, flat.nbytes)
        if queued:
            _hold(backend, _pending(fn, backend), _held_handles(t, p), (flat,))


def ggml_backend_tensor_get_async(backend: Backend, tensor: Tensor, offset: int = 0, size: int | None = None) -> np.ndarray:
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


def _get_async(fn: str, backend: Backend, tensor: Tensor, offset: Any, size: Any) -> np.ndarray:
    b = _backend(backend, fn)
    t, p = _tensor_on(backend, tensor, fn)
    dtype = numpy_dtype(t)
    _contiguous(p, fn)
    off, n = _byte_range(fn, p, dtype, offset, size)
    out = np.empty(n // dtype.itemsize, dtype=dtype)
    with using([backend, *t.keepers], fn):
        with computing([backend]):
            lib.ggml_backend_tensor_get_async(b, p, ffi.from_buffer(out), off, n)
        if _is_async(backend):
            _hold(backend, _pending(fn, backend), _held_handles(t, p), (out,))
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
    where = tensor_memory(p, f"{fn}: {_tensor_label(p)}")
    _contiguous(p, fn)
    off, n = _byte_range(fn, p, dtype, offset, size)
    out = np.empty(n, dtype=np.uint8)
    with using(t.keepers, fn):
        if n and where == "backend":
            lib.ggml_backend_tensor_get(p, ffi.from_buffer(out), off, n)
        elif n:
            ffi.memmove(ffi.from_buffer(out), ffi.cast("char *", p.data) + off, n)
    return out.tobytes()


def _same_layout(fn: str, src: Any, dst: Any) -> None:
    same = src.type == dst.type and all(src.ne[i] == dst.ne[i] and src.nb[i] == dst.nb[i] for i in range(4))
    if not same:
        def desc(p: Any) -> str:
            return f"{_tensor_label(p)} ne {[int(p.ne[i]) for i in range(4)]} nb {[int(p.nb[i]) for i in range(4)]}"
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
    bs = _backend(backend_src, fn, "backend_src")
    bd = _backend(backend_dst, fn, "backend_dst")
    ts, ps = _tensor_on(backend_src, src, fn, "src")
    td, pd = _tensor_on(backend_dst, dst, fn, "dst")
    _same_layout(fn, ps, pd)
    with using([backend_src, backend_dst, *ts.keepers, *td.keepers], fn):
        with computing([backend_src, backend_dst]):
            lib.ggml_backend_tensor_copy_async(bs, bd, ps, pd)
        if _is_async(backend_dst) or _is_async(backend_src):
            _hold(backend_dst, _pending(fn, backend_dst), [*_held_handles(ts, ps), *_held_handles(td, pd)])


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


# ---------------------------------------------------------------- async compute

def ggml_backend_graph_compute_async(backend: Backend, graph: Graph) -> int:
    """Start computing a graph on one backend without waiting for the result.

    Everything ``ggml_backend_graph_compute`` checks is checked first (memory on this backend, ops it
    implements, row indices). On a device without async support (CPU, BLAS, RPC) the graph is computed
    before the call returns; otherwise read the results after ``ggml_backend_synchronize(backend)``, and
    until then the graph's contexts and buffers cannot be freed (GgmlInUseError).

    Arguments:
        backend: the Backend to compute on.
        graph: a Graph whose tensors all have memory on that backend.

    Value: the status, an int: 0 (``GGML_STATUS_SUCCESS``), as in ggmlR; a failed computation raises
    GgmlStateError instead of returning another code.

    Example:
        >>> ggml_backend_graph_compute_async(cpu, gf)
        0
        >>> ggml_backend_synchronize(cpu)
    """
    fn = "ggml_backend_graph_compute_async"
    b = _backend(backend, fn)
    g = _graph_ptr(graph, fn)
    check_graph_ready(graph, [backend], fn, "backend")
    with using([backend, *graph.keepers], fn):
        _check_indices(g)
        with computing([backend]):
            status = lib.ggml_backend_graph_compute_async(b, g)
        if _is_async(backend):
            _hold(backend, _pending(fn, backend), graph.keepers, (graph,))
    check_status(status, fn)
    return int(status)


def ggml_backend_sched_graph_compute_async(sched: Scheduler, graph: Graph) -> int:
    """Start running a graph on a scheduler's backends without waiting for the result.

    Like ``ggml_backend_sched_graph_compute`` (the graph is allocated first when it is not the one
    allocated; inputs and row indices are checked), but the last steps may still run on a GPU when it
    returns: read the results after ``ggml_backend_sched_synchronize(sched)``. Until then the scheduler
    cannot be reset, reallocated or freed, nor the graph's contexts and buffers (GgmlInUseError);
    another async compute on it synchronizes the previous one first.

    Arguments:
        sched: a Scheduler.
        graph: a Graph whose node count fits the scheduler's ``graph_size``.

    Value: the status, an int: 0 (``GGML_STATUS_SUCCESS``), as in ggmlR; a failed computation raises
    GgmlStateError.

    Example:
        >>> ggml_backend_sched_graph_compute_async(sched, gf)
        0
        >>> ggml_backend_sched_synchronize(sched)
        >>> y = ggml_backend_tensor_get_data(out)
    """
    fn = "ggml_backend_sched_graph_compute_async"
    s = _sched(sched, fn)
    g = _graph_ptr(graph, fn, sched)
    if sched.__dict__.get("_async_pending"):
        ggml_backend_sched_synchronize(sched)
    addr = int(ffi.cast("uintptr_t", g))
    allocated = sched._allocated == addr
    check_graph_ready(graph, sched.backends, fn, "allocated" if allocated else "sched")
    with _exclusive(sched, graph.keepers, fn):
        if not allocated:
            # allocate here (as ggml_backend_sched_alloc_graph does), after the backends chosen with
            # ggml_backend_sched_set_tensor_backend are given back to ggml: its compute would reset them away
            sched.release()
            lib.ggml_backend_sched_reset(s)
            check_graph_ready(graph, sched.backends, fn, "sched")
            reapply_tensor_backends(sched)
            _reserve_first(sched, s, g, fn)  # a failed allocation inside ggml would crash: reserve first
            placed = _unallocated(g)
            ok = bool(lib.ggml_backend_sched_alloc_graph(s, g))
            _record(sched, graph, placed)
            if not ok:
                raise GgmlStateError(f"{fn}: the scheduler could not allocate the graph (out of memory on a backend?)")
            sched._allocated = addr
        _check_indices(g)
        with computing(sched.backends):
            status = lib.ggml_backend_sched_graph_compute_async(s, g)
        if any(_is_async(b) for b in sched.backends):
            _hold(sched, _pending(fn, sched), [sched, *graph.keepers], (graph,))
    sched._allocated = addr if status == lib.GGML_STATUS_SUCCESS else None
    check_status(status, fn)
    return int(status)


def ggml_backend_sched_synchronize(sched: Scheduler) -> None:
    """Wait until everything queued on a scheduler's backends has finished.

    Ends what ``ggml_backend_sched_graph_compute_async`` started: its results are readable afterwards, and
    the scheduler and the graph's contexts and buffers can be freed again.

    Arguments:
        sched: a Scheduler.

    Value: None.

    Example:
        >>> ggml_backend_sched_synchronize(sched)
    """
    s = _sched(sched, "ggml_backend_sched_synchronize")
    with computing(sched.backends):
        lib.ggml_backend_sched_synchronize(s)
    _release(sched)
    for b in sched.backends:  # they are synchronized too: what their own async calls held can go
        if b.alive:
            _release(b)


def ggml_backend_sched_get_n_copies(sched: Scheduler) -> int:
    """The number of copies of the graph inputs a scheduler keeps (more than 1 when ``parallel=True``
    lets it pipeline work across backends).

    Arguments:
        sched: a Scheduler.

    Value: an int.

    Example:
        >>> ggml_backend_sched_get_n_copies(ggml_backend_sched_new("cpu", parallel=False))
        1
    """
    return int(lib.ggml_backend_sched_get_n_copies(_sched(sched, "ggml_backend_sched_get_n_copies")))


def _sched_backend(sched: Scheduler, backend: Any, fn: str) -> int:
    unwrap(backend, Backend, f"{fn}(backend)")
    for i, b in enumerate(sched.backends):
        if b.alive and b.ptr == backend.ptr:
            return i
    raise GgmlValueError(f"{fn}: backend {backend.name} is not one of the scheduler's backends "
                         f"{[b.name for b in sched.backends if b.alive]}; pass ggml_backend_sched_get_backend(sched, i)")


def ggml_backend_sched_set_tensor_backend(sched: Scheduler, tensor: Tensor, backend: Backend) -> None:
    """Make a scheduler run one op (or keep one tensor) on a given backend, instead of choosing itself.

    The scheduler's current allocation is forgotten (as by ``ggml_backend_sched_reset``): the choice
    applies from its next allocation of a graph holding the tensor, and ggmlpy keeps it for the later
    ones too (while the tensor lives). It is honoured by ``ggml_backend_sched_graph_compute_async``; the
    synchronous ``ggml_backend_sched_alloc_graph`` and ``ggml_backend_sched_graph_compute`` reset the
    scheduler before allocating, which drops it.

    Arguments:
        sched: a Scheduler.
        tensor: a Tensor (an op's result or an input).
        backend: one of the scheduler's Backends (else GgmlValueError). It must implement the op for the
            tensor's types and, when the tensor already has memory, be able to use that memory (else
            GgmlTypeError / GgmlStateError: ggml would abort while computing).

    Value: None.

    Example:
        >>> ggml_backend_sched_set_tensor_backend(sched, h, ggml_backend_sched_get_backend(sched, 1))
    """
    fn = "ggml_backend_sched_set_tensor_backend"
    s = _sched(sched, fn)
    if not isinstance(tensor, Tensor):
        raise_type(f"{fn}(tensor)", "Tensor", tensor)
    t = as_tensor(tensor, f"{fn}(tensor)")
    p = t.ptr
    i = _sched_backend(sched, backend, fn)
    b = sched.backends[i]
    if p.op != lib.GGML_OP_NONE:
        ok, why = backend_runs(b, p)
        if not ok:
            raise GgmlTypeError(f"{fn}: {b.name} cannot compute {_tensor_label(p)}: {why}; ggml would abort while "
                                "computing. Pick another of the scheduler's backends")
    with _exclusive(sched, t.keepers, fn):
        # ggml takes a choice between a reset and the next allocation: forget the current allocation (its
        # tensors lose their memory, the next compute allocates again) and reset, as ggml_backend_sched_reset
        sched.release()
        lib.ggml_backend_sched_reset(s)
        reapply_tensor_backends(sched)
        root = p.view_src if p.view_src != ffi.NULL else p
        if root.buffer != ffi.NULL and root.data != ffi.NULL and not buffer_usable(b, root.buffer):
            buf = _str(lib.ggml_backend_buffer_name(root.buffer))
            raise GgmlStateError(f"{fn}: {_tensor_label(p)} lives in a {buf} buffer, which {b.name} cannot compute "
                                 "on; pick the backend that owns its memory")
        lib.ggml_backend_sched_set_tensor_backend(s, p, b.ptr)
        kept = [(x, y) for x, y in sched.__dict__.get("_tensor_backends", []) if x.alive and x != t]
        kept.append((t, b))
        sched.__dict__["_tensor_backends"] = kept


def ggml_backend_sched_get_tensor_backend(sched: Scheduler, tensor: Tensor) -> Backend | None:
    """The backend a scheduler assigned a tensor to (by its last graph allocation, or by
    ``ggml_backend_sched_set_tensor_backend``).

    Arguments:
        sched: a Scheduler.
        tensor: a Tensor.

    Value: one of the scheduler's Backends, or None when the tensor has no assignment (it is not part of the
    allocated graph, or the scheduler was reset since).

    Example:
        >>> ggml_backend_sched_alloc_graph(sched, gf)
        >>> ggml_backend_name(ggml_backend_sched_get_tensor_backend(sched, out))
    """
    fn = "ggml_backend_sched_get_tensor_backend"
    s = _sched(sched, fn)
    if not isinstance(tensor, Tensor):
        raise_type(f"{fn}(tensor)", "Tensor", tensor)
    t = as_tensor(tensor, f"{fn}(tensor)")
    with using([sched, *t.keepers], fn):
        ptr = lib.ggml_backend_sched_get_tensor_backend(s, t.ptr)
    if ptr == ffi.NULL:
        return None
    return next((b for b in sched.backends if b.alive and b.ptr == ptr), None)


# ---------------------------------------------------------------- events

def _free_event(state: dict, ptr: Any) -> None:
    if state.get("recorded_on") is not None:
        lib.ggml_backend_event_synchronize(ptr)  # its queued signal must not outlive it
    lib.ggml_backend_event_free(ptr)


class Event(Handle):
    kind = "backend event"

    def __init__(self, ptr: Any, device: Device) -> None:
        state: dict = {"recorded_on": None}
        super().__init__(ptr, functools.partial(_free_event, state))
        self._state = state  # recorded_on: the Backend it was last recorded on, until synchronized
        self.device = device
        self._waiters: weakref.WeakSet = weakref.WeakSet()  # backends told to wait for it

    def _before_free(self) -> None:
        for b in list(self._waiters):  # their queued wait points at it: finish it first
            if b.alive:
                finish_backend(b)

    def _describe(self) -> str:
        return f" {self.device.name}"


def _event(event: Any, fn: str) -> Any:
    return unwrap(event, Event, f"{fn}(event)")


def ggml_backend_event_new(device: Device) -> Event:
    """Create an event on a device: a marker recorded into a backend's queue that others can wait for.

    Only devices whose ``ggml_backend_dev_get_props(device)["caps"]["events"]`` is True have events (Vulkan,
    CUDA; not the CPU, BLAS or RPC).

    Arguments:
        device: a Device, a device name such as ``"Vulkan0"``, or a Backend (its device).

    Value: an Event handle (freed with ``ggml_backend_event_free``, or when collected). Raises GgmlStateError
    on a device without events (ggmlR returns NULL there).

    Example:
        >>> ev = ggml_backend_event_new("Vulkan0")
    """
    fn = "ggml_backend_event_new"
    if isinstance(device, Backend):
        unwrap(device, Backend, f"{fn}(device)")
        device = device.device
    dev = _as_device(device)
    if not device_caps(dev).get("events"):
        raise GgmlStateError(f"{fn}: device {dev.name} does not support events (its caps say events=False; "
                             f"ggml_backend_dev_get_props('{dev.name}')['caps']); use a device that does (Vulkan, "
                             "CUDA), or ggml_backend_synchronize to wait for a backend")
    ptr = lib.ggml_backend_event_new(dev.ptr)
    if ptr == ffi.NULL:
        raise GgmlStateError(f"{fn}: ggml could not create an event on {dev.name}")
    return Event(ptr, dev)


def ggml_backend_event_free(event: Event) -> None:
    """Free an event. Idempotent.

    Work still queued that records or waits for it is finished first (the backends told to wait are
    synchronized).

    Arguments:
        event: an Event.

    Value: None.

    Example:
        >>> ggml_backend_event_free(ev)
    """
    free_handle(event, Event, "ggml_backend_event_free(event)")


def _same_device(fn: str, event: Event, backend: Backend) -> None:
    if backend.device.ptr != event.device.ptr:
        raise GgmlValueError(f"{fn}: the event belongs to device {event.device.name}, the backend runs on "
                             f"{backend.device.name}; ggml's events work within one device: create the event on "
                             f"the backend's device (ggml_backend_event_new(ggml_backend_get_device(backend)))")


def ggml_backend_event_record(event: Event, backend: Backend) -> None:
    """Record an event into a backend's queue: it completes when the work queued before it has finished.

    Arguments:
        event: an Event of the backend's device (another device raises GgmlValueError).
        backend: a Backend.

    Value: None.

    Example:
        >>> ggml_backend_graph_compute_async(gpu, gf)
        >>> ggml_backend_event_record(ev, gpu)
        >>> ggml_backend_event_synchronize(ev)        # waits for that compute only
    """
    fn = "ggml_backend_event_record"
    e = _event(event, fn)
    b = _backend(backend, fn)
    _same_device(fn, event, backend)
    with using([event, backend], fn):
        with computing([backend]):
            lib.ggml_backend_event_record(e, b)
        event._state["recorded_on"] = backend
        backend.__dict__.setdefault("_recorded_events", weakref.WeakSet()).add(event)


def ggml_backend_event_synchronize(event: Event) -> None:
    """Wait until the work queued before the event's last record has finished.

    An event never recorded completes at once.

    Arguments:
        event: an Event.

    Value: None.

    Example:
        >>> ggml_backend_event_synchronize(ev)
    """
    fn = "ggml_backend_event_synchronize"
    e = _event(event, fn)
    with using([event], fn):
        recorded_on = event._state["recorded_on"]
        with computing([recorded_on] if recorded_on is not None and recorded_on.alive else []):
            lib.ggml_backend_event_synchronize(e)
            event._state["recorded_on"] = None


def ggml_backend_event_wait(backend: Backend, event: Event) -> None:
    """Make a backend's later work wait until the event completes (the host does not wait).

    Arguments:
        backend: a Backend of the event's device (another device raises GgmlValueError).
        event: an Event.

    Value: None.

    Example:
        >>> ggml_backend_event_wait(gpu, ev)
    """
    fn = "ggml_backend_event_wait"
    b = _backend(backend, fn)
    e = _event(event, fn)
    _same_device(fn, event, backend)
    with using([event, backend], fn):
        with computing([backend]):
            lib.ggml_backend_event_wait(b, e)
        event._waiters.add(backend)


# ---------------------------------------------------------------- graph plans

def _free_plan(backend_ptr: Any, ptr: Any) -> None:
    lib.ggml_backend_graph_plan_free(backend_ptr, ptr)


class GraphPlan(Handle):
    kind = "graph plan"

    def __init__(self, ptr: Any, backend: Backend, graph: Graph) -> None:
        # a child of the backend: freeing the backend frees the plan first, while the backend still exists
        super().__init__(ptr, functools.partial(_free_plan, backend.ptr), parents=[backend])
        self.backend = backend
        self.graph = graph
        self.n_nodes = graph.n_nodes()

    def _describe(self) -> str:
        return f" {self.n_nodes} nodes on {self.backend.device.name}"


def _plans_supported(backend: Backend) -> bool:
    # Of ggml's backends only the CPU's implements graph plans; ggml aborts on the others.
    return backend.is_cpu and backend.device.backend_name == "CPU"


def ggml_backend_graph_plan_create(backend: Backend, graph: Graph) -> GraphPlan:
    """Prepare a graph for repeated computation on a backend (work buffer and thread plan made once).

    Only the CPU backend supports plans. The plan computes the nodes the graph has now; nodes added to
    the graph later are not part of it. Every tensor of the graph must have memory on the backend, as for
    ``ggml_backend_graph_compute``.

    Arguments:
        backend: a CPU Backend (another kind raises GgmlStateError: ggml would abort).
        graph: a Graph whose tensors have memory the CPU can use.

    Value: a GraphPlan handle, freed with ``ggml_backend_graph_plan_free``, with its backend, or when
    collected. ggmlR returns NULL when ggml cannot make one; ggmlpy raises GgmlStateError.

    Example:
        >>> plan = ggml_backend_graph_plan_create(cpu, gf)
        >>> ggml_backend_graph_plan_compute(cpu, plan)
    """
    fn = "ggml_backend_graph_plan_create"
    b = _backend(backend, fn)
    g = _graph_ptr(graph, fn)
    if not _plans_supported(backend):
        raise GgmlStateError(f"{fn}: backend {backend.name} does not implement graph plans (only ggml's CPU backend "
                             "does; ggml would abort); use ggml_backend_graph_compute on it")
    check_graph_ready(graph, [backend], fn, "backend")
    with using([backend, *graph.keepers], fn):
        ptr = lib.ggml_backend_graph_plan_create(b, g)
    if ptr == ffi.NULL:
        raise GgmlStateError(f"{fn}: ggml could not create the plan (out of memory for its work buffer?)")
    return GraphPlan(ptr, backend, graph)


def _plan(backend: Any, plan: Any, fn: str) -> tuple[Any, Any]:
    b = _backend(backend, fn)
    if not isinstance(plan, GraphPlan):
        raise_type(f"{fn}(plan)", "GraphPlan (ggml_backend_graph_plan_create)", plan)
    if plan.backend is not backend and plan.backend.ptr != b:
        raise GgmlValueError(f"{fn}: the plan was made for backend {plan.backend.name}, not for {backend.name}; pass "
                             "the backend it was created with")
    return b, plan


def ggml_backend_graph_plan_free(backend: Backend, plan: GraphPlan) -> None:
    """Free a graph plan. Idempotent.

    Arguments:
        backend: the Backend the plan was made for (another raises GgmlValueError). A plan whose backend
            was freed was freed with it: freeing it again does nothing.
        plan: a GraphPlan.

    Value: None.

    Example:
        >>> ggml_backend_graph_plan_free(cpu, plan)
    """
    fn = "ggml_backend_graph_plan_free"
    if not isinstance(plan, GraphPlan):
        raise_type(f"{fn}(plan)", "GraphPlan (ggml_backend_graph_plan_create)", plan)
    if not isinstance(backend, Backend):
        raise_type(f"{fn}(backend)", "Backend", backend)
    if plan._ptr is None:
        return
    _plan(backend, plan, fn)
    free_handle(plan, GraphPlan, f"{fn}(plan)")


def ggml_backend_graph_plan_compute(backend: Backend, plan: GraphPlan) -> int:
    """Compute the graph of a plan on its backend and wait for the result.

    The graph's tensors are checked first, as by ``ggml_backend_graph_compute`` (memory still there, row
    indices in range); the graph and its contexts must still be alive.

    Arguments:
        backend: the Backend the plan was made for (another raises GgmlValueError).
        plan: a GraphPlan (a freed one raises GgmlStateError).

    Value: the status, an int: 0 (``GGML_STATUS_SUCCESS``), as in ggmlR; a failed computation raises
    GgmlStateError.

    Example:
        >>> ggml_backend_graph_plan_compute(cpu, plan)
        0
    """
    fn = "ggml_backend_graph_plan_compute"
    b, plan = _plan(backend, plan, fn)
    p = plan.ptr
    graph = plan.graph
    g = _graph_ptr(graph, fn)
    if graph.n_nodes() != plan.n_nodes:  # ggml's plan holds the node list and work size of its creation
        raise GgmlStateError(f"{fn}: the graph has {graph.n_nodes()} nodes now, {plan.n_nodes} when the plan was "
                             "made: the plan would compute the old graph (and size its work buffer for it); free it "
                             "and create a new one with ggml_backend_graph_plan_create")
    check_graph_ready(graph, [backend], fn, "backend")
    with using([backend, plan, *graph.keepers], fn):
        _check_indices(g)
        with computing([backend]):
            status = lib.ggml_backend_graph_plan_compute(b, p)
    check_status(status, fn)
    return int(status)
