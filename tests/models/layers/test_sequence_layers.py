"""The sequence layers (lstm, gru, layer_norm, multi_head_attention, position_embedding; masking, bidirectional,
time_distributed, return_state and initial states, cross-attention with a mask) against the float64 numpy
references of tests/helpers/layer_refs.py: forward passes, one-step SGD gradients against central finite
differences, the same step on Vulkan against the CPU, and a 100-step LSTM that trains.

The machinery (cases, gradient check, Vulkan subprocess) is test_layers.py's.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.models.engine.compile import build_training_graph
from tests.helpers import layer_refs as R

from .test_layers import (
    _vulkan_mode,
    assert_close,
    Case,
    check_backend,
    check_gradient,
    make_case,
    normal,
    sequential,
    vulkan_checks_in_subprocess,
)
from .test_layers import run_vulkan_checks as run_layer_vulkan_checks


CASES: list[Case] = []


def case(*args, **kw) -> None:
    CASES.append(Case(*args, **kw))


def _rnn_ref(fn, name="r", rs=False):
    return lambda w, x, t: fn(x, w[f"{name}.kernel"], w[f"{name}.recurrent_kernel"], w[f"{name}.bias"], rs)


for _rs in (False, True):
    _tag = "_sequences" if _rs else ""
    case(f"lstm{_tag}", lambda rs=_rs: sequential((g.ggml_layer_lstm, (3,), dict(return_sequences=rs,
                                                                                  input_shape=(4, 2), name="r"))),
         _rnn_ref(R.lstm, rs=_rs), normal(3, 4, 2))
    case(f"gru{_tag}", lambda rs=_rs: sequential((g.ggml_layer_gru, (3,), dict(return_sequences=rs,
                                                                                input_shape=(4, 2), name="r"))),
         _rnn_ref(R.gru, rs=_rs), normal(3, 4, 2))

case("lstm_one_step", lambda: sequential((g.ggml_layer_lstm, (2,), dict(input_shape=(1, 3), name="r"))),
     _rnn_ref(R.lstm), normal(2, 1, 3), zero_grads=("r.recurrent_kernel",))   # one step: h U never used
case("gru_then_gru",   # gradients flow into a recurrent layer's input sequence
     lambda: sequential((g.ggml_layer_gru, (3,), dict(return_sequences=True, input_shape=(4, 2), name="r")),
                        (g.ggml_layer_gru, (2,), dict(name="r2"))),
     lambda w, x, t: _rnn_ref(R.gru, "r2")(w, _rnn_ref(R.gru, rs=True)(w, x, t), t), normal(3, 4, 2))
case("embedding_lstm_dense",
     lambda: sequential((g.ggml_layer_embedding, (6, 3), dict(input_shape=(5,), name="e")),
                        (g.ggml_layer_lstm, (4,), dict(name="r")), (g.ggml_layer_dense, (2,), dict(name="d"))),
     lambda w, x, t: R.dense(_rnn_ref(R.lstm)(w, R.embedding(x, w["e.weight"]), t), w["d.weight"], w["d.bias"]),
     lambda rng: rng.randint(0, 6, (3, 5)).astype(np.int32))

case("layer_norm", lambda: sequential((g.ggml_layer_layer_norm, (), dict(input_shape=(3, 5), name="n"))),
     lambda w, x, t: R.layer_norm(x, w["n.gamma"], w["n.beta"]), normal(2, 3, 5))
case("layer_norm_eps_then_dense",
     lambda: sequential((g.ggml_layer_layer_norm, (), dict(eps=0.5, input_shape=(4,), name="n")),
                        (g.ggml_layer_dense, (3,), dict(name="d"))),
     lambda w, x, t: R.dense(R.layer_norm(x, w["n.gamma"], w["n.beta"], 0.5), w["d.weight"], w["d.bias"]),
     normal(3, 4))

KEY_BIAS = ("a.key_bias",)   # softmax ignores a constant added to a query's scores: q.(k + b) shifts them all

for _causal in (False, True):
    case(f"attention{'_causal' if _causal else ''}",
         lambda c=_causal: sequential((g.ggml_layer_multi_head_attention, (2, 3),
                                       dict(causal=c, input_shape=(4, 5), name="a"))),
         lambda w, x, t, c=_causal: R.multi_head_attention(x, w, "a", c), normal(2, 4, 5), zero_grads=KEY_BIAS)
case("attention_one_head_causal_then_dense",
     lambda: sequential((g.ggml_layer_multi_head_attention, (1, 2), dict(causal=True, input_shape=(3, 2), name="a")),
                        (g.ggml_layer_flatten, (), {}), (g.ggml_layer_dense, (2,), dict(name="d"))),
     lambda w, x, t: R.dense(R.flatten(R.multi_head_attention(x, w, "a", True)), w["d.weight"], w["d.bias"]),
     normal(3, 3, 2), zero_grads=KEY_BIAS)
case("position_embedding",
     lambda: sequential((g.ggml_layer_position_embedding, (6,), dict(input_shape=(4, 3), name="p")),
                        (g.ggml_layer_dense, (2,), dict(activation="tanh", name="d"))),
     lambda w, x, t: R.dense(R.position_embedding(x, w["p.weight"]), w["d.weight"], w["d.bias"], "tanh"),
     normal(2, 4, 3))


def _block():
    """A pre-norm transformer block on embedded tokens, as in examples/char_transformer.py."""
    ids = g.ggml_input((5,), dtype="int32", name="ids")
    x = g.ggml_layer_position_embedding(g.ggml_layer_embedding(ids, 7, 4, name="e"), 5, name="p")
    a = g.ggml_layer_multi_head_attention(g.ggml_layer_layer_norm(x, name="n1"), 2, 2, causal=True, name="a")
    x = g.ggml_layer_add([x, a])
    m = g.ggml_layer_dense(g.ggml_layer_dense(g.ggml_layer_layer_norm(x, name="n2"), 8, activation="gelu",
                                              name="f1"), 4, name="f2")
    return g.ggml_model(ids, g.ggml_layer_dense(g.ggml_layer_add([x, m]), 7, name="out"))


def _block_ref(w, ids, t):
    x = R.position_embedding(R.embedding(ids, w["e.weight"]), w["p.weight"])
    x = x + R.multi_head_attention(R.layer_norm(x, w["n1.gamma"], w["n1.beta"]), w, "a", True)
    h = R.dense(R.layer_norm(x, w["n2.gamma"], w["n2.beta"]), w["f1.weight"], w["f1.bias"], "gelu")
    x = x + R.dense(h, w["f2.weight"], w["f2.bias"])
    return R.dense(x, w["out.weight"], w["out.bias"])


# On Vulkan (lavapipe) every matrix product rounds
# through float16 (~1e-3); through the block's products, backward included, the gradients differ from the CPU's
# by up to 0.4% of each weight's largest gradient (all about 1 here), hence an absolute tolerance.
case("transformer_block", _block, _block_ref, lambda rng: rng.randint(0, 7, (2, 5)).astype(np.int32),
     fwd_tol=(2e-3, 2e-3), grad_tol=(1e-2, 1e-3), zero_grads=KEY_BIAS, vulkan_grad_tol=(1e-2, 6e-3))


# ---- issue 26's Keras layers: masking, bidirectional, time_distributed, return_state / initial states, cross-attention

def _rnn(fn, w, x, name="r", rs=False, **kw):
    return fn(x, w[f"{name}.kernel"], w[f"{name}.recurrent_kernel"], w[f"{name}.bias"], rs, **kw)


PAD = -1.0   # the masking cases' mask_value


def _padded(n=4, steps=5, features=2):
    """Sequences with padding steps (every feature PAD): at the end, at the start, in the middle, none."""
    def make(rng):
        x = rng.normal(0, 1, (n, steps, features)).astype(np.float32)
        x[0, 3:], x[1, :2], x[2, 2] = PAD, PAD, PAD
        return x
    return make


def _mask(x):
    """Keras' Masking: a step is real where any feature differs from mask_value."""
    return np.any(np.asarray(x) != PAD, axis=-1)


