"""ggml's BLAS backend: built by default when OpenBLAS is installed (left out, with a message, when it
is not), put before the CPU backend by ``sched_new("cpu")`` and the model layer, and given a thread
split with the CPU backend that keeps the two pools from contending."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.compute.threads import restore_threads, split_threads, StepWork
from tests.helpers.devices import cpu_takes_f32_products


ROOT = Path(__file__).resolve().parents[2]


def _build_options():
    """This checkout's tools/ggml_build/options.py (build_ggml.py's backends and CMake options): the
    module whose openblas_found, openblas_openmp_dir and cuda_options parse_backends and cmake_options
    look up, so the one to patch them in."""
    saved = sys.path[:]
    sys.path.insert(0, str(ROOT))
    try:
        options = importlib.import_module("tools.ggml_build.options")
    finally:
        sys.path[:] = saved
    assert Path(options.__file__).resolve().parent == ROOT / "tools" / "ggml_build"
    return options


def test_blas_is_a_default_backend_and_optional(monkeypatch, capsys):
    b = _build_options()
    assert "blas" in b.DEFAULT_BACKENDS.split(",")
    monkeypatch.delenv("GGMLPY_BACKENDS", raising=False)
    monkeypatch.setattr(b, "openblas_found", lambda: False)
    assert b.backends_from_env() == ["cpu"]  # the default falls back to the CPU alone, saying why
    assert "libopenblas-dev" in capsys.readouterr().err
    with pytest.raises(b.BuildError, match="libopenblas-dev"):  # asked for by name: an error
        b.parse_backends("cpu,blas")
    monkeypatch.setattr(b, "openblas_found", lambda: True)
    assert b.backends_from_env() == ["cpu", "blas"]
    monkeypatch.setenv("GGMLPY_BACKENDS", "cpu")  # GGMLPY_BACKENDS leaves it out
    assert b.backends_from_env() == ["cpu"]
    assert "-DGGML_BLAS=ON" in b.cmake_options(["cpu", "blas"], None)
    assert "-DGGML_BLAS=ON" not in b.cmake_options(["cpu"], None)


needs_blas = pytest.mark.skipif(g.ggml_backend_dev_by_name("BLAS") is None, reason="built without the BLAS backend")


@needs_blas
def test_cpu_scheduler_puts_blas_first_and_can_leave_it_out():
    s = g.ggml_backend_sched_new("cpu", parallel=False)
    assert [b.device.name for b in s.backends] == ["BLAS", "CPU"]
    assert s.backends[0].n_threads == 1
    s.free()
    g.ggml_set_blas_enabled(False)
    try:
        s = g.ggml_backend_sched_new("cpu", parallel=False)
        assert [b.device.name for b in s.backends] == ["CPU"]
        s.free()
    finally:
        g.ggml_set_blas_enabled(True)


@needs_blas
def test_thread_split(monkeypatch):
    """OpenBLAS on its own pthreads pool: the thread budget goes to the pool with the work for it."""
    import ggmlpy.backend.backend as gb
    import ggmlpy.compute.threads as policy
    monkeypatch.setattr(policy, "blas_shares_cpu_pool", lambda: False)
    s = g.ggml_backend_sched_new("cpu", parallel=False)
    blas, cpu = s.backends
    n = g.ggml_get_n_threads()
    before = split_threads(s.backends, StepWork(1.2e9 + 3e6, 1.2e9, 2.7e6))  # MNIST-FC: the products dominate
    assert (blas.n_threads, cpu.n_threads) == (n, 1)
    restore_threads(before)
    assert (blas.n_threads, cpu.n_threads) == (1, n)
    split_threads(s.backends, StepWork(2e6, 1e6, 1e6))  # a tiny model: one thread each (barriers cost more)
    assert (blas.n_threads, cpu.n_threads) == (1, 1)
    split_threads(s.backends, StepWork(2e8, 1.7e8, 2.8e7))  # the CNN: im2col and pooling outweigh thin products
    assert (blas.n_threads, cpu.n_threads) == (1, n)
    split_threads(s.backends, StepWork(43e9, 43e9, 1.5e8))  # wide layers: both pools get the threads
    assert (blas.n_threads, cpu.n_threads) == (n, n)
    split_threads(s.backends, StepWork(1.53e9, 1.49e9, 4.2e7))  # the char transformer: the pool's work weighs more
    assert (blas.n_threads, cpu.n_threads) == (1, n)
    s.free()
    cpu_only = g.ggml_backend_cpu_init()  # no BLAS: the CPU pool's count by the graph's size alone
    set_by_user, gb._threads_set_by_user[0] = gb._threads_set_by_user[0], False  # as in a fresh process
    try:
        before = split_threads([cpu_only], StepWork(1e6, 0.0, 1e6))
        assert cpu_only.n_threads == 1
        restore_threads(before)
        assert cpu_only.n_threads == n
        split_threads([cpu_only], StepWork(1e9, 0.0, 1e9))
        assert cpu_only.n_threads == n
    finally:
        gb._threads_set_by_user[0] = set_by_user
        cpu_only.free()


@needs_blas
def test_shared_pool_gives_both_backends_every_thread_but_to_small_graphs(monkeypatch):
    """OpenBLAS on OpenMP runs its products on ggml's own threads: no pool waits beside the other, so both
    take the whole count, whatever the mix of work; a small graph still runs on one thread (the barrier
    after every node costs more than it saves) unless the user set a count."""
    import ggmlpy.backend.backend as gb
    import ggmlpy.compute.threads as policy
    monkeypatch.setattr(policy, "blas_shares_cpu_pool", lambda: True)
    monkeypatch.setattr(gb, "_n_threads", [2])
    monkeypatch.setattr(gb, "_threads_set_by_user", [False])
    s = g.ggml_backend_sched_new("cpu", parallel=False)
    blas, cpu = s.backends
    for work in (StepWork(1.2e9 + 3e6, 1.2e9, 2.7e6), StepWork(2e8, 1.7e8, 2.8e7), StepWork(43e9, 43e9, 1.5e8),
                 StepWork(1.53e9, 1.49e9, 4.2e7)):  # MNIST-FC, the CNN, wide layers, the char transformer
        before = split_threads(s.backends, work)
        assert (blas.n_threads, cpu.n_threads) == (2, 2), work
        restore_threads(before)
    split_threads(s.backends, StepWork(2e6, 1e6, 1e6))  # a tiny model
    assert (blas.n_threads, cpu.n_threads) == (1, 1)
    gb._threads_set_by_user[0] = True  # the user's count holds even there
    split_threads(s.backends, StepWork(2e6, 1e6, 1e6))
    assert (blas.n_threads, cpu.n_threads) == (2, 2)
    s.free()


@needs_blas
def test_blas_shares_the_pool_when_the_openmp_openblas_is_installed():
    """The build puts OpenBLAS's OpenMP variant in the BLAS backend's run path where it is installed (CI
    installs it), and the process then runs on it: told by the loaded library, checked against the build
    description OpenBLAS gives of itself."""
    from ggmlpy.compute.threads import blas_shares_cpu_pool
    from ggmlpy.core import openblas
    model, config = openblas.threading_model(), openblas.config()
    assert model in ("openmp", "pthreads", "sequential") and config.startswith("OpenBLAS")
    assert (model == "openmp") == ("USE_OPENMP" in config)
    if _build_options().openblas_openmp_dir() is None:
        pytest.skip("OpenBLAS's OpenMP build is not installed here (apt-get install libopenblas0-openmp)")
    assert model == "openmp", config
    assert blas_shares_cpu_pool()


def test_build_links_the_openmp_openblas_before_the_system_default(monkeypatch, tmp_path):
    b = _build_options()
    monkeypatch.setattr(b, "openblas_openmp_dir", lambda: tmp_path)
    rpath = next(o for o in b.cmake_options(["cpu", "blas"], None) if o.startswith("-DCMAKE_INSTALL_RPATH="))
    assert rpath == f"-DCMAKE_INSTALL_RPATH=$ORIGIN;{tmp_path}"
    rpath = next(o for o in b.cmake_options(["cpu"], None) if o.startswith("-DCMAKE_INSTALL_RPATH="))
    assert rpath == "-DCMAKE_INSTALL_RPATH=$ORIGIN"  # no BLAS backend: nothing to find
    monkeypatch.setattr(b, "cuda_options", lambda arch: (["-DGGML_CUDA=ON"], ["/cuda/lib64"]))
    opts = b.cmake_options(["cpu", "blas", "cuda"], None)
    want = f"-DCMAKE_INSTALL_RPATH=$ORIGIN;/cuda/lib64;{tmp_path}"
    assert [o for o in opts if o.startswith("-DCMAKE_INSTALL_RPATH=")] == [want]


@needs_blas
def test_model_layer_splits_the_threads_for_fit_trainer_steps_and_predict(monkeypatch):
    """The split is what every model-layer computation runs with: a fit's steps, ggml_trainer's steps
    (which used to give ggml's pool the threads whatever the split said) and ggml_predict (whose products
    used to stay on one OpenBLAS thread). This model's products dominate: where the BLAS device takes them
    OpenBLAS gets the threads and ggml's pool one; where the CPU backend computes F32 products itself
    (patches/0062) ggml's pool gets them and OpenBLAS one."""
    from ggmlpy.backend import backend as gb
    from ggmlpy.compute import threads as policy
    from ggmlpy.models.engine import runtime
    from ggmlpy.training.loop import NativeRunner
    monkeypatch.setattr(gb, "_n_threads", [2])
    monkeypatch.setattr(policy, "blas_shares_cpu_pool", lambda: False)  # the pthreads policy splits the count
    seen = []

    def threads(sched):
        return tuple(sorted((b.device.name, b.n_threads) for b in sched.backends))

    step = NativeRunner.step
    monkeypatch.setattr(NativeRunner, "step", lambda self, *a, **k: (seen.append(("step", threads(self.graph.sched))),
                                                                    step(self, *a, **k))[1])
    compute = runtime.ggml_backend_sched_graph_compute
    monkeypatch.setattr(runtime, "ggml_backend_sched_graph_compute",
                        lambda sched, graph: (seen.append(("predict", threads(sched))), compute(sched, graph))[1])
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 1024, activation="relu", input_shape=(256,))  # ~200 MFLOP of products per step
    m = g.ggml_compile(g.ggml_layer_dense(m, 3, activation="softmax"), backend="cpu")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 256)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[np.arange(128) % 3]
    on_blas = not cpu_takes_f32_products()
    expected = (("BLAS", 2), ("CPU", 1)) if on_blas else (("BLAS", 1), ("CPU", 2))
    g.ggml_fit(m, x, y, batch_size=128, epochs=1, verbose=0)
    tr = g.ggml_trainer(m, batch_size=128)
    tr.step(x, y)
    g.ggml_predict(m, x, batch_size=128)
    kinds = {kind for kind, _ in seen}
    assert kinds == {"step", "predict"}, seen
    assert all(t == expected for _, t in seen), seen
    tr.free()


