"""Where a training step of the benchmark models runs on a device: splits, ops left on the CPU, and the bytes
copied between device and host per step (``ggml_model_placement``).

    GGML_VK_VISIBLE_DEVICES=0 python benchmarks/placement_report.py --backend Vulkan0     # lavapipe
    python benchmarks/placement_report.py --backend CUDA0 --json placement.json
    python benchmarks/placement_report.py --backend CUDA0 --check     # exit 1 unless one split, no CPU op

Models: MNIST-FC (784-500-10, batch 500), the small CNN (28x28x1, conv 3x3 8 relu, max-pool 2, conv 3x3 16
relu, max-pool 2, dense 10; batch 100) and examples/char_transformer.py's model (dim 64, 2 heads, 2 blocks,
64 steps; batch 32), as ``bench_vs_torch.py`` builds them. Prints each placement in full and a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_vs_torch import ggml_model, SIZES  # noqa: E402

import ggmlpy as g  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="Vulkan0")
    ap.add_argument("--models", default="mnist-fc,cnn,transformer", help="comma-separated, or 'all' (every model of "
                    "bench_vs_torch.py)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every model's training step is one split with no op on the CPU")
    args = ap.parse_args(argv)
    rows = {}
    names = list(SIZES) if args.models == "all" else args.models.split(",")
    for name in names:
        model = ggml_model(name, args.backend)
        batch = SIZES[name][1]
        p = g.ggml_model_placement(model, batch_size=batch)
        print(f"== {name}\n{p}\n")
        rows[name] = {"batch": batch, "n_splits": p.n_splits, "cpu_ops": p.cpu_ops, "copies": p.copies,
                      "copy_bytes": p.copy_bytes, "devices": p.devices, "why": p.why}
        model.runtime.free()
    print(f"{'model':12} {'batch':>5} {'splits':>6} {'copies':>6} {'bytes/step':>11}  ops on the CPU")
    for name, r in rows.items():
        print(f"{name:12} {r['batch']:5} {r['n_splits']:6} {r['copies']:6} {r['copy_bytes']:11,}  "
              f"{', '.join(r['cpu_ops']) or '-'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "models": rows}, f, indent=2)
    if args.check:
        bad = {n: r for n, r in rows.items() if r["n_splits"] != 1 or r["cpu_ops"]}
        for n, r in bad.items():
            print(f"CHECK FAILED: {n}: {r['n_splits']} splits, on the CPU: {', '.join(r['cpu_ops']) or '-'}; "
                  + "; ".join(f"{op}: {why}" for op, why in r["why"].items()))
        if not bad:
            print(f"CHECK PASSED: {len(rows)} models train in one split with no op on the CPU on {args.backend}")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
