"""Before a graph is allocated or computed: memory pools, whether an allocation fits, which nodes each backend
supports, and whether a graph is ready to run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .._ffi import CData, ffi, lib
from ..backend.probe import backend_runs, buffer_usable
from ..core.handle import memory_epoch
from ..core.sysmem import available_memory, physical_memory
from ..core.types import GGML_TYPE_F32
from ..errors import GgmlStateError, GgmlTypeError, GgmlValueError
from ..graph.graph import walk_graph
from ..graph.nodes import (
    describe_node,
    graph_tensor_ptrs,
    NO_MEMORY_FIX,
    op_label,
    ptr_key,
    tensor_label,
    tensor_memory,
    value_read,
)
from ..graph.objects import Graph


if TYPE_CHECKING:
    from ..backend.backend import Backend


_POOLS: dict[int, tuple[str, int, int, bool]] = {}


def memory_pool(backend: Backend) -> tuple[int, str, int, int, bool]:
    """(key, name, largest buffer, total memory, host) of the memory ``backend`` (a Backend) places a graph's
    tensors in: its default buffer type (what schedulers and graph allocators use). The largest buffer is
    ggml_backend_buft_get_max_size (read through an empty buffer: the cffi declarations have no buft form);
    the total is the device's memory (the machine's for host memory), 0 when the device does not say."""
    buft = lib.ggml_backend_get_default_buffer_type(backend.ptr)
    key = ptr_key(buft)
    if key not in _POOLS:
        buf = lib.ggml_backend_alloc_buffer(backend.ptr, 0)  # ggml's zero-size dummy buffer: no memory taken
        try:
            max_size = int(lib.ggml_backend_buffer_get_max_size(buf)) if buf != ffi.NULL else 0
        finally:
            if buf != ffi.NULL:
                lib.ggml_backend_buffer_free(buf)
        host = bool(lib.ggml_backend_buft_is_host(buft))
        if host:
            total = physical_memory()
        else:
            free_p, total_p = ffi.new("size_t *"), ffi.new("size_t *")
            lib.ggml_backend_dev_memory(lib.ggml_backend_get_device(backend.ptr), free_p, total_p)
            total = int(total_p[0])
        _POOLS[key] = (ffi.string(lib.ggml_backend_buft_name(buft)).decode(), max_size or (1 << 64) - 1, total, host)
    return (key, *_POOLS[key])


def pool_free(backend: Backend) -> int:
    """Bytes free now in the memory ``backend`` allocates from (0 when the device does not say)."""
    if lib.ggml_backend_buft_is_host(lib.ggml_backend_get_default_buffer_type(backend.ptr)):
        return available_memory()
    free_p, total_p = ffi.new("size_t *"), ffi.new("size_t *")
    lib.ggml_backend_dev_memory(lib.ggml_backend_get_device(backend.ptr), free_p, total_p)
    return int(free_p[0])


def _size_text(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n} bytes ({n / (1 << shift):.1f} {unit})"
    return f"{n} bytes"


def _placed_root(t: CData) -> CData | None:
    """The tensor an allocator gives memory for when it places ``t`` (t, or the tensor it views), or None when
    that one already has memory."""
    root = t.view_src if t.view_src != ffi.NULL else t
    return root if root.data == ffi.NULL else None


def unallocated_bytes(tensors: list) -> int:
    """An upper bound on what placing ``tensors`` (pointers) takes: each tensor without memory once (a view
    counts the tensor it views), plus alignment. Allocators reuse memory, so they usually need less."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        root = _placed_root(t)
        if root is not None and ptr_key(root) not in seen:
            seen.add(ptr_key(root))
            total += int(lib.ggml_nbytes(root)) + 512
    return total


_MEMORY_FIX = ("Expected sizes that fit: check the shape arguments of the op that made it (a padding, an arange's "
               "range, a repeat or an upscale far larger than meant), or split the work into smaller graphs (smaller "
               "batches)")


