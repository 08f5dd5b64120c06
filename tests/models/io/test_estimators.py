"""GgmlClassifier and GgmlRegressor against scikit-learn's own checks, metrics and model-selection tools."""
from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

import ggmlpy as g


sklearn = pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install '.[test]')")
from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import NotFittedError  # noqa: E402
from sklearn.metrics import accuracy_score, r2_score  # noqa: E402
from sklearn.model_selection import cross_val_score, GridSearchCV  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402


def classifier_fn(units=16, n_classes=2, input_shape=(4,)):
    m = g.ggml_model_sequential()
    if len(input_shape) > 1:
        m = g.ggml_layer_flatten(m, input_shape=input_shape)
    m = g.ggml_layer_dense(m, units, activation="relu", input_shape=input_shape)
    return g.ggml_layer_dense(m, n_classes, activation="softmax")


def regressor_fn(n_outputs=1, input_shape=(3,)):
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 16, activation="tanh", input_shape=input_shape)
    return g.ggml_layer_dense(m, n_outputs)


def labelled(n=240, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return x, np.where(x[:, 0] + x[:, 1] > 0, "up", "down")


def test_classifier_learns_string_labels_and_scores_as_scikit_learn(tmp_path):
    x, y = labelled()
    clf = g.GgmlClassifier(classifier_fn, epochs=30, learning_rate=0.02, random_state=0).fit(x, y)
    assert list(clf.classes_) == ["down", "up"] and clf.n_features_in_ == 4
    pred = clf.predict(x)
    assert set(pred) <= {"down", "up"}
    assert clf.score(x, y) == pytest.approx(accuracy_score(y, pred)) and clf.score(x, y) > 0.9
    p = clf.predict_proba(x[:10])
    np.testing.assert_allclose(p.sum(axis=1), 1, rtol=1e-5)
    np.testing.assert_array_equal(clf.classes_[p.argmax(axis=1)], pred[:10])
    assert len(clf.history_) == 30


def test_regressor_fits_1d_and_2d_targets_and_reports_r2():
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (300, 3)).astype(np.float32)
    y = np.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2]
    reg = g.GgmlRegressor(regressor_fn, epochs=80, learning_rate=0.02, random_state=0).fit(x, y)
    pred = reg.predict(x)
    assert pred.shape == (300,) and pred.dtype == np.float64
    assert reg.score(x, y) == pytest.approx(r2_score(y, pred)) and reg.score(x, y) > 0.8
    two = np.stack([y, -y], axis=1)
    reg2 = g.GgmlRegressor(regressor_fn, epochs=5, random_state=0).fit(x, two)
    assert reg2.predict(x).shape == (300, 2)
    assert reg2.model_.layers[-1].units == 2  # the function got n_outputs=2


def test_a_function_that_compiles_its_model_keeps_its_settings():
    def compiled_fn(n_classes=2, input_shape=(4,)):
        return g.ggml_compile(classifier_fn(8, n_classes, input_shape), optimizer="sgd",
                              loss="sparse_categorical_crossentropy", backend="cpu", learning_rate=0.1)
    x, y = labelled(80)
    clf = g.GgmlClassifier(compiled_fn, epochs=2).fit(x, y)
    assert clf.model_.compiled.optimizer == "sgd"


@pytest.mark.parametrize("compile_kw", [{}, {"loss": "categorical_crossentropy"}])
def test_a_function_compiled_with_categorical_crossentropy_gets_one_hot_labels(compile_kw):
    """ggml_compile's default loss takes one-hot rows: the estimator encodes its class ids so (SciKeras' rule), and
    training with them equals a ggml_fit on the one-hot labels from the same start."""
    def compiled_fn(n_classes=3, input_shape=(4,)):
        return g.ggml_compile(classifier_fn(8, n_classes, input_shape), backend="cpu", learning_rate=0.05,
                              **compile_kw)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(90, 4)).astype(np.float32)
    y = np.array(["a", "b", "c"])[np.argmax(x[:, :3], axis=1)]
    clf = g.GgmlClassifier(compiled_fn, epochs=3, batch_size=30, random_state=5).fit(x, y)
    np.random.seed(5)
    ref = compiled_fn()
    h = g.ggml_fit(ref, x, np.eye(3, dtype=np.float32)[np.searchsorted(clf.classes_, y)], epochs=3, batch_size=30,
                   verbose=0)
    np.testing.assert_allclose(clf.history_["train_loss"], h["train_loss"], rtol=1e-5)
    for name, w in g.ggml_get_weights(ref).items():
        np.testing.assert_allclose(g.ggml_get_weights(clf.model_)[name], w, rtol=1e-5, atol=1e-6, err_msg=name)
    assert clf.predict_proba(x).shape == (90, 3)


