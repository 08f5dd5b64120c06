"""Batched inference over arrays (``predict_arrays``), shared by ``ggml_predict``/``ggml_evaluate`` and the
hand-stepped trainer.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from ...core.handle import InterruptKeeper
from ...training.progress import EpochProgress
from ..network.model import Model


class AnyPredictor(Protocol):
    """What runs a model's inference graph on a batch (``runtime.Predictor``, ``runtime.ReplicaPredictor``)."""
    def run(self, arrays: list[np.ndarray], batch: int) -> list[np.ndarray]: ...


def predict_arrays(model: Model, predictor: AnyPredictor, xs: list[np.ndarray], batch_size: int,
                   progress: str | None = None) -> list[np.ndarray]:
    """Outputs (N, *output_shape) for inputs in ggml layout; the last partial batch is zero-padded and
    its padding dropped from the result. ``progress``: a bar of that name over the batches (on a terminal)."""
    n = xs[0].shape[0]
    batch = min(batch_size, n)
    outputs = model.graph()[1]
    # each output's sample shape (a variable size fixed by the inputs' sizes)
    sizes = model.concrete_shapes([x.shape[1:] for x in xs]) if model.variable else {id(o): o.shape for o in outputs}
    shapes = [tuple(sizes[id(o)]) for o in outputs]
    if n == 0:
        return [np.zeros((0,) + shape, dtype=np.float32) for shape in shapes]
    chunks: list[list[np.ndarray]] = [[] for _ in outputs]
    bar = EpochProgress(0, 0, -(-n // batch), progress is None, desc=progress)
    with InterruptKeeper() as interrupts:  # a Ctrl-C swallowed by a finalizer between batches is not lost
        for done, start in enumerate(range(0, n, batch), 1):
            interrupts.check()
            part = [x[start:start + batch] for x in xs]
            m = part[0].shape[0]
            if m < batch:
                part = [np.concatenate([p, np.zeros((batch - m,) + p.shape[1:], dtype=p.dtype)]) for p in part]
            for i, (o, shape) in enumerate(zip(predictor.run(part, batch), shapes)):
                chunks[i].append(o.reshape((batch,) + shape)[:m])
            bar.update(done * batch, None)
    bar.close()
    return [np.concatenate(c) for c in chunks]
