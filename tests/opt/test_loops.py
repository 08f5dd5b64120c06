"""Training through ggml-opt's low-level API: ggml_opt_fit (ggml's C loop) and a hand-written
loop over ggml_opt_alloc / ggml_opt_eval, checked against the true weights and against a
numpy float64 reimplementation of ggml's AdamW and SGD updates."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G


TRUE_W = np.array([1.0, 2.0, 3.0, 4.0])
TRUE_B = 0.5
N, B = 256, 16


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (N, 4)).astype(np.float32)                     # (N, 4): [4, N] in ggml
    y = (X.astype(np.float64) @ TRUE_W + TRUE_B).astype(np.float32).reshape(N, 1)
    return X, y


class Linear:
    """out = W x + b with W [4, 1], b [1] as parameters and x [4, batch] as the input."""

    def __init__(self, backend, batch, w0=None, b0=0.0):
        self.ctx_static = G.ggml_init(16 * G.ggml_tensor_overhead() + 1024, no_alloc=True)
        self.x = G.ggml_set_input(G.ggml_new_tensor_2d(self.ctx_static, G.GGML_TYPE_F32, 4, batch))
        self.W = G.ggml_set_param(G.ggml_new_tensor_2d(self.ctx_static, G.GGML_TYPE_F32, 4, 1))
        self.b = G.ggml_set_param(G.ggml_new_tensor_1d(self.ctx_static, G.GGML_TYPE_F32, 1))
        self.buf = G.ggml_backend_alloc_ctx_tensors(self.ctx_static, backend)
        G.ggml_backend_tensor_set_data(self.W, np.zeros(4) if w0 is None else w0)
        G.ggml_backend_tensor_set_data(self.b, [b0])
        self.ctx_compute = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
        self.out = G.ggml_add(self.ctx_compute, G.ggml_mul_mat(self.ctx_compute, self.W, self.x), self.b)
        assert G.ggml_tensor_shape(self.out) == (1, batch, 1, 1)

    def weights(self):
        return (G.ggml_backend_tensor_get_data(self.W).astype(np.float64),
                float(G.ggml_backend_tensor_get_data(self.b)[0]))

    def free(self):
        self.ctx_compute.free()
        self.buf.free()
        self.ctx_static.free()


def _dataset(X, y):
    ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 1, len(X), 1)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), X)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), y)
    return ds


# ---------------------------------------------------------------- (a) ggml_opt_fit

def test_opt_fit_recovers_linear_regression(backend, sched, data):
    X, y = data
    model = Linear(backend, B)
    ds = _dataset(X, y)
    try:
        # default AdamW (lr 1e-3): 1000 epochs x 16 steps, all in C
        G.ggml_opt_fit(sched, model.ctx_compute, model.x, model.out, ds, G.ggml_opt_loss_type_mse(),
                       G.ggml_opt_optimizer_type_adamw(), nepoch=1000, nbatch_logical=B, val_split=0.0, silent=True)
        W, b = model.weights()
        np.testing.assert_allclose(W, TRUE_W, atol=1e-2)
        assert abs(b - TRUE_B) < 1e-2
    finally:
        ds.free()
        model.free()


def test_opt_fit_with_gradient_accumulation_and_validation(backend, sched, data):
    X, y = data
    model = Linear(backend, 8)
    ds = _dataset(X, y)
    try:
        # physical batch 8, logical 32 (opt_period 4), 25 % held out for validation
        G.ggml_opt_fit(sched, model.ctx_compute, model.x, model.out, ds, G.ggml_opt_loss_type_mse(),
                       G.ggml_opt_optimizer_type_adamw(), nepoch=3, nbatch_logical=32, val_split=0.25, silent=True)
        W, b = model.weights()
        assert np.all(np.isfinite(W)) and np.isfinite(b)
        assert np.all(W > 0) and np.all(W < 1)  # moved towards the truth, ~3 x 6 small steps of lr 1e-3
    finally:
        ds.free()
        model.free()


# ---------------------------------------------------------------- (b) a hand-written loop

def _train_by_hand(backend, sched, X, y, optimizer, lr, epochs, w0=None, b0=0.0, weight_decay=0.0,
                   batch=B, on_step=None):
    model = Linear(backend, batch, w0, b0)
    fit = G.ggml_opt_init_for_fit(sched, G.ggml_opt_loss_type_mse(), optimizer, 1, model.ctx_compute, model.x,
                                  model.out, weight_decay=weight_decay)
    opt, lr_ud = fit["opt_ctx"], fit["lr_ud"]
    if optimizer == G.ggml_opt_optimizer_type_adamw():
        G.ggml_opt_set_lr(lr_ud, adamw_lr=lr)
    else:
        G.ggml_opt_set_lr(lr_ud, sgd_lr=lr)
    losses = []
    result = G.ggml_opt_result_init()
    try:
        for _ in range(epochs):
            G.ggml_opt_result_reset(result)
            for i in range(0, len(X), batch):
                G.ggml_opt_alloc(opt, True)
                G.ggml_backend_tensor_set_data(model.x, X[i:i + batch])
                G.ggml_backend_tensor_set_data(G.ggml_opt_labels(opt), y[i:i + batch])
                G.ggml_opt_eval(opt, result)
                losses.append(float(G.ggml_backend_tensor_get_data(G.ggml_opt_loss(opt))[0]))
                if on_step is not None:
                    on_step(model.weights(), losses[-1])
        return model.weights(), losses, {"loss": G.ggml_opt_result_loss(result),
                                         "ndata": G.ggml_opt_result_ndata(result)}
    finally:
        result.free()
        opt.free()
        model.free()


def test_hand_loop_recovers_linear_regression(backend, sched, data):
    X, y = data
    (W, b), losses, res = _train_by_hand(backend, sched, X, y, G.ggml_opt_optimizer_type_adamw(), 0.05, 40)
    np.testing.assert_allclose(W, TRUE_W, atol=1e-2)
    assert abs(b - TRUE_B) < 1e-2
    assert losses[-1] < 1e-4 < losses[0]
    # the result holds the last epoch: every datapoint once, loss = mean of the 16 batch losses
    assert res["ndata"] == N
    np.testing.assert_allclose(res["loss"]["loss"], np.mean(losses[-N // B:]), rtol=1e-5, atol=1e-9)
    assert res["loss"]["uncertainty"] >= 0


def test_result_loss_and_ndata_match_numpy(backend, sched, data):
    """One epoch with SGD: the per-batch MSE losses (before each update) recomputed in numpy."""
    X, y = data
    X, y = X[:64], y[:64]
    w0, b0 = np.array([0.3, -0.2, 0.1, 0.0]), 0.25
    seen = []
    (W, b), losses, res = _train_by_hand(backend, sched, X, y, G.ggml_opt_optimizer_type_sgd(), 0.1, 1,
                                         w0=w0, b0=b0, on_step=lambda wb, loss: seen.append(wb))
    Xd, yd = X.astype(np.float64), y.astype(np.float64).ravel()
    before = [(w0, b0)] + seen[:-1]
    ref = [np.mean((Xd[i * B:(i + 1) * B] @ w + bb - yd[i * B:(i + 1) * B]) ** 2) for i, (w, bb) in enumerate(before)]
    np.testing.assert_allclose(losses, ref, rtol=1e-5)
    assert res["ndata"] == 64
    np.testing.assert_allclose(res["loss"]["loss"], np.mean(ref), rtol=1e-5)
    np.testing.assert_allclose(res["loss"]["uncertainty"], np.std(ref) / np.sqrt(len(ref) - 1), rtol=1e-4)


# ---------------------------------------------------------------- (c) update rules vs numpy

def _mse_grad(Xb, yb, w, b):
    """d/d(w, b) of mean((X w + b - y)^2) over the batch (ggml-opt's MSE: mean over all outputs)."""
    r = Xb @ w + b - yb
    return 2 * Xb.T @ r / len(r), 2 * r.sum() / len(r)


def _reference_steps(X, y, w0, b0, n_steps, optimizer, lr, wd, beta1=0.9, beta2=0.999, eps=1e-8):
    w, b = np.array(w0, np.float64), float(b0)
    mw, vw, mb, vb = np.zeros(4), np.zeros(4), 0.0, 0.0
    path = []
    for it in range(1, n_steps + 1):
        i = (it - 1) * B
        gw, gb = _mse_grad(X[i:i + B], y[i:i + B], w, b)
        if optimizer == "sgd":
            w = w * (1 - lr * wd) - lr * gw
            b = b * (1 - lr * wd) - lr * gb
        else:
            mw, mb = beta1 * mw + (1 - beta1) * gw, beta1 * mb + (1 - beta1) * gb
            vw, vb = beta2 * vw + (1 - beta2) * gw ** 2, beta2 * vb + (1 - beta2) * gb ** 2
            c1, c2 = 1 / (1 - beta1 ** it), 1 / (1 - beta2 ** it)
            # bias correction, eps added after the square root, decoupled weight decay
            w = w * (1 - lr * wd) - lr * (mw * c1) / (np.sqrt(vw * c2) + eps)
            b = b * (1 - lr * wd) - lr * (mb * c1) / (np.sqrt(vb * c2) + eps)
        path.append((w.copy(), b))
    return path


@pytest.mark.parametrize("optimizer,lr,wd", [
    ("adamw", 0.05, 0.0),
    ("adamw", 0.05, 0.2),
    ("sgd", 0.1, 0.0),
    ("sgd", 0.1, 0.3),
])
def test_optimizer_steps_match_numpy(backend, sched, data, optimizer, lr, wd):
    X, y = data
    n_steps = 6
    X, y = X[:n_steps * B], y[:n_steps * B]
    w0, b0 = np.array([0.5, -1.0, 0.25, 2.0]), -0.75
    seen = []
    otype = G.ggml_opt_optimizer_type_adamw() if optimizer == "adamw" else G.ggml_opt_optimizer_type_sgd()
    _train_by_hand(backend, sched, X, y, otype, lr, 1, w0=w0, b0=b0, weight_decay=wd,
                   on_step=lambda wb, loss: seen.append(wb))
    ref = _reference_steps(X.astype(np.float64), y.astype(np.float64).ravel(), w0, b0, n_steps, optimizer, lr, wd)
    assert len(seen) == n_steps
    for step, ((w, b), (rw, rb)) in enumerate(zip(seen, ref), 1):
        np.testing.assert_allclose(w, rw, rtol=2e-5, atol=2e-6, err_msg=f"W after step {step}")
        np.testing.assert_allclose(b, rb, rtol=2e-5, atol=2e-6, err_msg=f"b after step {step}")
    # the weights did move, and weight decay made a difference where it was on
    assert np.abs(seen[-1][0] - w0).max() > 0.1
    if wd:
        no_wd = _reference_steps(X.astype(np.float64), y.astype(np.float64).ravel(), w0, b0, n_steps, optimizer,
                                 lr, 0.0)
        assert np.abs(no_wd[-1][0] - seen[-1][0]).max() > 1e-3


def test_changing_the_learning_rate_between_steps(backend, sched, data):
    """ggml_opt_set_lr takes effect at the next optimizer step (SGD: w -= lr * g)."""
    X, y = data
    X, y = X[:3 * B], y[:3 * B]
    lrs = [0.1, 0.0001, 0.5]
    model = Linear(backend, B)
    fit = G.ggml_opt_init_for_fit(sched, G.ggml_opt_loss_type_mse(), G.ggml_opt_optimizer_type_sgd(), 1,
                                  model.ctx_compute, model.x, model.out)
    opt, lr_ud = fit["opt_ctx"], fit["lr_ud"]
    try:
        w, b = np.zeros(4), 0.0
        for step, lr in enumerate(lrs):
            G.ggml_opt_set_lr(lr_ud, sgd_lr=lr)
            assert G.ggml_opt_get_lr(lr_ud)["sgd"] == pytest.approx(lr)
            G.ggml_opt_alloc(opt, True)
            G.ggml_backend_tensor_set_data(model.x, X[step * B:(step + 1) * B])
            G.ggml_backend_tensor_set_data(G.ggml_opt_labels(opt), y[step * B:(step + 1) * B])
            G.ggml_opt_eval(opt)
            gw, gb = _mse_grad(X[step * B:(step + 1) * B].astype(np.float64), y[step * B:(step + 1) * B].ravel(), w, b)
            w, b = w - lr * gw, b - lr * gb
            W, bb = model.weights()
            np.testing.assert_allclose(W, w, rtol=2e-5, atol=2e-6)
            np.testing.assert_allclose(bb, b, rtol=2e-5, atol=2e-6)
    finally:
        opt.free()
        model.free()


def test_opt_result_pred_holds_the_argmax_of_each_datapoint(backend, sched):
    """A cross-entropy context records each datapoint's predicted class; ggml_opt_result_pred returns them
    (it raised TypeError on any non-empty result: an untyped buffer for C's int32_t *)."""
    rng = np.random.default_rng(0)
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 8))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 4))
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    W = rng.normal(size=(4, 3)).astype(np.float32)
    G.ggml_backend_tensor_set_data(w, W)
    logits = G.ggml_mul_mat(ctx, w, x)
    opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_cross_entropy(), ctx_compute=ctx, inputs=x, outputs=logits,
                          build_type=G.ggml_opt_build_type_forward())
    result = G.ggml_opt_result_init()
    X = rng.normal(size=(16, 3)).astype(np.float32)
    for i in (0, 8):
        G.ggml_opt_alloc(opt, False)
        G.ggml_backend_tensor_set_data(x, X[i:i + 8])
        G.ggml_backend_tensor_set_data(G.ggml_opt_labels(opt), np.eye(4, dtype=np.float32)[np.arange(8) % 4])
        G.ggml_opt_eval(opt, result)
    pred = G.ggml_opt_result_pred(result)
    assert pred.dtype == np.int32 and pred.shape == (16,)
    np.testing.assert_array_equal(pred, (X.astype(np.float64) @ W.T).argmax(axis=1))
    for o in (result, opt, buf, ctx):
        o.free()


