"""Building models with the public builders (models/builders.py): sequential models, names, summary, get/pop, freezing,
the layers' arguments and the errors that say what to do (the graph of layers: network/test_model.py; weights:
network/test_parameters.py)."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers import layer_refs as R
from tests.helpers.models import mlp


def test_sequential_names_shapes_and_summary():
    m = mlp()
    assert [layer.name for layer in m.layers] == ["dense_1", "dense_2"]
    assert m.outputs[0].shape == (3,)
    text = str(m)
    assert "dense_1 (dense)" in text and "(None, 8)" in text and "(None, 3)" in text
    assert "Total params: 67" in text  # 4*8+8 + 8*3+3
    assert "Compiled: no" in text


def test_functions_change_the_model_in_place_and_return_it():
    m = g.ggml_model_sequential()
    same = g.ggml_layer_dense(m, 2, input_shape=(3,))
    assert same is m
    assert g.ggml_compile(m, backend="cpu") is m
    assert g.ggml_freeze_weights(m) is m and g.ggml_unfreeze_weights(m) is m


def test_get_and_pop_layer():
    m = mlp()
    assert g.ggml_get_layer(m, 0).name == "dense_1"
    assert g.ggml_get_layer(m, -1).name == "dense_2"
    assert g.ggml_get_layer(m, name="dense_2").units == 3
    with pytest.raises(ValueError, match="no layer named"):
        g.ggml_get_layer(m, name="nope")
    with pytest.raises(ValueError):
        g.ggml_get_layer(m, 5)
    g.ggml_pop_layer(m)
    assert [layer.name for layer in m.layers] == ["dense_1"] and m.outputs[0].shape == (8,)


def test_freezing_keeps_weights_and_trains_the_rest():
    np.random.seed(0)
    m = mlp()
    g.ggml_compile(m, loss="categorical_crossentropy", backend="cpu", learning_rate=0.05)
    g.ggml_freeze_weights(m, 0, 1)
    before = g.ggml_get_weights(m)
    x = np.random.rand(32, 4).astype(np.float32)
    y = np.eye(3)[np.random.randint(0, 3, 32)]
    g.ggml_fit(m, x, y, epochs=2, batch_size=16, verbose=0)
    after = g.ggml_get_weights(m)
    np.testing.assert_array_equal(before["dense_1.weight"], after["dense_1.weight"])
    assert not np.allclose(before["dense_2.weight"], after["dense_2.weight"])
    g.ggml_unfreeze_weights(m)
    g.ggml_fit(m, x, y, epochs=1, batch_size=16, verbose=0)
    assert not np.allclose(after["dense_1.weight"], g.ggml_get_weights(m)["dense_1.weight"])
    assert "Trainable params: 67" in str(m)
    g.ggml_freeze_weights(m)
    with pytest.raises(ValueError, match="nothing to train"):
        g.ggml_fit(m, x, y, verbose=0)


@pytest.mark.parametrize("call, kind, text", [
    (lambda: g.ggml_layer_dense(g.ggml_model_sequential(), 3, activation="swishy", input_shape=(2,)),
     ValueError, "unknown activation"),
    (lambda: g.ggml_layer_dense(g.ggml_model_sequential(), 0, input_shape=(2,)), ValueError, "units"),
    (lambda: g.ggml_apply(g.ggml_input(shape=(2,)), "dense"), TypeError, "layer object"),
    (lambda: g.ggml_layer_conv_2d(g.ggml_model_sequential(), 2, (3, 3), padding="full", input_shape=(5, 5, 1)),
     ValueError, "padding"),
    (lambda: g.ggml_compile(mlp(), loss="poisson"), ValueError, "sparse_categorical_crossentropy"),
    (lambda: g.ggml_compile(mlp(), optimizer="nadam"), ValueError, "'adam', 'adamw', 'sgd', 'rmsprop', 'adagrad'"),
    (lambda: g.ggml_layer_dense(g.ggml_input(shape=(3,), dtype="int32"), 2), TypeError, "embedding"),
    (lambda: g.ggml_model(g.ggml_input(shape=(2,)), g.ggml_layer_dense(g.ggml_input(shape=(2,)), 1)),
     ValueError, "not among the model's inputs"),
])
def test_building_errors(call, kind, text):
    with pytest.raises(kind, match=text):
        call()


def test_first_layer_without_input_shape_names_it():
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 4)
    with pytest.raises(ValueError, match="dense_1.*needs input_shape"):
        g.ggml_compile(m)
    assert "incomplete" in str(m)


def test_uncompiled_model_says_compile():
    m = mlp()
    x = np.zeros((2, 4))
    for call in (lambda: g.ggml_fit(m, x, np.zeros((2, 3))), lambda: g.ggml_predict(m, x),
                 lambda: g.ggml_evaluate(m, x, np.zeros((2, 3))), lambda: g.ggml_save_model(m, "x.gguf"),
                 lambda: g.ggml_trainer(m)):
        with pytest.raises(RuntimeError, match="compile"):
            call()


def test_conv_layer_objects_and_the_conv_op_share_a_name(ctx):
    layer = g.ggml_conv_2d(4, (3, 3), activation="relu")
    assert layer.kind == "conv_2d" and layer.filters == 4
    k = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 3, 3, 1, 2)
    x = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 8, 8, 1, 1)
    assert g.ggml_conv_2d(ctx, k, x).shape == (6, 6, 2, 1)  # the ggml op, as before


def test_a_model_in_use_cannot_be_recompiled_from_another_thread():
    """ggml_fit running in one thread; ggml_compile / adding a layer in another is refused (it would free
    the weights under ggml), and the model stays usable."""
    import threading
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(3,))
    g.ggml_compile(m, loss="mse", backend="cpu")
    started, release = threading.Event(), threading.Event()

    def slow_source():
        for _ in range(4):
            started.set()
            release.wait(10)
            yield np.ones((8, 3)), np.ones((8, 2))

    worker = threading.Thread(target=lambda: g.ggml_fit_generator(m, slow_source, verbose=0))
    worker.start()
    assert started.wait(10)
    try:
        with pytest.raises(RuntimeError, match="in use"):
            g.ggml_compile(m, loss="mae", backend="cpu")
        with pytest.raises(RuntimeError, match="in use"):
            g.ggml_layer_dense(m, 1)
    finally:
        release.set()
        worker.join(10)
    assert [layer.name for layer in m.layers] == ["dense_1"]
    assert g.ggml_predict(m, np.ones((2, 3))).shape == (2, 2)
    g.ggml_compile(m, loss="mae", backend="cpu")   # free again once the fit returned


# ---------------------------------------------------------------- red-team findings (each gave a wrong model)

@pytest.mark.parametrize("layer, shape, ref", [
    (lambda x: g.ggml_layer_conv_2d(x, 3, (2, 2), activation="softmax", padding="same", name="c"), (3, 4, 2),
     lambda x, w: R.softmax(R.conv2d(x, w["c.kernel"], w["c.bias"], padding="same"))),
    (lambda x: g.ggml_layer_conv_1d(x, 3, 2, activation="softmax", name="c"), (5, 2),
     lambda x, w: R.softmax(R.conv1d(x, w["c.kernel"], w["c.bias"]))),
])
def test_softmax_on_a_convolution_is_over_its_channels(layer, shape, ref):
    """ggml's image layout keeps width (steps) fastest: a softmax applied there normalised the wrong axis."""
    np.random.seed(0)
    x = g.ggml_input(shape)
    m = g.ggml_compile(g.ggml_model(x, layer(x)), loss="categorical_crossentropy", backend="cpu")
    data = np.random.default_rng(0).normal(size=(2,) + shape).astype(np.float32)
    w = {k: v.astype(np.float64) for k, v in g.ggml_get_weights(m).items()}
    p = g.ggml_predict(m, data)
    np.testing.assert_allclose(p, ref(data.astype(np.float64), w), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-5)