def check_graph_memory(nodes: list, tensors: list, backends: list, fn: str) -> None:
    """Refuse a graph whose allocation cannot succeed on ``backends`` (Backends: a scheduler's, or a graph
    allocator's one), before ggml tries: a tensor larger than the memory of every backend, or a node whose
    operands alone (all in memory while it is computed) exceed their memory together. ggml does not survive
    a failed graph allocation: a scheduler dereferences the missing buffer (segfault). (A buffer type's largest
    buffer, ggml_backend_buft_get_max_size, is no limit here: ggml gives a larger tensor a buffer of its own,
    which the backend may still manage; ``allocation_may_fail`` has the allocation reserved first then.)"""
    pools = {}
    for b in backends:
        key, name, _, total, _ = memory_pool(b)
        pools[key] = (name, total)
    totals = [tot for _, tot in pools.values()]
    if not all(totals):
        return  # a device that does not say how much memory it has
    names = "/".join(dict.fromkeys(b.name for b in backends))
    # one tensor: it must fit the memory of some backend
    one = max(totals)
    for t in tensors:
        root = _placed_root(t)
        if root is None:
            continue
        size = int(lib.ggml_nbytes(root))
        if size > one:
            what = "; ".join(f"{name}: {_size_text(tot)}" for name, tot in pools.values())
            op = f", the result of {op_label(root)}," if root.op != lib.GGML_OP_NONE else ""
            raise GgmlValueError(f"{fn}: {tensor_label(root)}{op} needs {_size_text(size)}, more than the memory "
                                 f"of {names} ({what}); ggml would fail to allocate it and crash. {_MEMORY_FIX}")
    # one node: its operands (and its result, unless it reuses an operand's memory) are in memory together
    memory = sum(totals)
    for p in nodes:
        roots = {}
        for src in p.src:
            if src != ffi.NULL:
                r = _placed_root(src)
                if r is not None:
                    roots[ptr_key(r)] = r
        own = _placed_root(p)
        need = max(sum(int(lib.ggml_nbytes(r)) for r in roots.values()),
                   int(lib.ggml_nbytes(own)) if own is not None else 0)
        if need > memory:
            raise GgmlValueError(f"{fn}: computing {tensor_label(p)} ({op_label(p)}) needs its operands and result "
                                 f"in memory together: at least {_size_text(need)}, more than {names} have "
                                 f"({_size_text(memory)}); ggml would fail to allocate the graph and crash. "
                                 f"{_MEMORY_FIX}")


def allocation_may_fail(tensors: list, backends: list) -> bool:
    """Whether placing ``tensors`` might fail on ``backends``: it might need more memory than they have free
    now, or a tensor is larger than a buffer type's largest buffer (ggml then asks the backend for a buffer of
    its own, which it may refuse). The caller then reserves the memory first (a failed reservation returns
    False; a failed allocation inside a scheduler crashes ggml). Cheap for small graphs: the free memory is
    only read above 64 MiB."""
    need = unallocated_bytes(tensors)
    if need <= 64 << 20:
        return False
    pools = {}
    for b in backends:
        key, _, max_size, _, _ = memory_pool(b)
        if key not in pools:
            pools[key] = (max_size, pool_free(b))
    smallest = min(m for m, _ in pools.values())
    if any(int(lib.ggml_nbytes(r)) > smallest for r in filter(None, map(_placed_root, tensors))):
        return True
    return need > sum(f for _, f in pools.values())


_PURE_VIEWS = {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}  # (a copy's result views its destination: placed)


