"""Quantized ONNX operators beyond the ONNX project's node tests: QLinearConv with per-channel weights and a bias
against ONNX's reference evaluator (random data, on the CPU and on Vulkan), and onnxruntime's com.microsoft
operators (QLinearAdd, QLinearMul, QLinearSigmoid, QLinearConcat; ONNX's reference has none of them) against
their definition computed in numpy float64 (dequantize, the float op, round half to even, saturate), and against
onnxruntime itself where it is installed. Quantized outputs must be equal, or one step apart where the float32
result lies within 1e-4 of a rounding boundary (exactly half a step in float64)."""
from __future__ import annotations

import warnings

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


# ---- found by an adversarial review: each against ONNX's reference evaluator (or numpy where it is exact)
F = TensorProto.FLOAT


def _run_one(nodes, feeds: dict, inits=(), out_type=F, opset: int = 19, reference: bool = True):
    inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT if v.dtype == np.float32 else TensorProto.INT64,
                                            list(v.shape)) for k, v in feeds.items()]
    graph = helper.make_graph(nodes, "r", inputs, [helper.make_tensor_value_info("y", out_type, None)],
                              [numpy_helper.from_array(a, n) for n, a in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()
    from onnx.reference import ReferenceEvaluator
    want = ReferenceEvaluator(model).run(None, feeds)[0] if reference else None
    got = g.onnx_run(g.onnx_load(model, device="cpu"), feeds)["y"]
    return got, want


def test_resize_nearest_floor_and_identity_scales_follow_the_reference():
    x = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    for mode, ctm, scales in (("floor", "half_pixel", [1, 1, 2, 2]), ("round_prefer_floor", "half_pixel", [1, 1, 1, 1]),
                              ("floor", "asymmetric", [1, 1, 3, 3])):
        node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest", nearest_mode=mode,
                                coordinate_transformation_mode=ctm)
        got, want = _run_one([node], {"x": x}, [("s", np.array(scales, np.float32))])
        np.testing.assert_array_equal(got, want)


def test_pad_edge_beyond_one_and_a_minus_infinity_constant():
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode="edge")
    got, want = _run_one([node], {"x": x}, [("p", np.array([0, 0, 2, 0, 0, 0, 1, 3], np.int64))])
    np.testing.assert_array_equal(got, want)
    node = helper.make_node("Pad", ["x", "p", "v"], ["y"], mode="constant")
    got, want = _run_one([node], {"x": x}, [("p", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
                                            ("v", np.array(-np.inf, np.float32))])
    np.testing.assert_array_equal(got, want)   # the inside kept exactly, -inf around it (no 0 x inf)


def test_scatter_elements_keeps_infinities_and_refuses_misfit_indices():
    data = np.array([[np.inf, 1, 2], [3, 4, 5]], np.float32)
    updates = np.array([[7, np.inf], [-1, 2]], np.float32)
    idx = np.array([[0, 2], [1, 1]], np.int64)
    for reduction in ("none", "add"):
        node = helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction=reduction)
        got, want = _run_one([node], {"d": data, "u": updates}, [("i", idx)])
        np.testing.assert_array_equal(got, want)
    node = helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=1)
    graph = helper.make_graph([node], "s", [helper.make_tensor_value_info("d", F, [2, 3]),
                                            helper.make_tensor_value_info("u", F, [3, 1])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(np.zeros((3, 1), np.int64), "i")])
    misfit = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    with pytest.raises(g.GgmlValueError, match=r"indices of shape \(3, 1\) do not fit data of shape \(2, 3\)"):
        g.onnx_load(misfit, device="cpu")