def test_a_frozen_batch_norm_runs_in_inference_mode():
    """As in Keras: its running statistics stay, and the layers after it see running-statistics outputs."""
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 3, input_shape=(4,), name="d")
    m = g.ggml_layer_batch_norm(m, name="bn")
    m = g.ggml_layer_dense(m, 2, name="out")
    m = g.ggml_compile(m, loss="mse", optimizer="sgd", backend="cpu", learning_rate=0.1)
    rng = np.random.default_rng(0)
    x, y = rng.normal(3, 2, size=(8, 4)).astype(np.float32), rng.normal(size=(8, 2)).astype(np.float32)
    g.ggml_freeze_weights(m, 0, 2)
    before = {k: v.astype(np.float64) for k, v in g.ggml_get_weights(m).items()}
    tr = g.ggml_trainer(m, batch_size=8)
    tr.step(x, y)
    tr.free()
    after = g.ggml_get_weights(m)
    for k in ("bn.running_mean", "bn.running_var", "bn.gamma", "d.weight"):
        np.testing.assert_array_equal(after[k], before[k].astype(np.float32))
    # the one SGD step on 'out' used the inference-mode features: w' = w - lr * dL/dw with them
    h = R.batch_norm(R.dense(x.astype(np.float64), before["d.weight"], before["d.bias"]), before["bn.gamma"],
                     before["bn.beta"], before["bn.running_mean"], before["bn.running_var"])
    pred = R.dense(h, before["out.weight"], before["out.bias"])
    grad = h.T @ (2 * (pred - y) / pred.size)
    np.testing.assert_allclose(after["out.weight"], before["out.weight"] - 0.1 * grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("build, text", [
    (lambda: g.ggml_layer_layer_norm(g.ggml_input((4,)), eps=1e-300), "float32 holds"),
    (lambda: g.ggml_layer_batch_norm(g.ggml_input((4,)), eps=1e300), "float32 holds"),
    (lambda: g.ggml_layer_dense(g.ggml_input((4,)), 2, use_bias="no"), "use_bias must be True or False"),
    (lambda: g.ggml_layer_dense(g.ggml_input((4,)), 2, input_shape=(5,)), "applied to a node of shape"),
    (lambda: g.ggml_input((2 ** 30, 2 ** 30, 4)), "values per sample"),
    (lambda: g.ggml_input((2 ** 32, 1)), "at most 2\\*\\*31 - 1"),
    (lambda: g.ggml_layer_conv_2d(g.ggml_model_sequential(), 2, 3, strides=2 ** 62, input_shape=(8, 8, 1)),
     "strides must be a positive int \\(at most"),
    (lambda: g.ggml_layer_dense(g.ggml_input((4,)), 2, name="é" * 40), "bytes in UTF-8"),
    (lambda: g.ggml_compile(g.ggml_model(*(lambda t: (t, t))(g.ggml_input((3,), dtype="int32"))), loss="mse",
                            backend="cpu"), "token-id input itself"),
])
def test_values_that_would_make_a_broken_model_are_refused(build, text):
    with pytest.raises((ValueError, TypeError), match=text):
        build()


def test_a_one_step_recurrent_layer_fits_again():
    """Over one step the recurrent kernel is unused (no gradient, no AdamW moments): keeping the optimizer
    state after the fit failed, and every later fit with it."""
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_lstm(m, 2, input_shape=(1, 3))
    m = g.ggml_compile(g.ggml_layer_dense(m, 1), loss="mse", backend="cpu")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 1, 3)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32)
    for _ in range(2):
        h = g.ggml_fit(m, x, y, epochs=2, verbose=0)
        assert np.isfinite(h["train_loss"]).all()
    assert "lstm_1.recurrent_kernel" not in m.runtime.opt_state.state["m"]


