"""Numerical tests of the model layer's layers against the float64 numpy references of
tests/helpers/layer_refs.py.

For every layer, in tiny models:

* forward: ``ggml_predict`` equals the reference inference pass;
* gradients: one SGD step (no momentum, no weight decay) of ``ggml_trainer`` on the MSE loss gives the
  gradient ``(w0 - w1) / eta`` of every trainable weight; it must equal central finite differences of
  the reference *training* loss (batch norm on batch statistics). Layers without weights are checked
  through the weights of the layer before them;
* batch-norm running statistics, dropout masks, concatenate's backward (patches/0006), the same
  one-step gradients on Vulkan (compared with the CPU), and a model whose training graph is larger
  than ggml's default graph size (patches/0005).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.models.layers.activations import ACTIVATIONS
from tests.helpers import layer_refs as R
from tests.helpers import ROOT


ETA = 0.1            # the SGD learning rate of the gradient checks: grad = (w0 - w1) / ETA
GRAD_RTOL, GRAD_ATOL = 1e-3, 1e-5
FWD_RTOL, FWD_ATOL = 1e-5, 1e-5
NON_TRAINABLE = ("running_mean", "running_var")


# ---------------------------------------------------------------- helpers

pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def sequential(*layers: tuple[Callable, tuple, dict]) -> Any:
    model = g.ggml_model_sequential()
    for fn, args, kw in layers:
        model = fn(model, *args, **kw)
    return model


def compile_sgd(model: Any, backend: str = "cpu", lr: float = ETA) -> Any:
    return g.ggml_compile(model, optimizer="sgd", loss="mse", metrics=[], backend=backend, learning_rate=lr)


def randomize(model: Any, rng: np.random.RandomState) -> dict[str, np.ndarray]:
    """Give every weight a random value (non-zero biases, gamma away from 1, ...) so that each one matters
    in the comparisons; returns the weights as the model holds them (float32)."""
    new = {}
    for key, w in g.ggml_get_weights(model).items():
        kind = key.rsplit(".", 1)[1]
        if kind in ("bias", "beta", "running_mean"):
            new[key] = rng.normal(0, 0.3, w.shape)
        elif kind == "gamma":
            new[key] = rng.uniform(0.5, 1.5, w.shape)
        elif kind == "running_var":
            new[key] = rng.uniform(0.5, 2.0, w.shape)
        else:
            new[key] = rng.uniform(-0.8, 0.8, w.shape)
    g.ggml_set_weights(model, new)
    return g.ggml_get_weights(model)


def trainable(weights: dict) -> list[str]:
    return [k for k in weights if k.rsplit(".", 1)[1] not in NON_TRAINABLE]


def one_step_gradients(model: Any, x: Any, y: np.ndarray, lr: float = ETA) -> dict[str, np.ndarray]:
    """The gradient of the model's loss on (x, y) from one SGD step: (w0 - w1) / lr, in float64."""
    w0 = g.ggml_get_weights(model)
    n = (x[0] if isinstance(x, list) else x).shape[0]
    tr = g.ggml_trainer(model, batch_size=n)
    try:
        loss = tr.step(x, y)
    finally:
        tr.free()
    assert np.isfinite(loss)
    w1 = g.ggml_get_weights(model)
    return {k: (w0[k].astype(np.float64) - w1[k].astype(np.float64)) / lr for k in trainable(w0)}


def assert_close(got: Any, want: Any, rtol: float, atol: float, what: str) -> None:
    if isinstance(want, (list, tuple)):   # a multi-output model: output by output
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{what}: {len(want)} outputs expected"
        for i, (a, b) in enumerate(zip(got, want)):
            assert_close(a, b, rtol, atol, f"{what} (output {i})")
        return
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    err = np.abs(got - want)
    bad = err > atol + rtol * np.abs(want)
    if bad.any():
        i = np.unravel_index(np.argmax(err - rtol * np.abs(want)), err.shape)
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} values differ; worst at {i}: got {got[i]!r}, "
                             f"expected {want[i]!r} (max abs err {err.max():.3g}, max |expected| "
                             f"{np.abs(want).max():.3g})")


# ---------------------------------------------------------------- the cases

@dataclass
class Case:
    """A tiny model, its reference forward ``ref(weights, x, training)``, and its data. A model of several inputs
    takes ``x`` as a list; one of several outputs has a ``ref`` that returns a list (the loss: the sum of the
    outputs' MSEs)."""
    name: str
    build: Callable[[], Any]
    ref: Callable[[dict, Any, bool], np.ndarray]
    x: Callable[[np.random.RandomState], Any]
    fwd_tol: tuple[float, float] = (FWD_RTOL, FWD_ATOL)
    grad_tol: tuple[float, float] = (GRAD_RTOL, GRAD_ATOL)
    zero_grads: tuple[str, ...] = ()   # weights whose gradient is 0 by construction (a bias before batch norm)
    isolate: bool = False              # the training step may abort the process: check it in a subprocess
    vulkan_grad_tol: tuple[float, float] | None = None   # (rtol, atol) of Vulkan's gradients against the CPU's


def normal(*shape: int, scale: float = 1.0) -> Callable:
    return lambda rng: rng.normal(0, scale, shape).astype(np.float32)


CASES: list[Case] = []


def case(*args: Any, **kw: Any) -> None:
    CASES.append(Case(*args, **kw))


# dense, every activation (gelu was loose while ggml's CPU read it from a float16 table; patches/0019).
for _act in [None, "relu", "sigmoid", "tanh", "gelu", "silu", "softmax", "elu", "selu", "leaky_relu", "relu6",
             "hard_sigmoid", "hard_silu", "softsign", "softplus", "mish", "exponential", "celu", "log_sigmoid",
             "hard_tanh", "soft_shrink", "tanh_shrink", "squareplus", "sparse_plus"]:
    case(f"dense_{_act or 'linear'}",
         lambda a=_act: sequential((g.ggml_layer_dense, (5,), dict(activation=a, input_shape=(4,), name="d"))),
         lambda w, x, t, a=_act: R.dense(x, w["d.weight"], w["d.bias"], a),
         normal(3, 4),
         fwd_tol=(FWD_RTOL, FWD_ATOL), grad_tol=(GRAD_RTOL, GRAD_ATOL))

case("dense_two_layers",
     lambda: sequential((g.ggml_layer_dense, (6,), dict(activation="tanh", input_shape=(3,), name="d1")),
                        (g.ggml_layer_dense, (2,), dict(activation="sigmoid", name="d2"))),
     lambda w, x, t: R.dense(R.dense(x, w["d1.weight"], w["d1.bias"], "tanh"), w["d2.weight"], w["d2.bias"],
                             "sigmoid"),
     normal(4, 3))

case("dense_on_sequences",   # a dense layer on (steps, features) samples acts on the last axis
     lambda: sequential((g.ggml_layer_dense, (2,), dict(activation="tanh", input_shape=(3, 4), name="d"))),
     lambda w, x, t: R.dense(x, w["d.weight"], w["d.bias"], "tanh"),
     normal(2, 3, 4))


# conv_2d: (input shape, filters, kernel, strides, padding, activation)
_CONV2D = {
    "conv2d_valid": ((5, 6, 2), 3, (3, 2), (1, 1), "valid", "tanh"),
    "conv2d_valid_strided": ((7, 6, 2), 2, (3, 3), (2, 1), "valid", None),
    "conv2d_valid_one_channel": ((5, 4, 1), 2, (2, 2), (1, 1), "valid", "relu"),
    "conv2d_same_even_kernel": ((4, 5, 2), 3, (2, 3), (1, 1), "same", None),    # pads (0, 1) and (1, 1)
    "conv2d_same_stride2": ((5, 6, 1), 2, (3, 3), (2, 2), "same", "sigmoid"),  # pads (1, 1) and (0, 1)
    "conv2d_same_uneven": ((7, 7, 2), 2, (4, 2), (2, 3), "same", None),        # pads (1, 2) and (0, 1)
}
for _name, (_shape, _f, _k, _s, _p, _a) in _CONV2D.items():
    case(_name,
         lambda sh=_shape, f=_f, k=_k, s=_s, p=_p, a=_a: sequential(
             (g.ggml_layer_conv_2d, (f, k), dict(strides=s, padding=p, activation=a, input_shape=sh, name="c"))),
         lambda w, x, t, s=_s, p=_p, a=_a: R.conv2d(x, w["c.kernel"], w["c.bias"], s, p, a),
         normal(3, *_shape))

# conv_1d: (input shape, filters, kernel, stride, padding, activation)
_CONV1D = {
    "conv1d_valid": ((7, 2), 3, 3, 1, "valid", "tanh"),
    "conv1d_valid_stride2": ((8, 3), 2, 3, 2, "valid", None),
    "conv1d_same_even_kernel": ((6, 2), 2, 4, 1, "same", None),     # pads (1, 2)
    "conv1d_same_stride2_one_channel": ((7, 1), 3, 3, 2, "same", "silu"),  # pads (1, 1)
    "conv1d_same_stride3": ((8, 2), 2, 2, 3, "same", None),         # no padding
}
for _name, (_shape, _f, _k, _s, _p, _a) in _CONV1D.items():
    case(_name,
         lambda sh=_shape, f=_f, k=_k, s=_s, p=_p, a=_a: sequential(
             (g.ggml_layer_conv_1d, (f, k), dict(strides=s, padding=p, activation=a, input_shape=sh, name="c"))),
         lambda w, x, t, s=_s, p=_p, a=_a: R.conv1d(x, w["c.kernel"], w["c.bias"], s, p, a),
         normal(3, *_shape))

