"""Handle lifetimes: idempotent free, use after free raises RuntimeError, `with` blocks, parents
kept alive, and the scheduler's CPU-last rule."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import ggmlpy as G


def _small_ctx(no_alloc=True):
    return G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(32) + 4096, no_alloc=no_alloc)


# ---------------------------------------------------------------- free is idempotent

def test_free_functions_are_idempotent():
    ctx = _small_ctx()
    G.ggml_free(ctx)
    G.ggml_free(ctx)          # a second free is a no-op
    ctx.free()
    assert not ctx.alive

    b = G.ggml_backend_cpu_init()
    s = G.ggml_backend_sched_new([b], parallel=False, graph_size=32)
    G.ggml_backend_sched_free(s)
    G.ggml_backend_sched_free(s)
    G.ggml_backend_free(b)
    G.ggml_backend_free(b)
    b.free()
    assert not b.alive and not s.alive


def test_buffer_free_is_idempotent(backend):
    ctx = _small_ctx()
    G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 8)
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    G.ggml_backend_buffer_free(buf)
    G.ggml_backend_buffer_free(buf)
    buf.free()
    ctx.free()


def test_free_functions_still_check_the_kind():
    with pytest.raises(TypeError):
        G.ggml_free("not a context")
    with pytest.raises(TypeError):
        G.ggml_backend_free(_small_ctx())


def test_finalizer_frees_what_the_user_forgot():
    ctx = _small_ctx()
    finalizer = ctx._finalizer
    assert finalizer.alive
    del ctx
    gc.collect()
    assert not finalizer.alive


# ---------------------------------------------------------------- use after free

def test_tensor_of_a_freed_context_raises():
    ctx = _small_ctx(no_alloc=False)
    t = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 2)
    G.ggml_backend_tensor_set_data(t, np.ones(6))
    g = G.ggml_new_graph_custom(ctx, 32)
    ctx.free()
    for call in (lambda: G.ggml_tensor_shape(t), lambda: G.ggml_backend_tensor_get_data(t),
                 lambda: G.ggml_backend_tensor_set_data(t, np.ones(6)), lambda: G.ggml_nelements(t),
                 lambda: G.ggml_set_param(t), lambda: G.ggml_build_forward_expand(g, t),
                 lambda: G.ggml_graph_n_nodes(g), lambda: G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 1)):
        with pytest.raises(RuntimeError, match="freed"):
            call()
    assert "freed" in repr(t)


def test_op_with_a_tensor_of_a_freed_context_raises():
    old, new = _small_ctx(no_alloc=False), _small_ctx()
    t = G.ggml_new_tensor_1d(old, G.GGML_TYPE_F32, 4)
    old.free()
    with pytest.raises(RuntimeError, match="freed"):
        G.ggml_relu(new, t)
    with pytest.raises(RuntimeError, match="freed"):
        G.ggml_add(new, G.ggml_new_tensor_1d(new, G.GGML_TYPE_F32, 4), t)
    new.free()


def test_freed_backend_raises():
    b = G.ggml_backend_cpu_init()
    b.free()
    for call in (lambda: G.ggml_backend_name(b), lambda: G.ggml_backend_is_cpu(b),
                 lambda: G.ggml_backend_cpu_set_n_threads(b, 1), lambda: G.ggml_backend_synchronize(b),
                 lambda: G.ggml_backend_sched_new([b]), lambda: G.ggml_backend_alloc_ctx_tensors(_small_ctx(), b)):
        with pytest.raises(RuntimeError, match="freed"):
            call()
    assert "freed" in repr(b)


def test_scheduler_after_its_backend_was_freed_raises():
    b = G.ggml_backend_cpu_init()
    s = G.ggml_backend_sched_new([b], parallel=False, graph_size=32)
    ctx = _small_ctx()
    x = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
    g = G.ggml_new_graph_custom(ctx, 32)
    G.ggml_build_forward_expand(g, G.ggml_relu(ctx, x))
    b.free()
    for call in (lambda: G.ggml_backend_sched_alloc_graph(s, g), lambda: G.ggml_backend_sched_graph_compute(s, g),
                 lambda: G.ggml_backend_sched_reset(s), lambda: G.ggml_backend_sched_get_n_backends(s),
                 lambda: G.ggml_backend_sched_reserve(s, g)):
        with pytest.raises(RuntimeError, match="freed"):
            call()
    ctx.free()


def test_buffer_freed_then_tensor_data_raises(backend):
    ctx = _small_ctx()
    t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    G.ggml_backend_tensor_set_data(t, [1, 2, 3, 4])
    buf.free()
    with pytest.raises(RuntimeError):
        G.ggml_backend_tensor_set_data(t, [1, 2, 3, 4])
    with pytest.raises(RuntimeError):
        G.ggml_backend_tensor_get_data(t)
    with pytest.raises(RuntimeError, match="freed"):
        G.ggml_backend_buffer_get_size(buf)
    # the context itself is still usable: allocate its tensors again
    buf2 = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    G.ggml_backend_tensor_set_data(t, [5, 6, 7, 8])
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), [5, 6, 7, 8])
    buf2.free()
    ctx.free()


def test_freeing_a_backend_frees_its_buffers_and_detaches_tensors():
    b = G.ggml_backend_cpu_init()
    ctx = _small_ctx()
    t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, b)
    G.ggml_backend_tensor_set_data(t, [1, 2, 3, 4])
    b.free()
    assert not buf.alive
    with pytest.raises(RuntimeError):
        G.ggml_backend_tensor_get_data(t)
    ctx.free()


# ---------------------------------------------------------------- parents are kept alive

def test_tensor_keeps_its_context_alive():
    def make():
        ctx = _small_ctx(no_alloc=False)
        t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 3)
        G.ggml_backend_tensor_set_data(t, [1, 2, 3])
        return t                      # the only reference to the context is the tensor's
    t = make()
    gc.collect()
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), [1, 2, 3])


def test_buffer_lives_as_long_as_its_context():
    b = G.ggml_backend_cpu_init()

    def make():
        ctx = _small_ctx()
        t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 3)
        G.ggml_backend_alloc_ctx_tensors(ctx, b)      # the buffer is not kept by the caller
        return t
    t = make()
    gc.collect()
    G.ggml_backend_tensor_set_data(t, [4, 5, 6])
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), [4, 5, 6])
    b.free()


# ---------------------------------------------------------------- with blocks

def test_with_blocks_free_on_exit():
    with G.ggml_init(1 << 20) as ctx, G.ggml_backend_cpu_init() as b:
        with G.ggml_backend_sched_new([b], parallel=False, graph_size=16) as s:
            assert s.alive and b.alive and ctx.alive
            t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 2)
        assert not s.alive and b.alive
    assert not ctx.alive and not b.alive
    with pytest.raises(RuntimeError):
        G.ggml_tensor_shape(t)


def test_with_block_frees_on_exception():
    with pytest.raises(KeyError):
        with G.ggml_init(1 << 20) as ctx:
            raise KeyError("boom")
    assert not ctx.alive


# ---------------------------------------------------------------- scheduler: CPU last

def test_scheduler_with_only_cpu_does_not_duplicate_it(backend):
    s = G.ggml_backend_sched_new([backend], parallel=False, graph_size=16)
    assert G.ggml_backend_sched_get_n_backends(s) == 1
    assert G.ggml_backend_sched_get_backend(s, 0) is backend
    s.free()
    s = G.ggml_backend_sched_new(backend, parallel=False, graph_size=16)   # a bare backend works too
    assert G.ggml_backend_sched_get_n_backends(s) == 1
    s.free()
    assert backend.alive       # the caller's backend is not the scheduler's to free


def test_scheduler_appends_an_owned_cpu_when_the_last_backend_is_not_cpu():
    # There is no GPU here: pose a CPU backend as a non-CPU one to exercise the Python rule.
    gpu_like = G.ggml_backend_cpu_init()
    gpu_like.is_cpu = False
    s = G.ggml_backend_sched_new([gpu_like], parallel=False, graph_size=16)
    assert G.ggml_backend_sched_get_n_backends(s) == 2
    appended = G.ggml_backend_sched_get_backend(s, 1)
    assert appended is not gpu_like and G.ggml_backend_is_cpu(appended)
    # the scheduler works with it
    ctx = _small_ctx()
    x = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 3)
    G.ggml_set_input(x)
    y = G.ggml_set_output(G.ggml_scale(ctx, x, 2.0))
    g = G.ggml_new_graph_custom(ctx, 32)
    G.ggml_build_forward_expand(g, y)
    G.ggml_backend_sched_alloc_graph(s, g)
    G.ggml_backend_tensor_set_data(x, [1, 2, 3])
    G.ggml_backend_sched_graph_compute(s, g)
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(y), [2, 4, 6])
    s.free()
    assert not appended.alive      # owned by the scheduler, freed with it
    assert gpu_like.alive
    ctx.free()
    gpu_like.free()


def test_scheduler_refuses_cpu_not_last():
    cpu = G.ggml_backend_cpu_init()
    gpu_like = G.ggml_backend_cpu_init()
    gpu_like.is_cpu = False
    with pytest.raises(ValueError, match="last"):
        G.ggml_backend_sched_new([cpu, gpu_like])
    with pytest.raises(ValueError):
        G.ggml_backend_sched_new([])
    cpu.free()
    gpu_like.free()


def test_context_memory_graph_compute():
    """ggml_graph_compute runs a graph whose tensors live in a no_alloc=False context."""
    with G.ggml_init(1 << 20) as ctx:
        a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 2)
        G.ggml_backend_tensor_set_data(a, [[1, -2, 3], [-4, 5, -6]])
        y = G.ggml_sum_rows(ctx, G.ggml_relu(ctx, a))
        g = G.ggml_new_graph(ctx)
        G.ggml_build_forward_expand(g, y)
        G.ggml_graph_compute(ctx, g)
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(y), [4, 5])
    with G.ggml_init(1 << 20, no_alloc=True) as ctx:
        g = G.ggml_new_graph(ctx)
        with pytest.raises(RuntimeError, match="no_alloc"):
            G.ggml_graph_compute(ctx, g)


# ---------------------------------------------------------------- in use: never freed under a running call

def test_a_handle_in_use_cannot_be_freed_nor_its_parents():
    from ggmlpy.core.handle import using
    b = G.ggml_backend_cpu_init()
    s = G.ggml_backend_sched_new([b], parallel=False, graph_size=32)
    with using([s], "a test call"):
        for free in (lambda: G.ggml_backend_sched_free(s), lambda: G.ggml_backend_free(b)):
            with pytest.raises(G.GgmlInUseError, match="in use by a test call"):
                free()
        assert s.alive and b.alive          # nothing was freed
    G.ggml_backend_free(b)                  # afterwards: frees the scheduler first, as before
    assert not s.alive and not b.alive
    with pytest.raises(RuntimeError, match="freed"):
        with using([s], "a test call"):
            pass


_EPOCH_PRELUDE = """
import warnings
import numpy as np, ggmlpy as G
be = G.ggml_backend_cpu_init(); G.ggml_backend_cpu_set_n_threads(be, 1)
sched = G.ggml_backend_sched_new([be], parallel=False)
cs = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
x = G.ggml_set_input(G.ggml_new_tensor_2d(cs, G.GGML_TYPE_F32, 4, 8))
W = G.ggml_set_param(G.ggml_new_tensor_2d(cs, G.GGML_TYPE_F32, 4, 1))
buf = G.ggml_backend_alloc_ctx_tensors(cs, be)
G.ggml_backend_tensor_set_data(W, np.zeros(4))
cc = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
out = G.ggml_mul_mat(cc, W, x)
ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 1, 64)
X = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), X)
G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), X @ np.array([[1.0], [2.0], [3.0], [4.0]], np.float32))
opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), ctx_compute=cc, inputs=x, outputs=out)
res = G.ggml_opt_result_init()
"""


def test_epoch_callbacks_cannot_free_or_reallocate_what_the_epoch_uses():
    """A callback of ggml_opt_epoch that frees the opt context, its scheduler, backend, contexts or buffers,
    the dataset or the result, or that allocates/evaluates the context itself, is refused: the refusal
    stops the epoch after that batch and reaches the caller; everything stays usable."""
    from tests.helpers.subprocesses import run_in_subprocess
    code = _EPOCH_PRELUDE + """
