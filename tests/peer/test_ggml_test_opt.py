"""ggml's own optimizer tests (tests/test-opt.cpp in ggml), as ggmlpy users would write them.

Our translation, from the facts those tests check: a dataset's batches read into 1-D tensors of
``ndata_batch * ne_datapoint`` values, in order without shuffling and each datapoint exactly once per
epoch with it; shards stay whole; and ggml-opt trains a one-weight regression to its exact answer.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G


NE_DATAPOINT, NE_LABEL, NDATA = 2, 1, 6


def _dataset(ndata_shard: int):
    ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, NE_DATAPOINT, NE_LABEL, NDATA, ndata_shard)
    idata = np.arange(NDATA)
    data = 16.0 * idata[:, None] + np.arange(NE_DATAPOINT)[None, :]   # datapoint i: 16 i + j
    labels = 16.0 * (16.0 * idata[:, None] + np.arange(NE_LABEL)[None, :])
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), data.astype(np.float32))
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), labels.astype(np.float32))
    return ds


def _flat_batch_tensors(backend, ndata_batch: int):
    ctx = G.ggml_init(4 * G.ggml_tensor_overhead(), no_alloc=True)
    data = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, ndata_batch * NE_DATAPOINT)
    labels = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, ndata_batch * NE_LABEL)
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    return ctx, buf, data, labels


# every batch size that is a whole number of shards and divides the data, as ggml's test loops over
SIZES = [(shard, batch) for shard in (1, 2, 3, 6) for batch in (1, 2, 3, 6) if batch % shard == 0]


@pytest.mark.parametrize("ndata_shard, ndata_batch", SIZES)
def test_batches_into_flat_tensors_come_in_order(backend, ndata_shard, ndata_batch):
    ds = _dataset(ndata_shard)
    ctx, buf, data, labels = _flat_batch_tensors(backend, ndata_batch)
    for ib in range(NDATA // ndata_batch):
        G.ggml_opt_dataset_get_batch(ds, data, labels, ib)
        points = np.arange(ib * ndata_batch, (ib + 1) * ndata_batch)
        want = (16.0 * points[:, None] + np.arange(NE_DATAPOINT)[None, :]).reshape(-1)
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(data), want)
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(labels), 256.0 * points)
    for o in (buf, ctx, ds):
        o.free()


def test_shuffled_batches_keep_datapoints_whole_and_each_once(backend, sched):
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, NE_DATAPOINT, 2))
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, NE_DATAPOINT, 1))
    wbuf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    G.ggml_backend_tensor_set_data(w, np.zeros((1, NE_DATAPOINT), np.float32))
    opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), ctx_compute=ctx, inputs=x,
                          outputs=G.ggml_mul_mat(ctx, w, x))
    ds = _dataset(1)
    bctx, buf, data, labels = _flat_batch_tensors(backend, 2)
    G.ggml_opt_dataset_shuffle(opt, ds, -1)
    seen = []
    for ib in range(NDATA // 2):
        G.ggml_opt_dataset_get_batch(ds, data, labels, ib)
        d = G.ggml_backend_tensor_get_data(data).reshape(2, NE_DATAPOINT)
        first = d[:, 0] / 16.0
        np.testing.assert_array_equal(d[:, 1], d[:, 0] + 1)            # a datapoint stays whole
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(labels), 256.0 * first)  # with its label
        seen += first.tolist()
    assert sorted(seen) == list(range(NDATA))
    for o in (buf, bctx, opt, wbuf, ctx, ds):
        o.free()


def test_a_multi_axis_batch_of_another_datapoint_shape_is_still_refused(backend):
    ds = _dataset(1)
    ctx = G.ggml_init(2 * G.ggml_tensor_overhead(), no_alloc=True)
    wrong = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 4)  # 12 values: 6 datapoints of 2, but rows of 3
    labels = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 6)
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    with pytest.raises(G.GgmlValueError, match="datapoints of 3 values"):
        G.ggml_opt_dataset_get_batch(ds, wrong, labels, 0)
    for o in (buf, ctx, ds):
        o.free()


def test_ggml_opt_fit_finds_the_regression_weight(backend, sched):
    """ggml's regression test: y = a x + b fitted by ggml_opt_fit; the weights reach the generating ones."""
    rng = np.random.default_rng(3)
    ndata, a_true, b_true = 64, 0.75, -0.5
    xs = rng.uniform(-1, 1, size=(ndata, 1)).astype(np.float32)
    ys = (a_true * xs + b_true).astype(np.float32)
    ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 1, 1, ndata, 1)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_data(ds), xs)
    G.ggml_backend_tensor_set_data(G.ggml_opt_dataset_labels(ds), ys)
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 1, 8))
    a = G.ggml_set_param(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 1))
    b = G.ggml_set_param(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 1))
    out = G.ggml_add(ctx, G.ggml_mul(ctx, x, a), b)
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    G.ggml_backend_tensor_set_data(a, [0.0])
    G.ggml_backend_tensor_set_data(b, [0.0])
    G.ggml_opt_fit(sched, ctx, x, out, ds, G.ggml_opt_loss_type_mse(), nepoch=120, nbatch_logical=8,
                   val_split=0.0, silent=True, get_opt_pars=lambda epoch: {"adamw_lr": 0.05})
    assert G.ggml_backend_tensor_get_data(a)[0] == pytest.approx(a_true, abs=2e-2)
    assert G.ggml_backend_tensor_get_data(b)[0] == pytest.approx(b_true, abs=2e-2)
    for o in (buf, ctx, ds):
        o.free()