case("conv1d_then_dense",
     lambda: sequential((g.ggml_layer_conv_1d, (3, 2), dict(activation="relu", input_shape=(6, 2), name="c")),
                        (g.ggml_layer_dense, (2,), dict(name="d"))),
     lambda w, x, t: R.dense(R.conv1d(x, w["c.kernel"], w["c.bias"], 1, "valid", "relu"), w["d.weight"],
                             w["d.bias"]),
     normal(3, 6, 2))


def _conv(shape, f=3, k=(2, 2), name="c", **kw):
    return (g.ggml_layer_conv_2d, (f, k), dict(input_shape=shape, name=name, **kw))


def _conv_ref(w, x, name="c", act=None, s=(1, 1), p="valid"):
    return R.conv2d(x, w[f"{name}.kernel"], w[f"{name}.bias"], s, p, act)


# pooling (after a conv, whose weights carry the gradient check)
case("max_pooling_2d",
     lambda: sequential(_conv((6, 7, 2)), (g.ggml_layer_max_pooling_2d, ((2, 2),), {})),
     lambda w, x, t: R.max_pooling_2d(_conv_ref(w, x), (2, 2)),
     normal(3, 6, 7, 2))
case("max_pooling_2d_strides",
     lambda: sequential(_conv((6, 7, 2)), (g.ggml_layer_max_pooling_2d, ((3, 2),), dict(strides=(1, 2)))),
     lambda w, x, t: R.max_pooling_2d(_conv_ref(w, x), (3, 2), (1, 2)),
     normal(3, 6, 7, 2))
case("max_pooling_2d_then_dense",
     lambda: sequential(_conv((5, 5, 1), f=2), (g.ggml_layer_max_pooling_2d, ((2, 2),), {}),
                        (g.ggml_layer_flatten, (), {}), (g.ggml_layer_dense, (3,), dict(name="d"))),
     lambda w, x, t: R.dense(R.flatten(R.max_pooling_2d(_conv_ref(w, x), (2, 2))), w["d.weight"], w["d.bias"]),
     normal(3, 5, 5, 1))
# dilated convolutions (Keras' dilation_rate): the reference inserts zeros between the kernel's taps
case("conv2d_dilated_valid",
     lambda: sequential(_conv((7, 8, 2), k=(2, 3), dilation_rate=(2, 1))),
     lambda w, x, t: R.conv2d(x, w["c.kernel"], w["c.bias"], dilation=(2, 1)),
     normal(3, 7, 8, 2))
case("conv2d_dilated_same",
     lambda: sequential(_conv((6, 7, 2), k=(3, 3), dilation_rate=2, padding="same")),
     lambda w, x, t: R.conv2d(x, w["c.kernel"], w["c.bias"], padding="same", dilation=(2, 2)),
     normal(3, 6, 7, 2))
case("conv1d_dilated_same",
     lambda: sequential((g.ggml_layer_conv_1d, (3, 3), dict(input_shape=(10, 2), name="c", dilation_rate=3,
                                                            padding="same"))),
     lambda w, x, t: R.conv1d(x, w["c.kernel"], w["c.bias"], padding="same", dilation=3),
     normal(3, 10, 2))


# a custom layer written with ggmlpy ops (issue 26, item 9): weights by name in ggml's order, autodiff's gradients
def _affine(ctx, x, w):
    return g.ggml_tanh(ctx, g.ggml_add(ctx, g.ggml_mul_mat(ctx, w["kernel"], x), w["bias"]))


case("custom_layer_affine_tanh",
     lambda: sequential((g.ggml_custom_layer, (_affine,), dict(weights={"kernel": (4, 3), "bias": (3,)},
                                                               output_shape=(3,), input_shape=(4,), name="c"))),
     lambda w, x, t: np.tanh(np.asarray(x, np.float64) @ w["c.kernel"].T + w["c.bias"]),
     normal(3, 4))
case("custom_layer_on_sequences_keeps_the_shape",
     lambda: sequential((g.ggml_layer_dense, (3,), dict(input_shape=(5, 2), name="d")),
                        (g.ggml_custom_layer, (lambda ctx, x, w: g.ggml_mul(ctx, x, w["gain"]),),
                         dict(weights={"gain": ((3, 1), "ones")}, name="c"))),
     lambda w, x, t: R.dense(x, w["d.weight"], w["d.bias"]) * w["c.gain"].reshape(1, 1, 3),
     normal(3, 5, 2))


# a relu before a max-pool runs after it (they commute, gradients included): the pool reads the conv's output
def _relu_shared_model():
    x = g.ggml_input((6, 7, 2), name="x")
    c = g.ggml_layer_conv_2d(x, 3, (2, 2), activation="relu", name="c")
    pooled = g.ggml_layer_max_pooling_2d(c, (2, 2))
    return g.ggml_model(x, g.ggml_layer_add([pooled, g.ggml_layer_conv_2d(c, 3, (4, 4), name="c2")]))


case("conv_relu_then_max_pooling_2d",
     lambda: sequential(_conv((6, 7, 2), activation="relu"), (g.ggml_layer_max_pooling_2d, ((2, 2),), {})),
     lambda w, x, t: R.max_pooling_2d(_conv_ref(w, x, act="relu"), (2, 2)),
     normal(3, 6, 7, 2))
case("conv_relu_then_overlapping_max_pooling_2d",
     lambda: sequential(_conv((6, 7, 2), activation="relu"),
                        (g.ggml_layer_max_pooling_2d, ((3, 2),), dict(strides=(1, 2)))),
     lambda w, x, t: R.max_pooling_2d(_conv_ref(w, x, act="relu"), (3, 2), (1, 2)),
     normal(3, 6, 7, 2))
case("conv_without_bias_relu_then_max_pooling_2d",
     lambda: sequential(_conv((6, 7, 2), activation="relu", use_bias=False),
                        (g.ggml_layer_max_pooling_2d, ((2, 2),), {})),
     lambda w, x, t: R.max_pooling_2d(R.conv2d(x, w["c.kernel"], None, (1, 1), "valid", "relu"), (2, 2)),
     normal(3, 6, 7, 2))
case("conv_relu_feeding_a_max_pool_and_a_conv", _relu_shared_model,
     lambda w, x, t: R.add([R.max_pooling_2d(_conv_ref(w, x, act="relu"), (2, 2)),
                            _conv_ref(w, _conv_ref(w, x, act="relu"), "c2")]),
     normal(3, 6, 7, 2))
# pooling, resampling and shaping layers without weights (issue 26), after a weighted layer whose gradient
# checks them
case("average_pooling_2d",
     lambda: sequential(_conv((6, 7, 2)), (g.ggml_layer_average_pooling_2d, ((2, 3),), {})),
     lambda w, x, t: R.average_pooling_2d(_conv_ref(w, x), (2, 3)),
     normal(3, 6, 7, 2))
case("average_pooling_2d_overlapping",
     lambda: sequential(_conv((6, 7, 2)), (g.ggml_layer_average_pooling_2d, ((3, 2),), dict(strides=(1, 2)))),
     lambda w, x, t: R.average_pooling_2d(_conv_ref(w, x), (3, 2), (1, 2)),
     normal(3, 6, 7, 2))
# padding='same' (Keras'): windows at the edges over the positions inside only; odd sizes pad unevenly
case("max_pooling_2d_same",
     lambda: sequential(_conv((6, 7, 2)), (g.ggml_layer_max_pooling_2d, ((3, 2),), dict(padding="same"))),
     lambda w, x, t: R.pooling_same(_conv_ref(w, x), (3, 2), None, "max"),
     normal(3, 6, 7, 2))
case("max_pooling_2d_same_after_relu",
     lambda: sequential(_conv((5, 7, 2), activation="relu", use_bias=False),
                        (g.ggml_layer_max_pooling_2d, ((2, 2),), dict(strides=(2, 3), padding="same"))),
     lambda w, x, t: R.pooling_same(R.conv2d(x, w["c.kernel"], None, (1, 1), "valid", "relu"), (2, 2), (2, 3), "max"),
     normal(3, 5, 7, 2))
case("average_pooling_2d_same",
     lambda: sequential(_conv((6, 7, 2)), (g.ggml_layer_average_pooling_2d, ((3, 3),), dict(strides=(2, 2),
                                                                                            padding="same"))),
     lambda w, x, t: R.pooling_same(_conv_ref(w, x), (3, 3), (2, 2), "avg"),
     normal(3, 6, 7, 2))
case("upsampling_2d",
     lambda: sequential(_conv((4, 5, 2)), (g.ggml_layer_upsampling_2d, ((2, 3),), {})),
     lambda w, x, t: R.upsampling_2d(_conv_ref(w, x), (2, 3)),
     normal(3, 4, 5, 2))
