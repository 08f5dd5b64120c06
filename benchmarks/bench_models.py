"""Throughput of the Keras-like model layer (``ggml_fit`` on arrays) against the same model hand-built.

For each model, alternating runs in one process, each from the same starting weights:
  A = hand-built: the graph written with the low-level API (``bench_backends.build_mlp``; for the CNN
      ``build_cnn_f32`` below, bench_backends' ``build_cnn`` with the float32 im2col the model layer
      uses, or ``build_cnn_f16`` with ``--cnn-conv ggml``), trained with ``ggml_fit_opt_gen`` from a
      generator function yielding the batches of the data set in order (views, no copy), ``silent=True``;
  B = model layer: the same architecture from ``ggml_model_sequential`` + ``ggml_layer_*``,
      ``ggml_compile(optimizer="adamw", loss="categorical_crossentropy", backend="cpu")``, trained
      with ``ggml_fit(model, x, y, batch_size=..., shuffle=False, verbose=0)`` on the whole arrays
      (sample-major, channels last), so both sides see the same batches in the same order.
Models (CPU backend, 2 threads, AdamW with ggml's defaults, synthetic MNIST-shaped data):
  mnist-fc: 784-500-10, ReLU, softmax + categorical cross-entropy (fused into ggml's loss),
            physical batch 500, logical batch 1000 (``nbatch_logical``);
  cnn:      conv 3x3 1->8 'same' + ReLU, max-pool 2, conv 3x3 8->16 'same' + ReLU, max-pool 2, flatten,
            dense 10 (no bias, as in bench_backends) + softmax, batch 100 (optimizer step every batch).
When both sides build the same graph they compute the same losses from the same weights and batches
(checked: printed per pair, and a NOTE when they differ). The timed span of a run is its training
epochs (first ``on_epoch_begin`` to last ``on_epoch_end``): the per-step cost. The whole call
(graph building, optimizer setup, history) is printed too, for information.

Target: samples/s of the model layer / samples/s hand-built >= 0.95 for each model, taking the
fastest run of each kind (background load only ever slows a run down); the per-pair ratios and
their median are printed too. The order alternates within pairs (A B, B A, ...). The machine is
shared and noisy: only ratios measured in one run count.
Usage: python benchmarks/bench_models.py [--models mnist-fc,cnn] [--reps N] [--epochs N] [--samples N]
       [--cnn-conv f32|ggml] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_backends import build_cnn_f16, build_mlp, conv_2d_f32, make_data, N_CLASSES  # noqa: E402  the hand-built models
from bench_fit import loadavg  # noqa: E402

import ggmlpy as G  # noqa: E402


TARGET = 0.95


# ---------------------------------------------------------------- the hand-built CNN the model layer computes

def build_cnn_f32(ctx, batch):
    """bench_backends' CNN as the model layer computes it: float32 im2col, and each conv/pool result passed
    through a no-op ``ggml_reshape(y, y)`` (whose backward makes the gradient contiguous: the flatten's
    permute hands pool 2 a non-contiguous gradient, which POOL_2D's backward misreads)."""
    x = G.ggml_set_input(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 28, 28, 1, batch))
    k1 = G.ggml_set_param(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 3, 3, 1, 8))
    c1 = G.ggml_set_param(G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 1, 1, 8))
    k2 = G.ggml_set_param(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 3, 3, 8, 16))
    c2 = G.ggml_set_param(G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 1, 1, 16))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 7 * 7 * 16, N_CLASSES))

    def safe(t):
        return G.ggml_reshape(ctx, t, t)
    h = safe(G.ggml_relu(ctx, G.ggml_add(ctx, conv_2d_f32(ctx, k1, x, 1), c1)))
    h = safe(G.ggml_pool_2d(ctx, h, G.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0))
    h = safe(G.ggml_relu(ctx, G.ggml_add(ctx, conv_2d_f32(ctx, k2, h, 1), c2)))
    h = safe(G.ggml_pool_2d(ctx, h, G.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0))
    flat = G.ggml_reshape_2d(ctx, G.ggml_cont(ctx, G.ggml_permute(ctx, h, 1, 2, 0, 3)), 7 * 7 * 16, batch)
    return x, G.ggml_mul_mat(ctx, w, flat), [k1, c1, k2, c2, w]


