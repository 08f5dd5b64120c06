"""benchmarks/bench_peak.py's counts: the FLOPs and the bytes it charges each profiled node, against counts made by
hand from the ops' definitions, on shapes as the profile gives them (trailing 1s dropped: a one-channel kernel's
shape has three dimensions), its stream rate a positive figure, and its summary of the rounds (best against best,
median against median) on rounds made by hand."""
from __future__ import annotations

import sys

import pytest

from ggmlpy.compute.profile import NodeTime
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def peak():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_peak
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return bench_peak


def _node(op, shape, sources, params=(0, 0, 0, 0)):
    return NodeTime(op, "CPU", shape, sources, 1e-3, params)


def test_products_flops(peak):
    # dst [10, 100] = W [784, 10]^T x [784, 100]: 1000 outputs of 784 terms
    assert peak.product_flops(_node("MUL_MAT", (10, 100), ((784, 10), (784, 100)))) == 2 * 1000 * 784
    # dst [784, 500] = x [784, 100] dy [500, 100]^T: sums of 100 terms
    assert peak.product_flops(_node("OUT_PROD", (784, 500), ((784, 100), (500, 100)))) == 2 * 784 * 500 * 100
    # 14 x 14 x 16 x 100 outputs, each 3 x 3 x 8 taps
    assert peak.product_flops(_node("CONV_2D_TILED", (14, 14, 16, 100), ((3, 3, 8, 16), (14, 14, 8, 100), (16,)))) \
        == 2 * 14 * 14 * 16 * 100 * 72
    assert peak.product_flops(_node("ADD", (10, 100), ((10, 100), (10,)))) == 0


def test_a_one_channel_kernels_backward_is_counted_whatever_it_computes(peak):
    """A kernel of one output channel (3 x 3 x 4 x 1, shown as (3, 3, 4)) over 2 images of 8 x 8 x 4, padding 0:
    6 x 6 outputs each; both gradients asked (op params 1, 1), then the kernel's alone."""
    sources = ((3, 3, 4), (8, 8, 4, 2), (6, 6, 1, 2), (6, 6, 1, 2))
    both = _node("CONV_2D_TILED_BACK", (8 * 8 * 4 * 2 + 36 + 1,), sources, (1, 1, 0, 0))
    kernel_only = _node("CONV_2D_TILED_BACK", (8 * 8 * 4 * 2 + 36 + 1,), sources, (0, 1, 0, 0))
    per_gradient = 2 * (6 * 6 * 2) * 36
    assert peak.product_flops(both) == 2 * per_gradient
    assert peak.product_flops(kernel_only) == per_gradient
    read = 36 + 8 * 8 * 4 * 2 + 6 * 6 * 2              # the kernel, the images, the output gradient
    assert peak.node_bytes(both) == 4 * (read + 36 + 1 + 8 * 8 * 4 * 2)   # the kernel's, bias's, images' gradients
    assert peak.node_bytes(kernel_only) == 4 * (read + 36 + 1)


def test_other_nodes_move_their_operands_and_result_once(peak):
    assert peak.node_bytes(_node("MUL_MAT", (10, 100), ((784, 10), (784, 100)))) == 4 * (1000 + 7840 + 78400)


def test_the_stream_rate_is_a_rate(peak):
    rate = peak.stream_rate(1, floats=1 << 14, reps=4, rounds=2)
    assert 0.1 < rate < 10_000   # GB/s: a memcpy's order, nowhere near 0 or a unit error


def _round(flops, seconds, peak_gflops, stream=50.0, step_s=2e-3):
    """A round as model_rounds makes it: one product of ``flops`` FLOPs and 1 MB taking ``seconds``."""
    return {"product_flops": flops, "product_s": seconds, "work": [(flops, 1e6)], "node_s": 2 * seconds,
            "step_s": step_s, "peak": peak_gflops, "stream": stream}


def test_the_summary_takes_the_best_round_against_the_best_peak(peak):
    # 1 GFLOP in 10, 8 and 20 ms beside peaks of 150, 200 and 100 GFLOP/s: the best round is 125 GFLOP/s, the
    # best peak 200 (measured beside another round); the median round 100 GFLOP/s against the median peak 150
    rows = [_round(1e9, 10e-3, 150.0), _round(1e9, 8e-3, 200.0, step_s=1.5e-3), _round(1e9, 20e-3, 100.0)]
    s = peak.summary("m", rows)
    assert s["product_gflops"] == pytest.approx(125.0)
    assert s["peak"] == 200.0 and s["of_peak"] == pytest.approx(125.0 / 200.0)
    assert s["median_gflops"] == pytest.approx(100.0) and s["median_of_peak"] == pytest.approx(100.0 / 150.0)
    assert s["step_s"] == 1.5e-3 and s["share"] == pytest.approx(0.5)
    # the roofline at the best limits: 1 GFLOP at 200 GFLOP/s (5 ms) against 1 MB at 50 GB/s (0.02 ms)
    assert s["roofline_gflops"] == pytest.approx(200.0)
    assert s["rounds_gflops"] == pytest.approx([100.0, 125.0, 50.0]) and s["rounds_peak"] == [150.0, 200.0, 100.0]


def test_a_memory_bound_product_has_the_stream_rate_as_its_roofline(peak):
    # 1 MFLOP moving 100 MB: at 50 GB/s that is 2 ms, where its FLOPs need 5 us at 200 GFLOP/s
    row = dict(_round(1e6, 4e-3, 200.0), work=[(1e6, 100e6)])
    assert peak.roofline_s(row["work"], 200.0, 50.0) == pytest.approx(2e-3)
    assert peak.summary("m", [row])["of_roofline"] == pytest.approx(0.5)
