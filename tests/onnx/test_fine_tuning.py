"""Fine-tuning an imported model: ``onnx_to_model`` makes the PyTorch exports (tests/helpers/onnx_exports) ggmlpy
models whose weights are the ONNX initializers.

What is checked, and against what:
* before training each model predicts PyTorch's saved output (1e-5), on the CPU and on Vulkan (lavapipe in CI);
* its gradients (one plain-SGD step at learning rate 1 moves each weight by minus its gradient) match central
  finite differences of the MSE computed by ONNX's reference evaluator in float64 (the model's floats made
  doubles): an independent implementation of every operator, Resize, LSTM, GRU, attention and layer norm included.
  Tolerance: 1e-3 of the largest gradient checked in the weight plus 1e-3 relative, on the CPU and on lavapipe
  (F32 products of these sizes: measured 1e-6 relative);
* the models train with ``ggml_fit`` and ``ggml_fit_generator`` (the loss of a fixed regression task falls by
  half), the Vulkan training step is one split, batch norm's running statistics do not change, and a saved GGUF
  loads into a model that predicts as the trained one;
* token ids (an integer input read as Gather's indices into an embedding table) train the table, checked against
  the reference's finite differences, and an id outside the table is refused by the fit;
* misuse is refused with what was expected: several outputs and no ``output=``, integer inputs used otherwise, a
  graph exported for one batch size, dynamic sizes besides the batch without ``input_shapes``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers.devices import require_gpu


onnx = pytest.importorskip("onnx", reason="ONNX import needs the onnx package (pip install onnx)")
EXPORTS = Path(__file__).resolve().parents[1] / "helpers" / "onnx_exports"
MODELS = ["mlp", "cnn", "conv1d", "depthwise", "encoder", "lstm", "gru", "text"]
DEVICES = ["cpu", "Vulkan0"]


def _device(name: str) -> str:
    if name != "cpu":
        require_gpu(name)
    return name


def _as_float64(model):
    """The model with every float32 tensor, type and cast made float64 (for ONNX's reference evaluator)."""
    from onnx import numpy_helper, TensorProto
    f32, f64 = TensorProto.FLOAT, TensorProto.DOUBLE

    def double(t):
        if t.data_type != f32:
            return t
        return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name)

    inits = [double(t) for t in model.graph.initializer]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        if vi.type.tensor_type.elem_type == f32:
            vi.type.tensor_type.elem_type = f64
    for node in model.graph.node:
        for a in node.attribute:
            if a.name == "to" and a.i == f32:
                a.i = f64
            if a.type == onnx.AttributeProto.TENSOR:
                a.t.CopyFrom(double(a.t))
            if node.op_type == "LayerNormalization" and a.name == "stash_type":
                a.i = 11   # the statistics in float64 too
    return model


def _erf64():
    """ONNX's reference Erf in float64 (the reference's own rounds to float32, which would swamp a central
    difference of a step of 1e-6)."""
    from math import erf

    from onnx.reference.op_run import OpRun

    class Erf(OpRun):
        op_domain = ""

        def _run(self, x):
            return (np.vectorize(erf, otypes=[np.float64])(x).astype(x.dtype),)
    return Erf


