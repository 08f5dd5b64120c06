"""Fine-tuning an imported ONNX model: ``onnx_to_model`` makes a ggmlpy functional model of it, one ``OnnxGraph``
layer whose weights are the model's float initializers, so that it compiles, trains, saves and loads as any model.

The layer builds the ONNX graph with the importer's operators into the model's graph (forward and, through ggml's
autodiff, backward), reading its weights from the model's weight store. Axis 0 of every ONNX input and of the
output is the batch; the rest is one sample, in ONNX's order (an NCHW image is a sample of shape ``(C, H, W)``,
ggml's ``[W, H, C, N]`` as the importer lays it out). Its config holds the graph without its weights (the
serialized ONNX model with only its constant initializers), so a saved model carries what rebuilds it.
"""
from __future__ import annotations

import base64
import math
import re
from typing import TYPE_CHECKING

import numpy as np

from ..core.args import is_int, positive_int_arg
from ..core.types import GGML_TYPE_F32, GGML_TYPE_I32
from ..errors import GgmlTypeError, GgmlValueError
from ..graph.context import ggml_init, ggml_tensor_overhead
from ..graph.objects import Tensor
from ..graph.tensor import ggml_new_tensor
from ..models.builders import ggml_apply, ggml_input, ggml_model
from ..models.layers.layer import Layer, natural_ne
from ..models.layers.weight import ParamSpec
from ..models.network.model import Model
from ..ops.layout import ggml_reshape
from .protobuf import GraphSpec, read_model, with_initializers
from .registry import OPS
from .session import build_nodes, check_supported, OnnxModel
from .values import Build, ne_of, Value


__all__ = ["onnx_to_model", "OnnxGraph"]


if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..models.layers.layer import Builder, LayerOptions


# inputs that hold state, not something to train: batch norm's running mean and variance
STATE_OPERANDS = {("BatchNormalization", 3), ("BatchNormalization", 4)}
MAX_WEIGHT_NAME = 22   # "<layer>.<weight>" within ggml's 63-byte tensor names, with a layer name of up to 40


def weight_roles(spec: GraphSpec) -> dict[str, bool]:
    """The initializers that become weights, each with whether it trains: float, finite, of rank 1 to 4 (in ggml's
    sense), read by no node as a value known when the graph is built (a shape, axes: ``static``) or as a number (a
    Pow's exponent, a quantization's scale: ``numbers``, registry.py); batch norm's running statistics are weights
    that do not train. The others stay constants of the graph."""
    uses: dict[str, set[tuple[str, int]]] = {}
    for node in spec.nodes:
        for i, name in enumerate(node.inputs):
            if name:
                uses.setdefault(name, set()).add((node.op, i))
    roles = {}
    for name, arr in spec.initializers.items():
        used = uses.get(name)
        if not used or arr.dtype.kind != "f" or arr.ndim < 1 or arr.size == 0 or len(ne_of(arr.shape)) > 4:
            continue
        if any(i in OPS[op].static | OPS[op].numbers for op, i in used):
            continue
        if not np.isfinite(arr).all():   # an attention mask of -inf: a constant, as the importer builds it exactly
            continue
        roles[name] = not used <= STATE_OPERANDS
    return roles


def row_limit(spec: GraphSpec, name: str, fn: str) -> int:
    """The ids an integer input may hold: it must be read only as Gather's indices into initializers (token ids
    into embedding tables), and every id below the shortest table's length (a negative id, which ONNX wraps, is
    refused by the fit's check). Else a ValueError saying so."""
    limits = []
    for node in spec.nodes:
        for i, used in enumerate(node.inputs):
            if used != name:
                continue
            table = spec.initializers.get(node.inputs[0]) if node.op == "Gather" and i == 1 else None
            if table is None:
                raise GgmlValueError(f"{fn}: integer input '{name}' is read by {node.op} node '{node.name}'; a "
                                     "model made of the graph takes integer inputs only as token ids that index "
                                     "tables (Gather of an initializer; run other graphs with onnx_run)")
            axis = int(node.attrs.get("axis", 0)) % max(table.ndim, 1)
            limits.append(int(table.shape[axis]))
    if not limits:
        raise GgmlValueError(f"{fn}: integer input '{name}' is read by no node")
    return min(limits)


def weight_names(names: list[str]) -> list[str]:
    """A weight name of at most 22 bytes per initializer name, unique: the name itself where it fits (characters
    other than letters, digits, '_' and '-' made '_'), else ``w<i>_`` and its end."""
    out: list[str] = []
    for i, name in enumerate(names):
        clean = _clean(name) or "w"
        tries = 0
        while len(clean) > MAX_WEIGHT_NAME or clean in out:   # w<i>_<end>, then w<i>x<k>_<end> while taken
            prefix = f"w{i}_" if not tries else f"w{i}x{tries}_"
            clean = prefix + _clean(name)[len(prefix) - MAX_WEIGHT_NAME:]
            tries += 1
        out.append(clean)
    return out


