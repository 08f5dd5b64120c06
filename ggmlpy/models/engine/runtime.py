"""What a compiled model owns in ggml: its weights on a backend (``ParamStore``, in ``network/parameters.py``),
the graphs built from its layers for one batch size (``GraphInstance``, in ``graphs.py``), a forward-only runner
(``Predictor``), and the ``Runtime`` that holds them with the optimizer's state (``OptimizerState``, in
``optimizer_state.py``).

Ownership: the weights live in one context and one buffer of the model's backend. A training graph
(built for each fit or trainer, freed after) reads them and is run by ggml-opt, which copies the graph
before allocating it, so the graph's own tensors never get memory. A predict graph has its own
scheduler and context, so the scheduler's allocations never leak into another graph.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Protocol, TYPE_CHECKING

import numpy as np

from ...backend.backend import Backend, blas_backend_init, ggml_backend_init_auto
from ...backend.transfer import ggml_backend_tensor_get_data, ggml_backend_tensor_set_data
from ...compute.run import ggml_backend_sched_graph_compute
from ...compute.sched import ggml_backend_sched_new, Scheduler
from ...compute.threads import restore_threads, split_threads
from ...core.handle import rpc_connection_lost
from ...core.types import GGML_TYPE_F16, GGML_TYPE_F32
from ...errors import GgmlInUseError, GgmlStateError, GgmlValueError
from ...graph.context import ggml_graph_overhead, ggml_init
from ...graph.graph import ggml_build_forward_expand, ggml_new_graph_custom
from ...graph.objects import Graph
from ...graph.tensor import ggml_set_output
from ...opt.loss_scale import DynamicLossScale
from ...training.replicas import split_counts
from ..network.model import Model
from ..network.parameters import ParamStore
from .graphs import build_graph, GraphInstance, input_shapes_of, InputShapes
from .optimizer_state import OptimizerState


if TYPE_CHECKING:
    # a context manager factory given a scheduler, entered around a compute (compute.placement.PlacementRecorder)
    Watch = Callable[[Scheduler], AbstractContextManager[object]]


class LiveTrainer(Protocol):
    """A ``ggml_trainer`` as the runtime keeps it: until freed it holds an optimizer state newer than the model's."""
    @property
    def alive(self) -> bool: ...



def make_scheduler(backend: Backend, graph_nodes: int) -> Scheduler:
    """A scheduler of its own over the model's backend (and the CPU as fallback), sized for the graph."""
    size = max(2048, 2 * graph_nodes + 256)
    blas = blas_backend_init() if backend.is_cpu else None  # the large matrix products go to OpenBLAS
    if blas is None:
        return ggml_backend_sched_new([backend], parallel=False, graph_size=size)
    try:
        sched = ggml_backend_sched_new([blas, backend], parallel=False, graph_size=size)
    except BaseException:
        blas.free()
        raise
    sched.own(blas)  # freed with the scheduler
    return sched


class Predictor:
    """Forward passes of a model with given weights: one inference graph per batch size, on a
    scheduler of its own. Calls from several threads take turns: a pass writes the graph's inputs,
    computes and reads its outputs as one step, and a graph is only dropped between passes."""

    def __init__(self, model: Model, params: ParamStore) -> None:
        self.model, self.params = model, params
        self._graphs: dict[tuple[int, InputShapes], tuple[GraphInstance, Graph, Scheduler]] = {}
        self._lock = threading.RLock()

    def run(self, arrays: list[np.ndarray], batch: int, watch: Watch | None = None) -> list[np.ndarray]:
        """``arrays``: one per model input, exactly ``batch`` rows in ggml layout; returns one per output.
        ``watch``: a context manager factory given the scheduler, entered around the compute (a
        ``PlacementRecorder``)."""
        with self._lock:
            inst, graph, sched = self._graph(batch, input_shapes_of(self.model, arrays))
            for t, a in zip(inst.inputs, arrays):
                ggml_backend_tensor_set_data(t, a)
            before = split_threads(sched.backends, inst.work)
            try:
                with watch(sched) if watch is not None else contextlib.nullcontext():
                    ggml_backend_sched_graph_compute(sched, graph)
            finally:
                restore_threads(before)  # a fit may be running on the same backend
            return [ggml_backend_tensor_get_data(o) for o in inst.outputs]

    def _graph(self, batch: int, shapes: InputShapes):
        key = (batch, shapes)
        if key not in self._graphs:
            if len(self._graphs) >= 4:  # keep a few sizes (the last partial batch of each call adds one)
                self._drop(next(iter(self._graphs)))
            inst = build_graph(self.model, self.params, batch, training=False, input_shapes=shapes)
            try:
                size = max(2048, inst.forward_nodes)
                graph_ctx = ggml_init(mem_size=ggml_graph_overhead(size) + 1024, no_alloc=True)
                inst.own(graph_ctx)
                graph = ggml_new_graph_custom(graph_ctx, size, False)
                for o in inst.outputs:
                    ggml_set_output(o)
                    ggml_build_forward_expand(graph, o)
                sched = make_scheduler(self.params.backend, inst.forward_nodes)
            except BaseException:
                inst.free()
                raise
            self._graphs[key] = (inst, graph, sched)
        return self._graphs[key]

    def _drop(self, key: tuple[int, InputShapes]) -> None:
        inst, _, sched = self._graphs.pop(key)
        sched.free()
        inst.free()

    def free(self) -> None:
        with self._lock:
            for key in list(self._graphs):
                self._drop(key)


