"""The backend scheduler and graph computation.

``ggml_backend_sched_new`` follows ggmlR: a CPU backend is appended (and owned by the
scheduler) when the list does not end with one, because ggml requires the last
backend to be a CPU and uses it as the fallback for ops a GPU backend lacks.
"""
from __future__ import annotations

import weakref
from typing import Sequence


from ._ffi import ffi, lib
from ._handle import Handle, free_handle, raise_type, unwrap
from .backend import Backend, ggml_backend_cpu_init
from .context import Graph
from ._checks import check_index_inputs, index_inputs
from .errors import GgmlStateError, GgmlValueError, expect

GGML_SCHED_MAX_BACKENDS = 16


class Scheduler(Handle):
    kind = "backend scheduler"

    def __init__(self, backends: list[Backend], graph_size: int, parallel: bool, op_offload: bool,
                 owned: list[Backend]) -> None:
        arr = ffi.new("ggml_backend_t[]", [b.ptr for b in backends])
        ptr = lib.ggml_backend_sched_new(arr, ffi.NULL, len(backends), graph_size, parallel, op_offload)
        super().__init__(ptr, lib.ggml_backend_sched_free, parents=backends)
        self.backends = list(backends)
        self.graph_size = graph_size
        self.parallel = parallel
        self.op_offload = op_offload
        self._owned = owned  # backends created for this scheduler, freed after it
        self._allocated: int | None = None  # address of the graph allocated by ggml_backend_sched_alloc_graph
        self._opt_users: weakref.WeakSet = weakref.WeakSet()  # static opt contexts built on it (at most one)

    def free(self) -> None:
        if self._ptr is None:
            return
        super().free()
        # The owned backends are this scheduler's parents: freeing one frees its children (this
        # scheduler) first, so clear the list before, or the two would free each other forever.
        owned, self._owned = self._owned, []
        for b in owned:
            b.free()

    def _describe(self) -> str:
        return " [" + ", ".join(b.device.name for b in self.backends) + "]"

    def sibling(self) -> "Scheduler":
        """A new scheduler over the same backends (ggml-opt needs one per opt context)."""
        return Scheduler(self.backends, self.graph_size, False, self.op_offload, [])


def ggml_backend_sched_new(backends: Sequence[Backend] | Backend | str, parallel: bool = True,
                           graph_size: int = 2048, op_offload: bool = True) -> Scheduler:
    """A scheduler over ``backends`` (highest priority first); a CPU backend is appended when the
    list does not end with one. ``backends`` may also be ``"auto"`` (the first GPU, else the CPU),
    ``"cpu"``, ``"vulkan"``, ``"cuda"`` or a device name: the scheduler then owns that backend."""
    owned: list[Backend] = []
    if isinstance(backends, str):
        from .backend import ggml_backend_init_auto
        backends = [ggml_backend_init_auto(backends)]
        owned.append(backends[0])
    if isinstance(backends, Backend):
        backends = [backends]
    if not isinstance(backends, (list, tuple)) or not backends:
        raise GgmlValueError(f"ggml_backend_sched_new: backends must be a non-empty list of backends, got {backends!r}")
    for i, b in enumerate(backends):
        unwrap(b, Backend, f"ggml_backend_sched_new(backends[{i}])")
    expect(isinstance(graph_size, int) and graph_size >= 1, f"graph_size must be an int >= 1, got {graph_size!r}")
    backends = list(backends)
    if not backends[-1].is_cpu:
        if any(b.is_cpu for b in backends):
            raise GgmlValueError("ggml_backend_sched_new: the CPU backend must come last (it is the fallback); "
                                 f"got {[b.device.name for b in backends]}")
        cpu = ggml_backend_cpu_init()
        backends.append(cpu)
        owned.append(cpu)
    if len(backends) > GGML_SCHED_MAX_BACKENDS:
        raise GgmlValueError(f"ggml_backend_sched_new: at most {GGML_SCHED_MAX_BACKENDS} backends, got {len(backends)}")
    return Scheduler(backends, graph_size, bool(parallel), bool(op_offload), owned)


def _sched(sched: Scheduler, fn: str):
    return unwrap(sched, Scheduler, f"{fn}(sched)")


def ggml_backend_sched_free(sched: Scheduler) -> None:
    free_handle(sched, Scheduler, "ggml_backend_sched_free(sched)")


def ggml_backend_sched_reset(sched: Scheduler) -> None:
    lib.ggml_backend_sched_reset(_sched(sched, "ggml_backend_sched_reset"))
    sched._allocated = None


def ggml_backend_sched_get_n_backends(sched: Scheduler) -> int:
    _sched(sched, "ggml_backend_sched_get_n_backends")
    return len(sched.backends)


def ggml_backend_sched_get_backend(sched: Scheduler, index: int = 0) -> Backend:
    _sched(sched, "ggml_backend_sched_get_backend")
    n = len(sched.backends)
    expect(isinstance(index, int) and 0 <= index < n, f"index must be an int in [0, {n}), got {index!r}")
    return sched.backends[index]


def ggml_backend_sched_get_n_splits(sched: Scheduler) -> int:
    return int(lib.ggml_backend_sched_get_n_splits(_sched(sched, "ggml_backend_sched_get_n_splits")))


# ggml_hash_size: the scheduler's hash set holds the smallest of these primes >= graph_size entries
_HASH_PRIMES = (2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537, 131101,
                262147, 524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467, 67108879, 134217757)
