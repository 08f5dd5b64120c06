"""Interpreter exit while a daemon thread is inside ggml_predict or ggml_fit.

At exit Python runs every weakref finalizer, which freed the backend and buffers under the running compute
(a segmentation fault in most runs). ggmlpy's exit hook refuses new calls, waits for the running one and
leaves the C objects to the operating system while another thread is alive. Each case is a fresh
interpreter, run several times (the crash depended on timing).
"""
from __future__ import annotations

import pytest

from tests.helpers.subprocesses import run_in_subprocess


SCRIPT = """
import threading, time
import numpy as np
import ggmlpy as G
x = np.random.rand(256, 128).astype(np.float32)
y = np.random.randint(0, 10, 256)
m = G.ggml_model_sequential()
m = G.ggml_layer_dense(m, 512, activation="relu", input_shape=(128,))
m = G.ggml_layer_dense(m, 10, activation="softmax")
m = G.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend="cpu")
started = threading.Event()

def work():
    while True:
        started.set()
        if MODE == "fit":
            G.ggml_fit(m, x, y, epochs=1, batch_size=64, verbose=0)
        else:
            G.ggml_predict(m, x)

threading.Thread(target=work, daemon=True).start()
started.wait(30)
time.sleep(DELAY)
print("exiting")
"""


@pytest.mark.parametrize("mode", ["predict", "fit"])
@pytest.mark.parametrize("delay", [0.05, 0.3])
def test_exit_during_a_daemon_threads_compute_does_not_crash(mode, delay):
    for _ in range(2):
        rc, out, err = run_in_subprocess(f"MODE = {mode!r}\nDELAY = {delay}\n" + SCRIPT, timeout=60)
        assert rc == 0 and "exiting" in out, (rc, err[-2000:])


def test_with_no_other_thread_the_finalizers_free_everything_at_exit():
    """The usual exit is unchanged: C objects still alive are freed (ggml's own frees run; no leak report)."""
    code = """
import atexit
import ggmlpy as G
from ggmlpy.core import handle
# registered before the first handle, so before ggmlpy's exit hook and weakref's: it runs after both
# (a finalizer that has run is dead; one left to the operating system would still be alive)
atexit.register(lambda: print("freed at exit:", len(handle._live_handles) > 0 and not any(
    h._finalizer.alive for h in handle._live_handles if h._finalizer is not None)))
b = G.ggml_backend_cpu_init()
ctx = G.ggml_init(1 << 20)
"""
    rc, out, err = run_in_subprocess(code, timeout=60)
    assert rc == 0 and "freed at exit: True" in out, out + err
