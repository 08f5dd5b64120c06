"""Ops of transformer models: rope, timestep embeddings, flash attention (forward only), group/L2 norms, relative positions, windows, expert products and ggml's explicit backward ops."""
from __future__ import annotations
