"""Memory stays flat while several GB stream through ``ggml_fit_opt_gen``.

A small autoencoder-like model (1024 -> 64 -> 1024, MSE, AdamW, batch 1024) trains from an
infinite callable generator that creates every batch on the fly with ``np.random`` and keeps
none of them. The process's resident set size (``VmRSS`` from ``/proc/self/status``) is
sampled inside the generator every ``--every`` batches and at every epoch end.

Passes ("RSS FLAT") when the peak RSS exceeds the RSS after the first epoch by less than
50 MB, i.e. nothing grows with the amount of data streamed.
Usage: python benchmarks/bench_memory.py [--gb 4] [--epochs 4] [--prefetch 0] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import ggmlpy as G


N_IO, N_HIDDEN, BATCH = 1024, 64, 1024
FLAT_MB = 50.0


def rss_mb() -> float:
    """Resident set size of this process in MB, from /proc/self/status (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS line in /proc/self/status")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=4.0, help="GB of float32 batch data to stream (default 4)")
    ap.add_argument("--epochs", type=int, default=4, help="epochs the stream is split into (default 4)")
    ap.add_argument("--every", type=int, default=16, help="sample RSS every N batches (default 16)")
    ap.add_argument("--prefetch", type=int, default=0, help="prefetch depth passed to ggml_fit_opt_gen (default 0)")
    ap.add_argument("--threads", type=int, default=2, help="ggml CPU threads (default 2)")
    ap.add_argument("--quick", action="store_true", help="small settings for a CI smoke test (0.25 GB, 2 epochs)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args(argv)
    if args.quick:
        args.gb, args.epochs = 0.25, 2

    # Each batch is an input x (BATCH x N_IO float32, 4 MiB) and its target; the target is the input itself
    # (an autoencoder), so the data generated per batch is 4 MiB and the data written into ggml is 8 MiB.
    batch_bytes = BATCH * N_IO * 4
    steps = max(1, int(args.gb * 1e9 / batch_bytes) // args.epochs)
    total_batches = steps * args.epochs
    rss_start = rss_mb()

    G.ggml_set_n_threads(args.threads)
    backend = G.ggml_backend_cpu_init()
    ctx_static = G.ggml_init(8 * G.ggml_tensor_overhead(), no_alloc=True)
    w1 = G.ggml_new_tensor_2d(ctx_static, G.GGML_TYPE_F32, N_IO, N_HIDDEN)
    b1 = G.ggml_new_tensor_1d(ctx_static, G.GGML_TYPE_F32, N_HIDDEN)
    w2 = G.ggml_new_tensor_2d(ctx_static, G.GGML_TYPE_F32, N_HIDDEN, N_IO)
    b2 = G.ggml_new_tensor_1d(ctx_static, G.GGML_TYPE_F32, N_IO)
    for t in (w1, b1, w2, b2):
        G.ggml_set_param(t)
    x_in = G.ggml_new_tensor_2d(ctx_static, G.GGML_TYPE_F32, N_IO, BATCH)
    G.ggml_set_input(x_in)
    buffer = G.ggml_backend_alloc_ctx_tensors(ctx_static, backend)
    rng = np.random.default_rng(0)
    for t, shape in ((w1, (N_HIDDEN, N_IO)), (w2, (N_IO, N_HIDDEN))):
        G.ggml_backend_tensor_set_data(t, rng.normal(0, 1 / np.sqrt(shape[1]), shape).astype(np.float32))
    for t in (b1, b2):
        G.ggml_backend_tensor_set_data(t, np.zeros(G.ggml_nelements(t), np.float32))
    ctx_compute = G.ggml_init(32 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    h = G.ggml_relu(ctx_compute, G.ggml_add(ctx_compute, G.ggml_mul_mat(ctx_compute, w1, x_in), b1))
    out = G.ggml_add(ctx_compute, G.ggml_mul_mat(ctx_compute, w2, h), b2)
    sched = G.ggml_backend_sched_new([backend], parallel=False)

    # Low-rank data (16 latent factors) so there is something to learn and the loss falls.
    mixing = rng.normal(0, 1 / 4, (16, N_IO)).astype(np.float32)
    samples: list[tuple[int, float]] = []   # (batches produced, RSS MB)
    produced = [0]
    data_rng = np.random.default_rng(1)

    def generator():
        """Infinite: a fresh batch per call, never stored."""
        if produced[0] % args.every == 0:
            samples.append((produced[0], rss_mb()))
        produced[0] += 1
        z = data_rng.standard_normal((BATCH, 16), dtype=np.float32)
        x = z @ mixing + 0.05 * data_rng.standard_normal((BATCH, N_IO), dtype=np.float32)
        return x, x

    epoch_rss: list[float] = []
    callbacks = [{"on_epoch_end": lambda epoch, logs, state: epoch_rss.append(rss_mb())}]
    rss_before_fit = rss_mb()
    print(f"streaming {total_batches} batches of {BATCH}x{N_IO} float32 ({total_batches * batch_bytes / 1e9:.2f} GB "
          f"generated, {2 * total_batches * batch_bytes / 1e9:.2f} GB written into ggml as inputs+labels) in "
          f"{args.epochs} epochs of {steps} steps, prefetch={args.prefetch}")
    t0 = time.perf_counter()
    hist = G.ggml_fit_opt_gen(sched, ctx_compute, x_in, out, generator, steps_per_epoch=steps, epochs=args.epochs,
                              loss_type=G.ggml_opt_loss_type_mse(), callbacks=callbacks, silent=True,
                              prefetch=args.prefetch)
    seconds = time.perf_counter() - t0
    rss_end = rss_mb()

    G.ggml_backend_sched_free(sched)
    G.ggml_free(ctx_compute)
    G.ggml_backend_buffer_free(buffer)
    G.ggml_free(ctx_static)
    G.ggml_backend_free(backend)
    rss_after_free = rss_mb()

    all_rss = [r for _, r in samples] + epoch_rss + [rss_end]
    peak = max(all_rss)
    after_first = epoch_rss[0]
    growth = peak - after_first
    flat = growth < FLAT_MB
    print(hist.to_string(index=False))
    print(f"{seconds:.1f} s, {total_batches * BATCH / seconds:,.0f} samples/s, "
          f"{total_batches * batch_bytes / 1e9 / seconds:.2f} GB/s generated")
    print(f"RSS at start:               {rss_start:8.1f} MB")
    print(f"RSS before the fit:         {rss_before_fit:8.1f} MB")
    print(f"RSS after epoch 1..{len(epoch_rss)}:       " + ", ".join(f"{r:.1f}" for r in epoch_rss) + " MB")
    print(f"RSS peak (sampled {len(samples)}x):   {peak:8.1f} MB")
    print(f"RSS at the end of the fit:  {rss_end:8.1f} MB")
    print(f"RSS after freeing all:      {rss_after_free:8.1f} MB")
    print(f"peak - after first epoch = {growth:.1f} MB (limit {FLAT_MB:.0f} MB)")
    print(f"RSS {'FLAT' if flat else 'GREW'}: TARGET {'MET' if flat else 'MISSED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gb": args.gb, "epochs": args.epochs, "steps_per_epoch": steps, "batches": total_batches,
                       "prefetch": args.prefetch, "seconds": seconds, "rss_start_mb": rss_start,
                       "rss_before_fit_mb": rss_before_fit, "rss_epoch_end_mb": epoch_rss, "rss_peak_mb": peak,
                       "rss_end_mb": rss_end, "rss_after_free_mb": rss_after_free, "growth_mb": growth, "flat": flat,
                       "rss_samples": samples, "train_loss": hist["train_loss"].tolist()}, f, indent=2)
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
