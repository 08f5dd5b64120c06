"""Each layer declared once (models/layers/layer.py): the class registry, the weights declared as ``Weight``
attributes, the config read from the constructor, the public functions made from the classes, and a user's
own ``Layer`` subclass, which trains, saves, loads (given its class) and pickles like a built-in."""
from __future__ import annotations

import copy
import inspect
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.models import builders
from ggmlpy.models.io.saving import model_from_architecture
from ggmlpy.models.layers.basic import Dense
from ggmlpy.models.layers.layer import import_built_ins, LAYER_TYPES


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


# one sample of every built-in layer with public functions: the constructor's arguments, and an input shape
# (a list of shapes: the nodes it takes)
SAMPLES = {
    "dense": ((3,), {"activation": "relu", "use_bias": False}, [(4,)]),
    "flatten": ((), {}, [(2, 3)]),
    "dropout": ((0.25,), {}, [(4,)]),
    "embedding": ((10, 3), {"mask_zero": True}, [(5,)]),
    "position_embedding": ((6,), {}, [(5, 3)]),
    "conv_1d": ((2, 3), {"padding": "causal", "dilation_rate": 2}, [(8, 2)]),
    "conv_2d": ((2, (3, 2)), {"strides": (1, 2), "padding": "same"}, [(6, 6, 2)]),
    "conv_2d_transpose": ((2, (3, 3)), {"strides": 2, "padding": "same"}, [(4, 4, 3)]),
    "max_pooling_2d": (((2, 2),), {}, [(4, 4, 2)]),
    "average_pooling_2d": (((2, 1),), {"strides": (1, 1)}, [(4, 4, 2)]),
    "global_average_pooling_2d": ((), {}, [(4, 4, 2)]),
    "global_max_pooling_2d": ((), {}, [(4, 4, 2)]),
    "max_pooling_1d": ((2,), {}, [(6, 2)]),
    "average_pooling_1d": ((3,), {"strides": 1}, [(6, 2)]),
    "global_average_pooling_1d": ((), {}, [(6, 2)]),
    "global_max_pooling_1d": ((), {}, [(6, 2)]),
    "upsampling_2d": (((2, 3),), {}, [(2, 2, 1)]),
    "activation": (("tanh",), {}, [(4,)]),
    "reshape": (((2, -1),), {}, [(6,)]),
    "repeat_vector": ((3,), {}, [(4,)]),
    "batch_norm": ((), {"momentum": 0.9}, [(4,)]),
    "layer_norm": ((), {"eps": 1e-3}, [(5, 4)]),
    "normalization": ((), {"mean": [1.0, 2.0], "variance": [4.0, 9.0]}, [(2,)]),
    "masking": ((), {"mask_value": -1.0}, [(5, 2)]),
    "lstm": ((3,), {"return_sequences": True, "unit_forget_bias": False}, [(5, 2)]),
    "gru": ((3,), {"go_backwards": True, "dropout": 0.1}, [(5, 2)]),
    "multi_head_attention": ((), {"num_heads": 2, "key_dim": 3, "causal": True}, [(5, 4)]),
    "time_distributed": ((lambda: g.ggml_dense(2),), {}, [(5, 3)]),
    "bidirectional": ((lambda: g.ggml_gru(2, return_sequences=True),), {"merge_mode": "sum"}, [(5, 3)]),
    "rescaling": ((1 / 255,), {"offset": 0.5}, [(4, 3, 2)]),
    "random_flip": (("horizontal",), {}, [(4, 3, 2)]),
    "random_translation": ((0.2, (-0.1, 0.3)), {"fill_mode": "constant", "fill_value": 1.0}, [(4, 3, 2)]),
    "random_zoom": (((-0.2, 0.1),), {"interpolation": "nearest"}, [(4, 3, 2)]),
    "random_rotation": ((0.1,), {"fill_mode": "wrap"}, [(4, 3, 2)]),
}


def built_in_classes():
    import_built_ins()
    return {kind: cls for kind, cls in LAYER_TYPES.items() if cls.__module__.startswith("ggmlpy.models.")}


def public_classes():
    return {kind: cls for kind, cls in built_in_classes().items() if cls.builder_functions}


def make(kind):
    args, kwargs, _ = SAMPLES[kind]
    args = tuple(a() if callable(a) else a for a in args)
    return public_classes()[kind](*args, **kwargs)


