"""The backend scheduler (``Scheduler``): creating it over backends, reserving and allocating graphs on it,
its splits and backends.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from .._ffi import CData, ffi, lib
from ..backend.backend import Backend, blas_backend_init, ggml_backend_cpu_init, ggml_backend_init_auto
from ..core.args import is_int
from ..core.handle import Allocations, free_handle, Handle, Lifetime, raise_type, unwrap, using
from ..core.sysmem import check_fits_memory
from ..errors import expect, GgmlStateError, GgmlValueError
from ..graph.context import check_graph_size
from ..graph.indices import check_index_inputs, index_inputs
from ..graph.nodes import graph_tensor_ptrs, ptr_key
from ..graph.objects import Context, Graph
from .checks import allocation_may_fail, check_graph_ready, unallocated_bytes


GGML_SCHED_MAX_BACKENDS = 16


class Allocator(Protocol):
    """What gives a graph's tensors memory: a ``Scheduler`` or a graph allocator (``compute.alloc.Gallocr``);
    its ``Allocations`` take that memory back."""
    _allocs: Allocations


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
        self._owned = owned  # backends created for this scheduler, freed after it (``own``)
        self.allocated_graph: int | None = None  # address of the graph allocated by ggml_backend_sched_alloc_graph
        # (graph address, its index inputs and bounds) as read before the allocation split the graph: afterwards a
        # node on another backend than its index input reads the scheduler's copy of it, filled only by the compute
        self.index_leaves: tuple[int, list] | None = None
        self.opt_users: weakref.WeakSet = weakref.WeakSet()  # static opt contexts built on it (at most one)
        self.opt_contexts: weakref.WeakSet = weakref.WeakSet()  # every opt context built on it (static or dynamic)
        self.opt_lock = threading.Lock()  # makes "serves no opt context yet" + building one atomic
        self._allocs = Allocations()  # the tensors its buffers hold (taken back on reset, re-allocation, free)

    def own(self, backend: Backend) -> None:
        """Free ``backend`` (made for this scheduler only) after the scheduler."""
        self._owned.append(backend)

    def _before_free(self) -> None:
        self.release()

    def release(self) -> None:
        """Forget the current allocation: the tensors it placed lose their memory (ggml re-places them)."""
        self._allocs.release()
        self.allocated_graph = None
        self.index_leaves = None

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

    def sibling(self) -> Scheduler:
        """A new scheduler over the same backends (ggml-opt needs one per opt context)."""
        return Scheduler(self.backends, self.graph_size, False, self.op_offload, [])


def ggml_backend_sched_new(backends: Sequence[Backend] | Backend | str, parallel: bool = True,
                           graph_size: int = 2048, op_offload: bool = True) -> Scheduler:
    """A scheduler that runs graphs over one or more backends (GPU first, CPU as the fallback).

    The scheduler assigns each op of a graph to a backend (by priority, by where its data lives and by
    what each backend supports; the CPU takes what the others cannot do), allocates the intermediate
    tensors and copies data between devices.
    ggml requires a CPU backend last: one is appended (and owned by the scheduler) when the list does
    not end with one. The fit functions and ggml-opt take a scheduler; one scheduler serves at most one
    live opt context with static graphs.

    Arguments:
        backends: a list of Backends, highest priority first, or one Backend, or a short name:
            ``"auto"`` (the first hardware GPU, else the CPU), ``"cpu"``, ``"vulkan"``, ``"cuda"`` or a device
            name such as ``"Vulkan0"``; the scheduler then owns the backend it starts. A name that gives the
            CPU also puts ggml's BLAS backend (OpenBLAS, when built) before it: it takes the large F32 matrix
            products, and ggmlpy splits the threads between the two per training graph. A CPU backend
            anywhere but last raises GgmlValueError; at most ``GGML_SCHED_MAX_BACKENDS`` (16).
        parallel: True (the default) lets ggml pipeline work across backends (several copies of the
            inputs); False computes one graph copy at a time.
        graph_size: the largest graph, in nodes, the scheduler can handle (default 2048). Training
            graphs of large models need more: an error says how much when it is too small.
        op_offload: True (the default) lets ggml run ops whose weights live in host memory on the GPU
            when that pays off (large batches).

    Value: a Scheduler handle (a context manager; freed with ``ggml_backend_sched_free``).

    Example:
        >>> sched = ggml_backend_sched_new("auto")
        >>> sched = ggml_backend_sched_new([ggml_vulkan_init(0)], graph_size=8192)
    """
    owned: list[Backend] = []
    if isinstance(backends, str):
        backends = [ggml_backend_init_auto(backends)]
        owned.append(backends[0])
        if backends[0].is_cpu:  # the CPU: ggml's BLAS backend takes the large matrix products
            blas = blas_backend_init()
            if blas is not None:
                backends.insert(0, blas)
                owned.insert(0, blas)
    if isinstance(backends, Backend):
        backends = [backends]
    if not isinstance(backends, (list, tuple)) or not backends:
        raise GgmlValueError(f"ggml_backend_sched_new: backends must be a non-empty list of backends, got {backends!r}")
    for i, b in enumerate(backends):
        unwrap(b, Backend, f"ggml_backend_sched_new(backends[{i}])")
    check_graph_size("ggml_backend_sched_new", graph_size, "graph_size")
    # the scheduler's hash tables and graph copy: about this many bytes (ggml aborts when malloc fails)
    need = graph_size * (64 + 32 * (len(backends) + 1)) + int(lib.ggml_graph_overhead_custom(graph_size, False))
    check_fits_memory("ggml_backend_sched_new", f"a scheduler of graph_size={graph_size}", need,
                      "use a graph_size near the node count of your largest graph (2048 is the default)")
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


def sched_ptr(sched: Scheduler, fn: str):
    return unwrap(sched, Scheduler, f"{fn}(sched)")


def exclusive_sched(sched: Scheduler, handles: Iterable[object], fn: str) -> AbstractContextManager[None]:
    """``using`` for a call that resets the scheduler or gives it another graph: refused while another call runs
    it (a fit, an epoch, a compute in another thread): ggml would run that call on memory it no longer owns."""
    def busy(other: str) -> str:
        return (f"{fn}: this scheduler is in use by {other} (this call comes from one of its callbacks or "
                "generators, or from another thread); resetting it or running another graph on it now would pull "
                "the memory out from under that call. Use another scheduler (ggml_backend_sched_new over the same "
                "backends), or call it afterwards")
    def serves_no_opt_context() -> None:
        if any(o.alive for o in list(sched.opt_contexts)):
            # ggml-opt keeps its graph allocated on the scheduler between evals and does not notice a reset: its
            # next eval would run whatever graph was allocated last (silently wrong, or on memory that moved)
            raise GgmlStateError(f"{fn}: this scheduler serves a live opt context, which keeps its graphs allocated "
                                 "on it; computing another graph here would make that context compute the wrong "
                                 "graph. Use another scheduler (ggml_backend_sched_new over the same backends), or "
                                 "free the opt context first")
    return using(handles, fn, exclusive=[sched], busy=busy, check=serves_no_opt_context)


def ggml_backend_sched_free(sched: Scheduler) -> None:
    """Free a scheduler (and the backends it created itself, e.g. for ``"auto"`` or the CPU fallback).

    Idempotent. Backends passed in by the caller stay alive.

    Arguments:
        sched: a Scheduler.

    Value: None.

    Example:
        >>> ggml_backend_sched_free(sched)
    """
    free_handle(sched, Scheduler, "ggml_backend_sched_free(sched)")


def reapply_tensor_backends(sched: Scheduler) -> None:
    """After a reset of ``sched``: give ggml again the backends chosen with ggml_backend_sched_set_tensor_backend
    (a reset forgets them). For code that resets a scheduler and then allocates a graph."""
    kept = [(t, b) for t, b in sched.__dict__.get("_tensor_backends", []) if t.alive and b.alive]
    if kept or "_tensor_backends" in sched.__dict__:
        sched.__dict__["_tensor_backends"] = kept
    for t, b in kept:
        lib.ggml_backend_sched_set_tensor_backend(sched.ptr, t.ptr, b.ptr)


def ggml_backend_sched_reset(sched: Scheduler) -> None:
    """Forget the scheduler's current graph allocation, so that another graph can be allocated.

    Graph computes through ggmlpy reset when needed; call it yourself after a manual
    ``ggml_backend_sched_alloc_graph`` whose graph you no longer want to run.

    Arguments:
        sched: a Scheduler.

    Value: None.

    Example:
        >>> ggml_backend_sched_reset(sched)
    """
    s = sched_ptr(sched, "ggml_backend_sched_reset")
    with exclusive_sched(sched, [], "ggml_backend_sched_reset"):
        sched.release()  # the graph's tensors no longer have memory: using them raises instead of reading stale data
        lib.ggml_backend_sched_reset(s)


def ggml_backend_sched_get_n_backends(sched: Scheduler) -> int:
    """The number of backends of a scheduler, the appended CPU fallback included.

    Arguments:
        sched: a Scheduler.

    Value: an int.

    Example:
        >>> ggml_backend_sched_get_n_backends(ggml_backend_sched_new([ggml_vulkan_init()]))
        2
    """
    sched_ptr(sched, "ggml_backend_sched_get_n_backends")
    return len(sched.backends)


def ggml_backend_sched_get_backend(sched: Scheduler, index: int = 0) -> Backend:
    """Backend number ``index`` of a scheduler (0 has the highest priority; the last is the CPU).

    Arguments:
        sched: a Scheduler.
        index: an int in ``[0, n_backends)`` (default 0; else GgmlValueError).

    Value: a Backend.

    Example:
        >>> ggml_backend_name(ggml_backend_sched_get_backend(sched, 0))
    """
    sched_ptr(sched, "ggml_backend_sched_get_backend")
    n = len(sched.backends)
    expect(is_int(index) and 0 <= index < n, f"index must be an int in [0, {n}), got {index!r}")
    return sched.backends[index]


def ggml_backend_sched_get_n_splits(sched: Scheduler) -> int:
    """The number of pieces the last allocated graph was split into across backends.

    1 means the whole graph ran on one backend; more means data crossed devices (ops a GPU backend
    lacks fell back to the CPU), which costs time.

    Arguments:
        sched: a Scheduler.

    Value: an int.

    Example:
        >>> ggml_backend_sched_graph_compute(sched, gf); ggml_backend_sched_get_n_splits(sched)
    """
    return int(lib.ggml_backend_sched_get_n_splits(sched_ptr(sched, "ggml_backend_sched_get_n_splits")))


# ggml_hash_size: the scheduler's hash set holds the smallest of these primes >= graph_size entries
_HASH_PRIMES = (2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537, 131101,
                262147, 524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467, 67108879, 134217757)
_OPS = {ffi.string(lib.ggml_op_name(i)).decode(): i for i in range(int(lib.GGML_OP_COUNT))}


def sched_hash_size(n: int) -> int:
    return next((p for p in _HASH_PRIMES if p >= n), n | 1)


def graph_ptr(graph: Graph, fn: str, sched: Scheduler | None = None):
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


def _graph_index_leaves(g) -> list:
    """The index inputs of graph pointer ``g`` and their bounds, as its nodes read them now."""
    return index_inputs([lib.ggml_graph_node(g, i) for i in range(lib.ggml_graph_n_nodes(g))])


def remember_index_leaves(sched: Scheduler, g) -> None:
    """Note ``g``'s index inputs before ``sched`` allocates (and so splits) it: see ``check_sched_indices``."""
    sched.index_leaves = (int(ffi.cast("uintptr_t", g)), _graph_index_leaves(g))


