"""Dynamic loss scaling for F16 training (``ggml_compile(precision="f16")``), with PyTorch ``GradScaler``'s rule.

F16 holds magnitudes down to 6e-8 (6e-5 at full precision): gradients converted to F16 inside a half product's
backward pass would flush to zero. So the backward pass starts from ``scale`` instead of 1 (the loss's gradient
seed: the loss itself, and what the fit reports, is unchanged), every gradient is ``scale`` times too large while
it flows back, and the optimizer divides the accumulated gradients by ``scale`` before it steps. A step whose
gradients are not all finite (the scale made one overflow) is skipped, its gradients dropped and the scale halved;
after ``growth_interval`` good steps in a row the scale doubles. The optimizer (``GraphOptimizer``) applies it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DynamicLossScale:
    """The scale and its schedule: ``scale`` now; ``growth_factor``, ``backoff_factor`` and ``growth_interval``
    as PyTorch's ``GradScaler`` (its defaults); ``good_steps`` since the last change; ``skipped`` steps in all."""
    scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    good_steps: int = 0
    skipped: int = 0

    # F32's range bounds the scale: the seed and its reciprocal stay normal numbers
    MIN_SCALE = 2.0 ** -24
    MAX_SCALE = 2.0 ** 100

    def update(self, finite: bool) -> bool:
        """Record a step: its gradients were all ``finite`` (the step was taken) or not (skipped). Returns
        whether the scale changed."""
        if not finite:
            self.skipped += 1
            self.good_steps = 0
            new = max(self.scale * self.backoff_factor, self.MIN_SCALE)
        else:
            self.good_steps += 1
            if self.good_steps < self.growth_interval:
                return False
            self.good_steps = 0
            new = min(self.scale * self.growth_factor, self.MAX_SCALE)
        changed = new != self.scale
        self.scale = new
        return changed
