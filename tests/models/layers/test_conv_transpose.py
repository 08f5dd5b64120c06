"""Conv2DTranspose (ggmlpy/models/layers/conv_transpose.py) against float64 numpy references and Keras 3.

* forward: ``ggml_predict`` equals the scatter-add definition (each input pixel times the kernel added into
  the output at stride steps), cropped to Keras' window, for square and non-square kernels and strides,
  strides above and below the kernel, 'same' and 'valid', batch and channels above 1;
* training: SGD steps of ``ggml_fit`` (shuffle=False) give the weights of the same steps in numpy float64
  (the transposed convolution's gradients written out by hand, through a 1x1 conv_2d before it so the input
  gradient is checked too), and Keras 3's Conv2DTranspose from the same starting weights predicts and trains
  the same;
* on the CPU and on Vulkan (lavapipe, GGML_VK_VISIBLE_DEVICES=0), where the whole training step must stay on
  the device;
* misuse: wrong arguments say what was expected; 1x1 inputs; the config rebuilds the layer; saving.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.errors import GgmlStateError, GgmlTypeError, GgmlValueError
from ggmlpy.models.layers.conv_transpose import Conv2DTranspose
from tests.helpers import layer_refs as R


LR = 0.05


pytestmark = pytest.mark.usefixtures("one_cpu_thread")


def _vulkan_missing() -> str | None:
    if "vulkan" not in [b.lower() for b in g.ggml_backends_built()]:
        return "this ggmlpy is built without the Vulkan backend"
    if g.ggml_backend_dev_by_name("Vulkan0") is None:
        return ("the Vulkan backend is built but lists no device Vulkan0 (lavapipe needs GGML_VK_VISIBLE_DEVICES=0 "
                "set before ggmlpy is imported)")
    return None


@pytest.fixture(params=["cpu", "Vulkan0"])
def backend(request) -> str:
    if request.param == "Vulkan0" and _vulkan_missing():
        pytest.skip(_vulkan_missing())
    return request.param


def _tol(backend: str) -> tuple[float, float]:
    """(rtol, atol): lavapipe's matrix products round through float16 (~1e-3, as in test_layers)."""
    return (1e-5, 2e-5) if backend == "cpu" else (3e-3, 3e-3)


# ---------------------------------------------------------------- numpy float64 references