def _reference_loss(source, weights: dict[str, np.ndarray], x: np.ndarray, target: np.ndarray) -> float:
    """The MSE of the model (an export's name, or its bytes) with ``weights`` in float64, by ONNX's reference."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator
    model = _as_float64(onnx.load(EXPORTS / f"{source}.onnx") if isinstance(source, str) else
                        onnx.load_from_string(source))
    inits = [numpy_helper.from_array(weights.get(t.name, numpy_helper.to_array(t)), t.name)
             for t in model.graph.initializer]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    feed = x.astype(np.float64) if x.dtype.kind == "f" else x
    y = ReferenceEvaluator(model, new_ops=[_erf64()]).run(None, {"x": feed})[0]
    return float(np.mean((y - target) ** 2))


def _onnx_names(model) -> dict[str, str]:
    """ggmlpy weight name ('onnx_graph_1.net_0_weight') -> the ONNX initializer it is."""
    layer = model.layers[-1]
    return {f"{layer.name}.{name}": onnx_name for name, onnx_name, _, _ in layer.weights}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_an_imported_model_predicts_as_pytorch_before_training(name, device):
    data = np.load(EXPORTS / f"{name}.npz")
    model = g.onnx_to_model(EXPORTS / f"{name}.onnx")
    g.ggml_compile(model, optimizer="adam", loss="mse", backend=_device(device))
    got = g.ggml_predict(model, data["x"], batch_size=len(data["x"]))
    np.testing.assert_allclose(got, data["y"].reshape(got.shape), atol=1e-5, rtol=1e-5)


def _check_gradients(source, x: np.ndarray, target: np.ndarray, device: str) -> int:
    """One plain-SGD step at learning rate 1 of the model made of ``source`` (a path or bytes): each weight's move
    against central finite differences of the reference's float64 MSE, at its two largest entries and one more."""
    rng = np.random.default_rng(1)
    model = g.onnx_to_model(EXPORTS / f"{source}.onnx" if isinstance(source, str) else source)
    g.ggml_compile(model, optimizer="sgd", learning_rate=1.0, loss="mse", backend=_device(device))
    before = g.ggml_get_weights(model)
    g.ggml_fit(model, x, target, epochs=1, batch_size=len(x), shuffle=False, verbose=0)
    after = g.ggml_get_weights(model)
    names = _onnx_names(model)
    w64 = {names[k]: v.astype(np.float64) for k, v in before.items()}
    checked = 0
    for key in sorted(before):
        grad = (before[key] - after[key]).astype(np.float64)
        flat = np.argsort(-np.abs(grad).reshape(-1))[:2].tolist() + rng.integers(0, grad.size, 1).tolist()
        scale = np.abs(grad).max()
        for i in flat:
            idx = np.unravel_index(i, grad.shape)
            eps = 1e-6 * max(1.0, abs(w64[names[key]][idx]))
            plus, minus = dict(w64), dict(w64)
            plus[names[key]] = w64[names[key]].copy()
            plus[names[key]][idx] += eps
            minus[names[key]] = w64[names[key]].copy()
            minus[names[key]][idx] -= eps
            fd = (_reference_loss(source, plus, x, target) - _reference_loss(source, minus, x, target)) / (2 * eps)
            assert abs(grad[idx] - fd) <= 1e-3 * scale + 1e-3 * abs(fd) + 1e-9, (key, idx, grad[idx], fd, scale)
            checked += 1
    return checked


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MODELS)
def test_gradients_match_finite_differences_of_onnx_reference(name, device):
    pytest.importorskip("onnx.reference", reason="ONNX's reference evaluator (onnx >= 1.13)")
    data = np.load(EXPORTS / f"{name}.npz")
    rng = np.random.default_rng(1)
    target = (data["y"] + rng.normal(0, 0.5, data["y"].shape)).astype(np.float32)
    assert _check_gradients(name, data["x"], target, device) >= 3 * 4


def _one_node(op: str, attrs: dict, x_shape: tuple, inits: dict) -> bytes:
    """A model of one ``op`` node on input ``x`` (dynamic batch) and the initializers ``inits``."""
    h = onnx.helper
    node = h.make_node(op, ["x"] + list(inits), ["y"], **attrs)
    return _graph([node], [_info("x", F, ["n"] + list(x_shape[1:]))], [_info("y", F, None)],
                  [(k, v.astype(np.float32)) for k, v in inits.items()])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["conv_transpose_2d", "conv_transpose_1d", "resize_linear", "pad_reflect"])
def test_ops_built_differentiably_where_a_graph_trains_have_the_reference_gradients(case, device):
    """The forms a training graph builds where ggml has no backward pass (ConvTranspose as a convolution of the
    spread input, Resize as matrix products, Pad as concatenations) against finite differences of the reference."""
    rng = np.random.default_rng(4)
    x = rng.normal(0, 1, {"conv_transpose_2d": (2, 4, 5, 4), "conv_transpose_1d": (2, 2, 5)}.get(case, (2, 3, 4, 5)))
    if case == "conv_transpose_2d":
        model = _one_node("ConvTranspose", {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 0]},
                          x.shape, {"w": rng.normal(0, 0.5, (4, 3, 3, 3)), "b": rng.normal(0, 0.5, 3)})
    elif case == "conv_transpose_1d":
        model = _one_node("ConvTranspose", {"strides": [3], "pads": [2, 1]}, x.shape,
                          {"w": rng.normal(0, 0.5, (2, 3, 4))})
    else:   # a weight before the op: Conv(1x1), then the op
        h = onnx.helper
        op = (h.make_node("Resize", ["c", "", "scales"], ["y"], mode="linear",
                          coordinate_transformation_mode="align_corners") if case == "resize_linear" else
              h.make_node("Pad", ["c", "pads"], ["y"], mode="reflect"))
        const = (("scales", np.array([1, 1, 1.5, 2.5], np.float32)) if case == "resize_linear" else
                 ("pads", np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64)))
        model = _graph([h.make_node("Conv", ["x", "k"], ["c"], kernel_shape=[1, 1]), op],
                       [_info("x", F, ["n", 3, 4, 5])], [_info("y", F, None)],
                       [("k", rng.normal(0, 0.5, (2, 3, 1, 1)).astype(np.float32)), const])
    x = x.astype(np.float32)
    from onnx.reference import ReferenceEvaluator
    y = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert _check_gradients(model, x, (y + rng.normal(0, 0.5, y.shape)).astype(np.float32), device) >= 3


