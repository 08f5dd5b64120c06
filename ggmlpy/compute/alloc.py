"""Graph allocators (ggml-alloc.h): place a graph's intermediate tensors in one backend's memory.

The scheduler does this for several backends at once; a ``Gallocr`` is the single-backend tool
(compute with ``ggml_backend_graph_compute`` afterwards).
"""
from __future__ import annotations

from .._ffi import CData, lib
from ..backend.backend import Backend
from ..core.handle import Allocations, free_handle, Handle, raise_type, unwrap, using
from ..errors import expect, GgmlStateError
from ..graph.nodes import graph_tensor_ptrs
from ..graph.objects import Graph
from .checks import check_graph_ready, unallocated_bytes
from .sched import record_allocation, unallocated


class Gallocr(Handle):
    kind = "graph allocator"

    def __init__(self, backend: Backend) -> None:
        buft = lib.ggml_backend_get_default_buffer_type(backend.ptr)
        super().__init__(lib.ggml_gallocr_new(buft), lib.ggml_gallocr_free, parents=[backend])
        self.backend = backend
        self._allocs = Allocations()  # the tensors its buffer holds: they lose that memory when it goes
        # a reservation failed (out of memory): ggml then keeps no buffer but still believes graphs of that
        # size fit, and its next allocation writes through the missing buffer (segfault) unless it reserves first
        self._alloc_failed = False

    def _before_free(self) -> None:
        self._allocs.release()


def ggml_gallocr_new(backend: Backend) -> Gallocr:
    """A graph allocator for one backend: places a graph's intermediate tensors in that backend's memory.

    The single-backend alternative to a scheduler: ``ggml_gallocr_alloc_graph`` then
    ``ggml_backend_graph_compute``. The allocator reuses the memory of results no longer needed and
    keeps one buffer (of the backend's default buffer type) that grows as needed.

    Arguments:
        backend: the Backend the graph will run on.

    Value: a Gallocr handle (freed with ``ggml_gallocr_free``, or when collected).

    Example:
        >>> galloc = ggml_gallocr_new(cpu)
        >>> ggml_gallocr_alloc_graph(galloc, gf)
        >>> ggml_backend_graph_compute(cpu, gf)
    """
    unwrap(backend, Backend, "ggml_gallocr_new(backend)")
    return Gallocr(backend)


def ggml_gallocr_free(galloc: Gallocr) -> None:
    """Free a graph allocator and its buffer; tensors it placed lose their memory.

    Idempotent.

    Arguments:
        galloc: a Gallocr from ``ggml_gallocr_new``.

    Value: None.

    Example:
        >>> ggml_gallocr_free(galloc)
    """
    free_handle(galloc, Gallocr, "ggml_gallocr_free(galloc)")


def _graph(graph: object, fn: str) -> CData:
    if not isinstance(graph, Graph):
        raise_type(f"{fn}(graph)", "Graph", graph)
    return graph.ptr


def ggml_gallocr_reserve(galloc: Gallocr, graph: Graph) -> None:
    """Size the allocator's buffer for ``graph`` (and any graph no larger) ahead of time.

    Later ``ggml_gallocr_alloc_graph`` calls on graphs of that size then do not reallocate.

    Arguments:
        galloc: a Gallocr.
        graph: the largest Graph it will have to allocate.

    Value: None. Raises GgmlStateError when the backend cannot allocate the buffer.

    Example:
        >>> ggml_gallocr_reserve(galloc, gf)
    """
    g = _graph(graph, "ggml_gallocr_reserve")
    ptr = unwrap(galloc, Gallocr, "ggml_gallocr_reserve(galloc)")
    check_graph_ready(graph, [galloc.backend], "ggml_gallocr_reserve", "alloc")
    with using([galloc, *graph.keepers], "ggml_gallocr_reserve"):
        galloc._allocs.release()  # a larger reservation replaces the buffer
        ok = bool(lib.ggml_gallocr_reserve(ptr, g))
        galloc._alloc_failed = not ok
    expect(ok, f"ggml_gallocr_reserve: {galloc.backend.name} could not allocate the buffer for the graph (up to "
               f"{unallocated_bytes(graph_tensor_ptrs(g)[1])} bytes); free other buffers or models, or split the work "
               "into smaller graphs (smaller batches)", GgmlStateError)


def ggml_gallocr_alloc_graph(galloc: Gallocr, graph: Graph) -> None:
    """Give every tensor of ``graph`` that has no memory yet a place in the allocator's buffer.

    Call it before each compute of a graph (again after building a new one). Tensors that already
    have memory (e.g. from ``ggml_backend_alloc_ctx_tensors``) stay where they are.

    Arguments:
        galloc: a Gallocr.
        graph: a Graph built with ``ggml_build_forward_expand``.

    Value: None. Raises GgmlStateError when the allocation fails (out of memory).

    Example:
        >>> ggml_gallocr_alloc_graph(galloc, gf)
    """
    fn = "ggml_gallocr_alloc_graph"
    g = _graph(graph, fn)
    ptr = unwrap(galloc, Gallocr, f"{fn}(galloc)")
    check_graph_ready(graph, [galloc.backend], fn, "alloc")
    with using([galloc, *graph.keepers], fn):
        # the previous allocation goes: its tensors lose their memory (the buffer may be replaced)
        galloc._allocs.release()
        check_graph_ready(graph, [galloc.backend], fn, "alloc")
        placed = unallocated(g)
        # after a failed reservation ggml must reserve again before it allocates (else it writes through a
        # missing buffer); a failed allocation here returns False and leaves it in that state
        ok = not galloc._alloc_failed or bool(lib.ggml_gallocr_reserve(ptr, g))
        ok = ok and bool(lib.ggml_gallocr_alloc_graph(ptr, g))
        galloc._alloc_failed = not ok
        record_allocation(galloc, graph, placed)
    expect(ok, f"{fn}: {galloc.backend.name} could not allocate the buffer for the graph (up to "
               f"{unallocated_bytes(placed)} bytes; out of memory); free other buffers or models, or split the work "
               "into smaller graphs (smaller batches)", GgmlStateError)


def ggml_gallocr_get_buffer_size(galloc: Gallocr, buffer_id: int = 0) -> int:
    """The size in bytes of the allocator's buffer (0 before any allocation).

    Arguments:
        galloc: a Gallocr.
        buffer_id: the buffer's index; this allocator has exactly one, so only 0 (the default) is valid.

    Value: an int.

    Example:
        >>> ggml_gallocr_get_buffer_size(galloc)
    """
    ptr = unwrap(galloc, Gallocr, "ggml_gallocr_get_buffer_size(galloc)")
    expect(buffer_id == 0, f"ggml_gallocr_get_buffer_size: this allocator has one buffer (id 0), got {buffer_id!r}")
    return int(lib.ggml_gallocr_get_buffer_size(ptr, 0))
