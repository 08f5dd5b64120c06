"""patches/0046: lavapipe leaves a shader's loops once they have iterated 65535 times in all (one counter per
invocation, shared by every loop of the shader), and the result is silently wrong: a sum stops short, an argmax
returns 0. ggml-vulkan now refuses, on lavapipe only, an op whose shader would loop that far, and ggml's scheduler
computes it on the CPU. patches/0047 and 0048 keep the common ones on the device instead: REPEAT_BACK's sums in
slices, and the reductions 512 wide past 1024 columns (upstream: a subgroup wide, 8 on lavapipe).

Each case is an op at a size past the limit (wrong before the patch: the value upstream gave is in the comment)
and one below it, computed by a scheduler over Vulkan0 and the CPU. Checked: the result against numpy float64 (the
sums are of exact small integers, or within float32 rounding of the float64 value: the cross-entropy's mean of
600,000 equal losses, added in float32 one by one on the CPU, is 2e-3 off, where lavapipe's truncated sum was 78 %
off); where the op ran (on lavapipe
the case past the limit on the CPU, the one below on Vulkan0; on any other device driver both on the device).
"""
from __future__ import annotations

import json
import textwrap

import pytest

import ggmlpy as g
from tests.helpers.subprocesses import run_in_subprocess


pytestmark = pytest.mark.vulkan

