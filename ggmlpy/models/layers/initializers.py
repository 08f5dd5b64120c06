"""Keras' weight initializers by name: how a layer's weight starts (``ParamSpec.initial`` draws through here)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import GgmlValueError


# Keras' initializers by name: VarianceScaling's (scale, fans used, distribution) for the scaled ones
VARIANCE_SCALING = {"glorot_normal": (1.0, "avg", "truncated"), "he_uniform": (2.0, "in", "uniform"),
                    "he_normal": (2.0, "in", "truncated"), "lecun_uniform": (1.0, "in", "uniform"),
                    "lecun_normal": (1.0, "in", "truncated")}
INITIALIZERS = ("glorot_uniform", *VARIANCE_SCALING, "random_normal", "random_uniform", "zeros", "ones",
                "orthogonal", "uniform")   # Keras' Embedding default "uniform": random_uniform's +-0.05


def check_initializer(name: Any, what: str) -> str:
    if not isinstance(name, str) or name.lower() not in INITIALIZERS:
        raise GgmlValueError(f"{what} must be one of {', '.join(INITIALIZERS)} (Keras' names), got {name!r}")
    return name.lower()


def initial_values(init: str, shape: tuple[int, ...], fans: tuple[int, int], rng: np.random.RandomState) -> np.ndarray:
    """A weight of numpy shape ``shape`` drawn as ``init`` says (a Keras name, or one of the layers' own: "glorot",
    "embedding", "unit_forget_bias[:<name>]"), ``fans`` its (fan-in, fan-out)."""
    if init in ("glorot", "glorot_uniform"):  # Glorot (Xavier) uniform, as Keras
        limit = math.sqrt(6.0 / (fans[0] + fans[1]))
        return rng.uniform(-limit, limit, size=shape).astype(np.float32)
    if init in VARIANCE_SCALING:
        return _variance_scaling(shape, fans, *VARIANCE_SCALING[init], rng)
    if init == "random_normal":
        return rng.normal(0.0, 0.05, size=shape).astype(np.float32)
    if init in ("random_uniform", "embedding", "uniform"):
        return rng.uniform(-0.05, 0.05, size=shape).astype(np.float32)
    if init == "orthogonal":  # Keras' recurrent kernels: orthonormal rows (or columns), gain 1
        tall = (max(shape), min(shape))
        q, r = np.linalg.qr(rng.normal(0.0, 1.0, size=tall))
        q = q * np.sign(np.diag(r))
        return (q if shape == tall else q.T).astype(np.float32)
    if init.startswith("unit_forget_bias"):  # Keras' LSTM bias: the forget gate's (2nd quarter) ones, the other
        # gates' from the bias initializer ("unit_forget_bias:<name>"; zeros by default)
        bias = initial_values(init.partition(":")[2] or "zeros", shape, fans, rng)
        units = shape[-1] // 4
        bias[..., units:2 * units] = 1.0
        return bias
    if init in ("ones", "zeros"):
        return np.full(shape, 1.0 if init == "ones" else 0.0, dtype=np.float32)
    raise GgmlValueError(f"unknown initializer {init!r}; expected one of {', '.join(WEIGHT_INITIALIZERS)}")


# every name a weight can start from: Keras' and the layers' own ("given": values the layer supplies)
WEIGHT_INITIALIZERS = (*INITIALIZERS, "glorot", "embedding", "given")


def check_weight_initializer(init: object, what: str) -> str:
    """A weight's initializer as a layer declares it: one of ``WEIGHT_INITIALIZERS`` (Keras' names, "glorot",
    "embedding", "given"), or "unit_forget_bias[:<Keras name>]"."""
    base = init.partition(":")[2] if isinstance(init, str) and init.startswith("unit_forget_bias") else init
    if not isinstance(init, str) or (base != "" and (not isinstance(base, str) or
                                                      base.lower() not in WEIGHT_INITIALIZERS)):
        raise GgmlValueError(f"{what}: unknown initializer {init!r}; expected one of {', '.join(WEIGHT_INITIALIZERS)}")
    return init


def _variance_scaling(shape: tuple[int, ...], fans: tuple[int, int], scale: float, mode: str, distribution: str,
                      rng: np.random.RandomState) -> np.ndarray:
    """Keras' VarianceScaling: variance scale / n (n the fan-in, or the mean of fan-in and fan-out); uniform in
    +-sqrt(3 scale / n), or a normal truncated at two standard deviations whose spread makes up for the cut."""
    n = fans[0] if mode == "in" else (fans[0] + fans[1]) / 2.0
    if distribution == "uniform":
        limit = math.sqrt(3.0 * scale / n)
        return rng.uniform(-limit, limit, size=shape).astype(np.float32)
    std = math.sqrt(scale / n) / 0.87962566103423978  # the standard deviation of N(0, 1) cut at +-2
    values = rng.normal(0.0, std, size=shape)
    outside = np.abs(values) > 2 * std
    while outside.any():  # draw again where the value fell beyond two standard deviations
        values[outside] = rng.normal(0.0, std, size=int(outside.sum()))
        outside = np.abs(values) > 2 * std
    return values.astype(np.float32)
