"""Keras' metrics (``ggml_compile(metrics=)``): each formula against scikit-learn's metrics or an independent
numpy computation, the training steps' values against the same metric on the model's predictions, the call
forms (lists, lists per output, dicts by output name), saving, callbacks, and the misuse that is refused."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.models.engine.metrics import metric_spec
from ggmlpy.training.callbacks import monitor_mode


sk = pytest.importorskip("sklearn.metrics", reason="scikit-learn (a test extra) gives the reference metrics")


def streamed(spec, probs, labels, classes=1, values=None, batch=37):
    """The metric of ``probs`` fed in batches (the streaming sums must not depend on the batching)."""
    state = (metric_spec(spec) if isinstance(spec, str) else spec).state()
    values = probs if values is None else values
    for i in range(0, len(probs), batch):
        state.update(probs[i:i + batch], values[i:i + batch], labels[i:i + batch], classes)
    return state.result()


@pytest.fixture
def scores():
    rng = np.random.default_rng(7)
    y = (rng.random(3000) < 0.35).astype(np.float32)
    p = np.clip(0.35 * y + 0.65 * rng.random(3000), 0, 1).astype(np.float32)
    return p, y


def test_roc_auc_is_exact_when_every_threshold_separates_the_scores():
    # scores at the middle of Keras' 200 buckets: the ROC points at the thresholds are all of them
    rng = np.random.default_rng(1)
    thresholds = np.linspace(0, 1, 199)
    p = ((thresholds[:-1] + thresholds[1:]) / 2)[rng.integers(0, 198, 2000)]
    y = (rng.random(2000) < p).astype(np.float32)
    assert streamed("auc", p, y) == pytest.approx(sk.roc_auc_score(y, p), abs=1e-12)


def test_roc_auc_of_continuous_scores_is_within_the_bucketing_error(scores):
    p, y = scores
    assert streamed("auc", p, y) == pytest.approx(sk.roc_auc_score(y, p), abs=1e-3)
    fine = g.ggml_metric_auc(num_thresholds=20000)
    assert streamed(fine, p, y) == pytest.approx(sk.roc_auc_score(y, p), abs=2e-5)


def test_pr_auc_is_the_integral_of_the_interpolated_curve(scores):
    # Davis and Goadrich: between thresholds, true positives grow linearly with the predicted positives;
    # integrate precision over recall along those lines numerically
    p, y = scores
    n = 50
    t = np.array([-1e-7, *[(i + 1) / (n - 1) for i in range(n - 2)], 1 + 1e-7])
    tp = np.array([((p > th) & (y == 1)).sum() for th in t], dtype=np.float64)
    fp = np.array([((p > th) & (y == 0)).sum() for th in t], dtype=np.float64)
    area = 0.0
    for i in range(n - 1):
        if tp[i] == tp[i + 1]:
            continue   # no recall gained
        s = np.linspace(0, 1, 4001)
        pos = (tp[i + 1] + fp[i + 1]) + s * ((tp[i] + fp[i]) - (tp[i + 1] + fp[i + 1]))
        tps = tp[i + 1] + s * (tp[i] - tp[i + 1])
        # towards no predicted positive the line's precision tends to its slope
        slope = (tp[i] - tp[i + 1]) / ((tp[i] + fp[i]) - (tp[i + 1] + fp[i + 1]))
        prec = np.where(pos > 0, tps / np.maximum(pos, 1e-300), slope)
        rec = tps / y.sum()
        area += np.trapezoid(prec, rec) if hasattr(np, "trapezoid") else np.trapz(prec, rec)
    got = streamed(g.ggml_metric_auc(num_thresholds=n, curve="PR"), p, y)
    assert got == pytest.approx(area, rel=1e-6)
    assert got == pytest.approx(sk.average_precision_score(y, p), abs=0.02)  # the same quantity, roughly


@pytest.mark.parametrize("name, reference", [
    ("precision", lambda y, p: sk.precision_score(y, p > 0.5)),
    ("recall", lambda y, p: sk.recall_score(y, p > 0.5)),
    ("true_positives", lambda y, p: sk.confusion_matrix(y, p > 0.5)[1, 1]),
    ("false_positives", lambda y, p: sk.confusion_matrix(y, p > 0.5)[0, 1]),
    ("true_negatives", lambda y, p: sk.confusion_matrix(y, p > 0.5)[0, 0]),
    ("false_negatives", lambda y, p: sk.confusion_matrix(y, p > 0.5)[1, 0]),
    ("mae", sk.mean_absolute_error), ("mse", sk.mean_squared_error),
    ("rmse", lambda y, p: math.sqrt(sk.mean_squared_error(y, p))),
])
def test_threshold_and_error_metrics_match_scikit_learn(scores, name, reference):
    p, y = scores
    want = float(reference(y.astype(np.float64), p.astype(np.float64)))
    assert streamed(name, p, y) == pytest.approx(want, rel=1e-9)


def test_precision_of_a_softmax_counts_every_class_of_every_sample():
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.ones(4) * 0.3, size=500)
    onehot = np.eye(4)[rng.integers(0, 4, 500)]
    want = sk.precision_score(onehot.ravel(), probs.ravel() > 0.3)   # Keras' micro-average over the elements
    assert streamed(g.ggml_metric_precision(0.3), probs, onehot, classes=4) == pytest.approx(want, rel=1e-12)
    assert streamed("precision", np.zeros((5, 4)), onehot[:5], classes=4) == 0.0  # nothing predicted positive


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_accuracy_matches_scikit_learn(k):
    rng = np.random.default_rng(k)
    probs = rng.dirichlet(np.ones(6), size=400)
    ids = rng.integers(0, 6, 400)
    got = streamed(g.ggml_metric_top_k_accuracy(k), probs, np.eye(6)[ids], classes=6)
    assert got == pytest.approx(sk.top_k_accuracy_score(ids, probs, k=k, labels=range(6)), abs=1e-12)


# ---------------------------------------------------------------- in fits

def binary_model(metrics, optimizer="adam", learning_rate=0.01, backend="cpu"):
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 8, activation="tanh", input_shape=(4,))
    m = g.ggml_layer_dense(m, 1, activation="sigmoid")
    return g.ggml_compile(m, optimizer=optimizer, loss="binary_crossentropy", metrics=metrics, backend=backend,
                          learning_rate=learning_rate)


@pytest.fixture
def data():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(320, 4)).astype(np.float32)
    y = (x[:, 0] - 0.7 * x[:, 2] + 0.5 * rng.normal(size=320) > 0).astype(np.float32)
    return x, y


def test_validation_metrics_are_those_of_the_predictions(data):
    x, y = data
    m = binary_model(["accuracy", "auc", "precision", "recall", "mse"])
    h = g.ggml_fit(m, x[:256], y[:256], epochs=3, batch_size=32, validation_data=(x[256:], y[256:]), verbose=0)
    for col in ("train_auc", "val_auc", "train_precision", "val_precision", "train_recall", "val_recall",
                "train_mse", "val_mse"):
        assert col in h.columns and np.isfinite(h[col]).all()
    p = g.ggml_predict(m, x[256:]).ravel()
    last = h.iloc[-1]
    assert last["val_auc"] == pytest.approx(sk.roc_auc_score(y[256:], p), abs=2e-3)
    assert last["val_precision"] == pytest.approx(sk.precision_score(y[256:], p > 0.5), abs=1e-6)
    assert last["val_recall"] == pytest.approx(sk.recall_score(y[256:], p > 0.5), abs=1e-6)
    assert last["val_mse"] == pytest.approx(sk.mean_squared_error(y[256:], p), rel=1e-5)
    ev = g.ggml_evaluate(m, x[256:], y[256:])
    assert ev["auc"] == pytest.approx(last["val_auc"], abs=1e-9) and ev["mse"] == pytest.approx(last["val_mse"])
    assert g.ggml_evaluate(m, x[256:], y[256:], return_dict=False) == \
        pytest.approx([ev["loss"], ev["accuracy"], ev["auc"], ev["precision"], ev["recall"], ev["mse"]])


@pytest.mark.parametrize("backend", ["cpu", "vulkan"])
def test_training_metrics_are_those_of_each_steps_outputs(data, backend):
    # an SGD step of 1e-9 leaves the predictions as they were: the epoch's training metrics are then those
    # of the model's predictions on the training set, computed by scikit-learn
    if backend == "vulkan" and ("vulkan" not in g.ggml_backends_built()
                                or g.ggml_backend_dev_by_name("Vulkan0") is None):
        pytest.skip("no Vulkan0 device (the vulkan backend not built, or no Vulkan driver: Mesa's lavapipe in CI)")
    x, y = data
    m = binary_model(["auc", "recall", "mae"], optimizer="sgd", learning_rate=1e-9, backend=backend)
    p = g.ggml_predict(m, x).ravel()
    h = g.ggml_fit(m, x, y, epochs=1, batch_size=64, shuffle=False, verbose=0)
    assert h["train_auc"].iloc[0] == pytest.approx(sk.roc_auc_score(y, p), abs=2e-3)
    assert h["train_recall"].iloc[0] == pytest.approx(sk.recall_score(y, p > 0.5), abs=1.5 / float(y.sum()))
    assert h["train_mae"].iloc[0] == pytest.approx(sk.mean_absolute_error(y, p), rel=1e-4)
    assert np.isnan(h["val_auc"].iloc[0])  # no validation data


def test_training_metrics_of_a_softmax_head_see_probabilities():
    # the training graph leaves the softmax to the fused loss: the metrics must apply it (MAE of one-hot
    # labels against logits would be far from that against probabilities)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(192, 5)).astype(np.float32)
    ids = rng.integers(0, 3, 192)
    np.random.seed(1)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 3, activation="softmax", input_shape=(5,))
    m = g.ggml_compile(m, optimizer="sgd", learning_rate=1e-9, loss="sparse_categorical_crossentropy",
                       metrics=["mae", g.ggml_metric_top_k_accuracy(2)], backend="cpu")
    probs = g.ggml_predict(m, x)
    h = g.ggml_fit(m, x, ids, epochs=1, batch_size=64, shuffle=False, verbose=0)
    assert h["train_mae"].iloc[0] == pytest.approx(sk.mean_absolute_error(np.eye(3)[ids], probs), rel=1e-4)
    assert h["train_top_k_categorical_accuracy"].iloc[0] == \
        pytest.approx(sk.top_k_accuracy_score(ids, probs, k=2), abs=1e-9)


def two_heads(metrics):
    np.random.seed(2)
    inp = g.ggml_input(shape=(4,))
    hid = g.ggml_layer_dense(inp, 8, activation="relu")
    cls = g.ggml_layer_dense(hid, 1, activation="sigmoid", name="cls")
    reg = g.ggml_layer_dense(hid, 1, name="reg")
    m = g.ggml_model(inp, [cls, reg])
    return g.ggml_compile(m, loss=["binary_crossentropy", "mse"], metrics=metrics, backend="cpu")


def test_multi_output_metrics_are_named_by_output_and_fit_the_outputs_they_can(data):
    x, y = data
    m = two_heads(["auc", "mae"])   # auc fits cls only, mae both
    h = g.ggml_fit(m, x, [y, x[:, 0]], epochs=1, batch_size=32, verbose=0)
    assert {"train_cls_auc", "train_cls_mae", "train_reg_mae"} <= set(h.columns)
    assert "train_reg_auc" not in h.columns
    m = two_heads({"reg": ["rmse"]})
    ev = g.ggml_evaluate(m, x, [y, x[:, 0]])
    pred = g.ggml_predict(m, x)[1].ravel()
    assert set(ev) >= {"reg_rmse"} and "cls_rmse" not in ev
    assert ev["reg_rmse"] == pytest.approx(math.sqrt(sk.mean_squared_error(x[:, 0], pred)), rel=1e-5)
    m = two_heads([["precision"], ["mse", "mae"]])
    assert [[s.name for s in specs] for specs in m.compiled.head_metrics] == [["precision"], ["mse", "mae"]]


@pytest.mark.parametrize("metrics, message", [
    (["auc_roc"], "unknown metric"),
    ([3], "a metric is a name"),
    ({"nope": ["auc"]}, "name no output"),
    ([["auc"]], "one list per output"),
    ([["mse"], ["auc"]], "needs an output trained with a classification loss"),
    (["auc", g.ggml_metric_auc(curve="PR")], "logged as 'auc'"),
    ([g.ggml_metric_recall(name="loss")], "logged as 'cls_loss', which another value"),
])
def test_metrics_that_cannot_be_computed_are_refused(metrics, message):
    with pytest.raises((ValueError, TypeError), match=message):
        two_heads(metrics)


def test_a_metric_that_fits_no_output_is_refused():
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 1, input_shape=(4,))
    with pytest.raises(ValueError, match="'auc' needs an output trained with a classification loss"):
        g.ggml_compile(m, loss="mse", metrics=["auc"], backend="cpu")
    with pytest.raises(ValueError, match="categorical cross-entropy"), pytest.warns(g.GgmlpyWarning, match="sigmoid"):
        g.ggml_compile(m, loss="binary_crossentropy", metrics=["top_k_categorical_accuracy"], backend="cpu")


@pytest.mark.parametrize("name", ["loss", "accuracy", "steps", "val_loss", "train_auc", "lr"])
def test_a_metric_named_like_another_logged_value_is_refused(name):
    with pytest.raises(ValueError, match=f"logged as '{name}', which another value"):
        binary_model([g.ggml_metric_auc(name=name)])


@pytest.mark.parametrize("name", ["auc", "precision", "recall", "false_negatives", "mae"])
def test_a_nonfinite_prediction_makes_the_metric_nan(name):
    # a diverged model must not look best to a callback (NaN in Keras' top AUC bucket would read as 1.0)
    p = np.array([np.nan, np.inf, 0.1, 0.2], np.float32)
    y = np.array([1, 1, 0, 0], np.float32)
    assert math.isnan(streamed(name, p, y, batch=2))
    assert not math.isnan(streamed(name, p[2:], y[2:]))


@pytest.mark.parametrize("call, message", [
    (lambda: g.ggml_metric_auc(num_thresholds=1), "num_thresholds"),
    (lambda: g.ggml_metric_auc(curve="XY"), "curve"),
    (lambda: g.ggml_metric_precision(1.5), "threshold"),
    (lambda: g.ggml_metric_recall(float("nan")), "threshold"),
    (lambda: g.ggml_metric_top_k_accuracy(0), "k must be"),
    (lambda: g.ggml_metric_auc(name="my auc"), "identifier"),
])
def test_metric_arguments_are_checked(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_saved_model_keeps_its_metrics(tmp_path, data):
    x, y = data
    m = binary_model(["accuracy", g.ggml_metric_auc(num_thresholds=50, curve="PR", name="pr"), "recall"])
    g.ggml_save_model(m, tmp_path / "m.gguf")
    back = g.ggml_load_model(tmp_path / "m.gguf", backend="cpu")
    assert back.compiled.head_metrics == m.compiled.head_metrics and back.compiled.metrics == ["accuracy"]
    assert g.ggml_evaluate(back, x, y)["pr"] == pytest.approx(g.ggml_evaluate(m, x, y)["pr"], abs=1e-12)


def test_callbacks_monitor_metrics_by_keras_names(data, tmp_path):
    x, y = data
    m = binary_model(["auc", "mae"])
    # an error is minimised and an area maximised, as Keras' directions of its metrics
    assert [monitor_mode(k, "auto") for k in ("val_mae", "train_rmse", "false_negatives", "val_auc", "recall")] == \
        ["min", "min", "min", "max", "max"]
    stop = g.ggml_callback_early_stopping(monitor="val_mae", patience=100)
    ckpt = g.ggml_callback_model_checkpoint(str(tmp_path / "e{epoch}-{auc:.3f}.gguf"), monitor="auc",
                                            save_best_only=True, mode="max")
    g.ggml_fit(m, x, y, epochs=2, batch_size=32, validation_split=0.25, callbacks=[stop, ckpt], verbose=0)
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert saved and all(n.startswith("e") and n.endswith(".gguf") for n in saved)
