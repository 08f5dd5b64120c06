"""compile / fit / fit_generator / evaluate / predict: data orientation, batches, validation, weights."""
from __future__ import annotations

import inspect
import io
import re
import sys
import warnings

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers.models import blobs, classifier


def test_fit_learns_and_history_has_ggml_fit_opt_columns():
    np.random.seed(1)
    x, ids = blobs()
    m = classifier()
    h = g.ggml_fit(m, x, np.eye(3)[ids], epochs=8, batch_size=32, validation_split=0.25, verbose=0)
    assert list(h.columns) == ["epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy"]
    assert list(h["epoch"]) == list(range(1, 9))
    assert h["train_loss"].iloc[-1] < 0.5 * h["train_loss"].iloc[0]
    assert h["val_accuracy"].iloc[-1] > 0.9
    r = g.ggml_evaluate(m, x[180:], np.eye(3)[ids[180:]])
    assert r["n_samples"] == 60
    # validation is the last quarter, evaluated on the inference graph: the same numbers
    assert r["loss"] == pytest.approx(h["val_loss"].iloc[-1], rel=1e-6)
    assert r["accuracy"] == pytest.approx(h["val_accuracy"].iloc[-1])


def test_evaluate_matches_a_numpy_float64_reference():
    x, ids = blobs(50)
    m = classifier()
    p = g.ggml_predict(m, x, batch_size=16)          # 50 = 3 batches of 16 + a partial one
    assert p.shape == (50, 3)
    y = np.eye(3)[ids]
    w = g.ggml_get_weights(m)
    h = np.maximum(x.astype(np.float64) @ w["dense_1.weight"] + w["dense_1.bias"], 0)
    z = h @ w["dense_2.weight"] + w["dense_2.bias"]
    ref = np.exp(z - z.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    np.testing.assert_allclose(p, ref, rtol=1e-5, atol=1e-6)
    r = g.ggml_evaluate(m, x, y, batch_size=16)
    assert r["loss"] == pytest.approx(-np.mean(np.log(ref[np.arange(50), ids])), rel=1e-5)
    assert r["accuracy"] == pytest.approx(np.mean(ref.argmax(1) == ids))
    np.testing.assert_array_equal(g.ggml_predict_classes(m, x), ref.argmax(1))


def test_training_loss_is_the_fused_cross_entropy_on_logits():
    """One SGD step: the weights move by lr * the gradient of mean CE(softmax(logits)) (float64 reference)."""
    x, ids = blobs(8)
    y = np.eye(3)[ids]
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 3, activation="softmax", input_shape=(4,))
    g.ggml_compile(m, optimizer="sgd", backend="cpu", learning_rate=0.1)
    w0 = g.ggml_get_weights(m)
    with g.ggml_trainer(m, batch_size=8) as tr:
        loss = tr.step(x, y)
    z = x.astype(np.float64) @ w0["dense_1.weight"] + w0["dense_1.bias"]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert loss == pytest.approx(-np.mean(np.sum(y * np.log(p), 1)), rel=1e-5)
    grad_w = x.T.astype(np.float64) @ (p - y) / 8
    np.testing.assert_allclose(g.ggml_get_weights(m)["dense_1.weight"], w0["dense_1.weight"] - 0.1 * grad_w,
                               rtol=1e-4, atol=1e-6)


def test_sparse_labels_train_like_one_hot():
    x, ids = blobs(64)
    np.random.seed(3)
    a = classifier()
    ha = g.ggml_fit(a, x, np.eye(3)[ids], epochs=2, batch_size=16, shuffle=False, verbose=0)
    np.random.seed(3)
    b = classifier(loss="sparse_categorical_crossentropy")
    hb = g.ggml_fit(b, x, ids, epochs=2, batch_size=16, shuffle=False, verbose=0)
    np.testing.assert_allclose(ha["train_loss"], hb["train_loss"], rtol=1e-6)
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        g.ggml_fit(b, x, np.where(ids == 2, 3, ids), verbose=0)
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        g.ggml_evaluate(b, x, np.full(64, -1))


@pytest.mark.parametrize("bad, text", [
    (lambda x: x.T, "looks transposed"),
    (lambda x: x[:, :3], r"must have shape \(N, 4\)"),
    (lambda x: x.reshape(-1, 2, 2), r"must have shape \(N, 4\)"),
    (lambda x: x.reshape(-1), r"must have shape \(N, 4\)"),
    (lambda x: x.astype(complex), "complex"),
    (lambda x: x.astype(str), "numeric"),
])
def test_misshaped_inputs_are_refused_naming_both_shapes(bad, text):
    x, ids = blobs(16)
    m = classifier()
    with pytest.raises((ValueError, TypeError), match=text):
        g.ggml_fit(m, bad(x), np.eye(3)[ids], verbose=0)
    with pytest.raises((ValueError, TypeError), match=text):
        g.ggml_predict(m, bad(x))


def test_images_must_be_channels_last():
    m = g.ggml_model_sequential()
    m = g.ggml_layer_conv_2d(m, 2, (3, 3), input_shape=(8, 6, 3))
    m = g.ggml_compile(g.ggml_layer_dense(g.ggml_layer_flatten(m), 2), loss="mse", backend="cpu")
    assert g.ggml_predict(m, np.zeros((2, 8, 6, 3))).shape == (2, 2)
    with pytest.raises(ValueError, match=r"\(N, 8, 6, 3\).*got \(2, 3, 8, 6\).*channels last"):
        g.ggml_predict(m, np.zeros((2, 3, 8, 6)))


def test_label_errors_say_what_to_do():
    x, ids = blobs(16)
    m = classifier()
    with pytest.raises(ValueError, match="sparse_categorical_crossentropy"):
        g.ggml_fit(m, x, ids, verbose=0)                      # class ids for a one-hot loss
    with pytest.raises(ValueError, match="summing to 1"):
        g.ggml_fit(m, x, np.zeros((16, 3)), verbose=0)       # all-zero "one-hot" labels
    with pytest.raises(ValueError, match="summing to 1"):
        g.ggml_fit(m, x, -np.eye(3)[ids], verbose=0)
    with pytest.raises(ValueError, match="16"):
        g.ggml_fit(m, x, np.eye(3)[ids][:10], verbose=0)     # another number of samples
    with pytest.raises(ValueError, match="NaN"):
        r = classifier(loss="mse")
        g.ggml_fit(r, x, np.full((16, 3), np.nan), verbose=0)


def test_a_last_partial_batch_trains_every_sample():
    """N = 10 with batch 4: 3 steps per epoch; the samples of the last step are the 2 left plus 2 others."""
    x, ids = blobs(10)
    m = classifier()
    h = g.ggml_fit(m, x, np.eye(3)[ids], epochs=1, batch_size=4, verbose=0)
    assert len(h) == 1 and np.isfinite(h["train_loss"][0])
    seen = []
    inputs = g.models.engine.inputs
    for b in inputs.training_batches(m.compiled.heads, [np.arange(10).reshape(-1, 1)], [np.zeros((10, 3))],
                                     None, 4, True, np.random.default_rng(0))():
        assert b["inputs"][0].shape == (4, 1)
        seen.append(b["inputs"][0].ravel())
    assert len(seen) == 3 and set(np.concatenate(seen)) == set(range(10))
    assert len(set(seen[-1])) == 4  # completed with two other samples, no duplicates within the step