def check_sched_indices(g, sched: Scheduler | None = None) -> None:
    """ggml's get_rows aborts on an out-of-range index: check the index inputs before computing.

    Once a scheduler has split the graph, a node on another backend than its index input reads the scheduler's
    copy of it, filled only during the compute: the inputs noted before the split (``remember_index_leaves``) are
    checked then, not the copies."""
    remembered = sched.index_leaves if sched is not None else None
    if remembered is not None and remembered[0] == int(ffi.cast("uintptr_t", g)):
        check_index_inputs(remembered[1])
    else:
        check_index_inputs(_graph_index_leaves(g))


def _sched_reserve(s: CData, g: CData) -> bool:
    """ggml_backend_sched_reserve on scheduler pointer ``s`` and graph pointer ``g``, leaving the graph as it was:
    ggml's graph split points the nodes' operands at its copies of inputs from other backends (in its own
    context, gone at the next split), and a graph allocated after being reserved would read those stale copies
    (wrong results)."""
    nodes = [lib.ggml_graph_node(g, i) for i in range(int(lib.ggml_graph_n_nodes(g)))]
    saved = [list(n.src) for n in nodes]
    try:
        return bool(lib.ggml_backend_sched_reserve(s, g))
    finally:
        for n, srcs in zip(nodes, saved):
            for j, src in enumerate(srcs):
                if n.src[j] != src:
                    n.src[j] = src