def test_model_arguments_are_parameters_that_clone_and_grid_search_tune():
    x, y = labelled(120)
    clf = g.GgmlClassifier(classifier_fn, epochs=10, learning_rate=0.02, model__units=4, random_state=0)
    assert clf.get_params()["model__units"] == 4
    assert clone(clf).get_params() == clf.get_params()
    gs = GridSearchCV(clf, {"model__units": [2, 16], "epochs": [3, 10]}, cv=2).fit(x, y)
    assert set(gs.best_params_) == {"model__units", "epochs"}
    assert gs.best_estimator_.model_.layers[0].units == gs.best_params_["model__units"]


def test_in_a_pipeline_and_cross_validation():
    x, y = labelled(150)
    pipe = make_pipeline(StandardScaler(), g.GgmlClassifier(classifier_fn, epochs=15, learning_rate=0.02,
                                                           random_state=0))
    scores = cross_val_score(pipe, x * 10 + 3, y, cv=3)
    assert scores.shape == (3,) and scores.mean() > 0.8


def test_random_state_makes_fits_repeatable_and_a_fitted_estimator_pickles():
    x, y = labelled(100)
    a = g.GgmlClassifier(classifier_fn, epochs=3, random_state=5).fit(x, y)
    b = g.GgmlClassifier(classifier_fn, epochs=3, random_state=5).fit(x, y)
    np.testing.assert_array_equal(a.predict_proba(x), b.predict_proba(x))
    c = pickle.loads(pickle.dumps(a))
    np.testing.assert_array_equal(c.predict_proba(x), a.predict_proba(x))


def test_random_state_leaves_the_callers_random_stream_alone():
    x, y = labelled(100)
    np.random.seed(123)
    want = np.random.random(3)
    np.random.seed(123)
    g.GgmlClassifier(classifier_fn, epochs=1, random_state=5).fit(x, y)
    np.testing.assert_array_equal(np.random.random(3), want)


def test_dataframe_feature_names_are_checked_at_predict_as_scikit_learn_does():
    """Columns in another order at predict gave no error (about half the predictions agreed): scikit-learn's
    estimators refuse feature names that differ from fit's, and warn (predicting all the same) on an array without
    names."""
    pd = pytest.importorskip("pandas")
    x, y = labelled(120)
    df = pd.DataFrame(x, columns=["a", "b", "c", "d"])
    clf = g.GgmlClassifier(classifier_fn, epochs=2, random_state=0).fit(df, y)
    assert list(clf.feature_names_in_) == ["a", "b", "c", "d"]
    with pytest.warns(UserWarning, match="does not have valid feature names"):   # scikit-learn's own warning
        plain = clf.predict(x)
    np.testing.assert_array_equal(clf.predict(df), plain)
    with pytest.raises(ValueError, match="feature names should match"):
        clf.predict(df[["d", "c", "b", "a"]])