def _epoch_setup(backend, sched):
    rng = np.random.default_rng(1)
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 4))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 1))
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    G.ggml_backend_tensor_set_data(w, np.zeros((1, 3)))
    out = G.ggml_mul_mat(ctx, w, x)
    opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), ctx_compute=ctx, inputs=x, outputs=out)
    ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 3, 1, 32, 1)
    X = rng.normal(size=(32, 3)).astype(np.float32)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), X)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), X @ np.array([[1.0], [2.0], [-1.0]], np.float32))
    return opt, ds, [ds, opt, buf, ctx]


def test_opt_epoch_calls_python_callbacks_and_trains(backend, sched):
    opt, ds, owned = _epoch_setup(backend, sched)
    result = G.ggml_opt_result_init()
    calls = []
    G.ggml_opt_epoch(opt, ds, result, None, -1, lambda *a: calls.append(a[:3]), False)
    assert [c[1] for c in calls] == list(range(1, 9)) and all(c[0] and c[2] == 8 for c in calls)
    assert G.ggml_opt_result_ndata(result) == 32
    for o in [result] + owned:
        o.free()


def test_ctrl_c_in_an_opt_epoch_callback_is_not_swallowed(backend, sched):
    """KeyboardInterrupt raised in a callback (that is where Ctrl-C surfaces during ggml's C loop) stops the
    caller once ggml_opt_epoch returns, and no further callback runs; an ordinary error only warns (ggmlR)."""
    opt, ds, owned = _epoch_setup(backend, sched)
    calls = []

    def interrupt(train, ibatch, ibatch_max, t_start, result):
        calls.append(ibatch)
        if ibatch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        G.ggml_opt_epoch(opt, ds, None, None, -1, interrupt, False)
    assert calls == [1, 2]

    failed = []

    def failing(train, ibatch, *args):
        failed.append(ibatch)
        raise ValueError("oops")

    result = G.ggml_opt_result_init()
    with pytest.raises(ValueError, match="oops"):  # not a warning: the epoch stops after the batch
        G.ggml_opt_epoch(opt, ds, result, None, -1, failing, False)
    assert failed == [1] and G.ggml_opt_result_ndata(result) == 4  # the batch done is recorded
    result.free()
    for o in owned:
        o.free()


