"""Fixtures of the training tests (tests/training): one CPU backend, a fresh scheduler per test."""
from __future__ import annotations

import numpy as np
import pytest



@pytest.fixture
def cpu(backend):
    """The session's CPU backend (tests/conftest.py: one thread)."""
    return backend


@pytest.fixture
def tsched(sched):
    return sched


@pytest.fixture
def trng():
    return np.random.default_rng(20240607)
