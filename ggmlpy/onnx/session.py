"""A loaded ONNX model (``OnnxModel``): its weights in one buffer of the chosen device, loaded once; one ggml graph
per set of input shapes (built when first needed, or at load where the shapes are fixed), each with its own
scheduler over the device and the CPU; and ``run``, which writes the inputs, computes and reads the outputs.

Ownership: the model owns its backend, the weights' context and buffer, and each graph's contexts, buffer and
scheduler; ``free()`` releases them all (a model that is collected releases them too)."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .._ffi import ffi, lib
from ..backend.backend import Backend, ggml_backend_init_auto, set_backend_threads
from ..backend.buffer import Buffer, ggml_backend_alloc_ctx_tensors
from ..backend.transfer import ggml_backend_tensor_get_data, ggml_backend_tensor_set_data
from ..compute.placement import Placement, PlacementRecorder
from ..compute.run import ggml_backend_sched_graph_compute
from ..compute.sched import Scheduler
from ..core.types import GGML_TYPE_F16, GGML_TYPE_F32
from ..errors import GgmlStateError, GgmlTypeError, GgmlValueError
from ..graph.context import ggml_graph_overhead, ggml_init, ggml_tensor_overhead
from ..graph.graph import ggml_build_forward_expand, ggml_new_graph_custom
from ..graph.objects import Context, Graph, Tensor
from ..graph.tensor import ggml_new_tensor, ggml_set_name, ggml_set_output
from ..models.engine.runtime import make_scheduler
from . import (  # noqa: F401
    operators_activations,
    operators_detection,
    operators_image,
    operators_math,
    operators_nn,
    operators_quantize,
    operators_rnn,
    operators_shape,  # they register the operators
)
from .fusion import for_inference
from .protobuf import first_opset, GraphSpec
from .registry import all_known, known, OPS
from .values import Build, ne_of, Value


# the uses of an initializer that take it as a weight on the device (op, input index): products in F16 with dtype f16
PRODUCT_WEIGHTS = {("MatMul", 1), ("Gemm", 1), ("Conv", 1)}


def check_supported(spec: GraphSpec, fn: str) -> None:
    """Every node's operator and attributes are ones the importer builds (else a ValueError naming the op, the node
    and the opset), and every input it reads is made before it."""
    made = {name for name, _, _ in spec.inputs} | set(spec.initializers)
    for node in spec.nodes:
        where = f"{fn}: {node.op} node '{node.name}' (opset {spec.opset})"
        entry = OPS.get(node.op)
        if entry is not None and node.domain not in entry.domains:
            raise GgmlValueError(f"{where}: {node.op} is built as an operator of the domain "
                                 f"'{sorted(entry.domains)[-1] or 'ai.onnx'}', not of '{node.domain or 'ai.onnx'}'")
        if entry is None:
            if node.domain not in ("", "ai.onnx"):
                raise GgmlValueError(f"{where}: the operator {node.op} of the domain '{node.domain}' is not supported")
            raise GgmlValueError(f"{where}: the operator {node.op} is not supported (supported: "
                                 f"{', '.join(sorted(OPS))})")
        if spec.opset < entry.since:
            raise GgmlValueError(f"{where}: {node.op} is read as of opset {entry.since}")
        first = first_opset(node.op) if node.domain in ("", "ai.onnx") else None
        if first is not None and spec.opset < first:
            raise GgmlValueError(f"{where}: ONNX defines {node.op} as of opset {first}; a model of opset "
                                 f"{spec.opset} cannot hold it (a damaged file, or one to re-export)")
        extra = sorted(set(node.attrs) - entry.attrs)
        if extra:
            raise GgmlValueError(f"{where}: attribute(s) {extra} of {node.op} are not supported")
        missing = [n for n in node.inputs if n and n not in made]
        if missing:
            raise GgmlValueError(f"{where}: input(s) {missing} are made by no node before it (a damaged graph?)")
        made.update(n for n in node.outputs if n)
    lost = [o for o, _ in spec.outputs if o not in made]
    if lost:
        raise GgmlValueError(f"{fn}: the graph's output(s) {lost} are made by no node")


def build_nodes(b: Build, spec: GraphSpec, env: dict[str, Value]) -> None:
    """Build every node of ``spec`` in order, reading its inputs from ``env`` (the graph's inputs and initializers)
    and adding its outputs there: computed in numpy where every input is known, else as ggml ops."""
    cursor = ffi.NULL   # the context's last tensor before the node
    t = lib.ggml_get_first_tensor(b.ctx.ptr)
    while t != ffi.NULL:
        cursor, t = t, lib.ggml_get_next_tensor(b.ctx.ptr, t)
    for node in spec.nodes:
        b.where = f"{node.op} node '{node.name}' (opset {spec.opset})"
        xs = [env[n] if n else None for n in node.inputs]
        entry = OPS[node.op]
        if entry.fold is not None and all_known(xs):
            try:
                outs = [Value.of(np.asarray(a)) for a in entry.fold(node, known(xs), spec.opset)]
            except (ArithmeticError, ValueError, IndexError, TypeError) as exc:   # numpy refused the values
                raise b.fail(f"{type(exc).__name__}: {exc}") from None
        else:
            outs = entry.build(b, node, xs, spec.opset)
        extra = [name for name in node.outputs[len(outs):] if name]
        if extra:
            raise b.fail(f"its output(s) {extra} (output {len(outs)} on) are not supported")
        for name, v in zip(node.outputs, outs):
            if name:
                env[name] = v
        # the tensors the node made, named after it: ggml's messages (an op without a backward pass, a placement)
        # then say which ONNX node
        label = f"{node.op} '{node.name}'"[:63].encode()
        t = lib.ggml_get_next_tensor(b.ctx.ptr, cursor) if cursor != ffi.NULL else lib.ggml_get_first_tensor(b.ctx.ptr)
        while t != ffi.NULL:
            if t.name[0] == b"\x00":
                lib.ggml_set_name(t, label)
            cursor, t = t, lib.ggml_get_next_tensor(b.ctx.ptr, t)


@dataclass
class GraphInstance:
    """One built graph: its contexts, inputs and constants' buffer, scheduler, and its outputs' values."""
    ctx: Context
    ctx_io: Context
    buffer: Buffer | None
    graph: Graph | None
    sched: Scheduler | None
    inputs: list[Tensor | None]   # per model input: its F32 tensor (None: its values are built into the graph)
    outputs: list[Value]
    nodes: int
    graph_ctx: Context
    indices: list[tuple[int, int, Tensor]]   # (input position, the length it indexes, its I32 copy)

    def free(self) -> None:
        for h in (self.sched, self.buffer, self.graph_ctx, self.ctx_io, self.ctx):
            if h is not None:
                h.free()


class OnnxModel:
    """An ONNX model on a device (``onnx_load``)."""

    def __init__(self, spec: GraphSpec, device: str, input_shapes: dict | None, n_threads: int | None,
                 half: bool, fn: str) -> None:
        check_supported(spec, fn)
        self.spec, self.half, self.n_threads = spec, half, n_threads
        self.graph = for_inference(spec)   # what is built: fewer passes over the data (fusion.py)
        self._lock = threading.RLock()
        self.backend: Backend = ggml_backend_init_auto(device)
        self._graphs: dict[tuple, GraphInstance] = {}
        self._wctx: Context | None = None
        self._wbuf: Buffer | None = None
        self.last_placement: Placement | None = None
        # inputs read where the graph needs values (a Reshape's shape, a Slice's starts): their values pick the graph
        self.value_inputs = {n for node in spec.nodes for i, n in enumerate(node.inputs)
                             if i in OPS[node.op].static and n in {name for name, _, _ in spec.inputs}}
        try:
            self._load_weights()
            self.fixed = self._fixed_shapes(input_shapes, fn)
            if self.value_inputs:
                self.fixed = None
            if self.fixed is not None:   # built now: what the graph cannot do is said at load
                self._graph(self.fixed, {})
        except BaseException:
            self.free()
            raise

    # ---- weights
    def _load_weights(self) -> None:
        uses: dict[str, set] = {}
        for node in self.graph.nodes:
            for i, name in enumerate(node.inputs):
                uses.setdefault(name, set()).add((node.op, i))
        floats = {k: v for k, v in self.graph.initializers.items()
                  if v.dtype.kind == "f" and v.size and 0 < v.ndim <= 4 and k in uses}
        transposed = {k for k, v in floats.items() if v.ndim == 2 and ("MatMul", 1) in uses[k]}
        n = len(floats) + len(transposed)
        self._wctx = ggml_init(mem_size=(n + 2) * ggml_tensor_overhead(), no_alloc=True)
        self.weights: dict[str, Tensor] = {}
        self.weights_t: dict[str, Tensor] = {}
        pending: list[tuple[Tensor, np.ndarray]] = []
        for name, arr in floats.items():
            half = self.half and arr.size >= 256 and bool(uses[name] & PRODUCT_WEIGHTS)
            forms = [("", arr)] + ([("T", np.ascontiguousarray(arr.T))] if name in transposed else [])
            for form, a in forms:
                ne = ne_of(a.shape)
                t = ggml_new_tensor(self._wctx, GGML_TYPE_F16 if half else GGML_TYPE_F32, len(ne), ne)
                ggml_set_name(t, (name if not form else f"{name}.T")[-60:])
                (self.weights_t if form else self.weights)[name] = t
                pending.append((t, a.astype(np.float16 if half else np.float32)))
        self._wbuf = ggml_backend_alloc_ctx_tensors(self._wctx, self.backend) if pending else None
        for t, a in pending:
            ggml_backend_tensor_set_data(t, a)

    # ---- shapes
    def _fixed_shapes(self, given: dict | None, fn: str) -> tuple | None:
        """The inputs' shapes where they are fixed (declared, or given as ``input_shapes``), else None."""
        given = dict(given or {})
        names = [n for n, _, _ in self.spec.inputs]
        unknown = [k for k in given if k not in names]
        if unknown:
            raise GgmlValueError(f"{fn}: input_shapes names {unknown}, which are not inputs of the model ({names})")
        shapes = []
        for name, declared, _ in self.spec.inputs:
            shape = tuple(int(d) for d in given[name]) if name in given else declared
            misfit = len(shape) != len(declared) or any(d >= 0 and d != s for d, s in zip(declared, shape))
            if name in given and min(shape, default=1) < 1:
                raise GgmlValueError(f"{fn}: input_shapes[{name!r}] = {list(shape)}: every size must be >= 1")
            if name in given and misfit:
                raise GgmlValueError(f"{fn}: input_shapes[{name!r}] = {list(shape)} does not fit the model's input "
                                     f"of shape {list(declared)} (-1: any size)")
            if any(d < 0 for d in shape):
                return None
            shapes.append(shape)
        return tuple(shapes)

    # ---- graphs
    def _graph(self, shapes: tuple, values: dict[str, np.ndarray]) -> GraphInstance:
        key = (shapes, tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in sorted(values.items())))
        inst = self._graphs.get(key)
        if inst is not None:
            return inst
        if len(self._graphs) >= 4:
            self._graphs.pop(next(iter(self._graphs))).free()
        for scale in (1, 8, 64):   # unrolled recurrences make many tensors per node: a larger context then
            try:
                built = self._build(shapes, values, scale)
                break
            except GgmlValueError as exc:
                if "context is full" not in str(exc) or scale == 64:
                    raise
        self._graphs[key] = built
        return built

    def _build(self, shapes: tuple, values: dict[str, np.ndarray], scale: int = 1) -> GraphInstance:
        spec = self.graph
        budget = scale * (64 * len(spec.nodes) + 64)
        ctx = ggml_init(mem_size=budget * ggml_tensor_overhead(), no_alloc=True)
        ctx_io = ggml_init(mem_size=scale * (16 * len(spec.nodes) + 16) * ggml_tensor_overhead(), no_alloc=True)
        owned: list = [ctx, ctx_io]
        try:
            b = Build(ctx, ctx_io, self.weights)
            b.weights_t = self.weights_t
            b.device = self.backend.device
            env: dict[str, Value] = {name: Value(tuple(int(d) for d in a.shape), self.weights.get(name), a)
                                     for name, a in spec.initializers.items()}
            inputs: list[Tensor | None] = []
            for (name, _, dtype), shape in zip(spec.inputs, shapes):
                b.where = f"input '{name}'"
                if name in values:
                    env[name] = Value.of(values[name])
                    inputs.append(None)
                    continue
                t = b.input(name, shape, False)   # computed in F32 (integers too: exact below 2^24)
                inputs.append(t)
                integer = dtype.kind in "iub"
                env[name] = Value(shape, t, source=name if integer else None, dtype=dtype if integer else None)
            build_nodes(b, spec, env)
            outputs = [env[name] for name, _ in spec.outputs]
            computed = [v.tensor for v in outputs if v.tensor is not None]
            n_nodes = max(2048, 4 * budget)
            graph_ctx = ggml_init(mem_size=ggml_graph_overhead(n_nodes) + 1024, no_alloc=True)
            owned.append(graph_ctx)
            graph = ggml_new_graph_custom(graph_ctx, n_nodes, False) if computed else None
            for t in computed:
                assert graph is not None
                ggml_set_output(t)
                ggml_build_forward_expand(graph, t)
            buffer = ggml_backend_alloc_ctx_tensors(ctx_io, self.backend) \
                if any(t is not None for t in inputs) or b.indices or b.constants else None
            owned.append(buffer)
            for t, a in b.constants:
                ggml_backend_tensor_set_data(t, a)
            sched = make_scheduler(self.backend, n_nodes) if computed else None
            position = {name: j for j, (name, _, _) in enumerate(spec.inputs)}
            indices = [(position[name], n, t) for (name, n), t in b.indices.items()]
            return GraphInstance(ctx, ctx_io, buffer, graph, sched, inputs, outputs, n_nodes, graph_ctx, indices)
        except BaseException:
            for h in reversed(owned):
                if h is not None:
                    h.free()
            raise

    # ---- running
    def run(self, arrays: list[np.ndarray], watch: bool = False) -> list[np.ndarray]:
        with self._lock:
            if self._wctx is None:
                raise GgmlStateError("onnx_run: the model has been freed")
            names = [name for name, _, _ in self.spec.inputs]
            values = {n: a for n, a in zip(names, arrays) if n in self.value_inputs}
            inst = self._graph(tuple(tuple(int(d) for d in a.shape) for a in arrays), values)
            for j, n, index in inst.indices:   # in range (ggml would read past its table), negative ones wrapped
                ids = np.asarray(arrays[j], np.int64)
                if ((ids < -n) | (ids >= n)).any():
                    raise GgmlValueError(f"onnx_run: input '{names[j]}' holds indices {ids.min()}..{ids.max()}, "
                                         f"out of range for the axis of {n} it indexes")
                ggml_backend_tensor_set_data(index, np.where(ids < 0, ids + n, ids).astype(np.int32).reshape(
                    tuple(reversed(ne_of(ids.shape)))))
            for t, a in zip(inst.inputs, arrays):
                if t is not None:
                    ggml_backend_tensor_set_data(t, a.astype(np.float32, copy=False).reshape(
                        tuple(reversed(ne_of(a.shape)))))
            if inst.sched is not None and inst.graph is not None:
                if self.n_threads is not None:
                    for be in inst.sched.backends:
                        if be.is_cpu:
                            set_backend_threads(be, self.n_threads)
                if watch:
                    with PlacementRecorder(inst.sched) as rec:
                        ggml_backend_sched_graph_compute(inst.sched, inst.graph)
                    self.last_placement = rec.placement(f"ONNX graph '{self.spec.graph_name}'")
                else:
                    ggml_backend_sched_graph_compute(inst.sched, inst.graph)
            out = []
            for v, (_, dtype) in zip(inst.outputs, self.spec.outputs):
                if v.tensor is None:
                    arr = np.asarray(v.const)
                else:   # the declared type, else the value's own (an integer input's, a Cast's), else F32
                    arr = ggml_backend_tensor_get_data(v.tensor).reshape(v.shape)
                    dtype = dtype if dtype is not None else v.dtype
                out.append(arr.astype(dtype) if dtype is not None else arr)
            return out

    def free(self) -> None:
        with self._lock:
            for inst in self._graphs.values():
                inst.free()
            self._graphs.clear()
            for h in (getattr(self, "_wbuf", None), getattr(self, "_wctx", None)):
                if h is not None:
                    h.free()
            self._wbuf = self._wctx = None
            if self.backend.alive:
                self.backend.free()


