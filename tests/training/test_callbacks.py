"""The callback protocol (python-api §5, ggmlR-training §5.1) and the four built-ins against
ggmlR's formulas (§5.2)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.training_refs import Linear


K, M, N = 3, 2, 4
ADAMW, SGD = G.ggml_opt_optimizer_type_adamw(), G.ggml_opt_optimizer_type_sgd()
END_KEYS = {"train_loss", "train_accuracy", "val_loss", "val_accuracy", "steps"}


@pytest.fixture
def model(cpu):
    m = Linear(cpu, K, M, N, seed=9)
    yield m
    m.free()


@pytest.fixture
def batches(trng):
    return [(trng.normal(0, 1, (N, K)).astype(np.float32), trng.normal(0, 1, (N, M)).astype(np.float32))
            for _ in range(2)]


def fit(model, sched, batches, callbacks, **kw):
    kw.setdefault("silent", True)
    return G.ggml_fit_opt_gen(sched, model.net.ctx, model.x, model.out, batches, callbacks=callbacks, **kw)


class Recorder:
    """An object callback."""

    def __init__(self, name, events):
        self.name, self.events = name, events

    def on_epoch_begin(self, epoch, logs, state):
        self.events.append((self.name, "begin", epoch))

    def on_epoch_end(self, epoch, logs, state):
        self.events.append((self.name, "end", epoch))


def dict_recorder(name, events, phases=("on_epoch_begin", "on_epoch_end"), stop_at=None):
    def make(phase):
        def f(epoch, logs, state):
            events.append((name, phase.split("_")[-1], epoch))
            if stop_at == (phase, epoch):
                state.stop = True
        return f
    return {p: make(p) for p in phases}


def lr_log(log, phase="on_epoch_begin", key="adamw"):
    return {phase: lambda e, logs, s: log.append((e, G.ggml_opt_get_lr(s.lr_ud)[key]))}


# ---------------------------------------------------------------- protocol

def test_dict_and_object_callbacks_run_in_list_order(model, tsched, batches):
    ev: list = []
    cbs = [dict_recorder("a", ev), Recorder("b", ev), dict_recorder("c", ev, phases=("on_epoch_end",)),
           {"on_epoch_begin": None}]  # None: no hook, as R's NULL
    h = fit(model, tsched, batches, cbs, epochs=2, initial_epoch=3)
    assert ev == [("a", "begin", 4), ("b", "begin", 4), ("a", "end", 4), ("b", "end", 4), ("c", "end", 4),
                  ("a", "begin", 5), ("b", "begin", 5), ("a", "end", 5), ("b", "end", 5), ("c", "end", 5)]
    assert list(h["epoch"]) == [4, 5]


def test_a_single_callback_may_be_given_bare(model, tsched, batches):
    ev: list = []
    fit(model, tsched, batches, dict_recorder("a", ev, phases=("on_epoch_end",)), epochs=2)
    assert ev == [("a", "end", 1), ("a", "end", 2)]
    ev.clear()
    fit(model, tsched, batches, Recorder("b", ev), epochs=1)
    assert ev == [("b", "begin", 1), ("b", "end", 1)]


def test_stop_in_on_epoch_begin_skips_the_epoch(model, tsched, batches):
    ev: list = []
    calls = []

    def gen():
        calls.append(1)
        return batches[0] if len(calls) % 2 else None

    cbs = [dict_recorder("a", ev, stop_at=("on_epoch_begin", 2)), Recorder("b", ev)]
    h = fit(model, tsched, gen, cbs, epochs=4)
    assert list(h["epoch"]) == [1]  # no row for the stopped epoch
    assert ev == [("a", "begin", 1), ("b", "begin", 1), ("a", "end", 1), ("b", "end", 1), ("a", "begin", 2)]
    assert len(calls) == 2  # epoch 2 asked the source for nothing


def test_stop_in_on_epoch_end_keeps_the_row(model, tsched, batches):
    ev: list = []
    cbs = [dict_recorder("a", ev, stop_at=("on_epoch_end", 2)), Recorder("b", ev)]
    h = fit(model, tsched, batches, cbs, epochs=4)
    assert list(h["epoch"]) == [1, 2]
    assert ev[-3:] == [("a", "begin", 2), ("b", "begin", 2), ("a", "end", 2)]  # b's end is skipped


def test_measured_values_are_protected_and_state_is_shared(model, tsched, batches):
    seen: list = []
    states = set()

    def vandal_end(epoch, logs, state):
        seen.append(("vandal", dict(logs)))
        logs["train_loss"] = -123.0
        del logs["val_loss"]
        logs.clear()

    def reader(epoch, logs, state):
        seen.append(("reader", dict(logs)))
        states.add(id(state))
        assert state.nepoch == 2 and not state.stop
        assert isinstance(state.lr_ud, G.opt.params.LrUserdata)

    cbs = [{"on_epoch_end": vandal_end},
           {"on_epoch_begin": lambda e, logs, s: states.add(id(s)) or seen.append(("begin", dict(logs))),
            "on_epoch_end": reader}]
    h = fit(model, tsched, batches, cbs, epochs=2)
    assert len(states) == 1
    assert [logs for who, logs in seen if who == "begin"] == [{}, {}]
    ends = [(who, logs) for who, logs in seen if who in ("vandal", "reader")]
    assert len(ends) == 4
    for who, logs in ends:
        assert set(logs) == END_KEYS, who   # the vandal's overwrite, deletion and clear reached nobody
    assert ends[0][1]["train_loss"] == ends[1][1]["train_loss"] == h["train_loss"].iloc[0]
    assert ends[1][1]["steps"] == 2
    assert (h["train_loss"] > 0).all() and set(h.columns) == {"epoch"} | END_KEYS


def test_values_a_callback_logs_reach_later_callbacks_and_the_history(model, tsched, batches, tmp_path):
    """Keras' rule: a callback that computes a metric and puts it in logs (say val_f1) is read by the callbacks
    after it (an early stopping monitoring it, the CSV logger) and recorded by the history."""
    seen: list = []

    def f1(epoch, logs, state):
        logs["val_f1"] = 0.5 + epoch / 10            # a new key: shared
        if epoch == 2:
            logs["note"] = "two"                      # a value that is not a number: an object column
        logs["train_loss"] = 99.0                     # a measured value: not shared

    def reader(epoch, logs, state):
        seen.append((logs["val_f1"], logs["train_loss"]))

    csv_path = tmp_path / "log.csv"
    h = fit(model, tsched, batches, [{"on_epoch_end": f1}, {"on_epoch_end": reader},
                                     G.ggml_callback_csv_logger(str(csv_path))], epochs=3)
    assert [v for v, _ in seen] == [0.6, 0.7, 0.8]
    assert all(loss < 99 for _, loss in seen)
    assert list(h["val_f1"]) == [0.6, 0.7, 0.8] and h["val_f1"].dtype == float
    assert h["note"].isna().tolist() == [True, False, True] and h["note"].iloc[1] == "two"
    assert (h["train_loss"] < 99).all()
    header = csv_path.read_text().splitlines()[0].split(",")
    assert "val_f1" in header                         # the logger after it writes the column


def test_an_early_stopping_monitors_a_value_a_callback_logs(model, tsched, batches):
    scores = iter([0.9, 0.8, 0.8, 0.8, 0.8, 0.8])

    def score(epoch, logs, state):
        logs["val_score"] = next(scores)

    stop = G.ggml_callback_early_stopping(monitor="val_score", patience=1, mode="max")
    h = fit(model, tsched, batches, [{"on_epoch_end": score}, stop], epochs=6)
    assert list(h["epoch"]) == [1, 2] and list(h["val_score"]) == [0.9, 0.8]


def test_what_a_callback_logged_before_raising_is_kept(model, tsched, batches):
    def bad(epoch, logs, state):
        logs["val_f1"] = 0.25
        if epoch == 2:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom") as info:
        fit(model, tsched, batches, [{"on_epoch_end": bad}], epochs=3)
    assert list(info.value.history["val_f1"]) == [0.25, 0.25]


def test_bad_callbacks_are_refused(model, tsched, batches):
    with pytest.raises(TypeError, match=r"callbacks\[1\]"):
        fit(model, tsched, batches, [{}, 5])
    with pytest.raises(TypeError, match="callbacks"):
        fit(model, tsched, batches, "on_epoch_end")


# ---------------------------------------------------------------- built-ins

@pytest.mark.parametrize("patience", [0, 2, 3])
def test_early_stopping_on_a_flat_metric_runs_1_plus_patience_epochs(patience, model, tsched, batches, capsys):
    cb = G.ggml_callback_early_stopping(monitor="steps", patience=patience)
    h = fit(model, tsched, batches, [cb], epochs=20)
    assert len(h) == 1 + patience
    assert f"Early stopping at epoch {1 + patience}" in capsys.readouterr().err


def test_early_stopping_min_delta_and_missing_metric(model, tsched, batches):
    # min_delta larger than any change: only the first epoch improves on +inf
    h = fit(model, tsched, batches, [G.ggml_callback_early_stopping("train_loss", patience=2, min_delta=1e9)],
            epochs=10)
    assert len(h) == 3
    # val_loss is NaN without validation: never an improvement, never a wait (and a warning says so)
    with pytest.warns(G.GgmlpyWarning, match="monitors 'val_loss'"):
        h = fit(model, tsched, batches, [G.ggml_callback_early_stopping("val_loss", patience=1)], epochs=4)
    assert len(h) == 4
    # a decreasing loss keeps training (SGD, lr 0.05, least squares: the loss falls every epoch)
    setlr = {"on_epoch_begin": lambda e, logs, s: G.ggml_opt_set_lr(s.lr_ud, sgd_lr=0.05)}
    h = fit(model, tsched, batches[:1], [setlr, G.ggml_callback_early_stopping("train_loss", patience=1)],
            epochs=5, optimizer=SGD)
    assert len(h) == 5 and np.all(np.diff(h["train_loss"]) < 0)


def test_early_stopping_counters_persist_across_fits(model, tsched, batches):
    """Callbacks are closures (ggmlR): reused, the exhausted patience stops the next fit at once."""
    cb = G.ggml_callback_early_stopping(monitor="steps", patience=2)
    assert len(fit(model, tsched, batches, [cb], epochs=10)) == 3
    assert len(fit(model, tsched, batches, [cb], epochs=10)) == 1


@pytest.mark.parametrize("initial_epoch", [0, 10])
def test_step_decay(initial_epoch, model, tsched, batches):
    log: list = []
    fit(model, tsched, batches, [G.ggml_schedule_step_decay(step_size=2, gamma=0.5), lr_log(log)], epochs=7,
        initial_epoch=initial_epoch)
    lr, expected = 1e-3, []
    for e in range(initial_epoch + 1, initial_epoch + 8):
        if e > 1 and (e - 1) % 2 == 0:
            lr *= 0.5
        expected.append((e, pytest.approx(lr, rel=1e-6)))
    assert log == expected
    if initial_epoch == 0:
        assert [e for e, _ in expected] == [1, 2, 3, 4, 5, 6, 7]
        assert log[2][1] == pytest.approx(5e-4) and log[1][1] == pytest.approx(1e-3)  # first drop at epoch 3


@pytest.mark.parametrize("T_max, initial_epoch, epochs", [(None, 0, 5), (None, 2, 4), (3, 0, 7)])
def test_cosine_decay(T_max, initial_epoch, epochs, model, tsched, batches):
    log: list = []
    eta_min = 1e-5
    fit(model, tsched, batches, [G.ggml_schedule_cosine_decay(eta_min=eta_min, T_max=T_max), lr_log(log)],
        epochs=epochs, initial_epoch=initial_epoch)
    t_max = T_max or initial_epoch + epochs
    expected = [(e, pytest.approx(eta_min + 0.5 * (1e-3 - eta_min) * (1 + math.cos(math.pi * (e - 1) / t_max)),
                                  rel=1e-5, abs=1e-12))
                for e in range(initial_epoch + 1, initial_epoch + epochs + 1)]
    assert log == expected


def test_cosine_reaching_zero_is_clamped(model, tsched, batches):
    """eta_min = 0 and (epoch - 1) / T_max = 1 gives exactly 0: clamped above 0, training goes on."""
    log: list = []
    h = fit(model, tsched, batches, [G.ggml_schedule_cosine_decay(eta_min=0, T_max=2), lr_log(log)], epochs=4)
    assert len(h) == 4 and np.isfinite(h["train_loss"]).all()
    lrs = dict(log)
    assert 0 < lrs[3] <= 1e-9
    assert lrs[2] == pytest.approx(5e-4) and lrs[4] == pytest.approx(5e-4)  # periodic past T_max


def test_reduce_on_plateau(model, tsched, batches, capsys):
    log: list = []
    cb = G.ggml_schedule_reduce_on_plateau(monitor="steps", factor=0.5, patience=2, min_lr=2e-4, mode="min")
    fit(model, tsched, batches, [cb, lr_log(log, "on_epoch_end")], epochs=8)
    # ggmlR's rule, step by step: improvement resets wait; wait >= patience -> lr = max(lr * factor, min_lr), wait 0
    lr, best, wait, expected = 1e-3, math.inf, 0, []
    for e in range(1, 9):
        value = 2.0  # the monitored metric: constant
        if value < best - 1e-4:
            best, wait = value, 0
        else:
            wait += 1
        if wait >= 2:
            lr, wait = max(lr * 0.5, 2e-4), 0
        expected.append((e, pytest.approx(lr, rel=1e-6)))
    assert log == expected
    assert [v for _, v in log] == [pytest.approx(x) for x in (1e-3, 1e-3, 5e-4, 5e-4, 2.5e-4, 2.5e-4, 2e-4, 2e-4)]
    assert "plateau" in capsys.readouterr().err


@pytest.mark.parametrize("schedule", ["step", "cosine", "plateau"])
def test_schedules_change_the_sgd_rate_too(schedule, model, tsched, batches):
    """An SGD fit's learning rate follows the schedule (the schedules used to change AdamW's only)."""
    log_a: list = []
    log_s: list = []
    cb = {"step": G.ggml_schedule_step_decay(step_size=1, gamma=0.5),
          "cosine": G.ggml_schedule_cosine_decay(T_max=2),
          "plateau": G.ggml_schedule_reduce_on_plateau("train_loss", factor=0.5, patience=0, min_delta=1e9)}
    fit(model, tsched, batches, [cb[schedule], lr_log(log_a), lr_log(log_s, key="sgd")], epochs=3, optimizer=SGD)
    want = {"step": (1e-3, 5e-4, 2.5e-4), "cosine": (1e-3, 5e-4, 0.0), "plateau": (1e-3, 5e-4, 2.5e-4)}[schedule]
    assert [v for _, v in log_s] == [pytest.approx(x, rel=1e-6, abs=1e-11) for x in want]
    assert [v for _, v in log_a] == [v for _, v in log_s]


@pytest.mark.parametrize("bad, kind, text", [
    ({"on_epoch_ends": lambda e, logs, s: None}, ValueError, "never called.*did you mean 'on_epoch_end'"),
    ({"on_epoch_end": "not callable"}, TypeError, "must be a function"),
])
def test_a_misspelled_or_non_callable_hook_is_an_error(bad, kind, text, model, tsched, batches):
    with pytest.raises(kind, match=text):
        fit(model, tsched, batches, [bad], epochs=1)


def test_a_monitor_that_is_never_logged_warns_once_and_keras_names_work(model, tsched, batches):
    with pytest.warns(G.GgmlpyWarning, match="monitors 'val_loss'.*no validation data") as caught:
        fit(model, tsched, batches, [G.ggml_callback_early_stopping(patience=1)], epochs=3)
    assert sum("monitors" in str(w.message) for w in caught) == 1
    h = fit(model, tsched, batches, [G.ggml_callback_early_stopping("loss", patience=0, min_delta=1e9)], epochs=3)
    assert len(h) == 1   # 'loss' is Keras' name for train_loss: the stop fired after the first epoch


def test_builtin_argument_errors():
    with pytest.raises(ValueError, match="mode"):
        G.ggml_callback_early_stopping(mode="up")
    with pytest.raises(ValueError, match="step_size"):
        G.ggml_schedule_step_decay(step_size=0)


# ---------------------------------------------------------------- Keras' LearningRateScheduler and CSVLogger

@pytest.mark.parametrize("initial_epoch", [0, 4])
def test_schedule_learning_rate_follows_keras_epoch_indices(initial_epoch, model, tsched, batches):
    """schedule(epoch_index, lr) at each epoch's start, the index from 0 (Keras), lr the rate in effect; the
    rate it returns is the one the epoch trains with."""
    calls: list = []

    def schedule(epoch, lr):
        calls.append((epoch, lr))
        return lr * 0.5 if epoch % 2 else lr + 1e-3

    log: list = []
    fit(model, tsched, batches, [G.ggml_schedule_learning_rate(schedule), lr_log(log)], epochs=4,
        initial_epoch=initial_epoch, learning_rate=2e-3)
    lr, want_calls, want_log = 2e-3, [], []
    for i in range(initial_epoch, initial_epoch + 4):   # plain Python: Keras' rule
        want_calls.append((i, pytest.approx(lr, rel=1e-6)))
        lr = lr * 0.5 if i % 2 else lr + 1e-3
        want_log.append((i + 1, pytest.approx(lr, rel=1e-6)))
    assert calls == want_calls
    assert log == want_log


def test_schedule_learning_rate_reads_and_sets_the_sgd_rate(model, tsched, batches):
    seen: list = []
    log: list = []
    fit(model, tsched, batches, [G.ggml_schedule_learning_rate(lambda e, lr: seen.append(lr) or 0.02),
                                 lr_log(log, key="sgd")], epochs=2, optimizer=SGD, learning_rate=0.05)
    assert seen == [pytest.approx(0.05), pytest.approx(0.02)]
    assert [lr for _, lr in log] == [pytest.approx(0.02)] * 2


@pytest.mark.parametrize("bad", [0.0, -1e-3, float("nan"), float("inf"), None, "0.1"])
def test_schedule_learning_rate_rejects_a_rate_ggml_cannot_step_with(bad, model, tsched, batches):
    with pytest.raises(G.GgmlValueError, match=r"schedule\(0, 0\.001\) returned"):
        fit(model, tsched, batches, [G.ggml_schedule_learning_rate(lambda e, lr: bad)], epochs=1)


def test_schedule_learning_rate_checks_its_function():
    with pytest.raises(G.GgmlTypeError, match="must be a function"):
        G.ggml_schedule_learning_rate(0.1)
    with pytest.raises(G.GgmlTypeError, match=r"called as f\(epoch_index, lr\)"):
        G.ggml_schedule_learning_rate(lambda epoch: 0.1)


def _read_csv(path, sep=","):
    import csv
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f, delimiter=sep))


def test_csv_logger_writes_the_history_one_row_per_epoch(tmp_path, model, tsched, batches):
    path = tmp_path / "log.csv"
    h = fit(model, tsched, batches, [G.ggml_callback_csv_logger(path)], epochs=3, validation_generator=batches)
    rows = _read_csv(path)
    header, body = rows[0], rows[1:]
    assert header[0] == "epoch" and set(header[1:]) >= {"train_loss", "val_loss"}
    assert [int(r[0]) for r in body] == list(h["epoch"]) == [1, 2, 3]
    for key in ("train_loss", "val_loss"):
        col = header.index(key)
        np.testing.assert_allclose([float(r[col]) for r in body], h[key].to_numpy(), rtol=1e-12)


def test_csv_logger_starts_over_or_appends_and_keeps_the_rows_of_a_failed_fit(tmp_path, model, tsched, batches):
    path = tmp_path / "log.csv"
    logger = G.ggml_callback_csv_logger(path, separator=";")

    def boom(epoch, logs, state):
        if epoch == 2:
            raise RuntimeError("the machine went away")

    with pytest.raises(RuntimeError):
        fit(model, tsched, batches, [logger, {"on_epoch_end": boom}], epochs=5)
    assert [r[0] for r in _read_csv(path, ";")] == ["epoch", "1", "2"]  # what finished is on disk
    fit(model, tsched, batches, [logger], epochs=2)  # a new fit: the file starts over
    assert [r[0] for r in _read_csv(path, ";")] == ["epoch", "1", "2"]
    fit(model, tsched, batches, [G.ggml_callback_csv_logger(path, separator=";", append=True)], epochs=2,
        initial_epoch=2)
    rows = _read_csv(path, ";")
    assert [r[0] for r in rows] == ["epoch", "1", "2", "3", "4"] and rows.count(rows[0]) == 1


def test_csv_logger_checks_its_arguments(tmp_path):
    with pytest.raises(G.GgmlValueError, match="does not exist"):
        G.ggml_callback_csv_logger(tmp_path / "missing" / "log.csv")
    with pytest.raises(G.GgmlValueError, match="one character"):
        G.ggml_callback_csv_logger(tmp_path / "log.csv", separator=", ")
    with pytest.raises(G.GgmlTypeError, match="file name"):
        G.ggml_callback_csv_logger(3)
    with pytest.raises(G.GgmlTypeError, match="True or False"):
        G.ggml_callback_csv_logger(tmp_path / "log.csv", append="yes")


def test_the_state_a_callback_gets_reads_as_documented(model, tsched, batches):
    """lr_ud.adamw / lr_ud.sgd are the rates its repr shows; epoch, nepoch and optimizer are the fit's."""
    seen: list = []

    def look(epoch, logs, state):
        seen.append((epoch, state.epoch, state.nepoch, state.optimizer, state.lr_ud.adamw, state.lr_ud.sgd,
                     repr(state.lr_ud), state.model, state.weights))

    fit(model, tsched, batches, [{"on_epoch_begin": look}], epochs=2, initial_epoch=1, learning_rate=2e-3)
    assert [s[:4] for s in seen] == [(2, 2, 3, "adamw"), (3, 3, 3, "adamw")]
    epoch, _, _, _, adamw, sgd, text, m, w = seen[0]
    assert adamw == pytest.approx(2e-3) and f"adamw={adamw:g}" in text and f"sgd={sgd:g}" in text
    assert m is None and w is None  # a low-level fit has no model


def test_the_history_offers_keras_history_dict():
    """Keras users read history.history["loss"]: the DataFrame (ggmlR's columns) has that view too."""
    import ggmlpy as g
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = np.eye(2, dtype=np.float32)[rng.integers(0, 2, 40)]
    m = g.ggml_compile(g.ggml_layer_dense(g.ggml_model_sequential(), 2, input_shape=(3,), activation="softmax"),
                       loss="categorical_crossentropy", metrics=["accuracy", "mae"], backend="cpu")
    h = g.ggml_fit(m, x, y, epochs=2, verbose=0, validation_split=0.25)
    assert list(h.history) == ["loss", "accuracy", "val_loss", "val_accuracy", "mae", "val_mae"]
    assert h.history["loss"] == list(h["train_loss"]) and h.history["val_mae"] == list(h["val_mae"])
    assert "val_loss" not in g.ggml_fit(m, x, y, epochs=1, verbose=0).history   # never computed: no key
    assert type(h.iloc[:1]).__name__ == "History"
