"""Nothing is lost when a fit ends early: the history of the completed epochs leaves with the exception,
the trained weights stay, and a non-finite loss stops training with a clear error (or a warning)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.training_refs import Linear, Net


def _batches(n_epochs_ok: int, fail_with: BaseException | None = None, nan_from: int | None = None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 8, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]])).astype(np.float32)
    epoch = {"n": 0}

    def gen():
        epoch["n"] += 1
        for i in range(4):
            if fail_with is not None and epoch["n"] > n_epochs_ok and i == 2:
                raise fail_with
            xb = x[i] if nan_from is None or epoch["n"] < nan_from else np.full_like(x[i], np.nan)
            yield xb, y[i]
    return gen


def test_an_exception_in_epoch_3_carries_the_history_of_epochs_1_and_2(cpu, tsched):
    lin = Linear(cpu, 3, 1, 8)
    with pytest.raises(RuntimeError, match="disk gone") as info:
        G.ggml_fit_opt_gen(tsched, lin.net.ctx, lin.x, lin.out, _batches(2, RuntimeError("disk gone")), epochs=5,
                           silent=True, learning_rate=0.05)
    history = info.value.history
    assert list(history["epoch"]) == [1, 2]
    assert history["train_loss"].notna().all() and history["train_loss"].iloc[1] < history["train_loss"].iloc[0]
    assert not np.allclose(Net.get(lin.W), lin.W0)  # the trained weights stay in place
    lin.free()


def test_ctrl_c_carries_the_history_too(cpu, tsched):
    lin = Linear(cpu, 3, 1, 8)
    with pytest.raises(KeyboardInterrupt) as info:
        G.ggml_fit_opt_gen(tsched, lin.net.ctx, lin.x, lin.out, _batches(1, KeyboardInterrupt()), epochs=5,
                           silent=True)
    assert list(info.value.history["epoch"]) == [1]
    lin.free()


def test_a_nan_loss_stops_training_with_a_clear_error(cpu, tsched):
    lin = Linear(cpu, 3, 1, 8)
    with pytest.raises(ValueError, match=r"Epoch 3: the training loss is nan.*learning rate") as info:
        G.ggml_fit_opt_gen(tsched, lin.net.ctx, lin.x, lin.out, _batches(9, nan_from=3), epochs=5, silent=True)
    assert list(info.value.history["epoch"]) == [1, 2]
    lin.free()


def test_on_nonfinite_warn_only_warns(cpu, tsched):
    lin = Linear(cpu, 3, 1, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = G.ggml_fit_opt_gen(tsched, lin.net.ctx, lin.x, lin.out, _batches(9, nan_from=2), epochs=3, silent=True,
                               on_nonfinite="warn")
    assert len(h) == 3 and np.isnan(h["train_loss"].iloc[2])
    assert any("not finite" in str(w.message) for w in caught)
    with pytest.raises(ValueError, match="on_nonfinite"):
        G.ggml_fit_opt_gen(tsched, lin.net.ctx, lin.x, lin.out, _batches(9), on_nonfinite="ignore", silent=True)
    lin.free()


def test_the_model_layer_stops_on_a_diverging_loss():
    np.random.seed(0)
    m = G.ggml_model_sequential()
    m = G.ggml_layer_dense(m, 8, input_shape=(4,))
    m = G.ggml_layer_dense(m, 1)
    G.ggml_compile(m, optimizer="sgd", loss="mse", backend="cpu", learning_rate=1.0)  # far too high
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32) * 100
    with pytest.raises(ValueError, match="not finite") as info:
        G.ggml_fit(m, x, x[:, :1] * 3, epochs=20, batch_size=16, verbose=0)
    assert len(info.value.history) < 20


def test_prefetch_never_trains_on_a_reused_buffer_refilled_later(cpu, tsched):
    """A generator that refills one buffer and yields it each time: with prefetch the queued batches must be
    copies, or training sees later batches' data (the weights must equal those of a run without prefetch)."""
    rng = np.random.default_rng(3)
    data = rng.normal(size=(6, 8, 3)).astype(np.float32)
    target = (data @ np.array([[1.0], [-2.0], [0.5]])).astype(np.float32)

    def reused():
        x, y = np.empty((8, 3), np.float32), np.empty((8, 1), np.float32)
        for i in range(6):
            x[...], y[...] = data[i], target[i]
            yield x, y

    weights = []
    for prefetch in (0, 3):
        lin = Linear(cpu, 3, 1, 8)
        G.ggml_fit_opt_gen(tsched, lin.net.ctx, lin.x, lin.out, reused, epochs=2, silent=True, learning_rate=0.05,
                           prefetch=prefetch)
        weights.append(Net.get(lin.W))
        lin.free()
    np.testing.assert_array_equal(weights[1], weights[0])