_SEQ = (g.ggml_layer_conv_1d, (3, 2), dict(input_shape=(9, 2), name="c"))


def _seq_ref(w, x):
    return R.conv1d(x, w["c.kernel"], w["c.bias"])


case("max_pooling_1d",
     lambda: sequential(_SEQ, (g.ggml_layer_max_pooling_1d, (3,), {})),
     lambda w, x, t: R.pooling_1d(_seq_ref(w, x), 3, None, "max"),
     normal(3, 9, 2))
case("average_pooling_1d_strides",
     lambda: sequential(_SEQ, (g.ggml_layer_average_pooling_1d, (3,), dict(strides=2))),
     lambda w, x, t: R.pooling_1d(_seq_ref(w, x), 3, 2, "avg"),
     normal(3, 9, 2))
case("max_pooling_1d_same",
     lambda: sequential(_SEQ, (g.ggml_layer_max_pooling_1d, (2,), dict(padding="same"))),
     lambda w, x, t: R.pooling_same(_seq_ref(w, x), (2,), None, "max"),
     normal(3, 9, 2))
case("average_pooling_1d_same",
     lambda: sequential(_SEQ, (g.ggml_layer_average_pooling_1d, (4,), dict(strides=3, padding="same"))),
     lambda w, x, t: R.pooling_same(_seq_ref(w, x), (4,), (3,), "avg"),
     normal(3, 9, 2))
case("global_average_pooling_1d",
     lambda: sequential(_SEQ, (g.ggml_layer_global_average_pooling_1d, (), {})),
     lambda w, x, t: _seq_ref(w, x).mean(axis=1),
     normal(3, 9, 2))
case("global_max_pooling_1d",
     lambda: sequential(_SEQ, (g.ggml_layer_global_max_pooling_1d, (), {})),
     lambda w, x, t: _seq_ref(w, x).max(axis=1),
     normal(3, 9, 2))
case("activation_softmax",
     lambda: sequential((g.ggml_layer_dense, (5,), dict(input_shape=(4,), name="d")),
                        (g.ggml_layer_activation, ("softmax",), {})),
     lambda w, x, t: R.softmax(R.dense(x, w["d.weight"], w["d.bias"])),
     normal(3, 4))
case("reshape_then_conv1d",
     lambda: sequential((g.ggml_layer_dense, (12,), dict(input_shape=(4,), name="d")),
                        (g.ggml_layer_reshape, ((6, -1),), {}), (g.ggml_layer_conv_1d, (2, 3), dict(name="c"))),
     lambda w, x, t: R.conv1d(R.dense(x, w["d.weight"], w["d.bias"]).reshape(-1, 6, 2), w["c.kernel"], w["c.bias"]),
     normal(3, 4))
case("repeat_vector_then_dense",
     lambda: sequential((g.ggml_layer_dense, (3,), dict(input_shape=(4,), name="d")),
                        (g.ggml_layer_repeat_vector, (4,), {}), (g.ggml_layer_dense, (2,), dict(name="e"))),
     lambda w, x, t: R.dense(R.repeat_vector(R.dense(x, w["d.weight"], w["d.bias"]), 4), w["e.weight"], w["e.bias"]),
     normal(3, 4))
case("global_average_pooling_2d",
     lambda: sequential(_conv((5, 4, 2)), (g.ggml_layer_global_average_pooling_2d, (), {})),
     lambda w, x, t: R.global_average_pooling_2d(_conv_ref(w, x)),
     normal(3, 5, 4, 2))
case("global_max_pooling_2d",
     lambda: sequential(_conv((5, 4, 2)), (g.ggml_layer_global_max_pooling_2d, (), {})),
     lambda w, x, t: R.global_max_pooling_2d(_conv_ref(w, x)),
     normal(3, 5, 4, 2))
case("global_average_pooling_2d_then_dense",
     lambda: sequential(_conv((4, 4, 2)),
                        (g.ggml_layer_global_average_pooling_2d, (), {}), (g.ggml_layer_dense, (2,), dict(name="d"))),
     lambda w, x, t: R.dense(R.global_average_pooling_2d(_conv_ref(w, x)), w["d.weight"], w["d.bias"]),
     normal(3, 4, 4, 2))

# flatten: channels fastest
case("flatten_after_conv",
     lambda: sequential(_conv((4, 5, 2)), (g.ggml_layer_flatten, (), {})),
     lambda w, x, t: R.flatten(_conv_ref(w, x)),
     normal(3, 4, 5, 2))
case("flatten_after_conv_then_dense",
     lambda: sequential(_conv((4, 5, 2)), (g.ggml_layer_flatten, (), {}), (g.ggml_layer_dense, (3,), dict(name="d"))),
     lambda w, x, t: R.dense(R.flatten(_conv_ref(w, x)), w["d.weight"], w["d.bias"]),
     normal(3, 4, 5, 2))
case("flatten_after_dense_on_sequences",
     lambda: sequential((g.ggml_layer_dense, (2,), dict(input_shape=(3, 4), name="d")), (g.ggml_layer_flatten, (), {})),
     lambda w, x, t: R.flatten(R.dense(x, w["d.weight"], w["d.bias"])),
     normal(3, 3, 4))
case("flatten_after_conv1d",
     lambda: sequential((g.ggml_layer_conv_1d, (3, 2), dict(input_shape=(5, 2), name="c")),
                        (g.ggml_layer_flatten, (), {})),
     lambda w, x, t: R.flatten(R.conv1d(x, w["c.kernel"], w["c.bias"])),
     normal(3, 5, 2))


# batch norm
def _bn_ref(w, x, t, name="bn", eps=1e-5):
    return R.batch_norm(x, w[f"{name}.gamma"], w[f"{name}.beta"], w[f"{name}.running_mean"],
                        w[f"{name}.running_var"], eps, training=t)


case("batch_norm_after_dense",
     lambda: sequential((g.ggml_layer_dense, (4,), dict(input_shape=(3,), name="d")),
                        (g.ggml_layer_batch_norm, (), dict(name="bn"))),
     lambda w, x, t: _bn_ref(w, R.dense(x, w["d.weight"], w["d.bias"]), t),
     normal(6, 3), zero_grads=("d.bias",))   # batch norm subtracts the batch mean: a bias before it has no gradient
case("batch_norm_after_conv",   # statistics over the batch, rows and columns
     lambda: sequential(_conv((4, 4, 2)), (g.ggml_layer_batch_norm, (), dict(name="bn"))),
     lambda w, x, t: _bn_ref(w, _conv_ref(w, x), t),
     normal(3, 4, 4, 2), zero_grads=("c.bias",))
case("batch_norm_then_dense_eps",   # a channel of small variance makes eps matter
     lambda: sequential((g.ggml_layer_batch_norm, (), dict(eps=1e-2, input_shape=(3,), name="bn")),
                        (g.ggml_layer_dense, (2,), dict(activation="tanh", name="d"))),
     lambda w, x, t: R.dense(_bn_ref(w, x, t, eps=1e-2), w["d.weight"], w["d.bias"], "tanh"),
     lambda rng: (rng.normal(0, 1, (5, 3)) * np.array([1.0, 0.05, 3.0])).astype(np.float32))
case("batch_norm_on_sequences",
     lambda: sequential((g.ggml_layer_conv_1d, (3, 2), dict(input_shape=(5, 2), name="c")),
                        (g.ggml_layer_batch_norm, (), dict(name="bn"))),
     lambda w, x, t: _bn_ref(w, R.conv1d(x, w["c.kernel"], w["c.bias"]), t),
     normal(3, 5, 2), zero_grads=("c.bias",))

# dropout with rate 0 (rate > 0 has tests of its own below)
case("dropout_rate0",
     lambda: sequential((g.ggml_layer_dense, (4,), dict(activation="tanh", input_shape=(3,), name="d")),
                        (g.ggml_layer_dropout, (0.0,), {})),
     lambda w, x, t: R.dropout(R.dense(x, w["d.weight"], w["d.bias"], "tanh"), 0.0, t),
     normal(3, 3))


# embedding: ids (N, steps); ids 5 and 6 are never used, so their rows get no gradient
def _ids(rng):
    return rng.randint(0, 5, (3, 4)).astype(np.int32)


case("embedding",
     lambda: sequential((g.ggml_layer_embedding, (7, 3), dict(input_shape=(4,), name="e"))),
     lambda w, x, t: R.embedding(x, w["e.weight"]),
     _ids)
case("embedding_then_dense",
     lambda: sequential((g.ggml_layer_embedding, (7, 3), dict(input_shape=(4,), name="e")),
                        (g.ggml_layer_flatten, (), {}), (g.ggml_layer_dense, (2,), dict(name="d"))),
     lambda w, x, t: R.dense(R.flatten(R.embedding(x, w["e.weight"])), w["d.weight"], w["d.bias"]),
     _ids)


# add and concatenate (functional models)
def _add_model():
    x = g.ggml_input((4,), name="x")
    a = g.ggml_layer_dense(x, 3, activation="tanh", name="a")
    b = g.ggml_layer_dense(x, 3, name="b")
    return g.ggml_model(x, g.ggml_layer_add([a, b], name="sum"))