# name -> hand-built graph, physical batch, nbatch_logical, image data, default samples, default epochs
MODELS = {
    "mnist-fc": {"build": build_mlp, "batch": 500, "logical": 1000, "image": False, "samples": 12_000,
                 "epochs": 1},
    "cnn": {"build": build_cnn_f32, "batch": 100, "logical": None, "image": True, "samples": 2_000, "epochs": 1},
}


# ---------------------------------------------------------------- the two sides

def keras_model(name: str):
    """The same architectures with the model layer."""
    m = G.ggml_model_sequential()
    if name == "mnist-fc":
        m = G.ggml_layer_dense(m, 500, activation="relu", input_shape=(784,), name="fc1")
        m = G.ggml_layer_dense(m, 10, activation="softmax", name="fc2")
    else:
        m = G.ggml_layer_conv_2d(m, 8, (3, 3), activation="relu", padding="same", input_shape=(28, 28, 1),
                                 name="conv1")
        m = G.ggml_layer_max_pooling_2d(m, (2, 2))
        m = G.ggml_layer_conv_2d(m, 16, (3, 3), activation="relu", padding="same", name="conv2")
        m = G.ggml_layer_max_pooling_2d(m, (2, 2))
        m = G.ggml_layer_flatten(m)
        m = G.ggml_layer_dense(m, 10, activation="softmax", use_bias=False, name="out")
    return G.ggml_compile(m, optimizer="adamw", loss="categorical_crossentropy", backend="cpu")


# hand-built parameter order (bench_backends' build_*) -> model-layer weight names
WEIGHT_NAMES = {"mnist-fc": ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
                "cnn": ["conv1.kernel", "conv1.bias", "conv2.kernel", "conv2.bias", "out.weight"]}


def initial_weights(name: str, seed: int = 1) -> list[np.ndarray]:
    """One array per hand-built parameter, in ggml's order (4-d numpy shape = reversed ne), N(0, 0.05)."""
    ctx = G.ggml_init(16 << 20, no_alloc=True)
    try:
        _, _, params = MODELS[name]["build"](ctx, MODELS[name]["batch"])
        shapes = [tuple(reversed(tuple(p.shape))) for p in params]   # 4-d: ne padded with 1s
    finally:
        ctx.free()
    rng = np.random.default_rng(seed)
    return [rng.normal(scale=0.05, size=s).astype(np.float32) for s in shapes]


