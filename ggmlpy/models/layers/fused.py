"""The fused CPU ops a layer may build instead of its portable form, and which device computes which.

The LSTM and GRU steps (patches/0031), the whole LSTM and GRU recurrences (0035, 0037) and the tiled convolution
(0036) are ggmlpy's own ops, computed by the CPU backend, and the whole recurrences by Vulkan too (0049); fused
attention is ggml's FLASH_ATTN_EXT with the backward pass of 0056 (FLASH_ATTN_BACK). A layer
asks ``device_computes(device, op)`` and builds the fused op where the answer is yes; elsewhere (CUDA) it builds the
portable form from ops every backend has, so a GPU model's step stays on the device. ggml answers once per device
and op (its ``supports_op`` of a small instance of the op), not a hand-kept list.
"""
from __future__ import annotations

from collections.abc import Callable

from ..._ffi import lib
from ...backend.device import Device, ggml_backend_dev_supports_op
from ...core.types import GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, type_name
from ...graph.context import ggml_init
from ...graph.objects import Context, Tensor
from ...graph.tensor import ggml_new_tensor, new_quantized_tensor
from ...ops.attention import flash_attn_ext_back, ggml_flash_attn_ext
from ...ops.conv import ggml_conv_2d_tiled
from ...ops.elementwise import ggml_cont
from ...ops.layout import ggml_cast, ggml_get_rows, ggml_transpose
from ...ops.linalg import ggml_mul_mat, ggml_out_prod
from ...ops.recurrent import ggml_gru_cell, ggml_gru_seq, ggml_lstm_cell, ggml_lstm_seq


def _f32(ctx: Context, *shape: int) -> Tensor:
    return ggml_new_tensor(ctx, GGML_TYPE_F32, len(shape), shape)


def _sequence(op: str, units: int, batch: int, steps: int) -> Callable[[Context], Tensor]:
    """An instance of the whole-recurrence op ``op`` ("lstm_seq" or "gru_seq") of this size."""
    gates = 4 if op == "lstm_seq" else 3
    fn = ggml_lstm_seq if op == "lstm_seq" else ggml_gru_seq
    return lambda ctx: fn(ctx, _f32(ctx, gates * units, batch, steps), _f32(ctx, units, gates * units))


# a small instance of each op, for ggml's supports_op
PROBES: dict[str, Callable[[Context], Tensor]] = {
    "lstm_cell": lambda ctx: ggml_lstm_cell(ctx, _f32(ctx, 8, 2)),
    "gru_cell": lambda ctx: ggml_gru_cell(ctx, _f32(ctx, 6, 2), _f32(ctx, 6, 2)),
    "lstm_seq": _sequence("lstm_seq", 2, 2, 3),
    "gru_seq": _sequence("gru_seq", 2, 2, 3),
    "conv_2d_tiled": lambda ctx: ggml_conv_2d_tiled(ctx, _f32(ctx, 3, 3, 2, 4), _f32(ctx, 5, 5, 2, 1)),
}
_ANSWERS: dict[tuple[str, str], bool] = {}  # (device name, op or op:size) -> whether the device computes it


def _answer(device: Device, key: str, probe: Callable[[Context], Tensor]) -> bool:
    """ggml's supports_op for ``probe``'s tensor on ``device``, asked once per device and ``key``."""
    if (device.name, key) not in _ANSWERS:
        ctx = ggml_init(mem_size=16384, no_alloc=True)
        try:
            _ANSWERS[(device.name, key)] = ggml_backend_dev_supports_op(device, probe(ctx))
        finally:
            ctx.free()
    return _ANSWERS[(device.name, key)]


def device_computes_sequence(device: Device, op: str, units: int, batch: int, steps: int) -> bool:
    """Whether ``device`` computes the whole-recurrence op ``op`` ("lstm_seq" or "gru_seq") at this size: a kernel
    may take only some (Vulkan's up to 512 units; on lavapipe, sums short enough for its loop limit)."""
    return device_computes(device, op) and _answer(device, f"{op}:{units}x{batch}x{steps}",
                                                   _sequence(op, units, batch, steps))


