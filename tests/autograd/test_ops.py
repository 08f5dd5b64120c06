"""The ag_* ops and losses: every forward against numpy float64, every gradient against central differences of the
numpy float64 reference (independent of ggml), on the CPU and on Vulkan (lavapipe in CI)."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers.devices import require_gpu
from tests.helpers.gradients import fd_grad


DEVICES = ["cpu", "Vulkan0", "CUDA0"]


def _device(name: str) -> str:
    if name != "cpu":
        require_gpu(name)
    return name


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


rng = np.random.default_rng(7)
A = rng.standard_normal((4, 5))
B = rng.standard_normal((5, 3))
P = rng.uniform(0.2, 2.0, (4, 5))          # positive: log, pow
ROW = rng.standard_normal(5)
COL = rng.standard_normal((4, 1))
T = rng.standard_normal((4, 5))

# name -> (the ag function of one parameter, the numpy function of the same, the parameter's value)
CASES = {
    "add_row": (lambda p: g.ag_add(p, ROW), lambda a: a + ROW, A),
    "add_param_broadcast": (lambda p: g.ag_add(g.ag_tensor(T), p), lambda r: T + r, ROW),
    "sub_col": (lambda p: g.ag_sub(p, COL), lambda a: a - COL, A),
    "sub_broadcast_param": (lambda p: g.ag_sub(g.ag_tensor(T), p), lambda c: T - c, COL),
    "rsub_number": (lambda p: 2.0 - p, lambda a: 2.0 - a, A),
    "mul_same": (lambda p: g.ag_mul(p, T), lambda a: a * T, A),
    "mul_broadcast_param": (lambda p: g.ag_mul(g.ag_tensor(T), p), lambda r: T * r, ROW),
    "div_tensor": (lambda p: g.ag_tensor(T) / p, lambda a: T / a, P),
    "matmul_left": (lambda p: g.ag_matmul(p, B), lambda a: a @ B, A),
    "matmul_right": (lambda p: g.ag_matmul(g.ag_tensor(A), p), lambda b: A @ b, B),
    "matmul_transposed": (lambda p: g.ag_matmul(g.ag_tensor(A), p.T), lambda w: A @ w.T, B.T.copy()),
    "matmul_vector": (lambda p: g.ag_matmul(p, ROW), lambda a: a @ ROW, A),
    "scale": (lambda p: g.ag_scale(p, -1.5), lambda a: -1.5 * a, A),
    "relu": (lambda p: g.ag_relu(p), lambda a: np.maximum(a, 0), A),
    "sigmoid": (lambda p: g.ag_sigmoid(p), lambda a: 1 / (1 + np.exp(-a)), A),
    "tanh": (lambda p: g.ag_tanh(p), np.tanh, A),
    "exp": (lambda p: g.ag_exp(p), np.exp, A),
    "log": (lambda p: g.ag_log(p), np.log, P),
    "softmax": (lambda p: g.ag_softmax(p), _softmax, A),
    "sum_all": (lambda p: g.ag_sum(p), lambda a: a.sum(), A),
    "sum_dim0": (lambda p: g.ag_sum(p, dim=0), lambda a: a.sum(0), A),
    "sum_dim1_keep": (lambda p: g.ag_sum(p, dim=1, keepdim=True), lambda a: a.sum(1, keepdims=True), A),
    "mean_all": (lambda p: g.ag_mean(p), lambda a: a.mean(), A),
    "mean_dim0": (lambda p: g.ag_mean(p, dim=0), lambda a: a.mean(0), A),
    "mean_dim1_3d": (lambda p: g.ag_mean(p, dim=1), lambda a: a.mean(1), A.reshape(2, 2, 5)),
    "reshape": (lambda p: g.ag_reshape(p, (5, -1)), lambda a: a.reshape(5, -1), A),
    "transpose": (lambda p: g.ag_transpose(p), lambda a: a.T, A),
    "transpose_3d": (lambda p: g.ag_transpose(p, 0, 2), lambda a: a.transpose(2, 1, 0), A.reshape(2, 2, 5)),
    "pow_2": (lambda p: g.ag_pow(p, 2), lambda a: a ** 2, A),
    "pow_3": (lambda p: p ** 3, lambda a: a ** 3, A),
    "pow_half": (lambda p: g.ag_pow(p, 0.5), np.sqrt, P),
    "pow_minus2": (lambda p: g.ag_pow(p, -2), lambda a: a ** -2.0, P),
    "pow_1_5": (lambda p: g.ag_pow(p, 1.5), lambda a: a ** 1.5, P),
    "clamp": (lambda p: g.ag_clamp(p, -0.5, 0.7), lambda a: np.clip(a, -0.5, 0.7), A),
    "neg": (lambda p: -p, lambda a: -a, A),
    "mse": (lambda p: g.ag_mse_loss(p, T), lambda a: ((a - T) ** 2).mean(), A),
    "cross_entropy": (lambda p: g.ag_cross_entropy_loss(g.ag_softmax(p), np.eye(5)[[0, 2, 4, 1]]),
                      lambda a: -(np.log(np.clip(_softmax(a), 1e-7, 1 - 1e-7)) * np.eye(5)[[0, 2, 4, 1]]).sum() / 4, A),
    "softmax_ce_onehot": (lambda p: g.ag_softmax_cross_entropy_loss(p, np.eye(5)[[0, 2, 4, 1]]),
                          lambda a: -(np.log(_softmax(a)) * np.eye(5)[[0, 2, 4, 1]]).sum() / 4, A),
    "softmax_ce_ids": (lambda p: g.ag_softmax_cross_entropy_loss(p, np.array([3, 0, 0, 4])),
                       lambda a: -np.log(_softmax(a)[np.arange(4), [3, 0, 0, 4]]).sum() / 4, A),
}
# the clamp's and relu's kinks: finite differences there are meaningless, so the points are kept away from them
assert np.abs(A).min() > 1e-3 and np.abs(A + 0.5).min() > 1e-3 and np.abs(A - 0.7).min() > 1e-3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_gradient_against_numpy(case, device):
    dev = _device(device)
    before = g.ag_device(dev)
    try:
        ag_fn, np_fn, value = CASES[case]
        p = g.ag_param(value)
        with g.with_grad_tape():
            out = ag_fn(p)
            loss = g.ag_sum(g.ag_mul(out, np.cos(np.arange(out.size)).reshape(out.shape))) if out.shape else out
        expected = np_fn(value.astype(np.float64))
        assert out.shape == np.shape(expected)
        # float32 on the device: ~1e-6 relative per op; lavapipe's exp/log are float32 too
        np.testing.assert_allclose(out.numpy(), expected, rtol=2e-5, atol=2e-5)
        weights = np.cos(np.arange(np.size(expected))).reshape(np.shape(expected))
        numeric = fd_grad(np_fn, value, weights, h=1e-6)
        grads = g.backward(loss)
        np.testing.assert_allclose(grads[p].numpy(), numeric, rtol=2e-4, atol=2e-5)
        assert p.grad is grads[p]
    finally:
        g.ag_device(before)


def test_clamp_gradient_is_zero_outside_and_on_the_bounds():
    p = g.ag_param([-2.0, -1.0, 0.0, 1.0, 2.0])
    with g.with_grad_tape():
        loss = g.ag_sum(g.ag_clamp(p, -1.0, 1.0))
    np.testing.assert_array_equal(g.backward(loss)[p].numpy(), [0, 0, 1, 0, 0])


def test_pow_of_a_negative_base():
    x = g.ag_tensor([-2.0, 3.0])
    np.testing.assert_allclose(g.ag_pow(x, 2).numpy(), [4, 9])
    np.testing.assert_allclose(g.ag_pow(x, 3).numpy(), [-8, 27])
    assert np.isnan(g.ag_pow(x, 1.5).numpy()[0])


def test_fan_out_sums_and_grad_accumulates_until_zero_grad():
    w = g.ag_param([1.0, 2.0])
    for k in range(2):
        with g.with_grad_tape():
            loss = g.ag_sum(g.ag_add(g.ag_mul(w, w), w))   # d/dw = 2w + 1
        g.backward(loss)
        np.testing.assert_allclose(w.grad.numpy(), (k + 1) * np.array([3.0, 5.0]))
    opt = g.optimizer_sgd([w], lr=0.0)
    opt.zero_grad()
    assert w.grad is None and g.ag_grad(w) is None


def test_an_earlier_tapes_value_is_a_constant():
    w = g.ag_param([2.0])
    with g.with_grad_tape():
        h = g.ag_mul(w, w)                          # 4, from the first tape
    with g.with_grad_tape() as tape:
        loss = g.ag_sum(g.ag_mul(h, w))             # h is a constant here: d/dw = h = 4
    assert len(tape) == 2
    np.testing.assert_allclose(g.backward(loss)[w].numpy(), [4.0])


def test_outside_a_tape_nothing_is_recorded():
    w = g.ag_param([1.0])
    y = g.ag_mul(w, 3.0)
    assert not y.requires_grad
    with pytest.raises(g.GgmlStateError, match="not recorded on a tape"):
        g.backward(g.ag_sum(y))


def test_backward_refuses_a_vector_and_an_older_tapes_loss():
    w = g.ag_param([1.0, 2.0])
    with g.with_grad_tape():
        v = g.ag_mul(w, w)
        old = g.ag_sum(v)
    with pytest.raises(g.GgmlValueError, match="scalar"):
        g.backward(v)
    with g.with_grad_tape():
        g.ag_sum(w)
    with pytest.raises(g.GgmlStateError, match="earlier tape"):
        g.backward(old)


def test_tapes_do_not_nest():
    with g.with_grad_tape():
        with pytest.raises(g.GgmlStateError, match="do not nest"):
            with g.with_grad_tape():
                pass


def test_bad_shapes_and_types_raise_clear_errors():
    a = g.ag_tensor(np.ones((3, 4)))
    with pytest.raises(g.GgmlValueError, match="does not broadcast"):
        g.ag_add(a, np.ones(3))
    with pytest.raises(g.GgmlValueError, match="last axis"):
        g.ag_matmul(a, np.ones((3, 2)))
    with pytest.raises(g.GgmlValueError, match="elements"):
        g.ag_reshape(a, (5, 2))
    with pytest.raises(g.GgmlTypeError, match="integer"):
        g.ag_relu(g.ag_tensor([1, 2, 3]))
    with pytest.raises(g.GgmlValueError, match="class ids"):
        g.ag_softmax_cross_entropy_loss(a, np.array([0, 1, 7]))
    with pytest.raises(g.GgmlValueError, match="no device"):
        g.ag_tensor([1.0], device="Metal9")


def test_integer_data_stays_integer_and_cannot_be_a_parameter():
    ids = g.ag_tensor(np.array([1, 2, 3]))
    assert ids.dtype == "i32" and ids.numpy().dtype == np.int32
    with pytest.raises(g.GgmlTypeError):
        g.ag_param(np.array([1, 2, 3]))


def test_data_assignment_keeps_the_shape_and_refuses_a_stale_value():
    w = g.ag_param(np.ones(3))
    y = g.ag_scale(w, 2.0)
    w.data = np.full(3, 5.0)
    with pytest.raises(g.GgmlStateError, match="changed"):
        y.numpy()
    np.testing.assert_allclose(g.ag_scale(w, 2.0).numpy(), [10, 10, 10])
    with pytest.raises(g.GgmlValueError, match="shape"):
        w.data = np.ones(4)
