"""Train a small CNN on scikit-learn's digits with the Keras-like model layer.

What this shows:
- a sequential model (conv_2d, batch_norm, max_pooling_2d, dropout, dense) on channels-last images;
- ``ggml_fit_generator`` fed by a *generator function*: called once per epoch, so every epoch sees a
  new shuffle and new augmentation (random 1-pixel shifts and pixel noise), with ``prefetch=2``;
- validation on held-out arrays, cosine learning-rate decay and early stopping (ggmlR callbacks);
- ``ggml_evaluate`` / ``ggml_predict_classes`` on the test split, ``ggml_save_model`` and
  ``ggml_load_model`` (GGUF), and ``ggml_plot_history`` for a PNG of the history.

The digits (1,797 8x8 images, 10 classes) ship inside scikit-learn: nothing is downloaded.
Usage: python examples/train_digits.py [--epochs 30] [--backend auto|cpu|vulkan|cuda] [--plot digits_history.png]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from sklearn.datasets import load_digits

import ggmlpy as g


BATCH = 64


def augment(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Shift a random half of the (n, 8, 8, 1) images by one pixel (zero fill) and add a little noise."""
    n = images.shape[0]
    padded = np.zeros((n, 10, 10), dtype=np.float32)
    padded[:, 1:9, 1:9] = images[..., 0]
    shift = rng.random(n) < 0.5
    dy = np.where(shift, rng.integers(0, 3, n), 1)   # 1 = unshifted
    dx = np.where(shift, rng.integers(0, 3, n), 1)
    rows = dy[:, None] + np.arange(8)[None, :]
    cols = dx[:, None] + np.arange(8)[None, :]
    out = padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]
    out += rng.normal(0.0, 0.05, out.shape).astype(np.float32)
    return np.clip(out, 0.0, 1.0)[..., None]


def build_model(backend: str) -> g.Model:
    model = g.ggml_model_sequential()
    model = g.ggml_layer_conv_2d(model, 16, (3, 3), activation="relu", padding="same", input_shape=(8, 8, 1))
    model = g.ggml_layer_batch_norm(model, momentum=0.9)          # running statistics settle in ~20 steps
    model = g.ggml_layer_max_pooling_2d(model, (2, 2))                 # 4x4x16
    model = g.ggml_layer_flatten(model)
    model = g.ggml_layer_dropout(model, 0.2)
    model = g.ggml_layer_dense(model, 64, activation="relu")
    model = g.ggml_layer_dense(model, 10, activation="softmax")
    return g.ggml_compile(model, optimizer="adam", loss="sparse_categorical_crossentropy",
                          learning_rate=3e-3, backend=backend)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=30, help="maximum number of epochs (default 30)")
    ap.add_argument("--backend", default="auto", help="auto (a GPU if there is one), cpu, vulkan, cuda")
    ap.add_argument("--plot", default="digits_history.png", help="where to save the history plot (PNG)")
    ap.add_argument("--save", default="digits_cnn.gguf", help="where to save the trained model (GGUF)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    np.random.seed(args.seed)                      # the initial weights come from numpy's global state
    rng = np.random.default_rng(args.seed)

    # ---- data: (N, 8, 8, 1) channels-last images in [0, 1], 0-based class ids
    digits = load_digits()
    x_all = (digits.images / 16.0).astype(np.float32)[..., None]
    y_all = digits.target.astype(np.int64)
    perm = rng.permutation(len(y_all))
    test, val, train = perm[:360], perm[360:616], perm[616:]
    print(f"digits: {len(train)} train, {len(val)} validation, {len(test)} test images")

    def train_batches():
        """One epoch: a new shuffle and new augmentation each time ggml_fit_generator calls this."""
        order = rng.permutation(train)
        for start in range(0, len(order) - BATCH + 1, BATCH):   # whole batches: the batch size is fixed
            idx = order[start:start + BATCH]
            yield augment(x_all[idx], rng), y_all[idx]

    try:
        model = build_model(args.backend)
    except g.BackendUnavailableError as exc:
        print(f"backend {args.backend!r} is not available: {exc}", file=sys.stderr)
        return 2
    print(model)

    t_fit = time.perf_counter()
    history = g.ggml_fit_generator(
        model, train_batches, epochs=args.epochs, validation_data=(x_all[val], y_all[val]), prefetch=2,
        callbacks=[g.ggml_schedule_cosine_decay(eta_min=1e-5),
                   g.ggml_callback_early_stopping(monitor="val_loss", patience=6, min_delta=1e-4)],
        verbose=0 if args.quiet else 1)
    fit_seconds = time.perf_counter() - t_fit
    # train_* are measured on the augmented batches with dropout, so they sit below val_*.
    print(history.to_string(index=False, float_format=lambda v: f"{v:.4f}"))

    result = g.ggml_evaluate(model, x_all[test], y_all[test])
    classes = g.ggml_predict_classes(model, x_all[test])

    # ---- save, load back, check that the loaded model predicts the same
    g.ggml_save_model(model, args.save)
    loaded = g.ggml_load_model(args.save, backend=args.backend)
    same = np.array_equal(g.ggml_predict_classes(loaded, x_all[test]), classes)

    plot = g.ggml_plot_history(history, args.plot, title="CNN on sklearn digits (ggmlpy model layer)")
    print(f"trained {len(history)} epochs in {fit_seconds:.1f} s (total {time.perf_counter() - t_start:.1f} s)")
    print(f"test loss: {result['loss']:.4f}")
    print(f"test accuracy: {result['accuracy']:.4f} ({int(np.sum(classes == y_all[test]))}/{len(test)})")
    print(f"saved to {args.save}; the loaded model predicts the same classes: {same}")
    print(f"history plot: {plot}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
