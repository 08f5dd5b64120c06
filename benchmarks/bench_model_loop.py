"""The model layer's loop against its own step: ``ggml_fit`` on arrays against the same training steps run bare.

A compiled model (MNIST-FC 784-500-10 or the small CNN of ``bench_models.py``, CPU, 2 threads, AdamW) trains one
epoch. A = its own step: the runner ``ggml_fit`` would use (``training_runner``) stepping batches parsed beforehand,
nothing else in the loop (no batch checks, no shuffling, no callbacks, no history); B = ``ggml_fit(model, x, y,
batch_size=..., shuffle=False, verbose=0)``, every check kept, timed over its epoch (``on_epoch_begin`` to
``on_epoch_end``: the loop with its per-batch work; the checks of the whole arrays and the graph's building come
before, once per call, as A's building and parsing do). Each run is a fresh process, A and B alternating, the same
starting weights; the figure is the median of the per-pair ratios B / A (samples/s). Target (issue 44): >= 0.97.

Usage: python benchmarks/bench_model_loop.py [--model mnist-fc|cnn] [--pairs N] [--batches N] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import alternated_pairs, pair_ratios  # noqa: E402 - the benchmarks' folder, just added


TARGET = 0.97
BATCH = {"mnist-fc": 500, "cnn": 100}


def build(model: str):
    import ggmlpy as g
    if model == "mnist-fc":
        m = g.ggml_layer_dense(g.ggml_model_sequential(), 500, activation="relu", input_shape=(784,))
        m = g.ggml_layer_dense(m, 10, activation="softmax")
    else:
        m = g.ggml_layer_conv_2d(g.ggml_model_sequential(), 8, (3, 3), activation="relu", padding="same",
                                 input_shape=(28, 28, 1))
        m = g.ggml_layer_max_pooling_2d(m, 2)
        m = g.ggml_layer_conv_2d(m, 16, (3, 3), activation="relu", padding="same")
        m = g.ggml_layer_max_pooling_2d(m, 2)
        m = g.ggml_layer_dense(g.ggml_layer_flatten(m), 10, activation="softmax")
    return g.ggml_compile(m, optimizer="adamw", loss="categorical_crossentropy", backend="cpu")


def one_run(kind: str, model: str, batches: int) -> float:
    """samples/s of one run of ``kind`` ("step": the runner's steps bare, "fit": ggml_fit), in this process."""
    import numpy as np
    import pandas  # noqa: F401 - a fit's history is a DataFrame: imported once per process, not timed

    import ggmlpy as g
    from ggmlpy.models.engine import inputs as D
    from ggmlpy.models.engine.training_runner import training_runner
    g.ggml_set_n_threads(2)
    batch = BATCH[model]
    n = batches * batch
    rng = np.random.default_rng(0)
    shape = (784,) if model == "mnist-fc" else (28, 28, 1)
    x = rng.random((n, *shape), dtype=np.float32)
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, n)]
    np.random.seed(1)
    m = build(model)
    if kind == "fit":
        span: list[float] = []
        clock = {"on_epoch_begin": lambda epoch, logs, state: span.append(time.perf_counter()),
                 "on_epoch_end": lambda epoch, logs, state: span.append(time.perf_counter())}
        g.ggml_fit(m, x, y, epochs=1, batch_size=batch, shuffle=False, verbose=0, callbacks=[clock])
        return n / (span[1] - span[0])
    cfg = m.compiled
    m.runtime.params.mark_trainable()
    runner, _ = training_runner(m, cfg, batch)
    try:
        writer, result = runner.writer("step", True), runner.new_result()
        parsed = []
        for i in range(0, n, batch):
            xs = D.model_inputs(m, x[i:i + batch])
            parsed.append(writer.parse(D.feed_dict(cfg.heads, xs, D.model_targets(m, cfg, y[i:i + batch], xs), None)))
        t0 = time.perf_counter()
        for pairs in parsed:
            runner.step(pairs, True, result, defer=True)
        runner.drain(final=True)
        seconds = time.perf_counter() - t0
        result.free()
    finally:
        runner.close()
    return n / seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(BATCH), default="mnist-fc")
    ap.add_argument("--pairs", type=int, default=8, help="alternated pairs of runs (default 8)")
    ap.add_argument("--batches", type=int, default=60, help="batches in the epoch (default 60)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    ap.add_argument("--one", choices=["step", "fit"], help=argparse.SUPPRESS)   # a single run (the child process)
    args = ap.parse_args(argv)
    if args.one:
        print(one_run(args.one, args.model, args.batches))
        return 0
    rates = alternated_pairs(__file__, ("step", "fit"), ["--model", args.model, "--batches", str(args.batches)],
                             args.pairs)
    print(f"{args.model}: its own step  samples/s: {', '.join(f'{r:,.0f}' for r in rates['step'])}")
    print(f"{args.model}: ggml_fit       samples/s: {', '.join(f'{r:,.0f}' for r in rates['fit'])}")
    summary = pair_ratios(rates["step"], rates["fit"], "fit / step", TARGET)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "rates": rates, **summary}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
