"""ggmlR's optimizers (``optimizer_sgd``, ``optimizer_adam``) and gradient clipping for ``ag_*`` parameters.

An optimizer's ``step()`` adds its updates to the lazy values of the step (the loss, ggml's backward pass, any
clipping) and computes them all as one graph on the device: ggml's fused AdamW and SGD kernels update the
parameters and moments in place. Learning rate, Adam's step count and the like are inputs of that graph, so a
scheduler changing them does not rebuild it.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from ..core.args import is_real
from ..errors import GgmlpyWarning, GgmlTypeError, GgmlValueError
from ..graph.objects import Tensor
from ..ops.elementwise import ggml_abs, ggml_add, ggml_mul, ggml_relu, ggml_sub
from ..ops.layout import ggml_cpy, ggml_get_rows, ggml_reshape_2d, ggml_view_1d
from ..ops.reduce import ggml_argmax
from ..opt.rules import OptimizerSpec, step_ops
from .device import Storage
from .lazy import Builder, evaluate, Op
from .ops import ag_add, ag_clamp, ag_mul, ag_pow, ag_sum
from .tape import Grads
from .tensor import AgTensor, result


__all__ = ["optimizer_sgd", "optimizer_adam", "clip_grad_norm", "clip_grad_value", "check_grad_anomaly"]


def param_list(params: object, fn: str) -> list[tuple[str, AgTensor]]:
    """(name, parameter) pairs of a dict, a module's ``parameters()``, a list or one AgTensor."""
    if isinstance(params, AgTensor):
        items: list[tuple[str, object]] = [("param1", params)]
    elif isinstance(params, Mapping):
        items = [(str(k), v) for k, v in params.items()]
    elif hasattr(params, "parameters") and callable(params.parameters):
        items = list(params.parameters().items())
    elif isinstance(params, Iterable) and not isinstance(params, (str, bytes)):
        items = [(f"param{i + 1}", p) for i, p in enumerate(params)]
    else:
        raise GgmlTypeError(f"{fn}: params must be a dict, a list, a module or an AgTensor, got "
                            f"{type(params).__name__}")
    for name, p in items:
        if not isinstance(p, AgTensor) or p.op is not None or not p.requires_grad:
            raise GgmlValueError(f"{fn}: {name} is not a trainable leaf (make parameters with ag_param)")
    seen: set[int] = set()
    out: list[tuple[str, AgTensor]] = []
    for name, p in items:
        if isinstance(p, AgTensor) and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def _rate(fn: str, name: str, v: float, low: float = 0.0, high: float = math.inf, closed_high: bool = False) -> float:
    ok = is_real(v) and not isinstance(v, bool) and math.isfinite(float(v)) and low <= float(v) and (
        float(v) <= high if closed_high else float(v) < high)
    if not ok:
        raise GgmlValueError(f"{fn}: {name} must be a finite number in [{low}, {high}{']' if closed_high else ')'}, "
                             f"got {v!r}")
    return float(v)


def _grads_of(params: list[tuple[str, AgTensor]], grads: Grads | None) -> list[tuple[AgTensor, AgTensor | None]]:
    if grads is None:
        return [(p, p.grad) for _, p in params]
    return [(p, grads[p] if p in grads else None) for _, p in params]


def _state_leaf(p: AgTensor) -> AgTensor:
    """A zeroed tensor of its own beside parameter ``p`` (a moment, a velocity)."""
    t = AgTensor(p.engine, p.shape, "f32")
    t.storage = Storage(p.engine, p.shape, "f32")
    return t


def _lower_adamw(b: Builder, xs: list, attrs: tuple) -> Tensor:
    p, g, m, v, hp = xs
    return step_ops(b.ctx, OptimizerSpec("adamw"), p, g, {"m": m, "v": v}, hp)[0]


