"""A small hyper-parameter search: many fits at once in a process pool, each worker training its own copy
of one compiled model.

What this shows:
- a compiled model pickles (through its GGUF bytes: architecture, compile settings, weights), so
  ``concurrent.futures.ProcessPoolExecutor`` can send it to each worker; every trial starts from the same
  initial weights, so the trials differ only in what is searched;
- the ``spawn`` start method (a fresh interpreter per worker; safe with ggml's thread pools), one ggml
  thread per worker so that the workers share the cores instead of fighting over them;
- the best trial's trained model coming back from its worker, evaluated on the test split and saved.

The digits (1,797 8x8 images, 10 classes) ship inside scikit-learn: nothing is downloaded.
Usage: python examples/hyperparameter_search.py [--epochs 15] [--workers 2] [--save best.gguf]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import multiprocessing
import os
import time

import numpy as np
from sklearn.datasets import load_digits

import ggmlpy as g


def digits() -> tuple[np.ndarray, ...]:
    """Train / validation / test splits of the digits, flattened to 64 features in [0, 1]."""
    data = load_digits()
    x = (data.images.reshape(-1, 64) / 16.0).astype(np.float32)
    y = data.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:1200], y[:1200], x[1200:1500], y[1200:1500], x[1500:], y[1500:]


def build() -> g.Sequential:
    np.random.seed(0)  # every trial starts from these weights (they travel with the pickled model)
    model = g.ggml_model_sequential()
    g.ggml_layer_dense(model, 64, activation="relu", input_shape=(64,))
    g.ggml_layer_dropout(model, 0.2)
    g.ggml_layer_dense(model, 10, activation="softmax")
    return g.ggml_compile(model, loss="sparse_categorical_crossentropy", backend="cpu")


def trial(model: g.Sequential, learning_rate: float, batch_size: int, epochs: int) -> tuple[float, g.Sequential]:
    """One fit in a worker process: the model arrived pickled; it goes back trained, with its score."""
    g.ggml_set_n_threads(1)
    x, y, x_val, y_val, _, _ = digits()
    g.ggml_compile(model, loss="sparse_categorical_crossentropy", backend="cpu", learning_rate=learning_rate)
    g.ggml_fit(model, x, y, epochs=epochs, batch_size=batch_size, verbose=0)
    scores = g.ggml_evaluate(model, x_val, y_val)
    return float(scores["accuracy"]), model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--save", default=None, help="save the best model to this GGUF file")
    args = parser.parse_args()

    template = build()
    grid = list(itertools.product([3e-4, 1e-3, 3e-3, 1e-2], [32, 128]))  # learning rate x batch size
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        futures = {pool.submit(trial, template, lr, batch, args.epochs): (lr, batch) for lr, batch in grid}
        results = []
        for future in concurrent.futures.as_completed(futures):
            lr, batch = futures[future]
            accuracy, model = future.result()
            print(f"learning_rate={lr:<7g} batch_size={batch:<4d} validation accuracy {accuracy:.3f}", flush=True)
            results.append((accuracy, lr, batch, model))
    print(f"{len(grid)} trials on {args.workers} workers in {time.perf_counter() - start:.1f} s")

    accuracy, lr, batch, best = max(results, key=lambda r: r[0])
    _, _, _, _, x_test, y_test = digits()
    test = g.ggml_evaluate(best, x_test, y_test)
    print(f"best: learning_rate={lr:g} batch_size={batch} (validation {accuracy:.3f}), "
          f"test accuracy: {test['accuracy']:.3f}")
    if args.save:
        g.ggml_save_model(best, args.save)
        print(f"saved {args.save}")


if __name__ == "__main__":
    main()
