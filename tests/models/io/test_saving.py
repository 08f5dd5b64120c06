"""Saving and loading models and weights in GGUF."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g


def cnn():
    np.random.seed(5)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_conv_2d(m, 4, (3, 3), activation="relu", padding="same", input_shape=(6, 6, 2))
    m = g.ggml_layer_batch_norm(m)
    m = g.ggml_layer_max_pooling_2d(m, (2, 2))
    m = g.ggml_layer_flatten(m)
    m = g.ggml_layer_dropout(m, 0.25)
    m = g.ggml_layer_dense(m, 3, activation="softmax")
    return g.ggml_compile(m, loss="sparse_categorical_crossentropy", backend="cpu", learning_rate=0.01)


def functional():
    np.random.seed(6)
    a = g.ggml_input(shape=(5,), name="a")
    t = g.ggml_input(shape=(4,), dtype="int32", name="tokens")
    e = g.ggml_layer_flatten(g.ggml_layer_embedding(t, 10, 3))
    h = g.ggml_layer_concatenate([g.ggml_layer_dense(a, 4, activation="relu"), e])
    out = g.ggml_layer_dense(h, 2, activation="softmax")
    return g.ggml_compile(g.ggml_model([a, t], out), backend="cpu")


def data(n=12):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 6, 6, 2)).astype(np.float32), rng.integers(0, 3, n)


def test_model_roundtrip_predicts_identically_and_trains_on(tmp_path):
    m = cnn()
    x, y = data()
    g.ggml_fit(m, x, y, epochs=2, batch_size=4, verbose=0)      # batch-norm statistics move too
    path = tmp_path / "model.gguf"
    g.ggml_save_model(m, path)
    loaded = g.ggml_load_model(path, backend="cpu")
    assert [layer.name for layer in loaded.layers] == [layer.name for layer in m.layers]
    np.testing.assert_array_equal(g.ggml_predict(loaded, x), g.ggml_predict(m, x))
    assert loaded.compiled.heads[0].loss == "sparse_categorical_crossentropy"
    h = g.ggml_fit(loaded, x, y, epochs=3, batch_size=4, verbose=0)
    assert np.isfinite(h["train_loss"]).all()
    assert not np.array_equal(g.ggml_predict(loaded, x), g.ggml_predict(m, x))


def test_pooling_resampling_and_shaping_layers_roundtrip(tmp_path):
    """Every weightless layer of issue 26 keeps its arguments through a save and a load."""
    x_img = g.ggml_input((6, 8, 2), name="img")
    a = g.ggml_layer_conv_2d(x_img, 3, (3, 3), padding="same", name="c")
    a = g.ggml_layer_average_pooling_2d(a, (2, 2), strides=(2, 1))
    a = g.ggml_layer_upsampling_2d(a, (1, 2))
    a = g.ggml_layer_global_max_pooling_2d(a)
    x_seq = g.ggml_input((12, 3), name="seq")
    b = g.ggml_layer_conv_1d(x_seq, 4, 3, name="c1")
    b = g.ggml_layer_max_pooling_1d(b, 3, strides=2)
    b = g.ggml_layer_average_pooling_1d(b, 2)
    b = g.ggml_layer_activation(b, "tanh")
    b = g.ggml_layer_reshape(b, (-1,))
    b = g.ggml_layer_dense(b, 3, name="d")
    c = g.ggml_layer_repeat_vector(g.ggml_layer_add([a, b]), 4)
    c = g.ggml_layer_concatenate([g.ggml_layer_global_average_pooling_1d(c), g.ggml_layer_global_max_pooling_1d(c)])
    m = g.ggml_compile(g.ggml_model([x_img, x_seq], c), loss="mse", backend="cpu")
    rng = np.random.default_rng(2)
    x = [rng.normal(size=(5, 6, 8, 2)).astype(np.float32), rng.normal(size=(5, 12, 3)).astype(np.float32)]
    g.ggml_save_model(m, tmp_path / "layers.gguf")
    loaded = g.ggml_load_model(tmp_path / "layers.gguf", backend="cpu")
    assert [layer.kind for layer in loaded.layers] == [layer.kind for layer in m.layers]
    np.testing.assert_array_equal(g.ggml_predict(loaded, x), g.ggml_predict(m, x))


def test_functional_roundtrip(tmp_path):
    m = functional()
    rng = np.random.default_rng(1)
    x = [rng.normal(size=(6, 5)), rng.integers(0, 10, (6, 4))]
    g.ggml_save_model(m, tmp_path / "f.gguf")
    loaded = g.ggml_load_model(tmp_path / "f.gguf", backend="cpu")
    np.testing.assert_array_equal(g.ggml_predict(loaded, x), g.ggml_predict(m, x))


def test_weights_roundtrip_and_architecture_mismatch(tmp_path):
    m = cnn()
    x, y = data()
    path = tmp_path / "w.gguf"
    g.ggml_save_weights(m, path)
    other = cnn()
    g.ggml_fit(other, x, y, epochs=1, batch_size=4, verbose=0)
    assert g.ggml_load_weights(other, path) is other
    np.testing.assert_array_equal(g.ggml_predict(other, x), g.ggml_predict(m, x))
    wrong = g.ggml_model_sequential()
    wrong = g.ggml_layer_conv_2d(wrong, 5, (3, 3), input_shape=(6, 6, 2))
    wrong = g.ggml_compile(g.ggml_layer_dense(g.ggml_layer_flatten(wrong), 3), backend="cpu")
    before = g.ggml_get_weights(wrong)
    with pytest.raises(ValueError, match="conv_2d_1.kernel"):
        g.ggml_load_weights(wrong, path)
    for k, v in g.ggml_get_weights(wrong).items():   # nothing was loaded
        np.testing.assert_array_equal(v, before[k])
    with pytest.raises(ValueError, match="weights-only"):
        g.ggml_load_model(path)


def test_missing_file_and_uncompiled(tmp_path):
    with pytest.raises(FileNotFoundError):
        g.ggml_load_model(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError):
        g.ggml_load_weights(cnn(), tmp_path / "nope.gguf")


def test_files_are_plain_gguf_readable_by_the_gguf_package(tmp_path):
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf)")
    m = cnn()
    path = tmp_path / "model.gguf"
    g.ggml_save_model(m, path)
    reader = gguf.GGUFReader(str(path))
    names = [t.name for t in reader.tensors]
    assert names[:2] == ["conv_2d_1.kernel", "conv_2d_1.bias"]
    kernel = next(t for t in reader.tensors if t.name == "conv_2d_1.kernel")
    keras = g.ggml_get_weights(m)["conv_2d_1.kernel"]            # (rows, cols, in, filters)
    data = np.asarray(kernel.data).reshape(4, 2, 3, 3)             # ggml [KW, KH, Cin, Cout] as numpy
    np.testing.assert_array_equal(data, np.transpose(keras, (3, 2, 0, 1)))
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "ggmlpy"


# ---------------------------------------------------------------- full resume (include_optimizer=True)



@pytest.fixture
def backend(each_device):
    """"cpu", or a GPU device (skipped, saying why, when it is not built or there is no device)."""
    return each_device


def mlp(backend="cpu", optimizer="adam"):
    np.random.seed(11)                 # the same initial weights for every run
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 16, activation="tanh", input_shape=(5,))
    m = g.ggml_layer_dense(m, 3, activation="softmax")
    return g.ggml_compile(m, optimizer=optimizer, loss="sparse_categorical_crossentropy", backend=backend,
                          learning_rate=0.01)


def mlp_data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(32, 5)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(int) + (x[:, 2] > 1).astype(int)


def fit(m, epochs, initial_epoch=0, **kw):
    x, y = mlp_data()                  # in order (shuffle off): every run sees the same batches
    return g.ggml_fit(m, x, y, epochs=epochs, batch_size=8, shuffle=False, verbose=0, initial_epoch=initial_epoch,
                      **kw)


def weights_of(m):
    return {k: v.copy() for k, v in g.ggml_get_weights(m).items()}


def max_diff(a, b):
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def resumed_vs_straight(backend, path, include_optimizer):
    straight = mlp(backend)
    h_straight = fit(straight, 4)
    first = mlp(backend)
    h1 = fit(first, 2)
    g.ggml_save_model(first, path, include_optimizer=include_optimizer)
    loaded = g.ggml_load_model(path, backend=backend)
    h2 = fit(loaded, 2, initial_epoch=2)
    losses = np.concatenate([h1["train_loss"], h2["train_loss"]])
    return h_straight["train_loss"].to_numpy(), losses, weights_of(straight), weights_of(loaded)


def test_saved_optimizer_state_resumes_the_uninterrupted_trajectory(backend, tmp_path):
    """2 epochs + save(include_optimizer=True) + load + 2 epochs == 4 epochs without a stop: the losses of every
    epoch and the final weights, to float tolerance (AdamW's moments and step count were saved and restored)."""
    straight, resumed, w_straight, w_resumed = resumed_vs_straight(backend, tmp_path / "ckpt.gguf", True)
    np.testing.assert_allclose(resumed, straight, rtol=1e-5, atol=1e-7)
    assert max_diff(w_resumed, w_straight) < 1e-5
    # the same without the optimizer: a warm restart (zero moments, bias correction from step 1) leaves the path
    straight, warm, _, w_warm = resumed_vs_straight(backend, tmp_path / "warm.gguf", False)
    assert np.abs(warm[2:] - straight[2:]).max() > 1e-4
    assert max_diff(w_warm, w_straight) > 1e-3


def test_two_fits_continue_one_optimizer_and_compile_starts_it_afresh():
    straight = mlp()
    h = fit(straight, 4)
    twice = mlp()
    h1, h2 = fit(twice, 2), fit(twice, 2, initial_epoch=2)
    np.testing.assert_allclose(np.concatenate([h1["train_loss"], h2["train_loss"]]), h["train_loss"], rtol=1e-5)
    assert max_diff(weights_of(twice), weights_of(straight)) < 1e-5
    assert twice.runtime.opt_state.state["iter"] == 4 * 4 + 1          # 4 epochs of 4 steps
    g.ggml_compile(twice, loss="sparse_categorical_crossentropy", backend="cpu", learning_rate=0.01)
    assert twice.runtime.opt_state.state is None                       # weights kept, optimizer afresh


def test_an_interrupted_fit_keeps_the_state_of_its_completed_steps():
    def stop(epoch, logs, state):
        if epoch == 2:
            raise KeyboardInterrupt
    m = mlp()
    with pytest.raises(KeyboardInterrupt):
        fit(m, 4, callbacks=[{"on_epoch_end": stop}])
    assert m.runtime.opt_state.state["iter"] == 2 * 4 + 1
    fit(m, 2, initial_epoch=2)
    straight = mlp()
    fit(straight, 4)
    assert max_diff(weights_of(m), weights_of(straight)) < 1e-5


def test_a_fit_ending_inside_a_logical_batch_warns():
    m = mlp()
    x, y = mlp_data()
    with pytest.warns(g.GgmlpyWarning, match="1 batches into a logical batch of 2"):
        g.ggml_fit(m, x[:24], y[:24], epochs=1, batch_size=8, shuffle=False, verbose=0, nbatch_logical=16)
    assert m.runtime.opt_state.state["iter"] == 2


def test_optimizer_state_file_contents_and_loading_rules(tmp_path):
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf)")
    m = mlp()
    fit(m, 1)
    path = tmp_path / "ckpt.gguf"
    g.ggml_save_model(m, path, include_optimizer=True)
    reader = gguf.GGUFReader(str(path))               # plain GGUF: the moments are F32 tensors
    names = [t.name for t in reader.tensors]
    assert names[:4] == ["dense_1.weight", "dense_1.bias", "dense_2.weight", "dense_2.bias"]
    assert "optimizer.m.dense_1.weight" in names and "optimizer.v.dense_2.bias" in names
    m_w = next(t for t in reader.tensors if t.name == "optimizer.m.dense_1.weight")
    state = m.runtime.opt_state.state
    np.testing.assert_array_equal(np.asarray(m_w.data).reshape(16, 5), state["m"]["dense_1.weight"])
    kind = reader.fields["ggmlpy.optimizer.type"]
    assert bytes(kind.parts[kind.data[0]]).decode() == "adamw"
    assert int(reader.fields["ggmlpy.optimizer.iter"].parts[-1][0]) == 5
    assert float(reader.fields["ggmlpy.optimizer.beta2"].parts[-1][0]) == pytest.approx(0.999)

    # weights only (the default of ggml_load_weights): the moments are ignored, the model's state kept
    other = mlp()
    g.ggml_load_weights(other, path)
    assert other.runtime.opt_state.state is None
    assert max_diff(weights_of(other), weights_of(m)) == 0
    g.ggml_load_weights(other, path, include_optimizer=True)
    assert other.runtime.opt_state.state["iter"] == 5
    # ggml_load_model(include_optimizer=False): a warm restart on purpose
    assert g.ggml_load_model(path, backend="cpu", include_optimizer=False).runtime.opt_state.state is None

    # an SGD model cannot take AdamW moments; another architecture is refused; nothing is loaded either way
    sgd = mlp(optimizer="sgd")
    before = weights_of(sgd)
    with pytest.raises(ValueError, match="compiled with sgd"):
        g.ggml_load_weights(sgd, path, include_optimizer=True)
    assert max_diff(weights_of(sgd), before) == 0 and sgd.runtime.opt_state.state is None
    g.ggml_load_weights(sgd, path)                    # the weights alone load into it
    wrong = g.ggml_model_sequential()
    wrong = g.ggml_layer_dense(wrong, 7, input_shape=(5,))
    wrong = g.ggml_compile(g.ggml_layer_dense(wrong, 3), backend="cpu")
    with pytest.raises(ValueError, match="dense_1.weight"):
        g.ggml_load_weights(wrong, path, include_optimizer=True)
    assert wrong.runtime.opt_state.state is None
    plain = tmp_path / "plain.gguf"
    g.ggml_save_model(m, plain)
    with pytest.raises(ValueError, match="no optimizer state"):
        g.ggml_load_weights(other, plain, include_optimizer=True)

    # an untrained model saves the fresh state; SGD saves its step count
    fresh = tmp_path / "fresh.gguf"
    g.ggml_save_model(mlp(), fresh, include_optimizer=True)
    st = g.ggml_load_model(fresh, backend="cpu").runtime.opt_state.state
    assert st["iter"] == 1 and not any(v.any() for v in st["m"].values())
    fit(sgd, 1)
    g.ggml_save_model(sgd, tmp_path / "sgd.gguf", include_optimizer=True)
    st = g.ggml_load_model(tmp_path / "sgd.gguf", backend="cpu").runtime.opt_state.state
    assert st["optimizer"] == "sgd" and st["iter"] == 5 and st["m"] == {}


