"""The model layer's data rule (models/engine/inputs.py): what is refused before it can train on wrong values, and
the Keras forms that are accepted."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g


def _classifier(lr=0.05, optimizer="adam"):
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 6, activation="tanh", input_shape=(4,))
    m = g.ggml_layer_dense(m, 3, activation="softmax")
    return g.ggml_compile(m, optimizer=optimizer, backend="cpu", learning_rate=lr)


def _data(n=24):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)]


@pytest.mark.parametrize("bad, text", [(np.nan, "it is nan"), (np.inf, "it is inf"), (1e300, "beyond float32")])
def test_training_inputs_must_be_finite_and_nothing_trains(bad, text):
    """One NaN input made every weight NaN after the first step (the error came after the damage)."""
    m = _classifier()
    x, y = _data()
    x = x.astype(np.float64)
    x[5, 1] = bad
    before = g.ggml_get_weights(m)
    with pytest.raises(ValueError, match=text):
        g.ggml_fit(m, x, y, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"\(5, 1\)"):
        g.ggml_trainer(m, batch_size=24).step(x, y)
    with pytest.raises(ValueError, match=text):
        g.ggml_fit_generator(m, [(x, y)], verbose=0)
    after = g.ggml_get_weights(m)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_predict_refuses_values_float32_cannot_hold_but_passes_nan():
    m = _classifier()
    x, _ = _data()
    big = x.astype(np.float64)
    big[0, 0] = 1e300
    with pytest.raises(ValueError, match="beyond float32's range"):
        g.ggml_predict(m, big)
    nan = x.copy()
    nan[0, 0] = np.nan
    p = g.ggml_predict(m, nan)                   # a NaN row predicts NaN, the others as always
    assert np.isnan(p[0]).all() and np.array_equal(p[1:], g.ggml_predict(m, x)[1:])


def test_sample_weights_and_learning_rates_must_fit_float32():
    m = _classifier()
    x, y = _data()
    with pytest.raises(ValueError, match="beyond float32's range"):
        g.ggml_fit(m, x, y, sample_weight=np.full(24, 1e39), verbose=0)
    for lr in (1e300, 1e-300, np.inf, np.nan, 0.0):
        with pytest.raises(ValueError, match="float32"):
            g.ggml_compile(m, backend="cpu", learning_rate=lr)
    tr = g.ggml_trainer(m, batch_size=24)
    for lr in (1e300, 1e-300):
        with pytest.raises(ValueError, match="float32"):
            tr.set_lr(lr)
    tr.set_lr(np.float32(0.01))                  # numpy scalars are numbers
    assert tr.get_lr() == pytest.approx(0.01)
    tr.free()


def test_numpy_scalars_are_accepted_as_numbers():
    m = _classifier()
    x, y = _data()
    h = g.ggml_fit(m, x, y, epochs=1, verbose=0, validation_split=np.float32(0.25),
                   class_weight={np.int64(0): np.float32(2.0)})
    assert len(h) == 1 and np.isfinite(h["val_loss"]).all()
    with pytest.raises(ValueError, match="validation_split"):
        g.ggml_fit(m, x, y, validation_split=[], verbose=0)


def test_class_ids_far_out_of_range_are_named_as_given():
    m = g.ggml_compile(_classifier(), loss="sparse_categorical_crossentropy", backend="cpu")
    x, _ = _data()
    with pytest.raises(ValueError, match=r"class id 1e\+30 is outside \[0, 3\)"):
        g.ggml_fit(m, x, np.full(24, 1e30), verbose=0)


def test_missing_labels_say_so():
    m = _classifier()
    x, _ = _data()
    with pytest.raises(ValueError, match="y is missing"):
        g.ggml_evaluate(m, x, None)


def test_one_array_lists_are_the_arrays_for_a_one_input_model():
    """Keras' ``fit(model, [x], [y])`` for a model of one input and one output."""
    x, y = _data()
    a, b = _classifier(), _classifier()
    np.random.seed(1)
    ha = g.ggml_fit(a, x, y, epochs=2, verbose=0, shuffle=False)
    hb = g.ggml_fit(b, [x], [y], epochs=2, verbose=0, shuffle=False)
    np.testing.assert_array_equal(ha["train_loss"], hb["train_loss"])
    np.testing.assert_array_equal(g.ggml_predict(a, [x]), g.ggml_predict(a, x))