def test_sample_weight_reaches_the_fit_and_weighs_the_loss():
    """fit(X, y, sample_weight=) was a bare TypeError. Weights of 0 on half the samples train as the other half
    alone."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (64, 3)).astype(np.float32)
    y = x @ np.array([1.0, -2.0, 0.5], dtype=np.float32)
    w = np.r_[np.ones(32), np.zeros(32)].astype(np.float32)
    args = dict(epochs=3, batch_size=32, learning_rate=0.02, random_state=0, optimizer="sgd")
    weighted = g.GgmlRegressor(regressor_fn, **args).fit(x, y, sample_weight=w)
    assert len(weighted.history_) == 3 and np.isfinite(weighted.predict(x)).all()
    with pytest.raises(ValueError, match="sample_weight"):
        g.GgmlRegressor(regressor_fn, **args).fit(x, y, sample_weight=np.ones(5))


def test_misuse_says_what_is_wrong():
    x, y = labelled(40)
    with pytest.raises(NotFittedError):
        g.GgmlClassifier(classifier_fn).predict(x)
    with pytest.raises(g.GgmlTypeError, match="unknown argument"):
        g.GgmlClassifier(classifier_fn, units=3).fit(x, y)      # a model argument without model__
    with pytest.raises(g.GgmlTypeError, match="must be a function"):
        g.GgmlClassifier(None).fit(x, y)
    with pytest.raises(g.GgmlTypeError, match="not a ggmlpy model"):
        g.GgmlClassifier(lambda n_classes=2, input_shape=(4,): "a model").fit(x, y)
    with pytest.raises(ValueError, match="one class"):
        g.GgmlClassifier(classifier_fn).fit(x, np.zeros(40))
    with pytest.raises(ValueError, match="Unknown label type"):
        g.GgmlClassifier(classifier_fn).fit(x, np.linspace(0, 1, 40))
    clf = g.GgmlClassifier(classifier_fn, epochs=1).fit(x, y)
    with pytest.raises(ValueError, match="X has 3 features, but GgmlClassifier is expecting 4"):
        clf.predict(x[:, :3])


@pytest.mark.parametrize("make", [
    lambda: g.GgmlClassifier(classifier_fn, epochs=60, learning_rate=0.05, random_state=0),
    lambda: g.GgmlRegressor(regressor_fn, epochs=60, learning_rate=0.05, random_state=0),
], ids=["classifier", "regressor"])
def test_scikit_learns_estimator_checks_pass(make):
    from sklearn.utils.estimator_checks import check_estimator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # minibatch training: a weight of 2 scales one sample's loss, a repeated sample changes the batches too
        results = check_estimator(make(), on_fail=None, expected_failed_checks={
            "check_sample_weight_equivalence_on_dense_data": "stochastic minibatch training (as Keras' SGD): "
                                                             "weights are not equivalent to repeated samples"})
    failed = [(r["check_name"], str(r["exception"])[:200]) for r in results if r["status"] == "failed"]
    assert not failed, failed
    assert len(results) > 40


def test_builtin_callbacks_start_afresh_in_every_fit_and_clone():
    """A reused early stopping kept the best loss of the fit before (ggmlR's closures), so a second fit, or the next
    GridSearchCV candidate, stopped at once; the estimator remakes ggmlpy's built-ins for each fit, and a clone
    (a deep copy) or a pickle makes them again from their arguments."""
    import copy
    x, y = labelled(120)
    stop = g.ggml_callback_early_stopping(monitor="loss", patience=1)
    clf = g.GgmlClassifier(classifier_fn, epochs=6, learning_rate=0.02, callbacks=[stop], random_state=0)
    first = len(clf.fit(x, y).history_)
    assert first == 6   # the training loss falls every epoch: no stop
    assert len(clf.fit(x, y).history_) == first
    assert len(clone(clf).fit(x, y).history_) == first
    # the shared object itself keeps ggmlR's rule: reused directly, its state carries over
    m = g.ggml_compile(classifier_fn(), loss="sparse_categorical_crossentropy", backend="cpu", learning_rate=0.02)
    g.ggml_fit(m, x, (y == "up").astype(int), epochs=3, verbose=0, callbacks=[stop])
    fresh = copy.deepcopy(stop)
    assert fresh is not stop and fresh["on_epoch_end"] is not stop["on_epoch_end"]
    assert type(pickle.loads(pickle.dumps(stop))) is type(stop)


def test_the_estimators_are_in_dir_of_ggmlpy():
    """They load on first use (scikit-learn is optional), and were missing from dir(ggmlpy) and tab completion."""
    assert {"GgmlClassifier", "GgmlRegressor"} <= set(dir(g))
    assert "GgmlClassifier" not in g.__all__   # `from ggmlpy import *` never needs scikit-learn


def test_scikeras_routing_reaches_the_model_function_compile_and_fit():
    """SciKeras' conventions (optimizer__learning_rate, loss=, fit__..., a build function taking meta) were refused
    or ignored."""
    x, y = labelled(64)
    seen = {}

    def build(meta, units=8):
        seen.update(meta)
        m = g.ggml_model_sequential()
        m = g.ggml_layer_dense(m, units, activation="relu", input_shape=(meta["n_features_in_"],))
        return g.ggml_layer_dense(m, meta["n_classes_"], activation="softmax")
    clf = g.GgmlClassifier(build, epochs=2, optimizer="sgd", optimizer__learning_rate=0.05, optimizer__momentum=0.9,
                           loss="categorical_crossentropy", fit__shuffle=False, model__units=4, random_state=0)
    clf.fit(x, y)
    assert seen["n_features_in_"] == 4 and seen["n_classes_"] == 2 and seen["X_shape_"] == (64, 4)
    assert list(seen["classes_"]) == ["down", "up"] and seen["target_type_"] == "binary"
    cfg = clf.model_.compiled
    assert cfg.optimizer_spec.name == "sgd" and cfg.learning_rate == pytest.approx(0.05)
    assert cfg.heads[0].loss == "categorical_crossentropy"
    assert clone(clf).get_params()["optimizer__momentum"] == 0.9
    with pytest.raises(TypeError, match="SciKeras' prefixes route the others"):
        g.GgmlClassifier(build, epochs=1, verbose__level=3).fit(x, y)


def test_precision_reaches_the_compile_and_is_a_tunable_parameter():
    """``precision`` is ggml_compile's (mixed precision), a constructor parameter like the others: cloned, and
    named in the warning when the model function compiled its own model (which keeps its compile's)."""
    x, y = labelled()
    clf = g.GgmlClassifier(classifier_fn, epochs=3, precision="bf16", random_state=0).fit(x, y)
    assert clf.model_.compiled.precision == "bf16" and clf.get_params()["precision"] == "bf16"
    assert clone(clf).get_params()["precision"] == "bf16"
    assert g.GgmlClassifier(classifier_fn, epochs=1).fit(x, y).model_.compiled.precision == "f32"

    def compiled_fn():
        return g.ggml_compile(classifier_fn(), loss="sparse_categorical_crossentropy", backend="cpu")
    with pytest.warns(g.GgmlpyWarning, match="settings precision are not used"):
        kept = g.GgmlClassifier(compiled_fn, epochs=1, precision="bf16").fit(x, y)
    assert kept.model_.compiled.precision == "f32"
