"""ggml_trainer and snapshots."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g


def regressor(lr=0.01, optimizer="adam"):
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 8, activation="tanh", input_shape=(3,))
    m = g.ggml_layer_dense(m, 2)
    return g.ggml_compile(m, optimizer=optimizer, loss="mse", backend="cpu", learning_rate=lr)


def data(n=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return x, np.stack([x[:, 0] - x[:, 1], x[:, 2] * 0.5], 1).astype(np.float32)


def weights(m):
    return {k: v.copy() for k, v in g.ggml_get_weights(m).items()}


def same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


def test_step_returns_the_batch_loss_and_learns():
    m = regressor(lr=0.02)
    x, y = data(16)
    with g.ggml_trainer(m, batch_size=16) as tr:
        first = tr.step(x, y)
        pred = g.ggml_predict(m, x)
        losses = [tr.step(x, y) for _ in range(200)]
        assert tr.n_steps() == 201
    assert first == pytest.approx(np.mean((g.ggml_predict(regressor(lr=0.02), x) - y) ** 2), rel=1e-5)
    assert losses[-1] < 0.2 * first
    assert not np.allclose(pred, g.ggml_predict(m, x))


def test_eval_changes_nothing_and_matches_evaluate():
    m = regressor()
    x, y = data(16)
    tr = g.ggml_trainer(m, batch_size=16, nbatch_logical=32)
    tr.step(x, y)                       # half an accumulation window
    w = weights(m)
    loss = tr.eval(x, y)
    assert loss == pytest.approx(g.ggml_evaluate(m, x, y)["loss"], rel=1e-6)
    assert same(w, weights(m))
    tr.step(x, y)                       # completes the window: the optimizer steps now
    assert not same(w, weights(m))
    tr.free()


def test_accumulation_first_two_steps_see_identical_weights():
    m = regressor()
    x, y = data(8)
    tr = g.ggml_trainer(m, batch_size=8, nbatch_logical=16)
    w0 = weights(m)
    tr.step(x, y)
    assert same(w0, weights(m))          # no optimizer step after the first physical batch
    tr.step(x, y)
    w2 = weights(m)
    assert not same(w0, w2)
    tr.step(x, y)
    assert same(w2, weights(m))
    with pytest.warns(g.GgmlpyWarning, match="1 batches into a logical batch of 2"):
        tr.free()  # the third batch's gradients are dropped: said, as ggml_fit says it


def test_accumulated_step_equals_one_double_batch_step():
    x, y = data(16)
    a = regressor(optimizer="sgd", lr=0.1)
    with g.ggml_trainer(a, batch_size=8, nbatch_logical=16) as tr:
        tr.step(x[:8], y[:8])
        tr.step(x[8:], y[8:])
    b = regressor(optimizer="sgd", lr=0.1)
    with g.ggml_trainer(b, batch_size=16) as tr:
        tr.step(x, y)
    wa, wb = weights(a), weights(b)
    for k in wa:
        np.testing.assert_allclose(wa[k], wb[k], rtol=1e-5, atol=1e-7)


def test_batch_size_is_exact():
    m = regressor()
    x, y = data(10)
    with g.ggml_trainer(m, batch_size=8) as tr:
        with pytest.raises(ValueError, match="exactly 8"):
            tr.step(x, y)
        with pytest.raises(ValueError, match="exactly 8"):
            tr.eval(x, y)
        with pytest.raises(ValueError, match=r"\(N, 3\)"):
            tr.step(x[:8].T, y[:8])


def test_free_is_idempotent_and_every_method_raises_after():
    m = regressor()
    x, y = data(8)
    tr = g.ggml_trainer(m, batch_size=8)
    tr.free()
    tr.free()
    for call in (lambda: tr.step(x, y), lambda: tr.eval(x, y), tr.model, lambda: tr.set_lr(1e-3), tr.n_steps,
                 tr.snapshot, lambda: tr.restore(None)):
        with pytest.raises(RuntimeError, match="has been freed"):
            call()
    assert g.ggml_predict(m, x).shape == (8, 2)   # the model lives on


def test_set_lr_changes_the_step_size():
    x, y = data(8)
    steps = []
    for lr in (0.01, 0.001):
        m = regressor(optimizer="sgd", lr=0.5)
        with g.ggml_trainer(m, batch_size=8) as tr:
            w0 = weights(m)
            tr.set_lr(lr)
            assert tr.get_lr() == pytest.approx(lr)
            tr.step(x, y)
            steps.append(np.abs(weights(m)["dense_2.weight"] - w0["dense_2.weight"]).max())
    assert steps[0] == pytest.approx(10 * steps[1], rel=1e-3)
    with pytest.raises(ValueError):
        g.ggml_trainer(regressor(), batch_size=8).set_lr(0)


def test_snapshots_are_frozen_copies_that_predict_and_restore():
    m = regressor(lr=0.05)
    x, y = data(8)
    tr = g.ggml_trainer(m, batch_size=8)
    snap = tr.snapshot()
    before = g.ggml_predict(m, x)
    np.testing.assert_array_equal(g.ggml_predict(snap, x), before)
    for _ in range(20):
        tr.step(x, y)
    assert not np.allclose(g.ggml_predict(m, x), before)
    np.testing.assert_array_equal(g.ggml_predict(snap, x), before)   # frozen
    tr.restore(snap)
    np.testing.assert_array_equal(g.ggml_predict(m, x), before)
    assert tr.model() is m
    g.ggml_snapshot_free(snap)
    g.ggml_snapshot_free(snap)
    g.ggml_snapshot_free(None)
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_predict(snap, x)
    with pytest.raises(RuntimeError, match="freed"):
        tr.restore(snap)
    tr.free()


def test_a_trainer_refuses_to_run_on_a_recompiled_model():
    m = regressor()
    x, y = data(8)
    tr = g.ggml_trainer(m, batch_size=8)
    g.ggml_compile(m, loss="mae", backend="cpu")
    with pytest.raises(RuntimeError, match="compiled again"):
        tr.step(x, y)
    tr.free()


def test_dropout_masks_change_every_step_and_are_off_in_eval():
    np.random.seed(1)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 64, input_shape=(3,))
    m = g.ggml_layer_dropout(m, 0.5)
    m = g.ggml_layer_dense(m, 1)
    g.ggml_compile(m, optimizer="sgd", loss="mse", backend="cpu", learning_rate=1e-9)
    x, y = data(8)
    y = y[:, :1]
    with g.ggml_trainer(m, batch_size=8) as tr:
        losses = {round(tr.step(x, y), 7) for _ in range(6)}
        evals = {round(tr.eval(x, y), 7) for _ in range(3)}
    assert len(losses) > 3       # a new mask every step
    assert len(evals) == 1       # no mask in inference


# ---------------------------------------------------------------- saving and resuming a trainer



@pytest.fixture
def backend(each_device):
    """"cpu", or a GPU device (skipped, saying why, when it is not built or there is no device)."""
    return each_device


def regressor_on(backend):
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 8, activation="tanh", input_shape=(3,))
    m = g.ggml_layer_dense(m, 2)
    return g.ggml_compile(m, optimizer="adam", loss="mse", backend=backend, learning_rate=0.02)


def batches(k):
    return [data(8, seed) for seed in range(k)]


def test_a_trainer_from_a_loaded_checkpoint_continues_the_same_trajectory(backend, tmp_path):
    """12 steps, tr.save, 12 more steps; against: ggml_trainer(ggml_load_model(file)) stepping the same 12
    batches. Same losses step by step and the same final weights (AdamW's moments and step count restored)."""
    xs = batches(24)
    m = regressor_on(backend)
    path = tmp_path / "tr.gguf"
    with g.ggml_trainer(m, batch_size=8) as tr:
        for xb, yb in xs[:12]:
            tr.step(xb, yb)
        tr.save(path)
        straight = [tr.step(xb, yb) for xb, yb in xs[12:]]
    resumed_model = g.ggml_load_model(path, backend=backend)
    with g.ggml_trainer(resumed_model, batch_size=8) as tr:
        resumed = [tr.step(xb, yb) for xb, yb in xs[12:]]
    np.testing.assert_allclose(resumed, straight, rtol=1e-5, atol=1e-7)
    diff = max(np.abs(weights(resumed_model)[k] - weights(m)[k]).max() for k in weights(m))
    assert diff < 1e-5
    # saved without the optimizer: a warm restart that leaves the trajectory
    warm_path = tmp_path / "warm.gguf"
    m2 = regressor_on(backend)
    with g.ggml_trainer(m2, batch_size=8) as tr:
        for xb, yb in xs[:12]:
            tr.step(xb, yb)
        tr.save(warm_path, include_optimizer=False)
    with g.ggml_trainer(g.ggml_load_model(warm_path, backend=backend), batch_size=8) as tr:
        warm = [tr.step(xb, yb) for xb, yb in xs[12:]]
    assert np.abs(np.array(warm) - straight).max() > 1e-4


def test_a_freed_trainer_hands_its_optimizer_state_to_the_next_one():
    xs = batches(10)
    one = regressor()
    with g.ggml_trainer(one, batch_size=8) as tr:
        for xb, yb in xs:
            tr.step(xb, yb)
        assert tr.optimizer_state()["iter"] == 11
    two = regressor()
    for part in (xs[:4], xs[4:]):
        with g.ggml_trainer(two, batch_size=8) as tr:
            for xb, yb in part:
                tr.step(xb, yb)
    assert same(weights(one), weights(two))


def test_save_with_the_optimizer_is_refused_inside_a_logical_batch(tmp_path):
    m = regressor()
    x, y = data(8)
    with g.ggml_trainer(m, batch_size=8, nbatch_logical=16) as tr:
        tr.step(x, y)
        with pytest.raises(RuntimeError, match="1 of the 2 batches"):
            tr.save(tmp_path / "t.gguf")
        tr.save(tmp_path / "t.gguf", include_optimizer=False)     # the weights alone are fine
        tr.step(x, y)
        tr.save(tmp_path / "t.gguf")
        assert g.ggml_load_model(tmp_path / "t.gguf", backend="cpu").runtime.opt_state.state["iter"] == 2
    tr = g.ggml_trainer(m, batch_size=8)
    tr.free()
    with pytest.raises(RuntimeError, match="has been freed"):
        tr.save(tmp_path / "t.gguf")


# ---------------------------------------------------------------- one training session per model at a time

def test_an_idle_trainer_freed_after_a_fit_keeps_the_fits_optimizer_state():
    """A trainer that never stepped holds nothing: freeing it after a fit leaves the fit's AdamW state."""
    m = regressor()
    x, y = data(16)
    idle = g.ggml_trainer(m, batch_size=16)
    g.ggml_fit(m, x, y, epochs=3, batch_size=16, verbose=0)
    after_fit = m.runtime.opt_state.state
    idle.free()
    assert m.runtime.opt_state.state is after_fit and int(after_fit["iter"]) == 3 + 1


def test_a_trainer_that_stepped_holds_the_optimizer_until_freed():
    m = regressor()
    x, y = data(16)
    tr = g.ggml_trainer(m, batch_size=16)
    tr.step(x, y)
    with pytest.raises(g.GgmlInUseError, match="already being trained by a ggml_trainer.*trainer.free"):
        g.ggml_fit(m, x, y, epochs=1, batch_size=16, verbose=0)
    tr.free()
    g.ggml_fit(m, x, y, epochs=1, batch_size=16, verbose=0)  # continues the trainer's state
    assert int(m.runtime.opt_state.state["iter"]) == 1 + 1 + 1


def test_a_fit_started_from_the_models_own_callback_is_refused():
    m = regressor()
    x, y = data(16)
    nested = {"on_epoch_end": lambda e, logs, s: g.ggml_fit(m, x, y, epochs=1, batch_size=16, verbose=0)}
    with pytest.raises(g.GgmlInUseError, match="already being trained by a ggml_fit under way") as info:
        g.ggml_fit(m, x, y, epochs=2, batch_size=16, verbose=0, callbacks=[nested])
    assert len(info.value.history) == 1  # the epoch whose callback failed is in the history
    g.ggml_fit(m, x, y, epochs=1, batch_size=16, verbose=0)  # the lease was given back


def test_two_fits_from_two_threads_do_not_both_run():
    import threading
    m = regressor()
    x, y = data(256)
    errors, started = [], threading.Event()

    def slow_epoch(e, logs, s):
        started.set()
        threading.Event().wait(0.5)

    def second():
        started.wait(30)
        try:
            g.ggml_fit(m, x, y, epochs=1, batch_size=16, verbose=0)
        except g.GgmlInUseError as exc:
            errors.append(exc)
    t = threading.Thread(target=second)
    t.start()
    g.ggml_fit(m, x, y, epochs=1, batch_size=16, verbose=0, callbacks=[{"on_epoch_begin": slow_epoch}])
    t.join(60)
    assert len(errors) == 1 and int(m.runtime.opt_state.state["iter"]) == 256 // 16 + 1


def test_a_trainer_dropped_without_free_releases_the_model_and_its_c_objects():
    import gc

    from ggmlpy.core import handle
    m = regressor()
    x, y = data(16)
    g.ggml_fit(m, x, y, epochs=1, batch_size=16, verbose=0)
    gc.collect()
    before = len(handle._live_handles)
    for _ in range(20):
        g.ggml_trainer(m, batch_size=16).step(x, y)  # dropped at once, never freed
    gc.collect()
    assert len(handle._live_handles) <= before and m.runtime.live_trainers() == []  # (other tests' models may go too)
    g.ggml_fit(m, x, y, epochs=1, batch_size=16, verbose=0)  # the optimizer is free for the next session


def test_a_trainer_dropped_without_free_hands_its_optimizer_steps_to_the_model():
    """Dropped, it lost its AdamW moments and step count: the next fit restarted the optimizer at step 1."""
    import gc
    xs = batches(6)
    freed, dropped = regressor(), regressor()
    with g.ggml_trainer(freed, batch_size=8) as tr:
        for xb, yb in xs[:3]:
            tr.step(xb, yb)
    tr = g.ggml_trainer(dropped, batch_size=8)
    for xb, yb in xs[:3]:
        tr.step(xb, yb)
    del tr
    gc.collect()
    assert dropped.runtime.opt_state.state["iter"] == freed.runtime.opt_state.state["iter"] == 4
    for m in (freed, dropped):
        with g.ggml_trainer(m, batch_size=8) as t2:
            for xb, yb in xs[3:]:
                t2.step(xb, yb)
    assert same(weights(freed), weights(dropped))


def test_a_trainer_collected_in_a_reference_cycle_does_not_crash():
    """The garbage collector frees a cycle's C objects (their finalizers) before its __del__ runs: the dropped
    trainer's hand-back read freed memory (SIGSEGV). Now its handles read as freed and it gives up quietly."""
    import gc
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent('''
        import gc, numpy as np, ggmlpy as g
        x = np.random.rand(32, 4).astype(np.float32); y = np.random.rand(32, 2).astype(np.float32)
        m = g.ggml_model_sequential(); g.ggml_layer_dense(m, 2, input_shape=(4,))
        g.ggml_compile(m, loss="mse", backend="cpu")
        class Agent:
            def __init__(self):
                self.tr = g.ggml_trainer(m, 16)
                self.learn = self.step          # a cycle: Agent -> bound method -> Agent
            def step(self, a, b):
                return self.tr.step(a, b)
        for _ in range(3):
            a = Agent(); a.learn(x[:16], y[:16]); del a; gc.collect()
        g.ggml_fit(m, x, y, epochs=1, verbose=0)  # the model is free for the next session
        print("ok")
    ''')
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
    gc.collect()
