"""Helpers for building ggmlpy from a source checkout; not installed with the package."""