# ---------------------------------------------------------------- messages that say what to do

def test_a_variable_size_whose_weights_would_depend_on_it_says_why_and_what_to_do():
    m = g.ggml_layer_flatten(g.ggml_model_sequential(), input_shape=(None, 4))
    with pytest.raises(g.GgmlValueError, match=r"weights would depend on the variable size.*global pooling"):
        g.ggml_layer_dense(m, 2)
    with pytest.raises(g.GgmlValueError, match=r"ggml_custom: output_shape \(None, 8\).*lambda s: \(s\[0\], 8\)"):
        g.ggml_custom(lambda ctx, x, w: x, output_shape=(None, 8))


@pytest.mark.parametrize("name, text", [("cpu ", "spaces around the name; did you mean 'cpu'"),
                                        ("gpu", "no backend or device is named 'gpu'; choose one of")])
def test_a_mistyped_backend_name_is_named_with_the_choices(name, text):
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(3,))
    with pytest.raises(g.BackendUnavailableError, match=text):
        g.ggml_compile(m, loss="mse", backend=name)


@pytest.mark.parametrize("attr, value", [("activation", None), ("units", 5), ("use_bias", False),
                                         ("input_shape", (9,))])
def test_a_layers_arguments_are_fixed_once_it_is_made(attr, value):
    """Changed after construction they were applied to some cached graphs and not others: predictions then
    depended on the batch size."""
    m = g.ggml_compile(mlp(), backend="cpu")
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    before = g.ggml_predict(m, x, batch_size=5)
    layer = m.layers[0]
    old = getattr(layer, attr)
    with pytest.raises(g.GgmlStateError, match=f"{attr} cannot change after the layer is made.*make a new layer"):
        setattr(layer, attr, value)
    assert getattr(layer, attr) == old
    with pytest.raises(g.GgmlStateError):
        delattr(layer, attr)
    np.testing.assert_array_equal(g.ggml_predict(m, x, batch_size=2), before)


