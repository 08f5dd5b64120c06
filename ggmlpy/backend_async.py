"""Asynchronous backend work: events, async tensor reads and writes, async compute and graph plans."""
from __future__ import annotations
