"""ggml_model_profile: node timings of a training step, checked against the placement of the same step."""
import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.models.placement_report import ggml_model_profile


def _cnn():
    m = g.ggml_model_sequential()
    m = g.ggml_layer_conv_2d(m, 4, (3, 3), activation="relu", input_shape=(8, 8, 1))
    m = g.ggml_layer_max_pooling_2d(m, (2, 2))
    m = g.ggml_layer_flatten(m)
    m = g.ggml_layer_dense(m, 3, activation="softmax")
    return g.ggml_compile(m, loss="sparse_categorical_crossentropy")


def test_profile_times_every_node_of_the_step_and_leaves_the_weights():
    model = _cnn()
    before = {k: v.copy() for k, v in g.ggml_get_weights(model).items()}
    p = ggml_model_profile(model, batch_size=8, steps=2)
    placement = g.ggml_model_placement(model, batch_size=8)
    assert p.nodes_per_step == sum(placement.op_counts().values())
    ops = {op for op, _, _, _ in p.by_op()}
    assert {"CONV_2D_TILED", "CONV_2D_TILED_BACK", "POOL_2D", "POOL_2D_BACK", "OPT_STEP_ADAMW"} <= ops
    assert all(n.seconds >= 0 for n in p.nodes) and p.node_seconds > 0 and p.step_seconds > 0
    assert "nodes per step" in str(p)
    after = g.ggml_get_weights(model)
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])


def test_profile_nodes_carry_their_op_parameters():
    """A node's first four op parameters come with its time: the first convolution's backward asks for the
    kernel's gradient only (params 0, 1: images', kernel's), as its images are the model's input; a second
    convolution's asks for both (what bench_peak.py counts its FLOPs from)."""
    m = g.ggml_model_sequential()
    m = g.ggml_layer_conv_2d(m, 4, (3, 3), activation="relu", input_shape=(8, 8, 1))
    m = g.ggml_layer_conv_2d(m, 2, (3, 3), activation="relu")
    m = g.ggml_compile(g.ggml_layer_dense(g.ggml_layer_flatten(m), 3, activation="softmax"),
                       loss="sparse_categorical_crossentropy", backend="cpu")
    p = ggml_model_profile(m, batch_size=4, steps=1)
    backs = {n.sources[0]: n.params[:2] for n in p.nodes if n.op == "CONV_2D_TILED_BACK"}
    assert backs == {(3, 3, 1, 4): (0, 1), (3, 3, 4, 2): (1, 1)}
    assert all(len(n.params) == 4 for n in p.nodes) and all(len(n.params) == 4 for n in p.slowest(3))


@pytest.mark.parametrize("kw", [{"batch_size": 0}, {"steps": 0}, {"steps": 1.5}])
def test_profile_rejects_bad_arguments(kw):
    with pytest.raises(g.GgmlValueError):
        ggml_model_profile(_cnn(), **kw)


def test_an_error_in_a_watcher_is_raised_when_its_block_ends():
    """ggml's eval callback cannot raise through C: the watcher keeps its first error and raises it when the block
    ends, where the profile's node list (or a placement) would otherwise come back incomplete without a word."""
    from ggmlpy.compute.placement import SchedWatcher
    from tests.helpers.compute import ctx_size, default_backend, graph_inputs

    class Broken(SchedWatcher):
        def _on_eval(self, t, ask):
            if not ask:
                raise KeyError("the watcher's own bug")
            return True

    backend = default_backend()
    with graph_inputs([np.ones((3, 4), np.float32)], backend, ctx_size(8, 16)) as (tensors, ctx_ops, owned):
        y = g.ggml_scale(ctx_ops, g.ggml_exp(ctx_ops, tensors[0]), 2.0)
        graph = g.ggml_new_graph_custom(ctx_ops, 16, False)
        g.ggml_build_forward_expand(graph, y)
        sched = g.ggml_backend_sched_new([backend], parallel=False, graph_size=16)
        owned.append(sched)
        g.ggml_backend_sched_alloc_graph(sched, graph)
        with pytest.raises(KeyError, match="own bug"):
            with Broken(sched):
                g.ggml_backend_sched_graph_compute(sched, graph)
        g.ggml_backend_sched_graph_compute(sched, graph)   # the callback is gone: a plain compute
        np.testing.assert_allclose(g.ggml_backend_tensor_get_data(y).reshape(3, 4), 2 * np.e, rtol=1e-6)
