"""Fuzzing ggmlpy's public API in subprocesses: nothing a Python caller does may kill the interpreter
(crash), run forever (hang), let a non-ggmlpy exception escape (leak) or compute something else than
numpy (wrong).

Hypothesis generates the cases (strategies.py); they run in batches in worker processes (runner.py),
where a crash or hang is pinned on the case that was running and confirmed by running it alone. By
default a small deterministic subset runs (about a minute in all); ``GGMLPY_FUZZ=long`` runs many more
with a random seed and prints the counts per family at the end::

    GGMLPY_FUZZ=long GGMLPY_FUZZ_CASES=1500 python -m pytest tests/fuzz -p no:cacheprovider -q

Every failure message carries a reproducer: ``python -m tests.fuzz.worker --case '<json>'``.
"""
from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, HealthCheck, Phase, seed, settings

from tests.fuzz import conftest
from tests.fuzz.runner import run_cases
from tests.fuzz.strategies import FAMILIES


LONG = os.environ.get("GGMLPY_FUZZ", "") == "long"
# cases per family in the quick run (sized for about 60 s in all on a 2-core machine) and the long one
QUICK = {"api": 150, "tensor": 60, "data": 60, "ops": 30, "gguf": 60, "fit": 20}
LONG_CASES = int(os.environ.get("GGMLPY_FUZZ_CASES", "600"))
SEED = int(os.environ.get("GGMLPY_FUZZ_SEED", str(random.randrange(1 << 30)))) if LONG else 0
# seconds a case may run before it counts as a hang (a fit case trains a few epochs)
CASE_TIMEOUT = {"fit": 60.0}


def generate(family: str, n: int) -> list[dict]:
    """``n`` cases of a family, drawn by hypothesis (deterministic in the quick run)."""
    cases: list[dict] = []

    @seed(SEED)
    @settings(max_examples=n, database=None, derandomize=not LONG, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(FAMILIES[family]())
    def collect(case):
        cases.append(case)

    collect()
    return cases[:n]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fuzz(family):
    n = LONG_CASES if LONG else QUICK[family]
    cases = generate(family, n)
    report = run_cases(cases, case_timeout=CASE_TIMEOUT.get(family, 30.0), batch=200 if LONG else 400)
    counts = report.counts()
    conftest.COUNTS[family] = {k: conftest.COUNTS.get(family, {}).get(k, 0) + v for k, v in counts.items()}
    if LONG:
        print(f"\n{family} (seed {SEED}): {counts}")
    bad = report.bad
    assert not bad, (f"{len(bad)} of {len(cases)} {family} cases failed (seed {SEED}):\n"
                     + "\n".join(str(o) for o in bad[:20]))
