"""GGUF files written byte by byte with ``struct`` (a GGUF v3 writer independent of ggml and ggmlpy), quantized
blocks included: the expected values of the GGUF tests come from the format's definition, not from the code
under test."""
from __future__ import annotations

import struct

import numpy as np


ALIGN = 32


def gguf_str(s: str) -> bytes:
    """A GGUF string: its length as a little-endian uint64, then its UTF-8 bytes."""
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path, kv: list, tensors: list) -> None:
    """kv: (key, gguf_type, payload bytes); tensors: (name, ne, ggml_type, raw bytes)."""
    out = bytearray(b"GGUF" + struct.pack("<I", 3) + struct.pack("<qq", len(tensors), len(kv)))
    for key, t, payload in kv:
        out += gguf_str(key) + struct.pack("<i", t) + payload
    offset, blobs = 0, []
    for name, ne, typ, raw in tensors:
        out += gguf_str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}q", *ne)
        out += struct.pack("<i", typ) + struct.pack("<Q", offset)
        padded = raw + b"\0" * (-len(raw) % ALIGN)
        blobs.append(padded)
        offset += len(padded)
    out += b"\0" * (-len(out) % ALIGN)
    for b in blobs:
        out += b
    with open(path, "wb") as f:
        f.write(bytes(out))


def q8_0(d: np.ndarray, q: np.ndarray) -> bytes:
    """Blocks of (f16 scale, 32 int8)."""
    return b"".join(np.float16(s).tobytes() + qs.astype(np.int8).tobytes() for s, qs in zip(d, q))


def q4_0(d: np.ndarray, nib: np.ndarray) -> bytes:
    """Blocks of (f16 scale, 16 bytes: element j in the low nibble of byte j, element j + 16 in its high one)."""
    return b"".join(np.float16(s).tobytes() + (n[:16] | (n[16:] << 4)).astype(np.uint8).tobytes()
                    for s, n in zip(d, nib))