def test_round_reciprocal_argmax_and_quantize_at_the_extremes():
    big = np.array([8388609, 8388611, 12582913, -8388609, np.inf, -np.inf, 2.5, -0.5], np.float32)
    got, want = _run_one([helper.make_node("Round", ["x"], ["y"])], {"x": big})
    np.testing.assert_array_equal(got, want)
    got, want = _run_one([helper.make_node("Reciprocal", ["x"], ["y"])],
                         {"x": np.array([0, -0.0, np.inf, 4], np.float32)})
    np.testing.assert_array_equal(got, want)
    got, want = _run_one([helper.make_node("ArgMax", ["x"], ["y"], axis=1)],
                         {"x": np.full((2, 3), -np.inf, np.float32)}, out_type=TensorProto.INT64)
    np.testing.assert_array_equal(got, want)
    q = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
    x = np.array([-np.inf, np.inf, 1e30, -3.5, 2.5], np.float32)
    with warnings.catch_warnings():   # the reference's cast of infinities warns
        warnings.simplefilter("ignore", RuntimeWarning)
        got, _ = _run_one([q], {"x": x}, [("s", np.float32(0.5)), ("z", np.int8(0))], out_type=TensorProto.INT8)
    # saturated as ONNX defines it (and onnxruntime computes; the reference evaluator's cast wraps +inf to -128)
    np.testing.assert_array_equal(got, np.clip(np.rint(x.astype(np.float64) / 0.5), -128, 127).astype(np.int8))


def test_reductions_without_axes_and_noop_keep_their_element_wise_part():
    x = np.array([[-2.0, 3.0], [0.5, -1.0]], np.float32)
    for op_name in ("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceSum"):
        got, want = _run_one([helper.make_node(op_name, ["x", "a"], ["y"], noop_with_empty_axes=1)], {"x": x},
                             [("a", np.zeros(0, np.int64))])
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_batch_norms_of_one_name_fold_each_into_its_own_convolution():
    rng = np.random.default_rng(7)
    inits = [(n, rng.normal(0, 1, s).astype(np.float32)) for n, s in
             (("k1", (2, 1, 3, 3)), ("k2", (2, 1, 3, 3)), ("g1", 2), ("b1", 2), ("m1", 2), ("g2", 2), ("b2", 2),
              ("m2", 2))] + [("v1", np.array([0.5, 2], np.float32)), ("v2", np.array([1.5, 0.7], np.float32))]
    nodes = [helper.make_node("Conv", ["x", "k1"], ["c1"]), helper.make_node("Conv", ["x", "k2"], ["c2"]),
             helper.make_node("BatchNormalization", ["c1", "g1", "b1", "m1", "v1"], ["n1"], name="bn"),
             helper.make_node("BatchNormalization", ["c2", "g2", "b2", "m2", "v2"], ["n2"], name="bn"),
             helper.make_node("Sub", ["n1", "n2"], ["y"])]
    got, want = _run_one(nodes, {"x": rng.normal(0, 1, (1, 1, 5, 5)).astype(np.float32)}, inits)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_of_an_empty_region_and_of_none(mode):
    x = np.random.default_rng(3).normal(size=(1, 2, 6, 6)).astype(np.float32)
    rois = np.array([[1.0, 1.0, 1.0, 3.0], [0.5, 0.5, 4.0, 5.0]], np.float32)   # the first has no width
    node = helper.make_node("RoiAlign", ["x", "r", "i"], ["y"], mode=mode, output_height=2, output_width=2,
                            sampling_ratio=0)
    got, want = _run_one([node], {"x": x}, [("r", rois), ("i", np.zeros(2, np.int64))])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(g.GgmlValueError, match="RoiAlign of no regions"):
        _run_one([node], {"x": x}, [("r", np.zeros((0, 4), np.float32)), ("i", np.zeros(0, np.int64))],
                 reference=False)


def test_an_operator_of_another_domain_says_which_it_is_built_as():
    node = helper.make_node("QLinearAdd", ["a", "s", "z", "a", "s", "z", "s", "z"], ["y"], name="qa")   # no domain
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("a", U8, [2])],
                              [helper.make_tensor_value_info("y", U8, None)],
                              [numpy_helper.from_array(np.float32(0.1), "s"),
                               numpy_helper.from_array(np.uint8(0), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(g.GgmlValueError, match="QLinearAdd is built as an operator of the domain 'com.microsoft', "
                                               "not of 'ai.onnx'"):
        g.onnx_load(model, device="cpu")
