"""The shared graph checks of ggmlpy/graph/ and ggmlpy/compute/checks.py that stand between a graph and ggml's asserts
and crashes:

* the backward pass: in-place nodes needing a gradient (ggml_build_backward_expand asserts), the split SwiGLU
  (differentiable) against its fused form (aborts), rope frequency factors, soft_max_ext masks and
  cross-entropy labels needing a gradient (ggml_compute_backward asserts);
* index inputs of ggml_get_rows_back and ggml_mul_mat_id (out-of-range indices write outside memory or abort);
* memory: a graph allocation that cannot succeed (ggml's scheduler dereferences the missing buffer), and an
  allocator whose earlier reservation failed (it keeps no buffer and crashes on its next allocation).

Every case that ggml would abort on runs in a fresh interpreter (``run_in_subprocess``): a missing check then
shows up as a failed test (the child died), not as a dead test runner.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute, compute_grad
from tests.helpers.subprocesses import run_in_subprocess


def _run(code: str, timeout: float = 120) -> str:
    rc, out, err = run_in_subprocess(code, timeout=timeout)
    assert rc == 0, f"the interpreter died (rc={rc}): {(out + err)[-2000:]}"
    return out


# ---------------------------------------------------------------- in-place nodes on the gradient path

_BACKWARD = """
import numpy as np, ggmlpy as G
ctx = G.ggml_init(16 * 1024 * 1024, no_alloc=True)
w = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
x = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
extra = []
{setup}
g = G.ggml_new_graph_custom(ctx, 256, True)
G.ggml_build_forward_expand(g, loss)
for e in extra:
    G.ggml_build_forward_expand(g, e)
try:
    G.ggml_build_backward_expand(ctx, g)
except ValueError as e:
    print("VALUEERROR|" + type(e).__name__ + "|" + str(e))
else:
    print("BUILT", G.ggml_graph_get_grad(g, w) is not None)
