"""The compiled metrics of the training steps summed on the device (``models/engine/device_metrics``,
``opt/tallies``): every metric kind on every kind of head, on the CPU and on Vulkan, against an independent float64
numpy computation of Keras' formulas on the model's predictions; the reads of the sums (behind an epoch's last step,
and every few steps where F32 counts would grow past 2**24); replicas, graph optimizers and accumulation; NaN
predictions; and the fallback to reading the outputs when a metric would not fit the device's budget. On the CPU
the outputs are read (host memory costs nothing to read); "cpu-device" runs the device's path there too.

A learning rate of 1e-9 keeps the weights where they are, so the epoch's training metrics are those of the
predictions of the whole training set (the reference). Counts are compared exactly, except for predictions closer
to a threshold than the forward passes of training and prediction may differ (1e-5): those may count either way."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.opt import tallies


N, BATCH = 192, 32
AMBIGUOUS = 1e-5   # training's and prediction's forward passes differ by float rounding, far less than this


def _gpu(family: str = "vulkan") -> str:
    name = {"vulkan": "Vulkan0", "cuda": "CUDA0"}[family]
    if family not in G.ggml_backends_built() or G.ggml_backend_dev_by_name(name) is None:
        pytest.skip(f"no {name} device (the {family} backend not built, or no such device; CI has Vulkan on Mesa's "
                    "lavapipe, and CUDA nowhere)")
    return name


@pytest.fixture
def backend(request, monkeypatch) -> str:
    """"cpu" (the outputs read back: host memory reads for free), "cpu-device" (the CPU forced onto the device's
    path, so that it is tested where no GPU is), "vulkan" or "cuda" (the device's path: lavapipe, a Vulkan device
    computing on the CPU's cores, reads the outputs back too unless forced, as here)."""
    if request.param in ("vulkan", "cuda"):
        device = _gpu(request.param)
        _force_device_path(monkeypatch)
        return device
    if request.param == "cpu-device":
        _force_device_path(monkeypatch)
    return "cpu"


def _force_device_path(monkeypatch) -> None:
    from ggmlpy.models.engine import training_runner
    monkeypatch.setattr(training_runner, "computes_on_host", lambda backend: False)


# ---------------------------------------------------------------- independent references (Keras' formulas)

def _thresholds(n: int) -> np.ndarray:
    return np.array([-1e-7, *[(i + 1) / (n - 1) for i in range(n - 2)], 1 + 1e-7])


def _auc(p: np.ndarray, positive: np.ndarray, n: int = 200, curve: str = "ROC") -> float:
    """keras.metrics.AUC(num_thresholds=n, curve=curve) of flat probabilities and positive labels."""
    t = _thresholds(n)
    tp = np.array([np.sum((p > th) & positive) for th in t], dtype=np.float64)
    fp = np.array([np.sum((p > th) & ~positive) for th in t], dtype=np.float64)
    fn, tn = positive.sum() - tp, (~positive).sum() - fp
    if curve == "ROC":
        tpr = np.where(tp + fn > 0, tp / np.maximum(tp + fn, 1), 0)
        fpr = np.where(fp + tn > 0, fp / np.maximum(fp + tn, 1), 0)
        return float(np.sum((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2))
    area = 0.0   # Davis and Goadrich: tp grows linearly with the predicted positives between two thresholds
    for i in range(n - 1):
        p0, p1 = tp[i] + fp[i], tp[i + 1] + fp[i + 1]
        if p0 == p1 or tp[i + 1] + fn[i + 1] == 0:
            continue
        slope = (tp[i] - tp[i + 1]) / (p0 - p1)
        intercept = tp[i + 1] - slope * p1
        ratio = p0 / p1 if p1 > 0 else 1.0
        area += slope * (tp[i] - tp[i + 1] + intercept * math.log(ratio)) / (tp[i + 1] + fn[i + 1])
    return area


def _reference(probs: np.ndarray, values: np.ndarray, labels: np.ndarray, classes: int) -> dict[str, float]:
    p = probs.astype(np.float64).ravel()
    v, y = values.astype(np.float64).ravel(), labels.astype(np.float64).ravel()
    positive = y != 0
    out = {"mae": np.mean(np.abs(v - y)), "mse": np.mean((v - y) ** 2), "rmse": math.sqrt(np.mean((v - y) ** 2))}
    for name, thr in (("", 0.5), ("_30", 0.3)):
        pred = p > thr
        tp = np.sum(pred & positive)
        out["precision" + name] = tp / pred.sum() if pred.sum() else 0.0
        out["recall" + name] = tp / positive.sum() if positive.sum() else 0.0
    pred = p > 0.5
    out.update(true_positives=np.sum(pred & positive), false_positives=np.sum(pred & ~positive),
               true_negatives=np.sum(~pred & ~positive), false_negatives=np.sum(~pred & positive))
    out["auc"] = _auc(p, positive)
    out["auc_pr"] = _auc(p, positive, 50, "PR")
    if classes > 1:
        rows, target = probs.reshape(-1, classes), labels.reshape(-1, classes).argmax(axis=1)
        higher = (rows > rows[np.arange(len(rows)), target][:, None]).sum(axis=1)
        out["top2"] = float(np.mean(higher < 2))
    return out


def _near(p: np.ndarray, thresholds) -> int:
    """Predictions closer to a threshold than the two forward passes may differ: each may count either way."""
    return int(sum(np.sum(np.abs(p.ravel() - t) < AMBIGUOUS) for t in thresholds))


METRICS = ["mae", "mse", "rmse", "precision", "recall", "true_positives", "false_positives", "true_negatives",
           "false_negatives", "auc", G.ggml_metric_auc(50, "PR", name="auc_pr"),
           G.ggml_metric_precision(0.3, name="precision_30"), G.ggml_metric_recall(0.3, name="recall_30")]


def _head(kind: str, rng: np.random.Generator):
    """A model ending in a head of ``kind``, its data, and how its predictions become probabilities."""
    np.random.seed(3)
    m = G.ggml_model_sequential()
    sigmoid = lambda z: 1 / (1 + np.exp(-z.astype(np.float64)))  # noqa: E731
    if kind == "sequence":           # a cross-entropy at every position of a sequence output
        x = rng.normal(size=(N, 5, 6)).astype(np.float32)
        y = rng.integers(0, 4, (N, 5))
        m = G.ggml_layer_dense(m, 4, activation="softmax", input_shape=(5, 6))
        return m, x, y, "sparse_categorical_crossentropy", None, 4, np.eye(4)[y], None
    x = rng.normal(size=(N, 6)).astype(np.float32)
    m = G.ggml_layer_dense(m, 8, activation="tanh", input_shape=(6,))
    if kind == "softmax":            # the softmax fused into the loss in training
        y = rng.integers(0, 3, N)
        m = G.ggml_layer_dense(m, 3, activation="softmax")
        return m, x, y, "sparse_categorical_crossentropy", None, 3, np.eye(3)[y], None
    if kind == "softmax_logits":     # a cross-entropy on logits: probabilities are their softmax
        y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, N)]
        m = G.ggml_layer_dense(m, 3)
        softmax = lambda z: np.exp(z - z.max(1, keepdims=True)) / np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)  # noqa: E731,E501
        return m, x, y, "categorical_crossentropy", True, 3, y, softmax
    if kind == "sigmoid":            # three yes/no labels per sample
        y = (rng.random((N, 3)) < 0.4).astype(np.float32)
        m = G.ggml_layer_dense(m, 3, activation="sigmoid")
        return m, x, y, "binary_crossentropy", None, 1, y, None
    if kind == "logits":             # binary cross-entropy on logits: probabilities are their sigmoid
        y = (rng.random((N, 1)) < 0.5).astype(np.float32)
        m = G.ggml_layer_dense(m, 1)
        return m, x, y, "binary_crossentropy", True, 1, y, sigmoid
    raise ValueError(kind)


