"""Inputs with a variable size (``ggml_input(shape=(None, ...))``, Keras' ``Input(shape=(None,))``): each call's
data fixes the size, and each size gets graphs of its own. Checked against float64 numpy on the CPU and each GPU
device, through training steps of alternating lengths (SGD against numpy's gradients), against a model of fixed
size trained on the same data, and under misuse."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import ggmlpy as g


V, D = 7, 3


def _pooled_model(backend: str = "cpu", optimizer: str = "adamw", lr: float | None = None):
    """ids (None,) -> embedding (V, D) -> global average over the steps -> dense 2 (linear)."""
    x = g.ggml_input(shape=(None,), dtype="int32")
    h = g.ggml_layer_global_average_pooling_1d(g.ggml_layer_embedding(x, V, D, name="emb"))
    out = g.ggml_layer_dense(h, 2, name="d")
    return g.ggml_compile(g.ggml_model(x, out), loss="mse", optimizer=optimizer, learning_rate=lr, backend=backend)


def _pooled_reference(w: dict, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64: the mean embedding over each sequence's steps, and the dense layer on it."""
    emb, kernel, bias = (w[k].astype(np.float64) for k in ("emb.weight", "d.weight", "d.bias"))
    h = emb[ids].mean(axis=1)
    return h, h @ kernel + bias


def test_one_model_predicts_sequences_of_any_length_as_numpy(each_device):
    m = _pooled_model(each_device)
    w = g.ggml_get_weights(m)
    rng = np.random.default_rng(0)
    # float32 sums on a GPU: the tolerance of a few roundings of values ~1
    tol = 1e-6 if each_device == "cpu" else 1e-5
    for length in (1, 4, 11, 4):   # the graph of length 4 is built once and used again
        ids = rng.integers(0, V, size=(5, length))
        np.testing.assert_allclose(g.ggml_predict(m, ids, batch_size=3), _pooled_reference(w, ids)[1],
                                   rtol=tol, atol=tol)


def test_steps_on_alternating_lengths_follow_numpy_sgd():
    """One trainer, batches of lengths 3, 5, 3, 8, 2, 4, 6, 3: each step is plain SGD on that batch's MSE gradient
    (float64 numpy, by hand), so each length's graph trains the same weights and the optimizer carries across
    lengths, through graphs kept for a length stepped before and graphs made again after more lengths came."""
    lr = 0.2
    m = _pooled_model(optimizer="sgd", lr=lr)
    w = {k: v.astype(np.float64) for k, v in g.ggml_get_weights(m).items()}
    rng = np.random.default_rng(1)
    tr = g.ggml_trainer(m, batch_size=4)
    assert tr.get_lr() == pytest.approx(lr)   # before the first step (the graph is made there)
    for length in (3, 5, 3, 8, 2, 4, 6, 3):
        ids = rng.integers(0, V, size=(4, length))
        y = rng.normal(size=(4, 2))
        loss = tr.step(ids, y.astype(np.float32))
        w, want = _sgd_by_hand(w, ids, y, lr)
        assert loss == pytest.approx(want, rel=1e-5)
        got = g.ggml_get_weights(m)
        for k in w:
            np.testing.assert_allclose(got[k], w[k], rtol=1e-5, atol=1e-6, err_msg=f"length {length}: {k}")
    tr.free()