def test_steps_per_epoch_continues_the_pass_across_epochs_as_keras_3():
    """10 samples, batch 4: 3 batches per pass. steps_per_epoch=2 gives epochs of 2, 1, 2, 1 steps, each pass
    every sample once, the second pass shuffled anew."""
    ids = np.arange(10).reshape(-1, 1)
    inputs = g.models.engine.inputs
    epoch = inputs.continuing_passes(
        inputs.training_batches([], [ids], [np.zeros((10, 1))], None, 4, True, np.random.default_rng(1)), 3, 2)
    epochs = [[b["inputs"][0].ravel() for b in epoch()] for _ in range(4)]
    assert [len(e) for e in epochs] == [2, 1, 2, 1]
    first, second = np.concatenate(epochs[0] + epochs[1]), np.concatenate(epochs[2] + epochs[3])
    assert set(first) == set(second) == set(range(10)) and not np.array_equal(first, second)
    x, y = blobs(10)
    m = classifier()
    g.ggml_fit(m, x, np.eye(3)[y], epochs=4, batch_size=4, steps_per_epoch=2, verbose=0)
    assert m.runtime.opt_state.state["iter"] - 1 == 6   # optimizer steps: 2 + 1 + 2 + 1
    with pytest.raises(ValueError, match="steps_per_epoch=4, but the 10 training samples give 3 batches"):
        g.ggml_fit(m, x, np.eye(3)[y], batch_size=4, steps_per_epoch=4, verbose=0)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        g.ggml_fit(m, x, np.eye(3)[y], batch_size=4, steps_per_epoch=0, verbose=0)


def test_initial_epoch_runs_epochs_more_as_ggmlrs_contract():
    """ggmlR's convention (spec: epochs initial_epoch+1 .. initial_epoch+epochs), not Keras' "up to": a port of
    Keras' fit(epochs=5, initial_epoch=3) writes epochs=2."""
    x, ids = blobs(64)
    m = classifier()
    h = g.ggml_fit(m, x, np.eye(3)[ids], epochs=2, initial_epoch=3, batch_size=32, verbose=0)
    assert list(h["epoch"]) == [4, 5]
    assert m.runtime.opt_state.state["iter"] - 1 == 4   # 2 epochs of 2 batches
    seen = []
    cb = {"on_epoch_begin": lambda epoch, logs, state: seen.append((epoch, state.nepoch))}
    g.ggml_fit_generator(m, [(x[:32], np.eye(3)[ids[:32]])], epochs=2, initial_epoch=5, callbacks=[cb], verbose=0)
    assert seen == [(6, 7), (7, 7)]


def test_keras_positional_strides_are_refused_with_the_keyword_to_use():
    """ggmlR's conv order puts activation third; Keras' strides there would train another model, so it raises."""
    for layer, args in [(g.ggml_layer_conv_2d, (8, (3, 3), (2, 2))), (g.ggml_layer_conv_1d, (8, 3, 2))]:
        with pytest.raises(TypeError, match=r"takes strides: pass strides=.* by keyword"):
            layer(g.ggml_model_sequential(), *args, input_shape=(28, 28, 1) if layer is g.ggml_layer_conv_2d
                  else (28, 1))


def test_class_weight_scales_each_samples_loss():
    """With class 0 weighted 0 and SGD, one step equals the unweighted step on the other samples only
    (times their share of the batch). The weighted loss keeps p in [eps, 1 - eps] (p' = p (1 - 2 eps) + eps, as
    its docstring says), which scales a sample's gradient by (1 - 2 eps) p / p': the reference does too, or a
    random start whose true class has p ~ 1e-4 would differ by 1e-3."""
    x, ids = blobs(8, seed=5)
    y = np.eye(3)[ids]
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 3, activation="softmax", input_shape=(4,))
    g.ggml_compile(m, optimizer="sgd", backend="cpu", learning_rate=0.1)
    w0 = g.ggml_get_weights(m)
    g.ggml_fit(m, x, y, epochs=1, batch_size=8, class_weight={0: 0.0, 1: 1.0, 2: 2.0}, shuffle=False, verbose=0)
    z = x.astype(np.float64) @ w0["dense_1.weight"] + w0["dense_1.bias"]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    sw = np.array([0.0, 1.0, 2.0])[ids]
    p_true = p[np.arange(8), ids]
    squeeze = (1 - 2e-7) * p_true / ((1 - 2e-7) * p_true + 1e-7)
    grad = x.T.astype(np.float64) @ ((p - y) * (sw * squeeze)[:, None]) / 8
    np.testing.assert_allclose(g.ggml_get_weights(m)["dense_1.weight"], w0["dense_1.weight"] - 0.1 * grad,
                               rtol=1e-3, atol=1e-5)


def test_sample_weight_of_zero_removes_samples_from_mse():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = rng.normal(size=(8, 2)).astype(np.float32)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(3,))
    g.ggml_compile(m, optimizer="sgd", loss="mse", backend="cpu", learning_rate=0.1)
    w0 = g.ggml_get_weights(m)
    sw = np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=np.float32)
    g.ggml_fit(m, x, y, batch_size=8, sample_weight=sw, shuffle=False, verbose=0)
    err = x.astype(np.float64) @ w0["dense_1.weight"] + w0["dense_1.bias"] - y
    grad = 2 * x.T @ (err * sw[:, None]) / err.size
    np.testing.assert_allclose(g.ggml_get_weights(m)["dense_1.weight"], w0["dense_1.weight"] - 0.1 * grad,
                               rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="one weight per sample"):
        g.ggml_fit(m, x, y, sample_weight=np.ones(5), verbose=0)


def test_validation_never_changes_training():
    x, ids = blobs(96)
    y = np.eye(3)[ids]
    np.random.seed(11)
    a = classifier()
    g.ggml_fit(a, x[:64], y[:64], epochs=3, batch_size=16, verbose=0)
    np.random.seed(11)
    b = classifier()
    h = g.ggml_fit(b, x[:64], y[:64], epochs=3, batch_size=16, validation_data=(x[64:], y[64:]), verbose=0)
    assert h["val_loss"].notna().all()
    for k, v in g.ggml_get_weights(a).items():
        np.testing.assert_array_equal(v, g.ggml_get_weights(b)[k])


def _sources(x, y, batch):
    n = len(x)

    def gen():
        for i in range(0, n, batch):
            yield x[i:i + batch], y[i:i + batch]

    state = {"i": 0}

    def fn():
        i = state["i"]
        if i >= n:
            state["i"] = 0
            return None
        state["i"] = i + batch
        return x[i:i + batch], y[i:i + batch]

    return {"generator function": gen, "callable": fn, "list": list(gen()), "iterator": iter(list(gen()) * 3)}


