"""Training throughput (samples/s) of MNIST-FC and a small CNN on every available backend.

Each model trains with ggmlpy's ``ggml_fit_opt_gen`` (cross-entropy, AdamW, physical batch 500 for
the MLP and 100 for the CNN) on synthetic MNIST-shaped data, on the CPU and on every GPU device this
build and machine have (Vulkan, CUDA; with GGML_VK_VISIBLE_DEVICES=0 also Mesa's CPU Vulkan device).
PyTorch on the CPU runs the same models and batches when it is installed. The first epoch is a
warm-up and is not timed. Ratios are against ggml's CPU run in this same process.

Usage: python benchmarks/bench_backends.py [--quick] [--samples N] [--epochs N] [--backends cpu,vulkan,cuda]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import ggmlpy as G

N_CLASSES = 10


def make_data(n: int, image: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    protos = (rng.random((N_CLASSES, 784)) < 0.2).astype(np.float32)
    y = rng.integers(0, N_CLASSES, n)
    x = np.clip(protos[y] * 0.7 + rng.random((n, 784), dtype=np.float32) * 0.5, 0, 1).astype(np.float32)
    onehot = np.eye(N_CLASSES, dtype=np.float32)[y]
    return (x.reshape(n, 1, 28, 28) if image else x), onehot


def build_mlp(ctx, batch):
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 784, batch))
    w1 = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 784, 500))
    b1 = G.ggml_set_param(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 500))
    w2 = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 500, N_CLASSES))
    b2 = G.ggml_set_param(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, N_CLASSES))
    h = G.ggml_relu(ctx, G.ggml_add(ctx, G.ggml_mul_mat(ctx, w1, x), b1))
    return x, G.ggml_add(ctx, G.ggml_mul_mat(ctx, w2, h), b2), [w1, b1, w2, b2]


def build_cnn(ctx, batch):
    """ggml's MNIST CNN: conv3x3(1->8)+relu, maxpool2, conv3x3(8->16)+relu, maxpool2, dense(784->10)."""
    x = G.ggml_set_input(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 28, 28, 1, batch))
    k1 = G.ggml_set_param(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 3, 3, 1, 8))
    c1 = G.ggml_set_param(G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 1, 1, 8))
    k2 = G.ggml_set_param(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 3, 3, 8, 16))
    c2 = G.ggml_set_param(G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 1, 1, 16))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 7 * 7 * 16, N_CLASSES))
    h = G.ggml_relu(ctx, G.ggml_add(ctx, G.ggml_conv_2d(ctx, k1, x, 1, 1, 1, 1, 1, 1), c1))
    h = G.ggml_pool_2d(ctx, h, G.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0)
    h = G.ggml_relu(ctx, G.ggml_add(ctx, G.ggml_conv_2d(ctx, k2, h, 1, 1, 1, 1, 1, 1), c2))
    h = G.ggml_pool_2d(ctx, h, G.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0)
    flat = G.ggml_reshape_2d(ctx, G.ggml_cont(ctx, G.ggml_permute(ctx, h, 1, 2, 0, 3)), 7 * 7 * 16, batch)
    return x, G.ggml_mul_mat(ctx, w, flat), [k1, c1, k2, c2, w]


MODELS = {"mnist-fc": (build_mlp, 500, False), "cnn": (build_cnn, 100, True)}


def ggml_throughput(device: str | None, model: str, x_all, y_all, epochs: int) -> float:
    build, batch, _ = MODELS[model]
    backend = G.ggml_backend_init_by_name(device) if device else G.ggml_backend_cpu_init()
    sched = G.ggml_backend_sched_new([backend], parallel=False)
    ctx = G.ggml_init(64 << 20, no_alloc=True)
    x, out, params = build(ctx, batch)
    G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    rng = np.random.default_rng(1)
    for p in params:
        G.ggml_backend_tensor_set_data(p, rng.normal(scale=0.05, size=p.nelements()))
    n = len(x_all) // batch
    batches = [(x_all[i * batch:(i + 1) * batch], y_all[i * batch:(i + 1) * batch]) for i in range(n)]
    times = []
    cb = {"on_epoch_begin": lambda e, logs, s: times.append(time.perf_counter())}
    try:
        G.ggml_fit_opt_gen(sched, ctx, x, out, batches, epochs=epochs + 1, callbacks=[cb], silent=True,
                           loss_type=G.ggml_opt_loss_type_cross_entropy())
        end = time.perf_counter()
    finally:
        sched.free()
        ctx.free()
        backend.free()
    return n * batch * epochs / (end - times[1])  # epoch 1 is the warm-up


def torch_throughput(model: str, x_all, y_all, epochs: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(G.ggml_get_n_threads())
    _, batch, image = MODELS[model]
    if model == "mnist-fc":
        net = torch.nn.Sequential(torch.nn.Linear(784, 500), torch.nn.ReLU(), torch.nn.Linear(500, N_CLASSES))
    else:
        net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                  torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                  torch.nn.Flatten(), torch.nn.Linear(7 * 7 * 16, N_CLASSES, bias=False))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.0)
    xs, ys = torch.from_numpy(np.ascontiguousarray(x_all)), torch.from_numpy(y_all.argmax(1))
    n = len(xs) // batch
    start = 0.0
    for epoch in range(epochs + 1):
        if epoch == 1:
            start = time.perf_counter()
        for i in range(n):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(net(xs[i * batch:(i + 1) * batch]), ys[i * batch:(i + 1) * batch])
            loss.backward()
            opt.step()
    return n * batch * epochs / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="small sizes, for CI smoke runs")
    ap.add_argument("--backends", default="cpu,vulkan,cuda", help="families to try (absent ones are reported)")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    G.ggml_set_n_threads(args.threads)
    samples = args.samples or (3000 if args.quick else 12000)
    epochs = args.epochs or (1 if args.quick else 3)
    wanted = [b.strip().lower() for b in args.backends.split(",")]
    devices: list[tuple[str, str | None]] = [("CPU", None)] if "cpu" in wanted else []
    for d in G.ggml_backend_devices():
        family = d.backend_name.lower()
        if d.type == "gpu" and family in wanted:
            devices.append((f"{d.name} ({d.description})", d.name))
    missing = [f for f in wanted if f != "cpu" and not any(n and n.lower().startswith(f) for _, n in devices)]
    rows = []
    for model in MODELS:
        x_all, y_all = make_data(samples, MODELS[model][2])
        base = None
        for label, device in devices:
            rate = ggml_throughput(device, model, x_all, y_all, epochs)
            base = base or rate
            rows.append((model, f"ggmlpy {label}", rate, rate / base))
        rate = torch_throughput(model, x_all, y_all, epochs)
        if rate is not None:
            rows.append((model, "PyTorch CPU", rate, rate / base if base else float("nan")))
    print(f"\n{'model':10} {'backend':48} {'samples/s':>11} {'vs ggml CPU':>12}")
    for model, label, rate, ratio in rows:
        print(f"{model:10} {label:48} {rate:11.0f} {ratio:12.2f}")
    if missing:
        print(f"\nnot available here: {', '.join(missing)} (not built, or no device)")


if __name__ == "__main__":
    main()
