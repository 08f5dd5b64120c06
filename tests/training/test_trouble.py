"""Trouble inside a fit: the exception propagates unchanged (the same object) after every C
resource of the fit was released, so the scheduler takes the next fit."""
from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.compute.sched import Scheduler
from ggmlpy.opt.context import OptContext
from ggmlpy.opt.result import OptResult
from tests.helpers.training_refs import F32, Linear


K, M, N = 3, 2, 4


class Boom(Exception):
    pass


@pytest.fixture
def model(cpu):
    m = Linear(cpu, K, M, N, seed=3)
    yield m
    m.free()


@pytest.fixture
def batches(trng):
    return [(trng.normal(0, 1, (N, K)).astype(np.float32), trng.normal(0, 1, (N, M)).astype(np.float32))
            for _ in range(4)]


def _live():
    """Live opt contexts, results and schedulers, and running prefetch threads."""
    gc.collect()
    handles = sum(1 for o in gc.get_objects() if isinstance(o, (OptContext, OptResult, Scheduler)) and o.alive)
    threads = sum(1 for t in threading.enumerate() if t.name.startswith("ggmlpy-prefetch"))
    return handles, threads


def _raising_after(batches, n, exc):
    """A callable source that raises ``exc`` on call number n + 1."""
    calls = {"n": 0}

    def gen():
        if calls["n"] == n:
            raise exc
        calls["n"] += 1
        return batches[(calls["n"] - 1) % len(batches)]
    return gen


def _fit(model, sched, gen, **kw):
    kw.setdefault("silent", True)
    return G.ggml_fit_opt_gen(sched, model.net.ctx, model.x, model.out, gen, **kw)


def _scheduler_is_free(model, sched, batches):
    """A live static opt context on ``sched`` would make both of these raise."""
    fit = G.ggml_opt_init_for_fit(sched, G.ggml_opt_loss_type_mse(), G.ggml_opt_optimizer_type_adamw(), 1,
                                  model.net.ctx, model.x, model.out)
    fit["opt_ctx"].free()
    h = _fit(model, sched, batches, epochs=2)
    assert len(h) == 2 and np.isfinite(h["train_loss"]).all()


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("where", ["first epoch", "second epoch", "validation", "callback"])
def test_exception_propagates_unchanged_and_frees(where, prefetch, model, tsched, batches):
    before = _live()
    exc = Boom("from the source")
    kw = dict(steps_per_epoch=2, epochs=3, prefetch=prefetch)
    if where == "first epoch":
        gen = _raising_after(batches, 1, exc)
    elif where == "second epoch":
        gen = _raising_after(batches, 3, exc)
    elif where == "validation":
        gen = batches
        kw.update(validation_generator=_raising_after(batches, 1, exc), validation_steps=2)
    else:
        gen = batches

        def on_epoch_end(epoch, logs, state):
            if epoch == 2:
                raise exc
        kw.update(callbacks=[{"on_epoch_end": on_epoch_end}])
    with pytest.raises(Boom) as info:
        _fit(model, tsched, gen, **kw)
    assert info.value is exc
    assert _live() == before  # nothing of the fit is left alive, even while the traceback is held
    _scheduler_is_free(model, tsched, batches)


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("kind", ["callable", "generator function"])
def test_keyboard_interrupt_frees_everything(kind, prefetch, model, tsched, batches):
    before = _live()
    exc = KeyboardInterrupt()
    if kind == "callable":
        gen = _raising_after(batches, 5, exc)
    else:
        def gen():
            yield from batches[:2]
            raise exc
    with pytest.raises(KeyboardInterrupt) as info:
        _fit(model, tsched, gen, steps_per_epoch=3, epochs=3, prefetch=prefetch)
    assert info.value is exc
    assert _live() == before
    _scheduler_is_free(model, tsched, batches)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_bad_batch_mid_run_frees(prefetch, model, tsched, batches):
    before = _live()
    bad = batches[:2] + [(np.zeros(5), batches[0][1])]
    with pytest.raises(ValueError, match="expects 12 values"):
        _fit(model, tsched, bad, prefetch=prefetch)
    assert _live() == before
    _scheduler_is_free(model, tsched, batches)


