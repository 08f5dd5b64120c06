"""Compute graphs (``Graph``): creating them, building the forward and backward passes, reading their nodes
and gradients, printing and dumping them.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterable, Iterator

from .._ffi import CData, ffi, ggml_logger, lib
from ..core.args import c_string, is_int
from ..core.handle import raise_type, unwrap
from ..core.paths import check_writable_path, PathArg
from ..errors import expect, GgmlStateError, GgmlTypeError, GgmlValueError
from .context import check_graph_size, GGML_DEFAULT_GRAPH_SIZE
from .nodes import ptr_key, tensor_label
from .objects import as_graph, as_tensor, Context, Graph, Tensor


def ggml_new_graph(ctx: Context) -> Graph:
    """A new computation graph in ``ctx`` with room for ``GGML_DEFAULT_GRAPH_SIZE`` (2048) nodes.

    Add the ops that compute a tensor with ``ggml_build_forward_expand``; use ``ggml_new_graph_custom``
    for larger graphs or for a backward pass.

    Arguments:
        ctx: the context the graph lives in (it needs ``ggml_graph_overhead()`` free bytes).

    Value: a Graph. Raises GgmlValueError when the context is too full.

    Example:
        >>> gf = ggml_build_forward_expand(ggml_new_graph(ctx), out)
    """
    return ggml_new_graph_custom(ctx, GGML_DEFAULT_GRAPH_SIZE, False)


def ggml_new_graph_custom(ctx: Context, size: int = GGML_DEFAULT_GRAPH_SIZE, grads: bool = False) -> Graph:
    """A new computation graph with room for ``size`` nodes, optionally with gradients.

    Arguments:
        ctx: the context the graph lives in (it needs ``ggml_graph_overhead(size, grads)`` free bytes).
        size: the node capacity (default ``GGML_DEFAULT_GRAPH_SIZE``, 2048); nodes and leafs are each
            limited to it.
        grads: True for a graph that ``ggml_build_backward_expand`` may extend (default False).

    Value: a Graph. Raises GgmlValueError for a size below 1 or a context too full.

    Example:
        >>> gf = ggml_new_graph_custom(ctx, 4096, True)
    """
    ctx_ptr = unwrap(ctx, Context, "ggml_new_graph_custom(ctx)")
    check_graph_size("ggml_new_graph_custom", size, "size")
    need = int(lib.ggml_graph_overhead_custom(size, bool(grads)))
    free = ctx.mem_size - ctx.used_mem
    expect(need <= free, f"the ggml context is full: a graph of size {size} needs {need} bytes, {free} are left; "
                         f"create the context with mem_size >= ggml_graph_overhead({size}) + tensors")
    return Graph(lib.ggml_new_graph_custom(ctx_ptr, size, bool(grads)), ctx, size, bool(grads))


def walk_graph(roots: Iterable[CData]) -> Iterator[CData]:
    """Every tensor (cdata pointer) reachable from ``roots`` through its sources, each once."""
    stack = list(roots)
    seen: set[int] = set()
    while stack:
        t = stack.pop()
        key = int(ffi.cast("uintptr_t", t))
        if key in seen:
            continue
        seen.add(key)
        yield t
        stack.extend(s for s in t.src if s != ffi.NULL)


def _reachable(root: CData) -> tuple[set[int], set[int]]:
    """Nodes (ops) and leafs reachable from ``root``, as ggml_build_forward_expand will add them."""
    nodes: set[int] = set()
    leafs: set[int] = set()
    for t in walk_graph([root]):
        key = int(ffi.cast("uintptr_t", t))
        (nodes if t.op != lib.GGML_OP_NONE or (t.flags & lib.GGML_TENSOR_FLAG_PARAM) else leafs).add(key)
    return nodes, leafs


def ggml_build_forward_expand(graph: Graph | Context, tensor: Tensor) -> Graph:
    """Add ``tensor`` and every op it depends on to ``graph`` (in the order they must run).

    Nodes already in the graph are not added twice, so it can be called once per output. Nothing is
    computed here: compute the graph with a scheduler, ``ggml_backend_graph_compute`` or
    ``ggml_graph_compute``. Two call forms: ggml's ``(graph, tensor)`` expands an existing graph;
    ggmlR's ``(ctx, tensor)`` creates a new graph in the context ``ctx`` (ggml's default size of
    ``GGML_DEFAULT_GRAPH_SIZE`` nodes, larger when the computation needs more) and expands it.

    Arguments:
        graph: a Graph from ``ggml_new_graph``/``ggml_new_graph_custom``, or a Context (ggmlR's form)
            in which a new graph is created.
        tensor: the result to compute.

    Value: the graph: the same one, or the new one for a Context. Raises GgmlValueError when the
    graph's size is too small for the new nodes or leafs (create it with
    ``ggml_new_graph_custom(ctx, size)``), or when the context has no room for a new graph.

    Example:
        >>> gf = ggml_new_graph(ctx)
        >>> ggml_build_forward_expand(gf, out)
        >>> graph = ggml_build_forward_expand(ctx, out)        # ggmlR's form: a new graph
        >>> ggml_graph_compute(ctx, graph)
    """
    if isinstance(graph, Context):
        ctx = graph
        unwrap(ctx, Context, "ggml_build_forward_expand(ctx)")
        t = as_tensor(tensor, "ggml_build_forward_expand(tensor)").ptr
        nodes, leafs = _reachable(t)
        size = max(GGML_DEFAULT_GRAPH_SIZE, len(nodes), len(leafs))
        return ggml_build_forward_expand(ggml_new_graph_custom(ctx, size, False), tensor)
    if not isinstance(graph, Graph):
        raise_type("ggml_build_forward_expand(graph)", "Graph (or a Context, ggmlR's form)", graph)
    t = as_tensor(tensor, "ggml_build_forward_expand(tensor)").ptr
    g = graph.ptr
    nodes, leafs = _reachable(t)
    have = int(lib.ggml_graph_n_nodes(g))
    existing, old_leafs = set(), set()
    param = int(lib.GGML_TENSOR_FLAG_PARAM)
    for i in range(have):
        node = lib.ggml_graph_node(g, i)
        existing.add(int(ffi.cast("uintptr_t", node)))
        for s in node.src:  # the graph's leafs so far: ggml counts them over all calls, not per call
            if s != ffi.NULL and s.op == lib.GGML_OP_NONE and not s.flags & param:
                old_leafs.add(int(ffi.cast("uintptr_t", s)))
    n_nodes = have + len(nodes - existing)
    n_leafs = len(leafs | old_leafs)
    # Leafs are counted separately by ggml; both must stay below the graph's size.
    if n_nodes > graph.size or n_leafs > graph.size:
        raise GgmlValueError(f"ggml_build_forward_expand: the graph is too small: expanding it needs {n_nodes} "
                             f"nodes and {n_leafs} leafs in total, its size is {graph.size}; create it with "
                             "ggml_new_graph_custom(ctx, size) and a larger size")
    graph.add_deps(tensor)
    lib.ggml_build_forward_expand(g, t)
    return graph


def ggml_graph_n_nodes(graph: Graph) -> int:
    """The number of nodes (op results and parameters) in a graph.

    Arguments:
        graph: a Graph.

    Value: an int.

    Example:
        >>> ggml_graph_n_nodes(gf)
    """
    graph = as_graph(graph, "ggml_graph_n_nodes(graph)")
    return graph.n_nodes()


def ggml_graph_node(graph: Graph, i: int) -> Tensor:
    """Node ``i`` of a graph, in execution order; negative ``i`` counts from the end.

    Arguments:
        graph: a Graph.
        i: an index in ``[-n, n)`` where ``n = ggml_graph_n_nodes(graph)`` (else GgmlValueError);
            ``-1`` is the last node (usually the output).

    Value: a Tensor.

    Example:
        >>> out = ggml_graph_node(gf, -1)
    """
    graph = as_graph(graph, "ggml_graph_node(graph)")
    n = graph.n_nodes()
    expect(is_int(i) and -n <= i < n, f"ggml_graph_node: index must be in [-{n}, {n}), got {i!r}")
    return graph.node_tensor(lib.ggml_graph_node(graph.ptr, i))


def ggml_graph_get_tensor(graph: Graph, name: str) -> Tensor | None:
    """The tensor of ``graph`` named ``name`` (a node or a leaf), or None.

    Arguments:
        graph: a Graph.
        name: the name given with ``ggml_set_name``.

    Value: a Tensor or None.

    Example:
        >>> logits = ggml_graph_get_tensor(gf, "logits")
    """
    graph = as_graph(graph, "ggml_graph_get_tensor(graph)")
    ptr = lib.ggml_graph_get_tensor(graph.ptr, c_string("ggml_graph_get_tensor", "name", name))
    return graph.node_tensor(ptr) if ptr != ffi.NULL else None


def ggml_graph_reset(graph: Graph) -> None:
    """Zero the gradients of a graph and set the loss gradient to 1, before a backward compute.

    Arguments:
        graph: a Graph with gradients whose tensors are allocated (else GgmlStateError; allocate with a
            scheduler or a graph allocator first).

    Value: None.

    Example:
        >>> ggml_graph_reset(gf)
        >>> ggml_backend_sched_graph_compute(sched, gf)
    """
    expect(isinstance(graph, Graph) and graph.grads, "ggml_graph_reset: the graph has no gradients")
    nodes = graph.nodes()
    for node in nodes:
        grad = lib.ggml_graph_get_grad(graph.ptr, node.ptr)
        if grad != ffi.NULL and grad.data == ffi.NULL:
            if node.ptr.flags & int(lib.GGML_TENSOR_FLAG_LOSS) and \
                    ptr_key(grad) not in {ptr_key(src) for m in nodes for src in m.ptr.src if src != ffi.NULL}:
                # a loss whose gradient no op reads: allocators leave it out, and ggml would write through NULL
                raise GgmlStateError("ggml_graph_reset: no trainable parameter gets a gradient from the loss "
                                     f"{tensor_label(node.ptr)}: it depends on them only through ops whose gradient is "
                                     "zero (sgn, step, im2col's kernel, a ggml_cpy destination), so the backward pass "
                                     "is empty; build the loss from differentiable ops of the parameters")
            raise GgmlStateError("ggml_graph_reset: the graph's gradients are not allocated yet "
                                 "(allocate the graph with a scheduler or gallocr first)")
    lib.ggml_graph_reset(graph.ptr)


_LOG_LOCK = threading.Lock()


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def ggml_graph_print(graph: Graph) -> None:
    """Print a graph's nodes (shape, op, whether a parameter or with a gradient) and leafs to stdout.

    Arguments:
        graph: a Graph.

    Value: None (ggml's report is printed).

    Example:
        >>> ggml_graph_print(ggml_build_forward_expand(ctx, out))
    """
    g = as_graph(graph, "ggml_graph_print(graph)").ptr
    handler = _Collect()
    with _LOG_LOCK:  # ggml logs the report at INFO level: collect it here instead of the log's handlers
        level, propagate = ggml_logger.level, ggml_logger.propagate
        ggml_logger.addHandler(handler)
        ggml_logger.setLevel(logging.DEBUG)
        ggml_logger.propagate = False
        try:
            lib.ggml_graph_print(g)
        finally:
            ggml_logger.removeHandler(handler)
            ggml_logger.setLevel(level)
            ggml_logger.propagate = propagate
    sys.stdout.write("".join(line + "\n" for line in handler.lines))
    sys.stdout.flush()


def ggml_graph_dump_dot(graph: Graph, leafs: Graph | None = None, filename: PathArg | None = None) -> None:
    """Write a graph in Graphviz's dot format (render it with ``dot -Tpng file.dot -o file.png``).

    Arguments:
        graph: the Graph to draw.
        leafs: None (the default), or a forward Graph whose nodes are drawn as that graph's (ggml's
            ``gf`` argument, for a backward graph ``graph``).
        filename: the file to write, a str or os.PathLike (required; it must be creatable: a missing
            folder raises GgmlValueError instead of ggml's abort).

    Value: None.

    Example:
        >>> ggml_graph_dump_dot(graph, None, "graph.dot")
    """
    fn = "ggml_graph_dump_dot"
    g = as_graph(graph, f"{fn}(graph)").ptr
    gf = ffi.NULL if leafs is None else as_graph(leafs, f"{fn}(leafs)").ptr
    if filename is None:
        raise GgmlTypeError(f"{fn}: filename is required (the .dot file to write)")
    try:
        path = os.fspath(filename)
    except TypeError:
        raise GgmlTypeError(f"{fn}: filename must be a str or os.PathLike, got {filename!r}") from None
    raw = os.fsencode(path)
    if not raw or b"\0" in raw:
        raise GgmlValueError(f"{fn}: filename must be a non-empty path without NUL characters, got {filename!r}")
    check_writable_path(os.fsdecode(raw), fn)  # a FIFO would block ggml's fopen
    try:
        with open(raw, "w"):
            pass
    except OSError as exc:  # ggml asserts that its fopen succeeds
        raise GgmlValueError(f"{fn}: cannot write {path!r}: {exc.strerror or exc}") from None
    handler = _Collect()
    with _LOG_LOCK:  # ggml logs a 'dot -Tpng ...' hint at INFO level: keep it out of the user's log
        propagate = ggml_logger.propagate
        ggml_logger.addHandler(handler)
        ggml_logger.propagate = False
        try:
            lib.ggml_graph_dump_dot(g, gf, raw)
        finally:
            ggml_logger.removeHandler(handler)
            ggml_logger.propagate = propagate
