"""Callbacks that use the model: early stopping's restore_best_weights and the model checkpoint (Keras'
EarlyStopping(restore_best_weights=True) and ModelCheckpoint semantics)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers.models import blobs, classifier


def _weights_per_epoch(store):
    """A callback that keeps the model's weights at the end of each epoch (it runs before the one under test)."""
    return {"on_epoch_end": lambda epoch, logs, state: store.__setitem__(epoch, g.ggml_get_weights(state.model))}


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _different(a, b):
    assert any(not np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture
def data():
    np.random.seed(3)
    x, ids = blobs(n=96)
    return x, np.eye(3)[ids]


# the training loss falls epoch after epoch, so with mode="max" the first epoch is the best one
@pytest.mark.parametrize("patience, epochs, stopped_after", [(2, 10, 3), (50, 4, 4)])
def test_restore_best_weights_leaves_the_weights_of_the_best_epoch(patience, epochs, stopped_after, data, each_device):
    x, y = data
    m = classifier(backend=each_device)
    seen: dict = {}
    stop = g.ggml_callback_early_stopping("loss", patience=patience, mode="max", restore_best_weights=True)
    h = g.ggml_fit(m, x, y, epochs=epochs, batch_size=32, verbose=0, callbacks=[_weights_per_epoch(seen), stop])
    assert len(h) == stopped_after and h["train_loss"].iloc[0] == h["train_loss"].max()
    _different(seen[1], seen[stopped_after])   # it trained after the best epoch
    _same(g.ggml_get_weights(m), seen[1])      # and left with the best epoch's weights


def test_without_restore_best_weights_the_last_epochs_weights_stay(data):
    x, y = data
    m = classifier()
    seen: dict = {}
    stop = g.ggml_callback_early_stopping("loss", patience=2, mode="max")
    g.ggml_fit(m, x, y, epochs=10, batch_size=32, verbose=0, callbacks=[_weights_per_epoch(seen), stop])
    _same(g.ggml_get_weights(m), seen[3])


def test_restore_best_weights_refuses_a_low_level_fit():
    from tests.helpers.training_refs import Linear
    cpu = g.ggml_backend_cpu_init()
    net = Linear(cpu, 3, 2, 4, seed=1)
    sched = g.ggml_backend_sched_new([cpu], parallel=False)
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32))]
    try:
        with pytest.raises(g.GgmlValueError, match="needs a fit of the model layer"):
            g.ggml_fit_opt_gen(sched, net.net.ctx, net.x, net.out, batches, epochs=2, silent=True,
                               callbacks=[g.ggml_callback_early_stopping("train_loss", restore_best_weights=True)])
    finally:
        net.free()
        sched.free()
        cpu.free()
    with pytest.raises(g.GgmlTypeError, match="True or False"):
        g.ggml_callback_early_stopping(restore_best_weights=1)


def test_checkpoint_pattern_saves_every_epoch_as_a_loadable_model(tmp_path, data):
    x, y = data
    m = classifier()
    seen: dict = {}
    ckpt = g.ggml_callback_model_checkpoint(str(tmp_path / "m-{epoch:02d}-{loss:.4f}.gguf"))
    h = g.ggml_fit(m, x, y, epochs=3, batch_size=32, verbose=0, callbacks=[_weights_per_epoch(seen), ckpt])
    names = sorted(os.listdir(tmp_path))
    assert names == [f"m-{e:02d}-{loss:.4f}.gguf" for e, loss in zip(h["epoch"], h["train_loss"])]
    loaded = g.ggml_load_model(str(tmp_path / names[1]), backend="cpu")
    _same(g.ggml_get_weights(loaded), seen[2])
    np.testing.assert_allclose(g.ggml_predict(loaded, x[:8]), g.ggml_predict(_model_with(seen[2]), x[:8]),
                               rtol=1e-6, atol=1e-7)


def _model_with(weights):
    m = classifier()
    g.ggml_set_weights(m, weights)
    return m


def test_checkpoint_save_best_only_keeps_the_best_epoch(tmp_path, data):
    x, y = data
    m = classifier()
    seen: dict = {}
    path = tmp_path / "best.gguf"
    ckpt = g.ggml_callback_model_checkpoint(path, monitor="train_loss", save_best_only=True, mode="max")
    g.ggml_fit(m, x, y, epochs=3, batch_size=32, verbose=0, callbacks=[_weights_per_epoch(seen), ckpt])
    _same(g.ggml_get_weights(g.ggml_load_model(path, backend="cpu")), seen[1])  # the loss only fell after it