def test_training_step_work_counts_the_pool_and_the_optimizer():
    """The split's inputs: products 2 flops per multiply-add, on BLAS where its device takes them, ggml's pool one
    per element plus the optimizer's pass over the weights (every opt_period steps, and the gradient accumulation
    between), and the products where the CPU backend computes them."""
    from ggmlpy.compute.threads import OPTIMIZER_ELEMENTS_PER_PARAM, training_step_work
    ctx = g.ggml_init(16 << 20, no_alloc=True)
    x = g.ggml_set_input(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 64, 128))
    w = g.ggml_set_param(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 64, 48))
    b = g.ggml_set_param(g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_F32, 48))
    out = g.ggml_relu(ctx, g.ggml_add(ctx, g.ggml_mul_mat(ctx, w, x), b))
    product = 2.0 * 64 * 48 * 128
    elementwise = 2.0 * 48 * 128  # the add and the relu
    n_params = 64 * 48 + 48
    # the BLAS device takes the product, unless the CPU backend computes F32 products itself (patches/0062)
    on_blas = g.ggml_backend_dev_by_name("BLAS") is not None and not cpu_takes_f32_products()
    pool_products = 0.0 if on_blas else 3 * product
    work = training_step_work([out])
    assert work.blas_flops == (3 * product if on_blas else 0.0)
    assert work.flops == 3 * (product + elementwise)
    assert work.pool_elements == pool_products + 3 * elementwise + OPTIMIZER_ELEMENTS_PER_PARAM * n_params
    accumulating = training_step_work([out], opt_period=4)
    assert accumulating.pool_elements == pool_products + 3 * elementwise + \
        (OPTIMIZER_ELEMENTS_PER_PARAM / 4 + 1) * n_params
    ctx.free()