def reserve_first(sched: Scheduler, s: CData, g: CData, fn: str) -> None:
    """Before ggml allocates graph pointer ``g`` on reset scheduler ``sched`` (pointer ``s``): reserve its memory
    first when that might fail (more than the backends have free) or failed before. A scheduler whose
    allocation fails inside ggml_backend_sched_alloc_graph dereferences the missing buffer (segfault), and
    after any failed reservation its allocator keeps no buffer until a reservation succeeds; a failed
    ggml_backend_sched_reserve only returns False. Raises GgmlStateError when the memory cannot be had."""
    if not sched.__dict__.get("_alloc_failed") and not allocation_may_fail(graph_tensor_ptrs(g)[1], sched.backends):
        return
    ok = _sched_reserve(s, g)
    sched.__dict__["_alloc_failed"] = not ok
    reapply_tensor_backends(sched)  # the reservation reset the scheduler
    if not ok:
        need = unallocated_bytes(graph_tensor_ptrs(g)[1])
        raise GgmlStateError(f"{fn}: the scheduler could not get the memory for the graph (up to {need} bytes "
                             f"for its intermediate tensors; {'/'.join(b.name for b in sched.backends)} have less "
                             "free): free other buffers, schedulers or models, or split the work into smaller "
                             "graphs (smaller batches)")


