"""Each model's training step against the machine's own limit: the best GEMM rate its CPU reaches, F32 and BF16.

The peak: OpenBLAS's sgemm (the library ggml's BLAS backend calls) on 2048 x 2048 matrices, best of several, with
the benchmark's thread count (``bench_scaling.openblas_sgemm_peak``); beside it ggml's own CPU kernels on the same
product in F32 and with BF16 weights (``ggml_mul_mat`` of a BF16 matrix: ggml converts the other operand to BF16 and
uses the CPU's BF16 dot products, AVX512-BF16 where present), the rate mixed precision could reach.

Each model of ``bench_vs_torch.py`` (MNIST-FC, the small CNN, the LSTM, the char transformer; the model layer on the
CPU, its default threads set to ``--threads``) trains one epoch, then ``ggml_model_profile`` times every node of
its training step. The matrix products (MUL_MAT, OUT_PROD, the tiled convolution and its backward, fused attention
and its backward) are counted in FLOPs (2 per multiply-add, from the nodes' shapes); the table gives their share of
the step's time, their rate and that rate as a share of the sgemm peak, and the whole step's product FLOPs over
its time (the step's efficiency against the peak).

A product that moves more bytes than it computes (a first convolution of one channel into 8 writes 2.5 MB for 11
MFLOP) is bound by memory, not by the FMA units. Beside the peak, the benchmark measures the rate at which ggml's
CPU backend streams F32 data with the same threads (``ggml_cpy`` between two 4 MiB tensors, 8 MiB in use: the cache
levels a step's activations live in), and gives each model's roofline: each product node's time bound by
max(FLOPs / peak, bytes / stream rate), its bytes its operands and result read and written once; the products'
rate over the roofline's rate says how near the products are to what the machine allows them.

Node times come from ``ggml_model_profile``: on the CPU alone they
are taken inside the step's one graph as ggml computes it (patches/0079; before it each node was computed as a graph
of its own, with a launch each, and its rates were 10-25 % below what the step reaches).

A shared 2-core machine moves both sides: the sgemm peak measured 68-205 GFLOP/s in one sitting on the same
machine. So each model is profiled ``--rounds`` times (default 5), each round just after a fresh measure of the peak
and the stream rate, and the table gives the best round (the products' least time) against the best peak, as
``bench_vs_torch.py`` gives best against best, and beside it the median round against the median peak; the rounds'
own figures follow each row.

Usage: python benchmarks/bench_peak.py [--threads 2] [--models mnist-fc,cnn,lstm,transformer] [--rounds 5]
                                       [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def best_compute_s(ctx, graph, threads: int, reps: int) -> float:
    """The best of ``reps`` computes of ``graph`` (after one unmeasured) on ``threads`` threads, in seconds."""
    import ggmlpy as G
    G.ggml_graph_compute_with_ctx(ctx, graph, threads)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        G.ggml_graph_compute_with_ctx(ctx, graph, threads)
        best = min(best, time.perf_counter() - t0)
    return best


def ggml_gemm_rate(weight_type: int, threads: int, size: int = 1024, reps: int = 5) -> float:
    """GFLOP/s of ``ggml_mul_mat`` of a ``weight_type`` size x size matrix by an F32 one on ggml's CPU kernels."""
    import ggmlpy as G
    backend = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(backend, threads)
    ctx = G.ggml_init(8 * size * size * 4 + 16 * 1024 * 1024)
    try:
        a = G.ggml_new_tensor_2d(ctx, weight_type, size, size)
        b = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, size, size)
        G.ggml_set_f32(a, np.random.default_rng(0).random((size, size), dtype=np.float32))
        G.ggml_set_f32(b, np.random.default_rng(1).random((size, size), dtype=np.float32))
        out = G.ggml_mul_mat(ctx, a, b)
        graph = G.ggml_new_graph(ctx)
        G.ggml_build_forward_expand(graph, out)
        return 2.0 * size ** 3 / best_compute_s(ctx, graph, threads, reps) / 1e9
    finally:
        ctx.free()
        backend.free()


def stream_rate(threads: int, floats: int = 1 << 20, reps: int = 10, rounds: int = 15) -> float:
    """GB/s at which ggml's CPU backend copies F32 data between two tensors of ``floats`` elements (``ggml_cpy``
    back and forth ``reps`` times in one graph, one launch for them all; read and written once each), best of
    ``rounds``: the rate a memory-bound node of that working set can reach with ``threads`` threads."""
    import ggmlpy as G
    ctx = G.ggml_init(3 * floats * 4 + 16 * 1024 * 1024)
    try:
        a = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, floats)
        b = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, floats)
        G.ggml_set_f32(a, np.random.default_rng(2).random(floats, dtype=np.float32))
        graph = G.ggml_new_graph(ctx)
        x = a
        for i in range(reps):
            x = G.ggml_cpy(ctx, x, b if i % 2 == 0 else a)
        G.ggml_build_forward_expand(graph, x)
        return 2.0 * floats * 4 * reps / best_compute_s(ctx, graph, threads, rounds) / 1e9
    finally:
        ctx.free()


