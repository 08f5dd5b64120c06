"""GGUF files that are damaged, hostile or not files at all: a ggmlpy error, never an abort, a hang, a
MemoryError or a silently changed name. Cases that could abort or block run in a subprocess."""
from __future__ import annotations

import os
import struct
import textwrap

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.core import sysmem as C
from ggmlpy.errors import GgufFileError
from tests.helpers.subprocesses import run_in_subprocess


def _write(path, shape=(4, 3), meta=None):
    """A valid GGUF file with one F32 tensor 'w' of ggml shape ``shape``, written by ggmlpy."""
    ctx = G.ggml_init(8 * G.ggml_tensor_overhead(), no_alloc=True)
    w = G.ggml_set_name(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, *shape), "w")
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, G.ggml_backend_cpu_init())
    G.ggml_backend_tensor_set_data(w, np.arange(shape[0] * shape[1], dtype=np.float32))
    G.ggml_save_weights_gguf(path, [w], meta or {"general.name": "t", "labels": ["a", "bc"]})
    buf.free()
    ctx.free()
    return path


def _ne1_offset(data: bytes) -> int:
    """Byte offset of ne[1] of tensor 'w' in the tensor info: name (u64 length + bytes), n_dims u32, ne0 i64."""
    at = data.index(struct.pack("<Q", 1) + b"w")
    return at + 8 + 1 + 4 + 8