def test_predict_takes_zero_samples():
    m = _classifier()
    empty = np.zeros((0, 4), np.float32)
    assert g.ggml_predict(m, empty).shape == (0, 3)
    assert g.ggml_predict_classes(m, empty).shape == (0,)


def test_sample_weighted_fits_report_their_accuracy():
    """The weighted loss is built from ggml ops (no ggml accuracy): the fit counts it from the logits. With a
    learning rate too small to change an argmax, it is the accuracy of the model before the fit."""
    m = _classifier(lr=1e-9, optimizer="sgd")
    x, y = _data()
    expected = float(np.mean(g.ggml_predict_classes(m, x) == y.argmax(axis=1)))
    h = g.ggml_fit(m, x, y, epochs=1, batch_size=24, verbose=0, sample_weight=np.linspace(0.5, 2, 24))
    assert h["train_accuracy"].iloc[0] == pytest.approx(expected)


def test_callbacks_must_take_epoch_logs_and_state():
    m = _classifier()
    x, y = _data()
    with pytest.raises(TypeError, match=r"called as f\(epoch, logs, state\)"):
        g.ggml_fit(m, x, y, verbose=0, callbacks=[{"on_epoch_end": lambda: None}])
    seen = []
    g.ggml_fit(m, x, y, verbose=0, callbacks=[{"on_epoch_end": lambda *args: seen.append(len(args))}])
    assert seen == [3]


def test_generator_validation_arrays_for_a_two_input_model():
    np.random.seed(0)
    a, b = g.ggml_input((3,)), g.ggml_input((2,))
    out = g.ggml_layer_dense(g.ggml_layer_concatenate([a, b]), 1)
    m = g.ggml_compile(g.ggml_model([a, b], out), loss="mse", backend="cpu")
    rng = np.random.default_rng(0)
    xa, xb, y = rng.normal(size=(8, 3)), rng.normal(size=(8, 2)), rng.normal(size=(8, 1))
    h = g.ggml_fit_generator(m, [([xa, xb], y)], epochs=1, verbose=0, validation_data=([xa, xb], y))
    assert h["val_loss"].iloc[0] == pytest.approx(g.ggml_evaluate(m, [xa, xb], y)["loss"], rel=1e-5)


def test_predicted_classes_of_a_sequence_output_are_per_position():
    """The argmax was taken over a flattened (steps x classes) sample: ids up to steps*classes-1, one per sample."""
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_embedding(m, 6, 4, input_shape=(5,))
    m = g.ggml_compile(g.ggml_layer_dense(m, 6, activation="softmax"), loss="sparse_categorical_crossentropy",
                       backend="cpu")
    ids = np.random.default_rng(0).integers(0, 6, (3, 5)).astype(np.int32)
    p = g.ggml_predict(m, ids)
    classes = g.ggml_predict_classes(m, ids)
    assert classes.shape == (3, 5)
    np.testing.assert_array_equal(classes, p.argmax(axis=-1))


