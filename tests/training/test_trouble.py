"""Trouble inside a fit: the exception propagates unchanged (the same object) after every C
resource of the fit was released, so the scheduler takes the next fit."""
from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.opt import OptContext, OptResult
from ggmlpy.sched import Scheduler

from .helpers import Linear

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
    from ggmlpy.training import loop

    real = loop.O._opt_init

    def failing(sched, *args, **kw):
        if args[6] == loop.O.BUILD_FORWARD:
            raise Boom("no validation context")
        return real(sched, *args, **kw)

    before = _live()
    monkeypatch.setattr(loop.O, "_opt_init", failing)
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
    from tests.conftest import run_in_subprocess
    rc, out, err = run_in_subprocess(
        "import numpy as np, ggmlpy as G\n"
        "from tests.training.helpers import Linear\n"
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
