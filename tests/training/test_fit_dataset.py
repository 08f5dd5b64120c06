"""The dataset path: ggml_fit_opt (val_split arithmetic, shuffling, history), the multi-head
loop and its accessors, dataset weights and get_batch_head. References are numpy float64 runs
of SGD over the rows the arithmetic of ggmlR-training §3.1 selects."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.training_refs import Linear, linear_forward, linear_grads, loss_and_dout, Net, sgd_step


F32 = G.GGML_TYPE_F32
SGD = G.ggml_opt_optimizer_type_sgd()
MSE, CE = G.ggml_opt_loss_type_mse(), G.ggml_opt_loss_type_cross_entropy()
WMSE = G.ggml_opt_loss_type_weighted_mse()
K, M, N = 3, 2, 4
LR = 0.1
LR_CB = {"on_epoch_begin": lambda e, logs, s: G.ggml_opt_set_lr(s.lr_ud, sgd_lr=LR)}
COLUMNS = ["epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy"]


def make_dataset(X, Y=None, shard=1):
    ds = G.ggml_opt_dataset_init(F32, F32, X.shape[1], 0 if Y is None else Y.shape[1], X.shape[0], shard)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), X)
    if Y is not None:
        G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), Y)
    return ds


def rows_of(t, ncols):
    return G.ggml_backend_tensor_get_data(t).reshape(-1, ncols)


def idata_split(ndata, physical, logical, val_split):
    logical = max(logical, physical)
    period = max(1, logical // physical)
    return min(math.floor((1 - val_split) * (ndata // logical)) * period * physical, ndata), period


def simulate(model, X, Y, split, period, nepoch=1, kind="mse", W=None):
    """numpy SGD with accumulation over rows [0, split); val over [split, ndata) after each epoch."""
    p = {"W": model.W0.astype(np.float64), "b": model.b0.astype(np.float64)}
    hist = []
    for _ in range(nepoch):
        acc, losses = None, []
        for i in range(split // N):
            r = slice(i * N, (i + 1) * N)
            w = None if W is None else W[r]
            loss, dout = loss_and_dout(kind, linear_forward(p, X[r]), Y[r], w)
            losses.append(loss)
            g = linear_grads(p, X[r], dout / period)
            acc = g if acc is None else {k: acc[k] + g[k] for k in g}
            if (i + 1) % period == 0:
                sgd_step(p, acc, LR)
                acc = None
        val, correct = [], 0
        for i in range(split // N, X.shape[0] // N):
            r = slice(i * N, (i + 1) * N)
            out = linear_forward(p, X[r])
            val.append(loss_and_dout(kind, out, Y[r])[0])
            correct += int((out.argmax(1) == Y[r].argmax(1)).sum())
        n_val = X.shape[0] - split
        hist.append((np.mean(losses), np.mean(val) if val else np.nan, correct / n_val if n_val else np.nan))
    return p, hist


def assert_params(model, p, atol=1e-6):
    got = model.params()
    for k in p:
        np.testing.assert_allclose(got[k], p[k], rtol=1e-5, atol=atol, err_msg=k)


@pytest.fixture
def model(cpu):
    m = Linear(cpu, K, M, N, seed=13)
    yield m
    m.free()


# ---------------------------------------------------------------- ggml_fit_opt

@pytest.mark.parametrize("ndata, logical, val_split", [
    (44, 8, 0.3),    # period 2, 5 logical batches -> 3 train (24 rows); the 20 rows left validate
    (40, 4, 0.25),   # period 1: floor(7.5) = 7 logical batches -> 28 rows
    (48, 12, 0.5),   # period 3: 2 of 4 logical batches -> 24 rows
    (36, 8, 0.2),    # 4 logical batches -> 3 -> 24 rows, 12 rows of validation
    (40, 8, 0.0),    # everything trains, no validation
    (20, 2, 0.5),    # nbatch_logical below the physical batch: raised to it (period 1)
])
def test_val_split_arithmetic(ndata, logical, val_split, model, trng):
    X = trng.normal(0, 1, (ndata, K)).astype(np.float32)
    Y = trng.normal(0, 1, (ndata, M)).astype(np.float32)
    ds = make_dataset(X, Y)
    sched = G.ggml_backend_sched_new([model.net.backend], parallel=False, graph_size=512)
    try:
        h = G.ggml_fit_opt(sched, model.net.ctx, model.x, model.out, ds, MSE, SGD, nepoch=2, nbatch_logical=logical,
                           val_split=val_split, shuffle=False, shuffle_all=False, callbacks=[LR_CB], silent=True)
        split, period = idata_split(ndata, N, logical, val_split)
        p, hist = simulate(model, X.astype(np.float64), Y.astype(np.float64), split, period, nepoch=2)
        assert_params(model, p)
        assert list(h.columns) == COLUMNS and list(h["epoch"]) == [1, 2]
        np.testing.assert_allclose(h["train_loss"], [r[0] for r in hist], rtol=1e-5)
        if val_split > 0:
            np.testing.assert_allclose(h["val_loss"], [r[1] for r in hist], rtol=1e-5)
        else:
            assert h["val_loss"].isna().all()
        assert h["train_accuracy"].isna().all() and h["val_accuracy"].isna().all()
    finally:
        sched.free()
        ds.free()


def test_cross_entropy_history_and_accuracy(cpu, tsched, trng):
    C = 3
    m = Linear(cpu, K, C, N, seed=2)
    X = trng.normal(0, 1, (32, K)).astype(np.float32)
    Y = np.eye(C, dtype=np.float32)[trng.integers(0, C, 32)]
    ds = make_dataset(X, Y)
    try:
        h = G.ggml_fit_opt(tsched, m.net.ctx, m.x, m.out, ds, CE, SGD, nepoch=2, nbatch_logical=N, val_split=0.5,
                           shuffle=False, shuffle_all=False, callbacks=[LR_CB], silent=True)
        p, hist = simulate(m, X.astype(np.float64), Y.astype(np.float64), 16, 1, nepoch=2, kind="cross_entropy")
        assert_params(m, p)
        np.testing.assert_allclose(h["train_loss"], [r[0] for r in hist], rtol=1e-5)
        np.testing.assert_allclose(h["val_loss"], [r[1] for r in hist], rtol=1e-5)
        np.testing.assert_allclose(h["val_accuracy"], [r[2] for r in hist])
        assert h["train_accuracy"].between(0, 1).all()
        assert h["epoch"].dtype == np.int64 and h["train_accuracy"].dtype == np.float64
    finally:
        ds.free()
        m.free()


def test_shuffle_is_deterministic_and_keeps_rows_together(cpu, trng):
    A = trng.normal(0, 1, (K, M))
    X = trng.normal(0, 1, (40, K)).astype(np.float32)
    Y = (X.astype(np.float64) @ A).astype(np.float32)  # each label row is a function of its data row
    runs = []
    for shuffle in (True, True, False):
        m = Linear(cpu, K, M, N, seed=4)
        ds = make_dataset(X, Y)
        sched = G.ggml_backend_sched_new([cpu], parallel=False, graph_size=512)
        h = G.ggml_fit_opt(sched, m.net.ctx, m.x, m.out, ds, MSE, SGD, nepoch=3, nbatch_logical=8, val_split=0.2,
                           shuffle=shuffle, shuffle_all=False, callbacks=[LR_CB], silent=True)
        Xs, Ys = rows_of(G.ggml_opt_dataset_data(ds), K), rows_of(G.ggml_opt_dataset_labels(ds), M)
        runs.append((m.params(), h, Xs, Ys))
        sched.free()
        ds.free()
        m.free()
    (p1, h1, X1, Y1), (p2, h2, X2, Y2), (p3, h3, X3, Y3) = runs
    for k in p1:
        assert np.array_equal(p1[k], p2[k])  # same seed, same order, bit for bit
    assert np.array_equal(h1.to_numpy(), h2.to_numpy(), equal_nan=True)
    assert not np.allclose(p1["W"], p3["W"])  # shuffling changed the order
    np.testing.assert_allclose(Y1, (X1.astype(np.float64) @ A), rtol=1e-5, atol=1e-5)  # rows kept together
    # only the training part (32 rows) is reshuffled each epoch; the validation tail stays put
    np.testing.assert_array_equal(X1[32:], X[32:])
    assert not np.array_equal(X1[:32], X[:32])
    assert sorted(map(tuple, X1[:32])) == sorted(map(tuple, X[:32]))
    np.testing.assert_array_equal(X3, X)


def test_shuffle_all_draws_the_validation_rows_at_random(cpu, tsched, trng):
    X = trng.normal(0, 1, (40, K)).astype(np.float32)
    Y = trng.normal(0, 1, (40, M)).astype(np.float32)
    ds = make_dataset(X, Y, shard=2)
    m = Linear(cpu, K, M, N)
    try:
        G.ggml_fit_opt(tsched, m.net.ctx, m.x, m.out, ds, MSE, SGD, nepoch=1, nbatch_logical=8, val_split=0.2,
                       shuffle=False, shuffle_all=True, silent=True)
        Xs = rows_of(G.ggml_opt_dataset_data(ds), K)
        assert not np.array_equal(Xs[32:], X[32:])
        # shards of 2 rows move as units
        pairs = {tuple(map(tuple, X[i:i + 2])) for i in range(0, 40, 2)}
        assert {tuple(map(tuple, Xs[i:i + 2])) for i in range(0, 40, 2)} == pairs
    finally:
        ds.free()
        m.free()


def test_fit_opt_argument_errors(model, tsched, trng):
    X = trng.normal(0, 1, (40, K)).astype(np.float32)
    ds_nolabels = make_dataset(X)
    ds = make_dataset(X, X[:, :M].copy())
    try:
        base = dict(silent=True)
        with pytest.raises(ValueError, match="val_split"):
            G.ggml_fit_opt(tsched, model.net.ctx, model.x, model.out, ds, MSE, val_split=1, **base)
        with pytest.raises(ValueError, match="needs labels"):
            G.ggml_fit_opt(tsched, model.net.ctx, model.x, model.out, ds_nolabels, MSE, **base)
        with pytest.raises(ValueError, match="nbatch_logical"):
            G.ggml_fit_opt(tsched, model.net.ctx, model.x, model.out, ds, MSE, nbatch_logical=0, **base)
        with pytest.raises(ValueError, match="nepoch"):
            G.ggml_fit_opt(tsched, model.net.ctx, model.x, model.out, ds, MSE, nepoch=-1, **base)
        bad = make_dataset(trng.normal(0, 1, (40, 5)).astype(np.float32), X[:, :M].copy())
        with pytest.raises(ValueError, match="ne_datapoint"):
            G.ggml_fit_opt(tsched, model.net.ctx, model.x, model.out, bad, MSE, **base)
        bad.free()
        h = G.ggml_fit_opt(tsched, model.net.ctx, model.x, model.out, ds, MSE, nepoch=1, **base)
        assert len(h) == 1
    finally:
        ds.free()
        ds_nolabels.free()


# ---------------------------------------------------------------- dataset weights (weighted MSE)

@pytest.mark.parametrize("width", [1, M])
def test_dataset_weights_train_weighted_mse(width, model, tsched, trng):
    X = trng.normal(0, 1, (24, K)).astype(np.float32)
    Y = trng.normal(0, 1, (24, M)).astype(np.float32)
    ds = make_dataset(X, Y)
    try:
        w = G.ggml_opt_dataset_weights(ds, width)
        assert G.ggml_tensor_shape(w) == (width, 24, 1, 1)
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(w), 1.0)  # all 1 at first
        assert G.ggml_opt_dataset_weights(ds, width) == w  # the same tensor on a later call
        with pytest.raises(ValueError, match="width"):
            G.ggml_opt_dataset_weights(ds, M if width == 1 else 1)
        W = trng.uniform(0, 2, (24, width)).astype(np.float32)
        W[3] = 0
        G.ggml_backend_tensor_set_data(w, W)
        h = G.ggml_fit_opt(tsched, model.net.ctx, model.x, model.out, ds, WMSE, SGD, nepoch=1, nbatch_logical=N,
                           shuffle=False, shuffle_all=False, callbacks=[LR_CB], silent=True)
        p, hist = simulate(model, X.astype(np.float64), Y.astype(np.float64), 24, 1, kind="weighted_mse",
                           W=W.astype(np.float64))
        assert_params(model, p)
        assert h["train_loss"].iloc[0] == pytest.approx(hist[0][0], rel=1e-5)
    finally:
        ds.free()


def test_dataset_weights_width_is_checked(trng):
    ds = make_dataset(trng.normal(0, 1, (8, K)).astype(np.float32), trng.normal(0, 1, (8, M)).astype(np.float32))
    try:
        with pytest.raises(ValueError, match="ne0 must be 1 or ne_label"):
            G.ggml_opt_dataset_weights(ds, 3)
        G.ggml_opt_dataset_weights(ds, 1)
        with pytest.raises(ValueError, match="width 1"):
            G.ggml_opt_dataset_weights(ds, M)
    finally:
        ds.free()


def test_weights_move_with_their_rows_when_shuffled(model, tsched, trng):
    X = trng.normal(0, 1, (40, K)).astype(np.float32)
    ds = make_dataset(X, trng.normal(0, 1, (40, M)).astype(np.float32))
    try:
        w = G.ggml_opt_dataset_weights(ds)
        G.ggml_backend_tensor_set_data(w, np.abs(X[:, 0]))
        G.ggml_fit_opt(tsched, model.net.ctx, model.x, model.out, ds, WMSE, nepoch=2, nbatch_logical=N,
                       shuffle=True, silent=True)
        Xs = rows_of(G.ggml_opt_dataset_data(ds), K)
        assert not np.array_equal(Xs, X)
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(w), np.abs(Xs[:, 0]))
    finally:
        ds.free()


# ---------------------------------------------------------------- multi-head

class TwoHeads:
    """x [K, N] -> reg = W1 x + b1 [2, N] (MSE) and cls = W2 x + b2 [3, N] (cross-entropy)."""

    def __init__(self, backend, seed=0):
        rng = np.random.default_rng(seed)
        self.p0 = {"W1": rng.normal(0, .5, (2, K)), "b1": rng.normal(0, .1, 2),
                   "W2": rng.normal(0, .5, (3, K)), "b2": rng.normal(0, .1, 3)}
        self.net = Net(backend)
        self.x = self.net.leaf((N, K))
        self.t = {k: self.net.leaf(v.shape, v, param=True) for k, v in self.p0.items()}
        self.net.alloc()
        c = self.net.ctx
        self.reg = G.ggml_add(c, G.ggml_mul_mat(c, self.t["W1"], self.x), self.t["b1"])
        self.cls = G.ggml_add(c, G.ggml_mul_mat(c, self.t["W2"], self.x), self.t["b2"])

    def params(self):
        return {k: Net.get(t).astype(np.float64) for k, t in self.t.items()}

    def free(self):
        self.net.free()


def _two_head_reference(model, X, Y, offs, weights, split, nepoch):
    p = {k: v.astype(np.float32).astype(np.float64) for k, v in model.p0.items()}
    y_reg = lambda r: Y[r, offs[0]:offs[0] + 2]  # noqa: E731
    y_cls = lambda r: Y[r, offs[1]:offs[1] + 3]  # noqa: E731

    def heads(r):
        o1 = X[r] @ p["W1"].T + p["b1"]
        o2 = X[r] @ p["W2"].T + p["b2"]
        return loss_and_dout("mse", o1, y_reg(r)), loss_and_dout("cross_entropy", o2, y_cls(r)), o2

    epochs = []
    for _ in range(nepoch):
        tl = []
        correct = 0
        for i in range(split // N):
            r = slice(i * N, (i + 1) * N)
            (l1, d1), (l2, d2), o2 = heads(r)
            tl.append((l1, l2, weights[0] * l1 + weights[1] * l2))
            correct += int((o2.argmax(1) == y_cls(r).argmax(1)).sum())
            d1, d2 = weights[0] * d1, weights[1] * d2
            g = {"W1": d1.T @ X[r], "b1": d1.sum(0), "W2": d2.T @ X[r], "b2": d2.sum(0)}
            for k in p:
                p[k] = p[k] - LR * g[k]
        vl, vcorrect = [], 0
        for i in range(split // N, X.shape[0] // N):
            r = slice(i * N, (i + 1) * N)
            (l1, _), (l2, _), o2 = heads(r)
            vl.append((l1, l2, weights[0] * l1 + weights[1] * l2))
            vcorrect += int((o2.argmax(1) == y_cls(r).argmax(1)).sum())
        epochs.append({"train": np.mean(tl, axis=0), "val": np.mean(vl, axis=0), "acc": correct / split,
                       "val_acc": vcorrect / (X.shape[0] - split)})
    return p, epochs


@pytest.mark.parametrize("offs", [None, [3, 0]])
def test_fit_opt_multi_two_heads(offs, cpu, tsched, trng):
    n = 32
    X = trng.normal(0, 1, (n, K)).astype(np.float32)
    eff = offs or [0, 2]
    Y = np.zeros((n, 5), dtype=np.float32)
    Y[:, eff[0]:eff[0] + 2] = trng.normal(0, 1, (n, 2))
    Y[:, eff[1]:eff[1] + 3] = np.eye(3)[trng.integers(0, 3, n)]
    ds = make_dataset(X, Y)
    m = TwoHeads(cpu, seed=1)
    logs_seen = []
    weights = [0.5, 2.0]
    try:
        h = G.ggml_fit_opt_multi(tsched, m.net.ctx, m.x, [m.reg, m.cls], ds, [MSE, CE], weights, offs,
                                 head_names=["reg", "cls"], optimizer=SGD, nepoch=2, nbatch_logical=N, val_split=0.25,
                                 shuffle=False, shuffle_all=False, silent=True,
                                 callbacks=[LR_CB, {"on_epoch_end": lambda e, logs, s: logs_seen.append(logs)}])
        p, ref = _two_head_reference(m, X.astype(np.float64), Y.astype(np.float64), eff, weights, 24, 2)
        got = m.params()
        for k in p:
            np.testing.assert_allclose(got[k], p[k], rtol=1e-5, atol=1e-6, err_msg=k)
        assert list(h.columns) == COLUMNS
        np.testing.assert_allclose(h["train_loss"], [r["train"][2] for r in ref], rtol=1e-5)
        np.testing.assert_allclose(h["val_loss"], [r["val"][2] for r in ref], rtol=1e-5)
        np.testing.assert_allclose(h["train_accuracy"], [r["acc"] for r in ref])
        np.testing.assert_allclose(h["val_accuracy"], [r["val_acc"] for r in ref])
        assert h.attrs["head_names"] == ["reg", "cls"]
        for attr, key in (("head_loss", "train"), ("val_head_loss", "val")):
            frame = h.attrs[attr]
            assert list(frame.columns) == ["reg", "cls"] and frame.shape == (2, 2)
            np.testing.assert_allclose(frame.to_numpy(), [r[key][:2] for r in ref], rtol=1e-5)
        for attr, key in (("head_accuracy", "acc"), ("val_head_accuracy", "val_acc")):
            frame = h.attrs[attr]
            assert frame["reg"].isna().all()  # accuracy only for cross-entropy heads
            np.testing.assert_allclose(frame["cls"], [r[key] for r in ref])
        assert len(logs_seen) == 2
        expected_keys = {"train_loss", "train_accuracy", "val_loss", "val_accuracy"} | {
            f"{s}_{hn}_{q}" for s in ("train", "val") for hn in ("reg", "cls") for q in ("loss", "accuracy")}
        assert set(logs_seen[0]) == expected_keys
        for e, logs in enumerate(logs_seen):
            assert logs["train_reg_loss"] == pytest.approx(ref[e]["train"][0], rel=1e-5)
            assert logs["val_cls_loss"] == pytest.approx(ref[e]["val"][1], rel=1e-5)
            assert logs["train_cls_accuracy"] == pytest.approx(ref[e]["acc"])
            assert math.isnan(logs["val_reg_accuracy"])
    finally:
        ds.free()
        m.free()


def test_fit_opt_multi_errors_and_defaults(cpu, tsched, trng):
    X = trng.normal(0, 1, (16, K)).astype(np.float32)
    ds = make_dataset(X, trng.normal(0, 1, (16, 5)).astype(np.float32))
    m = TwoHeads(cpu)
    try:
        run = lambda **kw: G.ggml_fit_opt_multi(tsched, m.net.ctx, m.x, [m.reg, m.cls], ds,  # noqa: E731
                                                **{"loss_types": [MSE, MSE], "nepoch": 1, "nbatch_logical": N,
                                                   "silent": True, **kw})
        with pytest.raises(ValueError, match="loss_types has 1 entries, expected 2"):
            run(loss_types=[MSE])
        with pytest.raises(ValueError, match="loss_weights has 3 entries, expected 2"):
            run(loss_weights=[1, 1, 1])
        with pytest.raises(ValueError, match="head_names"):
            run(head_names=["a", "a"])
        with pytest.raises(ValueError, match="labels_offs"):
            run(labels_offs=[0])
        with pytest.raises(ValueError, match=r"head labels \[4, 7\) fall outside"):
            run(labels_offs=[0, 4])
        h = run()
        assert h.attrs["head_names"] == ["head_1", "head_2"]
        assert h.attrs["val_head_loss"].isna().all().all()
        h0 = run(nepoch=0)
        assert len(h0) == 0 and h0.attrs["head_loss"].shape == (0, 2)
    finally:
        ds.free()
        m.free()


def test_opt_fit_multi_returns_a_dict(cpu, tsched, trng):
    X = trng.normal(0, 1, (16, K)).astype(np.float32)
    Y = np.concatenate([trng.normal(0, 1, (16, 2)), np.eye(3)[trng.integers(0, 3, 16)]], axis=1).astype(np.float32)
    ds = make_dataset(X, Y)
    m = TwoHeads(cpu)
    try:
        r = G.ggml_opt_fit_multi(tsched, m.net.ctx, m.x, [m.reg, m.cls], ds, [MSE, CE], nepoch=3, nbatch_logical=N,
                                 val_split=0.5, silent=True)
        assert set(r) == {"train_loss", "train_accuracy", "val_loss", "val_accuracy", "head_loss", "head_accuracy"}
        assert r["train_loss"].shape == (3,) and r["head_loss"].shape == (3, 2) and r["head_accuracy"].shape == (3, 2)
        np.testing.assert_allclose(r["head_loss"].sum(axis=1), r["train_loss"], rtol=1e-5)  # weights 1, 1
        assert np.isnan(r["head_accuracy"][:, 0]).all() and np.isfinite(r["head_accuracy"][:, 1]).all()
        assert np.isfinite(r["val_loss"]).all()
    finally:
        ds.free()
        m.free()


def test_init_for_fit_multi_accessors(cpu, tsched, trng):
    m = TwoHeads(cpu, seed=3)
    try:
        fit = G.ggml_opt_init_for_fit_multi(tsched, [MSE, CE], [0.5, 2.0], None, SGD, 1, m.net.ctx, m.x,
                                            [m.reg, m.cls])
        opt = fit["opt_ctx"]
        assert G.ggml_opt_n_loss(opt) == 2
        assert G.ggml_opt_outputs_i(opt, 1) == m.reg and G.ggml_opt_outputs_i(opt, 2) == m.cls
        assert G.ggml_tensor_shape(G.ggml_opt_labels_i(opt, 1))[:2] == (2, N)
        assert G.ggml_tensor_shape(G.ggml_opt_labels_i(opt, 2))[:2] == (3, N)
        assert G.ggml_opt_loss_weights_i(opt, 1) is None
        assert G.ggml_opt_ncorrect_i(opt, 1) is None and G.ggml_opt_ncorrect_i(opt, 2) is not None
        for bad in (0, 3, True, 1.0):
            with pytest.raises(ValueError, match="ihead"):
                G.ggml_opt_loss_i(opt, bad)
        X = trng.normal(0, 1, (N, K)).astype(np.float32)
        y1 = trng.normal(0, 1, (N, 2)).astype(np.float32)
        y2 = np.eye(3, dtype=np.float32)[[0, 2, 1, 2]]
        result = G.ggml_opt_result_init()
        G.ggml_opt_alloc(opt, False)  # a forward pass: no step
        G.ggml_backend_tensor_set_data(m.x, X)
        G.ggml_backend_tensor_set_data(G.ggml_opt_labels_i(opt, 1), y1)
        G.ggml_backend_tensor_set_data(G.ggml_opt_labels_i(opt, 2), y2)
        G.ggml_backend_tensor_set_data(G.ggml_opt_ncorrect_i(opt, 2), [777])  # a sentinel the eval must replace
        G.ggml_opt_eval(opt, result)
        p = {k: v.astype(np.float32).astype(np.float64) for k, v in m.p0.items()}
        o1 = X @ p["W1"].T + p["b1"]
        o2 = X @ p["W2"].T + p["b2"]
        l1 = loss_and_dout("mse", o1, y1.astype(np.float64))[0]
        l2 = loss_and_dout("cross_entropy", o2, y2.astype(np.float64))[0]
        loss_i = [float(G.ggml_backend_tensor_get_data(G.ggml_opt_loss_i(opt, i))[0]) for i in (1, 2)]
        assert loss_i == [pytest.approx(l1, rel=1e-5), pytest.approx(l2, rel=1e-5)]  # before the head weights
        assert G.ggml_opt_result_loss(result)["loss"] == pytest.approx(0.5 * l1 + 2 * l2, rel=1e-5)
        ncorrect = int(G.ggml_backend_tensor_get_data(G.ggml_opt_ncorrect_i(opt, 2))[0])
        assert ncorrect == int((o2.argmax(1) == y2.argmax(1)).sum())
        for k, v in m.params().items():
            np.testing.assert_array_equal(v, p[k])  # forward only: nothing moved
        # the result keeps each head's loss and accuracy (ggmlR 0.8.4's ggml_opt_result_*_i); a second batch
        # with other labels: the head losses are the means over the two batches, the standard errors theirs
        y1b = trng.normal(0, 1, (N, 2)).astype(np.float32)
        G.ggml_opt_alloc(opt, False)
        G.ggml_backend_tensor_set_data(m.x, X)
        G.ggml_backend_tensor_set_data(G.ggml_opt_labels_i(opt, 1), y1b)
        G.ggml_backend_tensor_set_data(G.ggml_opt_labels_i(opt, 2), y2)
        G.ggml_opt_eval(opt, result)
        l1b = loss_and_dout("mse", o1, y1b.astype(np.float64))[0]
        assert G.ggml_opt_result_n_loss(result) == 2
        r1, r2 = G.ggml_opt_result_loss_i(result, 1), G.ggml_opt_result_loss_i(result, 2)
        assert r1["loss"] == pytest.approx((l1 + l1b) / 2, rel=1e-5)
        assert r1["uncertainty"] == pytest.approx(abs(l1 - l1b) / 2, rel=1e-4)   # sqrt(sum of sq. dev. / (n(n-1)))
        assert r2["loss"] == pytest.approx(l2, rel=1e-5) and r2["uncertainty"] == pytest.approx(0, abs=1e-6)
        assert math.isnan(G.ggml_opt_result_accuracy_i(result, 1)["accuracy"])
        assert G.ggml_opt_result_accuracy_i(result, 2)["accuracy"] == pytest.approx(ncorrect / N)
        with pytest.raises(ValueError, match="ihead"):
            G.ggml_opt_result_loss_i(result, 3)
        G.ggml_opt_result_reset(result)
        assert G.ggml_opt_result_n_loss(result) == 0
        result.free()
        opt.free()
        # a single-head context answers the same accessors
        single = G.ggml_opt_init_for_fit(tsched, MSE, SGD, 1, m.net.ctx, m.x, m.reg)["opt_ctx"]
        assert G.ggml_opt_n_loss(single) == 1 and G.ggml_opt_outputs_i(single, 1) == m.reg
        assert G.ggml_opt_labels_i(single, 1) == G.ggml_opt_labels(single)
        single.free()
    finally:
        m.free()


# ---------------------------------------------------------------- get_batch / get_batch_head

def test_get_batch_and_get_batch_head(cpu, trng):
    X = trng.normal(0, 1, (12, K)).astype(np.float32)
    Y = trng.normal(0, 1, (12, 5)).astype(np.float32)
    ds = make_dataset(X, Y)
    net = Net(cpu)
    try:
        xb = net.leaf((N, K))
        yb = net.leaf((N, 5))
        head = net.leaf((N, 2))
        net.alloc()
        G.ggml_opt_dataset_get_batch(ds, xb, yb, 2)
        np.testing.assert_array_equal(Net.get(xb), X[8:12])
        np.testing.assert_array_equal(Net.get(yb), Y[8:12])
        net.set(xb, np.zeros((N, K)))
        G.ggml_opt_dataset_get_batch_head(ds, None, head, 3, 1)  # labels only
        np.testing.assert_array_equal(Net.get(head), Y[4:8, 3:5])
        np.testing.assert_array_equal(Net.get(xb), 0)
        G.ggml_opt_dataset_get_batch_head(ds, xb, head, 1, 0)
        np.testing.assert_array_equal(Net.get(head), Y[0:4, 1:3])
        np.testing.assert_array_equal(Net.get(xb), X[0:4])
        with pytest.raises(ValueError, match="outside"):
            G.ggml_opt_dataset_get_batch_head(ds, None, head, 4, 0)
        with pytest.raises(ValueError, match="ibatch"):
            G.ggml_opt_dataset_get_batch_head(ds, None, head, 0, 3)
        with pytest.raises(ValueError, match="ibatch"):
            G.ggml_opt_dataset_get_batch(ds, xb, yb, 3)
        with pytest.raises(ValueError, match="labels_batch"):
            G.ggml_opt_dataset_get_batch(ds, xb, None, 0)
    finally:
        net.free()
        ds.free()


def test_get_batch_head_checks_the_data_batch_type(cpu, trng):
    """A data_batch of another type than the dataset's is refused (an I32 one would get the float bits)."""
    ds = make_dataset(trng.normal(0, 1, (8, K)).astype(np.float32), trng.normal(0, 1, (8, 2)).astype(np.float32))
    net = Net(cpu)
    try:
        xb = net.leaf((N, K), dtype=G.GGML_TYPE_I32)
        yb = net.leaf((N, 2))
        net.alloc()
        with pytest.raises(TypeError, match="data_batch"):
            G.ggml_opt_dataset_get_batch_head(ds, xb, yb, 0, 0)
    finally:
        net.free()
        ds.free()


