"""What the one fit loop drives: a ``StepRunner``, the steps of one fit over its C objects, and the one epoch loop
over a runner's steps (``run_epoch``).

Three runners implement the protocol, one per way a training step is made:

    loop.NativeRunner              ggml-opt's own step: its optimizer (AdamW, SGD) inside the opt context
    graph_steps.GraphOptimizerRunner  an optimizer ggml-opt lacks (RMSprop, Adagrad, momentum SGD, clipping):
                                   gradients from a gradient-only opt context, the update as a graph of its own
    replicas.ReplicaRunner         data-parallel replicas on K devices: gradients summed on the first, the update
                                   there, the weights sent back

The fit loop (``loop.fit_loop``) and the model layer's hand-stepped trainer drive any of them the same way:
``writer`` turns a batch into what ``step`` writes; ``step`` runs one physical batch into a result
(``new_result``), on a GPU leaving its wait to the next step when asked to (``defer``; ``drain`` waits);
``epoch_stats`` reads a result; ``state`` is where the model's optimizer state is read and written; ``keepers``
and ``close`` own the C objects.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TYPE_CHECKING, TypeVar

from ..compute.placement import Placement, PlacementRecorder
from ..compute.sched import Scheduler
from ..core.handle import InterruptGuard, Lifetime
from ..opt import result as R
from ..opt.params import LrUserdata
from .adapters import Writer
from .config import StepOptions, TrainingGraph
from .progress import EpochProgress


if TYPE_CHECKING:
    from ..opt.context import OptContext
    from ..opt.graph_optimizer import GraphOptimizer

# a context manager factory given a scheduler, entered around a step's compute (a PlacementRecorder)
Watch = Callable[[Scheduler], AbstractContextManager[PlacementRecorder]]


class Feed(Protocol):
    """Batches for a runner's steps, an epoch at a time: what the runner's writer made of them."""
    def epoch(self, limit: int | None) -> Iterable[Any]: ...  # what the runner's writer made: opaque here
    def close(self) -> None: ...


@dataclass
class EpochStats:
    steps: int = 0
    samples: int = 0
    loss: float = math.nan
    accuracy: float = math.nan
    head_loss: list[float] = field(default_factory=list)
    head_accuracy: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # StepOptions.metrics' results, by log name


class Owned(Protocol):
    """Something a runner frees when it closes (a graph it was built with, that graph's scheduler)."""
    def free(self) -> None: ...


class Result(Protocol):
    """A runner's result: what its steps evaluate into, summed until ``reset``."""
    def reset(self) -> None: ...
    def free(self) -> None: ...


ResultT = TypeVar("ResultT", bound=Result)


class StepRunner(Protocol[ResultT]):
    """The steps of one fit, as the fit loop and the trainer drive them (see the module's docstring)."""
    graph: TrainingGraph       # the (first) training graph: its heads' names
    options: StepOptions       # the step's options: optimizer, period, metrics
    guard: InterruptGuard      # holds Ctrl-C back inside a step
    lr_ud: LrUserdata          # the optimizer's parameters for the coming steps (callbacks and schedules set them)
    batch_size: int            # samples per step

    @property
    def state(self) -> OptContext | GraphOptimizer: ...
    @property
    def placement(self) -> Placement | None: ...
    def writer(self, name: str, train: bool) -> Writer: ...
    def new_result(self) -> ResultT: ...
    def step(self, pairs: Any, train: bool, result: ResultT, watch: Watch | None = None,
             defer: bool = False) -> None: ...
    def drain(self, final: bool = False) -> None: ...
    def epoch_stats(self, result: ResultT, steps: int) -> EpochStats: ...
    def result_loss(self, result: ResultT) -> float: ...
    def split_threads(self) -> list: ...
    def history_attrs(self) -> dict: ...
    def keepers(self) -> list[Lifetime]: ...
    def close(self) -> None: ...


def opt_result_loss(result: R.OptResult) -> float:
    """The mean loss of the batches an opt context evaluated into ``result``."""
    return float(R.ggml_opt_result_loss(result)["loss"])


def run_epoch(runner: StepRunner[ResultT], feed: Feed, limit: int | None, train: bool, result: ResultT,
              progress: EpochProgress | None = None) -> EpochStats:
    """The one epoch loop: every batch of ``feed`` (at most ``limit``) stepped by ``runner`` into ``result``
    (reset first); the epoch's statistics, with the training steps' metrics."""
    result.reset()
    metrics = runner.options.metrics if train else None
    if metrics is not None:
        metrics.reset()
    steps = 0
    try:
        for pairs in feed.epoch(limit):
            # deferred: the step's wait comes with the next one, after its batch was read and staged
            runner.step(pairs, train, result, defer=True)
            steps += 1
            if progress is not None:
                progress.update(steps * runner.batch_size, lambda: runner.result_loss(result))
    finally:
        runner.drain(final=True)  # the last step's wait: the epoch's results are complete, also when it ends early
    stats = runner.epoch_stats(result, steps)
    if metrics is not None and steps:
        stats.metrics = metrics.results()
    return stats