@pytest.mark.parametrize("device", DEVICES)
def test_a_grouped_conv_transpose_trains_as_it_predicts(device):
    """Groups (ONNX's reference evaluator mishandles grouped ConvTranspose): the training graph's loss before its
    first step equals the loss of onnx_run's output (the inference form the node tests check)."""
    rng = np.random.default_rng(5)
    model = _one_node("ConvTranspose", {"strides": [2, 1], "group": 2, "pads": [0, 1, 1, 0]}, (2, 4, 5, 4),
                      {"w": rng.normal(0, 0.5, (4, 3, 3, 2)), "b": rng.normal(0, 0.5, 6)})
    x = rng.normal(0, 1, (6, 4, 5, 4)).astype(np.float32)
    y = g.onnx_run(g.onnx_load(model, device="cpu"), {"x": x})["y"]
    target = (y + rng.normal(0, 0.5, y.shape)).astype(np.float32)
    net = g.onnx_to_model(model)
    g.ggml_compile(net, optimizer="sgd", learning_rate=1e-30, loss="mse", backend=_device(device))
    loss = g.ggml_fit(net, x, target, epochs=1, batch_size=6, shuffle=False, verbose=0).history["loss"][0]
    assert loss == pytest.approx(float(np.mean((y.astype(np.float64) - target) ** 2)), rel=1e-5)


