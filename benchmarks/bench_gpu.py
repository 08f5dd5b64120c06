"""GPU-sized training benchmarks: a CNN, a transformer and an MLP built with ggmlpy's model layer, next to the same
models in PyTorch on the same device and precision, with each step split into device compute and host overhead.

Models (ggmlpy: ``ggml_compile`` + ``ggml_fit`` on arrays; PyTorch: the same architecture as ``torch.nn`` modules
from the same initial weights; both AdamW with ggml's defaults, lr 1e-3, weight decay 0.01, sparse cross-entropy,
synthetic data):

    cnn-gpu          32x32x3 images: conv 3x3 64 relu (same), conv 64, max-pool 2, conv 128, conv 128, max-pool 2,
                     conv 256, max-pool 2, global average pooling, dense 10 (softmax); batch 256
    transformer-gpu  examples/char_transformer.py's model (its ``build_model``; PyTorch: bench_transformer.py's copy):
                     vocabulary 98, sequence 256, dim 512, 8 heads of 64, 6 pre-LN blocks (causal MHA + GELU MLP 4x),
                     final layer norm, softmax over the vocabulary at every position; batch 32 (8,192 tokens a step)
    mlp-gpu          1024 -> 4096 -> 4096 -> 4096 -> 10, relu; batch 1024

``--size full`` is those sizes (meant for a GPU; the default on any backend but the CPU); ``--size reduced`` (the
default on the CPU, and what the tests run) keeps each architecture but shrinks it so that a CPU run takes seconds:
channels 8/16/32 and batch 32; dim 64, 2 heads, 2 blocks, sequence 64, batch 8; 256 -> 512 x 3 -> 10, batch 128.

Devices and precision: ``--backend`` is ggmlpy's device (cpu, CUDA0, Vulkan0, ...); PyTorch runs on CUDA for a CUDA
backend, and for any other GPU backend on CUDA when PyTorch has it, else on the CPU (the output and the JSON say
which; ``--torch-device`` overrides). ``--tf32 off`` (the default) computes float32 products in full float32 on both
sides; ``--tf32 on`` lets both use TF32: ggmlpy reads ``GGMLPY_CUDA_TF32`` (set to 1 or 0 in its workers'
environment before ggmlpy is imported, and ggml's own ``GGML_CUDA_TF32`` with it, which would win), PyTorch gets
``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` set the same way (cuDNN's default
would be on). Both are recorded in the JSON.
Everything is float32: ggmlpy's model layer has no mixed precision yet, so there is no AMP side. PyTorch keeps its
defaults otherwise (cuDNN's autotuner off, AdamW's foreach implementation, ``scaled_dot_product_attention`` for the
transformer, which on CUDA is a fused kernel where ggml materialises the T x T scores).

Method. Every measurement is a fresh subprocess (``--worker``). A first one per model (``init``) builds the ggmlpy
model with numpy's seed 0 and writes its initial weights for both sides, counts its parameters, evaluates the loss
of the first batch at those weights and records ``ggml_model_placement`` of one training step (the scheduler's
splits and the bytes copied between device and host per step; a step that stays on the device has one split and
no copies). Then the two sides alternate for ``--rounds`` rounds (ggmlpy, PyTorch; PyTorch, ggmlpy; ...), each run:

1. **Throughput**: trains two epochs of ``--steps`` batches from host (numpy) arrays, the second epoch timed:
   ggmlpy with ``ggml_fit(shuffle=False)``; PyTorch with a plain loop that copies each batch to the device and
   reads each step's loss (``float(loss)``), as ``ggml_fit`` does. Samples/s (tokens/s for the transformer) of the
   best and the median run of each side, and their ratios (best / best, median / median).
2. **Step split** (``--split-steps`` more steps on the first batch, after a warm-up step):
   - *step*: the wall time of one training step end to end (ggmlpy: ``ggml_trainer(model).step(x, y)``: the
     batch written to the device, the graph computed, the loss read back; PyTorch: the step above);
   - *compute*, ggmlpy: the same, already allocated training graph (forward, backward and AdamW) recomputed back
     to back by ggml-opt's C functions (``ggml_opt_alloc``, which returns at once for the allocated graph, and
     ``ggml_opt_eval`` without a result: the scheduler's compute and its synchronisation), no Python, no batch
     written, no loss read. On a GPU that is the device's time for the graph, plus whatever of ggml's own kernel
     launching the device does not hide (launches overlap the kernels already queued, so when the kernels are
     longer than their launches it is the kernel time); on the CPU it is the kernels with their thread pool.
   - *compute*, PyTorch: on CUDA the GPU's busy time per step from ``torch.profiler`` (the union of the kernel,
     memcpy and memset intervals that CUPTI reports; annotations left out); on the CPU none (the kernels run on
     the calling thread between the Python and the autograd engine's work, so the wall time is not split).
   - *host* = step - compute: what the step costs beyond the device's work (Python, the model layer's and
     ggml-opt's bookkeeping, the batch upload, the loss readback, launches the device waits for). It is a
     difference of two best-of-rounds times, so on a noisy machine it can come out slightly negative.
   The split is reported from the best (smallest) step and compute times over the rounds.

FLOPs per step is an estimate: 2 x the multiply-adds of the forward pass's products and convolutions (the
transformer's attention scores and values over the full T x T square, as ggml computes them), times 3 for a
training step (forward, and the backward's input and weight gradients; the first layer has no input gradient);
element-wise work, the norms, the optimizer and the embedding lookups are not counted. It equals
``torch.utils.flop_counter``'s count of the PyTorch model's step, attention aside (tests/public/test_bench_gpu.py).
TFLOP/s = FLOPs per step x steps/s, the same count for both sides (model FLOPs, not what each executes). The JSON
also has each side's memory: ggmlpy's scheduler buffers (the step's activations and gradients; the weights and
AdamW's moments are ``4 x 3 x params`` bytes besides) and, on CUDA, PyTorch's peak allocated memory.

    python benchmarks/bench_gpu.py --quick                                  # reduced sizes, CPU, seconds
    python benchmarks/bench_gpu.py --backend CUDA0 --tf32 off --json gpu.json   # full sizes vs torch CUDA
    python benchmarks/bench_gpu.py --backend CUDA0 --tf32 on --models transformer-gpu --rounds 5
    python benchmarks/bench_gpu.py --backend Vulkan0 --size full --rounds 2   # vs torch CUDA if present, else CPU
    python benchmarks/bench_gpu.py --size reduced --rounds 3 --threads 2 --no-torch
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_common import best_median, rotated, run_json_worker, torch_missing  # noqa: E402


MODELS = ("cnn-gpu", "transformer-gpu", "mlp-gpu")
CONFIGS = {
    "full": {
        "cnn-gpu": {"image": 32, "channels": [64, 128, 256], "batch": 256},
        "transformer-gpu": {"seq": 256, "dim": 512, "heads": 8, "blocks": 6, "batch": 32},
        "mlp-gpu": {"inputs": 1024, "width": 4096, "layers": 3, "batch": 1024},
    },
    "reduced": {
        "cnn-gpu": {"image": 32, "channels": [8, 16, 32], "batch": 32},
        "transformer-gpu": {"seq": 64, "dim": 64, "heads": 2, "blocks": 2, "batch": 8},
        "mlp-gpu": {"inputs": 256, "width": 512, "layers": 3, "batch": 128},
    },
}
STEPS = {"full": 20, "reduced": 24}          # batches per epoch (two epochs, the second timed)
SPLIT_STEPS = {"full": 10, "reduced": 4}    # steps timed for the step split (each way)
QUICK_STEPS, QUICK_SPLIT_STEPS = 4, 2
CLASSES = 10
LR, WEIGHT_DECAY = 1e-3, 0.01
TF32_ENV = "GGMLPY_CUDA_TF32"    # ggmlpy's switch (patches/0039); ggml's own, GGML_CUDA_TF32, would override it


def vocab() -> int:
    return _char_transformer().VOCAB


def _char_transformer():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import char_transformer
    return char_transformer


def describe(model: str, cfg: dict) -> str:
    if model == "cnn-gpu":
        return f"{cfg['image']}x{cfg['image']}x3, channels {'/'.join(map(str, cfg['channels']))}, batch {cfg['batch']}"
    if model == "transformer-gpu":
        return (f"dim {cfg['dim']}, {cfg['heads']} heads, {cfg['blocks']} blocks, sequence {cfg['seq']}, "
                f"batch {cfg['batch']}")
    return f"{cfg['inputs']} -> {cfg['width']} x {cfg['layers']} -> {CLASSES}, batch {cfg['batch']}"


def tokens_per_sample(model: str, cfg: dict) -> int:
    return cfg["seq"] if model == "transformer-gpu" else 1


def train_flops_per_sample(model: str, cfg: dict) -> tuple[int, int]:
    """(FLOPs of one sample's training step, the part of them in the attention scores and values): 2 x the
    multiply-adds of the forward products and convolutions, times 3 (forward, input and weight gradients) except
    the first layer's, whose input (the data) needs no gradient; the transformer's first layer is an embedding
    lookup (not counted), its attention the full T x T square as ggml computes it."""
    if model == "mlp-gpu":
        w = cfg["width"]
        first, rest = cfg["inputs"] * w, (cfg["layers"] - 1) * w * w + w * CLASSES
        return 2 * (2 * first + 3 * rest), 0
    if model == "cnn-gpu":
        macs, side, cin, first = 0, cfg["image"], 3, None
        for c in conv_plan(cfg):
            if c:
                here = side * side * cin * 9 * c
                first = here if first is None else first
                macs += here
                cin = c
            else:
                side //= 2
        return 2 * (3 * (macs + cin * CLASSES) - first), 0
    d, t = cfg["dim"], cfg["seq"]
    per_token = cfg["blocks"] * (4 * d * d + 8 * d * d) + d * vocab()   # q, k, v, o; the MLP's two; the head
    attention = 2 * 3 * cfg["blocks"] * 2 * t * t * d                     # scores and values, the full square
    return 2 * 3 * t * per_token + attention, attention


def data(model: str, cfg: dict, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if model == "cnn-gpu":
        return rng.random((n, cfg["image"], cfg["image"], 3), dtype=np.float32), rng.integers(0, CLASSES, n)
    if model == "mlp-gpu":
        return rng.random((n, cfg["inputs"]), dtype=np.float32), rng.integers(0, CLASSES, n)
    v = vocab()
    return rng.integers(0, v, (n, cfg["seq"])).astype(np.int32), rng.integers(0, v, (n, cfg["seq"]))


def conv_plan(cfg: dict) -> list[int]:
    """The CNN's layers in order: a number is a 3x3 convolution with that many filters, 0 a 2x2 max-pool (two
    convolutions before each pool but the last, which follows one)."""
    plan: list[int] = []
    for j, c in enumerate(cfg["channels"]):
        plan += [c] * (2 if j < len(cfg["channels"]) - 1 else 1) + [0]
    return plan


def layer_names(model: str, cfg: dict) -> list[str]:
    """The ggmlpy names of the CNN's and the MLP's layers with weights, in order (PyTorch's modules follow it)."""
    if model == "mlp-gpu":
        return [f"fc{i + 1}" for i in range(cfg["layers"])] + ["head"]
    n_conv = sum(1 for c in conv_plan(cfg) if c)
    return [f"conv{i + 1}" for i in range(n_conv)] + ["head"]


# ---------------------------------------------------------------- ggmlpy side

def ggml_build(model: str, cfg: dict, backend: str):
    """The model, compiled (AdamW, lr 1e-3, weight decay 0.01), its weights drawn after ``np.random.seed(0)``."""
    import ggmlpy as g
    np.random.seed(0)
    if model == "transformer-gpu":
        ct = _char_transformer()
        return ct.build_model(cfg["seq"], cfg["dim"], cfg["heads"], cfg["blocks"], backend, LR)   # AdamW, wd 0.01
    m = g.ggml_model_sequential()
    names = iter(layer_names(model, cfg))
    if model == "mlp-gpu":
        for i in range(cfg["layers"]):
            first = {"input_shape": (cfg["inputs"],)} if i == 0 else {}
            m = g.ggml_layer_dense(m, cfg["width"], activation="relu", name=next(names), **first)
    else:
        first = {"input_shape": (cfg["image"], cfg["image"], 3)}
        for c in conv_plan(cfg):
            if c:
                m = g.ggml_layer_conv_2d(m, c, (3, 3), activation="relu", padding="same", name=next(names), **first)
                first = {}
            else:
                m = g.ggml_layer_max_pooling_2d(m, (2, 2))
        m = g.ggml_layer_global_average_pooling_2d(m)
    m = g.ggml_layer_dense(m, CLASSES, activation="softmax", name=next(names))
    return g.ggml_compile(m, optimizer="adamw", loss="sparse_categorical_crossentropy", backend=backend,
                          learning_rate=LR, weight_decay=WEIGHT_DECAY)


def ggml_device_name(backend: str) -> str:
    import ggmlpy as g
    for d in g.ggml_backend_devices():
        if d.name.lower() == backend.lower():
            return f"{d.name}: {d.description}"
    return backend


def ggml_init(spec: dict) -> dict:
    """Build the model, write its initial weights to ``spec["init"]``, and report what describes it."""
    import ggmlpy as g
    g.ggml_set_n_threads(spec["threads"])
    model, cfg, batch = spec["model"], spec["cfg"], spec["cfg"]["batch"]
    net = ggml_build(model, cfg, spec["backend"])
    weights = g.ggml_get_weights(net)
    np.savez(spec["init"], **weights)
    x, y = data(model, cfg, spec["steps"] * batch)            # the training data; its first batch
    x, y = x[:batch], y[:batch]
    init_loss = float(g.ggml_evaluate(net, x, y, batch_size=batch)["loss"])
    p = g.ggml_model_placement(net, batch_size=batch)
    return {"params": int(sum(v.size for v in weights.values())), "init_loss": init_loss,
            "device": ggml_device_name(spec["backend"]), "version": g.ggml_version(),
            "placement": {"n_splits": p.n_splits, "copies": p.copies, "copy_bytes": p.copy_bytes,
                          "cpu_ops": list(p.cpu_ops), "devices": list(p.devices)}}


def ggml_split(net, x: np.ndarray, y: np.ndarray, batch: int, k: int) -> tuple[float, float, int]:
    """(seconds of one ``trainer.step``, seconds of one back-to-back recompute of its graph, the scheduler's
    buffer bytes) on ``(x, y)``: see the module's docstring."""
    import ggmlpy as g
    from ggmlpy._ffi import ffi, lib
    from ggmlpy.compute.threads import restore_threads
    tr = g.ggml_trainer(net, batch_size=batch)
    try:
        tr.step(x, y)                                    # builds and allocates the graph
        t = time.perf_counter()
        for _ in range(k):
            tr.step(x, y)
        step_s = (time.perf_counter() - t) / k
        runner = tr._runner                              # noqa: SLF001 - the trainer's allocated graph, timed raw
        ctx = runner.state                               # ggml-opt's context (the benchmarks' models use AdamW)
        with tr._lock:                                   # noqa: SLF001
            before = runner.split_threads()              # the step's thread split, as trainer.step sets it
            try:
                ptr = ctx.ptr
                lib.ggml_opt_alloc(ptr, True)            # returns at once: this graph is the allocated one
                lib.ggml_opt_eval(ptr, ffi.NULL)
                t = time.perf_counter()
                for _ in range(k):
                    lib.ggml_opt_alloc(ptr, True)
                    lib.ggml_opt_eval(ptr, ffi.NULL)
                compute_s = (time.perf_counter() - t) / k
            finally:
                restore_threads(before)
        sched = ctx.sched
        buffers = sum(int(lib.ggml_backend_sched_get_buffer_size(sched.ptr, b.ptr)) for b in sched.backends)
    finally:
        tr.free()
    return step_s, compute_s, buffers


def ggml_worker(spec: dict) -> dict:
    import ggmlpy as g
    g.ggml_set_n_threads(spec["threads"])
    model, cfg, steps = spec["model"], spec["cfg"], spec["steps"]
    batch = cfg["batch"]
    net = ggml_build(model, cfg, spec["backend"])
    with np.load(spec["init"]) as f:
        g.ggml_set_weights(net, {k: f[k] for k in f.files})
    x, y = data(model, cfg, steps * batch)
    stamps: list[float] = []
    cb = {"on_epoch_begin": lambda e, logs, s: stamps.append(time.perf_counter()),
          "on_epoch_end": lambda e, logs, s: stamps.append(time.perf_counter())}
    hist = g.ggml_fit(net, x, y, epochs=2, batch_size=batch, shuffle=False, verbose=0, callbacks=[cb])
    epoch_s = stamps[3] - stamps[2]
    step_s, compute_s, buffers = ggml_split(net, x[:batch], y[:batch], batch, spec["split_steps"])
    return {"epoch_s": epoch_s, "loss": float(hist["train_loss"].iloc[-1]), "step_s": step_s, "compute_s": compute_s,
            "memory_bytes": buffers, "memory_what": "the training step's scheduler buffers (activations, gradients; "
            "not the weights and AdamW's moments)", "version": g.ggml_version()}


# ---------------------------------------------------------------- PyTorch side

def torch_build(model: str, cfg: dict):
    import torch
    nn = torch.nn
    if model == "transformer-gpu":
        import bench_transformer as bt
        return bt.CharTransformer({k: cfg[k] for k in ("seq", "dim", "heads", "blocks")})
    layers: list = []
    if model == "mlp-gpu":
        width = cfg["inputs"]
        for _ in range(cfg["layers"]):
            layers += [nn.Linear(width, cfg["width"]), nn.ReLU()]
            width = cfg["width"]
    else:
        width = 3
        for c in conv_plan(cfg):
            if c:
                layers += [nn.Conv2d(width, c, 3, padding=1), nn.ReLU()]
                width = c
            else:
                layers.append(nn.MaxPool2d(2))
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers, nn.Linear(width, CLASSES))


