"""ggmlR's quantization family (ggmlpy/core/quants.py): Q8_0 and Q4_0 bytes against an independent numpy encoder
of their block formats, every type's round trip within the error its bits per weight allow, the importance-matrix
rule, and the argument checks (ggml would abort or write out of bounds on each)."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.core import quants as Q


rng = np.random.default_rng(0)
X = rng.standard_normal((8, 256)).astype(np.float32)
NEEDS_IMATRIX = ("iq2_xxs", "iq2_xs", "iq1_s")
# every function of the family, by name: (type, its quantizer, its decoder)
WHOLE = [
    ("q1_0", g.quantize_q1_0, g.dequantize_row_q1_0),
    ("q4_0", g.quantize_q4_0, g.dequantize_row_q4_0),
    ("q4_1", g.quantize_q4_1, g.dequantize_row_q4_1),
    ("q5_0", g.quantize_q5_0, g.dequantize_row_q5_0),
    ("q5_1", g.quantize_q5_1, g.dequantize_row_q5_1),
    ("q8_0", g.quantize_q8_0, g.dequantize_row_q8_0),
    ("q2_K", g.quantize_q2_K, g.dequantize_row_q2_K),
    ("q3_K", g.quantize_q3_K, g.dequantize_row_q3_K),
    ("q4_K", g.quantize_q4_K, g.dequantize_row_q4_K),
    ("q5_K", g.quantize_q5_K, g.dequantize_row_q5_K),
    ("q6_K", g.quantize_q6_K, g.dequantize_row_q6_K),
    ("iq2_xxs", g.quantize_iq2_xxs, g.dequantize_row_iq2_xxs),
    ("iq2_xs", g.quantize_iq2_xs, g.dequantize_row_iq2_xs),
    ("iq2_s", g.quantize_iq2_s, g.dequantize_row_iq2_s),
    ("iq3_xxs", g.quantize_iq3_xxs, g.dequantize_row_iq3_xxs),
    ("iq3_s", g.quantize_iq3_s, g.dequantize_row_iq3_s),
    ("iq1_s", g.quantize_iq1_s, g.dequantize_row_iq1_s),
    ("iq1_m", g.quantize_iq1_m, g.dequantize_row_iq1_m),
    ("iq4_nl", g.quantize_iq4_nl, g.dequantize_row_iq4_nl),
    ("iq4_xs", g.quantize_iq4_xs, g.dequantize_row_iq4_xs),
    ("tq1_0", g.quantize_tq1_0, g.dequantize_row_tq1_0),
    ("tq2_0", g.quantize_tq2_0, g.dequantize_row_tq2_0),
    ("mxfp4", g.quantize_mxfp4, g.dequantize_row_mxfp4),
    ("nvfp4", g.quantize_nvfp4, g.dequantize_row_nvfp4),
]
ROWS = [
    ("q4_0", g.quantize_row_q4_0_ref, g.dequantize_row_q4_0),
    ("q4_1", g.quantize_row_q4_1_ref, g.dequantize_row_q4_1),
    ("q5_0", g.quantize_row_q5_0_ref, g.dequantize_row_q5_0),
    ("q5_1", g.quantize_row_q5_1_ref, g.dequantize_row_q5_1),
    ("q8_0", g.quantize_row_q8_0_ref, g.dequantize_row_q8_0),
    ("q8_1", g.quantize_row_q8_1_ref, None),
    ("q2_K", g.quantize_row_q2_K_ref, g.dequantize_row_q2_K),
    ("q3_K", g.quantize_row_q3_K_ref, g.dequantize_row_q3_K),
    ("q4_K", g.quantize_row_q4_K_ref, g.dequantize_row_q4_K),
    ("q5_K", g.quantize_row_q5_K_ref, g.dequantize_row_q5_K),
    ("q6_K", g.quantize_row_q6_K_ref, g.dequantize_row_q6_K),
    ("q8_K", g.quantize_row_q8_K_ref, g.dequantize_row_q8_K),
    ("iq3_xxs", g.quantize_row_iq3_xxs_ref, g.dequantize_row_iq3_xxs),
    ("iq3_s", g.quantize_row_iq3_s_ref, g.dequantize_row_iq3_s),
    ("iq2_s", g.quantize_row_iq2_s_ref, g.dequantize_row_iq2_s),
    ("iq4_nl", g.quantize_row_iq4_nl_ref, g.dequantize_row_iq4_nl),
    ("iq4_xs", g.quantize_row_iq4_xs_ref, g.dequantize_row_iq4_xs),
    ("tq1_0", g.quantize_row_tq1_0_ref, g.dequantize_row_tq1_0),
    ("tq2_0", g.quantize_row_tq2_0_ref, g.dequantize_row_tq2_0),
    ("mxfp4", g.quantize_row_mxfp4_ref, g.dequantize_row_mxfp4),
]


def q8_0_ref(x: np.ndarray) -> bytes:
    """Q8_0, written from its definition: blocks of 32, an f16 scale d = max|x| / 127, int8 round(x / d)."""
    out = bytearray()
    for block in x.reshape(-1, 32).astype(np.float32):
        amax = np.float32(np.abs(block).max())
        d = amax / np.float32(127)
        inv = np.float32(1) / d if d else np.float32(0)
        v = block * inv
        q = np.trunc(v + np.copysign(np.float32(0.5), v)).astype(np.int8)   # C's roundf: halves away from zero
        out += np.float16(d).tobytes() + q.tobytes()
    return bytes(out)


def q4_0_ref(x: np.ndarray) -> bytes:
    """Q4_0 from its definition: blocks of 32, d = (the value of largest magnitude) / -8, nibbles
    min(15, int(x / d + 8.5)), the first 16 values in the low nibbles, the last 16 in the high ones."""
    out = bytearray()
    for block in x.reshape(-1, 32).astype(np.float32):
        m = block[np.argmax(np.abs(block))]
        d = m / np.float32(-8)
        inv = np.float32(1) / d if d else np.float32(0)
        q = np.minimum(15, (block * inv + np.float32(8.5)).astype(np.int8)).astype(np.uint8)
        out += np.float16(d).tobytes() + (q[:16] | (q[16:] << 4)).astype(np.uint8).tobytes()
    return bytes(out)


def test_q8_0_and_q4_0_bytes_equal_an_independent_encoder():
    for row in X:
        assert g.quantize_row_q8_0_ref(row, 256) == q8_0_ref(row)
        assert g.quantize_row_q4_0_ref(row, 256) == q4_0_ref(row)
    assert g.quantize_q8_0(X, 8, 256) == q8_0_ref(X)          # the whole-matrix quantizer, no importance matrix
    assert g.quantize_q4_0(X, 8, 256) == q4_0_ref(X)
    assert g.ggml_quantize_chunk(g.GGML_TYPE_Q8_0, X, 8, 256) == q8_0_ref(X)


def test_q8_1_blocks_decode_by_their_definition():
    raw = np.frombuffer(g.quantize_row_q8_1_ref(X[0], 256), np.uint8).reshape(-1, 36)   # d, s (f16), 32 x int8
    d = raw[:, :2].copy().view(np.float16).astype(np.float32)
    q = raw[:, 4:].view(np.int8).astype(np.float32)
    np.testing.assert_allclose((d * q).reshape(-1), X[0], atol=np.abs(X[0]).max() / 127)
    s = raw[:, 2:4].copy().view(np.float16).astype(np.float32).reshape(-1)
    np.testing.assert_allclose(s, (d * q).sum(1), rtol=2e-3)   # s = d * sum(q), in f16


@pytest.mark.parametrize("name, quantize, dequantize", [w for w in WHOLE if w[0] not in ("tq1_0", "tq2_0", "q1_0")])
def test_every_type_round_trips_within_its_bits(name, quantize, dequantize):
    """Relative RMS error on Gaussian data at most 3 * 2^-bits_per_weight (measured: 1.3-2.5 times it)."""
    bpw = Q.TYPES[name][1]
    imatrix = np.ones(256, np.float32) if name in NEEDS_IMATRIX else None
    q = quantize(X, 8, 256, imatrix)
    info = g.ggml_quant_block_info(Q.ggml_type_of(name))
    assert len(q) == 8 * 256 // info["block_size"] * info["type_size"]
    back = dequantize(q, X.size)
    rel = np.sqrt(np.mean((back - X.reshape(-1)) ** 2)) / X.std()
    assert rel <= 3 * 2 ** -bpw, (name, rel, 3 * 2 ** -bpw)


@pytest.mark.parametrize("name, quantize, dequantize", [r for r in ROWS if r[0] not in ("q8_1", "tq1_0", "tq2_0")])
def test_every_reference_row_quantizer_round_trips(name, quantize, dequantize):
    # Q8_K stores 8-bit values with one scale per 256; its block sums (1.125 of its bits) serve the dot product
    bpw = 8.0 if name == "q8_K" else Q.TYPES[name][1]
    back = dequantize(quantize(X[0], 256), 256)
    assert np.sqrt(np.mean((back - X[0]) ** 2)) / X[0].std() <= 3 * 2 ** -bpw


@pytest.mark.parametrize("row, whole, decode", [(g.quantize_row_tq1_0_ref, g.quantize_tq1_0, g.dequantize_row_tq1_0),
                                                 (g.quantize_row_tq2_0_ref, g.quantize_tq2_0, g.dequantize_row_tq2_0)])
def test_ternary_types_are_exact_on_ternary_weights(row, whole, decode):
    scale = np.float32(0.37)
    t = rng.integers(-1, 2, 256).astype(np.float32) * scale    # BitNet-style weights: exact up to the f16 scale
    for q in (row(t, 256), whole(t, 1, 256)):
        np.testing.assert_allclose(decode(q, 256), t, rtol=1e-3, atol=1e-3)


def test_q1_0_keeps_signs():
    s = np.sign(X[0]).astype(np.float32) * np.float32(0.5)
    back = g.dequantize_row_q1_0(g.quantize_q1_0(s, 1, 256), 256)
    np.testing.assert_allclose(back, s, rtol=1e-3)


def test_types_that_need_an_importance_matrix_refuse_without_one():
    for name in NEEDS_IMATRIX:
        assert g.ggml_quantize_requires_imatrix(Q.ggml_type_of(name))
        with pytest.raises(g.GgmlValueError, match="importance matrix"):
            getattr(g, f"quantize_{name}")(X, 8, 256)
    assert not g.ggml_quantize_requires_imatrix(g.GGML_TYPE_Q4_K)
    weighted = g.quantize_q4_K(X, 8, 256, imatrix=np.linspace(0.1, 2.0, 256))
    assert weighted != g.quantize_q4_K(X, 8, 256)           # the importances change the choices


def test_arguments_that_ggml_would_abort_on_are_refused():
    with pytest.raises(g.GgmlValueError, match="multiple of the type's block size 32"):
        g.quantize_q4_0(np.ones(40), 1, 40)
    with pytest.raises(g.GgmlValueError, match="256 values, expected 512"):
        g.quantize_q8_0(np.ones(256), 2, 256)
    with pytest.raises(g.GgmlValueError, match="NaN"):
        g.quantize_q8_0(np.full(32, np.nan), 1, 32)
    with pytest.raises(g.GgmlValueError, match="take 34 bytes"):
        g.dequantize_row_q8_0(b"\0" * 10, 32)
    with pytest.raises(g.GgmlValueError, match="not a quantized type"):
        g.ggml_quantize_chunk(g.GGML_TYPE_F32, np.ones(32), 1, 32)
    with pytest.raises(g.GgmlValueError, match="grid_size"):
        g.iq3xs_init_impl(100)
    with pytest.raises(g.GgmlValueError, match="removed"):
        g.ggml_ftype_to_ggml_type(5)


def test_tables_block_info_and_file_types():
    g.iq2xs_init_impl(g.GGML_TYPE_IQ2_XS)
    g.iq3xs_init_impl(256)
    g.ggml_quantize_init(g.GGML_TYPE_IQ3_S)
    g.iq2xs_free_impl(g.GGML_TYPE_IQ2_XS)
    g.iq3xs_free_impl(256)
    g.ggml_quantize_free()
    assert len(g.quantize_iq3_xxs(X, 8, 256)) > 0            # the tables come back when needed
    assert g.ggml_quant_block_info(g.GGML_TYPE_Q4_0) == {"type_name": "q4_0", "type_size": 18, "block_size": 32,
                                                         "is_quantized": True}
    assert g.ggml_quant_block_info(g.GGML_TYPE_Q6_K)["block_size"] == 256
    assert g.ggml_ftype_to_ggml_type(2) == g.GGML_TYPE_Q4_0
    assert g.ggml_ftype_to_ggml_type(12) == g.GGML_TYPE_Q4_K
    assert [g.ggml_type_name(t) for t in (g.GGML_TYPE_Q2_K, g.GGML_TYPE_Q3_K, g.GGML_TYPE_Q4_1, g.GGML_TYPE_Q4_K,
                                          g.GGML_TYPE_Q5_K, g.GGML_TYPE_Q6_K)] == ["q2_K", "q3_K", "q4_1", "q4_K",
                                                                                   "q5_K", "q6_K"]


def test_freeing_the_tables_while_other_threads_quantize_is_safe():
    import threading
    errors, stop = [], threading.Event()

    def quantize():
        try:
            while not stop.is_set():
                g.dequantize_row_iq2_xs(g.quantize_iq2_xs(X, 8, 256, imatrix=np.ones(256)), X.size)
                g.quantize_row_iq3_xxs_ref(X[0], 256)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
    threads = [threading.Thread(target=quantize) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(50):
        g.ggml_quantize_free()
        g.iq3xs_free_impl(256)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