def _masking(*layers):
    return sequential((g.ggml_layer_masking, (), dict(mask_value=PAD, input_shape=(5, 2))), *layers)


case("masking_lstm", lambda: _masking((g.ggml_layer_lstm, (3,), dict(name="r"))),
     lambda w, x, t: _rnn(R.lstm, w, x, mask=_mask(x)), _padded())
case("masking_gru_sequences_then_gru",   # the sequence output passes the mask on to the next GRU
     lambda: _masking((g.ggml_layer_gru, (3,), dict(return_sequences=True, name="r")),
                      (g.ggml_layer_gru, (2,), dict(name="r2"))),
     lambda w, x, t: _rnn(R.gru, w, _rnn(R.gru, w, x, rs=True, mask=_mask(x)), "r2", mask=_mask(x)), _padded())
case("masking_bidirectional_gru",
     lambda: _masking((g.ggml_layer_bidirectional, (g.ggml_gru(3),), dict(name="bi"))),
     lambda w, x, t: R.bidirectional(x, w, "bi", R.gru, mask=_mask(x)), _padded())
case("masking_bidirectional_lstm_sequences_then_pooling",
     lambda: _masking((g.ggml_layer_bidirectional, (g.ggml_lstm(2, return_sequences=True),),
                       dict(merge_mode="mul", name="bi")), (g.ggml_layer_global_average_pooling_1d, (), {})),
     lambda w, x, t: R.masked_average(R.bidirectional(x, w, "bi", R.lstm, True, "mul", _mask(x)), _mask(x)),
     _padded())
case("masking_dense_then_global_average_pooling_1d",   # Keras' Masking zeroes the padding steps it passes on
     lambda: _masking((g.ggml_layer_dense, (3,), dict(activation="tanh", name="d")),
                      (g.ggml_layer_global_average_pooling_1d, (), {})),
     lambda w, x, t: R.masked_average(R.dense(x * _mask(x)[..., None], w["d.weight"], w["d.bias"], "tanh"), _mask(x)),
     _padded())
case("masking_time_distributed_dense_then_lstm",
     lambda: _masking((g.ggml_layer_time_distributed, (g.ggml_dense(3, activation="tanh"),), dict(name="td")),
                      (g.ggml_layer_lstm, (2,), dict(name="r"))),
     lambda w, x, t: _rnn(R.lstm, w, R.time_distributed(
         lambda s: R.dense(s, w["td.weight"], w["td.bias"], "tanh"), x * _mask(x)[..., None]), mask=_mask(x)),
     _padded())