def _ne(shape: tuple) -> tuple:
    """A profiled shape (trailing 1s dropped) as ggml's four dimensions."""
    return tuple(shape) + (1,) * (4 - len(shape))


def node_bytes(node) -> float:
    """Bytes of a node's operands and result, at 4 bytes an element (the F32 models this benchmark runs): the
    least it must read and write, each once."""
    if node.op == "CONV_2D_TILED_BACK":
        # it reads the kernel, the images and the output gradient (source 2 is the forward node, for its
        # geometry) and must write the kernel's and the bias's gradients, and the images' where asked (op
        # param 0; a first layer's are not, though the CPU zeroes them)
        kernel, x, _, grad = (_ne(s) for s in node.sources[:4])
        written = np.prod(kernel) + kernel[3] + (np.prod(x) if node.params[0] else 0)
        return 4.0 * float(np.prod(kernel) + np.prod(x) + np.prod(grad) + written)
    return 4.0 * (float(np.prod(node.shape)) + sum(float(np.prod(s)) for s in node.sources))


def product_flops(node) -> float:
    """FLOPs (2 per multiply-add) of a profiled node's matrix products; 0 for other ops."""
    n = float(np.prod(node.shape))
    src = [_ne(s) for s in node.sources]
    if node.op == "MUL_MAT":                     # dst [n, m, ...] = src0 [k, n]^T src1 [k, m]
        return 2.0 * n * src[0][0]
    if node.op == "OUT_PROD":                    # dst [n, m, ...] = src0 [n, k] src1 [m, k]^T
        return 2.0 * n * src[0][1]
    if node.op == "CONV_2D_TILED":               # each output: the kernel's KW x KH x Cin taps
        kernel = src[0]
        return 2.0 * n * kernel[0] * kernel[1] * kernel[2]
    if node.op == "CONV_2D_TILED_BACK":          # the images' and the kernel's gradients, each the forward's
        kernel, out = src[0], src[2]             # products, where asked for (op params 0 and 1: a first layer
        asked = sum(1 for p in node.params[:2] if p)   # computes no images' gradient)
        return asked * 2.0 * float(np.prod(out)) * kernel[0] * kernel[1] * kernel[2]
    if node.op == "FLASH_ATTN_EXT":              # scores and values: q [D, N, H, B], k [D, M, ...], v [Dv, M, ...]
        q, k, v = src[0], src[1], src[2]
        return 2.0 * q[1] * k[1] * (q[0] + v[0]) * q[2] * q[3]
    if node.op == "FLASH_ATTN_BACK":             # scores again, dP, dq, dk, dv
        q, k = src[0], src[1]
        return 2.0 * 5.0 * q[1] * k[1] * q[0] * q[2] * q[3]
    return 0.0


def round_row(prof) -> dict:
    """One profile's figures per step: its product FLOPs and their seconds, each product node's (FLOPs, bytes) for
    the roofline, the nodes' seconds and the plain step's."""
    steps = max(prof.steps, 1)
    products = [nd for nd in prof.nodes if product_flops(nd) > 0]
    return {"product_flops": sum(product_flops(nd) for nd in products) / steps,
            "product_s": sum(nd.seconds for nd in products) / steps,
            "work": [(product_flops(nd) / steps, node_bytes(nd) / steps) for nd in products],
            "node_s": prof.node_seconds, "step_s": prof.step_seconds}


def roofline_s(work: list[tuple[float, float]], peak: float, stream: float) -> float:
    """Seconds the products need at least: each at the slower of its FLOPs at ``peak`` GFLOP/s and its bytes at
    ``stream`` GB/s."""
    return sum(max(flops / (peak * 1e9), nbytes / (stream * 1e9)) for flops, nbytes in work)


def model_rounds(name: str, threads: int, rounds: int, limits) -> list[dict]:
    """``rounds`` profiles of model ``name``'s training step, each just after a fresh measure of the machine's
    limits (``limits()`` -> (peak GFLOP/s, stream GB/s)): the two sides alternate, so that a load on the shared
    machine falls on both. Each round's row holds its figures and the limits measured before it."""
    import bench_vs_torch as B

    import ggmlpy as G
    G.ggml_set_n_threads(threads)
    n, batch = B.SIZES[name]
    x, y = B.data(name, max(batch * 4, 256 if name != "mnist-fc" else 2000))
    model = B.ggml_model(name, "cpu")
    G.ggml_fit(model, x, y, epochs=1, batch_size=batch, verbose=0)
    rows = []
    for _ in range(rounds):
        peak, stream = limits()
        rows.append(dict(round_row(G.ggml_model_profile(model, batch_size=batch)), peak=peak, stream=stream))
    return rows


