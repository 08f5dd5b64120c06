"""Per-epoch progress: a tqdm bar with the running loss and samples/s, and the epoch summary."""
from __future__ import annotations

import math
import sys
import time

from tqdm.auto import tqdm


def _stderr_writable() -> bool:
    """Whether progress can be shown at all: a process started with stderr closed (``2>&-``, a daemon) has
    ``sys.stderr`` None or closed, and training must not stop because it cannot print."""
    err = sys.stderr
    return err is not None and not getattr(err, "closed", False)


class EpochProgress:
    REFRESH_S = 0.5

    def __init__(self, epoch: int, nepoch: int, total: int | None, silent: bool, desc: str | None = None) -> None:
        self.silent = silent or not _stderr_writable()
        self.start = time.perf_counter()
        self._last = self.start
        self.bar = None
        if not self.silent:
            try:
                self.bar = tqdm(total=total, desc=desc or f"Epoch {epoch}/{nepoch}", unit="batch", file=sys.stderr,
                                leave=False, dynamic_ncols=True, disable=None)  # None: no bar unless a terminal
            except (OSError, ValueError, AttributeError):  # a stderr that cannot be written or asked
                self.bar = None

    def update(self, samples: int, loss_fn) -> None:
        if self.bar is None:
            return
        try:
            self.bar.update(1)
            now = time.perf_counter()
            if loss_fn is not None and now - self._last >= self.REFRESH_S:
                self._last = now
                self.bar.set_postfix(loss=f"{loss_fn():.4g}", samples_per_s=f"{samples / (now - self.start):.0f}",
                                     refresh=False)
        except (OSError, ValueError):  # the terminal went away (a full disk behind 2>file): stop showing
            self.bar = None

    def close(self) -> float:
        if self.bar is not None:
            try:
                self.bar.close()
            except (OSError, ValueError):
                pass
        return time.perf_counter() - self.start


def summary_line(epoch: int, nepoch: int, logs: dict, seconds: float, samples: int) -> str:
    parts = [f"Epoch {epoch}/{nepoch}", f"train_loss={logs['train_loss']:.5g}"]
    if not math.isnan(logs["train_accuracy"]):
        parts.append(f"train_acc={logs['train_accuracy']:.4f}")
    if not math.isnan(logs["val_loss"]):
        parts.append(f"val_loss={logs['val_loss']:.5g}")
    if not math.isnan(logs["val_accuracy"]):
        parts.append(f"val_acc={logs['val_accuracy']:.4f}")
    shown = {"train_loss", "train_accuracy", "val_loss", "val_accuracy"}
    for key, value in logs.items():   # the compiled metrics and each output's values, as Keras' epoch line has them
        if key.startswith(("train_", "val_")) and key not in shown and isinstance(value, (int, float)) \
                and not math.isnan(value):
            parts.append(f"{key}={value:.4g}")
    if "steps" in logs:
        parts.append(f"steps={logs['steps']}")
    parts.append(f"{seconds:.2f}s ({samples / seconds if seconds > 0 else 0:.0f} samples/s)")
    return "  ".join(parts)


def say(line: str, silent: bool) -> None:
    if not silent and _stderr_writable():
        try:
            tqdm.write(line, file=sys.stderr)
        except (OSError, ValueError):  # progress is never worth stopping a fit for
            pass
