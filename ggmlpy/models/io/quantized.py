"""Quantized model files (``ggml_save_model(model, path, quantize=...)``): which weights of a model take which
quantized type, and their quantized copies as host tensors the GGUF writer stores with that type.

A weight is quantized when it is a matrix (or more) whose rows (ggml's ne[0]) are a whole number of the type's
blocks; vectors (biases, normalisation scales and shifts, batch-norm statistics) and weights whose rows do not fit
(a 3x3 convolution kernel's rows of 3) stay F32.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..._ffi import ffi, lib
from ...core.quants import quantize_rows, type_by_name
from ...core.types import type_name
from ...errors import GgmlValueError
from ...graph.context import ggml_init, ggml_tensor_overhead
from ...graph.objects import Context, Tensor
from ...graph.tensor import ggml_set_name


def quantization_plan(names: list[str], shapes: Mapping[str, tuple[int, ...]], quantize: object,
                      fn: str) -> dict[str, int]:
    """name -> ggml type of each weight to quantize. ``quantize``: a type name for every weight that fits it, or a
    dict by layer name or weight name (``{"dense_1": "q4_0", "dense_2.weight": "q8_0"}``; a weight's own entry
    wins over its layer's); names of neither are a ValueError."""
    if isinstance(quantize, str):
        chosen = {n: type_by_name(quantize, fn) for n in names}
    elif isinstance(quantize, Mapping):
        layers = {n.rsplit(".", 1)[0] for n in names}
        unknown = [k for k in quantize if k not in names and k not in layers]
        if unknown:
            raise GgmlValueError(f"{fn}: quantize names {unknown}, which are neither a layer nor a weight of the "
                                 f"model (weights: {names[:6]}{'...' if len(names) > 6 else ''})")
        chosen = {}
        for n in names:
            key = n if n in quantize else n.rsplit(".", 1)[0]
            if key in quantize and quantize[key] is not None:
                chosen[n] = type_by_name(quantize[key], fn)
    else:
        raise GgmlValueError(f"{fn}: quantize must be None, a type name such as 'q8_0', or a dict by layer or weight "
                             f"name, got {quantize!r}")
    out = {}
    for n, t in chosen.items():
        ne = shapes[n]
        if len([d for d in ne if d > 1]) >= 2 and ne[0] % int(lib.ggml_blck_size(t)) == 0:
            out[n] = t
    return out


def quantized_tensors(values: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]],
                      plan: Mapping[str, int], fn: str) -> tuple[Context | None, dict[str, Tensor]]:
    """Host tensors of the planned types holding the quantized weights (ggml's quantizer), in one context the
    caller frees after writing."""
    if not plan:
        return None, {}
    size = sum(int(lib.ggml_row_size(t, shapes[n][0])) * int(np.prod(shapes[n][1:])) + 64 for n, t in plan.items())
    ctx = ggml_init(mem_size=size + len(plan) * ggml_tensor_overhead() + 1024, no_alloc=False)
    out = {}
    try:
        for n, t in plan.items():
            ne = shapes[n]
            rows = np.asarray(values[n], np.float32).reshape(-1, ne[0])
            raw = quantize_rows(t, rows, fn)
            # ggml_new_tensor refuses quantized types (few ops take them); a tensor only to be written to a file
            new = (lib.ggml_new_tensor_1d, lib.ggml_new_tensor_2d, lib.ggml_new_tensor_3d, lib.ggml_new_tensor_4d)
            tensor = ggml_set_name(Tensor(new[len(ne) - 1](ctx.ptr, t, *ne), ctx), n)
            if int(lib.ggml_nbytes(tensor.ptr)) != len(raw):
                raise GgmlValueError(f"{fn}: {n} as {type_name(t)} takes {lib.ggml_nbytes(tensor.ptr)} bytes, the "
                                     f"quantizer wrote {len(raw)}")
            ffi.memmove(tensor.ptr.data, raw, len(raw))
            out[n] = tensor
    except BaseException:
        ctx.free()
        raise
    return ctx, out
