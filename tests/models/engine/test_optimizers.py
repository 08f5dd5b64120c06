"""Keras' optimizers in ggml_compile (SGD with momentum and Nesterov, RMSprop, Adagrad) and gradient clipping
(clipnorm, global_clipnorm, clipvalue), which run as ggml graphs outside ggml-opt: each trajectory against a
float64 numpy implementation of Keras 3's documented update rules, and against Keras itself where it is
installed; on the CPU and on Vulkan (lavapipe in CI); their state saved, loaded, merged across fits."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

import ggmlpy as g


LR = 0.01

CASES = {
    "sgd-momentum": ("sgd", {"momentum": 0.9}),
    "sgd-nesterov": ("sgd", {"momentum": 0.8, "nesterov": True}),
    "rmsprop": ("rmsprop", {}),
    "rmsprop-centered-momentum": ("rmsprop", {"rho": 0.8, "momentum": 0.5, "centered": True, "epsilon": 1e-3}),
    "adagrad": ("adagrad", {}),
    "adagrad-no-start": ("adagrad", {"initial_accumulator_value": 0.0, "epsilon": 1e-4}),
    "adam-clipnorm": ("adam", {"clipnorm": 0.05}),
    "adam-global-clipnorm": ("adam", {"global_clipnorm": 0.05}),
    "sgd-clipvalue": ("sgd", {"clipvalue": 0.02}),
    "rmsprop-clipnorm": ("rmsprop", {"clipnorm": 0.05, "momentum": 0.3}),
}


def keras_step(name: str, s: dict, p: dict, grads: dict, state: dict, lr: float, wd: float = 0.0) -> None:
    """One optimizer step of Keras 3 (keras/src/optimizers: clip, decoupled weight decay, update_step), float64,
    in place. Adam is ggml's AdamW formula (epsilon added to the bias-corrected root), as ggml_compile documents."""
    grads = dict(grads)
    if s.get("clipnorm"):
        for k, gk in grads.items():
            grads[k] = gk * s["clipnorm"] / max(np.sqrt((gk ** 2).sum()), s["clipnorm"])
    if s.get("global_clipnorm"):
        norm = math.sqrt(sum(float((gk ** 2).sum()) for gk in grads.values()))
        grads = {k: gk * s["global_clipnorm"] / max(norm, s["global_clipnorm"]) for k, gk in grads.items()}
    if s.get("clipvalue"):
        grads = {k: np.clip(gk, -s["clipvalue"], s["clipvalue"]) for k, gk in grads.items()}
    state["t"] = state.get("t", 0) + 1
    mu, eps = s.get("momentum", 0.0), s.get("epsilon", 1e-7)
    for k, gk in grads.items():
        def slot(n, start=0.0, k=k):
            return state.setdefault(f"{n} {k}", np.full_like(p[k], start))
        w = p[k] * (1 - lr * wd)
        if name == "sgd":
            if mu:
                m = slot("m")
                m[...] = mu * m - lr * gk
                w = w + (mu * m - lr * gk if s.get("nesterov") else m)
            else:
                w = w - lr * gk
        elif name == "rmsprop":
            rho = s.get("rho", 0.9)
            v = slot("v")
            v[...] = rho * v + (1 - rho) * gk ** 2
            den = v + eps
            if s.get("centered"):
                a = slot("a")
                a[...] = rho * a + (1 - rho) * gk
                den = v - a ** 2 + eps
            inc = lr * gk / np.sqrt(den)
            if mu:
                m = slot("m")
                m[...] = mu * m + inc
                inc = m
            w = w - inc
        elif name == "adagrad":
            acc = slot("acc", s.get("initial_accumulator_value", 0.1))
            acc += gk ** 2
            w = w - lr * gk / np.sqrt(acc + eps)
        else:  # adam, ggml's AdamW
            t = state["t"]
            m, v = slot("m"), slot("v")
            m[...] = 0.9 * m + 0.1 * gk
            v[...] = 0.999 * v + 0.001 * gk ** 2
            w = w - lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        p[k] = w


def _data(n=16, f=4, out=3, seed=11):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, f)).astype(np.float32), rng.normal(size=(n, out)).astype(np.float32)