@pytest.mark.parametrize("kind", ["generator function", "callable", "list", "iterator"])
def test_fit_generator_takes_the_four_source_kinds(kind):
    x, ids = blobs(64)
    y = np.eye(3)[ids]
    m = classifier()
    source = _sources(x, y, 16)[kind]
    steps = 4 if kind == "iterator" else None   # an iterator is consumed across epochs
    h = g.ggml_fit_generator(m, source, epochs=3, steps_per_epoch=steps, validation_data=(x[:20], y[:20]),
                             verbose=0)
    assert list(h.columns)[-1] == "steps" and list(h["steps"]) == [4, 4, 4]
    assert h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]
    assert h["val_loss"].notna().all()


def test_fit_generator_equals_fit_on_the_same_batches():
    x, ids = blobs(48)
    y = np.eye(3)[ids]
    np.random.seed(4)
    a = classifier()
    ha = g.ggml_fit(a, x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)
    np.random.seed(4)
    b = classifier()
    hb = g.ggml_fit_generator(b, _sources(x, y, 16)["list"], epochs=2, verbose=0)
    np.testing.assert_allclose(ha["train_loss"], hb["train_loss"], rtol=1e-6)


def test_fit_generator_refuses_a_batch_of_another_size_and_lambda_gen():
    x, ids = blobs(40)
    y = np.eye(3)[ids]
    m = classifier()
    with pytest.raises(ValueError, match="first batch had 16"):
        g.ggml_fit_generator(m, _sources(x, y, 16)["generator function"], verbose=0)  # 40 = 16 + 16 + 8
    gen = _sources(x[:32], y[:32], 16)["generator function"]
    with pytest.raises(TypeError, match="generator function itself"):
        g.ggml_fit_generator(m, lambda: gen(), verbose=0)


def test_fit_generator_validation_source_and_empty_source():
    x, ids = blobs(64)
    y = np.eye(3)[ids]
    m = classifier()
    h = g.ggml_fit_generator(m, _sources(x, y, 16)["list"], epochs=2,
                             validation_data=_sources(x[:30], y[:30], 7)["generator function"],
                             validation_steps=2, verbose=0)
    assert h["val_loss"].notna().all()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        h = g.ggml_fit_generator(m, [], epochs=2, verbose=0)
    assert len(h) == 0 and any("no batch" in str(x.message) for x in w)


def test_callbacks_and_early_stopping_work_through_ggml_fit():
    x, ids = blobs(64)
    y = np.eye(3)[ids]
    m = classifier(lr=1e-6)
    seen = []
    cb = {"on_epoch_end": lambda epoch, logs, state: seen.append((epoch, sorted(logs)))}
    h = g.ggml_fit(m, x, y, epochs=20, batch_size=16, validation_split=0.25, verbose=0,
                   callbacks=[cb, g.ggml_callback_early_stopping(patience=1, min_delta=1.0)])
    assert len(h) < 20 and seen[0][0] == 1 and "val_loss" in seen[0][1]


def test_huber_mae_and_binary_crossentropy_train():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    for loss, y in (("mae", x[:, :1] * 2), ("huber", x[:, :1] * 2),
                    ("binary_crossentropy", (x[:, :1] > 0).astype(np.float32))):
        m = g.ggml_model_sequential()
        m = g.ggml_layer_dense(m, 8, activation="tanh", input_shape=(4,))
        m = g.ggml_layer_dense(m, 1, activation="sigmoid" if loss.startswith("binary") else None)
        g.ggml_compile(m, loss=loss, backend="cpu", learning_rate=0.05)
        h = g.ggml_fit(m, x, y, epochs=15, batch_size=16, verbose=0)
        assert h["train_loss"].iloc[-1] < 0.6 * h["train_loss"].iloc[0], loss
        r = g.ggml_evaluate(m, x, y)
        assert np.isnan(r["accuracy"]) == (loss != "binary_crossentropy")


def test_multi_output_trains_one_loss_per_head():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(96, 4)).astype(np.float32)
    ids = (x[:, 0] > 0).astype(int)
    inp = g.ggml_input(shape=(4,))
    h = g.ggml_layer_dense(inp, 16, activation="relu")
    cls = g.ggml_layer_dense(h, 2, activation="softmax", name="cls")
    reg = g.ggml_layer_dense(h, 1, name="reg")
    m = g.ggml_compile(g.ggml_model(inp, [cls, reg]), loss=["sparse_categorical_crossentropy", "mse"],
                       loss_weights=[1.0, 0.5], backend="cpu", learning_rate=0.02)
    hist = g.ggml_fit(m, x, [ids, x[:, 1:2] * 3], epochs=12, batch_size=16, validation_split=0.25, verbose=0)
    per = hist.attrs["head_loss"]
    assert list(per.columns) == ["cls", "reg"]
    assert (per.iloc[-1] < per.iloc[0]).all()
    r = g.ggml_evaluate(m, x, [ids, x[:, 1:2] * 3])
    assert r["loss"] == pytest.approx(r["cls_loss"] + 0.5 * r["reg_loss"], rel=1e-6)
    assert r["cls_accuracy"] > 0.8


def test_ggml_fit_with_a_scheduler_is_the_low_level_fit():
    assert "sched" in inspect.signature(g.ggml_fit_opt).parameters
    b = g.ggml_backend_cpu_init()
    sched = g.ggml_backend_sched_new([b], parallel=False)
    ctx = g.ggml_init(16 * 1024 * 1024, no_alloc=True)
    x = g.ggml_set_input(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 2, 8))
    w = g.ggml_set_param(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 2, 1))
    out = g.ggml_mul_mat(ctx, w, x)
    buf = g.ggml_backend_alloc_ctx_tensors(ctx, b)
    g.ggml_backend_tensor_set_data(w, np.zeros(2))
    ds = g.ggml_opt_dataset_init(g.GGML_TYPE_F32, g.GGML_TYPE_F32, 2, 1, 32, 1)
    g.ggml_backend_tensor_set_data(g.ggml_opt_dataset_data(ds), np.ones((32, 2)))
    g.ggml_backend_tensor_set_data(g.ggml_opt_dataset_labels(ds), np.ones((32, 1)))
    h = g.ggml_fit(sched, ctx, x, out, ds, nepoch=2, nbatch_logical=8, silent=True)
    assert len(h) == 2
    for o in (ds, buf, ctx, sched, b):
        o.free()