for _rnn_fn, _kind, _rs, _merge in ((R.lstm, "lstm", False, "concat"), (R.gru, "gru", True, "sum"),
                                    (R.lstm, "lstm", True, "mul"), (R.gru, "gru", False, "ave")):
    case(f"bidirectional_{_kind}{'_sequences' if _rs else ''}_{_merge}",
         lambda k=_kind, rs=_rs, mm=_merge: sequential((g.ggml_layer_bidirectional, (
             (g.ggml_lstm if k == "lstm" else g.ggml_gru)(2, return_sequences=rs),),
             dict(merge_mode=mm, input_shape=(4, 2), name="bi"))),
         lambda w, x, t, fn=_rnn_fn, rs=_rs, mm=_merge: R.bidirectional(x, w, "bi", fn, rs, mm), normal(3, 4, 2))
case("time_distributed_dense",
     lambda: sequential((g.ggml_layer_time_distributed, (g.ggml_dense(3, activation="tanh"),),
                         dict(input_shape=(4, 2), name="td"))),
     lambda w, x, t: R.time_distributed(lambda s: R.dense(s, w["td.weight"], w["td.bias"], "tanh"), x),
     normal(3, 4, 2))
case("time_distributed_conv_1d",   # steps of (length, channels)
     lambda: sequential((g.ggml_layer_time_distributed, (g.ggml_conv_1d(2, 2, activation="tanh"),),
                         dict(input_shape=(3, 5, 2), name="tc"))),
     lambda w, x, t: R.time_distributed(lambda s: R.conv1d(s, w["tc.kernel"], w["tc.bias"], act="tanh"), x),
     normal(3, 3, 5, 2))
case("bidirectional_gru_sequences_then_time_distributed_dense",
     lambda: sequential((g.ggml_layer_bidirectional, (g.ggml_gru(2, return_sequences=True),),
                         dict(input_shape=(4, 2), name="bi")),
                        (g.ggml_layer_time_distributed, (g.ggml_dense(2),), dict(name="td"))),
     lambda w, x, t: R.time_distributed(lambda s: R.dense(s, w["td.weight"], w["td.bias"]),
                                        R.bidirectional(x, w, "bi", R.gru, True)),
     normal(3, 4, 2))


# return_state and initial states (functional models; several outputs: the sum of their losses)
def _return_state(layer, rs):
    def build():
        x = g.ggml_input((4, 2))
        return g.ggml_model(x, list(layer(x, 3, return_sequences=rs, return_state=True, name="r")))
    return build


def _seq2seq(layer):
    def build():
        xe, xd = g.ggml_input((5, 2)), g.ggml_input((4, 2))
        states = layer(xe, 3, return_state=True, name="enc")[1:]
        return g.ggml_model([xe, xd], layer([xd] + list(states), 3, return_sequences=True, name="dec"))
    return build


def _states_from_dense():
    x, z = g.ggml_input((4, 2)), g.ggml_input((3,))
    h0 = g.ggml_layer_dense(z, 3, activation="tanh", name="h0")
    c0 = g.ggml_layer_dense(z, 3, name="c0")
    return g.ggml_model([x, z], g.ggml_layer_lstm([x, h0, c0], 3, name="r"))


def _state_input():
    x, h0 = g.ggml_input((4, 2)), g.ggml_input((3,))
    return g.ggml_model([x, h0], g.ggml_layer_gru([x, h0], 3, return_sequences=True, name="r"))


def _enc_dec_ref(fn):
    return lambda w, x, t: _rnn(fn, w, x[1], "dec", True, initial_state=_rnn(fn, w, x[0], "enc", return_state=True)[1:])


def _inputs(*shapes):
    return lambda rng: [rng.normal(0, 1, s).astype(np.float32) for s in shapes]


case("lstm_return_state_outputs", _return_state(g.ggml_layer_lstm, True),   # [sequence, h, c]
     lambda w, x, t: _rnn(R.lstm, w, x, rs=True, return_state=True), normal(3, 4, 2))
case("gru_return_state_outputs", _return_state(g.ggml_layer_gru, False),    # [last output, h]: the same values
     lambda w, x, t: _rnn(R.gru, w, x, return_state=True), normal(3, 4, 2))
case("lstm_encoder_states_start_decoder", _seq2seq(g.ggml_layer_lstm), _enc_dec_ref(R.lstm),
     _inputs((3, 5, 2), (3, 4, 2)))
case("gru_encoder_state_starts_decoder", _seq2seq(g.ggml_layer_gru), _enc_dec_ref(R.gru),
     _inputs((3, 5, 2), (3, 4, 2)))
case("lstm_initial_states_from_dense", _states_from_dense,
     lambda w, x, t: _rnn(R.lstm, w, x[0], initial_state=[R.dense(x[1], w["h0.weight"], w["h0.bias"], "tanh"),
                                                          R.dense(x[1], w["c0.weight"], w["c0.bias"])]),
     _inputs((3, 4, 2), (3, 3)))
case("gru_initial_state_input", _state_input,
     lambda w, x, t: _rnn(R.gru, w, x[0], rs=True, initial_state=[x[1]]), _inputs((3, 4, 2), (3, 3)))


# cross-attention: a query sequence over a value (and key) sequence of other lengths and dimensions, with a mask
TQ, TV, DQ, DV, DK = 3, 4, 3, 2, 4


