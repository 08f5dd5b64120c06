"""Data-parallel training: gradient-only opt contexts (patches/0021) and replicas of a model on several devices.

The references are independent of the replica code: numpy float64 for the accumulated gradients, and for the
replicas the single-device training of the same model (ggml-opt's own fused step on the whole batch), which the
K-replica run must follow to float32 tolerance. Two local devices here are the CPU and Vulkan (lavapipe in CI);
loopback RPC servers are tested in tests/backend/test_rpc.py.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G


def _vulkan_or_skip() -> str:
    if "vulkan" not in G.ggml_backends_built():
        pytest.skip("the Vulkan backend is not built in this installation (GGMLPY_BACKENDS): no second local device")
    if G.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("this machine has no Vulkan0 device (CI uses Mesa's lavapipe): no second local device")
    return "Vulkan0"


# ---------------------------------------------------------------- gradient-only opt contexts

def test_a_gradient_only_context_accumulates_numpys_gradient_and_never_steps(backend):
    rng = np.random.default_rng(3)
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 8))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 2))
    out = G.ggml_mul_mat(ctx, w, x)
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    sched = G.ggml_backend_sched_new([backend], parallel=False)
    W = rng.normal(size=(2, 3)).astype(np.float32)
    G.ggml_backend_tensor_set_data(w, W)
    opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), ctx_compute=ctx, inputs=x, outputs=out,
                          build_type=G.ggml_opt_build_type_grad())
    try:
        batches = [(rng.normal(size=(8, 3)), rng.normal(size=(8, 2))) for _ in range(2)]
        expected = np.zeros((2, 3))
        for X, Y in batches:
            G.ggml_opt_alloc(opt, True)
            G.ggml_backend_tensor_set_data(x, X.astype(np.float32))
            G.ggml_backend_tensor_set_data(G.ggml_opt_labels(opt), Y.astype(np.float32))
            G.ggml_opt_eval(opt, None)
            # MSE over all 16 outputs: d/dW mean((W X^T - Y^T)^2) = 2/16 (W X^T - Y^T) X
            expected += 2.0 / 16 * ((W.astype(np.float64) @ X.T - Y.T) @ X)
            acc = G.ggml_backend_tensor_get_data(G.ggml_opt_grad_acc(opt, w)).reshape(2, 3)
            np.testing.assert_allclose(acc, expected, rtol=2e-5, atol=1e-6)
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(w).reshape(2, 3), W)  # no step
        G.ggml_opt_reset(opt, False)
        assert not G.ggml_backend_tensor_get_data(G.ggml_opt_grad_acc(opt, w)).any()
    finally:
        opt.free()
        sched.free()
        buf.free()
        ctx.free()


def test_split_counts_follow_the_shares():
    from ggmlpy.training.replicas import split_counts
    assert split_counts(32, [1, 1]) == [16, 16]
    assert split_counts(33, [1, 1]) == [17, 16]
    assert split_counts(100, [3, 1]) == [75, 25]
    assert split_counts(10, [1, 1, 1]) == [4, 3, 3]
    assert sum(split_counts(7, [0.1, 5, 2.5])) == 7


# ---------------------------------------------------------------- replicas of a model

def _data(n=96, f=6, classes=3, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, f)).astype(np.float32)
    y = np.eye(classes, dtype=np.float32)[(x[:, 0] + x[:, 1] > 0).astype(int) + (x[:, 2] > 1)]
    return x, y


def _mlp(backend, optimizer="adam", shares=None, batch_norm=False, dropout=0.0, seed=0, **settings):
    np.random.seed(seed)
    m = G.ggml_model_sequential()
    m = G.ggml_layer_dense(m, 12, activation="relu", input_shape=(6,))
    if batch_norm:
        m = G.ggml_layer_batch_norm(m)
    if dropout:
        m = G.ggml_layer_dropout(m, dropout)
    m = G.ggml_layer_dense(m, 3, activation="softmax")
    settings = {"loss": "categorical_crossentropy", **settings}
    return G.ggml_compile(m, optimizer=optimizer, backend=backend, shares=shares, learning_rate=0.01, **settings)


def _fit(model, x, y, **kw):
    np.random.seed(7)  # the shuffles
    return G.ggml_fit(model, x, y, verbose=0, **kw)


def _same_trajectory(single, multi, h1, h2, rtol=2e-5):
    np.testing.assert_allclose(h2["train_loss"], h1["train_loss"], rtol=rtol, atol=1e-6)
    np.testing.assert_allclose(h2["train_accuracy"], h1["train_accuracy"], atol=1e-6)
    w1, w2 = G.ggml_get_weights(single), G.ggml_get_weights(multi)
    assert w1.keys() == w2.keys()
    for k in w1:
        np.testing.assert_allclose(w2[k], w1[k], rtol=1e-4, atol=2e-6, err_msg=k)


@pytest.mark.vulkan
@pytest.mark.parametrize("optimizer, settings", [("adam", {}), ("sgd", {}), ("rmsprop", {"momentum": 0.5}),
                                                 ("sgd", {"momentum": 0.9, "clipnorm": 0.5}),
                                                 ("adam", {"global_clipnorm": 0.1})])
def test_two_replicas_follow_the_single_device_trajectory(optimizer, settings):
    dev = _vulkan_or_skip()
    x, y = _data()
    single, multi = _mlp("cpu", optimizer, **settings), _mlp(["cpu", dev], optimizer, **settings)
    h1 = _fit(single, x, y, epochs=4, batch_size=16, validation_split=0.25)
    h2 = _fit(multi, x, y, epochs=4, batch_size=16, validation_split=0.25)
    _same_trajectory(single, multi, h1, h2)
    np.testing.assert_allclose(h2["val_loss"], h1["val_loss"], rtol=2e-5)
    assert h2["train_loss"].iloc[-1] < h2["train_loss"].iloc[0]  # it trains


@pytest.mark.vulkan
def test_uneven_shares_and_gradient_accumulation_stay_exact():
    dev = _vulkan_or_skip()
    x, y = _data()
    single, multi = _mlp("cpu"), _mlp([dev, "cpu"], shares=[3, 1])
    h1 = _fit(single, x, y, epochs=3, batch_size=12, nbatch_logical=24)
    h2 = _fit(multi, x, y, epochs=3, batch_size=12, nbatch_logical=24)
    _same_trajectory(single, multi, h1, h2)


@pytest.mark.vulkan
def test_weights_set_by_a_callback_reach_every_replica():
    """ggml_set_weights (or a load) from a callback during a data-parallel fit changed the first replica only: the
    others computed their gradients on the old weights until the next optimizer step sent them the new ones. The
    trajectory with such a callback is the single device's."""
    dev = _vulkan_or_skip()
    x, y = _data()

    def halve(model):
        def on_epoch_end(epoch, logs, state):
            if epoch == 1:
                G.ggml_set_weights(model, {k: v * 0.5 for k, v in G.ggml_get_weights(model).items()})
        return {"on_epoch_end": on_epoch_end}
    single, multi = _mlp("cpu", "sgd"), _mlp(["cpu", dev], "sgd")
    h1 = _fit(single, x, y, epochs=3, batch_size=16, shuffle=False, callbacks=[halve(single)])
    h2 = _fit(multi, x, y, epochs=3, batch_size=16, shuffle=False, callbacks=[halve(multi)])
    _same_trajectory(single, multi, h1, h2)