attempts = {
    "opt": lambda: G.ggml_opt_free(opt), "sched": lambda: G.ggml_backend_sched_free(sched),
    "backend": lambda: G.ggml_backend_free(be), "result": lambda: G.ggml_opt_result_free(res),
    "dataset": lambda: G.ggml_opt_dataset_free(ds), "ctx": lambda: G.ggml_free(cc), "weights": lambda: G.ggml_free(cs),
    "buffer": lambda: G.ggml_backend_buffer_free(buf), "alloc": lambda: G.ggml_opt_alloc(opt, True),
    "eval": lambda: G.ggml_opt_eval(opt, res), "reset": lambda: G.ggml_opt_reset(opt, True),
    "epoch": lambda: G.ggml_opt_epoch(opt, ds, None, None, -1, False, False),
}
for name, attempt in attempts.items():
    calls = []
    def cb(train, ibatch, ibatch_max, t_start, result):
        calls.append(ibatch)
        if ibatch == 2:
            attempt()
    try:
        G.ggml_opt_epoch(opt, ds, res, None, -1, cb, False)
        raise AssertionError(f"{name}: the refusal did not reach the caller")
    except G.GgmlInUseError as exc:
        assert "in use by ggml_opt_epoch" in str(exc), (name, str(exc))
    assert calls == [1, 2], (name, calls)  # the callback's error stops the epoch after its batch
    assert all(h.alive for h in (opt, sched, be, res, ds, cc, cs, buf)), name
