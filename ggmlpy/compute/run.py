"""Running graphs: on a backend, on the scheduler (sync and async), on the CPU in a context, and where the
scheduler places each tensor.
"""
from __future__ import annotations

import numpy as np

from .._ffi import ffi, lib
from ..backend.backend import (
    Backend,
    ggml_backend_cpu_init,
    ggml_backend_cpu_set_n_threads,
    hold_until_sync,
    is_async,
    release_held,
)
from ..backend.device import decode_str
from ..backend.probe import backend_runs, buffer_usable
from ..backend.transfer import ggml_backend_tensor_get_data, ggml_backend_tensor_set_data
from ..core.args import n_threads_arg
from ..core.handle import computing, raise_type, unwrap, using
from ..core.types import GGML_TYPE_F32
from ..errors import GgmlStateError, GgmlTypeError, GgmlValueError
from ..graph.context import ggml_init
from ..graph.graph import ggml_build_forward_expand, ggml_new_graph
from ..graph.nodes import tensor_label
from ..graph.objects import as_tensor, Context, Graph, Tensor
from ..graph.tensor import ggml_new_tensor_1d
from ..ops.elementwise import ggml_add, ggml_mul
from .checks import check_graph_ready
from .sched import (
    check_sched_indices,
    exclusive_sched,
    graph_ptr,
    reapply_tensor_backends,
    record_allocation,
    remember_index_leaves,
    reserve_first,
    sched_ptr,
    Scheduler,
    unallocated,
)
from .transfer import backend_arg, pending_message


def ggml_backend_sched_graph_compute(sched: Scheduler, graph: Graph) -> None:
    """Run ``graph`` on the scheduler's backends and wait for the result.

    Allocates the graph first when it is not the one currently allocated. Row indices of
    ``ggml_get_rows`` held by input tensors are checked before computing (ggml would abort on one out
    of range). Read the results with ``ggml_backend_tensor_get_data`` afterwards.

    Arguments:
        sched: a Scheduler.
        graph: a Graph whose node count fits the scheduler's ``graph_size`` (else GgmlValueError).

    Value: None. Raises GgmlStateError when the computation fails or is aborted.

    Example:
        >>> ggml_backend_sched_graph_compute(sched, gf)
        >>> y = ggml_backend_tensor_get_data(out)
    """
    fn = "ggml_backend_sched_graph_compute"
    s = sched_ptr(sched, fn)
    g = graph_ptr(graph, fn, sched)
    addr = int(ffi.cast("uintptr_t", g))
    allocated = sched.allocated_graph == addr
    check_graph_ready(graph, sched.backends, fn, "allocated" if allocated else "sched")
    with exclusive_sched(sched, graph.keepers, fn):
        placed = None
        if not allocated:
            # an allocated scheduler runs the graph it allocated, whatever graph it is given: let it allocate
            # this one (the previous allocation's tensors lose their memory)
            sched.release()
            lib.ggml_backend_sched_reset(s)
            reapply_tensor_backends(sched)
            check_graph_ready(graph, sched.backends, fn, "sched")
            placed = unallocated(g)
            reserve_first(sched, s, g, fn)
            remember_index_leaves(sched, g)
        check_sched_indices(g, sched)
        with computing(sched.backends):
            status = lib.ggml_backend_sched_graph_compute(s, g)
        if placed is not None:
            record_allocation(sched, graph, placed)
    sched.allocated_graph = addr if status == lib.GGML_STATUS_SUCCESS else None
    check_status(status, fn)


