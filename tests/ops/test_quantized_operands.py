"""Quantized first operands of ggml_mul_mat and ggml_out_prod (a quantized model's frozen weights, forward and
backward), on ggml's CPU backend, against numpy float64 of the operand as ggml's decoder gives it.

The quantized operand is made in the graph (``ggml_cpy`` of F32 values into a q8_0 / q4_0 tensor: ggml's
quantizer); the reference decodes ggml's quantization of the same values (``quantize_*`` then ``dequantize_row_*``,
the family's functions). ``OUT_PROD`` decodes the weight row by row and multiplies in F32: within 1e-5 of the
reference (F32 sums of 64 terms). ``MUL_MAT`` rounds its F32 operand to 8 bits per block of 32 first: within the
bound that rounding allows (tests/models/io/test_quantized_inference.py holds the CPU to its exact arithmetic).
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.graph.tensor import new_quantized_tensor
from tests.helpers.compute import compute, nd4


KINDS = {"q8_0": (G.GGML_TYPE_Q8_0, G.quantize_q8_0, G.dequantize_row_q8_0),
         "q4_0": (G.GGML_TYPE_Q4_0, G.quantize_q4_0, G.dequantize_row_q4_0)}


def _decoded(a: np.ndarray, kind: str) -> np.ndarray:
    _, quantize, decode = KINDS[kind]
    return decode(quantize(a, a.shape[0], a.shape[1]), a.size).reshape(a.shape).astype(np.float64)


@pytest.mark.parametrize("kind", list(KINDS))
def test_out_prod_of_a_quantized_weight_decodes_it(kind):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 64)).astype(np.float32)        # ggml [K=64, M=8]
    d = rng.normal(size=(8, 5)).astype(np.float32)         # ggml [N=5, M=8]: the gradient, transposed

    def build(ctx, wt, dt):
        q = G.ggml_cpy(ctx, wt, new_quantized_tensor(ctx, KINDS[kind][0], (64, 8)))
        return G.ggml_out_prod(ctx, q, dt)
    out, = compute(build, w, d)
    expected = d.T.astype(np.float64) @ _decoded(w, kind)  # [N, K] in numpy order: ggml [K, N]
    np.testing.assert_allclose(out, nd4(expected), atol=1e-5)


@pytest.mark.parametrize("kind", list(KINDS))
def test_mul_mat_of_a_quantized_weight_is_the_decoded_product_within_the_activations_rounding(kind):
    rng = np.random.default_rng(1)
    w = rng.normal(size=(8, 64)).astype(np.float32)        # ggml [K=64, M=8]
    x = rng.normal(size=(5, 64)).astype(np.float32)        # ggml [K=64, N=5]

    def build(ctx, wt, xt):
        q = G.ggml_cpy(ctx, wt, new_quantized_tensor(ctx, KINDS[kind][0], (64, 8)))
        return G.ggml_mul_mat(ctx, q, xt)
    out, = compute(build, w, x)
    wd = _decoded(w, kind)
    expected = x.astype(np.float64) @ wd.T                  # [N, M]
    blocks = np.abs(x).reshape(5, 2, 32).max(axis=2) / 127 * 0.6                       # [N, 2]: half a step, F16
    bound = blocks @ np.abs(wd.T).reshape(2, 32, 8).sum(axis=1) + 1e-5 * np.abs(x) @ np.abs(wd.T)
    assert (np.abs(out[0, 0] - expected) <= bound).all()


def test_a_quantized_first_operand_takes_f32_data_only(ctx):
    q = new_quantized_tensor(ctx, G.GGML_TYPE_Q8_0, (64, 8))
    half = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, 64, 5)
    with pytest.raises(G.GgmlTypeError, match="b must be F32 or q8_0"):
        G.ggml_mul_mat(ctx, q, half)
    with pytest.raises(G.GgmlTypeError, match="b must be f32"):
        G.ggml_out_prod(ctx, q, half)
