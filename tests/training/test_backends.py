"""The same training run on every available backend gives the CPU's per-epoch losses.

Backends absent from this build or machine are skipped, saying so. In CI the Vulkan backend
runs on Mesa's lavapipe (GGML_VK_VISIBLE_DEVICES=0).
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g


FAMILIES = {"vulkan": "Vulkan0", "cuda": "CUDA0"}


def _gpu_device(family: str) -> str:
    name = FAMILIES[family]
    if family not in g.ggml_backends_built():
        pytest.skip(f"the {family} backend is not built in this installation (GGMLPY_BACKENDS)")
    if g.ggml_backend_dev_by_name(name) is None:
        pytest.skip(f"the {family} backend is built but this machine has no {name} device"
                    + (" (set GGML_VK_VISIBLE_DEVICES=0 to use lavapipe)" if family == "vulkan" else ""))
    return name


def _mlp(ctx, batch):
    x = g.ggml_set_input(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 16, batch))
    w1 = g.ggml_set_param(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 16, 32))
    b1 = g.ggml_set_param(g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_F32, 32))
    w2 = g.ggml_set_param(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 32, 4))
    b2 = g.ggml_set_param(g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_F32, 4))
    h = g.ggml_relu(ctx, g.ggml_add(ctx, g.ggml_mul_mat(ctx, w1, x), b1))
    return x, g.ggml_add(ctx, g.ggml_mul_mat(ctx, w2, h), b2), [w1, b1, w2, b2]


def _cnn(ctx, batch):
    x = g.ggml_set_input(g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 8, 8, 1, batch))
    k = g.ggml_set_param(g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 3, 3, 1, 4))
    kb = g.ggml_set_param(g.ggml_new_tensor_3d(ctx, g.GGML_TYPE_F32, 1, 1, 4))
    w = g.ggml_set_param(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 4 * 4 * 4, 4))
    conv = g.ggml_relu(ctx, g.ggml_add(ctx, g.ggml_conv_2d(ctx, k, x, 1, 1, 1, 1, 1, 1), kb))   # [8, 8, 4, N]
    pooled = g.ggml_pool_2d(ctx, conv, g.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0)                    # [4, 4, 4, N]
    flat = g.ggml_reshape_2d(ctx, g.ggml_cont(ctx, pooled), 4 * 4 * 4, batch)
    return x, g.ggml_mul_mat(ctx, w, flat), [k, kb, w]


def _train(device: str | None, build, batch=16, epochs=3, n_batches=6, seed=0):
    backend = g.ggml_backend_init_by_name(device) if device else g.ggml_backend_cpu_init()
    sched = g.ggml_backend_sched_new([backend], parallel=False)
    ctx = g.ggml_init(32 << 20, no_alloc=True)
    x, out, params = build(ctx, batch)
    g.ggml_backend_alloc_ctx_tensors(ctx, backend)
    rng = np.random.default_rng(seed)
    for p in params:
        g.ggml_backend_tensor_set_data(p, rng.normal(scale=0.3, size=p.nelements()))
    n_in = x.nelements()
    xs = rng.normal(size=(n_batches, n_in)).astype(np.float32)
    ys = np.eye(4, dtype=np.float32)[rng.integers(0, 4, size=(n_batches, batch))]
    batches = [(xs[i], ys[i]) for i in range(n_batches)]
    try:
        history = g.ggml_fit_opt_gen(sched, ctx, x, out, batches, epochs=epochs, validation_generator=batches,
                                     loss_type=g.ggml_opt_loss_type_cross_entropy(), silent=True,
                                     callbacks=[{"on_epoch_begin":
                                                 lambda e, logs, s: g.ggml_opt_set_lr(s.lr_ud, adamw_lr=0.01)}])
        weights = [g.ggml_backend_tensor_get_data(p) for p in params]
    finally:
        sched.free()
        ctx.free()
        backend.free()
    return history, weights


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("model", ["mlp", "cnn"])
# ggml_conv_2d's float16 im2col gives the kernel gradient's OUT_PROD an F16 operand, which Vulkan leaves to
# the CPU (the model layer's convolutions use a float32 im2col): the fit's warning says so, rightly
@pytest.mark.filterwarnings("ignore:a training step on .* computes OUT_PROD on the CPU")
def test_gpu_losses_match_cpu(family, model):
    device = _gpu_device(family)
    build = _mlp if model == "mlp" else _cnn
    cpu_hist, cpu_w = _train(None, build)
    gpu_hist, gpu_w = _train(device, build)
    for column in ("train_loss", "val_loss", "train_accuracy"):
        np.testing.assert_allclose(gpu_hist[column], cpu_hist[column], rtol=2e-3, err_msg=f"{model} {column}")
    assert cpu_hist["train_loss"].iloc[-1] < cpu_hist["train_loss"].iloc[0]
    # AdamW normalises each step, so weights with near-zero gradients may drift apart a little.
    for a, b in zip(gpu_w, cpu_w):
        np.testing.assert_allclose(a, b, atol=2e-2)


def test_cpu_only_build_reports_missing_backends_clearly():
    for family, name in FAMILIES.items():
        if g.ggml_backend_dev_by_name(name) is None:
            with pytest.raises(g.BackendUnavailableError, match=family.upper() if family == "cuda" else "Vulkan"):
                g.ggml_backend_init_by_name(name)
