"""A residual CNN written with ggmlR's autograd engine (ag_*) on scikit-learn's bundled digits, PyTorch-style.

The network is plain eager code (a convolution stem, a residual block, global pooling, a linear head) with a custom
loss (cross-entropy plus label smoothing written from ops); each step (the forward pass, ggml's backward pass, the
clipping and Adam's update) runs as one ggml graph on the device, reused from step to step. The batches stream from
a generator with a new shuffle and a random shift every epoch. At the end the model is saved to GGUF, loaded back
and scored on a held-out split; ``ag_trace`` reports what one step did on the device.

Usage: python examples/autograd_digits.py [--epochs N] [--device cpu|gpu|Vulkan0|CUDA0] [--quick]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from sklearn.datasets import load_digits

import ggmlpy as g


class ResidualCNN:
    """conv 3x3 (1 -> 16) + relu, a residual block of two 3x3 convolutions, 2x2 max pooling, a linear head."""

    def __init__(self) -> None:
        def kernel(cout: int, cin: int):  # He initialisation
            return g.ag_param(np.random.randn(cout, cin, 3, 3) * np.sqrt(2.0 / (cin * 9)))
        self.k1, self.k2, self.k3 = kernel(16, 1), kernel(16, 16), kernel(16, 16)
        self.b1, self.b2, self.b3 = (g.ag_param(np.zeros(16)) for _ in range(3))
        self.head = g.ag_linear(16 * 4 * 4, 10)

    def __call__(self, x):
        h = g.ag_relu(g.ag_conv2d(x, self.k1, self.b1, padding=1))
        r = g.ag_relu(g.ag_conv2d(h, self.k2, self.b2, padding=1))
        h = g.ag_relu(h + g.ag_conv2d(r, self.k3, self.b3, padding=1))     # the residual connection
        h = g.ag_max_pool2d(h, 2)                                           # (N, 16, 4, 4)
        return self.head(g.ag_reshape(h, (h.shape[0], -1)))

    def parameters(self) -> dict:
        own = {"k1": self.k1, "k2": self.k2, "k3": self.k3, "b1": self.b1, "b2": self.b2, "b3": self.b3}
        return {**own, **{f"head_{k}": v for k, v in self.head.parameters().items()}}


def smoothed_cross_entropy(logits, y: np.ndarray, eps: float = 0.1):
    """Cross-entropy against labels smoothed towards uniform: (1 - eps) one-hot + eps / classes."""
    target = np.full((len(y), 10), eps / 10, np.float32)
    target[np.arange(len(y)), y] += 1 - eps
    return g.ag_softmax_cross_entropy_loss(logits, target)


def batches(x: np.ndarray, y: np.ndarray, size: int):
    """A generator function: each epoch a new order and a random shift of up to one pixel."""
    def epoch():
        order = np.random.permutation(len(x))
        for i in range(0, len(x) - size + 1, size):
            idx = order[i:i + size]
            dy, dx = np.random.randint(-1, 2, 2)
            yield np.roll(x[idx], (dy, dx), axis=(2, 3)), y[idx]
    return epoch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="6 epochs (the tests run this)")
    a = ap.parse_args()
    epochs = 6 if a.quick else a.epochs
    np.random.seed(0)
    g.ag_device(a.device)
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]      # (N, 1, 8, 8)
    y = digits.target.astype(np.int64)
    order = np.random.permutation(len(x))
    train, test = order[:1400], order[1400:]
    model = ResidualCNN()
    params = model.parameters()
    opt = g.optimizer_adam(params, lr=3e-3)
    sched = g.lr_scheduler_warmup_cosine(opt, warmup_steps=20, total_steps=epochs * (1400 // 64))
    loader = g.ag_dataloader(batches(x[train], y[train], 64))

    def step(xb, yb):
        with g.with_grad_tape():
            loss = smoothed_cross_entropy(model(xb), yb.numpy())
        g.backward(loss)
        g.clip_grad_norm(params, max_norm=5.0)
        opt.step()
        opt.zero_grad()
        sched.step()
        return loss

    for epoch in range(epochs):
        losses = [step(b["x"], b["y"]) for b in loader.epoch()]
        print(f"epoch {epoch + 1:2d}: loss {np.mean([float(v) for v in losses]):.4f}, lr {opt.lr:.5f}")
    trace = g.ag_trace(step, g.ag_tensor(x[train[:64]]), g.ag_tensor(y[train[:64]]))
    print(f"one step: {trace.computes} graph compute, {trace.graphs_built} graphs built, {trace.downloads} "
          f"downloads, {trace.upload_bytes} bytes uploaded")

    path = g.ag_save_model(model, os.path.join(tempfile.mkdtemp(), "digits_ag.gguf"))
    loaded = g.ag_load_model(path, model_fn=ResidualCNN)      # a new network, its weights from the file
    accuracy = float((loaded(g.ag_tensor(x[test])).numpy().argmax(1) == y[test]).mean())
    print(f"test accuracy: {accuracy:.3f} on {len(test)} held-out digits")
    return 0 if accuracy > 0.8 else 1


if __name__ == "__main__":
    sys.exit(main())
