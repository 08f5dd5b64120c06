"""Keras' RandomTranslation and RandomZoom (models/layers/preprocessing.py), on the CPU and Vulkan.

The training-time images are read from a training graph computed forward with its step hooks run as a fit runs
them (``train_forward``), and through a real trainer step: one SGD step of a dense layer from zero weights
(loss ``(a . w - 1)^2``, learning rate 1/2) leaves ``w = a``, the augmented image. The reference is
scipy.ndimage's ``affine_transform`` given Keras' own transforms: output pixel ``o`` reads the input at
``z (o - c) + c`` (a zoom, ``c = (size - 1) / 2``, Keras' ``x_offset = c (1 - z)``) or at ``o - shift`` (a
translation of ``factor * size`` pixels). Pixel ``i`` sits at coordinate ``i`` in both (no half-pixel offset),
and each neighbour of a bilinear read is filled on its own: scipy's ``reflect`` is Keras' reflect
(d c b a | a b c d), ``grid-wrap`` Keras' wrap, ``nearest`` Keras' nearest and ``grid-constant`` Keras'
constant (scipy's plain ``constant`` and ``wrap`` do something else at the edges). At an exact half-pixel
coordinate scipy's order-0 read in reflect mode rounds after reflecting where Keras rounds first, so the
nearest-interpolation cases keep away from halves."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy import ndimage, stats

import ggmlpy as g
from ggmlpy.backend.transfer import ggml_backend_tensor_get_data, ggml_backend_tensor_set_data
from ggmlpy.compute.run import ggml_backend_sched_graph_compute
from ggmlpy.graph.context import ggml_graph_overhead, ggml_init
from ggmlpy.graph.graph import ggml_build_forward_expand, ggml_new_graph_custom
from ggmlpy.graph.tensor import ggml_set_output
from ggmlpy.models.engine.graphs import build_graph
from ggmlpy.models.engine.runtime import make_scheduler


SCIPY_MODES = {"reflect": "reflect", "wrap": "grid-wrap", "nearest": "nearest", "constant": "grid-constant"}
ORDERS = {"bilinear": 1, "nearest": 0}


def train_forward(model, x, steps=1, train=True):
    """The model's training graph for ``len(x)`` samples computed forward ``steps`` times, its step hooks
    writing before each as in a fit (``train``: a training step, else a validation step on the training graph):
    the outputs, each of x's shape (the model only augments)."""
    runtime = model.runtime
    inst = build_graph(model, runtime.params, len(x), training=True)
    graph_ctx = ggml_init(mem_size=ggml_graph_overhead(4096) + 1024, no_alloc=True)
    sched = make_scheduler(runtime.params.backend, inst.forward_nodes)
    try:
        graph = ggml_new_graph_custom(graph_ctx, 4096, False)
        out = ggml_set_output(inst.outputs[0])
        ggml_build_forward_expand(graph, out)
        results = []
        for _ in range(steps):
            ggml_backend_tensor_set_data(inst.inputs[0], x)
            for hook in inst.hooks:
                hook.before_eval(train, ggml_backend_tensor_set_data)
            ggml_backend_sched_graph_compute(sched, graph)
            results.append(ggml_backend_tensor_get_data(out).reshape(x.shape))
        return results
    finally:
        sched.free()
        graph_ctx.free()
        inst.free()


def keras_reference(images, fill_mode, interpolation, fill_value=0.0, zoom=(1.0, 1.0), shift=(0.0, 0.0)):
    """Keras' transform of images (N, H, W, C) by scipy: per axis ``input = z o + c (1 - z) - shift``."""
    h, w = images.shape[1:3]
    centre = np.array([(h - 1) / 2, (w - 1) / 2])
    matrix = np.diag([zoom[0], zoom[1], 1.0])
    offset = np.concatenate([centre * (1 - np.asarray(zoom)) - np.asarray(shift), [0.0]])
    return np.stack([ndimage.affine_transform(img.astype(np.float64), matrix, offset, order=ORDERS[interpolation],
                                              mode=SCIPY_MODES[fill_mode], cval=fill_value) for img in images])