# the optimizer objects' constructors, by the names ggml_compile takes
MAKERS = {"adam": g.ggml_optimizer_adam, "sgd": g.ggml_optimizer_sgd, "rmsprop": g.ggml_optimizer_rmsprop,
          "adagrad": g.ggml_optimizer_adagrad}


def _linear(backend, name, settings, wd=0.0, seed=0, form="flat"):
    """A linear model compiled with ``name`` and ``settings``: as ggml_compile's flat keywords, or as the
    ggml_optimizer_* object (``form="object"``)."""
    np.random.seed(seed)
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 3, input_shape=(4,), name="d")
    if form == "object":
        return g.ggml_compile(m, optimizer=MAKERS[name](learning_rate=LR, weight_decay=wd, **settings), loss="mse",
                              metrics=[], backend=backend)
    return g.ggml_compile(m, optimizer=name, loss="mse", metrics=[], backend=backend, learning_rate=LR,
                          weight_decay=wd, **settings)


def _reference_linear(w0, x, y, name, settings, steps, batch, wd=0.0, period=1):
    """The numpy trajectory of a linear model under MSE, batches in order (no shuffle)."""
    p = {k: v.astype(np.float64) for k, v in w0.items()}
    x, y = x.astype(np.float64), y.astype(np.float64)
    state: dict = {}
    n = len(x)
    for s in range(steps):
        total = {k: np.zeros_like(v) for k, v in p.items()}
        for j in range(period):
            i = ((s * period + j) * batch) % n
            xb, yb = x[i:i + batch], y[i:i + batch]
            err = xb @ p["d.weight"] + p["d.bias"] - yb
            total["d.weight"] += 2 * xb.T @ err / err.size / period
            total["d.bias"] += 2 * err.sum(axis=0) / err.size / period
        keras_step(name, settings, p, total, state, LR, wd)
    return p


@pytest.fixture
def backend(each_device):
    return each_device


@pytest.mark.parametrize("form", ["flat", "object"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_optimizer_follows_keras_rules_in_numpy(case, form, backend):
    name, settings = CASES[case]
    x, y = _data()
    m = _linear(backend, name, settings, form=form)
    w0 = g.ggml_get_weights(m)
    g.ggml_fit(m, x, y, epochs=3, batch_size=8, shuffle=False, verbose=0)
    want = _reference_linear(w0, x, y, "adam" if name == "adam" else name, settings, steps=6, batch=8)
    got = g.ggml_get_weights(m)
    for k in want:
        assert not np.allclose(got[k], w0[k]), f"{k} did not train"
        np.testing.assert_allclose(got[k], want[k], rtol=3e-5, atol=3e-6, err_msg=f"{case} {k}")


def test_weight_decay_and_gradient_accumulation_follow_the_reference():
    x, y = _data(n=32)
    settings = {"momentum": 0.5, "centered": True}
    m = _linear("cpu", "rmsprop", settings, wd=0.1)
    w0 = g.ggml_get_weights(m)
    g.ggml_fit(m, x, y, epochs=2, batch_size=8, nbatch_logical=16, shuffle=False, verbose=0)
    want = _reference_linear(w0, x, y, "rmsprop", settings, steps=4, batch=8, wd=0.1, period=2)
    got = g.ggml_get_weights(m)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=3e-5, atol=3e-6, err_msg=k)


def test_clipping_changes_the_step_only_when_the_gradient_is_beyond_it():
    """A clip far above the gradients leaves AdamW's trajectory exactly as ggml-opt's fused step trains it."""
    x, y = _data()
    plain, clipped = _linear("cpu", "adam", {}), _linear("cpu", "adam", {"clipnorm": 1e6})
    for m in (plain, clipped):
        g.ggml_fit(m, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    a, b = g.ggml_get_weights(plain), g.ggml_get_weights(clipped)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-6, atol=1e-7, err_msg=k)


KERAS_CASES = ["sgd-momentum", "sgd-nesterov", "rmsprop", "rmsprop-centered-momentum", "adagrad", "sgd-clipvalue",
               "rmsprop-clipnorm"]


@pytest.mark.parametrize("case", KERAS_CASES)
def test_each_optimizer_trains_an_mlp_as_keras_does(case):
    os.environ.setdefault("KERAS_BACKEND", "torch")  # the backend installed beside ggmlpy here, if any
    keras = pytest.importorskip("keras", reason="Keras 3 (with a backend) is not installed: the numpy reference "
                                               "above still runs")
    name, settings = CASES[case]
    x, y = _data(n=24)
    np.random.seed(5)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 6, activation="tanh", input_shape=(4,), name="h")
    m = g.ggml_layer_dense(m, 3, name="o")
    m = g.ggml_compile(m, optimizer=name, loss="mse", metrics=[], backend="cpu", learning_rate=LR, **settings)
    w0 = g.ggml_get_weights(m)
    k_opt = {"sgd": keras.optimizers.SGD, "rmsprop": keras.optimizers.RMSprop,
             "adagrad": keras.optimizers.Adagrad}[name](learning_rate=LR, **settings)
    km = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(3)])
    km.set_weights([w0["h.weight"], w0["h.bias"], w0["o.weight"], w0["o.bias"]])
    km.compile(optimizer=k_opt, loss="mse")
    km.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0)
    g.ggml_fit(m, x, y, epochs=4, batch_size=8, shuffle=False, verbose=0)
    got = g.ggml_get_weights(m)
    for k, want in zip(("h.weight", "h.bias", "o.weight", "o.bias"), km.get_weights()):
        assert not np.allclose(want, w0[k])
        np.testing.assert_allclose(got[k], want, rtol=1e-4, atol=1e-5, err_msg=f"{case} {k}")