def test_small_graphs_train_on_one_thread_unless_the_user_chose(monkeypatch):
    """A tiny model's steps are faster on one thread (the pool's barriers cost more than they save): the
    model layer picks one for it, leaves big graphs the default, and always obeys ggml_set_n_threads."""
    from ggmlpy.backend import backend as B
    from ggmlpy.compute import threads as policy
    monkeypatch.setattr(B, "_threads_set_by_user", [False])
    monkeypatch.setattr(B, "_n_threads", [2])
    # the static split is what is checked: the step timer starts on one thread when the machine is busy
    # (tests/compute/test_threads.py checks that)
    monkeypatch.setattr(policy, "cores_busy_since", lambda before: 0.0)
    monkeypatch.setattr(B, "_blas_disabled", [True])  # the CPU backend alone (tests/backend/test_blas.py: with BLAS)
    x, ids = blobs(32)
    seen = []
    probe = {"on_epoch_end": lambda e, logs, state: seen.append(m.runtime.backend.n_threads)}
    m = classifier()
    m.runtime.backend.n_threads = 2
    g.ggml_fit(m, x, np.eye(3)[ids], epochs=1, batch_size=16, verbose=0, callbacks=[probe])
    assert seen == [1] and m.runtime.backend.n_threads == 2  # restored after the fit
    big = g.ggml_model_sequential()
    big = g.ggml_layer_dense(big, 1024, activation="relu", input_shape=(256,))   # ~200 MFLOP per step
    m = g.ggml_compile(g.ggml_layer_dense(big, 3, activation="softmax"), backend="cpu")
    m.runtime.backend.n_threads = 2
    xb = np.random.default_rng(0).normal(size=(128, 256)).astype(np.float32)
    g.ggml_fit(m, xb, np.eye(3)[np.arange(128) % 3], batch_size=128, verbose=0, callbacks=[probe])
    assert seen[-1] == 2
    g.ggml_set_n_threads(2)  # the user's choice wins (monkeypatch restores the module state afterwards)
    m = classifier()
    g.ggml_fit(m, x, np.eye(3)[ids], epochs=1, batch_size=16, verbose=0, callbacks=[probe])
    assert seen[-1] == 2


def test_sample_weights_on_outputs_of_several_axes():
    """(N, steps, units) outputs: each sample's weight scales all its elements (the loss of the single step
    equals the float64 weighted mean of the initial predictions' squared errors)."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(8, 5, 3)).astype(np.float32)
    y = rng.normal(size=(8, 5, 2)).astype(np.float32)
    sw = np.arange(8, dtype=np.float32)
    m = g.ggml_compile(g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(5, 3)), loss="mse",
                       backend="cpu")
    err = g.ggml_predict(m, x).astype(np.float64) - y
    h = g.ggml_fit(m, x, y, batch_size=8, sample_weight=sw, verbose=0)
    assert h["train_loss"].iloc[0] == pytest.approx(np.mean(err ** 2 * sw[:, None, None]), rel=1e-5)


def test_a_single_outputs_loss_weight_scales_training_as_evaluation():
    """ggml_evaluate applied a single output's loss_weights, training ignored it. Now both do (Keras): with
    SGD, weight 2 is the step of twice the learning rate, and the reported loss is twice the loss."""
    rng = np.random.default_rng(0)
    x, y = rng.random((32, 3)).astype(np.float32), rng.random((32, 1)).astype(np.float32)

    def run(weight, lr):
        np.random.seed(0)
        m = g.ggml_model_sequential()
        m = g.ggml_compile(g.ggml_layer_dense(m, 1, input_shape=(3,)), loss="mse", optimizer="sgd", backend="cpu",
                           loss_weights=weight, learning_rate=lr)
        loss = g.ggml_evaluate(m, x, y)["loss"]
        h = g.ggml_fit(m, x, y, epochs=1, batch_size=32, verbose=0, shuffle=False)
        return loss, h["train_loss"].iloc[0], g.ggml_get_weights(m)["dense_1.weight"]
    plain_eval, plain_train, plain_w = run(None, 0.2)
    weighted_eval, weighted_train, weighted_w = run(2.0, 0.1)
    assert weighted_eval == pytest.approx(2 * plain_eval, rel=1e-6)
    assert weighted_train == pytest.approx(2 * plain_train, rel=1e-5)
    np.testing.assert_allclose(weighted_w, plain_w, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- cross-entropy outputs that were trained wrongly

def _ends_in(*layers):
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 8, activation="relu", input_shape=(4,))
    for make in layers:
        m = make(m)
    return m


@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu"])
@pytest.mark.parametrize("loss", ["categorical_crossentropy", "sparse_categorical_crossentropy"])
def test_cross_entropy_on_a_bounded_output_is_refused(activation, loss):
    """It was trained as if the sigmoid/tanh/relu outputs were logits (a softmax of them)."""
    m = _ends_in(lambda m: g.ggml_layer_dense(m, 3, activation=activation))
    with pytest.raises(g.GgmlValueError, match=f"ends in {activation}.*takes logits .* or a softmax output"):
        g.ggml_compile(m, loss=loss, backend="cpu")


def test_dropout_after_the_softmax_is_refused_under_cross_entropy():
    """ggml_evaluate reported 0.60 where the true cross-entropy was 0.14: softmax applied twice."""
    m = _ends_in(lambda m: g.ggml_layer_dense(m, 3, activation="softmax"), lambda m: g.ggml_layer_dropout(m, 0.2))
    with pytest.raises(g.GgmlValueError, match="dropout after the softmax.*second softmax"):
        g.ggml_compile(m, loss="categorical_crossentropy", backend="cpu")


@pytest.mark.parametrize("after", [
    lambda m: g.ggml_layer_reshape(m, (3, 1)),
    lambda m: g.ggml_layer_repeat_vector(m, 2),
], ids=["reshape", "repeat_vector"])
def test_a_shaping_layer_after_the_softmax_is_refused_under_cross_entropy(after):
    m = _ends_in(lambda m: g.ggml_layer_dense(m, 3, activation="softmax"), after)
    with pytest.raises(g.GgmlValueError, match="after the softmax.*second softmax"):
        g.ggml_compile(m, loss="categorical_crossentropy", backend="cpu")


def test_a_pooling_layer_after_a_per_step_softmax_is_refused_under_cross_entropy():
    m = g.ggml_model_sequential()
    m = g.ggml_layer_conv_1d(m, 3, 2, activation="softmax", input_shape=(6, 2))
    m = g.ggml_layer_global_average_pooling_1d(m)
    with pytest.raises(g.GgmlValueError, match="global_average_pooling_1d after the softmax"):
        g.ggml_compile(m, loss="categorical_crossentropy", backend="cpu")


def test_an_activation_layer_softmax_is_the_fused_loss_s_softmax():
    """Dense + Activation('softmax') trains and predicts as Dense(activation='softmax')."""
    x, ids = blobs(n=64)
    np.random.seed(4)
    a = g.ggml_model_sequential()
    a = g.ggml_layer_dense(a, 3, input_shape=(4,), name="d")
    a = g.ggml_compile(g.ggml_layer_activation(a, "softmax"), loss="sparse_categorical_crossentropy", backend="cpu")
    b = g.ggml_model_sequential()
    b = g.ggml_compile(g.ggml_layer_dense(b, 3, activation="softmax", input_shape=(4,), name="d"),
                       loss="sparse_categorical_crossentropy", backend="cpu")
    g.ggml_set_weights(b, g.ggml_get_weights(a))
    ha = g.ggml_fit(a, x, ids, epochs=2, batch_size=16, shuffle=False, verbose=0)
    hb = g.ggml_fit(b, x, ids, epochs=2, batch_size=16, shuffle=False, verbose=0)
    np.testing.assert_allclose(ha["train_loss"], hb["train_loss"], rtol=1e-6)
    np.testing.assert_allclose(g.ggml_predict(a, x), g.ggml_predict(b, x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(g.ggml_predict(a, x).sum(axis=1), 1, rtol=1e-5)


@pytest.mark.parametrize("activation", ["softmax", None, "linear"])
def test_softmax_and_logit_outputs_compile_and_match_numpy(activation):
    m = _ends_in(lambda m: g.ggml_layer_dense(m, 3, activation=activation))
    m = g.ggml_compile(m, loss="categorical_crossentropy", backend="cpu")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 16)]
    out = g.ggml_predict(m, x).astype(np.float64)
    logp = np.log(out) if activation == "softmax" else out - np.log(np.exp(out).sum(1, keepdims=True))
    assert g.ggml_evaluate(m, x, y)["loss"] == pytest.approx(-(y * logp).sum(1).mean(), rel=1e-4)


def test_binary_crossentropy_logs_the_training_accuracy(each_device):
    """It was NaN every epoch. One step over the whole data: the epoch's training accuracy is that of the
    weights before the step, checked against numpy on the predictions made with them, on each device."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, :3] > 0).astype(np.float32)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 8, activation="tanh", input_shape=(4,))
    m = g.ggml_layer_dense(m, 3, activation="sigmoid")
    m = g.ggml_compile(m, loss="binary_crossentropy", backend=each_device, metrics=["accuracy"])
    before = g.ggml_predict(m, x)
    assert np.abs(before - 0.5).min() > 1e-4  # no prediction the rounding of another device could flip
    want = float(((before > 0.5) == (y > 0.5)).mean())
    hist = g.ggml_fit(m, x, y, epochs=1, batch_size=64, verbose=0)
    assert hist["train_accuracy"].iloc[0] == pytest.approx(want, abs=1e-6) and 0 < want < 1