# ---------------------------------------------------------------- (d) ggml's loops run from Python

def _c_opt_fit(sched, model, ds, nepoch, nbatch_logical, val_split, loss=None):
    """ggml's own C function ggml_opt_fit, reached through the ffi (graphs in a private context)."""
    from ggmlpy._ffi import lib
    graphs = G.ggml_init(3 * G.ggml_graph_overhead(2048, True) + 6 * 2048 * G.ggml_tensor_overhead(), no_alloc=True)
    try:
        lib.ggml_opt_fit(sched.ptr, graphs.ptr, model.x.ptr, model.out.ptr, ds.ptr,
                         G.ggml_opt_loss_type_mse() if loss is None else loss, G.ggml_opt_optimizer_type_adamw(),
                         lib.ggml_opt_get_default_optimizer_params, nepoch, nbatch_logical, val_split, True)
    finally:
        lib.ggml_backend_sched_reset(sched.ptr)
        graphs.free()


@pytest.mark.parametrize("batch,nbatch_logical,val_split", [(16, 16, 0.0), (8, 32, 0.25), (16, 64, 0.3)])
def test_opt_fit_matches_ggmls_c_loop(backend, data, batch, nbatch_logical, val_split):
    """ggml_opt_fit runs batch by batch from Python (Ctrl-C can stop it) with ggml's semantics: the same
    shuffles (ggml's generator), accumulation, validation split and optimizer steps give the same weights
    as ggml's C function, bit for bit."""
    X, y = data
    w0 = np.array([0.3, -0.2, 0.1, 0.0])
    weights = []
    for run in ("c", "python"):
        model = Linear(backend, batch, w0, 0.25)
        ds = _dataset(X, y)
        sched = G.ggml_backend_sched_new([backend], parallel=False)
        try:
            if run == "c":
                _c_opt_fit(sched, model, ds, 3, nbatch_logical, val_split)
            else:
                G.ggml_opt_fit(sched, model.ctx_compute, model.x, model.out, ds, G.ggml_opt_loss_type_mse(),
                               G.ggml_opt_optimizer_type_adamw(), nepoch=3, nbatch_logical=nbatch_logical,
                               val_split=val_split, silent=True)
            weights.append(model.weights())
        finally:
            for h in (sched, ds):
                h.free()
            model.free()
    (wc, bc), (wp, bp) = weights
    assert np.abs(wc - w0).max() > 1e-3          # it trained
    np.testing.assert_array_equal(wp, wc)
    assert bp == bc


