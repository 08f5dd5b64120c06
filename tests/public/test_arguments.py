"""Bad argument types and values give ggmlpy's own errors, raised at the argument, with what was expected:
never a bare TypeError from comparing types, an OverflowError from cffi, a ZeroDivisionError, a numpy
ValueError, an AttributeError on None. Numpy scalars are numbers like any other. A user's own exception
(from a generator or a callback) still comes out unchanged."""
from __future__ import annotations

import os
import sys
import textwrap

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.subprocesses import run_in_subprocess


F32 = G.GGML_TYPE_F32


@pytest.fixture
def tensors():
    ctx = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(64), no_alloc=True)
    a = G.ggml_new_tensor_2d(ctx, F32, 4, 3)
    yield ctx, a
    ctx.free()


def test_huge_ints_are_refused_not_overflowing_into_c(tensors):
    ctx, a = tensors
    for call in (lambda: G.ggml_diag_mask_inf(ctx, a, 2 ** 70), lambda: G.ggml_diag_mask_inf(ctx, a, 2 ** 31),
                 lambda: G.ggml_pad(ctx, a, 2 ** 40), lambda: G.ggml_concat(ctx, a, a, 2 ** 63),
                 lambda: G.ggml_pool_1d(ctx, a, 0, 2 ** 40, 1), lambda: G.ggml_reshape_2d(ctx, a, 2 ** 64, 1),
                 lambda: G.ggml_view_1d(ctx, a, 2, 2 ** 64), lambda: G.gguf_type_name(2 ** 70)):
        with pytest.raises(G.GgmlValueError):
            call()


def test_the_thread_count_is_bounded_and_a_refusal_changes_nothing():
    """ggml_set_n_threads(2**63) was accepted, and every CPU backend created later failed with OverflowError."""
    code = textwrap.dedent("""
        import ggmlpy as G
        for v in (2 ** 63, 513, 0, True, 2.0, None):
            try:
                G.ggml_set_n_threads(v)
            except G.GgmlpyError as e:
                print(type(e).__name__, e)
        b = G.ggml_backend_cpu_init()
        try:
            G.ggml_backend_cpu_set_n_threads(b, 2 ** 70)
        except G.GgmlValueError as e:
            print("REFUSED", e)
        print("THREADS", G.ggml_get_n_threads(), b.n_threads)
    """)
    rc, out, err = run_in_subprocess(code)
    assert rc == 0, err
    assert out.count("Ggml") == 6 and out.count("must be <= 512") == 3, out
    assert "THREADS" in out and "OverflowError" not in out + err


def test_comparisons_of_wrong_types_are_type_errors(tensors):
    ctx, a = tensors
    with pytest.raises(G.GgmlValueError, match="permutation of 0, 1, 2, 3"):
        G.ggml_permute(ctx, a, None, 1, 2, 3)  # was TypeError: '<' not supported between int and NoneType
    with pytest.raises(G.GgmlTypeError, match="ne must be a list"):
        G.ggml_new_tensor(ctx, F32, 2, None)
    with pytest.raises(G.GgmlTypeError, match=r"ggml_graph_n_nodes\(graph\)"):
        G.ggml_graph_n_nodes(None)  # was AttributeError: 'NoneType' object has no attribute 'n_nodes'
    with pytest.raises(G.GgmlTypeError, match=r"ggml_graph_get_tensor\(graph\)"):
        G.ggml_graph_get_tensor("g", "x")
    for fn in (G.ggml_opt_inputs, G.ggml_opt_loss, G.ggml_opt_pred, G.ggml_opt_ncorrect):
        with pytest.raises(G.GgmlTypeError, match=r"\(opt_ctx\)"):
            fn(None)  # was AttributeError: 'NoneType' object has no attribute 'tensor'
    with pytest.raises(G.GgmlTypeError, match="gguf_type_name"):
        G.gguf_type_name(None)


