"""GGUF files read the way ggmlR reads them: gguf_load, gguf_metadata, gguf_tensor_names/info/data."""
from __future__ import annotations
