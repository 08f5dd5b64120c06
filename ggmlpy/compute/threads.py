"""The thread policy: how the user's threads are split between ggml's CPU backend and BLAS for one graph, from
the graph's work (measured thresholds in docs/guide/threads.md).
"""
from __future__ import annotations


from .._ffi import lib
from .work import StepWork
from ..backend.backend import Backend, ggml_get_n_threads, is_blas, set_backend_threads, threads_set_by_user
from ..core import openblas
from ..core.library import uses_openmp



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