def _add_input_model():
    x = g.ggml_input((4,), name="x")
    a, b = g.ggml_layer_dense(x, 4, name="a"), g.ggml_layer_dense(x, 4, name="b")
    return g.ggml_model(x, g.ggml_layer_add([x, a, b]))


case("add", _add_model,
     lambda w, x, t: R.add([R.dense(x, w["a.weight"], w["a.bias"], "tanh"), R.dense(x, w["b.weight"], w["b.bias"])]),
     normal(3, 4))
case("add_three_with_input", _add_input_model,
     lambda w, x, t: R.add([x, R.dense(x, w["a.weight"], w["a.bias"]), R.dense(x, w["b.weight"], w["b.bias"])]),
     normal(3, 4))



def _merged_model(combine):
    """Two dense branches of x (a tanh one and a linear one) merged by ``combine(a, b)``."""
    def build():
        x = g.ggml_input((4,), name="x")
        a = g.ggml_layer_dense(x, 3, activation="tanh", name="a")
        b = g.ggml_layer_dense(x, 3, name="b")
        return g.ggml_model(x, combine(a, b))
    return build


def _branches(w, x):
    return R.dense(x, w["a.weight"], w["a.bias"], "tanh"), R.dense(x, w["b.weight"], w["b.bias"])


# Keras' other merge layers, and node arithmetic (a + b, a - b, a * b builds them)
for _name, _combine, _ref in (
        ("operator_add", lambda a, b: a + b, lambda p, q: p + q),
        ("subtract", lambda a, b: g.ggml_layer_subtract([a, b]), lambda p, q: p - q),
        ("operator_subtract", lambda a, b: a - b, lambda p, q: p - q),
        ("multiply", lambda a, b: g.ggml_layer_multiply([a, b, a]), lambda p, q: p * q * p),
        ("operator_multiply", lambda a, b: a * b, lambda p, q: p * q),
        ("average", lambda a, b: g.ggml_layer_average([a, b]), lambda p, q: (p + q) / 2),
        ("maximum", lambda a, b: g.ggml_layer_maximum([a, b]), np.maximum),
        ("minimum", lambda a, b: g.ggml_layer_minimum([a, b]), np.minimum)):
    case(_name, _merged_model(_combine), lambda w, x, t, r=_ref: r(*_branches(w, x)), normal(3, 4))


def _concat_features():
    x = g.ggml_input((4,), name="x")
    a = g.ggml_layer_dense(x, 2, activation="tanh", name="a")
    b = g.ggml_layer_dense(x, 3, name="b")
    return g.ggml_model(x, g.ggml_layer_concatenate([a, b]))


def _concat_features_then_dense():
    x = g.ggml_input((4,), name="x")
    a = g.ggml_layer_dense(x, 2, activation="tanh", name="a")
    b = g.ggml_layer_dense(x, 3, name="b")
    return g.ggml_model(x, g.ggml_layer_dense(g.ggml_layer_concatenate([a, b], axis=-1), 2, name="d"))


def _concat_steps(axis):
    def build():
        x1, x2 = g.ggml_input((3, 4), name="x1"), g.ggml_input((2, 4), name="x2")
        a = g.ggml_layer_dense(x1, 2, name="a")
        b = g.ggml_layer_dense(x2, 2, activation="tanh", name="b")
        return g.ggml_model([x1, x2], g.ggml_layer_concatenate([a, b], axis=axis))
    return build


def _concat_images(axis, fa, fb, ka, kb):
    def build():
        x = g.ggml_input((5, 5, 2), name="x")
        a = g.ggml_layer_conv_2d(x, fa, ka, name="ca")
        b = g.ggml_layer_conv_2d(x, fb, kb, activation="tanh", name="cb")
        return g.ggml_model(x, g.ggml_layer_concatenate([a, b], axis=axis))
    return build


def _concat_images_ref(axis, ka, kb):
    return lambda w, x, t: R.concatenate([_conv_ref(w, x, "ca"), _conv_ref(w, x, "cb", "tanh")], axis)


case("concatenate_features", _concat_features,
     lambda w, x, t: R.concatenate([R.dense(x, w["a.weight"], w["a.bias"], "tanh"),
                                    R.dense(x, w["b.weight"], w["b.bias"])]),
     normal(3, 4))
case("concatenate_features_then_dense", _concat_features_then_dense,
     lambda w, x, t: R.dense(R.concatenate([R.dense(x, w["a.weight"], w["a.bias"], "tanh"),
                                            R.dense(x, w["b.weight"], w["b.bias"])]), w["d.weight"], w["d.bias"]),
     normal(3, 4))
for _axis in (0, -2):
    case(f"concatenate_steps_axis{_axis}", _concat_steps(_axis),
         lambda w, x, t, ax=_axis: R.concatenate([R.dense(x[0], w["a.weight"], w["a.bias"]),
                                                  R.dense(x[1], w["b.weight"], w["b.bias"], "tanh")], ax),
         lambda rng: [rng.normal(0, 1, (3, 3, 4)).astype(np.float32), rng.normal(0, 1, (3, 2, 4)).astype(np.float32)])
# images (H, W, C): along channels (-1), rows (0) and columns (1)
for _axis, _fa, _fb, _ka, _kb in ((-1, 3, 2, (2, 2), (2, 2)), (0, 2, 2, (2, 2), (3, 2)), (1, 2, 2, (2, 3), (2, 2))):
    case(f"concatenate_images_axis{_axis}", _concat_images(_axis, _fa, _fb, _ka, _kb),
         _concat_images_ref(_axis, _ka, _kb), normal(3, 5, 5, 2))

# layers after layers: gradients flow into a conv's input (im2col's backward) and across layouts
case("conv2d_then_conv2d",
     lambda: sequential((g.ggml_layer_conv_2d, (3, (2, 2)), dict(activation="relu", input_shape=(6, 6, 2), name="c")),
                        (g.ggml_layer_conv_2d, (2, (2, 2)), dict(strides=(2, 2), padding="same", name="c2"))),
     lambda w, x, t: _conv_ref(w, _conv_ref(w, x, act="relu"), "c2", s=(2, 2), p="same"),
     normal(3, 6, 6, 2))
case("max_pooling_2d_then_conv2d",
     lambda: sequential(_conv((7, 7, 2)), (g.ggml_layer_max_pooling_2d, ((2, 2),), {}),
                        (g.ggml_layer_conv_2d, (2, (2, 2)), dict(name="c2"))),
     lambda w, x, t: _conv_ref(w, R.max_pooling_2d(_conv_ref(w, x), (2, 2)), "c2"),
     normal(3, 7, 7, 2))
case("batch_norm_then_conv2d",
     lambda: sequential((g.ggml_layer_batch_norm, (), dict(input_shape=(5, 5, 2), name="bn")),
                        (g.ggml_layer_conv_2d, (2, (2, 2)), dict(name="c"))),
     lambda w, x, t: _conv_ref(w, _bn_ref(w, x, t)),
     normal(4, 5, 5, 2))
case("embedding_then_conv1d",
     lambda: sequential((g.ggml_layer_embedding, (7, 3), dict(input_shape=(6,), name="e")),
                        (g.ggml_layer_conv_1d, (2, 3), dict(activation="tanh", name="c"))),
     lambda w, x, t: R.conv1d(R.embedding(x, w["e.weight"]), w["c.kernel"], w["c.bias"], act="tanh"),
     lambda rng: rng.randint(0, 7, (3, 6)).astype(np.int32))
case("dense_on_sequences_then_conv1d",
     lambda: sequential((g.ggml_layer_dense, (4,), dict(activation="tanh", input_shape=(6, 3), name="d")),
                        (g.ggml_layer_conv_1d, (2, 3), dict(name="c"))),
     lambda w, x, t: R.conv1d(R.dense(x, w["d.weight"], w["d.bias"], "tanh"), w["c.kernel"], w["c.bias"]),
     normal(3, 6, 3), isolate=True)   # natural -> spatial layout: ggml's permute backward (see below)

CASE_IDS = [c.name for c in CASES]
BY_NAME = {c.name: c for c in CASES}


def make_case(c: Case, seed: int = 0, backend: str = "cpu"):
    """The compiled model with random weights, its weights, input and target."""
    np.random.seed(seed)
    rng = np.random.RandomState(seed + 1)
    model = compile_sgd(c.build(), backend)
    w = randomize(model, rng)
    x = c.x(rng)
    out = c.ref(w, x, False)   # a list for a multi-output model (its loss is the sum of the outputs' losses)
    y = [rng.normal(0, 1, o.shape).astype(np.float32) for o in out] if isinstance(out, list) else \
        rng.normal(0, 1, out.shape).astype(np.float32)
    return model, w, x, y


# ---------------------------------------------------------------- a. forward

@pytest.mark.parametrize("c", CASES, ids=CASE_IDS)
def test_forward_matches_reference(c: Case):
    model, w, x, _ = make_case(c)
    got = g.ggml_predict(model, x)
    want = c.ref(w, x, False)
    assert_close(got, want, *c.fwd_tol, what=f"{c.name}: ggml_predict")