def test_nan_and_inf_parameters_are_refused(tensors):
    ctx, a = tensors
    for call in (lambda: G.ggml_leaky_relu(ctx, a, float("nan")), lambda: G.ggml_leaky_relu(ctx, a, float("inf")),
                 lambda: G.ggml_scale(ctx, a, float("nan")), lambda: G.ggml_scale(ctx, a, 1e300),
                 lambda: G.ggml_scale(ctx, a, 2 ** 2000), lambda: G.ggml_clamp(ctx, a, float("nan"), 1.0),
                 lambda: G.ggml_scale_bias(ctx, a, 1.0, float("inf"))):
        with pytest.raises(G.GgmlValueError):
            call()
    G.ggml_clamp(ctx, a, float("-inf"), 1.0)  # an infinite bound is a bound


def test_numpy_scalars_are_numbers(tensors):
    ctx, a = tensors
    assert G.ggml_tensor_shape(G.ggml_new_tensor_2d(ctx, F32, np.int64(3), np.int32(2))) == (3, 2, 1, 1)
    assert G.ggml_tensor_shape(G.ggml_new_tensor(ctx, F32, 2, np.array([5, 2]))) == (5, 2, 1, 1)
    G.ggml_leaky_relu(ctx, a, np.float32(0.2))
    G.ggml_scale(ctx, a, np.float64(2.0))
    assert G.ggml_tensor_shape(G.ggml_pad(ctx, a, np.int64(1))) == (5, 3, 1, 1)
    assert G.ggml_tensor_shape(G.ggml_permute(ctx, a, np.int64(1), 0, 2, 3)) == (3, 4, 1, 1)


