"""ggml_compile(precision="bf16"/"f16"): F32 master weights, products in the half type inside the training graph.

What is checked, against F32 training of the same model from the same weights (an independent path: F32 products
throughout) and against formulas:
* 200 steps of MNIST-FC (784-500-10) and the small CNN end within 2 % of the F32 run's loss, on each device: the
  loss the fit reports for them (their mean). The loss of one late step is no measure: it swings between any two
  runs whose roundings differ, F32 ones included, as ReLU and max-pool switches flip (the CNN here: F32 from weights
  perturbed by 1e-6 ends 3 % away after 200 steps, its 200 steps' mean 0.07 %);
* one step's gradients (plain SGD at learning rate 1: the weights move by minus the gradient) match F32's to the
  type's precision: within 4 units of its rounding (2^-8 for BF16, 2^-11 for F16) relative to the gradient's norm
  (measured: 0.1-1.3 units on the CPU and lavapipe). The models are MNIST-FC and the CNN with smooth switches (tanh,
  average pooling): a ReLU whose input is within rounding of 0 passes all or nothing, which moves a gradient by
  whole terms (1-6 % in norm for these models in either type), not by the type's precision;
* F16's dynamic loss scaling: gradients too small for F16 train the first layer only because of it (with a scale
  of 1 they flush to zero: the test of the mechanism can fail), a step that overflows is skipped (weights unchanged)
  and halves the scale, the schedule is GradScaler's;
* the setting is validated, saved with the model, used by predictions, and a model stays one split on Vulkan.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
import ggmlpy.models.engine.runtime as runtime_module
from ggmlpy.opt.loss_scale import DynamicLossScale


UNIT = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}


def _classes(n: int, shape: tuple[int, ...], noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A 10-class task of ``shape`` samples: one random prototype per class plus Gaussian ``noise`` (harder with
    more: sized so that 200 steps land between chance and perfect)."""
    rng = np.random.default_rng(seed)
    protos = rng.random((10,) + shape, dtype=np.float32)
    y = rng.integers(0, 10, n)
    return (protos[y] + noise * rng.standard_normal((n,) + shape).astype(np.float32)).astype(np.float32), \
        y.astype(np.int32)


def _mnist_fc(activation: str = "relu"):
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 500, activation=activation, input_shape=(784,), name="first")
    return g.ggml_layer_dense(m, 10, activation="softmax"), (784,)


def _cnn(activation: str = "relu"):
    pool = g.ggml_layer_max_pooling_2d if activation == "relu" else g.ggml_layer_average_pooling_2d
    m = g.ggml_model_sequential()
    m = g.ggml_layer_conv_2d(m, 8, (3, 3), activation=activation, padding="same", input_shape=(28, 28, 1))
    m = pool(m, (2, 2))
    m = g.ggml_layer_conv_2d(m, 16, (3, 3), activation=activation, padding="same")
    m = pool(m, (2, 2))
    m = g.ggml_layer_flatten(m)
    return g.ggml_layer_dense(m, 10, activation="softmax"), (28, 28, 1)


def _smooth_mnist_fc():
    return _mnist_fc("tanh")


def _smooth_cnn():
    return _cnn("tanh")


def _trained(make, precision: str, device: str, x, y, batch: int, steps: int, optimizer="adam", lr=1e-3,
             loss_weights=None):
    np.random.seed(7)
    model, _ = make()
    model = g.ggml_compile(model, optimizer=optimizer, loss="sparse_categorical_crossentropy", backend=device,
                           learning_rate=lr, precision=precision, loss_weights=loss_weights)
    before = g.ggml_get_weights(model)
    hist = g.ggml_fit(model, x[:batch * steps], y[:batch * steps], epochs=1, batch_size=batch, shuffle=False,
                      verbose=0)
    return model, before, hist


_F32_LOSS: dict[tuple[str, str], float] = {}   # (model, device) -> the F32 run's loss, shared by both half types


