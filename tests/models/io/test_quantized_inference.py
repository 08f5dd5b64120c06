"""Quantized inference (ggml_quantize_model, ggml_load_model of a quantized file): the weights stay quantized on the
device and the products run on them.

What is checked, and against what:
* the products: a dense layer held in q8_0 / q4_0 / q4_K / q6_K / iq4_nl predicts what numpy (float64) computes
  from the weights ggml's decoder gives for the held bytes, within the rounding of the activations alone. ggml's
  kernels may round each block of the activations to 8 bits before integer dot products (the CPU: q8_0 blocks of
  32, q8_K blocks of 256; a GPU's q8_1): an activation moves by at most half a step of its block's scale,
  d = max|x| / 127 (stored in F16: 0.6 d covers that scale's own rounding), so the bound per output is the sum
  over blocks of 0.6 d * sum |w| of the block, plus F32 rounding; a GPU may compute in F16 besides (2^-10 of
  sum |x w| more). That bound is loose (the measured error is ~11 % of it on the CPU; lavapipe computes in F32,
  3e-6 off), so on an x86 CPU the test also rounds the activations as ggml's CPU does (numpy: q8_0's
  round(x * 127 / max|x|) times the F16 scale; q8_K's scale from the block's largest-magnitude value, in F32) and
  requires the product of those with the decoded weights within 1e-6 of sum |x w| (measured: 3e-8). A kernel that
  read the blocks wrongly (a scale, a nibble order), or used the F32 weights, misses that by orders of magnitude;
* no decoded copy: the weights' buffer holds the quantized bytes (its size against the F32 model's), the weight
  tensors have the quantized type, an embedding's rows come back exactly as ggml decodes them;
* a quantized model saved again is the same file, byte for byte; copies (compiling again, a trainer's snapshot)
  keep the bytes; a quantized file loaded with dequantize=True is an F32 model that trains;
* training: a trainable layer holding quantized weights is refused with the fix; with those layers frozen the others
  train and the quantized bytes stay as they were;
* ggml_model_placement(model, training=False) of a quantized MLP and of a transformer (embedding, attention,
  dense) is one split on Vulkan.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers.devices import require_gpu


TYPES = ["q8_0", "q4_0", "q4_K", "q6_K", "iq4_nl"]
ACT_BLOCK = {"q8_0": 32, "q4_0": 32, "q4_K": 256, "q6_K": 256, "iq4_nl": 32}   # ggml-cpu's vec_dot_type blocks


def _device(name: str) -> str:
    if name != "cpu":
        require_gpu(name)
    return name


def _dense(backend: str, n_in: int = 256, units: int = 16, seed: int = 0):
    np.random.seed(seed)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, units, input_shape=(n_in,), bias_initializer="glorot_uniform")
    return g.ggml_compile(m, loss="mse", backend=backend)


def _bound(x: np.ndarray, w: np.ndarray, block: int, device: str) -> np.ndarray:
    """Per output of ``x @ w``: how far rounding each activation block to 8 bits (and, off the CPU, F16) moves it."""
    n, k = x.shape
    xb = np.abs(x.astype(np.float64)).reshape(n, k // block, block)
    d = xb.max(axis=2) / 127                                                    # [n, blocks]
    wb = np.abs(w.astype(np.float64)).reshape(k // block, block, -1).sum(axis=1)  # [blocks, out]
    bound = 0.6 * d @ wb + 1e-5 * np.abs(x) @ np.abs(w) + 1e-6
    if device != "cpu":
        bound += 2.0 ** -10 * (np.abs(x) @ np.abs(w))
    return bound


def _cpu_rounded(x: np.ndarray, block: int) -> np.ndarray:
    """``x`` as ggml's x86 CPU rounds it before a quantized product: q8_0 blocks of 32 (quantize_row_q8_0: round
    to nearest of x * 127 / max|x|, times the scale max|x| / 127 in F16), or q8_K blocks of 256 (the scale
    -max / 127 in F32, from the value of largest magnitude; at most 127)."""
    n, k = x.shape
    xb = x.reshape(n, k // block, block).astype(np.float32)
    if block == 32:
        amax = np.abs(xb).max(axis=2, keepdims=True)
        q = np.round(xb * (np.float32(127) / amax))
        return (q * (amax / np.float32(127)).astype(np.float16).astype(np.float32)).reshape(n, k)
    top = np.take_along_axis(xb, np.abs(xb).argmax(axis=2)[..., None], axis=2)
    iscale = np.float32(-127) / top
    return (np.minimum(127, np.round(iscale * xb)) * (np.float32(1) / iscale)).reshape(n, k)


@pytest.mark.parametrize("device", ["cpu", "Vulkan0", "CUDA0"])
@pytest.mark.parametrize("kind", TYPES)
def test_a_quantized_dense_layer_computes_on_its_blocks(device, kind):
    model = _dense(_device(device))
    x = np.random.default_rng(1).normal(size=(64, 256)).astype(np.float32)
    f32 = g.ggml_predict(model, x)
    g.ggml_quantize_model(model, kind)
    assert g.ggml_model_quantization(model) == {"dense_1.weight": kind}
    w = g.ggml_get_weights(model)["dense_1.weight"]     # ggml's decoding of the held bytes, (in, out)
    b = g.ggml_get_weights(model)["dense_1.bias"]
    expected = x.astype(np.float64) @ w + b
    got = g.ggml_predict(model, x)
    excess = np.abs(got - expected) - _bound(x, w, ACT_BLOCK[kind], device)
    assert excess.max() <= 0, f"{kind} on {device}: {excess.max():.3g} beyond the activations' rounding"
    if device == "cpu" and g.ggml_cpu_has_avx2():
        xr = _cpu_rounded(x, ACT_BLOCK[kind]).astype(np.float64)
        off = np.abs(got - (xr @ w + b)) / (np.abs(xr) @ np.abs(w))
        assert off.max() <= 1e-6, f"{kind}: {off.max():.3g} of sum |x w| from ggml's CPU arithmetic"
    assert np.abs(got - f32).max() > 0     # the products did change: the weights are the quantized ones


def test_the_weights_buffer_holds_the_quantized_bytes_and_no_decoded_copy():
    model = _dense("cpu", 1024, 256)
    f32_bytes = model.runtime.params.buffer.size
    g.ggml_quantize_model(model, "q4_0")
    tensor = model.runtime.params.named_tensors()["dense_1.weight"]
    assert tensor.type == g.GGML_TYPE_Q4_0
    q_bytes = model.runtime.params.buffer.size
    # q4_0: 18 bytes per 32 weights; the bias stays F32 (1 kB); a little alignment padding besides
    assert q_bytes <= 1024 * 256 * 18 // 32 + 256 * 4 + 512
    assert q_bytes < f32_bytes / 6


def test_an_embedding_looks_its_rows_up_in_the_quantized_table():
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_embedding(m, 50, 64, input_shape=(7,))
    m = g.ggml_compile(m, loss="mse", backend="cpu")
    g.ggml_quantize_model(m, "q4_0")
    assert g.ggml_model_quantization(m) == {"embedding_1.weight": "q4_0"}
    table = g.ggml_get_weights(m)["embedding_1.weight"]            # decoded, (vocab, dim)
    ids = np.random.default_rng(0).integers(0, 50, size=(3, 7)).astype(np.int32)
    np.testing.assert_array_equal(g.ggml_predict(m, ids), table[ids])


@pytest.fixture(scope="module")
def digits(digits_mlp):
    return digits_mlp


def _accuracy(model, x, y):
    return float((g.ggml_predict(model, x[1400:]).argmax(1) == y[1400:]).mean())


@pytest.mark.parametrize("device", ["cpu", "Vulkan0", "CUDA0"])
def test_a_quantized_file_loads_quantized_and_predicts_on_each_device(tmp_path, digits, device):
    model, x, y = digits
    g.ggml_save_model(model, tmp_path / "q8.gguf", quantize="q8_0")
    loaded = g.ggml_load_model(tmp_path / "q8.gguf", backend=_device(device))
    assert g.ggml_model_quantization(loaded) == {f"dense_{i}.weight": "q8_0" for i in (1, 2, 3)}
    assert _accuracy(loaded, x, y) >= _accuracy(model, x, y) - 0.01
    if device != "cpu":
        placement = g.ggml_model_placement(loaded, training=False)
        assert placement.n_splits == 1 and not placement.cpu_ops, placement
    # saved again: the same tensors, byte for byte (written as held, not decoded and quantized again)
    g.ggml_save_model(loaded, tmp_path / "again.gguf")
    again, first = g.gguf_read(tmp_path / "again.gguf", raw=True)[0], g.gguf_read(tmp_path / "q8.gguf", raw=True)[0]
    assert again.keys() == first.keys() and all(np.array_equal(again[k], first[k]) for k in first)


def test_dequantize_true_gives_an_f32_model_that_trains(tmp_path, digits):
    model, x, y = digits
    g.ggml_save_model(model, tmp_path / "q4.gguf", quantize="q4_0")
    quantized = g.ggml_load_model(tmp_path / "q4.gguf", backend="cpu")
    decoded = g.ggml_load_model(tmp_path / "q4.gguf", backend="cpu", dequantize=True)
    assert g.ggml_model_quantization(decoded) == {}
    for name, w in g.ggml_get_weights(quantized).items():
        np.testing.assert_array_equal(g.ggml_get_weights(decoded)[name], w)
    g.ggml_fit(decoded, x[:256], y[:256], epochs=1, batch_size=32, verbose=0)   # F32 weights train


def test_training_refuses_quantized_trainable_layers_and_trains_the_others(digits):
    model, x, y = digits
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 64, activation="relu", input_shape=64, name="body")
    m = g.ggml_layer_dense(m, 10, activation="softmax", name="head")
    m = g.ggml_compile(m, optimizer="adam", learning_rate=0.01, loss="sparse_categorical_crossentropy",
                       backend="cpu")
    g.ggml_quantize_model(m, {"body": "q8_0"})
    with pytest.raises(g.GgmlValueError, match=r"body.weight \(q8_0\).*trainable = False"):
        g.ggml_fit(m, x[:256], y[:256], epochs=1, verbose=0)
    m.layers[0].trainable = False
    held = g.ggml_get_weights(m)["body.weight"].copy()
    raw = m.runtime.params.value(m.layers[0], "weight")
    hist = g.ggml_fit(m, x[:1024], y[:1024], epochs=4, batch_size=32, verbose=0)
    losses = hist.history["loss"]
    assert losses[-1] < 0.7 * losses[0]
    assert m.runtime.params.value(m.layers[0], "weight") == raw   # the quantized bytes, untouched
    np.testing.assert_array_equal(g.ggml_get_weights(m)["body.weight"], held)


def test_copies_keep_the_quantized_bytes(digits):
    model, x, y = digits
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 64, activation="relu", input_shape=64, name="q_body", trainable=False)
    m = g.ggml_layer_dense(m, 10, activation="softmax", name="q_head")
    m = g.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend="cpu")
    g.ggml_quantize_model(m, {"q_body": "q4_0"})
    raw = m.runtime.params.value(m.layers[0], "weight")
    m = g.ggml_compile(m, optimizer="sgd", loss="sparse_categorical_crossentropy", backend="cpu")   # again
    assert g.ggml_model_quantization(m) == {"q_body.weight": "q4_0"}
    assert m.runtime.params.value(m.layers[0], "weight") == raw
    tr = g.ggml_trainer(m, batch_size=32)
    snap = tr.snapshot()
    tr.step(x[:32], y[:32])
    tr.restore(snap)
    tr.free()
    assert m.runtime.params.value(m.layers[0], "weight") == raw
    g.ggml_quantize_model(m, {"q_body": None})                    # back to F32: the decoded values
    assert g.ggml_model_quantization(m) == {}
    np.testing.assert_array_equal(g.ggml_get_weights(m)["q_body.weight"], raw.floats().T)


def test_quantize_model_refuses_what_it_cannot_do():
    model = _dense("cpu")
    with pytest.raises(g.GgmlValueError, match="not a quantization type"):
        g.ggml_quantize_model(model, "q3")
    with pytest.raises(g.GgmlValueError, match="neither a layer nor a weight"):
        g.ggml_quantize_model(model, {"dense_9": "q8_0"})
    with pytest.raises(g.GgmlStateError, match="not compiled"):
        g.ggml_quantize_model(g.ggml_model_sequential(), "q8_0")
    assert g.ggml_model_quantization(model) == {}


def test_a_transformer_runs_quantized_in_one_split_on_vulkan():
    require_gpu("Vulkan0")
    ids = np.random.default_rng(0).integers(0, 40, size=(8, 16)).astype(np.int32)
    results = {}
    for device in ("cpu", "Vulkan0"):
        np.random.seed(0)   # the same weights on both devices (new layers: the quantized types belong to layers)
        tokens = g.ggml_input(shape=(16,), dtype="int32")
        h = g.ggml_layer_embedding(tokens, 40, 64)
        a = g.ggml_layer_multi_head_attention(h, num_heads=2, key_dim=32)
        h = g.ggml_layer_layer_norm(g.ggml_layer_add([h, a]))
        m = g.ggml_model(tokens, g.ggml_layer_dense(h, 40, activation="softmax"))
        m = g.ggml_compile(m, loss="sparse_categorical_crossentropy", backend=device)
        f32 = g.ggml_predict(m, ids)
        g.ggml_quantize_model(m, "q8_0")
        # the table, the four projections (rows of 64, and of 32 for the output's heads) and the head
        assert sorted(name.split(".")[1] for name in g.ggml_model_quantization(m)) == sorted(
            ["weight", "query_kernel", "key_kernel", "value_kernel", "output_kernel", "weight"])
        results[device] = (f32, g.ggml_predict(m, ids))
        if device != "cpu":
            placement = g.ggml_model_placement(m, training=False)
            assert placement.n_splits == 1 and not placement.cpu_ops, placement
    (f_cpu, q_cpu), (f_vk, q_vk) = results["cpu"], results["Vulkan0"]
    np.testing.assert_allclose(f_cpu, f_vk, atol=1e-5)
    np.testing.assert_allclose(q_cpu, q_vk, atol=2e-3)
    assert 0 < np.abs(q_cpu - f_cpu).max() < 0.02


def test_explicit_names_that_cannot_be_quantized_are_refused_and_writes_keep_the_bytes():
    model = _dense("cpu")
    with pytest.raises(g.GgmlValueError, match="none of whose weights can be held in q8_0"):
        g.ggml_quantize_model(model, {"dense_1.bias": "q8_0"})
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 8, input_shape=(64,))        # rows of 64: no K-quant's block of 256
    m = g.ggml_compile(m, loss="mse", backend="cpu")
    with pytest.raises(g.GgmlValueError, match=r"whole blocks \(256 values for q2_K\)"):
        g.ggml_quantize_model(m, {m.layers[0].name: "q2_K"})
    assert g.ggml_model_quantization(model) == {} and g.ggml_model_quantization(m) == {}
    g.ggml_quantize_model(model, "q6_K")
    raw = model.runtime.params.value(model.layers[0], "weight")
    g.ggml_set_weights(model, g.ggml_get_weights(model))   # the held values written back: the same bytes
    assert model.runtime.params.value(model.layers[0], "weight") == raw


def test_data_parallel_replicas_follow_quantized_weights():
    require_gpu("Vulkan0")
    model = _dense(["cpu", "Vulkan0"])
    g.ggml_quantize_model(model, "q8_0")
    x = np.random.default_rng(2).normal(size=(16, 256)).astype(np.float32)
    weights = g.ggml_get_weights(model)
    weights["dense_1.bias"] = weights["dense_1.bias"] + 1.0
    g.ggml_set_weights(model, weights)                        # copied to the Vulkan replica as held
    expected = x.astype(np.float64) @ weights["dense_1.weight"] + weights["dense_1.bias"]
    got = g.ggml_predict(model, x, batch_size=16)             # half the batch on each device
    assert np.abs(got - expected).max() < 0.05
    replica = model.runtime.replicas[0][1]
    assert replica.value(model.layers[0], "weight") == model.runtime.params.value(model.layers[0], "weight")
