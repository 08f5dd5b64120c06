"""The ag_* engine against the model layer and PyTorch eager on the same model, optimizer and batches (issue 45).

Sides, each in a fresh process, rotated round by round (best run of each side, and the median):
- ``ag``: the model written with ag_* (``ag_sequential`` / the layers), a PyTorch-style loop: ``ag_tensor`` of the
  batch, ``with_grad_tape``, ``backward``, ``optimizer_adam.step``, ``zero_grad``;
- ``model``: the same model in the model layer, ``ggml_fit`` over the same arrays (one epoch, no shuffling);
- ``torch``: PyTorch eager, same layers and Adam, ``torch.set_num_threads`` as ggml's threads.

Models: ``mlp`` (MNIST-FC 784-500-10, batch 500) and ``block`` (a pre-norm transformer block over 64 character
embeddings of 64 features, 4 heads, an MLP of 128, next-character loss; batch = one sequence, as ggmlR's ag_*
attention is per sequence). Targets (issue 45): ag >= 0.9x the model layer; ag >= 1.0x PyTorch eager (the MLP).

Usage: python benchmarks/bench_autograd.py [--model mlp|block] [--rounds N] [--threads N]
       [--torch-python PATH] (an interpreter with PyTorch, when this one has none) [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import best_median, rotated, run_json_worker, torch_missing  # noqa: E402 - the benchmarks' folder


BATCHES = {"mlp": 60, "block": 200}
WARMUP = 3


def data(model: str):
    import numpy as np
    rng = np.random.default_rng(0)
    if model == "mlp":
        n = BATCHES[model] * 500
        x = rng.random((n, 784), dtype=np.float32)
        y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, n)]
        return x, y
    text = rng.integers(0, 32, BATCHES[model] * 64 + 1)
    return text, None


def run_ag(model: str, threads: int) -> float:
    import numpy as np

    import ggmlpy as g
    g.ggml_set_n_threads(threads)
    np.random.seed(1)
    x, y = data(model)
    if model == "mlp":
        net = g.ag_sequential(g.ag_linear(784, 500, "relu"), g.ag_linear(500, 10))
        opt = g.optimizer_adam(net.parameters(), lr=1e-3)

        def step(i: int) -> None:
            xb = g.ag_tensor(x[i * 500:(i + 1) * 500])
            with g.with_grad_tape():
                loss = g.ag_softmax_cross_entropy_loss(net(xb), y[i * 500:(i + 1) * 500])
            g.backward(loss)
            opt.step()
            opt.zero_grad()
        samples = 500
    else:
        emb, pos = g.ag_embedding(32, 64), g.ag_param(np.random.randn(64, 64) * 0.02)
        ln1, att, ln2 = g.ag_layer_norm(64), g.ag_multihead_attention(64, 4), g.ag_layer_norm(64)
        mlp = g.ag_sequential(g.ag_linear(64, 128, "relu"), g.ag_linear(128, 64))
        head = g.ag_linear(64, 32)
        params = {"pos": pos}
        for name, m in (("emb", emb), ("ln1", ln1), ("att", att), ("ln2", ln2), ("mlp", mlp), ("head", head)):
            params.update({f"{name}_{k}": v for k, v in m.parameters().items()})
        opt = g.optimizer_adam(params, lr=1e-3)

        def step(i: int) -> None:
            seq = x[i * 64:(i + 1) * 64 + 1]
            with g.with_grad_tape():
                h = g.ag_add(emb(seq[:-1]), pos)
                h = g.ag_add(h, att(ln1(h), causal_mask=True))
                h = g.ag_add(h, mlp(ln2(h)))
                loss = g.ag_softmax_cross_entropy_loss(head(h), seq[1:])
            g.backward(loss)
            opt.step()
            opt.zero_grad()
        samples = 64
    for i in range(WARMUP):
        step(i)
    g.ag_tensor([0.0]).numpy()
    t0 = time.perf_counter()
    for i in range(BATCHES[model]):
        step(i)
    float(opt.params[0][1].numpy().reshape(-1)[0])   # the last step done
    return BATCHES[model] * samples / (time.perf_counter() - t0)


def run_model(model: str, threads: int) -> float:
    import numpy as np

    import ggmlpy as g
    g.ggml_set_n_threads(threads)
    np.random.seed(1)
    x, y = data(model)
    if model == "mlp":
        m = g.ggml_layer_dense(g.ggml_model_sequential(), 500, activation="relu", input_shape=(784,))
        m = g.ggml_compile(g.ggml_layer_dense(m, 10, activation="softmax"), optimizer="adam",
                           loss="categorical_crossentropy", backend="cpu")
        batch = 500
    else:   # the same block: one sequence per step, next-character targets
        text = x
        x = np.stack([text[i * 64:(i + 1) * 64] for i in range(BATCHES[model])]).astype(np.int32)
        y = np.stack([text[i * 64 + 1:(i + 1) * 64 + 1] for i in range(BATCHES[model])]).astype(np.int32)
        ids = g.ggml_input((64,), dtype="int32")
        h = g.ggml_layer_position_embedding(g.ggml_layer_embedding(ids, 32, 64), 64)
        h = g.ggml_layer_add([h, g.ggml_layer_multi_head_attention(g.ggml_layer_layer_norm(h), 4, 16, causal=True)])
        f = g.ggml_layer_dense(g.ggml_layer_layer_norm(h), 128, activation="relu")
        h = g.ggml_layer_add([h, g.ggml_layer_dense(f, 64)])
        out = g.ggml_layer_dense(h, 32, activation="softmax")
        m = g.ggml_compile(g.ggml_model(ids, out), optimizer="adam", loss="sparse_categorical_crossentropy",
                           backend="cpu")
        batch = 1
    g.ggml_fit(m, x[:WARMUP * batch], y[:WARMUP * batch], epochs=1, batch_size=batch, shuffle=False, verbose=0)
    t0 = time.perf_counter()
    g.ggml_fit(m, x, y, epochs=1, batch_size=batch, shuffle=False, verbose=0)
    return len(x) * (64 if model == "block" else 1) / (time.perf_counter() - t0)


def run_torch(model: str, threads: int) -> float:
    import numpy as np
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    x, y = data(model)
    if model == "mlp":
        net = torch.nn.Sequential(torch.nn.Linear(784, 500), torch.nn.ReLU(), torch.nn.Linear(500, 10))
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y.argmax(1))

        def step(i: int) -> None:
            loss = torch.nn.functional.cross_entropy(net(xt[i * 500:(i + 1) * 500]), yt[i * 500:(i + 1) * 500])
            opt.zero_grad()
            loss.backward()
            opt.step()
        samples = 500
    else:
        class Block(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb, self.pos = torch.nn.Embedding(32, 64), torch.nn.Parameter(torch.randn(64, 64) * 0.02)
                self.ln1, self.ln2 = torch.nn.LayerNorm(64), torch.nn.LayerNorm(64)
                self.qkv, self.o = torch.nn.Linear(64, 192, bias=False), torch.nn.Linear(64, 64)
                self.mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
                self.head = torch.nn.Linear(64, 32)

            def forward(self, s: torch.Tensor) -> torch.Tensor:
                h = self.emb(s) + self.pos
                q, k, v = self.qkv(self.ln1(h)).view(64, 3, 4, 16).permute(1, 2, 0, 3)
                a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                h = h + self.o(a.permute(1, 0, 2).reshape(64, 64))
                return self.head(h + self.mlp(self.ln2(h)))
        net = Block()
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        text = torch.from_numpy(np.asarray(x, dtype=np.int64))

        def step(i: int) -> None:
            seq = text[i * 64:(i + 1) * 64 + 1]
            loss = torch.nn.functional.cross_entropy(net(seq[:-1]), seq[1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
        samples = 64
    for i in range(WARMUP):
        step(i)
    t0 = time.perf_counter()
    for i in range(BATCHES[model]):
        step(i)
    return BATCHES[model] * samples / (time.perf_counter() - t0)


RUNNERS = {"ag": run_ag, "model": run_model, "torch": run_torch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(BATCHES), default="mlp")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--torch-python", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps({"rate": RUNNERS[a.one](a.model, a.threads)}))
        return
    torch_python = a.torch_python or (sys.executable if torch_missing() is None else None)
    sides = ["ag", "model"] + (["torch"] if torch_python else [])
    if not torch_python:
        print(f"{torch_missing()}: PyTorch is left out (pass --torch-python)")
    rates: dict[str, list[float]] = {s: [] for s in sides}
    script = os.path.abspath(__file__)
    for r in range(a.rounds):
        for side in rotated(sides, r):
            python = torch_python if side == "torch" else sys.executable
            out = run_json_worker([python, script, "--one", side, "--model", a.model, "--threads", str(a.threads)],
                                  threads=a.threads)
            rates[side].append(out["rate"])
    summary = {s: best_median(v) for s, v in rates.items()}
    for s, v in summary.items():
        print(f"{a.model} {s:>5}: best {v['best']:9.0f} samples/s, median {v['median']:9.0f}")
    for other, target in (("model", 0.9), ("torch", 1.0)):
        if other in summary:
            best = summary["ag"]["best"] / summary[other]["best"]
            med = summary["ag"]["median"] / summary[other]["median"]
            print(f"ag / {other}: {best:.2f} by best runs, {med:.2f} by medians (target >= {target})")
            summary[f"ag_over_{other}"] = {"best": best, "median": med, "target": target}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