def _flip_ne1(path, bit: int = 40):
    data = bytearray(path.read_bytes())
    data[_ne1_offset(data) + bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(data)
    return path


def test_a_flipped_size_bit_is_refused_before_ggml_allocates(tmp_path):
    """One flipped bit makes the tensor 2**40 rows long: ggml would allocate ~16 TB and abort."""
    path = _flip_ne1(_write(tmp_path / "flipped.gguf"))
    code = textwrap.dedent(f"""
        import ggmlpy as G
        for call in (lambda: G.gguf_init_from_file({str(path)!r}, no_alloc=False), lambda: G.gguf_read({str(path)!r})):
            try:
                call()
            except G.GgufFileError as e:
                print("REFUSED", e)
            except BaseException as e:
                print("LEAKED", type(e).__name__, e)
        with G.gguf_init_from_file({str(path)!r}) as g:   # the header alone is fine
            print("SHAPE", G.gguf_get_tensor_shape(g, 0))
    """)
    rc, out, err = run_in_subprocess(code)
    assert rc == 0, f"rc={rc}\n{out}\n{err}"
    assert out.count("REFUSED") == 2 and "LEAKED" not in out, out
    assert "truncated or corrupt: tensor 'w' declares" in out
    assert f"SHAPE (4, {3 + 2 ** 40}, 1, 1)" in out


def test_every_single_bit_flip_of_the_size_fields_is_safe(tmp_path):
    """Each of the 64 bits of ne[1], read with data: refused or read, never an abort or a MemoryError."""
    base = _write(tmp_path / "base.gguf").read_bytes()
    at = _ne1_offset(base)
    paths = []
    for bit in range(64):
        data = bytearray(base)
        data[at + bit // 8] ^= 1 << (bit % 8)
        p = tmp_path / f"bit{bit}.gguf"
        p.write_bytes(data)
        paths.append(str(p))
    code = textwrap.dedent(f"""
        import ggmlpy as G
        bad = []
        for p in {paths!r}:
            for call in (lambda: G.gguf_init_from_file(p, no_alloc=False), lambda: G.gguf_read(p)):
                try:
                    call()
                except G.GgmlpyError:
                    pass
                except BaseException as e:
                    bad.append((p, type(e).__name__))
        print("BAD", bad)
    """)
    rc, out, err = run_in_subprocess(code, timeout=120)
    assert rc == 0, f"rc={rc}\n{out}\n{err[-2000:]}"
    assert "BAD []" in out, out


def test_truncated_file_is_a_ggmlpy_error_not_memory_error(tmp_path):
    path = _write(tmp_path / "t.gguf", shape=(64, 64))
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(GgufFileError, match="truncated"):
        G.gguf_read(path)
    with pytest.raises(GgufFileError, match="truncated"):
        G.gguf_init_from_file(path, no_alloc=False)
    with G.gguf_init_from_file(path) as g:  # header only: a file written with only_meta=True looks like this
        assert G.gguf_get_tensor_shape(g, 0) == (64, 64, 1, 1)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_refused_instead_of_blocking(tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    code = textwrap.dedent(f"""
        import ggmlpy as G
        for call in (lambda: G.gguf_init_from_file({str(fifo)!r}), lambda: G.gguf_read({str(fifo)!r}),
                     lambda: G.gguf_init_from_file({str(fifo)!r}, no_alloc=False),
                     lambda: G.ggml_load_weights_gguf({str(fifo)!r}, {{}}),
                     lambda: G.gguf_write_to_file(G.gguf_init_empty(), {str(fifo)!r})):
            try:
                call()
            except G.GgufFileError as e:
                print("REFUSED", e)
    """)
    rc, out, err = run_in_subprocess(code, timeout=60)  # opening a FIFO blocks until a writer comes
    assert rc == 0, f"rc={rc}\n{out}\n{err}"
    assert out.count("REFUSED") == 5, out
    assert "FIFO" in out and "regular file" in out


def _patch(path, old: bytes, new: bytes):
    data = path.read_bytes()
    assert data.count(old) == 1 and len(old) == len(new)
    path.write_bytes(data.replace(old, new))
    return path


def test_keys_and_tensor_names_with_nul_bytes_are_refused(tmp_path):
    """C cuts strings at NUL: 'ab\\0x' and 'ab\\0y' would both read as 'ab' (two keys merging)."""
    path = _write(tmp_path / "k.gguf", meta={"key.one": 1, "key.two": 2})
    _patch(path, b"key.one", b"key\0one")
    _patch(path, b"key.two", b"key\0two")
    for call in (lambda: G.gguf_init_from_file(path), G.gguf_read):
        with pytest.raises(GgufFileError, match=r"key #0 b'key\\x00one' holds a NUL byte"):
            call(path) if call is G.gguf_read else call()
    path = _patch(_write(tmp_path / "t.gguf"), struct.pack("<Q", 1) + b"w", struct.pack("<Q", 1) + b"\0")
    with pytest.raises(GgufFileError, match="tensor name #0"):
        G.gguf_read(path)


def test_non_utf8_key_is_refused(tmp_path):
    path = _patch(_write(tmp_path / "u.gguf", meta={"key.abc": 1}), b"key.abc", b"key.\xff\xfe\xfd")
    with pytest.raises(GgufFileError, match="not UTF-8"):
        G.gguf_init_from_file(path)


def test_string_value_with_nul_is_refused_not_cut(tmp_path):
    path = _patch(_write(tmp_path / "s.gguf", meta={"general.name": "ab-cd", "n": 3}), b"ab-cd", b"ab\0cd")
    with G.gguf_init_from_file(path) as g:
        with pytest.raises(G.GgmlValueError, match="NUL byte"):
            G.gguf_get_val(g, "general.name")
        assert G.gguf_get_val(g, "n") == 3  # the other keys read normally
        G.gguf_set_val(g, "general.name", "fixed")
        assert G.gguf_get_val(g, "general.name") == "fixed"
    with pytest.raises(G.GgmlValueError, match="NUL byte"):
        G.gguf_read(path)


def test_strings_sent_to_c_are_checked(tmp_path):
    g = G.gguf_init_empty()
    for bad in ("a\0b", "\ud800"):
        for call in (lambda bad=bad: G.gguf_set_val(g, bad, 1), lambda bad=bad: G.gguf_set_val_str(g, "k", bad),
                     lambda bad=bad: G.gguf_set_val(g, "k", [bad]), lambda bad=bad: G.gguf_find_key(g, bad),
                     lambda bad=bad: G.gguf_write_to_file(g, bad)):
            with pytest.raises(G.GgmlValueError):
                call()
    assert G.gguf_get_n_kv(g) == 0
    g.free()


def test_loading_data_larger_than_available_memory_is_refused(tmp_path, monkeypatch):
    """What ggml would allocate is compared with the memory available now, not the machine's total."""
    path = _write(tmp_path / "m.gguf", shape=(256, 256))
    monkeypatch.setattr(C, "_SMALL_ALLOCATION", 0)
    monkeypatch.setattr(C, "available_memory", lambda: 100_000)
    with pytest.raises(G.GgmlValueError, match="memory available now"):
        G.gguf_init_from_file(path, no_alloc=False)
    with pytest.raises(G.GgmlValueError, match="memory available now"):
        G.gguf_read(path)
    with pytest.raises(G.GgmlValueError, match="memory available now"):
        G.ggml_init(1 << 20)
    with pytest.raises(G.GgmlValueError, match="memory available now"):
        G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 1000, 10, 1000)
    with pytest.raises(G.GgmlValueError, match="memory available now"):
        G.ggml_backend_sched_new([G.ggml_backend_cpu_init()], parallel=False, graph_size=1 << 16)
    monkeypatch.undo()
    with G.gguf_init_from_file(path, no_alloc=False) as g:
        assert g.ggml_ctx is not None


def test_available_memory_reads_meminfo_and_cgroup_limits(monkeypatch):
    files = {"/proc/meminfo": {"MemTotal": 8 << 30, "MemAvailable": 6 << 30, "SwapFree": 1 << 30,
                               "CommitLimit": 5 << 30, "Committed_AS": 3 << 30}}
    monkeypatch.setattr(C, "_read_kv", lambda path: files.get(path, {}))
    monkeypatch.setattr(C, "_cgroup_available", lambda: None)
    monkeypatch.setattr(C, "_read_int", lambda path: 0)
    assert C.available_memory() == 7 << 30
    monkeypatch.setattr(C, "_read_int", lambda path: 2 if path.endswith("overcommit_memory") else None)
    assert C.available_memory() == 2 << 30  # strict overcommit: CommitLimit - Committed_AS
    monkeypatch.setattr(C, "_cgroup_available", lambda: 1 << 30)
    assert C.available_memory() == 1 << 30  # a container limit


def test_a_save_into_a_folder_that_takes_no_new_file_overwrites_the_file_in_place(tmp_path, monkeypatch):
    """Saves go to a new file beside the target, then replace it; where the folder takes no new file (a
    read-only folder holding a writable file) the file itself is written, then read back and checked."""
    import ggmlpy.gguf.tensors as gguf_module

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    c = G.ggml_init(1 << 16)
    t = G.ggml_set_name(G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 4), "t")
    G.ggml_backend_tensor_set_data(t, [1.0, 2.0, 3.0, 4.0])
    path = tmp_path / "w.gguf"
    path.write_bytes(b"old")
    monkeypatch.setattr(gguf_module.tempfile, "mkstemp", refuse)
    G.ggml_save_weights_gguf(path, [t])
    assert G.gguf_read(path)[0]["t"].tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(OSError, match="permission denied"):
        G.ggml_save_weights_gguf(tmp_path / "new.gguf", [t])
    c.free()