def test_opt_epoch_matches_ggmls_c_loop(backend, data):
    """ggml_opt_epoch from Python and ggml's C ggml_opt_epoch: same per-batch losses, accuracy bookkeeping,
    weights and accumulation phase (opt_period 2, a training and an evaluation part)."""
    from ggmlpy._ffi import ffi, lib
    X, y = data
    out = []
    for run in ("c", "python"):
        model = Linear(backend, 8, np.array([0.3, -0.2, 0.1, 0.0]), 0.25)
        ds = _dataset(X, y)
        sched = G.ggml_backend_sched_new([backend], parallel=False)
        fit = G.ggml_opt_init_for_fit(sched, G.ggml_opt_loss_type_mse(), opt_period=2, ctx_compute=model.ctx_compute,
                                      inputs=model.x, outputs=model.out)
        opt = fit["opt_ctx"]
        rt, re_ = G.ggml_opt_result_init(), G.ggml_opt_result_init()
        try:
            for _ in range(2):
                G.ggml_opt_result_reset(rt)
                G.ggml_opt_result_reset(re_)
                if run == "c":
                    lib.ggml_opt_epoch(opt.ptr, ds.ptr, rt.ptr, re_.ptr, 192, ffi.NULL, ffi.NULL)
                else:
                    G.ggml_opt_epoch(opt, ds, rt, re_, 192, False, False)
            out.append((model.weights(), G.ggml_opt_result_loss(rt), G.ggml_opt_result_loss(re_),
                        G.ggml_opt_result_ndata(rt), G.ggml_opt_result_ndata(re_)))
        finally:
            for h in (rt, re_, opt, sched, ds):
                h.free()
            model.free()
    (wc, bc), *rest_c = out[0]
    (wp, bp), *rest_p = out[1]
    np.testing.assert_array_equal(wp, wc)
    assert bp == bc and rest_p == rest_c and rest_c[2:] == [192, 64]