def _lower_sgd(b: Builder, xs: list, attrs: tuple) -> Tensor:
    """hp = [lr, 0, momentum]: ggml's SGD step reads the first two (rate, decay)."""
    p, g, vel, hp = xs if len(xs) == 4 else (*xs[:2], None, xs[2])
    if vel is not None:   # ggmlR's momentum: v = mu*v + g; p -= lr * v
        g = ggml_add(b.ctx, ggml_mul(b.ctx, vel, ggml_view_1d(b.ctx, hp, 1, 8)), g)
        b.ends.append(ggml_cpy(b.ctx, g, vel))
    return step_ops(b.ctx, OptimizerSpec("sgd"), p, g, {}, ggml_view_1d(b.ctx, hp, 2, 0))[0]


_ADAMW, _SGD = Op("adamw_step", _lower_adamw), Op("sgd_step", _lower_sgd)
_STEPS = {op.name: op for op in (_ADAMW, _SGD)}


def _lower_updates(b: Builder, xs: list, attrs: tuple) -> Tensor:
    """Every parameter's update of one step. The inputs are the gradients, in order, then the shared
    hyper-parameters; ``attrs`` = ((op name, the stored tensors it updates: the parameter first, then its state),
    ...), which the step's plan does not walk (they are the same each step: the graph's key holds them). The updates
    but the last are side effects of the graph (``b.ends``)."""
    hp, made = xs[-1], []
    for (name, stored), g in zip(attrs, xs):
        b.storages.extend(stored)   # kept alive while the graph that writes them is
        tensors = [st.tensor for st in stored]
        made.append(_STEPS[name].lower(b, [tensors[0], g, *tensors[1:], hp], ()))
    b.ends.extend(made[:-1])
    return made[-1]


_UPDATES = Op("updates", _lower_updates)


def _updates(hp: AgTensor, parts: list[tuple]) -> AgTensor:
    """One node for the updates of every parameter on a device: one step's plan walks it as one op, over the
    gradients only."""
    grads = tuple(g for _, g, _ in parts)
    spec = tuple((op.name, stored) for op, _, stored in parts)
    node = result(_UPDATES, grads + (hp,), (), spec, differentiable=False)
    node.writes = tuple(st for _, _, stored in parts for st in stored)
    return node


class Optimizer:
    name = "optimizer"

    def __init__(self, params: object, lr: float) -> None:
        self.params = param_list(params, self.name)
        self.lr = _rate(self.name, "lr", lr)
        self.t = 0
        self._state: dict[int, tuple] = {}

    def zero_grad(self) -> None:
        """Forget the accumulated gradients (``.grad`` of every parameter becomes None)."""
        for _, p in self.params:
            p.grad = None

    def step(self, grads: Grads | None = None) -> None:
        """One update of every parameter with a gradient (``grads``: a ``Grads`` mapping; None: each
        parameter's ``.grad``), computed with the loss and its backward pass in one graph."""
        pairs = [(p, g) for p, g in _grads_of(self.params, grads) if g is not None]
        if not pairs:
            return
        self.t += 1
        try:
            self._step(pairs)
        except BaseException:
            self.t -= 1   # the step did not happen
            raise

    def _step(self, pairs: list[tuple[AgTensor, AgTensor]]) -> None:
        hp = self._hparams()
        by_engine: dict[int, list] = {}   # per device: the hyper-parameters (one input, read by every update)
        for p, g in pairs:
            if g.engine is not p.engine:
                raise GgmlValueError(f"{self.name}.step: a gradient on {g.engine.name} for a parameter on "
                                     f"{p.engine.name}")
            if g.shape != p.shape:
                raise GgmlValueError(f"{self.name}.step: a gradient of shape {g.shape} for a parameter of shape "
                                     f"{p.shape}")
            group = by_engine.get(id(p.engine))
            if group is None:
                hp_t = AgTensor(p.engine, hp.shape, "f32")
                hp_t.host = hp
                group = by_engine[id(p.engine)] = [hp_t]
            group.append(self._update(p, g))
        evaluate([_updates(group[0], group[1:]) for group in by_engine.values()])

    def _update(self, p: AgTensor, g: AgTensor) -> tuple[Op, AgTensor, tuple[Storage, ...]]:
        """One parameter's update: its op, its gradient and the stored tensors it updates (the parameter first)."""
        raise NotImplementedError

    def _hparams(self) -> np.ndarray:
        raise NotImplementedError

    def state(self, p: AgTensor, n: int) -> tuple:
        """``p``'s ``n`` zeroed state tensors (moments, velocity), made on first use, and what its update writes
        (``p`` and them)."""
        got = self._state.get(id(p))
        if got is None:
            leaves = tuple(_state_leaf(p) for _ in range(n))
            got = self._state[id(p)] = (*leaves, tuple(t.storage for t in (p, *leaves)))
        return got