def test_get_batch_head_with_a_half_precision_data_batch_raises_not_aborts():
    from tests.helpers.subprocesses import run_in_subprocess
    rc, out, err = run_in_subprocess(
        "import numpy as np, ggmlpy as G\n"
        "b = G.ggml_backend_cpu_init()\n"
        "ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 2, 1, 8)\n"
        "ctx = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)\n"
        "xb = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, 2, 4)\n"
        "lb = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 1, 4)\n"
        "buf = G.ggml_backend_alloc_ctx_tensors(ctx, b)\n"
        "try:\n"
        "    G.ggml_opt_dataset_get_batch_head(ds, xb, lb, 0, 0)\n"
        "except TypeError as exc:\n"
        "    print('RAISED', exc)\n")
    assert rc == 0, err[-2000:]
    assert out.startswith("RAISED") and "data_batch" in out


def test_shuffle_leaves_a_partial_shard_in_place(cpu, tsched, trng):
    """ndata 10 in shards of 3: three shards move as units, the last row (no whole shard) stays."""
    X = np.arange(20, dtype=np.float32).reshape(10, 2)
    ds = make_dataset(X, X[:, :1].copy(), shard=3)
    m = Linear(cpu, 2, 1, 3, bias=False)
    try:
        fit = G.ggml_opt_init_for_fit(tsched, MSE, SGD, 1, m.net.ctx, m.x, m.out)
        moved = False
        for _ in range(4):
            G.ggml_opt_dataset_shuffle(fit["opt_ctx"], ds)
            Xs = rows_of(G.ggml_opt_dataset_data(ds), 2)
            np.testing.assert_array_equal(Xs[9], X[9])
            assert {tuple(Xs[i:i + 3, 0]) for i in (0, 3, 6)} == {(0, 2, 4), (6, 8, 10), (12, 14, 16)}
            np.testing.assert_array_equal(rows_of(G.ggml_opt_dataset_labels(ds), 1)[:, 0], Xs[:, 0])
            moved |= not np.array_equal(Xs, X)
        assert moved
        with pytest.raises(ValueError, match="multiple of ndata_shard"):
            G.ggml_opt_dataset_shuffle(fit["opt_ctx"], ds, 4)
        fit["opt_ctx"].free()
    finally:
        ds.free()
        m.free()


