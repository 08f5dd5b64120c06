"""A training step waits for its device once (patches/0051-0052, ggmlpy/compute/staging.py): the batch is uploaded
from pinned memory ahead of the step, the loss, predictions, correct count, loss heads and the outputs the metrics
read are read behind it, a graph optimizer's step is queued before the one wait, and the optimizer's parameters
are uploaded without one. ``ggmlpy_host_waits`` (patches/0051) counts every synchronization and every blocking
read or write of device memory; a step here is the second epoch of a fit divided by its steps, so that the first
step's one-time work (placing the graph, watching the placement) is not counted.

On the CPU no step waits: the count stays at zero. Vulkan runs on lavapipe in CI; CUDA where built and present.
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy._ffi import lib
from tests.helpers import ROOT


DEVICES = {"vulkan": "Vulkan0", "cuda": "CUDA0"}
N, BATCH = 96, 32


def _device(family: str) -> str:
    if family not in G.ggml_backends_built():
        pytest.skip(f"the {family} backend is not built in this installation (GGMLPY_BACKENDS)")
    name = DEVICES[family]
    if G.ggml_backend_dev_by_name(name) is None:
        pytest.skip(f"the {family} backend is built but this machine has no {name} device")
    return name


def _data(classes: int = 3):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(N, 6)).astype(np.float32)
    y = rng.integers(0, classes, N)
    return x, y


def _model(backend: str, **compile_args):
    m = G.ggml_model_sequential()
    m = G.ggml_layer_dense(m, 16, activation="relu", input_shape=(6,))
    m = G.ggml_layer_dense(m, 3, activation="softmax")
    args = {"optimizer": "adam", "loss": "sparse_categorical_crossentropy", **compile_args}
    if isinstance(args["optimizer"], str):
        args["learning_rate"] = 1e-2
    return G.ggml_compile(m, backend=backend, **args)


def _waits_per_step(fit) -> float:
    """Host waits per training step in the second epoch of ``fit(callbacks)``. The count is the process's: objects
    of earlier tests freed by the garbage collector during the fit (a scheduler synchronizes as it goes) would add
    theirs, so they go first and the collector waits meanwhile."""
    marks: list[int] = []
    cb = {"on_epoch_begin": lambda e, logs, s: marks.append(lib.ggmlpy_host_waits()),
          "on_epoch_end": lambda e, logs, s: marks.append(lib.ggmlpy_host_waits())}
    gc.collect()
    gc.disable()
    try:
        fit([cb])
    finally:
        gc.enable()
    return (marks[3] - marks[2]) / (N // BATCH)


CASES = {
    "adam": {},                                               # ggml-opt's own step
    "rmsprop": {"optimizer": "rmsprop"},                      # the step as a graph of its own (GraphOptimizer)
    "momentum-clipped": {"optimizer": G.ggml_optimizer_sgd(learning_rate=1e-2, momentum=0.9, clipnorm=1.0)},
    "metrics": {"metrics": ["accuracy", "auc"]},              # outputs read for the compiled metrics
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("family", list(DEVICES))
def test_a_model_step_waits_once(family, case):
    device = _device(family)
    x, y = _data()
    args = dict(CASES[case])
    if case == "metrics":
        y = (y > 0).astype(np.int64)
        m = G.ggml_model_sequential()
        m = G.ggml_layer_dense(m, 8, activation="relu", input_shape=(6,))
        m = G.ggml_layer_dense(m, 1, activation="sigmoid")
        net = G.ggml_compile(m, optimizer="adam", loss="binary_crossentropy", backend=device, **args)
    else:
        net = _model(device, **args)
    per_step = _waits_per_step(lambda cbs: G.ggml_fit(net, x, y, epochs=2, batch_size=BATCH, shuffle=False,
                                                      verbose=0, callbacks=cbs))
    assert per_step == 1.0, f"{per_step} host waits per step on {device} ({case}); one is the target"


@pytest.mark.parametrize("family", list(DEVICES))
def test_gradient_accumulation_waits_once_per_step(family):
    """nbatch_logical over two batches: the optimizer step zeroes the accumulators in its graph (patches/0052),
    where ggml-opt waited for a memset per weight before each logical batch (2 + 5 / 2 waits per step here). The
    second wait per step is the scheduler's synchronization when ggml-opt allocates its other graph (it alternates
    between the gradients' and the optimizer step's): the device is idle then, the step before already waited for."""
    device = _device(family)
    x, y = _data()
    net = _model(device)
    per_step = _waits_per_step(lambda cbs: G.ggml_fit(net, x, y, epochs=2, batch_size=BATCH // 2,
                                                      nbatch_logical=BATCH, shuffle=False, verbose=0, callbacks=cbs)
                               ) / 2   # twice the steps of the others: N // (BATCH // 2) per epoch
    assert per_step == 2.0


@pytest.mark.parametrize("family", list(DEVICES))
def test_weighted_samples_and_heads_are_read_in_the_one_wait(family):
    """Sample weights make the loss a graph of ggml ops with heads (their values and correct counts read back)."""
    device = _device(family)
    x, y = _data()
    w = np.linspace(0.5, 1.5, N).astype(np.float32)
    net = _model(device)
    per_step = _waits_per_step(lambda cbs: G.ggml_fit(net, x, y, sample_weight=w, epochs=2, batch_size=BATCH,
                                                      shuffle=False, verbose=0, callbacks=cbs))
    assert per_step == 1.0


@pytest.mark.parametrize("family", list(DEVICES))
def test_the_seed_loop_on_a_device_scheduler_waits_once(family):
    """ggml_fit_opt_gen over a scheduler the user built on the device (the seed page's setup on a GPU)."""
    device = _device(family)
    backend = G.ggml_backend_init_by_name(device)
    cpu = G.ggml_backend_cpu_init()
    sched = G.ggml_backend_sched_new([backend, cpu], parallel=False, graph_size=512)
    ctx = G.ggml_init(16 * 1024 * 1024, no_alloc=True)
    try:
        inputs = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 6, BATCH)
        G.ggml_set_input(inputs)
        w = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 6, 3)
        G.ggml_set_param(w)
        out = G.ggml_mul_mat(ctx, w, inputs)
        G.ggml_set_output(out)
        buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
        G.ggml_backend_tensor_set_data(w, np.random.default_rng(1).normal(0, 0.1, 18).astype(np.float32))
        x, _ = _data()
        target = np.random.default_rng(2).normal(size=(N, 3)).astype(np.float32)

        def batches():
            for i in range(0, N, BATCH):
                yield x[i:i + BATCH], target[i:i + BATCH]

        per_step = _waits_per_step(lambda cbs: G.ggml_fit_opt_gen(sched, ctx, inputs, out, batches, epochs=2,
                                                                  callbacks=cbs, silent=True))
        assert per_step == 1.0
        buf.free()
    finally:
        sched.free()
        ctx.free()
        cpu.free()
        backend.free()