def test_opt_epoch_callbacks_get_ggmls_arguments(backend, sched):
    """The callbacks see what ggml's loop passes: train flag, 1-based batch index within its part, the part's
    batch count, the part's start time (ggml's clock) and the part's result."""
    opt, ds, owned = _epoch_setup(backend, sched)
    rt, re_ = G.ggml_opt_result_init(), G.ggml_opt_result_init()
    calls = []
    G.ggml_opt_epoch(opt, ds, rt, re_, 20, lambda *a: calls.append(a), lambda *a: calls.append(a))
    assert [(c[0], c[1], c[2]) for c in calls] == [(True, i, 5) for i in range(1, 6)] + \
        [(False, i, 3) for i in range(1, 4)]
    assert all(c[4] is rt for c in calls[:5]) and all(c[4] is re_ for c in calls[5:])
    assert len({c[3] for c in calls[:5]}) == 1 and calls[5][3] >= calls[0][3] > 0
    for o in [rt, re_] + owned:
        o.free()


_CTRL_C = """
import os, signal, threading, time
import numpy as np, ggmlpy as G
be = G.ggml_backend_cpu_init(); G.ggml_backend_cpu_set_n_threads(be, 1)
sched = G.ggml_backend_sched_new([be], parallel=False)
cs = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
x = G.ggml_set_input(G.ggml_new_tensor_2d(cs, G.GGML_TYPE_F32, 4, 8))
W = G.ggml_set_param(G.ggml_new_tensor_2d(cs, G.GGML_TYPE_F32, 4, 1))
buf = G.ggml_backend_alloc_ctx_tensors(cs, be)
G.ggml_backend_tensor_set_data(W, np.zeros(4))
cc = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
out = G.ggml_mul_mat(cc, W, x)
ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 1, 64)
X = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), X)
G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), X @ np.array([[1.0], [2.0], [3.0], [4.0]], np.float32))
sent = []
def interrupt():
    time.sleep(1.0)
    sent.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=interrupt, daemon=True).start()
try:
    {call}
except KeyboardInterrupt:
    print("STOPPED_AFTER", time.monotonic() - sent[0])
w = G.ggml_backend_tensor_get_data(W)
assert np.all(np.isfinite(w)) and np.abs(w).max() > 0, w   # the completed batches trained
{after}
print("USABLE")
"""


