"""Quantized model files (ggml_save_model(..., quantize=...)): which weights take the type (as the gguf package reads
the file), what stays F32, mixed types by layer or weight, the weights read back equal ggml's decoding of ggml's
encoding, and the loaded model predicts the digits within a point of the F32 model (q8_0) or three (q4_0)."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g


gguf = pytest.importorskip("gguf", reason="the gguf package reads the files (pip install gguf)")


@pytest.fixture(scope="module")
def trained(digits_mlp):
    model, x, y = digits_mlp
    return model, x[1400:], y[1400:]


def _types(path):
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


def _accuracy(model, x, y):
    return float((g.ggml_predict(model, x).argmax(1) == y).mean())


@pytest.mark.parametrize("kind, points", [("q8_0", 1.0), ("q4_0", 3.0)])
def test_a_quantized_file_holds_its_types_and_predicts_close_to_f32(tmp_path, trained, kind, points):
    model, x, y = trained
    g.ggml_save_model(model, tmp_path / "f32.gguf")
    g.ggml_save_model(model, tmp_path / f"{kind}.gguf", quantize=kind)
    types = _types(tmp_path / f"{kind}.gguf")
    assert types == {"dense_1.weight": kind.upper(), "dense_1.bias": "F32", "dense_2.weight": kind.upper(),
                     "dense_2.bias": "F32", "dense_3.weight": kind.upper(), "dense_3.bias": "F32"}
    size = (tmp_path / f"{kind}.gguf").stat().st_size
    assert size < (tmp_path / "f32.gguf").stat().st_size * (0.4 if kind == "q8_0" else 0.25)
    loaded = g.ggml_load_model(tmp_path / f"{kind}.gguf", backend="cpu")
    assert _accuracy(loaded, x, y) >= _accuracy(model, x, y) - points / 100
    # the weights read back are ggml's decoding of ggml's encoding of the trained weights
    w = g.ggml_get_weights(model)["dense_2.weight"]            # (in, out): the file's rows are its columns
    quantize, decode = {"q8_0": (g.quantize_q8_0, g.dequantize_row_q8_0),
                        "q4_0": (g.quantize_q4_0, g.dequantize_row_q4_0)}[kind]
    expected = decode(quantize(w.T, 64, 128), 64 * 128).reshape(64, 128).T
    np.testing.assert_array_equal(g.ggml_get_weights(loaded)["dense_2.weight"], expected)


def test_mixed_types_by_layer_and_weight_and_rows_that_do_not_fit(tmp_path, trained):
    model, _, _ = trained
    g.ggml_save_model(model, tmp_path / "mix.gguf", quantize={"dense_1": "q4_0", "dense_2.weight": "q8_0"})
    types = _types(tmp_path / "mix.gguf")
    assert (types["dense_1.weight"], types["dense_2.weight"], types["dense_3.weight"]) == ("Q4_0", "Q8_0", "F32")
    g.ggml_save_model(model, tmp_path / "k.gguf", quantize="q4_K")   # K-quants' blocks of 256: rows of 64/128 don't fit
    assert set(_types(tmp_path / "k.gguf").values()) == {"F32"}


def test_quantized_saving_refuses_what_it_cannot_do(tmp_path, trained):
    model, _, _ = trained
    with pytest.raises(g.GgmlValueError, match="not a quantization type"):
        g.ggml_save_model(model, tmp_path / "x.gguf", quantize="q3")
    with pytest.raises(g.GgmlValueError, match="neither a layer nor a weight"):
        g.ggml_save_model(model, tmp_path / "x.gguf", quantize={"dense_9": "q8_0"})
    with pytest.raises(g.GgmlValueError, match="for inference"):
        g.ggml_save_model(model, tmp_path / "x.gguf", include_optimizer=True, quantize="q8_0")


def test_gguf_read_decodes_quantized_tensors_when_asked(tmp_path, trained):
    model, _, _ = trained
    g.ggml_save_model(model, tmp_path / "q.gguf", quantize="q8_0")
    with pytest.raises(g.GgmlTypeError, match="numpy cannot hold"):
        g.gguf_read(tmp_path / "q.gguf")
    tensors, meta = g.gguf_read(tmp_path / "q.gguf", dequantize=True)
    assert tensors["dense_1.weight"].dtype == np.float32 and tensors["dense_1.weight"].shape == (128, 64)
    assert "dense_1.weight" in meta["ggmlpy.quantized"]
