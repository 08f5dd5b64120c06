"""What compiled metrics cost a fit: samples/s with ``metrics=["accuracy"]`` against the same fit with
``["accuracy", "auc", "precision", "recall", "mae"]`` (each step copies its outputs to the host and adds them to
the metrics' sums in numpy), measured in the same process with the runs alternated.

    python benchmarks/bench_metrics.py [--reps 4] [--quick] [--json PATH]

Model: MNIST-FC-sized (784-128-10, ReLU, softmax, sparse categorical cross-entropy, Adam), batch 128, CPU,
synthetic data. Target: the fit with the four extra metrics keeps at least 80% of the samples/s (fastest run
of each kind).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import ggmlpy as g


EXTRA = ["accuracy", "auc", "precision", "recall", "mae"]
TARGET = 0.8


def fit_seconds(x: np.ndarray, y: np.ndarray, metrics: list[str], epochs: int, batch: int) -> float:
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 128, activation="relu", input_shape=(x.shape[1],))
    m = g.ggml_layer_dense(m, 10, activation="softmax")
    g.ggml_compile(m, loss="sparse_categorical_crossentropy", metrics=metrics, backend="cpu")
    g.ggml_fit(m, x[:batch * 4], y[:batch * 4], epochs=1, batch_size=batch, verbose=0)  # warm up the graphs
    start = time.perf_counter()
    g.ggml_fit(m, x, y, epochs=epochs, batch_size=batch, verbose=0)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="tiny settings for a smoke test, not a measurement")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    n, epochs, reps = (1024, 1, 1) if args.quick else (8192, 3, args.reps)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 784)).astype(np.float32)
    y = rng.integers(0, 10, n)
    plain, extra = [], []
    for rep in range(reps):   # alternated: background load hits both kinds
        plain.append(fit_seconds(x, y, ["accuracy"], epochs, 128))
        extra.append(fit_seconds(x, y, EXTRA, epochs, 128))
        print(f"rep {rep}: accuracy only {n * epochs / plain[-1]:.0f} samples/s, + auc/precision/recall/mae "
              f"{n * epochs / extra[-1]:.0f} samples/s, ratio {plain[-1] / extra[-1]:.3f}")
    ratio = min(plain) / min(extra)
    print(f"with metrics / without (fastest runs): {ratio:.3f} of the samples/s (load average "
          f"{os.getloadavg()[0]:.2f})" + (" [--quick: not a measurement]" if args.quick else ""))
    if not args.quick:
        print(f"TARGET {'MET' if ratio >= TARGET else 'MISSED'}: >= {TARGET} of the samples/s with four metrics")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"plain_s": plain, "metrics_s": extra, "ratio": ratio, "samples": n, "epochs": epochs}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