# ---------------------------------------------------------------- b. gradients vs finite differences

def run_isolated(code: str, env: dict | None = None, timeout: float = 300) -> tuple[int, str, str]:
    """``code`` in a fresh interpreter from the repository root (a ggml abort is returncode -6 there)."""
    code = "import ggmlpy\nggmlpy.ggml_set_n_threads(1)\n" + code
    full = dict(os.environ if env is None else env, GGML_NO_BACKTRACE="1")
    full["PYTHONPATH"] = str(ROOT) + os.pathsep + full.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("c", CASES, ids=CASE_IDS)
def test_one_step_gradient_matches_finite_differences(c: Case):
    if c.isolate:
        rc, out, err = run_isolated("from tests.models.layers.test_layers import BY_NAME, check_gradient\n"
                                    f"check_gradient(BY_NAME[{c.name!r}])\nprint('CHECKED')")
        assert rc == 0 and "CHECKED" in out, f"{c.name}: the check failed in a subprocess (rc={rc}):\n" \
                                              f"{(out + err)[-3000:]}"
        return
    check_gradient(c)


def check_gradient(c: Case) -> None:
    model, w, x, y = make_case(c)
    names = trainable(w)
    assert names, "the case has no trainable weight to check"
    got = one_step_gradients(model, x, y)
    want = R.fd_gradients(lambda ww: R.mse(c.ref(ww, x, True), y), w, names)
    for name in names:
        if name in c.zero_grads:
            assert np.abs(want[name]).max() < 1e-8, f"{c.name}: the reference gradient of {name} is not 0"
        else:
            assert np.abs(want[name]).max() > 1e-4, f"{c.name}: the reference gradient of {name} is ~0: a weak check"
        assert_close(got[name], want[name], *c.grad_tol, what=f"{c.name}: gradient of {name}")


def test_gradient_check_detects_a_wrong_gradient():
    """The comparison is sensitive: the gradient of another target does not pass it."""
    c = BY_NAME["conv2d_same_uneven"]
    model, w, x, y = make_case(c)
    got = one_step_gradients(model, x, y)
    want = R.fd_gradients(lambda ww: R.mse(c.ref(ww, x, True), y * 1.01), w, ["c.kernel"])
    with pytest.raises(AssertionError):
        assert_close(got["c.kernel"], want["c.kernel"], *c.grad_tol, what="perturbed")


# ---------------------------------------------------------------- c. batch-norm running statistics

@pytest.mark.parametrize("cname,pre", [
    ("batch_norm_after_dense", lambda w, x: R.dense(x, w["d.weight"], w["d.bias"])),
    ("batch_norm_after_conv", lambda w, x: _conv_ref(w, x)),
    ("batch_norm_on_sequences", lambda w, x: R.conv1d(x, w["c.kernel"], w["c.bias"])),
], ids=["dense", "conv_2d", "conv_1d"])
def test_batch_norm_running_statistics(cname, pre):
    c = BY_NAME[cname]
    model, w, x0, _ = make_case(c)
    momentum = g.ggml_get_layer(model, name="bn").momentum
    assert momentum == 0.99
    rng = np.random.RandomState(7)
    n = x0.shape[0]
    mean, var = w["bn.running_mean"].astype(np.float64), w["bn.running_var"].astype(np.float64)
    tr = g.ggml_trainer(model, batch_size=n)
    try:
        for step in range(4):
            x = (rng.normal(0, 1, x0.shape) * 2 + 1).astype(np.float32)   # statistics far from the running ones
            y = rng.normal(0, 1, c.ref(w, x, True).shape).astype(np.float32)
            before = g.ggml_get_weights(model)                 # the step's forward pass sees these weights
            bmean, bvar = R.batch_stats(pre(before, x))
            tr.step(x, y)
            mean = R.running_update(mean, bmean, momentum)
            var = R.running_update(var, bvar, momentum)
            after = g.ggml_get_weights(model)
            assert_close(after["bn.running_mean"], mean, 1e-5, 1e-6, what=f"running_mean after step {step + 1}")
            assert_close(after["bn.running_var"], var, 1e-5, 1e-6, what=f"running_var after step {step + 1}")
    finally:
        tr.free()
    # and inference now uses them
    w = g.ggml_get_weights(model)
    assert_close(g.ggml_predict(model, x0), c.ref(w, x0, False), FWD_RTOL, FWD_ATOL, what="predict after training")


def test_batch_norm_momentum_argument():
    """A momentum other than the default is honoured (0.5: half the batch statistics per step)."""
    np.random.seed(0)
    rng = np.random.RandomState(3)
    model = compile_sgd(sequential((g.ggml_layer_batch_norm, (), dict(momentum=0.5, input_shape=(3,), name="bn"))))
    x = rng.normal(2, 3, (8, 3)).astype(np.float32)
    with g.ggml_trainer(model, batch_size=8) as tr:
        tr.step(x, np.zeros((8, 3), np.float32))
    w = g.ggml_get_weights(model)
    bmean, bvar = R.batch_stats(x)
    assert_close(w["bn.running_mean"], 0.5 * 0 + 0.5 * bmean, 1e-5, 1e-6, what="running_mean")
    assert_close(w["bn.running_var"], 0.5 * 1 + 0.5 * bvar, 1e-5, 1e-6, what="running_var")


def test_batch_norm_eval_and_predict_leave_running_statistics():
    c = BY_NAME["batch_norm_after_dense"]
    model, w, x, y = make_case(c)
    with g.ggml_trainer(model, batch_size=x.shape[0]) as tr:
        tr.eval(x, y)
    g.ggml_predict(model, x)
    after = g.ggml_get_weights(model)
    for k in ("bn.running_mean", "bn.running_var"):
        np.testing.assert_array_equal(after[k], w[k])


# ---------------------------------------------------------------- dropout with rate > 0

def _dropout_model(rate: float, units: int = 400):
    return compile_sgd(sequential((g.ggml_layer_dense, (units,), dict(input_shape=(3,), name="d")),
                                  (g.ggml_layer_dropout, (rate,), {})))


def _recover_mask(model, x, rate):
    """One SGD step on one sample with target 0; the output is o = z * m / (1 - rate) (z = x W + b), so the
    bias gradient is 2/U * z * m / (1 - rate)^2 and gives the mask m back; the weight gradient must then
    be x^T of the same. Returns the mask (0/1 per unit)."""
    w = g.ggml_get_weights(model)
    z = R.dense(x, w["d.weight"], w["d.bias"])[0]
    units = z.size
    grads = one_step_gradients(model, x, np.zeros((1, units), np.float32))
    ratio = grads["d.bias"] / (2.0 / units * z / (1 - rate) ** 2)
    mask = np.round(ratio)
    clear = np.abs(z) > 0.05   # where z ~ 0 the ratio is float32 noise
    assert clear.mean() > 0.8
    assert set(np.unique(mask[clear])) <= {0.0, 1.0}, \
        f"mask values {np.unique(mask[clear])}: not inverted dropout with scale 1/(1-rate)"
    d_out = 2.0 / units * z * mask / (1 - rate) ** 2
    assert_close(grads["d.bias"], d_out, 1e-3, 1e-7, what="bias gradient through the mask")
    assert_close(grads["d.weight"], np.outer(x[0], d_out), 1e-3, 1e-6, what="weight gradient through the mask")
    return mask


@pytest.mark.parametrize("rate", [0.25, 0.5])
def test_dropout_masks(rate):
    np.random.seed(0)
    rng = np.random.RandomState(5)
    model = _dropout_model(rate)
    w = randomize(model, rng)
    x = rng.normal(0, 1, (1, 3)).astype(np.float32)
    # inference: the identity
    assert_close(g.ggml_predict(model, x), R.dense(x, w["d.weight"], w["d.bias"]), FWD_RTOL, FWD_ATOL,
                 what="predict with dropout")
    masks = []
    for _ in range(3):
        masks.append(_recover_mask(model, x, rate))
    for m in masks:   # each keeps about 1 - rate of 400 units (binomial sd <= 0.025)
        assert abs(m.mean() - (1 - rate)) < 0.1, f"kept fraction {m.mean()} for rate {rate}"
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2]), \
        "dropout drew the same mask in two steps"
    # inference is still the identity (with the trained weights)
    w = g.ggml_get_weights(model)
    assert_close(g.ggml_predict(model, x), R.dense(x, w["d.weight"], w["d.bias"]), FWD_RTOL, FWD_ATOL,
                 what="predict after training")


