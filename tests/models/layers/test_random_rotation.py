"""Keras' RandomRotation (models/layers/preprocessing.py), on the CPU and Vulkan.

As in test_random_translation_zoom.py, the training-time images are read from a training graph computed forward
with its step hooks run as a fit runs them (``train_forward``), and through a real trainer step. The reference
is scipy.ndimage's ``affine_transform`` given Keras' own rotation matrix (keras/src/layers/preprocessing/
image_preprocessing/random_rotation.py): output pixel ``(y, x)`` reads the input at ``x_in = cos x - sin y +
x_offset``, ``y_in = sin x + cos y + y_offset`` with ``x_offset = ((W - 1) - (cos (W - 1) - sin (H - 1))) / 2``
and ``y_offset = ((H - 1) - (sin (W - 1) + cos (H - 1))) / 2`` (the angle ``factor * 2 pi``), which with y
pointing down turns the image counter-clockwise for a positive angle (``np.rot90``'s direction). scipy's modes
stand for Keras' as in the translation tests: reflect, grid-wrap, nearest, grid-constant; the nearest cases keep
away from exact half-pixel coordinates (the image's sizes of one parity: a quarter turn lands on whole pixels)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy import ndimage, stats

import ggmlpy as g
from ggmlpy.models.layers.preprocessing import rotation_taps

from .test_random_translation_zoom import ORDERS, SCIPY_MODES, train_forward


def keras_rotated(images, angle, fill_mode="reflect", interpolation="bilinear", fill_value=0.0):
    """Images (N, H, W, C) transformed by Keras' rotation matrix for ``angle`` (radians), by scipy."""
    h, w = images.shape[1:3]
    cos, sin = np.cos(angle), np.sin(angle)
    x_offset = ((w - 1) - (cos * (w - 1) - sin * (h - 1))) / 2
    y_offset = ((h - 1) - (sin * (w - 1) + cos * (h - 1))) / 2
    # Keras' [[cos, -sin, x_offset], [sin, cos, y_offset]] maps output (x, y) to input (x, y); scipy's
    # coordinates are (y, x, channel)
    matrix = np.array([[cos, sin, 0.0], [-sin, cos, 0.0], [0.0, 0.0, 1.0]])
    offset = np.array([y_offset, x_offset, 0.0])
    return np.stack([ndimage.affine_transform(img.astype(np.float64), matrix, offset, order=ORDERS[interpolation],
                                              mode=SCIPY_MODES[fill_mode], cval=fill_value) for img in images])


def rotator(shape, device, factor, **kwargs):
    model = g.ggml_layer_random_rotation(g.ggml_model_sequential(), factor, input_shape=shape, **kwargs)
    return g.ggml_compile(model, loss="mse", backend=device)


