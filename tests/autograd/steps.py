"""A training step's promises, checked by the model tests of tests/autograd/: repeated, it is one graph compute with
no graph built and nothing read back, whole on a GPU device (one split, no op on the CPU), and it learns."""
from __future__ import annotations

from collections.abc import Callable

import ggmlpy as g


def check_step_stays_on_device(step: Callable[[], object], device: str, steps: int, drop: float) -> None:
    """``step()`` returns its loss; after ``steps`` more steps the loss is below ``drop`` times the first."""
    first = float(step())
    step()
    trace = g.ag_trace(step)
    assert trace.computes == 1 and trace.graphs_built == 0 and trace.downloads == 0, trace
    if device != "cpu":   # on the CPU, OpenBLAS's backend takes the large products: splits there are no copies
        assert trace.n_splits == 1 and trace.cpu_ops == [], trace.placements[-1]
    for _ in range(steps):
        last = float(step())
    assert last < drop * first, (first, last)