def to_user(name: str, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The hand-built weights in the model layer's (Keras) orientation, for ``ggml_set_weights``."""
    out = {}
    for key, a in zip(WEIGHT_NAMES[name], arrays):
        if key.endswith(".kernel"):      # ggml (filters, cin, kh, kw) -> Keras (kh, kw, cin, filters)
            a = np.transpose(a, (2, 3, 1, 0))
        elif key.endswith(".weight"):    # ggml (units, fan_in) -> Keras (fan_in, units)
            a = a.reshape(a.shape[-2:]).T
        else:                            # biases: one value per unit / channel
            a = a.reshape(-1)
        out[key] = np.ascontiguousarray(a)
    return out


class Timer:
    """ggmlR callback: the time of the first ``on_epoch_begin`` and of the last ``on_epoch_end``."""

    def __init__(self) -> None:
        self.begin = self.end = None
        self.cb = {"on_epoch_begin": self._begin, "on_epoch_end": self._end}

    def _begin(self, epoch, logs, state):
        if self.begin is None:
            self.begin = time.perf_counter()

    def _end(self, epoch, logs, state):
        self.end = time.perf_counter()


def _result(hist, timer: Timer, t0: float, t1: float, batch: int, steps: int) -> dict:
    seconds = timer.end - timer.begin
    return {"samples": steps * batch, "seconds": seconds, "samples_per_s": steps * batch / seconds,
            "call_s": t1 - t0, "call_samples_per_s": steps * batch / (t1 - t0),
            "loss": hist["train_loss"].tolist()}


def run_hand_built(name: str, backend, init: list[np.ndarray], x: np.ndarray, y: np.ndarray, epochs: int) -> dict:
    spec = MODELS[name]
    batch = spec["batch"]
    batches = [(x[i:i + batch], y[i:i + batch]) for i in range(0, len(x) - batch + 1, batch)]

    def generator():
        yield from batches

    sched = G.ggml_backend_sched_new([backend], parallel=False)
    ctx = G.ggml_init(64 << 20, no_alloc=True)
    try:
        inp, out, params = spec["build"](ctx, batch)
        G.ggml_backend_alloc_ctx_tensors(ctx, backend)
        for p, a in zip(params, init):
            G.ggml_backend_tensor_set_data(p, a)
        timer = Timer()
        t0 = time.perf_counter()
        hist = G.ggml_fit_opt_gen(sched, ctx, inp, out, generator, epochs=epochs,
                                  loss_type=G.ggml_opt_loss_type_cross_entropy(),
                                  optimizer=G.ggml_opt_optimizer_type_adamw(), nbatch_logical=spec["logical"],
                                  callbacks=[timer.cb], silent=True)
        t1 = time.perf_counter()
    finally:
        sched.free()
        ctx.free()
    return _result(hist, timer, t0, t1, batch, int(hist["steps"].sum()))


def run_model(name: str, model, init_user: dict, x: np.ndarray, y: np.ndarray, epochs: int) -> dict:
    spec = MODELS[name]
    G.ggml_set_weights(model, init_user)  # every run starts from the same weights (fresh AdamW state per fit)
    timer = Timer()
    t0 = time.perf_counter()
    hist = G.ggml_fit(model, x, y, epochs=epochs, batch_size=spec["batch"], verbose=0, callbacks=[timer.cb],
                      shuffle=False, nbatch_logical=spec["logical"])
    t1 = time.perf_counter()
    steps_per_epoch = -(-len(x) // spec["batch"])  # ggml_fit's history has no steps column: every sample, every epoch
    return _result(hist, timer, t0, t1, spec["batch"], len(hist) * steps_per_epoch)


# ---------------------------------------------------------------- one model, alternating

def bench(name: str, backend, samples: int, epochs: int, reps: int) -> dict:
    spec = MODELS[name]
    x_hb, y = make_data(samples, spec["image"])           # (N, 784) or (N, 1, 28, 28): ggml layout
    x_model = x_hb.reshape(samples, 28, 28, 1) if spec["image"] else x_hb   # Keras: channels last (C=1: same bytes)
    init = initial_weights(name)
    init_user = to_user(name, init)
    model = keras_model(name)
    logical = spec["logical"] or spec["batch"]
    print(f"\n== {name}: batch {spec['batch']} (logical {logical}), {samples} samples x {epochs} epochs, "
          f"{reps} alternating pairs; hand-built graph: {spec['build'].__name__}")
    try:
        # warm-up (page faults, thread pool, first allocations), not counted
        run_hand_built(name, backend, init, x_hb, y, 1)
        run_model(name, model, init_user, x_model, y, 1)
        hb, md, pairs, call_pairs, loss_diff = [], [], [], [], []
        for rep in range(reps):
            if rep % 2 == 0:   # swap the order every pair (A B, B A, ...): neither side always goes first
                a = run_hand_built(name, backend, init, x_hb, y, epochs)
                b = run_model(name, model, init_user, x_model, y, epochs)
            else:
                b = run_model(name, model, init_user, x_model, y, epochs)
                a = run_hand_built(name, backend, init, x_hb, y, epochs)
            hb.append(a["samples_per_s"])
            md.append(b["samples_per_s"])
            pairs.append(b["samples_per_s"] / a["samples_per_s"])
            call_pairs.append(b["call_samples_per_s"] / a["call_samples_per_s"])
            loss_diff.append(max(abs(p - q) for p, q in zip(a["loss"], b["loss"])))
            print(f"  pair {rep + 1}: hand-built {a['samples_per_s']:8,.0f}  model {b['samples_per_s']:8,.0f} "
                  f"samples/s  ratio {pairs[-1]:.3f}  (whole call {call_pairs[-1]:.3f}; loss "
                  f"{b['loss'][0]:.4f} -> {b['loss'][-1]:.4f}, |model - hand-built| {loss_diff[-1]:.1e})")
    finally:
        model.runtime.free()
    best = max(md) / max(hb)
    med_pairs = statistics.median(pairs)
    for label, v in (("hand-built (fit_opt_gen)", hb), ("model layer (ggml_fit)", md)):
        print(f"  {label:26s} best {max(v):8,.0f}  median {statistics.median(v):8,.0f}  "
              f"slowest {min(v):8,.0f} samples/s")
    if max(loss_diff) > 1e-4:
        print(f"  NOTE: the losses differ (by up to {max(loss_diff):.1e}): the two sides do not compute the same "
              "graph, so the ratio includes that difference, not only the model layer's overhead")
    print(f"  model / hand-built: best {best:.3f}, medians {statistics.median(md) / statistics.median(hb):.3f}, "
          f"per pair [{', '.join(f'{p:.2f}' for p in pairs)}] (median {med_pairs:.3f}); whole call incl. setup: "
          f"median {statistics.median(call_pairs):.3f}")
    return {"hand_built": hb, "model": md, "pair_ratios": pairs, "pair_ratio_median": med_pairs, "ratio": best,
            "ratio_medians": statistics.median(md) / statistics.median(hb), "call_pair_ratios": call_pairs,
            "max_loss_diff": max(loss_diff), "samples": samples, "epochs": epochs, "batch": spec["batch"],
            "nbatch_logical": logical, "target": TARGET, "met": best >= TARGET}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mnist-fc,cnn", help="comma-separated: mnist-fc, cnn (default both)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs per timed run (default 1)")
    ap.add_argument("--samples", type=int, default=None,
                    help="synthetic samples (default 12000 for mnist-fc, 2000 for cnn); a multiple of the "
                         "logical batch")
    ap.add_argument("--reps", type=int, default=8, help="alternating pairs per model (default 8)")
    ap.add_argument("--cnn-conv", choices=("f32", "ggml"), default="f32",
                    help="hand-built CNN convolutions: f32 = float32 im2col, the model layer's graph (default); "
                         "ggml = ggml_conv_2d (float16 im2col): bench_backends' cnn-f16")
    ap.add_argument("--threads", type=int, default=2, help="ggml CPU threads (default 2)")
    ap.add_argument("--quick", action="store_true", help="tiny settings for a CI smoke test")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    for n in names:
        if n not in MODELS:
            ap.error(f"unknown model {n!r}; expected {', '.join(MODELS)}")
    if args.quick:
        args.reps = 2
    if args.cnn_conv == "ggml":
        MODELS["cnn"]["build"] = build_cnn_f16

    G.ggml_set_n_threads(args.threads)
    backend = G.ggml_backend_cpu_init()
    print(f"ggmlpy {G.__version__} / ggml {G.GGML_VERSION}, Python {platform.python_version()}, "
          f"{args.threads} threads, CPU backend; model layer (ggml_fit on arrays) vs hand-built graph "
          f"(ggml_fit_opt_gen), alternating in one process")
    print(f"load average at start: {loadavg()}")
    results = {}
    note = " [--quick: smoke settings, not a measurement]" if args.quick else ""
    for n in names:
        spec = MODELS[n]
        logical = spec["logical"] or spec["batch"]
        samples = args.samples or (spec["samples"] // 2 if args.quick else spec["samples"])
        samples -= samples % logical
        if samples < logical:
            ap.error(f"--samples must be at least {logical} for {n}")
        epochs = args.epochs or (1 if args.quick else spec["epochs"])
        results[n] = bench(n, backend, samples, epochs, args.reps)
    print()
    for n, r in results.items():
        print(f"TARGET {'MET' if r['met'] else 'MISSED'}: {n}, model layer / hand-built = {r['ratio']:.3f} "
              f"(best of {args.reps}; per-pair median {r['pair_ratio_median']:.3f}; target >= {TARGET}){note}")
    print(f"load average at end: {loadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {"threads": args.threads, "reps": args.reps, "quick": args.quick,
                                  "cnn_conv": args.cnn_conv,
                                  "ggml": G.GGML_VERSION, "ggmlpy": G.__version__,
                                  "python": platform.python_version(), "loadavg_end": loadavg()},
                       "models": results}, f, indent=2)
        print(f"results written to {args.json}")
    G.ggml_backend_free(backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