def test_dropout_masks_are_per_sample():
    """With a batch, each sample gets its own mask: for identical samples, the bias gradient counts how many
    samples kept each unit, and some units are kept by some samples only."""
    np.random.seed(0)
    rate, units, n = 0.5, 64, 4
    model = _dropout_model(rate, units)
    rng = np.random.RandomState(2)
    w = randomize(model, rng)
    x = np.repeat(rng.normal(0, 1, (1, 3)), n, axis=0).astype(np.float32)
    z = R.dense(x, w["d.weight"], w["d.bias"])
    grads = one_step_gradients(model, x, np.zeros((n, units), np.float32))
    # bias gradient: 2/(n U) * z_j * sum_i m_ij / (1 - rate)^2 ; the count sum_i m_ij is in 0..n
    clear = np.abs(z[0]) > 0.05   # where z ~ 0 the ratio is float32 noise
    counts = (grads["d.bias"] / (2.0 / (n * units) * z[0] / (1 - rate) ** 2))[clear]
    assert clear.sum() > units // 2
    assert_close(counts, np.round(counts), 0, 1e-2, what="kept count per unit")
    assert set(np.round(counts)) <= set(range(n + 1))
    assert ((np.round(counts) > 0) & (np.round(counts) < n)).any(), "every unit kept or dropped for all samples"


def test_dropout_then_conv_trains():
    """dense (on sequences) -> dropout -> conv_1d: the gradient crosses from ggml's sequence layout back to
    the user's through a permute (patches/0007 makes it contiguous; ggml aborted here before); in a
    subprocess, in case it aborts again."""
    code = textwrap.dedent("""
        import numpy as np, ggmlpy as g
        g.ggml_set_n_threads(1)
        np.random.seed(0)
        m = g.ggml_model_sequential()
        m = g.ggml_layer_dense(m, 4, input_shape=(6, 3))
        m = g.ggml_layer_dropout(m, 0.3)
        m = g.ggml_layer_conv_1d(m, 2, 3)
        m = g.ggml_compile(m, optimizer="sgd", loss="mse", metrics=[], backend="cpu")
        with g.ggml_trainer(m, batch_size=3) as tr:
            loss = tr.step(np.random.randn(3, 6, 3), np.random.randn(3, 4, 2))
        assert np.isfinite(loss)
        print("TRAINED")
    """)
    rc, out, err = run_isolated(code)
    assert rc == 0 and "TRAINED" in out, f"rc={rc}: {(out + err)[-2000:]}"


# ---------------------------------------------------------------- d. concatenate trains

@pytest.mark.parametrize("cname", ["concatenate_features", "concatenate_steps_axis0", "concatenate_images_axis1"])
def test_concatenate_trains(cname):
    """Both branches of a concatenate get their gradient (patches/0006), and a few steps lower the loss."""
    c = BY_NAME[cname]
    model, w, x, y = make_case(c)
    n = (x[0] if isinstance(x, list) else x).shape[0]
    losses = []
    with g.ggml_trainer(model, batch_size=n) as tr:
        for _ in range(5):
            losses.append(tr.step(x, y))
    assert losses[0] == pytest.approx(R.mse(c.ref(w, x, True), y), rel=1e-4)
    assert losses[-1] < losses[0]
    after = g.ggml_get_weights(model)
    for name in trainable(w):
        assert not np.array_equal(after[name], w[name]), f"{name} did not train"


# ---------------------------------------------------------------- e. Vulkan

VK_ENV = "GGML_VK_VISIBLE_DEVICES"   # Mesa's lavapipe (a CPU Vulkan device) is used only when selected


def _vulkan_mode() -> tuple[str, str]:
    """("in-process" | "subprocess" | "skip", why). ggml lists its Vulkan devices when ggmlpy is imported
    (the test modules do that when they are collected), so when GGML_VK_VISIBLE_DEVICES was not set then, the
    Vulkan checks run in one subprocess started with GGML_VK_VISIBLE_DEVICES=0."""
    if "vulkan" not in [b.lower() for b in g.ggml_backends_built()]:
        return "skip", "this ggmlpy is built without the Vulkan backend"
    if g.ggml_backend_dev_by_name("Vulkan0") is not None:
        return "in-process", ""
    if os.environ.get(VK_ENV) is not None:
        return "skip", f"the Vulkan backend is built but there is no Vulkan device ({VK_ENV}={os.environ[VK_ENV]!r})"
    return "subprocess", ""


VULKAN_CASES = [c for c in CASES if c.name in {
    "dense_relu", "dense_sigmoid", "dense_tanh", "dense_gelu", "dense_silu", "dense_softmax", "dense_on_sequences",
    "conv2d_valid", "conv2d_same_uneven", "conv2d_valid_one_channel", "conv1d_valid", "conv1d_same_even_kernel",
    "max_pooling_2d_strides", "global_average_pooling_2d", "global_max_pooling_2d", "flatten_after_conv_then_dense",
    "batch_norm_after_conv", "batch_norm_then_dense_eps", "dropout_rate0", "embedding_then_dense", "add",
    "concatenate_features", "concatenate_steps_axis0", "concatenate_images_axis1", "conv2d_then_conv2d",
    "max_pooling_2d_then_conv2d", "embedding_then_conv1d", "conv_relu_then_max_pooling_2d", "average_pooling_2d",
    "average_pooling_2d_overlapping", "upsampling_2d", "max_pooling_1d", "average_pooling_1d_strides",
    "global_average_pooling_1d", "global_max_pooling_1d", "activation_softmax", "reshape_then_conv1d",
    "repeat_vector_then_dense", "conv2d_dilated_same", "conv1d_dilated_same", "custom_layer_affine_tanh",
    "dense_elu", "dense_selu", "dense_leaky_relu", "dense_relu6", "dense_hard_silu", "dense_softsign", "dense_mish",
    "dense_log_sigmoid", "dense_hard_tanh", "dense_soft_shrink", "dense_tanh_shrink", "dense_squareplus",
    "dense_sparse_plus",
    "max_pooling_2d_same", "max_pooling_2d_same_after_relu", "average_pooling_2d_same", "max_pooling_1d_same",
    "average_pooling_1d_same", "subtract", "multiply", "average", "maximum", "minimum"}]


def check_backend(c: Case, backend: str) -> None:
    """One training step on ``backend``: its forward pass must match the reference and its gradient the
    CPU's (checked against finite differences above); on the CPU, a second run must be bit-identical."""
    model, w, x, y = make_case(c, backend=backend)
    vk = backend == "vulkan"
    # Vulkan's matrix products round through float16 on this device: ~1e-3
    fwd_rtol, fwd_atol = (max(t, 2e-3) for t in c.fwd_tol) if vk else c.fwd_tol
    assert_close(g.ggml_predict(model, x), c.ref(w, x, False), fwd_rtol, fwd_atol,
                 what=f"{c.name} on {backend}: predict")
    got = one_step_gradients(model, x, y)
    cpu_model, cpu_w, _, _ = make_case(c, backend="cpu")
    for k in w:
        np.testing.assert_array_equal(w[k], cpu_w[k])
    want = one_step_gradients(cpu_model, x, y)
    rtol, atol = (c.vulkan_grad_tol or (1e-2 if c.name == "dense_gelu" else 3e-3, 1e-3)) if vk else (0.0, 0.0)
    for name in want:
        assert_close(got[name], want[name], rtol, atol, what=f"{c.name} on {backend}: gradient of {name}")


def run_vulkan_checks(cases: list[Case] | None = None) -> dict:
    """Every Vulkan case, for the subprocess: {case: None (passed) or the error}, or {"__skip__": why}."""
    mode, why = _vulkan_mode()
    if mode != "in-process":
        return {"__skip__": why or f"no Vulkan device even with {VK_ENV}={os.environ.get(VK_ENV)!r}"}
    out = {}
    for c in cases or VULKAN_CASES:
        try:
            check_backend(c, "vulkan")
            out[c.name] = None
        except Exception as exc:  # noqa: BLE001 - reported by the test of that case
            out[c.name] = f"{type(exc).__name__}: {exc}"
    return out


@pytest.fixture(scope="module")
def vulkan_subprocess_results() -> dict:
    return vulkan_checks_in_subprocess("tests.models.layers.test_layers")


def vulkan_checks_in_subprocess(module: str) -> dict:
    """``module.run_vulkan_checks()`` in a fresh interpreter started with GGML_VK_VISIBLE_DEVICES=0."""
    import json
    code = (f"import json\nfrom {module} import run_vulkan_checks\n"
            "print('RESULTS' + json.dumps(run_vulkan_checks()))")
    rc, out, err = run_isolated(code, env=dict(os.environ, **{VK_ENV: "0"}), timeout=900)
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULTS")), None)
    if rc != 0 or line is None:
        return {"__crash__": f"rc={rc}\n{(out + err)[-3000:]}"}
    return json.loads(line[len("RESULTS"):])


@pytest.mark.parametrize("backend", ["cpu", "vulkan"])
@pytest.mark.parametrize("c", VULKAN_CASES, ids=[c.name for c in VULKAN_CASES])
def test_trains_on_backend(c: Case, backend: str, request):
    """Every layer trains on each backend (Vulkan: lavapipe, selected with GGML_VK_VISIBLE_DEVICES=0)."""
    if backend == "vulkan":
        mode, why = _vulkan_mode()
        if mode == "skip":
            pytest.skip(why)
        if mode == "subprocess":
            results = request.getfixturevalue("vulkan_subprocess_results")
            if "__skip__" in results:
                pytest.skip(results["__skip__"])
            assert "__crash__" not in results, f"the Vulkan subprocess failed: {results.get('__crash__')}"
            assert results[c.name] is None, results[c.name]
            return
    check_backend(c, backend)