# ---------------------------------------------------------------- files that must not load silently

def _rewrite(src, dst, tensors=None, meta=None, order=None):
    """Copy a ggmlpy GGUF file with the ``gguf`` package (an independent writer), changing tensors or metadata."""
    gguf = pytest.importorskip("gguf")
    t, m = g.gguf_read(src)
    t.update(tensors or {})
    m.update(meta or {})
    w = gguf.GGUFWriter(str(dst), m.pop("general.architecture"))
    for k, v in m.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, (int, np.integer)):
            w.add_int64(k, int(v))
        elif isinstance(v, float):
            w.add_float64(k, v)
        else:
            w.add_array(k, list(v))
    for name in order or list(t):
        w.add_tensor(name, t[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _dense(units_in, units_out, **kw):
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, units_out, input_shape=(units_in,), use_bias=False, **kw)
    return g.ggml_compile(m, loss="mse", backend="cpu")


def _conv(cin, filters):
    m = g.ggml_model_sequential()
    m = g.ggml_layer_conv_2d(m, filters, (3, 3), use_bias=False, input_shape=(5, 5, cin))
    return g.ggml_compile(m, loss="mse", backend="cpu")


@pytest.mark.parametrize("save, load", [
    (lambda: _conv(1, 4), lambda: _conv(4, 1)),     # (3,3,1,4) and (3,3,4,1): same count, 1-axes elsewhere
    (lambda: _dense(1, 4), lambda: _dense(4, 1)),   # (1,4) and (4,1)
])
def test_weights_of_another_shape_are_refused_even_with_the_same_count(tmp_path, save, load):
    g.ggml_save_weights(save(), tmp_path / "w.gguf")
    target = load()
    before = g.ggml_get_weights(target)
    with pytest.raises(ValueError, match="has shape"):
        g.ggml_load_weights(target, tmp_path / "w.gguf")
    assert all(np.array_equal(v, g.ggml_get_weights(target)[k]) for k, v in before.items())


def test_a_weight_of_another_kind_is_refused_when_matched_in_order(tmp_path):
    """Names differ (another model), so weights go in order; a conv_1d kernel of size 1 holds exactly a dense
    weight's values, but it is not a 'weight'."""
    m = g.ggml_model_sequential()
    m = g.ggml_layer_conv_1d(m, 3, 1, use_bias=False, input_shape=(1, 4))
    g.ggml_save_weights(g.ggml_compile(m, loss="mse", backend="cpu"), tmp_path / "c.gguf")
    with pytest.raises(ValueError, match="is not a 'weight'"):
        g.ggml_load_weights(_dense(4, 3), tmp_path / "c.gguf")


def test_weights_are_matched_by_name_whatever_their_order_in_the_file(tmp_path):
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 4, input_shape=(4,))
    m = g.ggml_compile(g.ggml_layer_layer_norm(m), loss="mse", backend="cpu")
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    g.ggml_fit(m, x, x, epochs=3, verbose=0)          # gamma and beta move away from 1 and 0
    g.ggml_save_weights(m, tmp_path / "w.gguf")
    names = list(g.gguf_read(tmp_path / "w.gguf")[0])
    swapped = _rewrite(tmp_path / "w.gguf", tmp_path / "s.gguf", order=names[:2] + names[:1:-1])
    assert list(g.gguf_read(swapped)[0]) != names
    other = g.ggml_model_sequential()
    other = g.ggml_layer_dense(other, 4, input_shape=(4,))
    other = g.ggml_compile(g.ggml_layer_layer_norm(other), loss="mse", backend="cpu")
    g.ggml_load_weights(other, swapped)
    np.testing.assert_array_equal(g.ggml_predict(other, x), g.ggml_predict(m, x))


