"""fork() after ggml ran its thread pool (multiprocessing's default start method on Linux).

ggml's OpenMP pool does not survive fork(): a child's first multi-threaded compute never returned. A child
of a process that may have started the pool computes on one thread instead (and trains correctly), and
asking it for more threads is refused with the fix (the 'spawn' start method). Each case runs in a fresh
interpreter with a timeout, so a regression shows as a failure, not a hung suite.
"""
from __future__ import annotations

from tests.helpers.subprocesses import run_in_subprocess


SETUP = """
import multiprocessing, os
import numpy as np
import ggmlpy as G
G.ggml_set_n_threads(2)

def train(seed):
    rng = np.random.default_rng(seed)
    x = rng.random((256, 16)).astype(np.float32)
    y = (x[:, 0] > 0.5).astype(int)
    m = G.ggml_model_sequential()
    m = G.ggml_layer_dense(m, 256, activation="relu", input_shape=(16,))
    m = G.ggml_layer_dense(m, 2, activation="softmax")
    m = G.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend="cpu",
                       learning_rate=0.01)
    G.ggml_fit(m, x, y, epochs=3, batch_size=64, verbose=0)
    return G.ggml_evaluate(m, x, y)["loss"], G.ggml_get_n_threads()
"""


def test_a_forked_pool_trains_on_one_thread_after_the_parent_used_two():
    code = SETUP + """
parent_loss, parent_threads = train(0)
with multiprocessing.get_context("fork").Pool(2) as pool:
    results = pool.map(train, [1, 2])
print("RESULT", parent_threads, [(round(l, 4), n) for l, n in results])
assert parent_threads == 2 and all(np.isfinite(l) and l < 0.69 and n == 1 for l, n in results), results
"""
    rc, out, err = run_in_subprocess(code, timeout=120)
    assert rc == 0, out + err
    assert "RESULT 2" in out


def test_more_threads_in_a_forked_child_are_refused_with_the_fix():
    code = SETUP + """
train(0)
pid = os.fork()
if pid == 0:
    try:
        G.ggml_set_n_threads(2)
        os._exit(3)
    except G.GgmlStateError as e:
        os._exit(0 if "'spawn'" in str(e) and "fork" in str(e) else 4)
print("CHILD", os.waitpid(pid, 0)[1] >> 8)
"""
    rc, out, err = run_in_subprocess(code, timeout=60)
    assert rc == 0 and "CHILD 0" in out, out + err


def test_a_child_of_a_process_that_never_started_threads_keeps_its_count():
    code = """
import os
import ggmlpy as G
pid = os.fork()
if pid == 0:
    os._exit(0 if G.ggml_set_n_threads(2) == 2 else 5)
print("CHILD", os.waitpid(pid, 0)[1] >> 8)
"""
    rc, out, err = run_in_subprocess(code, timeout=60)
    assert rc == 0 and "CHILD 0" in out, out + err
