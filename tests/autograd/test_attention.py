"""ag_flash_attention and ag_multihead_attention against a numpy float64 reference (forward, and the gradient
against central differences of the reference), causal, masked and cross attention, on the CPU and on Vulkan."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.autograd.steps import check_step_stays_on_device
from tests.helpers.gradients import fd_grad


def attention_ref(q, k, v, heads, causal=False, mask=None):
    tq, d = q.shape
    dh, dv = d // heads, v.shape[1] // heads
    out = []
    for h in range(heads):
        s = q[:, h * dh:(h + 1) * dh] @ k[:, h * dh:(h + 1) * dh].T / np.sqrt(dh)
        if causal:
            s = s + np.triu(np.full(s.shape, -np.inf), 1)
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        e = np.exp(s - s.max(1, keepdims=True))
        out.append(e / e.sum(1, keepdims=True) @ v[:, h * dv:(h + 1) * dv])
    return np.concatenate(out, 1)


rng = np.random.default_rng(5)


@pytest.mark.parametrize("causal,masked,tk", [(False, False, 6), (True, False, 6), (False, True, 4)])
def test_flash_attention_forward_and_gradients(device, causal, masked, tk):
    q, k, v = rng.standard_normal((6, 8)), rng.standard_normal((tk, 8)), rng.standard_normal((tk, 8))
    mask = None
    if masked:
        mask = rng.random((6, tk)) > 0.4
        mask[:, 0] = True
    weights = np.cos(np.arange(48)).reshape(6, 8)
    pq, pk, pv = g.ag_param(q), g.ag_param(k), g.ag_param(v)
    with g.with_grad_tape():
        out = g.ag_flash_attention(pq, pk, pv, n_heads=2, mask=mask, causal=causal)
        loss = g.ag_sum(g.ag_mul(out, weights))
    # float32 scores and softmax (lavapipe too): ~1e-6 relative
    np.testing.assert_allclose(out.numpy(), attention_ref(q, k, v, 2, causal, mask), rtol=1e-5, atol=1e-5)
    grads = g.backward(loss)
    for p, which in ((pq, 0), (pk, 1), (pv, 2)):
        args = [q, k, v]

        def f(x, which=which, args=args):
            a = list(args)
            a[which] = x
            return attention_ref(*a, 2, causal, mask)
        np.testing.assert_allclose(grads[p].numpy(), fd_grad(f, args[which], weights, h=1e-6), rtol=1e-4, atol=1e-5)


def test_a_batch_axis_is_attended_sample_by_sample(device):
    q, k, v = (rng.standard_normal((3, 5, 8)) for _ in range(3))
    out = g.ag_flash_attention(g.ag_tensor(q), g.ag_tensor(k), g.ag_tensor(v), 4, causal=True).numpy()
    for b in range(3):
        np.testing.assert_allclose(out[b], attention_ref(q[b], k[b], v[b], 4, True), rtol=1e-5, atol=1e-5)


def test_multihead_attention_projects_the_heads(device):
    np.random.seed(2)
    att = g.ag_eval(g.ag_multihead_attention(8, 2))
    x = rng.standard_normal((5, 8))
    p = {n: t.numpy().astype(np.float64) for n, t in att.parameters().items()}
    expected = attention_ref(x @ p["W_q"].T, x @ p["W_k"].T, x @ p["W_v"].T, 2, causal=True) @ p["W_o"].T + p["b_o"]
    np.testing.assert_allclose(att(g.ag_tensor(x), causal_mask=True).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert list(att.parameters()) == ["W_q", "W_k", "W_v", "W_o", "b_o"]


def test_multihead_attention_with_dropout_trains_through_the_scores(device):
    np.random.seed(4)
    att = g.ag_multihead_attention(8, 2, dropout=0.5)
    x = g.ag_tensor(rng.standard_normal((5, 8)))
    with g.with_grad_tape():
        loss = g.ag_sum(att(x, causal_mask=True))
    grads = g.backward(loss)
    assert np.isfinite(grads[att.W_q].numpy()).all() and np.abs(grads[att.W_o].numpy()).sum() > 0
    g.ag_eval(att)
    a, b = att(x).numpy(), att(x).numpy()
    np.testing.assert_array_equal(a, b)     # no dropout in evaluation


def test_attention_refuses_bad_arguments():
    x = g.ag_tensor(np.ones((4, 6)))
    with pytest.raises(g.GgmlValueError, match="multiples of n_heads"):
        g.ag_flash_attention(x, x, x, 4)
    with pytest.raises(g.GgmlValueError, match="not both"):
        g.ag_flash_attention(x, x, x, 2, mask=np.ones((4, 4), bool), causal=True)
    with pytest.raises(g.GgmlValueError, match="mask must have shape"):
        g.ag_flash_attention(x, x, x, 2, mask=np.ones((3, 4), bool))
    with pytest.raises(g.GgmlValueError, match="multiple of n_heads"):
        g.ag_multihead_attention(6, 4)


def test_a_transformer_block_trains_in_one_split_per_step(device):
    np.random.seed(6)
    vocab, d, t = 12, 16, 10
    emb, pos = g.ag_embedding(vocab, d), g.ag_param(np.random.randn(t, d) * 0.1)
    ln1, att, ln2 = g.ag_layer_norm(d), g.ag_multihead_attention(d, 2), g.ag_layer_norm(d)
    mlp = g.ag_sequential(g.ag_linear(d, 32, "relu"), g.ag_linear(32, d))
    out = g.ag_linear(d, vocab)
    params = {"pos": pos}
    for name, m in (("emb", emb), ("ln1", ln1), ("att", att), ("ln2", ln2), ("mlp", mlp), ("out", out)):
        params.update({f"{name}_{k}": v for k, v in m.parameters().items()})
    opt = g.optimizer_adam(params, lr=0.01)
    seq = np.arange(t + 1) % vocab          # learn to predict the next of a fixed sequence

    def step():
        with g.with_grad_tape():
            h = g.ag_add(emb(seq[:-1]), pos)
            h = g.ag_add(h, att(ln1(h), causal_mask=True))       # residual blocks
            h = g.ag_add(h, mlp(ln2(h)))
            loss = g.ag_softmax_cross_entropy_loss(out(h), seq[1:])
        g.backward(loss)
        g.clip_grad_norm(params, max_norm=5.0)
        opt.step()
        opt.zero_grad()
        return loss
    check_step_stays_on_device(step, device, steps=60, drop=0.2)