def test_data_access_arguments(tensors):
    ctx, a = tensors
    host = G.ggml_init(1 << 16)
    t = G.ggml_new_tensor_1d(host, F32, 4)
    G.ggml_backend_tensor_set_data(t, [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(G.GgmlTypeError, match="offset must be an int"):
        G.ggml_backend_tensor_get_data(t, None)
    with pytest.raises(G.GgmlValueError, match="holds 4 elements"):
        G.ggml_backend_tensor_get_data(t, 2 ** 70)
    assert list(G.ggml_backend_tensor_get_data(t, np.int64(1), np.int32(2))) == [2.0, 3.0]
    with pytest.raises(G.GgmlTypeError, match="value must be a number"):
        G.ggml_set_f32(t, [1.0, 2.0])
    ds = G.ggml_opt_dataset_init(F32, F32, 4, 1, 8)
    xb = G.ggml_new_tensor_2d(host, F32, 4, 2)
    with pytest.raises(G.GgmlTypeError, match="rows must be a slice"):
        G.ggml_opt_dataset_get_batch_rows(ds, xb, "x")
    with pytest.raises(G.GgmlTypeError, match=r"\(dataset\)"):
        G.ggml_opt_dataset_get_batch_rows(None, xb, slice(0, 2))
    with pytest.raises(G.GgmlValueError):
        G.ggml_opt_dataset_get_batch_rows(ds, xb, slice(2 ** 63, 2 ** 64))
    with pytest.raises(G.GgmlTypeError, match="type_data"):
        G.ggml_opt_dataset_init([F32], F32, 4, 1, 8)
    host.free()


def test_callback_arguments_are_checked_when_the_callback_is_made():
    """They used to fail at the end of the first epoch, inside fit, with a TypeError from float()."""
    for call in (lambda: G.ggml_callback_early_stopping(min_delta=None), lambda: G.ggml_callback_early_stopping(
            patience="3"), lambda: G.ggml_schedule_step_decay(gamma="0.5"),
            lambda: G.ggml_schedule_reduce_on_plateau(factor=float("nan")),
            lambda: G.ggml_schedule_reduce_on_plateau(factor=2.0), lambda: G.ggml_schedule_reduce_on_plateau(
                min_lr=-1.0), lambda: G.ggml_callback_early_stopping(mode=np.zeros((2, 2)))):
        with pytest.raises(G.GgmlpyError):
            call()


def test_plot_history_arguments(tmp_path):
    import pandas as pd
    hist = pd.DataFrame({"epoch": [1, 2], "train_loss": [1.0, 0.5]})  # the other columns may be missing
    assert G.ggml_plot_history(hist, tmp_path / "h").name == "h.png"
    for path, title, exc in ((None, None, G.GgmlTypeError), (tmp_path / "h.gguf", None, G.GgmlValueError),
                             (str(tmp_path / "a\0b.png"), None, G.GgmlValueError),
                             (tmp_path / "h.png", 3, G.GgmlTypeError),
                             (tmp_path / "h.png", "x" * 100000, G.GgmlValueError),  # hung in matplotlib
                             (tmp_path / "no" / "dir" / "h.png", None, G.GgmlValueError)):
        with pytest.raises(exc):
            G.ggml_plot_history(hist, path, title)


@pytest.mark.skipif("rpc" not in G.ggml_backends_built(), reason="the RPC backend was not built")
def test_rpc_strings_and_numbers_are_checked_before_c():
    for call in (lambda: G.ggml_rpc_probe("a\0b:50052"), lambda: G.ggml_rpc_probe("host:５００５２"),
                 lambda: G.ggml_rpc_probe("127.0.0.1:1", float("nan")),
                 lambda: G.ggml_rpc_probe("127.0.0.1:1", 2 ** 70), lambda: G.ggml_rpc_probe("127.0.0.1:1", -1),
                 lambda: G.ggml_backend_rpc_add_server("a\0b:1"),
                 lambda: G.ggml_backend_rpc_add_server("127.0.0.1:1", timeout="2"),
                 lambda: G.ggml_backend_rpc_start_server("a\0b:1"),
                 lambda: G.ggml_backend_rpc_start_server("127.0.0.1:1", n_threads=2 ** 70),
                 lambda: G.ggml_backend_rpc_start_server("127.0.0.1:1", cache_dir=3),
                 lambda: G.ggml_backend_rpc_start_server("127.0.0.1:1", cache_dir="a\0b"),
                 lambda: G.ggml_backend_rpc_start_server("127.0.0.1:1", devices="CPU")):
        with pytest.raises(G.GgmlpyError):
            call()
    assert G.ggml_rpc_probe("no-such-host.invalid:1", 0.2) is False


def test_lists_where_lists_are_expected():
    backend = G.ggml_backend_cpu_init()
    sched = G.ggml_backend_sched_new([backend], parallel=False)
    ctx = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, F32, 4, 8))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, F32, 4, 2))
    out = G.ggml_mul_mat(ctx, w, x)
    G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    ds = G.ggml_opt_dataset_init(F32, F32, 4, 2, 16)
    mse = G.ggml_opt_loss_type_mse()
    for kwargs, name in (({"loss_weights": 0.5}, "loss_weights"), ({"head_names": 3.0}, "head_names")):
        with pytest.raises(G.GgmlTypeError, match=name):  # was TypeError: 'float' object is not iterable
            G.ggml_fit_opt_multi(sched, ctx, x, [out], ds, [mse], silent=True, **kwargs)
    with pytest.raises(G.GgmlTypeError, match="loss_types"):
        G.ggml_opt_init_for_fit_multi(sched, None, None, ctx_compute=ctx, inputs=x, outputs=[out])


def test_leftover_python_errors_become_ggmlpy_errors(tensors):
    """What the checks miss leaves a public function as a ggmlpy error naming it (the original chained)."""
    ctx, a = tensors
    with pytest.raises(G.GgmlValueError, match="ggml_new_graph_custom") as info:
        G.ggml_new_graph_custom(ctx, 64, np.zeros((2, 2)))  # numpy: truth value of an array is ambiguous
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(G.GgmlpyError):
        G.ggml_opt_reset(None, np.zeros((2, 2)))