def test_float_weights_of_other_types_are_converted_and_integers_refused(tmp_path):
    m = _dense(3, 2)
    g.ggml_save_weights(m, tmp_path / "w.gguf")
    w = g.gguf_read(tmp_path / "w.gguf")[0]["dense_1.weight"]
    half = _rewrite(tmp_path / "w.gguf", tmp_path / "h.gguf", {"dense_1.weight": w.astype(np.float16)})
    g.ggml_load_weights(m, half)
    np.testing.assert_array_equal(g.ggml_get_weights(m)["dense_1.weight"].T, w.astype(np.float16).astype(np.float32))
    ints = _rewrite(tmp_path / "w.gguf", tmp_path / "i.gguf", {"dense_1.weight": np.ones(w.shape, np.int32)})
    with pytest.raises(ValueError, match="holds int32 values"):
        g.ggml_load_weights(m, ints)


def test_a_model_file_is_checked_against_its_architecture_before_any_weight_is_allocated(tmp_path, monkeypatch):
    """An 832-byte file whose description asks for 50 million units allocated gigabytes before the check."""
    import json
    m = _dense(3, 2)
    g.ggml_save_model(m, tmp_path / "m.gguf")
    arch = json.loads(g.gguf_read(tmp_path / "m.gguf")[1]["ggmlpy.model"])
    arch["layers"][0]["units"] = 50_000_000
    bomb = _rewrite(tmp_path / "m.gguf", tmp_path / "bomb.gguf", meta={"ggmlpy.model": json.dumps(arch)})
    from ggmlpy.models.engine import compile as C

    def no_runtime(*a, **k):
        raise AssertionError("weights were allocated before the file was checked")
    monkeypatch.setattr(C, "Runtime", no_runtime)
    with pytest.raises(ValueError, match="has shape"):
        g.ggml_load_model(bomb)


