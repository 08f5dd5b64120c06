"""Who owns the C objects of a model (issue 41, item 3): at most three owners between the model and any C
object it holds (Runtime -> Predictor -> Graph -> handles), and none of the training's: a fit's runner and its
opt context belong to the fit call, a ggml_trainer's to the trainer (one owner between it and them)."""
from __future__ import annotations

from collections import deque

import numpy as np

import ggmlpy as g
from ggmlpy.core.handle import Handle
from ggmlpy.graph.objects import Tensor
from ggmlpy.models.layers.layer import Layer
from ggmlpy.models.network.model import Model, Node


def _held(obj):
    """The ggmlpy objects ``obj`` holds in its attributes (and in lists, tuples, sets and dicts there)."""
    out, todo = [], list(vars(obj).values()) if hasattr(obj, "__dict__") else []
    while todo:
        v = todo.pop()
        if isinstance(v, (list, tuple, set, frozenset)):
            todo += list(v)
        elif isinstance(v, dict):
            todo += list(v.values())
        elif type(v).__module__.startswith("ggmlpy") and not isinstance(v, type):
            out.append(v)
    return out


def owner_chains(root):
    """The shortest chain of owners from ``root`` to each C object it reaches. Layers and nodes are the
    architecture (they hold no C object), a tensor only keeps its context alive, another model is its own."""
    queue, seen, chains = deque([(root, [])]), {id(root)}, []
    while queue:
        obj, owners = queue.popleft()
        for held in _held(obj):
            if id(held) in seen or isinstance(held, (Layer, Node, Tensor, Model)):
                continue
            seen.add(id(held))
            if isinstance(held, Handle):
                chains.append(owners + [type(held).__name__])
            else:
                queue.append((held, owners + [type(held).__name__]))
    return chains


def trained_model():
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 8, activation="relu", input_shape=(4,))
    m = g.ggml_compile(g.ggml_layer_dense(m, 2, activation="softmax"), optimizer="rmsprop", backend="cpu")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 4)).astype(np.float32), np.eye(2)[rng.integers(0, 2, 32)]
    g.ggml_fit(m, x, y, epochs=1, batch_size=16, verbose=0)
    g.ggml_predict(m, x)
    return m, x, y


def test_a_model_holds_its_c_objects_at_most_three_owners_down_and_no_training_objects():
    m, _, _ = trained_model()
    trainer = g.ggml_trainer(m, batch_size=16)
    chains = owner_chains(m)
    assert chains and max(len(c) - 1 for c in chains) <= 3, max(chains, key=len)
    assert not [c for c in chains if "OptContext" in c or any("Runner" in o for o in c)]
    assert trainer is not None   # alive while the model's chains were read


def test_a_trainer_holds_its_runner_and_the_runner_its_opt_context():
    m, _, _ = trained_model()
    trainer = g.ggml_trainer(m, batch_size=16)
    chains = owner_chains(trainer)
    runner = [c for c in chains if c and c[0].endswith("Runner")]
    assert runner and max(len(c) - 1 for c in chains) <= 3, max(chains, key=len)
