"""The installation itself: libraries found in the package, built from the pinned source."""
from __future__ import annotations

import json
import subprocess
import sys

import ggmlpy as g
from ggmlpy._ffi import BUILD_INFO, LIB_DIR
from tests.helpers import ROOT


def test_built_from_the_pinned_archive_with_our_patches():
    pin = json.loads((ROOT / "ggml.pin").read_text())
    assert BUILD_INFO["pin_sha256"] == pin["sha256"]
    assert BUILD_INFO["ggml_version"] == pin["ggml_version"] == g.GGML_VERSION
    assert BUILD_INFO["patches"] == sorted(p.name for p in (ROOT / "patches").glob("*.patch"))


def test_backends_load_from_the_package_folder_not_the_working_directory(tmp_path):
    assert (LIB_DIR / "libggml-cpu.so").exists()
    code = "import ggmlpy as g; print([d.name for d in g.ggml_backend_devices()])"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert "CPU" in out.stdout


def test_every_built_backend_registered():
    registered = {name.lower() for name in g.ggml_backend_reg_names()}
    for backend in g.ggml_backends_built():
        assert backend in registered, f"{backend} was built but did not load"


def test_ggml_log_goes_to_python_logging(caplog):
    import logging

    from ggmlpy._ffi import ffi, lib
    with caplog.at_level(logging.DEBUG, logger="ggmlpy.ggml"):
        assert lib.ggml_backend_load(b"/nonexistent/libggml-nothing.so") == ffi.NULL  # ggml logs why
    messages = [r.getMessage() for r in caplog.records if r.name == "ggmlpy.ggml"]
    assert any("/nonexistent/libggml-nothing.so" in m for m in messages), messages


def test_public_names_mirror_ggmlr():
    for name in ("ggml_fit_opt_gen", "ggml_fit_opt", "ggml_opt_fit", "ggml_opt_init_for_fit", "ggml_opt_set_lr",
                 "ggml_opt_get_lr", "ggml_backend_sched_new", "ggml_backend_tensor_set_data", "ggml_vulkan_init",
                 "ggml_backend_cuda_init", "ggml_callback_early_stopping", "ggml_schedule_cosine_decay",
                 "GGML_TYPE_F32", "ggml_opt_loss_type_huber", "ggml_opt_optimizer_type_sgd"):
        assert name in g.__all__ and callable(getattr(g, name)) or name.startswith("GGML_")