def test_a_warning_turned_error_in_a_fits_cleanup_keeps_the_history_and_the_steps():
    """With -W error, the warning about a partial logical batch was raised in the fit's cleanup before the
    optimizer state was stored and without the history: both were lost."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 4)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 48)]
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 3, activation="softmax", input_shape=(4,))
    m = g.ggml_compile(m, backend="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", g.GgmlpyWarning)
        with pytest.raises(g.GgmlpyWarning, match="into a logical batch") as info:
            g.ggml_fit(m, x, y, epochs=3, batch_size=16, nbatch_logical=32, verbose=0)  # 9 batches: 4 steps
    assert list(info.value.history["epoch"]) == [1, 2, 3]
    assert int(m.runtime.opt_state.state["iter"]) == 4 + 1


# ---------------------------------------------------------------- Keras' call forms (issue 26, item 1)

def test_evaluate_return_dict_false_gives_keras_list_forms():
    x, labels = blobs()
    y = np.eye(3, dtype=np.float32)[labels]
    m = classifier()
    d = g.ggml_evaluate(m, x, y)
    assert g.ggml_evaluate(m, x, y, return_dict=False) == [d["loss"], d["accuracy"]]
    plain = g.ggml_compile(classifier(), loss="categorical_crossentropy", metrics=[], backend="cpu")
    loss = g.ggml_evaluate(plain, x, y, return_dict=False)
    assert isinstance(loss, float) and loss == g.ggml_evaluate(plain, x, y)["loss"]
    inp = g.ggml_input((4,))
    h = g.ggml_layer_dense(inp, 6, activation="tanh")
    two = g.ggml_compile(g.ggml_model(inp, [g.ggml_layer_dense(h, 3, activation="softmax", name="cls"),
                                           g.ggml_layer_dense(h, 1, name="reg")]),
                         loss=["categorical_crossentropy", "mse"], backend="cpu")
    r = x[:, :1]
    d2 = g.ggml_evaluate(two, x, [y, r])
    np.testing.assert_array_equal(g.ggml_evaluate(two, x, [y, r], return_dict=False),  # NaN: no accuracy of mse
                                  [d2["loss"], d2["cls_loss"], d2["reg_loss"], d2["cls_accuracy"], d2["reg_accuracy"]])
    with pytest.raises(g.GgmlValueError, match="return_dict"):
        g.ggml_evaluate(m, x, y, return_dict="no")


def test_predict_and_evaluate_take_keras_verbose_values():
    x, labels = blobs()
    y = np.eye(3, dtype=np.float32)[labels]
    m = classifier()
    want = g.ggml_predict(m, x)
    for v in (0, 1, 2, "auto", True, False):
        np.testing.assert_array_equal(g.ggml_predict(m, x, verbose=v), want)
        assert g.ggml_evaluate(m, x, y, verbose=v)["loss"] == pytest.approx(g.ggml_evaluate(m, x, y)["loss"])
    for bad in (3, "yes", 1.0, None):
        with pytest.raises(g.GgmlValueError, match="verbose"):
            g.ggml_predict(m, x, verbose=bad)
    h = g.ggml_fit(m, x, y, epochs=1, verbose="auto")  # Keras' default of fit too
    assert len(h) == 1


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal: tqdm draws its bar only on one (disable=None)."""

    def isatty(self):
        return True


_BAR = re.compile(r"(Epoch \d+/\d+|predict|evaluate): ")   # tqdm's "<desc>: ..." (the summary has no colon)
_SUMMARY = re.compile(r"Epoch (\d+)/3  train_loss=\S+  train_acc=\S+  val_loss=")


def _stderr_of(monkeypatch, call, terminal=True) -> str:
    err = _Terminal() if terminal else io.StringIO()
    with monkeypatch.context() as mp:
        mp.setattr(sys, "stderr", err)
        call()
    return err.getvalue()


@pytest.mark.parametrize("how", ["fit", "fit_generator"])
def test_fit_verbose_follows_keras_0_silent_1_bar_and_lines_2_lines_only(how, monkeypatch, capsys):
    """Keras' verbose: 0 silent, 1 a progress bar and the epoch's line, 2 one line per epoch and no bar (it was
    as 1); "auto" as 1. On a stderr that is a terminal (where the bar is drawn) and on one that is not."""
    x, labels = blobs(96)
    y = np.eye(3, dtype=np.float32)[labels]
    m = classifier()

    def fit(verbose):
        if how == "fit":
            return lambda: g.ggml_fit(m, x[:64], y[:64], epochs=3, batch_size=16, validation_data=(x[64:], y[64:]),
                                      verbose=verbose)
        batches = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
        return lambda: g.ggml_fit_generator(m, batches, epochs=3, validation_data=(x[64:], y[64:]), verbose=verbose)

    for verbose in (0, False):
        assert _stderr_of(monkeypatch, fit(verbose)) == ""
    for verbose in (1, True, "auto"):
        out = _stderr_of(monkeypatch, fit(verbose))
        assert _BAR.search(out), out
        assert [int(e) for e in _SUMMARY.findall(out)] == [1, 2, 3], out
    out = _stderr_of(monkeypatch, fit(2))
    assert not _BAR.search(out) and "\r" not in out, out
    assert [int(e) for e in _SUMMARY.findall(out)] == [1, 2, 3] and len(out.splitlines()) == 3, out
    # not a terminal (a log file, a pipe): 1 prints the lines without a bar, as 2
    capsys.readouterr()
    fit(1)()
    err = capsys.readouterr().err
    assert not _BAR.search(err) and [int(e) for e in _SUMMARY.findall(err)] == [1, 2, 3], err