def _attention_mask(rng, tq):
    m = (rng.uniform(size=(3, tq, TV)) > 0.4).astype(np.float32)
    m[:, :, 0] = 1.0   # every query sees at least one step
    return m


def _cross(with_key, with_mask, causal=False):
    tq = TV if causal else TQ

    def build():
        nodes = [g.ggml_input((tq, DQ)), g.ggml_input((TV, DV))] + ([g.ggml_input((TV, DK))] if with_key else []) + \
            ([g.ggml_input((tq, TV))] if with_mask else [])
        return g.ggml_model(nodes, g.ggml_layer_multi_head_attention(nodes, 2, 2, causal=causal,
                                                                     attention_mask=with_mask, name="a"))

    def ref(w, x, t):
        return R.multi_head_attention(x[0], w, "a", causal, value=x[1], key=x[2] if with_key else None,
                                      mask=x[-1] if with_mask else None)

    def data(rng):
        x = [rng.normal(0, 1, (3, tq, DQ)), rng.normal(0, 1, (3, TV, DV))] + \
            ([rng.normal(0, 1, (3, TV, DK))] if with_key else [])
        return [a.astype(np.float32) for a in x] + ([_attention_mask(rng, tq)] if with_mask else [])
    return build, ref, data


case("cross_attention", *_cross(False, False), zero_grads=KEY_BIAS)
case("cross_attention_mask", *_cross(False, True), zero_grads=KEY_BIAS)
case("cross_attention_key_mask", *_cross(True, True), zero_grads=KEY_BIAS)
case("cross_attention_mask_causal", *_cross(False, True, causal=True), zero_grads=KEY_BIAS)

CASE_IDS = [c.name for c in CASES]
BY_NAME = {c.name: c for c in CASES}


pytestmark = pytest.mark.usefixtures("one_cpu_thread")


@pytest.mark.parametrize("c", CASES, ids=CASE_IDS)
def test_forward_matches_reference(c: Case):
    model, w, x, _ = make_case(c)
    assert_close(g.ggml_predict(model, x), c.ref(w, x, False), *c.fwd_tol, what=f"{c.name}: ggml_predict")


@pytest.mark.parametrize("c", CASES, ids=CASE_IDS)
def test_one_step_gradient_matches_finite_differences(c: Case):
    check_gradient(c)


def test_keras_orientation_and_initial_values():
    """Weights come out in Keras' shapes; the LSTM's forget-gate bias starts at 1 and its recurrent kernel
    is orthogonal, as in Keras."""
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_lstm(m, 4, return_sequences=True, input_shape=(6, 3), name="l")
    m = g.ggml_layer_gru(m, 5, name="r")
    x = g.ggml_input((6, 8), name="x")
    att = g.ggml_model(x, g.ggml_layer_multi_head_attention(x, 2, 3, name="a"))
    w = g.ggml_get_weights(g.ggml_compile(m, loss="mse", metrics=[], backend="cpu"))
    assert w["l.kernel"].shape == (3, 16) and w["l.recurrent_kernel"].shape == (4, 16) and w["l.bias"].shape == (16,)
    np.testing.assert_array_equal(w["l.bias"], np.r_[np.zeros(4), np.ones(4), np.zeros(8)])
    u = w["l.recurrent_kernel"].astype(np.float64)
    np.testing.assert_allclose(u @ u.T, np.eye(4), atol=1e-5)
    assert w["r.kernel"].shape == (4, 15) and w["r.recurrent_kernel"].shape == (5, 15) and w["r.bias"].shape == (2, 15)
    wa = g.ggml_get_weights(g.ggml_compile(att, loss="mse", metrics=[], backend="cpu"))
    assert wa["a.query_kernel"].shape == (8, 2, 3) and wa["a.query_bias"].shape == (2, 3)
    assert wa["a.output_kernel"].shape == (2, 3, 8) and wa["a.output_bias"].shape == (8,)


