"""ggml_cpu_has_* and ggml_cpu_features against the machine's own report (/proc/cpuinfo) and the build."""
from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest

import ggmlpy as G


X86 = platform.machine() in ("x86_64", "AMD64")


def _cpuinfo_flags() -> set:
    try:
        return set(Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split())
    except (OSError, IndexError):
        return set()


@pytest.mark.skipif(not X86 or not _cpuinfo_flags(), reason="needs an x86 machine with /proc/cpuinfo")
@pytest.mark.parametrize("name, flag", [("avx", "avx"), ("avx2", "avx2"), ("fma", "fma"), ("f16c", "f16c"),
                                        ("bmi2", "bmi2"), ("avx512", "avx512f")])
def test_x86_features_match_the_cpu(name, flag):
    """build_ggml.py compiles for this machine's instruction sets, so ggml's report is the CPU's; a build for the
    AVX2 baseline (GGMLPY_CPU=avx2, made to be carried to other machines) reports that baseline's sets only."""
    from tools.ggml_build.options import AVX2_BASELINE
    built = json.loads((Path(G.__file__).parent / "lib" / "build_info.json").read_text()).get("cpu", "native")
    expected = flag in _cpuinfo_flags() and (built == "native" or flag in AVX2_BASELINE)
    assert getattr(G, f"ggml_cpu_has_{name}")() is expected


@pytest.mark.skipif(not X86, reason="x86 only: the features of other architectures are absent there")
def test_other_architectures_features_are_absent_on_x86():
    for name in ("neon", "arm_fma", "sve", "sme", "dotprod", "riscv_v", "vsx", "vxe", "wasm_simd"):
        assert getattr(G, f"ggml_cpu_has_{name}")() is False, name
    assert G.ggml_cpu_get_sve_cnt() == 0 and G.ggml_cpu_get_rvv_vlen() == 0


def test_llamafile_follows_the_build():
    """The CPU backend is built with llamafile's kernels (build_ggml.py's -DGGML_LLAMAFILE=ON, in
    tools/ggml_build/options.py)."""
    info = json.loads((Path(G.__file__).parent / "lib" / "build_info.json").read_text())
    assert "cpu" in info["backends"]
    assert G.ggml_cpu_has_llamafile() is True


def test_features_dict_agrees_with_each_function():
    features = G.ggml_cpu_features()
    has = [n for n in dir(G) if n.startswith("ggml_cpu_has_")]
    assert len(has) == 25
    for n in has:
        assert features[n[len("ggml_cpu_has_"):]] is getattr(G, n)()
    assert features["sve_cnt"] == G.ggml_cpu_get_sve_cnt() and features["rvv_vlen"] == G.ggml_cpu_get_rvv_vlen()
