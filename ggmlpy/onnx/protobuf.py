"""Reading an ONNX model with the ``onnx`` package: the protobuf from a path or bytes, its operator set version, its
graph's inputs (shapes with -1 for a dynamic dimension), outputs, initializers (as numpy arrays) and each node's
attributes as Python values."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np

from ..errors import GgmlTypeError, GgmlValueError


# the operator set versions this importer reads (the default domain's)
MIN_OPSET, MAX_OPSET = 1, 28


def onnx_package(fn: str) -> ModuleType:
    """The ``onnx`` package, or an ImportError saying how to install it."""
    try:
        import onnx
    except ImportError:
        raise ImportError(f"{fn} needs the onnx package to read ONNX files: pip install onnx "
                          "(or pip install 'ggmlpy[onnx]')") from None
    return onnx


@dataclass
class Node:
    """One node of the graph, as the importer reads it."""
    op: str
    name: str
    inputs: list[str]     # "" for an omitted optional input
    outputs: list[str]
    attrs: dict
    domain: str = ""


@dataclass
class GraphSpec:
    """What the importer knows of a model before building anything."""
    ir_version: int
    opset: int
    producer: str
    graph_name: str
    inputs: list[tuple[str, tuple[int, ...], np.dtype]]   # (name, shape with -1 where dynamic, numpy dtype)
    outputs: list[tuple[str, np.dtype | None]]   # (name, numpy dtype where declared)
    initializers: dict[str, np.ndarray]
    nodes: list[Node] = field(default_factory=list)
    skeleton: bytes = b""   # the model without its initializers (serialized): what a trained copy keeps (trainable.py)


def read_model(source: object, fn: str) -> GraphSpec:
    """``source``: a path (str or os.PathLike) to an .onnx file, or its bytes."""
    onnx = onnx_package(fn)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, where = bytes(source), "the given bytes"
    elif isinstance(source, (str, os.PathLike)):
        where = repr(os.fspath(source))
        if not os.path.isfile(source):
            raise FileNotFoundError(f"{fn}: no such file: {where}")
        with open(source, "rb") as f:
            data = f.read()
    else:
        raise GgmlTypeError(f"{fn}: expected a path to an .onnx file or its bytes, got {type(source).__name__}")
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:   # noqa: BLE001 - protobuf's DecodeError and friends: the file is not ONNX
        raise GgmlValueError(f"{fn}: {where} is not an ONNX model ({type(exc).__name__}: {exc})") from None
    if not model.HasField("graph") or not model.graph.node and not model.graph.output:
        raise GgmlValueError(f"{fn}: {where} holds no ONNX graph (an empty or damaged file?)")
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    opset = int(opsets.get("ai.onnx", 0))
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise GgmlValueError(f"{fn}: {where} uses ONNX operator set {opset}; this importer reads opsets {MIN_OPSET} "
                             f"to {MAX_OPSET} (re-export the model with opset_version in that range)")
    numpy_helper = onnx.numpy_helper
    try:
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    except Exception as exc:   # noqa: BLE001 - external data not found, a damaged tensor
        raise GgmlValueError(f"{fn}: {where}: an initializer cannot be read ({type(exc).__name__}: {exc}); a model "
                             "saved with external data must be loaded from its folder") from None
    inputs = []
    for vi in model.graph.input:
        if vi.name in inits:   # IR < 4 lists the initializers among the inputs
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise GgmlValueError(f"{fn}: input '{vi.name}' is not a tensor (sequences and maps are not supported)")
        dims = tuple(int(d.dim_value) if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        inputs.append((vi.name, dims, _dtype(onnx, tt.elem_type, f"{fn}: input '{vi.name}'")))
    nodes = [Node(n.op_type, n.name or f"{n.op_type}_{i}", list(n.input), list(n.output),
                  {a.name: _attribute(onnx, a) for a in n.attribute}, n.domain)
             for i, n in enumerate(model.graph.node)]
    outputs = [(o.name, _dtype(onnx, o.type.tensor_type.elem_type, f"{fn}: output '{o.name}'")
                 if o.type.HasField("tensor_type") and o.type.tensor_type.elem_type else None)
                for o in model.graph.output]
    model.graph.ClearField("initializer")
    kept = [vi for vi in model.graph.input if vi.name not in inits]
    model.graph.ClearField("input")
    model.graph.input.extend(kept)
    return GraphSpec(int(model.ir_version), opset, model.producer_name or "", model.graph.name or "", inputs,
                     outputs, inits, nodes, model.SerializeToString())


def first_opset(op: str) -> int | None:
    """The first operator set of ONNX's own domain that defines ``op`` (None: ONNX does not define it, as ggmlR's
    Silu)."""
    return _first_opsets().get(op)


@functools.lru_cache(maxsize=1)
def _first_opsets() -> dict[str, int]:
    onnx = onnx_package("onnx_load")
    first: dict[str, int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == "":
            first[schema.name] = min(first.get(schema.name, 10 ** 6), int(schema.since_version))
    return first


def with_initializers(skeleton: bytes, arrays: dict[str, np.ndarray], fn: str) -> bytes:
    """A model's ``skeleton`` (``GraphSpec.skeleton``) with ``arrays`` as its initializers, serialized."""
    onnx = onnx_package(fn)
    model = onnx.load_model_from_string(skeleton)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(np.asarray(a), name) for name, a in arrays.items())
    return bytes(model.SerializeToString())


def _attribute(onnx: ModuleType, attribute: object) -> object:
    """An attribute's value as Python has it, strings (ONNX's bytes) decoded: the builders compare them with str."""
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8", "replace") for v in value]
    return value


def np_dtype(elem_type: int, what: str, fn: str = "onnx_load") -> np.dtype:
    """The numpy dtype of an ONNX element type (``TensorProto.FLOAT`` ...), or a ValueError naming ``what``."""
    return _dtype(onnx_package(fn), elem_type, what)


def _dtype(onnx: ModuleType, elem_type: int, what: str) -> np.dtype:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:   # noqa: BLE001 - an undefined or exotic element type
        raise GgmlValueError(f"{what} has ONNX element type {elem_type}, which numpy cannot hold") from None
