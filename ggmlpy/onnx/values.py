"""The values an ONNX graph's nodes pass each other while its ggml graph is built: a ggml tensor with its ONNX
(numpy-order) shape, or an array known when the graph is built (a shape, axes, a constant, an initializer used as
one), and the builder that makes tensors of them (``Build``).

ggml's tensors hold up to 4 dimensions in reverse order: an ONNX tensor of shape ``(d0, ..., dk)`` is a ggml tensor
with ``ne = (dk, ..., d0)``, so NCHW images are ggml's ``[W, H, C, N]`` layout as they are, and a rank-0 scalar is
``ne = (1,)``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._ffi import lib
from ..backend.device import Device
from ..core.types import GGML_TYPE_F32, GGML_TYPE_I32
from ..errors import GgmlValueError
from ..graph.objects import Context, Tensor
from ..graph.tensor import ggml_new_tensor, ggml_set_input, ggml_set_name, pending_constant
from ..ops.elementwise import ggml_cont
from ..ops.layout import ggml_reshape
from ..ops.reduce import ggml_repeat


@dataclass
class Value:
    """A node's output: ``shape`` in ONNX order; ``tensor`` (F32, or I32 for integer data) where ggml computes it,
    ``const`` where it is known when the graph is built."""
    shape: tuple[int, ...]
    tensor: Tensor | None = None
    const: np.ndarray | None = None
    source: str | None = None     # an integer graph input's name: row indices read it (``Build.indices``)
    dtype: np.dtype | None = None  # the ONNX element type where it is not float32 (an integer input, a Cast)

    @staticmethod
    def of(array: np.ndarray) -> Value:
        a = np.asarray(array)
        return Value(tuple(int(d) for d in a.shape), const=a)

    @property
    def known(self) -> bool:
        return self.const is not None


def ne_of(shape: tuple[int, ...]) -> tuple[int, ...]:
    """ggml's ``ne`` of an ONNX shape (rank 0: one element); a rank above 4 fits where it has size-1 axes, which are
    left out (the leading ones first)."""
    ne = list(reversed(shape)) or [1]
    while len(ne) > 4 and 1 in ne:
        del ne[len(ne) - 1 - ne[::-1].index(1)]
    return tuple(ne)


class Build:
    """What an operator builds its ops with: the graph's contexts, its constants and inputs, and the device's
    weights. ``where`` names the node being built, for errors."""

    def __init__(self, ctx: Context, ctx_io: Context | None, weights: dict[str, Tensor],
                 constant: Callable[[np.ndarray], Tensor] | None = None) -> None:
        self.ctx, self.ctx_io, self.weights = ctx, ctx_io, weights
        self.constants: list[tuple[Tensor, np.ndarray]] = []
        # how a known value becomes a tensor: by default one of ctx_io, written once its buffer exists (``constants``)
        self.constant = constant or (lambda arr: pending_constant(self.io, arr, self.constants))
        self.indices: dict[tuple[str, int], Tensor] = {}   # (integer input, length it indexes) -> its I32 copy
        self.weights_t: dict[str, Tensor] = {}
        self.device: Device | None = None   # the model's device (which fused ops it computes)
        self.differentiable = False   # a training graph: only ops ggml differentiates (trainable.py)
        self.given_indices: dict[str, Tensor] = {}   # integer inputs given as I32 row indices (trainable.py)
        self.where = ""

    def fail(self, message: str) -> GgmlValueError:
        return GgmlValueError(f"{self.where}: {message}")

    @property
    def io(self) -> Context:
        if self.ctx_io is None:
            raise self.fail("it needs an input tensor of its own, which a graph built inside a model cannot have")
        return self.ctx_io

    def input(self, name: str, shape: tuple[int, ...], integer: bool) -> Tensor:
        ne = ne_of(shape)
        self.check_rank(shape)
        t = ggml_set_input(ggml_new_tensor(self.io, GGML_TYPE_I32 if integer else GGML_TYPE_F32, len(ne), ne))
        return ggml_set_name(t, name[:63])

    def index_input(self, name: str, shape: tuple[int, ...], length: int) -> Tensor:
        """An I32 copy of the integer input ``name`` as row indices into an axis of ``length``: onnx_run checks
        its values against that length and wraps negative ones (one copy per length; the input's own F32 tensor
        keeps its values)."""
        if name in self.given_indices:   # a model's int32 input (trainable.py): its ids checked by the fit
            return self.given_indices[name]
        key = (name, length)
        if key not in self.indices:
            self.indices[key] = self.input(f"{name[:40]}#rows{length}", shape, True)
        return self.indices[key]

    def check_rank(self, shape: tuple[int, ...]) -> None:
        if len(ne_of(shape)) > 4:
            raise self.fail(f"a tensor of rank {len(shape)} {shape}: ggml's tensors have at most 4 dimensions")

    def tensor(self, v: Value, integer: bool = False) -> Tensor:
        """``v`` as a ggml tensor: itself, or its known value as a constant (F32, or I32 with ``integer``)."""
        if v.tensor is not None:
            return v.tensor
        assert v.const is not None
        self.check_rank(v.shape)
        arr = np.asarray(v.const, np.int32 if integer else np.float32).reshape(tuple(reversed(ne_of(v.shape))))
        return self.constant(arr)

    def contiguous(self, t: Tensor) -> Tensor:
        return t if lib.ggml_is_contiguous(t.ptr) else ggml_cont(self.ctx, t)

    def reshaped(self, v: Value, shape: tuple[int, ...]) -> Tensor:
        """``v``'s tensor with the ONNX shape ``shape`` (as many elements)."""
        self.check_rank(shape)
        t = self.contiguous(self.tensor(v))
        ne = ne_of(shape)
        if tuple(t.shape[:len(ne)]) == ne and all(d == 1 for d in t.shape[len(ne):]):
            return t
        return ggml_reshape(self.ctx, t, self.shape_target(shape))

    def shape_target(self, shape: tuple[int, ...]) -> Tensor:
        ne = ne_of(shape)
        return ggml_new_tensor(self.ctx, GGML_TYPE_F32, len(ne), ne)

    def broadcast(self, v: Value, shape: tuple[int, ...]) -> Tensor:
        """``v``'s tensor repeated to ``shape`` (numpy broadcasting), where it is not that shape already."""
        if v.shape == shape:
            return self.tensor(v)
        padded = (1,) * (len(shape) - len(v.shape)) + v.shape
        t = self.reshaped(v, padded)
        return t if padded == shape else ggml_repeat(self.ctx, t, self.shape_target(shape))