@pytest.mark.parametrize("which", ["opt_fit", "opt_epoch"])
def test_ctrl_c_stops_ggmls_loops_promptly(which):
    """Ctrl-C during ggml_opt_fit / ggml_opt_epoch stops it between two batches (ggml's C loop ran all its
    batches first, about a minute here), leaving everything usable: the scheduler serves a new opt context
    after ggml_opt_fit, the opt context runs another epoch after ggml_opt_epoch."""
    from tests.helpers.subprocesses import run_in_subprocess
    if which == "opt_fit":
        call = ("G.ggml_opt_fit(sched, cc, x, out, ds, G.ggml_opt_loss_type_mse(), nepoch=200000, nbatch_logical=16, "
                "val_split=0.25, silent=True)")
        after = ("G.ggml_opt_free(G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), ctx_compute=cc, inputs=x, "
                 "outputs=out))")
    else:
        call = ("opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), opt_period=2, ctx_compute=cc, inputs=x, "
                "outputs=out)\n    big = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 1, 8 * 400000)\n"
                "    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(big), np.tile(X, (50000, 1)))\n"
                "    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(big), "
                "np.tile(X.sum(1, keepdims=True), (50000, 1)))\n"
                "    G.ggml_opt_epoch(opt, big, None, None, -1, False, False)")
        after = "G.ggml_opt_epoch(opt, ds, None, None, -1, False, False)"
    rc, out_, err = run_in_subprocess(_CTRL_C.replace("{call}", call).replace("{after}", after), timeout=100)
    assert rc == 0, err[-2000:]
    stopped = [line for line in out_.splitlines() if line.startswith("STOPPED_AFTER")]
    assert stopped, f"the loop was not interrupted: {out_[-500:]} {err[-1500:]}"
    assert float(stopped[0].split()[1]) < 1.0, stopped
    assert "USABLE" in out_