@pytest.mark.vulkan
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_copy_keeps_the_devices_and_their_shares(how):
    """pickle and deepcopy dropped ``shares``: the copy split its batches equally."""
    import copy
    import pickle
    dev = _vulkan_or_skip()
    m = _mlp([dev, "cpu"], shares=[3, 1])
    twin = pickle.loads(pickle.dumps(m)) if how == "pickle" else copy.deepcopy(m)
    assert twin.compiled.backend == [dev, "cpu"] and twin.runtime.shares == [3.0, 1.0]
    x, y = _data()
    h1, h2 = _fit(m, x, y, epochs=2, batch_size=12), _fit(twin, x, y, epochs=2, batch_size=12)
    np.testing.assert_allclose(h2["train_loss"], h1["train_loss"], rtol=1e-6)


@pytest.mark.vulkan
def test_a_file_loaded_onto_other_devices_does_not_take_their_shares(tmp_path):
    """Shares belong to the devices they were given for: loaded onto the same list, kept; onto another, equal."""
    dev = _vulkan_or_skip()
    G.ggml_save_model(_mlp([dev, "cpu"], shares=[3, 1]), tmp_path / "m.gguf")
    assert G.ggml_load_model(tmp_path / "m.gguf", backend=[dev, "cpu"]).runtime.shares == [3.0, 1.0]
    assert G.ggml_load_model(tmp_path / "m.gguf", backend=["cpu", dev]).runtime.shares == [1.0, 1.0]


