"""Training throughput (samples/s) of MNIST-FC and a small CNN on every available backend.

Each model trains with ggmlpy's ``ggml_fit_opt_gen`` (cross-entropy, AdamW, physical batch 500 and
logical batch 1000 for the MLP, 100 for the CNN) on synthetic MNIST-shaped data, on the CPU (the
default ``ggml_backend_sched_new("cpu")``: ggml's BLAS backend before the CPU backend when built, and
the CPU backend alone) and on every GPU device this build and machine have (Vulkan, CUDA; with
GGML_VK_VISIBLE_DEVICES=0 also Mesa's CPU Vulkan device). PyTorch on the CPU runs the same models and
batches when it is installed, alternated with ggmlpy's default CPU path (--rounds times, best kept).
The first epoch is a warm-up and is not timed. Ratios are against ggml's plain CPU run and against
PyTorch; the targets of issue 8 (MNIST-FC >= 1.0x PyTorch, the CNN >= 0.5x) are checked.

Usage: python benchmarks/bench_backends.py [--quick] [--samples N] [--epochs N] [--rounds N] [--threads N]
       [--backends cpu,vulkan,cuda]
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


def conv_2d_f32(ctx, kernel, x, pad):
    """A stride-1 convolution as the model layer builds it: an F32 im2col and one matrix product.
    (ggml's own ``ggml_conv_2d``, which ggml's MNIST example uses, makes an F16 im2col: every
    activation rounded to half precision, and 2-3x slower on the CPU, mostly converting back.)"""
    kw, kh, cin, cout = kernel.shape[:4]
    cols = G.ggml_im2col(ctx, kernel, x, 1, 1, pad, pad, 1, 1, True, G.GGML_TYPE_F32)  # [Cin*KH*KW, OW, OH, N]
    k, ow, oh, n = cols.shape[:4]
    y = G.ggml_mul_mat(ctx, G.ggml_reshape_2d(ctx, cols, k, ow * oh * n),
                       G.ggml_reshape_2d(ctx, kernel, kw * kh * cin, cout))        # [OW*OH*N, Cout]
    return G.ggml_cont(ctx, G.ggml_permute(ctx, G.ggml_reshape_4d(ctx, y, ow, oh, n, cout), 0, 1, 3, 2))


def ggml_conv_2d_f16(ctx, kernel, x, pad):
    """ggml's own ``ggml_conv_2d`` (F16 im2col), as ggml's MNIST example uses it: model ``cnn-f16``."""
    return G.ggml_conv_2d(ctx, kernel, x, 1, 1, pad, pad, 1, 1)


def build_cnn(ctx, batch, conv=conv_2d_f32):
    """ggml's MNIST CNN: conv3x3(1->8)+relu, maxpool2, conv3x3(8->16)+relu, maxpool2, dense(784->10),
    with the model layer's F32 convolutions."""
    x = G.ggml_set_input(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 28, 28, 1, batch))
    k1 = G.ggml_set_param(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 3, 3, 1, 8))
    c1 = G.ggml_set_param(G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 1, 1, 8))
    k2 = G.ggml_set_param(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 3, 3, 8, 16))
    c2 = G.ggml_set_param(G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 1, 1, 16))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 7 * 7 * 16, N_CLASSES))
    h = G.ggml_relu(ctx, G.ggml_add(ctx, conv(ctx, k1, x, 1), c1))
    h = G.ggml_pool_2d(ctx, h, G.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0)
    h = G.ggml_relu(ctx, G.ggml_add(ctx, conv(ctx, k2, h, 1), c2))
    h = G.ggml_pool_2d(ctx, h, G.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0)
    flat = G.ggml_reshape_2d(ctx, G.ggml_cont(ctx, G.ggml_permute(ctx, h, 1, 2, 0, 3)), 7 * 7 * 16, batch)
    return x, G.ggml_mul_mat(ctx, w, flat), [k1, c1, k2, c2, w]


def build_cnn_f16(ctx, batch):
    return build_cnn(ctx, batch, conv=ggml_conv_2d_f16)


MODELS = {"mnist-fc": (build_mlp, 500, False), "cnn": (build_cnn, 100, True),
          "cnn-f16": (build_cnn_f16, 100, True)}  # not run by default: --models cnn-f16
LOGICAL = {"mnist-fc": 1000}  # optimizer step every this many samples (gradients accumulated)
TARGETS = {"mnist-fc": 1.0, "cnn": 0.5}  # ggmlpy's default CPU path / PyTorch CPU (issue 8)
DEFAULT_CPU = "default"  # ggml_backend_sched_new("cpu"): BLAS + CPU when built


