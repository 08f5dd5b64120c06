"""ggmlR's ``dp_train``: synchronous data-parallel training of an ``ag_*`` model over several devices (replicas), each
step a sample per replica, the gradients averaged, one Adam step, the weights sent back to every replica.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..backend.device import ggml_backend_devices
from ..core.args import is_int
from ..errors import GgmlTypeError, GgmlValueError
from .device import resolve_device, thread_device
from .optim import clip_grad_norm, optimizer_adam, param_list
from .tape import backward, TapeBlock
from .tensor import ag_tensor, AgTensor


__all__ = ["dp_train"]


def _replica_devices(n_gpu: object, devices: Sequence[str] | None, fn: str) -> list[str]:
    if devices is not None:
        if isinstance(devices, str) or not devices:
            raise GgmlValueError(f"{fn}: devices must be a non-empty list of device names, got {devices!r}")
        return [resolve_device(d, fn) for d in devices]
    gpus = [d.name for d in ggml_backend_devices() if d.type == "gpu"]
    if n_gpu is None:
        return gpus or ["cpu"]
    if not is_int(n_gpu) or int(n_gpu) < 1:
        raise GgmlValueError(f"{fn}: n_gpu must be an int >= 1 or None, got {n_gpu!r}")
    n = int(n_gpu)
    if gpus and n > len(gpus):
        raise GgmlValueError(f"{fn}: n_gpu={n}, but there are {len(gpus)} GPUs ({gpus}); pass devices=[...] to put "
                             "several replicas on one device")
    return gpus[:n] if gpus else ["cpu"] * n


def _build(make_model: Callable[[], object], device: str, fn: str) -> object:
    before = thread_device(device)
    try:
        model = make_model()
    finally:
        thread_device(before)
    if not callable(getattr(model, "parameters", None)):
        raise GgmlTypeError(f"{fn}: make_model must return a model with parameters() (an ag_* layer or your own), "
                            f"got {type(model).__name__}")
    return model


def dp_train(make_model: Callable[[], object], data: Sequence[object], loss_fn: Callable | None = None,
             forward_fn: Callable | None = None, target_fn: Callable | None = None, n_gpu: int | None = None,
             n_iter: int = 10, lr: float = 1e-3, max_norm: float = math.inf, verbose: int | bool = 10,
             devices: Sequence[str] | None = None) -> dict:
    """Synchronous data-parallel training: one replica of the model per device, a sample per replica per step.

    ``make_model()`` is called once per replica, on its device; replica 0's initial weights are copied to the
    others. Each iteration, replica r takes sample ``(it * n + r) % len(data)``, computes its loss and gradients
    (the replicas run at the same time, each as one graph on its device), the gradients are averaged, clipped to
    ``max_norm`` (global L2 norm), one Adam step updates replica 0, and its weights are copied to the others.

    Arguments:
        make_model: a function of no arguments returning a model with ``parameters()`` (and ``forward`` or a call,
            when forward_fn is None); each call makes independent parameters.
        data: a sequence of samples, each passed to forward_fn (or to the model) as it is.
        loss_fn: ``(output, target) -> scalar AgTensor``; None: forward_fn (or the model) returns the loss.
        forward_fn: ``(model, sample) -> output``; None: ``model(sample)``.
        target_fn: ``(sample) -> target`` for loss_fn; None: the sample itself.
        n_gpu: the number of replicas: the first n GPUs (None: every GPU; on a machine without one, n replicas
            on the CPU).
        n_iter: the number of steps.
        lr: Adam's learning rate.
        max_norm: the gradient clipping bound (inf: none).
        verbose: print the mean loss every ``verbose`` steps (False or 0: never).
        devices: the replicas' devices by name (a device may appear more than once); overrides n_gpu.

    Value: a dict with ``params`` (replica 0's parameters by name), ``loss_history`` (each step's mean loss over
    the replicas), ``loss`` (the last) and ``model`` (replica 0).

    Example:
        >>> result = dp_train(lambda: ag_sequential(ag_linear(4, 16, "relu"), ag_linear(16, 3)), samples,
        ...                   loss_fn=ag_softmax_cross_entropy_loss, forward_fn=lambda m, s: m(ag_tensor(s[0])),
        ...                   target_fn=lambda s: s[1], n_iter=200)
    """
    fn = "dp_train"
    if not callable(make_model):
        raise GgmlTypeError(f"{fn}: make_model must be a function of no arguments, got {make_model!r}")
    if not isinstance(data, Sequence) or isinstance(data, (str, bytes)) or not len(data):
        raise GgmlValueError(f"{fn}: data must be a non-empty sequence of samples")
    if not is_int(n_iter) or int(n_iter) < 0:
        raise GgmlValueError(f"{fn}: n_iter must be an int >= 0, got {n_iter!r}")
    every = 0 if verbose is False else int(verbose)
    names = _replica_devices(n_gpu, devices, fn)
    models = [_build(make_model, d, fn) for d in names]
    params = [param_list(m, fn) for m in models]
    first = params[0]
    for k, ps in enumerate(params[1:], 1):
        if [(n, p.shape) for n, p in ps] != [(n, p.shape) for n, p in first]:
            raise GgmlValueError(f"{fn}: replica {k} has other parameters than replica 0; make_model must build "
                                 "the same architecture each call")
        for (_, p), (_, p0) in zip(ps, first):
            p.data = p0.numpy()
    opt = optimizer_adam([p for _, p in first], lr=lr)
    history: list[float] = []

    def replica_step(k: int, sample: object) -> tuple[float, list[np.ndarray]]:
        model = models[k]
        before = thread_device(names[k])   # data made in forward_fn goes to this replica's device
        try:
            return _replica_step(model, k, sample)
        finally:
            thread_device(before)

    def _replica_step(model: object, k: int, sample: object) -> tuple[float, list[np.ndarray]]:
        with TapeBlock():
            out = forward_fn(model, sample) if forward_fn is not None else model(sample)  # type: ignore[operator]
            loss = loss_fn(out, target_fn(sample) if target_fn is not None else sample) if loss_fn else out
        if not isinstance(loss, AgTensor):
            raise GgmlTypeError(f"{fn}: the loss must be an AgTensor, got {type(loss).__name__}")
        grads = backward(loss)
        values = [grads[p].numpy() if p in grads else np.zeros(p.shape, np.float32) for _, p in params[k]]
        for _, p in params[k]:
            p.grad = None   # each step's gradients are its own
        return float(loss.item()), values

    with ThreadPoolExecutor(max_workers=len(models), thread_name_prefix="ggmlpy-dp") as pool:
        for it in range(int(n_iter)):
            samples = [data[(it * len(models) + k) % len(data)] for k in range(len(models))]
            results = list(pool.map(replica_step, range(len(models)), samples))
            mean = [np.mean([r[1][i] for r in results], axis=0) for i in range(len(first))]
            grads = {p: ag_tensor(g, p.device) for (_, p), g in zip(first, mean)}
            if math.isfinite(max_norm):
                clip_grad_norm([p for _, p in first], grads, max_norm)   # type: ignore[arg-type]  # a mapping
            opt.step(grads)   # type: ignore[arg-type]  # a mapping parameter -> gradient
            values = [p.numpy() for _, p in first]
            for ps in params[1:]:
                for (_, p), v in zip(ps, values):
                    p.data = v
            history.append(float(np.mean([r[0] for r in results])))
            if every and (it + 1) % every == 0:
                print(f"dp_train step {it + 1}/{n_iter}: loss {history[-1]:.6f}")
    return {"params": dict(first), "loss_history": history, "loss": history[-1] if history else math.nan,
            "model": models[0]}