def check_graph_ready(graph: Graph, backends: list, fn: str, mode: str, scheduler: bool = False) -> None:
    """Refuse to compute a graph that would crash ggml or compute garbage, naming the tensor:

    * memory: ``mode`` "backend" (``ggml_backend_graph_compute`` on ``backends[0]``) and "allocated" (a
      scheduler that allocated the graph) need memory for every tensor; "sched" (a scheduler that will
      allocate it while computing) needs it for the leafs (inputs and weights: a leaf without memory
      holds no values); "alloc" (an allocator about to place the graph) for none. The tensor a view views
      needs memory unless the graph has it. Memory must be on a backend that can use it.
    * support: every op must be implemented for its types by one of ``backends`` (on the backend its
      pre-allocated memory pins it to) — ggml aborts inside a kernel otherwise.

    A graph that passed is not checked again until its node count, the backends or the memory epoch
    (``core.handle.memory_epoch``: some memory was given back) change."""
    g = graph.ptr
    key = (memory_epoch(), int(lib.ggml_graph_n_nodes(g)), mode, scheduler, tuple(id(b) for b in backends))
    if graph.checked_key == key:
        return
    nodes, tensors = graph_tensor_ptrs(g)
    keys = {ptr_key(t) for t in tensors}
    read = value_read(nodes) if mode == "sched" else set()
    names = "/".join(b.name for b in backends)
    unplaced_view = None
    # leafs some node writes into (a copy's destination, an in-place op's): the scheduler places those
    written = {ptr_key(t.view_src) for t in nodes if t.view_src != ffi.NULL
               and ffi.string(lib.ggml_op_name(t.op)).decode() not in _PURE_VIEWS}
    for t in tensors:
        root = t.view_src if t.view_src != ffi.NULL else t
        leaf = t.op == lib.GGML_OP_NONE and t.view_src == ffi.NULL
        if mode in ("sched", "alloc") and root.data == ffi.NULL:
            if leaf and mode == "sched" and ptr_key(t) in read:
                raise GgmlStateError(f"{fn}: {tensor_label(t)} is an input of the graph without memory, so it holds no "
                                     "values: allocate the graph with ggml_backend_sched_alloc_graph and write the "
                                     "tensor with ggml_backend_tensor_set_data before computing (or allocate its "
                                     "context with ggml_backend_alloc_ctx_tensors)")
            if root is not t and ptr_key(root) not in keys:
                raise GgmlStateError(f"{fn}: {tensor_label(t)} views {tensor_label(root)}, which has no memory and "
                                     f"is not computed by this graph: {NO_MEMORY_FIX}")
            if (scheduler or mode == "sched") and root is not t and root.op == lib.GGML_OP_NONE \
                    and ffi.string(lib.ggml_op_name(t.op)).decode() in _PURE_VIEWS \
                    and not root.flags & int(lib.GGML_TENSOR_FLAG_INPUT) and ptr_key(root) not in written \
                    and unplaced_view is None:
                unplaced_view = (t, root)  # refused below, after the ops (a missing kernel says more)
            continue
        where = tensor_memory(t, f"{fn}: {tensor_label(t)}")
        if where == "host" and mode == "backend" and not backends[0].is_cpu:
            raise GgmlStateError(f"{fn}: {tensor_label(root)} lives in context memory (the CPU's), which "
                                 f"{names} cannot compute on; allocate its context on that backend with "
                                 "ggml_backend_alloc_ctx_tensors, or use a scheduler")
        if where == "host" and mode != "backend" and any(b.device.type not in ("cpu", "accel") for b in backends):
            # ggml's scheduler copies a tensor to another device through its buffer: one in context memory
            # has none, and the copy dereferenced it (segfault)
            raise GgmlStateError(f"{fn}: {tensor_label(root)} lives in context memory (ggml_init without "
                                 f"no_alloc), which a scheduler with {names} cannot move between devices; create "
                                 "it in a no_alloc context and allocate that with ggml_backend_alloc_ctx_tensors "
                                 "(on the CPU backend or the device), or compute on a CPU-only scheduler")
        if where == "backend" and not any(buffer_usable(b, root.buffer) for b in backends):
            buf = ffi.string(lib.ggml_backend_buffer_name(root.buffer)).decode()
            raise GgmlStateError(f"{fn}: {tensor_label(root)} lives in a {buf} buffer, which {names} cannot compute "
                                 f"on; compute with a scheduler that has the {buf} backend (or allocate the tensor on "
                                 "one of these backends)")
    check_nodes_supported(nodes, backends, fn, pinned=mode != "backend")
    if unplaced_view is not None:
        # ggml's scheduler gives memory to leafs that nodes read, not to one only seen through a view (it
        # aborted: "buffer_id >= 0"); a graph allocator places it
        t, root = unplaced_view
        raise GgmlStateError(f"{fn}: {tensor_label(t)} views {tensor_label(root)}, a leaf without memory that is "
                             "not marked as an input: ggml's scheduler would not place it. Mark it with ggml_set_input "
                             "(then write it after allocating the graph), or allocate its context with "
                             "ggml_backend_alloc_ctx_tensors")
    if mode in ("sched", "alloc"):
        check_graph_memory(nodes, tensors, backends, fn)
    graph.checked_key = key


