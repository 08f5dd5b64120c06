"""Data-parallel training over ggml RPC servers on loopback: step time and bytes moved per step, 1 vs 2 replicas.

Model: an MLP 784-1024-1024-10 (ReLU, softmax cross-entropy, AdamW; ``--hidden``), batch 512 (``--batch``), built
with the model layer and trained with ``ggml_fit``; each RPC server runs in a process of its own with ``--threads``
CPU threads (default 1, so two servers use this 2-core machine's two cores). Runs, alternated ``--reps`` times:

  A = one replica: ``backend="RPC0"``, the whole batch on one server;
  B = two replicas: ``backend=["RPC0", "RPC1"]``, half of each batch on each server;
  H = one replica with half the batch (the compute part of a B step, for the scaling model).

Printed per run kind: the best and median step time (ms), samples/s, and per step the bytes the client moved:
batch shards sent to the replicas, gradients (replica 1 -> client -> replica 0), weights (replica 0 -> client
-> replica 1). Then the scaling model's prediction of B's step time from H's compute time and the bytes moved
at the loopback bandwidth measured here, against B's measured time.

The scaling model (README, "Data-parallel training"): with K replicas and P trainable float32 values, one
optimizer step moves ``4 P (3K - 2)`` bytes through the client (K-1 gradients in and out, the new weights out
of replica 0 and into K-1 replicas) plus the batch, sequentially after the replicas' computes, so
``t(K) ~ t_compute(B / K) + 4 P (3K - 2) / bandwidth + per-tensor latency``.

The machine is shared and noisy: only ratios measured in the same run mean anything.
Usage: python benchmarks/bench_replicas.py [--reps N] [--steps N] [--threads N] [--hidden N] [--batch N] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

import ggmlpy as G


N_IN, N_CLASSES = 784, 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(threads: int) -> tuple[subprocess.Popen, str]:
    endpoint = f"127.0.0.1:{_free_port()}"
    code = f"import ggmlpy; ggmlpy.ggml_backend_rpc_start_server({endpoint!r}, n_threads={threads})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not G.ggml_rpc_probe(endpoint, 0.2):
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit("an RPC server did not start")
        time.sleep(0.1)
    return proc, G.ggml_backend_rpc_add_server(endpoint)[0].name


def _model(backend, hidden):
    np.random.seed(0)
    m = G.ggml_model_sequential()
    m = G.ggml_layer_dense(m, hidden, activation="relu", input_shape=(N_IN,))
    m = G.ggml_layer_dense(m, hidden, activation="relu")
    m = G.ggml_layer_dense(m, N_CLASSES, activation="softmax")
    return G.ggml_compile(m, backend=backend)


def _n_params(model) -> int:
    return int(sum(v.size for v in G.ggml_get_weights(model).values()))


def _run(model, x, y, batch, steps) -> tuple[float, dict]:
    """Seconds per step of one epoch of ``steps`` steps (after one warm-up epoch) and the bytes per step."""
    n = batch * steps
    G.ggml_fit(model, x[:batch * 2], y[:batch * 2], epochs=1, batch_size=batch, verbose=0)  # graphs built, warm
    t0 = time.perf_counter()
    h = G.ggml_fit(model, x[:n], y[:n], epochs=1, batch_size=batch, verbose=0, shuffle=False)
    seconds = (time.perf_counter() - t0) / steps
    # measured by the fit (a one-device fit moves only its batch: its size here)
    if "replicas" in h.attrs:
        moved = dict(h.attrs["replicas"]["bytes_per_step"], seconds=h.attrs["replicas"]["seconds_per_step"])
    else:
        moved = {"batch": batch * (N_IN + N_CLASSES) * 4, "gradients": 0, "weights": 0}
    return seconds, moved


def _link(device: str) -> tuple[float, float]:
    """(bytes per second of a 16 MB write plus read, seconds of one small write) through one RPC server."""
    backend = G.ggml_backend_init_by_name(device)
    ctx = G.ggml_init(4 * G.ggml_tensor_overhead(), no_alloc=True)
    big = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4 << 20)
    small = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 16)
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    data = np.ones(4 << 20, np.float32)
    best, rtt = float("inf"), float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        G.ggml_backend_tensor_set_data(big, data)
        G.ggml_backend_tensor_get_data(big)
        best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(20):
            G.ggml_backend_tensor_set_data(small, data[:16])
        rtt = min(rtt, (time.perf_counter() - t0) / 20)
    buf.free()
    ctx.free()
    backend.free()
    return 2 * data.nbytes / best, rtt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    servers = [_server(args.threads) for _ in range(2)]
    try:
        names = [name for _, name in servers]
        rng = np.random.default_rng(0)
        BATCH, hidden = args.batch, args.hidden
        n = BATCH * args.steps
        x = rng.random((n, N_IN), dtype=np.float32)
        y = np.eye(N_CLASSES, dtype=np.float32)[rng.integers(0, N_CLASSES, n)]
        kinds = {"A": (names[0], BATCH), "B": (names, BATCH), "H": (names[0], BATCH // 2)}
        models = {k: _model(b, hidden) for k, (b, _) in kinds.items()}
        times: dict = {k: [] for k in kinds}
        moved: dict = {}
        for _ in range(args.reps):
            for k, (_, batch) in kinds.items():
                seconds, moved[k] = _run(models[k], x, y, batch, args.steps)
                times[k].append(seconds)
        bw, rtt = _link(names[0])
        p = _n_params(models["A"])
        print(f"data-parallel over loopback RPC: MLP {N_IN}-{hidden}-{hidden}-{N_CLASSES} ({p:,} weights), "
              f"batch {BATCH}, {args.threads} thread(s) per server, best/median of {args.reps}")
        for k, label in (("A", "1 replica"), ("B", "2 replicas"), ("H", "1 replica, half batch")):
            best, med = min(times[k]), statistics.median(times[k])
            batch = kinds[k][1]
            b = moved[k]
            print(f"  {label:22s} step {best * 1e3:7.1f} ms (median {med * 1e3:7.1f})  {batch / best:8.0f} samples/s  "
                  f"bytes/step: batch {b['batch'] / 1e6:.2f} MB, gradients {b['gradients'] / 1e6:.2f} MB, "
                  f"weights {b['weights'] / 1e6:.2f} MB")
        ratio = min(times["A"]) / min(times["B"])
        # the scaling model: K = 2, 6 weight tensors; per step 2 (K-1) 6 gradient copies, K 6 weight copies, K 7
        # accumulator resets, the step's parameters and its compute: one round trip each
        calls = 2 * 6 + 2 * 6 + 2 * 7 + 2
        comm = (moved["B"]["gradients"] + moved["B"]["weights"]) / bw + calls * rtt
        split = moved["B"]["seconds"]
        print(f"  2 replicas / 1 replica throughput: {ratio:.2f}x "
              f"(2 replicas / 1 replica with half the batch, per sample: {2 * min(times['H']) / min(times['B']):.2f}x)")
        print(f"  2 replicas, per step: evaluations {split['replicas'] * 1e3:.1f} ms, optimizer (sum, step, copies) "
              f"{split['optimizer'] * 1e3:.1f} ms")
        print(f"  loopback: {bw / 1e9:.2f} GB/s, {rtt * 1e6:.0f} us per round trip; the scaling model's transfers: "
              f"{comm * 1e3:.1f} ms predicted against the optimizer's {split['optimizer'] * 1e3:.1f} ms measured "
              f"(which also holds the step's compute); step {(split['replicas'] + comm) * 1e3:.1f} ms predicted, "
              f"{min(times['B']) * 1e3:.1f} ms measured")
        predicted = split["replicas"] + comm
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"times": times, "moved": moved, "bandwidth": bw, "ratio": ratio, "predicted_B": predicted,
                           "params": p}, f, indent=1)
        models.clear()  # their buffers live on the servers: freed before the servers go
        import gc
        gc.collect()
    finally:
        for proc, _ in servers:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
