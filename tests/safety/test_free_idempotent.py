"""Every ``*_free`` function of ggmlpy is idempotent (python-api.md section 2): a second free does nothing,
and the freed object raises a state error when used, never crashes.

The list of free functions is taken from ``ggmlpy.__all__``: a new one without a case here fails
``test_every_free_function_is_covered`` until one is added.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G


# owned and tested elsewhere (compute/events.py)
SKIP = {"ggml_backend_event_free", "ggml_backend_graph_plan_free",
        # frees no object but ggml's global quantization tables, which the quantizers make again: its own test below
        "ggml_quantize_free"}


def test_quantize_free_twice_then_quantizing_again_works():
    import numpy as np
    x = np.random.default_rng(0).standard_normal(512)
    first = G.quantize_iq2_xs(x, 2, 256, imatrix=np.ones(256))
    assert G.ggml_quantize_free() is None
    assert G.ggml_quantize_free() is None      # a second free does nothing
    assert G.quantize_iq2_xs(x, 2, 256, imatrix=np.ones(256)) == first   # the tables come back, the same


def _ctx():
    ctx = G.ggml_init(1 << 16)
    return ctx, lambda: G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4), {}


def _gguf_empty():
    g = G.gguf_init_empty()
    return g, lambda: G.gguf_get_n_kv(g), {}


def _backend():
    b = G.ggml_backend_cpu_init()
    return b, lambda: G.ggml_backend_name(b), {}


def _buffer():
    ctx = G.ggml_init(4 * G.ggml_tensor_overhead(), no_alloc=True)
    t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
    b = G.ggml_backend_cpu_init()
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, b)
    return buf, lambda: G.ggml_backend_tensor_set_data(t, np.zeros(4)), {"keep": (ctx, b)}


def _sched():
    s = G.ggml_backend_sched_new("cpu")
    return s, lambda: G.ggml_backend_sched_get_n_backends(s), {}


def _gallocr():
    b = G.ggml_backend_cpu_init()
    ga = G.ggml_gallocr_new(b)
    return ga, lambda: G.ggml_gallocr_get_buffer_size(ga, 0), {"keep": b}


def _dataset():
    ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 1, 8, 1)
    return ds, lambda: G.ggml_opt_dataset_ndata(ds), {}


def _opt():
    s = G.ggml_backend_sched_new("cpu")
    opt = G.ggml_opt_init(s, G.ggml_opt_loss_type_mse())   # dynamic graphs: nothing else needed
    return opt, lambda: G.ggml_opt_static_graphs(opt), {"keep": s}


def _result():
    r = G.ggml_opt_result_init()
    return r, lambda: G.ggml_opt_result_ndata(r), {}


def _snapshot():
    m = G.ggml_model_sequential()
    m = G.ggml_layer_dense(m, 2, input_shape=(3,))
    m = G.ggml_compile(m, optimizer="sgd", loss="mse", backend="cpu")
    tr = G.ggml_trainer(m, batch_size=4)
    snap = tr.snapshot()
    x = np.zeros((4, 3), np.float32)
    return snap, lambda: G.ggml_predict(snap, x), {"keep": (m, tr)}


def _gguf_load(tmp_path):
    path = tmp_path / "one.gguf"
    g = G.gguf_init_empty()
    G.gguf_set_val(g, "k", 1)
    G.gguf_write_to_file(g, str(path), only_meta=True)
    G.gguf_free(g)
    loaded = G.gguf_load(path)
    return loaded, lambda: G.gguf_metadata(loaded), {}


CASES = {
    "ggml_free": [_ctx],
    "gguf_free": [_gguf_empty, _gguf_load],
    "ggml_backend_free": [_backend],
    "ggml_backend_buffer_free": [_buffer],
    "ggml_backend_sched_free": [_sched],
    "ggml_gallocr_free": [_gallocr],
    "ggml_opt_dataset_free": [_dataset],
    "ggml_opt_free": [_opt],
    "ggml_opt_result_free": [_result],
    "ggml_snapshot_free": [_snapshot],
}

FREES = sorted(n for n in G.__all__ if n.endswith("_free") and n not in SKIP)


def test_every_free_function_is_covered():
    missing = [n for n in FREES if n not in CASES]
    assert not missing, f"add an idempotency case for {missing}"


@pytest.mark.parametrize("name,make", [(n, f) for n in sorted(CASES) for f in CASES[n]],
                         ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_free_twice_then_use_raises(name, make, tmp_path):
    obj, use, keep = make(tmp_path) if make is _gguf_load else make()
    use()                                   # alive: works
    free = getattr(G, name)
    assert free(obj) is None
    assert free(obj) is None                # a second free does nothing
    with pytest.raises(RuntimeError):       # GgmlStateError is a RuntimeError
        use()
    for v in keep.values():
        for h in (v if isinstance(v, tuple) else (v,)):
            if hasattr(h, "free"):
                h.free()


@pytest.mark.parametrize("name", sorted(CASES))
def test_free_refuses_objects_of_another_kind(name):
    free = getattr(G, name)
    if name == "ggml_snapshot_free":
        free(None)                           # ggmlR's form: NULL is fine
        with pytest.raises(TypeError):
            free(object())
        return
    with pytest.raises(TypeError):
        free(object())