def _window(n: int, k: int, s: int, padding: str) -> tuple[int, int]:
    """(start, size) of the part of the full scatter ((n - 1) * s + k long) that Keras keeps (output_padding=None):
    'valid' all of it, at least n * s; 'same' n * s from (k - s) // 2 (the odd extra cut from the end)."""
    if padding == "valid":
        return 0, n * s + max(k - s, 0)
    return max((k - s) // 2, 0), n * s


def _full(x: np.ndarray, kernel: np.ndarray, strides) -> np.ndarray:
    """The scatter-add: out[n, i*sh + a, j*sw + b, f] += x[n, i, j, c] * kernel[a, b, f, c]."""
    n, h, w, _ = x.shape
    kh, kw, f, _ = kernel.shape
    sh, sw = strides
    out = np.zeros((n, (h - 1) * sh + kh, (w - 1) * sw + kw, f))
    for i in range(h):
        for j in range(w):
            out[:, i * sh:i * sh + kh, j * sw:j * sw + kw, :] += np.einsum("nc,abfc->nabf", x[:, i, j, :], kernel)
    return out


def _crops(x_shape, kernel_shape, strides, padding):
    (_, h, w, _), (kh, kw, _, _) = x_shape, kernel_shape
    return _window(h, kh, strides[0], padding), _window(w, kw, strides[1], padding)


def conv_transpose(x, kernel, bias, strides, padding, act=None) -> np.ndarray:
    x, kernel = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
    full = _full(x, kernel, strides)
    (r0, rn), (c0, cn) = _crops(x.shape, kernel.shape, strides, padding)
    big = np.zeros((full.shape[0], max(r0 + rn, full.shape[1]), max(c0 + cn, full.shape[2]), full.shape[3]))
    big[:, :full.shape[1], :full.shape[2]] = full          # 'valid' with strides above the kernel: zeros after
    y = big[:, r0:r0 + rn, c0:c0 + cn]
    return R.activation(y + (0.0 if bias is None else np.asarray(bias, np.float64)), act)


def conv_transpose_grads(x, kernel, dy, strides, padding):
    """Gradients of sum(dy * conv_transpose(x)) (linear, no activation): (d kernel, d bias, d x)."""
    x, kernel = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
    n, h, w, _ = x.shape
    kh, kw, _, _ = kernel.shape
    sh, sw = strides
    (r0, rn), (c0, cn) = _crops(x.shape, kernel.shape, strides, padding)
    big = np.zeros((n, max(r0 + rn, (h - 1) * sh + kh), max(c0 + cn, (w - 1) * sw + kw), kernel.shape[2]))
    big[:, r0:r0 + rn, c0:c0 + cn] = dy                     # the gradient of the full scatter
    dk, dx = np.zeros_like(kernel), np.zeros_like(x)
    for i in range(h):
        for j in range(w):
            window = big[:, i * sh:i * sh + kh, j * sw:j * sw + kw, :]
            dk += np.einsum("nc,nabf->abfc", x[:, i, j, :], window)
            dx[:, i, j, :] = np.einsum("nabf,abfc->nc", window, kernel)
    return dk, dy.sum(axis=(0, 1, 2)), dx


def sgd_reference(w: dict, x, y, strides, padding, batch: int, epochs: int, lr: float = LR) -> dict:
    """ggml_fit's steps in float64: a 1x1 conv_2d 'pre' then the transposed conv 't', MSE, plain SGD,
    batches in order."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    for _ in range(epochs):
        for b0 in range(0, len(x), batch):
            xb, yb = x[b0:b0 + batch].astype(np.float64), y[b0:b0 + batch].astype(np.float64)
            h = R.conv2d(xb, w["pre.kernel"], w["pre.bias"])
            out = conv_transpose(h, w["t.kernel"], w["t.bias"], strides, padding)
            dy = 2.0 * (out - yb) / out.size                  # MSE: the mean over every value of the batch
            dk, db, dh = conv_transpose_grads(h, w["t.kernel"], dy, strides, padding)
            grads = {"t.kernel": dk, "t.bias": db, "pre.kernel": np.einsum("nijc,nijd->cd", xb, dh)[None, None],
                     "pre.bias": dh.sum(axis=(0, 1, 2))}
            w = {k: v - lr * grads[k] for k, v in w.items()}
    return w


def assert_close(got, want, rtol: float, atol: float, what: str) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    err = np.abs(got - want)
    assert (err <= atol + rtol * np.abs(want)).all(), \
        f"{what}: max abs err {err.max():.3g} (max |expected| {np.abs(want).max():.3g})"
    return float(err.max())


# ---------------------------------------------------------------- models

def transpose_model(shape, backend: str = "cpu", pre: int | None = None, **kw):
    """input -> [1x1 conv_2d 'pre' with ``pre`` filters] -> Conv2DTranspose 't', compiled for SGD + MSE."""
    x = g.ggml_input(shape=shape)
    h = g.ggml_layer_conv_2d(x, pre, (1, 1), name="pre") if pre else x
    out = g.ggml_apply(h, Conv2DTranspose(name="t", **kw))
    model = g.ggml_model(x, out)
    return g.ggml_compile(model, optimizer="sgd", loss="mse", metrics=[], backend=backend, learning_rate=LR)


def randomize(model, rng: np.random.RandomState) -> dict:
    new = {k: (rng.normal(0, 0.3, v.shape) if k.endswith("bias") else rng.uniform(-0.5, 0.5, v.shape))
           for k, v in g.ggml_get_weights(model).items()}
    g.ggml_set_weights(model, new)
    return g.ggml_get_weights(model)


# ---------------------------------------------------------------- 1. forward

FORWARD = [  # (input (H, W, C), filters, kernel_size, strides, padding, activation, use_bias)
    ((4, 5, 2), 3, (3, 3), (2, 2), "same", None, True),
    ((4, 5, 2), 3, (3, 3), (2, 2), "valid", None, True),
    ((4, 3, 3), 2, (4, 4), (2, 2), "same", "relu", True),
    ((4, 3, 3), 2, (4, 4), (2, 2), "valid", None, False),
    ((3, 4, 2), 3, (2, 3), (3, 2), "same", None, True),     # non-square kernel and strides, kernel < stride
    ((3, 4, 2), 3, (2, 3), (3, 2), "valid", None, True),    # 'valid' with a stride above the kernel: zeros after
    ((5, 4, 2), 2, (5, 2), (2, 1), "same", "tanh", True),   # kernel - stride odd on the rows: Keras' crop side
    ((5, 4, 1), 4, (3, 4), (1, 1), "same", None, True),     # stride 1: even kernel, same
    ((5, 4, 2), 2, (3, 3), (1, 1), "valid", None, True),
    ((3, 3, 2), 4, (1, 1), (2, 2), "valid", None, True),
    ((3, 2, 2), 3, (3, 3), (2, 2), "same", "softmax", True),  # softmax over the filters (the user's layout)
]


@pytest.mark.parametrize("shape, filters, kernel, strides, padding, act, use_bias", FORWARD,
                         ids=[f"{s[0]}x{s[1]}x{s[2]}-k{k[0]}x{k[1]}-s{st[0]}x{st[1]}-{p}-{a}"
                              for s, _, k, st, p, a, _ in FORWARD])
def test_forward_matches_the_scatter_definition(shape, filters, kernel, strides, padding, act, use_bias):
    rng = np.random.RandomState(1)
    model = transpose_model(shape, filters=filters, kernel_size=kernel, strides=strides, padding=padding,
                            activation=act, use_bias=use_bias)
    w = randomize(model, rng)
    assert w["t.kernel"].shape == (kernel[0], kernel[1], filters, shape[2])  # Keras' orientation
    x = rng.normal(0, 1, (3,) + shape).astype(np.float32)
    want = conv_transpose(x, w["t.kernel"], w.get("t.bias"), strides, padding, act)
    got = g.ggml_predict(model, x, batch_size=3)
    assert_close(got, want, 1e-5, 1e-5, "forward")


def test_forward_on_each_backend(backend):
    rng = np.random.RandomState(2)
    model = transpose_model((4, 3, 3), backend, filters=2, kernel_size=(4, 3), strides=(2, 3), padding="same")
    w = randomize(model, rng)
    x = rng.normal(0, 1, (4, 4, 3, 3)).astype(np.float32)
    got = g.ggml_predict(model, x, batch_size=4)
    assert_close(got, conv_transpose(x, w["t.kernel"], w["t.bias"], (2, 3), "same"), *_tol(backend), backend)


# ---------------------------------------------------------------- 2. training

TRAIN = [((3, 4, 2), (3, 3), (2, 2), "same"), ((3, 4, 2), (4, 3), (2, 3), "valid"),
         ((4, 3, 2), (2, 4), (3, 2), "same")]


@pytest.mark.parametrize("shape, kernel, strides, padding", TRAIN,
                         ids=[f"k{k[0]}x{k[1]}-s{s[0]}x{s[1]}-{p}" for _, k, s, p in TRAIN])
def test_sgd_steps_match_numpy(backend, shape, kernel, strides, padding):
    """Six SGD steps (3 epochs of 2 batches, in order): the weights, the input's gradient included (through
    the 1x1 conv before the layer), follow numpy's float64 steps."""
    rng = np.random.RandomState(3)
    model = transpose_model(shape, backend, pre=3, filters=2, kernel_size=kernel, strides=strides, padding=padding)
    w0 = randomize(model, rng)
    x = rng.normal(0, 1, (8,) + shape).astype(np.float32)
    y = rng.normal(0, 1, (8,) + g.ggml_predict(model, x[:1]).shape[1:]).astype(np.float32)
    g.ggml_fit(model, x, y, epochs=3, batch_size=4, shuffle=False, verbose=0)
    want = sgd_reference(w0, x, y, strides, padding, batch=4, epochs=3)
    got = g.ggml_get_weights(model)
    share = 1e-3 if backend == "cpu" else 2e-2  # of the largest update (measured: ~1e-5 on the CPU and lavapipe)
    for k in want:
        moved = np.abs(want[k] - w0[k]).max()
        assert moved > 1e-3, f"{k} hardly moved: the comparison would be empty"
        assert_close(got[k] - w0[k], want[k] - w0[k], 0.0, share * moved, f"{backend}: {k}'s change in 6 SGD steps")