def ggml_throughput(device: str | None, model: str, x_all, y_all, epochs: int) -> float:
    """``device``: a device name, None for a plain CPU backend, DEFAULT_CPU for ``sched_new("cpu")``."""
    build, batch, _ = MODELS[model]
    if device == DEFAULT_CPU:
        sched = G.ggml_backend_sched_new("cpu", parallel=False)
        backend = None
        host = sched.backends[-1]
    else:
        backend = G.ggml_backend_init_by_name(device) if device else G.ggml_backend_cpu_init()
        sched = G.ggml_backend_sched_new([backend], parallel=False)
        host = backend
    ctx = G.ggml_init(64 << 20, no_alloc=True)
    x, out, params = build(ctx, batch)
    G.ggml_backend_alloc_ctx_tensors(ctx, host)
    rng = np.random.default_rng(1)
    for p in params:
        G.ggml_backend_tensor_set_data(p, rng.normal(scale=0.05, size=p.nelements()))
    n = len(x_all) // batch
    batches = [(x_all[i * batch:(i + 1) * batch], y_all[i * batch:(i + 1) * batch]) for i in range(n)]
    times = []
    cb = {"on_epoch_begin": lambda e, logs, s: times.append(time.perf_counter())}
    try:
        G.ggml_fit_opt_gen(sched, ctx, x, out, batches, epochs=epochs + 1, callbacks=[cb], silent=True,
                           loss_type=G.ggml_opt_loss_type_cross_entropy(), nbatch_logical=LOGICAL.get(model))
        end = time.perf_counter()
    finally:
        sched.free()
        ctx.free()
        if backend is not None:
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
    period = LOGICAL.get(model, batch) // batch  # physical batches per optimizer step
    start = 0.0
    for epoch in range(epochs + 1):
        if epoch == 1:
            start = time.perf_counter()
        for i in range(n):
            loss = torch.nn.functional.cross_entropy(net(xs[i * batch:(i + 1) * batch]), ys[i * batch:(i + 1) * batch])
            (loss / period).backward()
            if (i + 1) % period == 0:
                opt.step()
                opt.zero_grad(set_to_none=True)
    return n * batch * epochs / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None, help="ggmlpy/PyTorch alternations (best kept)")
    ap.add_argument("--quick", action="store_true", help="small sizes, for CI smoke runs")
    ap.add_argument("--backends", default="cpu,vulkan,cuda", help="families to try (absent ones are reported)")
    ap.add_argument("--models", default="mnist-fc,cnn", help=f"of {', '.join(MODELS)}")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    if args.threads != G.ggml_get_n_threads():
        G.ggml_set_n_threads(args.threads)  # else ggmlpy's defaults: the per-graph CPU/BLAS thread split
    samples = args.samples or (3000 if args.quick else 12000)
    epochs = args.epochs or (1 if args.quick else 3)
    rounds = args.rounds or (1 if args.quick else 3)
    wanted = [b.strip().lower() for b in args.backends.split(",")]
    has_blas = G.ggml_backend_dev_by_name("BLAS") is not None
    devices: list[tuple[str, str | None]] = []
    if "cpu" in wanted:
        devices.append(("CPU", None))  # ggml's own CPU kernels: the baseline of the ratios
    for d in G.ggml_backend_devices():
        family = d.backend_name.lower()
        if d.type == "gpu" and family in wanted:
            devices.append((f"{d.name} ({d.description})", d.name))
    missing = [f for f in wanted if f != "cpu" and not any(n and n.lower().startswith(f) for _, n in devices)]
    default_label = "BLAS+CPU (default)" if has_blas else "CPU (default; no BLAS built)"
    rows, verdicts = [], []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        x_all, y_all = make_data(samples, MODELS[model][2])
        base = None
        for label, device in devices:
            rate = ggml_throughput(device, model, x_all, y_all, epochs)
            base = base or rate
            rows.append((model, f"ggmlpy {label}", rate, rate / base))
        mine, theirs = [], []  # alternated, so both see the same machine load
        for _ in range(rounds if "cpu" in wanted else 0):
            mine.append(ggml_throughput(DEFAULT_CPU, model, x_all, y_all, epochs) if has_blas else base)
            rate = torch_throughput(model, x_all, y_all, epochs)
            if rate is not None:
                theirs.append(rate)
        if mine and has_blas:
            rows.append((model, f"ggmlpy {default_label}", max(mine), max(mine) / base))
        if theirs:
            rows.append((model, "PyTorch CPU", max(theirs), max(theirs) / base))
            ratio = max(mine) / max(theirs)
            target = TARGETS.get(model)
            ok = "no target" if target is None else \
                f"target >= {target:.1f}x: {'met' if ratio >= target else 'NOT met'}"
            verdicts.append(f"{model}: ggmlpy {default_label} / PyTorch CPU = {ratio:.2f}x "
                            f"({ok}; per round: " + ", ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(mine, theirs)) + ")")
    print(f"\n{args.threads} thread(s), load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'model':10} {'backend':48} {'samples/s':>11} {'vs ggml CPU':>12}")
    for model, label, rate, ratio in rows:
        print(f"{model:10} {label:48} {rate:11.0f} {ratio:12.2f}")
    for line in verdicts:
        print(line)
    if not verdicts and "cpu" in wanted:
        print("PyTorch is not installed: no ratios against it (pip install torch)")
    if missing:
        print(f"\nnot available here: {', '.join(missing)} (not built, or no device)")


if __name__ == "__main__":
    main()
