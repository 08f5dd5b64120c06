"""Our GPU kernels at indices past 2^31 (POOL_2D forward and backward, IM2COL_BACK) and 2^32 (DROPOUT's logical
index, whose high word enters its hash), on devices with the memory for them; each also runs at a small size
everywhere, so that the harness itself is tested in CI.

Inputs are made on the host in chunks from a hash of each element's flat index (``_values``), so that an element
read from the wrong index has the wrong value (a 32-bit index that wraps around would read another element), and
the numpy references of ``kernel_refs`` recompute the planes around the 2^31 boundary and the last plane without
holding the whole tensor. A Vulkan device binds at most maxStorageBufferRange bytes at once (4 GiB on NVIDIA), so
there these ops must be refused (patches/0041) rather than computed wrongly: that is what the test checks on
Vulkan at the large size.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers import kernel_refs as ref
from tests.helpers.devices import GPUS, require_gpu


CHUNK = 1 << 26                      # elements per upload
PAST_2_31 = (1 << 31) + (1 << 22)
PAST_2_32 = (1 << 32) + (1 << 22)


def _values(start: int, n: int, salt: int) -> np.ndarray:
    """float32 values in [-1, 1) from a multiplicative hash of the flat indices start .. start + n - 1."""
    i = np.arange(start, start + n, dtype=np.uint64)
    h = ((i + np.uint64(salt)) * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)
    return (h.astype(np.float64) / 2.0 ** 31 - 1.0).astype(np.float32)


@contextlib.contextmanager
def _leaves(backend, specs: dict):
    """{name: (ne, fill)} -> tensors on ``backend``, freed on exit. ``fill``: an int salt (F32 ``_values``), None
    (F32 ones) or an int32 array (its content)."""
    ctx = G.ggml_init(mem_size=1 << 20, no_alloc=True)
    owned = [ctx]
    try:
        tensors = {k: G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_I32 if isinstance(fill, np.ndarray) else G.GGML_TYPE_F32,
                                           *ne) for k, (ne, fill) in specs.items()}
        owned.append(G.ggml_backend_alloc_ctx_tensors(ctx, backend))
        for k, (ne, fill) in specs.items():
            if isinstance(fill, np.ndarray):
                G.ggml_backend_tensor_set_data(tensors[k], fill)
                continue
            total = int(np.prod(ne))
            for off in range(0, total, CHUNK):
                n = min(CHUNK, total - off)
                chunk = np.ones(n, np.float32) if fill is None else _values(off, n, fill)
                G.ggml_backend_tensor_set_data(tensors[k], chunk, offset=off)
        yield tensors
    finally:
        for h in reversed(owned):
            h.free()


def _run(backend, graph_fn: Callable, specs: dict, grad_of: str | None):
    """Build ``graph_fn(ctx, leaves) -> (outputs, loss or None)``, compute it on ``backend`` (the gradient of
    leaf ``grad_of`` when given) and return a reader ``read(tensor_name, offset, n)``."""
    stack = contextlib.ExitStack()
    leaves = stack.enter_context(_leaves(backend, specs))
    ctx = G.ggml_init(mem_size=1 << 22, no_alloc=True)
    stack.callback(ctx.free)
    if grad_of:
        G.ggml_set_param(leaves[grad_of])
    outputs, loss = graph_fn(ctx, leaves)
    graph = G.ggml_new_graph_custom(ctx, 64, grad_of is not None)
    for t in outputs.values():
        G.ggml_set_output(t)
        G.ggml_build_forward_expand(graph, t)
    if loss is not None:
        G.ggml_set_loss(loss)
        G.ggml_build_forward_expand(graph, loss)
        G.ggml_build_backward_expand(ctx, graph)
        outputs = dict(outputs, grad=G.ggml_graph_get_grad(graph, leaves[grad_of]))
    sched = G.ggml_backend_sched_new([backend], parallel=False, graph_size=64)
    stack.callback(sched.free)
    G.ggml_backend_sched_alloc_graph(sched, graph)
    if loss is not None:
        G.ggml_graph_reset(graph)
    G.ggml_backend_sched_graph_compute(sched, graph)
    return stack, lambda name, off, n: G.ggml_backend_tensor_get_data(outputs[name], off, n)


def _size_or_skip(device: str, scale: str, nbytes: int) -> None:
    """Skip the large size, saying why, where the device lacks the memory for it."""
    if scale == "small":
        return
    free = G.ggml_backend_dev_by_name(device).memory()["free"]
    if free < nbytes:
        pytest.skip(f"{device} has {free / 2**30:.1f} GiB free, the case needs {nbytes / 2**30:.1f} GiB")


@pytest.fixture(params=sorted(GPUS))
def device(request):
    require_gpu(request.param)
    return request.param


def _refused_past_the_binding(device: str, build: Callable, specs: dict, grad_of: str | None, op: str) -> bool:
    """On a device with a binding limit below the tensors (Vulkan), check that ``op`` is refused by its
    supports_op (it would run elsewhere) and return True; else False."""
    limit = G.ggml_backend_dev_by_name(device).max_binding_bytes
    largest = max(4 * int(np.prod(ne)) for ne, _ in specs.values())
    if limit is None or largest <= limit:
        return False
    ctx = G.ggml_init(mem_size=1 << 22, no_alloc=True)
    try:
        leaves = {k: G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_I32 if isinstance(fill, np.ndarray) else G.GGML_TYPE_F32,
                                          *ne) for k, (ne, fill) in specs.items()}
        if grad_of:
            G.ggml_set_param(leaves[grad_of])
        outputs, loss = build(ctx, leaves)
        graph = G.ggml_new_graph_custom(ctx, 64, grad_of is not None)
        for t in outputs.values():
            G.ggml_build_forward_expand(graph, t)
        if loss is not None:
            G.ggml_set_loss(loss)
            G.ggml_build_forward_expand(graph, loss)
            G.ggml_build_backward_expand(ctx, graph)
        nodes = [G.ggml_graph_node(graph, i) for i in range(G.ggml_graph_n_nodes(graph))]
        found = [t for t in nodes if G.ggml_op_desc(t) == op]
        assert found, f"the graph has no {op}"
        for t in found:
            assert not G.ggml_backend_dev_supports_op(device, t), f"{device} claims {op} past its binding limit"
    finally:
        ctx.free()
    return True


# ---------------------------------------------------------------- POOL_2D and POOL_2D_BACK past 2^31

@pytest.mark.parametrize("scale", ["small", "past 2^31"])
def test_max_pool_forward_and_backward_past_2_31(device, scale):
    w = h = 64
    c = 64
    total = 3 * c * w * h if scale == "small" else PAST_2_31
    n = -(-total // (c * w * h))
    specs = {"x": ([w, h, c, n], 1), "r": ([w // 2, h // 2, c, n], 2)}

    def build(ctx, t):
        y = G.ggml_pool_2d(ctx, t["x"], G.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0)
        return {"y": y}, G.ggml_sum(ctx, G.ggml_mul(ctx, y, t["r"]))

    if scale != "small" and _refused_past_the_binding(device, build, specs, "x", "POOL_2D_BACK"):
        return
    _size_or_skip(device, scale, 4 * n * c * w * h * 4)
    backend = G.ggml_backend_init_by_name(device)
    stack, read = _run(backend, build, specs, "x")
    with stack:
        plane = w * h
        n_planes = n * c
        boundary = min((1 << 31) // plane, n_planes - 2)
        for p0 in sorted({0, boundary - 1, boundary, n_planes - 2}):
            x = _values(p0 * plane, 2 * plane, 1).reshape(2, h, w)
            r = _values(p0 * plane // 4, 2 * plane // 4, 2).reshape(2, h // 2, w // 2)
            want_y, _ = ref.max_pool_2d(x, 2, 2, 2, 2, 0, 0)
            np.testing.assert_array_equal(read("y", p0 * plane // 4, plane // 2).reshape(want_y.shape), want_y)
            want = ref.pool_2d_back(x, r, "max", 2, 2, 2, 2, 0, 0)
            np.testing.assert_array_equal(read("grad", p0 * plane, 2 * plane).reshape(want.shape), want)
    backend.free()


# ---------------------------------------------------------------- IM2COL_BACK past 2^31

@pytest.mark.parametrize("scale", ["small", "past 2^31"])
def test_im2col_back_past_2_31(device, scale):
    """A 2x1 kernel with stride 2: the im2col matrix has as many elements as the image (kept to 6 tensors of
    8.6 GB at the large size)."""
    w = h = 64
    c = 64
    total = 3 * c * w * h if scale == "small" else PAST_2_31
    n = -(-total // (c * w * h))
    ow = w // 2
    specs = {"x": ([w, h, c, n], 3), "k": ([2, 1, c, 1], None), "r": ([2 * c, ow, h, n], 4)}

    def build(ctx, t):
        cols = G.ggml_im2col(ctx, t["k"], t["x"], 2, 1, 0, 0, 1, 1, True, G.GGML_TYPE_F32)
        return {}, G.ggml_sum(ctx, G.ggml_mul(ctx, cols, t["r"]))

    if scale != "small" and _refused_past_the_binding(device, build, specs, "x", "IM2COL_BACK"):
        return
    _size_or_skip(device, scale, 6 * n * c * w * h * 4 + (1 << 30))
    backend = G.ggml_backend_init_by_name(device)
    stack, read = _run(backend, build, specs, "x")
    with stack:
        image = c * h * w
        boundary = min((1 << 31) // image, n - 1)
        for i in sorted({0, boundary, n - 1}):          # whole images: the one holding index 2^31, the last
            r = _values(i * image, image, 4).reshape(1, h, ow, 2 * c)
            want = ref.im2col_back(r, (1, c, h, w), 1, 2, 2, 1, 0, 0, 1, 1)
            np.testing.assert_array_equal(read("grad", i * image, image).reshape(want.shape), want)
    backend.free()


# ---------------------------------------------------------------- DROPOUT past 2^32

@pytest.mark.parametrize("scale", ["small", "past 2^32"])
def test_dropout_mask_past_2_32(device, scale):
    """The mask of element i hashes both words of i: past 2^32 the high word is 1, and a kernel indexing in 32
    bits would repeat the first elements' mask."""
    total = (1 << 20) + 7 if scale == "small" else PAST_2_32
    cols = 1 << 20
    rows = -(-total // cols)
    specs = {"x": ([cols, rows, 1, 1], None), "seed": ([1, 1, 1, 1], np.array([424242], np.int32))}

    def build(ctx, t):
        return {"y": G.ggml_dropout(ctx, t["x"], t["seed"], 0.5)}, None

    if scale != "small" and _refused_past_the_binding(device, build, specs, None, "DROPOUT"):
        return
    _size_or_skip(device, scale, 2 * rows * cols * 4 + (1 << 30))
    backend = G.ggml_backend_init_by_name(device)
    stack, read = _run(backend, build, specs, None)
    with stack:
        scale_f = np.float32(1.0 / (1.0 - float(np.float32(0.5))))
        starts = [0, rows * cols - 4096] + ([(1 << 32) - 2048] if scale != "small" else [])
        for start in starts:
            want = np.where(ref.dropout_keep(424242, 4096, 0.5, start=start), scale_f, np.float32(0))
            np.testing.assert_array_equal(read("y", start, 4096), want)
    backend.free()
