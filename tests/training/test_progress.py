"""Progress output of the fit loops (training/progress.py): never a reason for a fit to fail."""
from __future__ import annotations


def test_a_fit_with_progress_runs_when_stderr_is_closed_or_full():
    """A process started with stderr closed (2>&-, a daemon) or on a full disk: the default verbose=1 fit
    failed on its first progress line. Progress is skipped; training goes on."""
    from tests.helpers.subprocesses import run_in_subprocess
    rc, out, err = run_in_subprocess("""
import sys, numpy as np, ggmlpy as g
m = g.ggml_compile(g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(3,)), loss="mse", backend="cpu")
x, y = np.ones((8, 3), np.float32), np.ones((8, 2), np.float32)
for err in (None, "closed", "full"):
    sys.stderr = None if err is None else open("/dev/full", "w") if err == "full" else open("/dev/null", "w")
    if err == "closed":
        sys.stderr.close()
    h = g.ggml_fit(m, x, y, epochs=2, verbose=1, callbacks=[g.ggml_schedule_reduce_on_plateau("loss", patience=0)])
    print(err, len(h))
sys.stderr = sys.__stderr__   # the interpreter's own exit flushes stderr (a full one would set the exit code)
""")
    assert rc == 0 and out.split() == ["None", "2", "closed", "2", "full", "2"], (rc, out, err)


def test_the_epoch_line_shows_the_compiled_metrics(capsys):
    """verbose=2 printed loss and accuracy only: a compiled MAE was in the history but not on the line (Keras
    prints every metric)."""
    import numpy as np

    import ggmlpy as g
    m = g.ggml_compile(g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(3,)), loss="mse",
                       metrics=["mae"], backend="cpu")
    x, y = np.ones((8, 3), np.float32), np.ones((8, 2), np.float32)
    h = g.ggml_fit(m, x, y, epochs=1, verbose=2, validation_data=(x, y))
    err = capsys.readouterr().err
    assert f"train_mae={h['train_mae'][0]:.4g}" in err and f"val_mae={h['val_mae'][0]:.4g}" in err, err
