"""benchmarks/bench_gpu.py at its reduced sizes on the CPU (a few steps per model), so that the GPU benchmark keeps
working where no GPU is: every figure of its JSON is there and finite, and the PyTorch side is the same model
(the same parameter count and the same loss at the shared initial weights)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT


SCRIPT = ROOT / "benchmarks" / "bench_gpu.py"
MODELS = ("cnn-gpu", "transformer-gpu", "mlp-gpu")


def _torch_missing() -> str | None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_common import torch_missing
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return torch_missing()


def _run(tmp_path: Path, *args: str, pythonpath: list[str] = ()) -> tuple[dict, str]:
    """The script as a user runs it, with this checkout's ggmlpy first on the path of it and its workers."""
    out = tmp_path / "bench.json"
    path = os.pathsep.join([*pythonpath, str(ROOT), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--steps", "3", "--split-steps", "1",
                           "--json", str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _check_side(row: dict, side: str, split: bool) -> None:
    v = row[side]
    for key in ("samples_per_s", "tflops"):
        assert _positive(v[key]["best"]) and _positive(v[key]["median"]), (side, key, v[key])
    assert len(v["samples_per_s"]["runs"]) == 1
    if row["tokens_per_sample"] > 1:
        assert v["tokens_per_s"]["best"] == pytest.approx(v["samples_per_s"]["best"] * row["tokens_per_sample"])
    sp = v["split"]
    assert _positive(sp["step_s"]) and _positive(sp["epoch_step_s"]) and sp["method"]
    if split:
        assert _positive(sp["compute_s"]) and math.isfinite(sp["host_s"]) and math.isfinite(sp["host_share"])
        assert sp["host_s"] == pytest.approx(sp["step_s"] - sp["compute_s"])
    else:
        assert sp["compute_s"] is None and sp["host_s"] is None
    assert math.isfinite(v["loss"]) and v["version"]


@pytest.fixture(scope="module")
def reduced(tmp_path_factory):
    """One quick run of all three models (with PyTorch when it is installed)."""
    return _run(tmp_path_factory.mktemp("bench_gpu"))


def test_reduced_run_reports_every_figure(reduced):
    result, out = reduced
    assert result["size"] == "reduced" and result["backend"] == "cpu" and result["torch_device"] == "cpu"
    assert result["tf32"] == "off" and result["precision"] == "float32"
    assert result["env"] == {"GGMLPY_CUDA_TF32": "0", "GGML_CUDA_TF32": "0"}
    assert set(result["models"]) == set(MODELS)
    for name in MODELS:
        row = result["models"][name]
        assert row["batch"] == row["config"]["batch"] and row["description"] in out
        assert _positive(row["flops_per_step"]) and _positive(row["params"]["ggmlpy"])
        assert row["tokens_per_sample"] == (64 if name == "transformer-gpu" else 1)
        pl = row["placement"]
        assert pl["n_splits"] >= 1 and pl["copies"] == 0 and pl["copy_bytes"] == 0 and "CPU" in pl["devices"]
        assert math.isfinite(row["init_loss"]["ggmlpy"])
        _check_side(row, "ggmlpy", split=True)
        assert _positive(row["ggmlpy"]["memory_bytes"])


def test_torch_side_is_the_same_model(reduced):
    missing = _torch_missing()
    if missing is not None:
        pytest.skip(f"{missing}: the benchmark ran ggmlpy only")
    result, _ = reduced
    assert result["torch"] is True and result["torch_precision"]["matmul.allow_tf32"] is False
    assert result["torch_precision"]["cudnn.allow_tf32"] is False
    for name in MODELS:
        row = result["models"][name]
        assert row["params"]["torch"] == row["params"]["ggmlpy"], name
        # the same function from the same weights: the first batch's loss agrees to float32 rounding
        assert row["init_loss"]["torch"] == pytest.approx(row["init_loss"]["ggmlpy"], rel=1e-4), name
        _check_side(row, "torch", split=False)     # on the CPU PyTorch's step is not split
        assert _positive(row["ratio"]["best"]) and _positive(row["ratio"]["median"])


def test_flops_estimate_matches_torch_flop_counter():
    """The FLOPs per step are torch.utils.flop_counter's count of the PyTorch model's training step (the attention
    scores and values aside, which it does not count for the CPU's fused attention in every version)."""
    if _torch_missing() is not None:
        pytest.skip(_torch_missing())
    import numpy as np
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_gpu as bg
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    for name in MODELS:
        cfg = bg.CONFIGS["reduced"][name]
        net = bg.torch_build(name, cfg)
        x, y = bg.data(name, cfg, cfg["batch"])
        x = x.transpose(0, 3, 1, 2).copy() if name == "cnn-gpu" else x.astype(np.int64) if x.dtype == np.int32 else x
        with FlopCounterMode(display=False) as counter:
            out = net(torch.from_numpy(x))
            torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                              torch.from_numpy(y.astype(np.int64)).reshape(-1)).backward()
        total, attention = (f * cfg["batch"] for f in bg.train_flops_per_sample(name, cfg))
        assert total - attention <= counter.get_total_flops() <= total, name


def test_runs_where_torch_cannot_be_imported(tmp_path):
    """A ``torch`` that fails to import (as where it is not installed) leaves a ggmlpy-only run that says so."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
    result, out = _run(tmp_path, "--models", "mlp-gpu", pythonpath=[str(fake)])
    assert "PyTorch left out" in out
    assert result["torch"] is False and result["torch_missing"] == "PyTorch is not installed"
    row = result["models"]["mlp-gpu"]
    assert "torch" not in row and "ratio" not in row and set(row["params"]) == {"ggmlpy"}
    _check_side(row, "ggmlpy", split=True)
