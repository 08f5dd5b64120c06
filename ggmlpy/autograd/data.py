"""Data and checks for the autograd engine: ``ag_dataloader`` (arrays in mini-batches, or a generator's batches
streamed one at a time), ``ag_gradcheck`` (gradients against central differences) and ``ag_trace`` (what a piece of
code computed and moved on the devices).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..core.args import is_int, is_real
from ..errors import GgmlStateError, GgmlTypeError, GgmlValueError
from .device import Counters, COUNTS, engines, recording
from .tape import backward, TapeBlock
from .tensor import ag_tensor, AgTensor


__all__ = ["ag_dataloader", "ag_gradcheck", "ag_trace"]


class DataLoader:
    """Mini-batches of arrays (or of a generator): see ``ag_dataloader``."""

    def __init__(self, x: object, y: object, batch_size: int, shuffle: bool, col_major: bool,
                 device: str | None) -> None:
        self.batch_size, self.shuffle, self.device = batch_size, shuffle, device
        self.source: Callable[[], Iterator] | None = None
        if not isinstance(x, (np.ndarray, list, tuple)) and (isinstance(x, Iterator) or callable(x)):
            if y is not None:
                raise GgmlValueError("ag_dataloader: with a generator of batches, y comes from the batches; pass "
                                     "y=None")
            self.source = x if callable(x) else (lambda it=x: it)
            self.x = self.y = None
            self.n = None
        else:
            xa = np.asarray(x)
            if col_major:
                xa = xa.T
            ya = None if y is None else np.asarray(y)
            if ya is not None and col_major:
                ya = ya.T
            if xa.ndim == 0 or (ya is not None and (ya.ndim == 0 or len(ya) != len(xa))):
                raise GgmlValueError(f"ag_dataloader: x and y need the same number of samples (first axis; "
                                     f"col_major=True: last), got {xa.shape} and {None if ya is None else ya.shape}")
            self.x, self.y, self.n = xa, ya, len(xa)
        self.iteration = 0
        self._order: np.ndarray | None = None
        self._it: Iterator | None = None
        self._peek: object = None
        self.reset()

    def n_batches(self) -> int | None:
        """Full batches per epoch (the partial last one is dropped); None for a generator."""
        return None if self.n is None else self.n // self.batch_size

    def reset(self) -> None:
        """Start a new epoch (reshuffled when ``shuffle``; a generator function is called again)."""
        self.iteration = 0
        if self.source is not None:
            self._it, self._peek = iter(self.source()), None
        else:
            assert self.n is not None
            self._order = np.random.permutation(self.n) if self.shuffle else np.arange(self.n)

    def has_next(self) -> bool:
        """Whether another batch is left in this epoch."""
        if self.source is not None:
            if self._peek is None:
                try:
                    self._peek = next(self._it)  # type: ignore[arg-type]
                except StopIteration:
                    return False
            return True
        return (self.iteration + 1) * self.batch_size <= (self.n or 0)

    def next_batch(self) -> dict[str, AgTensor | None]:
        """The next batch as ``{"x": AgTensor, "y": AgTensor or None}``; past the end a GgmlStateError."""
        if not self.has_next():
            raise GgmlStateError("ag_dataloader: no batch left in this epoch; call reset() (or use epoch())")
        if self.source is not None:
            batch, self._peek = self._peek, None
            bx, by = _split(batch)
        else:
            assert self._order is not None and self.x is not None
            idx = self._order[self.iteration * self.batch_size:(self.iteration + 1) * self.batch_size]
            bx, by = self.x[idx], None if self.y is None else self.y[idx]
        self.iteration += 1
        return {"x": ag_tensor(bx, self.device), "y": None if by is None else ag_tensor(by, self.device)}

    def epoch(self) -> Iterator[dict[str, AgTensor | None]]:
        """The batches of one epoch (reset first)."""
        self.reset()
        while self.has_next():
            yield self.next_batch()

    def __iter__(self) -> Iterator[dict[str, AgTensor | None]]:
        return self.epoch()

    def __len__(self) -> int:
        n = self.n_batches()
        if n is None:
            raise TypeError("a data loader over a generator has no length")
        return n


def _split(batch: object) -> tuple[object, object]:
    if isinstance(batch, Mapping):
        return batch["x"], batch.get("y")
    if isinstance(batch, tuple) and len(batch) == 2:
        return batch
    return batch, None


def ag_dataloader(x: object, y: object = None, batch_size: int = 32, shuffle: bool = True, col_major: bool = False,
                  device: str | None = None) -> DataLoader:
    """Mini-batches for an ``ag_*`` training loop, from arrays (samples first) or streamed from a generator.

    From arrays, each epoch visits the samples in a new random order (``np.random``) and drops the last partial
    batch. A generator (or a function returning one, called again at each ``reset``) yields ``(x, y)`` pairs,
    ``{"x": ..., "y": ...}`` dicts or bare x batches, one at a time: data larger than memory, augmented per epoch,
    or from a simulator.

    Arguments:
        x: the inputs (N, ...) as an array, or a generator / generator function of batches.
        y: the targets (N, ...) for arrays; None: no targets (and for a generator).
        batch_size: samples per batch (arrays).
        shuffle: a new order each epoch (arrays).
        col_major: x and y are ggmlR's (features, N): transposed first.
        device: where the batches go; None: the default.

    Value: a loader with ``reset()``, ``has_next()``, ``next_batch()`` (``{"x", "y"}`` AgTensors), ``epoch()`` (an
    iterator over one epoch), ``iteration``, ``n_batches()``.

    Example:
        >>> dl = ag_dataloader(x_train, y_train, batch_size=64)
        >>> for batch in dl.epoch(): loss = step(batch["x"], batch["y"])
    """
    if not is_int(batch_size) or int(batch_size) < 1:
        raise GgmlValueError(f"ag_dataloader: batch_size must be an int >= 1, got {batch_size!r}")
    return DataLoader(x, y, int(batch_size), bool(shuffle), bool(col_major), device)


def ag_gradcheck(fn: Callable[..., AgTensor], inputs: object, eps: float = 1e-5, atol: float = 1e-4,
                 verbose: bool = False, quiet: bool = False) -> bool:
    """Check the gradients ``backward`` gives against central differences of ``fn``.

    For each element of each input, ``(f(x + h) - f(x - h)) / 2h`` with ``h = max(eps, 1e-3)`` (the values are
    float32, so a smaller step drowns in rounding) against the analytic gradient; an element passes when
    ``|analytic - numeric| <= atol + 1e-2 |numeric|``. The inputs' values are restored afterwards.

    Arguments:
        fn: a function of ``inputs`` returning a one-element AgTensor (the loss).
        inputs: the trainable leaves (ag_param): one, a list or a dict; passed to fn as given.
        eps: the difference step (at least 1e-3 is used).
        atol: the absolute tolerance.
        verbose: print each input's largest error.
        quiet: print nothing on failure.

    Value: True when every element passes.

    Example:
        >>> W = ag_param(np.random.randn(3, 4))
        >>> ag_gradcheck(lambda p: ag_sum(ag_tanh(p)), W)
    """
    if not callable(fn):
        raise GgmlTypeError(f"ag_gradcheck: fn must be a function of the inputs, got {fn!r}")
    leaves = [inputs] if isinstance(inputs, AgTensor) else list(inputs.values()) if isinstance(inputs, Mapping) \
        else list(inputs) if isinstance(inputs, Iterable) else None
    if not leaves or any(not isinstance(p, AgTensor) or p.op is not None or not p.requires_grad for p in leaves):
        raise GgmlValueError("ag_gradcheck: inputs must be trainable leaves (ag_param): one, a list or a dict")
    for name, v in (("eps", eps), ("atol", atol)):
        if not is_real(v) or float(v) < 0:
            raise GgmlValueError(f"ag_gradcheck: {name} must be a number >= 0, got {v!r}")
    h = max(float(eps), 1e-3)
    saved = [(p, p.grad) for p in leaves]
    for p in leaves:
        p.grad = None
    try:
        with TapeBlock():
            loss = fn(inputs)
        grads = backward(loss)
        analytic = [grads[p].numpy() if p in grads else np.zeros(p.shape, np.float32) for p in leaves]
    finally:
        for p, g in saved:
            p.grad = g
    ok = True
    for k, p in enumerate(leaves):
        base = p.numpy()
        numeric = np.zeros(base.shape, np.float64)
        try:
            for i in range(base.size):
                plus, minus = base.copy(), base.copy()
                plus.flat[i] += h
                minus.flat[i] -= h
                p.data = plus
                f_plus = float(fn(inputs).item())
                p.data = minus
                f_minus = float(fn(inputs).item())
                numeric.flat[i] = (f_plus - f_minus) / (2 * h)
        finally:
            p.data = base
        err = np.abs(analytic[k] - numeric)
        bad = err > float(atol) + 1e-2 * np.abs(numeric)
        if verbose:
            print(f"input {k + 1} {p.shape}: largest error {err.max():.3g}")
        if bad.any():
            ok = False
            if not quiet:
                i = int(np.argmax(err - 1e-2 * np.abs(numeric)))
                print(f"ag_gradcheck: input {k + 1} {p.shape}: {int(bad.sum())} of {bad.size} elements differ; "
                      f"e.g. element {i}: analytic {analytic[k].flat[i]:.6g}, numeric {numeric.flat[i]:.6g}")
    return ok


@dataclass
class Trace(Counters):
    """What ``ag_trace`` saw: the result, and on every device the graph computes, graphs built, host-to-device
    uploads and device-to-host downloads (counts and bytes), and where each compute ran (``placements``:
    ``Placement`` objects as ``ggml_model_placement`` gives; ``n_splits``: the last compute's)."""
    result: object = None

    @property
    def n_splits(self) -> int:
        return self.placements[-1].n_splits if self.placements else 0

    @property
    def cpu_ops(self) -> list[str]:
        """Ops a host backend computed while a device was in the scheduler, over all computes."""
        return sorted({op for p in self.placements for op in p.cpu_ops})


def ag_trace(fn: Callable[..., object], *args: object, **kwargs: object) -> Trace:
    """Run ``fn(*args, **kwargs)`` and report what it computed and moved on the devices.

    Arguments:
        fn: the code to watch (a training step, an evaluation).
        args: its positional arguments.
        kwargs: its keyword arguments.

    Value: a ``Trace`` with ``result`` (fn's value), ``computes``, ``graphs_built``, ``uploads``,
    ``upload_bytes``, ``downloads``, ``download_bytes``, ``placements`` and ``n_splits``, ``cpu_ops``.

    Example:
        >>> t = ag_trace(train_step, x, y)
        >>> t.computes, t.graphs_built, t.n_splits
    """
    if not callable(fn):
        raise GgmlTypeError(f"ag_trace: fn must be callable, got {fn!r}")
    before = {id(e): (e.counters.snapshot(), len(e.counters.placements)) for e in engines()}
    recording(+1)
    try:
        out = Trace(result=fn(*args, **kwargs))
    finally:
        recording(-1)
    for e in engines():
        snap, n_places = before.get(id(e), ((0,) * len(COUNTS), 0))
        for name, now, was in zip(COUNTS, e.counters.snapshot(), snap):
            setattr(out, name, getattr(out, name) + now - was)
        out.placements += e.counters.placements[n_places:]
    return out