SCRIPT = textwrap.dedent("""
    import json, numpy as np, ggmlpy as G
    from tests.helpers.compute import compute, compute_grad
    vk, cpu = G.ggml_backend_init_by_name("Vulkan0"), G.ggml_backend_cpu_init()
    lavapipe = "llvmpipe" in G.ggml_backend_dev_description(G.ggml_backend_dev_by_name("Vulkan0"))
    rng = np.random.default_rng(0)
    out = {"lavapipe": lavapipe, "cases": []}

    def record(name, op, past, got, want, places, rtol=1e-5):
        got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
        err = float(np.max(np.abs(got - want) / (rtol * np.abs(want) + 1e-6))) if got.shape == want.shape else 1e9
        where = places[-1]
        out["cases"].append({"name": name, "op": op, "past": past, "err": err, "cpu_ops": where.cpu_ops,
                             "devices": where.devices, "why": where.why.get(op, "")})

    def case(name, op, past, build, arrays, want, rtol=1e-5):
        places = []
        (got,) = compute(build, *arrays, backend=[vk, cpu], placements=places)
        record(name, op, past, got, want, places, rtol)

    # the reductions (patches/0048: 512 wide past 1024 columns): upstream's subgroup-wide workgroups (8 on lavapipe)
    # gave SUM 131070 for 600,000, ARGMAX 0 and 0, the cross-entropy 0.151 for 0.693; now on the device up to
    # 512 x 60000 per row
    n = 600_000
    case(f"sum {n}", "SUM", False, lambda c, a: G.ggml_sum(c, a), [np.ones(n, np.float32)], [n])
    case(f"sum_rows 2x{n}", "SUM_ROWS", False, lambda c, a: G.ggml_sum_rows(c, a), [np.ones((2, n), np.float32)],
         [n, n])
    a = rng.normal(size=(2, n)).astype(np.float32)
    case(f"mean 2x{n}", "MEAN", False, lambda c, a: G.ggml_mean(c, a), [a], a.astype(np.float64).mean(axis=1),
         rtol=1e-3)
    a = np.zeros((2, n), np.float32); a[0, n - 10] = 5; a[1, 3] = 5
    case(f"argmax 2x{n}", "ARGMAX", False, lambda c, a: G.ggml_argmax(c, a), [a], [n - 10, 3])
    logits, labels = np.zeros((n, 2), np.float32), np.zeros((n, 2), np.float32)
    labels[:, 0] = 1
    case(f"cross_entropy {n} rows", "CROSS_ENTROPY_LOSS", False, lambda c, a, b: G.ggml_cross_entropy_loss(c, a, b),
         [logits, labels], [np.log(2.0)], rtol=1e-2)
    for n, past in ((31_500_000, True), (30_000_000, False)):   # SUM's one workgroup past 512 x 60000
        case(f"sum {n}", "SUM", past, lambda c, a: G.ggml_sum(c, a), [np.ones(n, np.float32)], [n])
    for n, past in ((10_500_000, True), (9_000_000, False)):    # NORM_BACK (patches/0067): 3 loops of a 512-wide row
        x = rng.integers(-2, 3, size=(1, n)).astype(np.float32)
        dy = rng.integers(-2, 3, size=(1, n)).astype(np.float32)
        xc = x.astype(np.float64) - x.mean(dtype=np.float64)
        r = 1.0 / np.sqrt((xc * xc).mean() + 1e-5)
        want = r * (dy - dy.mean(dtype=np.float64)) - r ** 3 * xc * (dy * xc).mean()
        case(f"norm_back {n}", "NORM_BACK", past, lambda c, a, b: G.ggml_norm_back(c, a, b, 1e-5), [dy, x], want,
             rtol=1e-3)
    n = 300_000                                                  # upstream: zeros from index 224240 on
    y = np.full((1, n), 1.0 / n, np.float32)
    dy = np.ones((1, n), np.float32); dy[0, -50_000:] = 3.0
    want = y.astype(np.float64) * (dy - (dy.astype(np.float64) * y).sum())
    case(f"soft_max_back {n}", "SOFT_MAX_BACK", False, lambda c, a, b: G.ggml_soft_max_ext_back(c, a, b, 1.0, 0.0),
         [dy, y], want, rtol=1e-3)
    for n, past in ((70_000, True), (50_000, False)):           # upstream: 6554 of 7000 per row
        grad, idx = np.ones((n, 4), np.float32), (np.arange(n) % 10).astype(np.int32)
        want = np.zeros((10, 4)); np.add.at(want, idx, 1.0)
        case(f"get_rows_back {n} ids", "GET_ROWS_BACK", past,
             lambda c, a, b: G.ggml_get_rows_back(c, a, b, G.ggml_new_tensor_2d(c, G.GGML_TYPE_F32, 4, 10)),
             [grad, idx], want)
    # upstream: 63448 of 65536 at 16 x 64 x 64; patches/0047 cuts the sums into slices: on the device at any size
    for (n, h), past in (((16, 64), False), ((100, 28), False)):
        x = np.ones((n, 2, h, h), np.float32)                    # a channel bias's gradient (ADD's backward)
        case(f"repeat_back {n}x2x{h}x{h}", "REPEAT_BACK", past,
             lambda c, a: G.ggml_repeat_back(c, a, G.ggml_new_tensor_4d(c, G.GGML_TYPE_F32, 1, 1, 2, 1)),
             [x], [n * h * h] * 2)
    for k, past in ((260, True), (200, False)):                  # upstream: avg 8.8e-4 for 2.04e-3
        x = rng.normal(size=(2, k, k)).astype(np.float32)
        case(f"pool_2d avg {k}x{k}", "POOL_2D", past,
             lambda c, a: G.ggml_pool_2d(c, a, G.GGML_OP_POOL_AVG, k, k, k, k, 0, 0), [x],
             x.astype(np.float64).mean(axis=(1, 2)), rtol=1e-3)
    for k, past in ((16, True), (6, False)):                     # upstream: 144 of 161 for k = 16
        x = rng.normal(size=(1, 40, 40)).astype(np.float32)
        r = np.ones((1, 41 - k, 41 - k), np.float32)
        places = []
        _, got = compute_grad(lambda c, a: G.ggml_pool_2d(c, a, G.GGML_OP_POOL_MAX, k, k, 1, 1, 0, 0), x, r,
                              backend=[vk, cpu], placements=places)
        want = np.zeros((40, 40))
        for oy in range(41 - k):
            for ox in range(41 - k):
                w = x[0, oy:oy + k, ox:ox + k]
                iy, ix = np.unravel_index(np.argmax(w), w.shape)
                want[oy + iy, ox + ix] += 1
        record(f"pool_2d_back max k={k}", "POOL_2D_BACK", past, got, want, places)
    for L, past in ((16384, True), (4096, False)):              # upstream: 1030 outputs wrong at L = 16384
        a = (rng.normal(size=(128, 2, 4)) * 0.1).astype(np.float32)   # kernel [K=4, Cout=2, Cin=128]
        b = rng.normal(size=(128, L)).astype(np.float32)              # input [L, Cin=128]
        want = np.zeros((2, L + 3))
        for t in range(4):
            want[:, t:t + L] += np.einsum("ic,il->cl", a[:, :, t].astype(np.float64), b)
        case(f"conv_transpose_1d L={L}", "CONV_TRANSPOSE_1D", past,
             lambda c, a, b: G.ggml_conv_transpose_1d(c, a, b, 1, 0, 1), [a, b], want, rtol=1e-3)
    print("RESULT" + json.dumps(out))
""")


