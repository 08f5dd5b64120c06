"""One model used from several threads: calls take turns or are refused, never crash or mix results.

Each case runs in a fresh interpreter: before these guards, ggml aborted the process (an inference graph
freed under a running prediction, a second ggml_opt_alloc of one trainer) or segfaulted (weights freed by
ggml_compile while ggml_save_weights read them).
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers.subprocesses import run_in_subprocess


MODEL = """
import threading, numpy as np, ggmlpy as g
np.random.seed(0)
m = g.ggml_model_sequential()
m = g.ggml_layer_dense(m, 8, activation="tanh", input_shape=(4,))
m = g.ggml_layer_dense(m, 3, activation="softmax")
m = g.ggml_compile(m, backend="cpu")
x = np.random.default_rng(1).normal(size=(40, 4)).astype(np.float32)
y = np.eye(3, dtype=np.float32)[np.arange(40) % 3]
errors = []
def run_threads(target, n=2):
    ts = [threading.Thread(target=target, args=(k,)) for k in range(n)]
    [t.start() for t in ts]; [t.join() for t in ts]
"""


def _run(body: str, timeout: float = 240) -> str:
    rc, out, err = run_in_subprocess(MODEL + textwrap.dedent(body), timeout=timeout)
    assert rc == 0, f"rc={rc}\n{out}\n{err[-3000:]}"
    return out


def test_predictions_from_two_threads_are_each_correct():
    """Several batch sizes (the predictor's cache of four graphs evicts while the other thread runs) and one
    shared size (both threads write the same input tensor): every result equals the single-threaded one."""
    out = _run("""
        expected = {bs: g.ggml_predict(m, x, batch_size=bs) for bs in range(1, 9)}
        wrong = []
        def loop(k):
            for i in range(60):
                bs = 8 if i % 2 else 1 + (i + k) % 8
                try:
                    p = g.ggml_predict(m, x, batch_size=bs)
                except Exception as e:
                    errors.append(repr(e)); continue
                if not np.array_equal(p, expected[bs]):
                    wrong.append((bs, float(np.abs(p - expected[bs]).max())))
        run_threads(loop, 3)
        print("errors", len(errors), errors[:2]); print("wrong", len(wrong), wrong[:2])
    """)
    assert "errors 0 " in out and "wrong 0 " in out, out


def test_trainer_steps_from_two_threads_take_turns():
    out = _run("""
        tr = g.ggml_trainer(m, batch_size=40)
        def loop(k):
            for _ in range(100):
                try:
                    tr.step(x, y)
                except Exception as e:
                    errors.append(repr(e))
        run_threads(loop)
        print("errors", len(errors), errors[:2], "steps", tr.n_steps())
        tr.free()
    """)
    assert "errors 0 [] steps 200" in out, out


def test_freeing_a_trainer_waits_for_the_step_under_way():
    out = _run("""
        import time
        tr = g.ggml_trainer(m, batch_size=40)
        def loop(k):
            if k == 0:
                while tr.n_steps() < 5:
                    time.sleep(0.001)
                try:
                    tr.free()
                except Exception as e:
                    errors.append(repr(e))
                return
            while True:
                try:
                    tr.step(x, y)
                except g.GgmlStateError as e:
                    errors.append("freed" if "has been freed" in str(e) else repr(e))
                    return
        run_threads(loop)
        print("alive", tr.alive, "errors", errors)
    """)
    assert "alive False errors ['freed']" in out, out


def test_compile_while_saving_or_loading_weights_in_another_thread(tmp_path):
    """ggml_compile frees the old weights; ggml_save_weights/ggml_load_weights mark the model in use, so the
    compile is refused while they read or write them (it segfaulted)."""
    path = str(tmp_path / "w.gguf")
    out = _run(f"""
        g.ggml_save_weights(m, {path!r})
        stop = False
        def io(k):
            while not stop:
                try:
                    (g.ggml_save_weights if k else g.ggml_load_weights)(m, {path!r})
                except g.GgmlpyError as e:
                    errors.append(type(e).__name__)
        ts = [threading.Thread(target=io, args=(k,)) for k in (0, 1)]
        [t.start() for t in ts]
        refused = 0
        for _ in range(150):
            try:
                g.ggml_compile(m, backend="cpu")
            except g.GgmlInUseError:
                refused += 1
        stop = True
        [t.join() for t in ts]
        print("ok", refused >= 0, sorted(set(errors)))
    """)
    assert "ok True" in out, out
    assert "GgmlStateError" not in out.split("ok True")[1], out   # no thread saw freed weights


def _model():
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 4, activation="relu", input_shape=(3,))
    m = g.ggml_layer_dense(m, 2, activation="softmax")
    return g.ggml_compile(m, backend="cpu", learning_rate=0.05)


def test_freezing_layers_during_a_fit_is_refused():
    """A running fit trains the layers that were trainable when it started: freezing one from a callback
    would report success and change nothing."""
    m = _model()
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    y = np.eye(2, dtype=np.float32)[np.arange(16) % 2]

    def freeze(epoch, logs, state):
        g.ggml_freeze_weights(m, 0, 1)
    with pytest.raises(g.GgmlInUseError, match="fit of this model is running"):
        g.ggml_fit(m, x, y, epochs=2, verbose=0, callbacks=[{"on_epoch_end": freeze}])
    assert all(layer.trainable for layer in m.layers)
    g.ggml_freeze_weights(m, 0, 1)     # after the fit: fine
    assert not m.layers[0].trainable


def test_setting_trainable_on_a_layer_during_a_fit_is_refused():
    """The same rule through the layer's own attribute (Keras' ``layer.trainable = False``), also for a layer
    of a second model that shares it."""
    m = _model()
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    y = np.eye(2, dtype=np.float32)[np.arange(16) % 2]
    first = m.layers[0]

    def freeze(epoch, logs, state):
        first.trainable = False
    with pytest.raises(g.GgmlInUseError, match="trainable cannot change while a fit"):
        g.ggml_fit(m, x, y, epochs=2, verbose=0, callbacks=[{"on_epoch_end": freeze}])
    assert first.trainable
    first.trainable = False            # after the fit: fine, and the next fit leaves the layer as it is
    before = g.ggml_get_weights(m)["dense_1.weight"]
    g.ggml_fit(m, x, y, epochs=1, verbose=0)
    np.testing.assert_array_equal(g.ggml_get_weights(m)["dense_1.weight"], before)


def test_compile_during_a_fit_is_refused_as_in_use():
    m = _model()
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    y = np.eye(2, dtype=np.float32)[np.arange(16) % 2]

    def recompile(epoch, logs, state):
        g.ggml_compile(m, backend="cpu")
    with pytest.raises(g.GgmlInUseError, match="in use by a running fit"):
        g.ggml_fit(m, x, y, epochs=1, verbose=0, callbacks=[{"on_epoch_end": recompile}])
