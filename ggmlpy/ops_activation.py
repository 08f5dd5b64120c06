"""Activations, rounding, ggml's add1 and the GLU family (ggmlR parity)."""
from __future__ import annotations
