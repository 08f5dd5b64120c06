"""The step timer of the training loops (``compute.threads.ThreadTuner``), on a simulated clock: which thread
count it runs each step with when two threads are faster (a quiet machine), when one is (cores shared with a
busy process), when a competitor starts in the middle, and that it stays out of the way of a count the user set.
The wall-clock behaviour is measured by benchmarks/bench_shared_cores.py."""
from __future__ import annotations

import time
import types

import pytest

import ggmlpy as G
from ggmlpy.compute import threads as policy


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def cpu(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(policy, "time", types.SimpleNamespace(perf_counter=clock.perf_counter, sleep=time.sleep))
    monkeypatch.setattr(policy, "cpu_sample", lambda: (0, 0, 0))
    monkeypatch.setattr(policy, "cores_busy_since", lambda before: 0.0)
    monkeypatch.setattr(policy, "threads_set_by_user", lambda: False)  # whatever other tests set
    b = G.ggml_backend_cpu_init()
    policy.set_backend_threads(b, 2)
    yield b, clock
    b.free()


def _run(tuner, backend, clock, cost, steps):
    """Step ``steps`` times, each costing ``cost(step, threads)`` seconds; returns the thread count of each."""
    used = []
    for i in range(steps):
        started = tuner.before_step()
        used.append(backend.n_threads)
        clock.now += cost(i, backend.n_threads)
        tuner.after_step(started)
    return used


def test_a_quiet_machine_keeps_two_threads_and_rarely_probes(cpu):
    backend, clock = cpu
    tuner = policy.ThreadTuner([backend])
    used = _run(tuner, backend, clock, lambda i, n: 0.010 if n == 2 else 0.018, 2000)
    assert used[-1] == 2 and tuner.current == "wide"
    extra = used.count(1) * (0.018 - 0.010)
    assert extra < 0.02 * 0.010 * len(used)  # the probes cost about 1% of the training


def test_shared_cores_switch_to_one_thread_within_a_few_steps(cpu):
    backend, clock = cpu
    tuner = policy.ThreadTuner([backend])
    used = _run(tuner, backend, clock, lambda i, n: 0.300 if n == 2 else 0.007, 1000)
    assert all(n == 1 for n in used[6:50])
    assert used.count(2) < 8  # the first steps and a few probes, no more
    slow = sum(0.300 - 0.007 for n in used[6:] if n == 2)
    assert slow < 0.05 * 0.007 * len(used) + 0.3  # probing costs about 5% of the training


def test_a_competitor_that_starts_or_stops_is_followed(cpu):
    backend, clock = cpu
    tuner = policy.ThreadTuner([backend])

    def cost(i, n):
        busy = 200 <= i < 700
        return (0.150 if n == 2 else 0.012) if busy else (0.008 if n == 2 else 0.012)
    used = _run(tuner, backend, clock, cost, 1400)
    assert used[150:200].count(2) == 50          # quiet: two threads
    assert used[230:690].count(1) > 440          # busy: one thread soon after it started
    assert used[-100:].count(2) == 100           # quiet again: back to two threads


def test_a_fit_started_beside_a_busy_core_goes_to_one_thread_after_its_warm_up(cpu, monkeypatch):
    """The load is measured over the warm-up steps (no wait before the first step): a busy core found there
    sends the steps after them to one thread, and the first wide probe waits long (one costs 40 narrow steps)."""
    backend, clock = cpu
    monkeypatch.setattr(policy, "cores_busy_since", lambda before: 1.0)
    tuner = policy.ThreadTuner([backend])
    used = _run(tuner, backend, clock, lambda i, n: 0.300 if n == 2 else 0.007, 200)
    assert used[:policy.ThreadTuner.WARMUP] == [2] * policy.ThreadTuner.WARMUP and used.count(2) == tuner.WARMUP


def test_a_backend_whose_count_the_user_set_is_left_alone(cpu, monkeypatch):
    """ggml_backend_cpu_set_n_threads on one backend: the tuner, the split and the small-graph rule keep it."""
    backend, clock = cpu
    G.ggml_backend_cpu_set_n_threads(backend, 2)
    tuner = policy.ThreadTuner([backend])
    assert not tuner.enabled
    used = _run(tuner, backend, clock, lambda i, n: 0.300 if n == 2 else 0.007, 50)
    assert set(used) == {2}
    small = policy.StepWork(1e3, 0.0, 10.0)   # a graph the rules would give one thread
    before = policy.split_threads([backend], small)
    assert backend.n_threads == 2
    policy.restore_threads(before)
    assert policy.threads_for(backend, 1e3) == 2 and backend.n_threads == 2


def test_a_count_set_by_the_user_is_left_alone(cpu, monkeypatch):
    backend, clock = cpu
    monkeypatch.setattr(policy, "threads_set_by_user", lambda: True)
    tuner = policy.ThreadTuner([backend])
    assert not tuner.enabled
    used = _run(tuner, backend, clock, lambda i, n: 0.300 if n == 2 else 0.007, 50)
    assert set(used) == {2}


def test_cores_busy_since_reads_the_machine():
    before = policy.cpu_sample()
    time.sleep(0.05)
    busy = policy.cores_busy_since(before) if before is not None else None
    assert busy is None or 0.0 <= busy <= (__import__("os").cpu_count() or 1)