class OnnxGraph(Layer):
    """An imported ONNX graph as one layer of a ggmlpy model (``onnx_to_model`` makes it): its float initializers
    are the layer's weights (trained by a fit; batch norm's running statistics kept as they are), its inputs the
    model's inputs in the ONNX model's order, its output one of the graph's outputs.

    Arguments:
        graph: the ONNX model without its weights, serialized and base64-encoded (its constant initializers kept).
        output: the name of the graph output the layer returns.
        weights: one ``[weight name, initializer name, shape, trains]`` per weight.
        initial: the weights' starting values by weight name (numpy order; not saved: a saved model's file holds
            its weights); None: zeros until values are set (``ggml_set_weights``, a load).
    """
    kind = "onnx_graph"
    builder_functions = False
    many_inputs = "either"
    takes_int = "either"   # integer inputs: token ids that only index tables (Gather)

    NOT_SAVED = ("initial",)

    def __init__(self, graph: str, output: str, weights: list, initial: dict | None = None,
                 **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        fn = "OnnxGraph"
        if not isinstance(graph, str) or not isinstance(output, str) or not isinstance(weights, (list, tuple)):
            raise GgmlTypeError(f"{fn}: graph (base64 text), output (a name) and weights (a list) are expected, got "
                                f"{type(graph).__name__}, {type(output).__name__}, {type(weights).__name__}")
        try:
            data = base64.b64decode(graph.encode(), validate=True)
        except ValueError:
            raise GgmlValueError(f"{fn}: graph is not base64 text of an ONNX model") from None
        spec = read_model(data, fn)
        rows: list[tuple[str, str, tuple[int, ...], bool]] = []
        for row in weights:
            if (not isinstance(row, (list, tuple)) or len(row) != 4 or not isinstance(row[0], str)
                    or not isinstance(row[1], str) or not isinstance(row[2], (list, tuple))):
                raise GgmlValueError(f"{fn}: each weight is [weight name, initializer name, shape, trains], got "
                                     f"{row!r}")
            shape = tuple(positive_int_arg(fn, f"the shape of weight {row[0]!r}", d) for d in row[2])
            rows.append((row[0], row[1], shape, bool(row[3])))
            # the weight's place in the graph: a zero-size view of its shape (read only for its shape)
            spec.initializers[row[1]] = np.broadcast_to(np.float32(0), shape)
        outputs = [name for name, _ in spec.outputs]
        if output not in outputs:
            raise GgmlValueError(f"{fn}: output {output!r} is not an output of the graph ({outputs})")
        check_supported(spec, fn)
        # per input, the ids an integer one may hold: the fit checks them (models/engine/inputs.py) as an embedding's
        self.vocab_sizes = [None if dtype.kind == "f" else row_limit(spec, name, fn) for name, _, dtype in spec.inputs]
        self.graph, self.output, self.weights = graph, output, [[n, o, list(s), t] for n, o, s, t in rows]
        self._rows = rows
        self._spec = spec
        self._initial = {k: np.asarray(v, np.float32) for k, v in (initial or {}).items()}
        # input shapes -> (output's sample shape, tensors, constants the graph makes)
        self._shapes: dict[tuple, tuple[tuple[int, ...], int, int]] = {}

    def config(self) -> dict:
        return {"graph": self.graph, "output": self.output, "weights": [list(r) for r in self.weights]}

    # ---- building
    def _output(self, b: Build, xs: list[Tensor], shapes: list[tuple[int, ...]], batch: int) -> Value:
        spec = self._spec
        env = {name: Value(tuple(int(d) for d in a.shape), b.weights.get(name), None if name in b.weights else a)
               for name, a in spec.initializers.items()}
        for (name, _, dtype), shape, t in zip(spec.inputs, shapes, xs):
            integer = dtype.kind != "f"
            env[name] = Value((batch,) + tuple(shape), t, source=name if integer else None,
                              dtype=dtype if integer else None)
            if integer:
                b.given_indices[name] = t
        build_nodes(b, spec, env)
        return env[self.output]

    def _probe(self, shapes: list[tuple[int, ...]]) -> tuple[tuple[int, ...], int, int]:
        """The output's sample shape, and how many tensors and constants the graph makes, for input ``shapes``,
        from the graph built in a context of its own for a batch of 2 (never allocated)."""
        key = tuple(tuple(s) for s in shapes)
        if key in self._shapes:
            return self._shapes[key]
        where = f"layer '{self.name}' (ONNX graph)"
        declared = self._spec.inputs
        if len(shapes) != len(declared):
            raise GgmlValueError(f"{where} takes {len(declared)} input(s) ({[n for n, _, _ in declared]}), got "
                                 f"{len(shapes)}")
        for (name, dims, _), shape in zip(declared, shapes):
            if len(shape) != len(dims) - 1 or any(d >= 0 and d != s for d, s in zip(dims[1:], shape)):
                raise GgmlValueError(f"{where}: input '{name}' is declared {list(dims)} (axis 0 the batch, -1 any "
                                     f"size); a sample of shape {tuple(shape)} does not fit it")
        # both forms: a training graph builds some ops from others (Resize, Pad, ConvTranspose: more tensors)
        (out, n_tensors, n_constants), (_, n_train, c_train) = (self._dry_build(shapes, where, training)
                                                                for training in (False, True))
        if out.tensor is None:
            raise GgmlValueError(f"{where}: output '{self.output}' does not depend on the inputs (it is a constant)")
        if len(out.shape) < 2 or out.shape[0] != 2 or len(out.shape) > 4:
            raise GgmlValueError(f"{where}: output '{self.output}' has shape {list(out.shape)} for a batch of 2; a "
                                 "model's output is a batch of samples (axis 0 the batch, 1 to 3 axes more)")
        self._shapes[key] = result = (tuple(out.shape[1:]), max(n_tensors, n_train), max(n_constants, c_train))
        return result

    def _dry_build(self, shapes: list[tuple[int, ...]], where: str, training: bool) -> tuple[Value, int, int]:
        """The graph built for a batch of 2 in a context of its own (never allocated): its output, and how many
        tensors and constants it made."""
        for scale in (1, 8, 64):
            ctx = ggml_init(mem_size=scale * (64 * len(self._spec.nodes) + 64) * ggml_tensor_overhead(),
                            no_alloc=True)
            try:
                weights = {onnx: ggml_new_tensor(ctx, GGML_TYPE_F32, len(ne_of(s)), ne_of(s))
                           for _, onnx, s, _ in self._rows}
                b = Build(ctx, ctx, weights)   # its constants made in ctx too, and never written
                b.differentiable = training
                xs = [ggml_new_tensor(ctx, GGML_TYPE_F32 if dtype.kind == "f" else GGML_TYPE_I32, len(ne_of((2,) + s)),
                                      ne_of((2,) + s)) for (_, _, dtype), s in zip(self._spec.inputs, shapes)]
                out = self._output(b, xs, shapes, 2)
                return out, ctx.used_mem // ggml_tensor_overhead(), len(b.constants)
            except GgmlValueError as exc:
                if "context is full" in str(exc) and scale < 64:
                    continue
                raise GgmlValueError(f"{where}: {exc} (built for a batch of 2: if the graph was exported for one "
                                     "batch size, export it with a dynamic batch axis, torch.onnx.export's "
                                     "dynamic_axes)") from None
            finally:
                ctx.free()
        raise AssertionError("unreachable: the last scale raises")

    def output_shape(self, shapes):
        return self._probe(shapes)[0]

    def graph_tensors(self, shapes):
        return 64 + 2 * self._probe(shapes)[1]

    def graph_constants(self, shapes):
        return self._probe(shapes)[2]

    def make_params(self, shapes):
        initial = self._initial
        specs = []
        for name, _, shape, trains in self._rows:
            value = initial.get(name)
            ne = ne_of(tuple(shape))
            specs.append(ParamSpec(name, ne, "given" if value is not None else "zeros",
                                   (ne[0], math.prod(ne[1:])), trainable=trains, value=value))
        return specs

    def forward(self, g: Builder, xs, shapes):
        weights = {onnx: g.param(self, name) for name, onnx, _, _ in self._rows}
        b = Build(g.ctx, None, weights, g.constant)
        b.device, b.differentiable = g.params.backend.device, g.training
        if g.half_products:
            g.note(f"onnx_graph '{self.name}' computes its products in F32: ggml_compile's precision applies to "
                   "ggmlpy's own layers")
        out = self._output(b, xs, shapes, g.batch)
        assert out.tensor is not None   # _probe checked it
        want = natural_ne(self.output_shape(shapes), g.batch)
        y = b.contiguous(out.tensor)
        if tuple(y.shape[:len(want)]) != want or any(n != 1 for n in y.shape[len(want):]):
            y = ggml_reshape(g.ctx, y, g.shape_target(want))
        return y


def onnx_to_model(model: object, output: str | None = None, input_shapes: dict | None = None,
                  name: str | None = None) -> Model:
    """An ONNX model as a ggmlpy functional model that trains: its float initializers become trainable weights
    (batch norm's running statistics weights that do not train), its graph one layer (``OnnxGraph``) built from
    the importer's operators, so the model compiles, fits (``ggml_fit``, ``ggml_fit_generator``), evaluates,
    predicts, saves (``ggml_save_model``, GGUF) and loads as any other; before training it predicts what the ONNX
    model computes.

    Axis 0 of each input and of the output is the batch; the rest is one sample in ONNX's order (an NCHW image
    input is ``ggml_input(shape=(C, H, W))``). The graph is built as for inference: Dropout passes values through
    and BatchNormalization uses its running statistics (Keras' advice for fine-tuning: batch norm in inference
    mode). A graph exported for one batch size only (a Reshape to ``[1, -1]``) cannot train: export it with a
    dynamic batch axis. An integer input read only as Gather's indices into initializers (token ids into embedding
    tables) is an int32 input of the model, each id checked by the fit against the shortest table it indexes;
    integer inputs read otherwise are refused (run such graphs with ``onnx_run``).

    Arguments:
        model: an ``OnnxModel`` from ``onnx_load``, or a path to an .onnx file, or its bytes.
        output: the name of the graph output the model returns (None: the graph's only output).
        input_shapes: a dict by input name of full shapes (batch included; its size is not used) where an input
            has a dynamic size besides the batch; an ``OnnxModel`` loaded with ``input_shapes`` has them.
        name: the model's name.

    Value: an uncompiled functional ``Model``; compile it with ``ggml_compile(model, ...)`` on the device wanted.

    Example:
        >>> net = g.onnx_to_model("classifier.onnx")
        >>> g.ggml_compile(net, optimizer="adam", loss="categorical_crossentropy", backend="cpu")
        >>> g.ggml_fit(net, x, y, epochs=2, batch_size=32)
    """
    fn = "onnx_to_model"
    if isinstance(model, OnnxModel):
        spec = model.spec
        if input_shapes is None and model.fixed is not None:
            input_shapes = {n: s for (n, _, _), s in zip(spec.inputs, model.fixed)}
    else:
        spec = read_model(model, fn)
        check_supported(spec, fn)
    if input_shapes is not None and not isinstance(input_shapes, dict):
        raise GgmlTypeError(f"{fn}: input_shapes must be a dict by input name, got {type(input_shapes).__name__}")
    names = [n for n, _, _ in spec.inputs]
    for key, given in (input_shapes or {}).items():
        if key not in names:
            raise GgmlValueError(f"{fn}: input_shapes names {key!r}, which is not an input of the model ({names})")
        if not isinstance(given, (tuple, list)) or not all(is_int(d) and d >= 1 for d in given):
            raise GgmlValueError(f"{fn}: input_shapes[{key!r}] must be a full shape of ints >= 1 (batch included), "
                                 f"got {given!r}")
    outputs = [n for n, _ in spec.outputs]
    if output is None:
        if len(outputs) != 1:
            raise GgmlValueError(f"{fn}: the graph has {len(outputs)} outputs {outputs}; say which the model returns "
                                 "(output=...)")
        output = outputs[0]
    elif output not in outputs:
        raise GgmlValueError(f"{fn}: output {output!r} is not an output of the graph ({outputs})")
    inputs = []
    for in_name, dims, dtype in spec.inputs:
        if dtype.kind != "f":
            row_limit(spec, in_name, fn)   # token ids: only row indices of tables (Gather), else refused
        given = (input_shapes or {}).get(in_name)
        sample = tuple(int(d) for d in given)[1:] if given is not None else tuple(dims[1:])
        if len(dims) < 2 or len(dims) > 4:
            raise GgmlValueError(f"{fn}: input '{in_name}' has rank {len(dims)} ({list(dims)}); a model's input is a "
                                 "batch of samples of 1 to 3 axes (rank 2 to 4)")
        if len(sample) != len(dims) - 1 or any(d < 1 for d in sample):
            raise GgmlValueError(f"{fn}: input '{in_name}' is declared {list(dims)}, with a dynamic size besides the "
                                 f"batch; give its shape: input_shapes={{{in_name!r}: (1, ...)}}")
        inputs.append(ggml_input(shape=sample, name=_node_name(in_name), dtype="float32" if dtype.kind == "f" else
                                 "int32"))
    roles = weight_roles(spec)
    names = weight_names(list(roles))
    graph = with_initializers(spec.skeleton, {k: v for k, v in spec.initializers.items() if k not in roles}, fn)
    layer = OnnxGraph(base64.b64encode(graph).decode(), output,
                      [[n, onnx, list(spec.initializers[onnx].shape), roles[onnx]] for n, onnx in zip(names, roles)],
                      initial={n: spec.initializers[onnx] for n, onnx in zip(names, roles)})
    node = ggml_apply(inputs if len(inputs) > 1 else inputs[0], layer)
    return ggml_model(inputs if len(inputs) > 1 else inputs[0], node, name=name)


def _node_name(name: str) -> str:
    return _clean(name)[:40] or "input"


def _clean(name: str) -> str:
    """``name`` with every character but letters, digits, '_' and '-' made '_' (a layer's or weight's name)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)