@pytest.mark.parametrize("build, message", [
    (lambda: g.ggml_layer_lstm(g.ggml_model_sequential(), 4, input_shape=(6,)), "(steps, features)"),
    (lambda: g.ggml_layer_gru(g.ggml_model_sequential(), 0, input_shape=(6, 2)), "units"),
    (lambda: g.ggml_layer_lstm(g.ggml_model_sequential(), 3, return_sequences=1, input_shape=(6, 2)),
     "return_sequences"),
    (lambda: g.ggml_layer_multi_head_attention(g.ggml_model_sequential(), 2, 3, input_shape=(6,)), "(steps, dim)"),
    (lambda: g.ggml_layer_multi_head_attention(g.ggml_model_sequential(), 0, 3, input_shape=(6, 2)), "num_heads"),
    (lambda: g.ggml_layer_layer_norm(g.ggml_model_sequential(), eps=-1.0, input_shape=(6, 2)), "eps"),
    (lambda: g.ggml_layer_position_embedding(g.ggml_model_sequential(), 4, input_shape=(6, 2)), "at most 4"),
])
def test_wrong_arguments_and_shapes(build, message):
    with pytest.raises(g.GgmlValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        g.ggml_compile(build(), loss="mse", metrics=[], backend="cpu")   # shapes are checked by compile at the latest


@pytest.mark.parametrize("layer, unrolled", [(g.ggml_layer_lstm, False), (g.ggml_layer_gru, True)],
                         ids=["lstm", "gru_unrolled"])
def test_a_recurrence_over_100_steps_trains(layer, unrolled, monkeypatch):
    """A recurrence over 100 steps learns the sign of a small offset hidden in noise, which each step shows only
    faintly (one step alone: ~62 % right). The GRU unrolled step by step (as a GPU or a masked sequence builds it)
    makes a training graph beyond ggml's default 2048 nodes (patches/0005); the CPU runs the LSTM's recurrence as
    one op each way (patches/0035)."""
    if unrolled:
        from ggmlpy.models.layers import fused
        monkeypatch.setattr(fused, "device_computes", lambda device, op: op == "gru_cell")
    np.random.seed(0)
    rng = np.random.RandomState(0)
    sign = rng.randint(0, 2, 256)
    x = (rng.normal(0, 1, (256, 100, 1)) + np.where(sign, 0.3, -0.3)[:, None, None]).astype(np.float32)
    m = g.ggml_model_sequential()
    m = layer(m, 8, input_shape=(100, 1))
    m = g.ggml_layer_dense(m, 2, activation="softmax")
    m = g.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend="cpu",
                       learning_rate=0.02)
    inst = build_training_graph(m, m.compiled, 32)
    if unrolled:
        assert inst.train_nodes > g.GGML_DEFAULT_GRAPH_SIZE   # forward + backward + optimizer nodes
    else:
        assert inst.train_nodes < 200
    inst.free()
    hist = g.ggml_fit(m, x, sign, epochs=6, batch_size=32, verbose=0)
    assert hist["train_loss"].iloc[-1] < 0.5 * hist["train_loss"].iloc[0], hist
    assert g.ggml_evaluate(m, x, sign)["accuracy"] > 0.85


def test_saved_sequence_model_predicts_identically(tmp_path):
    np.random.seed(1)
    m = _block()
    g.ggml_compile(m, loss="mse", metrics=[], backend="cpu")
    ids = np.random.RandomState(2).randint(0, 7, (4, 5)).astype(np.int32)
    path = str(tmp_path / "block.gguf")
    g.ggml_save_model(m, path)
    loaded = g.ggml_load_model(path, backend="cpu")
    np.testing.assert_array_equal(g.ggml_predict(loaded, ids), g.ggml_predict(m, ids))
    lstm = g.ggml_layer_lstm(g.ggml_model_sequential(), 3, return_sequences=True, input_shape=(4, 2), name="l")
    g.ggml_compile(g.ggml_layer_gru(lstm, 2), loss="mse", metrics=[], backend="cpu")
    g.ggml_save_model(lstm, path)
    xs = np.random.RandomState(3).normal(0, 1, (3, 4, 2)).astype(np.float32)
    np.testing.assert_array_equal(g.ggml_predict(g.ggml_load_model(path, backend="cpu"), xs), g.ggml_predict(lstm, xs))


# ---------------------------------------------------------------- Vulkan

VULKAN_CASES = [BY_NAME[n] for n in ("lstm_sequences", "gru", "gru_then_gru", "layer_norm", "attention_causal",
                                     "position_embedding", "transformer_block")] + \
    [c for c in CASES if c.name.startswith(("masking_", "bidirectional_", "time_distributed_", "cross_attention"))
     or "state" in c.name]


def run_vulkan_checks() -> dict:
    return run_layer_vulkan_checks(VULKAN_CASES)


@pytest.fixture(scope="module")
def vulkan_results() -> dict:
    return vulkan_checks_in_subprocess("tests.models.layers.test_sequence_layers")


@pytest.mark.parametrize("c", VULKAN_CASES, ids=[c.name for c in VULKAN_CASES])
def test_trains_on_vulkan(c: Case, request):
    """One training step on Vulkan (lavapipe) matches the CPU's, whose gradients are checked above."""
    mode, why = _vulkan_mode()
    if mode == "skip":
        pytest.skip(why)
    if mode == "in-process":
        check_backend(c, "vulkan")
        return
    results = request.getfixturevalue("vulkan_results")
    if "__skip__" in results:
        pytest.skip(results["__skip__"])
    assert "__crash__" not in results, f"the Vulkan subprocess failed: {results.get('__crash__')}"
    assert results[c.name] is None, results[c.name]


# ---------------------------------------------------------------- cross-entropy over sequence outputs

def _token_model(loss: str):
    np.random.seed(4)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_embedding(m, 7, 3, input_shape=(4,), name="e")
    m = g.ggml_layer_dense(m, 5, activation="softmax", name="d")
    return g.ggml_compile(m, optimizer="sgd", loss=loss, backend="cpu", learning_rate=0.1)


def _token_loss(w: dict, ids: np.ndarray, targets: np.ndarray) -> float:
    """Keras' sparse cross-entropy over every position: the mean over the N * steps tokens."""
    z = R.dense(R.embedding(ids, w["e.weight"]), w["d.weight"], w["d.bias"])
    logp = z - z.max(axis=-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(axis=-1, keepdims=True))
    return float(-np.take_along_axis(logp, targets[..., None], axis=-1).mean())