def test_the_lstm_sequence_ops_products_count_as_the_pools_work():
    """ggml_lstm_seq (patches/0035) runs every step's recurrent product inside ggml's CPU pool: counted there, or
    a pool of one thread would be given an LSTM's whole recurrence."""
    from ggmlpy.compute.threads import training_step_work
    units, batch, steps = 64, 32, 40
    ctx = g.ggml_init(16 << 20, no_alloc=True)
    x = g.ggml_set_input(g.ggml_new_tensor_3d(ctx, g.GGML_TYPE_F32, 4 * units, batch, steps))
    u = g.ggml_set_param(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, units, 4 * units))
    seq = g.ggml_lstm_seq(ctx, x, u)
    work = training_step_work([seq])
    recurrent = 2.0 * units * 4 * units * batch * steps
    assert work.blas_flops == 0
    assert work.pool_elements >= 3 * recurrent and work.flops >= 3 * recurrent
    ctx.free()


def test_the_gru_sequence_ops_products_count_as_the_pools_work():
    from ggmlpy.compute.threads import training_step_work
    units, batch, steps = 64, 32, 40
    ctx = g.ggml_init(16 << 20, no_alloc=True)
    x = g.ggml_set_input(g.ggml_new_tensor_3d(ctx, g.GGML_TYPE_F32, 3 * units, batch, steps))
    u = g.ggml_set_param(g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, units, 3 * units))
    work = training_step_work([g.ggml_gru_seq(ctx, x, u)])
    assert work.blas_flops == 0 and work.pool_elements >= 3 * 2.0 * units * 3 * units * batch * steps
    ctx.free()


