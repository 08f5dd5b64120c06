"""ggmlR's learning-rate schedulers for the ``ag_*`` optimizers. Each ``step()`` sets the optimizer's ``lr`` (an
input of the step's graph: nothing is rebuilt) and returns it; ``get_lr()`` reads it.
"""
from __future__ import annotations

import math

from ..core.args import is_int, is_real
from ..errors import GgmlTypeError, GgmlValueError
from .optim import Optimizer


__all__ = ["lr_scheduler_step", "lr_scheduler_cosine", "lr_scheduler_cyclic", "lr_scheduler_onecycle",
           "lr_scheduler_warmup_cosine"]


def _opt(opt: object, fn: str) -> Optimizer:
    if not isinstance(opt, Optimizer):
        raise GgmlTypeError(f"{fn}: opt must be an optimizer (optimizer_sgd, optimizer_adam), got {type(opt).__name__}")
    return opt


def _count(fn: str, name: str, v: object, low: int = 1) -> int:
    if not is_int(v) or int(v) < low:
        raise GgmlValueError(f"{fn}: {name} must be an int >= {low}, got {v!r}")
    return int(v)


def _num(fn: str, name: str, v: object, low: float = 0.0) -> float:
    if not is_real(v) or isinstance(v, bool) or not math.isfinite(float(v)) or float(v) < low:
        raise GgmlValueError(f"{fn}: {name} must be a finite number >= {low}, got {v!r}")
    return float(v)


class Scheduler:
    """A schedule of an optimizer's learning rate: ``step()`` moves it on and returns the new rate."""

    def __init__(self, opt: Optimizer) -> None:
        self.optimizer = opt
        self.k = 0   # the steps taken

    def get_lr(self) -> float:
        """The optimizer's current learning rate."""
        return self.optimizer.lr

    def step(self) -> float:
        """The next step of the schedule: sets the optimizer's ``lr`` and returns it."""
        self.k += 1
        self.optimizer.lr = float(self._lr(self.k))
        return self.optimizer.lr

    def _lr(self, k: int) -> float:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: step {self.k}, lr {self.get_lr():.6g}>"


def _cos(a: float, b: float, p: float) -> float:
    """From a (p = 0) to b (p = 1) along half a cosine."""
    return b + (a - b) * (1 + math.cos(math.pi * p)) / 2


class StepSchedule(Scheduler):
    def __init__(self, opt: Optimizer, step_size: int, gamma: float) -> None:
        super().__init__(opt)
        self.step_size, self.gamma = step_size, gamma

    def _lr(self, k: int) -> float:
        return self.optimizer.lr * self.gamma if k % self.step_size == 0 else self.optimizer.lr


def lr_scheduler_step(opt: object, step_size: int, gamma: float = 0.1) -> Scheduler:
    """Multiply the learning rate by ``gamma`` every ``step_size`` steps.

    Arguments:
        opt: an optimizer (optimizer_sgd, optimizer_adam).
        step_size: how many steps between decays (an int >= 1).
        gamma: the factor (>= 0).

    Value: a scheduler with ``step()`` (sets and returns the new lr) and ``get_lr()``.

    Example:
        >>> sched = lr_scheduler_step(opt, step_size=10, gamma=0.5)
        >>> for epoch in range(30): train(); sched.step()
    """
    fn = "lr_scheduler_step"
    return StepSchedule(_opt(opt, fn), _count(fn, "step_size", step_size), _num(fn, "gamma", gamma))


class CosineSchedule(Scheduler):
    def __init__(self, opt: Optimizer, t_max: int, lr_min: float, restart: bool, t_mult: float) -> None:
        super().__init__(opt)
        self.lr_max, self.lr_min, self.restart, self.t_mult = opt.lr, lr_min, restart, t_mult
        self.period, self.start = t_max, 0

    def _lr(self, k: int) -> float:
        t = k - 1 - self.start
        if self.restart:
            while t >= self.period:   # a new cycle, longer by T_mult
                self.start += self.period
                t -= self.period
                self.period = max(1, round(self.period * self.t_mult))
        else:
            t = min(t, self.period - 1)
        return _cos(self.lr_max, self.lr_min, t / self.period)


