"""ggml.h's objects: contexts, tensors and graphs, and pointer-level facts about them (no backends)."""