def test_the_samples_cover_every_built_in_layer():
    """Adding a built-in layer adds its line above (the checks below then hold for it too)."""
    assert set(SAMPLES) == set(public_classes())


def test_every_built_in_class_has_its_two_functions_with_its_help_and_arguments():
    for kind, cls in public_classes().items():
        names = [f"ggml_layer_{kind}"] + ([] if cls.builder_functions == "layer" else [f"ggml_{kind}"])
        assert set(names) <= set(g.__all__) and set(names) <= set(builders.LAYER_FUNCTIONS), kind
        description = inspect.cleandoc(cls.__doc__).partition("\n\nExample:")[0]
        assert "Example:" in cls.__doc__, f"{cls.__name__}'s docstring has no example"
        for name in names:
            doc = getattr(g, name).__doc__
            assert doc.startswith(description) or description in doc, name
            # every constructor argument is in the signature and in the Arguments: list
            params = inspect.signature(getattr(g, name)).parameters
            for arg, p in inspect.signature(cls.__init__).parameters.items():
                if arg != "self" and p.kind is not p.VAR_KEYWORD:
                    assert f"    {arg}: " in doc, (name, arg)
                    # an op's name (ggml_conv_2d) takes the op's call too: its signature is the op's or the layer's
                    assert arg in params or name in ("ggml_conv_1d", "ggml_conv_2d", "ggml_dropout"), (name, arg)
        layer_fn = getattr(g, f"ggml_layer_{kind}")
        args, kwargs, shapes = SAMPLES[kind]
        if cls.many_inputs is not True:
            node = g.ggml_input(shape=shapes[0], dtype="int32" if cls.takes_int else "float32")
            out = layer_fn(node, *(a() if callable(a) else a for a in args), **kwargs)
            assert out.layer.kind == kind


def test_no_function_is_made_for_what_is_not_a_public_layer():
    made = set(builders.LAYER_FUNCTIONS)
    for kind in ("custom", "input", "recurrent_part", "add", "concatenate", "layer"):
        assert f"ggml_layer_{kind}" not in made
    assert "ggml_reshape" not in made and g.ggml_reshape.__module__ == "ggmlpy.ops.layout"   # the op keeps it


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_the_config_rebuilds_the_layer_and_its_weights_are_the_declared_ones(kind):
    layer = make(kind)
    config = {**layer.full_config(), "name": f"{kind}_sample"}
    again = model_from_architecture({"class": "sequential", "layers": [config]}).layers[0]
    assert type(again) is type(layer) and again.full_config() == config
    # every constructor argument is in the config, or stands for another one (NOT_SAVED)
    from ggmlpy.models.layers.layer import constructor_arguments
    assert set(constructor_arguments(type(layer))) - set(layer.NOT_SAVED) == set(layer.config())
    _, _, shapes = SAMPLES[kind]
    layer.build(shapes)
    inner = getattr(layer, "layer", None)
    declared = set(type(inner if inner is not None else layer).WEIGHTS)
    names = {p.name for p in layer.params}
    if inner is not None:   # a wrapper holds its inner layer's weights, with a prefix for each direction
        names = {n.removeprefix("forward_").removeprefix("backward_") for n in names}
    assert names <= declared
    assert set(layer.REGULARIZED.values()) <= declared


def test_a_weight_present_only_with_an_argument_is_made_only_then():
    with_bias, without = g.ggml_dense(3), g.ggml_dense(3, use_bias=False)
    with_bias.build([(4,)])
    without.build([(4,)])
    assert [p.name for p in with_bias.params] == ["weight", "bias"] and [p.name for p in without.params] == ["weight"]
    wrapped = g.ggml_time_distributed(g.ggml_dense(2, use_bias=False))
    wrapped.build([(5, 3)])
    assert [p.name for p in wrapped.params] == ["weight"]


def test_regularizer_arguments_come_from_the_weights():
    assert g.ggml_dense(2).REGULARIZED == {"kernel_regularizer": "weight", "bias_regularizer": "bias"}
    assert g.ggml_lstm(2).REGULARIZED == {"kernel_regularizer": "kernel", "recurrent_regularizer":
                                          "recurrent_kernel", "bias_regularizer": "bias"}
    assert g.ggml_embedding(4, 2).REGULARIZED == {"embeddings_regularizer": "weight"}
    with pytest.raises(TypeError, match="unexpected keyword argument 'kernel_regularizer'"):
        g.ggml_layer_norm(kernel_regularizer="l2")