@pytest.mark.vulkan
def test_weights_set_after_the_last_step_reach_every_replica():
    """Keras' restore-best pattern: a callback sets the weights in the last epoch's end. The fit ended by marking the
    replicas in step with the model, so they kept the trained weights and predicted with them."""
    dev = _vulkan_or_skip()
    x, y = _data()
    m = _mlp(["cpu", dev], "sgd")

    def zero_at_the_end(epoch, logs, state):
        if epoch == 2:
            G.ggml_set_weights(m, {k: np.zeros_like(v) for k, v in G.ggml_get_weights(m).items()})
    _fit(m, x, y, epochs=2, batch_size=16, callbacks=[{"on_epoch_end": zero_at_the_end}])
    np.testing.assert_allclose(G.ggml_predict(m, x), np.full((len(x), 3), 1 / 3), rtol=1e-6)   # softmax of zeros


@pytest.mark.vulkan
def test_a_custom_loss_of_the_whole_batch_is_refused_for_replicas():
    """A custom loss returning one value per batch (a sum) was averaged over the replicas' shares: loss and
    gradients shrank by the number of devices. It is refused at compile; per-sample values train as on one
    device."""
    dev = _vulkan_or_skip()
    x, y = _data()

    def batch_sum(ctx, t, p):
        return G.ggml_sum(ctx, G.ggml_sqr(ctx, G.ggml_sub(ctx, p, t)))

    def per_element(ctx, t, p):
        return G.ggml_sqr(ctx, G.ggml_sub(ctx, p, t))
    with pytest.raises(G.GgmlValueError, match="one value per batch.*several devices"):
        _mlp(["cpu", dev], "sgd", loss=batch_sum)
    _mlp("cpu", "sgd", loss=batch_sum)    # one device: the batch's value is the loss
    single, multi = _mlp("cpu", "sgd", loss=per_element), _mlp(["cpu", dev], "sgd", loss=per_element)
    h1 = _fit(single, x, y, epochs=2, batch_size=16, shuffle=False)
    h2 = _fit(multi, x, y, epochs=2, batch_size=16, shuffle=False)
    _same_trajectory(single, multi, h1, h2)


@pytest.mark.vulkan
def test_the_optimizer_state_carries_across_fits_and_to_one_device():
    """Two data-parallel fits of one epoch continue one AdamW trajectory (moments and step count kept by the
    model), equal to one fit of two epochs on one device."""
    dev = _vulkan_or_skip()
    x, y = _data()
    single, multi = _mlp("cpu"), _mlp(["cpu", dev])
    h1 = _fit(single, x, y, epochs=2, batch_size=16, shuffle=False)
    a = _fit(multi, x, y, epochs=1, batch_size=16, shuffle=False)
    b = _fit(multi, x, y, epochs=1, batch_size=16, shuffle=False)
    np.testing.assert_allclose([a["train_loss"].iloc[0], b["train_loss"].iloc[0]], h1["train_loss"], rtol=2e-5)
    for k, v in G.ggml_get_weights(single).items():
        np.testing.assert_allclose(G.ggml_get_weights(multi)[k], v, rtol=1e-4, atol=2e-6)


