"""Choosing a backend: names, "auto", device listing, and clear errors for what is missing."""
from __future__ import annotations

import pytest

import ggmlpy as g


def test_device_listing_has_name_description_type_memory():
    table = g.ggml_list_devices()
    assert list(table.columns) == ["name", "description", "type", "backend", "memory_free", "memory_total"]
    assert "CPU" in set(table["name"])
    # ggml's BLAS device computes in host memory and reports none of its own
    assert (table[table["name"] != "BLAS"]["memory_total"] > 0).all()


@pytest.mark.parametrize("choice", ["cpu", "CPU", "auto"])
def test_scheduler_from_a_backend_name(choice):
    sched = g.ggml_backend_sched_new(choice, parallel=False)
    names = [b.device.name for b in sched.backends]
    # "auto" skips CPU emulations of a GPU API (lavapipe): they are slower than the CPU backend
    gpus = [d.name for d in g.ggml_backend_devices() if d.type == "gpu" and "llvmpipe" not in d.description.lower()]
    # on the CPU, ggml's BLAS backend (when built) comes first: it takes the large matrix products
    cpu = ["BLAS", "CPU"] if g.ggml_backend_dev_by_name("BLAS") is not None else ["CPU"]
    if choice == "auto" and gpus:
        assert names == [gpus[0], "CPU"]
    else:
        assert names == cpu
    owned = list(sched._owned)
    assert owned, "a scheduler built from a name owns its backend"
    sched.free()
    assert all(not b.alive for b in owned)  # and frees it with itself


@pytest.mark.parametrize("choice, device", [("cuda", "CUDA0"), ("vulkan", "Vulkan0")])
def test_missing_backend_says_how_to_get_it(choice, device):
    if g.ggml_backend_dev_by_name(device) is not None:
        pytest.skip(f"{device} is present on this machine")
    with pytest.raises(g.BackendUnavailableError, match="GGMLPY_BACKENDS|GGML_VK_VISIBLE_DEVICES|no device"):
        g.ggml_backend_sched_new(choice)
    with pytest.raises(RuntimeError):
        g.ggml_backend_init_by_name(device)


def test_unknown_device_name_lists_the_devices():
    with pytest.raises(g.BackendUnavailableError, match="devices"):
        g.ggml_backend_init_by_name("NoSuchDevice7")