@pytest.mark.parametrize("case", ["rmsprop-centered-momentum", "adagrad", "sgd-nesterov"])
def test_the_state_saves_loads_and_continues_the_trajectory(case, tmp_path):
    name, settings = CASES[case]
    x, y = _data()
    straight, resumed = _linear("cpu", name, settings), _linear("cpu", name, settings)
    g.ggml_fit(straight, x, y, epochs=4, batch_size=8, shuffle=False, verbose=0)
    g.ggml_fit(resumed, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    g.ggml_save_model(resumed, tmp_path / "m.gguf", include_optimizer=True)
    loaded = g.ggml_load_model(tmp_path / "m.gguf", backend="cpu")
    assert loaded.compiled.optimizer_spec == resumed.compiled.optimizer_spec
    g.ggml_fit(loaded, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    g.ggml_fit(resumed, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)  # the state kept across fits
    a = g.ggml_get_weights(straight)
    for m in (loaded, resumed):
        b = g.ggml_get_weights(m)
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_a_trainer_steps_with_the_compiled_optimizer():
    x, y = _data()
    m = _linear("cpu", "rmsprop", {"momentum": 0.5})
    w0 = g.ggml_get_weights(m)
    with g.ggml_trainer(m, batch_size=8) as tr:
        for i in (0, 8, 0):
            tr.step(x[i:i + 8], y[i:i + 8])
        state = tr.optimizer_state()
    assert state["optimizer"] == "rmsprop" and state["iter"] == 4
    assert set(state["slots"]) == {"velocity", "momentum"}
    xs, ys = np.concatenate([x, x[:8]]), np.concatenate([y, y[:8]])
    want = _reference_linear(w0, xs, ys, "rmsprop", {"momentum": 0.5}, steps=3, batch=8)
    got = g.ggml_get_weights(m)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=3e-5, atol=3e-6, err_msg=k)


def test_a_pickled_model_keeps_its_optimizer_and_state():
    import pickle
    x, y = _data()
    m = _linear("cpu", "adagrad", {"clipvalue": 0.5})
    g.ggml_fit(m, x, y, epochs=1, batch_size=8, shuffle=False, verbose=0)
    copy = pickle.loads(pickle.dumps(m))
    assert copy.compiled.optimizer_spec == m.compiled.optimizer_spec
    for model in (m, copy):
        g.ggml_fit(model, x, y, epochs=1, batch_size=8, shuffle=False, verbose=0)
    a, b = g.ggml_get_weights(m), g.ggml_get_weights(copy)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-6, err_msg=k)


