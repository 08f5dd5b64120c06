"""The seed page's setup, as a user builds it: ``ggml_fit_opt_gen`` over a generator of numpy slices against
ggml's C loop ``ggml_opt_fit`` on the same graph.

A CPU-only scheduler (``ggml_backend_cpu_init()``, ``ggml_backend_cpu_set_n_threads(cpu, 2)``,
``ggml_backend_sched_new([cpu])``), MNIST-FC 784-500-10 (ReLU, cross-entropy, AdamW with ggml's defaults), batch
500, one epoch of 60 batches. B yields ``(x[i:i + 500], y[i:i + 500])`` slices of arrays in memory, every batch
checked as always; A is ggml's ``ggml_opt_fit`` (reached through the ffi) on a dataset holding the same samples.
Each run is a fresh process, A and B alternating (A B A B ...), so that neither inherits the other's caches or
thread pool (pandas, which B's history needs, is imported before the timing: a once-per-process cost, not the
loop's); the figure is the median of the per-pair ratios B / A (samples/s), with the best runs' ratio beside
it. Target (issue 44): >= 0.97.

Usage: python benchmarks/bench_seed_loop.py [--pairs N] [--batches N] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_common import alternated_pairs, pair_ratios  # noqa: E402 - the benchmarks' folder, just added


BATCH, TARGET = 500, 0.97


def one_run(kind: str, batches: int) -> float:
    """samples/s of one run of ``kind`` ("c": ggml_opt_fit, "gen": ggml_fit_opt_gen), in this process."""
    sys.path.insert(0, HERE)
    import pandas  # noqa: F401 - a fit's history is a DataFrame: imported once per process, not timed (A has none)
    from bench_fit import initial_weights, make_data, Model, N_CLASSES, N_IN

    import ggmlpy as G
    n = batches * BATCH
    x, y = make_data(n)
    cpu = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(cpu, 2)
    m = Model(cpu, initial_weights())
    m.sched.free()
    m.sched = G.ggml_backend_sched_new([cpu], parallel=False)
    if kind == "c":
        from ggmlpy._ffi import lib
        ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, N_IN, N_CLASSES, n, 1)
        G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), x)
        G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), y)
        graphs = G.ggml_init(3 * G.ggml_graph_overhead(2048, True) + 6 * 2048 * G.ggml_tensor_overhead(),
                             no_alloc=True)
        t0 = time.perf_counter()
        lib.ggml_opt_fit(m.sched.ptr, graphs.ptr, m.images.ptr, m.logits.ptr, ds.ptr,
                         G.ggml_opt_loss_type_cross_entropy(), G.ggml_opt_optimizer_type_adamw(),
                         lib.ggml_opt_get_default_optimizer_params, 1, BATCH, 0.0, True)
        return n / (time.perf_counter() - t0)

    def slices():
        for i in range(0, n, BATCH):
            yield x[i:i + BATCH], y[i:i + BATCH]
    t0 = time.perf_counter()
    G.ggml_fit_opt_gen(m.sched, m.ctx_compute, m.images, m.logits, slices, epochs=1,
                       loss_type=G.ggml_opt_loss_type_cross_entropy(), optimizer=G.ggml_opt_optimizer_type_adamw(),
                       silent=True)
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=8, help="alternated pairs of runs (default 8)")
    ap.add_argument("--batches", type=int, default=60, help="batches of 500 in the epoch (default 60)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    ap.add_argument("--one", choices=["c", "gen"], help=argparse.SUPPRESS)   # a single run (the child process)
    args = ap.parse_args(argv)
    if args.one:
        print(one_run(args.one, args.batches))
        return 0
    rates = alternated_pairs(__file__, ("c", "gen"), ["--batches", str(args.batches)], args.pairs)
    print(f"ggml_opt_fit (C)      samples/s: {', '.join(f'{r:,.0f}' for r in rates['c'])}")
    print(f"ggml_fit_opt_gen      samples/s: {', '.join(f'{r:,.0f}' for r in rates['gen'])}")
    summary = pair_ratios(rates["c"], rates["gen"], "gen / C", TARGET)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rates": rates, **summary}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
