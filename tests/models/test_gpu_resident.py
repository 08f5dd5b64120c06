"""Training that stays on the GPU: every component of the model layer, compiled on a GPU (Vulkan, CUDA), trains
in one scheduler split with no op on the CPU and no copy between device and host but the optimizer's few
parameters; and three training steps on the GPU give the CPU's losses and weights from the same start.

Components: each layer type in first position and after a trainable layer (then its input needs a gradient
too), each loss with AdamW and SGD, sample and class weights; ``ggml_fit``, ``ggml_fit_generator`` and
``ggml_trainer``, and the low-level loops (``ggml_fit_opt_gen``, ``ggml_opt_fit``) with ggml's own losses.
Vulkan runs on Mesa's lavapipe in CI (``GGML_VK_VISIBLE_DEVICES=0``); CUDA where a GPU is lent
(``benchmarks/gpu_check.sh``). A device that is missing skips its tests, saying so.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.compute.placement import PlacementRecorder


BATCH = 4
OPTIMIZER_PARAMS = ("adamw_params", "sgd_params")   # ggml-opt's per-step learning rate & co., made on the CPU
DEVICES = {"Vulkan0": ("vulkan", "GGML_VK_VISIBLE_DEVICES=0 selects Mesa's lavapipe"),
           "CUDA0": ("cuda", "an NVIDIA GPU and its driver")}


@pytest.fixture(scope="module", params=sorted(DEVICES))
def device(request):
    name = request.param
    family, hint = DEVICES[name]
    if family not in g.ggml_backends_built():
        pytest.skip(f"the {family} backend is not built in this installation (GGMLPY_BACKENDS=...,{family})")
    if g.ggml_backend_dev_by_name(name) is None:
        pytest.skip(f"the {family} backend is built but there is no {name} device ({hint})")
    return name


# ---------------------------------------------------------------- the components

def _layer_cases():
    """name -> (input shape, dtype, layers applied in order, may follow a dense layer)."""
    flat = lambda h: g.ggml_layer_flatten(h)  # noqa: E731
    return {
        "dense_relu": ((6,), None, [lambda h: g.ggml_layer_dense(h, 8, activation="relu")], True),
        "dense_gelu": ((6,), None, [lambda h: g.ggml_layer_dense(h, 8, activation="gelu")], True),
        "dense_sigmoid_tanh": ((6,), None, [lambda h: g.ggml_layer_dense(h, 8, activation="sigmoid"),
                                            lambda h: g.ggml_layer_dense(h, 8, activation="tanh")], True),
        "conv_1d": ((10, 3), None, [lambda h: g.ggml_layer_conv_1d(h, 4, 3, activation="relu"), flat], True),
        "conv_2d_valid": ((8, 8, 2), None, [lambda h: g.ggml_layer_conv_2d(h, 4, (3, 3), activation="relu"), flat],
                          True),
        "conv_2d_same_strided": ((9, 9, 2), None, [lambda h: g.ggml_layer_conv_2d(h, 3, (3, 3), strides=(2, 2),
                                                                                  padding="same"), flat], True),
        "max_pooling_2d": ((8, 8, 2), None, [lambda h: g.ggml_layer_max_pooling_2d(h, (2, 2)), flat], True),
        "global_average_pooling_2d": ((6, 6, 3), None, [lambda h: g.ggml_layer_global_average_pooling_2d(h)], True),
        "global_max_pooling_2d": ((6, 6, 3), None, [lambda h: g.ggml_layer_global_max_pooling_2d(h)], True),
        "batch_norm": ((6,), None, [lambda h: g.ggml_layer_batch_norm(h)], True),
        "batch_norm_images": ((4, 4, 3), None, [lambda h: g.ggml_layer_batch_norm(h), flat], True),
        "dropout": ((6,), None, [lambda h: g.ggml_layer_dropout(h, 0.3)], True),
        "layer_norm": ((6,), None, [lambda h: g.ggml_layer_layer_norm(h)], True),
        "lstm": ((4, 3), None, [lambda h: g.ggml_layer_lstm(h, 5)], True),
        "lstm_sequences": ((4, 3), None, [lambda h: g.ggml_layer_lstm(h, 5, return_sequences=True), flat], True),
        "gru": ((4, 3), None, [lambda h: g.ggml_layer_gru(h, 5)], True),
        "multi_head_attention": ((5, 8), None, [lambda h: g.ggml_layer_multi_head_attention(h, 2, 4, causal=True),
                                                flat], True),
        "embedding_positions": ((5,), "int32", [lambda h: g.ggml_layer_embedding(h, 20, 8),
                                                lambda h: g.ggml_layer_position_embedding(h, 5), flat], False),
    }


LAYERS = _layer_cases()
LAYER_PARAMS = [(name, after) for name, case in LAYERS.items() for after in (False, True) if not after or case[3]]


def _layer_model(name: str, after_dense: bool, loss: str = "mse", optimizer: str = "adam", backend: str = "cpu",
                 seed: int = 0):
    shape, dtype, layers, _ = LAYERS[name]
    np.random.seed(seed)
    x = g.ggml_input(shape, dtype=dtype) if dtype else g.ggml_input(shape)
    h = g.ggml_layer_dense(x, shape[-1], activation="tanh") if after_dense else x
    for layer in layers:
        h = layer(h)
    return g.ggml_compile(g.ggml_model(x, g.ggml_layer_dense(h, 3)), loss=loss, optimizer=optimizer,
                          backend=backend, learning_rate=0.01)


def _combine_model(kind: str, backend: str, seed: int = 0):
    np.random.seed(seed)
    x = g.ggml_input((6,))
    a, b = g.ggml_layer_dense(x, 4, activation="relu"), g.ggml_layer_dense(x, 4)
    h = g.ggml_layer_add([a, b]) if kind == "add" else g.ggml_layer_concatenate([a, b])
    return g.ggml_compile(g.ggml_model(x, g.ggml_layer_dense(h, 3)), loss="mse", backend=backend, learning_rate=0.01)


LOSSES = {"categorical_crossentropy": "softmax", "sparse_categorical_crossentropy": "softmax",
          "binary_crossentropy": "sigmoid", "mse": None, "mae": None, "huber": None}


def _loss_model(loss: str, optimizer: str, backend: str, seed: int = 0):
    np.random.seed(seed)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 8, activation="relu", input_shape=(6,))
    m = g.ggml_layer_dense(m, 3, activation=LOSSES[loss])
    return g.ggml_compile(m, loss=loss, optimizer=optimizer, backend=backend, learning_rate=0.01)


def _data(model, n: int, seed: int = 1):
    """Inputs and labels every loss accepts, drawn from a fixed seed."""
    rng = np.random.default_rng(seed)
    (node,) = model.graph()[0]
    if node.dtype == "int32":
        x = rng.integers(0, 20, (n,) + tuple(node.shape)).astype(np.int32)
    else:
        x = rng.normal(size=(n,) + tuple(node.shape)).astype(np.float32)
    (head,) = model.compiled.heads
    if head.sparse:
        y = rng.integers(0, 3, n)
    elif head.loss == "categorical_crossentropy":
        y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)]
    elif head.loss == "binary_crossentropy":
        y = rng.integers(0, 2, (n, 3)).astype(np.float32)
    else:
        y = rng.normal(size=(n, 3)).astype(np.float32)
    return x, y


def _assert_on_device(p, device: str, what: str) -> None:
    assert p.n_splits == 1, f"{what}: {p}"
    assert p.cpu_ops == [], f"{what}: {p}"
    assert p.devices == [device], f"{what}: {p}"
    extra = [c for c, _ in p.copied if not c.split("#")[1].startswith(OPTIMIZER_PARAMS)]
    assert extra == [], f"{what}: copies beyond the optimizer's parameters: {p}"


# ---------------------------------------------------------------- one split

@pytest.mark.parametrize("name, after_dense", LAYER_PARAMS)
def test_each_layer_trains_in_one_split(device, name, after_dense):
    model = _layer_model(name, after_dense, backend=device)
    _assert_on_device(g.ggml_model_placement(model, batch_size=BATCH), device, name)
    _assert_on_device(g.ggml_model_placement(model, batch_size=BATCH, training=False), device, f"{name} (inference)")


@pytest.mark.parametrize("kind", ["add", "concatenate"])
def test_merging_layers_train_in_one_split(device, kind):
    _assert_on_device(g.ggml_model_placement(_combine_model(kind, device), batch_size=BATCH), device, kind)


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_each_loss_and_optimizer_trains_in_one_split(device, loss, optimizer):
    model = _loss_model(loss, optimizer, device)
    _assert_on_device(g.ggml_model_placement(model, batch_size=BATCH), device, f"{loss} {optimizer}")


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_fits_with_sample_and_class_weights_stay_on_the_device(device, loss):
    """ggml_fit and ggml_fit_generator watch their first training step; the history carries what it saw."""
    model = _loss_model(loss, "adam", device)
    x, y = _data(model, 16)
    kw = {"class_weight": {0: 1.0, 1: 2.0, 2: 0.5}} if model.compiled.heads[0].sparse else {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", g.GgmlpyWarning)   # the warning about ops left on the CPU would fail it
        hist = g.ggml_fit(model, x, y, epochs=1, batch_size=BATCH, verbose=0,
                          sample_weight=np.linspace(0.5, 1.5, 16), **kw)
        _assert_on_device(hist.attrs["placement"], device, f"ggml_fit {loss} weighted")
        gen_hist = g.ggml_fit_generator(model, [(x[:BATCH], y[:BATCH]), (x[BATCH:2 * BATCH], y[BATCH:2 * BATCH])],
                                        epochs=1, verbose=0)
        _assert_on_device(gen_hist.attrs["placement"], device, f"ggml_fit_generator {loss}")


def test_low_level_loops_with_ggmls_losses_stay_on_the_device(device):
    backend = g.ggml_backend_init_by_name(device)
    sched = g.ggml_backend_sched_new([backend], parallel=False)
    ctx = g.ggml_init(16 << 20, no_alloc=True)
    try:
        x = g.ggml_set_input(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 6, 8))
        w = g.ggml_set_param(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 6, 4))
        out = g.ggml_mul_mat(ctx, w, x)
        g.ggml_backend_alloc_ctx_tensors(ctx, backend)
        g.ggml_backend_tensor_set_data(w, np.random.default_rng(0).normal(size=24))
        rng = np.random.default_rng(1)
        batches = [(rng.normal(size=48).astype(np.float32), np.eye(4, dtype=np.float32)[rng.integers(0, 4, 8)])
                   for _ in range(3)]
        for loss in (g.ggml_opt_loss_type_cross_entropy(), g.ggml_opt_loss_type_mse()):
            hist = g.ggml_fit_opt_gen(sched, ctx, x, out, batches, epochs=1, loss_type=loss, silent=True)
            _assert_on_device(hist.attrs["placement"], device, f"ggml_fit_opt_gen loss {loss}")
        # ggml's own C loop, watched on its scheduler
        ds = g.ggml_opt_dataset_init(g.GGML_TYPE_F32, g.GGML_TYPE_F32, 6, 4, 16, 1)
        g.ggml_backend_tensor_set_data(g.ggml_opt_dataset_data(ds), rng.normal(size=96))
        g.ggml_backend_tensor_set_data(g.ggml_opt_dataset_labels(ds), np.eye(4)[rng.integers(0, 4, 16)])
        with PlacementRecorder(sched) as rec:
            g.ggml_opt_fit(sched, ctx, x, out, ds, loss_type=g.ggml_opt_loss_type_cross_entropy(), nepoch=1,
                           nbatch_logical=8, silent=True)
        _assert_on_device(rec.placement("ggml_opt_fit"), device, "ggml_opt_fit")
        g.ggml_opt_dataset_free(ds)
    finally:
        sched.free()
        ctx.free()
        backend.free()


def test_a_step_leaving_ops_on_the_cpu_warns_naming_them(device):
    """An OUT_PROD of an F16 operand (a constant term of the output here) is an op Vulkan refuses: the fit says so.
    (ggml_conv_2d's float16 im2col was the example once; its backward is a product Vulkan computes since
    patches/0060.)"""
    if device != "Vulkan0":
        pytest.skip("the example's op (OUT_PROD of an F16 operand) is one only Vulkan lacks")
    backend = g.ggml_backend_init_by_name(device)
    sched = g.ggml_backend_sched_new([backend], parallel=False)
    ctx = g.ggml_init(16 << 20, no_alloc=True)
    try:
        x = g.ggml_set_input(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 16, 4))
        k = g.ggml_set_param(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 16, 2))
        a = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 2, 3)
        b = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 4, 3)
        g.ggml_backend_alloc_ctx_tensors(ctx, backend)   # the leaves: the ops below get memory from the scheduler
        term = g.ggml_out_prod(ctx, g.ggml_cast(ctx, a, g.GGML_TYPE_F16), b)             # [2, 4], no gradient
        out = g.ggml_add(ctx, g.ggml_mul_mat(ctx, k, x), term)
        rng = np.random.default_rng(0)
        for t, size in ((k, 32), (a, 6), (b, 12)):
            g.ggml_backend_tensor_set_data(t, rng.normal(size=size))
        batch = (rng.normal(size=64).astype(np.float32), np.zeros(8, np.float32))
        with pytest.warns(g.GgmlpyWarning, match=rf"on {device} computes .*OUT_PROD.* on the CPU: \d+ splits"):
            hist = g.ggml_fit_opt_gen(sched, ctx, x, out, [batch], epochs=1, loss_type=g.ggml_opt_loss_type_mse(),
                                      silent=True)
        p = hist.attrs["placement"]
        assert "OUT_PROD" in p.cpu_ops and p.n_splits > 1 and p.copy_bytes > 0
        assert "on the CPU: " in str(p) and "OUT_PROD" in str(p)
    finally:
        sched.free()
        ctx.free()
        backend.free()


# ---------------------------------------------------------------- the same training as on the CPU

def _three_steps(model, x, y):
    """Three trainer steps on consecutive batches: their losses, then every weight."""
    with g.ggml_trainer(model, batch_size=BATCH) as tr:
        losses = [tr.step(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(3)]
    return np.array(losses), g.ggml_get_weights(model)


def _assert_same_training(make, device, what: str, x=None, y=None):
    cpu, gpu = make("cpu"), make(device)
    if x is None:
        x, y = _data(cpu, 3 * BATCH)
    # the same start (automatic layer names differ between the two models: weights go in model order)
    g.ggml_set_weights(gpu, dict(zip(g.ggml_get_weights(gpu), g.ggml_get_weights(cpu).values())))
    np.random.seed(7)   # dropout masks come from numpy's global seed (the same on both)
    cpu_losses, cpu_w = _three_steps(cpu, x, y)
    np.random.seed(7)
    gpu_losses, gpu_w = _three_steps(gpu, x, y)
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=2e-3, err_msg=f"{what}: losses")
    assert cpu_losses[-1] != cpu_losses[0], f"{what}: training did not move"
    for (key, want), got in zip(cpu_w.items(), gpu_w.values()):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-4, err_msg=f"{what}: {key}")


@pytest.mark.parametrize("name, after_dense", LAYER_PARAMS)
def test_each_layer_trains_as_on_the_cpu(device, name, after_dense):
    # SGD: AdamW normalises every step, so a weight whose gradient is zero in exact arithmetic (an attention
    # key bias: the softmax ignores it) would follow the rounding noise of each backend a full step at a time
    _assert_same_training(lambda b: _layer_model(name, after_dense, optimizer="sgd", backend=b), device, name)


@pytest.mark.parametrize("kind", ["add", "concatenate"])
def test_merging_layers_train_as_on_the_cpu(device, kind):
    _assert_same_training(lambda b: _combine_model(kind, b), device, kind)


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_each_loss_and_optimizer_trains_as_on_the_cpu(device, loss, optimizer):
    _assert_same_training(lambda b: _loss_model(loss, optimizer, b), device, f"{loss} {optimizer}")