G.ggml_opt_result_reset(res)
G.ggml_opt_epoch(opt, ds, res, None, -1, False, False)
assert G.ggml_opt_result_ndata(res) == 64
for h in (res, opt, ds, buf, cc, cs, sched, be):
    h.free()
print("OK")
"""
    rc, out, err = run_in_subprocess(code, timeout=120)
    assert rc == 0 and "OK" in out, err[-2500:]


def test_nothing_a_fit_uses_can_be_freed_from_another_thread():
    """While ggml_fit_opt_gen runs in one thread, freeing its scheduler, backend, model contexts, buffer or
    dataset-less inputs from another is refused (ggml would run on freed memory); afterwards it works."""
    from tests.helpers.subprocesses import run_in_subprocess
    code = _EPOCH_PRELUDE + """
import threading, time
G.ggml_opt_free(opt)   # the fit builds its own opt context on sched
started, release = threading.Event(), threading.Event()
def batches():
    for i in range(6):
        if i == 2:
            started.set()
            release.wait(30)
        yield X[:8], X[:8] @ np.ones((4, 1), np.float32)
errors = []
def run():
    try:
        G.ggml_fit_opt_gen(sched, cc, x, out, batches, epochs=1, silent=True)
    except BaseException as e:
        errors.append(e)
t = threading.Thread(target=run); t.start()
assert started.wait(30)
for name, free in {"sched": lambda: G.ggml_backend_sched_free(sched), "backend": lambda: G.ggml_backend_free(be),
                   "ctx": lambda: G.ggml_free(cc), "weights": lambda: G.ggml_free(cs),
                   "buffer": lambda: G.ggml_backend_buffer_free(buf)}.items():
    try:
        free()
    except G.GgmlInUseError as e:
        assert "in use by a fit" in str(e), e
    else:
        raise AssertionError(f"freeing {name} during the fit was allowed")