"""
_LOSS = "loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_sqr(ctx, G.ggml_mul(ctx, w, x))))\n"

INPLACE_REFUSED = {
    # the op made before ggml_set_param: the construction-time check cannot see it
    "relu_inplace_on_the_loss_path": ("y = G.ggml_relu_inplace(ctx, G.ggml_mul(ctx, w, x))\nG.ggml_set_param(w)\n"
                                      "loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_sqr(ctx, y)))", "ggml_relu,"),
    "scale_inplace_side_output": ("extra.append(G.ggml_scale_inplace(ctx, G.ggml_add(ctx, w, x), 2.0))\n"
                                  "G.ggml_set_param(w)\n" + _LOSS, "ggml_scale,"),
    # in place as a side output of a trainable graph (ggml 0.20's ggml_clamp always was)
    "clamp_inplace_side_output": ("extra.append(G.ggml_clamp_inplace(ctx, G.ggml_mul(ctx, w, x), 0.0, 1.0))\n"
                                  "G.ggml_set_param(w)\n" + _LOSS, "ggml_clamp,"),
    "leaky_relu_inplace_side_output": ("G.ggml_set_param(w)\n"
                                       "extra.append(G.ggml_leaky_relu(ctx, G.ggml_mul(ctx, w, x), 0.1, True))\n"
                                       + _LOSS, "ggml_leaky_relu,"),
    # a loss needs a gradient whatever it depends on
    "inplace_loss": ("G.ggml_set_param(w)\n" + _LOSS.replace("loss = ", "l0 = ") +
                     "loss = G.ggml_set_loss(G.ggml_scale_inplace(ctx, G.ggml_sum(ctx, x), 2.0))\nextra.append(l0)",
                     "it is the loss"),
}


@pytest.mark.parametrize("case", sorted(INPLACE_REFUSED))
def test_inplace_node_needing_a_gradient_is_refused(case):
    setup, fix = INPLACE_REFUSED[case]
    out = _run(_BACKWARD.format(setup=setup))
    assert out.startswith("VALUEERROR|GgmlValueError|"), out
    assert "in-place op" in out and fix in out, out


INPLACE_ALLOWED = {
    # views, reshapes, permutes, transposes and copies are views too (view_src), which ggml differentiates
    "views": ("G.ggml_set_param(w)\n"
              "v = G.ggml_cont(ctx, G.ggml_transpose(ctx, G.ggml_reshape_2d(ctx, G.ggml_mul(ctx, w, x), 3, 4)))\n"
              "v = G.ggml_view_1d(ctx, G.ggml_cont(ctx, G.ggml_permute(ctx, v, 1, 0, 2, 3)), 4, 0)\n"
              "c = G.ggml_cpy(ctx, v, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4))\n"
              "loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_sqr(ctx, c)))"),
    # a view of a strided tensor is fine when a later node gave that tensor a gradient first
    "view_of_strided_with_later_user": ("G.ggml_set_param(w)\n"
                                        "t = G.ggml_transpose(ctx, G.ggml_mul(ctx, w, x))\n"
                                        "a = G.ggml_sum(ctx, G.ggml_sqr(ctx, G.ggml_view_1d(ctx, t, 3, 0)))\n"
                                        "b = G.ggml_sum(ctx, G.ggml_sqr(ctx, G.ggml_cont(ctx, t)))\n"
                                        "loss = G.ggml_set_loss(G.ggml_add(ctx, a, b))"),
    # ggml 0.25's ggml_clamp makes a new tensor: as a side output (no gradient reaches it) it builds
    "clamp_side_output": ("G.ggml_set_param(w)\nextra.append(G.ggml_clamp(ctx, G.ggml_mul(ctx, w, x), 0.0, 1.0))\n"
                          + _LOSS),
    # in place on data only: no gradient there
    "inplace_on_data": ("G.ggml_set_param(w)\nextra.append(G.ggml_relu_inplace(ctx, G.ggml_mul(ctx, x, x)))\n" + _LOSS),
}


@pytest.mark.parametrize("case", sorted(INPLACE_ALLOWED))
def test_views_and_inplace_ops_off_the_gradient_path_build(case):
    out = _run(_BACKWARD.format(setup=INPLACE_ALLOWED[case]))
    assert "BUILT True" in out, out


def test_view_of_a_strided_tensor_on_the_gradient_path_is_refused():
    """ggml adds a view's gradient into ggml_scale(viewed, 0), which asserts a contiguous layout."""
    setup = ("G.ggml_set_param(w)\n"
             "v = G.ggml_view_1d(ctx, G.ggml_transpose(ctx, G.ggml_mul(ctx, w, x)), 3, 0)\n"
             "loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_sqr(ctx, v)))")
    out = _run(_BACKWARD.format(setup=setup))
    assert out.startswith("VALUEERROR|GgmlValueError|"), out
    assert "view" in out and "ggml_cont" in out, out


# ---------------------------------------------------------------- the GLU family

