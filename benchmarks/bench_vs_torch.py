"""Training throughput of four models built with ggmlpy's model layer, next to the same models in PyTorch,
and optionally next to another ggmlpy build (an older ggml, a branch) in the same run.

Models (ggmlpy: ``ggml_compile`` + ``ggml_fit`` on arrays, Adam(W) lr 1e-3, synthetic data; PyTorch: the same
architecture as ``torch.nn`` modules, the same batches, Adam(W) with ggml's defaults):

    mnist-fc     784-500(relu)-10, batch 500
    cnn          28x28x1, conv 3x3 8 relu (same), max-pool 2, conv 3x3 16 relu (same), max-pool 2, dense 10;
                 batch 100
    lstm         LSTM(64) over 40 steps of 16 features (Keras' gates), dense 10 on the last state; batch 64
    transformer  examples/char_transformer.py's model: vocab 98, 64 steps, dim 64, 2 heads, 2 pre-LN blocks
                 (causal MHA + GELU MLP); batch 32 (tokens/s = samples/s x 64)

Each measurement is a fresh subprocess (``--worker``) that trains two epochs and reports the second (the
first builds the graphs and allocations). Sides alternate (A B C A B C ...) so background load hits all of
them; the best run of each side is the least disturbed, so the ratios use best runs (medians are printed
too). ``--baseline-python PATH`` adds a third side: ggmlpy as installed for that interpreter (e.g. a virtual
environment with the previous ggml build), run from this same script, so the two builds train identical
models and its ratios against PyTorch are measured in the same run.

    python benchmarks/bench_vs_torch.py                               # all four, 3 rounds
    python benchmarks/bench_vs_torch.py --models cnn,lstm --rounds 5 --threads 2
    python benchmarks/bench_vs_torch.py --baseline-python /path/to/old-venv/bin/python --json out.json
    python benchmarks/bench_vs_torch.py --quick
    python benchmarks/bench_vs_torch.py --backend CUDA0 --models mnist-fc,cnn,transformer   # GPU vs torch CUDA
    python benchmarks/bench_vs_torch.py --precision bf16 --models mnist-fc,cnn,transformer --rounds 5

``--precision bf16`` (or ``f16``) runs four sides: ggmlpy in F32 and with ``ggml_compile(precision=...)``, PyTorch
in F32 and under ``torch.autocast(dtype=torch.bfloat16 / float16)`` (its CPU autocast: oneDNN's BF16 kernels, AMX
where the CPU has it), and prints the mixed-precision speedup of each library and ggmlpy's mixed precision against
PyTorch's.
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
from bench_common import best_median, rotated, run_json_worker, torch_missing  # noqa: E402


MODELS = ("mnist-fc", "cnn", "lstm", "transformer")
# samples per epoch (a few seconds of training on 2 cores) and batch size of each model
SIZES = {"mnist-fc": (10000, 500), "cnn": (5000, 100), "lstm": (5120, 64), "transformer": (1600, 32)}
QUICK_SIZES = {"mnist-fc": (2000, 500), "cnn": (400, 100), "lstm": (256, 64), "transformer": (128, 32)}
TOKENS = {"transformer": 64}   # tokens per sample (the unit of the transformer's figures)
LR = 1e-3


def data(model: str, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    if model == "mnist-fc":
        return rng.random((n, 784), dtype=np.float32), rng.integers(0, 10, n)
    if model == "cnn":
        return rng.random((n, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, n)
    if model == "lstm":
        return rng.normal(size=(n, 40, 16)).astype(np.float32), rng.integers(0, 10, n)
    return rng.integers(0, 98, (n, 64)).astype(np.int32), rng.integers(0, 98, (n, 64))


# ---------------------------------------------------------------- ggmlpy side

def ggml_model(model: str, backend: str = "cpu", precision: str = "f32"):
    import ggmlpy as g
    if model == "transformer":
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
        import char_transformer as ct
        return ct.build_model(64, 64, 2, 2, backend, LR, precision)
    m = g.ggml_model_sequential()
    if model == "mnist-fc":
        m = g.ggml_layer_dense(m, 500, activation="relu", input_shape=(784,))
    elif model == "cnn":
        m = g.ggml_layer_conv_2d(m, 8, (3, 3), activation="relu", padding="same", input_shape=(28, 28, 1))
        m = g.ggml_layer_max_pooling_2d(m, (2, 2))
        m = g.ggml_layer_conv_2d(m, 16, (3, 3), activation="relu", padding="same")
        m = g.ggml_layer_max_pooling_2d(m, (2, 2))
        m = g.ggml_layer_flatten(m)
    else:
        m = g.ggml_layer_lstm(m, 64, input_shape=(40, 16))
    m = g.ggml_layer_dense(m, 10, activation="softmax")
    return g.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend=backend,
                          learning_rate=LR, precision=precision)


def ggml_epoch_s(model: str, n: int, batch: int, threads: int, device: str,
                 precision: str = "f32") -> tuple[float, float, str]:
    import ggmlpy as g
    g.ggml_set_n_threads(threads)
    x, y = data(model, n)
    net = ggml_model(model, device, precision)
    stamps: list[float] = []
    cb = {"on_epoch_begin": lambda e, logs, s: stamps.append(time.perf_counter()),
          "on_epoch_end": lambda e, logs, s: stamps.append(time.perf_counter())}
    hist = g.ggml_fit(net, x, y, epochs=2, batch_size=batch, shuffle=False, verbose=0, callbacks=[cb])
    return stamps[3] - stamps[2], float(hist["train_loss"].iloc[-1]), g.ggml_version()


# ---------------------------------------------------------------- PyTorch side

def torch_net(model: str):
    import torch
    nn = torch.nn
    if model == "mnist-fc":
        return nn.Sequential(nn.Linear(784, 500), nn.ReLU(), nn.Linear(500, 10))
    if model == "cnn":
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(784, 10))
    if model == "lstm":
        class Last(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm, self.head = nn.LSTM(16, 64, batch_first=True), nn.Linear(64, 10)

            def forward(self, x):
                return self.head(self.lstm(x)[0][:, -1])
        return Last()
    sys.path.insert(0, HERE)
    import bench_transformer as bt
    return bt.CharTransformer({"seq": 64, "dim": 64, "heads": 2, "blocks": 2, "batch": 32})


def torch_epoch_s(model: str, n: int, batch: int, threads: int, device: str,
                  precision: str = "f32") -> tuple[float, float, str]:
    import contextlib

    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x, y = data(model, n)
    if model == "cnn":
        x = x.transpose(0, 3, 1, 2).copy()   # NCHW
    net = torch_net(model).to(device)
    xt = torch.from_numpy(x.astype(np.int64) if model == "transformer" else x).to(device)
    yt = torch.from_numpy(y.astype(np.int64)).to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    opt = (torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.01) if model == "transformer" else
           torch.optim.Adam(net.parameters(), lr=LR))
    loss_fn = torch.nn.functional.cross_entropy
    autocast = (contextlib.nullcontext if precision == "f32" else
                lambda: torch.autocast(device.split(":")[0], dtype=torch.bfloat16 if precision == "bf16" else
                                       torch.float16))
    seconds, loss = 0.0, 0.0
    for _ in range(2):
        sync()
        t = time.perf_counter()
        for i in range(0, n - batch + 1, batch):
            opt.zero_grad()
            with autocast():
                out = net(xt[i:i + batch])
                loss_v = loss_fn(out.reshape(-1, out.shape[-1]).float(), yt[i:i + batch].reshape(-1))
            loss_v.backward()
            opt.step()
            loss = float(loss_v)   # as ggmlpy, which reads each step's loss
        sync()
        seconds = time.perf_counter() - t
    return seconds, loss, torch.__version__


# ---------------------------------------------------------------- driver

def run_worker(python: str, side: str, model: str, n: int, batch: int, threads: int, device: str,
               precision: str = "f32") -> dict:
    cmd = [python, os.path.abspath(__file__), "--worker", side, model, str(n), str(batch), str(threads), device,
           precision]
    return run_json_worker(cmd, threads=threads)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--baseline-python", default=None, help="an interpreter with another ggmlpy build installed")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--backend", default="cpu", help="ggmlpy's device: cpu (default), Vulkan0, CUDA0, ...")
    ap.add_argument("--torch-device", default=None, help="PyTorch's device (default: cuda for a CUDA backend, else "
                    "cpu)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--precision", default=None, choices=["bf16", "f16"],
                    help="also train each library with mixed precision in this type (four sides)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", nargs=7, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        side, model, n, batch, threads, device, precision = args.worker
        fn = torch_epoch_s if side == "torch" else ggml_epoch_s
        seconds, loss, version = fn(model, int(n), int(batch), int(threads), device, precision)
        print(json.dumps({"seconds": seconds, "loss": loss, "version": version}))
        return 0
    sizes = QUICK_SIZES if args.quick else SIZES
    torch_device = args.torch_device or ("cuda" if args.backend.lower().startswith("cuda") else "cpu")
    rounds = 1 if args.quick else args.rounds
    # each side: the interpreter, the library, the products' type
    sides = {"ggmlpy": (sys.executable, "ggml", "f32")}
    if args.baseline_python:
        sides["baseline"] = (args.baseline_python, "ggml", "f32")
    if args.precision:
        sides[f"ggmlpy-{args.precision}"] = (sys.executable, "ggml", args.precision)
    if not args.no_torch:
        missing = torch_missing()
        if missing is None:
            sides["torch"] = (sys.executable, "torch", "f32")
            if args.precision:
                sides[f"torch-{args.precision}"] = (sys.executable, "torch", args.precision)
        else:
            print(f"{missing}: ggmlpy only (pip install torch)")
    results: dict = {"threads": args.threads, "rounds": rounds, "load": os.getloadavg()[0], "backend": args.backend,
                     "torch_device": torch_device, "models": {}}
    for model in args.models.split(","):
        n, batch = sizes[model]
        unit = TOKENS.get(model, 1)
        per = {s: [] for s in sides}
        versions = {}
        print(f"\n== {model}: {n} samples per epoch, batch {batch}, {args.threads} threads, {rounds} rounds; ggmlpy on "
              f"{args.backend}, PyTorch on {torch_device}")
        for r in range(rounds):
            order = rotated(list(sides), r)
            cells = []
            for side in order:
                python, kind, precision = sides[side]
                device = torch_device if kind == "torch" else args.backend
                out = run_worker(python, kind, model, n, batch, args.threads, device, precision)
                rate = n * unit / out["seconds"]
                per[side].append(rate)
                versions[side] = out["version"]
                cells.append(f"{side} {rate:9,.0f}/s (loss {out['loss']:.3f})")
            print(f"  round {r + 1}: " + "   ".join(cells))
        row = {s: dict(best_median(v), version=versions[s]) for s, v in per.items()}
        for s, v in row.items():
            print(f"  {s:9} ({v['version']}) best {v['best']:9,.0f}  median {v['median']:9,.0f} "
                  f"{'tokens' if unit > 1 else 'samples'}/s")
        if "torch" in row:
            for s in ("ggmlpy", "baseline"):
                if s in row:
                    row[f"{s}_vs_torch"] = row[s]["best"] / row["torch"]["best"]
                    print(f"  {s} / PyTorch (best runs): {row[f'{s}_vs_torch']:.2f}")
        if "baseline" in row:
            row["ggmlpy_vs_baseline"] = row["ggmlpy"]["best"] / row["baseline"]["best"]
            print(f"  ggmlpy / baseline (best runs): {row['ggmlpy_vs_baseline']:.2f}")
        if args.precision:
            half = args.precision
            pairs = [(f"ggmlpy-{half}", "ggmlpy"), (f"torch-{half}", "torch"), (f"ggmlpy-{half}", f"torch-{half}")]
            for a, b in pairs:
                if a in row and b in row:
                    row[f"{a}_vs_{b}"] = row[a]["best"] / row[b]["best"]
                    print(f"  {a} / {b} (best runs): {row[f'{a}_vs_{b}']:.2f}")
        results["models"][model] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
