"""Models as graphs of layer applications: ``Node`` (a symbolic tensor of the functional API),
``Model`` (functional: inputs and outputs) and ``Sequential`` (a list of layers), with the
summary, layer lookup, freezing and the architecture description saved with a model.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NoReturn, TYPE_CHECKING

import numpy as np

from ...errors import GgmlStateError, GgmlTypeError, GgmlValueError
from ..layers import basic
from ..layers.layer import give_automatic_name, is_variable, Layer, LayerOptions, next_global_name, sample_shape
from ..layers.masking import masks_output


if TYPE_CHECKING:
    from typing_extensions import Unpack


DTYPES = ("float32", "int32")


class InputLayer(Layer):
    """Where data enters: one sample's ``shape`` and ``dtype`` ("float32", or "int32" for token ids)."""
    kind = "input"
    builder_functions = False  # ggml_input (builders.py) makes it

    def __init__(self, shape: int | Sequence[int], dtype: str = "float32", **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.shape = sample_shape(shape, "shape", variable=True)
        if dtype not in DTYPES:
            raise GgmlValueError(f"dtype must be 'float32' or 'int32', got {dtype!r}")
        self.dtype = dtype


class Node:
    """The output of a layer applied to nodes (or of an input): a per-sample ``shape``."""
    __slots__ = ("layer", "inputs", "shape", "dtype")
    layer: Layer
    inputs: tuple[Node, ...]
    shape: tuple[int, ...]
    dtype: str

    def __init__(self, layer: Layer, inputs: list[Node], shape: tuple[int, ...], dtype: str = "float32") -> None:
        for key, value in (("layer", layer), ("inputs", tuple(inputs)), ("shape", tuple(shape)), ("dtype", dtype)):
            object.__setattr__(self, key, value)

    def __setattr__(self, key: str, value: object) -> None:
        # A node is a fact about how it was made; edited inputs could close a cycle or skip a shape check.
        raise GgmlStateError(f"a node cannot be changed ({key}); apply layers to nodes to make new ones")

    def __delattr__(self, key: str) -> None:
        self.__setattr__(key, None)

    def __reduce__(self) -> tuple:
        return Node, (self.layer, self.inputs, self.shape, self.dtype)

    # Keras' arithmetic on symbolic tensors: nodes combine through merge layers (the layer the functional API
    # would add), so ``a + b`` is ``ggml_layer_add([a, b])``; numpy defers to these (``array + node`` is refused
    # here, not broadcast element by element)
    __array_ufunc__ = None

    def __add__(self, other: object) -> Node:
        return self._merged(other, basic.Add, "+")

    def __sub__(self, other: object) -> Node:
        return self._merged(other, basic.Subtract, "-")

    def __mul__(self, other: object) -> Node:
        return self._merged(other, basic.Multiply, "*")

    def __radd__(self, other: object) -> Node:   # a constant + node (a node + node calls __add__)
        if type(other) is int and other == 0:      # sum([a, b]) starts from 0
            return self
        return self._merged(other, basic.Add, "+")

    def __rsub__(self, other: object) -> Node:
        return self._merged(other, basic.Subtract, "-")

    def __rmul__(self, other: object) -> Node:
        return self._merged(other, basic.Multiply, "*")

    def _merged(self, other: object, cls: type[Layer], symbol: str) -> Node:
        if not isinstance(other, Node):
            constant = "ggml_layer_rescaling(node, c)" if symbol == "*" else \
                "ggml_layer_rescaling(node, 1.0, offset=c)" if symbol == "+" else \
                "ggml_layer_rescaling(node, 1.0, offset=-c) (node - c) or ggml_layer_rescaling(node, -1.0, offset=c) " \
                "(c - node)"
            hint = f"; for a number c: {constant}" if isinstance(other, (int, float)) else ""
            raise GgmlTypeError(f"node {symbol} {type(other).__name__}: node arithmetic combines two nodes (a merge "
                                f"layer: ggml_layer_{cls.kind}){hint}; for anything else write a custom layer "
                                "(ggml_custom_layer) or a Layer subclass")
        return apply_layer(default_name(cls()), [self, other])

    def _unsupported(self, what: str, instead: str) -> NoReturn:
        raise GgmlTypeError(f"{what}: node arithmetic has +, - and * of two nodes (merge layers); {instead}")

    def __truediv__(self, other: object) -> NoReturn:
        self._unsupported("node / ...", "to divide, write a custom layer with ggml_div (ggml_custom_layer), or for "
                                        "a number c ggml_layer_rescaling(node, 1 / c)")

    __rtruediv__ = __truediv__

    def __neg__(self) -> NoReturn:
        self._unsupported("-node", "to negate: ggml_layer_rescaling(node, -1.0)")

    def __matmul__(self, other: object) -> NoReturn:
        self._unsupported("node @ ...", "a product with weights is ggml_layer_dense; of two nodes, write a custom "
                                        "layer with ggml_mul_mat (ggml_custom_layer)")

    __rmatmul__ = __matmul__

    def __abs__(self) -> NoReturn:
        self._unsupported("abs(node)", "write a custom layer with ggml_abs (ggml_custom_layer)")

    def __pow__(self, other: object) -> NoReturn:
        self._unsupported("node ** ...", "write a custom layer (ggml_custom_layer: ggml_sqr, ggml_sqrt, ...)")

    @property
    def is_input(self) -> bool:
        return isinstance(self.layer, InputLayer)

    @property
    def name(self) -> str:
        """The name of the node's layer (every layer of a model is named when it is applied: ``default_name``)."""
        name = self.layer.name
        if name is None:
            raise GgmlStateError(f"internal: an unnamed {self.layer.kind} layer in a model; please report it")
        return name

    def __repr__(self) -> str:
        return f"<Node {self.layer.name} shape=(None, {', '.join(map(str, self.shape))})>"


def check_input_dtypes(layer: Layer, dtypes: list[str]) -> None:
    """Token ids (int32) go to a layer that reads them (an embedding, a layer of one's own that says so) and
    nowhere else."""
    if layer.takes_int == "either":
        return
    int_in = "int32" in dtypes
    if int_in and not layer.takes_int:
        raise GgmlTypeError(f"layer '{layer.name}' ({layer.kind}) cannot read int32 token ids; put an embedding "
                            "layer first (a Layer subclass of one's own that reads ids declares takes_int = True)")
    if layer.takes_int is True and not int_in:
        raise GgmlTypeError(f"layer '{layer.name}' ({layer.kind}) reads int32 token ids: give it "
                            "ggml_input(shape, dtype='int32') (in a sequential model: make it the first layer)")


def apply_layer(layer: Layer, inputs: Node | Sequence[Node]) -> Node:
    """``layer`` applied to ``inputs`` (a node, or a list for add/concatenate): a new node."""
    if layer.__dict__.get("_wrapped"):
        raise GgmlValueError(f"layer '{layer.name}' is wrapped (time_distributed, bidirectional): its weights are the "
                             "wrapper's; apply the wrapper, or a new layer object")
    given: list[object] = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    nodes: list[Node] = []
    for n in given:
        if not isinstance(n, Node):
            raise GgmlTypeError(f"layer '{layer.name}' must be applied to a node (from ggml_input or a layer), "
                                f"got {type(n).__name__}")
        nodes.append(n)
    if layer.many_inputs != "either" and layer.many_inputs != (isinstance(inputs, (list, tuple))):
        raise GgmlTypeError(f"{layer.kind} takes {'a list of nodes' if layer.many_inputs else 'one node'}")
    check_input_dtypes(layer, [n.dtype for n in nodes])
    if layer.input_shape is not None and tuple(layer.input_shape) != tuple(nodes[0].shape):
        raise GgmlValueError(f"layer '{layer.name}' has input_shape={tuple(layer.input_shape)} but is applied to a "
                             f"node of shape {tuple(nodes[0].shape)}; input_shape is for the first layer of a "
                             "sequential model (leave it out here)")
    shape = layer.build([n.shape for n in nodes])
    return Node(layer, nodes, shape)


def _topological(outputs: list[Node]) -> list[Node]:
    order: list[Node] = []
    state: dict[int, int] = {}
    for root in outputs:
        stack = [(root, False)]
        while stack:
            node, done = stack.pop()
            key = id(node)
            if done:
                if state.get(key) != 2:
                    state[key] = 2
                    order.append(node)
                continue
            if state.get(key):
                continue
            state[key] = 1
            stack.append((node, True))
            stack.extend((n, False) for n in reversed(node.inputs) if not state.get(id(n)))
    return order


# Keras' model methods and the ggmlpy functions that do their work (ggmlR's functional style: model first)
KERAS_METHODS = {
    "fit": "ggml_fit(model, x, y, ...)", "predict": "ggml_predict(model, x)",
    "evaluate": "ggml_evaluate(model, x, y)", "compile": "ggml_compile(model, optimizer=..., loss=...)",
    "save": "ggml_save_model(model, path)",
    "get_weights": "ggml_get_weights(model)", "set_weights": "ggml_set_weights(model, weights)",
    "save_weights": "ggml_save_weights(model, path)", "load_weights": "ggml_load_weights(model, path)",
    "get_layer": "ggml_get_layer(model, name)", "pop": "ggml_pop_layer(model)",
    "train_on_batch": "ggml_trainer(model).step(x, y)", "add": "ggml_layer_dense(model, ...) (a ggml_layer_* call)",
    "test_on_batch": "ggml_trainer(model).eval(x, y)", "predict_on_batch": "ggml_predict(model, x)",
    "count_params": "ggml_model_summary(model) (its params lines), or sum(w.size for w in "
                    "ggml_get_weights(model).values())",
    "to_json": "ggml_save_model(model, path) (the architecture and weights in one GGUF file)",
    "get_config": "ggml_save_model(model, path) (the architecture and weights in one GGUF file)",
}


class Model:
    """A functional model: ``inputs`` and ``outputs`` nodes and the layers between them."""
    sequential = False

    if not TYPE_CHECKING:  # (for the type checker, a model has only the attributes it declares)
        def __getattr__(self, name: str) -> NoReturn:
            """Keras' methods (``model.fit``, ``model.predict``, ...) are ggmlpy functions taking the model first:
            the AttributeError says which."""
            if name in KERAS_METHODS:
                raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}': ggmlpy's models are "
                                     f"used through functions, as in ggmlR (model first): {KERAS_METHODS[name]}")
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __init__(self, inputs: Node | Sequence[Node], outputs: Node | Sequence[Node], name: str | None = None) -> None:
        self.name = name or "model"
        self._set_graph(_node_list(inputs, "inputs"), _node_list(outputs, "outputs"))
        # set by ggml_compile (typed Any: their modules import this one): compile.CompileConfig, and
        # runtime.Runtime, the weights on a backend
        self.compiled: Any = None
        self.runtime: Any = None

    def _set_graph(self, inputs: list[Node], outputs: list[Node]) -> None:
        for n in inputs:
            if not n.is_input:
                raise GgmlValueError(f"model inputs must come from ggml_input, got the output of '{n.layer.name}'")
        for i, n in enumerate(inputs):
            if any(n is m for m in inputs[:i]):
                raise GgmlValueError(f"input '{n.layer.name}' is listed twice among the model's inputs: each input "
                                     "takes one array, so one of the two would be ignored; list it once")
        nodes = _topological(outputs)
        missing = [n for n in nodes if n.is_input and all(n is not i for i in inputs)]
        if missing:
            raise GgmlValueError(f"the outputs depend on input '{missing[0].layer.name}', which is not among the "
                                 "model's inputs")
        unused = [i for i in inputs if all(n is not i for n in nodes)]
        if unused:
            raise GgmlValueError(f"input '{unused[0].layer.name}' is not connected to any output; remove it from "
                                 "the model's inputs or use it")
        self.inputs, self.outputs, self.nodes = inputs, outputs, nodes
        layers: list[Layer] = []
        for n in nodes:
            if not n.is_input and all(n.layer is not layer for layer in layers):
                layers.append(n.layer)
        names = [layer.name for layer in layers]
        dup = next((x for x in names if names.count(x) > 1), None)
        if dup is not None:
            raise GgmlValueError(f"two different layers of the model are named '{dup}', and a layer's name names its "
                                 f"weights ('{dup}.weight'), so they must be unique; name the layers when making them "
                                 "(name=...). Automatic names count per sequential model (and a loaded model keeps "
                                 "its names), so layers taken from two such models ('dense_1' in each) need names of "
                                 "their own")
        self._layers = layers

    @property
    def layers(self) -> list[Layer]:
        return list(self._layers)

    @property
    def input_shape(self) -> tuple | list[tuple]:
        """Keras' ``model.input_shape``: ``(None, *one sample's shape)``, None for the batch (and for a variable
        size); a list for several inputs."""
        shapes = [(None, *n.shape) for n in self.graph()[0]]
        return shapes[0] if len(shapes) == 1 else shapes

    @property
    def output_shape(self) -> tuple | list[tuple]:
        """Keras' ``model.output_shape``, as ``input_shape``."""
        shapes = [(None, *n.shape) for n in self.graph()[1]]
        return shapes[0] if len(shapes) == 1 else shapes

    def graph(self) -> tuple[list[Node], list[Node], list[Node]]:
        """(inputs, outputs, nodes in topological order)."""
        return self.inputs, self.outputs, self.nodes

    @property
    def variable(self) -> bool:
        """Whether an input has a variable size (None): the data of each call fixes it, and each size gets graphs of
        its own."""
        return any(is_variable(n.shape) for n in self.graph()[0])

    def concrete_shapes(self, input_shapes: Sequence[tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
        """Each node's sample shape (by the node's id) for inputs of ``input_shapes``, the data's (each variable size
        fixed by it)."""
        inputs, _, nodes = self.graph()
        shapes = {id(n): tuple(int(d) for d in s) for n, s in zip(inputs, input_shapes)}
        for n in nodes:
            if not n.is_input:
                shapes[id(n)] = tuple(n.layer.output_shape([shapes[id(i)] for i in n.inputs]))
            got = shapes[id(n)]
            if len(got) != len(n.shape) or any(d is not None and d != c for d, c in zip(n.shape, got)):
                raise GgmlValueError(f"layer '{n.name}' makes samples of shape {got} for inputs of shapes "
                                     f"{[tuple(s) for s in input_shapes]}, where it was built for {n.shape}; give "
                                     "inputs of the sizes the model was built for (None is the size that may vary)")
        return shapes

    def invalidate(self) -> None:
        """The layer list changed: compiled state must be rebuilt; the layers carry their weights to the
        next ``ggml_compile`` (freeing the runtime leaves them a copy)."""
        if self.runtime is not None:
            self.runtime.free()
        self.runtime = None
        self.compiled = None

    # ---- description
    def architecture(self) -> dict:
        inputs, outputs, nodes = self.graph()
        layers = self.layers
        index = {id(n): i for i, n in enumerate(nodes)}
        return {"class": "functional", "name": self.name, "layers": [layer.full_config() for layer in layers],
                "nodes": [{"layer": n.layer.full_config() if n.is_input else
                           next(i for i, layer in enumerate(layers) if layer is n.layer),
                           "inputs": [index[id(i)] for i in n.inputs]} for n in nodes],
                "inputs": [index[id(n)] for n in inputs], "outputs": [index[id(n)] for n in outputs]}

    def summary(self) -> str:
        inputs, outputs, nodes = self.graph()
        rows = [("Layer (type)", "Output Shape", "Param #")]
        for n in nodes:
            params = n.layer.n_params() + sum(int(np.prod(p.ne)) for p in (n.layer.params or []) if not p.trainable)
            rows.append((f"{n.layer.name} ({n.layer.kind})", "(None, " + ", ".join(map(str, n.shape)) + ")",
                         f"{params:,}"))
        widths = [max(len(r[i]) for r in rows) + 2 for i in range(3)]
        rule = "=" * sum(widths)
        lines = [f'Model: "{self.name}" ({"sequential" if self.sequential else "functional"})', rule,
                 "".join(c.ljust(w) for c, w in zip(rows[0], widths)), rule]
        lines += ["".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows[1:]]
        total = sum(layer.n_params() + sum(int(np.prod(p.ne)) for p in (layer.params or []) if not p.trainable)
                    for layer in self.layers)
        trainable = sum(layer.n_params(trainable_only=True) for layer in self.layers)
        devices = " + ".join(self.runtime.device_names) if self.runtime is not None else ""
        lines += [rule, f"Total params: {total:,}", f"Trainable params: {trainable:,}",
                  f"Non-trainable params: {total - trainable:,}",
                  f"Compiled: {'yes, on ' + devices if self.runtime is not None else 'no'}"
                  + (" (data parallel)" if self.runtime is not None and len(self.runtime.device_names) > 1 else "")]
        return "\n".join(lines)

    def __str__(self) -> str:
        try:
            return self.summary()
        except (GgmlValueError, GgmlStateError, GgmlTypeError) as exc:  # an incomplete model still prints
            return f"<{type(self).__name__} '{self.name}' (incomplete: {exc})>"

    def __repr__(self) -> str:
        return f"<{'Sequential' if self.sequential else 'Model'} '{self.name}' with {len(self.layers)} layers>"


class Sequential(Model):
    """A stack of layers, each applied to the previous one's output; the first takes ``input_shape``."""
    sequential = True

    def __init__(self, layers: Iterable[Layer] = (), name: str | None = None) -> None:
        self.name = name or "sequential"
        self._stack: list[Layer] = []
        self._built: tuple | None = None
        self.compiled = None
        self.runtime = None
        for layer in layers:
            self.add(layer)

    def add(self, layer: Layer) -> Sequential:
        if not isinstance(layer, Layer) or isinstance(layer, InputLayer):
            raise GgmlTypeError(f"a sequential model takes layers, got {type(layer).__name__}")
        if layer.many_inputs is True:
            raise GgmlTypeError(f"{layer.kind} joins several nodes: use it in a functional model (ggml_model)")
        if any(layer is each for each in self._stack):
            raise GgmlValueError(f"layer '{layer.name}' is already in this model")
        if layer.name is None:
            k = 1 + sum(each.kind == layer.kind for each in self._stack)
            give_automatic_name(layer, f"{layer.kind}_{k}")
        if any(each.name == layer.name for each in self._stack):
            raise GgmlValueError(f"the model already has a layer named '{layer.name}'")
        if self._stack and layer.input_shape is not None:
            raise GgmlValueError(f"input_shape is for the first layer only; layer '{layer.name}' is not first")
        self._check_fits(layer)
        self.invalidate()
        self._stack.append(layer)
        self._built = None
        return self

    def _check_fits(self, layer: Layer) -> None:
        """Refuse a layer that cannot follow the others (a kernel larger than its input, a flatten missing, token
        ids for a layer after the first, a padding mask it cannot honour) when it is added, not at compile: its
        shapes are checked on a copy, so a refused layer stays unbuilt."""
        if self._stack:
            check_input_dtypes(layer, ["float32"])   # every layer outputs float32: ids only reach the first
            masked = False
            for each in self._stack:
                masked = masks_output(each, [0] if masked else [])
            masks_output(layer, [0] if masked else [])
        first = self._stack[0] if self._stack else layer
        if first.input_shape is None:
            return  # no shapes yet: checked once the first layer's input_shape is known (at compile)
        shape = first.input_shape
        for each in self._stack:
            shape = each.shape_of([shape])
        if layer.built_for is not None and [shape] != layer.built_for:
            raise GgmlValueError(f"layer '{layer.name}' was built for input shape(s) {layer.built_for}, and here it "
                                 f"would take {shape}; a layer added to a second model needs inputs of one shape")
        layer.shape_of([shape])   # (with a variable size, its weights are checked there)
        if layer.built_for is None and not is_variable(shape):
            layer.make_params([shape])   # its weights for this input (a normalization's statistics), then dropped

    def pop(self) -> Layer:
        if not self._stack:
            raise GgmlValueError("the model has no layer to pop")
        self.invalidate()
        layer = self._stack.pop()
        self._built = None
        return layer

    @property
    def layers(self) -> list[Layer]:
        return list(self._stack)

    def graph(self):
        if self._built is None:
            if not self._stack:
                raise GgmlValueError("the sequential model has no layers yet")
            first = self._stack[0]
            if first.input_shape is None:
                raise GgmlValueError(f"layer '{first.name}' ({first.kind}) is the first layer of the sequential "
                                     "model and needs input_shape=(...) (one sample's shape, no batch axis)")
            dtype = "int32" if first.takes_int is True else "float32"
            node = Node(InputLayer(first.input_shape, dtype, name="input"), [], first.input_shape, dtype)
            inputs = [node]
            for layer in self._stack:
                node = apply_layer(layer, node)
            self._built = (inputs, [node], _topological([node]))
        return self._built

    @property
    def inputs(self):
        return self.graph()[0]

    @property
    def outputs(self):
        return self.graph()[1]

    @property
    def nodes(self):
        return self.graph()[2]

    def architecture(self) -> dict:
        return {"class": "sequential", "name": self.name, "layers": [layer.full_config() for layer in self._stack],
                "input_shape": list(self._stack[0].input_shape) if self._stack and self._stack[0].input_shape
                else None}


def _node_list(value: object, what: str) -> list[Node]:
    given: list[object] = list(value) if isinstance(value, (list, tuple)) else [value]
    if not given:
        raise GgmlValueError(f"{what}: expected at least one node")
    nodes: list[Node] = []
    for n in given:
        if not isinstance(n, Node):
            raise GgmlTypeError(f"{what} must be nodes (from ggml_input or ggml_layer_* on a node), "
                                f"got {type(n).__name__}")
        nodes.append(n)
    return nodes


def default_name(layer: Layer) -> Layer:
    """Layers made outside a sequential model are named from a session-wide count ("dense_3")."""
    if layer.name is None:
        give_automatic_name(layer, next_global_name(layer.kind))
    return layer