def test_split_swiglu_gradients_match_finite_differences():
    """ggml differentiates silu(a) * b with respect to both operands at once."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (3, 4)).astype(np.float32)
    r = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    _, grad = compute_grad(lambda c, t: G.ggml_swiglu_split(c, t, G.ggml_scale(c, t, 0.5)), x, r)
    f = lambda z: z / (1 + np.exp(-z)) * 0.5 * z  # noqa: E731
    z, eps = x.astype(np.float64), 1e-5
    fd = np.zeros_like(z)
    for i in np.ndindex(z.shape):
        zp, zm = z.copy(), z.copy()
        zp[i] += eps
        zm[i] -= eps
        fd[i] = ((f(zp) - f(zm)) * r).sum() / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-3, atol=1e-4)


GLU_REFUSED = {
    "fused_swiglu": "y = G.ggml_swiglu(ctx, G.ggml_concat(ctx, w, x, 0))",
    "split_geglu": "y = G.ggml_geglu_split(ctx, w, x)",
    "fused_reglu": "y = G.ggml_reglu(ctx, G.ggml_concat(ctx, w, x, 0))",
}


@pytest.mark.parametrize("case", sorted(GLU_REFUSED))
def test_glu_forms_without_backward_are_refused(case):
    setup = ("G.ggml_set_param(w)\n" + GLU_REFUSED[case] +
             "\nloss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_sqr(ctx, y)))")
    out = _run(_BACKWARD.format(setup=setup))
    assert out.startswith("VALUEERROR|GgmlValueError|"), out
    assert "GLU (" in out and "ggml_swiglu_split" in out, out


# ---------------------------------------------------------------- sources ggml cannot differentiate

_SOURCES = """
import ggmlpy as G
ctx = G.ggml_init(16 * 1024 * 1024, no_alloc=True)
x = G.ggml_set_param(G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 2, 3))
{setup}
G.ggml_set_param(p)
loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_sqr(ctx, y)))
g = G.ggml_new_graph_custom(ctx, 256, True)
G.ggml_build_forward_expand(g, loss)
try:
    G.ggml_build_backward_expand(ctx, g)
except ValueError as e:
    print("VALUEERROR|" + type(e).__name__ + "|" + str(e))
else:
    print("BUILT")
"""
SOURCES = {
    # made before ggml_set_param(p), so the ops' own checks cannot see it
    "rope_frequency_factors": ("pos = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 3)\n"
                               "p = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)\n"
                               "y = G.ggml_rope_ext(ctx, x, pos, G.ggml_scale(ctx, p, 2.0), 8)", "frequency factors"),
    "soft_max_mask": ("p = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 8, 2)\n"
                      "y = G.ggml_soft_max_ext(ctx, x, G.ggml_scale(ctx, p, 2.0), 1.0, 0.0)", "mask"),
    "cross_entropy_labels": ("p = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 2, 3)\n"
                             "y = G.ggml_cross_entropy_loss(ctx, G.ggml_reshape_2d(ctx, x, 8, 6), "
                             "G.ggml_reshape_2d(ctx, G.ggml_soft_max(ctx, p), 8, 6))", "labels"),
}


@pytest.mark.parametrize("case", sorted(SOURCES))
def test_trainable_source_without_backward_is_refused(case):
    setup, word = SOURCES[case]
    out = _run(_SOURCES.format(setup=setup))
    assert out.startswith("VALUEERROR|GgmlValueError|"), out
    assert word in out and "trainable" in out, out


@pytest.mark.parametrize("case", sorted(SOURCES))
def test_the_same_sources_as_data_build(case):
    setup, _ = SOURCES[case]
    out = _run(_SOURCES.format(setup=setup).replace("G.ggml_set_param(p)\n", ""))
    assert "BUILT" in out, out


# ---------------------------------------------------------------- index inputs

_INDEX = """
import numpy as np, ggmlpy as G
be = G.ggml_backend_cpu_init()
ctx = G.ggml_init(1 << 20, no_alloc=True)
{build}
buf = G.ggml_backend_alloc_ctx_tensors(ctx, be)
G.ggml_backend_tensor_set_data(idx, np.array({values}, np.int32))
g = G.ggml_new_graph_custom(ctx, 64, False)
G.ggml_build_forward_expand(g, out)
s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
try:
    G.ggml_backend_sched_graph_compute(s, g)
except ValueError as e:
    print("VALUEERROR|" + str(e))
else:
    print("COMPUTED", G.ggml_backend_tensor_get_data(out).tolist())
