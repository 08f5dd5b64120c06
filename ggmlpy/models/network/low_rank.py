"""Low-rank adapters on a layer's product weights (LoRA): which weights of a layer have one, with what rank and
scale, and their two factors as weights of the layer.

An adapter on a weight ``W`` that a layer multiplies as ``ggml_mul_mat(W [K, M], x)`` adds
``alpha / rank * B (A x)`` to the product, with ``A [K, rank]`` and ``B [rank, M]`` (ggml shapes): the weight the
layer computes with is ``W + alpha / rank * (A B)`` without that sum being made. ``A`` starts random and ``B`` at
zero, so the model starts as it was. Its factors are weights of the layer (``<weight>_lora_a``,
``<weight>_lora_b``: saved, read and written as any weight), and the only ones that train in a layer that has
one (its own weights stay frozen: F32 or quantized).

A product weight's declared fans (``ParamSpec.fans``) are its product's ``(K, M)``: that is the shape an adapter
factors.
"""
from __future__ import annotations

from ..layers.layer import Layer
from ..layers.weight import ParamSpec


SUFFIXES = ("_lora_a", "_lora_b")


def adapters(layer: Layer) -> dict[str, tuple[int, float]]:
    """The adapters ``layer`` has: ``{weight name: (rank, alpha)}``."""
    return layer.__dict__.get("_lora") or {}


def adapter_names(weight: str) -> tuple[str, str]:
    """The names of the two factors (A, B) of an adapter on ``weight``."""
    return weight + SUFFIXES[0], weight + SUFFIXES[1]


def adaptable(spec: ParamSpec) -> bool:
    """Whether an adapter can go on this weight: one the layer only multiplies, as a product's first operand."""
    return spec.quantizable == "product" and spec.adapts is None and spec.fans[0] * spec.fans[1] == _count(spec.ne)


def attach(layer: Layer, weight: str, rank: int, alpha: float) -> None:
    """Give ``layer`` (built) an adapter of ``rank`` on its product weight ``weight``: the two factors join its
    weights (``layer.params``) and it is listed in ``adapters(layer)``."""
    spec = next(p for p in layer.params or [] if p.name == weight)
    k, m = spec.fans
    a_name, b_name = adapter_names(weight)
    factors = [ParamSpec(a_name, (k, rank), "lecun_uniform", (k, rank), adapts=weight),
               ParamSpec(b_name, (rank, m), "zeros", (rank, m), adapts=weight)]
    layer.params = [p for p in layer.params or [] if p.name not in (a_name, b_name)] + factors
    layer.__dict__["_lora"] = {**adapters(layer), weight: (int(rank), float(alpha))}


def detach(layer: Layer, weight: str) -> None:
    """Remove the adapter on ``weight`` (its factors leave the layer's weights)."""
    names = adapter_names(weight)
    layer.params = [p for p in layer.params or [] if p.name not in names]
    layer.__dict__["_lora"] = {w: v for w, v in adapters(layer).items() if w != weight}


def _count(ne: tuple[int, ...]) -> int:
    n = 1
    for d in ne:
        n *= d
    return n
