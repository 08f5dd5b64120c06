"""Library and tensor facts: ggml's version, timers, type sizes, layout predicates."""
from __future__ import annotations
