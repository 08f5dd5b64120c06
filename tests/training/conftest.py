"""Fixtures of the training tests (tests/training): one CPU backend, a fresh scheduler per test."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G


@pytest.fixture(scope="session")
def cpu():
    """One CPU backend for the training tests, one thread: the models are tiny, and on a busy 2-core
    machine two spinning threads made the whole set about 5 times slower."""
    b = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(b, 1)
    yield b
    b.free()


@pytest.fixture
def tsched(cpu):
    s = G.ggml_backend_sched_new([cpu], parallel=False, graph_size=512)
    yield s
    s.free()


@pytest.fixture
def trng():
    return np.random.default_rng(20240607)
