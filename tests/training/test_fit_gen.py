"""ggml_fit_opt_gen: the generator contract of python-api.md §4 (sources, epochs, batches, errors).

Most runs train out = W x + b with SGD at lr 0.1 and compare the weights with a float64 numpy run
over the batch sequence the contract implies, so the order and content of the batches is checked,
not only their number.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.training_refs import Linear, linear_forward, linear_grads, loss_and_dout, Net, sgd_step


SGD = G.ggml_opt_optimizer_type_sgd()
MSE = G.ggml_opt_loss_type_mse()
LR = 0.1
K, M, N = 3, 2, 4
COLUMNS = ["epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "steps"]


def _set_lr(epoch, logs, state):
    G.ggml_opt_set_lr(state.lr_ud, sgd_lr=LR)


LR_CB = {"on_epoch_begin": _set_lr}


@pytest.fixture
def model(cpu):
    m = Linear(cpu, K, M, N, seed=7)
    yield m
    m.free()


@pytest.fixture
def batches(trng):
    return [(trng.normal(0, 1, (N, K)).astype(np.float32), trng.normal(0, 1, (N, M)).astype(np.float32))
            for _ in range(5)]


def fit(model, sched, generator, callbacks=(), **kw):
    kw.setdefault("optimizer", SGD)
    kw.setdefault("silent", True)
    return G.ggml_fit_opt_gen(sched, model.net.ctx, model.x, model.out, generator,
                              callbacks=[LR_CB, *callbacks], **kw)


def expect_trained_on(model, sequence, kind="mse", weights=None):
    """The weights equal numpy SGD over ``sequence`` (a list of (x, y) batches)."""
    p = {"W": model.W0.astype(np.float64), "b": model.b0.astype(np.float64)}
    for i, (x, y) in enumerate(sequence):
        x = np.asarray(x, dtype=np.float64)
        w = None if weights is None else np.asarray(weights[i], dtype=np.float64)
        _, dout = loss_and_dout(kind, linear_forward(p, x), None if y is None else np.asarray(y, np.float64), w)
        sgd_step(p, linear_grads(p, x, dout), LR)
    got = model.params()
    for k in p:
        np.testing.assert_allclose(got[k], p[k], rtol=1e-5, atol=1e-6, err_msg=k)


def recorded(batches, log):
    """A re-iterable (not an iterator) that records which batches it hands out."""
    class Recorder:
        def __iter__(self):
            for i, b in enumerate(batches):
                log.append(i)
                yield b
    return Recorder()


def messages(record):
    return [str(w.message) for w in record if issubclass(w.category, G.GgmlpyWarning)]


# ---------------------------------------------------------------- the four kinds of source

def test_callable_that_resets_itself(model, tsched, batches):
    """ggmlR's contract: each call returns a batch; a finite generator resets before returning None."""
    state = {"i": 0, "calls": 0}

    def gen():
        state["calls"] += 1
        if state["i"] >= 3:
            state["i"] = 0
            return None
        state["i"] += 1
        return batches[state["i"] - 1]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h = fit(model, tsched, gen, epochs=3)
    assert list(h["steps"]) == [3, 3, 3]
    assert state["calls"] == 12  # 3 batches + the None, per epoch
    expect_trained_on(model, batches[:3] * 3)


def test_generator_function_is_called_once_per_epoch(model, tsched, batches):
    calls = []

    def gen():
        calls.append(1)
        yield from batches[:2]

    h = fit(model, tsched, gen, epochs=3)
    assert len(calls) == 3
    assert list(h["steps"]) == [2, 2, 2]
    expect_trained_on(model, batches[:2] * 3)


def test_list_is_iterated_once_per_epoch(model, tsched, batches):
    h = fit(model, tsched, batches[:3], epochs=2)
    assert list(h["steps"]) == [3, 3]
    assert len(h) == 2
    expect_trained_on(model, batches[:3] * 2)


def test_one_shot_iterator_runs_dry(model, tsched, batches):
    with pytest.warns(G.GgmlpyWarning, match="returned None on the first step") as record:
        h = fit(model, tsched, iter(batches[:3]), epochs=3)
    assert len(h) == 1 and list(h["epoch"]) == [1] and list(h["steps"]) == [3]
    assert len(messages(record)) == 1
    assert "Epoch 2" in messages(record)[0] and "after 1 epoch(s)" in messages(record)[0]
    expect_trained_on(model, batches[:3])