# ---------------------------------------------------------------- cross-entropy targets that trained to nonsense

def _ce_setup(backend, sched, classes):
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 4))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, classes))
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    G.ggml_backend_tensor_set_data(w, np.full((classes, 3), 0.1, np.float32))
    return ctx, x, G.ggml_mul_mat(ctx, w, x), [buf, ctx]


def test_cross_entropy_over_one_class_is_refused(backend, sched):
    """A softmax over one value is 1: loss 0 and accuracy 1 whatever the data."""
    ctx, x, out, owned = _ce_setup(backend, sched, 1)
    ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 3, 1, 8, 1)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), np.ones((8, 1), np.float32))  # "one class"
    with pytest.raises(G.GgmlValueError, match="at least 2 classes"):
        G.ggml_fit_opt(sched, ctx, x, out, ds, G.ggml_opt_loss_type_cross_entropy(), nepoch=1, nbatch_logical=4,
                       silent=True)
    with pytest.raises(G.GgmlValueError, match="at least 2 classes"):
        G.ggml_opt_fit(sched, ctx, x, out, ds, G.ggml_opt_loss_type_cross_entropy(), nepoch=1, nbatch_logical=4,
                       silent=True)
    for o in [ds, *owned]:
        o.free()


@pytest.mark.parametrize("bad_row", [[0.0, 0.0], [1.5, -0.5]])
def test_cross_entropy_labels_must_be_distributions(backend, sched, bad_row):
    """A row of zeros trained to loss 0, a negative entry to a negative loss."""
    ctx, x, out, owned = _ce_setup(backend, sched, 2)
    ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 3, 2, 8, 1)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), np.ones((8, 3), np.float32))
    labels = np.eye(2, dtype=np.float32)[np.arange(8) % 2]
    labels[5] = bad_row
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), labels)
    for fit in (G.ggml_fit_opt, G.ggml_opt_fit):
        with pytest.raises(G.GgmlValueError, match="datapoint 5 has .* must be >= 0 and a row must not be all zeros"):
            fit(sched, ctx, x, out, ds, G.ggml_opt_loss_type_cross_entropy(), nepoch=1, nbatch_logical=4, silent=True)

    def batches():
        for _ in range(2):
            yield np.ones((4, 3), np.float32), np.array([[1, 0], bad_row, [0, 1], [1, 0]], np.float32)
    with pytest.raises(G.GgmlValueError, match="row 1 is .* must be >= 0"):
        G.ggml_fit_opt_gen(sched, ctx, x, out, batches, loss_type=G.ggml_opt_loss_type_cross_entropy(), silent=True)
    for o in [ds, *owned]:
        o.free()