def test_stop_iteration_from_a_callable_ends_the_epoch(model, tsched, batches):
    """``lambda: next(it)`` behaves like the iterator itself: StopIteration is the end of the data."""
    it = iter(batches[:3])
    with pytest.warns(G.GgmlpyWarning, match="returned None on the first step"):
        h = _fit(model, tsched, lambda: next(it), epochs=2)
    assert list(h["steps"]) == [3]


def test_prefetch_reads_ahead_only_within_the_epoch(model, tsched, batches):
    """prefetch=N never asks the source for more than steps_per_epoch batches per epoch."""
    calls = []

    def gen():
        calls.append(1)
        return batches[len(calls) % len(batches)]

    seen = []

    def on_epoch_end(epoch, logs, state):
        seen.append(len(calls))

    h = _fit(model, tsched, gen, steps_per_epoch=2, epochs=3, prefetch=4, callbacks=[{"on_epoch_end": on_epoch_end}])
    assert list(h["steps"]) == [2, 2, 2]
    assert seen == [2, 4, 6]
    assert _live()[1] == 0


def test_half_built_trainer_is_released(model, tsched, batches, monkeypatch):
    """The validation context fails to build after the training context was: both are released."""
    from ggmlpy.opt.constants import BUILD_FORWARD
    from ggmlpy.training import loop

    real = loop.opt_init

    def failing(sched, *args, **kw):
        if args[6] == BUILD_FORWARD:
            raise Boom("no validation context")
        return real(sched, *args, **kw)

    before = _live()
    monkeypatch.setattr(loop, "opt_init", failing)
    with pytest.raises(Boom) as info:
        _fit(model, tsched, batches, validation_generator=batches)
    monkeypatch.undo()
    assert _live() == before  # while the traceback (and the frames in it) is still held
    assert info.value.args == ("no validation context",)
    _scheduler_is_free(model, tsched, batches)


def test_ctrl_c_while_a_slow_source_is_read_ahead(model, tsched, batches, monkeypatch):
    """Ctrl-C while the prefetch thread is inside a slow generator: KeyboardInterrupt comes out (not
    "generator already executing" from closing it), and the C resources are released."""
    import signal

    from ggmlpy.training import prefetch

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's default handler here")
    monkeypatch.setattr(prefetch, "JOIN_TIMEOUT_S", 0.2)
    release = threading.Event()
    main = threading.main_thread().ident

    def gen():
        yield batches[0]
        signal.pthread_kill(main, signal.SIGINT)  # the user presses Ctrl-C ...
        release.wait(5)                           # ... while the next batch takes long
        yield batches[1]

    before = _live()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            _fit(model, tsched, gen, prefetch=2)
        assert info.value.__context__ is None
        gc.collect()
        assert sum(1 for o in gc.get_objects() if isinstance(o, (OptContext, OptResult, Scheduler)) and o.alive) \
            == before[0]
    finally:
        release.set()
    _scheduler_is_free(model, tsched, batches)


def test_a_scheduler_too_small_for_the_training_graph_raises_not_aborts():
    """ggml aborts when the graph ggml-opt allocates has more nodes + leafs than the scheduler's hash set."""
    from tests.helpers.subprocesses import run_in_subprocess
    rc, out, err = run_in_subprocess(
        "import numpy as np, ggmlpy as G\n"
        "from tests.helpers.training_refs import Linear\n"
        "b = G.ggml_backend_cpu_init()\n"
        "m = Linear(b, 3, 2, 4)\n"
        "batch = (np.zeros((4, 3)), np.zeros((4, 2)))\n"
        "for gs in (8, 30):\n"
        "    s = G.ggml_backend_sched_new([b], parallel=False, graph_size=gs)\n"
        "    try:\n"
        "        G.ggml_fit_opt_gen(s, m.net.ctx, m.x, m.out, [batch], silent=True)\n"
        "    except ValueError as exc:\n"
        "        print('RAISED', exc)\n"
        "s = G.ggml_backend_sched_new([b], parallel=False, graph_size=256)\n"
        "print('TRAINED', len(G.ggml_fit_opt_gen(s, m.net.ctx, m.x, m.out, [batch], silent=True,\n"
        "                                        validation_generator=[batch])))\n")
    assert rc == 0, err[-2000:]
    lines = out.splitlines()
    assert len(lines) == 3 and lines[0].startswith("RAISED") and lines[1].startswith("RAISED"), out
    assert "graph_size" in lines[0] and "too small" in lines[0]
    assert lines[2] == "TRAINED 1"


