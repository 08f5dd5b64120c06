"""In-place variants of ggml's ops: the result is a view of the first operand."""
from __future__ import annotations