CASES = [   # (image size (H, W), the fraction of a turn)
    ((5, 7), 0.0),
    ((5, 7), 0.25),      # a quarter turn, counter-clockwise: whole pixels (H and W of one parity)
    ((6, 4), -0.25),
    ((5, 7), 0.5),
    ((5, 7), 0.0731),
    ((6, 4), -0.163),
    ((4, 9), 0.41),
    ((7, 5), -0.87),
]


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
@pytest.mark.parametrize("fill_mode", ["reflect", "wrap", "constant", "nearest"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_training_images_are_keras_rotations(device, case, fill_mode, interpolation):
    (h, w), turn = CASES[case]
    x = np.random.default_rng(case).normal(size=(3, h, w, 2)).astype(np.float32)
    model = rotator((h, w, 2), device, (turn, turn), fill_mode=fill_mode, interpolation=interpolation,
                    fill_value=0.75)
    got = train_forward(model, x)[0]
    want = keras_rotated(x, turn * 2 * np.pi, fill_mode, interpolation, 0.75)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fill_mode", ["reflect", "constant"])
def test_quarter_turns_are_np_rot90(device, fill_mode):
    """A positive factor turns counter-clockwise: +1/4 is ``np.rot90(k=1)`` (the top-right pixel goes to the
    top left), -1/4 is ``k=-1`` and 1/2 is ``k=2``, each an exact permutation of the pixels of a square image."""
    x = np.random.default_rng(1).normal(size=(2, 6, 6, 3)).astype(np.float32)
    for turn, k in ((0.25, 1), (-0.25, -1), (0.5, 2)):
        got = train_forward(rotator((6, 6, 3), device, (turn, turn), fill_mode=fill_mode, fill_value=9.0), x)[0]
        np.testing.assert_allclose(got, np.rot90(x, k, axes=(1, 2)), rtol=0, atol=1e-6)
    corner = np.zeros((1, 5, 5, 1), np.float32)
    corner[0, 0, 4, 0] = 1.0                                                  # the top-right pixel
    out = train_forward(rotator((5, 5, 1), device, (0.25, 0.25), fill_mode="constant"), corner)[0]
    assert np.unravel_index(np.argmax(out[0, ..., 0]), (5, 5)) == (0, 0)     # to the top left
    np.testing.assert_allclose(out.sum(), 1.0, atol=1e-6)


def test_the_taps_are_the_layers_reference():
    """The host's taps (``rotation_taps``) applied by numpy are scipy's rotation, so what the device gathers is
    checked apart from the gather."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, 7, 3))
    angle = np.array([0.7, -2.1])
    for fill_mode in ("reflect", "wrap", "constant", "nearest"):
        rows, weights, fill = rotation_taps(5, 7, angle, fill_mode, "bilinear", 0.5)
        assert rows.shape == weights.shape == (4, 2 * 5 * 7) and rows.dtype == np.int32
        pixels = x.reshape(-1, 3)
        got = (pixels[rows] * weights[..., None]).sum(0) + (0.0 if fill is None else fill[:, None])
        want = np.concatenate([keras_rotated(x[k:k + 1], a, fill_mode, "bilinear", 0.5) for k, a in enumerate(angle)])
        np.testing.assert_allclose(got.reshape(x.shape), want, rtol=1e-6, atol=1e-6)   # float32 weights
        assert (fill is None) == (fill_mode != "constant")


def test_a_trainer_step_sees_the_rotated_image(device):
    """Through the fit's own step (its hooks, uploads, index checks and the backward pass), batch 1: one SGD step
    from zero weights makes the dense layer's weights the rotated image."""
    x = np.random.default_rng(3).normal(size=(1, 4, 6, 2)).astype(np.float32)
    for interpolation in ("bilinear", "nearest"):
        m = g.ggml_layer_random_rotation(g.ggml_model_sequential(), (0.1, 0.1), fill_mode="wrap",
                                         interpolation=interpolation, input_shape=(4, 6, 2))
        m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 1, use_bias=False, name="d")
        m = g.ggml_compile(m, loss="mse", optimizer="sgd", learning_rate=0.5, backend=device)
        g.ggml_set_weights(m, {"d.weight": np.zeros((48, 1), np.float32)})
        with g.ggml_trainer(m, batch_size=1) as trainer:
            assert trainer.step(x, np.ones((1, 1), np.float32)) == pytest.approx(1.0)
        want = keras_rotated(x, 0.2 * np.pi, "wrap", interpolation)
        np.testing.assert_allclose(g.ggml_get_weights(m)["d.weight"][:, 0], want.reshape(-1), rtol=1e-4, atol=1e-5)


def _drawn_angles(out, h, w, r=3):
    """Each image's angle, from ramps (channel 0: the row, channel 1: the column): the output pixel ``r`` right
    of the centre reads the input at ``r (cos, sin)`` from it."""
    cy, cx = (h - 1) / 2, (w - 1) / 2
    return np.arctan2(out[:, int(cy), int(cx) + r, 0] - cy, out[:, int(cy), int(cx) + r, 1] - cx)


def ramps(n, h, w):
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    return np.broadcast_to(np.stack([rows, cols], -1), (n, h, w, 2)).astype(np.float32).copy()


def test_each_image_and_step_draws_its_own_angle_uniformly(device):
    n, h, w = 200, 21, 31
    np.random.seed(5)
    model = rotator((h, w, 2), device, (-0.2, 0.35), fill_mode="nearest")
    first, second = train_forward(model, ramps(n, h, w), steps=2)
    a1, a2 = _drawn_angles(first, h, w), _drawn_angles(second, h, w)
    assert len(np.unique(np.round(a1, 4))) > 0.9 * n and not np.allclose(a1, a2)     # per image, per step
    low, high = -0.2 * 2 * np.pi, 0.35 * 2 * np.pi
    both = np.concatenate([a1, a2])
    assert low - 1e-3 <= both.min() and both.max() <= high + 1e-3
    assert stats.kstest(both, stats.uniform(low, high - low).cdf).pvalue > 1e-3
    symmetric = _drawn_angles(train_forward(rotator((h, w, 2), device, 0.1), ramps(n, h, w))[0], h, w)
    assert stats.kstest(symmetric, stats.uniform(-0.2 * np.pi, 0.4 * np.pi).cdf).pvalue > 1e-3   # f: [-f, f]
    np.random.seed(5)
    again = train_forward(rotator((h, w, 2), device, (-0.2, 0.35), fill_mode="nearest"), ramps(n, h, w))[0]
    np.testing.assert_array_equal(again, first)             # numpy's global seed makes the draws reproducible


def test_the_gradient_flows_through_to_the_weights_before(device):
    """One SGD step of a dense layer (per pixel, on the channels) before a fixed rotation: its gradient is
    numpy's, through the transpose of the rotation (the constant fill adds no gradient)."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(1, 5, 4, 3)).astype(np.float32)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, use_bias=False, name="d1", input_shape=(5, 4, 3))
    m = g.ggml_layer_random_rotation(m, (0.137, 0.137), fill_mode="constant", fill_value=0.5)
    m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 1, use_bias=False, name="d2")
    m = g.ggml_compile(m, loss="mse", optimizer="sgd", learning_rate=0.1, backend=device)
    w1 = rng.normal(size=(3, 2)).astype(np.float32)
    w2 = rng.normal(size=(40, 1)).astype(np.float32)
    g.ggml_set_weights(m, {"d1.weight": w1, "d2.weight": w2})
    angle = 0.137 * 2 * np.pi
    hidden = keras_rotated(x.astype(np.float64) @ w1, angle, "constant", "bilinear", 0.5)     # (1, 5, 4, 2)
    residual = float(hidden.reshape(-1) @ w2[:, 0]) - 1.0
    turned = keras_rotated(x, angle, "constant", "bilinear", 0.0)[0]                           # (5, 4, 3)
    grad = 2 * residual * turned.reshape(-1, 3).T @ w2[:, 0].reshape(-1, 2)                   # (3, 2)
    with g.ggml_trainer(m, batch_size=1) as trainer:
        assert trainer.step(x, np.ones((1, 1), np.float32)) == pytest.approx(residual ** 2, rel=1e-4)
    np.testing.assert_allclose(g.ggml_get_weights(m)["d1.weight"], w1 - 0.1 * grad, rtol=1e-4, atol=1e-5)


def test_save_load_and_pickle_keep_the_layer(tmp_path):
    x = np.random.default_rng(11).normal(size=(3, 6, 5, 2)).astype(np.float32)
    m = g.ggml_layer_random_rotation(g.ggml_model_sequential(), (-0.1, 0.2), fill_mode="constant", fill_value=0.5,
                                     interpolation="nearest", input_shape=(6, 5, 2), name="r")
    m = g.ggml_layer_random_rotation(m, 0.3, name="r2")
    m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 2)
    m = g.ggml_compile(m, loss="mse", backend="cpu")
    path = str(tmp_path / "rot.gguf")
    g.ggml_save_model(m, path)
    for again in (g.ggml_load_model(path, backend="cpu"), pickle.loads(pickle.dumps(m))):
        layers = {layer.name: layer for layer in again.layers}
        assert layers["r"].config() == {"factor": [-0.1, 0.2], "fill_mode": "constant", "interpolation": "nearest",
                                        "fill_value": 0.5}
        assert layers["r2"].config() == {"factor": 0.3, "fill_mode": "reflect", "interpolation": "bilinear",
                                         "fill_value": 0.0}
        if again.runtime is None:
            again = g.ggml_compile(again, loss="mse", backend="cpu")
        np.testing.assert_allclose(g.ggml_predict(again, x), g.ggml_predict(m, x), rtol=1e-6)


def test_bad_arguments_say_what_to_give():
    with pytest.raises(g.GgmlValueError, match=r"factor is a fraction of a full turn \(2 pi\), in \[-1, 1\]"):
        g.ggml_random_rotation(1.5)
    with pytest.raises(g.GgmlValueError, match=r"lower <= upper"):
        g.ggml_random_rotation((0.3, -0.1))
    with pytest.raises(g.GgmlValueError, match=r"-1 <= lower <= upper <= 1 \(fractions of a full turn"):
        g.ggml_random_rotation((-1.5, 0.1))
    with pytest.raises(g.GgmlTypeError, match="a number or a pair"):
        g.ggml_random_rotation("0.1")
    with pytest.raises(g.GgmlValueError, match="random_rotation fill_mode must be one of"):
        g.ggml_random_rotation(0.1, fill_mode="mirror")
    with pytest.raises(g.GgmlValueError, match="random_rotation interpolation must be one of"):
        g.ggml_random_rotation(0.1, interpolation="bicubic")
    with pytest.raises(g.GgmlValueError, match="fill_value must be a finite number"):
        g.ggml_random_rotation(0.1, fill_value=float("nan"))
    with pytest.raises(g.GgmlValueError, match=r"takes image samples \(height, width, channels\), got shape "
                                               r"\(4, 3\); reshape"):
        g.ggml_layer_random_rotation(g.ggml_model_sequential(), 0.1, input_shape=(4, 3))