@pytest.mark.vulkan
def test_predict_evaluate_and_trainer_split_their_batches():
    dev = _vulkan_or_skip()
    x, y = _data(n=50)
    single, multi = _mlp("cpu"), _mlp(["cpu", dev])
    np.testing.assert_allclose(G.ggml_predict(multi, x, batch_size=7), G.ggml_predict(single, x, batch_size=7),
                               rtol=1e-5, atol=1e-6)
    assert G.ggml_evaluate(multi, x, y)["loss"] == pytest.approx(G.ggml_evaluate(single, x, y)["loss"], rel=1e-5)
    with G.ggml_trainer(single, batch_size=10) as t1, G.ggml_trainer(multi, batch_size=10) as t2:
        for i in range(0, 50, 10):
            assert t2.step(x[i:i + 10], y[i:i + 10]) == pytest.approx(t1.step(x[i:i + 10], y[i:i + 10]), rel=1e-5)
    for k, v in G.ggml_get_weights(single).items():
        np.testing.assert_allclose(G.ggml_get_weights(multi)[k], v, rtol=1e-4, atol=2e-6)


@pytest.mark.vulkan
def test_weights_set_by_the_user_reach_every_replica():
    dev = _vulkan_or_skip()
    x, _ = _data(n=20)
    single, multi = _mlp("cpu", seed=1), _mlp(["cpu", dev], seed=2)
    G.ggml_set_weights(multi, G.ggml_get_weights(single))
    np.testing.assert_allclose(G.ggml_predict(multi, x, batch_size=20), G.ggml_predict(single, x, batch_size=20),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.vulkan
def test_restored_best_weights_reach_every_replica():
    """restore_best_weights writes the best epoch's weights into the first replica at the end of a fit: the
    others get them too, so every row of a split prediction comes from the restored weights."""
    dev = _vulkan_or_skip()
    x, y = _data(n=40)
    multi, single = _mlp(["cpu", dev], seed=3), _mlp("cpu", seed=3)
    stop = G.ggml_callback_early_stopping("train_loss", patience=1, restore_best_weights=True, min_delta=10.0)
    _fit(multi, x, y, epochs=4, batch_size=8, callbacks=[stop])  # no epoch improves by 10: epoch 1's weights
    G.ggml_set_weights(single, G.ggml_get_weights(multi))
    np.testing.assert_allclose(G.ggml_predict(multi, x, batch_size=40), G.ggml_predict(single, x, batch_size=40),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.vulkan
def test_batch_norm_and_dropout_train_with_per_replica_batches():
    """Batch statistics are each replica's (as DDP): not the single-device trajectory, but one set of weights,
    the first replica's running statistics, and a model that learns."""
    dev = _vulkan_or_skip()
    x, y = _data(n=128)
    multi = _mlp(["cpu", dev], batch_norm=True, dropout=0.2)
    h = _fit(multi, x, y, epochs=6, batch_size=32)
    assert h["train_loss"].iloc[-1] < 0.8 * h["train_loss"].iloc[0]
    runtime = multi.runtime
    for a, b in zip(runtime.params.synced_tensors(every=True), runtime.stores()[1].synced_tensors(every=True)):
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(a), G.ggml_backend_tensor_get_data(b))


@pytest.mark.vulkan
def test_misuse_of_replicas_is_refused_with_the_fix():
    dev = _vulkan_or_skip()
    m = G.ggml_model_sequential()
    m = G.ggml_layer_dense(m, 3, activation="softmax", input_shape=(6,))
    with pytest.raises(G.GgmlValueError, match="twice"):
        G.ggml_compile(m, backend=["cpu", "CPU"])
    with pytest.raises(G.GgmlValueError, match="one per backend"):
        G.ggml_compile(m, backend=["cpu", dev], shares=[1])
    with pytest.raises(G.GgmlValueError, match="positive"):
        G.ggml_compile(m, backend=["cpu", dev], shares=[1, 0])
    with pytest.raises(G.GgmlValueError, match="several backends"):
        G.ggml_compile(m, backend="cpu", shares=[1])
    with pytest.raises(G.GgmlValueError, match="two or more"):
        G.ggml_compile(m, backend=["cpu"])
    with pytest.raises(G.GgmlTypeError, match="device name"):
        G.ggml_compile(m, backend=["cpu", 3])
    G.ggml_compile(m, backend=["cpu", dev])
    x, y = _data(n=8)
    with pytest.raises(G.GgmlValueError, match="needs at least one per step. Train on batches of at least 2"):
        G.ggml_fit(m, x, y, batch_size=1, verbose=0)
    # one sample of data: the batch is that one sample whatever batch_size says, and the message says so
    with pytest.raises(G.GgmlValueError, match="at least that many samples of data"):
        G.ggml_fit(m, x[:1], y[:1], verbose=0)


@pytest.mark.vulkan
def test_a_one_unit_output_starts_from_the_same_weights_on_every_replica():
    """A dense layer of one unit has a kernel of shape (n, 1), which ggml reads back as (n,): the replicas
    (and a model compiled again) once took it for another shape and drew it afresh (found by review)."""
    dev = _vulkan_or_skip()
    rng = np.random.default_rng(4)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = (x[:, :1] > 0).astype(np.float32)
    models = []
    for backend in ("cpu", ["cpu", dev]):
        np.random.seed(0)
        m = G.ggml_model_sequential()
        m = G.ggml_layer_dense(m, 8, activation="relu", input_shape=(6,))
        m = G.ggml_layer_dense(m, 1, activation="sigmoid")
        models.append(G.ggml_compile(m, loss="binary_crossentropy", backend=backend, learning_rate=0.01))
    single, multi = models
    np.testing.assert_allclose(G.ggml_predict(multi, x), G.ggml_predict(single, x), rtol=1e-5, atol=1e-6)
    h1, h2 = _fit(single, x, y, epochs=3, batch_size=16), _fit(multi, x, y, epochs=3, batch_size=16)
    _same_trajectory(single, multi, h1, h2)


@pytest.mark.vulkan
def test_shares_as_an_array_and_a_tiny_share_say_what_batch_it_needs():
    dev = _vulkan_or_skip()
    m = G.ggml_model_sequential()
    m = G.ggml_layer_dense(m, 3, activation="softmax", input_shape=(6,))
    G.ggml_compile(m, backend=["cpu", dev], shares=np.array([3, 1]))
    assert m.runtime.shares == [3.0, 1.0] and "data parallel" in str(m)
    G.ggml_compile(m, backend=["cpu", dev], shares=[1e-3, 1])
    x, y = _data(n=20)
    with pytest.raises(G.GgmlValueError, match="batches of at least 1001 samples"):
        G.ggml_fit(m, x, y, batch_size=16, verbose=0)


@pytest.mark.vulkan
def test_fit_generator_splits_its_batches_too():
    dev = _vulkan_or_skip()
    x, y = _data()
    single, multi = _mlp("cpu"), _mlp(["cpu", dev])

    def batches():
        for i in range(0, 96, 16):
            yield x[i:i + 16], y[i:i + 16]
    h1 = G.ggml_fit_generator(single, batches, epochs=3, verbose=0, validation_data=(x[:32], y[:32]))
    h2 = G.ggml_fit_generator(multi, batches, epochs=3, verbose=0, validation_data=(x[:32], y[:32]))
    _same_trajectory(single, multi, h1, h2)
    assert h2.attrs["replicas"]["samples"] == [8, 8]


@pytest.mark.vulkan
def test_each_replica_draws_its_own_dropout_masks():
    dev = _vulkan_or_skip()
    x, y = _data(n=16)
    multi = _mlp(["cpu", dev], dropout=0.5)
    with G.ggml_trainer(multi, batch_size=16) as t:
        t.step(x, y)
        seeds = [r.hooks[0].tensor for r in t._runner.replicas]  # each replica graph's dropout seeds
        a, b = (G.ggml_backend_tensor_get_data(s) for s in seeds)
    assert a.shape == b.shape and not np.array_equal(a, b)
