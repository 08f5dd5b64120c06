"""The thread policy: how much work a graph is (``StepWork``, for a forward pass and for a training step
with its optimizer), and how the user's threads are split between ggml's CPU backend and BLAS for it
(measured thresholds in docs/guide/threads.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .._ffi import ffi, lib
from ..backend.backend import Backend, ggml_get_n_threads, is_blas, set_backend_threads, threads_set_by_user
from ..core import openblas
from ..core.library import uses_openmp
from ..graph.graph import walk_graph
from ..graph.objects import Tensor


# ---------------------------------------------------------------- the work of a graph

def count_forward(outputs: Sequence[Tensor], with_leafs: bool = False) -> Any:
    """Forward nodes reachable from the outputs, and the trainable leafs among them (and the other leafs)."""
    params, n_nodes, n_leafs = [], 0, 0
    flag = int(lib.GGML_TENSOR_FLAG_PARAM)
    for t in walk_graph(o.ptr for o in outputs):
        if t.flags & flag:
            params.append(t)
        if t.op != lib.GGML_OP_NONE or t.flags & flag:
            n_nodes += 1
        else:
            n_leafs += 1
    return (n_nodes, params, n_leafs) if with_leafs else (n_nodes, params)


_MUL_MAT = next(i for i in range(int(lib.GGML_OP_COUNT)) if ffi.string(lib.ggml_op_name(i)) == b"MUL_MAT")


def forward_flops(outputs: Sequence[Tensor]) -> float:
    """A rough count of the floating-point operations of one forward pass to ``outputs``: 2 per
    multiply-add of a matrix product, one per result element of any other op."""
    return forward_work(outputs).flops


def _blas_takes(t: Any) -> bool:
    """Whether ggml's BLAS backend takes this MUL_MAT (F32, at least 32^3 multiply-adds: patch 0010)."""
    return int(t.ne[0]) * int(t.ne[1]) * int(t.src[1].ne[0]) >= 32 ** 3 \
        and t.src[0].type == lib.GGML_TYPE_F32 and t.src[1].type == lib.GGML_TYPE_F32


# ggml-opt's per-parameter work, in element-op units of ``StepWork.pool_elements``: AdamW reads a gradient,
# two moments and the weight and writes three of them (memory-bound, about four element ops' time);
# accumulating a gradient across a logical batch is one addition.
OPTIMIZER_ELEMENTS_PER_PARAM = 4.0


@dataclass(frozen=True)
class StepWork:
    """What one step computes, for splitting the CPU threads between ggml's pool and OpenBLAS.

    ``flops``: all of it, as ``forward_flops`` counts. ``blas_flops``: the matrix products ggml's BLAS
    backend takes (2 per multiply-add). ``pool_elements``: what ggml's CPU pool is left with, one per
    result element of its ops (its own small products at 2 per multiply-add), in training the optimizer's
    pass over the parameters included."""
    flops: float
    blas_flops: float
    pool_elements: float


def forward_work(outputs: Sequence[Tensor]) -> StepWork:
    """The work of one forward pass to ``outputs`` (inference)."""
    flops = blas = 0.0
    for t in walk_graph(o.ptr for o in outputs):
        if t.op == lib.GGML_OP_NONE:
            continue
        n = float(lib.ggml_nelements(t))
        if t.op == _MUL_MAT:
            product = 2.0 * n * int(t.src[0].ne[0])
            flops += product
            blas += product if _blas_takes(t) else 0.0
        else:
            flops += n
    return StepWork(flops, blas, flops - blas)


def training_step_work(outputs: Sequence[Tensor], opt_period: int = 1) -> StepWork:
    """The work of one training step (forward and backward: 3x the forward pass) of ``outputs``, with the
    optimizer stepping every ``opt_period`` steps."""
    forward = forward_work(outputs)
    n_params = sum(float(lib.ggml_nelements(p)) for p in count_forward(outputs)[1])
    per_param = OPTIMIZER_ELEMENTS_PER_PARAM / max(1, opt_period) + (1.0 if opt_period > 1 else 0.0)
    return StepWork(3.0 * forward.flops, 3.0 * forward.blas_flops,
                    3.0 * forward.pool_elements + n_params * per_param)


# ---------------------------------------------------------------- the split

# The thresholds come from alternated runs on this project's 2 shared cores; the measurements behind each
# are in docs/guide/threads.md ("Where the rules come from"). Below SMALL_GRAPH_FLOPS per compute one thread
# is faster (the pool's barrier after every node costs more than a second thread saves).
SMALL_GRAPH_FLOPS = 50e6
BLAS_PARALLEL_FLOPS = SMALL_GRAPH_FLOPS  # OpenBLAS's products per step, at least
BLAS_FLOPS_PER_POOL_ELEMENT = 75.0  # ... and at least this many product flops per element op of the pool
POOL_PARALLEL_ELEMENTS = 20e6  # ggml's pool next to OpenBLAS: element ops per step for a second thread


def threads_for(backend: "Backend", flops: float) -> int:
    """Give a CPU backend the threads a graph of ``flops`` per compute runs best with: the user's count if
    they set one with ``ggml_set_n_threads``, else one thread for a small graph and the default for others.
    Returns the count it had before (to restore it)."""
    if not backend.is_cpu:
        return 0
    before = backend.n_threads
    n = ggml_get_n_threads() if threads_set_by_user() or flops >= SMALL_GRAPH_FLOPS else 1
    if n != before:
        lib.ggmlpy_cpu_set_n_threads(backend.ptr, n)
        backend.n_threads = n
    return before


def blas_shares_cpu_pool() -> bool:
    """Whether ggml's BLAS backend runs its products on the CPU backend's own threads: OpenBLAS built on
    OpenMP, as ggml's CPU backend is. Then both may take every thread, as neither pool waits beside the other."""
    return openblas.threading_model() == "openmp" and uses_openmp()


def split_threads(backends, work: "StepWork") -> list:
    """Set the threads of a scheduler's CPU and BLAS backends for a training graph doing ``work`` per step
    (``opt.training_step_work``). With a BLAS backend, the thread budget ``ggml_get_n_threads()`` goes to
    OpenBLAS when the products reach BLAS_PARALLEL_FLOPS and BLAS_FLOPS_PER_POOL_ELEMENT times the pool's
    element ops, and to ggml's pool when those reach POOL_PARALLEL_ELEMENTS; each gets one thread
    otherwise. Without a BLAS backend, the CPU backends get the count ``threads_for`` picks (one thread for
    a small graph unless the user set a count). Returns [(backend, count before)] for restore_threads."""
    blas = [b for b in backends if is_blas(b) and b.alive]
    if not blas:
        return [(b, threads_for(b, work.flops)) for b in backends if b.alive and b.is_cpu]
    n = ggml_get_n_threads()
    if blas_shares_cpu_pool():
        blas_n = pool_n = n if threads_set_by_user() or work.flops >= SMALL_GRAPH_FLOPS else 1
    else:
        blas_n = n if work.blas_flops >= max(BLAS_PARALLEL_FLOPS,
                                             BLAS_FLOPS_PER_POOL_ELEMENT * work.pool_elements) else 1
        pool_n = n if work.pool_elements >= POOL_PARALLEL_ELEMENTS else 1
    before = []
    for b in backends:
        if not b.alive or not (b.is_cpu or is_blas(b)):
            continue
        before.append((b, b.n_threads))
        set_backend_threads(b, blas_n if is_blas(b) else pool_n)
    return before


def restore_threads(before: list) -> None:
    for b, n in before:
        if b.alive:
            set_backend_threads(b, n)
