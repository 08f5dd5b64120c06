"""Training with ag_*: optimizers and schedulers against their published formulas (numpy float64), the layers'
semantics, the data loader, ag_gradcheck, and the promise that a repeated step is one graph compute on the device
with no download (ag_trace), on the CPU and on Vulkan (lavapipe in CI)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ggmlpy as g


def _quadratic_steps(opt_fn, steps=5):
    """Minimise sum(c * w^2) from w0; returns the weights after each step and the gradients seen."""
    c = np.array([1.0, -2.0, 0.5])
    w = g.ag_param([0.3, -0.7, 1.1])
    opt = opt_fn([w])
    path, grads = [], []
    for _ in range(steps):
        with g.with_grad_tape():
            loss = g.ag_sum(g.ag_mul(g.ag_mul(w, w), c))
        g.backward(loss)
        grads.append(2 * c * w.numpy().astype(np.float64))
        opt.step()
        opt.zero_grad()
        path.append(w.numpy().astype(np.float64))
    return np.array(path), np.array(grads)


def test_sgd_with_momentum_follows_ggmlrs_rule(device):
    path, grads = _quadratic_steps(lambda p: g.optimizer_sgd(p, lr=0.1, momentum=0.9))
    w, v = np.array([0.3, -0.7, 1.1]), np.zeros(3)
    for k in range(len(path)):
        v = 0.9 * v + grads[k]
        w = w - 0.1 * v
        np.testing.assert_allclose(path[k], w, rtol=1e-5, atol=1e-6)


def test_adam_follows_the_bias_corrected_formula(device):
    path, grads = _quadratic_steps(lambda p: g.optimizer_adam(p, lr=0.05))
    w, m, v = np.array([0.3, -0.7, 1.1]), np.zeros(3), np.zeros(3)
    for t in range(1, len(path) + 1):
        gr = grads[t - 1]
        m = 0.9 * m + 0.1 * gr
        v = 0.999 * v + 0.001 * gr ** 2
        w = w - 0.05 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        # float32 moments: each step's ratio m/sqrt(v) carries ~1e-6 relative error into a move of lr = 0.05
        np.testing.assert_allclose(path[t - 1], w, rtol=1e-5, atol=1e-5)


def test_clip_grad_norm_scales_all_gradients_together(device):
    a, b = g.ag_param([3.0, 0.0]), g.ag_param([4.0])
    with g.with_grad_tape():
        loss = g.ag_add(g.ag_sum(g.ag_mul(a, a)), g.ag_sum(g.ag_mul(b, b)))   # grads 2a, 2b: norm 10
    g.backward(loss)
    norm = g.clip_grad_norm([a, b], max_norm=1.0)
    np.testing.assert_allclose(norm.item(), 10.0, rtol=1e-6)
    np.testing.assert_allclose(a.grad.numpy(), [6 / (10 + 1e-6), 0], rtol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), [8 / (10 + 1e-6)], rtol=1e-5)
    with g.with_grad_tape():
        small = g.ag_sum(g.ag_scale(a, 0.1))
    a.grad = None
    g.backward(small)
    g.clip_grad_norm([a], max_norm=1.0)          # norm 0.14 < 1: unchanged
    np.testing.assert_allclose(a.grad.numpy(), [0.1, 0.1], rtol=1e-6)


def test_clip_grad_value_clamps_and_reports_the_largest(device):
    w = g.ag_param([1.0, -3.0, 0.2])
    with g.with_grad_tape():
        loss = g.ag_sum(g.ag_mul(w, w))            # grads 2, -6, 0.4
    g.backward(loss)
    largest = g.clip_grad_value([w], clip_value=1.0)
    np.testing.assert_allclose(largest.item(), 6.0, rtol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), [1.0, -1.0, 0.4], rtol=1e-6)


def test_schedulers_follow_their_formulas():
    opt = g.optimizer_sgd([g.ag_param([0.0])], lr=0.1)
    s = g.lr_scheduler_step(opt, step_size=2, gamma=0.5)
    assert [s.step() for _ in range(5)] == pytest.approx([0.1, 0.05, 0.05, 0.025, 0.025])
    opt.lr = 1.0
    s = g.lr_scheduler_cosine(opt, T_max=4, lr_min=0.0)
    expected = [(1 + math.cos(math.pi * min(k - 1, 3) / 4)) / 2 for k in range(1, 7)]
    assert [s.step() for _ in range(6)] == pytest.approx(expected)
    opt.lr = 1.0
    s = g.lr_scheduler_cosine(opt, T_max=2, restart=True, T_mult=2)
    # cycles of 2 then 4 steps: positions 0 1 | 0 1 2 3
    expected = [(1 + math.cos(math.pi * t / T)) / 2 for t, T in ((0, 2), (1, 2), (0, 4), (1, 4), (2, 4), (3, 4))]
    assert [s.step() for _ in range(6)] == pytest.approx(expected)
    s = g.lr_scheduler_cyclic(opt, base_lr=0.1, max_lr=0.5, step_size_up=2, mode="triangular2")
    assert opt.lr == 0.1
    assert [s.step() for _ in range(6)] == pytest.approx([0.3, 0.5, 0.3, 0.1, 0.2, 0.3])
    opt.lr = 1.0
    s = g.lr_scheduler_warmup_cosine(opt, warmup_steps=2, total_steps=4, lr_min=0.0, warmup_start_lr=0.0)
    assert opt.lr == 0.0
    assert [s.step() for _ in range(5)] == pytest.approx([0.5, 1.0, 0.5, 0.0, 0.0])
    with pytest.raises(g.GgmlValueError):
        g.lr_scheduler_warmup_cosine(opt, warmup_steps=4, total_steps=4)


def test_onecycle_moves_rate_and_momentum():
    opt = g.optimizer_sgd([g.ag_param([0.0])], lr=0.1, momentum=0.9)
    s = g.lr_scheduler_onecycle(opt, max_lr=1.0, total_steps=10, pct_start=0.3, anneal_strategy="linear")
    assert opt.lr == pytest.approx(1.0 / 25) and opt.momentum == pytest.approx(0.95)
    lrs = [s.step() for _ in range(10)]
    start = 1.0 / 25
    assert lrs[2] == pytest.approx(1.0) and opt.momentum == pytest.approx(0.95)  # the end: momentum back up
    assert lrs[0] == pytest.approx(start + (1 - start) / 3)
    assert lrs[-1] == pytest.approx(1e-4)


def test_layers_match_numpy_and_switch_modes(device):
    np.random.seed(3)
    x = np.random.randn(6, 4)
    fc = g.ag_linear(4, 3, activation="tanh")
    w, b = fc.W.numpy(), fc.b.numpy()
    np.testing.assert_allclose(fc(g.ag_tensor(x)).numpy(), np.tanh(x @ w.T + b), rtol=1e-5, atol=1e-6)
    assert np.abs(w).max() <= math.sqrt(6 / 7)
    ln = g.ag_layer_norm(4)
    ref = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(ln(g.ag_tensor(x)).numpy(), ref, rtol=1e-4, atol=1e-5)
    bn = g.ag_batch_norm(4, momentum=0.1)
    y = bn(g.ag_tensor(x)).numpy()
    np.testing.assert_allclose(y, (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * x.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.9 + 0.1 * x.var(0), rtol=1e-5)
    g.ag_eval(bn)
    np.testing.assert_allclose(bn(g.ag_tensor(x)).numpy(),
                               (x - 0.1 * x.mean(0)) / np.sqrt(0.9 + 0.1 * x.var(0) + 1e-5), rtol=1e-4, atol=1e-5)
    drop = g.ag_dropout(0.5)
    out = drop(g.ag_tensor(np.ones((200, 50)))).numpy()
    assert set(np.unique(out)) <= {0.0, 2.0} and 0.4 < (out == 0).mean() < 0.6
    g.ag_eval(drop)
    np.testing.assert_array_equal(drop(g.ag_tensor(np.ones((2, 2)))).numpy(), np.ones((2, 2)))
    with pytest.raises(g.GgmlValueError):
        g.ag_dropout(1.0)


def test_embedding_scatter_adds_repeated_ids(device):
    emb = g.ag_embedding(5, 3)
    ids = np.array([[1, 1], [4, 0]])
    table = emb.weight.numpy()
    with g.with_grad_tape():
        out = emb(ids)
        loss = g.ag_sum(out)
    assert out.shape == (2, 2, 3)
    np.testing.assert_allclose(out.numpy(), table[ids], rtol=1e-6)
    grad = g.backward(loss)[emb.weight].numpy()
    np.testing.assert_allclose(grad, np.array([1, 2, 0, 0, 1])[:, None] * np.ones((5, 3)))
    with pytest.raises(g.GgmlValueError, match="ids must be in"):
        emb(np.array([5]))


def test_gradcheck_passes_a_right_gradient_and_fails_a_wrong_one():
    w = g.ag_param(np.random.default_rng(1).standard_normal((2, 3)))
    assert g.ag_gradcheck(lambda p: g.ag_sum(g.ag_tanh(p)), w, quiet=True)
    before = w.numpy()
    # a custom "loss" whose recorded ops do not give its value's gradient: stop_gradient-like use of a constant
    wrong = g.ag_gradcheck(lambda p: g.ag_add(g.ag_sum(p), g.ag_sum(g.ag_tensor(p.numpy() ** 2))), w, quiet=True)
    assert not wrong
    np.testing.assert_array_equal(w.numpy(), before)


def _mlp_step(model, opt, x, y):
    with g.with_grad_tape():
        loss = g.ag_softmax_cross_entropy_loss(model(x), y)
    g.backward(loss)
    opt.step()
    opt.zero_grad()
    return loss


def test_a_repeated_step_is_one_graph_on_the_device(device):
    np.random.seed(0)
    model = g.ag_sequential(g.ag_linear(20, 32, "relu"), g.ag_linear(32, 4))
    opt = g.optimizer_adam(model.parameters(), lr=0.01)
    x = np.random.randn(64, 20).astype(np.float32)
    y = (x[:, :4].argmax(1)).astype(np.int64)
    first = _mlp_step(model, opt, g.ag_tensor(x), y).item()
    for _ in range(3):
        _mlp_step(model, opt, g.ag_tensor(x), y)
    t = g.ag_trace(_mlp_step, model, opt, g.ag_tensor(x), y)
    assert t.computes == 1 and t.graphs_built == 0 and t.downloads == 0
    # the batch, its one-hot targets (the ids become one-hot rows on the host) and at most 256 bytes besides
    # (the optimizer's hyper-parameters: one input for every parameter's update)
    assert t.upload_bytes - x.nbytes - 64 * 4 * 4 <= 256, t
    if device != "cpu":   # on the CPU, OpenBLAS's backend takes the large products: splits there are no copies
        assert t.n_splits == 1 and t.cpu_ops == []
    read = g.ag_trace(lambda: t.result.item())
    assert read.computes == 0 and read.downloads == 1
    for _ in range(30):
        last = _mlp_step(model, opt, g.ag_tensor(x), y).item()
    assert last < 0.5 * first


def test_a_value_kept_across_steps_stays_readable():
    w = g.ag_param([1.0])
    opt = g.optimizer_sgd([w], lr=0.1)
    losses = []
    for _ in range(3):
        with g.with_grad_tape():
            loss = g.ag_sum(g.ag_mul(w, w))
        g.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss)
    np.testing.assert_allclose([v.item() for v in losses], [1.0, 0.64, 0.4096], rtol=1e-6)


def test_the_loader_batches_arrays_and_streams_a_generator():
    x, y = np.arange(20.0).reshape(10, 2), np.arange(10.0)
    dl = g.ag_dataloader(x, y, batch_size=3, shuffle=True)
    assert dl.n_batches() == 3
    seen = [b["y"].numpy() for b in dl.epoch()]
    assert len(seen) == 3 and len(set(np.concatenate(seen))) == 9
    with pytest.raises(g.GgmlStateError):
        dl.next_batch()

    def batches():
        for k in range(4):
            yield x[k * 2:(k + 1) * 2], y[k * 2:(k + 1) * 2]
    stream = g.ag_dataloader(batches, batch_size=2)
    assert stream.n_batches() is None
    assert [b["y"].numpy().tolist() for b in stream.epoch()] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert len(list(stream.epoch())) == 4      # a generator function starts again each epoch


def test_check_grad_anomaly_reports_each_gradient():
    a, b, c = g.ag_param([1.0, 0.0]), g.ag_param([2.0]), g.ag_param([1.0])
    with g.with_grad_tape():
        loss = g.ag_sum(g.ag_log(a)) + g.ag_sum(g.ag_scale(b, 1000.0))   # d/da = 1/a: inf at 0; c unused
    g.backward(loss)
    with pytest.warns(g.GgmlpyWarning, match="p1: inf"):
        table = g.check_grad_anomaly({"p1": a, "p2": b, "p3": c}, max_abs=100.0)
    assert list(table.columns) == ["param", "n_nan", "n_inf", "max_abs", "status"]
    assert table.status.tolist() == ["inf", "large", "missing"]
    assert table.n_inf.tolist() == [1, 0, 0] and table.max_abs.tolist()[:2] == [1.0, 1000.0]
    with pytest.raises(g.GgmlValueError, match="gradient anomalies"):
        g.check_grad_anomaly({"p1": a}, action="stop")
