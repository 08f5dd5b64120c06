"""Build a graph from numpy arrays, compute it on a CPU backend (or a given one), read the results back; the
conventions of the whole suite:

* A C-ordered numpy array of shape ``(..., ne[1], ne[0])`` is in ggml layout, so an input
  array ``x`` becomes a tensor with ``ne = reversed(x.shape)`` (padded with 1s to 4-D).
* ``compute`` returns every result as a full 4-D array of shape ``(ne3, ne2, ne1, ne0)``;
  compare it with ``nd4(reference)`` so that the shape is checked as well as the values.
* References are computed in numpy float64, never by ggmlpy itself.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Callable

import numpy as np

import ggmlpy as G


_GGML_TYPES = {
    np.dtype(np.float32): G.GGML_TYPE_F32,
    np.dtype(np.float16): G.GGML_TYPE_F16,
    np.dtype(np.int32): G.GGML_TYPE_I32,
}


def nd4(a: np.ndarray) -> np.ndarray:
    """``a`` with leading 1-axes added up to 4 dimensions (ggml's (ne3, ne2, ne1, ne0))."""
    a = np.asarray(a)
    return a.reshape((1,) * (4 - a.ndim) + a.shape)


def ne_of(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """ggml ``ne`` of a numpy array shape in ggml layout."""
    ne = list(reversed(tuple(shape)))
    return tuple(ne + [1] * (4 - len(ne)))  # type: ignore[return-value]


def new_tensor_like(ctx, arr: np.ndarray):
    """A tensor of ``ctx`` with the type and ggml shape of ``arr``."""
    arr = np.asarray(arr)
    return G.ggml_new_tensor_4d(ctx, _GGML_TYPES[arr.dtype], *ne_of(arr.shape))


def read4(t) -> np.ndarray:
    """A tensor's data as a float64 (or int) array of shape (ne3, ne2, ne1, ne0)."""
    flat = G.ggml_backend_tensor_get_data(t)
    return flat.reshape(tuple(reversed(G.ggml_tensor_shape(t))))


# ---------------------------------------------------------------- build + compute

_BACKEND: list = []


def default_backend():
    """A CPU backend shared by the helpers (2 threads: the test machine is shared)."""
    if not _BACKEND or not _BACKEND[0].alive:
        b = G.ggml_backend_cpu_init()
        G.ggml_backend_cpu_set_n_threads(b, 2)
        _BACKEND[:] = [b]
    return _BACKEND[0]


@contextmanager
def cpu_backend(threads: int) -> Iterator:
    """A CPU backend of its own computing on ``threads`` threads (a thread-count test's), freed on leaving."""
    b = G.ggml_backend_cpu_init()
    try:
        G.ggml_backend_cpu_set_n_threads(b, threads)
        yield b
    finally:
        b.free()


def ctx_size(n_tensors: int, graph_size: int, grads: bool = False) -> int:
    return n_tensors * G.ggml_tensor_overhead() + G.ggml_graph_overhead(graph_size, grads) + 4096


@contextmanager
def graph_inputs(arrays, backend, ops_size: int):
    """Input tensors holding ``arrays`` (allocated on ``backend``), a context for the ops, and a list
    the caller appends further handles to (a scheduler); everything is freed on exit, newest first."""
    ctx_in = G.ggml_init(ctx_size(len(arrays) + 1, 1), no_alloc=True)
    owned = [ctx_in]
    try:
        tensors = [new_tensor_like(ctx_in, a) for a in arrays]
        if arrays:
            owned.append(G.ggml_backend_alloc_ctx_tensors(ctx_in, backend))
        for t, a in zip(tensors, arrays):
            G.ggml_backend_tensor_set_data(t, np.ascontiguousarray(a))
        ctx_ops = G.ggml_init(ops_size, no_alloc=True)
        owned.append(ctx_ops)
        yield tensors, ctx_ops, owned
    finally:
        for handle in reversed(owned):
            if handle is not None:
                handle.free()


def _backends(backend) -> list:
    """``backend`` as the scheduler's list: one backend, or a list of them (the first holds the inputs and runs
    what it supports, the others, e.g. the CPU, the rest)."""
    if isinstance(backend, (list, tuple)):
        return list(backend)
    return [backend or default_backend()]


def compute(build: Callable, *arrays: np.ndarray, backend=None, graph_size: int = 256,
            placements: list | None = None) -> list[np.ndarray]:
    """Build ``build(ctx, *input_tensors)`` on the CPU, compute it, return the results as 4-D arrays.

    The inputs live in a no_alloc context allocated with ``ggml_backend_alloc_ctx_tensors``;
    the ops go to a second no_alloc context whose graph a scheduler allocates and runs.
    ``build`` may return one tensor or a tuple/list of tensors. ``backend``: one backend or a list (see
    ``_backends``). ``placements``: a list that gets where the compute ran (a ``Placement``).
    """
    backends = _backends(backend)
    with graph_inputs(arrays, backends[0], ctx_size(graph_size, graph_size)) as (tensors, ctx_ops, owned):
        out = build(ctx_ops, *tensors)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        graph = G.ggml_new_graph_custom(ctx_ops, graph_size, False)
        for o in outs:
            G.ggml_set_output(o)
            G.ggml_build_forward_expand(graph, o)
        sched = G.ggml_backend_sched_new(backends, parallel=False, graph_size=graph_size)
        owned.append(sched)
        G.ggml_backend_sched_alloc_graph(sched, graph)
        _compute_watched(sched, graph, placements)
        return [read4(o) for o in outs]


def _compute_watched(sched, graph, placements: list | None) -> None:
    if placements is None:
        G.ggml_backend_sched_graph_compute(sched, graph)
        return
    from ggmlpy.compute.placement import PlacementRecorder
    with PlacementRecorder(sched) as rec:
        G.ggml_backend_sched_graph_compute(sched, graph)
    placements.append(rec.placement("a compute"))


def compute_grad(build: Callable, x: np.ndarray, r: np.ndarray, *others: np.ndarray, backend=None,
                 graph_size: int = 512, placements: list | None = None) -> tuple[float, np.ndarray]:
    """loss = sum(build(ctx, x, *others) * r): the loss and d loss / d x computed by ggml's autodiff.

    ``x`` is marked a parameter, the loss a loss; the graph is built with gradients, expanded
    backward, allocated by a scheduler, reset (loss gradient = 1) and computed. ``placements``: a list
    that gets where the compute ran (a ``Placement``: which backend computed each op).
    """
    backends = _backends(backend)
    ops_size = ctx_size(4 * graph_size, graph_size, True)
    with graph_inputs([x, r, *others], backends[0], ops_size) as (tensors, ctx_ops, owned):
        xt, rt, other_t = tensors[0], tensors[1], tensors[2:]
        G.ggml_set_param(xt)
        y = build(ctx_ops, xt, *other_t)
        loss = G.ggml_sum(ctx_ops, G.ggml_mul(ctx_ops, y, rt))
        G.ggml_set_loss(loss)
        graph = G.ggml_new_graph_custom(ctx_ops, graph_size, True)
        G.ggml_build_forward_expand(graph, loss)
        G.ggml_build_backward_expand(ctx_ops, graph)
        sched = G.ggml_backend_sched_new(backends, parallel=False, graph_size=graph_size)
        owned.append(sched)
        G.ggml_backend_sched_alloc_graph(sched, graph)
        G.ggml_graph_reset(graph)
        _compute_watched(sched, graph, placements)
        grad = G.ggml_graph_get_grad(graph, xt)
        assert grad is not None, "ggml built no gradient for the parameter"
        return float(G.ggml_backend_tensor_get_data(loss)[0]), \
            G.ggml_backend_tensor_get_data(grad).astype(np.float64).reshape(x.shape)


@contextmanager
def backward_nodes(build: Callable, ne: tuple[int, ...] = (8, 4)) -> Iterator[list]:
    """The nodes (Tensors) of the graph ggml's autodiff builds for loss = sum(build(ctx, x)), x an F32 parameter of
    shape ``ne`` (ggml order), forward and backward nodes in execution order, valid inside the block; nothing is
    computed."""
    ctx = G.ggml_init(4 * 1024 * 1024, no_alloc=True)
    try:
        x = G.ggml_new_tensor(ctx, G.GGML_TYPE_F32, len(ne), list(ne))
        G.ggml_set_param(x)
        loss = G.ggml_sum(ctx, build(ctx, x))
        G.ggml_set_loss(loss)
        graph = G.ggml_new_graph_custom(ctx, 64, True)
        G.ggml_build_forward_expand(graph, loss)
        G.ggml_build_backward_expand(ctx, graph)
        yield [G.ggml_graph_node(graph, i) for i in range(G.ggml_graph_n_nodes(graph))]
    finally:
        ctx.free()


def backward_ops(build: Callable, ne: tuple[int, ...] = (8, 4)) -> list[str]:
    """The op names of ``backward_nodes``'s graph, in execution order."""
    with backward_nodes(build, ne) as nodes:
        return [G.ggml_op_desc(n) for n in nodes]
