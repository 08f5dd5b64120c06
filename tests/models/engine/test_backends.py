"""The model layer on every available backend: the same model, seed and batches give the same training
on Vulkan (Mesa's lavapipe in CI) and CUDA as on the CPU; a missing backend is skipped, saying why."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g


DEVICES = {"vulkan": "Vulkan0", "cuda": "CUDA0"}


@pytest.fixture(params=sorted(DEVICES))
def gpu(request):
    family = request.param
    if family not in g.ggml_backends_built():
        pytest.skip(f"the {family} backend is not built in this installation (GGMLPY_BACKENDS)")
    if g.ggml_backend_dev_by_name(DEVICES[family]) is None:
        pytest.skip(f"the {family} backend is built but this machine has no {DEVICES[family]} device")
    return DEVICES[family]


def cnn(backend):
    np.random.seed(3)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_conv_2d(m, 4, (3, 3), activation="relu", padding="same", input_shape=(6, 6, 2))
    m = g.ggml_layer_batch_norm(m, momentum=0.5)
    m = g.ggml_layer_max_pooling_2d(m, (2, 2))
    m = g.ggml_layer_flatten(m)
    m = g.ggml_layer_dense(m, 3, activation="softmax")
    return g.ggml_compile(m, loss="sparse_categorical_crossentropy", backend=backend, learning_rate=0.01)


def functional(backend):
    np.random.seed(4)
    t = g.ggml_input(shape=(5,), dtype="int32")
    a = g.ggml_input(shape=(3,))
    e = g.ggml_layer_flatten(g.ggml_layer_embedding(t, 12, 2))
    h = g.ggml_layer_concatenate([e, g.ggml_layer_dense(a, 4, activation="tanh")])
    h = g.ggml_layer_add([g.ggml_layer_dense(h, 6, activation="relu"), g.ggml_layer_dense(h, 6)])
    out = g.ggml_layer_dense(h, 2)
    return g.ggml_compile(g.ggml_model([t, a], out), loss="mse", backend=backend, learning_rate=0.01)


def test_cnn_trains_on_the_gpu_as_on_the_cpu(gpu):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, 16)
    histories, preds = [], []
    for backend in ("cpu", gpu):
        m = cnn(backend)
        np.random.seed(9)  # the same shuffles
        histories.append(g.ggml_fit(m, x, y, epochs=3, batch_size=8, validation_split=0.25, verbose=0))
        preds.append(g.ggml_predict(m, x))
    np.testing.assert_allclose(histories[1]["train_loss"], histories[0]["train_loss"], rtol=2e-3)
    np.testing.assert_allclose(histories[1]["val_loss"], histories[0]["val_loss"], rtol=2e-3)
    np.testing.assert_allclose(preds[1], preds[0], rtol=2e-3, atol=1e-4)


def test_functional_model_trains_on_the_gpu_as_on_the_cpu(gpu):
    rng = np.random.default_rng(1)
    x = [rng.integers(0, 12, (16, 5)), rng.normal(size=(16, 3)).astype(np.float32)]
    y = rng.normal(size=(16, 2)).astype(np.float32)
    losses = []
    for backend in ("cpu", gpu):
        m = functional(backend)
        with g.ggml_trainer(m, batch_size=8) as tr:
            losses.append([tr.step([x[0][:8], x[1][:8]], y[:8]) for _ in range(5)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=2e-3)
    assert losses[0][-1] < losses[0][0]


def test_matrix_products_on_a_gpu_stay_float32(gpu):
    """ggml's Vulkan backend rounds the operands of F32 products to F16 on devices with F16 arithmetic
    (products of more than 8 columns): predictions were 5e-4 off the CPU's. ggmlpy keeps them F32 unless
    GGMLPY_VULKAN_F16=1."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 16)).astype(np.float32)

    def model(backend):
        np.random.seed(0)
        m = g.ggml_model_sequential()
        m = g.ggml_layer_dense(m, 32, activation="tanh", input_shape=(16,))
        return g.ggml_compile(g.ggml_layer_dense(m, 4), loss="mse", backend=backend)
    cpu, dev = model("cpu"), model(gpu)
    w = {k: v.astype(np.float64) for k, v in g.ggml_get_weights(cpu).items()}
    ref = np.tanh(x @ w["dense_1.weight"] + w["dense_1.bias"]) @ w["dense_2.weight"] + w["dense_2.bias"]
    np.testing.assert_allclose(g.ggml_predict(dev, x, batch_size=32), ref, rtol=1e-5, atol=1e-5)


def test_a_tensor_beyond_the_devices_largest_buffer_is_refused(gpu):
    """ggml's scheduler cannot move a weight or input that already lives on the device to the CPU when the
    device refuses it (beyond its storage-buffer range: 128 MiB on lavapipe); it aborted at the first compute."""
    ctx = g.ggml_init(2 * g.ggml_tensor_overhead(), no_alloc=True)
    probe = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 5793, 5793)       # 134 MB
    try:
        if g.ggml_backend_dev_supports_op(g.ggml_backend_dev_by_name(gpu), probe):
            pytest.skip(f"{gpu} takes tensors of 134 MB: its largest buffer is beyond what this test tries")
    finally:
        ctx.free()
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 5793, input_shape=(5793,))
    with pytest.raises(ValueError, match="dense_1.weight.*backend='cpu'"):
        g.ggml_compile(m, loss="mse", backend=gpu)
    m = g.ggml_compile(g.ggml_layer_dense(g.ggml_model_sequential(), 4, input_shape=(4096,)), loss="mse", backend=gpu)
    with pytest.raises(ValueError, match="smaller batch_size"):
        g.ggml_predict(m, np.zeros((9000, 4096), np.float32), batch_size=9000)
    assert g.ggml_predict(m, np.zeros((10, 4096), np.float32)).shape == (10, 4)
