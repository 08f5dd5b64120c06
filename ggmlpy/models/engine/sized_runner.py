"""The step runner of a fit of a model with variable sizes (``SizedRunner``): a training stream may bring batches of
several lengths, and ggml's graphs have fixed sizes, so each size gets a runner of its own (``training_runner`` for
those sizes), kept for the last ``KEPT_SIZES``, and the optimizer's state moves to the runner of each batch's sizes.

To the one fit loop, and to a ``ggml_trainer``, it is a runner like the others (``training.runner.StepRunner``):
the loop holds the first runner's optimizer state, learning rates, Ctrl-C guard and compiled metrics, which every
runner shares or is given before its steps; at the end of each epoch the state is back in the first runner, where
the fit keeps it (a trainer keeps ``state``, the latest, when it is freed).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TYPE_CHECKING

import numpy as np

from ...errors import GgmlStateError
from ...training.adapters import Writer
from ...training.runner import EpochStats, Result, StepRunner, Watch
from .graphs import InputShapes
from .optimizer_state import OptimizerState


if TYPE_CHECKING:
    from ...compute.placement import Placement
    from ...opt.context import OptContext
    from ...opt.graph_optimizer import GraphOptimizer


KEPT_SIZES = 4   # the runners kept, the first's included (as the predictor keeps graphs)


class SizedRunner:
    """A ``StepRunner`` over runners made by ``make(shapes)``, one per size of the inputs; see the module's doc."""

    def __init__(self, make: Callable[[InputShapes], StepRunner], shapes: InputShapes,
                 opt_state: OptimizerState) -> None:
        self._make, self._opt_state = make, opt_state
        self.first = make(shapes)
        # the loop's view: the first runner's graph, options (its metrics, shared by all), guard and rates
        first = self.first
        self.graph, self.options, self.guard, self.lr_ud = first.graph, first.options, first.guard, first.lr_ud
        self.batch_size = first.batch_size
        self._runners: dict[InputShapes, StepRunner] = {shapes: first}   # the most recently used last
        self._writers: dict[tuple[InputShapes, str, bool], Writer] = {}
        self._current, self._shapes = first, shapes

    # ---- what the loop reads
    @property
    def state(self) -> OptContext | GraphOptimizer:
        """The optimizer state of the runner stepping now (the latest). The fit loop takes it once, before the first
        step: the first runner's, where ``drain(final=True)`` puts the state back at each epoch's end."""
        return self._current.state

    @property
    def placement(self) -> Placement | None:
        return self.first.placement

    def writer(self, name: str, train: bool) -> _SizedWriter:
        return _SizedWriter(name, train)

    def new_result(self) -> Result:
        return self.first.new_result()

    def result_loss(self, result: Result) -> float:
        return self.first.result_loss(result)

    def epoch_stats(self, result: Result, steps: int) -> EpochStats:
        return self.first.epoch_stats(result, steps)

    def split_threads(self) -> list:
        return self._current.split_threads()

    def history_attrs(self) -> dict:
        return self.first.history_attrs()

    def keepers(self) -> list:
        return self.first.keepers()

    # ---- steps
    def step(self, pairs: Sequence[Any], train: bool, result: Result, watch: Watch | None = None,
             defer: bool = False) -> None:
        """One batch (what ``_SizedWriter.parse`` made: its sizes and the batch) on the runner of its sizes."""
        shapes, name, batch = pairs
        runner = self._use(shapes)
        key = (shapes, name, train)
        writer = self._writers.get(key)
        if writer is None:
            writer = self._writers[key] = runner.writer(name, train)
        runner.step(writer.parse(batch), train, result, watch, defer)

    def _use(self, shapes: InputShapes) -> StepRunner:
        """The runner of ``shapes``, made current: the optimizer's state moves to it from the one before."""
        if shapes != self._shapes:
            current = self._current
            current.drain()
            if current.state.pending_batches:
                raise GgmlStateError(f"a batch of inputs {shapes} after batches of {self._shapes}, inside a logical "
                                     f"batch ({current.state.pending_batches} batches accumulated, nbatch_logical): "
                                     "change the sizes between logical batches (group the batches by length, a "
                                     "multiple of nbatch_logical / batch_size of each)")
            runner = self._runners.pop(shapes, None)
            if runner is None:
                if len(self._runners) >= KEPT_SIZES:  # the size used longest ago, never the first (the fit's state)
                    oldest = next(s for s, r in self._runners.items() if r is not self.first and r is not current)
                    self._close(oldest)
                runner = self._make(shapes)
                runner.guard = self.guard  # the Ctrl-C guard the loop installed
            self._runners[shapes] = runner
            self._opt_state.keep(current.state, warn_partial=False)
            self._opt_state.restore(runner.state)
            self._current, self._shapes = runner, shapes
        else:
            self._runners[shapes] = self._runners.pop(shapes)
        if self._current is not self.first:  # the rates the loop's callbacks and schedules set, on the first's
            self._current.lr_ud.params[0] = self.lr_ud.params[0]
            self._current.lr_ud.provider = self.lr_ud.provider
        return self._current

    def drain(self, final: bool = False) -> None:
        self._current.drain(final)
        if final and self._current is not self.first:  # the epoch's end: the state back in the first runner
            self._opt_state.keep(self._current.state, warn_partial=False)
            self._opt_state.restore(self.first.state)

    def _close(self, shapes: InputShapes) -> None:
        self._runners.pop(shapes).close()
        for key in [k for k in self._writers if k[0] == shapes]:
            del self._writers[key]

    def close(self) -> None:
        runners = list(self._runners.values())
        self._runners.clear()
        self._writers.clear()
        failure: BaseException | None = None
        for runner in reversed(runners):   # the first last
            try:
                runner.close()
            except BaseException as exc:  # noqa: BLE001 - every runner is closed; the first failure is raised
                failure = failure or exc
        if failure is not None:
            raise failure


class _SizedWriter:
    """The writer of a ``SizedRunner``: a batch's sizes and the batch, parsed by the runner of those sizes at its
    step (arrays copied when a prefetching feed asks, ``own``: the source may refill them meanwhile)."""

    def __init__(self, name: str, train: bool) -> None:
        self.name, self.train = name, train

    def parse(self, batch: object, own: bool = False) -> Sequence[object]:
        if not isinstance(batch, dict):
            raise GgmlStateError(f"internal: {self.name}: a variable model's batch is the model layer's dict; "
                                 "please report it")
        if own:
            batch = {k: [np.array(a) for a in v] if isinstance(v, list) else v for k, v in batch.items()}
        shapes = tuple(tuple(int(d) for d in np.shape(a)[1:]) for a in batch["inputs"])
        return (shapes, self.name, batch)