def lr_scheduler_cosine(opt: object, T_max: int, lr_min: float = 0.0, restart: bool = False,  # noqa: N803 - R's
                        T_mult: float = 1) -> Scheduler:  # noqa: N803 - ggmlR's names
    """Cosine annealing from the optimizer's learning rate at creation to ``lr_min`` over ``T_max`` steps (with
    ``restart``, warm restarts: each cycle ``T_mult`` times the last).

    The k-th step sets ``lr = lr_min + (lr_max - lr_min) (1 + cos(pi t / T)) / 2`` with ``t = min(k-1, T-1)`` (the
    position in the cycle, with restarts).

    Arguments:
        opt: an optimizer.
        T_max: the steps of one cycle (an int >= 1).
        lr_min: the lowest rate.
        restart: start a new cycle after each one (SGDR) instead of staying at lr_min.
        T_mult: how much longer each new cycle is (>= 1).

    Value: a scheduler with ``step()`` and ``get_lr()``.

    Example:
        >>> sched = lr_scheduler_cosine(opt, T_max=100, lr_min=1e-5)
    """
    fn = "lr_scheduler_cosine"
    o = _opt(opt, fn)
    return CosineSchedule(o, _count(fn, "T_max", T_max), _num(fn, "lr_min", lr_min), bool(restart),
                          max(1.0, _num(fn, "T_mult", T_mult, 1.0)))


class CyclicSchedule(Scheduler):
    def __init__(self, opt: Optimizer, base: float, top: float, up: int, down: int, mode: str, gamma: float) -> None:
        super().__init__(opt)
        self.base, self.top, self.up, self.down, self.mode, self.gamma = base, top, up, down, mode, gamma
        opt.lr = base

    def _lr(self, s: int) -> float:
        c = s // (self.up + self.down)
        pos = s - c * (self.up + self.down)
        frac = pos / self.up if pos <= self.up else 1 - (pos - self.up) / self.down
        amp = self.top - self.base
        if self.mode == "triangular2":
            amp /= 2 ** c
        elif self.mode == "exp_range":
            amp *= self.gamma ** s
        return self.base + amp * frac


def lr_scheduler_cyclic(opt: object, base_lr: float, max_lr: float, step_size_up: int = 2000,
                        step_size_down: int | None = None, mode: str = "triangular", gamma: float = 1.0) -> Scheduler:
    """A learning rate cycling between ``base_lr`` and ``max_lr`` (Smith's cyclical rates); it starts at base_lr.

    Step s: cycle ``c = s // (up + down)``, position ``pos = s - c (up + down)``, fraction ``pos/up`` rising, then
    ``1 - (pos - up)/down`` falling; ``lr = base_lr + amplitude * fraction``, the amplitude ``max_lr - base_lr``
    halved each cycle ("triangular2") or times ``gamma**s`` ("exp_range").

    Arguments:
        opt: an optimizer.
        base_lr: the lowest rate (>= 0).
        max_lr: the highest rate (>= base_lr).
        step_size_up: steps rising (an int >= 1).
        step_size_down: steps falling; None: step_size_up.
        mode: "triangular", "triangular2" or "exp_range".
        gamma: the decay per step of "exp_range".

    Value: a scheduler with ``step()`` and ``get_lr()``.

    Example:
        >>> sched = lr_scheduler_cyclic(opt, base_lr=1e-4, max_lr=1e-2, step_size_up=500)
    """
    fn = "lr_scheduler_cyclic"
    o = _opt(opt, fn)
    base, top = _num(fn, "base_lr", base_lr), _num(fn, "max_lr", max_lr)
    if top < base:
        raise GgmlValueError(f"{fn}: max_lr ({max_lr}) is below base_lr ({base_lr})")
    if mode not in ("triangular", "triangular2", "exp_range"):
        raise GgmlValueError(f"{fn}: mode must be 'triangular', 'triangular2' or 'exp_range', got {mode!r}")
    up = _count(fn, "step_size_up", step_size_up)
    down = up if step_size_down is None else _count(fn, "step_size_down", step_size_down)
    return CyclicSchedule(o, base, top, up, down, mode, _num(fn, "gamma", gamma))


class OneCycleSchedule(Scheduler):
    def __init__(self, opt: Optimizer, top: float, total: int, pct: float, div: float, final_div: float,
                 linear: bool, cycle_momentum: bool, base_m: float, max_m: float) -> None:
        super().__init__(opt)
        self.top, self.total, self.linear = top, total, linear
        self.start, self.end = top / div, top / final_div
        self.up = max(1, round(pct * total))
        self.cycle_momentum, self.base_m, self.max_m = cycle_momentum, base_m, max_m
        opt.lr = self.start
        if cycle_momentum:
            opt.momentum = max_m  # type: ignore[attr-defined]  # SGD's momentum, Adam's beta1

    def _move(self, a: float, b: float, p: float) -> float:
        return a + (b - a) * p if self.linear else _cos(a, b, p)

    def _lr(self, k: int) -> float:
        s = min(k, self.total)
        if s <= self.up:
            p = s / self.up
            lr, m = self._move(self.start, self.top, p), self._move(self.max_m, self.base_m, p)
        else:
            p = min(1.0, (s - self.up) / max(1, self.total - self.up))
            lr, m = self._move(self.top, self.end, p), self._move(self.base_m, self.max_m, p)
        if self.cycle_momentum:
            self.optimizer.momentum = m  # type: ignore[attr-defined]
        return lr