def device_computes_attention(device: Device, key_dim: int, queries: int, keys: int, heads: int, batch: int,
                              masked: bool, training: bool) -> bool:
    """Whether ``device`` computes fused attention of this size: ggml's FLASH_ATTN_EXT with F32 keys and values
    (and an F16 mask when ``masked``) and, for a training graph, its backward op FLASH_ATTN_BACK (patches/0056).
    A kernel may take only some head sizes, and on lavapipe only sums short enough for its loop limit."""
    def operands(ctx: Context) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        mask = ggml_new_tensor(ctx, GGML_TYPE_F16, 2, (keys, queries)) if masked else None
        return (_f32(ctx, key_dim, queries, heads, batch), _f32(ctx, key_dim, keys, heads, batch),
                _f32(ctx, key_dim, keys, heads, batch), mask)

    def forward(ctx: Context) -> Tensor:
        q, k, v, mask = operands(ctx)
        return ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0)

    def backward(ctx: Context) -> Tensor:   # the node ggml_build_backward_expand makes for the forward
        q, k, v, mask = operands(ctx)
        d = _f32(ctx, key_dim, heads, queries, batch)
        return flash_attn_ext_back(ctx, q, k, v, mask, d, 1.0)
    size = f"{key_dim}x{queries}x{keys}x{heads}x{batch}{'m' if masked else ''}"
    return _answer(device, f"flash_attn_ext:{size}", forward) and \
        (not training or _answer(device, f"flash_attn_back:{size}", backward))


def device_computes_half_products(device: Device, type: int) -> bool:
    """Whether ``device`` computes mixed precision's products in ``type`` (GGML_TYPE_BF16 or _F16): the cast of an
    F32 weight, its product with F32 data, and the backward pass's product of the transposed half weight
    (patches/0060). Asked of small instances: ggml's kernels take these at any size."""
    def cast(ctx: Context) -> Tensor:
        return ggml_cast(ctx, _f32(ctx, 8, 4), type)

    def product(ctx: Context) -> Tensor:
        return ggml_mul_mat(ctx, ggml_new_tensor(ctx, type, 2, (8, 4)), _f32(ctx, 8, 3))

    def transposed(ctx: Context) -> Tensor:
        return ggml_cont(ctx, ggml_transpose(ctx, ggml_new_tensor(ctx, type, 2, (8, 4))))
    key = type_name(type)
    return all(_answer(device, f"{step}:{key}", probe)
               for step, probe in (("cast", cast), ("product", product), ("transposed", transposed)))


def device_computes_quantized(device: Device, type: int, how: str) -> bool:
    """Whether ``device`` reads a weight of quantized ``type`` as a layer does (``Weight(quantizable=...)``):
    "product", the first operand of a matrix product with F32 data; "rows", an embedding's ``ggml_get_rows``; or
    "out_prod", the backward pass of such a product into its data (``ggml_out_prod`` of the weight)."""
    block = int(lib.ggml_blck_size(type))

    def probe(ctx: Context) -> Tensor:
        w = new_quantized_tensor(ctx, type, (block, 4))
        if how == "rows":
            return ggml_get_rows(ctx, w, ggml_new_tensor(ctx, GGML_TYPE_I32, 1, (2,)))
        if how == "out_prod":
            return ggml_out_prod(ctx, w, ggml_transpose(ctx, _f32(ctx, 4, 3)))
        return ggml_mul_mat(ctx, w, _f32(ctx, block, 3))
    return _answer(device, f"quantized_{how}:{type_name(type)}", probe)


def device_computes(device: Device, op: str) -> bool:
    """Whether ``device`` (a ggml device) computes the fused op ``op``, one of ``PROBES``."""
    return _answer(device, op, PROBES[op])
