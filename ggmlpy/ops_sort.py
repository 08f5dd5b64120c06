"""Sorting and ranges: argsort, top_k, arange."""
from __future__ import annotations
