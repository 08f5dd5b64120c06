"""The route of one fit, as docs/guide/architecture.md draws it: from the public function to the step runner's
``step`` at most five calls (issue 41's budget), whichever runner trains the model; read from the live stack
at the first step, so a new layer of indirection fails here."""
from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.training.graph_steps import GraphOptimizerRunner
from ggmlpy.training.loop import NativeRunner
from ggmlpy.training.replicas import ReplicaRunner


PACKAGE = os.path.dirname(g.__file__)
GUARD = os.path.join(PACKAGE, "_guard.py")


def _route(monkeypatch, runner_class, fit) -> list[str]:
    """The ggmlpy functions between ``fit``'s public function and ``runner_class.step`` (both included), from the
    stack of the first step; the guard's one wrapper frame is the public function's own."""
    seen: list[list[str]] = []
    step = runner_class.step

    def watched(self, *args, **kwargs):
        if not seen:
            frames = inspect.stack()[1:]  # from the caller of step outwards
            names = []
            for f in frames:
                if not f.filename.startswith(PACKAGE) or f.filename == GUARD:
                    if names:
                        break  # the user's line: the route ends
                    continue
                names.append(f.function)
            seen.append(list(reversed(names)) + [f"{runner_class.__name__}.step"])
        return step(self, *args, **kwargs)
    monkeypatch.setattr(runner_class, "step", watched)
    fit()
    assert seen, f"{runner_class.__name__}.step never ran"
    return seen[0]


def _model(optimizer, backend="cpu"):
    np.random.seed(0)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(3,))
    return g.ggml_compile(m, optimizer=optimizer, loss="mse", metrics=[], backend=backend)


def _second_device() -> str:
    if "vulkan" not in g.ggml_backends_built():
        pytest.skip("the Vulkan backend is not built in this installation (GGMLPY_BACKENDS): no second local device "
                    "for data-parallel replicas")
    if g.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("no Vulkan device (install mesa-vulkan-drivers for lavapipe): no second local device for "
                    "data-parallel replicas")
    return "Vulkan0"


X = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
Y = np.random.default_rng(1).normal(size=(16, 2)).astype(np.float32)


@pytest.mark.parametrize("optimizer, runner", [("adam", NativeRunner), ("rmsprop", GraphOptimizerRunner),
                                               ("adam", ReplicaRunner)])
@pytest.mark.parametrize("public", ["ggml_fit", "ggml_fit_generator"])
def test_a_fit_reaches_the_step_in_at_most_five_calls(monkeypatch, optimizer, runner, public):
    m = _model(optimizer, ["cpu", _second_device()] if runner is ReplicaRunner else "cpu")
    if public == "ggml_fit":
        def fit():
            g.ggml_fit(m, X, Y, epochs=1, batch_size=8, verbose=0)
    else:
        def fit():
            g.ggml_fit_generator(m, [(X[:8], Y[:8]), (X[8:], Y[8:])], epochs=1, verbose=0)
    route = _route(monkeypatch, runner, fit)
    assert route[0] == public, route
    hops = len(route) - 1
    assert hops <= 5, f"{public} reaches the step in {hops} calls (at most 5): {' -> '.join(route)}"