release.set(); t.join(60)
assert not t.is_alive() and not errors, errors
for h in (cc, buf, cs, sched, be):
    h.free()
print("OK")
"""
    rc, out, err = run_in_subprocess(code, timeout=120)
    assert rc == 0 and "OK" in out, err[-2500:]


def test_a_prefetch_generator_cannot_free_the_scheduler():
    """A generator that frees the scheduler (here from the prefetch thread) gets GgmlInUseError, which ends
    the fit as a generator's exception does; nothing is freed under ggml."""
    from tests.helpers.subprocesses import run_in_subprocess
    code = _EPOCH_PRELUDE + """
G.ggml_opt_free(opt)
def batches():
    for i in range(6):
        if i == 3:
            G.ggml_backend_sched_free(sched)
        yield X[:8], X[:8] @ np.ones((4, 1), np.float32)
try:
    G.ggml_fit_opt_gen(sched, cc, x, out, batches, epochs=2, silent=True, prefetch=2)
except G.GgmlInUseError as e:
    print("REFUSED", e)
assert sched.alive
G.ggml_fit_opt_gen(sched, cc, x, out, [(X[:8], X[:8] @ np.ones((4, 1), np.float32))], epochs=1, silent=True)
print("OK")
"""
    rc, out, err = run_in_subprocess(code, timeout=120)
    assert rc == 0 and "REFUSED" in out and "OK" in out, out[-1000:] + err[-2500:]


def test_one_opt_context_per_scheduler_even_from_racing_threads(backend):
    """The check that a scheduler serves no live opt context and the creation of one are a single step:
    of two threads building one at the same moment, exactly one succeeds."""
    import threading
    sched = G.ggml_backend_sched_new([backend], parallel=False)
    cs = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(cs, G.GGML_TYPE_F32, 4, 8))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(cs, G.GGML_TYPE_F32, 4, 1))
    buf = G.ggml_backend_alloc_ctx_tensors(cs, backend)
    cc = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    out = G.ggml_mul_mat(cc, w, x)
    try:
        for _ in range(15):
            barrier, made, refused = threading.Barrier(2), [], []

            # the threads run and are joined within this iteration: the closure reads this iteration's variables
            def build():
                barrier.wait()  # noqa: B023
                try:
                    made.append(G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), ctx_compute=cc, inputs=x,  # noqa: B023
                                                outputs=out))
                except G.GgmlStateError as e:
                    refused.append(e)  # noqa: B023
            threads = [threading.Thread(target=build) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(made) == 1 and len(refused) == 1, (made, refused)
            assert "already serves" in str(refused[0])
            made[0].free()
    finally:
        for h in (cc, buf, cs, sched):
            h.free()


def test_ctrl_c_inside_a_step_waits_for_its_end():
    """A Ctrl-C that lands between ggml_opt_alloc and ggml_opt_eval is raised once the step is done (an alloc
    without its eval would leave the opt context unusable); outside a step it is raised at once."""
    import os
    import signal

    from ggmlpy.core.handle import InterruptGuard
    done = []
    with pytest.raises(KeyboardInterrupt):
        with InterruptGuard() as guard:
            with guard.step:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):   # the handler has run by now: it only took note
                    pass
                done.append("step finished")
            done.append("not reached")
    assert done == ["step finished"]
    with pytest.raises(KeyboardInterrupt):
        with InterruptGuard():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            done.append("not reached either")
    assert done == ["step finished"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