# ---------------------------------------------------------------- a user's own layer

class ScaledDense(g.Layer):
    """``units`` outputs, each product scaled by a learned factor per output: ``(x @ kernel) * scale``."""
    kernel = g.Weight(user_axes=(1, 0))          # Glorot uniform; ggml_get_weights shows it (inputs, units)
    scale = g.Weight(initializer="ones")

    def __init__(self, units, **kw):
        super().__init__(**kw)
        self.units = units

    def output_shape(self, shapes):
        return shapes[0][:-1] + (self.units,)

    def make_params(self, shapes):
        n = shapes[0][-1]
        return [self.kernel.spec((n, self.units), fans=(n, self.units)), self.scale.spec((self.units,))]

    def forward(self, build, xs, shapes):
        y = g.ggml_mul_mat(build.ctx, build.param(self, self.kernel), xs[0])
        return g.ggml_mul(build.ctx, y, build.param(self, self.scale))


def scaled_model(seed=0):
    np.random.seed(seed)
    m = g.ggml_model_sequential()
    m = g.ggml_apply(m, ScaledDense(3, input_shape=(4,)))
    return g.ggml_compile(m, optimizer="sgd", loss="mse", metrics=[], learning_rate=0.1, backend="cpu")


def data():
    rng = np.random.default_rng(1)
    return rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 3)).astype(np.float32)


def test_a_subclass_is_registered_under_its_class_name_and_named_after_it():
    assert ScaledDense.kind == "scaled_dense" and LAYER_TYPES["scaled_dense"] is ScaledDense
    assert ScaledDense.WEIGHTS.keys() == {"kernel", "scale"} and not ScaledDense.builder_functions
    m = scaled_model()
    assert m.layers[0].name.startswith("scaled_dense")


def test_a_subclass_computes_and_trains_as_numpy_says():
    m = scaled_model()
    x, t = data()
    w = g.ggml_get_weights(m)
    name = m.layers[0].name
    kernel, scale = (w[f"{name}.kernel"].astype(np.float64), w[f"{name}.scale"].astype(np.float64))
    assert kernel.shape == (4, 3) and np.array_equal(scale, np.ones(3))
    y = (x @ kernel) * scale
    np.testing.assert_allclose(g.ggml_predict(m, x, batch_size=8), y, rtol=1e-5, atol=1e-6)
    # one SGD step on the whole batch: the gradient of mean((y - t)^2) in float64
    dy = 2 * (y - t) / y.size
    grad_kernel = x.T.astype(np.float64) @ (dy * scale)
    grad_scale = ((x @ kernel) * dy).sum(axis=0)
    g.ggml_fit(m, x, t, epochs=1, batch_size=8, verbose=0)
    w = g.ggml_get_weights(m)
    np.testing.assert_allclose(w[f"{name}.kernel"], kernel - 0.1 * grad_kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w[f"{name}.scale"], scale - 0.1 * grad_scale, rtol=1e-5, atol=1e-6)


def test_a_subclass_saves_loads_and_pickles(tmp_path):
    m = scaled_model()
    x, t = data()
    g.ggml_fit(m, x, t, epochs=2, batch_size=4, verbose=0)
    want = g.ggml_predict(m, x)
    path = str(tmp_path / "scaled.gguf")
    g.ggml_save_model(m, path)
    np.testing.assert_array_equal(g.ggml_predict(g.ggml_load_model(path, backend="cpu"), x), want)
    again = g.ggml_load_model(path, backend="cpu", custom_objects={"ScaledDense": ScaledDense})
    np.testing.assert_array_equal(g.ggml_predict(again, x), want)
    np.testing.assert_array_equal(g.ggml_predict(pickle.loads(pickle.dumps(m)), x), want)


