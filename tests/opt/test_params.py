"""ggml_opt_default_params + ggml_opt_init(params), the optimizer hyper-parameters as public fields, and
the get_opt_pars callback (ggml_opt_init and ggml_opt_fit).

Every update is checked against an independent float64 numpy implementation of ggml's AdamW (bias
corrected moments, eps after the square root, decoupled weight decay) and SGD, with the same
hyper-parameters; and against the same numpy run with ggml's defaults, so a setter that changed nothing
would fail the test.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G


B = 8


class Linear:
    """out = W x + b, W [4, 1] and b [1] trainable, x [4, B] the input."""

    def __init__(self, backend, w0, b0):
        self.ctx_static = G.ggml_init(16 * G.ggml_tensor_overhead() + 1024, no_alloc=True)
        self.x = G.ggml_set_input(G.ggml_new_tensor_2d(self.ctx_static, G.GGML_TYPE_F32, 4, B))
        self.W = G.ggml_set_param(G.ggml_new_tensor_2d(self.ctx_static, G.GGML_TYPE_F32, 4, 1))
        self.b = G.ggml_set_param(G.ggml_new_tensor_1d(self.ctx_static, G.GGML_TYPE_F32, 1))
        self.buf = G.ggml_backend_alloc_ctx_tensors(self.ctx_static, backend)
        G.ggml_backend_tensor_set_data(self.W, w0)
        G.ggml_backend_tensor_set_data(self.b, [b0])
        self.ctx_compute = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
        self.out = G.ggml_add(self.ctx_compute, G.ggml_mul_mat(self.ctx_compute, self.W, self.x), self.b)

    def weights(self):
        return np.concatenate([G.ggml_backend_tensor_get_data(self.W), G.ggml_backend_tensor_get_data(self.b)])

    def free(self):
        self.ctx_compute.free()
        self.buf.free()
        self.ctx_static.free()


W0, B0 = np.array([0.5, -1.0, 0.25, 2.0]), -0.75


@pytest.fixture
def data():
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, (4 * B, 4)).astype(np.float32)
    y = (X.astype(np.float64) @ np.array([1.0, 2.0, 3.0, 4.0]) + 0.5).astype(np.float32).reshape(-1, 1)
    return X, y


@pytest.fixture
def model(backend):
    m = Linear(backend, W0, B0)
    yield m
    m.free()


def _grad(X, y, theta):
    """d/d(W, b) of mean((X W + b - y)^2) over the batch (ggml-opt's MSE)."""
    Xa = np.hstack([X.astype(np.float64), np.ones((len(X), 1))])
    r = Xa @ theta - y.astype(np.float64).ravel()
    return 2 * Xa.T @ r / len(r)


def numpy_adamw(X, y, theta0, steps, alpha, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.0):
    theta, m, v, path = np.array(theta0, np.float64), 0.0, 0.0, []
    for it in range(1, steps + 1):
        g = _grad(X[(it - 1) * B:it * B], y[(it - 1) * B:it * B], theta)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        mh, vh = m / (1 - beta1 ** it), v / (1 - beta2 ** it)
        theta = theta * (1 - alpha * wd) - alpha * mh / (np.sqrt(vh) + eps)
        path.append(theta.copy())
    return path


def numpy_sgd(X, y, theta0, lrs, wd=0.0, batches=None):
    theta, path = np.array(theta0, np.float64), []
    for k, lr in enumerate(lrs):
        sl = slice(k * B, (k + 1) * B) if batches is None else batches
        theta = theta * (1 - lr * wd) - lr * _grad(X[sl], y[sl], theta)
        path.append(theta.copy())
    return path


def _step(opt, model, X, y, k):
    G.ggml_opt_alloc(opt, True)
    G.ggml_backend_tensor_set_data(model.x, X[k * B:(k + 1) * B])
    G.ggml_backend_tensor_set_data(G.ggml_opt_labels(opt), y[k * B:(k + 1) * B])
    G.ggml_opt_eval(opt)
    return model.weights()


def _params(sched, model, optimizer=None):
    p = G.ggml_opt_default_params(sched, G.ggml_opt_loss_type_mse())
    p.ctx_compute, p.inputs, p.outputs = model.ctx_compute, model.x, model.out
    if optimizer is not None:
        p.optimizer = optimizer
    return p


THETA0 = np.append(W0, B0)


# ---------------------------------------------------------------- the objects

def test_default_params_are_ggmls(sched):
    p = G.ggml_opt_default_params(sched, G.ggml_opt_loss_type_cross_entropy())
    assert p.as_dict() == {"loss_type": G.ggml_opt_loss_type_cross_entropy(), "build_type": G.ggml_opt_build_type_opt(),
                           "opt_period": 1, "optimizer": G.ggml_opt_optimizer_type_adamw()}
    assert p["opt_period"] == 1 and p["build_type"] == 30 and p.sched is sched
    assert p.ctx_compute is None and p.inputs is None and p.outputs is None and p.get_opt_pars is None
    a = p.opt_pars.as_dict()["adamw"]
    assert a == pytest.approx({"alpha": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "wd": 0.0})
    assert p.sgd.alpha == pytest.approx(1e-3) and p.sgd.wd == 0.0
    with pytest.raises(KeyError):
        p["nope"]


def test_setters_check_what_ggml_asserts(sched):
    p = G.ggml_opt_default_params(sched, G.ggml_opt_loss_type_mse())
    bad = [("adamw", "alpha", 0.0), ("adamw", "alpha", -1e-3), ("adamw", "alpha", 1e-50),  # 0 as a float32
           ("adamw", "beta1", 1.5), ("adamw", "beta2", -0.1), ("adamw", "eps", -1e-9), ("adamw", "wd", 1.01),
           ("adamw", "eps", float("nan")), ("sgd", "alpha", 0), ("sgd", "wd", 2.0), ("sgd", "alpha", float("inf")),
           # a beta of 1, also one that only rounds to 1 in float32, makes every weight NaN (1 / (1 - beta^t));
           # a learning rate beyond float32 becomes inf
           ("adamw", "beta1", 1.0), ("adamw", "beta2", 0.99999999), ("adamw", "alpha", 1e300)]
    for group, key, value in bad:
        with pytest.raises(G.GgmlValueError, match=f"{group}.{key}"):
            setattr(getattr(p, group), key, value)
    with pytest.raises(G.GgmlValueError):
        p.adamw.beta1 = True
    with pytest.raises(AttributeError, match="alpha, beta1"):
        p.adamw.lr = 0.1
    with pytest.raises(AttributeError):
        p.sgd.beta1 = 0.5
    assert p.opt_pars.as_dict() == G.ggml_opt_get_default_optimizer_params().as_dict()  # nothing was written
    p.adamw.beta1, p.adamw.eps, p.sgd.wd = 0.0, 0.0, 1.0    # the bounds themselves are fine (test-opt uses them)
    assert (p.adamw.beta1, p.adamw.eps, p.sgd.wd) == (0.0, 0.0, 1.0)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_opt_default_params("sched", G.ggml_opt_loss_type_mse())
    with pytest.raises(G.GgmlValueError):
        G.ggml_opt_default_params(sched, 99)


def test_init_with_params_refuses_other_arguments(sched, model):
    p = _params(sched, model)
    with pytest.raises(G.GgmlValueError, match="params.loss_type"):
        G.ggml_opt_init(p, G.ggml_opt_loss_type_mse())
    with pytest.raises(G.GgmlValueError, match="params.opt_period"):
        G.ggml_opt_init(p, opt_period=2)
    p.get_opt_pars = 0.1
    with pytest.raises(G.GgmlTypeError, match="get_opt_pars"):
        G.ggml_opt_init(p)
    with pytest.raises(G.GgmlTypeError, match="loss_type is required"):
        G.ggml_opt_init(sched)


# ---------------------------------------------------------------- AdamW / SGD steps against numpy

def test_adamw_hyper_parameters_change_the_steps_as_numpy_predicts(sched, model, data):
    X, y = data
    p = _params(sched, model)
    p.adamw.alpha, p.adamw.beta1, p.adamw.beta2, p.adamw.eps, p.adamw.wd = 0.05, 0.3, 0.8, 0.5, 0.2
    opt = G.ggml_opt_init(p)
    try:
        seen = [_step(opt, model, X, y, k) for k in range(3)]
    finally:
        opt.free()
    ref = numpy_adamw(X, y, THETA0, 3, 0.05, beta1=0.3, beta2=0.8, eps=0.5, wd=0.2)
    for k, (got, want) in enumerate(zip(seen, ref), 1):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=f"after step {k}")
    # each changed field matters: the same run with ggml's default for it lands elsewhere
    for changed in ({"beta1": 0.9}, {"eps": 1e-8}, {"wd": 0.0}):
        other = numpy_adamw(X, y, THETA0, 3, 0.05, **{"beta1": 0.3, "beta2": 0.8, "eps": 0.5, "wd": 0.2, **changed})
        assert np.abs(other[-1] - seen[-1]).max() > 1e-3, changed