class SgdOptimizer(Optimizer):
    """ggmlR's SGD (see ``optimizer_sgd``)."""
    name = "optimizer_sgd"

    def __init__(self, params: object, lr: float, momentum: float) -> None:
        super().__init__(params, lr)
        self.momentum = _rate(self.name, "momentum", momentum, 0.0, 1.0)

    def _hparams(self) -> np.ndarray:
        return np.array([self.lr, 0.0, self.momentum], np.float32)

    def _update(self, p: AgTensor, g: AgTensor) -> tuple[Op, AgTensor, tuple[Storage, ...]]:
        if not self.momentum:
            return _SGD, g, (p.storage,)  # type: ignore[return-value]  # a parameter is stored
        _vel, writes = self.state(p, 1)
        return _SGD, g, writes

    def __repr__(self) -> str:
        return f"<optimizer_sgd lr={self.lr} momentum={self.momentum}, {len(self.params)} parameters, t={self.t}>"


class AdamOptimizer(Optimizer):
    """ggmlR's Adam (see ``optimizer_adam``)."""
    name = "optimizer_adam"

    def __init__(self, params: object, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
        super().__init__(params, lr)
        self.beta1 = _rate(self.name, "beta1", beta1, 0.0, 1.0)
        self.beta2 = _rate(self.name, "beta2", beta2, 0.0, 1.0)
        self.eps = _rate(self.name, "eps", eps)
        self.weight_decay = _rate(self.name, "weight_decay", weight_decay)

    @property
    def momentum(self) -> float:  # what a one-cycle schedule cycles (beta1)
        return self.beta1

    @momentum.setter
    def momentum(self, v: float) -> None:
        self.beta1 = _rate(self.name, "beta1", v, 0.0, 1.0)

    def _hparams(self) -> np.ndarray:
        b1h = 1.0 / (1.0 - self.beta1 ** self.t)
        b2h = 1.0 / (1.0 - self.beta2 ** self.t)
        return np.array([self.lr, self.beta1, self.beta2, self.eps, self.weight_decay, b1h, b2h], np.float32)

    def _update(self, p: AgTensor, g: AgTensor) -> tuple[Op, AgTensor, tuple[Storage, ...]]:
        *_moments, writes = self.state(p, 2)
        return _ADAMW, g, writes

    def __repr__(self) -> str:
        return f"<optimizer_adam lr={self.lr}, {len(self.params)} parameters, t={self.t}>"


def optimizer_sgd(params: object, lr: float = 0.01, momentum: float = 0.0) -> SgdOptimizer:
    """Stochastic gradient descent, ggmlR's rule: ``v = momentum * v + g; p -= lr * v`` (``p -= lr * g``
    without momentum).

    Arguments:
        params: the parameters: a dict (``module.parameters()``), a list, a module or one AgTensor.
        lr: the learning rate (schedulers change ``opt.lr``).
        momentum: in [0, 1); 0: plain SGD.

    Value: an optimizer with ``step(grads=None)``, ``zero_grad()`` and the attributes ``lr``, ``momentum``,
    ``t`` (steps taken), ``params``.

    Example:
        >>> opt = optimizer_sgd(model.parameters(), lr=0.1, momentum=0.9)
        >>> opt.step(); opt.zero_grad()
    """
    return SgdOptimizer(params, lr, momentum)


def optimizer_adam(params: object, lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                   weight_decay: float = 0.0) -> AdamOptimizer:
    """Adam with bias correction (ggml's fused AdamW kernel): ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``,
    ``p -= lr * mhat / (sqrt(vhat) + eps)`` with ``mhat = m / (1 - b1^t)``, ``vhat = v / (1 - b2^t)``; a
    ``weight_decay`` first shrinks ``p`` by ``lr * weight_decay`` (decoupled, AdamW's).

    Arguments:
        params: the parameters: a dict (``module.parameters()``), a list, a module or one AgTensor.
        lr: the learning rate.
        beta1: the first moment's decay, in [0, 1).
        beta2: the second moment's decay, in [0, 1).
        eps: added to the root of the second moment.
        weight_decay: decoupled weight decay (0: plain Adam).

    Value: an optimizer with ``step(grads=None)``, ``zero_grad()`` and the attributes ``lr``, ``beta1``,
    ``beta2``, ``eps``, ``t`` (steps taken), ``params``.

    Example:
        >>> opt = optimizer_adam(model.parameters(), lr=1e-3)
    """
    return AdamOptimizer(params, lr, beta1, beta2, eps, weight_decay)


def _clipped(params: object, grads: Grads | None, bound: float, name: str,
             fn: str) -> tuple[float, list[tuple[AgTensor, AgTensor]]]:
    """A clipping's bound (> 0) and its (parameter, gradient) pairs (at least one)."""
    c = _rate(fn, name, bound)
    if c <= 0:
        raise GgmlValueError(f"{fn}: {name} must be > 0, got {bound!r}")
    pairs = [(p, g) for p, g in _grads_of(param_list(params, fn), grads) if g is not None]
    if not pairs:
        raise GgmlValueError(f"{fn}: none of the parameters has a gradient (call backward first)")
    return c, pairs


def _replace(p: AgTensor, grads: Grads | None, g: AgTensor) -> None:
    """The clipped gradient ``g`` in place of the one clipped: in ``grads`` when given (and in ``p.grad`` when that is
    the same gradient: one backward since zero_grad), else in ``p.grad``."""
    if grads is None:
        p.grad = g
        return
    if p.grad is not None and p.grad is grads[p]:
        p.grad = g
    grads[p] = g


def clip_grad_norm(params: object, grads: Grads | None = None, max_norm: float = 1.0) -> AgTensor:
    """Scale the gradients together so that their global L2 norm is at most ``max_norm``: when the norm exceeds it,
    every gradient is multiplied by ``max_norm / (norm + 1e-6)``.

    The clipping is part of the step's graph (nothing is read back).

    Arguments:
        params: the parameters whose gradients to clip (dict, list, module).
        grads: a ``Grads`` mapping from ``backward``; None: the parameters' ``.grad``.
        max_norm: the largest norm allowed (> 0).

    Value: the global norm before clipping, a lazy 0-d AgTensor.

    Example:
        >>> norm = clip_grad_norm(model.parameters(), max_norm=1.0)
    """
    c, pairs = _clipped(params, grads, max_norm, "max_norm", "clip_grad_norm")
    total = ag_sum(ag_pow(pairs[0][1], 2))
    for _, g in pairs[1:]:
        total = ag_add(total, ag_sum(ag_pow(g, 2)))
    norm = ag_pow(total, 0.5)
    factor = ag_clamp(ag_mul(ag_pow(ag_add(norm, 1e-6), -1), c), hi=1.0)
    for p, g in pairs:
        _replace(p, grads, ag_mul(g, factor))
    return norm


def clip_grad_value(params: object, grads: Grads | None = None, clip_value: float = 1.0) -> AgTensor:
    """Clamp every gradient element to ``[-clip_value, clip_value]``.

    Arguments:
        params: the parameters whose gradients to clip (dict, list, module).
        grads: a ``Grads`` mapping from ``backward``; None: the parameters' ``.grad``.
        clip_value: a positive finite bound.

    Value: the largest finite ``|g|`` before clipping, a lazy 0-d AgTensor.

    Example:
        >>> clip_grad_value(model.parameters(), clip_value=0.5)
    """
    c, pairs = _clipped(params, grads, clip_value, "clip_value", "clip_grad_value")
    largest = None
    for p, g in pairs:
        m = result(_MAXABS, (g,), ())
        largest = m if largest is None else result(_MAX2, (largest, m), ())
        _replace(p, grads, ag_clamp(g, -c, c))
    assert largest is not None
    return largest


def _lower_maxabs(b: Builder, xs: list, attrs: tuple) -> Tensor:
    """The largest finite ``|g|``: the element of ``|g| + (g - g)`` (NaN where g is not finite, which no
    comparison picks) at its argmax."""
    g = xs[0]
    a = ggml_add(b.ctx, ggml_abs(b.ctx, g), ggml_sub(b.ctx, g, g))
    n = int(np.prod(a.shape))
    idx = ggml_argmax(b.ctx, ggml_reshape_2d(b.ctx, a, n, 1))
    return ggml_get_rows(b.ctx, ggml_reshape_2d(b.ctx, a, 1, n), idx)


def _lower_max2(b: Builder, xs: list, attrs: tuple) -> Tensor:
    """``max(a, c) = c + relu(a - c)``."""
    a, c = xs
    return ggml_add(b.ctx, c, ggml_relu(b.ctx, ggml_sub(b.ctx, a, c)))


_MAXABS, _MAX2 = Op("max_abs", _lower_maxabs), Op("max", _lower_max2)


def check_grad_anomaly(params: object, grads: Grads | None = None, action: str = "warn",
                       max_abs: float | None = None) -> pd.DataFrame:
    """A table of each parameter's gradient: NaN and Inf counts, the largest finite ``|g|``, and a status.

    Arguments:
        params: the parameters (dict, list, module).
        grads: a ``Grads`` mapping from ``backward``; None: the parameters' ``.grad``.
        action: "warn" (a warning when a status is not "ok"), "stop" (a ValueError) or "none".
        max_abs: a bound on ``|g|`` above which the status is "large"; None: no bound.

    Value: a pandas DataFrame with the columns ``param, n_nan, n_inf, max_abs, status`` (``ok``, ``nan``, ``inf``,
    ``nan+inf``, ``large`` or ``missing``).

    Example:
        >>> check_grad_anomaly(model.parameters(), action="stop")
    """
    fn = "check_grad_anomaly"
    if action not in ("warn", "stop", "none"):
        raise GgmlValueError(f"{fn}: action must be 'warn', 'stop' or 'none', got {action!r}")
    bound = None if max_abs is None else _rate(fn, "max_abs", max_abs)
    plist = param_list(params, fn)
    rows = []
    for name, p in plist:
        g = p.grad if grads is None else (grads[p] if p in grads else None)
        if g is None:
            rows.append((name, 0, 0, float("nan"), "missing"))
            continue
        a = g.numpy()
        n_nan, n_inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
        finite = np.abs(a[np.isfinite(a)])
        largest = float(finite.max()) if finite.size else float("nan")
        status = "nan+inf" if n_nan and n_inf else "nan" if n_nan else "inf" if n_inf else \
            "large" if bound is not None and largest > bound else "ok"
        rows.append((name, n_nan, n_inf, largest, status))
    table = pd.DataFrame(rows, columns=["param", "n_nan", "n_inf", "max_abs", "status"])
    bad = table[table.status != "ok"]
    if len(bad) and action != "none":
        text = ", ".join(f"{r.param}: {r.status}" for r in bad.itertuples())
        if action == "stop":
            raise GgmlValueError(f"{fn}: gradient anomalies: {text}")
        warnings.warn(f"gradient anomalies: {text}", GgmlpyWarning, stacklevel=3)
    return table