def _keras():
    os.environ.setdefault("KERAS_BACKEND", "torch")  # the backend installed beside ggmlpy here, if any
    keras = pytest.importorskip("keras", reason="Keras 3 (with a backend) is not installed: the numpy checks "
                                               "above still run")
    if not str(keras.__version__).startswith("3."):
        pytest.skip(f"Keras 3 is needed, found {keras.__version__}")
    return keras


@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")
@pytest.mark.parametrize("kernel, strides, padding", [((3, 3), (2, 2), "same"), ((4, 4), (2, 2), "same"),
                                                      ((3, 2), (2, 3), "valid"), ((2, 5), (1, 2), "same")])
def test_matches_keras(kernel, strides, padding):
    """Keras 3's Conv2DTranspose loads ggml_get_weights' kernel as it is, predicts the same and trains the same
    (SGD, MSE, shuffle=False)."""
    keras = _keras()
    shape, filters = (4, 3, 2), 3
    rng = np.random.RandomState(4)
    model = transpose_model(shape, filters=filters, kernel_size=kernel, strides=strides, padding=padding,
                            activation="relu")
    w0 = randomize(model, rng)
    km = keras.Sequential([keras.Input(shape), keras.layers.Conv2DTranspose(
        filters, kernel, strides=strides, padding=padding, activation="relu")])
    km.layers[0].set_weights([w0["t.kernel"], w0["t.bias"]])
    x = rng.normal(0, 1, (8,) + shape).astype(np.float32)
    want = np.asarray(km.predict(x, verbose=0))
    assert_close(g.ggml_predict(model, x), want, 1e-5, 1e-5, "prediction vs Keras")
    y = rng.normal(0, 1, want.shape).astype(np.float32)
    km.compile(optimizer=keras.optimizers.SGD(learning_rate=LR), loss="mse")
    km.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0)
    g.ggml_fit(model, x, y, epochs=3, batch_size=4, shuffle=False, verbose=0)
    got, (k_kernel, k_bias) = g.ggml_get_weights(model), km.layers[0].get_weights()
    assert np.abs(k_kernel - w0["t.kernel"]).max() > 1e-3
    assert_close(got["t.kernel"], k_kernel, 1e-5, 1e-5, "kernel trained vs Keras")
    assert_close(got["t.bias"], k_bias, 1e-5, 1e-5, "bias trained vs Keras")
    assert_close(g.ggml_predict(model, x), np.asarray(km.predict(x, verbose=0)), 1e-5, 1e-5,
                 "prediction after training vs Keras")