def test_test_opt_parameters_give_sign_steps(sched, model, data):
    """ggml's test-opt sets alpha 1, beta1 = beta2 = eps = wd = 0: each AdamW step is w - sign(g)."""
    X, y = data
    p = _params(sched, model)
    p.adamw.alpha, p.adamw.beta1, p.adamw.beta2, p.adamw.eps, p.adamw.wd = 1.0, 0.0, 0.0, 0.0, 0.0
    opt = G.ggml_opt_init(p)
    try:
        got = _step(opt, model, X, y, 0)
    finally:
        opt.free()
    np.testing.assert_allclose(got, THETA0 - np.sign(_grad(X[:B], y[:B], THETA0)), rtol=0, atol=1e-6)


def test_sgd_alpha_and_wd_through_params(sched, model, data):
    X, y = data
    p = _params(sched, model, G.ggml_opt_optimizer_type_sgd())
    p.sgd.alpha, p.sgd.wd = 0.2, 0.25
    opt = G.ggml_opt_init(p)
    try:
        seen = [_step(opt, model, X, y, 0)]
        p.sgd.alpha = 0.01              # the context reads the params object at every step
        seen.append(_step(opt, model, X, y, 1))
    finally:
        opt.free()
    ref = numpy_sgd(X, y, THETA0, [0.2, 0.01], wd=0.25)
    for got, want in zip(seen, ref):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert np.abs(numpy_sgd(X, y, THETA0, [0.2, 0.2], wd=0.25)[-1] - seen[-1]).max() > 1e-3


