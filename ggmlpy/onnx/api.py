"""ggmlR's five ONNX functions: ``onnx_load``, ``onnx_run``, ``onnx_summary``, ``onnx_inputs``, ``onnx_device_info``."""
from __future__ import annotations

from collections import Counter

import numpy as np

from ..compute.placement import is_host_backend
from ..core.args import positive_int_arg
from ..errors import GgmlTypeError, GgmlValueError
from .protobuf import read_model
from .registry import OPS
from .session import checked_inputs, OnnxModel


__all__ = ["onnx_load", "onnx_run", "onnx_summary", "onnx_inputs", "onnx_device_info"]

_DTYPES = {"f32": False, "float32": False, "f16": True, "fp16": True, "float16": True}


def onnx_load(path: object, device: str | None = None, input_shapes: dict | None = None,
              n_threads: int | None = None, dtype: str = "f32") -> OnnxModel:
    """Load an ONNX model onto a ggml device: its graph becomes one ggml graph, computed by ggml's scheduler on
    ``device`` (and the CPU for any op the device lacks), its weights loaded once into the device's memory.

    Every node's operator and attributes are checked first: an operator (or attribute, or operator set) the importer
    does not build raises ValueError naming the op, the node and the opset, and a file that is not ONNX raises
    ValueError too; nothing aborts. Values known when the graph is built (shapes, axes, constants, and whatever is
    computed from them only) are computed in numpy, so a graph's shape arithmetic never reaches ggml.

    Arguments:
        path: the .onnx file (a str or os.PathLike), or its bytes.
        device: where to run: None or "auto" (a GPU where there is one, else the CPU), "cpu", "vulkan", "cuda" or
            a device name such as "Vulkan0", as ``ggml_compile``'s backend.
        input_shapes: a dict by input name of full shapes (batch included) for inputs with dynamic dimensions,
            ``{"image": (1, 3, 224, 224)}``; with every shape fixed the graph is built (and checked) at load.
            Without it, a graph is built for each new set of input shapes ``onnx_run`` meets.
        n_threads: CPU threads for the CPU's share of the work (None: ggml's default).
        dtype: "f32" (the default) or "f16": the weights of matrix products and convolutions with 256 or more
            values are held in F16 (half the memory; products in F16 where the device computes them); biases,
            normalisation parameters, inputs and outputs stay F32.

    Value: an ``OnnxModel`` for ``onnx_run``, ``onnx_summary``, ``onnx_inputs`` and ``onnx_device_info``.

    Example:
        >>> model = g.onnx_load("mnist.onnx", device="cpu")
        >>> out = g.onnx_run(model, {"Input3": np.zeros((1, 1, 28, 28), np.float32)})
    """
    fn = "onnx_load"
    if device is not None and not isinstance(device, str):
        raise GgmlTypeError(f"{fn}: device must be a name such as 'cpu', 'vulkan' or 'Vulkan0', got {device!r}")
    if not isinstance(dtype, str) or dtype.lower() not in _DTYPES:
        raise GgmlValueError(f"{fn}: dtype must be 'f32' or 'f16', got {dtype!r}")
    if input_shapes is not None and not isinstance(input_shapes, dict):
        raise GgmlTypeError(f"{fn}: input_shapes must be a dict by input name, got {type(input_shapes).__name__}")
    threads = None if n_threads is None else positive_int_arg(fn, "n_threads", n_threads)
    spec = read_model(path, fn)
    return OnnxModel(spec, device or "auto", input_shapes, threads, _DTYPES[dtype.lower()], fn)


def _model(model: object, fn: str) -> OnnxModel:
    if not isinstance(model, OnnxModel):
        raise GgmlTypeError(f"{fn}: expected a model from onnx_load, got {type(model).__name__}")
    return model