def test_the_callers_own_errors_pass_unchanged():
    backend = G.ggml_backend_cpu_init()
    sched = G.ggml_backend_sched_new([backend], parallel=False)
    ctx = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, F32, 4, 8))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, F32, 4, 1))
    out = G.ggml_mul_mat(ctx, w, x)
    G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    G.ggml_backend_tensor_set_data(w, np.zeros(4))

    def gen():
        yield np.zeros((8, 4)), np.zeros(8)
        raise TypeError("the generator's own")

    for prefetch in (0, 2):
        with pytest.raises(TypeError, match="the generator's own") as info:
            G.ggml_fit_opt_gen(sched, ctx, x, out, gen, silent=True, prefetch=prefetch)
        assert not isinstance(info.value, G.GgmlpyError)

    def callback(epoch, logs, state):
        return 1 / 0

    with pytest.raises(ZeroDivisionError) as info:
        G.ggml_fit_opt_gen(sched, ctx, x, out, [(np.zeros((8, 4)), np.zeros(8))], silent=True,
                           callbacks=[{"on_epoch_end": callback}])
    assert not isinstance(info.value, G.GgmlpyError)


def test_errors_name_tensors_by_their_user_given_name():
    """ggml names unnamed graph leafs 'leaf_0': a message says the tensor is unnamed, and uses real names."""
    backend = G.ggml_backend_cpu_init()
    sched = G.ggml_backend_sched_new([backend], parallel=False)
    ctx = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, F32, 4, 8))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, F32, 4, 1))
    out = G.ggml_mul_mat(ctx, w, x)
    G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    G.ggml_backend_tensor_set_data(w, np.zeros(4))
    transposed = [(np.zeros((4, 8)), np.zeros(8))]
    with pytest.raises(G.GgmlValueError) as info:
        G.ggml_fit_opt_gen(sched, ctx, x, out, transposed, silent=True)
    assert "an unnamed F32 [4, 8] tensor" in str(info.value) and "('leaf_0')" not in str(info.value)
    G.ggml_set_name(x, "pixels")
    with pytest.raises(G.GgmlValueError, match=r"inputs\[0\] \(tensor 'pixels' \(F32 \[4, 8\]\)\)"):
        G.ggml_fit_opt_gen(sched, ctx, x, out, transposed, silent=True)
    with pytest.raises(G.GgmlValueError, match="tensor 'pixels'"):
        G.ggml_backend_tensor_set_data(x, np.zeros((4, 8)))


def test_pool_2d_output_size_follows_ggml_exactly():
    """ggml computes (n + 2p - k) / s + 1 in float before truncating: a kernel larger than the input by less
    than a stride gives 0.5 -> 0 there (GGML_ASSERT(ne[1] > 0) aborted), where ggmlpy had predicted 1.
    Found by the fuzz suite (tests/fuzz, family ops)."""
    code = textwrap.dedent("""
        import ggmlpy as G
        ctx = G.ggml_init(1 << 20, no_alloc=True)
        a = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 3, 1, 6, 5)
        try:
            G.ggml_pool_2d(ctx, a, 0, 2, 2, 2, 2)
        except G.GgmlValueError as e:
            print("REFUSED", e)
        print("SHAPE", G.ggml_tensor_shape(G.ggml_pool_2d(ctx, a, 1, 2, 1, 2, 1)))
    """)
    rc, out, err = run_in_subprocess(code)
    assert rc == 0, f"rc={rc}: {err[-1500:]}"
    assert "REFUSED ggml_pool_2d: the pooled size would be 1x0" in out and "SHAPE (1, 1, 6, 5)" in out, out


def test_scale_of_a_transposed_row_is_refused():
    """A transposed [1, n] tensor passes ggml_is_contiguous (size-1 dimensions are skipped) but not the
    GGML_ASSERT(ggml_is_padded_1d(a)) of ggml_scale, which aborted. Found by the fuzz suite (family ops)."""
    code = textwrap.dedent("""
        import ggmlpy as G
        ctx = G.ggml_init(1 << 20, no_alloc=True)
        t = G.ggml_transpose(ctx, G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 1, 2, 5, 5))
        for call in (lambda: G.ggml_scale(ctx, t, 2.0), lambda: G.ggml_scale_bias(ctx, t, 2.0, 1.0)):
            try:
                call()
            except G.GgmlValueError as e:
                print("REFUSED", e)
        print("CONT", G.ggml_tensor_shape(G.ggml_scale(ctx, G.ggml_cont(ctx, t), 2.0)))
    """)
    rc, out, err = run_in_subprocess(code)
    assert rc == 0, f"rc={rc}: {err[-1500:]}"
    assert out.count("REFUSED") == 2 and "ggml_cont" in out and "CONT (2, 1, 5, 5)" in out, out