def check_nodes_supported(nodes: list, backends: list, fn: str, pinned: bool = True) -> None:
    """Every op node (tensor pointer) must be implemented for its types and layouts by one of ``backends``
    (with ``pinned``: by one that can use the memory it already has, as ggml's scheduler requires), else
    GgmlTypeError naming the op, the tensor and its types (ggml would abort inside a kernel)."""
    for p in nodes:
        if p.op == lib.GGML_OP_NONE:
            continue
        root = p.view_src if p.view_src != ffi.NULL else p
        candidates = backends
        if pinned and root.buffer != ffi.NULL and root.data != ffi.NULL:
            candidates = [b for b in backends if buffer_usable(b, root.buffer)]  # ggml pins the op to them
        reasons = []
        for b in candidates:
            ok, why = backend_runs(b, p)
            if ok:
                break
            reasons.append(why)
        else:
            names = "/".join(b.name for b in candidates) or "/".join(b.name for b in backends)
            note = " (the memory it already has pins it to them)" if candidates is not backends else ""
            raise GgmlTypeError(f"{fn}: {names} cannot compute {describe_node(p)}{note}: "
                                f"{'; '.join(reasons) or 'no backend can use its memory'}; ggml would abort the "
                                "process. Convert the operands to a type the op takes (F32 works for every op: "
                                "ggml_cpy into an F32 tensor), or use another op")


def check_static_memory(roots: list, fn: str) -> list:
    """ggml-opt's static graphs: every leaf (input, weight, constant) reachable from ``roots`` (tensor pointers:
    the outputs and extra outputs) needs memory, which ggml-opt's copy of the graph keeps; a leaf without would
    get fresh, uninitialised memory at every step (weights reset to garbage). Returns (leaf, data pointer)
    pairs to check later."""
    found = []
    everything = list(walk_graph(roots))
    read = value_read(everything)
    for t in everything:
        if t.op == lib.GGML_OP_NONE and t.view_src == ffi.NULL:
            if t.data == ffi.NULL and ptr_key(t) in read:
                raise GgmlStateError(f"{fn}: {tensor_label(t)} has no memory. ggml-opt runs a copy of the graph "
                                     "that keeps the memory of its inputs and weights: allocate the tensor's context "
                                     "with ggml_backend_alloc_ctx_tensors (and write its values) before building the "
                                     "opt context")
            if t.data != ffi.NULL:
                found.append((t, t.data))
    return found


def check_opt_heads(heads: list, fn: str, ggml_loss: bool) -> None:
    """What ggml-opt asserts about the outputs it trains (it would abort): F32 (its losses and optimizer are
    F32-only), contiguous, and for its own cross-entropy (``ggml_loss``: one head handed to ggml-opt as is)
    a matrix ``[classes, batch]`` (its accuracy takes an argmax per column)."""
    for i, h in enumerate(heads):
        t = h.outputs.ptr
        which = "outputs" if len(heads) == 1 else f"outputs[{i}]"
        label = tensor_label(t)
        if t.type != GGML_TYPE_F32:
            raise GgmlTypeError(f"{fn}: {which} must be F32 (ggml-opt's losses and optimizer compute in F32), got "
                                f"{label}; convert it: ggml_cpy(ctx, out, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, "
                                "...)) with the same shape")
        if not lib.ggml_is_contiguous(t):
            raise GgmlValueError(f"{fn}: {which} must be contiguous, got a strided view ({label}); apply ggml_cont")
        if h.loss_type == int(lib.GGML_OPT_LOSS_TYPE_CROSS_ENTROPY) and t.ne[0] < 2:
            # a softmax over one value is 1: the loss is 0 and every prediction right, whatever the data
            raise GgmlValueError(f"{fn}: cross-entropy needs at least 2 classes (ne0 of {which}), got {label} with one "
                                 "value per prediction, whose softmax is always 1 (loss 0, accuracy 1 whatever the "
                                 "data); for a yes/no target use one sigmoid output and binary cross-entropy")
        if ggml_loss and h.loss_type == int(lib.GGML_OPT_LOSS_TYPE_CROSS_ENTROPY) and (t.ne[2] != 1 or t.ne[3] != 1):
            ne = [int(t.ne[k]) for k in range(4)]
            raise GgmlValueError(f"{fn}: ggml's cross-entropy loss needs 2-D outputs [classes, batch] (it takes the "
                                 f"argmax of each column for the accuracy), got {label} with ne {ne}; reshape the "
                                 f"logits with ggml_reshape_2d(ctx, out, {ne[0]}, {ne[1] * ne[2] * ne[3]}) (each "
                                 "column one prediction) and the labels alike")
