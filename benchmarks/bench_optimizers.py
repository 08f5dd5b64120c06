"""What the optimizers outside ggml-opt cost a fit: samples/s of the same model trained with ggml-opt's fused
AdamW (the baseline) against SGD with momentum, RMSprop, Adagrad and AdamW with clipnorm, which run as a graph of
ggml element-wise ops after each backward pass (ggmlpy/opt/rules.py), measured in one process with the runs
alternated (the fastest run of each counts).

    python benchmarks/bench_optimizers.py [--reps 3] [--quick] [--backend cpu] [--json PATH]

Model: MNIST-FC-sized (784-500-10, ReLU, softmax, sparse categorical cross-entropy), batch 500, synthetic data.
Target: each graph optimizer keeps at least 0.85 of the fused AdamW's samples/s on the CPU (its step adds one
graph compute of a few element-wise passes over the 397k weights per batch).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import ggmlpy as g


CASES = {"adam (fused)": ("adam", {}), "sgd (fused)": ("sgd", {}), "sgd momentum": ("sgd", {"momentum": 0.9}),
         "rmsprop": ("rmsprop", {}), "adagrad": ("adagrad", {}), "adam clipnorm": ("adam", {"clipnorm": 1.0})}
TARGET = 0.85


def fit_seconds(x: np.ndarray, y: np.ndarray, optimizer: str, settings: dict, epochs: int, batch: int,
                backend: str) -> float:
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 500, activation="relu", input_shape=(x.shape[1],))
    m = g.ggml_layer_dense(m, 10, activation="softmax")
    g.ggml_compile(m, optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=[], backend=backend,
                   **settings)
    g.ggml_fit(m, x[:batch * 2], y[:batch * 2], epochs=1, batch_size=batch, verbose=0)  # warm up the graphs
    start = time.perf_counter()
    g.ggml_fit(m, x, y, epochs=epochs, batch_size=batch, verbose=0)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny settings for a smoke test, not a measurement")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    n, epochs, reps = (1000, 1, 1) if args.quick else (10000, 2, args.reps)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 784)).astype(np.float32)
    y = rng.integers(0, 10, n)
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for rep in range(reps):   # alternated: background load hits every kind
        for name, (opt, settings) in CASES.items():
            times[name].append(fit_seconds(x, y, opt, settings, epochs, 500, args.backend))
        print(f"rep {rep}: " + ", ".join(f"{k} {n * epochs / v[-1]:.0f}" for k, v in times.items()) + " samples/s")
    base = min(times["adam (fused)"])
    ratios = {k: base / min(v) for k, v in times.items()}
    for k, r in ratios.items():
        print(f"{k:>14}: {r:.3f} of fused AdamW's samples/s")
    print(f"load average {os.getloadavg()[0]:.2f}" + (" [--quick: not a measurement]" if args.quick else ""))
    if not args.quick:
        worst = min(r for k, r in ratios.items() if "fused" not in k)
        print(f"TARGET {'MET' if worst >= TARGET else 'MISSED'}: every graph optimizer >= {TARGET} (worst {worst:.3f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seconds": times, "ratios": ratios, "samples": n, "epochs": epochs}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