def test_generator_object_is_a_one_shot_iterator(model, tsched, batches):
    with pytest.warns(G.GgmlpyWarning, match="returned None on the first step"):
        h = fit(model, tsched, (b for b in batches[:2]), epochs=2)
    assert list(h["steps"]) == [2]


# ---------------------------------------------------------------- steps_per_epoch

def test_steps_per_epoch_continues_a_list(model, tsched, batches):
    log: list[int] = []
    with pytest.warns(G.GgmlpyWarning) as record:
        h = fit(model, tsched, recorded(batches, log), steps_per_epoch=2, epochs=4)
    assert list(h["steps"]) == [2, 2, 1, 2]
    assert log == [0, 1, 2, 3, 4, 0, 1]
    msgs = messages(record)
    assert len(msgs) == 1
    assert "Epoch 3" in msgs[0] and "1 of 2 requested batches" in msgs[0]
    expect_trained_on(model, batches + batches[:2])


def test_steps_per_epoch_that_divides_a_list_starts_a_new_pass(model, tsched, batches):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h = fit(model, tsched, batches[:4], steps_per_epoch=2, epochs=3)
    assert list(h["steps"]) == [2, 2, 2]
    expect_trained_on(model, batches[:4] + batches[:2])


def test_steps_per_epoch_continues_an_iterator(model, tsched, batches):
    with pytest.warns(G.GgmlpyWarning) as record:
        h = fit(model, tsched, iter(batches), steps_per_epoch=2, epochs=5)
    assert list(h["steps"]) == [2, 2, 1]
    msgs = messages(record)
    assert len(msgs) == 2
    assert "Epoch 3" in msgs[0] and "1 of 2 requested batches" in msgs[0]
    assert "Epoch 4" in msgs[1] and "returned None on the first step" in msgs[1]
    expect_trained_on(model, batches)


def test_steps_per_epoch_restarts_a_generator_function(model, tsched, batches):
    closed = []

    def gen():
        try:
            yield from batches
        finally:
            closed.append(1)  # the unfinished epoch's generator is closed

    h = fit(model, tsched, gen, steps_per_epoch=2, epochs=3)
    assert list(h["steps"]) == [2, 2, 2]
    assert len(closed) == 3
    expect_trained_on(model, batches[:2] * 3)


def test_steps_per_epoch_continues_a_callable(model, tsched, batches):
    state = {"i": 0}

    def gen():
        if state["i"] >= len(batches):
            state["i"] = 0
            return None
        state["i"] += 1
        return batches[state["i"] - 1]

    with pytest.warns(G.GgmlpyWarning, match="ended after 1 of 2 requested batches"):
        h = fit(model, tsched, gen, steps_per_epoch=2, epochs=4)
    assert list(h["steps"]) == [2, 2, 1, 2]
    expect_trained_on(model, batches + batches[:2])


def test_infinite_callable_needs_steps_per_epoch(model, tsched, batches):
    state = {"i": 0}

    def forever():
        state["i"] += 1
        return batches[(state["i"] - 1) % len(batches)]

    h = fit(model, tsched, forever, steps_per_epoch=3, epochs=2)
    assert list(h["steps"]) == [3, 3]
    assert state["i"] == 6
    expect_trained_on(model, batches + batches[:1])


def test_short_validation_epoch_warns(model, tsched, batches):
    with pytest.warns(G.GgmlpyWarning, match="validation_generator ended after 2 of 3 requested batches"):
        h = fit(model, tsched, batches[:2], validation_generator=batches[2:4], validation_steps=3)
    assert np.isfinite(h["val_loss"].iloc[0])


def test_validation_steps_start_a_list_again_every_epoch(model, tsched, batches):
    """A list of validation batches with validation_steps is validated from its start every epoch (Keras' rule), not
    through the next batches each epoch. The learning rate is 0, so the three epochs' validations must agree."""
    h = fit(model, tsched, batches[:1], epochs=3, validation_generator=batches[1:], validation_steps=2,
            callbacks=[{"on_epoch_begin": lambda e, logs, s: G.ggml_opt_set_lr(s.lr_ud, sgd_lr=0.0)}])
    assert np.isfinite(h["val_loss"]).all()
    np.testing.assert_allclose(h["val_loss"], [h["val_loss"].iloc[0]] * 3, rtol=1e-6)