def test_initializers_use_keras_fans():
    """Keras' fans of a (kh, kw, filters, in channels) kernel: fan-in kh*kw*filters (he_uniform's limit)."""
    model = transpose_model((2, 2, 8), filters=16, kernel_size=3, kernel_initializer="he_uniform")
    kernel = g.ggml_get_weights(model)["t.kernel"]
    limit = np.sqrt(6.0 / (3 * 3 * 16))
    assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.95 * limit


# ---------------------------------------------------------------- 3. on the device

def test_training_step_stays_on_vulkan():
    """Forward, backward (IM2COL_BACK through the 1x1 conv before it, the views' and permutes' gradients) and
    the SGD step all run on Vulkan0: one split, no op on the CPU."""
    why = _vulkan_missing()
    if why:
        pytest.skip(why)
    model = transpose_model((5, 4, 3), "Vulkan0", pre=4, filters=3, kernel_size=(3, 4), strides=(2, 3),
                            padding="same", activation="relu")
    p = g.ggml_model_placement(model, batch_size=8)
    assert p.cpu_ops == [] and p.devices == ["Vulkan0"] and p.n_splits == 1, str(p)
    assert "IM2COL_BACK" in p.op_counts(), str(p)
    p = g.ggml_model_placement(model, batch_size=8, training=False)
    assert p.cpu_ops == [] and p.n_splits == 1, str(p)


# ---------------------------------------------------------------- 4. arguments, shapes, saving

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(filters=0, kernel_size=3), GgmlValueError, r"filters must be a positive int .* got 0"),
    (dict(filters=2.5, kernel_size=3), GgmlTypeError, r"filters must be a positive int .* got 2\.5"),  # not an int
    (dict(filters="8", kernel_size=3), GgmlTypeError, r"filters must be a positive int .* got '8'"),
    (dict(filters=4, kernel_size=(3,)), GgmlValueError, r"kernel_size must be an int or a pair \(rows, cols\)"),
    (dict(filters=4, kernel_size=(3, 0)), GgmlValueError, r"kernel_size must be a positive int .* got 0"),
    (dict(filters=4, kernel_size=(3, 3, 3)), GgmlValueError, r"kernel_size must be an int or a pair"),
    (dict(filters=4, kernel_size=3, strides=0), GgmlValueError, r"strides must be a positive int .* got 0"),
    (dict(filters=4, kernel_size=3, strides=(2, -1)), GgmlValueError, r"strides must be a positive int .* got -1"),
    (dict(filters=4, kernel_size=3, strides="2"), GgmlValueError, r"strides must be an int or a pair"),
    (dict(filters=4, kernel_size=3, padding="full"), GgmlValueError,
     r"padding must be 'valid' or 'same', got 'full'"),
    (dict(filters=4, kernel_size=3, padding=None), GgmlValueError, r"padding must be 'valid' or 'same', got None"),
    (dict(filters=4, kernel_size=3, activation="relu7"), GgmlValueError, r"unknown activation 'relu7'; expected"),
    (dict(filters=4, kernel_size=3, activation=3), GgmlTypeError, r"activation must be a name \(str\) or None"),
    (dict(filters=4, kernel_size=3, use_bias="yes"), GgmlTypeError, r"use_bias must be True or False"),
    (dict(filters=4, kernel_size=3, kernel_initializer="xavier"), GgmlValueError,
     r"kernel_initializer must be one of glorot_uniform, .* got 'xavier'"),
    (dict(filters=4, kernel_size=3, name="a b"), GgmlValueError, r"a layer name must be letters, digits"),
    (dict(filters=4, kernel_size=3, output_padding=1), TypeError, r"unexpected keyword argument 'output_padding'"),
])
def test_bad_arguments_say_what_was_expected(kwargs, error, message):
    with pytest.raises(error, match=message):
        Conv2DTranspose(**kwargs)