def onnx_run(model: OnnxModel, inputs: object) -> dict[str, np.ndarray]:
    """Run a loaded ONNX model on inputs: one ggml graph compute.

    Arguments:
        model: a model from ``onnx_load``.
        inputs: a dict by input name of arrays in ONNX's shapes (a single array for a one-input model); the
            inputs' sizes must fit the declared ones (a dynamic dimension takes any size: a graph is built for each
            new shape and kept, four at most).

    Value: a dict by output name of numpy arrays in ONNX's shapes and types (ggmlR's named list).

    Example:
        >>> out = g.onnx_run(model, {"x": x})["y"]
    """
    fn = "onnx_run"
    m = _model(model, fn)
    arrays = checked_inputs(m, inputs, fn)
    results = m.run(arrays, watch=m.last_placement is None)
    return {name: r for (name, _), r in zip(m.spec.outputs, results)}


def onnx_summary(model: OnnxModel) -> dict:
    """What a loaded ONNX model is: its IR version, operator set, producer, graph name, node and initializer counts
    and the operators it uses.

    Arguments:
        model: a model from ``onnx_load``.

    Value: a dict with ``ir_version``, ``opset_version``, ``producer``, ``graph_name``, ``n_nodes``,
    ``n_initializers``, ``ops`` (each operator once, in order of first use).

    Example:
        >>> g.onnx_summary(model)["ops"]
        ['Conv', 'Relu', 'MaxPool', 'Reshape', 'MatMul', 'Add']
    """
    m = _model(model, "onnx_summary")
    s = m.spec
    return {"ir_version": s.ir_version, "opset_version": s.opset, "producer": s.producer, "graph_name": s.graph_name,
            "n_nodes": len(s.nodes), "n_initializers": len(s.initializers),
            "ops": list(dict.fromkeys(n.op for n in s.nodes))}


def onnx_inputs(model: OnnxModel) -> dict[str, list[int]]:
    """The inputs of a loaded ONNX model (not its initializers): their shapes in ONNX's order, -1 for a dynamic
    dimension.

    Arguments:
        model: a model from ``onnx_load``.

    Value: a dict by input name of shapes (lists of ints).

    Example:
        >>> g.onnx_inputs(model)
        {'image': [-1, 3, 224, 224]}
    """
    m = _model(model, "onnx_inputs")
    return {name: list(shape) for name, shape, _ in m.spec.inputs}


def onnx_device_info(model: OnnxModel) -> dict:
    """Where a loaded ONNX model's graph runs, as ggml's scheduler placed it in the latest ``onnx_run`` (or, before
    any, in a run on zeros where the input shapes are fixed).

    Arguments:
        model: a model from ``onnx_load``.

    Value: a dict: ``backends`` (the scheduler's backends by name), ``n_backends``, ``n_splits`` (1: the whole graph
    on one backend), ``n_nodes`` (nodes computed), ``gpu_ops`` and ``cpu_ops`` (nodes on a device and on the host),
    ``cpu_only_ops`` (ops the host computed while a device was present, with their counts), ``why`` (for each
    such op, why the device did not compute it).

    Example:
        >>> info = g.onnx_device_info(model)
        >>> info["n_splits"], info["cpu_only_ops"]
        (1, {})
    """
    fn = "onnx_device_info"
    m = _model(model, fn)
    if m.last_placement is None:
        if m.fixed is None:
            raise GgmlValueError(f"{fn}: the model's input shapes are dynamic and it has not run yet; call onnx_run "
                                 "first (or load it with input_shapes=...)")
        zeros = [np.zeros(shape, dtype) for (_, _, dtype), shape in zip(m.spec.inputs, m.fixed)]
        m.run(zeros, watch=True)
    p = m.last_placement
    assert p is not None
    ops = [(backend, op) for backend, names in p.splits for op in names]
    host = [op for backend, op in ops if backend in p.host]
    device = any(not is_host_backend(b) for b in ([m.backend]))
    return {"backends": list(dict.fromkeys(backend for backend, _ in p.splits)) or [m.backend.name],
            "n_backends": len({backend for backend, _ in p.splits}), "n_splits": p.n_splits, "n_nodes": len(ops),
            "gpu_ops": len(ops) - len(host), "cpu_ops": len(host),
            "cpu_only_ops": dict(Counter(host)) if device else {}, "why": dict(p.why)}


def supported_operators() -> list[str]:
    """The ONNX operators the importer builds."""
    return sorted(OPS)
