"""Host waits per training step on a device: how many times the host waits for the device in a step (every
synchronization and every blocking read or write of device memory, counted by patches/0051), the time it spends
in those waits, and samples/s, for bench_vs_torch.py's models (and MNIST-FC with RMSprop, whose step is a graph
of its own, and with Keras' metrics MAE, precision, recall and AUC compiled), against a baseline build measured in
the same run.

The baseline is another source checkout with its own compiled bindings and libraries, built with patches/0051
(the counter), for example the commit before a change:

    git worktree add /tmp/before <commit>        # then build it there (setup.py build_ext --inplace), or copy
                                                 # ggmlpy/lib and ggmlpy/_ffi/_ggml.abi3.so of such a build
    GGML_VK_VISIBLE_DEVICES=0 python benchmarks/bench_host_waits.py --baseline-root /tmp/before --rounds 3
    python benchmarks/bench_host_waits.py --device CUDA0                           # this build only

Each measurement is a fresh process that trains two epochs and reports the second; builds alternate (baseline,
this one, baseline, ...) so background load hits both; medians of the rounds.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CASES = ("mnist-fc", "mnist-fc/rmsprop", "mnist-fc/metrics", "cnn", "lstm", "transformer")
METRICS = ["accuracy", "mae", "precision", "recall", "auc"]   # the "/metrics" cases' compiled metrics
SIZES = {"mnist-fc": (2000, 500), "cnn": (400, 100), "lstm": (256, 64), "transformer": (128, 32)}


def worker(root: str, case: str, device: str) -> dict:
    sys.path.insert(0, root)
    sys.path.insert(0, HERE)
    import bench_vs_torch as models

    import ggmlpy as g
    base = ctypes.CDLL(os.path.join(os.path.dirname(g.__file__), "lib", "libggml-base.so.0"))
    base.ggmlpy_host_waits.restype = ctypes.c_uint64
    base.ggmlpy_host_wait_us.restype = ctypes.c_int64
    model, _, variant = case.partition("/")
    n, batch = SIZES[model]
    x, y = models.data(model, n)
    net = models.ggml_model(model, device)
    if variant:
        optimizer, metrics = ("adam", METRICS) if variant == "metrics" else (variant, ["accuracy"])
        net = g.ggml_compile(net, optimizer=optimizer, loss="sparse_categorical_crossentropy", backend=device,
                             learning_rate=models.LR, metrics=metrics)
    marks: list[tuple[float, int, int]] = []

    def mark(*_: object) -> None:
        marks.append((time.perf_counter(), base.ggmlpy_host_waits(), base.ggmlpy_host_wait_us()))
    g.ggml_fit(net, x, y, epochs=2, batch_size=batch, shuffle=False, verbose=0,
               callbacks=[{"on_epoch_begin": mark, "on_epoch_end": mark}])
    steps = n // batch
    (t0, w0, us0), (t1, w1, us1) = marks[2], marks[3]
    return {"waits": (w1 - w0) / steps, "wait_ms": (us1 - us0) / steps / 1e3, "samples_s": n / (t1 - t0),
            "step_ms": (t1 - t0) / steps * 1e3}


def run(root: str, case: str, device: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--worker", root, case, device], capture_output=True, text=True,
                          timeout=1800, cwd="/tmp")
    if proc.returncode != 0:
        raise SystemExit(f"{case} ({root}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="Vulkan0")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-root", default=None, help="a source checkout of the build to compare against")
    ap.add_argument("--json", default=None, help="also write the medians here")
    args = ap.parse_args()
    results: dict[str, dict] = {}
    builds = ([("before", args.baseline_root)] if args.baseline_root else []) + [("now", ROOT)]
    print(f"host waits per training step on {args.device}, medians of {args.rounds} rounds "
          f"(second epoch of a fit; builds: {', '.join(f'{n}={r}' for n, r in builds)})")
    head = f"{'case':18s}" + "".join(f" {n + ' waits':>13s} {n + ' wait ms':>14s} {n + ' samples/s':>17s}"
                                     for n, _ in builds)
    print(head + ("  samples/s now/before" if len(builds) > 1 else ""))
    for case in args.cases.split(","):
        got: dict[str, list[dict]] = {n: [] for n, _ in builds}
        for _ in range(args.rounds):
            for name, root in builds:
                got[name].append(run(root, case, args.device))
        med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in got.items()}
        results[case] = med
        line = f"{case:18s}" + "".join(f" {med[n]['waits']:13.1f} {med[n]['wait_ms']:14.2f} "
                                       f"{med[n]['samples_s']:17.1f}" for n, _ in builds)
        if len(builds) > 1:
            line += f"  {med['now']['samples_s'] / med['before']['samples_s']:.2f}x"
        print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "rounds": args.rounds, "cases": results}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], sys.argv[3], sys.argv[4])))
    else:
        main()