@pytest.mark.parametrize("precision", ["bf16", "f16"])
@pytest.mark.parametrize("make, batch, noise, lr", [(_mnist_fc, 50, 3.5, 1e-3), (_cnn, 16, 0.6, 3e-3)],
                         ids=["mnist-fc", "cnn"])
def test_200_steps_end_within_2_percent_of_f32(each_device, make, batch, noise, lr, precision):
    x, y = _classes(200 * batch, make()[1], noise)

    def loss(p: str) -> float:
        model, _, hist = _trained(make, p, each_device, x, y, batch, 200, lr=lr)
        assert g.ggml_evaluate(model, x[:1000], y[:1000])["loss"] < 0.5 * np.log(10)   # it learned (chance: ln 10)
        return float(hist["train_loss"].iloc[-1])
    key = (make.__name__, each_device)
    if key not in _F32_LOSS:
        _F32_LOSS[key] = loss("f32")
    want, got = _F32_LOSS[key], loss(precision)
    assert abs(got - want) <= 0.02 * want, (got, want)


@pytest.mark.parametrize("precision", ["bf16", "f16"])
@pytest.mark.parametrize("make, batch", [(_smooth_mnist_fc, 64), (_smooth_cnn, 16)], ids=["mnist-fc", "cnn"])
def test_gradients_match_f32_to_the_types_precision(each_device, make, batch, precision):
    x, y = _classes(batch, make()[1], 0.5, seed=3)
    grads = {}
    for p in ("f32", precision):
        model, before, _ = _trained(make, p, each_device, x, y, batch, 1, optimizer="sgd", lr=1.0)
        after = g.ggml_get_weights(model)
        grads[p] = {k: before[k].astype(np.float64) - after[k] for k in before}
    for name, want in grads["f32"].items():
        got = grads[precision][name]
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err <= 4 * UNIT[precision], f"{name}: relative error {err:.2e}"
        if name.endswith(("weight", "kernel")) and each_device == "cpu":
            assert err > 0, f"{name}: equal to F32's bit for bit: the product did not run in {precision}"


def _tiny_gradient_fit(device: str, scale: float | None, monkeypatch, steps: int = 6):
    """An MLP whose loss is weighted by 1e-7: its gradients inside the half products are ~1e-9, below F16's
    smallest value, unless the loss scale lifts them."""
    if scale is not None:
        monkeypatch.setattr(runtime_module, "DynamicLossScale", lambda: DynamicLossScale(scale=scale))
    x, y = _classes(64 * steps, (784,), 0.5, seed=5)
    return _trained(_mnist_fc, "f16", device, x, y, 64, steps, loss_weights=[1e-7])


def test_f16_loss_scaling_keeps_tiny_gradients(each_device, monkeypatch):
    model, before, hist = _tiny_gradient_fit(each_device, None, monkeypatch)
    moved = np.abs(g.ggml_get_weights(model)["first.weight"] - before["first.weight"]).max()
    assert moved > 1e-3   # Adam's steps of ~lr per weight
    assert hist.attrs["loss_scale"] == {"scale": 2.0 ** 16, "skipped_steps": 0}
    if each_device == "cpu":
        # the same without scaling: the first layer's gradient flushes to zero in F16 and it never moves (ggml's CPU
        # rounds the gradient to F16 in the product; Vulkan's F16 kernels multiply it unrounded, F32, so there the
        # scale guards the F16 devices and kernels that do round)
        model, before, hist = _tiny_gradient_fit(each_device, 1.0, monkeypatch)
        assert np.array_equal(g.ggml_get_weights(model)["first.weight"], before["first.weight"])


