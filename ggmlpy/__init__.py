"""ggmlpy: train models on ggml's backends (CPU, Vulkan, CUDA, RPC) from Python.

Every function is importable from here under its ggmlR name, with ggml's argument
order (context first, then operands, then scalars). The code lives in modules by
concern; this file only re-exports their public ``ggml_*`` / ``GGML_*`` names.
"""
from __future__ import annotations

from . import alloc, backend, backend_async, backend_registry, context, cpu_features, data, dataset, gguf, \
    gguf_reader, info, losses, ops, ops_activation, ops_conv, ops_inplace, ops_sort, ops_transformer, opt, opt_fit, \
    opt_result, opt_state, rpc, sched, weights
from .training import callbacks as _callbacks, fit as _fit, plot as _plot
from . import models
from ._ffi import BUILD_INFO
from ._guard import guard as _guard
from inspect import isfunction as _isfunction
from .errors import (BackendUnavailableError, GgmlInUseError, GgmlpyError, GgmlpyWarning, GgmlStateError,
                     GgmlTypeError, GgmlValueError, GgufFileError, GgufFileNotFoundError, GgufKeyError)

__version__ = "0.1.0"
__docformat__ = "google"  # for pdoc (docs/README.md): "Arguments:" sections render as lists, examples as code
GGML_VERSION = BUILD_INFO.get("ggml_version", "unknown")

# the model layer first: its ggml_conv_2d/ggml_conv_1d also accept the ops' (ctx, ...) call
_MODULES = [*models.MODULES, alloc, backend, backend_async, backend_registry, context, cpu_features, data, dataset, gguf,
            gguf_reader, info, losses, ops, ops_activation, ops_conv, ops_inplace, ops_sort, ops_transformer, opt,
            opt_fit, opt_result, opt_state, rpc, sched, weights, _callbacks, _fit, _plot]
__all__ = ["GgmlpyError", "GgmlpyWarning", "GgmlStateError", "GgmlInUseError", "GgmlTypeError", "GgmlValueError",
           "BackendUnavailableError", "GgufFileError", "GgufFileNotFoundError", "GgufKeyError", "GGML_VERSION"]
for _module in _MODULES:
    for _name in dir(_module):
        if _name.startswith(("ggml_", "GGML_", "gguf_")) and not _name.startswith("ggml_logger") \
                and _name not in globals():  # a name one module imports from another is exported once
            _obj = getattr(_module, _name)
            # a Python error from inside ggmlpy leaves a public function as a ggmlpy error (_guard.py)
            globals()[_name] = _guard(_obj) if _isfunction(_obj) else _obj
            __all__.append(_name)
del _module, _name, _obj