def test_predict_and_evaluate_show_a_bar_on_verbose_1_and_nothing_on_0_or_2(monkeypatch, capsys):
    x, labels = blobs(96)
    y = np.eye(3, dtype=np.float32)[labels]
    m = classifier()
    for fn, call in (("predict", lambda v: lambda: g.ggml_predict(m, x, batch_size=16, verbose=v)),
                     ("evaluate", lambda v: lambda: g.ggml_evaluate(m, x, y, batch_size=16, verbose=v))):
        for verbose in (1, True, "auto"):
            out = _stderr_of(monkeypatch, call(verbose))
            assert re.search(rf"{fn}: +\d+%\|.*\| \d/6 \[", out), out   # a bar over the 6 batches
        for verbose in (0, False, 2):
            assert _stderr_of(monkeypatch, call(verbose)) == ""
        capsys.readouterr()
        call(1)()
        assert capsys.readouterr().err == ""   # not a terminal: no bar
    assert _stderr_of(monkeypatch, lambda: g.ggml_predict(m, x)) == ""   # the default is silent


@pytest.mark.parametrize("betas_eps", [(0.5, 0.9, 1e-3), (None, None, None), (0.0, 0.0, 0.5)])
def test_adam_betas_and_epsilon_follow_the_numpy_reference(betas_eps, tmp_path, each_device):
    """Three full-batch Adam steps on a linear model under MSE against numpy float64 (ggml's AdamW formula), on
    each device (ggml's fused OPT_STEP_ADAMW takes the betas and epsilon on the GPU too)."""
    from tests.helpers.training_refs import adamw_step
    b1, b2, eps = betas_eps
    rng = np.random.default_rng(11)
    x = rng.normal(size=(8, 4)).astype(np.float32)
    y = rng.normal(size=(8, 3)).astype(np.float32)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 3, input_shape=(4,), name="d")
    m = g.ggml_compile(m, optimizer="adam", loss="mse", metrics=[], backend=each_device, learning_rate=0.01,
                       beta_1=b1, beta_2=b2, epsilon=eps)
    w0 = g.ggml_get_weights(m)
    p = {k: v.astype(np.float64) for k, v in w0.items()}
    state: dict = {}
    for _ in range(3):
        err = x.astype(np.float64) @ p["d.weight"] + p["d.bias"] - y
        grads = {"d.weight": 2 * x.T.astype(np.float64) @ err / err.size, "d.bias": 2 * err.sum(axis=0) / err.size}
        adamw_step(p, grads, state, 0.01, beta1=0.9 if b1 is None else b1, beta2=0.999 if b2 is None else b2,
                   eps=1e-8 if eps is None else eps)
    g.ggml_fit(m, x, y, epochs=3, batch_size=8, shuffle=False, verbose=0)
    got = g.ggml_get_weights(m)
    for k in p:
        np.testing.assert_allclose(got[k], p[k], rtol=2e-5, atol=2e-6, err_msg=k)
    if b1 is not None:  # the settings travel with the model
        g.ggml_save_model(m, tmp_path / "m.gguf")
        assert g.ggml_load_model(tmp_path / "m.gguf", backend=each_device).compiled.adam == (b1, b2, eps)


def test_adam_settings_are_checked():
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 3, input_shape=(4,))
    with pytest.raises(g.GgmlValueError, match="beta_1 set Adam's moments, but the optimizer is 'sgd'"):
        g.ggml_compile(m, optimizer="sgd", loss="mse", backend="cpu", beta_1=0.8)
    with pytest.raises(g.GgmlValueError, match=r"beta_2 must be a number in \[0, 1\)"):
        g.ggml_compile(m, loss="mse", backend="cpu", beta_2=1.0)
    with pytest.raises(g.GgmlValueError, match="epsilon must be a finite number >= 0"):
        g.ggml_compile(m, loss="mse", backend="cpu", epsilon=-1e-7)


class _Batches:
    """Keras' PyDataset protocol: __len__, __getitem__(i), on_epoch_end (and no __iter__); ``partial``: Keras'
    ceil(N / batch) batches, the last one short."""

    def __init__(self, x, y, batch, partial=False):
        self.x, self.y, self.batch, self.partial = x, y, batch, partial
        self.order = np.arange(len(x))
        self.asked: list = []
        self.epochs_ended = 0

    def __len__(self):
        return -(-len(self.x) // self.batch) if self.partial else len(self.x) // self.batch

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(i)  # a fit must never ask beyond len
        self.asked.append(i)
        rows = self.order[i * self.batch:(i + 1) * self.batch]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        self.epochs_ended += 1
        self.order = np.random.default_rng(self.epochs_ended).permutation(len(self.x))


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_pydataset_like_source_serves_len_batches_per_epoch_and_hears_each_epoch_end(prefetch):
    x, ids = blobs(n=96)
    data = _Batches(x, np.eye(3, dtype=np.float32)[ids], 16)
    m = classifier()
    h = g.ggml_fit_generator(m, data, epochs=3, verbose=0, prefetch=prefetch)
    assert list(h["steps"]) == [6, 6, 6]
    assert data.asked == list(range(6)) * 3 and data.epochs_ended == 3
    assert h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]


def test_a_pydataset_epoch_cut_short_by_steps_per_epoch_still_ends():
    x, ids = blobs(n=96)
    data = _Batches(x, np.eye(3, dtype=np.float32)[ids], 16)
    h = g.ggml_fit_generator(classifier(), data, epochs=2, steps_per_epoch=4, verbose=0)
    assert list(h["steps"]) == [4, 4]
    assert data.asked == [0, 1, 2, 3, 0, 1, 2, 3]  # each epoch starts again at batch 0
    assert data.epochs_ended == 2  # after each epoch, also one cut short


