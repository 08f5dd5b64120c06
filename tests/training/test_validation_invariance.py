"""Validation never changes training: a run with a validation generator ends with exactly
(np.array_equal) the weights of the same run without one, also while a gradient-accumulation
window is open at the end of an epoch, and with prefetching."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.training_refs import adamw_step, Linear, linear_forward, linear_grads, loss_and_dout, sgd_step


ADAMW, SGD = G.ggml_opt_optimizer_type_adamw(), G.ggml_opt_optimizer_type_sgd()
LOSSES = {"mse": G.ggml_opt_loss_type_mse(), "mae": G.ggml_opt_loss_type_mae(),
          "cross_entropy": G.ggml_opt_loss_type_cross_entropy()}
K, M, N = 3, 3, 4
STEPS, EPOCHS = 4, 3  # 12 physical batches; with period 3 the window is open at the ends of epochs 1 and 2


def _stream(seed: int, kind: str):
    """An endless callable: the same batches for the same seed."""
    rng = np.random.default_rng(seed)

    def gen():
        x = rng.normal(0, 1, (N, K)).astype(np.float32)
        y = np.eye(M, dtype=np.float32)[rng.integers(0, M, N)] if kind == "cross_entropy" \
            else rng.normal(0, 1, (N, M)).astype(np.float32)
        return x, y
    return gen


def _val_batches(kind: str):
    return [_stream(99 + i, kind)() for i in range(2)]


def _run(cpu, sched, optimizer, kind, period, prefetch, validation, callbacks=(), m=None):
    m = m or Linear(cpu, K, M, N, seed=5)
    lr = {"adamw_lr": 0.01} if optimizer == ADAMW else {"sgd_lr": 0.1}
    cbs = [{"on_epoch_begin": lambda e, logs, s: G.ggml_opt_set_lr(s.lr_ud, **lr)}, *callbacks]
    try:
        h = G.ggml_fit_opt_gen(sched, m.net.ctx, m.x, m.out, _stream(1, kind), steps_per_epoch=STEPS,
                               epochs=EPOCHS, validation_generator=_val_batches(kind) if validation else None,
                               loss_type=LOSSES[kind], optimizer=optimizer, nbatch_logical=period * N,
                               callbacks=cbs, silent=True, prefetch=prefetch)
        return m.params(), h, m
    except BaseException:
        m.free()
        raise


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("period", [1, 3])
@pytest.mark.parametrize("optimizer", [ADAMW, SGD], ids=["adamw", "sgd"])
def test_same_weights_with_and_without_validation(optimizer, period, prefetch, cpu, tsched):
    p_plain, h_plain, m1 = _run(cpu, tsched, optimizer, "mse", period, prefetch, False)
    p_val, h_val, m2 = _run(cpu, tsched, optimizer, "mse", period, prefetch, True)
    m1.free()
    m2.free()
    for k in p_plain:
        assert np.array_equal(p_plain[k], p_val[k]), k
    assert np.array_equal(h_plain["train_loss"].to_numpy(), h_val["train_loss"].to_numpy())
    assert h_plain["val_loss"].isna().all() and h_val["val_loss"].notna().all()
    assert list(h_val["steps"]) == [STEPS] * EPOCHS


@pytest.mark.parametrize("kind", ["mae", "cross_entropy"])
def test_same_weights_for_composite_and_ce_losses(kind, cpu, tsched):
    p_plain, h_plain, m1 = _run(cpu, tsched, ADAMW, kind, 3, 0, False)
    p_val, h_val, m2 = _run(cpu, tsched, ADAMW, kind, 3, 2, True)
    m1.free()
    m2.free()
    for k in p_plain:
        assert np.array_equal(p_plain[k], p_val[k]), k
    if kind == "cross_entropy":
        assert h_val["val_accuracy"].between(0, 1).all() and h_val["train_accuracy"].between(0, 1).all()


@pytest.mark.parametrize("optimizer", [ADAMW, SGD], ids=["adamw", "sgd"])
def test_accumulation_across_epochs_and_val_loss_match_numpy(optimizer, cpu, tsched):
    """Period 3 over 4-batch epochs: optimizer steps after physical batches 3, 6, 9, 12, wherever the
    epoch boundaries fall; val_loss is computed with the weights at the end of each epoch."""
    snapshots = []
    m = Linear(cpu, K, M, N, seed=5)

    def on_epoch_end(epoch, logs, state):
        snapshots.append((m.params(), logs["val_loss"]))

    p, h, _ = _run(cpu, tsched, optimizer, "mse", 3, 0, True, [{"on_epoch_end": on_epoch_end}], m=m)
    try:
        gen = _stream(1, "mse")
        stream = [gen() for _ in range(STEPS * EPOCHS)]
        ref = {"W": m.W0.astype(np.float64), "b": m.b0.astype(np.float64)}
        lr = 0.01 if optimizer == ADAMW else 0.1
        state: dict = {}
        acc = None
        val = _val_batches("mse")
        for i, (x, y) in enumerate(stream):
            x, y = x.astype(np.float64), y.astype(np.float64)
            _, dout = loss_and_dout("mse", linear_forward(ref, x), y)
            g = linear_grads(ref, x, dout / 3)
            acc = g if acc is None else {k: acc[k] + g[k] for k in g}
            if (i + 1) % 3 == 0:
                adamw_step(ref, acc, state, lr) if optimizer == ADAMW else sgd_step(ref, acc, lr)
                acc = None
            if (i + 1) % STEPS == 0:
                weights, val_loss = snapshots[(i + 1) // STEPS - 1]
                for k in ref:
                    np.testing.assert_allclose(weights[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=f"{k} at {i}")
                expected = np.mean([loss_and_dout("mse", linear_forward(ref, vx.astype(np.float64)),
                                                  vy.astype(np.float64))[0] for vx, vy in val])
                assert val_loss == pytest.approx(expected, rel=1e-5)
        for k in ref:
            np.testing.assert_allclose(p[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)
    finally:
        m.free()
