"""ggmlpy/models/layers/fused.py: which device computes the fused CPU ops, and the layers that build them (the tiled
convolution of patches/0036 here; the recurrent ones in test_sequence_layers.py) training as their portable form."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.models.layers import fused


def test_the_cpu_computes_every_fused_op():
    cpu = g.ggml_backend_dev_by_name("CPU")
    assert all(fused.device_computes(cpu, op) for op in fused.PROBES)


# which of ggmlpy's own ops each GPU backend has kernels for (patches/0049: the whole recurrences on Vulkan)
GPU_FUSED = {"Vulkan0": {"lstm_seq", "gru_seq"}, "CUDA0": set()}


@pytest.mark.parametrize("each_device", ["vulkan", "cuda"], indirect=True)
def test_a_gpu_computes_exactly_the_fused_ops_it_has_kernels_for(each_device):
    """A GPU model builds the fused op where the device has a kernel for it and the portable form (all on the
    device) elsewhere: the device's answers are exactly its kernels."""
    device = g.ggml_backend_dev_by_name(each_device)
    assert {op for op in fused.PROBES if fused.device_computes(device, op)} == GPU_FUSED[each_device]


def _conv_model(kind, backend, seed=0):
    np.random.seed(seed)
    m = g.ggml_model_sequential()
    if kind == "conv_2d":
        m = g.ggml_layer_conv_2d(m, 6, (3, 3), activation="relu", padding="same", input_shape=(9, 8, 2))
        m = g.ggml_layer_max_pooling_2d(m, (2, 2))
        m = g.ggml_layer_conv_2d(m, 5, (2, 3), strides=(2, 1), dilation_rate=(1, 1), use_bias=False)
    elif kind == "conv_2d_dilated":
        m = g.ggml_layer_conv_2d(m, 4, (3, 3), activation="tanh", padding="same", dilation_rate=(2, 2),
                                 input_shape=(9, 8, 2))
    else:
        m = g.ggml_layer_conv_1d(m, 6, 3, activation="relu", padding="causal", dilation_rate=2, input_shape=(12, 3))
        m = g.ggml_layer_conv_1d(m, 4, 3, strides=2, padding="same")
    m = g.ggml_layer_flatten(m)
    m = g.ggml_layer_dense(m, 3, activation="softmax")
    return g.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend=backend,
                          learning_rate=0.01)