def lr_scheduler_onecycle(opt: object, max_lr: float, total_steps: int, pct_start: float = 0.3, div_factor: float = 25,
                          final_div_factor: float = 1e4, anneal_strategy: str = "cos", cycle_momentum: bool = True,
                          base_momentum: float = 0.85, max_momentum: float = 0.95) -> Scheduler:
    """The one-cycle policy: the rate rises from ``max_lr / div_factor`` to ``max_lr`` over the first
    ``pct_start`` of ``total_steps``, then falls to ``max_lr / final_div_factor`` (ggmlR's end, not PyTorch's);
    the momentum (SGD's, Adam's beta1) moves the other way between ``max_momentum`` and ``base_momentum``.

    Arguments:
        opt: an optimizer.
        max_lr: the peak rate.
        total_steps: the steps of the whole cycle (an int >= 1); later steps stay at the end.
        pct_start: the rising share of the steps, in [0, 1].
        div_factor: the start is ``max_lr / div_factor``.
        final_div_factor: the end is ``max_lr / final_div_factor``.
        anneal_strategy: "cos" or "linear".
        cycle_momentum: move the momentum too.
        base_momentum: the momentum at the peak rate.
        max_momentum: the momentum at the start and the end.

    Value: a scheduler with ``step()`` and ``get_lr()``.

    Example:
        >>> sched = lr_scheduler_onecycle(opt, max_lr=0.01, total_steps=1000)
    """
    fn = "lr_scheduler_onecycle"
    o = _opt(opt, fn)
    if anneal_strategy not in ("cos", "linear"):
        raise GgmlValueError(f"{fn}: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
    pct = _num(fn, "pct_start", pct_start)
    if pct > 1:
        raise GgmlValueError(f"{fn}: pct_start must be in [0, 1], got {pct_start!r}")
    div, final = _num(fn, "div_factor", div_factor), _num(fn, "final_div_factor", final_div_factor)
    if div <= 0 or final <= 0:
        raise GgmlValueError(f"{fn}: div_factor and final_div_factor must be > 0")
    moments = _num(fn, "base_momentum", base_momentum), _num(fn, "max_momentum", max_momentum)
    if cycle_momentum and max(moments) >= 1:
        raise GgmlValueError(f"{fn}: base_momentum and max_momentum must be below 1 (a momentum or Adam's beta1 of 1 "
                             f"never forgets), got {moments}")
    return OneCycleSchedule(o, _num(fn, "max_lr", max_lr), _count(fn, "total_steps", total_steps), pct, div, final,
                            anneal_strategy == "linear", bool(cycle_momentum), *moments)


class WarmupCosineSchedule(Scheduler):
    def __init__(self, opt: Optimizer, warmup: int, total: int, lr_min: float, start: float) -> None:
        super().__init__(opt)
        self.lr0, self.warmup, self.total, self.lr_min, self.start = opt.lr, warmup, total, lr_min, start
        if warmup:
            opt.lr = start

    def _lr(self, k: int) -> float:
        if k <= self.warmup:
            return self.start + (self.lr0 - self.start) * k / self.warmup
        return _cos(self.lr0, self.lr_min, min(1.0, (k - self.warmup) / (self.total - self.warmup)))


def lr_scheduler_warmup_cosine(opt: object, warmup_steps: int, total_steps: int, lr_min: float = 0.0,
                               warmup_start_lr: float = 0.0) -> Scheduler:
    """A linear warm-up from ``warmup_start_lr`` to the optimizer's rate at creation over ``warmup_steps``, then a
    cosine decay to ``lr_min`` at ``total_steps``.

    Arguments:
        opt: an optimizer.
        warmup_steps: steps of warm-up (an int >= 0).
        total_steps: the last step of the decay (more than warmup_steps, else ValueError).
        lr_min: the rate at the end.
        warmup_start_lr: the rate the warm-up starts from.

    Value: a scheduler with ``step()`` and ``get_lr()``.

    Example:
        >>> sched = lr_scheduler_warmup_cosine(opt, warmup_steps=100, total_steps=1000)
    """
    fn = "lr_scheduler_warmup_cosine"
    o = _opt(opt, fn)
    warmup = _count(fn, "warmup_steps", warmup_steps, 0)
    total = _count(fn, "total_steps", total_steps)
    if total <= warmup:
        raise GgmlValueError(f"{fn}: total_steps ({total}) must be more than warmup_steps ({warmup})")
    return WarmupCosineSchedule(o, warmup, total, _num(fn, "lr_min", lr_min), _num(fn, "warmup_start_lr",
                                                                                   warmup_start_lr))
