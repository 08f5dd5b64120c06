"""Devices and defaults of the ag_* engine: ag_device / ag_dtype return the previous default, ag_to_device copies
(keeping requires_grad), unknown names raise, two devices in one op raise, ag_train / ag_eval switch modes."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers.devices import require_gpu


def test_defaults_are_set_and_returned():
    assert g.ag_default_device() == "cpu" and g.ag_default_dtype() == "f32"
    assert g.ag_dtype("f16") == "f32"
    try:
        assert g.ag_default_dtype() == "f16"
        t = g.ag_tensor([1.0001, 2.0])      # rounded to f16, held as f32
        assert t.numpy()[0] == np.float32(np.float16(1.0001))
    finally:
        assert g.ag_dtype("f32") == "f16"
    with pytest.raises(g.GgmlValueError, match="dtype"):
        g.ag_dtype("f64")
    with pytest.raises(g.GgmlValueError, match="no device"):
        g.ag_device("Metal0")


def test_to_device_copies_and_mixed_devices_are_refused():
    require_gpu("Vulkan0")
    w = g.ag_param([1.0, 2.0])
    assert g.ag_to_device(w, "cpu") is w
    wv = g.ag_to_device(w, "Vulkan0")
    assert wv.device == "Vulkan0" and wv.requires_grad and wv is not w
    np.testing.assert_array_equal(wv.numpy(), [1.0, 2.0])
    before = g.ag_device("Vulkan0")
    try:
        assert before == "cpu" and g.ag_default_device() == "Vulkan0"
        assert g.ag_tensor([1.0]).device == "Vulkan0"
    finally:
        g.ag_device(before)
    with pytest.raises(g.GgmlValueError, match="move one with ag_to_device"):
        g.ag_add(w, wv)


def test_train_and_eval_switch_every_layer():
    model = g.ag_sequential(g.ag_linear(2, 2), g.ag_dropout(0.5))
    assert model.training and model.layers[1].training
    assert g.ag_eval(model) is model and not model.layers[1].training
    assert g.ag_train(model) is model and model.layers[1].training
    with pytest.raises(g.GgmlTypeError):
        g.ag_train("model")


def _bf16(a):
    """Round to bfloat16 (to nearest, ties to even), independently of ggmlpy: via PyTorch's rule on the bits."""
    bits = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("device", ["cpu", "Vulkan0", "CUDA0"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_half_weights_products_take_its_rounded_value_and_train_its_f32_master(device, dtype):
    if device != "cpu":
        require_gpu(device)
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((5, 16)), rng.standard_normal((4, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # Vulkan stores bf16 as f16, and says so
        W = g.ag_param(np.zeros((4, 16)), device=device, dtype=dtype)
    kind = W.dtype
    W.data = w                              # the f32 master holds w itself, off the half type's grid
    np.testing.assert_allclose(W.numpy(), w.astype(np.float32))
    xt = g.ag_tensor(x, device=device)
    with g.with_grad_tape():
        y = xt @ W.T
        loss = g.ag_sum(g.ag_mul(y, np.cos(np.arange(20)).reshape(5, 4)))

    def rounded(a):
        return _bf16(a) if kind == "bf16" else a.astype(np.float16).astype(np.float32)
    # the product takes the weight in the half type, accumulating in f32: the CPU's kernel converts x to the type
    # too (its dot products are half x half), Vulkan's reads x in f32; the references round the same operands
    if device == "CUDA0":   # cuBLAS may convert x to the half type too: either reference, within x's rounding
        np.testing.assert_allclose(y.numpy(), x @ rounded(w).T, rtol=1e-2, atol=2e-2)
    else:
        ref = (rounded(x) if device == "cpu" else x) @ rounded(w).T
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)
    assert np.abs(y.numpy() - x @ w.T).max() > 1e-4          # not the f32 product: the cast is in the graph
    grad = g.backward(loss)[W].numpy()      # d loss / d W = weights^T x, into the f32 master
    # the CPU's half product backward reads x rounded to the type (bf16: 4e-3 relative on sums of size ~3)
    np.testing.assert_allclose(grad, np.cos(np.arange(20)).reshape(5, 4).T @ x, rtol=2e-2, atol=2e-2)


def test_half_dtypes_round_the_values():
    x = np.array([1.0 + 2 ** -9, 3.14159265, -1e-3], np.float32)
    np.testing.assert_array_equal(g.ag_param(x, dtype="f16").numpy(), x.astype(np.float16).astype(np.float32))
    bf = g.ag_param(x, dtype="bf16").numpy()
    # bf16 keeps 8 bits of mantissa: 1 + 2**-9 rounds to 1 (ties to even), pi to 3.140625
    # the values PyTorch 2.13 gives for torch.tensor(x).to(torch.bfloat16)
    np.testing.assert_array_equal(bf, np.array([1.0, 3.140625, -0.00099945068359375], np.float32))