def test_sequence_cross_entropy_is_the_mean_over_tokens():
    """A softmax over each position of a (steps, classes) output with class ids (N, steps): one SGD step's
    gradient equals finite differences of the per-token mean loss; ggml_evaluate reports that loss and the
    per-token accuracy; one-hot labels (N, steps, classes) give the same step."""
    rng = np.random.RandomState(5)
    ids, targets = rng.randint(0, 7, (3, 4)).astype(np.int32), rng.randint(0, 5, (3, 4))
    m = _token_model("sparse_categorical_crossentropy")
    w = {k: v.astype(np.float64) for k, v in g.ggml_get_weights(m).items()}
    ev = g.ggml_evaluate(m, ids, targets)
    assert ev["loss"] == pytest.approx(_token_loss(w, ids, targets), rel=1e-5)
    pred = g.ggml_predict(m, ids)
    assert pred.shape == (3, 4, 5)
    assert ev["accuracy"] == pytest.approx((pred.argmax(-1) == targets).mean())
    want = R.fd_gradients(lambda ww: _token_loss(ww, ids, targets), w, list(w))
    with g.ggml_trainer(m, batch_size=3) as tr:
        step_loss = tr.step(ids, targets)
    assert step_loss == pytest.approx(_token_loss(w, ids, targets), rel=1e-5)
    got = {k: (w[k] - v) / 0.1 for k, v in g.ggml_get_weights(m).items()}
    for k in w:
        assert_close(got[k], want[k], 1e-3, 1e-5, what=f"gradient of {k}")
    onehot = _token_model("categorical_crossentropy")
    g.ggml_fit(onehot, ids, np.eye(5, dtype=np.float32)[targets], epochs=1, batch_size=3, shuffle=False, verbose=0)
    sparse = _token_model("sparse_categorical_crossentropy")
    g.ggml_fit(sparse, ids, targets, epochs=1, batch_size=3, shuffle=False, verbose=0)
    for k, v in g.ggml_get_weights(sparse).items():
        np.testing.assert_array_equal(v, g.ggml_get_weights(onehot)[k])


def test_sequence_labels_are_checked():
    m = _token_model("sparse_categorical_crossentropy")
    ids = np.zeros((3, 4), np.int32)
    with pytest.raises(g.GgmlValueError, match=r"class ids of shape \(3, 4\)"):
        g.ggml_fit(m, ids, np.zeros(3, np.int32), verbose=0)
    with pytest.raises(g.GgmlValueError, match="outside"):
        g.ggml_fit(m, ids, np.full((3, 4), 5), verbose=0)
    with pytest.raises(g.GgmlValueError, match="position 2"):
        y = np.eye(5, dtype=np.float32)[np.zeros((3, 4), int)]
        y[1, 2] = 0
        g.ggml_fit(_token_model("categorical_crossentropy"), ids, y, verbose=0)
    with pytest.raises(g.GgmlValueError, match="sequence outputs"):
        g.ggml_fit(m, ids, np.zeros((3, 4), np.int32), sample_weight=np.ones(3), verbose=0)


def test_functional_api_and_shared_layer_objects():
    """The layer objects (ggml_lstm, ggml_gru, ggml_layer_norm, ggml_multi_head_attention) applied with
    ggml_apply share their weights: one GRU object applied to two inputs gives the reference of one GRU."""
    np.random.seed(6)
    a, b = g.ggml_input((5, 2), name="a"), g.ggml_input((5, 2), name="b")
    enc = g.ggml_gru(3, name="enc")
    both = g.ggml_layer_concatenate([g.ggml_apply(a, enc), g.ggml_apply(b, enc)])
    seq = g.ggml_apply(g.ggml_apply(a, g.ggml_lstm(4, return_sequences=True, name="l")), g.ggml_layer_norm(name="n"))
    att = g.ggml_apply(seq, g.ggml_multi_head_attention(2, 2, causal=True, name="att"))
    m = g.ggml_model([a, b], [both, att])
    g.ggml_compile(m, loss=["mse", "mse"], metrics=[], backend="cpu")
    w = g.ggml_get_weights(m)
    assert sum(k.startswith("enc.") for k in w) == 3
    rng = np.random.RandomState(7)
    xa, xb = rng.normal(0, 1, (3, 5, 2)).astype(np.float32), rng.normal(0, 1, (3, 5, 2)).astype(np.float32)
    got_both, got_att = g.ggml_predict(m, [xa, xb])

    def gru(x):
        return R.gru(x, w["enc.kernel"], w["enc.recurrent_kernel"], w["enc.bias"])
    assert_close(got_both, np.concatenate([gru(xa), gru(xb)], axis=-1), 1e-5, 1e-5, "shared gru")
    ref_seq = R.layer_norm(R.lstm(xa, w["l.kernel"], w["l.recurrent_kernel"], w["l.bias"], True), w["n.gamma"],
                           w["n.beta"])
    assert_close(got_att, R.multi_head_attention(ref_seq, w, "att", True), 1e-5, 1e-5, "lstm -> norm -> attention")


# ---------------------------------------------------------------- Keras' dropout= and recurrent_dropout=

def _sgd_rnn(kind, units, features, steps, **kw):
    np.random.seed(0)
    layer = g.ggml_layer_lstm if kind == "lstm" else g.ggml_layer_gru
    m = layer(g.ggml_model_sequential(), units, input_shape=(steps, features), name="r", **kw)
    return g.ggml_compile(m, optimizer="sgd", loss="mse", metrics=[], backend="cpu", learning_rate=0.1)