def test_ncorrect_i_of_a_dynamic_context(tsched):
    opt = G.ggml_opt_init(tsched, CE)
    try:
        assert G.ggml_opt_n_loss(opt) == 1
        assert G.ggml_opt_ncorrect_i(opt, 1) is None  # no graph yet
    finally:
        opt.free()


def test_token_id_dataset(cpu, tsched, trng):
    """An I32 dataset feeds an I32 input; its type must match, and every id must index the table."""
    V, D = 5, 2
    net = Net(cpu)
    try:
        E0 = trng.normal(0, 1, (V, D)).astype(np.float32)
        E = net.leaf((V, D), E0, param=True)
        ids = net.leaf((N,), dtype=G.GGML_TYPE_I32)
        net.alloc()
        out = G.ggml_get_rows(net.ctx, E, ids)
        tok = trng.integers(0, V, 8)
        Y = trng.normal(0, 1, (8, D)).astype(np.float32)
        ds = G.ggml_opt_dataset_init(G.GGML_TYPE_I32, F32, 1, D, 8)
        G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), tok)
        G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), Y)
        G.ggml_fit_opt(tsched, net.ctx, ids, out, ds, MSE, SGD, nepoch=1, nbatch_logical=N, shuffle=False,
                       shuffle_all=False, callbacks=[LR_CB], silent=True)
        ref = E0.astype(np.float64)
        for i in range(2):
            r = slice(i * N, (i + 1) * N)
            _, dout = loss_and_dout("mse", ref[tok[r]], Y[r].astype(np.float64))
            np.add.at(ref, tok[r], -LR * dout)
        np.testing.assert_allclose(Net.get(E), ref, rtol=1e-5, atol=1e-6)
        tok[5] = V
        G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), tok)
        with pytest.raises(ValueError, match=r"the dataset's data holds row indices .* \[0, 5\); got 5"):
            G.ggml_fit_opt(tsched, net.ctx, ids, out, ds, MSE, nbatch_logical=N, silent=True)
        ds.free()
        ds_float = make_dataset(tok[:, None].astype(np.float32), Y)
        with pytest.raises(TypeError, match="f32 data, the inputs tensor is i32"):
            G.ggml_fit_opt(tsched, net.ctx, ids, out, ds_float, MSE, nbatch_logical=N, silent=True)
        ds_float.free()
    finally:
        net.free()


