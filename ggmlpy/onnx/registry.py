"""The operators the importer builds, by ONNX name: each one's builder, the attributes it reads (a node with any
other is refused when the model loads) and, where numpy can, how to compute it when every input is known (shapes,
axes, constants: folded while the graph is built, never computed by ggml)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .protobuf import Node
from .values import Build, Value


# builder(b, node, inputs (None for an omitted optional one), opset) -> outputs
Builder = Callable[[Build, Node, list, int], list]
Folder = Callable[[Node, list, int], list]


@dataclass(frozen=True)
class OpSpec:
    build: Builder
    attrs: frozenset[str]
    fold: Folder | None = None
    since: int = 1        # the first opset whose semantics the builder follows
    static: frozenset[int] = frozenset()   # inputs that must be known when the graph is built (shapes, axes)
    domains: frozenset[str] = frozenset({"", "ai.onnx"})   # the operator sets it belongs to
    numbers: frozenset[int] = frozenset()   # inputs read as numbers where known (an exponent, a scale): never weights


OPS: dict[str, OpSpec] = {}


def op(*names: str, attrs: tuple[str, ...] = (), fold: Folder | None = None, since: int = 1,
       static: tuple[int, ...] = (), domain: str = "", numbers: tuple[int, ...] = ()) -> Callable[[Builder], Builder]:
    """Register a builder for the ONNX operators ``names``; ``static``: the inputs it needs known when the graph is
    built (a graph input there is read from each run's data, and its value picks the graph); ``domain``: an operator
    set other than ONNX's own ("com.microsoft": onnxruntime's quantized operators); ``numbers``: inputs it reads as
    numbers where they are known (a Pow's exponent, a quantization's scales), which a fine-tuned import keeps
    constant (trainable.py)."""
    def register(fn: Builder) -> Builder:
        for name in names:
            spec = OpSpec(fn, frozenset(attrs), fold, since, frozenset(static), numbers=frozenset(numbers))
            OPS[name] = dataclasses.replace(spec, domains=frozenset({domain})) if domain else spec
        return fn
    return register


def known(xs: list) -> list[np.ndarray | None]:
    """The known arrays of ``xs`` (an omitted input stays None)."""
    return [None if x is None else x.const for x in xs]


def all_known(xs: list) -> bool:
    return all(x is None or x.const is not None for x in xs)


def const_arg(b: Build, v: Value | None, what: str) -> np.ndarray:
    """An input that must be known when the graph is built (a shape, axes, pads): its array, or an error."""
    if v is None:
        raise b.fail(f"its {what} input is missing")
    if v.const is None:
        raise b.fail(f"its {what} must be known when the graph is built (a constant, an initializer, or computed "
                     "from shapes); here it is computed from the data")
    return v.const


def axis_of(b: Build, axis: int, rank: int) -> int:
    """A (possibly negative) ONNX axis as 0..rank-1."""
    a = int(axis)
    if not -rank <= a < max(rank, 1):
        raise b.fail(f"axis {axis} is out of range for a tensor of rank {rank}")
    return a % max(rank, 1)