def _step_gradients(m, x, y):
    w0 = g.ggml_get_weights(m)
    with g.ggml_trainer(m, batch_size=len(x)) as tr:
        tr.step(x, y)
    w1 = g.ggml_get_weights(m)
    g.ggml_set_weights(m, w0)
    return {k: (w0[k].astype(np.float64) - w1[k]) / 0.1 for k in w0}


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_input_dropout_keeps_one_mask_for_the_whole_sequence(kind):
    """A dropped input feature gives its kernel row no gradient at any step (one mask per sequence, Keras'
    rule); about ``rate`` of the rows are dropped, a new mask every step; inference is the plain layer."""
    rate, features, units, steps = 0.5, 64, 3, 4
    m = _sgd_rnn(kind, units, features, steps, dropout=rate)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(1, steps, features)).astype(np.float32), rng.normal(size=(1, units)).astype(np.float32)
    w = g.ggml_get_weights(m)
    ref = R.lstm if kind == "lstm" else R.gru
    np.testing.assert_allclose(g.ggml_predict(m, x), ref(x, w["r.kernel"], w["r.recurrent_kernel"], w["r.bias"]),
                               rtol=1e-5, atol=1e-6)
    masks = []
    for _ in range(3):
        grad = _step_gradients(m, x, y)["r.kernel"]            # (features, gates * units)
        dropped = np.all(grad == 0, axis=1)
        assert np.all(np.abs(grad[~dropped]).sum(axis=1) > 0)
        assert 0.25 < dropped.mean() < 0.75, dropped.mean()
        masks.append(dropped)
    assert not np.array_equal(masks[0], masks[1]) or not np.array_equal(masks[1], masks[2])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recurrent_dropout_draws_one_mask_per_gate(kind):
    """With recurrent_dropout (Keras' implementation 1) each gate reads the inputs and the state through its own
    mask: a kernel row is zero in some gates' blocks and not in others'."""
    features, units, steps = 32, 8, 5
    m = _sgd_rnn(kind, units, features, steps, dropout=0.5, recurrent_dropout=0.5)
    gates = 4 if kind == "lstm" else 3
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(1, steps, features)).astype(np.float32), rng.normal(size=(1, units)).astype(np.float32)
    grads = _step_gradients(m, x, y)
    blocks = grads["r.kernel"].reshape(features, gates, units)
    zero = np.all(blocks == 0, axis=2)                          # (features, gates): dropped for that gate
    assert zero.any() and (~zero).any() and (zero.any(axis=1) & ~zero.all(axis=1)).any()
    rec = grads["r.recurrent_kernel"].reshape(units, gates, units)
    assert np.all(rec == 0, axis=2).any()                       # state units dropped for some gate
    h = g.ggml_fit(m, np.repeat(x, 8, axis=0), np.repeat(y, 8, axis=0), epochs=3, batch_size=4, verbose=0)
    assert np.isfinite(h["train_loss"]).all()


def test_dropout_arguments_are_checked_and_saved(tmp_path):
    with pytest.raises(g.GgmlValueError, match=r"lstm dropout must be a rate in \[0, 1\)"):
        g.ggml_lstm(3, dropout=1.0)
    with pytest.raises(g.GgmlValueError, match=r"gru recurrent_dropout must be a rate in \[0, 1\)"):
        g.ggml_gru(3, recurrent_dropout=-0.1)
    m = _sgd_rnn("gru", 3, 2, 4, dropout=0.2, recurrent_dropout=0.3)
    g.ggml_save_model(m, tmp_path / "m.gguf")
    layer = g.ggml_load_model(tmp_path / "m.gguf", backend="cpu").layers[0]
    assert (layer.dropout, layer.recurrent_dropout) == (0.2, 0.3)


def _trained_lstm(backend, seed=3, layer=g.ggml_layer_lstm):
    np.random.seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(48, 7, 3)).astype(np.float32)
    y = (x[:, :, 0].sum(axis=1) > 0).astype(np.int32)
    m = g.ggml_model_sequential()
    m = layer(m, 5, return_sequences=True, input_shape=(7, 3))
    m = layer(m, 4)
    m = g.ggml_layer_dense(m, 2, activation="softmax")
    m = g.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend=backend,
                       learning_rate=0.05)
    h = g.ggml_fit(m, x, y, epochs=3, batch_size=16, shuffle=False, verbose=0)
    return m, h, x


FUSED_FORMS = [  # (layer, the fused ops the CPU may use, the op that must be in its graph)
    (g.ggml_layer_lstm, {"lstm_seq", "lstm_cell"}, "LSTM_SEQ"),   # the whole recurrence (patches/0035)
    (g.ggml_layer_lstm, {"lstm_cell"}, "LSTM_CELL"),              # one op per step (0031): masks, recurrent dropout
    (g.ggml_layer_gru, {"gru_seq", "gru_cell"}, "GRU_SEQ"),     # the whole recurrence (patches/0037)
    (g.ggml_layer_gru, {"gru_cell"}, "GRU_CELL"),
]


# the CPU has every fused form; Vulkan the whole recurrences (patches/0049), not the one-step ops
FUSED_CASES = [(*f, "cpu") for f in FUSED_FORMS] + [(*f, "vulkan") for f in FUSED_FORMS if f[2].endswith("_SEQ")]


@pytest.mark.parametrize("layer, allowed, op, each_device", FUSED_CASES, indirect=["each_device"],
                         ids=[f"{f[2]}-{f[3]}" for f in FUSED_CASES])