def test_f16_overflowing_steps_are_skipped_and_halve_the_scale(monkeypatch):
    """A skipped step leaves the weights and the optimizer's state alone, still reports its batch's loss (the
    forward pass did not overflow: the fit's loss is the untouched model's), and the scale is the model's: the
    next fit and a trainer continue from it."""
    x, y = _classes(64 * 3, (784,), 0.5, seed=6)
    monkeypatch.setattr(runtime_module, "DynamicLossScale", lambda: DynamicLossScale(scale=2.0 ** 60))
    np.random.seed(7)
    model, _ = _mnist_fc()
    model = g.ggml_compile(model, loss="sparse_categorical_crossentropy", backend="cpu", precision="f16")
    before = g.ggml_get_weights(model)
    untouched = g.ggml_evaluate(model, x, y)["loss"]
    hist = g.ggml_fit(model, x, y, epochs=1, batch_size=64, shuffle=False, verbose=0)
    assert hist.attrs["loss_scale"] == {"scale": 2.0 ** 57, "skipped_steps": 3}
    assert hist["train_loss"].iloc[-1] == pytest.approx(untouched, rel=1e-4)
    after = g.ggml_get_weights(model)
    assert all(np.array_equal(after[k], before[k]) for k in before)   # no step taken, optimizer state untouched
    hist = g.ggml_fit(model, x, y, epochs=1, batch_size=64, shuffle=False, verbose=0)
    scale, skipped = hist.attrs["loss_scale"]["scale"], hist.attrs["loss_scale"]["skipped_steps"]
    assert scale == 2.0 ** (57 - skipped) and np.isfinite(hist["train_loss"].iloc[-1])   # continued, not restarted
    with g.ggml_trainer(model, batch_size=64) as tr:
        losses = [tr.step(x[:64], y[:64]) for _ in range(2)]
    assert all(np.isfinite(v) and v > 0.1 for v in losses)   # the batch's loss, skipped step or not
    assert model.runtime.loss_scale.scale <= scale


def test_the_loss_scale_is_saved_with_the_optimizer_state(tmp_path, monkeypatch):
    """An F16 model saved with its optimizer's state (and a pickle, which is such a file) resumes with its loss
    scale and good-step count; a warm restart (weights only) starts the scale afresh."""
    import pickle
    monkeypatch.setattr(runtime_module, "DynamicLossScale", lambda: DynamicLossScale(scale=2.0 ** 60))
    x, y = _classes(64 * 3, (784,), 0.5, seed=6)
    model, _ = _mnist_fc()
    model = g.ggml_compile(model, loss="sparse_categorical_crossentropy", backend="cpu", precision="f16")
    g.ggml_fit(model, x, y, epochs=1, batch_size=64, shuffle=False, verbose=0)
    model.runtime.loss_scale.good_steps = 5
    path = str(tmp_path / "f16.gguf")
    g.ggml_save_model(model, path, include_optimizer=True)
    for loaded in (g.ggml_load_model(path, backend="cpu"), pickle.loads(pickle.dumps(model))):
        assert (loaded.runtime.loss_scale.scale, loaded.runtime.loss_scale.good_steps) == (2.0 ** 57, 5)
    fresh = g.ggml_compile(_mnist_fc()[0], loss="sparse_categorical_crossentropy", backend="cpu", precision="f16")
    g.ggml_load_weights(fresh, path, include_optimizer=True)
    assert fresh.runtime.loss_scale.scale == 2.0 ** 57
    g.ggml_save_model(model, path, include_optimizer=False)
    assert g.ggml_load_model(path, backend="cpu").runtime.loss_scale.scale == 2.0 ** 60   # a fresh one