def ggml_backend_graph_compute(backend: Backend, graph: Graph) -> None:
    """Run ``graph`` on one backend; every tensor of the graph must already have memory there.

    Use it with a graph allocator (``ggml_gallocr_alloc_graph``) or with tensors allocated by
    ``ggml_backend_alloc_ctx_tensors``; a scheduler does the allocation itself. Row indices of
    ``ggml_get_rows`` held by input tensors are checked first.

    Arguments:
        backend: the Backend to compute on.
        graph: a Graph.

    Value: None. Raises GgmlStateError when the computation fails.

    Example:
        >>> ggml_gallocr_alloc_graph(galloc, gf)
        >>> ggml_backend_graph_compute(cpu, gf)
    """
    fn = "ggml_backend_graph_compute"
    b = unwrap(backend, Backend, f"{fn}(backend)")
    g = graph_ptr(graph, fn)
    check_graph_ready(graph, [backend], fn, "backend")
    with using([backend, *graph.keepers], fn):
        check_sched_indices(g)
        with computing([backend]):
            status = lib.ggml_backend_graph_compute(b, g)
        check_status(status, fn)


def recompute(backend: Backend, graph: Graph, fn: str, wait: bool = True) -> None:
    """Run again a graph that ``ggml_backend_graph_compute`` has accepted and that has not changed since (the
    same nodes and memory: an optimizer step of every batch), without walking it for the checks again. ``wait``
    False: queued behind the backend's work, for a caller that synchronizes the backend itself (the end of a
    training step: patches/0052)."""
    with using([backend, *graph.keepers], fn):
        with computing([backend]):
            compute = lib.ggml_backend_graph_compute if wait else lib.ggml_backend_graph_compute_async
            status = compute(backend.ptr, graph.ptr)
        check_status(status, fn)


_cpu_for_ctx: list[Backend] = []


def _compute_in_ctx(ctx: Context, graph: Graph, fn: str, n_threads: int = 0) -> None:
    unwrap(ctx, Context, f"{fn}(ctx)")
    if not isinstance(graph, Graph):
        raise_type(f"{fn}(graph)", "Graph (ggml_build_forward_expand(ctx, tensor))", graph)
    _ = graph.ptr  # raises if freed or reset
    if n_threads != 0:
        n_threads = n_threads_arg(fn, n_threads)
    if not _cpu_for_ctx or not _cpu_for_ctx[0].alive:
        _cpu_for_ctx[:] = [ggml_backend_cpu_init()]
    if ctx.no_alloc:
        # no memory in the context: fine when the graph's tensors got memory elsewhere (a CPU buffer, a graph
        # allocator); else say how to compute it
        fix = ("Use a scheduler (ggml_backend_sched_alloc_graph + ggml_backend_sched_graph_compute), or create the "
               "context with no_alloc=False")
        if graph.n_nodes() == 0:
            raise GgmlStateError(f"{fn}: the context has no_alloc=True and the graph is empty. {fix}")
        try:
            check_graph_ready(graph, [_cpu_for_ctx[0]], fn, "backend")
        except GgmlStateError as exc:
            raise GgmlStateError(f"{fn}: the context has no_alloc=True and the graph's tensors have no memory "
                                 f"({exc}). {fix}") from None
    if n_threads == 0:
        ggml_backend_graph_compute(_cpu_for_ctx[0], graph)
        return
    cpu = ggml_backend_cpu_init()  # a backend of its own: the shared one keeps its thread count
    try:
        ggml_backend_cpu_set_n_threads(cpu, n_threads)
        ggml_backend_graph_compute(cpu, graph)
    finally:
        cpu.free()