def test_fit_opt_callbacks(model, tsched, trng):
    """The dataset loop: logs without 'steps', state.nepoch = nepoch, stop at the end keeps the row."""
    X = trng.normal(0, 1, (16, K)).astype(np.float32)
    ds = make_dataset(X, trng.normal(0, 1, (16, M)).astype(np.float32))
    seen = []

    def on_epoch_end(epoch, logs, state):
        seen.append((epoch, sorted(logs), state.nepoch))
        state.stop = epoch == 2

    try:
        h = G.ggml_fit_opt(tsched, model.net.ctx, model.x, model.out, ds, MSE, nepoch=5, nbatch_logical=N,
                           val_split=0.5, callbacks=[{"on_epoch_end": on_epoch_end}], silent=True)
        assert list(h["epoch"]) == [1, 2]
        assert seen == [(e, ["train_accuracy", "train_loss", "val_accuracy", "val_loss"], 5) for e in (1, 2)]
    finally:
        ds.free()


@pytest.mark.parametrize("weight", [1.0, 2.0])
def test_fit_opt_multi_with_one_head(weight, cpu, tsched, trng):
    """A single head (also given as a bare tensor): per-head history = the head's unweighted loss."""
    C = 3
    m = Linear(cpu, K, C, N, seed=8)
    X = trng.normal(0, 1, (16, K)).astype(np.float32)
    Y = np.eye(C, dtype=np.float32)[trng.integers(0, C, 16)]
    ds = make_dataset(X, Y)
    keys = []
    try:
        h = G.ggml_fit_opt_multi(tsched, m.net.ctx, m.x, m.out, ds, [CE], [weight], head_names=["cls"], nepoch=2,
                                 nbatch_logical=N, val_split=0.5, silent=True,
                                 callbacks=[{"on_epoch_end": lambda e, logs, s: keys.append(sorted(logs))}])
        assert h.attrs["head_names"] == ["cls"]
        np.testing.assert_allclose(h.attrs["head_loss"]["cls"] * weight, h["train_loss"], rtol=1e-5)
        np.testing.assert_allclose(h.attrs["val_head_loss"]["cls"] * weight, h["val_loss"], rtol=1e-5)
        np.testing.assert_allclose(h.attrs["head_accuracy"]["cls"], h["train_accuracy"])
        np.testing.assert_allclose(h.attrs["val_head_accuracy"]["cls"], h["val_accuracy"])
        assert h["val_accuracy"].between(0, 1).all()
        assert "train_cls_loss" in keys[0] and "val_cls_accuracy" in keys[0]
        r = G.ggml_opt_fit_multi(tsched, m.net.ctx, m.x, m.out, ds, [CE], [weight], nepoch=2, nbatch_logical=N,
                                 silent=True)
        assert r["head_loss"].shape == (2, 1)
    finally:
        ds.free()
        m.free()