"""
_GET_ROWS_BACK = ("a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 2)\n"
                  "idx = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 2)\n"
                  "out = G.ggml_get_rows_back(ctx, a, G.ggml_reshape_1d(ctx, idx, 2), "
                  "G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 4))")
_MUL_MAT_ID = ("ex = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 4, 3, 2)\n"
               "idx = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_I32, 1, 2)\n"
               "out = G.ggml_mul_mat_id(ctx, ex, G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 4, 1, 2), idx)")


@pytest.mark.parametrize("build, values, bound, what", [
    (_GET_ROWS_BACK, [1, 4], 4, "ggml_get_rows_back"),
    (_GET_ROWS_BACK, [-1, 0], 4, "ggml_get_rows_back"),
    (_MUL_MAT_ID, [0, 2], 2, "ggml_mul_mat_id"),
    (_MUL_MAT_ID, [-3, 1], 2, "ggml_mul_mat_id"),
], ids=["get_rows_back_high", "get_rows_back_negative", "mul_mat_id_high", "mul_mat_id_negative"])
def test_out_of_range_index_inputs_are_refused(build, values, bound, what):
    out = _run(_INDEX.format(build=build, values=values))
    assert out.startswith("VALUEERROR|"), out
    assert what in out and f"[0, {bound})" in out, out


@pytest.mark.parametrize("build, values", [(_GET_ROWS_BACK, [0, 3]), (_MUL_MAT_ID, [1, 0])],
                         ids=["get_rows_back", "mul_mat_id"])
def test_in_range_index_inputs_compute(build, values):
    out = _run(_INDEX.format(build=build, values=values))
    assert "COMPUTED" in out, out


def test_index_bounds_name_the_op_and_keep_the_smallest_bound():
    ctx = G.ggml_init(1 << 20, no_alloc=True)
    try:
        idx = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_I32, 1, 2)
        ex = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 4, 3, 5)
        mm = G.ggml_mul_mat_id(ctx, ex, G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 4, 1, 2), idx)
        rows = G.ggml_get_rows(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 7), G.ggml_reshape_1d(ctx, idx, 2))
        from ggmlpy.graph.indices import index_bounds
        from ggmlpy.graph.nodes import ptr_key
        (bound,) = index_bounds(None, [mm]).values()
        assert bound == 5 and "ggml_mul_mat_id" in bound.what
        both = index_bounds(None, [mm, rows])[ptr_key(idx.ptr)]
        assert both == 5
        (alone,) = index_bounds(None, [rows]).values()
        assert alone == 7 and "ggml_get_rows" in alone.what
    finally:
        ctx.free()


# ---------------------------------------------------------------- memory of a graph allocation

_HUGE = """
import numpy as np, ggmlpy as G
from tests.helpers.compute import compute
try:
    compute(lambda c, t: {build}, np.zeros(4, np.float32))
except ValueError as e:
    print("VALUEERROR|" + type(e).__name__ + "|" + str(e))
else:
    print("COMPUTED")
"""


@pytest.mark.parametrize("build, op", [
    ("G.ggml_pad(c, t, 2**30, 2**20)", "PAD"),
    ("G.ggml_arange(c, 0, 1e15)", "ARANGE"),
], ids=["pad", "arange"])
def test_tensor_larger_than_memory_is_refused_before_allocation(build, op):
    out = _run(_HUGE.format(build=build))
    assert out.startswith("VALUEERROR|GgmlValueError|ggml_backend_sched_alloc_graph: "), out
    assert f"the result of {op}" in out and "more than the memory of CPU" in out and "bytes" in out, out


_HUGE_ALLOCATORS = """
import numpy as np, ggmlpy as G
be = G.ggml_backend_cpu_init()
ctx = G.ggml_init(1 << 20, no_alloc=True)
x = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
buf = G.ggml_backend_alloc_ctx_tensors(ctx, be)
g = G.ggml_new_graph_custom(ctx, 64, False)
G.ggml_build_forward_expand(g, G.ggml_pad(ctx, x, 2**30, 2**20))
s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
ga = G.ggml_gallocr_new(be)
for name, call in [("sched_reserve", lambda: G.ggml_backend_sched_reserve(s, g)),
                   ("sched_compute", lambda: G.ggml_backend_sched_graph_compute(s, g)),
                   ("gallocr_reserve", lambda: G.ggml_gallocr_reserve(ga, g)),
                   ("gallocr_alloc", lambda: G.ggml_gallocr_alloc_graph(ga, g))]:
    try:
        call()
    except ValueError as e:
        print(name, "VALUEERROR", "needs" in str(e))
    else:
        print(name, "DONE")