def test_a_batch_of_one_sample_accumulates_over_nbatch_logical(backend, sched):
    """Inputs [features, 1] were taken for a batch of `features` samples: nbatch_logical=4 then stepped the
    optimizer every batch (accumulation silently off). Now one sample per batch: 3 batches leave the weights
    as they were (no optimizer step yet), the 4th steps."""
    import warnings

    def run(steps):
        ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
        x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 1))
        w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 1))
        buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
        G.ggml_backend_tensor_set_data(w, np.zeros((1, 3), np.float32))
        out = G.ggml_mul_mat(ctx, w, x)
        batches = [(np.full((1, 3), i + 1.0, np.float32), np.ones((1, 1), np.float32)) for i in range(steps)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "training ended inside a logical batch"
            G.ggml_fit_opt_gen(sched, ctx, x, out, batches, loss_type=G.ggml_opt_loss_type_mse(), nbatch_logical=4,
                               silent=True)
        after = G.ggml_backend_tensor_get_data(w).copy()
        buf.free()
        ctx.free()
        return after

    np.testing.assert_array_equal(run(3).reshape(-1), np.zeros(3))
    assert np.abs(run(4)).sum() > 0


def test_predictions_of_a_loss_that_records_none_are_refused_not_zeros(backend, sched):
    """ggml records predictions for its cross-entropy only; for another loss ggml_opt_result_pred returned
    zeros, a class id for every datapoint."""
    opt, ds, owned = _epoch_setup(backend, sched)  # an MSE context
    result = G.ggml_opt_result_init()
    G.ggml_opt_epoch(opt, ds, result, None, -1, False, False)
    assert G.ggml_opt_result_ndata(result) == 32
    with pytest.raises(G.GgmlValueError, match="records no predictions"):
        G.ggml_opt_result_pred(result)
    empty = G.ggml_opt_result_init()
    assert G.ggml_opt_result_pred(empty).shape == (0,)  # nothing evaluated: nothing to predict
    for o in [result, empty, *owned]:
        o.free()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_the_fast_distribution_check_agrees_with_the_rule():
    """The per-batch check's fast path (``all_distributions``: two vectorised passes) says "all fine" exactly when
    the rule (``not_distributions``, row by row) finds no bad row: rows with NaN, -inf, a negative value, all
    zeros, -0.0, subnormals, +inf, one class and many, empty batches."""
    from ggmlpy.opt.dataset import all_distributions, not_distributions
    rng = np.random.default_rng(0)
    specials = np.array([0.0, -0.0, 1.0, 0.5, np.nan, np.inf, -np.inf, -1e-30, 1e-45, 3e38], np.float32)
    cases = [np.zeros((0, 3), np.float32), np.zeros((4, 0), np.float32), np.zeros((1, 1), np.float32),
             np.ones((3, 1), np.float32), np.full((2, 2), 3e38, np.float32)]
    for _ in range(400):
        n, k = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        rows = np.eye(k, dtype=np.float32)[rng.integers(0, k, n)]
        for _ in range(int(rng.integers(0, 3))):
            rows[rng.integers(0, n), rng.integers(0, k)] = rng.choice(specials)
        cases.append(rows)
    bad_found = 0
    for rows in cases:
        expected = not bool(not_distributions(rows).any())
        assert all_distributions(rows) == expected, rows
        bad_found += not expected
    assert 50 < bad_found < len(cases) - 50   # both answers are exercised
