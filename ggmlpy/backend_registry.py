"""ggml's backend registry, device properties and buffer queries."""
from __future__ import annotations