@pytest.mark.parametrize("kind", ["conv_2d", "conv_2d_dilated", "conv_1d"])
def test_convolutions_train_the_same_tiled_and_through_im2col(kind, monkeypatch):
    """The CPU's tiled convolution against im2col + mul_mat (the GPUs' form, whose ops are checked against numpy
    elsewhere): the same losses, weights and predictions after three epochs, float32 rounding apart."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(48, 9, 8, 2) if kind != "conv_1d" else (48, 12, 3)).astype(np.float32)
    y = rng.integers(0, 3, 48)
    tiled = _conv_model(kind, "cpu")
    h_tiled = g.ggml_fit(tiled, x, y, epochs=3, batch_size=16, shuffle=False, verbose=0)
    assert "CONV_2D_TILED" in g.ggml_model_placement(tiled).op_counts()
    real = fused.device_computes
    monkeypatch.setattr(fused, "device_computes", lambda device, op: op != "conv_2d_tiled" and real(device, op))
    plain = _conv_model(kind, "cpu")
    h_plain = g.ggml_fit(plain, x, y, epochs=3, batch_size=16, shuffle=False, verbose=0)
    ops = g.ggml_model_placement(plain).op_counts()
    assert "CONV_2D_TILED" not in ops and "IM2COL" in ops
    np.testing.assert_allclose(h_tiled["train_loss"], h_plain["train_loss"], rtol=1e-5)
    for name, w in g.ggml_get_weights(tiled).items():
        np.testing.assert_allclose(w, g.ggml_get_weights(plain)[name], rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(g.ggml_predict(tiled, x), g.ggml_predict(plain, x), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("each_device", ["vulkan", "cuda"], indirect=True)
def test_a_gpu_convolution_stays_on_the_device(each_device):
    m = _conv_model("conv_2d", each_device)
    x = np.random.default_rng(2).normal(size=(16, 9, 8, 2)).astype(np.float32)
    g.ggml_fit(m, x, np.zeros(16, dtype=int), epochs=1, batch_size=16, verbose=0)
    p = g.ggml_model_placement(m)
    assert "CONV_2D_TILED" not in p.op_counts() and p.cpu_ops == [] and p.n_splits == 1, str(p)


def _attention_model(backend, causal=True, dropout=0.0, seed=0):
    np.random.seed(seed)
    inp = g.ggml_input(shape=(12, 16))
    x = g.ggml_layer_multi_head_attention(inp, num_heads=2, key_dim=8, causal=causal, dropout=dropout, name="att")
    x = g.ggml_layer_dense(g.ggml_layer_flatten(x, name="flat"), 3, activation="softmax", name="out")
    return g.ggml_compile(g.ggml_model(inp, x), optimizer="adam", loss="sparse_categorical_crossentropy",
                          backend=backend, learning_rate=0.01)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_trains_the_same_fused_and_from_its_parts(causal, monkeypatch):
    """The CPU's fused attention (FLASH_ATTN_EXT trained through FLASH_ATTN_BACK, patches/0056) against the
    softmax form (whose ops are checked against numpy elsewhere): the same losses, weights and predictions after
    three epochs, float32 rounding apart."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 12, 16)).astype(np.float32)
    y = rng.integers(0, 3, 40)
    flash = _attention_model("cpu", causal)
    h_flash = g.ggml_fit(flash, x, y, epochs=3, batch_size=8, shuffle=False, verbose=0)
    ops = g.ggml_model_placement(flash).op_counts()
    assert "FLASH_ATTN_EXT" in ops and "FLASH_ATTN_BACK" in ops and "SOFT_MAX" not in ops, ops
    monkeypatch.setattr(fused, "device_computes_attention", lambda *args: False)
    parts = _attention_model("cpu", causal)
    h_parts = g.ggml_fit(parts, x, y, epochs=3, batch_size=8, shuffle=False, verbose=0)
    ops = g.ggml_model_placement(parts).op_counts()
    assert "FLASH_ATTN_EXT" not in ops and "SOFT_MAX" in ops, ops
    np.testing.assert_allclose(h_flash["train_loss"], h_parts["train_loss"], rtol=1e-5)
    for name, w in g.ggml_get_weights(flash).items():
        if name == "att.key_bias":
            # softmax ignores what a key bias adds to all of a query's scores alike: its gradient is 0 but for
            # float32 rounding, which differs between the forms and which Adam scales up to whole steps
            continue
        np.testing.assert_allclose(w, g.ggml_get_weights(parts)[name], rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(g.ggml_predict(flash, x), g.ggml_predict(parts, x), rtol=1e-4, atol=1e-6)


def test_attention_with_dropout_keeps_its_parts_while_training():
    """Dropout on the attention weights needs them: the training graph keeps the softmax form."""
    m = _attention_model("cpu", dropout=0.2)
    x = np.random.default_rng(4).normal(size=(8, 12, 16)).astype(np.float32)
    g.ggml_fit(m, x, np.zeros(8, dtype=int), epochs=1, batch_size=8, verbose=0)
    ops = g.ggml_model_placement(m).op_counts()
    assert "FLASH_ATTN_EXT" not in ops and "SOFT_MAX" in ops, ops


@pytest.mark.parametrize("each_device", ["vulkan", "cuda"], indirect=True)
def test_a_gpu_attention_trains_fused_on_the_device(each_device):
    """Where the GPU has FLASH_ATTN_EXT with F32 keys and FLASH_ATTN_BACK (Vulkan: patches/0057, CUDA: 0058), a
    causal attention layer trains fused, in one split with nothing on the CPU, to the CPU's losses."""
    x = np.random.default_rng(5).normal(size=(16, 12, 16)).astype(np.float32)
    y = np.random.default_rng(6).integers(0, 3, 16)
    m = _attention_model(each_device)
    h = g.ggml_fit(m, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    p = g.ggml_model_placement(m)
    assert p.cpu_ops == [] and p.n_splits == 1, str(p)
    device = g.ggml_backend_dev_by_name(each_device)
    if fused.device_computes_attention(device, 8, 12, 12, 2, 8, True, True):
        assert "FLASH_ATTN_BACK" in p.op_counts(), str(p)
    else:
        assert each_device != "Vulkan0", "lavapipe takes fused attention of this size (patches/0057)"
    cpu = _attention_model("cpu")
    h_cpu = g.ggml_fit(cpu, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    np.testing.assert_allclose(h["train_loss"], h_cpu["train_loss"], rtol=1e-4)