def _regression(name: str, n: int = 48):
    """Inputs like the export's and a task the import has not seen: its own outputs shifted by a fixed pattern
    scaled by each sample's mean (which every one of these architectures can compute); images out (the depthwise
    net's, whose convolutions see 5 x 5 pixels) by a fixed shift per channel."""
    data = np.load(EXPORTS / f"{name}.npz")
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (n,) + data["x"].shape[1:]).astype(np.float32) if data["x"].dtype.kind == "f" else \
        rng.integers(0, 50, (n,) + data["x"].shape[1:])   # the text classifier's token ids
    start = g.onnx_run(g.onnx_load(EXPORTS / f"{name}.onnx", device="cpu"), {"x": x})["y"]
    level = x.reshape(n, -1).mean(axis=1) * np.sqrt(x[0].size)   # about N(0, 1)
    pattern = rng.normal(0, 1, data["y"].shape[1:])
    if pattern.ndim == 3:
        pattern, level = pattern[:, :1, :1], np.ones(n)
    return x, (start + 0.5 * level.reshape((n,) + (1,) * pattern.ndim) * pattern).astype(np.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_the_cnn_fine_tunes_on_the_device_in_one_split_and_saves(device, tmp_path):
    x, y = _regression("cnn")
    model = g.onnx_to_model(EXPORTS / "cnn.onnx")
    g.ggml_compile(model, optimizer="adam", learning_rate=0.005, loss="mse", backend=_device(device))
    hist = g.ggml_fit(model, x, y, epochs=25, batch_size=16, verbose=0)
    losses = hist.history["loss"]
    assert losses[-1] < 0.5 * losses[0], losses
    if device != "cpu":
        placement = g.ggml_model_placement(model, training=True)
        assert placement.n_splits == 1 and not placement.cpu_ops, placement
    path = tmp_path / "cnn.gguf"
    g.ggml_save_model(model, path)
    loaded = g.ggml_load_model(path, backend=device)
    np.testing.assert_array_equal(g.ggml_predict(loaded, x), g.ggml_predict(model, x))
    for k, v in g.ggml_get_weights(model).items():
        np.testing.assert_array_equal(g.ggml_get_weights(loaded)[k], v)


def _bn_net() -> bytes:
    """Conv -> BatchNormalization (statistics of its own) -> Relu -> GlobalAveragePool -> Flatten -> Gemm."""
    rng = np.random.default_rng(3)
    h = onnx.helper
    nodes = [h.make_node("Conv", ["x", "k", "kb"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             h.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], epsilon=1e-5),
             h.make_node("Relu", ["n"], ["r"]), h.make_node("GlobalAveragePool", ["r"], ["p"]),
             h.make_node("Flatten", ["p"], ["f"]), h.make_node("Gemm", ["f", "w", "wb"], ["y"], transB=1)]
    inits = [("k", rng.normal(0, 0.3, (6, 3, 3, 3))), ("kb", rng.normal(0, 0.1, 6)),
             ("gamma", rng.uniform(0.5, 1.5, 6)),
             ("beta", rng.normal(0, 0.1, 6)), ("mean", rng.normal(0, 0.2, 6)), ("var", rng.uniform(0.5, 2, 6)),
             ("w", rng.normal(0, 0.5, (4, 6))), ("wb", np.zeros(4))]
    return _graph(nodes, [_info("x", F, ["n", 3, 8, 8])], [_info("y", F, ["n", 4])],
                  [(n, a.astype(np.float32)) for n, a in inits])


def test_batch_norm_statistics_stay_and_a_generator_streams_the_data():
    from onnx.reference import ReferenceEvaluator
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (64, 3, 8, 8)).astype(np.float32)
    y = np.tanh(8 * x.mean(axis=(2, 3)) @ rng.normal(0, 1, (3, 4))).astype(np.float32)   # of the channels' means
    source = _bn_net()
    model = g.onnx_to_model(g.onnx_load(source, device="cpu"))
    g.ggml_compile(model, optimizer="adam", learning_rate=0.01, loss="mse", backend="cpu")
    np.testing.assert_allclose(g.ggml_predict(model, x), ReferenceEvaluator(source).run(None, {"x": x})[0],
                               atol=1e-5, rtol=1e-5)
    layer = model.layers[-1]
    frozen = {f"{layer.name}.{p.name}" for p in layer.params if not p.trainable}
    assert frozen == {f"{layer.name}.mean", f"{layer.name}.var"}
    before = g.ggml_get_weights(model)

    def batches():
        while True:
            for i in range(0, 64, 16):
                yield x[i:i + 16], y[i:i + 16]

    hist = g.ggml_fit_generator(model, batches(), steps_per_epoch=4, epochs=20, verbose=0)
    assert hist.history["loss"][-1] < 0.5 * hist.history["loss"][0], hist.history["loss"]
    after = g.ggml_get_weights(model)
    assert all(np.array_equal(before[k], after[k]) for k in frozen)
    assert all(not np.array_equal(before[k], after[k]) for k in before if k not in frozen)


@pytest.mark.parametrize("name", ["lstm", "encoder", "depthwise", "text"])
def test_recurrent_attention_resize_and_token_id_exports_fine_tune(name):
    x, y = _regression(name)
    model = g.onnx_to_model(EXPORTS / f"{name}.onnx")
    g.ggml_compile(model, optimizer="adam", learning_rate=0.01, loss="mse", backend="cpu")
    hist = g.ggml_fit(model, x, y, epochs=30, batch_size=16, verbose=0)
    assert hist.history["loss"][-1] < 0.5 * hist.history["loss"][0], hist.history["loss"]


# ---- misuse
def _graph(nodes, inputs, outputs, inits=()):
    from onnx import helper, numpy_helper
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _info(name, elem, shape):
    return onnx.helper.make_tensor_value_info(name, elem, shape)


F = 1   # TensorProto.FLOAT


def test_several_outputs_need_output_and_take_it():
    w = np.ones((3, 2), np.float32)
    model = _graph([onnx.helper.make_node("MatMul", ["x", "w"], ["a"]), onnx.helper.make_node("Relu", ["a"], ["b"])],
                   [_info("x", F, ["n", 3])], [_info("a", F, ["n", 2]), _info("b", F, ["n", 2])], [("w", w)])
    with pytest.raises(ValueError, match=r"2 outputs \['a', 'b'\]; say which.*output="):
        g.onnx_to_model(model)
    with pytest.raises(ValueError, match="output 'c' is not an output"):
        g.onnx_to_model(model, output="c")
    net = g.onnx_to_model(model, output="b")
    g.ggml_compile(net, optimizer="adam", loss="mse", backend="cpu")
    x = np.array([[1, -2, 0.5], [-1, -1, -1]], np.float32)
    np.testing.assert_allclose(g.ggml_predict(net, x), np.maximum(x @ w, 0))