def test_empty_validation_gives_nan_and_training_goes_on(model, tsched, batches):
    with pytest.warns(G.GgmlpyWarning, match="validation_generator gave no batch"):  # NaN, but not silently
        h = fit(model, tsched, batches[:2], epochs=2, validation_generator=lambda: None)
    assert list(h["steps"]) == [2, 2] and h["val_loss"].isna().all()
    # a one-shot validation iterator: validated in epoch 1, nothing (NaN) afterwards, no stop
    with pytest.warns(G.GgmlpyWarning, match="Epoch 2: the validation_generator gave no batch"):
        h = fit(model, tsched, batches[:2], epochs=3, validation_generator=iter(batches[2:4]))
    assert len(h) == 3
    assert np.isfinite(h["val_loss"].iloc[0]) and h["val_loss"].iloc[1:].isna().all()


# ---------------------------------------------------------------- empty epochs and the history

def test_empty_first_epoch_warns_and_returns_no_rows(model, tsched):
    with pytest.warns(G.GgmlpyWarning, match="Epoch 1: the generator returned None on the first step") as record:
        h = fit(model, tsched, lambda: None, epochs=3)
    assert len(messages(record)) == 1
    assert list(h.columns) == COLUMNS and len(h) == 0
    assert h["epoch"].dtype == np.int64 and h["steps"].dtype == np.int64
    for c in ("train_loss", "train_accuracy", "val_loss", "val_accuracy"):
        assert h[c].dtype == np.float64, c
    np.testing.assert_array_equal(Net.get(model.W), model.W0)


def test_zero_epochs(model, tsched, batches):
    h = fit(model, tsched, batches, epochs=0)
    assert list(h.columns) == COLUMNS and len(h) == 0


def test_history_columns_dtypes_and_shifted_epochs(model, tsched, batches):
    seen = []

    def on_epoch_end(epoch, logs, state):
        seen.append((epoch, state.nepoch, logs["steps"]))

    h = fit(model, tsched, batches[:3], epochs=2, initial_epoch=5, validation_generator=batches[3:],
            callbacks=[{"on_epoch_end": on_epoch_end}])
    assert list(h.columns) == COLUMNS
    assert list(h["epoch"]) == [6, 7] and list(h["steps"]) == [3, 3]
    assert h["epoch"].dtype == np.int64 and h["steps"].dtype == np.int64
    for c in ("train_loss", "train_accuracy", "val_loss", "val_accuracy"):
        assert h[c].dtype == np.float64, c
    assert h["train_accuracy"].isna().all() and h["val_accuracy"].isna().all()  # no accuracy for MSE
    assert h["train_loss"].notna().all() and h["val_loss"].notna().all()
    assert seen == [(6, 7, 3), (7, 7, 3)]


def test_train_loss_is_the_mean_batch_loss(model, tsched, batches):
    """train_loss: mean over the epoch's batches of each batch's loss before its step; val_loss after."""
    h = fit(model, tsched, batches[:3], validation_generator=batches[3:])
    p = {"W": model.W0.astype(np.float64), "b": model.b0.astype(np.float64)}
    losses = []
    for x, y in batches[:3]:
        loss, dout = loss_and_dout("mse", linear_forward(p, x.astype(np.float64)), y.astype(np.float64))
        losses.append(loss)
        sgd_step(p, linear_grads(p, x.astype(np.float64), dout), LR)
    val = [loss_and_dout("mse", linear_forward(p, x.astype(np.float64)), y.astype(np.float64))[0]
           for x, y in batches[3:]]
    assert h["train_loss"].iloc[0] == pytest.approx(np.mean(losses), rel=1e-5)
    assert h["val_loss"].iloc[0] == pytest.approx(np.mean(val), rel=1e-5)


# ---------------------------------------------------------------- batch formats

