"""The CPU kernel probe (ggmlpy/backend/probe.py): a kernel that aborts is found in a helper process and
remembered; a helper that fails for another reason (it cannot import, say) gives no answer and nothing
is remembered, so one broken start cannot mark an op unsupported for good."""
from __future__ import annotations

import json

import pytest

import ggmlpy as G
from ggmlpy.backend import probe


@pytest.fixture
def fresh_probe(tmp_path, monkeypatch):
    monkeypatch.setenv("GGMLPY_CACHE", str(tmp_path))
    monkeypatch.setenv("GGMLPY_PROBE_KERNELS", "1")
    monkeypatch.setattr(probe, "_known", {})
    monkeypatch.setattr(probe, "_disk_loaded", [False])
    probe._stop_helper()
    yield tmp_path
    probe._stop_helper()


def _f16_add(ctx):
    a = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F16, 8)
    return G.ggml_add(ctx, a, a)  # not all-F32: the probe runs it


def test_a_kernel_that_runs_is_remembered(fresh_probe):
    with G.ggml_init(1 << 16, no_alloc=True) as ctx:
        node = _f16_add(ctx)
        assert probe.cpu_kernel_runs(node.ptr) == (True, "")
        saved = json.loads(next(fresh_probe.glob("cpu-kernels-*.json")).read_text())
        assert list(saved.values()) == [[True, ""]]


def test_a_helper_that_cannot_start_answers_nothing(fresh_probe, monkeypatch, caplog):
    monkeypatch.setattr(probe, "HELPER_CODE", "import sys; sys.exit('no such module')")
    with G.ggml_init(1 << 16, no_alloc=True) as ctx:
        node = _f16_add(ctx)
        assert probe.cpu_kernel_runs(node.ptr) == (True, "")  # trust supports_op, as without a helper
    assert not list(fresh_probe.glob("cpu-kernels-*.json")) and probe._known == {}
    assert "probe failed" in caplog.text


def test_an_aborting_helper_is_an_unsupported_kernel(fresh_probe, monkeypatch):
    monkeypatch.setattr(probe, "HELPER_CODE", "import os; os.abort()")
    with G.ggml_init(1 << 16, no_alloc=True) as ctx:
        ok, why = probe.cpu_kernel_runs(_f16_add(ctx).ptr)
    assert ok is False and "code -6" in why
