"""Attention's training step, fused (``ggml_flash_attn_ext`` and its backward op, patches/0056) against the unfused
form (scores by ``ggml_mul_mat``, ``ggml_soft_max_ext`` with the causal mask, the product with the values), at
several sequence lengths: the memory the step's graph needs and its time.

The graph is attention's core alone, trained: loss = sum(attention(q, k, v) * r) with q, k and v parameters
(batch 8, 4 heads of 32, causal), its backward pass built by ggml, allocated by ggml's graph allocator on the CPU
backend (``ggml_gallocr_get_buffer_size``: every intermediate tensor of the forward and backward pass, reused where
their lifetimes allow) and computed with 2 threads. The unfused step holds the ``T x T`` scores, probabilities and
their gradients per head, so its memory grows as T^2; the fused step recomputes the scores a query row at a time
and its memory must grow as T (each doubling of T: 2x). The times are medians of ``--reps`` computations, the two
forms alternating, in one process.

Usage: python benchmarks/bench_attention.py [--lengths 64,256,1024] [--reps 10] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import ggmlpy as G


BATCH, HEADS, KEY_DIM = 8, 4, 32


def build(ctx, q, k, v, r, mask, fused: bool):
    """loss = sum(attention * r); q, k, v [D, T, H, B], r [D, H, T, B] (the fused output's layout)."""
    scale = 1.0 / np.sqrt(KEY_DIM)
    if fused:
        y = G.ggml_flash_attn_ext(ctx, q, k, v, mask, scale)                       # [D, H, T, B]
    else:
        s = G.ggml_mul_mat(ctx, k, q)                                                # [T keys, T queries, H, B]
        p = G.ggml_soft_max_ext(ctx, s, mask, scale, 0.0)
        vt = G.ggml_cont(ctx, G.ggml_permute(ctx, v, 1, 0, 2, 3))                  # [T, D, H, B]
        y = G.ggml_cont(ctx, G.ggml_permute(ctx, G.ggml_mul_mat(ctx, vt, p), 0, 2, 1, 3))
    return G.ggml_sum(ctx, G.ggml_mul(ctx, y, r))


def measure(steps: int, fused: bool, reps: int, backend) -> tuple[int, float]:
    """(bytes of the training graph's buffer, median seconds per step) for sequences of ``steps``."""
    rng = np.random.default_rng(0)
    shape = (BATCH, HEADS, steps, KEY_DIM)
    data = G.ggml_init(64 * 1024 * 1024)                 # the inputs, with their memory
    ctx = G.ggml_init(16 * 1024 * 1024, no_alloc=True)   # the step's nodes: their memory is the allocator's
    galloc = None
    try:
        q, k, v = (G.ggml_set_param(G.ggml_new_tensor_4d(data, G.GGML_TYPE_F32, KEY_DIM, steps, HEADS, BATCH))
                   for _ in range(3))
        r = G.ggml_new_tensor_4d(data, G.GGML_TYPE_F32, KEY_DIM, HEADS, steps, BATCH)
        mask = G.ggml_new_tensor_2d(data, G.GGML_TYPE_F16 if fused else G.GGML_TYPE_F32, steps, steps)
        for t in (q, k, v):
            G.ggml_set_f32(t, rng.normal(size=shape).astype(np.float32))
        G.ggml_set_f32(r, rng.normal(size=(BATCH, steps, HEADS, KEY_DIM)).astype(np.float32))
        G.ggml_set_f32(mask, np.triu(np.full((steps, steps), -np.inf, np.float32), 1))
        loss = G.ggml_set_loss(build(ctx, q, k, v, r, mask, fused))
        graph = G.ggml_new_graph_custom(ctx, 1024, True)
        G.ggml_build_forward_expand(graph, loss)
        G.ggml_build_backward_expand(ctx, graph)
        galloc = G.ggml_gallocr_new(backend)
        G.ggml_gallocr_alloc_graph(galloc, graph)
        size = G.ggml_gallocr_get_buffer_size(galloc, 0)
        times = []
        for _ in range(reps + 1):
            G.ggml_graph_reset(graph)
            t0 = time.perf_counter()
            G.ggml_backend_graph_compute(backend, graph)
            times.append(time.perf_counter() - t0)
        return size, float(np.median(times[1:]))
    finally:
        if galloc is not None:
            G.ggml_gallocr_free(galloc)
        ctx.free()
        data.free()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="64,256,1024", help="sequence lengths (default 64,256,1024)")
    ap.add_argument("--reps", type=int, default=10, help="timed computations per form and length (default 10)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args(argv)
    backend = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(backend, 2)
    rows = []
    print(f"attention's training step: batch {BATCH}, {HEADS} heads of {KEY_DIM}, causal, CPU, 2 threads")
    print(f"{'T':>6} {'unfused MB':>11} {'fused MB':>9} {'ratio':>6} {'unfused ms':>11} {'fused ms':>9} {'speed':>6}")
    for steps in (int(s) for s in args.lengths.split(",")):
        unfused_mb, unfused_s = measure(steps, False, args.reps, backend)
        fused_mb, fused_s = measure(steps, True, args.reps, backend)
        rows.append({"steps": steps, "unfused_bytes": unfused_mb, "fused_bytes": fused_mb,
                     "unfused_s": unfused_s, "fused_s": fused_s})
        print(f"{steps:>6} {unfused_mb / 2**20:>11.1f} {fused_mb / 2**20:>9.1f} {unfused_mb / fused_mb:>6.1f} "
              f"{unfused_s * 1e3:>11.2f} {fused_s * 1e3:>9.2f} {unfused_s / fused_s:>5.2f}x")
    for a, b in zip(rows, rows[1:]):
        growth = (b["fused_bytes"] / a["fused_bytes"]) / (b["steps"] / a["steps"])
        print(f"fused memory {a['steps']} -> {b['steps']}: x{b['fused_bytes'] / a['fused_bytes']:.2f} for "
              f"x{b['steps'] / a['steps']:.0f} steps ({'linear' if growth < 1.1 else 'faster than linear'}); "
              f"unfused x{b['unfused_bytes'] / a['unfused_bytes']:.2f}")
    backend.free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