def test_dict_batches_with_two_inputs(cpu, tsched, trng):
    """out = W1 x1 + W2 x2: inputs[i] of the batch goes to inputs[i] of the model."""
    net = Net(cpu)
    try:
        W1_0 = trng.normal(0, 0.5, (M, 3)).astype(np.float32)
        W2_0 = trng.normal(0, 0.5, (M, 2)).astype(np.float32)
        x1 = net.leaf((N, 3))
        x2 = net.leaf((N, 2))
        W1 = net.leaf((M, 3), W1_0, param=True)
        W2 = net.leaf((M, 2), W2_0, param=True)
        net.alloc()
        out = G.ggml_add(net.ctx, G.ggml_mul_mat(net.ctx, W1, x1), G.ggml_mul_mat(net.ctx, W2, x2))
        data = [(trng.normal(0, 1, (N, 3)), trng.normal(0, 1, (N, 2)), trng.normal(0, 1, (N, M))) for _ in range(3)]
        gen = [{"inputs": [a, b], "labels": [y]} for a, b, y in data[:2]] + \
              [{"inputs": (data[2][0], data[2][1]), "labels": data[2][2]}]  # a bare labels array is accepted
        h = G.ggml_fit_opt_gen(tsched, net.ctx, [x1, x2], out, gen, optimizer=SGD, callbacks=[LR_CB], silent=True)
        assert list(h["steps"]) == [3]
        p1, p2 = W1_0.astype(np.float64), W2_0.astype(np.float64)
        for a, b, y in data:
            o = a @ p1.T + b @ p2.T
            _, dout = loss_and_dout("mse", o, y)
            p1, p2 = p1 - LR * dout.T @ a, p2 - LR * dout.T @ b
        np.testing.assert_allclose(Net.get(W1), p1, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(Net.get(W2), p2, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="the batch has 1 inputs, the model expects 2"):
            G.ggml_fit_opt_gen(tsched, net.ctx, [x1, x2], out, [(data[0][0], data[0][2])], silent=True)
    finally:
        net.free()


@pytest.mark.parametrize("kind", ["mean", "sum"])
def test_labels_free_losses(kind, cpu, tsched, trng):
    loss = G.ggml_opt_loss_type_mean() if kind == "mean" else G.ggml_opt_loss_type_sum()
    xs = [trng.normal(0, 1, (N, K)).astype(np.float32) for _ in range(3)]
    forms = {"bare": xs, "tuple": [(x,) for x in xs], "list": [[x] for x in xs], "dict": [{"inputs": x} for x in xs]}
    for name, gen in forms.items():
        m = Linear(cpu, K, M, N, seed=11)
        try:
            h = fit(m, tsched, gen, loss_type=loss)
            assert list(h["steps"]) == [3], name
            expect_trained_on(m, [(x, None) for x in xs], kind)
        finally:
            m.free()
    m = Linear(cpu, K, M, N, seed=11)
    try:
        with pytest.raises(ValueError, match="takes no labels"):
            fit(m, tsched, [(xs[0], xs[0])], loss_type=loss)
    finally:
        m.free()


@pytest.mark.parametrize("mask", [None, 1, M])
def test_weighted_mse_weights_entry(mask, model, tsched, batches, trng):
    width = M if mask == M else 1
    ws = [trng.uniform(0, 2, (N, width)).astype(np.float32) for _ in batches[:3]]
    gen = [{"inputs": [x], "labels": [y], "weights": w} for (x, y), w in zip(batches, ws)]
    h = fit(model, tsched, gen, loss_type=G.ggml_opt_loss_type_weighted_mse(), loss_mask_ne0=mask)
    assert list(h["steps"]) == [3]
    expect_trained_on(model, batches[:3], "weighted_mse", ws)


def test_weighted_mse_needs_weights(model, tsched, batches):
    with pytest.raises(ValueError, match="the batch has 0 weights, the model expects 1"):
        fit(model, tsched, batches[:1], loss_type=G.ggml_opt_loss_type_weighted_mse())
    with pytest.raises(ValueError, match="the batch has 1 weights, the model expects 0"):
        fit(model, tsched, [{"inputs": batches[0][0], "labels": batches[0][1], "weights": np.ones(N)}])


# ---------------------------------------------------------------- bad batches

def test_wrong_input_size_names_the_tensor_and_counts(model, tsched, batches):
    x, y = batches[0]
    with pytest.raises(ValueError, match=r"inputs\[0\].*expects 12 values.*gives 9"):
        fit(model, tsched, [(x[:3], y)])
    with pytest.raises(ValueError, match=r"labels\[0\].*expects 8 values.*gives 10"):
        fit(model, tsched, [(x, np.zeros((5, 2)))])
    with pytest.raises(ValueError, match=r"generator: .*numeric"):
        fit(model, tsched, [(np.array([["a"] * K] * N), y)])
    with pytest.raises(ValueError, match="length 3"):
        fit(model, tsched, [(x, y, y)])
    with pytest.raises(ValueError, match="got keys"):
        fit(model, tsched, [{"x": x, "y": y}])
    np.testing.assert_array_equal(Net.get(model.W), model.W0)  # nothing was trained before the bad batch
    with pytest.raises(ValueError, match=r"validation_generator: .*inputs\[0\].*expects 12 values.*gives 13"):
        fit(model, tsched, [(x, y)], validation_generator=[(np.zeros(13), y)])


def test_integer_input_takes_integer_arrays(cpu, tsched, trng):
    """Token ids: an I32 input accepts integer arrays and refuses floats."""
    V, D = 5, 2
    net = Net(cpu)
    try:
        E0 = trng.normal(0, 1, (V, D)).astype(np.float32)
        E = net.leaf((V, D), E0, param=True)
        ids = net.leaf((N,), dtype=G.GGML_TYPE_I32)
        net.alloc()
        out = G.ggml_get_rows(net.ctx, E, ids)
        tok = np.array([0, 3, 3, 1])
        y = trng.normal(0, 1, (N, D)).astype(np.float32)
        G.ggml_fit_opt_gen(tsched, net.ctx, ids, out, [(tok, y)], optimizer=SGD, callbacks=[LR_CB], silent=True)
        ref = E0.astype(np.float64)
        _, dout = loss_and_dout("mse", ref[tok], y.astype(np.float64))
        np.add.at(ref, tok, -LR * dout)
        np.testing.assert_allclose(Net.get(E), ref, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match=r"integer tensor .*float64"):
            G.ggml_fit_opt_gen(tsched, net.ctx, ids, out, [(tok.astype(float), y)], silent=True)
    finally:
        net.free()


@pytest.mark.parametrize("bad", [5, -1, 2**40])
def test_token_ids_out_of_range_are_refused_not_aborted(bad, cpu, tsched, trng):
    """ggml_get_rows aborts the process on an index outside the table: the batch is checked first,
    also when the ids reach get_rows through a reshape."""
    V, D, T = 5, 2, 2
    net = Net(cpu)
    try:
        E0 = trng.normal(0, 1, (V, D)).astype(np.float32)
        E = net.leaf((V, D), E0, param=True)
        ids = net.leaf((N, T), dtype=G.GGML_TYPE_I32)  # [T, N] ids, flattened for get_rows
        net.alloc()
        out = G.ggml_get_rows(net.ctx, E, G.ggml_reshape_1d(net.ctx, ids, T * N))
        tok = trng.integers(0, V, (N, T))
        y = trng.normal(0, 1, (N * T, D)).astype(np.float32)
        assert len(G.ggml_fit_opt_gen(tsched, net.ctx, ids, out, [(tok, y)], silent=True)) == 1
        tok[1, 1] = bad
        with pytest.raises(ValueError, match=rf"row indices for ggml_get_rows, which must be in \[0, {V}\); got {bad}"):
            G.ggml_fit_opt_gen(tsched, net.ctx, ids, out, [(tok, y)], silent=True)
    finally:
        net.free()


# ---------------------------------------------------------------- argument errors, before any work

@pytest.mark.parametrize("kw, error, pattern", [
    ({"steps_per_epoch": 0}, ValueError, "steps_per_epoch"),
    ({"steps_per_epoch": 1.5}, TypeError, "steps_per_epoch"),  # a non-int is a TypeError, as for every int argument
    ({"steps_per_epoch": True}, TypeError, "steps_per_epoch"),
    ({"validation_steps": 0}, ValueError, "validation_steps"),
    ({"initial_epoch": -1}, ValueError, "initial_epoch"),
    ({"epochs": -1}, ValueError, "epochs"),
    ({"weight_decay": 2}, ValueError, "weight_decay"),
    ({"weight_decay": -0.5}, ValueError, "weight_decay"),
    ({"nbatch_logical": 0}, ValueError, "nbatch_logical"),
    ({"loss_type": 99}, ValueError, "loss_type"),
    ({"optimizer": 7}, ValueError, "optimizer"),
    ({"silent": "yes"}, ValueError, "silent"),
    ({"callbacks": [5]}, TypeError, r"callbacks\[0\]"),
    ({"prefetch": -1}, ValueError, "prefetch"),
    ({"learning_rate": 1e-300}, ValueError, "learning_rate"),  # float32 makes it 0: the rule of ggml_compile
    ({"learning_rate": 1e300}, ValueError, "learning_rate"),
    ({"prefetch": 2.0}, TypeError, "prefetch"),
    ({"validation_generator": 5}, TypeError, "validation_generator"),
    ({"generator": 5}, TypeError, "generator"),
    ({"generator": "abc"}, TypeError, "generator"),
])
def test_argument_errors_come_before_any_work(kw, error, pattern, model, tsched, batches):
    calls = []

    def gen():
        calls.append(1)
        return None

    kw = dict(kw)
    generator = kw.pop("generator", gen)
    kw.setdefault("silent", True)
    with pytest.raises(error, match=pattern):
        G.ggml_fit_opt_gen(tsched, model.net.ctx, model.x, model.out, generator, **kw)
    assert calls == []
    # nothing was left behind: the scheduler takes a new fit
    h = fit(model, tsched, batches[:1])
    assert len(h) == 1


def test_unallocated_inputs_are_refused(cpu, tsched):
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(256), no_alloc=True)
    try:
        x = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, K, N)
        W = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, K, M))
        out = G.ggml_mul_mat(ctx, W, x)
        with pytest.raises(RuntimeError, match="not allocated"):
            G.ggml_fit_opt_gen(tsched, ctx, x, out, [], silent=True)
    finally:
        ctx.free()