def summary(name: str, rows: list[dict]) -> dict:
    """A model's figures from its rounds: the best round (the products' least time) against the best limits
    measured beside the rounds (best against best, as ``bench_vs_torch``'s ratios), and the median round against
    the median peak."""
    by_time = sorted(rows, key=lambda r: r["product_s"])
    best, med = by_time[0], by_time[len(by_time) // 2]
    peak, stream = max(r["peak"] for r in rows), max(r["stream"] for r in rows)
    peak_med = float(np.median([r["peak"] for r in rows]))
    rate = best["product_flops"] / best["product_s"] / 1e9 if best["product_s"] else 0.0
    rate_med = med["product_flops"] / med["product_s"] / 1e9 if med["product_s"] else 0.0
    roof_s = roofline_s(best["work"], peak, stream)
    roof = best["product_flops"] / roof_s / 1e9 if roof_s else 0.0
    step_s = min(r["step_s"] for r in rows)
    return {"model": name, "rounds": len(rows), "step_s": step_s, "node_s": best["node_s"],
            "product_flops": best["product_flops"], "product_s": best["product_s"],
            "share": best["product_s"] / best["node_s"] if best["node_s"] else 0.0,
            "product_gflops": rate, "of_peak": rate / peak, "median_gflops": rate_med,
            "median_of_peak": rate_med / peak_med, "roofline_gflops": roof, "of_roofline": rate / roof if roof else 0.0,
            "step_of_peak": best["product_flops"] / step_s / 1e9 / peak if step_s else 0.0,
            "peak": peak, "stream": stream,
            "rounds_gflops": [r["product_flops"] / r["product_s"] / 1e9 for r in rows if r["product_s"]],
            "rounds_peak": [r["peak"] for r in rows]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="mnist-fc,cnn,lstm,transformer")
    ap.add_argument("--rounds", type=int, default=5, help="profiles per model, each beside a fresh peak (default 5)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    from bench_scaling import openblas_sgemm_peak

    import ggmlpy as G
    ggml_f32 = ggml_gemm_rate(G.GGML_TYPE_F32, args.threads)
    ggml_bf16 = ggml_gemm_rate(G.GGML_TYPE_BF16, args.threads)
    source = ""   # which library gave the peak, as the first measure found it

    def limits() -> tuple[float, float]:
        nonlocal source
        peak, source = openblas_sgemm_peak(args.threads, 2048, reps=3)
        return peak, stream_rate(args.threads, rounds=5)

    rows = []
    for name in args.models.split(","):
        rows.append(summary(name, model_rounds(name, args.threads, args.rounds, limits)))
    peak = max(r["peak"] for r in rows)
    print(f"peak: {source}, {args.threads} threads, 2048^3, best beside each round: {peak:.1f} GFLOP/s")
    print(f"stream: ggml_cpy between two 4 MiB F32 tensors, {args.threads} threads, best: "
          f"{max(r['stream'] for r in rows):.1f} GB/s")
    print(f"ggml's own CPU kernels, 1024^3: F32 {ggml_f32:.1f} GFLOP/s, BF16 weights {ggml_bf16:.1f} GFLOP/s "
          f"({ggml_bf16 / peak:.0%} of the sgemm peak)")
    print(f"\n{'model':12} {'step ms':>8} {'products':>9} {'GFLOP/s':>8} {'of peak':>8} {'median':>7} "
          f"{'roofline':>9} {'of roofline':>12} {'step of peak':>13}")
    for r in rows:
        print(f"{r['model']:12} {r['step_s'] * 1e3:>8.2f} {r['share']:>8.0%} {r['product_gflops']:>8.1f} "
              f"{r['of_peak']:>8.0%} {r['median_of_peak']:>7.0%} {r['roofline_gflops']:>9.1f} "
              f"{r['of_roofline']:>12.0%} {r['step_of_peak']:>13.0%}")
        rates = ", ".join(f"{g:.0f}/{p:.0f}" for g, p in zip(r["rounds_gflops"], r["rounds_peak"]))
        print(f"{'':12} rounds (products / peak GFLOP/s): {rates}")
    print(f"\n{args.rounds} rounds per model, each a profile of the step (ggml_model_profile) just after a fresh "
          "measure of the sgemm peak and the stream rate. products: their share of the step's node time in the "
          "best round; GFLOP/s: the products' rate in the best round; of peak: that rate over the best peak; "
          "median: the median round's rate over the median peak; roofline: the rate the products could reach, "
          "each bound by the peak or by its bytes at the stream rate; of roofline: the products' rate over it; "
          "step of peak: the step's product FLOPs over the best whole step's time, over the peak")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "rounds": args.rounds, "sgemm_peak": peak, "ggml_f32": ggml_f32,
                       "ggml_bf16": ggml_bf16, "models": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
