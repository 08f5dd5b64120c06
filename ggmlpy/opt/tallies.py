"""Statistics of the training steps summed on the device (a fit's compiled metrics), read once per epoch.

A ``TallySource`` (the model layer's metrics) builds, from the loss heads' outputs and labels, a few small F32
tensors of per-batch sums (``device_stats``). ``DeviceTally`` keeps their sums in one accumulator in device memory
and adds each step's statistics to it inside the training graph (ggml-opt's extra outputs, as batch-norm statistics
are updated): no step reads an output back for its metrics. The accumulator is zeroed by an upload queued ahead of
the first step after each read, and read:

- behind the last step of an epoch, within that step's one wait (``unread``: the runner queues it when it drains
  the epoch; ``collect`` reads it with a wait of its own where no step was left to queue it behind);
- behind every ``flush_every``-th step too, so that counts summed in F32 stay below 2**24, where F32 holds every
  integer exactly (a step adds at most one count per output element).

The statistics are folded into the source's float64 sums by the function ``device_stats`` returned with them,
together with the number of steps they cover.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ..backend.buffer import Buffer, ggml_backend_alloc_ctx_tensors
from ..backend.transfer import ggml_backend_tensor_get_data, ggml_backend_tensor_set_data
from ..compute.sched import Scheduler
from ..compute.staging import Reads
from ..core.types import GGML_TYPE_F32
from ..graph.context import ggml_init, ggml_tensor_overhead
from ..graph.objects import Context, Tensor
from ..graph.tensor import ggml_new_tensor, ggml_new_tensor_1d, ggml_set_name, ggml_set_output, pending_constant
from ..ops.elementwise import ggml_add
from ..ops.layout import ggml_cpy, ggml_reshape_1d
from ..ops.reduce import ggml_concat
from .losses import loss_backend


F32_EXACT = 1 << 24   # every integer up to this is exact in F32

# what device_stats returns: the statistics (1-D F32 tensors, summed over a step) and the function that folds
# their sums over ``steps`` steps into the source's own sums
Fold = Callable[[list[np.ndarray], int], None]


class TallyGraph:
    """Where a source builds its statistics: ``ctx`` (no_alloc; every tensor in it gets memory on the device with
    the accumulators), ``constant(values)`` for the tensors it needs written once (thresholds), ``shape(ne)`` for a
    tensor that only gives ``ggml_repeat`` its shape (in a context never allocated)."""

    def __init__(self, n_tensors: int) -> None:
        self.ctx: Context = ggml_init(n_tensors * ggml_tensor_overhead() + 4096, no_alloc=True)
        self.shapes: Context = ggml_init(n_tensors // 16 * ggml_tensor_overhead() + 4096, no_alloc=True)
        self.constants: list[tuple[Tensor, np.ndarray]] = []

    def constant(self, values: np.ndarray) -> Tensor:
        """An F32 tensor holding ``values`` (numpy order: ggml's shape reversed), written once it has memory."""
        return pending_constant(self.ctx, values, self.constants)

    def shape(self, ne: tuple[int, ...]) -> Tensor:
        """An F32 tensor of shape ``ne`` with no memory: a shape for ``ggml_repeat``, never computed."""
        return ggml_new_tensor(self.shapes, GGML_TYPE_F32, len(ne), ne)


class TallySource(Protocol):
    """What a ``DeviceTally`` sums: ``device_stats`` builds the statistics of one step from each head's outputs and
    labels (None for a head without labels) and returns them with their fold, or None where they cannot be built
    (then nothing is summed on the device); ``device``: whether they are to be summed on the device at all (else
    the opt context builds nothing for them); ``generation`` changes whenever the source's sums are reset (an
    epoch's start), which restarts the accumulators too."""
    generation: int
    device: bool

    def device_stats(self, g: TallyGraph, outputs: Sequence[Tensor],
                     labels: Sequence[Tensor | None]) -> tuple[list[Tensor], Fold] | None: ...


class DeviceTally:
    """The accumulator of one opt context's training steps (see the module's docstring): one F32 tensor, the
    statistics one after another. ``updates``: the nodes ggml-opt computes with every step (its extra outputs);
    ``owned``: the contexts and buffer its graphs read, freed by ``free`` with the pinned slot of its read."""

    def __init__(self, source: TallySource, sched: Scheduler, outputs: Sequence[Tensor],
                 labels: Sequence[Tensor | None]) -> None:
        self.source = source
        g = TallyGraph(4096)   # tensor headers only (host memory): room for hundreds of metrics
        self.owned: list = [g.ctx, g.shapes]
        self.updates: list[Tensor] = []
        self.accumulator: Tensor | None = None
        self.reads: Reads | None = None
        self._fold: Fold | None = None
        built = source.device_stats(g, outputs, labels)
        if built is None:
            return
        stats, self._fold = built
        # one vector of every statistic, added to the accumulator with one add and one copy
        flat = [s if len(s.shape) == 1 else ggml_reshape_1d(g.ctx, s, s.nelements()) for s in stats]
        total = flat[0]
        for s in flat[1:]:
            total = ggml_concat(g.ctx, total, s, 0)
        acc = self.accumulator = ggml_set_name(ggml_new_tensor_1d(g.ctx, GGML_TYPE_F32, total.nelements()),
                                               "tallies")
        self.updates.append(ggml_set_output(ggml_cpy(g.ctx, ggml_add(g.ctx, acc, total), acc)))
        self._sizes = [s.nelements() for s in stats]
        # the device that runs every op of the statistics (the outputs' device), as the loss graph's is chosen
        buffer: Buffer | None = ggml_backend_alloc_ctx_tensors(g.ctx, loss_backend(g.ctx, sched))
        if buffer is not None:
            self.owned.insert(0, buffer)
        for t, values in g.constants:
            ggml_backend_tensor_set_data(t, values)
        self.zeros = np.zeros(acc.nelements(), dtype=np.float32)
        # a step adds at most one count per output element to any statistic
        self.flush_every = max(1, F32_EXACT // max(1, max(o.nelements() for o in outputs)))
        self.reads = Reads([acc], sched.backends)
        self.steps = 0                  # steps summed in the accumulator since it was zeroed
        self.zeroed_for: int | None = None   # the source's generation it was zeroed for
        self._restart = True            # zero it ahead of the next step

    @property
    def active(self) -> bool:
        """Whether the statistics are summed here (the source could build them)."""
        return self.accumulator is not None

    @property
    def _current(self) -> bool:
        """Whether the accumulator holds the sums of steps of the source's current generation."""
        return not self._restart and self.zeroed_for == self.source.generation

    def plan(self) -> tuple[list[tuple[Tensor, np.ndarray]], Reads | None]:
        """For the coming step: the writes to queue ahead of it (zeros, at an epoch's start or after a read) and
        the read to queue behind it (None unless its counts could otherwise reach 2**24)."""
        assert self.accumulator is not None  # active
        steps = self.steps + 1 if self._current else 1
        writes = [] if self._current else [(self.accumulator, self.zeros)]
        return writes, self.reads if steps >= self.flush_every else None

    def submitted(self) -> None:
        """The step ``plan`` was made for was queued (with its writes and read)."""
        if not self._current:
            self.steps, self.zeroed_for, self._restart = 0, self.source.generation, False
        self.steps += 1

    def unread(self) -> Reads | None:
        """The read to queue behind the last step so that its wait brings the sums (an epoch's end), or None when
        every summed step was read already."""
        return self.reads if self._current and self.steps else None

    def after_wait(self, read: Reads | None) -> None:
        """The wait of a step returned: fold what ``read`` (queued behind it) read, if anything."""
        if read is not None and self._current:
            self._fold_values(read.values()[0])

    def collect(self) -> None:
        """Fold the sums of the steps not read yet (a blocking read; call when no step is queued)."""
        if self.accumulator is not None and self._current and self.steps:
            self._fold_values(ggml_backend_tensor_get_data(self.accumulator))

    def _fold_values(self, values: np.ndarray) -> None:
        assert self._fold is not None  # active
        parts = np.split(values.astype(np.float64), np.cumsum(self._sizes)[:-1])
        self._fold(parts, self.steps)
        self.steps, self._restart = 0, True

    def free(self) -> None:
        if self.reads is not None:
            self.reads.free()
            self.reads = None
        for h in self.owned:
            h.free()
        self.owned.clear()
