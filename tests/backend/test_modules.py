"""A backend module that was built but gives no device is never silent (issue 40).

ggml's loader drops a module it cannot load without a word (a CUDA module whose cuBLAS is not on the library
path, a Vulkan module without the Vulkan loader). These tests hide a library for real: a copy of the installed
package whose ``libggml-vulkan.so`` needs ``libvulkan.so.9`` (its DT_NEEDED entry ``libvulkan.so.1``
rewritten in place, same length), which no system has; then ggmlpy runs from that copy in a fresh
interpreter. A Vulkan module that loads but finds no device (only Mesa's lavapipe, a CPU device, offered) and
one that does not start (``GGML_VK_VISIBLE_DEVICES`` naming a device that does not exist) run from the
installed package itself.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import ggmlpy as g


PACKAGE = Path(g.__file__).resolve().parent
VULKAN_MODULE = PACKAGE / "lib" / "libggml-vulkan.so"
needs_vulkan_module = pytest.mark.skipif(
    "vulkan" not in g.ggml_backends_built() or not VULKAN_MODULE.is_file(),
    reason="the Vulkan backend module is not built (GGMLPY_BACKENDS=cpu,vulkan pip install . builds it)")

# One fresh interpreter per case: every public way a user meets a backend module that gave no device.
PROBE = r'''
import json, warnings
import ggmlpy as G

def caught(call):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        value = call()
    return value, [str(w.message) for w in seen if issubclass(w.category, G.GgmlpyWarning)]

def error(call):
    try:
        call()
    except G.BackendUnavailableError as exc:
        return str(exc)
    return None

out = {"file": G.__file__, "errors": G.ggml_backend_load_errors(),
       "vulkan_registry": None if G.ggml_backend_reg_by_name("Vulkan") is None
       else G.ggml_backend_reg_dev_count("Vulkan")}
table, out["list_warnings"] = caught(G.ggml_list_devices)
out["listed"] = list(table["name"])
backends, out["auto_warnings"] = caught(lambda: [G.ggml_backend_init_auto("auto") for _ in range(2)])
out["auto"] = [G.ggml_backend_name(b) for b in backends]
sched, out["sched_warnings"] = caught(lambda: G.ggml_backend_sched_new("auto"))   # already said: not again
out["by_name"] = error(lambda: G.ggml_backend_init_by_name("Vulkan0"))
out["vulkan_init"] = error(G.ggml_vulkan_init)
out["vulkan_choice"] = error(lambda: G.ggml_backend_sched_new("vulkan"))
out["device_query"] = error(lambda: G.ggml_backend_dev_description("Vulkan0"))
print("RESULT " + json.dumps(out))
'''


def run_probe(package_parent: Path, cwd: Path, **env_changes: str | None) -> dict:
    """Run PROBE with ggmlpy imported from ``package_parent``; the environment changed as given (None unsets)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(package_parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    out = json.loads(line[len("RESULT "):])
    assert Path(out["file"]).resolve().parent == (package_parent / "ggmlpy").resolve(), out["file"]
    return out


def _vulkan(problems: list) -> list:
    """The Vulkan module's problems (an installation built with CUDA too has CUDA's on a machine without a GPU)."""
    return [p for p in problems if p["backend"] == "vulkan"]


def _vulkan_texts(texts: list) -> list:
    return [t for t in texts if "libggml-vulkan.so" in t]


@pytest.fixture(scope="module")
def hidden_loader(tmp_path_factory):
    """The parent folder of a copy of the package whose Vulkan module needs libvulkan.so.9 (absent)."""
    try:
        ctypes.CDLL("libvulkan.so.9")
    except OSError:
        pass
    else:
        pytest.skip("this machine has a libvulkan.so.9: it cannot stand for a missing library")
    root = tmp_path_factory.mktemp("hidden-vulkan-loader")
    shutil.copytree(PACKAGE, root / "ggmlpy", ignore=shutil.ignore_patterns("__pycache__"))
    module = root / "ggmlpy" / "lib" / "libggml-vulkan.so"
    data = module.read_bytes()
    needed = b"\0libvulkan.so.1\0"
    if data.count(needed) != 1:
        pytest.skip("libggml-vulkan.so does not name libvulkan.so.1 once in its dynamic section")
    module.write_bytes(data.replace(needed, b"\0libvulkan.so.9\0"))
    return root


@needs_vulkan_module
def test_a_vulkan_module_without_its_loader_is_named_everywhere(hidden_loader):
    out = run_probe(hidden_loader, hidden_loader, GGML_VK_VISIBLE_DEVICES="0")
    # the import works, and Vulkan is simply absent from ggml's registry
    assert out["vulkan_registry"] is None and not any(n.startswith("Vulkan") for n in out["listed"])
    # ggml_backend_load_errors: the module, the system's error and the library it misses
    [problem] = _vulkan(out["errors"])
    assert problem["backend"] == "vulkan" and problem["module"] == "libggml-vulkan.so"
    assert problem["stage"] == "load" and problem["missing_library"] == "libvulkan.so.9"
    assert "libvulkan.so.9: cannot open shared object file" in problem["error"]
    assert Path(problem["path"]) == hidden_loader / "ggmlpy" / "lib" / "libggml-vulkan.so"
    for text in (problem["message"], *_vulkan_texts(out["list_warnings"])):
        assert "libggml-vulkan.so" in text and "libvulkan.so.9" in text, text
        assert "libvulkan1" in text and "LD_LIBRARY_PATH" in text, text   # the usual fix
    assert len(_vulkan_texts(out["list_warnings"])) == 1
    # "auto" takes the CPU and says why, once for the whole process
    assert out["auto"] == ["CPU", "CPU"]
    [warning] = out["auto_warnings"]
    assert 'backend="auto" uses the CPU' in warning and "libggml-vulkan.so" in warning and "libvulkan.so.9" in warning
    assert out["sched_warnings"] == []
    # asking for Vulkan by name: BackendUnavailableError naming the module, the missing library and the fix
    for key in ("by_name", "vulkan_init", "vulkan_choice", "device_query"):
        message = out[key]
        assert message is not None, f"{key} did not raise BackendUnavailableError"
        assert all(part in message for part in ("libggml-vulkan.so", "libvulkan.so.9", "libvulkan1")), (key, message)


@needs_vulkan_module
def test_a_vulkan_module_that_finds_no_device_says_so(tmp_path):
    # only Mesa's lavapipe offered, and not selected: ggml's Vulkan module loads and takes no device (it takes
    # CPU devices only when GGML_VK_VISIBLE_DEVICES names them), as on a machine without a GPU
    icds = sorted(p for d in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d")
                  for p in Path(d).glob("lvp_icd*.json"))
    if not icds:
        pytest.skip("Mesa's lavapipe (mesa-vulkan-drivers) is not installed: no CPU-only Vulkan driver to offer")
    out = run_probe(PACKAGE.parent, tmp_path, GGML_VK_VISIBLE_DEVICES=None, VK_ICD_FILENAMES=str(icds[0]),
                    VK_DRIVER_FILES=str(icds[0]))
    assert out["vulkan_registry"] == 0                     # registered, with no device
    [problem] = _vulkan(out["errors"])
    assert (problem["backend"], problem["module"], problem["stage"]) == ("vulkan", "libggml-vulkan.so", "no device")
    assert "loaded but found no device" in problem["message"] and "GGML_VK_VISIBLE_DEVICES" in problem["message"]
    assert _vulkan_texts(out["list_warnings"]) == [problem["message"]]
    # a machine without that GPU is not a failure: "auto" takes the CPU without a warning
    assert out["auto"] == ["CPU", "CPU"] and out["auto_warnings"] == []
    for key in ("by_name", "vulkan_init", "vulkan_choice"):
        assert "libggml-vulkan.so loaded but found no device" in out[key], (key, out[key])


@needs_vulkan_module
def test_a_vulkan_module_that_does_not_start_says_why(tmp_path):
    # a device index that no machine has: ggml's Vulkan module loads, and its start fails
    out = run_probe(PACKAGE.parent, tmp_path, GGML_VK_VISIBLE_DEVICES="99")
    assert out["vulkan_registry"] is None
    [problem] = _vulkan(out["errors"])
    assert (problem["module"], problem["stage"], problem["missing_library"]) == ("libggml-vulkan.so", "init", None)
    assert "did not start" in problem["message"] and "GGML_VK_VISIBLE_DEVICES=99" in problem["message"]
    [warning] = out["auto_warnings"]
    assert "libggml-vulkan.so" in warning and "GGML_VK_VISIBLE_DEVICES=99" in warning
    assert "GGML_VK_VISIBLE_DEVICES=99" in out["by_name"]


def test_the_installed_modules_report_only_what_this_machine_lacks():
    errors = g.ggml_backend_load_errors()
    assert [e for e in errors if e["stage"] in ("missing", "load", "unsupported")] == [], errors
    # a built family without a device (no driver, no GPU) is reported; every other one is not
    lacking = []
    for family in g.ggml_backends_built():
        reg = g.ggml_backend_reg_by_name(family)
        if family != "rpc" and (reg is None or g.ggml_backend_reg_dev_count(reg) == 0):
            lacking.append(family)
    assert sorted({e["backend"] for e in errors}) == sorted(lacking)
    if not errors:   # and then listing the devices warns about nothing
        with warnings.catch_warnings():
            warnings.simplefilter("error", g.GgmlpyWarning)
            g.ggml_list_devices()


@pytest.mark.parametrize("error, library, fix", [
    ("libcublas.so.13: cannot open shared object file: No such file or directory", "libcublas.so.13",
     "pip install nvidia-cublas in"),
    ("libcublasLt.so.12: cannot open shared object file: No such file or directory", "libcublasLt.so.12",
     "pip install nvidia-cublas-cu12"),
    ("libcudart.so.13: cannot open shared object file: No such file or directory", "libcudart.so.13",
     "pip install nvidia-cuda-runtime in"),
    ("libcuda.so.1: cannot open shared object file: No such file or directory", "libcuda.so.1", "NVIDIA driver"),
    ("libvulkan.so.1: cannot open shared object file: No such file or directory", "libvulkan.so.1", "libvulkan1"),
    ("/x/lib/libggml-cuda.so: undefined symbol: ggml_foo", None, "reinstall ggmlpy here"),
], ids=["cublas", "cublasLt-12", "cudart", "driver", "vulkan-loader", "undefined-symbol"])
def test_the_fix_named_for_each_missing_library(error, library, fix):
    # the CUDA cases cannot be produced on a machine without a CUDA build: their messages are checked here
    from ggmlpy.backend.modules import library_fix, missing_library
    assert missing_library(error, "/x/lib/libggml-cuda.so") == library
    assert fix in library_fix(library)
    if library is not None and library != "libcuda.so.1":
        assert f"the folder holding {library}" in library_fix(library) and "LD_LIBRARY_PATH" in library_fix(library)


def test_every_rebuild_hint_keeps_what_the_default_install_builds():
    """The hints for a missing backend said GGMLPY_BACKENDS=cpu,vulkan: following them dropped the BLAS backend
    the default install builds (and the CPU speed figures rely on)."""
    import re
    from pathlib import Path

    from ggmlpy.backend import modules
    from tools.ggml_build.options import DEFAULT_BACKENDS
    assert ",".join(modules.DEFAULT_BUILD) == DEFAULT_BACKENDS
    root = Path(__file__).resolve().parents[2]
    texts = [p.read_text() for p in (root / "ggmlpy").rglob("*.py")] + \
        [p.read_text() for p in (root / "docs" / "guide").glob("*.md")] + [(root / "README.md").read_text()]
    hints = [h for t in texts for h in re.findall(r"GGMLPY_BACKENDS=([a-z,]+) pip install", t)]
    assert hints and all(h.startswith(DEFAULT_BACKENDS) for h in hints), hints
    assert modules.rebuild_hint("vulkan") == f"GGMLPY_BACKENDS={DEFAULT_BACKENDS},vulkan pip install ."
