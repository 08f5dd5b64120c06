"""What the benchmarks that compare sides in fresh processes share (``bench_vs_torch.py``, ``bench_gpu.py``, the
loop benchmarks).

- ``run_json_worker``: one measurement in a fresh subprocess, whose last line of output is a JSON object;
- ``rotated``: the order of the sides in a round (A B C, then B C A, ...), so that background load hits
  every side alike;
- ``best_median``: the best and median of a side's runs (the best run is the least disturbed);
- ``alternated_pairs`` and ``pair_ratios``: two kinds of run alternated in fresh processes, and the median of the
  per-pair ratios (``bench_seed_loop.py``, ``bench_model_loop.py``);
- ``torch_missing``: why PyTorch cannot be imported here (None when it can).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence


def run_json_worker(cmd: Sequence[str], threads: int | None = None, env: dict | None = None,
                    timeout: float = 1800) -> dict:
    """Run ``cmd`` (``OMP_NUM_THREADS=threads`` and ``env`` added to this environment) and return the JSON
    object on the last line of its output; a failure raises with the tail of its output."""
    full_env = dict(os.environ)
    if threads is not None:
        full_env["OMP_NUM_THREADS"] = str(threads)
    full_env.update(env or {})
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=full_env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def alternated_pairs(script: str, kinds: Sequence[str], args: Sequence[str], pairs: int) -> dict[str, list[float]]:
    """Run ``script --one <kind> *args`` in a fresh process for each kind in turn, ``pairs`` times (A B A B ...);
    each prints its samples/s last. Returns each kind's rates, in run order."""
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(pairs):
        for kind in kinds:
            out = subprocess.run([sys.executable, script, "--one", kind, *args], capture_output=True, text=True,
                                 check=True)
            rates[kind].append(float(out.stdout.split()[-1]))
    return rates


def pair_ratios(base: Sequence[float], other: Sequence[float], label: str, target: float) -> dict:
    """Print and return the per-pair ratios other / base, their median and the best runs' ratio."""
    pairs = [o / b for b, o in zip(base, other)]
    median, best = statistics.median(pairs), max(other) / max(base)
    print(f"{label} per pair: {', '.join(f'{p:.3f}' for p in pairs)}; median {median:.3f}, best runs {best:.3f} "
          f"(target >= {target})")
    return {"pairs": pairs, "median": median, "best": best, "target": target}


def rotated(sides: Sequence[str], round_index: int) -> list[str]:
    """The sides in the order of round ``round_index`` (0-based): rotated by one each round."""
    sides = list(sides)
    k = round_index % len(sides)
    return sides[k:] + sides[:k]


def best_time(fn: Callable[[], object], rounds: int) -> float:
    """The shortest of ``rounds`` timed calls of ``fn`` (seconds), after one untimed call (graphs built, caches
    warm)."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def best_median(values: Sequence[float], larger_is_better: bool = True) -> dict:
    """``{"best", "median", "runs"}`` of one side's runs (best = largest rate, or smallest time)."""
    values = list(values)
    return {"best": max(values) if larger_is_better else min(values), "median": statistics.median(values),
            "runs": values}


def torch_missing() -> str | None:
    """None when ``import torch`` works in this interpreter, else why not (not installed, or it fails to load)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "PyTorch is not installed"
    except Exception as exc:  # noqa: BLE001 - a broken install (missing shared libraries) counts as absent
        return f"PyTorch does not load ({type(exc).__name__}: {exc})"
    return None