def test_checkpoint_monitors_a_metric_another_callback_logs(tmp_path, data, each_device):
    """Keras' pattern: a callback computes a metric the fit does not (here each epoch's macro F1 on held-out
    samples, with scikit-learn) and logs it; the checkpoint after it keeps the best epoch by that metric."""
    f1_score = pytest.importorskip("sklearn.metrics").f1_score
    x, y = data
    m = classifier(backend=each_device)
    seen: dict = {}
    scores = {1: 0.3, 2: 0.9, 3: 0.5}   # the metric's values, fixed so that epoch 2 is the best

    def macro_f1(epoch, logs, state):
        pred = g.ggml_predict(state.model, x[:48]).argmax(1)
        logs["val_f1"] = f1_score(y[:48].argmax(1), pred, average="macro")   # a real metric reaches the history
        logs["val_score"] = scores[epoch]

    path = tmp_path / "best.gguf"
    ckpt = g.ggml_callback_model_checkpoint(path, monitor="val_score", save_best_only=True, mode="max")
    h = g.ggml_fit(m, x, y, epochs=3, batch_size=32, verbose=0,
                   callbacks=[_weights_per_epoch(seen), {"on_epoch_end": macro_f1}, ckpt])
    assert list(h["val_score"]) == [0.3, 0.9, 0.5] and h["val_f1"].between(0, 1).all()
    _same(g.ggml_get_weights(g.ggml_load_model(path, backend="cpu")), seen[2])


def test_checkpoint_of_weights_only_loads_into_a_model_of_the_same_architecture(tmp_path, data):
    x, y = data
    m = classifier()
    path = tmp_path / "w.gguf"
    g.ggml_fit(m, x, y, epochs=2, batch_size=32, verbose=0,
               callbacks=[g.ggml_callback_model_checkpoint(path, save_weights_only=True)])
    other = g.ggml_load_weights(classifier(), path)
    _same(g.ggml_get_weights(other), g.ggml_get_weights(m))


def test_checkpoint_save_best_only_without_the_monitored_value_warns_and_saves_nothing(tmp_path, data):
    x, y = data
    path = tmp_path / "best.gguf"
    with pytest.warns(g.GgmlpyWarning, match="does not log"):
        g.ggml_fit(classifier(), x, y, epochs=2, batch_size=32, verbose=0,
                   callbacks=[g.ggml_callback_model_checkpoint(path, save_best_only=True)])  # no validation data
    assert not path.exists()


def test_checkpoint_checks_its_arguments(tmp_path, data):
    with pytest.raises(g.GgmlValueError, match="does not exist"):
        g.ggml_callback_model_checkpoint(tmp_path / "missing" / "m.gguf")
    with pytest.raises(g.GgmlTypeError, match="True or False"):
        g.ggml_callback_model_checkpoint(tmp_path / "m.gguf", save_best_only="yes")
    with pytest.raises(g.GgmlValueError, match="mode"):
        g.ggml_callback_model_checkpoint(tmp_path / "m.gguf", mode="best")
    x, y = data
    with pytest.raises(g.GgmlValueError, match="cannot be filled"):
        g.ggml_fit(classifier(), x, y, epochs=1, batch_size=32, verbose=0,
                   callbacks=[g.ggml_callback_model_checkpoint(str(tmp_path / "m-{val_auc}.gguf"))])


@pytest.mark.parametrize("metric", ["sparse_categorical_accuracy", "categorical_accuracy", "acc"])
def test_keras_accuracy_names_are_monitored_as_the_accuracy_they_log(metric, data):
    """A Keras port monitors its metric's own name (val_sparse_categorical_accuracy ...): ggmlpy logs that metric as
    val_accuracy, and the monitor reads it there (no 'never logged' warning, and the stop happens)."""
    import warnings
    x, y = data
    m = classifier()
    stop = g.ggml_callback_early_stopping(monitor=f"val_{metric}", patience=0, min_delta=1e9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", g.GgmlpyWarning)
        h = g.ggml_fit(m, x, y, epochs=4, validation_split=0.25, verbose=0, callbacks=[stop])
    assert len(h) == 1   # no epoch can improve by 1e9: the first epoch's end stops the fit


def test_the_recorders_still_record_the_epoch_a_callback_before_them_stopped_at(tmp_path, data):
    """ggmlR skips the callbacks after one that stops the fit; the CSV logger and the checkpoint record that epoch
    anyway (Keras runs every callback), while a plain callback after the stop is still skipped."""
    x, y = data
    m = classifier()
    seen: list = []
    stop = g.ggml_callback_early_stopping(monitor="loss", mode="max", patience=1)   # the loss falls: stops at 2
    csv_path = tmp_path / "log.csv"
    h = g.ggml_fit(m, x, y, epochs=6, verbose=0, callbacks=[
        stop, g.ggml_callback_csv_logger(str(csv_path)),
        g.ggml_callback_model_checkpoint(str(tmp_path / "m-{epoch}.gguf"), monitor="loss"),
        {"on_epoch_end": lambda epoch, logs, state: seen.append(epoch)}])
    assert list(h["epoch"]) == [1, 2]
    rows = csv_path.read_text().splitlines()
    assert len(rows) == 1 + 2 and rows[-1].startswith("2,")
    assert sorted(p.name for p in tmp_path.glob("m-*.gguf")) == ["m-1.gguf", "m-2.gguf"]
    assert seen == [1]
