"""Building a compiled model's ggml graph for one batch size: ``GraphBuilder`` (what layers call while building:
their weights, products, constants, dropout, layouts) and the ``GraphInstance`` it makes, which owns the graph's
contexts."""
from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Optional, TYPE_CHECKING

import numpy as np

from ...backend.buffer import ggml_backend_alloc_ctx_tensors
from ...backend.transfer import ggml_backend_tensor_set_data
from ...compute.threads import forward_work
from ...core.handle import Handle
from ...core.types import GGML_TYPE_F32, GGML_TYPE_I32
from ...errors import GgmlTypeError, GgmlValueError
from ...graph.context import ggml_init, ggml_tensor_overhead
from ...graph.objects import Tensor
from ...graph.tensor import ggml_new_tensor, ggml_set_input, ggml_set_name, ggml_set_output, pending_constant
from ...ops.elementwise import ggml_add, ggml_cont, ggml_dropout, ggml_scale
from ...ops.layout import (
    ggml_get_rows,
    ggml_permute,
    ggml_reshape,
    ggml_reshape_2d,
    ggml_reshape_3d,
    ggml_reshape_4d,
    ggml_view_1d,
)
from ...ops.linalg import ggml_mul_mat
from ...opt.constants import BUILD_FORWARD
from ...opt.context import training_graph_nodes
from ..layers.fused import device_computes_quantized
from ..layers.layer import Layer, NATURAL, natural_ne, SPATIAL
from ..layers.masking import mask_flow
from ..layers.weight import BoundWeight, weight_name
from ..network.low_rank import adapter_names, adapters
from ..network.model import Model, Node
from ..network.parameters import check_device_can_use, ParamStore
from .dropout_seeds import DropoutSeeds
from .precision import WeightCasts


if TYPE_CHECKING:
    from ...training.config import StepHook


# the sample shape of each model input a graph is built for, where the model has variable sizes (None: it has none)
InputShapes = Optional[tuple[tuple[int, ...], ...]]


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
        constants = sum(node.layer.graph_constants([self.sizes[id(i)] for i in node.inputs]) for node in nodes
                        if not node.is_input)
        self.ctx_io = ggml_init(mem_size=(8 + 4 * n + constants) * ggml_tensor_overhead(), no_alloc=True)
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
        self.adapted: set[tuple[int, str]] = set()   # (layer, weight) of the adapters that went into products

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
        (cast after the reshape: the gradient flows back through the cast into the F32 weight, in F32). A weight
        held quantized is taken as it is, ggml multiplying its blocks directly; but in a training graph on a device
        whose backward pass cannot go through such a product (it lacks ggml_out_prod of the quantized weight: Vulkan,
        CUDA), the graph decodes the frozen weight first (``ggml_get_rows`` of every row, in the graph's own memory)
        and multiplies in F32, so that the whole step stays on the device."""
        w = self.param(layer, weight)
        if ne is not None and tuple(ne) + (1,) * (4 - len(ne)) != tuple(w.shape):
            w = ggml_reshape(self.ctx, w, self.shape_target(ne))
        if w.type != GGML_TYPE_F32:
            device = self.params.backend.device
            if self.training and not device_computes_quantized(device, w.type, "out_prod"):
                rows = self.constant(np.arange(w.shape[1], dtype=np.int32))
                return ggml_get_rows(self.ctx, w, rows)
            return w
        return self.casts.of(w, (id(layer), weight_name(weight), w.shape))

    def product(self, layer: Layer, weight: BoundWeight | str, x: Tensor, ne: tuple[int, ...] | None = None) -> Tensor:
        """``ggml_mul_mat(w, x)`` of the layer's product weight (``product_weight``, reshaped to ``ne`` if given),
        plus, where the layer has a low-rank adapter on it, ``alpha / rank * B (A x)`` (network/low_rank.py)."""
        y = ggml_mul_mat(self.ctx, self.product_weight(layer, weight, ne), x)
        name = weight_name(weight)
        lora = adapters(layer).get(name)
        if lora is None:
            return y
        rank, alpha = lora
        self.adapted.add((id(layer), name))
        a, b = (self.param(layer, n) for n in adapter_names(name))
        low = ggml_mul_mat(self.ctx, b, ggml_mul_mat(self.ctx, a, x))
        return ggml_add(self.ctx, y, ggml_scale(self.ctx, low, alpha / rank))

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
        self._check_adapters_used()
        input_tensors = [values[id(n)][NATURAL] for n in inputs]
        out_tensors = [self._value(values, n, NATURAL) for n in outputs]
        out_tensors = [ggml_reshape_2d(self.ctx, t, self.sizes[id(n)][-1], t.nelements() // self.sizes[id(n)][-1])
                       if id(n) in self.rows_for else t for n, t in zip(outputs, out_tensors)]
        self.output_copies = [self.readout(t) for t in out_tensors] if self.read_outputs else []
        for copy in self.output_copies:
            self.side_output(copy)
        return GraphInstance(self, input_tensors, out_tensors)

    def _check_adapters_used(self) -> None:
        """Every adapter a layer has went into its products (``product``): a layer of one's own that reads an adapted
        weight otherwise (``product_weight``, ``param``) would train and merge an adapter that changes nothing."""
        for layer in self.model.layers:
            unused = [w for w in adapters(layer) if (id(layer), w) not in self.adapted]
            if unused:
                raise GgmlValueError(f"layer '{layer.name}' ({type(layer).__qualname__}) has low-rank adapters on "
                                     f"{unused} but does not multiply them through g.product(self, weight, x) (its "
                                     "forward reads the weight with g.product_weight or g.param), so they would "
                                     "change nothing; read the weight with g.product, or give the adapters other "
                                     "targets (ggml_add_lora(..., targets=...)) after building the model again")

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

    def own(self, handle: Handle) -> None:
        """Free ``handle`` (a context made for this graph) with the graph."""
        self._owned.append(handle)

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