def test_trainable_takes_booleans_only_and_names_are_given_once():
    layer = mlp().layers[0]
    with pytest.raises(g.GgmlTypeError, match="trainable must be True or False, got 'no'"):
        layer.trainable = "no"
    layer.trainable = np.bool_(False)
    assert layer.trainable is False
    with pytest.raises(g.GgmlStateError, match="named already"):
        layer.name = "other"
    with pytest.raises(g.GgmlStateError, match="make a new layer"):
        layer.made_up = 1


def test_swish_is_keras_name_for_silu():
    def model(activation):
        np.random.seed(0)
        m = g.ggml_model_sequential()
        m = g.ggml_layer_dense(m, 4, activation=activation, input_shape=(3,), name="d")
        return g.ggml_compile(m, loss="mse", backend="cpu")
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    np.testing.assert_array_equal(g.ggml_predict(model("swish"), x), g.ggml_predict(model("silu"), x))
    m = model("swish")
    w = g.ggml_get_weights(m)
    kernel, bias = w["d.weight"], w["d.bias"]  # (inputs, units), as Keras' kernel
    z = x.astype(np.float64) @ kernel + bias
    np.testing.assert_allclose(g.ggml_predict(m, x), z / (1 + np.exp(-z)), rtol=1e-5, atol=1e-6)


def test_every_layer_docstring_lists_each_argument_once():
    """issue 26: layers without an __init__ of their own listed name, trainable and input_shape twice."""
    import re
    for fn_name in [n for n in dir(g) if n.startswith("ggml_layer_")]:
        doc = getattr(g, fn_name).__doc__ or ""
        params = __import__("inspect").signature(getattr(g, fn_name)).parameters
        if "Arguments:" not in doc or "model_or_node" not in params:
            continue  # not a layer (ggml_layer_adapt sets a layer's statistics)
        listed = re.findall(r"^    (\w+): ", doc.split("Arguments:")[1].split("Value:")[0], re.M)
        assert len(listed) == len(set(listed)), (fn_name, listed)
        assert {"name", "trainable", "input_shape"} <= set(listed), fn_name