def augmented(layer_fn, shape, device, *args, **kwargs):
    model = layer_fn(g.ggml_model_sequential(), *args, input_shape=shape, **kwargs)
    return g.ggml_compile(model, loss="mse", backend=device)


CASES = [   # (layer, its factors, Keras' zoom and shift in pixels for H=5, W=7)
    ("translation", ((0.23, 0.23), (-0.31, -0.31)), (1.0, 1.0), (0.23 * 5, -0.31 * 7)),
    ("translation", ((-0.45, -0.45), (0.0, 0.0)), (1.0, 1.0), (-0.45 * 5, 0.0)),     # the height only
    ("translation", ((0.0, 0.0), (0.93, 0.93)), (1.0, 1.0), (0.0, 0.93 * 7)),        # the width, off the image
    ("zoom", ((0.23, 0.23), (-0.3, -0.3)), (1.23, 0.7), (0.0, 0.0)),
    ("zoom", ((-0.41, -0.41), None), (0.59, 0.59), (0.0, 0.0)),                      # width as the height
    ("zoom", ((0.0, 0.0), (0.77, 0.77)), (1.0, 1.77), (0.0, 0.0)),                   # the width only
]


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest"])
@pytest.mark.parametrize("fill_mode", ["reflect", "wrap", "constant", "nearest"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_training_images_are_keras_transforms(device, case, fill_mode, interpolation):
    kind, factors, zoom, shift = CASES[case]
    x = np.random.default_rng(case).normal(size=(2, 5, 7, 3)).astype(np.float32)
    fn = g.ggml_layer_random_translation if kind == "translation" else g.ggml_layer_random_zoom
    model = augmented(fn, (5, 7, 3), device, *factors, fill_mode=fill_mode, interpolation=interpolation,
                      fill_value=0.75)
    got = train_forward(model, x)[0]
    want = keras_reference(x, fill_mode, interpolation, 0.75, zoom, shift)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_directions_are_keras(device):
    """A positive height shift moves the image down, a positive width shift right; a positive zoom zooms out
    (the image shrinks towards its centre), a negative one in."""
    x = np.zeros((1, 5, 7, 1), np.float32)
    x[0, 1, 2, 0] = 1.0
    moved = train_forward(augmented(g.ggml_layer_random_translation, (5, 7, 1), device, (0.4, 0.4),
                                    (-2 / 7, -2 / 7), fill_mode="constant"), x)[0]
    assert np.unravel_index(np.argmax(moved[0, ..., 0]), (5, 7)) == (3, 0)      # 2 rows down, 2 columns left
    np.testing.assert_allclose(moved.sum(), 1.0, atol=1e-5)
    edge = np.zeros((1, 9, 9, 1), np.float32)
    edge[0, :, 0] = edge[0, :, -1] = 1.0                                       # the left and right columns
    out = train_forward(augmented(g.ggml_layer_random_zoom, (9, 9, 1), device, (0.0, 0.0), (1.0, 1.0),
                                  fill_mode="constant", interpolation="nearest"), edge)[0][0, 4, :, 0]
    np.testing.assert_array_equal(out, [0, 0, 1, 0, 0, 0, 1, 0, 0])            # zoomed out 2x: half the width
    out = train_forward(augmented(g.ggml_layer_random_zoom, (9, 9, 1), device, (0.0, 0.0), (-0.5, -0.5),
                                  fill_mode="constant", interpolation="nearest"), edge)[0][0, 4, :, 0]
    np.testing.assert_array_equal(out, np.zeros(9))                           # zoomed in 2x: the edges gone


def test_a_trainer_step_sees_the_transformed_image(device):
    """Through the fit's own step (its hooks, uploads and the backward pass), batch 1: one SGD step from zero
    weights makes the dense layer's weights the augmented image."""
    x = np.random.default_rng(3).normal(size=(1, 4, 6, 2)).astype(np.float32)
    m = g.ggml_layer_random_translation(g.ggml_model_sequential(), (0.3, 0.3), (-0.2, -0.2), fill_mode="wrap",
                                        input_shape=(4, 6, 2))
    m = g.ggml_layer_random_zoom(m, (-0.15, -0.15), fill_mode="reflect")
    m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 1, use_bias=False, name="d")
    m = g.ggml_compile(m, loss="mse", optimizer="sgd", learning_rate=0.5, backend=device)
    g.ggml_set_weights(m, {"d.weight": np.zeros((48, 1), np.float32)})
    with g.ggml_trainer(m, batch_size=1) as trainer:
        loss = trainer.step(x, np.ones((1, 1), np.float32))
    assert loss == pytest.approx(1.0)
    shifted = keras_reference(x, "wrap", "bilinear", shift=(0.3 * 4, -0.2 * 6))
    want = keras_reference(shifted, "reflect", "bilinear", zoom=(0.85, 0.85))
    np.testing.assert_allclose(g.ggml_get_weights(m)["d.weight"][:, 0], want.reshape(-1), rtol=1e-4, atol=1e-5)


def _drawn_shifts(out, h, w):
    """The (row, column) shift of each image of ramps (channel 0: the row, channel 1: the column), read at
    the centre."""
    return (h - 1) / 2 - out[:, h // 2, w // 2, 0], (w - 1) / 2 - out[:, h // 2, w // 2, 1]


def ramps(n, h, w):
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    return np.broadcast_to(np.stack([rows, cols], -1), (n, h, w, 2)).astype(np.float32).copy()


def test_each_image_and_step_draws_its_own_translation_uniformly(device):
    n, h, w = 200, 21, 31
    np.random.seed(5)
    model = augmented(g.ggml_layer_random_translation, (h, w, 2), device, 0.4, (-0.1, 0.3), fill_mode="nearest")
    first, second = train_forward(model, ramps(n, h, w), steps=2)
    dh, dw = _drawn_shifts(first, h, w)
    dh2, _ = _drawn_shifts(second, h, w)
    assert len(np.unique(np.round(dh, 3))) > 0.9 * n and not np.allclose(dh, dh2)   # per image, per step
    assert -0.4 * h - 1e-3 <= dh.min() and dh.max() <= 0.4 * h + 1e-3
    assert -0.1 * w - 1e-3 <= dw.min() and dw.max() <= 0.3 * w + 1e-3
    for drawn, low, high in ((np.concatenate([dh, dh2]), -0.4 * h, 0.4 * h), (dw, -0.1 * w, 0.3 * w)):
        assert stats.kstest(drawn, stats.uniform(low, high - low).cdf).pvalue > 1e-3
    assert abs(np.corrcoef(dh, dw)[0, 1]) < 0.25          # the two axes drawn apart
    np.random.seed(5)
    again = train_forward(model, ramps(n, h, w))[0]        # numpy's global seed makes the draws reproducible
    np.testing.assert_array_equal(again, first)


def test_each_image_draws_its_own_zoom_and_width_none_keeps_the_aspect_ratio(device):
    n, h, w = 200, 21, 31
    np.random.seed(6)
    x = ramps(n, h, w)

    def zooms(out):   # output pixel h // 4 (w // 4) reads the input at c - z (c - h // 4)
        ch, cw = (h - 1) / 2, (w - 1) / 2
        return ((ch - out[:, h // 4, w // 4, 0]) / (ch - h // 4), (cw - out[:, h // 4, w // 4, 1]) / (cw - w // 4))
    zh, zw = zooms(train_forward(augmented(g.ggml_layer_random_zoom, (h, w, 2), device, (-0.5, 0.3),
                                           fill_mode="nearest"), x)[0])
    np.testing.assert_allclose(zh, zw, atol=1e-4)
    assert 0.5 - 1e-4 <= zh.min() and zh.max() <= 1.3 + 1e-4 and len(np.unique(np.round(zh, 4))) > 0.9 * n
    assert stats.kstest(zh, stats.uniform(0.5, 0.8).cdf).pvalue > 1e-3
    zh, zw = zooms(train_forward(augmented(g.ggml_layer_random_zoom, (h, w, 2), device, 0.2, (0.1, 0.4),
                                           fill_mode="nearest"), x)[0])
    assert 0.8 - 1e-4 <= zh.min() and zh.max() <= 1.2 + 1e-4 and 1.1 - 1e-4 <= zw.min() and zw.max() <= 1.4 + 1e-4
    assert stats.kstest(zw, stats.uniform(1.1, 0.3).cdf).pvalue > 1e-3


# what the augmentation layers share, each test run for each: (a name, what appends the layers to a model)
AUGMENTATIONS = {
    "translation_zoom": lambda m, **kw: g.ggml_layer_random_zoom(g.ggml_layer_random_translation(m, 0.5, 0.5), 0.5,
                                                                  **kw),
    "rotation": lambda m, **kw: g.ggml_layer_random_rotation(m, 0.5, **kw),
}


@pytest.mark.parametrize("augment", sorted(AUGMENTATIONS))
def test_inference_leaves_the_images_alone(device, augment):
    x = np.random.default_rng(7).normal(size=(5, 6, 4, 3)).astype(np.float32)
    m = g.ggml_layer_rescaling(g.ggml_model_sequential(), 1.0, input_shape=(6, 4, 3))
    m = AUGMENTATIONS[augment](m, fill_mode="constant", fill_value=3.0)
    m = g.ggml_compile(m, loss="mse", backend=device)
    np.testing.assert_array_equal(g.ggml_predict(m, x).reshape(x.shape), x)
    assert g.ggml_evaluate(m, x, x, batch_size=2)["loss"] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(train_forward(m, x, train=False)[0], x, rtol=1e-6, atol=1e-6)  # a validation step
    assert not np.allclose(train_forward(m, x)[0], x)


def test_the_gradient_flows_through_to_the_weights_before(device):
    """One SGD step of a dense layer (per pixel, on the channels) before a fixed translation: its gradient is
    numpy's, through the transpose of the translation (the constant fill adds no gradient)."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(1, 4, 5, 3)).astype(np.float32)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, use_bias=False, name="d1", input_shape=(4, 5, 3))
    m = g.ggml_layer_random_translation(m, (0.3, 0.3), (-0.37, -0.37), fill_mode="constant", fill_value=0.5)
    m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 1, use_bias=False, name="d2")
    m = g.ggml_compile(m, loss="mse", optimizer="sgd", learning_rate=0.1, backend=device)
    w1 = rng.normal(size=(3, 2)).astype(np.float32)
    w2 = rng.normal(size=(40, 1)).astype(np.float32)
    g.ggml_set_weights(m, {"d1.weight": w1, "d2.weight": w2})
    shift = (0.3 * 4, -0.37 * 5)
    hidden = keras_reference(x.astype(np.float64) @ w1, "constant", "bilinear", 0.5, shift=shift)  # (1, 4, 5, 2)
    residual = float(hidden.reshape(-1) @ w2[:, 0]) - 1.0
    moved = keras_reference(x, "constant", "bilinear", 0.0, shift=shift)[0]                        # (4, 5, 3)
    grad = 2 * residual * moved.reshape(-1, 3).T @ w2[:, 0].reshape(-1, 2)                        # (3, 2)
    with g.ggml_trainer(m, batch_size=1) as trainer:
        assert trainer.step(x, np.ones((1, 1), np.float32)) == pytest.approx(residual ** 2, rel=1e-4)
    np.testing.assert_allclose(g.ggml_get_weights(m)["d1.weight"], w1 - 0.1 * grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("augment", sorted(AUGMENTATIONS))
def test_a_fit_with_a_partial_last_batch_trains_the_layers_before(augment):
    rng = np.random.default_rng(9)
    x = rng.normal(size=(13, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 2, 13)
    m = g.ggml_layer_conv_2d(g.ggml_model_sequential(), 2, (3, 3), padding="same", name="c", input_shape=(8, 8, 1))
    m = AUGMENTATIONS[augment](m, fill_mode="constant")
    m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 2, activation="softmax")
    m = g.ggml_compile(m, loss="sparse_categorical_crossentropy", backend="cpu")
    before = g.ggml_get_weights(m)["c.kernel"]
    history = g.ggml_fit(m, x, y, epochs=2, batch_size=5, verbose=0, validation_split=0.2)
    assert np.isfinite(history["train_loss"]).all() and np.isfinite(history["val_loss"]).all()
    assert not np.allclose(g.ggml_get_weights(m)["c.kernel"], before)


@pytest.mark.parametrize("augment", sorted(AUGMENTATIONS))
def test_replicas_draw_for_their_own_share_of_the_batch(augment):
    if "vulkan" not in g.ggml_backends_built() or g.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("no Vulkan0 device: a second replica needs a device other than the CPU")
    rng = np.random.default_rng(10)
    x = rng.normal(size=(11, 6, 6, 2)).astype(np.float32)
    y = rng.normal(size=(11, 1)).astype(np.float32)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 3, name="d1", input_shape=(6, 6, 2))
    m = AUGMENTATIONS[augment](m, interpolation="nearest")
    m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 1)
    m = g.ggml_compile(m, loss="mse", backend=["cpu", "Vulkan0"], shares=[2, 1])
    before = g.ggml_get_weights(m)["d1.weight"]
    history = g.ggml_fit(m, x, y, epochs=2, batch_size=5, verbose=0)
    assert np.isfinite(history["train_loss"]).all()
    assert not np.allclose(g.ggml_get_weights(m)["d1.weight"], before)


def test_save_load_and_pickle_keep_the_layers(tmp_path):
    x = np.random.default_rng(11).normal(size=(3, 6, 5, 2)).astype(np.float32)
    m = g.ggml_layer_random_translation(g.ggml_model_sequential(), (-0.1, 0.2), 0.3, fill_mode="constant",
                                        fill_value=0.5, interpolation="nearest", input_shape=(6, 5, 2), name="t")
    m = g.ggml_layer_random_zoom(m, 0.2, (-0.3, 0.1), fill_mode="wrap", name="z")
    m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 2)
    m = g.ggml_compile(m, loss="mse", backend="cpu")
    path = str(tmp_path / "aug.gguf")
    g.ggml_save_model(m, path)
    for again in (g.ggml_load_model(path, backend="cpu"), pickle.loads(pickle.dumps(m))):
        layers = {layer.name: layer for layer in again.layers}
        assert layers["t"].config() == {"height_factor": [-0.1, 0.2], "width_factor": 0.3, "fill_mode": "constant",
                                        "interpolation": "nearest", "fill_value": 0.5}
        assert layers["z"].config() == {"height_factor": 0.2, "width_factor": [-0.3, 0.1], "fill_mode": "wrap",
                                        "interpolation": "bilinear", "fill_value": 0.0}
        if again.runtime is None:
            again = g.ggml_compile(again, loss="mse", backend="cpu")
        np.testing.assert_allclose(g.ggml_predict(again, x), g.ggml_predict(m, x), rtol=1e-6)


def test_bad_arguments_say_what_to_give():
    with pytest.raises(g.GgmlValueError, match=r"height_factor is a fraction of the image's size, in \[-1, 1\]"):
        g.ggml_random_translation(1.5, 0.1)
    with pytest.raises(g.GgmlValueError, match=r"lower <= upper"):
        g.ggml_random_zoom((0.3, -0.1))
    with pytest.raises(g.GgmlValueError, match=r"-1 <= lower <= upper <= 1"):
        g.ggml_random_zoom(0.1, (-1.5, 0.1))
    with pytest.raises(g.GgmlTypeError, match="a number or a pair"):
        g.ggml_random_translation("0.1", 0.1)
    with pytest.raises(g.GgmlTypeError, match="a number or a pair"):
        g.ggml_random_translation((0.1, 0.2, 0.3), 0.1)
    with pytest.raises(g.GgmlValueError, match="fill_mode must be one of"):
        g.ggml_random_zoom(0.1, fill_mode="mirror")
    with pytest.raises(g.GgmlValueError, match="interpolation must be one of"):
        g.ggml_random_translation(0.1, 0.1, interpolation="bicubic")
    with pytest.raises(g.GgmlValueError, match="fill_value must be a finite number"):
        g.ggml_random_translation(0.1, 0.1, fill_value=float("inf"))
    for fn in (g.ggml_layer_random_translation, g.ggml_layer_random_zoom):
        with pytest.raises(g.GgmlValueError, match=r"takes image samples \(height, width, channels\), got shape "
                                                   r"\(4, 3\); reshape"):
            fn(g.ggml_model_sequential(), 0.1, 0.1, input_shape=(4, 3))
