"""Training-loop cases: ggml_fit_opt_gen on a tiny linear model with random (and bad) arguments and
sources. Oracles: no crash or hang; an error is a ggmlpy error, or the source's own exception unchanged;
a completed fit has at most ``epochs`` rows and no epoch longer than ``steps_per_epoch``."""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

import ggmlpy as G


B = 8  # physical batch


class SourceError(Exception):
    """Raised by a fuzzed source on purpose: ggmlpy must let it through unchanged."""


from tests.fuzz.oracle import Wrong  # noqa: E402


def _batch(rng: np.random.Generator, bad: str | None, k: int) -> Any:
    x = rng.normal(size=(B, 4)).astype(np.float32)
    y = rng.normal(size=(B, 2)).astype(np.float32)
    if bad is None or k != 1:
        return x, y
    return {"transposed": lambda: (x.T, y), "short": lambda: (x[:-1], y[:-1]), "nan": lambda: (x * np.nan, y),
            "str": lambda: ("x", y), "none_y": lambda: (x, None), "triple": lambda: (x, y, y),
            "dict": lambda: {"inputs": [x], "labels": [y], "extra": 1}, "complex": lambda: (x + 1j, y),
            "flat": lambda: (x.reshape(-1), y.reshape(-1)), "int": lambda: (x.astype(np.int64), y),
            "huge": lambda: (np.full((B, 4), 1e30), y), "object": lambda: (np.array([None] * 32).reshape(B, 4), y),
            "ragged": lambda: ([[1.0, 2.0], [3.0]], y), "scalar": lambda: (1.0, y),
            "raise": lambda: (_ for _ in ()).throw(SourceError("from the source"))}[bad]()


def make_source(kind: str, n: int, bad: str | None, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    batches = [_batch(rng, None, 0) for _ in range(max(n, 0))]

    def gen():
        for k in range(n):
            yield _batch(rng, bad, k)

    def infinite():
        while True:
            yield _batch(rng, bad, 0)

    if kind == "genfn":
        return gen
    if kind == "genobj":
        return gen()
    if kind == "list":
        return batches if bad is None else [_batch(rng, bad, k) for k in range(n)]
    if kind == "iter":
        return iter(batches)
    if kind == "callable":
        state = {"k": 0}

        def call():
            if state["k"] >= n:
                state["k"] = 0
                return None
            state["k"] += 1
            return _batch(rng, bad, state["k"] - 1)
        return call
    if kind == "infinite":
        return infinite
    if kind == "cycle":
        return itertools.cycle(batches or [_batch(rng, None, 0)])
    if kind == "lambda_gen":
        return lambda: gen()
    if kind == "string":
        return "batches"
    if kind == "none":
        return None
    raise ValueError(kind)


CALLBACKS = {
    None: None,
    "early": lambda: [G.ggml_callback_early_stopping(monitor="train_loss", patience=1)],
    "cosine": lambda: [G.ggml_schedule_cosine_decay()],
    "step": lambda: [G.ggml_schedule_step_decay(step_size=1, gamma=0.5)],
    "plateau": lambda: [G.ggml_schedule_reduce_on_plateau(monitor="train_loss", patience=1)],
    "stop": lambda: [{"on_epoch_end": lambda e, logs, s: setattr(s, "stop", True)}],
    "raises": lambda: [{"on_epoch_begin": lambda e, logs, s: (_ for _ in ()).throw(SourceError("callback"))}],
    "typo": lambda: [{"on_epoch_ends": lambda e, logs, s: None}],
    "not_callable": lambda: [{"on_epoch_end": 3}],
}


def run(case: dict) -> None:
    from tests.fuzz.worker import V
    backend = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(backend, 1)
    sched = G.ggml_backend_sched_new([backend], parallel=False, graph_size=256)
    ctx = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(256, True), no_alloc=True)
    x = G.ggml_set_input(G.ggml_set_name(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, B), "x"))
    w = G.ggml_set_param(G.ggml_set_name(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 2), "w"))
    out = G.ggml_mul_mat(ctx, w, x)
    G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    G.ggml_backend_tensor_set_data(w, np.zeros(8))
    source = make_source(case["source"], case["n"], case.get("bad_batch"), case.get("seed", 0))
    val = make_source(case["val_source"], case["n"], None, 1) if case.get("val_source") else None
    loss = {"mse": G.ggml_opt_loss_type_mse(), "ce": G.ggml_opt_loss_type_cross_entropy(),
            "mae": G.ggml_opt_loss_type_mae(), "huber": G.ggml_opt_loss_type_huber(),
            "bce": G.ggml_opt_loss_type_binary_cross_entropy(), "bad": V(case.get("bad_loss", "$str"))}[case["loss"]]
    kwargs = {k: V(case[k]) for k in ("steps_per_epoch", "epochs", "initial_epoch", "validation_steps",
                                       "nbatch_logical", "prefetch", "learning_rate", "weight_decay", "optimizer",
                                       "on_nonfinite") if k in case}
    cb = CALLBACKS[case.get("callbacks")]
    hist = G.ggml_fit_opt_gen(sched, ctx, x, out, source, validation_generator=val, loss_type=loss,
                              callbacks=cb() if cb else None, silent=True, **kwargs)
    epochs = kwargs.get("epochs", 1)
    if len(hist) > epochs:
        raise Wrong(f"{len(hist)} history rows for epochs={epochs}")
    spe = kwargs.get("steps_per_epoch")
    if spe is not None and len(hist) and int(hist["steps"].max()) > spe:
        raise Wrong(f"an epoch of {int(hist['steps'].max())} steps with steps_per_epoch={spe}")