# ---------------------------------------------------------------- f. beyond ggml's default graph size

DEEP = textwrap.dedent("""
    import numpy as np, ggmlpy as g
    g.ggml_set_n_threads(1)
    np.random.seed(0)
    depth, width, n = {depth}, 4, 8
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, width, activation="relu", input_shape=(width,), name="d0")
    for i in range(1, depth):
        m = g.ggml_layer_dense(m, width, activation="relu" if i < depth - 1 else None, name=f"d{{i}}")
    m = g.ggml_compile(m, optimizer="sgd", loss="mse", metrics=[], backend="cpu", learning_rate=0.05)
    rng = np.random.RandomState(1)
    # near-identity layers with a positive bias: no unit dies, the gradient reaches the first layer
    g.ggml_set_weights(m, {{k: (np.eye(width) + rng.uniform(-0.05, 0.05, (width, width))) if k.endswith("weight")
                           else np.full(width, 0.01) for k in g.ggml_get_weights(m)}})
    x = rng.uniform(0.1, 1.0, (n, width)).astype(np.float32)
    y = rng.uniform(0.0, 1.0, (n, width)).astype(np.float32)
    w0 = g.ggml_get_weights(m)
    # reference: forward in float64, and the loss
    def fwd(ws):
        h = x.astype(np.float64)
        for i in range(depth):
            h = h @ ws[f"d{{i}}.weight"] + ws[f"d{{i}}.bias"]
            if i < depth - 1:
                h = np.maximum(h, 0)
        return h
    pred = g.ggml_predict(m, x)
    assert np.allclose(pred, fwd(w0), rtol=1e-4, atol=1e-4), (pred, fwd(w0))
    tr = g.ggml_trainer(m, batch_size=n)
    print("train_nodes", tr.train_nodes)   # nodes of the forward and backward graphs
    losses = [tr.step(x, y)]
    w1 = g.ggml_get_weights(m)
    ref_loss = float(np.mean((fwd(w0) - y) ** 2))
    assert abs(losses[0] - ref_loss) <= 1e-4 * ref_loss + 1e-6, (losses[0], ref_loss)
    # the first layer's bias gradient against finite differences
    grad = (w0["d0.bias"].astype(np.float64) - w1["d0.bias"]) / 0.05
    fd = np.zeros(width)
    for j in range(width):
        wp = {{k: v.astype(np.float64).copy() for k, v in w0.items()}}
        wm = {{k: v.astype(np.float64).copy() for k, v in w0.items()}}
        wp["d0.bias"][j] += 1e-6
        wm["d0.bias"][j] -= 1e-6
        fd[j] = (np.mean((fwd(wp) - y) ** 2) - np.mean((fwd(wm) - y) ** 2)) / 2e-6
    assert np.abs(fd).max() > 1e-3, fd
    assert np.allclose(grad, fd, rtol=2e-2, atol=1e-4), (grad, fd)
    for _ in range(4):
        losses.append(tr.step(x, y))
    tr.free()
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses
    print("OK", losses)
""")


def test_model_larger_than_default_graph_size():
    """~150 dense layers: the training graph (forward, backward, optimizer) has well over 2048 nodes.
    Without patches/0005 ggml-opt aborts, so this runs in a subprocess."""
    rc, out, err = run_isolated(DEEP.format(depth=150))
    assert rc == 0, f"rc={rc}\n{out}\n{err[-3000:]}"
    assert "OK" in out
    nodes = int(out.split("train_nodes", 1)[1].split()[0])
    assert nodes > 2048, f"the training graph has only {nodes} nodes: not beyond the default size"


def test_dilation_with_a_stride_is_refused_and_dilation_survives_saving(tmp_path):
    with pytest.raises(g.GgmlValueError, match="a dilation above 1 needs strides of 1"):
        g.ggml_layer_conv_2d(g.ggml_model_sequential(), 2, 3, strides=2, dilation_rate=2, input_shape=(9, 9, 1))
    with pytest.raises(g.GgmlValueError, match="a dilation above 1 needs strides of 1"):
        g.ggml_layer_conv_1d(g.ggml_model_sequential(), 2, 3, strides=2, dilation_rate=2, input_shape=(9, 1))
    m = g.ggml_compile(g.ggml_layer_conv_1d(g.ggml_model_sequential(), 2, 3, dilation_rate=2, input_shape=(9, 1)),
                       loss="mse", backend="cpu")
    g.ggml_save_model(m, tmp_path / "d.gguf")
    loaded = g.ggml_load_model(tmp_path / "d.gguf", backend="cpu")
    assert loaded.layers[-1].dilation_rate == 2
    x = np.random.default_rng(0).normal(size=(4, 9, 1)).astype(np.float32)
    np.testing.assert_array_equal(g.ggml_predict(loaded, x), g.ggml_predict(m, x))
    assert g.ggml_predict(m, x).shape == (4, 5, 2)  # 9 - 2 * (3 - 1)


def test_a_custom_layer_says_what_it_expected():
    m = lambda: g.ggml_model_sequential()  # noqa: E731
    with pytest.raises(g.GgmlTypeError, match=r"called as forward\(ctx, x, weights\)"):
        g.ggml_custom_layer(m(), lambda ctx, x: x, input_shape=(4,))
    with pytest.raises(g.GgmlValueError, match="needs a shape of 1 to 4 ints"):
        g.ggml_custom_layer(m(), _affine, weights={"kernel": (4, 0)}, input_shape=(4,))
    with pytest.raises(g.GgmlValueError, match="unknown initializer 'he'"):
        g.ggml_custom_layer(m(), _affine, weights={"kernel": ((4, 3), "he")}, input_shape=(4,))
    wrong = g.ggml_custom_layer(m(), _affine, weights={"kernel": (4, 3), "bias": (3,)}, input_shape=(4,))
    wrong = g.ggml_compile(wrong, loss="mse", backend="cpu")
    with pytest.raises(g.GgmlValueError, match=r"shape \(3, 2, 1, 1\).*must be \(4, 2\).*give output_shape="):
        g.ggml_predict(wrong, np.ones((2, 4), np.float32), batch_size=2)  # (3,) samples, declared as the input's


def test_a_custom_layer_trains_freezes_and_saves_its_weights_but_not_itself(tmp_path):
    def build():
        return g.ggml_compile(g.ggml_custom_layer(g.ggml_model_sequential(), _affine,
                                                  weights={"kernel": (4, 3), "bias": (3,)}, output_shape=(3,),
                                                  input_shape=(4,), name="c"), loss="mse", backend="cpu",
                              learning_rate=0.05)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = np.tanh(x[:, :3]).astype(np.float32)
    m = build()
    assert set(g.ggml_get_weights(m)) == {"c.kernel", "c.bias"}
    h = g.ggml_fit(m, x, y, epochs=20, batch_size=16, verbose=0)
    assert h["train_loss"].iloc[-1] < 0.5 * h["train_loss"].iloc[0]
    with pytest.raises(g.GgmlValueError, match="custom layers.*ggml_save_weights"):
        g.ggml_save_model(m, tmp_path / "m.gguf")
    g.ggml_save_weights(m, tmp_path / "w.gguf")
    again = g.ggml_load_weights(build(), tmp_path / "w.gguf")
    np.testing.assert_array_equal(g.ggml_predict(again, x), g.ggml_predict(m, x))
    g.ggml_freeze_weights(again)
    before = g.ggml_get_weights(again)
    with pytest.raises(g.GgmlValueError, match="nothing to train"):
        g.ggml_fit(again, x, y, epochs=1, batch_size=16, verbose=0)
    assert all(np.array_equal(before[k], v) for k, v in g.ggml_get_weights(again).items())


def test_a_custom_layer_with_an_op_ggml_cannot_differentiate_is_an_error_not_an_abort():
    rc, out, err = run_isolated(
        "import numpy as np, ggmlpy as g\n"
        "def padded(ctx, x, w):\n"
        "    return g.ggml_pad_reflect_1d(ctx, g.ggml_mul(ctx, x, w['gain']), 1, 1)\n"
        "m = g.ggml_custom_layer(g.ggml_model_sequential(), padded, weights={'gain': ((4, 1), 'ones')},\n"
        "                        output_shape=(6,), input_shape=(4,))\n"
        "m = g.ggml_compile(m, loss='mse', backend='cpu')\n"
        "try:\n"
        "    g.ggml_fit(m, np.ones((8, 4), np.float32), np.ones((8, 6), np.float32), epochs=1, verbose=0)\n"
        "except g.GgmlpyError as e:\n"
        "    print('RAISED', type(e).__name__, e)\n")
    assert rc == 0 and "RAISED" in out, (rc, out[-2000:], err[-2000:])