class _ShortInTheMiddle(_Batches):
    """A PyDataset whose third batch is short: only the last may be (it was padded with copies of its own rows)."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return (x[:5], y[:5]) if i == 2 else (x, y)


def test_a_short_batch_before_a_pydatasets_last_is_refused():
    x, ids = blobs(n=96)
    data = _ShortInTheMiddle(x, np.eye(3, dtype=np.float32)[ids], 16)
    with pytest.raises(ValueError, match="a batch of 5 samples before the PyDataset's last batch"):
        g.ggml_fit_generator(classifier(), data, epochs=1, verbose=0)


@pytest.mark.parametrize("kind", ["list", "pydataset"])
def test_validation_steps_validate_the_same_first_batches_every_epoch(kind):
    """Keras validates on the first validation_steps batches of its validation data each epoch; a list (or other
    re-iterable) went on through its batches across epochs, so each epoch validated on other data."""
    x, ids = blobs(n=96)
    y = np.eye(3, dtype=np.float32)[ids]
    val = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 96, 16)] if kind == "list" else _Batches(x, y, 16)
    if kind == "pydataset":
        val.on_epoch_end = lambda: None   # keeps its order (the class reshuffles, which Keras would see too)
    m = classifier()
    g.ggml_compile(m, optimizer="sgd", learning_rate=1e-9, loss="categorical_crossentropy", backend="cpu")
    h = g.ggml_fit_generator(m, [(x[:32], y[:32])], epochs=3, validation_data=val, validation_steps=2, verbose=0)
    want = g.ggml_evaluate(m, x[:32], y[:32])["loss"]
    np.testing.assert_allclose(h["val_loss"], [want] * 3, rtol=1e-5)


def test_fit_evaluate_and_predict_take_a_pydataset_with_a_short_last_batch_as_keras():
    """Keras' fit/evaluate/predict(PyDataset): ggml_fit trains it as a source (a short last batch completed with rows
    of itself), ggml_evaluate and ggml_predict go batch by batch and equal the same calls on the arrays."""
    x, ids = blobs(n=100)
    y = np.eye(3, dtype=np.float32)[ids]
    data = _Batches(x, y, 16, partial=True)     # 6 batches of 16 and one of 4
    m = classifier()
    h = g.ggml_fit(m, data, epochs=3, verbose=0)
    assert list(h["steps"]) == [7, 7, 7] and data.epochs_ended == 3
    assert h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]
    data.order = np.arange(100)
    got = g.ggml_evaluate(m, data)   # Keras' evaluate(PyDataset): the labels come from the dataset
    want = g.ggml_evaluate(m, x, y)
    assert got["n_samples"] == 100
    for key in ("loss", "accuracy"):
        assert got[key] == pytest.approx(want[key], rel=1e-5)
    assert data.epochs_ended == 4   # evaluate's one epoch ended too (it reshuffled the order)
    data.order = np.arange(100)
    np.testing.assert_allclose(g.ggml_predict(m, data), g.ggml_predict(m, x), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="validation_split cannot be used with a PyDataset-like x"):
        g.ggml_fit(m, data, validation_split=0.2, verbose=0)


def test_cosine_similarity_trains_rows_towards_their_labels_direction():
    """Keras' CosineSimilarity: -mean over samples of cos(p, y); the scale of the outputs is free."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(160, 4)).astype(np.float32)
    y = (x @ rng.normal(size=(4, 3)) * rng.uniform(0.5, 3, size=(160, 1))).astype(np.float32)
    np.random.seed(8)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 3, input_shape=(4,))
    m = g.ggml_compile(m, loss="cosine", metrics=[], backend="cpu", learning_rate=0.05)
    h = g.ggml_fit(m, x, y, epochs=30, batch_size=32, verbose=0)
    p = g.ggml_predict(m, x).astype(np.float64)
    keras = -np.mean(np.sum(p / np.linalg.norm(p, axis=1, keepdims=True) * y / np.linalg.norm(y, axis=1, keepdims=True),
                            axis=1))
    assert g.ggml_evaluate(m, x, y)["loss"] == pytest.approx(keras, rel=1e-5)
    assert keras < -0.95 and h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]
    assert m.compiled.heads[0].loss == "cosine_similarity"


@pytest.mark.parametrize("loss", ["kl_divergence", "kld", "hinge", "squared_hinge"])
def test_keras_losses_train_and_evaluate_as_keras_defines_them(loss):
    """KLDivergence on softmax outputs, Hinge / SquaredHinge on one linear output with 0/1 labels (Keras turns
    them into -1/1): ggml_evaluate's loss is Keras' formula on the predictions."""
    np.random.seed(6)
    x, ids = blobs(n=120)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 8, activation="tanh", input_shape=(4,))
    if loss in ("kl_divergence", "kld"):
        y = (np.eye(3)[ids] * 0.8 + 0.2 / 3).astype(np.float32)   # soft label distributions
        m = g.ggml_layer_dense(m, 3, activation="softmax")
    else:
        y = (ids == 0).astype(np.float32)
        m = g.ggml_layer_dense(m, 1)
    m = g.ggml_compile(m, loss=loss, metrics=[], backend="cpu", learning_rate=0.02)
    h = g.ggml_fit(m, x, y, epochs=15, batch_size=30, verbose=0)
    assert h["train_loss"].iloc[-1] < 0.8 * h["train_loss"].iloc[0]
    p = g.ggml_predict(m, x).astype(np.float64)
    if loss in ("kl_divergence", "kld"):
        yc, pc = np.clip(y, 1e-7, 1), np.clip(p, 1e-7, 1)
        keras = np.mean(np.sum(yc * np.log(yc / pc), axis=-1))
    else:
        signed = 2 * y.reshape(-1, 1) - 1
        margin = np.maximum(1 - signed * p, 0)
        keras = np.mean(margin if loss == "hinge" else margin ** 2)
    assert g.ggml_evaluate(m, x, y)["loss"] == pytest.approx(keras, rel=1e-5)


def _bce_data(n=48, seed=21):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = ((x[:, :2] + 0.3 * rng.normal(size=(n, 2))) > 0).astype(np.float32)
    return x, y


def test_binary_crossentropy_from_logits_follows_keras_formula_and_reads_sigmoid_for_metrics(tmp_path):
    """from_logits=True: the loss is Keras' stable form on the raw outputs, accuracy counts a logit > 0, the
    metrics read sigmoid(z); all checked in float64 numpy (and scikit-learn's AUC) on ggml_predict's logits."""
    x, y = _bce_data()
    np.random.seed(2)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(4,))
    m = g.ggml_compile(m, optimizer="sgd", loss="binary_crossentropy", from_logits=True, backend="cpu",
                       learning_rate=0.5, metrics=["accuracy", "auc", "precision"])
    h = g.ggml_fit(m, x, y, epochs=4, batch_size=16, verbose=0)
    assert h["train_loss"].iloc[-1] < h["train_loss"].iloc[0]
    z = g.ggml_predict(m, x).astype(np.float64)
    assert (z < 0).any() and (z > 1).any()  # logits, not probabilities
    s = 1 / (1 + np.exp(-z))
    want = np.mean(-(y * np.log(s) + (1 - y) * np.log(1 - s)))
    got = g.ggml_evaluate(m, x, y)
    assert got["loss"] == pytest.approx(want, rel=1e-5)
    assert got["accuracy"] == pytest.approx(np.mean((z > 0) == (y > 0.5)))
    tp, fp = ((s > 0.5) & (y > 0.5)).sum(), ((s > 0.5) & (y < 0.5)).sum()
    assert got["precision"] == pytest.approx(tp / (tp + fp))
    sklearn_metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is not installed")
    assert got["auc"] == pytest.approx(sklearn_metrics.roc_auc_score(y.ravel(), s.ravel()), abs=2e-3)  # 200 buckets
    g.ggml_save_model(m, tmp_path / "m.gguf")
    loaded = g.ggml_load_model(tmp_path / "m.gguf", backend="cpu")
    assert loaded.compiled.heads[0].loss_type == g.ggml_opt_loss_type_binary_cross_entropy_logits()
    assert g.ggml_evaluate(loaded, x, y)["loss"] == pytest.approx(got["loss"], rel=1e-6)