def test_keras_habits_of_a_second_port_say_what_to_write():
    """What a Keras user reaches for next: each works or says what to write instead."""
    a, b = g.ggml_input(shape=(3,)), g.ggml_input(shape=(3,))
    total = sum([a, b])                         # sum() starts from 0: 0 + node is the node
    assert total.layer.kind == "add" and list(total.inputs) == [a, b]
    for expr, text in ((lambda: a / b, r"node / \.\.\..*ggml_div"), (lambda: -a, r"-node.*rescaling\(node, -1\.0\)"),
                       (lambda: a @ b, r"ggml_layer_dense.*ggml_mul_mat"), (lambda: a ** 2, r"node \*\* \.\.\."),
                       (lambda: a * 2.0, r"for a number c: ggml_layer_rescaling\(node, c\)"),
                       (lambda: 1 - a, r"rescaling\(node, -1\.0, offset=c\) \(c - node\)")):
        with pytest.raises(g.GgmlTypeError, match=text):
            expr()
    m = g.ggml_model([a, b], g.ggml_layer_dense(total, 2))
    assert m.input_shape == [(None, 3), (None, 3)] and m.output_shape == (None, 2)
    with pytest.raises(AttributeError, match=r"count_params.*ggml_get_weights"):
        m.count_params()
    seq = g.ggml_layer_max_pooling_2d(g.ggml_model_sequential(), 2, padding="SAME", input_shape=(5, 5, 1))
    seq = g.ggml_compile(g.ggml_layer_flatten(seq), loss="mse", backend="cpu")
    assert seq.output_shape == (None, 9)                        # "SAME" is "same", as Keras lowers it
    x, y = np.ones((4, 5, 5, 1), np.float32), np.zeros((4, 9), np.float32)
    h = g.ggml_fit(g.ggml_compile(g.ggml_layer_dense(seq, 9), loss="mse", backend="cpu"), x, y, verbose=0)
    with pytest.raises(KeyError, match=r"'loss'.*history\.history\['loss'\]"):
        h["loss"]
    assert h.history["loss"] == list(h["train_loss"])
    with pytest.raises(KeyError, match="nothing"):
        h["nothing"]


def test_scikeras_routing_names_an_argument_its_function_lacks():
    def build(input_shape):
        return g.ggml_layer_dense(g.ggml_model_sequential(), 1, input_shape=input_shape)
    x, y = np.ones((8, 2), np.float32), np.ones(8, np.float32)
    with pytest.raises(g.GgmlTypeError, match=r"optimizer__bogus: 'optimizer__' routes arguments to ggml_compile, "
                                              r"which has no argument 'bogus'; its arguments are .*learning_rate"):
        g.GgmlRegressor(build, backend="cpu", optimizer__bogus=1).fit(x, y)
    with pytest.raises(g.GgmlTypeError, match=r"fit__shufle: .* ggml_fit, which has no argument 'shufle'"):
        g.GgmlRegressor(build, backend="cpu", fit__shufle=False, epochs=1).fit(x, y)


@pytest.mark.parametrize("name, why", [("log_softmax", "from_logits=True"), ("glu", "custom layer"),
                                       ("hard_shrink", "soft_shrink"), ("threshold", "relu"),
                                       ("sparsemax", "softmax")])
def test_keras_activations_left_out_say_what_to_use(name, why):
    with pytest.raises(g.GgmlValueError, match=rf"activation '{name}' \(Keras'\) is not provided: .*{why}"):
        g.ggml_layer_dense(g.ggml_model_sequential(), 2, activation=name, input_shape=(3,))


def test_an_estimator_whose_function_compiles_says_its_compile_settings_are_unused():
    def compiled_build(input_shape):
        m = g.ggml_layer_dense(g.ggml_model_sequential(), 1, input_shape=input_shape)
        return g.ggml_compile(m, loss="mse", backend="cpu")
    x, y = np.ones((8, 2), np.float32), np.ones(8, np.float32)
    with pytest.warns(g.GgmlpyWarning, match=r"compile settings learning_rate, optimizer__momentum are not used"):
        g.GgmlRegressor(compiled_build, learning_rate=0.5, optimizer__momentum=0.9, epochs=1).fit(x, y)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.GgmlRegressor(compiled_build, epochs=1).fit(x, y)   # nothing given that would be dropped: no warning
    with pytest.raises(g.GgmlTypeError, match=r"abs\(node\).*ggml_abs"):
        abs(g.ggml_input(shape=(2,)))


def test_recompiling_with_only_a_backend_on_a_one_unit_model_names_the_default_loss():
    m = g.ggml_compile(g.ggml_layer_dense(g.ggml_model_sequential(), 1, input_shape=(3,)), loss="mse", backend="cpu")
    x, y = np.ones((6, 3), np.float32), np.ones((6, 1), np.float32)
    g.ggml_fit(m, x, y, verbose=0)
    m = g.ggml_compile(m, backend="cpu")          # Keras' rule: the loss goes back to the default
    with pytest.raises(g.GgmlValueError, match=r"1 unit, where categorical_crossentropy \(ggml_compile's default "
                                               r"loss: .*resets every setting.*loss='mse'"):
        g.ggml_fit(m, x, y, verbose=0)