@pytest.mark.parametrize("name, settings, match", [
    ("adam", {"momentum": 0.9}, "momentum= is a setting of sgd and rmsprop, but the optimizer is 'adamw'"),
    ("sgd", {"rho": 0.9}, "rho= is a setting of rmsprop"),
    ("rmsprop", {"nesterov": True}, "nesterov= is a setting of sgd"),
    ("sgd", {"nesterov": True}, "nesterov=True needs a momentum > 0"),
    ("sgd", {"momentum": 1.0}, r"momentum must be a number in \[0, 1\)"),
    ("sgd", {"momentum": -0.1}, r"momentum must be a number in \[0, 1\)"),
    ("rmsprop", {"rho": 1.0}, r"rho must be a number in \[0, 1\)"),
    ("rmsprop", {"centered": "yes"}, "centered must be True or False"),
    ("adam", {"clipnorm": 0.0}, "clipnorm must be a finite number >= 1e-30"),
    ("adam", {"global_clipnorm": 1e-40}, "global_clipnorm must be a finite number >= 1e-30"),
    ("adam", {"clipvalue": float("inf")}, "clipvalue must be a finite number >= 1e-30"),
    ("rmsprop", {"epsilon": 0.0}, "RMSprop with epsilon=0 divides 0 by 0"),
    ("adam", {"clipnorm": 1.0, "clipvalue": 1.0}, "set one of clipnorm, global_clipnorm and clipvalue"),
    ("adagrad", {"initial_accumulator_value": -1.0}, "initial_accumulator_value must be a finite number >= 0"),
    ("adagrad", {"initial_accumulator_value": 0.0, "epsilon": 0.0}, "divides 0 by 0"),
    ("rmsprop", {"epsilon": -1.0}, "epsilon must be a finite number >= 0"),
    ("sgd", {"epsilon": 1e-7}, "epsilon set Adam's moments, but the optimizer is 'sgd'"),
    ("rmsprop", {"beta_1": 0.9}, "beta_1 set Adam's moments, but the optimizer is 'rmsprop'"),
    ("nadam", {}, "unknown optimizer 'nadam'"),
])
def test_settings_are_checked_with_the_fix(name, settings, match):
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 3, input_shape=(4,))
    with pytest.raises(g.GgmlValueError, match=match):
        g.ggml_compile(m, optimizer=name, loss="mse", backend="cpu", **settings)


def test_a_saved_state_must_fit_the_compiled_optimizer(tmp_path):
    x, y = _data()
    m = _linear("cpu", "rmsprop", {"centered": True})
    g.ggml_fit(m, x, y, epochs=1, batch_size=8, verbose=0)
    g.ggml_save_model(m, tmp_path / "c.gguf", include_optimizer=True)
    plain = _linear("cpu", "rmsprop", {})
    with pytest.raises(g.GgmlValueError, match=r"keeps \['average_gradient'\] per weight"):
        g.ggml_load_weights(plain, tmp_path / "c.gguf", include_optimizer=True)
    sgd = _linear("cpu", "sgd", {"momentum": 0.9})
    with pytest.raises(g.GgmlValueError, match="holds rmsprop's optimizer state but the model is compiled with sgd"):
        g.ggml_load_weights(sgd, tmp_path / "c.gguf", include_optimizer=True)
    g.ggml_load_weights(plain, tmp_path / "c.gguf")  # the weights alone: a warm restart
    np.testing.assert_array_equal(g.ggml_get_weights(plain)["d.weight"], g.ggml_get_weights(m)["d.weight"])


