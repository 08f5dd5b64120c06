"""Devices and defaults of the ag_* engine: ag_device / ag_dtype return the previous default, ag_to_device copies
(keeping requires_grad), unknown names raise, two devices in one op raise, ag_train / ag_eval switch modes."""
from __future__ import annotations

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


def test_half_dtypes_round_the_values():
    x = np.array([1.0 + 2 ** -9, 3.14159265, -1e-3], np.float32)
    np.testing.assert_array_equal(g.ag_param(x, dtype="f16").numpy(), x.astype(np.float16).astype(np.float32))
    bf = g.ag_param(x, dtype="bf16").numpy()
    # bf16 keeps 8 bits of mantissa: 1 + 2**-9 rounds to 1 (ties to even), pi to 3.140625
    # the values PyTorch 2.13 gives for torch.tensor(x).to(torch.bfloat16)
    np.testing.assert_array_equal(bf, np.array([1.0, 3.140625, -0.00099945068359375], np.float32))