# ---------------------------------------------------------------- batches must have the tensor's shape (issue 9)

@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("which", ["inputs", "labels"])
def test_a_transposed_batch_is_refused_naming_both_shapes(which, prefetch, model, tsched, batches):
    """x (N, K) = (4, 3) and y (N, M) = (4, 2): their transposes hold as many values, in the wrong order."""
    before = _live()
    x, y = batches[0]
    bad = (x.T, y) if which == "inputs" else (x, y.T)
    with pytest.raises(ValueError) as info:
        _fit(model, tsched, batches[:2] + [bad], prefetch=prefetch)
    msg = str(info.value)
    want, given = ((N, K), (K, N)) if which == "inputs" else ((N, M), (M, N))
    assert which in msg and str(want) in msg and str(given) in msg and "arr.T" in msg, msg
    assert _live() == before
    _scheduler_is_free(model, tsched, batches)


def test_batch_shapes_that_are_still_allowed_train_alike(cpu, tsched, batches):
    """The exact numpy shape, 1-D of nelements and extra leading 1-axes are one and the same batch."""
    forms = {
        "exact": batches,
        "flat": [(x.ravel(), y.ravel()) for x, y in batches],
        "leading 1-axes": [(x[None], y[None, None]) for x, y in batches],
        "lists": [(x.tolist(), y.tolist()) for x, y in batches],
    }
    results = {}
    for name, data in forms.items():
        m = Linear(cpu, K, M, N, seed=3)
        try:
            h = _fit(m, tsched, data, epochs=2)
            results[name] = (list(h["train_loss"]), m.params())
        finally:
            m.free()
    ref_loss, ref_params = results["exact"]
    for name, (loss, params) in results.items():
        np.testing.assert_array_equal(loss, ref_loss, err_msg=name)
        for k in ref_params:
            np.testing.assert_array_equal(params[k], ref_params[k], err_msg=name)


def _writer(cpu, x_shape, x_type, y_shape=None, bound=None):
    from ggmlpy.graph.nodes import ptr_key
    from ggmlpy.training.adapters import BatchWriter
    from tests.helpers.training_refs import Net
    net = Net(cpu)
    x = net.leaf(x_shape, dtype=x_type)
    y = net.leaf(y_shape) if y_shape else None
    net.alloc()
    bounds = {} if bound is None else {ptr_key(x.ptr): bound}
    return net, BatchWriter("fit", [x], [y] if y is not None else [], [], bounds)


@pytest.mark.parametrize("bad,match", [
    (np.zeros((3, 5)), r"\(5, 3\).*\(3, 5\).*arr\.T"),          # transposed
    (np.zeros((1, 5, 1, 3)), r"\(5, 3\)"),                        # an inner 1-axis changes the shape
    (np.zeros((15, 1)), r"reshape\(-1\)"),                        # a column of the right count
    (np.zeros(14), r"expects 15 values"),
    (np.zeros((5, 3), dtype=np.complex64), r"complex"),
    (np.full((5, 3), 1e39), r"inf"),                              # float64 that overflows F32
])
def test_batch_writer_refuses(cpu, bad, match):
    net, w = _writer(cpu, (5, 3), F32)
    try:
        with pytest.raises((ValueError, TypeError), match=match):
            w.parse(bad)
        assert w.parse(np.zeros((5, 3)))[0][1].shape == (15,)
    finally:
        net.free()