"""


def test_every_allocation_path_refuses_a_tensor_larger_than_memory():
    out = _run(_HUGE_ALLOCATORS)
    for name in ("sched_reserve", "sched_compute", "gallocr_reserve", "gallocr_alloc"):
        assert f"{name} VALUEERROR True" in out, out


# Four outputs of a third of the machine's memory each: every tensor fits, the graph does not (the allocator
# keeps outputs). ggml's reservation fails (malloc), and the allocator keeps no buffer afterwards; the next
# graph of the same size crashed ggml (scheduler: already the failed allocation itself).
_TOO_LARGE_TOGETHER = """
import numpy as np, ggmlpy as G
from ggmlpy.core.sysmem import physical_memory
be = G.ggml_backend_cpu_init()
ctx = G.ggml_init(1 << 20, no_alloc=True)
x = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
buf = G.ggml_backend_alloc_ctx_tensors(ctx, be)
G.ggml_backend_tensor_set_data(x, np.arange(4, dtype=np.float32))
def graph(n):
    g = G.ggml_new_graph_custom(ctx, 64, False)
    outs = []
    for k in range(4):
        o = G.ggml_pad(ctx, G.ggml_scale(ctx, x, k + 1.0), n, 0)
        G.ggml_set_output(o)
        G.ggml_build_forward_expand(g, o)
        outs.append(o)
    return g, outs
big, _ = graph(physical_memory() // 12)
small, outs = graph(4)
if "{which}" == "sched":
    s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
    alloc = lambda g: G.ggml_backend_sched_alloc_graph(s, g)
    run = lambda g: G.ggml_backend_sched_graph_compute(s, g)
else:
    ga = G.ggml_gallocr_new(be)
    alloc = lambda g: G.ggml_gallocr_alloc_graph(ga, g)
    run = lambda g: (alloc(g), G.ggml_backend_graph_compute(be, g))
for attempt in range(2):
    try:
        alloc(big)
    except RuntimeError as e:
        print("STATEERROR|" + type(e).__name__ + "|" + str(e))
run(small)
print("SMALL", G.ggml_backend_tensor_get_data(outs[1])[:6].tolist())
"""


@pytest.mark.parametrize("which", ["sched", "gallocr"])
def test_failed_graph_allocation_raises_and_the_allocator_recovers(which):
    try:
        overcommit = int(open("/proc/sys/vm/overcommit_memory").read())
    except (OSError, ValueError):
        overcommit = None
    if overcommit not in (0, 2):
        pytest.skip("needs Linux refusing a malloc larger than the machine's memory (vm.overcommit_memory 0 or 2)")
    out = _run(_TOO_LARGE_TOGETHER.format(which=which))
    assert out.count("STATEERROR|GgmlStateError|") == 2, out
    assert "could not" in out and "smaller graphs" in out, out
    assert "SMALL [0.0, 2.0, 4.0, 6.0, 0.0, 0.0]" in out, out


def test_normal_graphs_are_not_refused(rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    (out,) = compute(lambda c, t: G.ggml_pad(c, G.ggml_sqr(c, t), 3, 1), x)
    assert out.shape == (1, 1, 4, 8)
    np.testing.assert_allclose(out[0, 0, :3, :5], x.astype(np.float64) ** 2, rtol=1e-6)


_RESERVE_THEN_ALLOC = """
import numpy as np, ggmlpy as G
vk = G.ggml_backend_init_by_name("Vulkan0")
cpu = G.ggml_backend_cpu_init()
ctx = G.ggml_init(1 << 20, no_alloc=True)
x = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
buf = G.ggml_backend_alloc_ctx_tensors(ctx, vk)
G.ggml_backend_tensor_set_data(x, np.arange(4, dtype=np.float32) + 1)
y = G.ggml_scale(ctx, x, 2.0)
out = G.ggml_sum(ctx, y)
G.ggml_set_output(out)
g = G.ggml_new_graph_custom(ctx, 64, False)
G.ggml_build_forward_expand(g, out)
s = G.ggml_backend_sched_new([vk, cpu], parallel=False, graph_size=64)
G.ggml_backend_sched_set_tensor_backend(s, y, cpu)  # the CPU reads x from Vulkan: ggml copies it
print("RESERVED", G.ggml_backend_sched_reserve(s, g))
G.ggml_backend_sched_alloc_graph(s, g)
G.ggml_backend_sched_graph_compute(s, g)
print("SUM", float(G.ggml_backend_tensor_get_data(out)[0]))
"""


@pytest.mark.vulkan
def test_a_graph_reserved_then_allocated_reads_its_inputs():
    """ggml's graph split points operands at its copies of inputs from another backend; a reservation (which
    ggmlpy also makes before allocating a graph that might not fit) must not leave the graph pointing at copies
    of a split that is gone (the sum read garbage)."""
    if "vulkan" not in [b.lower() for b in G.ggml_backends_built()] or G.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("needs a Vulkan device (for lavapipe, set GGML_VK_VISIBLE_DEVICES=0 before starting the tests)")
    out = _run(_RESERVE_THEN_ALLOC)
    assert "RESERVED True" in out and "SUM 20.0" in out, out


_CONTEXT_MEMORY_ON_A_GPU_SCHEDULER = """
import numpy as np, ggmlpy as G
sched = G.ggml_backend_sched_new([G.ggml_backend_init_by_name("Vulkan0")], parallel=False)
ctx = G.ggml_init(1 << 20)                         # context memory: the tensor has data but no buffer
a = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
G.ggml_backend_tensor_set_data(a, np.arange(4, dtype=np.float32))
ops = G.ggml_init(1 << 20, no_alloc=True)
out = G.ggml_sqr(ops, G.ggml_add(ops, a, a))
graph = G.ggml_new_graph(ops)
G.ggml_build_forward_expand(graph, out)
try:
    G.ggml_backend_sched_graph_compute(sched, graph)
    print("COMPUTED")