def test_binary_crossentropy_from_logits_trains_as_keras():
    import os
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras", reason="Keras 3 (with a backend) is not installed: the numpy check above "
                                               "still runs")
    x, y = _bce_data()
    np.random.seed(3)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(4,), name="d")
    m = g.ggml_compile(m, optimizer="sgd", loss="binary_crossentropy", from_logits=True, backend="cpu",
                       learning_rate=0.5)
    w0 = g.ggml_get_weights(m)
    km = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    km.set_weights([w0["d.weight"], w0["d.bias"]])
    km.compile(optimizer=keras.optimizers.SGD(0.5), loss=keras.losses.BinaryCrossentropy(from_logits=True),
               metrics=[keras.metrics.BinaryAccuracy(threshold=0.0)])
    kh = km.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0).history
    h = g.ggml_fit(m, x, y, epochs=3, batch_size=16, shuffle=False, verbose=0)
    np.testing.assert_allclose(h["train_loss"], kh["loss"], rtol=1e-5)
    np.testing.assert_allclose(h["train_accuracy"], kh["binary_accuracy"], atol=1e-6)
    np.testing.assert_allclose(g.ggml_get_weights(m)["d.weight"], km.get_weights()[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss, activation, from_logits, match", [
    ("binary_crossentropy", "sigmoid", True,
     "from_logits=True takes the raw outputs, but output 'd' ends in a sigmoid"),
    ("categorical_crossentropy", "softmax", True, "ends in a softmax; drop the activation"),
    ("categorical_crossentropy", None, False, "from_logits=False takes probabilities, but output 'd' does not end"),
    ("mse", None, True, "output 'd' is trained with mse"),
    ("binary_crossentropy", None, "yes", "from_logits must be True, False or None"),
    ("binary_crossentropy", None, [True, False], "from_logits must be True, False or None, or 1 of them"),
])
def test_from_logits_that_contradicts_the_output_is_refused(loss, activation, from_logits, match):
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 3, activation=activation, input_shape=(4,), name="d")
    with pytest.raises(g.GgmlValueError, match=match):
        g.ggml_compile(m, loss=loss, from_logits=from_logits, backend="cpu")


def test_from_logits_per_output_and_the_loss_constant():
    a = g.ggml_input(shape=(4,))
    h = g.ggml_layer_dense(a, 6, activation="relu")
    logits = g.ggml_layer_dense(h, 2, name="logits")
    probs = g.ggml_layer_dense(h, 2, activation="sigmoid", name="probs")
    m = g.ggml_compile(g.ggml_model(a, [logits, probs]), loss="binary_crossentropy",
                       from_logits={"logits": True, "probs": None}, backend="cpu")
    assert [hd.loss_type_name for hd in m.compiled.heads] == ["binary_cross_entropy_logits", "binary_cross_entropy"]
    x, y = _bce_data()
    hist = g.ggml_fit(m, x, [y, y], epochs=2, batch_size=16, verbose=0)
    assert np.isfinite(hist["train_loss"]).all()
    one = g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(4,))
    one = g.ggml_compile(one, loss=g.ggml_opt_loss_type_binary_cross_entropy_logits(), backend="cpu")
    assert one.compiled.heads[0].from_logits and one.compiled.heads[0].loss == "binary_crossentropy"


def test_a_batch_size_beyond_the_samples_trains_one_batch_of_all_of_them_as_keras():
    x, ids = blobs(7)
    m = classifier()
    h = g.ggml_fit(m, x, np.eye(3)[ids], epochs=3, batch_size=100, verbose=0)
    assert len(h) == 3 and m.runtime.opt_state.state["iter"] - 1 == 3   # one step of the 7 samples per epoch


def test_multi_output_accuracies_average_the_same_heads_in_training_and_validation(each_device):
    """Issue 26: train_accuracy averaged the heads that report one, val_accuracy all of them (the regression
    head's NaN included). A binary-cross-entropy, a categorical-cross-entropy and an MSE head; one step over the
    whole training set with a tiny learning rate, so the training accuracies are those of the weights before the
    step and the validation ones those after it, both computed in numpy from ggml_predict (Keras' binary accuracy:
    p > 0.5 against the 0/1 label, element-wise; categorical: argmax against argmax)."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(96, 4)).astype(np.float32)
    xv = rng.normal(size=(40, 4)).astype(np.float32)

    def labels(a):
        return [(a[:, :2] > 0).astype(np.float32), np.eye(3, dtype=np.float32)[np.argmax(a[:, 1:4], axis=1)],
                (a[:, :1] * 2 - a[:, 3:]).astype(np.float32)]

    inp = g.ggml_input(shape=(4,), name="x")
    h = g.ggml_layer_dense(inp, 8, activation="tanh")
    heads = [g.ggml_layer_dense(h, 2, activation="sigmoid", name="bin"),
             g.ggml_layer_dense(h, 3, activation="softmax", name="cat"), g.ggml_layer_dense(h, 1, name="reg")]
    m = g.ggml_compile(g.ggml_model(inp, heads), loss=["binary_crossentropy", "categorical_crossentropy", "mse"],
                       backend=each_device, learning_rate=1e-6, metrics=["accuracy"])

    def accuracies(a):
        p_bin, p_cat, _ = g.ggml_predict(m, a)
        y_bin, y_cat, _ = labels(a)
        assert np.abs(p_bin - 0.5).min() > 1e-4   # no prediction the rounding of another device could flip
        return [float(((p_bin > 0.5) == (y_bin > 0.5)).mean()), float((p_cat.argmax(1) == y_cat.argmax(1)).mean())]

    train_want = accuracies(x)
    hist = g.ggml_fit(m, x, labels(x), epochs=1, batch_size=96, validation_data=(xv, labels(xv)), verbose=0)
    val_want = accuracies(xv)
    assert not any(a in (0.0, 1.0) for a in train_want + val_want)
    assert hist["train_accuracy"].iloc[0] == pytest.approx(np.mean(train_want), abs=1e-6)
    assert hist["val_accuracy"].iloc[0] == pytest.approx(np.mean(val_want), abs=1e-6)
    for key, want in (("head_accuracy", train_want), ("val_head_accuracy", val_want)):
        per = hist.attrs[key]
        assert list(per.columns) == ["bin", "cat", "reg"]
        np.testing.assert_allclose(per.iloc[0][["bin", "cat"]].to_numpy(float), want, atol=1e-6)
        assert np.isnan(per.iloc[0]["reg"])


def test_evaluate_reads_a_generator_or_a_list_of_batches_without_y():
    """Keras' evaluate takes a generator of (x, y) batches; a function that is not a generator function is refused
    with what to give (it was 'expected numeric data, got dtype object')."""
    x, ids = blobs(n=48)
    y = np.eye(3, dtype=np.float32)[ids]
    m = classifier()
    want = g.ggml_evaluate(m, x, y)
    for source in (((x[i:i + 16], y[i:i + 16]) for i in range(0, 48, 16)), [(x[:20], y[:20]), (x[20:], y[20:])]):
        got = g.ggml_evaluate(m, source)
        assert got["n_samples"] == 48 and got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    with pytest.raises(TypeError, match="x is a function"):
        g.ggml_evaluate(m, lambda: iter([(x, y)]))