# ---------------------------------------------------------------- reporting

def test_silent_false_reports_each_epoch(model, tsched, batches, capsys):
    fit(model, tsched, batches[:3], epochs=2, silent=False, validation_generator=batches[3:])
    err = capsys.readouterr().err
    for epoch in (1, 2):
        line = next(ln for ln in err.splitlines() if f"Epoch {epoch}/2" in ln and "train_loss=" in ln)
        assert "val_loss=" in line and "steps=3" in line and "samples/s" in line
    fit(model, tsched, batches[:3], epochs=2, silent=True)
    assert capsys.readouterr().err == ""


def test_nbatch_logical_not_a_multiple_warns(model, tsched, batches):
    with pytest.warns(G.GgmlpyWarning, match=r"nbatch_logical \(10\) is not a multiple of the physical batch \(4\)"):
        fit(model, tsched, batches[:2], nbatch_logical=10)


def test_plot_history(model, tsched, batches, tmp_path):
    pytest.importorskip("matplotlib")
    h = fit(model, tsched, batches[:3], epochs=3, validation_generator=batches[3:])
    out = G.ggml_plot_history(h, tmp_path / "history.png", title="test")
    assert out.exists() and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="history"):
        G.ggml_plot_history({"epoch": [1]}, tmp_path / "x.png")


@pytest.mark.parametrize("batch, message", [
    (lambda x, y: (x, None), r"the batch has no labels \(labels\[0\] is None\); give each batch as \(x, y\)"),
    (lambda x, y: ([[1.0, 2.0, 3.0], [1.0, 2.0]], y), "rows have different lengths"),
    (lambda x, y: (x, [[1.0, 2.0], [3.0]]), "labels.*rows have different lengths"),
])
def test_a_batch_missing_labels_or_ragged_says_so(model, tsched, batches, batch, message):
    """(x, None) was "labels of dtype object" and a ragged list "not array-like", where the model layer says what is
    missing."""
    x, y = batches[0]
    with pytest.raises(G.GgmlValueError, match=message):
        fit(model, tsched, [batch(x, y)])