def test_binary_crossentropy_on_outputs_that_are_not_probabilities():
    """Without a sigmoid the outputs leave [0, 1]: the loss is NaN. ggml_evaluate says so without a numpy
    warning; a trainer step raises naming the usual cause instead of returning NaN."""
    import warnings
    np.random.seed(0)
    m = g.ggml_model_sequential()
    with pytest.warns(g.GgmlpyWarning, match="sigmoid"):
        m = g.ggml_compile(g.ggml_layer_dense(m, 1, input_shape=(3,)), loss="binary_crossentropy", backend="cpu")
    rng = np.random.default_rng(0)
    x, y = rng.normal(0, 3, size=(32, 3)).astype(np.float32), rng.integers(0, 2, (32, 1)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert np.isnan(g.ggml_evaluate(m, x, y)["loss"])
    with pytest.raises(ValueError, match="end the model in a sigmoid"):
        g.ggml_trainer(m, batch_size=32).step(x, y)


# ---------------------------------------------------------------- data numpy would convert silently

@pytest.mark.parametrize("make, text", [
    (lambda x: (x * 1000).astype("timedelta64[ms]"), "dates or durations"),
    (lambda x: np.datetime64("2026-01-01") + (x * 10).astype("timedelta64[D]"), "dates or durations"),
    (lambda x: np.ma.masked_array(x, mask=x > 0.9), "masked values"),
])
def test_times_and_masked_values_are_refused_not_converted(make, text):
    m = _classifier()
    x, y = _data()
    bad = make(x)
    for call in (lambda: g.ggml_fit(m, bad, y, epochs=1, batch_size=8, verbose=0), lambda: g.ggml_predict(m, bad)):
        with pytest.raises(g.GgmlTypeError, match=text):
            call()


def test_a_masked_array_without_masked_values_is_plain_data():
    m = _classifier()
    x, _ = _data()
    np.testing.assert_array_equal(g.ggml_predict(m, np.ma.masked_array(x)), g.ggml_predict(m, x))


@pytest.mark.parametrize("value, error, text", [
    (1e39, g.GgmlValueError, "would become inf"),
    (1 + 2j, g.GgmlTypeError, "complex"),
    ("a", g.GgmlTypeError, "numeric"),
])
def test_set_weights_checks_values_as_loading_does_and_writes_nothing_on_refusal(value, error, text):
    m = _classifier()
    w = g.ggml_get_weights(m)
    first, second = list(w)[:2]
    with pytest.raises(error, match=text):
        g.ggml_set_weights(m, {first: w[first] * 0, second: np.full(w[second].shape, value)})
    after = g.ggml_get_weights(m)
    assert all(np.array_equal(after[k], w[k]) for k in w)  # nothing written, the good one neither


def _frame(**columns):
    import pandas as pd
    return pd.DataFrame({"a": 0.5, "b": 1.0, "c": 2.0, "d": 3.0, **columns}, index=range(24))


@pytest.mark.parametrize("make_x, text", [
    (lambda x: (row for row in x), "generator, an iterator: .*ggml_fit_generator"),
    (lambda x: [{"a": 1.0}] * len(x), "a list of dicts .*pd.DataFrame"),
    (lambda x: _frame(a=__import__("pandas").Categorical(list("ab") * 12)),
     r"column 'a' of categories: .*pd.get_dummies"),
    (lambda x: _frame(a=__import__("pandas").array([1, None] * 12, dtype="Int64")),
     r"column 'a' with 12 missing values \(pd.NA\)"),
    (lambda x: _frame(a=["x", "y"] * 12), r"column 'a' of str values \('x'\)"),
    (lambda x: _frame(a=__import__("pandas").Series([1.0] * 24, dtype=object), b=["x"] * 24),
     r"column 'b' of str values"),                     # not the object column of numbers before it
    (lambda x: _frame(a=__import__("pandas").array(list(range(24)), dtype="Int64")),
     r"column 'a' of pandas' nullable type Int64.*astype\('float32'\)"),
    (lambda x: _frame(a=__import__("pandas").to_datetime(["2020-01-01"] * 24)), r"column 'a' of dates or durations"),
])
def test_data_numpy_reads_as_objects_is_named_the_users_way(make_x, text):
    """These were all reported as 'got dtype object', the type numpy made of them."""
    m = _classifier()
    x, y = _data()
    with pytest.raises(g.GgmlTypeError, match=text):
        g.ggml_fit(m, make_x(x), y, epochs=1, verbose=0)


def test_string_categories_as_labels_say_to_use_codes():
    import pandas as pd
    m = _classifier()
    x, _ = _data()
    with pytest.raises(g.GgmlTypeError, match=r"pandas categories: use their integer codes \(.codes\)"):
        g.ggml_fit(m, x, pd.Categorical(list("abc") * 8), epochs=1, verbose=0)


def test_one_hot_frames_of_bool_columns_train():
    """pd.get_dummies makes bool columns: they are numbers 0/1, not refused."""
    import pandas as pd
    m = _classifier()
    x, _ = _data()
    y = pd.get_dummies(pd.Series(list("abc") * 8))
    assert y.dtypes.iloc[0] == np.dtype(bool)
    hist = g.ggml_fit(m, x, y, epochs=1, verbose=0)
    assert np.isfinite(hist["train_loss"]).all()


@pytest.mark.parametrize("source", ["tuple", "list", "array", "frame"])
def test_fit_generator_given_arrays_says_to_use_ggml_fit(source):
    import pandas as pd
    m = _classifier()
    x, y = _data()
    given = {"tuple": (x, y), "list": [x, y], "array": x, "frame": pd.DataFrame(x)}[source]
    with pytest.raises(g.GgmlTypeError, match=r"expected a source of batches .*use ggml_fit\(model, x, y"):
        g.ggml_fit_generator(m, given, steps_per_epoch=2, verbose=0)
    # a list of (x, y) batches is a source of batches and trains
    hist = g.ggml_fit_generator(m, [(x[:12], y[:12]), (x[12:], y[12:])], epochs=1, verbose=0)
    assert len(hist) == 1


def test_losses_as_a_dict_by_output_name():
    """Keras' dict form: the same training as the list form in output order."""
    def two_heads():
        np.random.seed(0)
        x = g.ggml_input((4,))
        h = g.ggml_layer_dense(x, 6, activation="tanh", name="body")
        return g.ggml_model(x, [g.ggml_layer_dense(h, 3, activation="softmax", name="cls"),
                                g.ggml_layer_dense(h, 1, name="reg")])
    x, y = _data()
    r = np.random.default_rng(1).normal(size=(24, 1)).astype(np.float32)
    as_list = g.ggml_compile(two_heads(), loss=["categorical_crossentropy", "mse"], loss_weights=[1.0, 0.5],
                             backend="cpu")
    as_dict = g.ggml_compile(two_heads(), loss={"reg": "mse", "cls": "categorical_crossentropy"},
                             loss_weights={"cls": 1.0, "reg": 0.5}, backend="cpu")
    h1 = g.ggml_fit(as_list, x, [y, r], epochs=2, batch_size=8, verbose=0, shuffle=False)
    h2 = g.ggml_fit(as_dict, x, [y, r], epochs=2, batch_size=8, verbose=0, shuffle=False)
    np.testing.assert_allclose(h2["train_loss"], h1["train_loss"], rtol=1e-6)
    with pytest.raises(g.GgmlValueError,
                       match=r"a dict is keyed by the names of the model's output layers \['cls', 'reg'\]"):
        g.ggml_compile(two_heads(), loss={"cls": "mse", "box": "mse"}, backend="cpu")
    with pytest.raises(g.GgmlValueError, match=r"the output\(s\) \['reg'\] have none"):
        g.ggml_compile(two_heads(), loss={"cls": "mse"}, backend="cpu")


def test_an_argument_the_function_lacks_is_named_with_the_functions_arguments():
    """It was 'an argument has the wrong kind ... if the arguments match it, this is a bug in ggmlpy'."""
    with pytest.raises(g.GgmlTypeError, match=r"unexpected keyword argument 'start_from_epoch' \(its arguments: "
                                              r"monitor, patience, min_delta, mode, restore_best_weights") as info:
        g.ggml_callback_early_stopping(start_from_epoch=3)
    assert "bug in ggmlpy" not in str(info.value)
    with pytest.raises(g.GgmlTypeError, match="missing a required argument: 'x'"):
        g.ggml_predict(_classifier())
    # layer functions list the layer's own arguments (they pass **kwargs on to the layer class)
    with pytest.raises(g.GgmlTypeError, match=r"'activaton' \(its arguments: model_or_node, units, activation, "
                                              r"use_bias, kernel_initializer, bias_initializer, input_dim, name, "
                                              r"trainable, input_shape"):
        g.ggml_layer_dense(g.ggml_model_sequential(), 3, activaton="relu")
    with pytest.raises(g.GgmlTypeError, match=r"'groups' \(its arguments: model_or_node, filters, kernel_size"):
        g.ggml_layer_conv_2d(g.ggml_input((8, 8, 1)), 4, 3, groups=2)


def test_inputs_and_labels_as_dicts_by_layer_name():
    """Keras' dict forms: fit, evaluate, predict, a generator's batches and validation_data keyed by the names of
    the input and output layers train and evaluate exactly as the lists in the model's order."""
    def two_by_two():
        np.random.seed(12)
        a, b = g.ggml_input(shape=(3,), name="a"), g.ggml_input(shape=(2,), name="b")
        h = g.ggml_layer_concatenate([g.ggml_layer_dense(a, 4, activation="tanh"), b])
        m = g.ggml_model([a, b], [g.ggml_layer_dense(h, 3, activation="softmax", name="cls"),
                                  g.ggml_layer_dense(h, 1, name="reg")])
        return g.ggml_compile(m, loss=["sparse_categorical_crossentropy", "mse"], backend="cpu", metrics=["mae"])
    rng = np.random.default_rng(5)
    xa, xb = rng.normal(size=(24, 3)).astype(np.float32), rng.normal(size=(24, 2)).astype(np.float32)
    ids, r = rng.integers(0, 3, 24), rng.normal(size=(24, 1)).astype(np.float32)
    x_dict, y_dict = {"b": xb, "a": xa}, {"reg": r, "cls": ids}
    as_list, as_dict = two_by_two(), two_by_two()
    h1 = g.ggml_fit(as_list, [xa, xb], [ids, r], epochs=2, batch_size=8, shuffle=False, verbose=0,
                    validation_data=([xa, xb], [ids, r]))
    h2 = g.ggml_fit(as_dict, x_dict, y_dict, epochs=2, batch_size=8, shuffle=False, verbose=0,
                    validation_data=(x_dict, y_dict))
    np.testing.assert_allclose(h2["train_loss"], h1["train_loss"], rtol=1e-6)
    np.testing.assert_allclose(h2["val_loss"], h1["val_loss"], rtol=1e-6)
    got, want = g.ggml_evaluate(as_dict, x_dict, y_dict), g.ggml_evaluate(as_list, [xa, xb], [ids, r])
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[k] for k in got], [want[k] for k in got], rtol=1e-6)  # NaN where both are
    for got, want in zip(g.ggml_predict(as_dict, x_dict), g.ggml_predict(as_list, [xa, xb])):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    batches = [({"a": xa[i:i + 8], "b": xb[i:i + 8]}, {"cls": ids[i:i + 8], "reg": r[i:i + 8]}) for i in (0, 8, 16)]
    h3 = g.ggml_fit_generator(two_by_two(), batches, epochs=2, verbose=0)
    np.testing.assert_allclose(h3["train_loss"], h1["train_loss"], rtol=1e-6)
    with pytest.raises(g.GgmlValueError, match=r"x: a dict is keyed by the names of the model's input layers "
                                               r"\['a', 'b'\]; \['c'\] name no input"):
        g.ggml_predict(as_dict, {"a": xa, "c": xb})
    with pytest.raises(g.GgmlValueError, match=r"the output\(s\) \['reg'\] have none"):
        g.ggml_evaluate(as_dict, x_dict, {"cls": ids})