def test_an_empty_validation_source_warns_once(cpu, tsched):
    lin = Linear(cpu, 3, 1, 8)
    with pytest.warns(G.GgmlpyWarning, match="validation_generator gave no batch") as caught:
        h = G.ggml_fit_opt_gen(tsched, lin.net.ctx, lin.x, lin.out, _batches(9), epochs=3, silent=True,
                               validation_generator=iter([]))
    assert h["val_loss"].isna().all()
    assert sum("validation_generator gave no batch" in str(w.message) for w in caught) == 1
    lin.free()


def test_a_dataset_fit_that_leaves_no_training_batch_is_an_error(cpu, tsched):
    lin = Linear(cpu, 3, 1, 8)
    ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 3, 1, 32, 1)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), np.ones((32, 3)))
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), np.ones((32, 1)))
    with pytest.raises(ValueError, match="no training batch"):
        G.ggml_fit_opt(tsched, lin.net.ctx, lin.x, lin.out, ds, nbatch_logical=32, val_split=0.5, silent=True)
    ds.free()
    lin.free()


def test_the_model_layer_reports_samples_per_second_of_one_sample_batches():
    """A batch of one: ggmlR's batch rule (the last axis that is not 1) would take the features for the batch."""
    import re
    import subprocess
    import sys
    code = ("import numpy as np, ggmlpy as g\n"
            "m = g.ggml_compile(g.ggml_layer_dense(g.ggml_model_sequential(), 1, input_shape=(50,)), loss='mse', "
            "backend='cpu')\n"
            "g.ggml_fit(m, np.ones((400, 50)), np.ones((400, 1)), batch_size=1, epochs=1, verbose=1)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seconds, rate = re.search(r"([0-9.]+)s \(([0-9]+) samples/s\)", out.stdout + out.stderr).groups()
    assert float(seconds) > 0
    assert float(rate) == pytest.approx(400 / float(seconds), rel=0.2)   # 400 samples, not 400 x 50


def test_outputs_that_do_not_read_the_inputs_are_refused(cpu, tsched):
    lin = Linear(cpu, 3, 1, 8)
    net = Net(cpu)
    other = net.leaf((8, 3))      # allocated, the right shape, but lin.out never reads it
    net.alloc()
    with pytest.raises(ValueError, match=r"do not depend on inputs\[0\]"):
        G.ggml_fit_opt_gen(tsched, lin.net.ctx, other, lin.out, _batches(9), silent=True)
    net.free()
    lin.free()


# ---------------------------------------------------------------- a None batch is not an end for every source

@pytest.mark.parametrize("kind", ["generator function", "list", "iterator"])
def test_a_none_inside_a_source_that_is_not_a_function_is_an_error(kind):
    """Only a function of no arguments ends an epoch with None (ggmlR's contract); elsewhere a None batch
    would silently end the epoch early, so it is refused with the fix."""
    from ggmlpy.training.adapters import Source
    batches = [1, None, 3]

    def gen():
        yield from batches
    obj = {"generator function": gen, "list": batches, "iterator": iter(batches)}[kind]
    src = Source(obj, "generator")
    src.start_epoch()
    assert src.next_batch() == 1
    with pytest.raises(G.GgmlValueError, match="gave None as batch 2 .* only for a function of no arguments"):
        src.next_batch()


def test_a_function_ends_its_epoch_with_none():
    from ggmlpy.training.adapters import Source
    items = iter([1, None, 2])
    src = Source(lambda: next(items), "generator")
    src.start_epoch()
    assert src.next_batch() == 1 and src.next_batch() is None and src.next_batch() == 2
