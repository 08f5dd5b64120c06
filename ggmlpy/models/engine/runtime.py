"""What a compiled model owns in ggml: its weights on a backend (``ParamStore``, in ``weights.py``), the
graphs built from its layers for one batch size (``GraphInstance``), a forward-only runner (``Predictor``),
and the ``Runtime`` that holds them with the optimizer's state (``OptimizerState``, in ``optimizer_state.py``).

Ownership: the weights live in one context and one buffer of the model's backend. A training graph
(built for each fit or trainer, freed after) reads them and is run by ggml-opt, which copies the graph
before allocating it, so the graph's own tensors never get memory. A predict graph has its own
scheduler and context, so the scheduler's allocations never leak into another graph.
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Container, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Optional, Protocol, TYPE_CHECKING

import numpy as np

from ...backend.backend import Backend, blas_backend_init, ggml_backend_init_auto
from ...backend.buffer import ggml_backend_alloc_ctx_tensors
from ...backend.transfer import ggml_backend_tensor_get_data, ggml_backend_tensor_set_data
from ...compute.run import ggml_backend_sched_graph_compute
from ...compute.sched import ggml_backend_sched_new, Scheduler
from ...compute.threads import forward_work, restore_threads, split_threads
from ...core.handle import Handle, rpc_connection_lost
from ...core.types import GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32
from ...errors import GgmlInUseError, GgmlStateError, GgmlTypeError, GgmlValueError
from ...graph.context import ggml_graph_overhead, ggml_init, ggml_tensor_overhead
from ...graph.graph import ggml_build_forward_expand, ggml_new_graph_custom
from ...graph.objects import Graph, Tensor
from ...graph.tensor import ggml_new_tensor, ggml_set_input, ggml_set_name, ggml_set_output, pending_constant
from ...ops.elementwise import ggml_cont, ggml_dropout
from ...ops.layout import ggml_permute, ggml_reshape, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d, ggml_view_1d
from ...opt.constants import BUILD_FORWARD
from ...opt.context import training_graph_nodes
from ...opt.loss_scale import DynamicLossScale
from ...training.replicas import split_counts
from ..layers.layer import Layer, NATURAL, natural_ne, SPATIAL
from ..layers.masking import mask_flow
from ..layers.weight import BoundWeight, weight_name
from ..network.model import Model, Node
from ..network.parameters import check_device_can_use, ParamStore
from .dropout_seeds import DropoutSeeds
from .optimizer_state import OptimizerState
from .precision import WeightCasts


if TYPE_CHECKING:
    from ...training.config import StepHook

    # a context manager factory given a scheduler, entered around a compute (compute.placement.PlacementRecorder)
    Watch = Callable[[Scheduler], AbstractContextManager[object]]


# ---------------------------------------------------------------- graphs
# the sample shape of each model input a graph is built for, where the model has variable sizes (None: it has none)
InputShapes = Optional[tuple[tuple[int, ...], ...]]


class LiveTrainer(Protocol):
    """A ``ggml_trainer`` as the runtime keeps it: until freed it holds an optimizer state newer than the model's."""
    @property
    def alive(self) -> bool: ...