@pytest.mark.parametrize("kernel, dilation, strides", [(3, 1, 1), (3, 2, 1), (2, 4, 1), (3, 1, 2)])
def test_causal_conv_1d_sees_only_the_past_as_keras_and_trains(kernel, dilation, strides, tmp_path):
    """Keras' padding='causal': y[t] = b + sum_j x[t*s - d*(k-1) + d*j] W[j] (zeros before step 0), one output per
    stride; against numpy float64, its gradient through training, and saved and loaded."""
    rng = np.random.default_rng(kernel * 10 + dilation + strides)
    steps, cin, filters = 11, 3, 2
    x = rng.normal(size=(5, steps, cin)).astype(np.float32)
    m = g.ggml_layer_conv_1d(g.ggml_model_sequential(), filters, kernel, strides=strides, padding="causal",
                             dilation_rate=dilation, input_shape=(steps, cin), name="c")
    m = g.ggml_compile(m, optimizer="sgd", loss="mse", metrics=[], backend="cpu", learning_rate=0.1)
    w = {k: v.astype(np.float64) for k, v in g.ggml_get_weights(m).items()}

    def ref(weights):
        left = dilation * (kernel - 1)
        xp = np.concatenate([np.zeros((5, left, cin)), x.astype(np.float64)], axis=1)
        out = [sum(xp[:, t * strides + dilation * j] @ weights["c.kernel"][j] for j in range(kernel))
               + weights["c.bias"] for t in range((steps - 1) // strides + 1)]
        return np.stack(out, axis=1)
    np.testing.assert_allclose(g.ggml_predict(m, x), ref(w), rtol=1e-5, atol=1e-6)
    y = rng.normal(size=ref(w).shape).astype(np.float32)
    g.ggml_fit(m, x, y, epochs=1, batch_size=5, shuffle=False, verbose=0)
    grad = np.zeros_like(w["c.kernel"])   # the SGD step against finite differences of the mean squared error
    for idx in np.ndindex(grad.shape):
        wp, wm = {k: v.copy() for k, v in w.items()}, {k: v.copy() for k, v in w.items()}
        wp["c.kernel"][idx] += 1e-6
        wm["c.kernel"][idx] -= 1e-6
        grad[idx] = (np.mean((ref(wp) - y) ** 2) - np.mean((ref(wm) - y) ** 2)) / 2e-6
    np.testing.assert_allclose(g.ggml_get_weights(m)["c.kernel"], w["c.kernel"] - 0.1 * grad, rtol=1e-4, atol=1e-5)
    g.ggml_save_model(m, tmp_path / "c.gguf")
    np.testing.assert_array_equal(g.ggml_predict(g.ggml_load_model(tmp_path / "c.gguf", backend="cpu"), x),
                                  g.ggml_predict(m, x))


def test_a_layer_of_ones_own_reads_token_ids():
    """Keras' TokenAndPositionEmbedding is a layer of one's own reading int32 ids: a ggml_custom_layer (ids or
    floats) or a Layer subclass declaring takes_int = True; the lookup equals numpy's indexing."""
    ids = np.random.default_rng(0).integers(0, 10, (6, 5)).astype(np.int32)

    def lookup(ctx, x, w):   # x: [5, N] int32 ids -> [4, 5, N] rows of the table plus a position row
        rows = g.ggml_get_rows(ctx, w["table"], g.ggml_reshape_1d(ctx, x, x.nelements()))
        return g.ggml_add(ctx, g.ggml_reshape_3d(ctx, rows, 4, 5, x.shape[1]), w["position"])
    tokens = g.ggml_input(shape=(5,), dtype="int32")
    out = g.ggml_custom_layer(tokens, lookup, weights={"table": (4, 10), "position": (4, 5)}, output_shape=(5, 4),
                              name="emb")
    m = g.ggml_compile(g.ggml_model(tokens, g.ggml_layer_dense(g.ggml_layer_flatten(out), 2)), loss="mse",
                       backend="cpu")
    w = g.ggml_get_weights(m)
    table, position = w["emb.table"], w["emb.position"]
    inner = g.ggml_compile(g.ggml_model(tokens, out), loss="mse", backend="cpu")   # the same layer, its weights
    np.testing.assert_allclose(g.ggml_predict(inner, ids), table[ids] + position, rtol=1e-6)
    h = g.ggml_fit(m, ids, np.ones((6, 2), np.float32), epochs=2, batch_size=3, verbose=0)
    assert np.isfinite(h["train_loss"]).all()


def test_maximum_and_minimum_are_exact_where_arithmetic_loses_the_smaller_value():
    """(a + b + |a - b|) / 2 gave max(1, -1e8) = 0 and max(3e38, 3e38) = inf (a reviewer's cases)."""
    a, b = g.ggml_input(shape=(4,)), g.ggml_input(shape=(4,))
    m = g.ggml_compile(g.ggml_model([a, b], [g.ggml_layer_maximum([a, b]), g.ggml_layer_minimum([a, b])]),
                       loss="mse", backend="cpu")
    xa = np.array([[0.1234567, 1.0, 3e38, -2e38]], np.float32)
    xb = np.array([[-3000.5, -1e8, 3e38, -2e38]], np.float32)
    high, low = g.ggml_predict(m, [xa, xb])
    np.testing.assert_array_equal(high, np.maximum(xa, xb))
    np.testing.assert_array_equal(low, np.minimum(xa, xb))


def test_the_free_form_of_a_custom_layer_is_shared_by_ggml_apply_and_wrapped_by_time_distributed(tmp_path):
    """``ggml_custom`` is ``ggml_custom_layer``'s layer object: applied twice it is one set of weights; in
    ``time_distributed`` it maps every step (against numpy float64); a model holding it is refused by
    ``ggml_save_model`` as the applied form is (its forward is code), and its weights save."""
    rng = np.random.default_rng(3)
    shared = g.ggml_custom(_affine, weights={"kernel": (4, 3), "bias": (3,)}, output_shape=(3,), name="aff")
    a, b = g.ggml_input(shape=(4,)), g.ggml_input(shape=(4,))
    out = g.ggml_layer_add([g.ggml_apply(a, shared), g.ggml_apply(b, shared)])
    m = g.ggml_compile(g.ggml_model([a, b], out), loss="mse", backend="cpu")
    w = g.ggml_get_weights(m)
    assert set(w) == {"aff.kernel", "aff.bias"}
    k, bias = w["aff.kernel"].astype(np.float64), w["aff.bias"].astype(np.float64)
    kmat = k.reshape(3, 4)  # (out, in): ggml's [4, 3] read row-major
    xa, xb = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    want = np.tanh(xa @ kmat.T + bias.reshape(-1)) + np.tanh(xb @ kmat.T + bias.reshape(-1))   # _affine's tanh
    got = g.ggml_predict(m, [xa.astype(np.float32), xb.astype(np.float32)], batch_size=5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    step = g.ggml_custom(_affine, weights={"kernel": (4, 3), "bias": (3,)}, output_shape=(3,))
    seq = g.ggml_input(shape=(6, 4))
    td = g.ggml_model(seq, g.ggml_layer_time_distributed(seq, step, name="td"))
    td = g.ggml_compile(td, loss="mse", backend="cpu")
    w = g.ggml_get_weights(td)
    kmat = w["td.kernel"].astype(np.float64).reshape(3, 4)
    x = rng.normal(size=(2, 6, 4))
    np.testing.assert_allclose(g.ggml_predict(td, x.astype(np.float32), batch_size=2),
                               np.tanh(x @ kmat.T + w["td.bias"].astype(np.float64).reshape(-1)), rtol=1e-5, atol=1e-5)
    h = g.ggml_fit(td, x.astype(np.float32), np.tanh(x[..., :3]).astype(np.float32), epochs=3, batch_size=2,
                   verbose=0)
    assert np.isfinite(h["train_loss"]).all()
    assert not np.array_equal(g.ggml_get_weights(td)["td.kernel"], w["td.kernel"])   # the step's weights train
    with pytest.raises(g.GgmlValueError, match="custom layers"):
        g.ggml_save_model(td, tmp_path / "m.gguf")
    g.ggml_save_weights(td, tmp_path / "w.gguf")
    with pytest.raises(g.GgmlTypeError, match="expected a layer object"):
        g.ggml_apply(a, _affine)   # the function is not the layer: ggml_custom(_affine, ...) makes it


EXTREMES = np.array([-1e30, -1e8, -2.0 ** 24, -7.0, -1.0, -0.5, -1e-3, 0.0, 1e-3, 0.5, 1.0, 7.0, 2.0 ** 24, 1e8, 1e30])


@pytest.mark.parametrize("name", sorted(a for a in ACTIVATIONS if a not in (None, "linear", "softmax")))
def test_activations_hold_their_bounds_at_extreme_inputs(name, device):
    """Each activation over inputs from -1e30 to 1e30 (past 2**24, where x and x - 6 are one float32) against
    Keras' formula in float64, rounded to float32 (inf where float32 overflows, as Keras' float32 does);
    squareplus's naive formula, Keras' too, overflows x^2 past 1e19, so its range stops at 1e8."""
    z = EXTREMES[np.abs(EXTREMES) <= 1e8] if name == "squareplus" else EXTREMES
    m = g.ggml_layer_activation(g.ggml_model_sequential(), name, input_shape=(z.size,))
    m = g.ggml_compile(m, loss="mse", backend=device)
    with np.errstate(over="ignore", invalid="ignore"):
        want = R.activation(z, name).astype(np.float32)
    got = g.ggml_predict(m, z[None].astype(np.float32))[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)
