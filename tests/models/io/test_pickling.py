"""Models through pickle and copy.deepcopy (models/io/pickling.py): the copy predicts identically, its next fit
continues the same optimizer trajectory, and a spawn worker of a process pool can take one and send it back."""
from __future__ import annotations

import concurrent.futures
import copy
import multiprocessing
import pickle

import numpy as np
import pytest

import ggmlpy as g


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    return x, np.eye(3, dtype=np.float32)[rng.integers(0, 3, 32)]


def _trained(backend="cpu"):
    np.random.seed(3)
    m = g.ggml_model_sequential()
    g.ggml_layer_dense(m, 8, activation="tanh", input_shape=(4,))
    g.ggml_layer_dense(m, 3, activation="softmax")
    g.ggml_compile(m, backend=backend, learning_rate=0.01)
    x, y = _data()
    g.ggml_fit(m, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    return m


def _flat(state, prefix=""):
    """The optimizer state's nested dict of arrays as {"m.dense_1.weight": array, "iter": array, ...}."""
    out = {}
    for k, v in state.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: np.asarray(v)})
    return out


def _joblib_round_trip(m, folder):
    joblib = pytest.importorskip("joblib")
    path = folder / "model.joblib"
    joblib.dump(m, path)
    return joblib.load(path)


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "joblib"])
def test_a_compiled_models_copy_predicts_identically_and_trains_on_the_same_trajectory(how, each_device, tmp_path):
    m = _trained(each_device)
    twin = {"pickle": lambda: pickle.loads(pickle.dumps(m)), "deepcopy": lambda: copy.deepcopy(m),
            "joblib": lambda: _joblib_round_trip(m, tmp_path)}[how]()
    assert twin is not m and twin.runtime is not m.runtime
    assert twin.compiled.backend == m.compiled.backend == each_device
    for k, v in g.ggml_get_weights(m).items():
        np.testing.assert_array_equal(g.ggml_get_weights(twin)[k], v)
    want, got = _flat(m.runtime.opt_state.state), _flat(twin.runtime.opt_state.state)  # AdamW's moments, step count
    assert sorted(got) == sorted(want) and int(want["iter"]) == 2 * 4 + 1 and len(want) > 1
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    x, y = _data()
    np.testing.assert_array_equal(g.ggml_predict(twin, x), g.ggml_predict(m, x))
    # AdamW's moments and step count travel too: the next epochs are those of the original
    h1 = g.ggml_fit(m, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    h2 = g.ggml_fit(twin, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    np.testing.assert_array_equal(h2["train_loss"], h1["train_loss"])
    for k, v in g.ggml_get_weights(m).items():
        np.testing.assert_array_equal(g.ggml_get_weights(twin)[k], v)


@pytest.mark.parametrize("how", ["deepcopy", "save"])
def test_a_snapshot_taken_by_a_callback_resumes_the_fit_exactly(how, tmp_path):
    """A copy (or a file with include_optimizer=True) made by a callback during a fit paired the epoch's weights
    with the optimizer state of the fit's start: resuming from it was not the fit's next epoch. Now it carries the
    running optimizer's state, and its next epoch is the fit's."""
    m = _trained()
    x, y = _data()
    snaps = []

    def snapshot(epoch, logs, state):
        if epoch == 2:   # after the second of four epochs (callbacks count epochs from 1)
            if how == "deepcopy":
                snaps.append(copy.deepcopy(m))
            else:
                g.ggml_save_model(m, tmp_path / "mid.gguf", include_optimizer=True)
                snaps.append(g.ggml_load_model(tmp_path / "mid.gguf", backend="cpu"))
    h = g.ggml_fit(m, x, y, epochs=4, batch_size=8, shuffle=False, verbose=0,
                   callbacks=[{"on_epoch_end": snapshot}])
    resumed = g.ggml_fit(snaps[0], x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    np.testing.assert_allclose(resumed["train_loss"], h["train_loss"].iloc[2:], rtol=1e-6)
    for k, v in g.ggml_get_weights(m).items():
        np.testing.assert_allclose(g.ggml_get_weights(snaps[0])[k], v, rtol=1e-5, atol=1e-7)


def test_the_copy_is_independent_of_the_original():
    m = _trained()
    twin = copy.deepcopy(m)
    before = g.ggml_get_weights(m)
    x, y = _data()
    g.ggml_fit(twin, x, y, epochs=1, verbose=0)
    for k, v in g.ggml_get_weights(m).items():
        np.testing.assert_array_equal(v, before[k])


def test_an_uncompiled_model_pickles_as_its_layers_and_the_weights_they_carry():
    m = _trained()
    trained = g.ggml_get_weights(m)
    g.ggml_pop_layer(m)      # uncompiled now; its layers keep the trained weights
    twin = pickle.loads(pickle.dumps(m))
    assert twin.runtime is None and [layer.name for layer in twin.layers] == ["dense_1"]
    g.ggml_compile(twin, loss="mse", backend="cpu")
    np.testing.assert_array_equal(g.ggml_get_weights(twin)["dense_1.weight"], trained["dense_1.weight"])


def test_a_model_with_a_live_trainer_is_refused():
    m = _trained()
    x, y = _data()
    tr = g.ggml_trainer(m, batch_size=8)
    tr.step(x[:8], y[:8])
    with pytest.raises(g.GgmlInUseError, match="ggml_trainer of this model is live"):
        pickle.dumps(m)
    tr.free()
    assert pickle.loads(pickle.dumps(m)).runtime is not None


def _fit_in_worker(model, x, y):
    g.ggml_fit(model, x, y, epochs=1, batch_size=8, shuffle=False, verbose=0)
    return model


def test_a_spawn_worker_of_a_process_pool_takes_a_model_and_sends_it_back():
    m = _trained()
    x, y = _data()
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        back = pool.submit(_fit_in_worker, m, x, y).result(timeout=120)
    g.ggml_fit(m, x, y, epochs=1, batch_size=8, shuffle=False, verbose=0)   # the same epoch here
    for k, v in g.ggml_get_weights(m).items():
        np.testing.assert_allclose(g.ggml_get_weights(back)[k], v, rtol=0, atol=1e-6)