class ReplicaPredictor:
    """Forward passes of a model compiled on several devices: each batch is cut as training cuts it (by the
    replicas' shares), the replicas run at the same time and their outputs are put back in order."""

    def __init__(self, predictors: list[Predictor], shares: list[float]) -> None:
        self.predictors, self.shares = predictors, shares
        self._pool = ThreadPoolExecutor(len(predictors) - 1, thread_name_prefix="ggmlpy-replica")

    def run(self, arrays: list[np.ndarray], batch: int, watch: Watch | None = None) -> list[np.ndarray]:
        counts = split_counts(batch, self.shares)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        jobs = [(p, [a[s:s + n] for a in arrays], n) for p, s, n in zip(self.predictors, starts, counts) if n]
        futures = [self._pool.submit(p.run, part, n) for p, part, n in jobs[1:]]
        failure: BaseException | None = None
        try:
            outs = [jobs[0][0].run(jobs[0][1], jobs[0][2], watch)]
        finally:
            for f in futures:  # every replica finishes before this returns or raises
                failure = failure or f.exception()
        if failure is not None:
            raise failure
        outs += [f.result() for f in futures]
        return [np.concatenate([o[i].reshape(n, -1) for o, (_, _, n) in zip(outs, jobs)])
                for i in range(len(outs[0]))]

    def free(self) -> None:
        self._pool.shutdown(wait=True)
        for p in self.predictors:
            p.free()


