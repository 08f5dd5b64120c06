"""How much work a graph is: the estimate the thread policy reads (``StepWork``), for a forward pass and
for a training step with its optimizer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


from .._ffi import ffi, lib
from ..graph.graph import walk_graph
from ..graph.objects import Tensor


def count_forward(outputs: Sequence[Tensor], with_leafs: bool = False) -> Any:
    """Forward nodes reachable from the outputs, and the trainable leafs among them (and the other leafs)."""
    params, n_nodes, n_leafs = [], 0, 0
    flag = int(lib.GGML_TENSOR_FLAG_PARAM)
    for t in walk_graph(o.ptr for o in outputs):
        if t.flags & flag:
            params.append(t)
        if t.op != lib.GGML_OP_NONE or t.flags & flag:
            n_nodes += 1
        else:
            n_leafs += 1
    return (n_nodes, params, n_leafs) if with_leafs else (n_nodes, params)


_MUL_MAT = next(i for i in range(int(lib.GGML_OP_COUNT)) if ffi.string(lib.ggml_op_name(i)) == b"MUL_MAT")


def forward_flops(outputs: Sequence[Tensor]) -> float:
    """A rough count of the floating-point operations of one forward pass to ``outputs``: 2 per
    multiply-add of a matrix product, one per result element of any other op."""
    return forward_work(outputs).flops


def _blas_takes(t: Any) -> bool:
    """Whether ggml's BLAS backend takes this MUL_MAT (F32, at least 32^3 multiply-adds: patch 0010)."""
    return int(t.ne[0]) * int(t.ne[1]) * int(t.src[1].ne[0]) >= 32 ** 3 \
        and t.src[0].type == lib.GGML_TYPE_F32 and t.src[1].type == lib.GGML_TYPE_F32


# ggml-opt's per-parameter work, in element-op units of ``StepWork.pool_elements``: AdamW reads a gradient,
# two moments and the weight and writes three of them (memory-bound, about four element ops' time);
# accumulating a gradient across a logical batch is one addition.
OPTIMIZER_ELEMENTS_PER_PARAM = 4.0


@dataclass(frozen=True)
class StepWork:
    """What one step computes, for splitting the CPU threads between ggml's pool and OpenBLAS.

    ``flops``: all of it, as ``forward_flops`` counts. ``blas_flops``: the matrix products ggml's BLAS
    backend takes (2 per multiply-add). ``pool_elements``: what ggml's CPU pool is left with, one per
    result element of its ops (its own small products at 2 per multiply-add), in training the optimizer's
    pass over the parameters included."""
    flops: float
    blas_flops: float
    pool_elements: float


def forward_work(outputs: Sequence[Tensor]) -> StepWork:
    """The work of one forward pass to ``outputs`` (inference)."""
    flops = blas = 0.0
    for t in walk_graph(o.ptr for o in outputs):
        if t.op == lib.GGML_OP_NONE:
            continue
        n = float(lib.ggml_nelements(t))
        if t.op == _MUL_MAT:
            product = 2.0 * n * int(t.src[0].ne[0])
            flops += product
            blas += product if _blas_takes(t) else 0.0
        else:
            flops += n
    return StepWork(flops, blas, flops - blas)


def training_step_work(outputs: Sequence[Tensor], opt_period: int = 1) -> StepWork:
    """The work of one training step (forward and backward: 3x the forward pass) of ``outputs``, with the
    optimizer stepping every ``opt_period`` steps."""
    forward = forward_work(outputs)
    n_params = sum(float(lib.ggml_nelements(p)) for p in count_forward(outputs)[1])
    per_param = OPTIMIZER_ELEMENTS_PER_PARAM / max(1, opt_period) + (1.0 if opt_period > 1 else 0.0)
    return StepWork(3.0 * forward.flops, 3.0 * forward.blas_flops,
                    3.0 * forward.pool_elements + n_params * per_param)