@pytest.mark.parametrize("meta, text", [
    ({"ggmlpy.format_version": 99}, "format version 99"),
    ({"ggmlpy.optimizer.type": "adamw", "ggmlpy.optimizer.iter": "abc"}, "optimizer.iter must be an int"),
])
def test_damaged_or_newer_files_say_so(tmp_path, meta, text):
    m = _dense(3, 2)
    g.ggml_save_model(m, tmp_path / "m.gguf", include_optimizer=True)
    bad = _rewrite(tmp_path / "m.gguf", tmp_path / "bad.gguf", meta=meta)
    with pytest.raises(OSError if "version" in text else (OSError, ValueError), match=text):
        g.ggml_load_model(bad)


def test_include_optimizer_must_be_a_bool_when_loading(tmp_path):
    m = _dense(3, 2)
    g.ggml_save_model(m, tmp_path / "m.gguf")
    with pytest.raises(TypeError, match="include_optimizer"):
        g.ggml_load_model(tmp_path / "m.gguf", include_optimizer="no")
    with pytest.raises(TypeError, match="include_optimizer"):
        g.ggml_load_weights(m, tmp_path / "m.gguf", include_optimizer="no")


def test_optimizer_state_and_a_live_trainer(tmp_path):
    """A live trainer holds the newest optimizer state: ggml_save_model(include_optimizer=True) saved the model's
    older copy, and ggml_load_weights(include_optimizer=True) was overwritten when the trainer was freed."""
    np.random.seed(0)
    m = _dense(3, 2)
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    tr = g.ggml_trainer(m, batch_size=4)
    tr.step(x, x[:, :2])
    with pytest.raises(g.GgmlInUseError, match="tr.save"):
        g.ggml_save_model(m, tmp_path / "m.gguf", include_optimizer=True)
    tr.save(tmp_path / "t.gguf")
    with pytest.raises(g.GgmlInUseError, match="free the trainer"):
        g.ggml_load_weights(m, tmp_path / "t.gguf", include_optimizer=True)
    g.ggml_save_model(m, tmp_path / "w.gguf")        # without the optimizer state: fine
    tr.free()
    g.ggml_save_model(m, tmp_path / "m.gguf", include_optimizer=True)
    assert g.gguf_read(tmp_path / "m.gguf")[1]["ggmlpy.optimizer.iter"] == 2