# ---------------------------------------------------------------- ggmlpy's own bugs are not the caller's fault

class _NoFunctions:
    """Stands in for the C library so that ggmlpy's own code raises AttributeError, as a bug of ours would."""


def test_an_internal_error_says_so_and_asks_for_a_report(monkeypatch):
    from ggmlpy.graph import context as module
    monkeypatch.setattr(module, "lib", _NoFunctions())
    with pytest.raises(G.GgmlStateError, match=r"ggml_tensor_overhead: internal error in ggmlpy \(AttributeError.*"
                                               r"not in your arguments; please report it") as info:
        G.ggml_tensor_overhead()
    assert isinstance(info.value.__cause__, AttributeError)


def _ggmlpy_function(body: str):
    """A function whose code counts as ggmlpy's own (its file name lies in the package), guarded."""
    from pathlib import Path

    from ggmlpy._guard import guard
    namespace: dict = {}
    exec(compile(f"import numpy as np\ndef f(i):\n    {body}\n", str(Path(G.__file__).parent / "fake.py"), "exec"),
         namespace)
    namespace["f"].__name__ = "ggml_fake"
    return guard(namespace["f"])


def test_a_lookup_error_raised_in_ggmlpy_is_internal_one_raised_in_numpy_blames_the_argument():
    with pytest.raises(G.GgmlStateError, match="internal error in ggmlpy"):
        _ggmlpy_function("return [][i]")(1)
    with pytest.raises(G.GgmlValueError, match="out of range or inconsistent.*if the arguments match it, this is a "
                                               "bug in ggmlpy") as info:
        _ggmlpy_function("return np.take(np.zeros(2), i)")(5)
    assert isinstance(info.value.__cause__, IndexError) and "internal" not in str(info.value)


def test_a_converted_error_keeps_the_history_of_the_completed_epochs():
    """The fit loop attaches .history to whatever leaves it; the guard's replacement carries it on."""
    fit = _ggmlpy_function("e = ValueError('bad value'); e.history = ['epoch 1']; raise e")
    with pytest.raises(G.GgmlValueError) as info:
        fit(0)
    assert info.value.history == ["epoch 1"] and isinstance(info.value.__cause__, ValueError)




def _wrapper_frames(public, exc: BaseException) -> list[str]:
    """The frames of ggmlpy's wrappers of the public function ``public`` in the traceback of ``exc`` and of the
    errors it was raised from, as Python prints them: the package's frames above the function's own (the
    function of that name in its module, before the package wrapped it)."""
    own = getattr(sys.modules[public.__module__], public.__name__).__code__
    package = os.path.dirname(G.__file__) + os.sep
    found, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code is not own:
            if tb.tb_frame.f_code.co_filename.startswith(package):
                found.append(f"{type(exc).__name__}: {tb.tb_frame.f_code.co_name} at line {tb.tb_lineno}")
            tb = tb.tb_next
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return found

def test_a_failing_public_call_shows_one_wrapper_frame(tensors):
    """Between the caller's line and the function that refuses, a traceback shows one frame of ggmlpy's
    wrapper (the guard, which also takes the context's lock), whether the error leaves as raised, converted
    (its original chained), or for a call that does not match the signature."""
    ctx, a = tensors
    calls = [(G.ggml_add, (ctx, a, 2)),                                  # refused by the op's own check
             (G.ggml_add, (ctx, a)),                                     # not the function's signature
             (G.ggml_new_graph_custom, (ctx, 64, np.zeros((2, 2)))),     # numpy's error, converted
             (G.ggml_fit, (None, np.zeros((4, 2)), np.zeros(4))),        # the model layer
             (G.ggml_backend_tensor_set_data, (a, np.zeros(3)))]         # no context first
    for public, args in calls:
        with pytest.raises(G.GgmlpyError) as info:
            public(*args)
        frames = _wrapper_frames(public, info.value)
        assert len(frames) == 1, (public.__name__, frames)