def test_get_opt_pars_is_called_before_every_optimizer_step(sched, model, data):
    X, y = data
    p = _params(sched, model, G.ggml_opt_optimizer_type_sgd())
    p.opt_period = 2
    calls, lrs = [], [0.3, 0.05]

    def get_opt_pars(ud):
        calls.append(ud)
        return {"sgd": {"alpha": lrs[len(calls) - 1]}}

    p.get_opt_pars, p.get_opt_pars_ud = get_opt_pars, "my-userdata"
    opt = G.ggml_opt_init(p)
    try:
        for k in range(4):                # 4 batches, accumulation period 2: two optimizer steps
            got = _step(opt, model, X, y, k)
            assert len(calls) == (k + 1) // 2
    finally:
        opt.free()
    assert calls == ["my-userdata"] * 2
    theta = THETA0.copy()
    for step, lr in enumerate(lrs):      # each step: the mean gradient of its two batches (ggml scales by 1/period)
        sl = slice(2 * step * B, 2 * (step + 1) * B)
        theta = theta - lr * _grad(X[sl], y[sl], theta)
    np.testing.assert_allclose(got, theta, rtol=2e-5, atol=2e-6)


def test_a_bad_get_opt_pars_raises_instead_of_aborting(sched, model, data):
    X, y = data
    p = _params(sched, model)
    p.get_opt_pars = lambda ud: {"adamw": {"alpha": -1.0}}
    opt = G.ggml_opt_init(p)
    try:
        with pytest.raises(G.GgmlValueError, match="adamw.alpha"):
            _step(opt, model, X, y, 0)
        np.testing.assert_array_equal(model.weights(), THETA0.astype(np.float32))  # no step was taken
        p.get_opt_pars = None    # read at init: the context keeps its callback
    finally:
        opt.free()
    p.get_opt_pars = lambda ud: 42
    opt = G.ggml_opt_init(p)
    try:
        with pytest.raises(G.GgmlTypeError, match="get_opt_pars"):
            _step(opt, model, X, y, 0)
    finally:
        opt.free()