def test_a_failed_save_keeps_the_file_that_was_there(tmp_path):
    """ggml does not check its last writes: over a file size limit the save returned normally and left a
    truncated file in place of the good one."""
    from tests.helpers.subprocesses import run_in_subprocess
    path = tmp_path / "m.gguf"
    m = _dense(64, 64)
    g.ggml_save_model(m, path)
    good = path.read_bytes()
    rc, out, err = run_in_subprocess(f"""
import resource, signal, numpy as np, ggmlpy as g
m = g.ggml_model_sequential()
m = g.ggml_compile(g.ggml_layer_dense(m, 64, input_shape=(64,), use_bias=False), loss="mse", backend="cpu")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))
try:
    g.ggml_save_model(m, {str(path)!r})
    print("saved")
except OSError as e:
    print("refused:", e)
""")
    assert rc == 0 and "refused:" in out, (out, err)
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]       # no temporary file left behind
    assert g.ggml_predict(g.ggml_load_model(path), np.ones((1, 64), np.float32)).shape == (1, 64)


def test_a_file_name_of_the_longest_legal_length_saves(tmp_path):
    """The temporary file beside it used to add '.<name>.XXXX.tmp' and pass 255 bytes."""
    m = mlp()
    for stem in ("a" * 240, "é" * 125):
        path = tmp_path / (stem + ".gguf")
        assert len(path.name.encode()) <= 255
        g.ggml_save_model(m, str(path))
        np.testing.assert_array_equal(g.ggml_get_weights(g.ggml_load_model(str(path)))["dense_1.weight"],
                                      g.ggml_get_weights(m)["dense_1.weight"])
