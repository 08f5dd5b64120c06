"""ggmlR's own tests (its testthat files), as ggmlpy users would write them: our translation of what they
check where ggmlpy follows ggmlR (where ggmlpy deliberately differs, the parity table that
tests/public/test_parity.py checks says why)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.opt.params import LrUserdata


def test_the_library_self_test_passes():
    assert G.ggml_test() is True


@pytest.mark.parametrize("make_state", [lambda ud: {"lr_ud": ud, "nepoch": 10},
                                        lambda ud: SimpleNamespace(lr_ud=ud, nepoch=10)],
                         ids=["dict", "object"])
def test_schedules_take_a_state_built_by_hand(make_state):
    """ggmlR's callback tests call a schedule with a state of their own: only lr_ud and nepoch in it."""
    ud = LrUserdata()
    G.ggml_opt_set_lr(ud, adamw_lr=0.1, sgd_lr=0.1)
    state = make_state(ud)
    step = G.ggml_schedule_step_decay(step_size=2, gamma=0.5)
    for epoch in range(1, 6):
        step["on_epoch_begin"](epoch, {}, state)
    assert G.ggml_opt_get_lr(ud)["adamw"] == pytest.approx(0.1 * 0.5 ** 2)   # epochs 3 and 5
    cosine = G.ggml_schedule_cosine_decay(eta_min=0.0)
    cosine["on_epoch_begin"](6, {}, state)
    assert G.ggml_opt_get_lr(ud)["adamw"] == pytest.approx(0.025 * 0.5 * (1 + np.cos(np.pi * 5 / 10)))


def test_a_hand_built_state_without_lr_ud_says_what_it_needs():
    with pytest.raises(G.GgmlTypeError, match="has no 'lr_ud'"):
        G.ggml_schedule_step_decay(step_size=2)["on_epoch_begin"](3, {}, {"nepoch": 3})


def test_early_stopping_sets_stop_on_a_hand_built_state():
    state = {"nepoch": 10}
    cb = G.ggml_callback_early_stopping("val_loss", patience=1)
    cb["on_epoch_end"](1, {"val_loss": 1.0}, state)
    cb["on_epoch_end"](2, {"val_loss": 2.0}, state)
    assert state["stop"] is True


def test_default_params_are_a_list_as_in_ggmlr(sched):
    params = G.ggml_opt_default_params(sched, G.ggml_opt_loss_type_mse())
    assert "loss_type" in params and "opt_period" in params and "no_such_field" not in params
    assert dict(params) == {"loss_type": G.ggml_opt_loss_type_mse(), "build_type": G.ggml_opt_build_type_opt(),
                            "opt_period": 1, "optimizer": G.ggml_opt_optimizer_type_adamw()}
    params["opt_period"] = 4
    assert params.opt_period == 4 and params["opt_period"] == 4 and len(params) == 4
    with pytest.raises(KeyError):
        params["no_such_field"] = 1


def test_get_opt_pars_may_return_ggmlrs_flat_names():
    ud = LrUserdata()
    ud.provider = lambda: {"adamw_lr": 0.02, "sgd_lr": 0.3, "sgd_wd": 0.1}
    ud.refresh()
    p = ud.params
    assert (p.adamw.alpha, p.sgd.alpha, p.sgd.wd) == pytest.approx((0.02, 0.3, 0.1))
    ud.provider = lambda: {"adamw_lr": -1.0}
    with pytest.raises(G.GgmlValueError):
        ud.refresh()
    ud.provider = lambda: {"adamw_lr": 0.1, "adamw": {"alpha": 0.1}}   # the two forms do not mix
    with pytest.raises(G.GgmlTypeError, match="flat names"):
        ud.refresh()
