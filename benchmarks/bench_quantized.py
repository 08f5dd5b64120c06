"""Quantized models (``ggml_save_model(..., quantize=...)``, loaded with their weights kept quantized): file size,
accuracy (or loss) and inference speed per type against F32, on the two example models: the digits CNN
(``examples/train_digits.py``) and the character-level transformer (``examples/char_transformer.py``, its
``--quick`` size).

Each model is trained once (CPU), saved in F32 and in each type, loaded back on ``--backend`` (the quantized weights
stay quantized there: the products run on ggml's quantized kernels) and scored on its held-out data: the digits'
test accuracy, the transformer's validation loss (nats per character); then ``ggml_predict`` of the held-out data is
timed (best of ``--rounds``, after a warm-up call) and reported as samples per second, and as a ratio to the F32
model measured in the same run. Issue 46's targets: q8_0 within 1 point of F32 accuracy, q4_0 within 3.

A third model measures speed alone where quantization pays: a 4096-wide MLP (134 MB of F32 weights) at batch sizes
1, 8 and 64, each type against F32 in the same run.

Usage: python benchmarks/bench_quantized.py [--types q8_0,q4_0,q4_K,q5_K,q6_K] [--backend cpu] [--rounds 7]
                                            [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_common import best_time  # noqa: E402 - the benchmarks' folder


def digits(types: list[str], workdir: Path, backend: str, rounds: int) -> list[dict]:
    import train_digits as td
    from sklearn.datasets import load_digits

    import ggmlpy as g
    np.random.seed(0)
    rng = np.random.default_rng(0)
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]
    y = d.target.astype(np.int64)
    perm = rng.permutation(len(y))
    test, train = perm[:360], perm[360:]
    model = td.build_model("cpu")
    g.ggml_fit(model, x[train], y[train], epochs=20, batch_size=td.BATCH, verbose=0)
    return [_score(model, t, workdir / f"digits-{t}.gguf",
                   lambda m: {"accuracy": float((g.ggml_predict_classes(m, x[test]) == y[test]).mean())},
                   lambda m: g.ggml_predict(m, x[test], batch_size=len(test)), len(test), backend, rounds)
            for t in ["f32"] + types]


def transformer(types: list[str], workdir: Path, backend: str, rounds: int) -> list[dict]:
    import char_transformer as ct

    import ggmlpy as g
    np.random.seed(0)
    cfg = ct.QUICK
    model = ct.build_model(cfg["seq"], cfg["dim"], cfg["heads"], cfg["blocks"], "cpu", cfg["lr"])
    train_files, val_files, _ = ct.corpus_files()
    g.ggml_fit_generator(model, ct.windows(train_files, cfg["seq"], cfg["batch"], seed=0),
                         steps_per_epoch=cfg["steps"], epochs=cfg["epochs"], verbose=0)
    val = list(ct.windows(val_files, cfg["seq"], cfg["batch"], seed=12345, passes=1, buffer=512))[:cfg["val_steps"]]
    xv = np.concatenate([b[0] for b in val])
    yv = np.concatenate([b[1] for b in val])

    def loss(m: object) -> dict:
        p = g.ggml_predict(m, xv)
        picked = np.take_along_axis(p, yv[..., None].astype(np.int64), axis=-1)[..., 0]
        return {"val_loss": float(-np.log(np.maximum(picked, 1e-30)).mean())}
    return [_score(model, t, workdir / f"transformer-{t}.gguf", loss,
                   lambda m: g.ggml_predict(m, xv, batch_size=len(xv)), len(xv), backend, rounds)
            for t in ["f32"] + types]


def wide_mlp(types: list[str], backend: str, rounds: int) -> list[dict]:
    """Inference speed only, where quantization pays: a 4096-wide MLP (two 4096 x 4096 layers and a head: 134 MB of
    F32 weights, beyond any cache), random weights, at batch sizes 1, 8 and 64 (a deployed model serving requests:
    reading the weights bounds the small batches)."""
    import ggmlpy as g
    x = np.random.default_rng(0).random((64, 4096), dtype=np.float32)
    rows = []
    for kind in ["f32"] + types:
        np.random.seed(0)
        m = g.ggml_model_sequential()
        m = g.ggml_layer_dense(m, 4096, activation="relu", input_shape=(4096,))
        m = g.ggml_layer_dense(m, 4096, activation="relu")
        m = g.ggml_layer_dense(m, 10)
        m = g.ggml_compile(m, loss="mse", backend=backend)
        if kind != "f32":
            g.ggml_quantize_model(m, kind)
        row: dict = {"type": kind, "quantized_tensors": len(g.ggml_model_quantization(m))}
        for batch in (1, 8, 64):
            xb = x[:max(batch, 8)]
            best = best_time(lambda m=m, xb=xb, batch=batch: g.ggml_predict(m, xb, batch_size=batch), rounds)
            row[f"batch_{batch}"] = len(xb) / best
        rows.append(row)
    return rows


def _score(model: object, kind: str, path: Path, metric, predict, samples: int, backend: str, rounds: int) -> dict:
    import ggmlpy as g
    g.ggml_save_model(model, str(path), quantize=None if kind == "f32" else kind)
    loaded = g.ggml_load_model(str(path), backend=backend)   # quantized weights stay quantized
    best = best_time(lambda: predict(loaded), rounds)   # the graph built and allocated by the first call
    return {"type": kind, "bytes": os.path.getsize(path), "quantized_tensors": len(g.ggml_model_quantization(loaded)),
            "samples_per_second": samples / best, **metric(loaded)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="q8_0,q4_0,q4_K,q5_K,q6_K")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    types = a.types.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        results = {"digits CNN": digits(types, Path(tmp), a.backend, a.rounds),
                   "char transformer": transformer(types, Path(tmp), a.backend, a.rounds)}
    for model, rows in results.items():
        base = rows[0]
        print(f"{model}:")
        for r in rows:
            metric = {k: v for k, v in r.items() if k in ("accuracy", "val_loss")}
            (name, value), = metric.items()
            delta = value - base[name]
            print(f"  {r['type']:>5}: {r['bytes']:8d} bytes ({r['bytes'] / base['bytes']:5.1%} of F32), "
                  f"{r['quantized_tensors']} tensors held quantized, {name} {value:.4f} ({delta:+.4f}), "
                  f"{r['samples_per_second']:,.0f} samples/s on {a.backend} "
                  f"({r['samples_per_second'] / base['samples_per_second']:.2f}x F32)")
    wide = wide_mlp(types, a.backend, a.rounds)
    print(f"4096-wide MLP, samples/s on {a.backend} at batch 1 / 8 / 64 (x F32):")
    for r in wide:
        cells = [f"{r[f'batch_{b}']:,.0f} ({r[f'batch_{b}'] / wide[0][f'batch_{b}']:.2f}x)" for b in (1, 8, 64)]
        print(f"  {r['type']:>5}: " + " / ".join(cells))
    results["wide MLP"] = wide
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