except G.GgmlStateError as exc:
    print("REFUSED", "context memory" in str(exc))
"""


@pytest.mark.vulkan
def test_context_memory_on_a_scheduler_with_a_gpu_is_refused():
    """ggml's scheduler moves tensors between devices through their buffers; one in a context's own memory has
    none, and ggml dereferenced it (segfault)."""
    if "vulkan" not in [b.lower() for b in G.ggml_backends_built()] or G.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("needs a Vulkan device (for lavapipe, set GGML_VK_VISIBLE_DEVICES=0 before starting the tests)")
    out = _run(_CONTEXT_MEMORY_ON_A_GPU_SCHEDULER)
    assert "REFUSED True" in out, out


# a CPU scheduler and a two-weight model y = w x, for the dynamic opt graph cases
_DYNAMIC_PRELUDE = """
import ggmlpy as G
be = G.ggml_backend_cpu_init()
sched = G.ggml_backend_sched_new([be], parallel=False, graph_size=512)
cs = G.ggml_init(8 * G.ggml_tensor_overhead(), no_alloc=True)
x = G.ggml_set_input(G.ggml_new_tensor_2d(cs, G.GGML_TYPE_F32, 3, 4))
w = G.ggml_set_param(G.ggml_new_tensor_2d(cs, G.GGML_TYPE_F32, 3, 2))
buf = G.ggml_backend_alloc_ctx_tensors(cs, be)
"""

_DYNAMIC_OPT_IN_A_SMALL_CONTEXT = _DYNAMIC_PRELUDE + """
cc = G.ggml_init(64 * G.ggml_tensor_overhead() + 3 * G.ggml_graph_overhead(), no_alloc=True)
opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), G.ggml_opt_optimizer_type_sgd(), 1)
out = G.ggml_mul_mat(cc, w, x)
try:
    G.ggml_opt_prepare_alloc(opt, cc, G.ggml_build_forward_expand(cc, out), x, out)
    G.ggml_opt_alloc(opt, False)
    print("ALLOCATED")
