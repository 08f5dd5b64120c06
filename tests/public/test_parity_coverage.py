"""Real tests for the ggmlR functions that the parity table (docs/ggmlr-parity.md) marks mirrored and
that no other test used: each is called and its result checked against an independent expectation
(numpy float64, ggml's documented behaviour, or the device registry), not just its presence."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.subprocesses import cpu_flags


F32 = G.GGML_TYPE_F32


# ---------------------------------------------------------------- core / backends

def test_ggml_dup_tensor_copies_type_and_shape_not_data(host_ctx):
    a = G.ggml_new_tensor_3d(host_ctx, G.GGML_TYPE_I32, 5, 3, 2)
    G.ggml_set_i32(a, np.arange(30))
    d = G.ggml_dup_tensor(host_ctx, a)
    assert d is not a
    assert G.ggml_tensor_type(d) == G.GGML_TYPE_I32
    assert G.ggml_tensor_shape(d) == (5, 3, 2, 1)
    assert G.ggml_nbytes(d) == 30 * 4
    G.ggml_set_i32(d, 7)                               # its own memory: writing it leaves a alone
    np.testing.assert_array_equal(G.ggml_get_i32(a), np.arange(30))
    np.testing.assert_array_equal(G.ggml_get_i32(d), np.full(30, 7))


def test_ggml_backend_buffer_name_is_the_cpu_buffer_type(backend):
    ctx = G.ggml_init(4 * G.ggml_tensor_overhead(), no_alloc=True)
    try:
        G.ggml_new_tensor_1d(ctx, F32, 16)
        buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
        assert G.ggml_backend_buffer_name(buf) == "CPU"     # ggml's CPU buffer type is named "CPU"
        assert G.ggml_backend_buffer_get_size(buf) >= 16 * 4
        buf.free()
    finally:
        ctx.free()


def test_ggml_backend_init_best_picks_gpu_then_igpu_then_cpu():
    # ggml's rule, from the registry: the first GPU device, else the first iGPU, else the CPU
    expected = next(d for d in (G.ggml_backend_dev_by_type(G.ggml_backend_device_type_gpu()),
                                G.ggml_backend_dev_by_type(G.ggml_backend_device_type_igpu()),
                                G.ggml_backend_dev_by_type(G.ggml_backend_device_type_cpu())) if d is not None)
    if G.ggml_backend_dev_name(expected).startswith("RPC") and \
            not G.ggml_rpc_probe(G.ggml_backend_dev_description(expected), 0.5):
        # a device of an RPC server an earlier test stopped (ggml would abort the process connecting to it)
        with pytest.raises(G.BackendUnavailableError, match="stopped answering"):
            G.ggml_backend_init_best()
        return
    best = G.ggml_backend_init_best()
    try:
        assert G.ggml_backend_dev_name(G.ggml_backend_get_device(best)) == G.ggml_backend_dev_name(expected)
    finally:
        G.ggml_backend_free(best)


def test_ggml_backend_sched_get_n_splits_is_one_on_a_single_backend(sched, ctx):
    a = G.ggml_new_tensor_1d(ctx, F32, 4)
    b = G.ggml_new_tensor_1d(ctx, F32, 4)
    out = G.ggml_mul(ctx, G.ggml_add(ctx, a, b), b)
    gf = G.ggml_build_forward_expand(G.ggml_new_graph(ctx), out)
    assert G.ggml_backend_sched_alloc_graph(sched, gf)
    G.ggml_backend_tensor_set_data(a, [1, 2, 3, 4])
    G.ggml_backend_tensor_set_data(b, [2, 2, 2, 2])
    G.ggml_backend_sched_graph_compute(sched, gf)
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(out), [6, 8, 10, 12])
    assert G.ggml_backend_sched_get_n_splits(sched) == 1         # one backend: the graph is one split


# ---------------------------------------------------------------- model layer: layer objects

def test_ggml_batch_norm_layer_object_uses_its_running_statistics_in_predict():
    np.random.seed(0)
    x = G.ggml_input(shape=(4,))
    model = G.ggml_model(inputs=x, outputs=G.ggml_apply(x, G.ggml_batch_norm(eps=1e-3, name="bn")))
    G.ggml_compile(model, loss="mse", backend="cpu")
    gamma, beta = np.array([1.0, 2.0, 0.5, -1.0]), np.array([0.0, 1.0, -1.0, 0.25])
    mean, var = np.array([0.5, -0.5, 1.0, 0.0]), np.array([1.0, 4.0, 0.25, 2.0])
    G.ggml_set_weights(model, {"bn.gamma": gamma, "bn.beta": beta, "bn.running_mean": mean, "bn.running_var": var})
    X = np.random.default_rng(1).normal(size=(6, 4))
    expected = gamma * (X - mean) / np.sqrt(var + 1e-3) + beta
    np.testing.assert_allclose(G.ggml_predict(model, X.astype(np.float32)), expected, rtol=1e-5, atol=1e-5)


def test_ggml_embedding_layer_object_looks_up_rows_of_its_table():
    np.random.seed(0)
    ids = G.ggml_input(shape=(3,), dtype="int32")
    model = G.ggml_model(inputs=ids, outputs=G.ggml_apply(ids, G.ggml_embedding(10, 2, name="emb")))
    G.ggml_compile(model, loss="mse", backend="cpu")
    table = np.arange(20, dtype=np.float64).reshape(10, 2) / 4
    G.ggml_set_weights(model, {"emb.weight": table})
    ids = np.array([[1, 2, 3], [9, 0, 9]], dtype=np.int32)
    np.testing.assert_array_equal(G.ggml_predict(model, ids), table[ids])


# ---------------------------------------------------------------- ggml-opt accessors

class _Linear:
    """out = W x + b (W [3, 2] i.e. 2 outputs of 3 features, b [2]) on the CPU backend."""

    def __init__(self, backend, batch, W, b):
        self.ctx_static = G.ggml_init(8 * G.ggml_tensor_overhead(), no_alloc=True)
        self.x = G.ggml_set_input(G.ggml_new_tensor_2d(self.ctx_static, F32, 3, batch))
        self.W = G.ggml_set_param(G.ggml_new_tensor_2d(self.ctx_static, F32, 3, 2))
        self.b = G.ggml_set_param(G.ggml_new_tensor_1d(self.ctx_static, F32, 2))
        self.buf = G.ggml_backend_alloc_ctx_tensors(self.ctx_static, backend)
        G.ggml_backend_tensor_set_data(self.W, W)       # (2, 3) array = [3, 2] in ggml layout
        G.ggml_backend_tensor_set_data(self.b, b)
        self.ctx_compute = G.ggml_init(128 * G.ggml_tensor_overhead() + 4 * G.ggml_graph_overhead(2048, True),
                                       no_alloc=True)

    def forward(self):
        return G.ggml_add(self.ctx_compute, G.ggml_mul_mat(self.ctx_compute, self.W, self.x), self.b)

    def free(self):
        self.ctx_compute.free()
        self.buf.free()
        self.ctx_static.free()


W0 = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5]])
B0 = np.array([0.1, -0.2])
X = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0], [2.0, -2.0, 1.0], [0.0, 0.0, 1.0]])   # 4 samples


@pytest.mark.parametrize("optimizer, name", [(G.ggml_opt_optimizer_type_adamw(), "adamw"),
                                             (G.ggml_opt_optimizer_type_sgd(), "sgd")])
def test_ggml_opt_context_optimizer_type_and_name(backend, sched, optimizer, name):
    model = _Linear(backend, 4, W0, B0)
    opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), optimizer, 1, model.ctx_compute, model.x,
                          model.forward())
    try:
        assert G.ggml_opt_context_optimizer_type(opt) == optimizer
        assert G.ggml_opt_optimizer_name(G.ggml_opt_context_optimizer_type(opt)) == name
    finally:
        opt.free()
        model.free()


def test_ggml_opt_grad_acc_matches_numpy(backend, sched):
    Y = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 0.5]])
    model = _Linear(backend, 4, W0, B0)
    out = model.forward()
    # opt_period 2: the first eval only accumulates the gradient (no optimizer step, no reset)
    opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), G.ggml_opt_optimizer_type_sgd(), 2,
                          model.ctx_compute, model.x, out)
    try:
        assert G.ggml_opt_outputs(opt) is out      # a static context hands back the outputs it was built with
        G.ggml_opt_alloc(opt, True)
        G.ggml_backend_tensor_set_data(model.x, X)
        G.ggml_backend_tensor_set_data(G.ggml_opt_labels(opt), Y)
        G.ggml_opt_eval(opt)
        pred = X @ W0.T + B0                                           # (4 samples, 2 outputs)
        # ggml-opt's MSE: sum((out - y)^2) / (opt_period * nelements(out)), so d/dW = 2 E^T X / (2 * 8)
        E = pred - Y
        np.testing.assert_allclose(G.ggml_backend_tensor_get_data(G.ggml_opt_grad_acc(opt, model.W)).reshape(2, 3),
                                   2 * E.T @ X / 16, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(G.ggml_backend_tensor_get_data(G.ggml_opt_grad_acc(opt, model.b)),
                                   2 * E.sum(axis=0) / 16, rtol=1e-5, atol=1e-6)
    finally:
        opt.free()
        model.free()


def test_ggml_opt_prepare_alloc_and_outputs_of_a_dynamic_graph(backend, sched):
    Y = np.array([[0.0, 1.0], [1.0, 1.0], [0.5, 0.0], [2.0, -1.0]])
    model = _Linear(backend, 4, W0, B0)
    opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), G.ggml_opt_optimizer_type_sgd(), 1)
    try:
        assert G.ggml_opt_outputs(opt) is None        # dynamic: no graph before the first prepare_alloc
        for _ in range(2):      # a fresh forward graph per batch, handed over before every alloc
            out = model.forward()
            gf = G.ggml_build_forward_expand(model.ctx_compute, out)
            G.ggml_opt_prepare_alloc(opt, model.ctx_compute, gf, model.x, out)
            G.ggml_opt_alloc(opt, False)
            G.ggml_backend_tensor_set_data(model.x, X)
            G.ggml_backend_tensor_set_data(G.ggml_opt_labels(opt), Y)
            G.ggml_opt_eval(opt)
            pred = X @ W0.T + B0
            np.testing.assert_allclose(G.ggml_backend_tensor_get_data(G.ggml_opt_outputs(opt)).reshape(4, 2), pred,
                                       rtol=1e-6, atol=1e-6)
            expected = np.mean((pred - Y) ** 2)
            assert float(G.ggml_backend_tensor_get_data(G.ggml_opt_loss(opt))[0]) == pytest.approx(expected, rel=1e-5)
            G.ggml_reset(model.ctx_compute)
    finally:
        opt.free()
        model.free()


def test_ggml_opt_result_accuracy_counts_argmax_matches(backend, sched):
    model = _Linear(backend, 4, W0, B0)
    opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_cross_entropy(), G.ggml_opt_optimizer_type_adamw(), 1,
                          model.ctx_compute, model.x, model.forward())
    result = G.ggml_opt_result_init()
    try:
        logits = X @ W0.T + B0
        predicted = logits.argmax(axis=1)
        labels = np.eye(2)[[predicted[0], predicted[1], 1 - predicted[2], 1 - predicted[3]]]  # 2 of 4 right
        G.ggml_opt_alloc(opt, False)
        G.ggml_backend_tensor_set_data(model.x, X)
        G.ggml_backend_tensor_set_data(G.ggml_opt_labels(opt), labels)
        G.ggml_opt_eval(opt, result)
        acc = G.ggml_opt_result_accuracy(result)
        assert acc["accuracy"] == pytest.approx(0.5)
        assert acc["uncertainty"] == pytest.approx(np.sqrt(0.5 * 0.5 / 3))
        np.testing.assert_array_equal(G.ggml_opt_result_pred(result), predicted)
    finally:
        result.free()
        opt.free()
        model.free()


# ---------------------------------------------------------------- CPU features

# each x86 probe with the flag Linux reports in /proc/cpuinfo for that instruction set
X86_PROBES = [(G.ggml_cpu_has_sse3, "pni"), (G.ggml_cpu_has_ssse3, "ssse3"), (G.ggml_cpu_has_avx, "avx"),
              (G.ggml_cpu_has_avx2, "avx2"), (G.ggml_cpu_has_fma, "fma"), (G.ggml_cpu_has_f16c, "f16c"),
              (G.ggml_cpu_has_bmi2, "bmi2"), (G.ggml_cpu_has_avx512, "avx512f"),
              (G.ggml_cpu_has_avx512_vbmi, "avx512vbmi"), (G.ggml_cpu_has_avx512_vnni, "avx512_vnni"),
              (G.ggml_cpu_has_avx512_bf16, "avx512_bf16"), (G.ggml_cpu_has_avx_vnni, "avx_vnni"),
              (G.ggml_cpu_has_amx_int8, "amx_int8")]
# probes of other architectures: never true on an x86 machine
FOREIGN_PROBES = [G.ggml_cpu_has_neon, G.ggml_cpu_has_arm_fma, G.ggml_cpu_has_fp16_va, G.ggml_cpu_has_dotprod,
                  G.ggml_cpu_has_matmul_int8, G.ggml_cpu_has_sve, G.ggml_cpu_has_sme, G.ggml_cpu_has_riscv_v,
                  G.ggml_cpu_has_vsx, G.ggml_cpu_has_vxe, G.ggml_cpu_has_wasm_simd]


@pytest.mark.skipif(not cpu_flags() or "sse2" not in cpu_flags(), reason="needs an x86 /proc/cpuinfo")
def test_ggml_cpu_has_probes_agree_with_proc_cpuinfo():
    flags = cpu_flags()
    features = G.ggml_cpu_features()
    for probe, flag in X86_PROBES:
        used = probe()
        assert isinstance(used, bool), probe.__name__
        assert features[probe.__name__[len("ggml_cpu_has_"):]] is used, probe.__name__
        assert not used or flag in flags, f"{probe.__name__}() is True but the CPU has no {flag}"
    for probe in FOREIGN_PROBES:
        assert probe() is False, probe.__name__
    # build_ggml.py turns on the instruction sets of the CPU it builds on (SSE4.2 implying SSE3 / SSSE3, AVX,
    # AVX2), so for these baseline sets ggml's answer is the CPU's
    for probe, flag in X86_PROBES[:4]:
        assert probe() is (flag in flags), probe.__name__