def test_a_learning_rate_schedule_reaches_the_graph_optimizer():
    x, y = _data()
    fixed, scheduled = _linear("cpu", "sgd", {"momentum": 0.9}), _linear("cpu", "sgd", {"momentum": 0.9})
    g.ggml_fit(fixed, x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)
    h = g.ggml_fit(scheduled, x, y, epochs=2, batch_size=16, shuffle=False, verbose=0,
                   callbacks=[g.ggml_schedule_learning_rate(lambda epoch, lr: lr * 10 if epoch == 1 else lr)])
    w0 = g.ggml_get_weights(_linear("cpu", "sgd", {"momentum": 0.9}))
    p = {k: v.astype(np.float64) for k, v in w0.items()}
    state: dict = {}
    for lr in (LR, LR * 10):
        err = x.astype(np.float64) @ p["d.weight"] + p["d.bias"] - y
        grads = {"d.weight": 2 * x.T.astype(np.float64) @ err / err.size, "d.bias": 2 * err.sum(axis=0) / err.size}
        keras_step("sgd", {"momentum": 0.9}, p, grads, state, lr)
    got = g.ggml_get_weights(scheduled)
    for k in p:
        np.testing.assert_allclose(got[k], p[k], rtol=3e-5, atol=3e-6, err_msg=k)
    assert not np.allclose(got["d.weight"], g.ggml_get_weights(fixed)["d.weight"])
    assert len(h) == 2