def test_non_image_input_is_refused():
    x = g.ggml_input(shape=(10, 3))
    with pytest.raises(GgmlValueError, match=r"conv_2d_transpose '.*' takes image samples \(height, width, "
                                             r"channels\), got shape \(10, 3\)"):
        g.ggml_apply(x, Conv2DTranspose(2, 3))


def test_arguments_are_fixed_once_made():
    layer = Conv2DTranspose(2, 3)
    with pytest.raises(GgmlStateError, match="strides cannot change"):
        layer.strides = (2, 2)


@pytest.mark.parametrize("kernel, strides, padding, want", [
    ((3, 3), (2, 2), "same", (2, 2)), ((3, 3), (2, 2), "valid", (3, 3)), ((4, 1), (2, 3), "valid", (4, 3)),
    ((1, 2), (1, 1), "same", (1, 1)), ((5, 5), (1, 1), "valid", (5, 5)), ((2, 3), (3, 3), "same", (3, 3))])
def test_one_pixel_input(kernel, strides, padding, want):
    """A 1x1 image becomes the kernel itself ('valid', stride <= kernel) or stride x stride ('same')."""
    rng = np.random.RandomState(5)
    model = transpose_model((1, 1, 2), filters=3, kernel_size=kernel, strides=strides, padding=padding)
    assert model.outputs[0].shape == want + (3,)
    w = randomize(model, rng)
    x = rng.normal(0, 1, (2, 1, 1, 2)).astype(np.float32)
    assert_close(g.ggml_predict(model, x), conv_transpose(x, w["t.kernel"], w["t.bias"], strides, padding),
                 1e-5, 1e-5, "1x1 input")


def test_config_rebuilds_the_layer():
    layer = Conv2DTranspose(5, (3, 2), strides=(2, 1), padding="same", activation="swish", use_bias=False,
                            kernel_initializer="he_normal", bias_initializer="ones", kernel_regularizer="l2")
    config = layer.config()
    assert config == {"filters": 5, "kernel_size": [3, 2], "strides": [2, 1], "padding": "same",
                      "activation": "silu", "use_bias": False, "kernel_initializer": "he_normal",
                      "bias_initializer": "ones"}
    again = Conv2DTranspose(**config)
    assert again.config() == config
    assert again.output_shape([(4, 5, 2)]) == layer.output_shape([(4, 5, 2)]) == (8, 5, 5)
    assert "kernel_regularizer" in layer.full_config()


def test_save_and_load(tmp_path):
    rng = np.random.RandomState(6)
    model = transpose_model((3, 4, 2), pre=2, filters=3, kernel_size=(3, 2), strides=(2, 2), padding="same",
                            activation="relu")
    randomize(model, rng)
    x = rng.normal(0, 1, (4, 3, 4, 2)).astype(np.float32)
    path = tmp_path / "m.gguf"
    g.ggml_save_model(model, str(path))
    loaded = g.ggml_load_model(str(path), backend="cpu")
    t = next(layer for layer in loaded.layers if layer.name == "t")
    original = next(layer for layer in model.layers if layer.name == "t")
    assert isinstance(t, Conv2DTranspose) and t.config() == original.config()
    np.testing.assert_array_equal(g.ggml_predict(loaded, x), g.ggml_predict(model, x))
