"""Models as graphs of layers (models/network/model.py): functional models with several inputs and outputs, nodes
that cannot be edited into a cycle, inputs that are unconnected or listed twice, layer names across models, and a
layer that cannot fit refused when it is added, leaving the model as it was."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers.models import mlp


def test_functional_with_add_concatenate_and_several_inputs_outputs():
    a = g.ggml_input(shape=(5,))
    b = g.ggml_input(shape=(3,))
    h = g.ggml_layer_dense(a, 4, activation="relu")
    s = g.ggml_layer_add([h, g.ggml_layer_dense(a, 4)])
    c = g.ggml_layer_concatenate([s, b])
    assert c.shape == (7,)
    out1 = g.ggml_layer_dense(c, 2, activation="softmax")
    out2 = g.ggml_layer_dense(c, 1)
    m = g.ggml_model(inputs=[a, b], outputs=[out1, out2])
    assert len(m.layers) == 6
    g.ggml_compile(m, loss=["categorical_crossentropy", "mse"], loss_weights=[1.0, 0.5], backend="cpu")
    p = g.ggml_predict(m, [np.ones((7, 5)), np.ones((7, 3))])
    assert isinstance(p, list) and p[0].shape == (7, 2) and p[1].shape == (7, 1)


def test_an_unconnected_input_is_refused():
    a, b = g.ggml_input(shape=(3,)), g.ggml_input(shape=(2,), name="unused_input")
    with pytest.raises(ValueError, match="'unused_input' is not connected"):
        g.ggml_model([a, b], g.ggml_layer_dense(a, 1))


def test_an_input_listed_twice_is_refused():
    x = g.ggml_input((4,))
    with pytest.raises(ValueError, match="listed twice"):
        g.ggml_model([x, x], g.ggml_layer_dense(x, 3))


def test_nodes_cannot_be_edited_into_a_cycle():
    x = g.ggml_input((4,))
    h = g.ggml_layer_dense(x, 3)
    out = g.ggml_layer_dense(h, 2)
    with pytest.raises(g.GgmlStateError, match="a node cannot be changed"):
        h.inputs = (out,)
    with pytest.raises(AttributeError):
        h.inputs.append(out)    # a tuple
    assert g.ggml_model(x, out).layers[0].name == h.layer.name


def test_reusing_a_sequential_models_layers_beside_new_ones_needs_no_names():
    """Keras' transfer-learning pattern: a trained sequential's layers (named per model, 'dense_1') and new
    layers made outside it (named from a session-wide count) used to collide."""
    base = g.ggml_compile(mlp(), backend="cpu")
    x = g.ggml_input((4,))
    out = g.ggml_layer_dense(g.ggml_apply(x, base.layers[0]), 2)
    model = g.ggml_model(x, out)
    names = [layer.name for layer in model.layers]
    assert names[0] == base.layers[0].name and len(set(names)) == 2
    g.ggml_compile(model, loss="mse", backend="cpu")
    np.testing.assert_array_equal(g.ggml_get_weights(model)[f"{names[0]}.weight"],
                                  g.ggml_get_weights(base)[f"{names[0]}.weight"])


def test_two_sequential_models_layers_together_are_told_to_take_names():
    a, b = mlp(), mlp()
    x = g.ggml_input((4,))
    with pytest.raises(g.GgmlValueError, match="named 'dense_1'.*name the layers when making them"):
        g.ggml_model(x, g.ggml_layer_concatenate([g.ggml_apply(x, a.layers[0]), g.ggml_apply(x, b.layers[0])]))


def test_layers_of_a_loaded_or_unpickled_model_beside_new_ones_need_no_names(tmp_path):
    """A loaded model keeps its names ('dense_1'): new layers made outside it skip the names live layers have."""
    import pickle
    base = g.ggml_compile(mlp(), backend="cpu")
    g.ggml_save_model(base, str(tmp_path / "m.gguf"))
    del base
    for source in (g.ggml_load_model(str(tmp_path / "m.gguf"), backend="cpu"),
                   pickle.loads(pickle.dumps(g.ggml_compile(mlp(), backend="cpu")))):
        x = g.ggml_input((4,))
        model = g.ggml_model(x, g.ggml_layer_dense(g.ggml_apply(x, source.layers[0]), 2))
        names = [layer.name for layer in model.layers]
        assert names[0] == "dense_1" and len(set(names)) == 2


def test_a_sequential_model_refuses_an_impossible_layer_when_it_is_added():
    """Not at compile: token ids after the first layer, normalization statistics of another size."""
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 4, input_shape=(4,))
    with pytest.raises(TypeError, match=r"reads int32 token ids"):
        g.ggml_layer_embedding(m, 10, 3)
    with pytest.raises(ValueError, match=r"mean and variance have 3 values but its input has 4 features"):
        g.ggml_layer_normalization(m, mean=[0, 0, 0], variance=[1, 1, 1])
    assert [layer.kind for layer in m.layers] == ["dense"]   # neither was added
    g.ggml_layer_normalization(m, mean=[0, 0, 0, 0], variance=[1, 1, 1, 1])
    assert [layer.kind for layer in m.layers] == ["dense", "normalization"]


def _image_model():
    m = g.ggml_model_sequential()
    return g.ggml_layer_conv_2d(m, 4, (3, 3), activation="relu", input_shape=(5, 5, 2))   # out (3, 3, 4)


def _flat_model():
    return g.ggml_layer_flatten(_image_model())   # out (36,)


def _dense_model():
    return g.ggml_layer_dense(g.ggml_model_sequential(), 8, activation="tanh", input_shape=(5, 5, 2))  # (5, 5, 8)


def _vector_model():
    return g.ggml_layer_dense(g.ggml_model_sequential(), 8, activation="tanh", input_shape=(6,))   # out (8,)


@pytest.mark.parametrize("base, bad, text", [
    (_image_model, lambda m: g.ggml_layer_conv_2d(m, 4, (5, 5)),
     r"a kernel of 5 does not fit an input of 3 \(padding='valid'\)"),
    (g.ggml_model_sequential, lambda m: g.ggml_layer_conv_2d(m, 4, (7, 7), input_shape=(5, 5, 2)),
     r"a kernel of 7 does not fit an input of 5"),
    (_flat_model, lambda m: g.ggml_layer_conv_2d(m, 4, (3, 3)),
     r"conv_2d 'conv_2d_2' takes image samples \(height, width, channels\), got shape \(36,\)"),
    (_vector_model, lambda m: g.ggml_layer_conv_2d(m, 4, (3, 3)),
     r"conv_2d 'conv_2d_1' takes image samples \(height, width, channels\), got shape \(8,\)"),
    (_flat_model, lambda m: g.ggml_layer_max_pooling_2d(m, (2, 2)),
     r"max_pooling_2d 'max_pooling_2d_1' takes image samples \(height, width, channels\), got shape \(36,\)"),
    (_vector_model, lambda m: g.ggml_layer_max_pooling_2d(m, (2, 2)),
     r"takes image samples \(height, width, channels\), got shape \(8,\)"),
    (_image_model, lambda m: g.ggml_layer_max_pooling_2d(m, (4, 4)), r"a window of 4 does not fit an input of 3"),
    (_dense_model, lambda m: g.ggml_layer_conv_2d(m, 4, (3, 3), padding="valid", dilation_rate=3),
     r"does not fit an input of 5"),
])
def test_a_shape_mismatch_is_refused_when_the_layer_is_added_and_leaves_the_model_usable(base, bad, text):
    """Keras refuses such a layer when it is added (its build fails), saying what it expected and what it got;
    the model is left as it was: the same layers and output shape, and a valid layer then added compiles."""
    m = base()
    before = [(layer.name, layer.kind) for layer in m.layers]
    shape = m.outputs[0].shape if m.layers else None
    with pytest.raises(ValueError, match=text):
        bad(m)
    assert [(layer.name, layer.kind) for layer in m.layers] == before
    if m.layers:
        assert m.outputs[0].shape == shape
    else:   # the refused first layer: the model is still empty
        m = g.ggml_layer_conv_2d(m, 4, (3, 3), input_shape=(5, 5, 2))
    m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 3, activation="softmax") if len(m.outputs[0].shape) > 1 \
        else g.ggml_layer_dense(m, 3, activation="softmax")
    g.ggml_compile(m, loss="categorical_crossentropy", backend="cpu")
    x = np.random.default_rng(0).normal(size=(2,) + tuple(m.layers[0].input_shape)).astype(np.float32)
    p = g.ggml_predict(m, x)
    assert p.shape == (2, 3) and np.allclose(p.sum(axis=1), 1, atol=1e-5)


@pytest.mark.parametrize("method, function", [("fit", "ggml_fit"), ("predict", "ggml_predict"),
                                              ("evaluate", "ggml_evaluate"), ("save", "ggml_save_model")])
def test_keras_methods_point_to_the_ggmlpy_function(method, function):
    """model.fit(...) (a Keras habit) was a bare AttributeError; it names the function to call."""
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(3,))
    with pytest.raises(AttributeError, match=f"{function}\\(model"):
        getattr(m, method)
    assert getattr(g, function)  # the function named exists
    assert not hasattr(m, "no_such_thing")