def test_deep_models_and_long_layer_names_fit_the_step_graph():
    """The widest rule with clipping and accumulation on six weight pairs, and slot tensors of weights whose
    names are as long as a layer name may be."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(32, 4)).astype(np.float32), rng.normal(size=(32, 3)).astype(np.float32)
    m = g.ggml_model_sequential()
    for i in range(5):
        m = g.ggml_layer_dense(m, 6, activation="tanh", input_shape=(4,) if i == 0 else None)
    m = g.ggml_layer_dense(m, 3)
    m = g.ggml_compile(m, optimizer="rmsprop", momentum=0.5, centered=True, clipnorm=0.1, loss="mse", metrics=[],
                       backend="cpu")
    h = g.ggml_fit(m, x, y, epochs=2, batch_size=8, nbatch_logical=16, verbose=0)
    assert np.isfinite(h["train_loss"]).all()
    seq = rng.normal(size=(8, 5, 3)).astype(np.float32)
    for name, settings in (("rmsprop", {"centered": True, "momentum": 0.5}), ("adagrad", {})):
        m = g.ggml_layer_lstm(g.ggml_model_sequential(), 4, input_shape=(5, 3), name="L" * 40)
        m = g.ggml_compile(g.ggml_layer_dense(m, 2), optimizer=name, loss="mse", metrics=[], backend="cpu", **settings)
        h = g.ggml_fit(m, seq, y[:8, :2], epochs=1, batch_size=4, verbose=0)
        assert np.isfinite(h["train_loss"]).all()


def test_a_slot_gained_on_load_covers_frozen_weights_and_saves(tmp_path):
    """A state saved without momentum, loaded into a model with momentum, one layer frozen: the new slot starts
    at zero for every weight, so the state saves and pickles whole."""
    import pickle
    x, y = _data()

    def mlp(settings):
        np.random.seed(1)
        m = g.ggml_layer_dense(g.ggml_model_sequential(), 5, activation="tanh", input_shape=(4,), name="h")
        return g.ggml_compile(g.ggml_layer_dense(m, 3, name="o"), optimizer="rmsprop", loss="mse", metrics=[],
                              backend="cpu", **settings)
    a = mlp({})
    g.ggml_fit(a, x, y, epochs=1, batch_size=8, verbose=0)
    g.ggml_save_model(a, tmp_path / "a.gguf", include_optimizer=True)
    b = g.ggml_load_weights(mlp({"momentum": 0.5}), tmp_path / "a.gguf", include_optimizer=True)
    g.ggml_freeze_weights(b, 0, 1)
    g.ggml_fit(b, x, y, epochs=1, batch_size=8, verbose=0)
    state = b.runtime.opt_state.state
    assert set(state["slots"]["momentum"]) == set(state["slots"]["velocity"]) == {"h.weight", "h.bias", "o.weight",
                                                                                  "o.bias"}
    assert not state["slots"]["momentum"]["h.weight"].any() and state["slots"]["momentum"]["o.weight"].any()
    g.ggml_save_model(b, tmp_path / "b.gguf", include_optimizer=True)
    copy = pickle.loads(pickle.dumps(b))
    assert set(copy.runtime.opt_state.state["slots"]["momentum"]) == set(state["slots"]["momentum"])


@pytest.mark.parametrize("name, settings, match", [
    ("sgd", {"nesterov": True}, "nesterov=True needs a momentum > 0"),
    ("sgd", {"momentum": 1.0}, r"momentum must be a number in \[0, 1\)"),
    ("rmsprop", {"rho": 1.0}, r"rho must be a number in \[0, 1\)"),
    ("rmsprop", {"centered": "yes"}, "centered must be True or False"),
    ("rmsprop", {"epsilon": 0.0}, "RMSprop with epsilon=0 divides 0 by 0"),
    ("adam", {"clipnorm": 1.0, "clipvalue": 1.0}, "set one of clipnorm, global_clipnorm and clipvalue"),
    ("adam", {"beta_2": 1.0}, r"beta_2 must be a number in \[0, 1\)"),
    ("adam", {"epsilon": -1.0}, "epsilon must be a finite number >= 0"),
    ("adam", {"learning_rate": 0.0}, "learning_rate must be"),
    ("adagrad", {"weight_decay": 2.0}, r"weight_decay must be a number in \[0, 1\]"),
    ("adagrad", {"initial_accumulator_value": 0.0, "epsilon": 0.0}, "divides 0 by 0"),
])
def test_an_optimizer_object_checks_its_settings_where_it_is_made(name, settings, match):
    with pytest.raises(g.GgmlValueError, match=f"ggml_optimizer_{name}: .*{match}|{match}"):
        MAKERS[name](**settings)


def test_an_optimizer_object_refuses_flat_settings_beside_it():
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 3, input_shape=(4,))
    opt = g.ggml_optimizer_sgd(0.1, momentum=0.9)
    for extra in ({"learning_rate": 0.01}, {"momentum": 0.5}, {"weight_decay": 0.1}, {"clipnorm": 1.0}):
        with pytest.raises(g.GgmlValueError, match=f"{next(iter(extra))} given beside an optimizer object"):
            g.ggml_compile(m, optimizer=opt, loss="mse", backend="cpu", **extra)
    assert m.compiled is None  # nothing compiled by a refused call


@pytest.mark.parametrize("name, settings", [("adam", {"learning_rate": 0.02, "beta_1": 0.8, "clipnorm": 0.5}),
                                            ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
                                            ("rmsprop", {"rho": 0.8, "centered": True, "weight_decay": 0.01}),
                                            ("adagrad", {"initial_accumulator_value": 0.2, "epsilon": 1e-4})])
def test_an_optimizer_object_compiles_as_its_flat_keywords(name, settings, tmp_path):
    """The object and ggmlR's flat keywords are one set of settings: the same compiled configuration (what a saved
    model keeps) either way, the object's get_config() is the flat form, and one object compiles several models."""
    opt = MAKERS[name](**settings)
    assert opt.get_config() == {"optimizer": name, **settings}
    assert repr(opt).startswith(f"Optimizer('{name}'") and all(f"{k}=" in repr(opt) for k in settings)
    with pytest.raises(AttributeError):
        opt.learning_rate = 1.0  # immutable: compiling another model with it cannot change the first
    models = []
    for optimizer, flat in ((opt, {}), (name, settings), (opt, {})):
        m = g.ggml_layer_dense(g.ggml_model_sequential(), 3, input_shape=(4,))
        models.append(g.ggml_compile(m, optimizer=optimizer, loss="mse", metrics=[], backend="cpu", **flat))
    configs = [m.compiled.to_dict() for m in models]
    assert configs[0] == configs[1] == configs[2]
    g.ggml_save_model(models[0], tmp_path / "m.gguf")
    assert g.ggml_load_model(tmp_path / "m.gguf", backend="cpu").compiled.to_dict() == configs[0]


def test_an_unknown_optimizer_names_the_objects():
    m = g.ggml_layer_dense(g.ggml_model_sequential(), 3, input_shape=(4,))
    with pytest.raises(g.GgmlValueError, match="ggml_optimizer_adam / _sgd / _rmsprop / _adagrad"):
        g.ggml_compile(m, optimizer=object(), loss="mse", backend="cpu")