def ggml_backend_sched_reserve(sched: Scheduler, graph: Graph) -> bool:
    """Reserve the scheduler's buffers for ``graph`` (and graphs no larger), without allocating it.

    Optional: it moves the cost of growing the buffers out of the first compute.

    Arguments:
        sched: a Scheduler.
        graph: the largest Graph it will run; its node count must fit the scheduler's ``graph_size``
            (else GgmlValueError).

    Value: True on success, False when ggml could not reserve the memory.

    Example:
        >>> ggml_backend_sched_reserve(sched, gf)
    """
    s = sched_ptr(sched, "ggml_backend_sched_reserve")
    g = graph_ptr(graph, "ggml_backend_sched_reserve", sched)
    check_graph_ready(graph, sched.backends, "ggml_backend_sched_reserve", "alloc", scheduler=True)
    with exclusive_sched(sched, graph.keepers, "ggml_backend_sched_reserve"):
        sched.release()  # reserving may move the scheduler's buffers
        ok = _sched_reserve(s, g)
        sched.__dict__["_alloc_failed"] = not ok  # ggml keeps no buffer after a failure: reserve before the next
        return ok


def ggml_backend_sched_alloc_graph(sched: Scheduler, graph: Graph) -> bool:
    """Assign the tensors of ``graph`` to backends and give them memory, before writing its inputs.

    After this, input tensors created without memory can be written with
    ``ggml_backend_tensor_set_data``; then ``ggml_backend_sched_graph_compute`` runs the graph. A
    previous allocation is reset first.

    Arguments:
        sched: a Scheduler.
        graph: a Graph whose node count fits the scheduler's ``graph_size`` (else GgmlValueError).

    Value: True. Raises GgmlStateError when the allocation fails (out of memory on a backend).

    Example:
        >>> ggml_backend_sched_alloc_graph(sched, gf)
        >>> ggml_backend_tensor_set_data(x, batch)
        >>> ggml_backend_sched_graph_compute(sched, gf)
    """
    fn = "ggml_backend_sched_alloc_graph"
    s = sched_ptr(sched, fn)
    g = graph_ptr(graph, fn, sched)
    check_graph_ready(graph, sched.backends, fn, "alloc", scheduler=True)
    with exclusive_sched(sched, graph.keepers, fn):
        # ggml aborts when a scheduler is allocated twice without a reset (e.g. after a compute): reset first.
        # The previous allocation's tensors lose their memory (its buffers may move).
        sched.release()
        lib.ggml_backend_sched_reset(s)
        reapply_tensor_backends(sched)
        # again if the release took memory from it
        check_graph_ready(graph, sched.backends, fn, "alloc", scheduler=True)
        placed = unallocated(g)
        reserve_first(sched, s, g, fn)
        remember_index_leaves(sched, g)
        ok = bool(lib.ggml_backend_sched_alloc_graph(s, g))
        record_allocation(sched, graph, placed)
    if not ok:
        raise GgmlStateError("the scheduler could not allocate the graph (out of memory on a backend?)")
    sched.allocated_graph = int(ffi.cast("uintptr_t", g))
    return ok


def unallocated(g: CData) -> list[CData]:
    """The tensors of graph pointer ``g`` without memory (an allocation is about to place them)."""
    return [t for t in graph_tensor_ptrs(g)[1] if t.data == ffi.NULL]


def record_allocation(allocator: Allocator, graph: Graph, candidates: list[CData]) -> None:
    """Record in ``allocator._allocs`` the tensors of ``candidates`` that got memory, each with the context
    holding its header (found among the graph's contexts), so they lose it when the allocator's goes."""
    placed = [t for t in candidates if t.data != ffi.NULL]
    if not placed:
        return
    assert isinstance(allocator, Handle)  # a Scheduler or a Gallocr
    graph.allocators.setdefault(id(allocator), allocator)
    contexts = [h for h in (graph.ctx, *graph.deps.values()) if isinstance(h, Context) and h.alive]
    where: dict[int, Context] = {}
    wanted = {ptr_key(t) for t in placed}
    for ctx in contexts:
        for t in ctx.tensor_ptrs():
            k = ptr_key(t)
            if k in wanted:
                where.setdefault(k, ctx)
    groups: dict[int, tuple[tuple[Lifetime, ...], list[tuple[CData, CData]]]] = {}
    for t in placed:
        owner = where.get(ptr_key(t))
        # the context's current generation too: after a ggml_reset the header is gone although the context lives
        keepers = (owner, owner.generation) if owner is not None else (graph.ctx, *graph.deps.values())
        groups.setdefault(id(keepers[0]) if owner is not None else 0, (keepers, []))[1].append((t, t.buffer))
    for keepers, tensors in groups.values():
        allocator._allocs.record(keepers, tensors)
