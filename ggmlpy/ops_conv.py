"""Convolutions beyond im2col (transposed, depthwise, direct), padding, upscaling, rolling, writing into tensors and diagonals."""
from __future__ import annotations
