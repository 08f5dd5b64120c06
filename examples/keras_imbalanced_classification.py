"""A port of the Keras example "Imbalanced classification: credit card fraud detection" (keras.io, structured
data), written the Keras way with ggmlpy's pieces, on data that ships with scikit-learn: the Wisconsin breast
cancer set (569 tumours, 30 measurements each), malignant tumours (37%) as the minority class to find.

The Keras example and this port, step by step:

    Normalization() first, adapt(x_train)          g.ggml_layer_normalization(...), g.ggml_layer_adapt(layer, x_train)
    Sequential: Dense(256, relu) x 2, Dropout(0.3)  g.ggml_layer_dense(...), g.ggml_layer_dropout(...)
    Dense(1, sigmoid)                                g.ggml_layer_dense(m, 1, activation="sigmoid")
    compile(Adam(1e-2), "binary_crossentropy",       g.ggml_compile(m, optimizer="adam", learning_rate=1e-2,
            metrics=[FalseNegatives(), ...,                     loss="binary_crossentropy", metrics=[
                     Precision(), Recall()])                    "false_negatives", ..., "precision", "recall"])
    fit(..., class_weight={0: w0, 1: w1},            g.ggml_fit(m, x, y, class_weight={0: w0, 1: w1},
        callbacks=[ModelCheckpoint(...)],                       callbacks=[g.ggml_callback_model_checkpoint(...)],
        validation_data=(x_val, y_val))                         validation_data=(x_val, y_val))

Run: python examples/keras_imbalanced_classification.py [--epochs 30] [--backend auto|cpu|vulkan|cuda]
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
from sklearn.datasets import load_breast_cancer

import ggmlpy as g


def split(x: np.ndarray, y: np.ndarray, val_share: float, seed: int):
    """A stratified split: the same share of each class in the validation samples."""
    rng = np.random.default_rng(seed)
    val = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        val[idx[:int(round(val_share * len(idx)))]] = True
    return x[~val], y[~val], x[val], y[val]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), "best_malignant_model.gguf"))
    args = ap.parse_args()

    data = load_breast_cancer()
    x = data.data.astype(np.float32)
    y = (data.target == 0).astype(np.float32)          # 1: malignant, the minority to find
    x_train, y_train, x_val, y_val = split(x, y, 0.2, seed=7)
    counts = np.bincount(y_train.astype(int))
    print(f"training samples: {len(y_train)}, malignant: {counts[1]} ({counts[1] / len(y_train):.1%})")

    np.random.seed(7)
    model = g.ggml_model_sequential()
    model = g.ggml_layer_normalization(model, input_shape=(x.shape[1],), name="features")
    g.ggml_layer_adapt(g.ggml_get_layer(model, name="features"), x_train)   # means and variances of training data
    model = g.ggml_layer_dense(model, 256, activation="relu")
    model = g.ggml_layer_dense(model, 256, activation="relu")
    model = g.ggml_layer_dropout(model, 0.3)
    model = g.ggml_layer_dense(model, 256, activation="relu")
    model = g.ggml_layer_dropout(model, 0.3)
    model = g.ggml_layer_dense(model, 1, activation="sigmoid")
    model = g.ggml_compile(model, optimizer="adam", learning_rate=1e-2, loss="binary_crossentropy",
                           metrics=["false_negatives", "false_positives", "true_negatives", "true_positives",
                                    "precision", "recall"], backend=args.backend)
    g.ggml_model_summary(model)

    # each class weighs in as much as the other overall, as the Keras example's 1 / count weights do
    class_weight = {0: 1.0 / counts[0], 1: 1.0 / counts[1]}
    checkpoint = g.ggml_callback_model_checkpoint(args.checkpoint, monitor="val_recall", save_best_only=True,
                                                  mode="max")
    history = g.ggml_fit(model, x_train, y_train, batch_size=64, epochs=args.epochs, verbose=2,
                         callbacks=[checkpoint], validation_data=(x_val, y_val), class_weight=class_weight)

    last = history.iloc[-1]
    found, total = int(last["val_true_positives"]), int(y_val.sum())
    print(f"validation: {found} of {total} malignant tumours found ({found / total:.1%}), "
          f"{int(last['val_false_positives'])} benign ones flagged, precision {last['val_precision']:.3f}")
    best = g.ggml_load_model(args.checkpoint, backend="cpu")
    scores = g.ggml_evaluate(best, x_val, y_val)
    print(f"best checkpoint (val_recall): recall {scores['recall']:.3f}, precision {scores['precision']:.3f}, "
          f"accuracy {scores['accuracy']:.3f}")


if __name__ == "__main__":
    main()