def torch_load(net, model: str, cfg: dict, w: dict) -> None:
    """Copy ggmlpy's initial weights (Keras' orientation) into the PyTorch model."""
    import torch
    if model == "transformer-gpu":
        import bench_transformer as bt
        bt.torch_from_ggml(net, w)
        return
    mods = [m for m in net.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    names = layer_names(model, cfg)
    assert len(mods) == len(names), (len(mods), names)
    with torch.no_grad():
        for name, mod in zip(names, mods):
            if isinstance(mod, torch.nn.Conv2d):
                kernel = w[f"{name}.kernel"].transpose(3, 2, 0, 1)         # (kh, kw, in, out) -> (out, in, kh, kw)
            else:
                kernel = w[f"{name}.weight"].T                             # (in, out) -> (out, in)
            mod.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel, dtype=np.float32)))
            mod.bias.copy_(torch.from_numpy(np.ascontiguousarray(w[f"{name}.bias"], dtype=np.float32)))


def torch_precision(tf32: bool) -> dict:
    """Set PyTorch's TF32 switches (both, since cuDNN's default is on) and return what they read back."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    out = {"matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
           "cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32)}
    for key, obj in (("matmul.fp32_precision", torch.backends.cuda.matmul),
                     ("cudnn.conv.fp32_precision", getattr(torch.backends.cudnn, "conv", None))):
        value = getattr(obj, "fp32_precision", None)
        if value is not None:
            out[key] = str(value)
    return out


def torch_busy_s(prof) -> float:
    """The GPU's busy seconds in a ``torch.profiler`` trace: the union of its kernel/memcpy/memset intervals."""
    from torch.autograd import DeviceType
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == DeviceType.CUDA
                   and "annotation" not in str(getattr(e, "activity_type", None) or "").lower())
    busy, end = 0.0, -math.inf
    for a, b in spans:
        if b <= end:
            continue
        busy += b - max(a, end)
        end = b
    return busy / 1e6


