"""ag_conv2d and the pooling ops against numpy float64 (forward, and gradients against central differences of the
reference), on the CPU and on Vulkan; a small CNN written with ag_* trains there in one split per step."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.autograd.steps import check_step_stays_on_device
from tests.helpers.gradients import fd_grad


def conv_ref(x, w, s, p):
    x = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    _, _, h, wd = x.shape
    _, _, kh, kw = w.shape
    oh, ow = (h - kh) // s + 1, (wd - kw) // s + 1
    y = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for i in range(oh):
        for j in range(ow):
            y[:, :, i, j] = np.einsum("nchw,ochw->no", x[:, :, i * s:i * s + kh, j * s:j * s + kw], w)
    return y


def pool_ref(x, k, avg=False):
    n, c, h, w = x.shape
    blocks = x[:, :, :h // k * k, :w // k * k].reshape(n, c, h // k, k, w // k, k)
    return blocks.mean((3, 5)) if avg else blocks.max((3, 5))


rng = np.random.default_rng(11)


@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1)])
def test_conv2d_forward_and_gradients(device, stride, padding):
    x, w, b = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    px, pw, pb = g.ag_param(x), g.ag_param(w), g.ag_param(b)
    with g.with_grad_tape():
        y = g.ag_conv2d(px, pw, pb, stride=stride, padding=padding)
        weights = np.cos(np.arange(y.size)).reshape(y.shape)
        loss = g.ag_sum(g.ag_mul(y, weights))
    expected = conv_ref(x, w, stride, padding) + b[:, None, None]
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5)   # F32 im2col and product
    grads = g.backward(loss)
    np.testing.assert_allclose(grads[px].numpy(), fd_grad(lambda v: conv_ref(v, w, stride, padding), x, weights,
                                                          h=1e-6), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads[pw].numpy(), fd_grad(lambda v: conv_ref(x, v, stride, padding), w, weights,
                                                          h=1e-6), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads[pb].numpy(), weights.sum((0, 2, 3)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("avg", [False, True])
def test_pooling_forward_and_gradients(device, avg):
    x = rng.permutation(2 * 2 * 6 * 6).reshape(2, 2, 6, 6) / 10.0    # distinct values: no ties in a window
    px = g.ag_param(x)
    op = g.ag_avg_pool2d if avg else g.ag_max_pool2d
    with g.with_grad_tape():
        y = op(px, 2)
        weights = np.cos(np.arange(y.size)).reshape(y.shape)
        loss = g.ag_sum(g.ag_mul(y, weights))
    np.testing.assert_allclose(y.numpy(), pool_ref(x, 2, avg), rtol=1e-6)
    numeric = fd_grad(lambda v: pool_ref(v, 2, avg), x, weights, h=1e-3)   # max: the step stays away from ties
    np.testing.assert_allclose(g.backward(loss)[px].numpy(), numeric, rtol=1e-5, atol=1e-6)


def test_conv_refuses_bad_shapes():
    x = g.ag_tensor(np.ones((1, 3, 5, 5)))
    with pytest.raises(g.GgmlValueError, match="C_in"):
        g.ag_conv2d(x, g.ag_tensor(np.ones((2, 2, 3, 3))))
    with pytest.raises(g.GgmlValueError, match="output height"):
        g.ag_conv2d(x, g.ag_tensor(np.ones((2, 3, 7, 1))))


def test_a_small_cnn_trains_in_one_split_per_step(device):
    np.random.seed(1)
    k1 = g.ag_param(np.random.randn(4, 1, 3, 3) * 0.4)
    k2 = g.ag_param(np.random.randn(8, 4, 3, 3) * 0.2)
    head = g.ag_linear(8 * 2 * 2, 3)
    params = {"k1": k1, "k2": k2, **head.parameters()}
    opt = g.optimizer_adam(params, lr=0.02)
    x = rng.standard_normal((16, 1, 8, 8)).astype(np.float32)
    y = (x[:, 0, :4].mean((1, 2)) > 0).astype(np.int64) + (x[:, 0, 4:].mean((1, 2)) > 0)

    def step():
        with g.with_grad_tape():
            h = g.ag_max_pool2d(g.ag_relu(g.ag_conv2d(g.ag_tensor(x), k1, padding=1)), 2)
            h = g.ag_max_pool2d(g.ag_relu(g.ag_conv2d(h, k2, padding=1)), 2)
            loss = g.ag_softmax_cross_entropy_loss(head(g.ag_reshape(h, (16, -1))), y)
        g.backward(loss)
        opt.step()
        opt.zero_grad()
        return loss
    check_step_stays_on_device(step, device, steps=40, drop=0.7)