def test_a_scale_change_reaches_the_next_step_exactly(each_device, monkeypatch):
    """Scales are powers of two, so SGD's update must not depend on when the scale changes: growing it after
    every step (a new 1/scale written while the last step may still be queued on the device) gives the update
    of a scale that never changes."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 256)).astype(np.float32)
    y = rng.integers(0, 4, 128).astype(np.int32)

    def update(interval: int) -> dict:
        monkeypatch.setattr(runtime_module, "DynamicLossScale", lambda: DynamicLossScale(growth_interval=interval))
        np.random.seed(7)
        m = g.ggml_model_sequential()
        m = g.ggml_layer_dense(m, 512, activation="tanh", input_shape=(256,))
        m = g.ggml_layer_dense(m, 4, activation="softmax")
        m = g.ggml_compile(m, optimizer="sgd", loss="sparse_categorical_crossentropy", backend=each_device,
                           learning_rate=0.1, precision="f16")
        w0 = g.ggml_get_weights(m)
        g.ggml_fit(m, x, y, epochs=1, batch_size=32, shuffle=False, verbose=0)
        w = g.ggml_get_weights(m)
        return {k: w[k].astype(np.float64) - w0[k] for k in w}
    want = update(10 ** 9)
    for _ in range(2):
        got = update(1)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-6 * np.abs(want[k]).max())


def test_the_loss_scale_follows_grad_scalers_schedule():
    ls = DynamicLossScale(scale=8.0, growth_interval=3)
    assert [ls.update(True), ls.update(True), ls.update(True)] == [False, False, True] and ls.scale == 16.0
    assert ls.update(True) is False and ls.update(False) is True and ls.scale == 8.0 and ls.skipped == 1
    assert [ls.update(True) for _ in range(3)] == [False, False, True] and ls.scale == 16.0  # the count restarted
    low = DynamicLossScale(scale=DynamicLossScale.MIN_SCALE)
    assert low.update(False) is False and low.scale == DynamicLossScale.MIN_SCALE


def test_precision_is_checked_saved_and_used_by_predictions(tmp_path):
    model, _ = _mnist_fc()
    with pytest.raises(g.GgmlValueError, match="precision must be 'f32', 'bf16' or 'f16'"):
        g.ggml_compile(model, loss="sparse_categorical_crossentropy", backend="cpu", precision="fp8")
    for given, name in (("BF16", "bf16"), (None, "f32"), ("mixed_float16", "f16"), ("Float32", "f32")):
        assert g.ggml_compile(model, loss="mse", backend="cpu", precision=given).compiled.precision == name
    np.random.seed(1)
    model = g.ggml_compile(model, loss="sparse_categorical_crossentropy", backend="cpu", precision="mixed_bfloat16")
    assert model.compiled.precision == "bf16"
    x, y = _classes(32, (784,), 0.5)
    half = g.ggml_predict(model, x)
    with g.ggml_trainer(model, batch_size=32) as tr:   # a snapshot predicts with the model's products
        snap = tr.snapshot()
        np.testing.assert_array_equal(g.ggml_predict(snap, x), half)
        g.ggml_snapshot_free(snap)
    path = str(tmp_path / "m.gguf")
    g.ggml_save_model(model, path)
    loaded = g.ggml_load_model(path, backend="cpu")
    assert loaded.compiled.precision == "bf16"
    np.testing.assert_array_equal(g.ggml_predict(loaded, x), half)
    full = g.ggml_predict(g.ggml_compile(loaded, loss="sparse_categorical_crossentropy", backend="cpu"), x)
    assert 0 < np.abs(full - half).max() < 0.05   # the same weights through F32 products: close, not equal


def test_half_products_stay_one_split_on_vulkan(monkeypatch):
    if "vulkan" not in g.ggml_backends_built() or g.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("no Vulkan0 device (the vulkan backend not built, or no Vulkan driver: Mesa's lavapipe in CI)")
    inp = g.ggml_input(shape=(10, 6))
    att = g.ggml_layer_multi_head_attention(inp, num_heads=2, key_dim=4)
    conv = g.ggml_layer_conv_1d(att, 8, 3, activation="relu")
    out = g.ggml_layer_dense(g.ggml_layer_lstm(conv, 8), 2, activation="softmax")
    for precision in ("bf16", "f16"):
        model = g.ggml_compile(g.ggml_model(inp, out), loss="sparse_categorical_crossentropy", backend="Vulkan0",
                               precision=precision)
        placement = g.ggml_model_placement(model)
        assert [b for b, _ in placement.splits] == ["Vulkan0"] and not placement.notes
        casts = [op for _, ops in placement.splits for op in ops if op == "CPY"]
        assert len(casts) >= 6   # the four attention projections, the convolution's and the LSTM's input kernels