def test_batch_writer_complex_is_a_type_error(cpu):
    net, w = _writer(cpu, (5, 3), F32)
    try:
        with pytest.raises(TypeError, match="complex"):
            w.parse(np.zeros((5, 3), dtype=np.complex128))
    finally:
        net.free()


@pytest.mark.parametrize("shape", [(5, 3), (15,), (1, 5, 3), (1, 15)])
def test_batch_writer_allows(cpu, shape):
    net, w = _writer(cpu, (5, 3), F32)
    try:
        arr = np.arange(15, dtype=np.float64).reshape(shape)
        ((target, out),) = w.parse(arr)
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out, np.arange(15))
    finally:
        net.free()


def test_batch_writer_column_labels_for_a_one_wide_tensor(cpu):
    """Labels (N,) or (N, 1) for a [1, N] tensor (numpy (N, 1)) are both fine: the same values in order."""
    net, w = _writer(cpu, (4, 2), F32, y_shape=(4, 1))
    try:
        x = np.zeros((4, 2))
        for y in (np.arange(4.0), np.arange(4.0)[:, None], np.arange(4.0)[None]):
            pairs = w.parse((x, y))
            np.testing.assert_array_equal(pairs[1][1], np.arange(4))
    finally:
        net.free()


def test_batch_writer_keeps_its_integer_checks(cpu):
    """Integer inputs (token ids): floats refused, the type's range and get_rows bounds checked, after the shape."""
    I32 = G.GGML_TYPE_I32
    net, w = _writer(cpu, (2, 3), I32, bound=10)
    try:
        ok = np.arange(6).reshape(2, 3)
        np.testing.assert_array_equal(w.parse(ok)[0][1], np.arange(6))
        with pytest.raises(ValueError, match=r"arr\.T"):
            w.parse(ok.T)
        with pytest.raises(ValueError, match="integer tensor"):
            w.parse(ok.astype(np.float32))
        with pytest.raises(ValueError, match=r"\[0, 10\)"):
            w.parse(ok + 5)
    finally:
        net.free()
    net, w = _writer(cpu, (2, 3), I32)
    try:
        with pytest.raises(ValueError, match="outside"):
            w.parse(np.full((2, 3), 2 ** 40 + 5))
        np.testing.assert_array_equal(w.parse(np.ones((2, 3), dtype=bool))[0][1], np.ones(6))
    finally:
        net.free()


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_prefetch_reads_the_source_in_a_background_thread_exactly_when_asked(model, tsched, batches, prefetch):
    """prefetch=N makes the batches in a background thread (the main one computes meanwhile); 0 in the main thread.
    A field added to the epoch plan once shifted ggml_fit_opt_gen's positional prefetch into another field: every
    prefetch ran as 0, with the same results and no error."""
    threads = []

    def gen():
        for b in batches:
            threads.append(threading.current_thread() is threading.main_thread())
            yield b
    _fit(model, tsched, gen, epochs=2, prefetch=prefetch)
    assert threads and all(threads) == (prefetch == 0) and (prefetch == 0 or not any(threads)), threads


@pytest.mark.parametrize("prefetch", [0, 2])
def test_the_model_layers_generator_fit_prefetches_when_asked(prefetch):
    rng = np.random.default_rng(0)
    m = G.ggml_compile(G.ggml_layer_dense(G.ggml_model_sequential(), 2, input_shape=(3,)), loss="mse", backend="cpu")
    threads = []

    def gen():
        for _ in range(3):
            threads.append(threading.current_thread() is threading.main_thread())
            yield rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32)
    G.ggml_fit_generator(m, gen, epochs=2, verbose=0, prefetch=prefetch)
    # the first batch is read in the main thread: the model layer sizes its graphs from it
    assert len(threads) == 6 and threads[0] and all(threads) == (prefetch == 0), threads
    assert prefetch == 0 or not any(threads[1:]), threads
