"""What the tests share, importable as ``tests.helpers.<module>`` from every folder of the suite:

* ``compute``: build a graph from numpy arrays, compute it, read the results back (``compute``, ``compute_grad``,
  ``nd4``, ...); the layout conventions of the suite are in its docstring.
* ``subprocesses``: fresh interpreters for what could abort (``run_in_subprocess``, ``run_cases_in_subprocess``)
  and the scripts of backward-refusal cases.
* ``gradients``: central finite differences in float64 (``fd_grad``) and numpy references they check.
* ``devices``: the GPU devices and how a test that needs one skips (``require_gpu``).
* ``markers``: the hook that marks tests ``gpu``/``vulkan``/``cuda`` and ``pure`` (docs/guide/architecture.md, "Tests").
* ``device_runs``: the hooks of runs on a device (``GGMLPY_REQUIRE_DEVICES``, ``GGMLPY_VK_VALIDATION``).
* ``kernel_refs``, ``layer_refs``, ``training_refs``: numpy references of our kernels, of the model layer's
  layers (Keras semantics), and the small models of the training tests.
* ``gguf_writer``: GGUF files written byte by byte, independent of ggml.
* ``no_ggml/``: a ``sitecustomize`` that, on ``PYTHONPATH``, makes importing ggmlpy's compiled extension fail in
  a process and its children (the proof that the pure tests make no ggml call).

The modules that import ggmlpy (``compute``, ``devices``, ``training_refs``) are imported by the tests that use
them only, never by ``tests/conftest.py`` at import time, so that the pure tests run where ggml cannot load.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


ROOT = Path(__file__).resolve().parents[2]
"""The repository's root folder."""


def load_script(relative: str, name: str) -> ModuleType:
    """A script of the repository that is not part of the package (``tools/exports.py``, ``docs/build.py``),
    loaded as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None, relative
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
