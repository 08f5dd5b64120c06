"""The dropout seeds of a model's training graph (``GraphBuilder.dropout``)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...graph.objects import Tensor


class DropoutSeeds:
    """The seeds of a training graph's dropout layers (one I32 each, in one input tensor): new ones before every
    training step, so each step gets fresh masks, which ggml_dropout makes on the device from them."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.tensor: Tensor | None = None
        self.used = 0

    @property
    def written(self) -> list[Tensor]:
        return [self.tensor] if self.tensor is not None else []

    def before_eval(self, train: bool, write: Callable[[Tensor, np.ndarray], None]) -> None:
        if train and self.tensor is not None:  # I32 [n] (made in seed_input): the raw write needs no checks
            write(self.tensor, self.rng.integers(-2 ** 31, 2 ** 31, self.tensor.shape[0], dtype=np.int32))

    def after_eval(self, train: bool) -> None:
        pass