def test_a_variable_model_trains_as_the_fixed_model_of_the_datas_size():
    """An LSTM over (None,) ids, fit on sequences of 6 then evaluated and fit on 9, equals models built for (6,) and
    (9,) with the same starting weights and optimizer state (bit for bit: the same graphs)."""
    def build(steps):
        x = g.ggml_input(shape=(steps,), dtype="int32")
        h = g.ggml_layer_lstm(g.ggml_layer_embedding(x, V, 4, name="emb"), 5, name="rnn")
        out = g.ggml_layer_dense(h, 3, activation="softmax", name="d")
        return g.ggml_compile(g.ggml_model(x, out), loss="sparse_categorical_crossentropy", backend="cpu")
    rng = np.random.default_rng(2)
    data = {n: (rng.integers(0, V, size=(40, n)), rng.integers(0, 3, size=40)) for n in (6, 9)}
    var = build(None)
    start = g.ggml_get_weights(var)
    fixed6 = g.ggml_set_weights(build(6), start)
    for model in (var, fixed6):
        np.random.seed(5)
        g.ggml_fit(model, *data[6], epochs=2, batch_size=8, verbose=0)
    after6 = g.ggml_get_weights(var)
    for k, v in g.ggml_get_weights(fixed6).items():
        np.testing.assert_array_equal(after6[k], v)
    # the next fit, on sequences of 9, continues the same optimizer as a (9,) model given the (6,) model's state
    fixed9 = g.ggml_set_weights(build(9), after6)
    fixed9.runtime.opt_state.state = fixed6.runtime.opt_state.state
    assert g.ggml_evaluate(var, *data[9]) == g.ggml_evaluate(fixed9, *data[9])
    for model in (var, fixed9):
        np.random.seed(6)
        g.ggml_fit(model, *data[9], epochs=1, batch_size=8, verbose=0)
    for k, v in g.ggml_get_weights(fixed9).items():
        np.testing.assert_array_equal(g.ggml_get_weights(var)[k], v)


def test_labels_per_step_take_the_length_of_their_sequences():
    """Sequence tagging: a class per step of a (None,) input; the labels' length must be x's."""
    x = g.ggml_input(shape=(None,), dtype="int32")
    out = g.ggml_layer_dense(g.ggml_layer_embedding(x, V, 4), 3, activation="softmax")
    m = g.ggml_compile(g.ggml_model(x, out), loss="sparse_categorical_crossentropy", backend="cpu")
    rng = np.random.default_rng(3)
    for length in (4, 7):
        ids = rng.integers(0, V, size=(16, length))
        h = g.ggml_fit(m, ids, ids % 3, epochs=2, batch_size=8, verbose=0)
        assert np.isfinite(h["train_loss"]).all()
        assert g.ggml_predict(m, ids).shape == (16, length, 3)
    with pytest.raises(g.GgmlValueError, match=r"class ids of samples \(5,\).*make outputs of \(7, 3\)"):
        g.ggml_fit(m, ids, rng.integers(0, 3, size=(16, 5)), verbose=0)


