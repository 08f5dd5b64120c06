"""The low-level API: an MLP on scikit-learn's digits hand-built as a ggml graph, trained from a generator.

(examples/train_digits.py trains the same data through the Keras-like model layer.)

What this shows:
- ``ggml_fit_opt_gen`` fed by a *generator function*: it is called once per epoch, so every
  epoch sees a new shuffle and new augmentation (random 1-pixel shifts and pixel noise);
- a validation generator over a held-out split (evaluated without a backward pass);
- callbacks: cosine learning-rate decay and early stopping on the validation loss;
- ``prefetch=2``: batches are prepared in a background thread while ggml computes;
- reading the trained weights back with ``ggml_backend_tensor_get_data`` and scoring the
  test split in plain numpy; ``ggml_plot_history`` for a PNG of the history.

The digits (1,797 8x8 images, 10 classes) ship inside scikit-learn: nothing is downloaded.
Usage: python examples/train_digits_lowlevel.py [--epochs 40] [--backend auto|cpu|vulkan] [--plot digits_history.png]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from sklearn.datasets import load_digits

import ggmlpy as G


N_IN, N_HIDDEN, N_CLASSES = 64, 128, 10
BATCH = 64


def augment(images: np.ndarray, rng: np.random.Generator, p_shift: float = 0.5) -> np.ndarray:
    """Shift a random half of the 8x8 images by one pixel (zero fill) and add a little pixel noise."""
    n = images.shape[0]
    padded = np.zeros((n, 10, 10), dtype=np.float32)
    padded[:, 1:9, 1:9] = images.reshape(n, 8, 8)
    shift = rng.random(n) < p_shift
    dy = np.where(shift, rng.integers(0, 3, n), 1)   # 1 = unshifted
    dx = np.where(shift, rng.integers(0, 3, n), 1)
    rows = dy[:, None] + np.arange(8)[None, :]          # (n, 8)
    cols = dx[:, None] + np.arange(8)[None, :]          # (n, 8)
    shifted = padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]
    shifted += rng.normal(0.0, 0.05, shifted.shape).astype(np.float32)
    return np.clip(shifted, 0.0, 1.0).reshape(n, N_IN)


def one_hot(y: np.ndarray) -> np.ndarray:
    out = np.zeros((y.size, N_CLASSES), dtype=np.float32)
    out[np.arange(y.size), y] = 1.0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=40, help="maximum number of epochs (default 40)")
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "vulkan"],
                    help="auto: the first GPU ggml finds, else the CPU (default auto)")
    ap.add_argument("--plot", default="digits_history.png", help="where to save the history plot (PNG)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="no per-epoch progress lines")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    rng = np.random.default_rng(args.seed)

    # ---- data: 8x8 images with pixel values 0..16, scaled to [0, 1]; train / validation / test split
    digits = load_digits()
    x_all = (digits.data / 16.0).astype(np.float32)
    y_all = digits.target.astype(np.int64)
    perm = rng.permutation(len(y_all))
    test_idx, val_idx, train_idx = perm[:360], perm[360:360 + 4 * BATCH], perm[360 + 4 * BATCH:]
    x_train, y_train = x_all[train_idx], y_all[train_idx]
    x_val, y_val = x_all[val_idx], one_hot(y_all[val_idx])
    x_test, y_test = x_all[test_idx], y_all[test_idx]
    print(f"digits: {len(train_idx)} train, {len(val_idx)} validation, {len(test_idx)} test images")

    def train_batches():
        """One epoch: a new shuffle and new augmentation each time ggml_fit_opt_gen calls this."""
        order = rng.permutation(len(y_train))
        for start in range(0, len(order) - BATCH + 1, BATCH):   # whole batches only
            idx = order[start:start + BATCH]
            # ggml layout: a (BATCH, 64) C-ordered array fills the [64, BATCH] input tensor
            yield augment(x_train[idx], rng), one_hot(y_train[idx])

    def val_batches():
        for start in range(0, len(y_val), BATCH):
            yield x_val[start:start + BATCH], y_val[start:start + BATCH]

    # ---- backend and model: parameters and the input batch in a static context on the backend
    try:
        backend = G.ggml_backend_init_auto(args.backend)
    except G.BackendUnavailableError as exc:
        print(f"backend {args.backend!r} is not available: {exc}", file=sys.stderr)
        return 2
    print(f"backend: {G.ggml_backend_name(backend)}")
    ctx_static = G.ggml_init(8 * G.ggml_tensor_overhead(), no_alloc=True)
    w1 = G.ggml_new_tensor_2d(ctx_static, G.GGML_TYPE_F32, N_IN, N_HIDDEN)
    b1 = G.ggml_new_tensor_1d(ctx_static, G.GGML_TYPE_F32, N_HIDDEN)
    w2 = G.ggml_new_tensor_2d(ctx_static, G.GGML_TYPE_F32, N_HIDDEN, N_CLASSES)
    b2 = G.ggml_new_tensor_1d(ctx_static, G.GGML_TYPE_F32, N_CLASSES)
    for t in (w1, b1, w2, b2):
        G.ggml_set_param(t)
    images = G.ggml_new_tensor_2d(ctx_static, G.GGML_TYPE_F32, N_IN, BATCH)
    G.ggml_set_input(images)
    buffer = G.ggml_backend_alloc_ctx_tensors(ctx_static, backend)
    # He initialisation; numpy arrays of shape (ne1, ne0) are in ggml layout
    G.ggml_backend_tensor_set_data(w1, rng.normal(0, np.sqrt(2 / N_IN), (N_HIDDEN, N_IN)).astype(np.float32))
    G.ggml_backend_tensor_set_data(w2, rng.normal(0, np.sqrt(2 / N_HIDDEN), (N_CLASSES, N_HIDDEN)).astype(np.float32))
    G.ggml_backend_tensor_set_data(b1, np.zeros(N_HIDDEN, np.float32))
    G.ggml_backend_tensor_set_data(b2, np.zeros(N_CLASSES, np.float32))

    ctx_compute = G.ggml_init(32 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    hidden = G.ggml_relu(ctx_compute, G.ggml_add(ctx_compute, G.ggml_mul_mat(ctx_compute, w1, images), b1))
    logits = G.ggml_add(ctx_compute, G.ggml_mul_mat(ctx_compute, w2, hidden), b2)
    sched = G.ggml_backend_sched_new([backend])

    # ---- train: AdamW starting at lr 3e-3, cosine decay, early stopping on the validation loss
    callbacks = [
        G.ggml_schedule_cosine_decay(eta_min=1e-5),
        G.ggml_callback_early_stopping(monitor="val_loss", patience=8, min_delta=1e-4),
    ]
    t_fit = time.perf_counter()
    history = G.ggml_fit_opt_gen(sched, ctx_compute, images, logits, train_batches, epochs=args.epochs,
                                 validation_generator=val_batches,
                                 loss_type=G.ggml_opt_loss_type_cross_entropy(),
                                 optimizer=G.ggml_opt_optimizer_type_adamw(),
                                 callbacks=callbacks, learning_rate=3e-3, silent=args.quiet, prefetch=2)
    fit_seconds = time.perf_counter() - t_fit
    # train_* are measured on the augmented (shifted, noisy) batches, so they sit below val_*.
    print(history.to_string(index=False, float_format=lambda v: f"{v:.4f}"))

    # ---- evaluate in numpy from the trained weights (ggml order: ne0 fastest -> numpy (ne1, ne0))
    W1 = G.ggml_backend_tensor_get_data(w1).reshape(N_HIDDEN, N_IN)
    B1 = G.ggml_backend_tensor_get_data(b1)
    W2 = G.ggml_backend_tensor_get_data(w2).reshape(N_CLASSES, N_HIDDEN)
    B2 = G.ggml_backend_tensor_get_data(b2)
    test_logits = np.maximum(x_test @ W1.T + B1, 0.0) @ W2.T + B2
    accuracy = float(np.mean(test_logits.argmax(axis=1) == y_test))

    plot = G.ggml_plot_history(history, args.plot, title="MLP on sklearn digits (ggmlpy, generator + augmentation)")
    G.ggml_backend_sched_free(sched)
    G.ggml_free(ctx_compute)
    G.ggml_backend_buffer_free(buffer)
    G.ggml_free(ctx_static)
    G.ggml_backend_free(backend)

    print(f"trained {len(history)} epochs in {fit_seconds:.1f} s (total {time.perf_counter() - t_start:.1f} s)")
    print(f"test accuracy: {accuracy:.4f} ({int(round(accuracy * len(y_test)))}/{len(y_test)})")
    print(f"history plot: {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