def test_a_subclass_loads_in_a_fresh_process_given_its_class(tmp_path):
    """Where the class was never defined, loading says how to give it; custom_objects= gives it."""
    (tmp_path / "mylayers.py").write_text(textwrap.dedent(inspect.getsource(ScaledDense)).replace(
        "g.Layer", "ggmlpy.Layer").replace("g.Weight", "ggmlpy.Weight").replace("g.ggml_", "ggmlpy.ggml_"))
    (tmp_path / "mylayers.py").write_text("import ggmlpy\n\n\n" + (tmp_path / "mylayers.py").read_text())
    m = scaled_model()
    x, _ = data()
    path = str(tmp_path / "scaled.gguf")
    g.ggml_save_model(m, path)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "want.npy", g.ggml_predict(m, x))
    script = textwrap.dedent(f"""
        import sys, numpy as np, ggmlpy as g
        path, x, want = {path!r}, np.load({str(tmp_path / "x.npy")!r}), np.load({str(tmp_path / "want.npy")!r})
        try:
            g.ggml_load_model(path, backend="cpu")
            sys.exit("loaded without the class")
        except g.GgmlValueError as exc:
            assert "scaled_dense" in str(exc) and "custom_objects" in str(exc), exc
        sys.path.insert(0, {str(tmp_path)!r})
        import mylayers
        m = g.ggml_load_model(path, backend="cpu", custom_objects={{"scaled_dense": mylayers.ScaledDense}})
        np.testing.assert_array_equal(g.ggml_predict(m, x), want)
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_subclass_whose_config_its_constructor_cannot_take_is_refused_at_save(tmp_path):
    class Keeps(g.Layer):
        def __init__(self, units, **kw):
            super().__init__(**kw)
            self.size = units     # kept under another name: the derived config cannot read it

        def config(self):
            return {"size": self.size}

        def output_shape(self, shapes):
            return (self.size,)

        def forward(self, build, xs, shapes):
            return xs[0]

    m = g.ggml_model_sequential()
    m = g.ggml_apply(m, Keeps(4, input_shape=(4,)))
    g.ggml_compile(m, loss="mse", metrics=[], backend="cpu")
    with pytest.raises(g.GgmlValueError, match="constructor .* cannot be called with"):
        g.ggml_save_model(m, str(tmp_path / "k.gguf"))
    assert not (tmp_path / "k.gguf").exists()


def test_a_kind_taken_by_another_class_is_refused_and_bases_are_not_layers():
    with pytest.raises(g.GgmlValueError, match="the kind 'dense' is taken by ggmlpy.models.layers.basic.Dense"):
        type("MyDense", (g.Layer,), {"kind": "dense"})
    with pytest.raises(g.GgmlValueError, match="kind must be lower-case"):
        type("Odd", (g.Layer,), {"kind": "Odd Kind"})

    class Base(g.Layer, abstract=True):
        pass

    with pytest.raises(g.GgmlTypeError, match="a base of layers"):
        Base()
    with pytest.raises(g.GgmlTypeError, match="a base of layers"):
        g.Layer()


def test_a_weight_the_class_does_not_declare_is_refused():
    class Sloppy(g.Layer):
        kernel = g.Weight()

        def make_params(self, shapes):
            return [self.kernel.spec((4, 4)), self.kernel.spec((4,)).__class__("kernal", (4,), "zeros")]

    with pytest.raises(g.GgmlTypeError, match="weight 'kernal' the class does not declare"):
        Sloppy().build([(4,)])


def test_custom_objects_must_map_names_to_layer_classes():
    with pytest.raises(g.GgmlTypeError, match="custom_objects must be a dict"):
        from ggmlpy.models.layers.layer import layer_class
        layer_class("scaled_dense", {"scaled_dense": object})


def test_a_subclass_that_does_not_keep_an_argument_says_so_when_saved_and_still_prints(tmp_path):
    class Renamed(g.Layer):
        def __init__(self, factor, **kw):
            super().__init__(**kw)
            self.scale_by = factor          # not kept as self.factor

        def forward(self, build, xs, shapes):
            return g.ggml_scale(build.ctx, xs[0], self.scale_by)

    layer = Renamed(2.0, input_shape=(3,))
    assert repr(layer).startswith("<renamed ")
    m = g.ggml_apply(g.ggml_model_sequential(), layer)
    g.ggml_compile(m, loss="mse", metrics=[], backend="cpu")
    np.testing.assert_allclose(g.ggml_predict(m, np.ones((2, 3), np.float32)), 2.0)
    with pytest.raises(g.GgmlValueError, match="constructor argument 'factor' is not kept"):
        g.ggml_save_model(m, str(tmp_path / "r.gguf"))
    with pytest.raises(g.GgmlValueError, match="constructor argument 'factor' is not kept"):
        pickle.dumps(m)



class ScaledBase(Dense):
    """A built-in's subclass that passes the built-in's arguments on through ``**kw``."""
    def __init__(self, units, factor=2.0, **kw):
        super().__init__(units, **kw)
        self.factor = factor

    def forward(self, build, xs, shapes):
        return g.ggml_scale(build.ctx, super().forward(build, xs, shapes), self.factor)


def test_a_subclass_keeps_the_arguments_it_passes_on_to_its_base(tmp_path):
    """Keras' pattern: the arguments a subclass passes to its base through **kw are part of its config, so a
    copy, a pickle and a saved file rebuild the same layer (the base's activation and use_bias included)."""
    m = g.ggml_apply(g.ggml_model_sequential(), ScaledBase(3, activation="relu", use_bias=False, input_shape=(4,)))
    g.ggml_compile(m, loss="mse", metrics=[], backend="cpu")
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    want = g.ggml_predict(m, x)
    assert m.layers[0].config()["activation"] == "relu" and m.layers[0].config()["use_bias"] is False
    path = str(tmp_path / "s.gguf")
    g.ggml_save_model(m, path)
    for again in (copy.deepcopy(m), pickle.loads(pickle.dumps(m)), g.ggml_load_model(path, backend="cpu")):
        np.testing.assert_array_equal(g.ggml_predict(again, x), want)
        assert again.layers[0].full_config() == m.layers[0].full_config()


def test_what_a_subclass_cannot_declare_is_refused_where_it_is_written():
    with pytest.raises(g.GgmlValueError, match="'params' would overwrite the layer's own"):
        type("Gain", (g.Layer,), {"__init__": lambda self, params=2.0, **kw: None})
    with pytest.raises(g.GgmlValueError, match="unknown initializer 'xavier'"):
        g.Weight(initializer="xavier")
    with pytest.raises(g.GgmlValueError, match="when='use_bais', which is not a constructor argument"):
        class Misspelt(g.Layer):
            bias = g.Weight(when="use_bais")

            def __init__(self, use_bias=True, **kw):
                super().__init__(**kw)
                self.use_bias = use_bias
    with pytest.raises(g.GgmlValueError, match="two Weight attributes name the weight 'w'"):
        type("Twice", (g.Layer,), {"a": g.Weight("w"), "b": g.Weight("w")})


def test_what_a_subclass_gets_wrong_at_build_or_save_says_how_to_fix_it(tmp_path):
    class Typo(g.Layer):
        k = g.Weight(initializer_arg="kernel_init")

        def __init__(self, kernel_initializer="zeros", **kw):
            super().__init__(**kw)
            self.kernel_initializer = kernel_initializer

        def make_params(self, shapes):
            return [self.k.spec((3, 3))]

    with pytest.raises(g.GgmlValueError, match="initializer_arg='kernel_init' names no attribute"):
        Typo().build([(3,)])

    class BadInit(Typo):
        k = g.Weight(initializer_arg="kernel_initializer")

    with pytest.raises(g.GgmlValueError, match="unknown initializer 'he_normall'"):
        BadInit(kernel_initializer="he_normall").build([(3,)])

    class Scales(g.Layer):
        def __init__(self, *factors, **kw):
            super().__init__(**kw)
            self.factors = factors

        def forward(self, build, xs, shapes):
            return xs[0]

    m = g.ggml_apply(g.ggml_model_sequential(), Scales(2.0, input_shape=(3,)))
    g.ggml_compile(m, loss="mse", metrics=[], backend="cpu")
    with pytest.raises(g.GgmlValueError, match="takes \\*args cannot be called again"):
        g.ggml_save_model(m, str(tmp_path / "s.gguf"))


def test_a_forward_that_disagrees_with_output_shape_or_a_missing_super_init_is_named():
    class Wrong(g.Layer):
        def output_shape(self, shapes):
            return (5,)

        def forward(self, build, xs, shapes):
            return xs[0]                          # (4,) samples, not (5,)

    class Nothing(g.Layer):
        def forward(self, build, xs, shapes):
            return None

    class NoSuper(g.Layer):
        def __init__(self, units, **kw):
            self.units = units

    for layer, kind, message in [(Wrong(input_shape=(4,)), g.GgmlValueError, "make output_shape agree"),
                                 (Nothing(input_shape=(4,)), g.GgmlTypeError, "forward returned NoneType")]:
        m = g.ggml_apply(g.ggml_model_sequential(), layer)
        with pytest.raises(kind, match=message):
            g.ggml_compile(m, loss="mse", metrics=[], backend="cpu")
            g.ggml_predict(m, np.ones((2, 4), np.float32))
    with pytest.raises(g.GgmlTypeError, match="did not call super\\(\\).__init__"):
        NoSuper(3)