def _sgd_by_hand(w: dict, ids: np.ndarray, y: np.ndarray, lr: float) -> tuple[dict, float]:
    """One SGD step of the pooled model on Keras' MSE in float64: the new weights and the batch's loss."""
    length = ids.shape[1]
    h, o = _pooled_reference(w, ids)
    d_o = 2 * (o - y) / o.size                      # Keras' mse: the mean over samples and units
    d_h = d_o @ w["d.weight"].T
    grad_emb = np.zeros_like(w["emb.weight"])
    np.add.at(grad_emb, ids, np.repeat(d_h[:, None, :] / length, length, axis=1))
    new = {"emb.weight": w["emb.weight"] - lr * grad_emb, "d.weight": w["d.weight"] - lr * h.T @ d_o,
           "d.bias": w["d.bias"] - lr * d_o.sum(axis=0)}
    return new, float(np.mean((o - y) ** 2))


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_stream_of_batches_of_several_lengths_trains_as_numpy_sgd(prefetch):
    """ggml_fit_generator over batches of lengths 4, 6, 4, 7, 6 (a graph per length, the optimizer moving between
    them), two epochs: every weight and each epoch's loss as plain SGD in float64 numpy, step by step."""
    lr = 0.2
    m = _pooled_model(optimizer="sgd", lr=lr)
    w = {k: v.astype(np.float64) for k, v in g.ggml_get_weights(m).items()}
    rng = np.random.default_rng(4)
    batches = [(rng.integers(0, V, size=(4, n)), rng.normal(size=(4, 2)).astype(np.float32)) for n in (4, 6, 4, 7, 6)]
    h = g.ggml_fit_generator(m, batches, epochs=2, verbose=0, prefetch=prefetch)
    for epoch in range(2):
        losses = []
        for ids, y in batches:
            w, loss = _sgd_by_hand(w, ids, y.astype(np.float64), lr)
            losses.append(loss)
        assert h["train_loss"].iloc[epoch] == pytest.approx(np.mean(losses), rel=1e-5)
    for k, v in g.ggml_get_weights(m).items():
        np.testing.assert_allclose(v, w[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_stream_of_several_lengths_continues_adams_moments_as_one_trainer():
    """AdamW over a stream of lengths 5, 3, 5, 8, 3 (with MAE compiled: one sum over every length's steps) ends
    bit-equal to a trainer stepping the same batches (the trainer is checked against fixed-size models above), and
    a second fit continues from it."""
    rng = np.random.default_rng(14)
    batches = [(rng.integers(0, V, size=(4, n)), rng.normal(size=(4, 2)).astype(np.float32)) for n in (5, 3, 5, 8, 3)]
    fit, stepped = _pooled_model(), _pooled_model()
    g.ggml_set_weights(stepped, g.ggml_get_weights(fit))
    fit = g.ggml_compile(fit, loss="mse", metrics=["mae"], backend="cpu")   # keeps the weights
    h = g.ggml_fit_generator(fit, batches, epochs=2, verbose=0)
    assert np.isfinite(h["train_mae"]).all()
    tr = g.ggml_trainer(stepped, batch_size=4)
    for _ in range(2):
        for ids, y in batches:
            tr.step(ids, y)
    tr.free()
    for k, v in g.ggml_get_weights(stepped).items():
        np.testing.assert_array_equal(g.ggml_get_weights(fit)[k], v, err_msg=k)
    assert fit.runtime.opt_state.state is not None


def test_a_variable_model_saves_loads_and_pickles(tmp_path):
    m = _pooled_model()
    ids = np.random.default_rng(5).integers(0, V, size=(3, 5))
    g.ggml_save_model(m, tmp_path / "m.gguf")
    for again in (g.ggml_load_model(tmp_path / "m.gguf"), pickle.loads(pickle.dumps(m))):
        assert again.inputs[0].shape == (None,)
        np.testing.assert_array_equal(g.ggml_predict(again, ids), g.ggml_predict(m, ids))
    assert "(None, None)" in m.summary()


def test_variable_sizes_refused_where_they_cannot_hold():
    with pytest.raises(g.GgmlValueError, match=r"weights would depend on the variable size"):
        g.ggml_layer_dense(g.ggml_layer_flatten(g.ggml_input(shape=(None, 2))), 3)
    conv = g.ggml_layer_conv_1d(g.ggml_input(shape=(None, 2)), 4, 3)    # a kernel of 3: sequences of 3 and more
    out = g.ggml_layer_dense(g.ggml_layer_global_max_pooling_1d(conv), 1)
    m = g.ggml_compile(g.ggml_model(conv.inputs[0], out), loss="mse", backend="cpu")
    assert g.ggml_predict(m, np.ones((2, 3, 2), np.float32)).shape == (2, 1)
    with pytest.raises(g.GgmlValueError, match="kernel of 3 does not fit an input of 2"):
        g.ggml_predict(m, np.ones((2, 2, 2), np.float32))
    with pytest.raises(g.GgmlValueError, match=r"no values along a variable size"):
        g.ggml_predict(m, np.ones((2, 0, 2), np.float32))
    with pytest.raises(g.GgmlValueError, match=r"must have shape \(N, None, 2\).*None is a size that may vary"):
        g.ggml_predict(m, np.ones((2, 5, 3), np.float32))
    seq = g.ggml_input(shape=(None, 2))
    with pytest.raises(g.GgmlValueError, match="last size varies with the data"):
        g.ggml_compile(g.ggml_model(seq, g.ggml_layer_flatten(seq)), loss="mse", backend="cpu")


def test_images_of_any_size():
    """(None, None, C) images through a convolution and a global pooling, against numpy (a 1x1 kernel: each
    pixel's channels times the kernel, then the mean)."""
    x = g.ggml_input(shape=(None, None, 2))
    h = g.ggml_layer_global_average_pooling_2d(g.ggml_layer_conv_2d(x, 3, (1, 1), name="c"))
    m = g.ggml_compile(g.ggml_model(x, h), loss="mse", backend="cpu")
    w = g.ggml_get_weights(m)
    kernel = w["c.kernel"].astype(np.float64).reshape(2, 3).T  # Keras' (1, 1, channels, filters)
    rng = np.random.default_rng(6)
    for hw in ((4, 5), (7, 3)):
        img = rng.normal(size=(2, *hw, 2))
        want = (img.reshape(2, -1, 2) @ kernel.T).mean(axis=1) + w["c.bias"].astype(np.float64).reshape(-1)
        np.testing.assert_allclose(g.ggml_predict(m, img.astype(np.float32)), want, rtol=1e-5, atol=1e-6)


def test_the_predictor_keeps_a_few_graphs_as_lengths_change():
    m = _pooled_model()
    w = g.ggml_get_weights(m)
    rng = np.random.default_rng(7)
    for length in range(1, 40):
        ids = rng.integers(0, V, size=(2, length))
        np.testing.assert_allclose(g.ggml_predict(m, ids), _pooled_reference(w, ids)[1], rtol=1e-6, atol=1e-6)
    assert len(m.runtime.predictor._graphs) <= 4


def test_placement_and_profile_of_a_variable_model_take_its_sizes_as_32():
    m = _pooled_model()
    p = g.ggml_model_placement(m, batch_size=4)
    assert p.n_splits >= 1 and p.devices
    assert g.ggml_model_profile(m, batch_size=4, steps=1).by_op()
    x = g.ggml_input(shape=(None,), dtype="int32")     # labels per step: their length is the stand-in's too
    out = g.ggml_layer_dense(g.ggml_layer_embedding(x, V, 4), 3, activation="softmax")
    tagger = g.ggml_compile(g.ggml_model(x, out), loss="sparse_categorical_crossentropy", backend="cpu")
    assert g.ggml_model_placement(tagger, batch_size=2).n_splits >= 1


def test_a_layer_of_at_most_so_many_steps_takes_variable_lengths_up_to_them():
    """A position embedding of 6 positions over (None,) ids: any length up to 6 (its first positions), against
    numpy; a longer one is refused naming the limit."""
    x = g.ggml_input(shape=(None,), dtype="int32")
    out = g.ggml_layer_position_embedding(g.ggml_layer_embedding(x, V, D, name="emb"), 6, name="pos")
    m = g.ggml_compile(g.ggml_model(x, out), loss="mse", backend="cpu")
    w = g.ggml_get_weights(m)
    assert w["pos.weight"].shape == (6, D)
    ids = np.random.default_rng(8).integers(0, V, size=(2, 4))
    np.testing.assert_allclose(g.ggml_predict(m, ids), w["emb.weight"][ids] + w["pos.weight"][:4], rtol=1e-6)
    with pytest.raises(g.GgmlValueError, match="at most 6 steps"):
        g.ggml_predict(m, np.zeros((2, 7), np.int64))


def test_padding_masks_hold_for_any_length():
    """Embedding(mask_zero=True) into a bidirectional LSTM: trailing padding changes nothing, whatever the length
    (the same sequences with and without two padded steps: two graphs, one answer)."""
    x = g.ggml_input(shape=(None,), dtype="int32")
    h = g.ggml_layer_bidirectional(g.ggml_layer_embedding(x, 10, 4, mask_zero=True), g.ggml_lstm(5))
    m = g.ggml_compile(g.ggml_model(x, g.ggml_layer_dense(h, 2)), loss="mse", backend="cpu")
    ids = np.random.default_rng(9).integers(1, 10, size=(3, 4))
    padded = np.concatenate([ids, np.zeros((3, 2), np.int64)], axis=1)
    np.testing.assert_allclose(g.ggml_predict(m, padded), g.ggml_predict(m, ids), rtol=1e-6, atol=1e-7)


def test_data_parallel_replicas_build_each_length_as_one_device():
    """A model on the CPU and a GPU (replicas): predictions and a fit at two lengths, against numpy and a one-device
    model from the same weights."""
    if g.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("no Vulkan device for a second replica (GGML_VK_VISIBLE_DEVICES=0 selects Mesa's lavapipe)")
    both = _pooled_model(["cpu", "Vulkan0"], optimizer="sgd", lr=0.1)
    one = g.ggml_set_weights(_pooled_model("cpu", optimizer="sgd", lr=0.1), g.ggml_get_weights(both))
    rng = np.random.default_rng(10)
    for length in (3, 6):
        ids, y = rng.integers(0, V, size=(8, length)), rng.normal(size=(8, 2)).astype(np.float32)
        np.testing.assert_allclose(g.ggml_predict(both, ids), _pooled_reference(g.ggml_get_weights(both), ids)[1],
                                   rtol=1e-5, atol=1e-5)
        for model in (both, one):
            g.ggml_fit(model, ids, y, epochs=1, batch_size=8, shuffle=False, verbose=0)
        for k, v in g.ggml_get_weights(one).items():
            np.testing.assert_allclose(g.ggml_get_weights(both)[k], v, rtol=1e-5, atol=1e-6)


def test_metrics_summed_on_the_device_take_each_lengths_outputs(monkeypatch):
    """A tagger over (None,) ids with compiled accuracy, MAE and AUC summed on the device (the CPU forced onto the
    GPU's path): its budget is sized from the data's length, and the metrics equal numpy's on the outputs read
    after the fit (one SGD step of lr 1e-30: the weights do not move)."""
    from ggmlpy.models.engine import training_runner
    monkeypatch.setattr(training_runner, "computes_on_host", lambda backend: False)
    x = g.ggml_input(shape=(None,), dtype="int32")
    out = g.ggml_layer_dense(g.ggml_layer_embedding(x, V, 4), 3, activation="softmax")
    m = g.ggml_compile(g.ggml_model(x, out), loss="sparse_categorical_crossentropy", optimizer="sgd",
                       learning_rate=1e-30, metrics=["mae"], backend="cpu")
    rng = np.random.default_rng(11)
    for length in (4, 9):
        ids = rng.integers(0, V, size=(8, length))
        labels = rng.integers(0, 3, size=(8, length))
        h = g.ggml_fit(m, ids, labels, epochs=1, batch_size=8, shuffle=False, verbose=0)
        p = g.ggml_predict(m, ids).astype(np.float64)
        onehot = np.eye(3)[labels]
        assert h["train_mae"].iloc[0] == pytest.approx(np.abs(p - onehot).mean(), rel=1e-5)


def test_accuracy_over_batches_of_different_lengths_counts_every_step():
    """Keras' accuracy of a tagger is the share of all steps classified right: a batch of 10 steps per sample
    weighs five times one of 2 (not each sample's share, averaged)."""
    x = g.ggml_input(shape=(None,), dtype="int32")
    out = g.ggml_layer_dense(g.ggml_layer_embedding(x, V, 4), 3, activation="softmax")
    m = g.ggml_compile(g.ggml_model(x, out), loss="sparse_categorical_crossentropy", backend="cpu")
    rng = np.random.default_rng(12)
    batches = [(rng.integers(0, V, size=(4, n)), rng.integers(0, 3, size=(4, n))) for n in (2, 10)]
    right = [g.ggml_predict(m, ids).argmax(axis=-1) == labels for ids, labels in batches]
    want = sum(r.sum() for r in right) / sum(r.size for r in right)
    assert want != pytest.approx(np.mean([r.mean(axis=1) for r in right]))   # the two rules differ on this data
    assert g.ggml_evaluate(m, batches)["accuracy"] == pytest.approx(want)


def test_stand_in_sizes_reach_long_kernels_and_large_strides():
    """A kernel longer than the small stand-in sizes still builds (as Keras builds it), and a stride larger than the
    gap between two stand-ins still leaves the size variable (a dense layer after its flatten is refused)."""
    x = g.ggml_input(shape=(None, 1))
    conv = g.ggml_layer_conv_1d(x, 2, 1500)
    assert conv.shape == (None, 2)
    m = g.ggml_compile(g.ggml_model(x, g.ggml_layer_global_max_pooling_1d(conv)), loss="mse", backend="cpu")
    assert g.ggml_predict(m, np.ones((1, 1600, 1), np.float32)).shape == (1, 2)
    pooled = g.ggml_layer_max_pooling_1d(x, 2, strides=4096)
    assert pooled.shape == (None, 1)
    with pytest.raises(g.GgmlValueError, match="weights would depend on the variable size"):
        g.ggml_layer_dense(g.ggml_layer_flatten(pooled), 3)
    with pytest.raises(g.GgmlValueError, match=r"kernel of 300000.*of the sizes from 2 to 262,139 tried"):
        g.ggml_layer_conv_1d(x, 2, 300000)


def test_a_trainer_carries_adams_moments_across_lengths_as_fixed_models_would():
    """AdamW through one trainer at lengths 4, 6, 4 (the graph of 4 kept and used again) equals three trainers of
    models built for (4,), (6,), (4,), each given the weights and the optimizer state the one before left: bit for
    bit (the same graphs), so the kept graph's optimizer takes the moments of the steps between."""
    def build(steps):
        x = g.ggml_input(shape=(steps,), dtype="int32")
        h = g.ggml_layer_global_average_pooling_1d(g.ggml_layer_embedding(x, V, D, name="emb"))
        return g.ggml_compile(g.ggml_model(x, g.ggml_layer_dense(h, 2, name="d")), loss="mse", backend="cpu")
    rng = np.random.default_rng(13)
    batches = [(rng.integers(0, V, size=(4, n)), rng.normal(size=(4, 2)).astype(np.float32)) for n in (4, 6, 4)]
    var = build(None)
    weights, state = g.ggml_get_weights(var), None
    tr = g.ggml_trainer(var, batch_size=4)
    for ids, y in batches:
        tr.step(ids, y)
        fixed = g.ggml_set_weights(build(ids.shape[1]), weights)
        fixed.runtime.opt_state.state = state
        one = g.ggml_trainer(fixed, batch_size=4)
        one.step(ids, y)
        one.free()
        weights, state = g.ggml_get_weights(fixed), fixed.runtime.opt_state.state
        for k, v in weights.items():
            np.testing.assert_array_equal(g.ggml_get_weights(var)[k], v, err_msg=f"length {ids.shape[1]}: {k}")
    tr.free()


def test_a_stream_changes_length_between_logical_batches_only():
    """With nbatch_logical two batches make an optimizer step: lengths may change after each pair, and a change
    inside a pair (its gradients accumulated in one length's graph) is refused, saying so."""
    rng = np.random.default_rng(15)
    pairs = [(rng.integers(0, V, size=(4, n)), rng.normal(size=(4, 2)).astype(np.float32)) for n in (4, 4, 6, 6)]
    h = g.ggml_fit_generator(_pooled_model(), pairs, epochs=2, nbatch_logical=8, verbose=0)
    assert np.isfinite(h["train_loss"]).all()
    mixed = [pairs[0], pairs[2]]
    with pytest.raises(g.GgmlStateError, match=r"inside a logical batch.*group the batches by length"), \
            pytest.warns(g.GgmlpyWarning, match="1 batches into a logical batch"):  # the fit's end says what it drops
        g.ggml_fit_generator(_pooled_model(), mixed, epochs=1, nbatch_logical=8, verbose=0)


@pytest.mark.parametrize("optimizer", ["rmsprop", "sgd"])
def test_a_mixed_length_stream_takes_schedules_and_graph_optimizers(optimizer):
    """A learning-rate schedule (set on the loop's runner) reaches every length's graph, and RMSprop (an optimizer
    run as a graph of its own) moves between them: the fit equals a trainer stepping the same batches with the
    same rates, bit for bit."""
    rng = np.random.default_rng(16)
    batches = [(rng.integers(0, V, size=(6, n)), rng.normal(size=(6, 2)).astype(np.float32)) for n in (4, 6, 4, 7)]
    fit, stepped = _pooled_model(optimizer=optimizer, lr=0.1), _pooled_model(optimizer=optimizer, lr=0.1)
    g.ggml_set_weights(stepped, g.ggml_get_weights(fit))
    schedule = g.ggml_schedule_learning_rate(lambda epoch, lr: 0.1 if epoch < 2 else 1e-4)   # Keras': from 0
    g.ggml_fit_generator(fit, batches, epochs=3, verbose=0, callbacks=[schedule])
    tr = g.ggml_trainer(stepped, batch_size=6)
    for epoch in range(3):
        tr.set_lr(0.1 if epoch < 2 else 1e-4)
        for ids, y in batches:
            tr.step(ids, y)
    tr.free()
    for k, v in g.ggml_get_weights(stepped).items():
        np.testing.assert_array_equal(g.ggml_get_weights(fit)[k], v, err_msg=k)


def test_a_trainer_saves_and_reports_the_latest_optimizer_state_across_lengths(tmp_path):
    """After steps at lengths 4 then 6, the trainer's optimizer state (and a saved file's) is the latest: a model
    loaded from the file continues exactly as the trainer does; inside a logical batch a change of length is
    refused, and so is saving."""
    rng = np.random.default_rng(17)
    batches = [(rng.integers(0, V, size=(4, n)), rng.normal(size=(4, 2)).astype(np.float32)) for n in (4, 6, 4)]
    m = _pooled_model()
    tr = g.ggml_trainer(m, batch_size=4)
    tr.step(*batches[0])
    tr.step(*batches[1])
    assert tr.optimizer_state()["iter"] == 2 + 1   # ggml counts from 1: two steps taken, across two graphs
    tr.save(tmp_path / "m.gguf")
    tr.step(*batches[2])
    again = g.ggml_load_model(tmp_path / "m.gguf")
    with g.ggml_trainer(again, batch_size=4) as resumed:
        resumed.step(*batches[2])
    for k, v in g.ggml_get_weights(m).items():
        np.testing.assert_array_equal(g.ggml_get_weights(again)[k], v, err_msg=k)
    tr.free()
    logical = g.ggml_trainer(_pooled_model(), batch_size=4, nbatch_logical=8)
    logical.step(*batches[0])
    with pytest.raises(g.GgmlStateError, match="inside a logical batch"):
        logical.step(*batches[1])
    with pytest.raises(g.GgmlStateError, match="logical batch"):
        logical.save(tmp_path / "n.gguf")
    logical.discard()


def test_a_snapshot_mid_stream_resumes_exactly_and_a_broken_stream_keeps_its_steps(tmp_path):
    """Saved with its optimizer by a callback at the end of epoch 1 of a mixed-length stream, a model resumed from
    the file ends epoch 2 bit-equal to the fit; a stream that breaks after a change of length keeps the steps it
    took (the state the next fit continues from)."""
    rng = np.random.default_rng(18)
    batches = [(rng.integers(0, V, size=(4, n)), rng.normal(size=(4, 2)).astype(np.float32)) for n in (4, 6, 5, 7)]
    m = _pooled_model()

    def broken():
        yield batches[0]
        yield batches[1]
        raise RuntimeError("the source broke")
    with pytest.raises(RuntimeError, match="the source broke"):
        g.ggml_fit_generator(m, broken, epochs=1, verbose=0)
    assert m.runtime.opt_state.state["iter"] == 3         # two steps (ggml counts from 1), the second at length 6

    class Snapshot:
        def on_epoch_end(self, epoch, logs=None, state=None):
            g.ggml_save_model(m, tmp_path / f"e{epoch}.gguf", include_optimizer=True)
    g.ggml_fit_generator(m, batches, epochs=2, verbose=0, callbacks=[Snapshot()])
    resumed = g.ggml_load_model(tmp_path / "e1.gguf")
    g.ggml_fit_generator(resumed, batches, epochs=1, verbose=0)
    for k, v in g.ggml_get_weights(m).items():
        np.testing.assert_array_equal(g.ggml_get_weights(resumed)[k], v, err_msg=k)
