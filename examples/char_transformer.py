"""Train a small character-level transformer on the source code of Python's standard library.

What this shows:
- a functional model of a GPT-style decoder: token embedding + learned positions, blocks of pre-norm
  causal multi-head self-attention and a GELU MLP (each with a residual connection), a final layer norm
  and a softmax over the vocabulary at every position (sparse cross-entropy averaged over the tokens);
- ``ggml_fit_generator`` fed by a *text stream*: the ``*.py`` files of the standard library, read file by
  file (one file and a small shuffle buffer of windows in memory, never the corpus), in a new order every
  pass; a held-out validation stream from a disjoint, deterministic set of files; a progress bar, cosine
  learning-rate decay and a learning-curve PNG with the unigram baseline;
- ``ggml_save_model`` / ``ggml_load_model`` (GGUF), a check that the loaded model predicts identically,
  and autoregressive sampling with ``ggml_predict`` from a prompt, with a temperature.

The corpus ships with every Python (``sysconfig.get_paths()["stdlib"]``): nothing is downloaded. It is
the library's modules (about 600 files, 10 M characters with CPython 3.11); the test suites and the modules
that are mostly data (the codec tables of ``encodings``, ``pydoc_data``) are left out. About 5% of the
files, picked by a hash of their path, are held out for validation.
The unigram baseline is the entropy of the training characters' frequencies (nats per character): the
loss of the best model that ignores the context. The model must beat it by a wide margin.

Usage: python examples/char_transformer.py [--backend auto|cpu|vulkan|cuda] [--epochs 12] [--steps 150]
       [--quick] [--out DIR] [--prompt "def "] [--temperature 0.8]
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import sysconfig
import time
import zlib
from pathlib import Path

import numpy as np

import ggmlpy as g


# ---------------------------------------------------------------- vocabulary: tab, newline, printable ASCII, other
CHARS = "\t\n" + "".join(chr(c) for c in range(32, 127))
UNK = len(CHARS)                       # one id for every other character (non-ASCII, \r, \f, ...)
VOCAB = len(CHARS) + 1                 # 98
_LUT = np.full(129, UNK, dtype=np.int32)  # code point (clipped at 128) -> id
for _i, _c in enumerate(CHARS):
    _LUT[ord(_c)] = _i


def encode(text: str) -> np.ndarray:
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return _LUT[np.minimum(codes, 128)]


def decode(ids) -> str:
    return "".join(CHARS[i] if i < UNK else "\N{REPLACEMENT CHARACTER}" for i in ids)


# ---------------------------------------------------------------- the corpus, file by file

# installed packages, the test suites, and modules that are mostly data (codec tables, pydoc's topics)
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "encodings", "pydoc_data"}


def corpus_files() -> tuple[list[str], list[str], str]:
    """The standard library's *.py modules, split into train and validation by a hash of the path relative
    to the stdlib: the same split on every run and machine with this Python."""
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(f for f in glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
                   if not SKIP_DIRS & set(Path(os.path.relpath(f, root)).parts[:-1]))
    if not files:
        raise SystemExit(f"no *.py files under {root}")
    val = [f for f in files if zlib.crc32(os.path.relpath(f, root).encode()) % 20 == 0]   # ~5% of the files
    val_set = set(val)
    return [f for f in files if f not in val_set], val, root


def read_ids(path: str) -> np.ndarray:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return encode(fh.read() + "\n")


def unigram_entropy(files: list[str]) -> tuple[float, int]:
    """Entropy (nats) of the character frequencies of ``files``, counted one file at a time."""
    counts = np.zeros(VOCAB, dtype=np.int64)
    for f in files:
        counts += np.bincount(read_ids(f), minlength=VOCAB)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum()), int(counts.sum())


def windows(files: list[str], steps: int, batch: int, seed: int, passes: int | None = None, buffer: int = 2048):
    """Batches ``(x, y)`` of ``steps``-character windows, y = x shifted by one character.

    Files are read one at a time, in a new random order every pass, and their characters run on as one
    stream (a window may span two files); windows of ``steps + 1`` characters are cut from it with a stride
    of ``steps`` (from a random offset each pass) into a shuffle buffer of ``buffer`` windows, from which
    batches are drawn at random. Memory: one file plus the buffer (2048 windows of 65 int32 = 0.5 MB at 64
    steps). ``passes=None`` streams forever."""
    rng = np.random.default_rng(seed)
    pool = np.empty((buffer, steps + 1), dtype=np.int32)
    filled = 0
    k = 0
    while passes is None or k < passes:
        k += 1
        carry = np.zeros(0, dtype=np.int32)
        skip = int(rng.integers(0, steps))
        for i in rng.permutation(len(files)):
            ids = read_ids(files[i])
            if skip:
                ids, skip = ids[min(skip, len(ids)):], max(0, skip - len(ids))
            carry = np.concatenate([carry, ids])
            n = (len(carry) - 1) // steps
            if n == 0:
                continue
            cut = np.lib.stride_tricks.sliding_window_view(carry, steps + 1)[::steps][:n]
            carry = carry[n * steps:]
            for w in cut:
                if filled < buffer:
                    pool[filled] = w
                    filled += 1
                if filled == buffer:              # full: draw a batch, refill its slots from the stream
                    idx = rng.choice(buffer, batch, replace=False)
                    out = pool[idx]
                    yield out[:, :-1].copy(), out[:, 1:].copy()
                    keep = np.ones(buffer, dtype=bool)
                    keep[idx] = False
                    pool[:buffer - batch] = pool[keep]
                    filled = buffer - batch


# ---------------------------------------------------------------- the model

# seq: characters per window (the context); dim: model width; heads of dim / heads = 32 values each (ggml's BLAS
# backend takes the products whose sizes are all >= 32: 4 heads of 16 train 2.5x slower); batch: windows per
# step; steps: batches per epoch; val_steps: validation batches (the same ones every epoch)
DEFAULT = dict(seq=64, dim=64, heads=2, blocks=2, batch=32, lr=5e-3, epochs=12, steps=150, val_steps=16, chars=400)
QUICK = dict(seq=64, dim=64, heads=2, blocks=2, batch=8, lr=5e-3, epochs=4, steps=160, val_steps=16, chars=120)


def build_model(steps: int, dim: int, heads: int, blocks: int, backend: str, lr: float,
                precision: str = "f32") -> g.Model:
    ids = g.ggml_input((steps,), dtype="int32", name="ids")
    x = g.ggml_layer_embedding(ids, VOCAB, dim, name="tok")
    x = g.ggml_layer_position_embedding(x, steps, name="pos")
    for b in range(blocks):
        a = g.ggml_layer_layer_norm(x, name=f"b{b}_ln1")
        a = g.ggml_layer_multi_head_attention(a, heads, dim // heads, causal=True, name=f"b{b}_att")
        x = g.ggml_layer_add([x, a], name=f"b{b}_res1")
        m = g.ggml_layer_layer_norm(x, name=f"b{b}_ln2")
        m = g.ggml_layer_dense(m, 4 * dim, activation="gelu", name=f"b{b}_fc1")
        m = g.ggml_layer_dense(m, dim, name=f"b{b}_fc2")
        x = g.ggml_layer_add([x, m], name=f"b{b}_res2")
    x = g.ggml_layer_layer_norm(x, name="ln_f")
    out = g.ggml_layer_dense(x, VOCAB, activation="softmax", name="head")   # (steps, VOCAB) per sample
    model = g.ggml_model(ids, out, name="char_transformer")
    return g.ggml_compile(model, optimizer="adamw", loss="sparse_categorical_crossentropy", backend=backend,
                          learning_rate=lr, weight_decay=0.01, precision=precision)


def sample(model: g.Model, prompt: str, n_chars: int, steps: int, temperature: float,
           rng: np.random.Generator) -> str:
    """Autoregressive sampling: the last ``steps`` characters, left-aligned in the window (causal attention
    and learned positions: the prediction after position ``t`` only sees positions ``0..t``, as in
    training), the next-character distribution read at the last filled position."""
    ids = list(encode(prompt)) or [CHARS.index("\n")]
    for _ in range(n_chars):
        ctx = ids[-steps:]
        window = np.zeros((1, steps), dtype=np.int32)
        window[0, :len(ctx)] = ctx
        p = g.ggml_predict(model, window)[0, len(ctx) - 1].astype(np.float64)
        if temperature <= 0:
            nxt = int(np.argmax(p))
        else:
            logits = np.log(np.maximum(p, 1e-30)) / temperature
            q = np.exp(logits - logits.max())
            nxt = int(rng.choice(VOCAB, p=q / q.sum()))
        ids.append(nxt)
    return decode(ids)


def plot_curve(history, baseline: float, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(history["epoch"], history["train_loss"], "o-", label="train (stream, per epoch)")
    ax.plot(history["epoch"], history["val_loss"], "s-", label="validation (held-out files)")
    ax.axhline(baseline, color="gray", linestyle="--", label=f"unigram baseline {baseline:.2f}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy (nats / character)")
    ax.set_ylim(0, max(baseline, float(history["train_loss"].max())) * 1.08)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "vulkan", "cuda"],
                    help="auto (a GPU if there is one), cpu, vulkan, cuda")
    ap.add_argument("--epochs", type=int, default=None, help="epochs (default 12; --quick 4)")
    ap.add_argument("--steps", type=int, default=None, help="training batches per epoch (default 150; --quick 160)")
    ap.add_argument("--quick", action="store_true", help="a small model and a short run (tests; well under a minute)")
    ap.add_argument("--out", default="char_transformer_out", help="directory for the model, the plot and the sample")
    ap.add_argument("--prompt", default="def ", help="text to continue when sampling")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (0: greedy)")
    ap.add_argument("--chars", type=int, default=None, help="characters to sample (default 400; --quick 120)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16", "f16"],
                    help="the matrix products' type (mixed precision: F32 weights, products in bf16/f16)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else DEFAULT
    epochs = args.epochs or cfg["epochs"]
    steps_per_epoch = args.steps or cfg["steps"]
    n_chars = args.chars if args.chars is not None else cfg["chars"]
    seq, batch = cfg["seq"], cfg["batch"]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    np.random.seed(args.seed)                      # the initial weights come from numpy's global state

    train_files, val_files, root = corpus_files()
    baseline, n_train_chars = unigram_entropy(train_files)
    print(f"corpus: {root}: {len(train_files)} training files ({n_train_chars / 1e6:.1f} M characters), "
          f"{len(val_files)} validation files; vocabulary {VOCAB}")
    print(f"unigram baseline (entropy of the training characters): {baseline:.4f} nats/char")

    try:
        model = build_model(seq, cfg["dim"], cfg["heads"], cfg["blocks"], args.backend, cfg["lr"], args.precision)
    except g.BackendUnavailableError as exc:
        print(f"backend {args.backend!r} is not available: {exc}", file=sys.stderr)
        return 2
    print(model)

    train = windows(train_files, seq, batch, seed=args.seed)     # an iterator: one stream across the epochs

    def validation():      # a generator function: called once per validation, the same held-out batches each time
        yield from windows(val_files, seq, batch, seed=12345, passes=1, buffer=512)

    tokens = epochs * steps_per_epoch * batch * seq
    print(f"training: {epochs} epochs x {steps_per_epoch} batches of {batch} x {seq} characters "
          f"({tokens / 1e6:.2f} M tokens), validation: {cfg['val_steps']} batches")
    t_fit = time.perf_counter()
    history = g.ggml_fit_generator(
        model, train, steps_per_epoch=steps_per_epoch, epochs=epochs, validation_data=validation,
        validation_steps=cfg["val_steps"], prefetch=2, verbose=0 if args.quiet else 1,
        callbacks=[g.ggml_schedule_cosine_decay(eta_min=cfg["lr"] / 10)])
    fit_seconds = time.perf_counter() - t_fit
    print(history.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    val_loss = float(history["val_loss"].iloc[-1])

    # ---- save, load back, check that the loaded model predicts the same
    path = out_dir / "char_transformer.gguf"
    g.ggml_save_model(model, str(path))
    loaded = g.ggml_load_model(str(path), backend=args.backend)
    probe = next(windows(val_files, seq, 8, seed=7, passes=1, buffer=64))[0]
    same = np.array_equal(g.ggml_predict(model, probe), g.ggml_predict(loaded, probe))

    rng = np.random.default_rng(args.seed)
    t_sample = time.perf_counter()
    text = sample(loaded, args.prompt, n_chars, seq, args.temperature, rng)
    sample_seconds = time.perf_counter() - t_sample
    (out_dir / "sample.txt").write_text(text)

    plot = out_dir / "learning_curve.png"
    plot_curve(history, baseline, plot, f"char transformer on the stdlib ({epochs} x {steps_per_epoch} steps)")

    print(f"--- sample (prompt {args.prompt!r}, temperature {args.temperature}) ---")
    print(text)
    print("---")
    print(f"trained {len(history)} epochs in {fit_seconds:.1f} s ({tokens / fit_seconds:,.0f} tokens/s incl. "
          f"validation); sampled {n_chars} characters in {sample_seconds:.1f} s; total "
          f"{time.perf_counter() - t_start:.1f} s")
    print(f"validation loss: {val_loss:.4f} nats/char ({val_loss / math.log(2):.3f} bits/char), unigram baseline "
          f"{baseline:.4f}: {val_loss / baseline:.2f} of the baseline")
    print(f"saved to {path}; the loaded model predicts identically: {same}")
    print(f"learning curve: {plot}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