except G.GgmlValueError as exc:
    print("REFUSED", "mem_size" in str(exc))
"""


def test_dynamic_opt_graphs_that_do_not_fit_the_compute_context_are_refused():
    """ggml-opt builds two graph copies and its backward tensors in ctx_compute; without room ggml returned
    NULL and the next access crashed."""
    out = _run(_DYNAMIC_OPT_IN_A_SMALL_CONTEXT)
    assert "REFUSED True" in out, out


# ---------------------------------------------------------------- graphs too small for the backward pass

_BACKWARD_IN_A_SMALL_GRAPH = """
import numpy as np
import ggmlpy as G
ctx = G.ggml_init(1 << 22)
x = G.ggml_set_param(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4))
y = x
for _ in range(30):
    y = G.ggml_tanh(ctx, y)
loss = G.ggml_sum(ctx, y)
G.ggml_set_loss(loss)
small = G.ggml_new_graph_custom(ctx, 40, True)
G.ggml_build_forward_expand(small, loss)
try:
    G.ggml_build_backward_expand(ctx, small)
    print("BUILT")
except G.GgmlValueError as exc:
    print("REFUSED", "ggml_new_graph_custom(ctx," in str(exc), G.ggml_graph_n_nodes(small))
big = G.ggml_new_graph_custom(ctx, 512, True)
G.ggml_build_forward_expand(big, loss)
G.ggml_build_backward_expand(ctx, big)
G.ggml_backend_tensor_set_data(x, np.full(4, 0.5, np.float32))
G.ggml_graph_reset(big)
G.ggml_graph_compute(ctx, big)
grad = G.ggml_backend_tensor_get_data(G.ggml_graph_get_grad(big, x))
want = np.full(4, 0.5)
d = np.ones(4)
for _ in range(30):
    d *= 1 - np.tanh(want) ** 2
    want = np.tanh(want)
print("GRAD", np.allclose(grad, d, rtol=1e-4))
"""


def test_a_backward_pass_that_does_not_fit_the_graph_is_refused_and_a_big_enough_one_is_right():
    out = _run(_BACKWARD_IN_A_SMALL_GRAPH)
    assert "REFUSED True 32" in out and "GRAD True" in out, out


_DYNAMIC_OPT_GRAPHS = _DYNAMIC_PRELUDE + """
opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), G.ggml_opt_optimizer_type_sgd(), 1)
for size, use_out in ((8, True), (64, False), (64, True)):
    cc = G.ggml_init(256 * G.ggml_tensor_overhead() + 3 * G.ggml_graph_overhead(), no_alloc=True)
    out = G.ggml_mul_mat(cc, w, x)
    other = G.ggml_scale(cc, G.ggml_mul_mat(cc, w, x), 2.0)
    gf = G.ggml_new_graph_custom(cc, size, True)
    G.ggml_build_forward_expand(gf, out if use_out else other)
    try:
        G.ggml_opt_prepare_alloc(opt, cc, gf, x, out)
        G.ggml_opt_alloc(opt, True)
        res = G.ggml_opt_result_init()
        G.ggml_opt_eval(opt, res)
        print("TRAINED", size, use_out)
    except G.GgmlValueError as exc:
        print("REFUSED", size, use_out, "ggml_new_graph_custom" in str(exc) or "does not compute outputs" in str(exc))
"""


def test_dynamic_opt_graphs_too_small_or_without_the_outputs_are_refused():
    out = _run(_DYNAMIC_OPT_GRAPHS)
    assert "REFUSED 8 True True" in out and "REFUSED 64 False True" in out and "TRAINED 64 True" in out, out
