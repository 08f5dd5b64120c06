"""GGUF files: contexts, metadata, tensors, ggmlR's reader and weight files."""