def ggml_graph_compute(ctx, graph: Graph) -> None:
    """Compute a graph whose tensors live in host memory (a ``no_alloc=False`` context), on the CPU.

    The simplest way to run a small graph (ggmlR's idiom): no backend buffers, no scheduler. ggmlpy
    keeps one CPU backend for these calls (its threads follow ``ggml_set_n_threads``). A graph of a
    ``no_alloc=True`` context computes too when its tensors got memory in a CPU buffer (a graph
    allocator, ``ggml_backend_alloc_ctx_tensors`` on the CPU backend).

    Arguments:
        ctx: the Context holding the tensors, created with ``no_alloc=False`` (a no_alloc context whose
            graph tensors have no memory raises GgmlStateError: use a scheduler).
        graph: a Graph built in that context (``ggml_build_forward_expand(ctx, tensor)``).

    Value: None; read the results with ``ggml_get_f32`` or ``ggml_backend_tensor_get_data``.

    Example:
        >>> ctx = ggml_init(1 << 20)
        >>> a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 3); ggml_set_f32(a, [1.0, 2.0, 3.0])
        >>> graph = ggml_build_forward_expand(ctx, ggml_sqr(ctx, a))
        >>> ggml_graph_compute(ctx, graph)
    """
    _compute_in_ctx(ctx, graph, "ggml_graph_compute")


def ggml_graph_compute_with_ctx(ctx, graph: Graph, n_threads: int = 0) -> None:
    """Compute a graph of a context on the CPU with a given number of threads (ggmlR's alternative form).

    Like ``ggml_graph_compute``, with the thread count chosen per call.

    Arguments:
        ctx: the Context holding the tensors (see ``ggml_graph_compute``).
        graph: a Graph built in that context.
        n_threads: the number of CPU threads, or 0 (the default) for ``ggml_get_n_threads()``.

    Value: None.

    Example:
        >>> graph = ggml_build_forward_expand(ctx, ggml_relu(ctx, a))
        >>> ggml_graph_compute_with_ctx(ctx, graph, n_threads=2)
    """
    _compute_in_ctx(ctx, graph, "ggml_graph_compute_with_ctx", n_threads)


def check_status(status: int, what: str) -> None:
    if status != lib.GGML_STATUS_SUCCESS:
        names = {lib.GGML_STATUS_ALLOC_FAILED: "allocation failed", lib.GGML_STATUS_FAILED: "failed",
                 lib.GGML_STATUS_ABORTED: "aborted"}
        raise GgmlStateError(f"{what}: the computation {names.get(status, f'returned status {status}')}")


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
    b = backend_arg(backend, fn)
    g = graph_ptr(graph, fn)
    check_graph_ready(graph, [backend], fn, "backend")
    with using([backend, *graph.keepers], fn):
        check_sched_indices(g)
        with computing([backend]):
            status = lib.ggml_backend_graph_compute_async(b, g)
        if is_async(backend):
            hold_until_sync(backend, pending_message(fn, backend), graph.keepers, (graph,))
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
    s = sched_ptr(sched, fn)
    g = graph_ptr(graph, fn, sched)
    if sched.__dict__.get("_async_pending"):
        ggml_backend_sched_synchronize(sched)
    addr = int(ffi.cast("uintptr_t", g))
    allocated = sched.allocated_graph == addr
    check_graph_ready(graph, sched.backends, fn, "allocated" if allocated else "sched")
    with exclusive_sched(sched, graph.keepers, fn):
        if not allocated:
            # allocate here (as ggml_backend_sched_alloc_graph does), after the backends chosen with
            # ggml_backend_sched_set_tensor_backend are given back to ggml: its compute would reset them away
            sched.release()
            lib.ggml_backend_sched_reset(s)
            check_graph_ready(graph, sched.backends, fn, "sched")
            reapply_tensor_backends(sched)
            reserve_first(sched, s, g, fn)  # a failed allocation inside ggml would crash: reserve first
            placed = unallocated(g)
            remember_index_leaves(sched, g)
            ok = bool(lib.ggml_backend_sched_alloc_graph(s, g))
            record_allocation(sched, graph, placed)
            if not ok:
                raise GgmlStateError(f"{fn}: the scheduler could not allocate the graph (out of memory on a backend?)")
            sched.allocated_graph = addr
        check_sched_indices(g, sched)
        with computing(sched.backends):
            status = lib.ggml_backend_sched_graph_compute_async(s, g)
        if any(is_async(b) for b in sched.backends):
            hold_until_sync(sched, pending_message(fn, sched), [sched, *graph.keepers], (graph,))
    sched.allocated_graph = addr if status == lib.GGML_STATUS_SUCCESS else None
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
    s = sched_ptr(sched, "ggml_backend_sched_synchronize")
    with computing(sched.backends):
        lib.ggml_backend_sched_synchronize(s)
    release_held(sched)
    for b in sched.backends:  # they are synchronized too: what their own async calls held can go
        if b.alive:
            release_held(b)


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
    return int(lib.ggml_backend_sched_get_n_copies(sched_ptr(sched, "ggml_backend_sched_get_n_copies")))