_OPS = {ffi.string(lib.ggml_op_name(i)).decode(): i for i in range(int(lib.GGML_OP_COUNT))}


def sched_hash_size(n: int) -> int:
    return next((p for p in _HASH_PRIMES if p >= n), n | 1)


def _graph_ptr(graph: Graph, fn: str, sched: Scheduler | None = None):
    if not isinstance(graph, Graph):
        raise_type(f"{fn}(graph)", "Graph", graph)
    g = graph.ptr
    if sched is not None:
        n_nodes = graph.n_nodes()
        expect(n_nodes <= sched.graph_size,
               f"{fn}: the graph has {n_nodes} nodes, more than the scheduler's graph_size {sched.graph_size}")
        room = sched_hash_size(sched.graph_size)
        if n_nodes * (1 + int(lib.GGML_MAX_SRC)) > room:  # only then can nodes + leafs overflow: count the leafs
            n_leafs = _count_leafs(g, n_nodes)
            expect(n_nodes + n_leafs <= room,
                   f"{fn}: the graph has {n_nodes} nodes and {n_leafs} leafs, more than the scheduler (graph_size "
                   f"{sched.graph_size}) can hold ({room}); create it with a larger graph_size")
    return g


def _count_leafs(g, n_nodes: int) -> int:
    param = int(lib.GGML_TENSOR_FLAG_PARAM)
    leafs = set()
    for i in range(n_nodes):
        for s in lib.ggml_graph_node(g, i).src:
            if s != ffi.NULL and s.op == lib.GGML_OP_NONE and not s.flags & param:
                leafs.add(int(ffi.cast("uintptr_t", s)))
    return len(leafs)


def _check_indices(g) -> None:
    """ggml's get_rows aborts on an out-of-range index: check the index inputs before computing."""
    nodes = [lib.ggml_graph_node(g, i) for i in range(lib.ggml_graph_n_nodes(g))]
    check_index_inputs(index_inputs(nodes))


def ggml_backend_sched_reserve(sched: Scheduler, graph: Graph) -> bool:
    s = _sched(sched, "ggml_backend_sched_reserve")
    return bool(lib.ggml_backend_sched_reserve(s, _graph_ptr(graph, "ggml_backend_sched_reserve", sched)))


def ggml_backend_sched_alloc_graph(sched: Scheduler, graph: Graph) -> bool:
    s = _sched(sched, "ggml_backend_sched_alloc_graph")
    g = _graph_ptr(graph, "ggml_backend_sched_alloc_graph", sched)
    # ggml aborts when a scheduler is allocated twice without a reset (e.g. after a compute): reset first
    lib.ggml_backend_sched_reset(s)
    sched._allocated = None
    ok = bool(lib.ggml_backend_sched_alloc_graph(s, g))
    if not ok:
        raise GgmlStateError("the scheduler could not allocate the graph (out of memory on a backend?)")
    sched._allocated = int(ffi.cast("uintptr_t", g))
    return ok


def ggml_backend_sched_graph_compute(sched: Scheduler, graph: Graph) -> None:
    s = _sched(sched, "ggml_backend_sched_graph_compute")
    g = _graph_ptr(graph, "ggml_backend_sched_graph_compute", sched)
    addr = int(ffi.cast("uintptr_t", g))
    if sched._allocated is not None and sched._allocated != addr:
        # an allocated scheduler runs the graph it allocated, whatever graph it is given: let it allocate this one
        lib.ggml_backend_sched_reset(s)
    _check_indices(g)
    status = lib.ggml_backend_sched_graph_compute(s, g)
    sched._allocated = addr if status == lib.GGML_STATUS_SUCCESS else None
    check_status(status, "ggml_backend_sched_graph_compute")


def ggml_backend_graph_compute(backend: Backend, graph: Graph) -> None:
    b = unwrap(backend, Backend, "ggml_backend_graph_compute(backend)")
    g = _graph_ptr(graph, "ggml_backend_graph_compute")
    _check_indices(g)
    check_status(lib.ggml_backend_graph_compute(b, g), "ggml_backend_graph_compute")


_cpu_for_ctx: list[Backend] = []


def ggml_graph_compute(ctx, graph: Graph) -> None:
    """Compute a graph whose tensors live in context memory (``no_alloc=False``) on the CPU."""
    from .context import Context
    unwrap(ctx, Context, "ggml_graph_compute(ctx)")
    expect(not ctx.no_alloc, "ggml_graph_compute: the context has no_alloc=True; its tensors have no memory. "
                             "Use a scheduler (ggml_backend_sched_alloc_graph + ggml_backend_sched_graph_compute)",
           GgmlStateError)
    if not _cpu_for_ctx or not _cpu_for_ctx[0].alive:
        _cpu_for_ctx[:] = [ggml_backend_cpu_init()]
    ggml_backend_graph_compute(_cpu_for_ctx[0], graph)


ggml_graph_compute_with_ctx = ggml_graph_compute


def check_status(status: int, what: str) -> None:
    if status != lib.GGML_STATUS_SUCCESS:
        names = {lib.GGML_STATUS_ALLOC_FAILED: "allocation failed", lib.GGML_STATUS_FAILED: "failed",
                 lib.GGML_STATUS_ABORTED: "aborted"}
        raise GgmlStateError(f"{what}: the computation {names.get(status, f'returned status {status}')}")