@pytest.mark.parametrize("backend", ["cpu", "cpu-device", "vulkan", "cuda"], indirect=True)
@pytest.mark.parametrize("kind", ["softmax", "softmax_logits", "sequence", "sigmoid", "logits"])
def test_every_metric_summed_on_the_device_is_that_of_the_predictions(backend, kind):
    device = backend
    m, x, y, loss, from_logits, classes, onehot, to_probs = _head(kind, np.random.default_rng(11))
    metrics = METRICS + ([G.ggml_metric_top_k_accuracy(2, name="top2")] if classes > 1 else [])
    m = G.ggml_compile(m, optimizer="sgd", learning_rate=1e-9, loss=loss, metrics=metrics, backend=device,
                       **({} if from_logits is None else {"from_logits": from_logits}))
    out = G.ggml_predict(m, x)
    probs = to_probs(out.reshape(-1, out.shape[-1])) if to_probs is not None else out
    h = G.ggml_fit(m, x, y, epochs=2, batch_size=BATCH, shuffle=False, verbose=0)
    notes = G.ggml_model_placement(m).notes
    assert not any("read the outputs back" in n for n in notes), notes
    ref = _reference(probs, out, onehot, classes)
    p = probs.ravel()
    for epoch in (0, 1):    # the second epoch's sums restart from zero
        got = h.iloc[epoch]
        for name in ("mae", "mse", "rmse"):
            assert got[f"train_{name}"] == pytest.approx(ref[name], rel=2e-5), name
        assert got["train_auc"] == pytest.approx(ref["auc"], abs=1e-4 + _near(p, _thresholds(200)) / p.size)
        assert got["train_auc_pr"] == pytest.approx(ref["auc_pr"], abs=1e-4 + _near(p, _thresholds(50)) / p.size)
        slack = _near(p, [0.5])
        for name in ("true_positives", "false_positives", "true_negatives", "false_negatives"):
            assert abs(got[f"train_{name}"] - ref[name]) <= slack, (name, got[f"train_{name}"], ref[name])
        for name, thr in (("precision", 0.5), ("recall", 0.5), ("precision_30", 0.3), ("recall_30", 0.3)):
            assert got[f"train_{name}"] == pytest.approx(ref[name], abs=1e-9 + _near(p, [thr]) / 10), name
        if classes > 1:
            assert got["train_top2"] == pytest.approx(ref["top2"], abs=1e-12)


