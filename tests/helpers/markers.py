"""The markers that select GPU tests and pure-Python tests, set by one collection hook (loaded by tests/conftest.py)
instead of by hand on each test (pyproject.toml declares them; docs/guide/architecture.md, "Tests"):

* ``vulkan`` / ``cuda``: the test needs that GPU backend, and where it computes, its device (Vulkan0, CUDA0); it
  skips, saying why, where the build or the machine lacks it. A test gets the mark when

  - one of its parameters (a ``parametrize`` value, or the param of a parametrized fixture such as
    ``each_device``) is the device or its family: "Vulkan0", "vulkan", "CUDA0", "cuda" (in any case);
  - it uses a fixture named after the family (``vulkan``, ``cuda``);
  - its function's name has the family as a word (``test_events_on_vulkan``);
  - or it carries the mark itself (``@pytest.mark.vulkan``): a test that needs the device without saying so in
    its name or parameters.

* ``gpu``: every test marked ``vulkan`` or ``cuda``: ``-m "not gpu"`` runs what needs no GPU backend,
  ``-m gpu`` what does.
* ``pure``: every test under a folder of ``PURE_FOLDERS`` (tests/project/): no ggml call, neither in the test's
  process nor in one it starts; tests/project/test_pure.py runs them where ggmlpy's compiled extension cannot
  be imported.

Nothing here imports ggmlpy.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.helpers import ROOT


FAMILIES = ("vulkan", "cuda")
GPU_DEVICES = {"Vulkan0": "vulkan", "CUDA0": "cuda"}   # the GPU devices the backend tests run on, and their family
DEVICE_FAMILY = {**{f: f for f in FAMILIES}, **{name.lower(): f for name, f in GPU_DEVICES.items()}}
PURE_FOLDERS = ("project",)  # folders of tests/ whose tests make no ggml call
TESTS = ROOT / "tests"


def gpu_families(name: str, params: Mapping[str, object], fixtures: Iterable[str], marks: Iterable[str]) -> set[str]:
    """The GPU families a test needs, from its function's ``name``, its ``params`` (callspec), the ``fixtures`` it
    uses and the ``marks`` it carries."""
    found = {f for f in FAMILIES if f in marks}
    found |= {DEVICE_FAMILY[v.lower()] for v in params.values() if isinstance(v, str) and v.lower() in DEVICE_FAMILY}
    found |= {f for f in FAMILIES if f in fixtures}
    found |= {f for f in FAMILIES if f in name.lower().split("_")}
    return found


def markers_for(folder: str, name: str, params: Mapping[str, object], fixtures: Iterable[str],
                marks: Iterable[str]) -> set[str]:
    """Every marker a test gets: ``folder`` is its first folder under tests/ ("" for none)."""
    out = gpu_families(name, params, fixtures, marks)
    if out:
        out.add("gpu")
    if folder in PURE_FOLDERS:
        out.add("pure")
    return out


def folder_of(path: Path) -> str:
    """The first folder of ``path`` under tests/, or "" (a file directly in tests/, or outside it)."""
    try:
        parts = Path(path).resolve().relative_to(TESTS).parts
    except ValueError:
        return ""
    return parts[0] if len(parts) > 1 else ""


def pytest_collection_modifyitems(config, items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        names = markers_for(folder_of(item.path), getattr(item, "originalname", item.name),
                            callspec.params if callspec is not None else {}, getattr(item, "fixturenames", ()),
                            {m.name for m in item.iter_markers()})
        for marker in sorted(names):
            item.add_marker(marker)