def test_integer_inputs_and_fixed_batch_graphs_are_refused_with_the_fix():
    mask = _graph([onnx.helper.make_node("Cast", ["i"], ["c"], to=1), onnx.helper.make_node("Relu", ["c"], ["y"])],
                  [_info("i", 7, ["n", 4])], [_info("y", F, ["n", 4])])
    with pytest.raises(ValueError, match="integer input 'i' is read by Cast node.*token ids that index tables"):
        g.onnx_to_model(mask)
    fixed = _graph([onnx.helper.make_node("Reshape", ["x", "s"], ["r"]), onnx.helper.make_node("MatMul", ["r", "w"],
                                                                                                 ["y"])],
                   [_info("x", F, [1, 2, 3])], [_info("y", F, [1, 2])],
                   [("s", np.array([1, 6], np.int64)), ("w", np.ones((6, 2), np.float32))])
    with pytest.raises(ValueError, match="Reshape.*batch of 2.*exported for one batch size.*dynamic_axes"):
        g.onnx_to_model(fixed)


def test_dynamic_sizes_besides_the_batch_need_input_shapes():
    model = _graph([onnx.helper.make_node("Relu", ["x"], ["y"])], [_info("x", F, ["n", "t", 4])],
                   [_info("y", F, ["n", "t", 4])])
    with pytest.raises(ValueError, match=r"dynamic size besides the batch.*input_shapes=\{'x'"):
        g.onnx_to_model(model)
    net = g.onnx_to_model(model, input_shapes={"x": (1, 5, 4)})
    assert net.layers[-1].built_for == [(5, 4)]
    with pytest.raises(TypeError, match="expected a path to an .onnx file or its bytes"):
        g.onnx_to_model(3)


def test_long_initializer_names_get_distinct_weight_names():
    a, b = "w1_" + "x" * 40 + "abcdefghijklmnopqrs", "w1_abcdefghijklmnopqrs"   # the first's end is the second
    model = _graph([onnx.helper.make_node("MatMul", ["x", a], ["h"]), onnx.helper.make_node("MatMul", ["h", b], ["y"])],
                   [_info("x", F, ["n", 3])], [_info("y", F, ["n", 2])],
                   [(a, np.ones((3, 5), np.float32)), (b, np.full((5, 2), 0.5, np.float32))])
    net = g.onnx_to_model(model)
    names = [name for name, _, _, _ in net.layers[-1].weights]
    assert len(set(names)) == 2 and all(len(n) <= 22 for n in names), names
    g.ggml_compile(net, optimizer="adam", loss="mse", backend="cpu")
    np.testing.assert_allclose(g.ggml_predict(net, np.ones((1, 3), np.float32)), [[7.5, 7.5]])


def test_input_shapes_are_checked():
    model = _graph([onnx.helper.make_node("Relu", ["x"], ["y"])], [_info("x", F, ["n", "t", 4])],
                   [_info("y", F, ["n", "t", 4])])
    for bad in ({"x": (1, "seq", 4)}, {"x": 7}, {"x": (1, 2.5, 4)}):
        with pytest.raises(ValueError, match=r"input_shapes\['x'\] must be a full shape of ints >= 1"):
            g.onnx_to_model(model, input_shapes=bad)
    with pytest.raises(ValueError, match="input_shapes names 'z', which is not an input"):
        g.onnx_to_model(model, input_shapes={"z": (1, 2, 4)})


def test_an_op_without_a_backward_pass_is_named_by_its_onnx_node():
    h = onnx.helper
    model = _graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Round", ["m"], ["y"], name="rounding")],
                   [_info("x", F, ["n", 3])], [_info("y", F, ["n", 2])], [("w", np.ones((3, 2), np.float32))])
    net = g.onnx_to_model(model)
    g.ggml_compile(net, optimizer="adam", loss="mse", backend="cpu")
    with pytest.raises(ValueError, match="no backward pass for .*Round 'rounding'"):
        g.ggml_fit(net, np.ones((4, 3), np.float32), np.ones((4, 2), np.float32), epochs=1, verbose=0)


def _text_classifier() -> bytes:
    """Token ids -> an embedding table (Gather) -> the mean over the steps -> Gemm -> 3 scores."""
    rng = np.random.default_rng(11)
    h = onnx.helper
    nodes = [h.make_node("Gather", ["emb", "x"], ["e"]), h.make_node("ReduceMean", ["e"], ["m"], axes=[1], keepdims=0),
             h.make_node("Gemm", ["m", "w", "b"], ["y"], transB=1)]
    return _graph(nodes, [_info("x", 7, ["n", 5])], [_info("y", F, ["n", 3])],
                  [("emb", rng.normal(0, 1, (20, 8)).astype(np.float32)),
                   ("w", rng.normal(0, 0.5, (3, 8)).astype(np.float32)), ("b", np.zeros(3, np.float32))])


