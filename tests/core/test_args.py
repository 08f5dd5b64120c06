"""The one set of argument validators (ggmlpy/core/args.py): one rule per kind of argument, used by every
entry point (the entry points' own tests check that they refuse what these refuse)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.core import args


@pytest.mark.parametrize("value", [0, -1e-3, 1e-300, 1e300, math.inf, math.nan, True, "0.1", None])
def test_a_given_learning_rate_is_a_positive_float32(value):
    with pytest.raises(G.GgmlValueError, match="learning_rate"):
        args.learning_rate_arg("learning_rate", value)


@pytest.mark.parametrize("value", [1e-3, np.float32(0.5), 2, np.int64(1)])
def test_good_learning_rates_pass_as_floats(value):
    out = args.learning_rate_arg("learning_rate", value)
    assert type(out) is float and out == float(value)


def test_a_scheduled_rate_may_decay_to_zero():
    """A schedule reaching 0 means "stop learning": it is held at LR_FLOOR, as ggml aborts on 0."""
    assert args.learning_rate_arg("lr", 0, schedule=True) == args.LR_FLOOR
    assert args.learning_rate_arg("lr", 1e-300, schedule=True) == args.LR_FLOOR
    assert args.learning_rate_arg("lr", 0.25, schedule=True) == 0.25
    for bad in (-1e-9, math.nan, 1e300, "x"):
        with pytest.raises(G.GgmlValueError):
            args.learning_rate_arg("lr", bad, schedule=True)


def test_set_lr_and_the_schedules_use_the_schedule_rule():
    from ggmlpy.opt.params import LrUserdata
    lr = LrUserdata()
    lr.set(adamw_lr=0.0, sgd_lr=0.5)
    assert lr.params.adamw.alpha == pytest.approx(args.LR_FLOOR) and lr.params.sgd.alpha == 0.5
    with pytest.raises(G.GgmlValueError, match="ggml_opt_set_lr: adamw_lr"):
        lr.set(adamw_lr=-1.0)


@pytest.mark.parametrize("value, error", [(1.5, G.GgmlTypeError), (True, G.GgmlTypeError), ("3", G.GgmlTypeError),
                                          (np.float64(2), G.GgmlTypeError), (-1, G.GgmlValueError),
                                          (1 << 31, G.GgmlValueError)])
def test_c_ints_refuse_non_ints_as_type_errors_and_bounds_as_value_errors(value, error):
    with pytest.raises(error, match="epochs"):
        args.c_int_arg("f", "epochs", value, 0)


def test_ints_accept_numpy_ints():
    assert args.c_int_arg("f", "n", np.int32(7), 1) == 7 and args.is_int(np.uint8(3)) and not args.is_int(np.bool_(1))


def test_no_module_keeps_its_own_int_type_test():
    """Integer arguments are told apart with is_int (a Python or numpy int, not a bool) everywhere: the
    hand-written forms that let bools in or numpy ints out are gone."""
    import pathlib
    import re
    root = pathlib.Path(G.__file__).parent
    forms = [r"isinstance\([\w.\[\]]+, \(int, np\.integer\)\)", r"isinstance\([\w.\[\]]+, int\) and not isinstance",
             r"isinstance\([\w.\[\]]+, numbers\.Integral\) and not isinstance",
             r"expect\(isinstance\([\w.\[\]]+, int\)"]
    hits = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if p.name != "args.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if any(re.search(f, line) for f in forms)]
    assert not hits, hits


@pytest.mark.parametrize("value, error", [(2.5, G.GgmlTypeError), ("8", G.GgmlTypeError), (True, G.GgmlTypeError),
                                          (0, G.GgmlValueError), (1 << 31, G.GgmlValueError)])
def test_a_positive_int_refuses_non_ints_as_type_errors(value, error):
    """The layers' sizes, strides and counts: the int rule (a non-int is a GgmlTypeError), then the range."""
    with pytest.raises(error, match=r"filters must be a positive int \(at most 2\*\*31 - 1\)"):
        args.positive_int_arg(None, "filters", value)
    assert args.positive_int_arg(None, "filters", np.int64(3)) == 3
    assert args.int_pair_arg(None, "strides", 2) == (2, 2) and args.int_pair_arg(None, "strides", (1, 3)) == (1, 3)


@pytest.mark.parametrize("value", [0, 1, None, "True"])
def test_a_bool_is_true_or_false_only(value):
    with pytest.raises(G.GgmlTypeError, match="f: use_bias must be True or False"):
        args.bool_arg("f", "use_bias", value)
    assert args.bool_arg(None, "x", np.bool_(True)) is True