def _softmax_model(backend, metrics, **compile_args):
    np.random.seed(5)
    m = G.ggml_model_sequential()
    m = G.ggml_layer_dense(m, 8, activation="relu", input_shape=(6,))
    m = G.ggml_layer_dense(m, 3, activation="softmax")
    args = {"optimizer": "sgd", "learning_rate": 1e-9, **compile_args}
    return G.ggml_compile(m, loss="sparse_categorical_crossentropy", metrics=metrics, backend=backend, **args)


@pytest.fixture
def data():
    rng = np.random.default_rng(4)
    return rng.normal(size=(N, 6)).astype(np.float32), rng.integers(0, 3, N)


@pytest.mark.parametrize("backend", ["cpu-device", "vulkan", "cuda"], indirect=True)
def test_sums_read_every_few_steps_where_f32_counts_would_pass_2_24(backend, data, monkeypatch):
    # F32 holds integers exactly up to 2**24: the accumulator is read (and restarted) before a count could pass it;
    # here the bound is made small so that an epoch of 6 steps is read after steps 2, 4 and 6
    device = backend
    x, y = data
    folds: list[int] = []
    fold = tallies.DeviceTally._fold_values

    def counted(self, values):
        folds.append(self.steps)
        fold(self, values)
    monkeypatch.setattr(tallies.DeviceTally, "_fold_values", counted)
    monkeypatch.setattr(tallies, "F32_EXACT", 2 * BATCH * 3)   # two steps of 3 x 32 predictions
    m = _softmax_model(device, ["auc", "false_negatives", "mae"])
    probs = G.ggml_predict(m, x)
    h = G.ggml_fit(m, x, y, epochs=1, batch_size=BATCH, shuffle=False, verbose=0)
    assert folds == [2, 2, 2]
    ref = _reference(probs, probs, np.eye(3)[y], 3)
    assert h["train_mae"][0] == pytest.approx(ref["mae"], rel=2e-5)
    assert abs(h["train_false_negatives"][0] - ref["false_negatives"]) <= _near(probs, [0.5])
    assert h["train_auc"][0] == pytest.approx(ref["auc"], abs=1e-4)