class GraphBuilder:
    """Builds one model's ggml graph for one batch size; what layers call while building."""

    def __init__(self, model: Model, params: ParamStore, batch: int, training: bool, logits_for: set[int],
                 rows_for: Container[int] = frozenset(), read_outputs: bool = False,
                 input_shapes: InputShapes = None) -> None:
        inputs, outputs, nodes = model.graph()
        # each node's sample shape in this graph: the model's, or with its variable sizes (None) fixed by the data's
        self.sizes = model.concrete_shapes(input_shapes) if input_shapes is not None else \
            {id(n): n.shape for n in nodes}
        self.read_outputs = read_outputs       # a training graph whose outputs the fit's metrics read after each step
        self.model, self.params, self.batch, self.training = model, params, batch, training
        self.logits_for = logits_for           # ids of output nodes whose final softmax the loss applies
        self.rows_for = rows_for               # ids of output nodes handed to the loss as 2-D [units, rows]
        self.strip_softmax = False
        self.input_mask: Tensor | None = None  # the padding mask of the input of the layer being built (masking.py)
        n = len(nodes)
        self.graph_size = 0
        # tensors the layers create: most make a few dozen, a recurrent layer a few per time step
        budget = 256 + sum(node.layer.graph_tensors([self.sizes[id(i)] for i in node.inputs]) for node in nodes
                           if not node.is_input)
        self.ctx = ggml_init(mem_size=budget * ggml_tensor_overhead(), no_alloc=True)
        self.ctx_io = ggml_init(mem_size=(8 + 4 * n) * ggml_tensor_overhead(), no_alloc=True)
        self.ctx_pinned = ggml_init(mem_size=(4 + 4 * n) * ggml_tensor_overhead(), no_alloc=True)
        self.constants: list[tuple[Tensor, np.ndarray]] = []
        self.seeds = DropoutSeeds(np.random.default_rng(np.random.randint(0, 2 ** 31)))
        n_dropout = sum(node.layer.dropout_seeds() for node in nodes if not node.is_input)
        if training and n_dropout:
            self.seeds.tensor = ggml_set_input(ggml_new_tensor(self.ctx_io, GGML_TYPE_I32, 1, (n_dropout,)))
            ggml_set_name(self.seeds.tensor, "dropout_seeds")
        self.hooks: list[StepHook] = []
        self.side_outputs: list[Tensor] = []  # computed by every training step besides the loss
        self._relu_inputs: dict[int, tuple[Tensor, Tensor]] = {}  # id(relu output) -> (output, input)
        self.notes: list[str] = []  # what a layer built in a slower form than the device allows, and why
        self.casts = WeightCasts(self.ctx, params.backend.device, params.compute_type, self.note)

    # ---- for layers
    def param(self, layer: Layer, weight: BoundWeight | str) -> Tensor:
        return self.params.tensor(layer, weight_name(weight))

    @property
    def half_products(self) -> bool:
        """Whether this graph computes its matrix products in half precision (``ggml_compile(precision=...)``
        and a device that computes them); layers with a fused F32 kernel build their product form then."""
        return self.casts.active

    def product_weight(self, layer: Layer, weight: BoundWeight | str, ne: tuple[int, ...] | None = None) -> Tensor:
        """A weight as the first operand of a matrix product (``ggml_mul_mat(ctx, w, x)``), reshaped to ``ne``
        if given: the F32 weight, or under mixed precision its cast to the compiled type, made once per graph
        (cast after the reshape: the gradient flows back through the cast into the F32 weight, in F32)."""
        w = self.param(layer, weight)
        if ne is not None and tuple(ne) + (1,) * (4 - len(ne)) != tuple(w.shape):
            w = ggml_reshape(self.ctx, w, self.shape_target(ne))
        return self.casts.of(w, (id(layer), weight_name(weight), w.shape))

    def zeros(self, ne: tuple[int, ...]) -> Tensor:
        return self.constant(np.zeros(tuple(reversed(ne)), dtype=np.float32))

    def constant(self, values: np.ndarray) -> Tensor:
        """An F32 tensor (F16 for float16 ``values``) holding ``values`` (numpy order: ggml's shape reversed),
        written once when the graph is allocated (padding zeros, an attention mask)."""
        return pending_constant(self.ctx_io, values, self.constants)

    def shape_target(self, ne: tuple[int, ...]) -> Tensor:
        """A tensor of shape ``ne`` that only tells ggml_reshape / ggml_repeat the shape to make (never computed,
        never allocated)."""
        return ggml_new_tensor(self.ctx, GGML_TYPE_F32, len(ne), ne)

    def dropout(self, x: Tensor, rate: float) -> Tensor:
        """``x`` with inverted dropout at ``rate``: its mask is made on the device from this layer's seed, which
        changes before every training step."""
        seeds = self.seeds
        assert seeds.tensor is not None  # a training graph of a model with dropout has its seeds (__init__)
        seed = ggml_view_1d(self.ctx, seeds.tensor, 1, 4 * seeds.used)
        seeds.used += 1
        return ggml_dropout(self.ctx, x, seed, rate)

    def readout(self, t: Tensor) -> Tensor:
        """A copy of ``t`` in memory of its own, readable after each step (ggml-opt runs a copy of the graph,
        whose intermediate tensors are not readable otherwise)."""
        return ggml_cont(self.ctx_pinned, t)

    def side_output(self, t: Tensor) -> None:
        """Compute ``t`` in every training step although the loss does not depend on it (a ``ggml_cpy`` that
        updates a layer's state on the device: ggml-opt's extra outputs)."""
        self.side_outputs.append(ggml_set_output(t))

    def note_relu(self, out: Tensor, x: Tensor) -> None:
        """``out`` is ``relu(x)``: a layer after it may compute on ``x`` first (a max-pool: relu commutes with it)."""
        self._relu_inputs[id(out)] = (out, x)  # the output kept alive, so its id is not reused

    def note(self, text: str) -> None:
        """Say in the placement report (``Placement.notes``) what this layer built in a slower form than the device
        allows, and why."""
        if text not in self.notes:
            self.notes.append(text)

    def relu_input(self, t: Tensor) -> Tensor | None:
        """``x`` when ``t`` is a ``relu(x)`` that a layer built through ``activate``, else None."""
        entry = self._relu_inputs.get(id(t))
        return entry[1] if entry is not None and entry[0] is t else None

    def on_train_step(self, hook: StepHook) -> None:
        self.hooks.append(hook)

    def step_input(self, ne: tuple[int, ...], name: str, dtype: str = "float32") -> Tensor:
        """An input tensor of shape ``ne`` that a step hook (``on_train_step``) writes before every step: F32, or
        I32 with ``dtype="int32"`` (row indices for ``ggml_get_rows``, which the step's checks read as written)."""
        if dtype not in ("float32", "int32"):
            raise GgmlValueError(f"step_input dtype must be 'float32' or 'int32', got {dtype!r}")
        gtype = GGML_TYPE_I32 if dtype == "int32" else GGML_TYPE_F32
        t = ggml_set_input(ggml_new_tensor(self.ctx_io, gtype, len(ne), ne))
        ggml_set_name(t, name)
        return t

    # ---- layouts
    def convert(self, t: Tensor, shape: tuple[int, ...], src: str, dst: str) -> Tensor:
        """Between the user's orientation (NATURAL) and ggml's image/sequence layout (SPATIAL)."""
        if src == dst or len(shape) == 1:
            return t
        ctx = self.ctx
        if len(shape) == 3:   # (H, W, C): natural [C, W, H, N] <-> spatial [W, H, C, N]
            h, w, c = shape
            if c == 1:
                ne4 = (w, h, 1, self.batch) if dst == SPATIAL else (1, w, h, self.batch)
                return ggml_reshape_4d(ctx, t, *ne4)
            axes = (2, 0, 1, 3) if dst == SPATIAL else (1, 2, 0, 3)
            return ggml_cont(ctx, ggml_permute(ctx, t, *axes))
        steps, c = shape       # (steps, C): natural [C, steps, N] <-> spatial [steps, C, N]
        if c == 1:
            ne = (steps, 1, self.batch) if dst == SPATIAL else (1, steps, self.batch)
            return ggml_reshape_3d(ctx, t, *ne)
        return ggml_cont(ctx, ggml_permute(ctx, t, 1, 0, 2, 3))

    # ---- the graph
    def build(self) -> GraphInstance:
        inputs, outputs, nodes = self.model.graph()
        values: dict[int, dict[str, Tensor]] = {}   # node -> its tensor in each layout made so far
        masks: dict[int, Tensor | None] = {}   # node -> the padding mask of its steps ([1, T, N]), where it has one
        masked = mask_flow(self.model)
        for node in nodes:
            if node.is_input:
                gtype = GGML_TYPE_I32 if node.dtype == "int32" else GGML_TYPE_F32
                ne = natural_ne(self.sizes[id(node)], self.batch)
                t = ggml_set_input(ggml_new_tensor(self.ctx_io, gtype, len(ne), ne))
                ggml_set_name(t, node.name)
                values[id(node)] = {NATURAL: t}
                continue
            layer = node.layer
            xs = [self._value(values, n, layer.layout) for n in node.inputs]
            shapes = [self.sizes[id(n)] for n in node.inputs]
            self.strip_softmax = id(node) in self.logits_for
            self.input_mask = masks.get(id(node.inputs[0])) if node.inputs else None  # only the sequence's (mask_flow)
            fwd = layer.forward if self.training else layer.predict_forward
            out = self._checked(layer, fwd(self, xs, shapes), self.sizes[id(node)])
            values[id(node)] = {layer.out_layout or layer.layout: out}
            if id(node) in masked:
                masks[id(node)] = layer.output_mask(self, self.input_mask, xs, out)
            self.strip_softmax, self.input_mask = False, None
        input_tensors = [values[id(n)][NATURAL] for n in inputs]
        out_tensors = [self._value(values, n, NATURAL) for n in outputs]
        out_tensors = [ggml_reshape_2d(self.ctx, t, self.sizes[id(n)][-1], t.nelements() // self.sizes[id(n)][-1])
                       if id(n) in self.rows_for else t for n, t in zip(outputs, out_tensors)]
        self.output_copies = [self.readout(t) for t in out_tensors] if self.read_outputs else []
        for copy in self.output_copies:
            self.side_output(copy)
        return GraphInstance(self, input_tensors, out_tensors)

    def _checked(self, layer: Layer, out: object, shape: tuple[int, ...]) -> Tensor:
        """A layer's forward result, if it is a tensor of the shape ``output_shape`` said (in the layer's output
        layout, the batch last): a layer class of one's own that disagrees with itself is told so here."""
        what = f"layer '{layer.name}' ({type(layer).__qualname__})"
        if not isinstance(out, Tensor):
            raise GgmlTypeError(f"{what}: forward returned {type(out).__name__}, not a tensor; it must return the "
                                "result of ggmlpy ops on its inputs and weights")
        layout = layer.out_layout or layer.layout
        want: tuple[int, ...]
        if layout == SPATIAL and len(shape) == 3:
            want = (shape[1], shape[0], shape[2], self.batch)        # (H, W, C): [W, H, C, N]
        elif layout == SPATIAL and len(shape) == 2:
            want = (shape[0], shape[1], self.batch)                  # (steps, C): [steps, C, N]
        else:
            want = natural_ne(shape, self.batch)
        got = tuple(out.shape) + (1,) * (4 - len(out.shape))
        if got != tuple(want) + (1,) * (4 - len(want)):
            raise GgmlValueError(f"{what}: forward returned a tensor of ggml shape {tuple(out.shape)}, but its "
                                 f"output_shape says samples of shape {shape}, which in its layout and with a batch "
                                 f"of {self.batch} is {tuple(want)}; make output_shape agree with what forward builds")
        return out

    def _value(self, values: dict, node: Node, layout: str) -> Tensor:
        have = values[id(node)]
        if layout not in have:
            src, t = next(iter(have.items()))
            have[layout] = self.convert(t, self.sizes[id(node)], src, layout)
        return have[layout]


class GraphInstance:
    """A built graph: its input and output tensors, the contexts and buffers behind them, and the
    per-step hooks (dropout seeds) and side outputs (batch-norm statistics)."""

    def __init__(self, b: GraphBuilder, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        self.ctx, self.batch = b.ctx, b.batch
        self.inputs, self.outputs = inputs, outputs
        backend = b.params.backend
        self._owned: list[Handle] = [b.ctx, b.ctx_io, b.ctx_pinned]
        check_device_can_use(backend, list(inputs) + [t for t, _ in b.constants],
                             f"use a smaller batch_size (this graph is for {b.batch} samples), or backend='cpu'")
        for ctx in (b.ctx_io, b.ctx_pinned):
            buf = ggml_backend_alloc_ctx_tensors(ctx, backend)
            if buf is not None:
                self._owned.insert(0, buf)
        for t, values in b.constants:
            ggml_backend_tensor_set_data(t, values)
        self.hooks = ([b.seeds] if b.seeds.tensor is not None else []) + b.hooks
        self.side_outputs = b.side_outputs
        self.output_copies = b.output_copies
        self.notes = b.notes
        # bounds for graph and scheduler sizes
        self.train_nodes = sum(training_graph_nodes(o) for o in outputs) + \
            (training_graph_nodes(self.side_outputs) if self.side_outputs else 0)
        self.forward_nodes = sum(training_graph_nodes(o, BUILD_FORWARD) for o in outputs)
        self.work = forward_work(outputs)  # splits the CPU threads for inference (small graphs: one)

    def free(self) -> None:
        for h in self._owned:
            h.free()
        self._owned.clear()

    close = free


def build_graph(model: Model, params: ParamStore, batch: int, training: bool,
                logits_for: set[int] | None = None, rows_for: set[int] | None = None,
                read_outputs: bool = False, input_shapes: InputShapes = None) -> GraphInstance:
    """The graph of ``model`` for ``batch`` samples (``input_shapes``: the inputs' sample shapes, which fix a model's
    variable sizes; None for a model without them)."""
    return GraphBuilder(model, params, batch, training, logits_for or set(), rows_for or set(), read_outputs,
                        input_shapes).build()


def input_shapes_of(model: Model, arrays: Sequence[np.ndarray]) -> InputShapes:
    """The sample shapes of a model's input arrays (samples first) where the model has variable sizes, else None:
    the key of the graphs built for them."""
    return tuple(tuple(int(d) for d in a.shape[1:]) for a in arrays) if model.variable else None


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
    sched._owned.append(blas)  # freed with the scheduler
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
                inst._owned.append(graph_ctx)
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
        targets = [store.synced_tensors(every=True) for _, store in self.replicas]
        for j, src in enumerate(self.params.synced_tensors(every=True)):
            data = ggml_backend_tensor_get_data(src)
            for tensors in targets:
                ggml_backend_tensor_set_data(tensors[j], data)
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
