"""Graph allocators (ggml-alloc.h): place a graph's intermediate tensors in one backend's memory.

The scheduler does this for several backends at once; a ``Gallocr`` is the single-backend tool
(compute with ``ggml_backend_graph_compute`` afterwards).
"""
from __future__ import annotations

from typing import Any

from ._ffi import lib
from ._handle import Handle, free_handle, raise_type, unwrap
from .backend import Backend
from .context import Graph
from .errors import GgmlStateError, expect


class Gallocr(Handle):
    kind = "graph allocator"

    def __init__(self, backend: Backend) -> None:
        buft = lib.ggml_backend_get_default_buffer_type(backend.ptr)
        super().__init__(lib.ggml_gallocr_new(buft), lib.ggml_gallocr_free, parents=[backend])
        self.backend = backend


def ggml_gallocr_new(backend: Backend) -> Gallocr:
    """An allocator for graphs computed on ``backend`` (its default buffer type)."""
    unwrap(backend, Backend, "ggml_gallocr_new(backend)")
    return Gallocr(backend)


def ggml_gallocr_free(galloc: Gallocr) -> None:
    free_handle(galloc, Gallocr, "ggml_gallocr_free(galloc)")


def _graph(graph: Any, fn: str) -> Any:
    if not isinstance(graph, Graph):
        raise_type(f"{fn}(graph)", "Graph", graph)
    return graph.ptr


def ggml_gallocr_reserve(galloc: Gallocr, graph: Graph) -> None:
    """Size the allocator's buffer for ``graph`` (and graphs no larger), so later allocations do not grow it."""
    g = _graph(graph, "ggml_gallocr_reserve")
    expect(bool(lib.ggml_gallocr_reserve(unwrap(galloc, Gallocr, "ggml_gallocr_reserve(galloc)"), g)),
           "ggml_gallocr_reserve: the backend could not allocate the buffer (out of memory?)", GgmlStateError)


def ggml_gallocr_alloc_graph(galloc: Gallocr, graph: Graph) -> None:
    """Give every tensor of ``graph`` without memory a place in the allocator's buffer."""
    g = _graph(graph, "ggml_gallocr_alloc_graph")
    expect(bool(lib.ggml_gallocr_alloc_graph(unwrap(galloc, Gallocr, "ggml_gallocr_alloc_graph(galloc)"), g)),
           "ggml_gallocr_alloc_graph: the allocation failed (out of memory?)", GgmlStateError)


def ggml_gallocr_get_buffer_size(galloc: Gallocr, buffer_id: int = 0) -> int:
    ptr = unwrap(galloc, Gallocr, "ggml_gallocr_get_buffer_size(galloc)")
    expect(buffer_id == 0, f"ggml_gallocr_get_buffer_size: this allocator has one buffer (id 0), got {buffer_id!r}")
    return int(lib.ggml_gallocr_get_buffer_size(ptr, 0))
