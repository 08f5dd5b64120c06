"""patches/0047: Vulkan's REPEAT_BACK (the gradient of a broadcast: a bias added to every position) with its sums
cut into slices that many invocations add in parallel, then the split-k reduce shader. Upstream gave each output
one invocation looping over every repeat: 8 invocations for a convolution bias over 100 x 28 x 28 positions, and
on lavapipe a sum past 65535 iterations stopped short.

Checked against numpy float64 and ggml's CPU kernel, on shapes that repeat along one to four dimensions, a strided
(permuted) source, a source that starts off the binding alignment (upstream's shader ignored the offset: the
gradient of a GRU's recurrent bias, a view into its backward result, came out shifted), and sums short enough for
upstream's shader (which they keep). Tolerance: float32 sums of up to
78400 terms in another order than numpy's, so within 4 u sqrt(n) of the terms' magnitude (u = 2^-24), as for
OUT_PROD; exact for the sums of ones.
"""
from __future__ import annotations

import json
import textwrap

import pytest

import ggmlpy as g
from tests.helpers.subprocesses import run_in_subprocess


pytestmark = pytest.mark.vulkan

# (source shape, result shape) in numpy order (ne3, ne2, ne1, ne0); "P": the source is a permuted view, "O": a view
# at an offset that is not a binding's alignment
CASES = [
    ((100, 8, 28, 28), (1, 8, 1, 1), ""),      # a convolution bias over 78400 positions
    ((1, 1, 70000, 3), (1, 1, 1, 3), ""),      # a dense bias over 70000 rows: past lavapipe's loop limit
    ((3, 10, 4, 6), (3, 5, 1, 3), ""),         # repeats along ne0, ne1 and ne2
    ((4, 6, 300, 16), (1, 3, 1, 16), ""),       # along ne1, ne2 and ne3
    ((2, 3, 5, 7), (1, 1, 1, 1), ""),           # everything into one: short, upstream's shader
    ((1, 6, 512, 24), (1, 3, 1, 24), "P"),      # a permuted source (rows contiguous, ne1 and ne2 swapped)
    ((1, 3, 2, 9), (1, 1, 1, 9), "O"),          # a view 2 floats into its buffer: upstream's shader read from 0
    ((1, 1, 700, 9), (1, 1, 1, 9), "O"),        # the same, sliced
]

SCRIPT = textwrap.dedent("""
    import json, numpy as np, ggmlpy as G
    from tests.helpers.compute import compute
    vk, cpu = G.ggml_backend_init_by_name("Vulkan0"), G.ggml_backend_cpu_init()
    out = []
    for shape, dst, layout in {cases}:
        rng = np.random.default_rng(sum(shape))
        x = rng.normal(size=shape).astype(np.float32)
        if layout == "P":   # stored with ne1 and ne2 swapped, read through a permute
            stored = np.ascontiguousarray(np.swapaxes(x, 1, 2))
            view = lambda c, a: G.ggml_permute(c, a, 0, 2, 1, 3)
        elif layout == "O":  # stored after 2 floats, read through a view at that offset (a gradient's slice)
            stored = np.concatenate([np.zeros(2, np.float32), x.ravel()])
            ne = shape[::-1]
            view = lambda c, a, ne=ne: G.ggml_view_4d(c, a, *ne, 4 * ne[0], 4 * ne[0] * ne[1],
                                                      4 * ne[0] * ne[1] * ne[2], 8)
        else:
            stored, view = x, lambda c, a: a
        build = lambda c, a: G.ggml_repeat_back(c, view(c, a), G.ggml_new_tensor_4d(c, G.GGML_TYPE_F32, *dst[::-1]))
        places = []
        (got,) = compute(build, stored, backend=[vk, cpu], placements=places)
        (on_cpu,) = compute(build, stored, backend=cpu)
        reps = [s // d for s, d in zip(shape, dst)]
        x64 = x.astype(np.float64).reshape(reps[0], dst[0], reps[1], dst[1], reps[2], dst[2], reps[3], dst[3])
        want = x64.sum(axis=(0, 2, 4, 6))
        scale = np.sqrt((x64 ** 2).sum(axis=(0, 2, 4, 6)))
        n = int(np.prod(reps))
        bound = max(1e-5, 4 * 2.0 ** -24 * np.sqrt(n)) * scale + 1e-6
        ones = [compute(build, np.ones_like(stored), backend=[vk, cpu])[0].ravel().tolist(), n]
        out.append([float(np.max(np.abs(got.reshape(want.shape) - want) / bound)),
                    float(np.max(np.abs(on_cpu.reshape(want.shape) - want) / bound)), ones,
                    places[-1].cpu_ops])
    print("RESULT" + json.dumps(out))
""")


def test_repeat_back_agrees_with_numpy_and_the_cpu_and_stays_on_the_device():
    if "vulkan" not in g.ggml_backends_built() or g.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("needs the Vulkan backend and a Vulkan0 device (CI: Mesa's lavapipe)")
    rc, out, err = run_in_subprocess(SCRIPT.format(cases=repr(CASES)), timeout=600)
    assert rc == 0, err[-2000:]
    results = json.loads(out.split("RESULT", 1)[1])
    assert len(results) == len(CASES)
    for case, (vs_numpy, cpu_vs_numpy, (ones, n), cpu_ops) in zip(CASES, results):
        assert vs_numpy < 1 and cpu_vs_numpy < 1, (case, vs_numpy, cpu_vs_numpy)
        assert all(v == n for v in ones), (case, ones[:4], n)     # sums of ones: exact
        assert cpu_ops == [], (case, cpu_ops)                      # never refused, never on the CPU
