"""With this folder on ``PYTHONPATH``, importing ggmlpy's compiled extension (``ggmlpy._ffi._ggml``, and with it
``import ggmlpy``) raises ImportError, in the process and in every process it starts with the same environment:
the proof that a test makes no ggml call (tests/project/test_pure.py runs the pure tests so).

    PYTHONPATH=tests/helpers/no_ggml python -m pytest tests/project
"""
from __future__ import annotations

import sys


HIDDEN = "ggmlpy._ffi._ggml"


class HideGgml:
    """A meta path finder that refuses ``HIDDEN`` before any other finder is asked."""

    def find_spec(self, name, path=None, target=None):
        if name == HIDDEN:
            raise ImportError(f"{HIDDEN} is hidden (tests/helpers/no_ggml is on PYTHONPATH): this process must make "
                              "no ggml call", name=name)
        return None


sys.meta_path.insert(0, HideGgml())
