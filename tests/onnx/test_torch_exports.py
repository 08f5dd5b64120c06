"""PyTorch models exported to ONNX (tests/helpers/onnx_exports/export_torch_models.py wrote them, with an input and
PyTorch's output each, beside it: this test needs no PyTorch): an MLP, a CNN with batch norm and pooling, a 1-D
convolution net with GELU, depthwise and grouped convolutions with an upsampling (Resize), a transformer encoder
layer (attention, layer norm, GELU: PyTorch's export, shape arithmetic and a rank-5 intermediate included), an LSTM,
a GRU, and a text classifier (token ids into an embedding, a transformer encoder layer, a linear head). Each output
equals PyTorch's within 1e-4 on the CPU and on Vulkan (lavapipe in CI; measured: at most 5e-7), each graph one split
on Vulkan."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers.devices import require_gpu


pytest.importorskip("onnx", reason="ONNX import needs the onnx package (pip install onnx)")
EXPORTS = Path(__file__).resolve().parents[1] / "helpers" / "onnx_exports"
MODELS = ["mlp", "cnn", "conv1d", "depthwise", "encoder", "lstm", "gru", "text"]


@pytest.mark.parametrize("device", ["cpu", "Vulkan0"])
@pytest.mark.parametrize("name", MODELS)
def test_a_pytorch_export_predicts_as_pytorch(name, device):
    if device != "cpu":
        require_gpu(device)
    data = np.load(EXPORTS / f"{name}.npz")
    model = g.onnx_load(EXPORTS / f"{name}.onnx", device=device)
    got = g.onnx_run(model, {"x": data["x"]})["y"]
    assert got.shape == data["y"].shape
    np.testing.assert_allclose(got, data["y"], atol=1e-4, rtol=1e-4)
    if device != "cpu":
        info = g.onnx_device_info(model)
        assert info["n_splits"] == 1 and not info["cpu_only_ops"], info
    model.free()
