"""ggmlR parity of the backend registry, device properties and buffer queries (backend/registry.py, device.py,
buffer.py)."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as g


TYPE_NAMES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


def _ctx(n=8):
    return g.ggml_init(n * g.ggml_tensor_overhead() + g.ggml_graph_overhead(64) + 4096, no_alloc=True)


# ---------------------------------------------------------------- constants and dev_type

def test_device_type_constants_are_ggmls_ints():
    assert [g.ggml_backend_device_type_cpu(), g.ggml_backend_device_type_gpu(), g.ggml_backend_device_type_igpu(),
            g.ggml_backend_device_type_accel()] == [0, 1, 2, 3]
    assert g.GGML_BACKEND_DEVICE_TYPE_GPU == g.ggml_backend_device_type_gpu()
    assert [g.ggml_backend_buffer_usage_any(), g.ggml_backend_buffer_usage_weights(),
            g.ggml_backend_buffer_usage_compute()] == [0, 1, 2]


def test_dev_type_returns_the_constant_and_matches_the_readable_type():
    for d in g.ggml_backend_devices():
        t = g.ggml_backend_dev_type(d)
        assert isinstance(t, int) and not isinstance(t, bool)
        assert TYPE_NAMES[t] == d.type  # the Device's readable name agrees
        assert g.ggml_backend_dev_type(d.name) == t
    assert g.ggml_backend_dev_type("CPU") == g.ggml_backend_device_type_cpu()


def test_set_n_threads_returns_the_count():
    before = g.ggml_get_n_threads()
    try:
        assert g.ggml_set_n_threads(1) == 1
        assert g.ggml_get_n_threads() == 1
    finally:
        g.ggml_set_n_threads(before)


# ---------------------------------------------------------------- registry

def test_registry_names_and_devices_agree_with_the_device_list():
    n = g.ggml_backend_reg_count()
    regs = [g.ggml_backend_reg_get(i) for i in range(n)]
    assert [g.ggml_backend_reg_name(r) for r in regs] == g.ggml_backend_reg_names()
    from_regs = []
    for r in regs:
        for i in range(g.ggml_backend_reg_dev_count(r)):
            d = g.ggml_backend_reg_dev_get(r, i)
            assert d.backend_name == g.ggml_backend_reg_name(r)
            from_regs.append(d.name)
    assert sorted(from_regs) == sorted(d.name for d in g.ggml_backend_devices())
    assert g.ggml_backend_dev_count() == len(from_regs)


def test_reg_by_name_is_case_insensitive_and_none_when_missing():
    cpu = g.ggml_backend_reg_by_name("cpu")
    assert cpu is not None and g.ggml_backend_reg_name(cpu) == "CPU"
    assert cpu == g.ggml_backend_reg_by_name("CPU")
    assert g.ggml_backend_reg_dev_count(cpu) == 1
    assert g.ggml_backend_dev_name(g.ggml_backend_reg_dev_get(cpu, 0)) == "CPU"
    assert g.ggml_backend_reg_by_name("NoSuchFamily") is None


def test_registry_misuse_raises():
    with pytest.raises(ValueError, match=r"\[0, "):
        g.ggml_backend_reg_get(g.ggml_backend_reg_count())
    with pytest.raises(ValueError):
        g.ggml_backend_reg_get(-1)
    cpu = g.ggml_backend_reg_by_name("CPU")
    with pytest.raises(ValueError):
        g.ggml_backend_reg_dev_get(cpu, 1)
    with pytest.raises(TypeError):
        g.ggml_backend_reg_name(g.ggml_backend_dev_get(0))  # a Device is not a Registry
    with pytest.raises(TypeError):
        g.ggml_backend_reg_dev_count(None)


def test_dev_by_type_and_init_by_type():
    cpu = g.ggml_backend_dev_by_type(g.ggml_backend_device_type_cpu())
    assert g.ggml_backend_dev_name(cpu) == "CPU"
    for t in range(4):
        d = g.ggml_backend_dev_by_type(t)
        first = next((x for x in g.ggml_backend_devices() if g.ggml_backend_dev_type(x) == t), None)
        assert (d is None and first is None) or d.name == first.name
    b = g.ggml_backend_init_by_type(g.ggml_backend_device_type_cpu())
    try:
        assert g.ggml_backend_is_cpu(b) and g.ggml_backend_name(b) == "CPU"
    finally:
        g.ggml_backend_free(b)
    with pytest.raises(ValueError, match="device_type"):
        g.ggml_backend_dev_by_type(7)
    with pytest.raises(TypeError):
        g.ggml_backend_init_by_type("gpu")
    if g.ggml_backend_dev_by_type(g.ggml_backend_device_type_igpu()) is None:
        with pytest.raises(g.BackendUnavailableError, match="no igpu device"):
            g.ggml_backend_init_by_type(g.ggml_backend_device_type_igpu())


def test_load_of_a_missing_library_is_none_and_unload_is_refused(tmp_path):
    assert g.ggml_backend_load("/nonexistent/libggml-doesnotexist.so") is None
    not_a_lib = tmp_path / "libggml-fake.so"
    not_a_lib.write_bytes(b"not an ELF file")
    assert g.ggml_backend_load(not_a_lib) is None
    with pytest.raises(TypeError):
        g.ggml_backend_load(3)
    names = g.ggml_backend_reg_names()
    with pytest.raises(RuntimeError, match="refused"):
        g.ggml_backend_unload(g.ggml_backend_reg_by_name("CPU"))
    assert g.ggml_backend_reg_names() == names  # nothing was unloaded
    g.ggml_backend_register(g.ggml_backend_reg_by_name("CPU"))  # registered already: a no-op
    assert g.ggml_backend_reg_names() == names
    with pytest.raises(TypeError):
        g.ggml_backend_register("CPU")
    g.ggml_backend_load_all()  # ggmlpy's backends are linked in: nothing breaks, CPU still there
    assert "CPU" in g.ggml_backend_reg_names()
    assert g.ggml_backend_dev_by_name("CPU") is not None


# ---------------------------------------------------------------- device properties

@pytest.mark.parametrize("dev", [d.name for d in g.ggml_backend_devices()])
def test_props_agree_with_the_single_queries(dev):
    props = g.ggml_backend_dev_get_props(dev)
    assert set(props) == {"name", "description", "memory_free", "memory_total", "type", "device_id", "caps"}
    assert props["name"] == g.ggml_backend_dev_name(dev)
    assert props["description"] == g.ggml_backend_dev_description(dev)
    assert props["type"] == g.ggml_backend_dev_type(dev)
    mem = g.ggml_backend_dev_memory(dev)
    assert props["memory_total"] == mem["total"]
    assert abs(props["memory_free"] - mem["free"]) <= max(mem["total"] // 10, 1 << 26)  # free memory moves
    assert isinstance(props["device_id"], str)
    assert set(props["caps"]) == {"async", "host_buffer", "buffer_from_host_ptr", "events"}
    assert all(isinstance(v, bool) for v in props["caps"].values())


def test_cpu_caps_are_ggmls():
    caps = g.ggml_backend_dev_get_props("CPU")["caps"]
    assert caps == {"async": False, "host_buffer": False, "buffer_from_host_ptr": True, "events": False}


def test_supports_op_offload_op_and_supports_buft():
    ctx = _ctx()
    a = g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_F32, 4)
    b = g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_F32, 4)
    s = g.ggml_add(ctx, a, b)
    assert g.ggml_backend_dev_supports_op("CPU", s) is True
    assert g.ggml_backend_dev_supports_op(g.ggml_backend_dev_by_name("CPU"), s) is True
    assert g.ggml_backend_dev_offload_op("CPU", s) is False
    cpu = g.ggml_backend_cpu_init()
    buf = g.ggml_backend_alloc_ctx_tensors(ctx, cpu)
    assert g.ggml_backend_dev_supports_buft("CPU", buf) is True
    assert g.ggml_backend_dev_supports_buft("CPU", cpu) is True
    assert g.ggml_backend_dev_supports_buft("CPU", "CPU") is True
    if g.ggml_backend_dev_by_name("Vulkan0") is not None:
        assert g.ggml_backend_dev_supports_op("Vulkan0", s) is True
        assert g.ggml_backend_dev_supports_buft("Vulkan0", buf) is False  # host memory is not the GPU's
    with pytest.raises(TypeError):
        g.ggml_backend_dev_supports_op("CPU", np.zeros(3))
    with pytest.raises(TypeError):
        g.ggml_backend_dev_supports_buft("CPU", 42)
    g.ggml_free(ctx)
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_backend_dev_supports_op("CPU", s)
    g.ggml_backend_free(cpu)
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_backend_dev_supports_buft("CPU", cpu)


# ---------------------------------------------------------------- buffers

def test_buffer_usage_is_host_and_reset():
    ctx = _ctx()
    t = g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_F32, 8)
    cpu = g.ggml_backend_cpu_init()
    buf = g.ggml_backend_alloc_ctx_tensors(ctx, cpu)
    assert g.ggml_backend_buffer_is_host(buf) is True
    assert g.ggml_backend_buffer_get_usage(buf) == g.ggml_backend_buffer_usage_any()
    g.ggml_backend_buffer_set_usage(buf, g.ggml_backend_buffer_usage_weights())
    assert g.ggml_backend_buffer_get_usage(buf) == g.ggml_backend_buffer_usage_weights()
    g.ggml_backend_buffer_set_usage(buf, g.ggml_backend_buffer_usage_compute())
    assert g.ggml_backend_buffer_get_usage(buf) == g.ggml_backend_buffer_usage_compute()
    with pytest.raises(ValueError, match="usage must be one of"):
        g.ggml_backend_buffer_set_usage(buf, 9)
    with pytest.raises(TypeError):
        g.ggml_backend_buffer_set_usage(buf, "weights")
    g.ggml_backend_tensor_set_data(t, np.arange(8.0))
    g.ggml_backend_buffer_reset(buf)  # bookkeeping only: the values stay
    np.testing.assert_array_equal(g.ggml_backend_tensor_get_data(t), np.arange(8.0, dtype=np.float32))
    g.ggml_backend_buffer_clear(buf, 0)
    np.testing.assert_array_equal(g.ggml_backend_tensor_get_data(t), np.zeros(8, np.float32))
    g.ggml_backend_buffer_free(buf)
    for fn in (g.ggml_backend_buffer_is_host, g.ggml_backend_buffer_get_usage, g.ggml_backend_buffer_reset):
        with pytest.raises(RuntimeError, match="freed"):
            fn(buf)
    with pytest.raises(RuntimeError, match="freed"):
        g.ggml_backend_buffer_set_usage(buf, 0)
    with pytest.raises(TypeError):
        g.ggml_backend_buffer_is_host(cpu)
    g.ggml_backend_free(cpu)


def test_vulkan_buffer_is_not_host():
    if g.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("no Vulkan0 device (set GGML_VK_VISIBLE_DEVICES=0 to use lavapipe)")
    ctx = _ctx()
    g.ggml_new_tensor_1d(ctx, g.GGML_TYPE_F32, 8)
    gpu = g.ggml_vulkan_init(0)
    buf = g.ggml_backend_alloc_ctx_tensors(ctx, gpu)
    assert g.ggml_backend_buffer_is_host(buf) is False
    assert g.ggml_backend_dev_supports_buft("Vulkan0", buf) is True
    assert g.ggml_backend_dev_supports_buft("CPU", buf) is False
    g.ggml_free(ctx)
    g.ggml_backend_free(gpu)