def test_the_fused_recurrence_trains_as_the_element_wise_one(layer, allowed, op, each_device, monkeypatch):
    """The fused LSTM and GRU forms (the whole sequence, one step) against the element-wise graph they replace, on
    the same device: the same losses and weights after three epochs (float32 rounding apart), and the fused op is in
    the graph, on that device."""
    from ggmlpy.models.layers import fused as fused_ops
    real = fused_ops.device_computes
    monkeypatch.setattr(fused_ops, "device_computes", lambda device, name: name in allowed and real(device, name))
    fused, h_fused, x = _trained_lstm(each_device, layer=layer)
    placement = g.ggml_model_placement(fused)
    ops = placement.op_counts()
    assert op in ops and not {"LSTM_SEQ", "LSTM_CELL", "GRU_SEQ", "GRU_CELL"} - {op} & set(ops), ops
    assert placement.cpu_ops == [] or each_device == "cpu", str(placement)
    monkeypatch.setattr(fused_ops, "device_computes", lambda device, name: False)
    plain, h_plain, _ = _trained_lstm(each_device, layer=layer)
    assert not {"LSTM_SEQ", "LSTM_CELL", "GRU_SEQ", "GRU_CELL"} & set(g.ggml_model_placement(plain).op_counts())
    np.testing.assert_allclose(h_fused["train_loss"], h_plain["train_loss"], rtol=2e-5)
    for name, w in g.ggml_get_weights(fused).items():
        np.testing.assert_allclose(w, g.ggml_get_weights(plain)[name], rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(g.ggml_predict(fused, x), g.ggml_predict(plain, x), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("each_device", ["vulkan", "cuda"], indirect=True)
@pytest.mark.parametrize("layer", [g.ggml_layer_lstm, g.ggml_layer_gru])
def test_a_gpu_recurrent_layer_keeps_its_steps_on_the_device(each_device, layer):
    """A GPU model's recurrence stays on the device, in one split: on Vulkan as the whole-sequence op (patches/0049,
    one node forward and one backward per layer), on a device without it (CUDA) as the element-wise step; the
    one-step ops are the CPU's only."""
    m, _, _ = _trained_lstm(each_device, layer=layer)
    p = g.ggml_model_placement(m)
    seq = "LSTM_SEQ" if layer is g.ggml_layer_lstm else "GRU_SEQ"
    want = {seq: 2, f"{seq}_BACK": 2} if each_device == "Vulkan0" else {}   # two recurrent layers
    counts = p.op_counts()
    assert {op: counts[op] for op in counts if op.startswith(("LSTM", "GRU"))} == want, str(p)
    assert p.cpu_ops == [] and p.n_splits == 1, str(p)


@pytest.mark.parametrize("each_device", ["cpu", "vulkan"], indirect=True)
def test_the_placement_report_says_why_a_recurrence_is_not_one_op(each_device):
    """Where the device computes the whole-sequence op but a layer cannot use it (recurrent dropout, a padding
    mask), the layer's steps are built one by one and ``Placement.notes`` says so, and why; a layer that uses the
    op has no note."""
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_masking(m, mask_value=0.0, input_shape=(5, 3))
    m = g.ggml_layer_lstm(m, 4, return_sequences=True, name="masked")      # the padding mask reaches it
    m = g.ggml_layer_gru(m, 3, recurrent_dropout=0.25, name="dropped")
    m = g.ggml_layer_dense(m, 2, activation="softmax")
    m = g.ggml_compile(m, optimizer="adam", loss="sparse_categorical_crossentropy", backend=each_device)
    p = g.ggml_model_placement(m, batch_size=4)
    assert p.notes == [
        "lstm 'masked': its 5 steps are built one by one, not as one LSTM_SEQ op (which this device computes): the op "
        "takes no padding mask",
        "gru 'dropped': its 5 steps are built one by one, not as one GRU_SEQ op (which this device computes): the op "
        "takes no padding mask or recurrent dropout",     # the LSTM's sequence output carries the mask on
    ], p.notes
    assert "note: gru 'dropped'" in str(p)
    plain = g.ggml_model_sequential()
    plain = g.ggml_layer_lstm(plain, 4, input_shape=(5, 3))
    plain = g.ggml_compile(plain, optimizer="adam", loss="mse", backend=each_device)
    assert g.ggml_model_placement(plain, batch_size=4).notes == []


@pytest.mark.parametrize("each_device", ["vulkan"], indirect=True)
def test_a_recurrence_past_what_the_devices_kernel_takes_steps_on_the_device(each_device):
    """Vulkan's whole-sequence kernel holds up to 512 units: a wider LSTM steps one by one, all on the device, and
    the placement report says why (it was built as the op and left to the CPU)."""
    np.random.seed(0)
    m = g.ggml_model_sequential()
    m = g.ggml_layer_lstm(m, 513, input_shape=(3, 2), name="wide")
    m = g.ggml_compile(m, optimizer="adam", loss="mse", backend=each_device)
    p = g.ggml_model_placement(m, batch_size=2)
    assert p.cpu_ops == [] and p.n_splits == 1 and "LSTM_SEQ" not in p.op_counts(), str(p)
    assert p.notes == ["lstm 'wide': its 3 steps are built one by one, not as one LSTM_SEQ op (which this device "
                       "computes): this device's kernel does not take 513 units over 3 steps"], p.notes
