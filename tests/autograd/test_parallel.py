"""dp_train: replicas that average their gradients take exactly the steps one model takes on the mean of their
losses (checked against that model trained by hand, float32 on both sides); replicas on two devices agree with
replicas on one; the arguments are checked."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.autograd import builders
from tests.helpers.devices import require_gpu


rng = np.random.default_rng(4)
X = rng.standard_normal((12, 4)).astype(np.float32)
Y = rng.integers(0, 3, 12)
SAMPLES = [(X[i:i + 2], Y[i:i + 2]) for i in range(0, 12, 2)]   # six samples of two rows


def _run(devices, n_iter=5, max_norm=np.inf):
    np.random.seed(0)
    return g.dp_train(builders.dense_pair, SAMPLES, loss_fn=g.ag_softmax_cross_entropy_loss,
                      forward_fn=lambda m, s: m(g.ag_tensor(s[0])), target_fn=lambda s: s[1], n_iter=n_iter,
                      lr=0.05, max_norm=max_norm, verbose=False, devices=devices)


@pytest.mark.parametrize("max_norm", [np.inf, 0.5])
def test_replicas_step_as_one_model_on_the_mean_loss(max_norm):
    result = _run(["cpu", "cpu"], max_norm=max_norm)
    np.random.seed(0)
    model = builders.dense_pair()           # the same initial weights: replica 0's
    opt = g.optimizer_adam(model.parameters(), lr=0.05)
    losses = []
    for it in range(5):
        a, b = SAMPLES[(2 * it) % 6], SAMPLES[(2 * it + 1) % 6]
        with g.with_grad_tape():
            la = g.ag_softmax_cross_entropy_loss(model(g.ag_tensor(a[0])), a[1])
            lb = g.ag_softmax_cross_entropy_loss(model(g.ag_tensor(b[0])), b[1])
            loss = g.ag_scale(la + lb, 0.5)
        g.backward(loss)
        if np.isfinite(max_norm):
            g.clip_grad_norm(model.parameters(), max_norm=max_norm)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    np.testing.assert_allclose(result["loss_history"], losses, rtol=1e-5)
    for (name, p), q in zip(result["params"].items(), model.parameters().values()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    assert result["loss"] == result["loss_history"][-1] and result["model"].parameters()


def test_replicas_on_two_devices_agree_with_replicas_on_one():
    require_gpu("Vulkan0")
    one, two = _run(["cpu", "cpu"]), _run(["cpu", "Vulkan0"])
    np.testing.assert_allclose(two["loss_history"], one["loss_history"], rtol=1e-5)
    for p, q in zip(two["params"].values(), one["params"].values()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6)


def test_dp_train_checks_its_arguments():
    with pytest.raises(g.GgmlValueError, match="non-empty"):
        g.dp_train(builders.dense_pair, [], verbose=False)
    with pytest.raises(g.GgmlValueError, match="devices"):
        g.dp_train(builders.dense_pair, SAMPLES, devices="cpu", verbose=False)
    with pytest.raises(g.GgmlTypeError, match="parameters"):
        g.dp_train(lambda: object(), SAMPLES, devices=["cpu"], verbose=False)