def test_batch_tensors_are_read_by_their_shape_not_their_element_count():
    """A [3, 4] tensor holds 12 values, as 2 datapoints of 6 would: element counts alone took it for those,
    filling each column of 3 with half a datapoint. The batch is the outermost axis, each datapoint the rest."""
    X = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    ds = make_dataset(X, X[:, :1].copy())
    ctx = G.ggml_init(8 * G.ggml_tensor_overhead(), no_alloc=True)
    wrong = G.ggml_new_tensor_2d(ctx, F32, 3, 4)
    right = G.ggml_new_tensor_2d(ctx, F32, 6, 2)
    labels = G.ggml_new_tensor_2d(ctx, F32, 1, 2)
    image = G.ggml_new_tensor_4d(ctx, F32, 3, 2, 1, 2)      # two 3x2 images of 6 values
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, G.ggml_backend_cpu_init())
    try:
        with pytest.raises(ValueError, match=r"datapoints of 3 values"):
            G.ggml_opt_dataset_get_batch(ds, wrong, labels, 0)
        G.ggml_opt_dataset_get_batch(ds, right, labels, 1)
        np.testing.assert_array_equal(rows_of(right, 6), X[2:4])
        G.ggml_opt_dataset_get_batch(ds, image, labels, 2)
        np.testing.assert_array_equal(rows_of(image, 6), X[4:6])
        with pytest.raises(ValueError, match=r"datapoints of 3 values"):
            G.ggml_opt_dataset_get_batch_rows(ds, wrong, slice(0, 2))
    finally:
        buf.free()
        ctx.free()