# ---------------------------------------------------------------- ggml_opt_fit's callback

def _dataset(X, y):
    ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 1, len(X), 1)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), X)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), y)
    return ds


def test_opt_fit_applies_the_learning_rate_returned_for_each_epoch(sched, model, data):
    """One batch per epoch (no shuffle: nbatch_logical == ndata), SGD: epoch e steps with lr(e) exactly."""
    X, y = data
    X, y = X[:B], y[:B]
    ds = _dataset(X, y)
    epochs, lrs = [], {1: 0.2, 2: 0.01, 3: 0.5}

    def get_opt_pars(epoch):
        epochs.append(epoch)
        p = G.ggml_opt_get_default_optimizer_params()
        p.sgd.alpha = lrs[epoch]
        return p

    try:
        G.ggml_opt_fit(sched, model.ctx_compute, model.x, model.out, ds, G.ggml_opt_loss_type_mse(),
                       G.ggml_opt_optimizer_type_sgd(), nepoch=3, nbatch_logical=B, silent=True,
                       get_opt_pars=get_opt_pars)
    finally:
        ds.free()
    assert epochs == [1, 2, 3]
    want = numpy_sgd(X, y, THETA0, [0.2, 0.01, 0.5], batches=slice(0, B))[-1]
    np.testing.assert_allclose(model.weights(), want, rtol=2e-5, atol=2e-6)
    assert np.abs(numpy_sgd(X, y, THETA0, [0.2] * 3, batches=slice(0, B))[-1] - want).max() > 1e-3


def test_opt_fit_takes_constant_params_and_refuses_bad_ones(sched, model, data):
    X, y = data
    X, y = X[:B], y[:B]
    ds = _dataset(X, y)
    p = G.ggml_opt_get_default_optimizer_params()
    p.sgd.alpha = 0.1
    try:
        G.ggml_opt_fit(sched, model.ctx_compute, model.x, model.out, ds, G.ggml_opt_loss_type_mse(),
                       G.ggml_opt_optimizer_type_sgd(), nepoch=2, nbatch_logical=B, silent=True, get_opt_pars=p)
        np.testing.assert_allclose(model.weights(), numpy_sgd(X, y, THETA0, [0.1, 0.1], batches=slice(0, B))[-1],
                                   rtol=2e-5, atol=2e-6)
        with pytest.raises(G.GgmlTypeError, match="get_opt_pars"):
            G.ggml_opt_fit(sched, model.ctx_compute, model.x, model.out, ds, silent=True, nbatch_logical=B,
                           get_opt_pars=0.1)

        def boom(epoch):
            raise RuntimeError("schedule failed")
        with pytest.raises(RuntimeError, match="schedule failed"):
            G.ggml_opt_fit(sched, model.ctx_compute, model.x, model.out, ds, silent=True, nbatch_logical=B,
                           get_opt_pars=boom)
        # everything was released: the scheduler serves a new fit
        G.ggml_opt_fit(sched, model.ctx_compute, model.x, model.out, ds, silent=True, nbatch_logical=B,
                       get_opt_pars=lambda e: {"adamw": {"alpha": 0.01}})
    finally:
        ds.free()
