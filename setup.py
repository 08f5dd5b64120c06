"""Build hook: compile ggml (build_ggml.py) before the cffi extension that links it.

Backends come from GGMLPY_BACKENDS (default "cpu"), e.g. GGMLPY_BACKENDS=cpu,vulkan pip install .
"""
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_ggml  # noqa: E402


class BuildWithGgml(build_ext):
    def run(self):
        try:
            build_ggml.build(build_ggml.parse_backends(os.environ.get("GGMLPY_BACKENDS", "cpu")))
        except build_ggml.BuildError as exc:
            raise SystemExit(f"ggmlpy: building ggml failed: {exc}") from None
        super().run()
        if not self.inplace:  # a wheel: ship the libraries next to the extension
            shutil.copytree(build_ggml.LIB_DIR, Path(self.build_lib) / "ggmlpy" / "lib", dirs_exist_ok=True)


setup(cffi_modules=["ggmlpy/_ffi/build.py:ffibuilder"], cmdclass={"build_ext": BuildWithGgml})