def _sched_backend(sched: Scheduler, backend: Backend, fn: str) -> int:
    unwrap(backend, Backend, f"{fn}(backend)")
    for i, b in enumerate(sched.backends):
        if b.alive and b.ptr == backend.ptr:
            return i
    raise GgmlValueError(f"{fn}: backend {backend.name} is not one of the scheduler's backends "
                         f"{[b.name for b in sched.backends if b.alive]}; "
                         "pass ggml_backend_sched_get_backend(sched, i)")


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
    s = sched_ptr(sched, fn)
    if not isinstance(tensor, Tensor):
        raise_type(f"{fn}(tensor)", "Tensor", tensor)
    t = as_tensor(tensor, f"{fn}(tensor)")
    p = t.ptr
    i = _sched_backend(sched, backend, fn)
    b = sched.backends[i]
    if p.op != lib.GGML_OP_NONE:
        ok, why = backend_runs(b, p)
        if not ok:
            raise GgmlTypeError(f"{fn}: {b.name} cannot compute {tensor_label(p)}: {why}; ggml would abort while "
                                "computing. Pick another of the scheduler's backends")
    with exclusive_sched(sched, t.keepers, fn):
        # ggml takes a choice between a reset and the next allocation: forget the current allocation (its
        # tensors lose their memory, the next compute allocates again) and reset, as ggml_backend_sched_reset
        sched.release()
        lib.ggml_backend_sched_reset(s)
        reapply_tensor_backends(sched)
        root = p.view_src if p.view_src != ffi.NULL else p
        if root.buffer != ffi.NULL and root.data != ffi.NULL and not buffer_usable(b, root.buffer):
            buf = decode_str(lib.ggml_backend_buffer_name(root.buffer))
            raise GgmlStateError(f"{fn}: {tensor_label(p)} lives in a {buf} buffer, which {b.name} cannot compute "
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
    s = sched_ptr(sched, fn)
    if not isinstance(tensor, Tensor):
        raise_type(f"{fn}(tensor)", "Tensor", tensor)
    t = as_tensor(tensor, f"{fn}(tensor)")
    with using([sched, *t.keepers], fn):
        ptr = lib.ggml_backend_sched_get_tensor_backend(s, t.ptr)
    if ptr == ffi.NULL:
        return None
    return next((b for b in sched.backends if b.alive and b.ptr == ptr), None)


def ggml_test() -> bool:
    """Check that ggml works in this installation: a small graph computed on the CPU gives the right values.

    Builds ``a * b + a`` over four float32 values in a fresh context, computes it with ggml's CPU backend
    and compares the result with the exact answer (ggmlR's ``ggml_test``).

    Value: True when ggml computed the right values, else False.

    Example:
        >>> ggml_test()
        True
    """
    x, y = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32), np.array([0.5, -1.0, 2.0, 0.25], dtype=np.float32)
    with ggml_init(1 << 20) as ctx:
        a, b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4), ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4)
        ggml_backend_tensor_set_data(a, x)
        ggml_backend_tensor_set_data(b, y)
        out = ggml_add(ctx, ggml_mul(ctx, a, b), a)
        ggml_graph_compute(ctx, ggml_build_forward_expand(ggml_new_graph(ctx), out))
        return bool(np.array_equal(ggml_backend_tensor_get_data(out), x * y + x))
