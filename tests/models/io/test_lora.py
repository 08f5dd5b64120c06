"""Low-rank adapters over frozen (quantized) weights: ggml_add_lora, ggml_save_lora / ggml_load_lora,
ggml_merge_lora.

What is checked, and against what:
* an adapter starts as no change (the predictions before and after adding it are equal, bit for bit), and only the
  adapters' factors train;
* on a shifted task (the digits' labels rotated by one) the loss of a quantized digits model falls by half with
  rank-8 adapters, on the CPU and on Vulkan (lavapipe in CI), and every base weight, quantized or F32, is
  bit-identical afterwards; on Vulkan the training step is one split (the frozen weights decoded in the graph);
* the adapters' gradients (one plain-SGD step at learning rate 1 moves each factor by minus its gradient) match
  central finite differences of the loss of the dequantized model computed by numpy in float64 (the base weights
  decoded by ggml's decoder, the adapters' own product written out): within 2 % of the gradient's norm on the CPU,
  whose quantized kernels round the activations to 8 bits per block first (about 1 %; measured here 1e-6, where
  ggml's BLAS backend takes these products and decodes the weights for its sgemm), and 1e-4 on
  Vulkan, whose training graph multiplies the decoded weights in F32 (lavapipe; a GPU's F32 products agree to
  that);
* the base file plus the adapter file, loaded into a fresh model, predict as the trained model; a whole-model file
  keeps the adapters too; the adapter file carries the GGUF keys other tools read;
* a merge into F32 weights predicts what numpy computes from the merged sum (1e-5), a merge into quantized weights
  within that type's rounding of the adapter model, and the adapters are gone.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from tests.helpers.devices import require_gpu


def _device(name: str) -> str:
    if name != "cpu":
        require_gpu(name)
    return name


@pytest.fixture(scope="module")
def digits(digits_mlp):
    return digits_mlp


@pytest.fixture()
def base_file(tmp_path, digits):
    model, _, _ = digits
    path = tmp_path / "base-q8.gguf"
    g.ggml_save_model(model, path, quantize="q8_0")
    return path


def _base_values(model):
    store = model.runtime.params
    return {f"{layer.name}.{p.name}": store.value(layer, p.name) for layer, p in store.specs if p.adapts is None}


def _same(a, b) -> bool:
    return a == b if not isinstance(a, np.ndarray) else np.array_equal(a, b)


def test_an_adapter_starts_as_no_change_and_only_the_adapters_train(base_file, digits):
    _, x, _ = digits
    model = g.ggml_load_model(base_file, backend="cpu")
    before = g.ggml_predict(model, x[:100])
    g.ggml_add_lora(model, rank=4, alpha=8)
    np.testing.assert_array_equal(g.ggml_predict(model, x[:100]), before)
    names = sorted(model.runtime.opt_state.trainable())
    assert names == sorted(f"dense_{i}.weight_lora_{f}" for i in (1, 2, 3) for f in "ab")
    weights = g.ggml_get_weights(model)
    assert weights["dense_1.weight_lora_a"].shape == (4, 64) and weights["dense_1.weight_lora_b"].shape == (128, 4)
    assert not weights["dense_3.weight_lora_b"].any()


@pytest.mark.parametrize("device", ["cpu", "Vulkan0", "CUDA0"])
def test_adapters_learn_a_shifted_task_and_the_base_stays_bit_identical(base_file, digits, device):
    _, x, y = digits
    shifted = (y + 1) % 10
    model = g.ggml_load_model(base_file, backend=_device(device))
    g.ggml_compile(model, optimizer="adam", learning_rate=0.01, loss="sparse_categorical_crossentropy",
                   backend=device)
    g.ggml_add_lora(model, rank=8, alpha=16)
    base = _base_values(model)
    hist = g.ggml_fit(model, x[:1400], shifted[:1400], epochs=6, batch_size=32, verbose=0)
    losses = hist.history["loss"]
    assert losses[-1] < 0.5 * losses[0], losses
    accuracy = float((g.ggml_predict(model, x[1400:]).argmax(1) == shifted[1400:]).mean())
    assert accuracy > 0.8
    after = _base_values(model)
    assert all(_same(base[k], after[k]) for k in base), [k for k in base if not _same(base[k], after[k])]
    assert g.ggml_model_quantization(model) == {f"dense_{i}.weight": "q8_0" for i in (1, 2, 3)}
    if device != "cpu":   # the step decodes the frozen weights in its graph: no op left to the CPU
        placement = g.ggml_model_placement(model, training=True)
        assert placement.n_splits == 1 and not placement.cpu_ops, placement


def _numpy_loss(weights: dict, x: np.ndarray, t: np.ndarray, scale: float) -> float:
    """The MSE of the two-layer tanh model in float64: base weights (user order, (in, out)) plus each adapter's
    ``scale * A^T B^T`` (A stored (rank, in), B (out, rank))."""
    h = x.astype(np.float64)
    for i, act in ((1, np.tanh), (2, lambda v: v)):
        w = weights[f"dense_{i}.weight"].astype(np.float64)
        a, b = weights[f"dense_{i}.weight_lora_a"], weights[f"dense_{i}.weight_lora_b"]
        h = act(h @ w + scale * (h @ a.T.astype(np.float64)) @ b.T.astype(np.float64) + weights[f"dense_{i}.bias"])
    return float(((h - t) ** 2).mean())


@pytest.mark.parametrize("device", ["cpu", "Vulkan0", "CUDA0"])
def test_adapter_gradients_match_finite_differences_of_the_dequantized_model(device):
    _device(device)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(32, 64)).astype(np.float32)
    t = rng.normal(size=(32, 32)).astype(np.float32)
    np.random.seed(3)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 64, activation="tanh", input_shape=64, bias_initializer="glorot_uniform")
    m = g.ggml_layer_dense(m, 32, bias_initializer="glorot_uniform")
    m = g.ggml_compile(m, optimizer="sgd", learning_rate=1.0, loss="mse", backend=device)
    g.ggml_quantize_model(m, "q4_0")
    g.ggml_add_lora(m, rank=4, alpha=8)
    g.ggml_set_weights(m, {k: 0.3 * rng.normal(size=v.shape).astype(np.float32)
                           for k, v in g.ggml_get_weights(m).items() if "_lora_" in k})
    before = g.ggml_get_weights(m)
    g.ggml_fit(m, x, t, epochs=1, batch_size=32, shuffle=False, verbose=0)
    after = g.ggml_get_weights(m)
    tolerance = 0.02 if device == "cpu" else 1e-4
    for key in [k for k in before if "_lora_" in k]:
        grad = before[key].astype(np.float64) - after[key]
        fd = np.zeros(before[key].shape)
        for idx in np.ndindex(*before[key].shape):
            for sign in (1, -1):
                w = dict(before)
                w[key] = before[key].astype(np.float64).copy()
                w[key][idx] += sign * 1e-4
                fd[idx] += sign * _numpy_loss(w, x, t, 2.0) / 2e-4
        off = np.linalg.norm(grad - fd) / np.linalg.norm(fd)
        assert off <= tolerance, f"{key} on {device}: {off:.2e} of the gradient's norm"


def test_the_base_file_plus_the_adapter_file_predict_as_the_trained_model(tmp_path, base_file, digits):
    gguf = pytest.importorskip("gguf", reason="the gguf package reads the adapter file's keys")
    _, x, y = digits
    model = g.ggml_load_model(base_file, backend="cpu")
    g.ggml_add_lora(model, rank=8, alpha=16, targets=["dense_2", "dense_3.weight"])
    assert sorted(model.runtime.opt_state.trainable()) == ["dense_2.weight_lora_a", "dense_2.weight_lora_b",
                                                           "dense_3.weight_lora_a", "dense_3.weight_lora_b"]
    def batches():   # streamed, as a fine-tuning set larger than memory would be
        for i in range(0, 640, 32):
            yield x[i:i + 32], (y[i:i + 32] + 1) % 10
    g.ggml_fit_generator(model, batches, epochs=2, verbose=0)
    expected = g.ggml_predict(model, x[1400:])
    g.ggml_save_lora(model, tmp_path / "adapter.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "adapter.gguf"))
    assert sorted(t.name for t in reader.tensors) == ["dense_2.weight_lora_a", "dense_2.weight_lora_b",
                                                      "dense_3.weight_lora_a", "dense_3.weight_lora_b"]
    assert bytes(reader.fields["adapter.type"].parts[-1]).decode() == "lora"
    fresh = g.ggml_load_model(base_file, backend="cpu")
    g.ggml_add_lora(fresh, rank=2, targets=["dense_1"])      # the file's adapters replace these
    fresh = g.ggml_load_lora(fresh, tmp_path / "adapter.gguf")
    np.testing.assert_array_equal(g.ggml_predict(fresh, x[1400:]), expected)
    assert [layer.trainable for layer in fresh.layers] == [False, True, True]   # only the adapters train
    g.ggml_fit(fresh, x[:64], y[:64], epochs=1, batch_size=32, verbose=0)       # quantized dense_1: frozen
    g.ggml_save_model(model, tmp_path / "whole.gguf")                 # one file: base and adapters
    whole = g.ggml_load_model(tmp_path / "whole.gguf", backend="cpu")
    np.testing.assert_array_equal(g.ggml_predict(whole, x[1400:]), expected)
    assert sorted(whole.runtime.opt_state.trainable()) == sorted(model.runtime.opt_state.trainable())


def test_merging_adds_the_low_rank_product_to_the_weights(base_file, digits):
    _, x, y = digits
    model = g.ggml_load_model(base_file, backend="cpu")
    g.ggml_add_lora(model, rank=4, alpha=8)
    g.ggml_fit(model, x[:640], (y[:640] + 1) % 10, epochs=2, batch_size=32, verbose=0)
    w = g.ggml_get_weights(model)
    adapted = g.ggml_predict(model, x[1400:])
    h = x[1400:].astype(np.float64)
    for i, last in ((1, False), (2, False), (3, True)):
        merged = w[f"dense_{i}.weight"] + 2.0 * w[f"dense_{i}.weight_lora_a"].T @ w[f"dense_{i}.weight_lora_b"].T
        h = h @ merged + w[f"dense_{i}.bias"]
        h = np.exp(h - h.max(1, keepdims=True)) / np.exp(h - h.max(1, keepdims=True)).sum(1, keepdims=True) \
            if last else np.maximum(h, 0)
    exact = g.ggml_merge_lora(g.ggml_load_lora(g.ggml_load_model(base_file, backend="cpu"), _saved(model)),
                              dequantize=True)
    assert g.ggml_model_quantization(exact) == {} and not model.runtime.params.quantized == {}
    np.testing.assert_allclose(g.ggml_predict(exact, x[1400:]), h, atol=1e-5)
    g.ggml_merge_lora(model)                                              # back into q8_0
    assert g.ggml_model_quantization(model) == {f"dense_{i}.weight": "q8_0" for i in (1, 2, 3)}
    assert not any("_lora_" in k for k in g.ggml_get_weights(model))
    assert np.abs(g.ggml_predict(model, x[1400:]) - adapted).max() < 0.05
    assert (g.ggml_predict(model, x[1400:]).argmax(1) == adapted.argmax(1)).mean() >= 0.98


def test_adapters_on_attention_factor_each_projection_as_the_layer_multiplies_it():
    """An adapter's product equals the merged weight's (W + alpha / rank * A B in the weight's own layout) for
    each of attention's four kernels, whose products reshape them differently ([D, K, H] -> [D, H*K] for the
    projections, [K, H, D] -> [H*K, D] for the output)."""
    rng = np.random.default_rng(5)
    np.random.seed(5)
    tokens = g.ggml_input(shape=(12,), dtype="int32")
    h = g.ggml_layer_embedding(tokens, 30, 32)
    h = g.ggml_layer_add([h, g.ggml_layer_multi_head_attention(h, num_heads=2, key_dim=16)])
    m = g.ggml_model(tokens, g.ggml_layer_dense(h, 30, activation="softmax"))
    m = g.ggml_compile(m, loss="sparse_categorical_crossentropy", backend="cpu")
    ids = rng.integers(0, 30, size=(6, 12)).astype(np.int32)
    g.ggml_add_lora(m, rank=4, alpha=8)
    adapted = sorted(k for k in g.ggml_get_weights(m) if k.endswith("_lora_a"))
    assert sorted(k.split(".")[1] for k in adapted) == sorted(["key_kernel_lora_a", "output_kernel_lora_a",
                                                          "query_kernel_lora_a", "value_kernel_lora_a",
                                                          "weight_lora_a"])
    g.ggml_set_weights(m, {k: 0.2 * rng.normal(size=v.shape).astype(np.float32)
                           for k, v in g.ggml_get_weights(m).items() if "_lora_" in k})
    with_adapters = g.ggml_predict(m, ids)
    g.ggml_merge_lora(m)
    np.testing.assert_allclose(g.ggml_predict(m, ids), with_adapters, atol=1e-5)


def _saved(model):
    import tempfile
    path = tempfile.mkdtemp() + "/adapter.gguf"
    g.ggml_save_lora(model, path)
    return path


def test_adapters_refuse_what_they_cannot_do(tmp_path, base_file):
    model = g.ggml_load_model(base_file, backend="cpu")
    for alpha in (float("inf"), float("nan"), 0.0, -1.0, True):
        with pytest.raises((g.GgmlValueError, g.GgmlTypeError), match="alpha"):
            g.ggml_add_lora(model, alpha=alpha)
    with pytest.raises(g.GgmlValueError, match="name no weight an adapter can go on"):
        g.ggml_add_lora(model, targets=["dense_9"])
    with pytest.raises(g.GgmlValueError, match="name no weight an adapter can go on"):
        g.ggml_add_lora(model, targets=["dense_1.bias"])
    with pytest.raises(g.GgmlValueError, match="no adapters"):
        g.ggml_save_lora(model, tmp_path / "a.gguf")
    with pytest.raises(g.GgmlValueError, match="no adapters to merge"):
        g.ggml_merge_lora(model)
    with pytest.raises(g.GgmlValueError, match="holds no adapters"):
        g.ggml_load_lora(model, base_file)
    g.ggml_add_lora(model, rank=2, targets=["dense_3"])
    with pytest.raises(g.GgmlValueError, match="have adapters already"):       # trained factors are not dropped
        g.ggml_add_lora(model, rank=4, targets=["dense_3.weight"])
    g.ggml_save_lora(model, tmp_path / "a.gguf")
    reader_meta = g.gguf_read(tmp_path / "a.gguf")[1]
    tensors = g.gguf_read(tmp_path / "a.gguf")[0]
    # damaged metadata: the same tensors with a NaN alpha, a bool alpha, a rank of 0
    ctx = g.ggml_init(mem_size=1 << 20, no_alloc=False)
    named = {}
    for name, value in tensors.items():
        t = g.ggml_new_tensor(ctx, g.GGML_TYPE_F32, value.ndim, tuple(reversed(value.shape)))
        g.ggml_backend_tensor_set_data(t, value)
        named[name] = t
    for bad in ('{"dense_3.weight": [2, NaN]}', '{"dense_3.weight": [2, true]}', '{"dense_3.weight": [0, 4.0]}'):
        g.ggml_save_weights_gguf(tmp_path / "bad.gguf", named, {**reader_meta, "ggmlpy.lora": bad})
        with pytest.raises(g.GgufFileError, match="damaged adapter metadata"):
            g.ggml_load_lora(model, tmp_path / "bad.gguf")
    ctx.free()
    conv = g.ggml_model_sequential()
    conv = g.ggml_layer_conv_2d(conv, 4, (3, 3), input_shape=(8, 8, 1))
    conv = g.ggml_compile(conv, loss="mse", backend="cpu")
    with pytest.raises(g.GgmlValueError, match="no weight an adapter can go on"):
        g.ggml_add_lora(conv)
    # every refusal left the model as it was: quantized, with the one adapter added above, of rank 2
    assert g.ggml_model_quantization(model) == {f"dense_{i}.weight": "q8_0" for i in (1, 2, 3)}
    w = g.ggml_get_weights(model)
    assert sorted(k for k in w if "_lora_" in k) == ["dense_3.weight_lora_a", "dense_3.weight_lora_b"]
    assert w["dense_3.weight_lora_a"].shape == (2, 64)


def test_a_layer_that_reads_an_adapted_weight_around_its_adapter_is_refused():
    class PlainDense(g.Layer):   # multiplies its kernel through product_weight: an adapter would be ignored
        kernel = g.Weight(quantizable="product")

        def __init__(self, units, **kw):
            super().__init__(**kw)
            self.units = units

        def output_shape(self, shapes):
            return shapes[0][:-1] + (self.units,)

        def make_params(self, shapes):
            return [self.kernel.spec((shapes[0][-1], self.units), (shapes[0][-1], self.units))]

        def forward(self, g_, xs, shapes):
            return g.ggml_mul_mat(g_.ctx, g_.product_weight(self, self.kernel), xs[0])
    m = g.ggml_apply(g.ggml_model_sequential(), PlainDense(4, input_shape=(8,)))
    m = g.ggml_compile(m, loss="mse", backend="cpu")
    g.ggml_add_lora(m, rank=2)
    with pytest.raises(g.GgmlValueError, match="does not multiply them through g.product"):
        g.ggml_predict(m, np.zeros((2, 8), np.float32))