def checked_inputs(model: OnnxModel, inputs: object, fn: str) -> list[np.ndarray]:
    """``inputs`` (a dict by input name; one array for a one-input model) as arrays in the model's order, each checked
    against the declared shape and type."""
    names = [n for n, _, _ in model.spec.inputs]
    if not isinstance(inputs, dict):
        if len(names) == 1 and isinstance(inputs, np.ndarray):
            inputs = {names[0]: inputs}
        else:
            raise GgmlTypeError(f"{fn}: inputs must be a dict by input name ({names}), got {type(inputs).__name__}")
    unknown, missing = [k for k in inputs if k not in names], [n for n in names if n not in inputs]
    if unknown or missing:
        raise GgmlValueError(f"{fn}: the model's inputs are {names}; " +
                             (f"{unknown} are not among them" if unknown else f"{missing} are missing"))
    out = []
    for name, declared, _ in model.spec.inputs:
        arr = np.asarray(inputs[name])
        if arr.dtype.kind not in "fiub":
            raise GgmlTypeError(f"{fn}: input '{name}' must hold numbers, got {arr.dtype}")
        if len(arr.shape) != len(declared) or any(d >= 0 and d != s for d, s in zip(declared, arr.shape)):
            raise GgmlValueError(f"{fn}: input '{name}' has shape {arr.shape}, the model takes {list(declared)} "
                                 "(-1: any size)")
        out.append(arr)
    return out