def test_the_tiled_convolutions_products_count_as_the_pools_work():
    """ggml_conv_2d_tiled (patches/0036) multiplies inside ggml's CPU pool, 2 flops per tap of every output."""
    from ggmlpy.compute.threads import training_step_work
    ctx = g.ggml_init(16 << 20, no_alloc=True)
    x = g.ggml_set_input(g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 14, 14, 8, 100))
    k = g.ggml_set_param(g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, 3, 3, 8, 16))
    y = g.ggml_conv_2d_tiled(ctx, k, x, None, 1, 1, 1, 1, 1, 1)
    work = training_step_work([y])
    product = 2.0 * 14 * 14 * 16 * 100 * 72
    assert work.blas_flops == 0 and work.flops == 3 * product
    assert work.pool_elements >= 3 * product
    ctx.free()

@needs_blas
def test_blas_matmul_matches_numpy_and_training_uses_it():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 96)).astype(np.float32)
    b = rng.standard_normal((48, 96)).astype(np.float32)
    ctx = g.ggml_init(1 << 20, no_alloc=True)
    ta = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 96, 64)
    tb = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 96, 48)
    out = g.ggml_mul_mat(ctx, ta, tb)
    s = g.ggml_backend_sched_new("cpu", parallel=False)
    g.ggml_backend_alloc_ctx_tensors(ctx, s.backends[-1])
    g.ggml_backend_tensor_set_data(ta, a)
    g.ggml_backend_tensor_set_data(tb, b)
    gf = g.ggml_new_graph(ctx)
    g.ggml_build_forward_expand(gf, out)
    g.ggml_backend_sched_graph_compute(s, gf)
    got = g.ggml_backend_tensor_get_data(out).reshape(48, 64)
    np.testing.assert_allclose(got, b @ a.T, rtol=1e-4, atol=1e-4)
    s.free()
    ctx.free()
