"""Training on top of ggml_opt_alloc / ggml_opt_eval: the loop, its data sources, callbacks and reports."""
from . import callbacks, fit, plot


__all__ = ["callbacks", "fit", "plot"]
