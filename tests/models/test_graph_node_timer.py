"""patches/0079: the CPU backend times each node inside the graph it computes (``GraphNodeTimer``), and
``ggml_model_profile`` uses it for a step on the CPU alone.

What is checked: the entries follow the graph's nodes in order (views left out), one per compute's node with a
fused pair as one entry (``ADD+RELU``, counting 2 nodes); the times lie inside the compute (their sum is at most the
compute's wall time, and the longest op of a graph whose ops differ a hundredfold in work is the largest one); a
compute on another thread is not seen (the timer is the calling thread's); too many entries raise; and a profile of
a CPU model counts the placement's nodes, with the ReLU backward's STEP + MUL fused as the plain step computes it.
"""
import threading
import time

import numpy as np
import pytest

import ggmlpy as g
from ggmlpy.compute.profile import GraphNodeTimer, node_timer, NodeTimer
from ggmlpy.errors import GgmlStateError
from ggmlpy.models.placement_report import ggml_model_profile
from tests.helpers.compute import ctx_size, graph_inputs


def _cpu(threads: int = 2):
    be = g.ggml_backend_cpu_init()
    g.ggml_backend_cpu_set_n_threads(be, threads)
    return be


@pytest.fixture
def small_graph():
    """relu(a b^T + bias), reshaped, summed along rows, on a CPU scheduler: MUL_MAT (39 MFLOP), ADD+RELU (fused),
    SUM_ROWS."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 384)).astype(np.float32)
    b = rng.standard_normal((200, 384)).astype(np.float32)
    bias = rng.standard_normal(256).astype(np.float32)
    be = _cpu()
    with graph_inputs([a, b, bias], be, ctx_size(16, 64)) as (tensors, ctx, owned):
        y = g.ggml_relu(ctx, g.ggml_add(ctx, g.ggml_mul_mat(ctx, tensors[0], tensors[1]), tensors[2]))
        out = g.ggml_sum_rows(ctx, g.ggml_reshape_2d(ctx, y, 512, 100))   # a RESHAPE: no work, no entry
        graph = g.ggml_new_graph_custom(ctx, 64, False)
        g.ggml_build_forward_expand(graph, out)
        sched = g.ggml_backend_sched_new([be], parallel=False, graph_size=64)
        owned.append(sched)
        g.ggml_backend_sched_alloc_graph(sched, graph)
        yield sched, graph, out
    be.free()


def test_entries_follow_the_graph_with_fused_pairs_as_one(small_graph):
    sched, graph, _ = small_graph
    timer = node_timer(sched)
    assert isinstance(timer, GraphNodeTimer)
    t0 = time.perf_counter()
    with timer:
        g.ggml_backend_sched_graph_compute(sched, graph)
    wall = time.perf_counter() - t0
    assert [(n.op, n.nodes) for n in timer.nodes] == [("MUL_MAT", 1), ("ADD+RELU", 2), ("SUM_ROWS", 1)]
    assert timer.nodes[0].shape == (256, 200) and timer.nodes[1].shape == (256, 200)
    assert timer.nodes[0].sources == ((384, 256), (384, 200))
    assert all(n.seconds > 0 for n in timer.nodes)
    assert sum(n.seconds for n in timer.nodes) <= wall
    # the product (39 MFLOP) against a pass over 51k floats and sums of 512: the product is the slowest, by its
    # median over 7 computes (a preemption can lengthen any one entry)
    with GraphNodeTimer(sched) as again:
        for _ in range(7):
            g.ggml_backend_sched_graph_compute(sched, graph)
    medians = {op: np.median([n.seconds for n in again.nodes if n.op == op]) for op in ("MUL_MAT", "ADD+RELU",
                                                                                         "SUM_ROWS")}
    assert max(medians, key=medians.get) == "MUL_MAT"


def test_each_compute_is_timed_and_the_timer_is_gone_after_the_block(small_graph):
    sched, graph, _ = small_graph
    with GraphNodeTimer(sched) as timer:
        for _ in range(3):
            g.ggml_backend_sched_graph_compute(sched, graph)
    assert [n.op for n in timer.nodes] == ["MUL_MAT", "ADD+RELU", "SUM_ROWS"] * 3
    g.ggml_backend_sched_graph_compute(sched, graph)   # nothing left pointing at the freed timer
    assert len(timer.nodes) == 9


def test_a_timer_entered_again_appends_only_that_blocks_computes(small_graph):
    sched, graph, _ = small_graph
    timer = GraphNodeTimer(sched)
    for blocks in (1, 2):
        with timer:
            g.ggml_backend_sched_graph_compute(sched, graph)
        assert [n.op for n in timer.nodes] == ["MUL_MAT", "ADD+RELU", "SUM_ROWS"] * blocks


def test_nested_timers_take_turns_and_one_timer_cannot_nest_in_itself(small_graph):
    """An inner timer takes the thread's computes while it is entered; the outer one times the rest (the C setter
    hands back the timer it replaced, and leaving puts it back)."""
    sched, graph, _ = small_graph
    with GraphNodeTimer(sched) as outer:
        g.ggml_backend_sched_graph_compute(sched, graph)
        with GraphNodeTimer(sched) as inner:
            g.ggml_backend_sched_graph_compute(sched, graph)
            g.ggml_backend_sched_graph_compute(sched, graph)
        g.ggml_backend_sched_graph_compute(sched, graph)
        with pytest.raises(GgmlStateError, match="already entered"):
            with outer:
                pass
    assert len(outer.nodes) == 6 and len(inner.nodes) == 6
    g.ggml_backend_sched_graph_compute(sched, graph)   # no timer left on the thread
    assert len(outer.nodes) == 6


def test_a_compute_on_another_thread_is_not_timed(small_graph):
    sched, graph, _ = small_graph
    with GraphNodeTimer(sched) as timer:
        worker = threading.Thread(target=g.ggml_backend_sched_graph_compute, args=(sched, graph))
        worker.start()
        worker.join()
    assert timer.nodes == []


def test_more_entries_than_the_timer_holds_raise(small_graph, monkeypatch):
    sched, graph, _ = small_graph
    monkeypatch.setattr(GraphNodeTimer, "CAPACITY", 5)
    with pytest.raises(GgmlStateError, match="more than the 5"):
        with GraphNodeTimer(sched):
            for _ in range(2):   # 2 x (1 start + 3 nodes)
                g.ggml_backend_sched_graph_compute(sched, graph)


def test_a_scheduler_with_a_non_cpu_backend_is_timed_node_by_node(small_graph):
    sched, _, _ = small_graph
    assert isinstance(node_timer(sched, used=["CPU"]), GraphNodeTimer)
    assert isinstance(node_timer(sched, used=["Vulkan0"]), NodeTimer)   # a backend the scheduler does not have
    assert isinstance(node_timer(sched, used=[]), NodeTimer)


def test_a_cpu_models_profile_is_taken_in_one_graph():
    """A dense ReLU network on the CPU: its profile's nodes add up to the placement's, the ReLU backward's STEP and
    MUL and the bias's ADD and RELU each one entry of 2 nodes. (That the times lie inside the compute is
    checked on one compute above; a profiled step against the best plain one would depend on the machine's load.)"""
    m = g.ggml_model_sequential()
    m = g.ggml_layer_dense(m, 64, activation="relu", input_shape=(32,))
    m = g.ggml_compile(g.ggml_layer_dense(m, 4, activation="softmax"), loss="sparse_categorical_crossentropy",
                       backend="cpu")
    p = ggml_model_profile(m, batch_size=64, steps=2)
    placement = g.ggml_model_placement(m, batch_size=64)
    assert p.method == "in one graph" and "in one graph" in str(p)
    assert p.nodes_per_step == sum(placement.op_counts().values())
    fused = {n.op: n.nodes for n in p.nodes if n.nodes > 1}
    assert fused == {"STEP+MUL": 2, "ADD+RELU": 2}
    assert p.entries_per_step == p.nodes_per_step - 2
    assert p.node_seconds > 0 and all(n.seconds > 0 for n in p.nodes)