def torch_worker(spec: dict) -> dict:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(spec["threads"])
    model, cfg, steps, device = spec["model"], spec["cfg"], spec["steps"], spec["device"]
    batch = cfg["batch"]
    cuda = device.startswith("cuda")
    precision = torch_precision(spec["tf32"])
    net = torch_build(model, cfg)
    with np.load(spec["init"]) as f:
        torch_load(net, model, cfg, {k: f[k] for k in f.files})
    net = net.to(device)
    params = int(sum(p.numel() for p in net.parameters()))
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)   # betas 0.9/0.999, eps 1e-8: ggml's
    x, y = data(model, cfg, steps * batch)
    if model == "cnn-gpu":
        x = x.transpose(0, 3, 1, 2).copy()                                  # NCHW, once
    if model == "transformer-gpu":
        x = x.astype(np.int64)
    y = y.astype(np.int64)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def batch_at(i: int):   # from host memory to the device every step, as ggml_fit writes each batch
        return (torch.from_numpy(x[i * batch:(i + 1) * batch]).to(device),
                torch.from_numpy(y[i * batch:(i + 1) * batch]).to(device))

    def loss_of(xb, yb):
        out = net(xb)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), yb.reshape(-1))

    def step(i: int) -> float:
        xb, yb = batch_at(i)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(xb, yb)
        loss.backward()
        opt.step()
        return loss.detach().item()   # read back every step, as ggmlpy does

    with torch.no_grad():
        init_loss = float(loss_of(*batch_at(0)))
    epoch_s, loss = 0.0, 0.0
    for _ in range(2):
        sync()
        t = time.perf_counter()
        total = 0.0
        for i in range(steps):
            total += step(i)
        sync()
        epoch_s, loss = time.perf_counter() - t, total / steps
    k = spec["split_steps"]
    step(0)
    t = time.perf_counter()
    for _ in range(k):
        step(0)
    step_s = (time.perf_counter() - t) / k
    compute_s, method, memory, memory_what = None, "wall time only: on the CPU the kernels run on the stepping " \
        "thread", None, None
    if cuda:
        method = "GPU busy time from torch.profiler (kernels, memcpy, memset)"
        try:
            from torch.profiler import profile, ProfilerActivity
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(k):
                    step(0)
                sync()
            compute_s = torch_busy_s(prof) / k
        except Exception as exc:  # noqa: BLE001 - the profiler needs CUPTI; the figures stand without it
            method = f"no split: torch.profiler failed ({type(exc).__name__}: {exc})"
        memory = int(torch.cuda.max_memory_allocated(torch.device(device)))
        memory_what = "torch.cuda.max_memory_allocated (everything: weights, AdamW's moments, activations)"
    return {"epoch_s": epoch_s, "loss": loss, "step_s": step_s, "compute_s": compute_s, "split_method": method,
            "memory_bytes": memory, "memory_what": memory_what, "params": params, "init_loss": init_loss,
            "precision": precision, "device": torch.cuda.get_device_name(torch.device(device)) if cuda else "CPU",
            "version": torch.__version__}