@pytest.mark.parametrize("device", DEVICES)
def test_token_ids_index_a_trainable_embedding_table(device):
    from onnx.reference import ReferenceEvaluator
    model = _text_classifier()
    rng = np.random.default_rng(12)
    ids = rng.integers(0, 20, (6, 5)).astype(np.int64)
    y = ReferenceEvaluator(model).run(None, {"x": ids})[0]
    net = g.onnx_to_model(model)
    assert net.layers[-1].vocab_sizes == [20]
    g.ggml_compile(net, optimizer="adam", loss="mse", backend=_device(device))
    np.testing.assert_allclose(g.ggml_predict(net, ids), y, rtol=1e-5, atol=1e-6)
    target = (y + rng.normal(0, 0.5, y.shape)).astype(np.float32)
    assert _check_gradients(model, ids, target, device) >= 9
    with pytest.raises(ValueError, match=r"token id 20 at .* is outside \[0, 20\) of onnx_graph"):
        g.ggml_fit(net, np.full((2, 5), 20, np.int64), np.zeros((2, 3), np.float32), epochs=1, verbose=0)


def test_each_integer_input_is_checked_against_its_own_tables():
    h = onnx.helper
    rng = np.random.default_rng(13)
    nodes = [h.make_node("Gather", ["tok", "ids"], ["a"]), h.make_node("Gather", ["seg", "kind"], ["b"]),
             h.make_node("Add", ["a", "b"], ["s"]), h.make_node("ReduceMean", ["s"], ["y"], axes=[1], keepdims=0)]
    model = _graph(nodes, [_info("ids", 7, ["n", 4]), _info("kind", 7, ["n", 4])], [_info("y", F, ["n", 3])],
                   [("tok", rng.normal(size=(10, 3)).astype(np.float32)),
                    ("seg", rng.normal(size=(2, 3)).astype(np.float32))])
    net = g.onnx_to_model(model)
    assert net.layers[-1].vocab_sizes == [10, 2]
    g.ggml_compile(net, optimizer="adam", loss="mse", backend="cpu")
    ids, kind = np.array([[9, 0, 5, 3]]), np.array([[1, 0, 1, 1]])
    from onnx.reference import ReferenceEvaluator
    want = ReferenceEvaluator(model).run(None, {"ids": ids, "kind": kind})[0]
    np.testing.assert_allclose(g.ggml_predict(net, [ids, kind]), want, rtol=1e-6)
    with pytest.raises(ValueError, match=r"x\[1\] .*token id 2 at \(0, 0\) is outside \[0, 2\)"):
        g.ggml_fit(net, [ids, np.array([[2, 0, 0, 0]])], np.zeros((1, 3), np.float32), epochs=1, verbose=0)


def test_a_graph_of_many_pads_trains_its_larger_training_form():
    """A training graph builds Pad from concatenations (more tensors and constants than inference): the layer's
    budget counts that form too."""
    h = onnx.helper
    nodes, prev = [], "x"
    for i in range(12):
        nodes.append(h.make_node("Pad", [prev, "pads"], [f"p{i}"]))
        nodes.append(h.make_node("Mul", [f"p{i}", "k"], [f"m{i}"]))
        nodes.append(h.make_node("Slice", [f"m{i}", "starts", "ends", "axes"], [f"s{i}"]))
        prev = f"s{i}"
    nodes.append(h.make_node("Identity", [prev], ["y"]))
    model = _graph(nodes, [_info("x", F, ["n", 2, 5])], [_info("y", F, ["n", 2, 5])],
                   [("pads", np.array([0, 1, 1, 0, 1, 1], np.int64)), ("k", np.full((1, 4, 7), 0.9, np.float32)),
                    ("starts", np.array([1, 1], np.int64)), ("ends", np.array([3, 6], np.int64)),
                    ("axes", np.array([1, 2], np.int64))])
    net = g.onnx_to_model(model)
    g.ggml_compile(net, optimizer="adam", loss="mse", backend="cpu")
    x = np.random.default_rng(0).normal(size=(4, 2, 5)).astype(np.float32)
    hist = g.ggml_fit(net, x, x, epochs=3, batch_size=4, verbose=0)
    assert np.isfinite(hist.history["loss"]).all()