@pytest.mark.parametrize("setup", ["replicas", "rmsprop", "accumulated"])
def test_metrics_on_the_device_with_replicas_graph_optimizers_and_accumulation(setup, data, monkeypatch):
    # replicas: each sums its shard on its own device, the epoch reads both; a graph optimizer's and an accumulated
    # step run the same statistics
    _force_device_path(monkeypatch)
    x, y = data
    backend, args, fit_args = "cpu", {}, {}
    if setup == "replicas":
        backend = ["cpu", _gpu()]
    elif setup == "rmsprop":
        args = {"optimizer": "rmsprop"}
    else:
        fit_args = {"nbatch_logical": 2 * BATCH}
    m = _softmax_model(backend, ["mae", "auc", "precision"], **args)
    probs = G.ggml_predict(m, x)
    h = G.ggml_fit(m, x, y, epochs=1, batch_size=BATCH, shuffle=False, verbose=0, **fit_args)
    ref = _reference(probs, probs, np.eye(3)[y], 3)
    assert h["train_mae"][0] == pytest.approx(ref["mae"], rel=2e-5)
    assert h["train_auc"][0] == pytest.approx(ref["auc"], abs=1e-4 + _near(probs, _thresholds(200)) / probs.size)
    assert h["train_precision"][0] == pytest.approx(ref["precision"], abs=1e-9 + _near(probs, [0.5]) / 10)


@pytest.mark.parametrize("backend", ["cpu", "cpu-device"], indirect=True)
def test_a_nonfinite_prediction_makes_the_epochs_metrics_nan(backend):
    # outputs past F32's range: the sums on the device are NaN or meaningless, the epoch's metrics NaN (a diverged
    # model must not look best to a callback), and the next epoch starts clean once the model is finite again
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = rng.normal(size=(64, 1)).astype(np.float32)
    m = G.ggml_model_sequential()
    m = G.ggml_layer_dense(m, 1, input_shape=(4,))
    m = G.ggml_compile(m, optimizer="sgd", learning_rate=1e-9, loss="mse", metrics=["mae", "rmse"], backend=backend)
    w = G.ggml_get_weights(m)
    G.ggml_set_weights(m, {k: np.full_like(v, 3e38) for k, v in w.items()})
    with pytest.warns(UserWarning):
        h = G.ggml_fit(m, x, y, epochs=1, batch_size=16, shuffle=False, verbose=0, on_nonfinite="warn")
    assert math.isnan(h["train_mae"][0]) and math.isnan(h["train_rmse"][0])
    G.ggml_set_weights(m, w)
    h = G.ggml_fit(m, x, y, epochs=1, batch_size=16, shuffle=False, verbose=0)
    pred = G.ggml_predict(m, x)
    assert h["train_mae"][0] == pytest.approx(np.mean(np.abs(pred - y)), rel=2e-5)


def test_metrics_too_large_for_the_device_are_read_from_the_outputs(data, monkeypatch):
    # an AUC's statistics take thresholds x output elements of device memory: past the budget the outputs are read
    # back after every step instead, the placement report says so, and the values are the same
    from ggmlpy.models.engine import device_metrics
    monkeypatch.setattr(device_metrics, "BUDGET_BYTES", 1024)
    _force_device_path(monkeypatch)
    x, y = data
    m = _softmax_model("cpu", ["auc", "mae"])
    probs = G.ggml_predict(m, x)
    h = G.ggml_fit(m, x, y, epochs=1, batch_size=BATCH, shuffle=False, verbose=0)
    notes = G.ggml_model_placement(m).notes
    assert any("read the outputs back after every step" in n for n in notes), notes
    ref = _reference(probs, probs, np.eye(3)[y], 3)
    assert h["train_mae"][0] == pytest.approx(ref["mae"], rel=2e-5)
    assert h["train_auc"][0] == pytest.approx(ref["auc"], abs=1e-4 + _near(probs, _thresholds(200)) / probs.size)


def test_many_metrics_on_the_device_fit_the_scheduler(data, monkeypatch):
    # sixty thresholds' counts add hundreds of nodes to the step's graph: the scheduler is sized for them (the fit
    # failed with "the scheduler is too small", advice a ggml_fit user cannot act on)
    _force_device_path(monkeypatch)
    x, y = data
    thresholds = [i / 61 for i in range(1, 61)]
    m = _softmax_model("cpu", [G.ggml_metric_precision(t, name=f"p{i}") for i, t in enumerate(thresholds)])
    probs = G.ggml_predict(m, x)
    h = G.ggml_fit(m, x, y, epochs=1, batch_size=BATCH, shuffle=False, verbose=0)
    for i in (0, 29, 59):
        pred, positive = probs.ravel() > thresholds[i], np.eye(3)[y].ravel() != 0
        want = np.sum(pred & positive) / max(1, pred.sum())
        assert h[f"train_p{i}"][0] == pytest.approx(want, abs=1e-9 + _near(probs, [thresholds[i]]) / 10)