def test_a_one_input_model_takes_its_input_by_name_too():
    m = _classifier()
    x, y = _data()
    name = m.graph()[0][0].layer.name
    np.testing.assert_allclose(g.ggml_predict(m, {name: x}), g.ggml_predict(m, x), rtol=1e-6)
    with pytest.raises(g.GgmlValueError, match=rf"\['pixels'\] name no input of the model.*\['{name}'\]|"
                                               rf"\['{name}'\]; \['pixels'\] name no input"):
        g.ggml_fit(m, {"pixels": x}, y, epochs=1, verbose=0)


def test_class_ids_under_the_default_loss_say_the_loss_was_the_default():
    """A recompile for another backend (or a first compile) without loss= trains categorical cross-entropy; class ids
    then were refused without saying the loss was only the default."""
    x = np.zeros((8, 4), np.float32)
    ids = np.arange(8) % 2

    def model(**kw):
        m = g.ggml_model_sequential()
        m = g.ggml_layer_dense(m, 2, activation="softmax", input_shape=(4,))
        return g.ggml_compile(m, backend="cpu", **kw)
    with pytest.raises(g.GgmlValueError, match="ggml_compile's default loss.*loss='sparse_categorical_crossentropy'"):
        g.ggml_fit(model(), x, ids, verbose=0)
    with pytest.raises(g.GgmlValueError) as given:
        g.ggml_fit(model(loss="categorical_crossentropy"), x, ids, verbose=0)
    assert "default" not in str(given.value) and "sparse_categorical_crossentropy" in str(given.value)
    g.ggml_fit(model(loss="sparse_categorical_crossentropy"), x, ids, verbose=0)


def test_one_sample_without_its_axis_gets_the_hint():
    x = np.zeros((5, 4), np.float32)
    m = g.ggml_model_sequential()
    m = g.ggml_compile(g.ggml_layer_dense(m, 2, input_shape=(4,)), loss="mse", backend="cpu")
    with pytest.raises(g.GgmlValueError, match=r"one sample without the samples axis: pass arr\[None\]"):
        g.ggml_predict(m, x[0])
    assert g.ggml_predict(m, x[0][None]).shape == (1, 2)
