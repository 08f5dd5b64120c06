"""ggmlR's GGUF reader (ggmlpy/gguf/reader.py): gguf_load, gguf_metadata, gguf_tensor_names/info/data.

The files are written byte by byte with ``struct`` (tests/helpers/gguf_writer.py: a GGUF v3 writer
independent of ggml and ggmlpy), quantized blocks included, so the expected values come from the format's definition:
Q8_0 = one f16 scale and 32 int8 per block (x = d * q), Q4_0 = one f16 scale and 16 bytes of nibbles
(x = d * (nibble - 8), low nibbles first). Corrupt and truncated files must raise, never abort.
"""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.gguf_writer import gguf_str, q4_0, q8_0, write_gguf


F32, F16, Q4_0, Q8_0, I32 = 0, 1, 2, 8, 26
Q8_1, Q8_K = 9, 15   # quantized types with no row conversion (ggml's type traits)


@pytest.fixture
def model(tmp_path):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((2, 3)).astype(np.float32)            # numpy (2, 3) = ggml ne [3, 2]
    h = rng.standard_normal(5).astype(np.float16)
    ids = np.array([[1, -2], [3, 2 ** 31 - 1]], dtype=np.int32)   # ne [2, 2]
    d8 = rng.uniform(0.01, 0.1, 6).astype(np.float16)            # ne [64, 3]: 2 blocks per row
    q8 = rng.integers(-128, 128, (6, 32))
    d4 = rng.uniform(0.01, 0.1, 2).astype(np.float16)            # ne [32, 2]: 1 block per row
    n4 = rng.integers(0, 16, (2, 32))
    path = tmp_path / "m.gguf"
    write_gguf(path, [("general.name", 8, gguf_str("tiny")), ("n.layers", 4, struct.pack("<I", 3)),
                      ("lr", 6, struct.pack("<f", 0.5)), ("flag", 7, b"\1"),
                      ("vocab", 9, struct.pack("<iQ", 8, 2) + gguf_str("a") + gguf_str("bc"))],
               [("w", [3, 2], F32, w.tobytes()), ("h", [5], F16, h.tobytes()), ("ids", [2, 2], I32, ids.tobytes()),
                ("q8", [64, 3], Q8_0, q8_0(d8, q8)), ("q4", [32, 2], Q4_0, q4_0(d4, n4))])
    ref = {"w": w, "h": h.astype(np.float32), "ids": ids,
           "q8": (d8.astype(np.float64)[:, None] * q8).reshape(3, 64),
           "q4": (d4.astype(np.float64)[:, None] * (n4 - 8)).reshape(2, 32)}
    return path, ref


def test_load_reports_the_header(model):
    path, _ = model
    g = G.gguf_load(path)
    try:
        assert (g.version, g.n_tensors, g.n_kv, g.meta_only) == (3, 5, 5, False)
        assert g.path == str(path)
        assert "5 tensors" in repr(g)
        assert G.gguf_tensor_names(g) == ["w", "h", "ids", "q8", "q4"]
    finally:
        G.gguf_free(g)


def test_metadata_is_a_dict_of_python_values(model):
    path, _ = model
    with G.gguf_load(path) as g:
        meta = G.gguf_metadata(g)
    assert list(meta) == ["general.name", "n.layers", "lr", "flag", "vocab"]
    assert meta["general.name"] == "tiny" and meta["n.layers"] == 3 and meta["flag"] is True
    assert meta["lr"] == pytest.approx(0.5) and meta["vocab"] == ["a", "bc"]


def test_tensor_info_gives_ggml_order_shape_type_and_size(model):
    path, _ = model
    with G.gguf_load(path) as g:
        assert G.gguf_tensor_info(g, "w") == {"name": "w", "shape": (3, 2), "type": "f32", "size_bytes": 24}
        assert G.gguf_tensor_info(g, "q8") == {"name": "q8", "shape": (64, 3), "type": "q8_0", "size_bytes": 6 * 34}
        assert G.gguf_tensor_info(g, "q4")["type"] == "q4_0"


def test_tensor_data_in_ggmlrs_layout(model):
    """An R array with dim = ne is, in numpy's C order, the reversed shape: exactly the array written."""
    path, ref = model
    with G.gguf_load(path) as g:
        w = G.gguf_tensor_data(g, "w")
        assert w.shape == (2, 3) and w.dtype == np.float32
        np.testing.assert_array_equal(w, ref["w"])
        assert w[1, 2] == ref["w"].reshape(-1)[2 + 3 * 1]     # ggml element (i0=2, i1=1)
        h = G.gguf_tensor_data(g, "h")
        assert h.shape == (5,) and h.dtype == np.float32
        np.testing.assert_array_equal(h, ref["h"])
        ids = G.gguf_tensor_data(g, "ids")
        assert ids.dtype == np.int32
        np.testing.assert_array_equal(ids, ref["ids"])


@pytest.mark.parametrize("name", ["q8", "q4"])
def test_quantized_tensors_are_dequantized_as_the_format_defines(model, name):
    path, ref = model
    with G.gguf_load(path) as g:
        x = G.gguf_tensor_data(g, name)
    assert x.dtype == np.float32 and x.shape == ref[name].shape
    np.testing.assert_allclose(x, ref[name], rtol=1e-6, atol=0)
    assert np.abs(x).max() > 0