class Runtime:
    """A compiled model's backend, weights and predictor. ``use()`` marks it busy for the length of a
    call (a fit, a prediction), ``use(training=True)`` also marks it training: freeing it then (from a
    callback, a generator or another thread) is refused instead of pulling the weights out from under
    ggml, and so is changing which layers train while a fit runs."""

    def __init__(self, model: Model, backend: str | list[str], values: dict | None = None,
                 shares: list[float] | None = None, compute_type: int = GGML_TYPE_F32) -> None:
        self._lock = threading.Lock()
        self._busy = 0
        self._training = 0
        self._trainers: weakref.WeakSet = weakref.WeakSet()  # ggml_trainers made on these weights
        self.graph_notes: list[str] = []  # the last training graph's notes (GraphBuilder.note)
        names = list(backend) if isinstance(backend, (list, tuple)) else [backend]
        self.backend = ggml_backend_init_auto(names[0])
        # data parallel: replicas 1..K-1, each a backend and a private copy of the weights, which follow the
        # model's own store (replica 0): copied from it before each use, back from the optimizer after each step
        self.replicas: list[tuple[Backend, ParamStore]] = []
        self.shares = list(shares) if shares is not None else [1.0] * len(names)
        try:
            self.params = ParamStore(model.layers, self.backend, values)
            for name in names[1:]:
                b = ggml_backend_init_auto(name)
                try:
                    used = [self.backend.device.name] + [r.device.name for r, _ in self.replicas]
                    if b.device.name in used:
                        raise GgmlValueError(f"backend={names!r} names device {b.device.name} twice; each replica "
                                             "needs a device of its own (ggml_backend_devices() lists them)")
                    self.replicas.append((b, ParamStore(model.layers, b, self.params.values_by_layer(), share=False)))
                except BaseException:
                    b.free()
                    raise
        except BaseException:
            self._free_replicas()
            if getattr(self, "params", None) is not None:
                self.params.free()
            self.backend.free()
            raise
        for store in [self.params] + [r for _, r in self.replicas]:
            store.compute_type = compute_type
        self.loss_scale = DynamicLossScale() if compute_type == GGML_TYPE_F16 else None  # F16: kept across fits
        self._synced: int | None = self.params.stamp
        self.predictor: Predictor | ReplicaPredictor = Predictor(model, self.params)
        if self.replicas:
            self.predictor = ReplicaPredictor([self.predictor] + [Predictor(model, p) for _, p in self.replicas],
                                              self.shares)
        self.opt_state = OptimizerState(self.params)  # a new runtime (ggml_compile) starts the optimizer afresh
        self.device_name = self.backend.device.name
        self.device_names = [self.device_name] + [b.device.name for b, _ in self.replicas]
        # a model dropped without being compiled again still leaves its layers their weights (Keras keeps them
        # in the layers): when this runtime is collected, the store hands them on and frees itself. Not at
        # exit, where the process takes the memory back. The replicas' copies go with it.
        self._release = weakref.finalize(self, _dropped, self.params, self.replicas)
        self._release.atexit = False

    @contextlib.contextmanager
    def use(self, training: bool = False):
        """This runtime marked in use (``training``: by a fit) for the block: ``free()`` is refused meanwhile.
        Code that starts from a model uses ``model_in_use(model)``, which cannot mark a runtime being replaced."""
        self.mark(training)
        yield from self._held(training)

    def mark(self, training: bool) -> None:
        with self._lock:
            if not self.params.alive:
                raise GgmlStateError("the model's weights have been freed (compiled again or changed?)")
            self._busy += 1
            self._training += training
            self.params.fits_running += training

    def _held(self, training: bool):
        try:
            self.sync_replicas()
            yield self
        finally:
            with self._lock:
                self._busy -= 1
                self._training -= training
                self.params.fits_running -= training
                if training:  # the layers' newest weights are these now (and every replica's)
                    self.replicas_in_step()

    def readable(self) -> ParamStore:
        """The store the weights are read from: the model's own; or, once its device's RPC server stopped answering,
        a replica's on a local device, which the optimizer sends the weights after every step (data parallel)."""
        if self.replicas and self.backend.is_rpc and rpc_connection_lost():
            for backend, store in self.replicas:
                if not backend.is_rpc:
                    return store
        return self.params

    def stores(self) -> list[ParamStore]:
        """The weights of each replica, the model's own first (one store without data parallelism)."""
        return [self.params] + [p for _, p in self.replicas]

    def sync_replicas(self) -> None:
        """Copy the model's weights to the other replicas when they changed since the last copy (a fit, a
        ``ggml_set_weights``, a load)."""
        if not self.replicas or self._synced == self.params.stamp:
            return
        for layer, spec in self.params.specs:   # as held: a quantized weight's bytes, decoded where a replica's
            value = self.params.value(layer, spec.name)   # device holds it in F32
            for _, store in self.replicas:
                store.write(layer, spec.name, value)
        self._synced = self.params.stamp

    def replicas_in_step(self) -> None:
        """The model's weights changed by data-parallel steps, which sent them to every replica too; weights written
        since the last step's copy (a callback's ggml_set_weights after the last step) still go to the replicas at
        the next use."""
        written_since = self._synced != self.params.stamp
        self.params.touch()
        self._synced = None if written_since else self.params.stamp

    def _free_replicas(self) -> None:
        for b, store in self.replicas:
            store.free()
            b.free()
        self.replicas.clear()

    def add_trainer(self, trainer: LiveTrainer) -> None:
        self._trainers.add(trainer)

    def live_trainers(self) -> list:
        """The trainers of this model not yet freed: each holds an optimizer state newer than ``opt_state``."""
        return [t for t in list(self._trainers) if t.alive]

    @property
    def training(self) -> bool:
        """Whether a fit is running on this model now."""
        return self._training > 0

    def free(self) -> None:
        with self._lock:
            if self._busy:
                raise GgmlInUseError("the model is in use by a running fit or prediction (this call comes from one "
                                     "of its callbacks or generators, or from another thread); compile or change "
                                     "the model after that call returns (a callback can stop a fit with "
                                     "state.stop = True)")
            self.predictor.free()
            self._release.detach()
            self._free_replicas()
            self.params.free()
            self.backend.free()


# held while a compile replaces a model's runtime and while a caller reads one and marks it in use: without it a
# thread could read the old runtime just as a compile in another thread freed it, and fail as freed weights
_SWAPS = threading.Lock()


def replace_runtime(model: Model, runtime: Runtime, config: object) -> None:
    """Free the model's runtime (GgmlInUseError, and nothing changes, while it is in use) and set ``runtime``
    and its compile settings ``config``."""
    with _SWAPS:
        if model.runtime is not None:
            model.runtime.free()
        model.runtime, model.compiled = runtime, config


@contextlib.contextmanager
def model_in_use(model: Model, training: bool = False):
    """The model's current runtime, marked in use for the block (``training``: by a fit)."""
    with _SWAPS:
        runtime = model.runtime
        if runtime is None:
            raise GgmlStateError(f"model '{model.name}' is not compiled; call ggml_compile(model) first")
        runtime.mark(training)
    yield from runtime._held(training)


def _dropped(params: ParamStore, replicas: list) -> None:
    """What a runtime collected without ``free()`` releases: its weights (handed to the layers first) and the
    replicas' copies and backends."""
    params.free()
    for backend, store in replicas:
        store.free()
        backend.free()
    replicas.clear()
