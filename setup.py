"""Build hook: compile ggml (build_ggml.py) before the cffi extension that links it.

Backends come from GGMLPY_BACKENDS (default "cpu,blas", blas only when OpenBLAS is installed),
e.g. GGMLPY_BACKENDS=cpu,blas,vulkan pip install .
Progress lines start with "[ggmlpy]": pip shows them on the terminal it runs in (or with -v).
"""
import os
import shutil
import sys
import time
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext


sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_ggml  # noqa: E402


class BuildWithGgml(build_ext):
    def run(self):
        try:
            build_ggml.build(build_ggml.backends_from_env())
        except build_ggml.BuildError as exc:
            raise SystemExit(f"ggmlpy: building ggml failed: {exc}") from None
        started, cpu = time.monotonic(), os.times()
        build_ggml.log("compiling the cffi extension ggmlpy._ffi._ggml")
        super().run()
        cpu_s = sum(os.times()[:4]) - sum(cpu[:4])  # this process and the compiler
        build_ggml.log(f"compiled the cffi extension in {time.monotonic() - started:.1f} s ({cpu_s:.1f} s of CPU time)")
        if not self.inplace:  # a wheel: ship the libraries next to the extension
            shutil.copytree(build_ggml.LIB_DIR, Path(self.build_lib) / "ggmlpy" / "lib", dirs_exist_ok=True)


setup(cffi_modules=["ggmlpy/_ffi/build.py:ffibuilder"], cmdclass={"build_ext": BuildWithGgml})
