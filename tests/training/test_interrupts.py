"""Sources that never end or never answer: an error up front where it is certain, a warning where it is
not, and Ctrl-C always stops training promptly, leaving no prefetch thread behind. The Ctrl-C cases run
in a subprocess that receives a real SIGINT."""
from __future__ import annotations

import itertools
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.training import prefetch as P
from tests.helpers import ROOT


SETUP = """
import itertools, sys, threading, time, numpy as np, ggmlpy as G
backend = G.ggml_backend_cpu_init()
G.ggml_backend_cpu_set_n_threads(backend, 1)
sched = G.ggml_backend_sched_new([backend], parallel=False)
ctx = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 8))
w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 1))
out = G.ggml_mul_mat(ctx, w, x)
buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
G.ggml_backend_tensor_set_data(w, np.zeros(4))
BATCH = (np.zeros((8, 4), np.float32), np.zeros(8, np.float32))
"""


def _spawn(body: str) -> subprocess.Popen:
    env = dict(os.environ, GGML_NO_BACKTRACE="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # SIGINT back to its default in the child (a test runner started in the background ignores it, and a
    # child would inherit that), so Python turns it into KeyboardInterrupt
    return subprocess.Popen([sys.executable, "-c", SETUP + textwrap.dedent(body)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(proc: subprocess.Popen, word: str, timeout: float = 60) -> list[str]:
    lines, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith(word):
                return lines
    proc.kill()
    raise AssertionError(f"the child never printed {word}: {''.join(lines)}")


def _interrupt(body: str, settle: float = 1.5) -> tuple[int, str, float]:
    """Run ``body`` (it prints READY before blocking), send SIGINT; (exit status, output, seconds to exit)."""
    proc = _spawn(body)
    lines = _wait_for(proc, "READY")
    time.sleep(settle)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the process did not stop within 30 s of Ctrl-C:\n{''.join(lines) + out}") from None
    return proc.returncode, "".join(lines) + out, time.monotonic() - sent


BLOCKING = {
    # a source stuck in Python code (a polling loop): the prefetch thread can be stopped at once
    "polling": """
        def gen():
            yield BATCH
            print("READY", flush=True)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                sum(range(1000))
            yield BATCH
    """,
    # a source stuck in a C call: the thread cannot be stopped before the call returns, but it is a
    # daemon that never keeps the process alive, and training stops at once
    "sleeping": """
        def gen():
            yield BATCH
            print("READY", flush=True)
            time.sleep(20)
            yield BATCH
    """,
}


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("kind", sorted(BLOCKING))
def test_ctrl_c_stops_a_blocked_generator(kind, prefetch):
    body = BLOCKING[kind] + f"""
        t0 = time.monotonic()
        try:
            G.ggml_fit_opt_gen(sched, ctx, x, out, gen, epochs=3, silent=True, prefetch={prefetch})
        except KeyboardInterrupt as e:
            print("INTERRUPTED", round(time.monotonic() - t0, 2), "rows", len(e.history), flush=True)
            alive = [t for t in threading.enumerate() if t is not threading.main_thread()]
            print("THREADS", len(alive), "DAEMON", all(t.daemon for t in alive), flush=True)
    """
    rc, out, seconds = _interrupt(body)
    assert rc == 0, out
    assert "INTERRUPTED" in out and "rows 0" in out, out
    assert seconds < 8, f"{seconds:.1f} s from Ctrl-C to the end of the process:\n{out}"
    threads = out.split("THREADS ")[1].split()
    if kind == "polling" or prefetch == 0:
        assert threads[0] == "0", out  # no thread left running
    else:
        assert threads[2] == "True", out  # blocked in C: at most a daemon thread, which exits with the process


def test_an_abandoned_prefetch_thread_never_touches_the_source_again():
    """A source blocked in C when training stopped: once the call returns, the thread leaves for good (at its
    next Python instruction: the source does not run on)."""
    body = """
        calls = []
        def gen():
            yield BATCH
            print("READY", flush=True)
            time.sleep(2)
            calls.append("after sleep")
            yield BATCH
            calls.append("resumed")
        try:
            G.ggml_fit_opt_gen(sched, ctx, x, out, gen, epochs=2, silent=True, prefetch=2)
        except KeyboardInterrupt:
            time.sleep(3)
            alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
            print("ALIVE", alive, "CALLS", calls, flush=True)
    """
    rc, out, _ = _interrupt(body, settle=0.5)
    assert rc == 0, out
    assert "ALIVE [] CALLS" in out and "resumed" not in out, out


ENDLESS = {
    "while True generator function": "def src():\n    while True:\n        yield BATCH",
    "generator object": "def g():\n    while True:\n        yield BATCH\nsrc = g()",
    "itertools.cycle": "src = itertools.cycle([BATCH])",
    "itertools.repeat": "src = itertools.repeat(BATCH)",
}


@pytest.mark.parametrize("name", sorted(ENDLESS))
def test_a_certainly_endless_source_needs_steps_per_epoch(name):
    """Run in a subprocess: without the check the fit would never return."""
    body = ENDLESS[name] + """
for kwargs in ({"generator": src}, {"generator": [BATCH], "validation_generator": src}):
    try:
        G.ggml_fit_opt_gen(sched, ctx, x, out, epochs=1, silent=True, **kwargs)
        print("RAN")
    except G.GgmlValueError as e:
        print("REFUSED", e)
hist = G.ggml_fit_opt_gen(sched, ctx, x, out, src, steps_per_epoch=3, epochs=2, silent=True,
                          validation_generator=src, validation_steps=2)
print("STEPS", list(hist["steps"]))
"""
    proc = _spawn(body)
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("an endless source without steps_per_epoch ran forever") from None
    assert proc.returncode == 0, out
    assert out.count("REFUSED") == 2, out
    assert "never ends an epoch" in out and "pass steps_per_epoch=" in out and "pass validation_steps=" in out
    assert "STEPS [3, 3]" in out


def test_model_layer_generator_fit_refuses_endless_sources():
    """In a subprocess: without the check the fit would never return."""
    body = """
m = G.ggml_model_sequential()
m = G.ggml_layer_dense(m, 2, input_shape=(4,))
m = G.ggml_compile(m, optimizer="adam", loss="mse", backend="cpu")
def endless():
    while True:
        yield np.zeros((8, 4), np.float32), np.zeros((8, 2), np.float32)
for kwargs in ({}, {"steps_per_epoch": 2, "validation_data": endless}):
    try:
        G.ggml_fit_generator(m, endless, epochs=1, verbose=0, **kwargs)
        print("RAN")
    except G.GgmlValueError as e:
        print("REFUSED", e)
hist = G.ggml_fit_generator(m, endless, steps_per_epoch=2, validation_data=endless, validation_steps=1, epochs=2,
                            verbose=0)
print("ROWS", len(hist))
"""
    proc = _spawn(body)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("an endless source without steps_per_epoch ran forever") from None
    assert proc.returncode == 0, out
    assert out.count("REFUSED") == 2 and "pass steps_per_epoch=" in out and "pass validation_steps=" in out, out
    assert "ROWS 2" in out, out


def test_finite_sources_are_not_taken_for_endless():
    """Only what is certain is refused: a loop with a break, a counted repeat, a finite generator."""
    from ggmlpy.training.adapters import Source

    def with_break():
        i = 0
        while True:
            if i == 3:
                break
            i += 1
            yield i

    def counted():
        yield from range(3)

    for obj in (with_break, counted, counted(), itertools.repeat(1, 3), [1, 2], lambda: None):
        assert Source(obj, "generator").endless() is None, obj
    exhausted = counted()
    list(exhausted)
    assert Source(exhausted, "generator").endless() is None


def test_an_epoch_that_never_ends_warns_once(monkeypatch, tmp_path):
    """A source that cannot be recognised as endless (a callable never returning None): a warning after a
    while says what to do, instead of a silent, endless first epoch."""
    monkeypatch.setattr(P, "ENDLESS_WARN_S", 0.3)
    backend = G.ggml_backend_cpu_init()
    sched = G.ggml_backend_sched_new([backend], parallel=False)
    ctx = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 8))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 1))
    out = G.ggml_mul_mat(ctx, w, x)
    G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    G.ggml_backend_tensor_set_data(w, np.zeros(4))
    start = time.monotonic()

    class Enough(Exception):
        pass

    def call():
        if time.monotonic() - start > 1.5:
            raise Enough
        time.sleep(0.01)
        return np.zeros((8, 4), np.float32), np.zeros(8, np.float32)

    for prefetch in (0, 2):
        start = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(Enough):
                G.ggml_fit_opt_gen(sched, ctx, x, out, call, epochs=1, silent=True, prefetch=prefetch)
        msgs = [str(c.message) for c in caught if issubclass(c.category, G.GgmlpyWarning)]
        assert len(msgs) == 1 and "pass steps_per_epoch=" in msgs[0] and "Ctrl-C" in msgs[0], msgs


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed one, as meant
def test_a_ctrl_c_swallowed_by_a_finalizer_during_predict_is_raised_at_the_next_batch():
    """Python drops a KeyboardInterrupt raised inside a finalizer the garbage collector runs ("Exception
    ignored"): landing there between two batches of a long ggml_predict, Ctrl-C was lost and the prediction
    ran on. Here a gc callback takes the signal, once, while the batches run."""
    import gc
    import threading

    import ggmlpy as g

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    np.random.seed(0)
    m = g.ggml_model_sequential()
    g.ggml_layer_dense(m, 4, input_shape=(3,))
    g.ggml_compile(m, loss="mse", backend="cpu")
    x = np.random.rand(4000, 3).astype(np.float32)
    fired = []

    def in_batches():
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_name != "predict_arrays":
            frame = frame.f_back
        return frame is not None and frame.f_locals.get("start", 0) > 0   # the loop is under way

    def swallow(phase, info):
        if fired or not in_batches():
            return
        fired.append(True)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):   # the handler runs here, inside the callback, and its error is dropped
            pass

    threshold = gc.get_threshold()
    gc.callbacks.append(swallow)
    gc.set_threshold(1)
    try:
        with pytest.raises(KeyboardInterrupt):
            g.ggml_predict(m, x, batch_size=8)
    finally:
        gc.callbacks.remove(swallow)
        gc.set_threshold(*threshold)
    assert fired
