"""ggmlR parity of asynchronous backend work: async transfers and computes, events, graph plans, and the
scheduler's async calls (compute/transfer.py, run.py, events.py). Runs on the CPU, and on Vulkan where there is a
device (Mesa's lavapipe with GGML_VK_VISIBLE_DEVICES=0), whose async calls really queue work."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import ggmlpy as g


HAS_VULKAN = "vulkan" in g.ggml_backends_built() and g.ggml_backend_dev_by_name("Vulkan0") is not None
needs_vulkan = pytest.mark.skipif(not HAS_VULKAN, reason="no Vulkan0 device (set GGML_VK_VISIBLE_DEVICES=0 to "
                                                         "use lavapipe)")


@pytest.fixture(scope="module")
def cpu():
    b = g.ggml_backend_cpu_init()
    g.ggml_backend_cpu_set_n_threads(b, 1)
    yield b
    b.free()


@pytest.fixture(scope="module")
def vulkan():
    if not HAS_VULKAN:
        pytest.skip("no Vulkan0 device (set GGML_VK_VISIBLE_DEVICES=0 to use lavapipe)")
    b = g.ggml_vulkan_init(0)
    yield b
    b.free()


def _ctx(n=16):
    return g.ggml_init(n * g.ggml_tensor_overhead() + g.ggml_graph_overhead(64) + 4096, no_alloc=True)


def _add_graph(backend):
    """ctx, a [3, 2], b [3, 2], a + b, graph, buffer: all on ``backend``."""
    ctx = _ctx()
    a = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, 2)
    b = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, 2)
    s = g.ggml_mul(ctx, g.ggml_add(ctx, a, b), a)
    gf = g.ggml_build_forward_expand(g.ggml_new_graph_custom(ctx, 64), s)
    buf = g.ggml_backend_alloc_ctx_tensors(ctx, backend)
    return ctx, a, b, s, gf, buf


A = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.linspace(-1, 1, 6).reshape(2, 3)
EXPECTED = ((A + B.astype(np.float32)) * A).reshape(-1)


# ---------------------------------------------------------------- async set / get

@pytest.mark.parametrize("which", ["cpu", pytest.param("vulkan", marks=needs_vulkan)])
def test_async_set_compute_get_round_trip(which, request):
    backend = request.getfixturevalue(which)
    ctx, a, b, s, gf, _ = _add_graph(backend)
    g.ggml_backend_tensor_set_async(backend, a, A)
    g.ggml_backend_tensor_set_async(backend, b, B)       # float64 data converted to F32
    assert g.ggml_backend_graph_compute_async(backend, gf) == 0
    out = g.ggml_backend_tensor_get_async(backend, s)
    g.ggml_backend_synchronize(backend)
    np.testing.assert_allclose(out, EXPECTED, rtol=1e-6)
    assert out.dtype == np.float32 and out.shape == (6,)
    part = g.ggml_backend_tensor_get_async(backend, s, offset=4, size=8)  # bytes, as in ggmlR
    g.ggml_backend_synchronize(backend)
    np.testing.assert_allclose(part, EXPECTED[1:3], rtol=1e-6)
    raw = g.ggml_backend_tensor_get_and_sync(backend, s)
    np.testing.assert_allclose(np.frombuffer(raw, np.float32), EXPECTED, rtol=1e-6)
    # a partial write at a byte offset: elements 3..5
    g.ggml_backend_tensor_set_async(backend, a, [7.0, 8.0, 9.0], offset=12)
    g.ggml_backend_synchronize(backend)
    np.testing.assert_array_equal(g.ggml_backend_tensor_get_data(a), [0, 1, 2, 7, 8, 9])
    g.ggml_free(ctx)


def test_async_write_copies_the_data(vulkan):
    ctx, a, *_ = _add_graph(vulkan)
    data = A.copy()
    g.ggml_backend_tensor_set_async(vulkan, a, data)
    data[:] = -1  # changed before the synchronize: the queued write must not see it
    g.ggml_backend_synchronize(vulkan)
    np.testing.assert_array_equal(g.ggml_backend_tensor_get_data(a), A.reshape(-1))
    g.ggml_free(ctx)


def test_async_read_array_is_kept_until_synchronize(vulkan):
    ctx, a, *_ = _add_graph(vulkan)
    g.ggml_backend_tensor_set_data(a, A)
    out = g.ggml_backend_tensor_get_async(vulkan, a)
    pending = vulkan.__dict__["_async_pending"]
    assert any(any(x is out for x in keep) for _, _, keep in pending)  # the backend holds the array
    g.ggml_backend_synchronize(vulkan)
    assert not vulkan.__dict__["_async_pending"]
    np.testing.assert_array_equal(out, A.reshape(-1))
    g.ggml_free(ctx)


def test_pending_work_blocks_freeing_its_memory(vulkan):
    ctx, a, *_ = _add_graph(vulkan)
    buf = ctx.buffers[0]
    g.ggml_backend_tensor_set_async(vulkan, a, A)
    with pytest.raises(g.GgmlInUseError, match="ggml_backend_synchronize"):
        g.ggml_free(ctx)
    with pytest.raises(g.GgmlInUseError):
        g.ggml_backend_buffer_free(buf)
    assert ctx.alive and buf.alive
    g.ggml_backend_synchronize(vulkan)
    g.ggml_backend_buffer_free(buf)
    g.ggml_free(ctx)


@pytest.mark.vulkan
def test_freeing_a_backend_finishes_its_queued_work():
    if not HAS_VULKAN:
        pytest.skip("no Vulkan0 device")
    vulkan = g.ggml_vulkan_init(0)
    ctx, a, *_ = _add_graph(vulkan)
    out = g.ggml_backend_tensor_get_async(vulkan, a)
    g.ggml_backend_tensor_set_async(vulkan, a, A)
    g.ggml_backend_free(vulkan)          # synchronizes, then frees (the buffer with it)
    assert not vulkan.alive
    g.ggml_free(ctx)                  # no longer held
    assert out.shape == (6,)
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_backend_tensor_set_async(vulkan, a, A)


def test_async_misuse_is_refused(cpu):
    ctx, a, b, s, gf, buf = _add_graph(cpu)
    with pytest.raises(ValueError, match="transposed"):
        g.ggml_backend_tensor_set_async(cpu, a, A.T)           # the shape check of tensor_set_data
    with pytest.raises(ValueError, match="expects 6 values"):
        g.ggml_backend_tensor_set_async(cpu, a, [1.0, 2.0])     # short without an explicit offset
    with pytest.raises(ValueError, match="multiple of the element size"):
        g.ggml_backend_tensor_set_async(cpu, a, [1.0], offset=2)
    with pytest.raises(ValueError, match="size must be the byte count"):
        g.ggml_backend_tensor_set_async(cpu, a, A, size=6)      # 6 values are 24 bytes
    g.ggml_backend_tensor_set_async(cpu, a, A, size=24)
    with pytest.raises(ValueError, match="holds 24 bytes"):
        g.ggml_backend_tensor_get_async(cpu, a, offset=16, size=16)
    with pytest.raises(ValueError, match="multiple of the element size"):
        g.ggml_backend_tensor_get_async(cpu, a, size=5)
    with pytest.raises(TypeError):
        g.ggml_backend_tensor_get_async(cpu, np.zeros(3))
    with pytest.raises(TypeError):
        g.ggml_backend_tensor_set_async(a, cpu, A)              # arguments swapped
    with pytest.raises(TypeError):
        g.ggml_backend_tensor_set_async(cpu, a, ["x"] * 6)
    # a tensor in context memory has no backend buffer
    host = g.ggml_init(1 << 16)
    h = g.ggml_new_tensor_1d(host, g.GGML_TYPE_F32, 4)
    with pytest.raises(RuntimeError, match="context memory"):
        g.ggml_backend_tensor_set_async(cpu, h, np.ones(4))
    g.ggml_backend_tensor_set_data(h, [1.0, 2.0, 3.0, 4.0])
    assert np.frombuffer(g.ggml_backend_tensor_get_and_sync(None, h), np.float32).tolist() == [1, 2, 3, 4]
    # a tensor without memory
    ctx2 = _ctx()
    t = g.ggml_new_tensor_1d(ctx2, g.GGML_TYPE_F32, 4)
    with pytest.raises(RuntimeError, match="no memory"):
        g.ggml_backend_tensor_get_async(cpu, t)
    # freed buffer, freed backend
    g.ggml_backend_buffer_free(buf)
    with pytest.raises(RuntimeError, match="no memory"):
        g.ggml_backend_tensor_set_async(cpu, a, A)
    other = g.ggml_backend_cpu_init()
    g.ggml_backend_free(other)
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_backend_tensor_get_async(other, s)
    for c in (ctx, ctx2, host):
        g.ggml_free(c)


def test_a_tensor_of_another_backend_is_refused(cpu, vulkan):
    ctx, a, *_ = _add_graph(vulkan)
    with pytest.raises(RuntimeError, match="does not own"):
        g.ggml_backend_tensor_set_async(cpu, a, A)
    with pytest.raises(RuntimeError, match="does not own"):
        g.ggml_backend_tensor_get_async(cpu, a)
    ctx2, a2, *_ = _add_graph(cpu)
    with pytest.raises(RuntimeError, match="does not own"):
        g.ggml_backend_tensor_get_async(vulkan, a2)
    g.ggml_free(ctx)
    g.ggml_free(ctx2)


# ---------------------------------------------------------------- copies

def test_copy_between_cpu_and_vulkan(cpu, vulkan):
    ctx_c, ac, bc, *_ = _add_graph(cpu)
    ctx_g, ag, bg, *_ = _add_graph(vulkan)
    g.ggml_backend_tensor_set_data(ac, A)
    g.ggml_backend_tensor_copy_async(cpu, vulkan, ac, ag)       # CPU -> Vulkan
    g.ggml_backend_synchronize(vulkan)
    np.testing.assert_array_equal(g.ggml_backend_tensor_get_data(ag), A.reshape(-1))
    g.ggml_backend_tensor_copy_async(vulkan, vulkan, ag, bg)       # on the device
    g.ggml_backend_synchronize(vulkan)
    g.ggml_backend_tensor_copy_async(vulkan, cpu, bg, bc)       # Vulkan -> CPU
    g.ggml_backend_synchronize(cpu)
    np.testing.assert_array_equal(g.ggml_backend_tensor_get_data(bc), A.reshape(-1))
    g.ggml_backend_tensor_set_data(ac, B)
    g.ggml_backend_tensor_copy(ac, ag)                       # synchronous, any direction
    np.testing.assert_allclose(g.ggml_backend_tensor_get_data(ag), B.reshape(-1), rtol=1e-6)
    with pytest.raises(RuntimeError, match="does not own"):
        g.ggml_backend_tensor_copy_async(vulkan, cpu, ac, bg)   # src is not the GPU's
    g.ggml_free(ctx_c)
    g.ggml_free(ctx_g)


def test_copy_refuses_other_layouts(cpu):
    ctx = _ctx()
    a = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, 2)
    b = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 2, 3)
    c = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_I32, 3, 2)
    d = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, 2)
    g.ggml_backend_alloc_ctx_tensors(ctx, cpu)
    for other in (b, c):
        with pytest.raises(ValueError, match="same type, shape and strides"):
            g.ggml_backend_tensor_copy(a, other)
        with pytest.raises(ValueError, match="same type, shape and strides"):
            g.ggml_backend_tensor_copy_async(cpu, cpu, a, other)
    g.ggml_backend_tensor_set_data(a, A)
    g.ggml_backend_tensor_copy_async(cpu, cpu, a, d)
    np.testing.assert_array_equal(g.ggml_backend_tensor_get_data(d), A.reshape(-1))
    host = g.ggml_init(1 << 16)
    h = g.ggml_new_tensor_2d(host, g.GGML_TYPE_F32, 3, 2)
    with pytest.raises(RuntimeError, match="context memory"):
        g.ggml_backend_tensor_copy(h, a)                    # ggml would abort on a tensor without buffer
    g.ggml_free(ctx)
    g.ggml_free(host)


# ---------------------------------------------------------------- graph plans

def test_graph_plan_gives_the_same_result_as_graph_compute(cpu):
    ctx, a, b, s, gf, _ = _add_graph(cpu)
    g.ggml_backend_tensor_set_data(a, A)
    g.ggml_backend_tensor_set_data(b, B)
    g.ggml_backend_graph_compute(cpu, gf)
    direct = g.ggml_backend_tensor_get_data(s).copy()
    g.ggml_backend_buffer_clear(ctx.buffers[0], 0)
    g.ggml_backend_tensor_set_data(a, A)
    g.ggml_backend_tensor_set_data(b, B)
    plan = g.ggml_backend_graph_plan_create(cpu, gf)
    assert g.ggml_backend_graph_plan_compute(cpu, plan) == 0
    np.testing.assert_array_equal(g.ggml_backend_tensor_get_data(s), direct)
    np.testing.assert_allclose(direct, EXPECTED, rtol=1e-6)
    g.ggml_backend_tensor_set_data(a, 2 * A)                 # a plan runs again on new inputs
    g.ggml_backend_graph_plan_compute(cpu, plan)
    np.testing.assert_allclose(g.ggml_backend_tensor_get_data(s), ((2 * A + B) * 2 * A).reshape(-1), rtol=1e-6)
    g.ggml_backend_graph_plan_free(cpu, plan)
    g.ggml_backend_graph_plan_free(cpu, plan)                # idempotent
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_backend_graph_plan_compute(cpu, plan)
    g.ggml_free(ctx)


def test_graph_plan_misuse():
    cpu = g.ggml_backend_cpu_init()
    other = g.ggml_backend_cpu_init()
    ctx, a, b, s, gf, buf = _add_graph(cpu)
    plan = g.ggml_backend_graph_plan_create(cpu, gf)
    with pytest.raises(ValueError, match="made for backend"):
        g.ggml_backend_graph_plan_compute(other, plan)
    with pytest.raises(TypeError):
        g.ggml_backend_graph_plan_compute(cpu, gf)
    g.ggml_backend_buffer_free(buf)                          # its tensors lose their memory
    with pytest.raises(RuntimeError, match="no memory"):
        g.ggml_backend_graph_plan_compute(cpu, plan)
    buf = g.ggml_backend_alloc_ctx_tensors(ctx, cpu)
    g.ggml_backend_graph_plan_compute(cpu, plan)             # fine again with memory
    g.ggml_backend_free(cpu)                                 # frees the plan first, with the backend alive
    assert not plan.alive
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_backend_graph_plan_compute(cpu, plan)
    g.ggml_backend_graph_plan_free(cpu, plan)                # already freed with its backend: a no-op
    ctx2, *_, gf2, _ = _add_graph(other)
    plan2 = g.ggml_backend_graph_plan_create(other, gf2)
    g.ggml_free(ctx2)
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_backend_graph_plan_compute(other, plan2)
    del plan2
    gc.collect()                                             # the finalizer frees it, the backend is alive
    g.ggml_backend_free(other)
    g.ggml_free(ctx)


def test_graph_plan_is_refused_where_ggml_would_abort(vulkan):
    ctx, *_, gf, _ = _add_graph(vulkan)
    with pytest.raises(RuntimeError, match="does not implement graph plans"):
        g.ggml_backend_graph_plan_create(vulkan, gf)
    g.ggml_free(ctx)


# ---------------------------------------------------------------- events

def test_events_are_refused_on_the_cpu(cpu):
    assert g.ggml_backend_dev_get_props("CPU")["caps"]["events"] is False
    with pytest.raises(RuntimeError, match="does not support events"):
        g.ggml_backend_event_new("CPU")
    with pytest.raises(RuntimeError, match="does not support events"):
        g.ggml_backend_event_new(cpu)


def test_events_on_vulkan(cpu, vulkan):
    assert g.ggml_backend_dev_get_props("Vulkan0")["caps"]["events"] is True
    ev = g.ggml_backend_event_new(g.ggml_backend_get_device(vulkan))
    g.ggml_backend_event_synchronize(ev)                     # never recorded: completes at once
    ctx, a, b, s, gf, _ = _add_graph(vulkan)
    g.ggml_backend_tensor_set_async(vulkan, a, A)
    g.ggml_backend_tensor_set_async(vulkan, b, B)
    g.ggml_backend_graph_compute_async(vulkan, gf)
    g.ggml_backend_event_record(ev, vulkan)
    g.ggml_backend_event_synchronize(ev)
    g.ggml_backend_event_wait(vulkan, ev)
    out = g.ggml_backend_tensor_get_async(vulkan, s)
    g.ggml_backend_synchronize(vulkan)
    np.testing.assert_allclose(out, EXPECTED, rtol=1e-6)
    with pytest.raises(ValueError, match="within one device"):
        g.ggml_backend_event_record(ev, cpu)
    with pytest.raises(ValueError, match="within one device"):
        g.ggml_backend_event_wait(cpu, ev)
    with pytest.raises(TypeError):
        g.ggml_backend_event_record(vulkan, ev)                 # arguments swapped
    g.ggml_backend_event_free(ev)
    g.ggml_backend_event_free(ev)                            # idempotent
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_backend_event_synchronize(ev)
    g.ggml_free(ctx)


@pytest.mark.vulkan
def test_event_outlives_the_backend_it_was_recorded_on():
    if not HAS_VULKAN:
        pytest.skip("no Vulkan0 device")
    vulkan = g.ggml_vulkan_init(0)
    ev = g.ggml_backend_event_new("Vulkan0")
    g.ggml_backend_event_record(ev, vulkan)
    g.ggml_backend_free(vulkan)                                 # finishes the event's queued signal first
    g.ggml_backend_event_synchronize(ev)
    gpu2 = g.ggml_vulkan_init(0)
    g.ggml_backend_event_record(ev, gpu2)                    # reusable on another backend of the device
    del ev
    gc.collect()                                             # the finalizer synchronizes, then frees
    g.ggml_backend_free(gpu2)


# ---------------------------------------------------------------- schedulers

@pytest.mark.parametrize("which", ["cpu", pytest.param("vulkan", marks=needs_vulkan)])
def test_sched_async_compute_and_synchronize(which, request):
    backend = request.getfixturevalue(which)
    sched = g.ggml_backend_sched_new([backend], parallel=False, graph_size=64)
    assert g.ggml_backend_sched_get_n_copies(sched) == 1
    ctx = _ctx()
    a = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, 2)
    b = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, 2)
    s = g.ggml_mul(ctx, g.ggml_add(ctx, a, b), a)
    gf = g.ggml_build_forward_expand(g.ggml_new_graph_custom(ctx, 64), s)
    g.ggml_backend_alloc_ctx_tensors(ctx, backend)
    g.ggml_backend_tensor_set_data(a, A)
    g.ggml_backend_tensor_set_data(b, B)
    assert g.ggml_backend_sched_graph_compute_async(sched, gf) == 0
    if which == "vulkan":
        with pytest.raises(g.GgmlInUseError, match="ggml_backend_sched_synchronize"):
            g.ggml_backend_sched_free(sched)
        with pytest.raises(g.GgmlInUseError):
            g.ggml_backend_sched_reset(sched)
    assert g.ggml_backend_sched_graph_compute_async(sched, gf) == 0   # synchronizes the previous one first
    g.ggml_backend_sched_synchronize(sched)
    np.testing.assert_allclose(g.ggml_backend_tensor_get_data(s), EXPECTED, rtol=1e-6)
    assert g.ggml_backend_name(g.ggml_backend_sched_get_tensor_backend(sched, s)) == g.ggml_backend_name(backend)
    g.ggml_backend_sched_free(sched)
    g.ggml_free(ctx)
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_backend_sched_synchronize(sched)
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_backend_sched_get_n_copies(sched)


def test_sched_set_tensor_backend(vulkan):
    sched = g.ggml_backend_sched_new([vulkan], parallel=False, graph_size=64)   # + a CPU fallback
    cpu_b = g.ggml_backend_sched_get_backend(sched, 1)
    ctx = _ctx()
    a = g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_F32, 4)
    g.ggml_backend_alloc_ctx_tensors(ctx, cpu_b)                         # the input in a CPU buffer
    g.ggml_backend_tensor_set_data(a, [1.0, 2.0, 3.0, 4.0])
    cctx = _ctx()
    h = g.ggml_add(cctx, a, a)
    out = g.ggml_sqr(cctx, h)
    gf = g.ggml_build_forward_expand(g.ggml_new_graph_custom(cctx, 64), out)
    g.ggml_backend_sched_graph_compute_async(sched, gf)
    g.ggml_backend_sched_synchronize(sched)
    # left alone, the scheduler runs these small ops where their input lives: on the CPU
    assert g.ggml_backend_sched_get_tensor_backend(sched, h) is cpu_b
    g.ggml_backend_sched_set_tensor_backend(sched, h, vulkan)
    assert g.ggml_backend_sched_get_tensor_backend(sched, h) is vulkan
    g.ggml_backend_sched_graph_compute_async(sched, gf)
    g.ggml_backend_sched_synchronize(sched)
    assert g.ggml_backend_sched_get_tensor_backend(sched, h) is vulkan      # honoured by the allocation
    np.testing.assert_allclose(g.ggml_backend_tensor_get_data(out), [4, 16, 36, 64])
    outsider = g.ggml_backend_cpu_init()
    with pytest.raises(ValueError, match="not one of the scheduler's backends"):
        g.ggml_backend_sched_set_tensor_backend(sched, h, outsider)
    with pytest.raises(TypeError):
        g.ggml_backend_sched_set_tensor_backend(sched, gf, cpu_b)
    g.ggml_backend_free(outsider)
    g.ggml_backend_sched_free(sched)
    g.ggml_free(cctx)
    g.ggml_free(ctx)
