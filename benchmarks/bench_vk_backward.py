"""Backward matrix products on Vulkan: each benchmark model's training step with OUT_PROD on the default kernels
(patches/0043 and 0045: ggml's tiled matmul shaders for large products on a GPU, our blocked kernel otherwise)
against upstream's out_prod.comp (``GGMLPY_VK_OUT_PROD=naive``, the kernel before), in the same run; ``--kernels``
adds the forced choices (``matmul``, ``blocked``) that the default picks between.

For each model and kernel, one fresh process trains on Vulkan0 (bench_vs_torch.py's models and data) and
reports the median wall time of a step (a fit's second epoch over its steps) and, from a second process with
ggml's Vulkan perf logger (``GGML_VK_PERF_LOGGER``, which waits for each op), the time of each op per step: the
share of the step in OUT_PROD before and after. Kernels alternate (naive, default, naive, ...) so background load
hits both.

    GGML_VK_VISIBLE_DEVICES=0 python benchmarks/bench_vk_backward.py                 # lavapipe in CI's image
    python benchmarks/bench_vk_backward.py --models transformer,cnn --rounds 3 --device Vulkan0
    python benchmarks/bench_vk_backward.py --kernels naive,matmul,blocked,default   # what the GPU check runs
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("mnist-fc", "cnn", "lstm", "transformer")
# samples per epoch and batch: a few steps each (lavapipe computes on the CPU)
SIZES = {"mnist-fc": (2000, 500), "cnn": (400, 100), "lstm": (256, 64), "transformer": (128, 32)}
KERNELS = ("naive", "matmul", "blocked", "default")  # GGMLPY_VK_OUT_PROD's values; default: unset


def worker(model: str, device: str, perf: bool) -> dict:
    sys.path.insert(0, HERE)
    import bench_vs_torch as models

    import ggmlpy as g
    n, batch = SIZES[model]
    x, y = models.data(model, n)
    net = models.ggml_model(model, device)
    stamps: list[float] = []
    cb = {"on_epoch_begin": lambda e, logs, s: stamps.append(time.perf_counter()),
          "on_epoch_end": lambda e, logs, s: stamps.append(time.perf_counter())}
    g.ggml_fit(net, x, y, epochs=2, batch_size=batch, shuffle=False, verbose=0, callbacks=[cb])
    return {"step_ms": (stamps[3] - stamps[2]) / (n // batch) * 1e3, "steps": 2 * (n // batch)}


def run(model: str, kernel: str, device: str, perf: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GGMLPY_VK_OUT_PROD"}
    if kernel != "default":
        env["GGMLPY_VK_OUT_PROD"] = kernel
    if perf:
        env["GGML_VK_PERF_LOGGER"] = "1"
    proc = subprocess.run([sys.executable, __file__, "--worker", model, device, str(int(perf))], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{model} ({kernel}) failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if perf:
        out["ops_us"] = per_step_ops(proc.stderr, out["steps"])
    return out


def per_step_ops(log: str, steps: int) -> dict[str, float]:
    """The perf logger's totals per op name (MUL_MAT's shapes merged), over the training steps: the logger prints
    a block per graph compute, and the training steps' graphs are the ones with an OPT_STEP."""
    totals: dict[str, float] = {}
    for block in log.split("Vulkan Timings:")[1:]:
        if "OPT_STEP" not in block:
            continue
        for name, us in re.findall(r"^([A-Z_0-9]+)[^\n]*= ([0-9.e+]+) us", block, re.M):
            totals[name] = totals.get(name, 0.0) + float(us)
    return {k: v / steps for k, v in totals.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=3, help="timed runs of each kernel, alternating (default 3)")
    ap.add_argument("--device", default="Vulkan0")
    ap.add_argument("--kernels", default="naive,default",
                    help=f"OUT_PROD kernels to compare, of {','.join(KERNELS)} (default naive,default)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", nargs=3, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        model, device, perf = args.worker
        print(json.dumps(worker(model, device, perf == "1")))
        return 0
    kernels = args.kernels.split(",")
    unknown = sorted(set(kernels) - set(KERNELS))
    if unknown or "naive" not in kernels or "default" not in kernels:
        ap.error(f"--kernels: {args.kernels!r} must name naive and default, and only {', '.join(KERNELS)}")
    results = {}
    for model in args.models.split(","):
        times: dict[str, list[float]] = {k: [] for k in kernels}
        for r in range(args.rounds):
            for kernel in (kernels if r % 2 == 0 else list(reversed(kernels))):
                times[kernel].append(run(model, kernel, args.device, False)["step_ms"])
        ops = {k: run(model, k, args.device, True)["ops_us"] for k in kernels}
        row = {}
        print(f"== {model} on {args.device}, batch {SIZES[model][1]}, {args.rounds} rounds")
        for kernel in kernels:
            step = statistics.median(times[kernel])
            total, prod = sum(ops[kernel].values()), ops[kernel].get("OUT_PROD", 0.0)
            row[kernel] = {"step_ms": step, "step_runs_ms": times[kernel], "out_prod_ms": prod / 1e3,
                           "ops_total_ms": total / 1e3}
            print(f"  {kernel:8s} step {step:8.1f} ms (median; runs {', '.join(f'{t:.1f}' for t in times[kernel])})"
                  f"   OUT_PROD {prod / 1e3:7.1f} ms of {total / 1e3:7.1f} ms of ops per step"
                  f" ({100 * prod / total if total else 0:.0f}%)")
        n, d = row["naive"], row["default"]
        print(f"  OUT_PROD {n['out_prod_ms'] / d['out_prod_ms'] if d['out_prod_ms'] else float('inf'):.1f}x faster,"
              f" the step {n['step_ms'] / d['step_ms']:.2f}x")
        results[model] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