def test_meta_only_reads_everything_but_data(model):
    path, _ = model
    g = G.gguf_load(path, meta_only=True)
    try:
        assert g.meta_only and g.n_tensors == 5
        assert G.gguf_metadata(g)["general.name"] == "tiny"
        assert G.gguf_tensor_info(g, "w")["shape"] == (3, 2)
        with pytest.raises(G.GgmlStateError, match=r"meta_only=True.*gguf_load\(path, meta_only=False\)"):
            G.gguf_tensor_data(g, "w")
    finally:
        G.gguf_free(g)


def test_meta_only_needs_no_data_section(model, tmp_path):
    """A header-only read works on a file whose data is cut off; a full load refuses it."""
    path, _ = model
    raw = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(raw[:-40])
    with G.gguf_load(cut, meta_only=True) as g:
        assert G.gguf_tensor_names(g)[-1] == "q4"
    with pytest.raises(G.GgufFileError, match="truncated"):
        G.gguf_load(cut)


def test_free_is_idempotent_and_frees_the_data(model):
    path, _ = model
    g = G.gguf_load(path)
    data_ctx = g.ggml_ctx
    G.gguf_free(g)
    G.gguf_free(g)
    assert not data_ctx.alive
    for call in (lambda: G.gguf_metadata(g), lambda: G.gguf_tensor_names(g), lambda: G.gguf_tensor_data(g, "w"),
                 lambda: G.gguf_tensor_info(g, "w")):
        with pytest.raises(G.GgmlStateError, match="freed"):
            call()
    with G.gguf_load(path) as g2:
        pass
    assert not g2.alive


def test_unknown_names_and_wrong_objects(model):
    path, _ = model
    with G.gguf_load(path) as g:
        with pytest.raises(G.GgufKeyError, match="no tensor named 'nope'"):
            G.gguf_tensor_data(g, "nope")
        with pytest.raises(KeyError):
            G.gguf_tensor_info(g, "nope")
        with pytest.raises(G.GgmlTypeError):
            G.gguf_tensor_data(g, 3)
    for fn in (G.gguf_metadata, G.gguf_tensor_names, G.gguf_free):
        with pytest.raises(G.GgmlTypeError, match="gguf"):
            fn({})
    with pytest.raises(G.GgmlTypeError):
        G.gguf_tensor_info("x", "w")
    with pytest.raises(G.GgmlTypeError):
        G.gguf_load(path, meta_only="yes")


def test_missing_corrupt_and_truncated_files_raise(model, tmp_path):
    path, _ = model
    with pytest.raises(G.GgufFileNotFoundError):
        G.gguf_load(tmp_path / "missing.gguf")
    raw = path.read_bytes()
    bad_magic = tmp_path / "magic.gguf"
    bad_magic.write_bytes(b"GGUX" + raw[4:])
    header_cut = tmp_path / "header.gguf"
    header_cut.write_bytes(raw[:60])
    huge = tmp_path / "huge.gguf"   # the first tensor's ne0 flipped to a huge value: data far beyond the file
    pos = raw.index(b"\x01\x00\x00\x00\x00\x00\x00\x00w") + 9
    dims = pos + 4
    huge.write_bytes(raw[:dims] + struct.pack("<q", 1 << 40) + raw[dims + 8:])
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    for p in (bad_magic, header_cut, huge, empty):
        with pytest.raises(G.GgufFileError):
            G.gguf_load(p)
    with pytest.raises(G.GgufFileError, match="not a GGUF file|directory"):
        G.gguf_load(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(G.GgufFileError, match="FIFO"):
        G.gguf_load(fifo)


def test_types_without_a_row_conversion_are_refused_not_run(tmp_path):
    """Q8_1 is quantized but its type traits have no to_float: get_rows called NULL (segfault). Q8_K likewise.
    In a subprocess, so a crash shows as a return code."""
    from tests.helpers.subprocesses import run_in_subprocess
    cases = []
    for typ in (Q8_1, Q8_K):
        raw = b"\0" * (G.ggml_type_size(typ) * (256 // G.ggml_blck_size(typ)))
        path = tmp_path / f"t{typ}.gguf"
        write_gguf(path, [], [("t", [256], typ, raw)])
        cases.append(str(path))
    rc, out, err = run_in_subprocess(f"""
import ggmlpy as G
for p in {cases!r}:
    with G.gguf_load(p) as f:
        try:
            G.gguf_tensor_data(f, "t"); print("converted")
        except TypeError as e:
            print("refused", "cannot convert" in str(e))
""")
    assert rc == 0 and out.split() == ["refused", "True"] * 2, (rc, out, err)


def test_a_shape_whose_element_count_wraps_is_corrupt(tmp_path):
    """[2**62, 4] has 2**64 elements, which ggml 0.20's int64 product wrapped to 0 (its overflow check then passed):
    the reader reported the tensor 'not loaded' and a size of 0. ggml 0.25 refuses the file itself; the error
    must still say why."""
    path = tmp_path / "wrap.gguf"
    write_gguf(path, [], [("a", [2 ** 62, 4], F32, b"")])
    for read in (lambda: G.gguf_read(path), lambda: G.gguf_load(path, meta_only=True)):
        with pytest.raises(OSError, match="not a valid GGUF file.*overflow"):
            read()
