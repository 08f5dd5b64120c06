"""patches/0059: ggml's CPU backend allocates a compute's work buffer without throwing, and the failure reaches the
caller as a status: it called ``new[]`` and a buffer past what the process may have ended the interpreter with
``std::bad_alloc`` (found with attention's backward pass over long sequences, whose kernel needs a scratch per
thread). The case runs in a subprocess under a data limit (RLIMIT_DATA) that leaves room for the graph's tensors
but not for the work buffer: ggmlpy raises, and the interpreter goes on."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.helpers import ROOT


CASE = textwrap.dedent("""
    import resource, sys
    import numpy as np
    sys.path.insert(0, {root!r})
    import ggmlpy as G
    from tests.helpers.compute import compute_grad

    M, D = 1 << 16, 64
    unit = M * D * 4                     # one key/value tensor's bytes (16 MiB)
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 1, 1, D)).astype(np.float32)
    k = rng.normal(size=(1, 1, M, D)).astype(np.float32)
    r = rng.normal(size=(1, 1, 1, D)).astype(np.float32)
    G.ggml_set_n_threads(2)

    def attention(c, x, kk):
        return G.ggml_flash_attn_ext(c, x, kk, kk, None, 0.1)
    compute_grad(attention, q, r, k[:, :, :16].copy())   # thread pools and caches made before the limit
    with open("/proc/self/status") as f:
        data = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:"))
    # the graph's tensors (the keys, the backward's gradients: about 4 units) fit; the CPU kernel's work buffer
    # (about 5 units per thread, 2 threads) does not
    resource.setrlimit(resource.RLIMIT_DATA, (data + 8 * unit, data + 8 * unit))
    try:
        compute_grad(attention, q, r, k)
    except G.GgmlStateError as e:
        print("RAISED", e)
    else:
        print("COMPUTED")
""")


def test_a_work_buffer_beyond_the_process_limit_raises_instead_of_aborting():
    proc = subprocess.run([sys.executable, "-c", CASE.format(root=str(ROOT))], capture_output=True, text=True,
                          timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, f"the interpreter died (rc {proc.returncode}): {proc.stderr[-2000:]}"
    assert "RAISED" in proc.stdout and "allocation failed" in proc.stdout, proc.stdout + proc.stderr[-2000:]