def test_a_cpu_step_never_waits():
    x, y = _data()
    for args in ({}, {"optimizer": "rmsprop"}):
        net = _model("cpu", **args)
        per_step = _waits_per_step(lambda cbs, net=net: G.ggml_fit(net, x, y, epochs=2, batch_size=BATCH,
                                                                   shuffle=False, verbose=0, callbacks=cbs))
        assert per_step == 0.0


# ---------------------------------------------------------------- misuse around a deferred step (each found by a
# review of this change: before its fix, the first gave wrong metrics and the others killed the process)

def _run(script: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter (a crash must not take the test run with it), on Vulkan0."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=str(ROOT))


@pytest.mark.parametrize("family", list(DEVICES))
def test_deferred_metrics_read_their_own_batch_labels(family):
    """A generator that refills one buffer in place: a deferred step's metrics must still see that step's labels
    (they are read after the source made the next batch)."""
    device = _device(family)
    rng = np.random.default_rng(0)
    n, b = 256, 32
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (np.arange(n) // b * 100.0).astype(np.float32).reshape(n, 1)   # batch k's targets are all 100 k

    def reuse():
        xb, yb = np.empty((b, 4), np.float32), np.empty((b, 1), np.float32)
        for k in range(n // b):
            xb[:], yb[:] = x[k * b:(k + 1) * b], y[k * b:(k + 1) * b]
            yield xb, yb

    def copies():
        for k in range(n // b):
            yield x[k * b:(k + 1) * b].copy(), y[k * b:(k + 1) * b].copy()

    maes = []
    for gen in (reuse, copies):
        m = G.ggml_model_sequential()
        m = G.ggml_layer_dense(m, 1, input_shape=(4,), kernel_initializer="zeros")
        m = G.ggml_compile(m, optimizer="sgd", loss="mse", metrics=["mae"], backend=device, learning_rate=1e-9)
        maes.append(float(G.ggml_fit_generator(m, gen, epochs=1, verbose=0)["train_mae"][0]))
    # zero weights predict 0 (a learning rate of 1e-9 keeps them there): the mean |y| over the epoch is 350
    np.testing.assert_allclose(maes, [350.0, 350.0], rtol=1e-4)


def test_uploads_and_a_prediction_thread_share_the_device():
    """Predictions from another thread while a fit runs on the same device: the fit's asynchronous uploads are
    queued under the backend's lock, as every compute is."""
    _device("vulkan")
    proc = _run("""
        import threading, numpy as np, ggmlpy as G
        rng = np.random.default_rng(0)
        x = rng.normal(size=(1024, 16)).astype(np.float32); y = rng.integers(0, 4, 1024)
        m = G.ggml_model_sequential()
        m = G.ggml_layer_dense(m, 16, activation="relu", input_shape=(16,))
        m = G.ggml_layer_dense(m, 4, activation="softmax")
        m = G.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend="Vulkan0")
        stop = []
        def predict():
            while not stop:
                G.ggml_predict(m, x[:64], batch_size=64)
        t = threading.Thread(target=predict); t.start()
        try:
            G.ggml_fit(m, x, y, epochs=2, batch_size=16, verbose=0)
        finally:
            stop.append(1); t.join()
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]


def test_a_step_refused_after_its_batch_was_staged_leaves_nothing_queued():
    """A step refused by a check (here AdamW's beta1 set to 1 by a callback): nothing of it may stay queued on the
    device to run later on freed memory."""
    _device("vulkan")
    proc = _run("""
        import gc, numpy as np, ggmlpy as G
        rng = np.random.default_rng(0)
        x = rng.normal(size=(4096, 256)).astype(np.float32); y = rng.integers(0, 10, 4096)
        m = G.ggml_model_sequential()
        m = G.ggml_layer_dense(m, 64, activation="relu", input_shape=(256,))
        m = G.ggml_layer_dense(m, 10, activation="softmax")
        m = G.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend="Vulkan0")
        def bad(epoch, logs, state):
            if epoch == 2:
                state.lr_ud.params.adamw.beta1 = 1.0
        try:
            G.ggml_fit(m, x, y, epochs=2, batch_size=2048, verbose=0, callbacks=[{"on_epoch_begin": bad}])
            raise SystemExit("the fit should have refused beta1 = 1")
        except ValueError as e:
            print("refused:", str(e)[:60])
        gc.collect()
        junk = [np.ones(1 << 18, np.float32) for _ in range(64)]   # reuse the freed host memory
        p = G.ggml_predict(m, x[:2048], batch_size=2048)
        assert np.isfinite(p).all()
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_an_interrupted_wait_is_waited_for_by_the_next_step():
    """Ctrl-C (or another exception) where a step's wait begins, before ggml-opt's: the step stays pending and the
    next one waits for it, where ggml-opt asserted (killing the process) on the next alloc."""
    _device("vulkan")
    proc = _run("""
        import numpy as np, ggmlpy as G
        import ggmlpy.opt.context as C
        m = G.ggml_model_sequential()
        m = G.ggml_layer_dense(m, 8, activation="relu", input_shape=(4,))
        m = G.ggml_layer_dense(m, 3, activation="softmax")
        m = G.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend="Vulkan0")
        x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32); y = np.arange(8) % 3
        tr = G.ggml_trainer(m, batch_size=8)
        first = tr.step(x, y)
        real, entered = C.computing, []
        class Flaky(real):
            def __enter__(self):
                entered.append(1)
                if len(entered) == 3:   # alloc, eval_submit, eval_finish: as the lock's acquire would raise
                    raise KeyboardInterrupt
                return super().__enter__()
        C.computing = Flaky
        try:
            tr.step(x, y)
        except KeyboardInterrupt:
            pass
        C.computing = real
        third = tr.step(x, y)
        assert np.isfinite(third) and third < first, (first, third)
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr[-2000:]