def _require_vulkan():
    if "vulkan" not in g.ggml_backends_built() or g.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("needs the Vulkan backend and a Vulkan0 device (CI: Mesa's lavapipe)")


@pytest.fixture(scope="module")
def results():
    _require_vulkan()
    rc, out, err = run_in_subprocess(SCRIPT, timeout=900)
    assert rc == 0, err[-3000:]
    return json.loads(out.split("RESULT", 1)[1])


def test_every_case_is_right_past_lavapipes_loop_limit_and_below_it(results):
    wrong = [c for c in results["cases"] if c["err"] >= 1]
    assert not wrong, wrong
    assert len(results["cases"]) == 20


def test_lavapipe_refuses_exactly_the_ops_past_its_loop_limit(results):
    """On lavapipe the case past the limit runs its op on the CPU (the placement names the refusal) and the one
    below it on Vulkan0; on another driver both run on the device (the refusal is lavapipe's only)."""
    for c in results["cases"]:
        on_cpu = c["op"] in c["cpu_ops"]
        if results["lavapipe"] and c["past"]:
            assert on_cpu and "loop" in c["why"], c
        else:
            assert not on_cpu and "Vulkan0" in c["devices"], c


BAD_INDEX = textwrap.dedent("""
    import numpy as np, ggmlpy as G
    from tests.helpers.compute import compute
    vk, cpu = G.ggml_backend_init_by_name("Vulkan0"), G.ggml_backend_cpu_init()
    n = 70_000
    grad, idx = np.ones((n, 4), np.float32), (np.arange(n) % 10).astype(np.int32)
    idx[12345] = 10                                              # one row past the result's 10
    try:
        compute(lambda c, a, b: G.ggml_get_rows_back(c, a, b, G.ggml_new_tensor_2d(c, G.GGML_TYPE_F32, 4, 10)),
                grad, idx, backend=[vk, cpu])
    except G.GgmlValueError as e:
        print("REFUSED", e)
    # two halves of one index tensor, views without names of their own, the bad index in the second
    grad2, idx2 = np.ones((2 * n, 4), np.float32), (np.arange(2 * n) % 10).astype(np.int32)
    idx2[n + 12345] = 1_000_000

    def halves(c, a, b):
        return [G.ggml_get_rows_back(c, G.ggml_view_2d(c, a, 4, n, 16, h * n * 16), G.ggml_view_1d(c, b, n, h * n * 4),
                                     G.ggml_new_tensor_2d(c, G.GGML_TYPE_F32, 4, 10)) for h in range(2)]
    try:
        compute(halves, grad2, idx2, backend=[vk, cpu])
    except G.GgmlValueError as e:
        print("HALVES REFUSED", e)
""")


def test_an_index_input_copied_to_another_backend_is_checked_through_the_input():
    """On lavapipe the 70,000-index GET_ROWS_BACK runs on the CPU, which reads the scheduler's copy of the
    indices, filled only during the compute: the check reads the input itself (it read the unfilled copy and
    refused good indices), and still refuses a bad one before ggml would write outside its memory; also when the
    indices are views of one tensor, which ggml names alike (a lookup by name found the wrong one)."""
    _require_vulkan()
    rc, out, err = run_in_subprocess(BAD_INDEX, timeout=300)
    assert rc == 0, err[-2000:]
    assert "REFUSED" in out and "got 10" in out, out
    assert "HALVES REFUSED" in out and "got 1000000" in out, out