# ---------------------------------------------------------------- driver

def torch_device_for(backend: str, override: str | None, have_torch: bool) -> tuple[str, str]:
    """PyTorch's device for ggmlpy's ``backend`` and why."""
    if override:
        return override, "--torch-device"
    b = backend.lower()
    if b.startswith("cuda"):
        return f"cuda:{int(b[4:] or 0)}", "the same CUDA device"
    if b == "cpu":
        return "cpu", "the same device"
    if have_torch:
        import torch
        if torch.cuda.is_available():
            return "cuda", f"{backend} is not CUDA: PyTorch on CUDA, the GPU it has"
    return "cpu", f"{backend} is not CUDA and PyTorch has no CUDA device: PyTorch on the CPU"


def worker_cmd(python: str, spec: dict) -> list[str]:
    return [python, os.path.abspath(__file__), "--worker", json.dumps(spec)]


def fmt_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.2f} ms"


def summarize_side(runs: list[dict], samples: int, unit: int, flops_step: float, steps: int) -> dict:
    rates = [samples / r["epoch_s"] for r in runs]
    row: dict = {"samples_per_s": best_median(rates)}
    if unit > 1:
        row["tokens_per_s"] = best_median([v * unit for v in rates])
    batch = samples // steps
    row["tflops"] = {k: row["samples_per_s"][k] / batch * flops_step / 1e12 for k in ("best", "median")}
    step_s = min(r["step_s"] for r in runs)
    computes = [r["compute_s"] for r in runs if r.get("compute_s") is not None]
    compute_s = min(computes) if computes else None
    row["split"] = {"step_s": step_s, "compute_s": compute_s,
                    "host_s": None if compute_s is None else step_s - compute_s,
                    "host_share": None if compute_s is None else (step_s - compute_s) / step_s,
                    "epoch_step_s": min(r["epoch_s"] for r in runs) / steps}
    row["loss"] = runs[-1]["loss"]
    row["memory_bytes"] = runs[-1].get("memory_bytes")
    row["memory_what"] = runs[-1].get("memory_what")
    row["version"] = runs[-1]["version"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--backend", default="cpu", help="ggmlpy's device: cpu (default), CUDA0, Vulkan0, ...")
    ap.add_argument("--torch-device", default=None, help="PyTorch's device (default: matched to --backend)")
    ap.add_argument("--size", choices=("auto", "full", "reduced"), default="auto",
                    help="full (a GPU's sizes) or reduced (seconds on a CPU); auto: full unless --backend is cpu")
    ap.add_argument("--tf32", choices=("off", "on"), default="off", help="TF32 products on CUDA, both sides")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="batches per epoch (default: 20 full, 24 reduced)")
    ap.add_argument("--split-steps", type=int, default=None, help="steps timed each way for the step split")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of both sides")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--quick", action="store_true", help="reduced sizes, 1 round, 4 steps: a seconds-long smoke run")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        fn = {"init": ggml_init, "ggml": ggml_worker, "torch": torch_worker}[spec["side"]]
        print(json.dumps(fn(spec)))
        return 0

    size = args.size if args.size != "auto" else ("reduced" if args.quick or args.backend.lower() == "cpu" else "full")
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS[size])
    split_steps = args.split_steps or (QUICK_SPLIT_STEPS if args.quick else SPLIT_STEPS[size])
    rounds = 1 if args.quick else args.rounds
    missing = "--no-torch" if args.no_torch else torch_missing()
    sides = ["ggmlpy"] + (["torch"] if missing is None else [])
    torch_device, why = torch_device_for(args.backend, args.torch_device, missing is None)
    tf32 = args.tf32 == "on"
    env = {TF32_ENV: "1" if tf32 else "0", "GGML_CUDA_TF32": "1" if tf32 else "0"}   # an inherited one must not win
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    if missing is not None:
        print(f"PyTorch left out ({missing}): ggmlpy only")
    print(f"bench_gpu: size {size}, ggmlpy on {args.backend}, PyTorch on {torch_device} ({why}), TF32 {args.tf32} "
          f"({TF32_ENV}={env[TF32_ENV]}), float32, {args.threads} CPU threads, {rounds} round(s), {steps} steps per "
          f"epoch, split over {split_steps} steps")
    results: dict = {"size": size, "backend": args.backend, "torch_device": torch_device, "torch_device_reason": why,
                     "torch": missing is None, "torch_missing": missing, "tf32": args.tf32, "env": env,
                     "precision": "float32", "threads": args.threads, "rounds": rounds, "steps": steps,
                     "split_steps": split_steps, "load": os.getloadavg()[0], "torch_precision": None, "models": {}}
    tmp = tempfile.mkdtemp(prefix="bench_gpu_")
    try:
        for model in models:
            cfg = CONFIGS[size][model]
            batch, unit = cfg["batch"], tokens_per_sample(model, cfg)
            flops_step = train_flops_per_sample(model, cfg)[0] * batch
            base = {"model": model, "cfg": cfg, "threads": args.threads, "steps": steps, "split_steps": split_steps,
                    "init": os.path.join(tmp, f"{model}.npz"), "tf32": tf32}
            init = run_json_worker(worker_cmd(sys.executable, dict(base, side="init", backend=args.backend)),
                                   threads=args.threads, env=env)
            pl = init["placement"]
            print(f"\n== {model} ({describe(model, cfg)}): {init['params']:,} parameters, "
                  f"{flops_step / 1e9:,.2f} GFLOP per training step (estimate)")
            print(f"  placement on {init['device']}: {pl['n_splits']} split(s), {pl['copies']} copies, "
                  f"{pl['copy_bytes']:,} bytes copied per step; ops on the CPU: {', '.join(pl['cpu_ops']) or '-'}")
            per: dict = {s: [] for s in sides}
            for r in range(rounds):
                cells = []
                for side in rotated(sides, r):
                    spec = dict(base, side="ggml" if side == "ggmlpy" else "torch",
                                backend=args.backend, device=torch_device)
                    out = run_json_worker(worker_cmd(sys.executable, spec), threads=args.threads, env=env)
                    per[side].append(out)
                    rate = steps * batch * unit / out["epoch_s"]
                    cells.append(f"{side} {rate:11,.0f} {'tokens' if unit > 1 else 'samples'}/s "
                                 f"(loss {out['loss']:.3f})")
                print(f"  round {r + 1}: " + "   ".join(cells))
            row: dict = {"config": cfg, "description": describe(model, cfg), "batch": batch,
                         "tokens_per_sample": unit, "flops_per_step": flops_step,
                         "params": {"ggmlpy": init["params"]}, "placement": pl,
                         "init_loss": {"ggmlpy": init["init_loss"]}, "devices": {"ggmlpy": init["device"]}}
            for side in sides:
                row[side] = summarize_side(per[side], steps * batch, unit, flops_step, steps)
            if "torch" in per:
                t0 = per["torch"][0]
                row["params"]["torch"] = t0["params"]
                row["init_loss"]["torch"] = t0["init_loss"]
                row["devices"]["torch"] = t0["device"]
                row["torch"]["split"]["method"] = t0["split_method"]
                results["torch_precision"] = t0["precision"]
                g_, t_ = row["ggmlpy"]["samples_per_s"], row["torch"]["samples_per_s"]
                row["ratio"] = {"best": g_["best"] / t_["best"], "median": g_["median"] / t_["median"]}
            row["ggmlpy"]["split"]["method"] = "trainer.step vs the allocated graph recomputed back to back"
            what = "tokens" if unit > 1 else "samples"
            for side in sides:
                v = row[side]
                rate = v.get("tokens_per_s", v["samples_per_s"])
                sp = v["split"]
                split = (f"step {fmt_ms(sp['step_s'])} = compute {fmt_ms(sp['compute_s'])} + host "
                         f"{fmt_ms(sp['host_s'])} ({sp['host_share']:.0%} host)" if sp["compute_s"] is not None
                         else f"step {fmt_ms(sp['step_s'])} (not split: {sp['method']})")
                print(f"  {side:7} ({v['version']}) best {rate['best']:11,.0f}  median {rate['median']:11,.0f} "
                      f"{what}/s  {v['tflops']['best']:.3f} TFLOP/s best; {split}")
            mem = [f"{side} {row[side]['memory_bytes'] / 2**20:,.0f} MiB ({row[side]['memory_what']})" for side in sides
                   if row[side]["memory_bytes"] is not None]
            if mem:
                print("  memory: " + "; ".join(mem))
            if "ratio" in row:
                print(f"  ggmlpy / PyTorch: {row['ratio']['best']:.2f} best runs, {row['ratio']['median']:.2f} "
                      f"medians; parameters {row['params']['ggmlpy']:,} / {row['params']['torch']:,}; initial loss "
                      f"{row['init_loss']['ggmlpy']:.5f} / {row['init_loss']['torch']:.5f}")
            results["models"][model] = row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
