"""Plot a training history (matplotlib, optional) to a PNG."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import GgmlTypeError, GgmlValueError


if TYPE_CHECKING:
    import pandas as pd


def ggml_plot_history(history: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """Plot a training history to a PNG: loss per epoch, and accuracy where there is one.

    Train and validation curves share a panel (columns that are all NaN are left out); a second
    panel shows the accuracy when the history has any. Needs matplotlib (``pip install matplotlib``;
    the Agg backend is used, so no display is needed).

    Arguments:
        history: the DataFrame a fit function returned (``ggml_fit_opt``, ``ggml_fit_opt_gen``,
            ``ggml_fit``, ...); it must have an ``epoch`` column (else GgmlValueError).
        path: where to save the PNG (a str or Path ending in ``.png``; without a suffix ``.png`` is added;
            another suffix is a GgmlValueError).
        title: an optional title above the plot (default None: none).

    Value: the Path of the written file.

    Example:
        >>> ggml_plot_history(hist, "history.png", title="MNIST MLP")
    """
    import pandas as pd
    fn = "ggml_plot_history"
    if not isinstance(history, pd.DataFrame) or "epoch" not in history:
        raise GgmlValueError(f"{fn}: history must be the DataFrame a ggml_fit_* function returned, got "
                             f"{type(history).__name__}")
    try:
        out = Path(os.fspath(path))
    except TypeError:
        raise GgmlTypeError(f"{fn}: path must be a str or os.PathLike, got {path!r}") from None
    if str(out) in ("", ".") or "\0" in str(out):
        raise GgmlValueError(f"{fn}: path must be a file name (without NUL characters), got {path!r}")
    if out.suffix.lower() not in ("", ".png"):
        raise GgmlValueError(f"{fn}: the plot is a PNG: give a path ending in .png, got {path!r}")
    if out.suffix == "":
        out = out.with_suffix(".png")
    if title is not None and not isinstance(title, str):
        raise GgmlTypeError(f"{fn}: title must be a str or None, got {title!r}")
    if title is not None and len(title) > 1000:  # matplotlib lays out a huge title for minutes
        raise GgmlValueError(f"{fn}: title must be at most 1000 characters, got {len(title)}")
    history = history.reindex(columns=list(dict.fromkeys(list(history.columns) + [
        "train_loss", "val_loss", "train_accuracy", "val_accuracy"])))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - optional dependency
        raise ImportError("ggml_plot_history needs matplotlib: pip install matplotlib") from exc
    has_acc = history["train_accuracy"].notna().any() or history["val_accuracy"].notna().any()
    fig, axes = plt.subplots(1, 2 if has_acc else 1, figsize=(10 if has_acc else 5.5, 4), squeeze=False)
    panels = [("loss", axes[0][0])] + ([("accuracy", axes[0][1])] if has_acc else [])
    try:
        for metric, ax in panels:
            for split, style in (("train", "-o"), ("val", "--s")):
                column = f"{split}_{metric}"
                if history[column].notna().any():
                    ax.plot(history["epoch"], history[column], style, label=column, markersize=3)
            ax.set_xlabel("epoch")
            ax.set_ylabel(metric)
            ax.grid(alpha=0.3)
            ax.legend()
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(out, dpi=100, format="png")
    except (OSError, ValueError, TypeError, UnicodeError) as exc:  # an unwritable path, data or a title
        raise GgmlValueError(f"{fn}: could not draw or write the plot to {str(out)!r}: {exc}") from None
    finally:
        plt.close(fig)
    return out
