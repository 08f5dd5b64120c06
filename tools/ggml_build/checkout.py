"""Where things are in this checkout, and the pin of ggml's source.

The package lives in ``tools/ggml_build/``; every path here is relative to the repository root two
folders up, where ``build_ggml.py``, ``ggml.pin`` and ``patches/`` are."""
from __future__ import annotations

import json
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
PIN_FILE = ROOT / "ggml.pin"
PATCH_DIR = ROOT / "patches"
VENDOR_DIR = ROOT / "vendor" / "ggml"
LIB_DIR = ROOT / "ggmlpy" / "lib"


def read_pin() -> dict:
    return json.loads(PIN_FILE.read_text())
