"""Models through ``pickle`` and ``copy.deepcopy``: what process pools, joblib and spawn workers need.

A compiled model travels as the bytes of the GGUF file ``ggml_save_model(..., include_optimizer=True)``
writes (architecture, compile settings, weights, optimizer state) and comes back as
``ggml_load_model`` makes it: compiled on the backend it was compiled for ("auto" stays "auto", so a
worker picks its own device), predicting identically, its next fit continuing the same trajectory.
An uncompiled model travels as its layers (and whatever weights they carry). Registered with
``copyreg`` so that this tier's lower modules need not know about saving.
"""
from __future__ import annotations

import copyreg
import os
import tempfile

from ...errors import GgmlInUseError
from ..engine.runtime import model_in_use
from ..network.model import Model, Sequential
from .saving import ggml_load_model, save_model


def model_to_bytes(model: Model) -> bytes:
    """The GGUF file of a compiled model, with its optimizer state, as bytes."""
    with model_in_use(model) as runtime:
        if runtime.live_trainers():
            raise GgmlInUseError("pickling a model: a ggml_trainer of this model is live and holds its optimizer "
                                 "state (the copy would miss the trainer's steps); free the trainer first "
                                 "(tr.free())")
        with tempfile.TemporaryDirectory(prefix="ggmlpy-pickle-") as folder:
            path = os.path.join(folder, "model.gguf")
            save_model(model, path, True, runtime.opt_state.current(), "pickling a model")
            with open(path, "rb") as f:
                return f.read()


def model_from_bytes(data: bytes, backend: str) -> Model:
    """A model back from ``model_to_bytes``, compiled on ``backend``."""
    with tempfile.TemporaryDirectory(prefix="ggmlpy-pickle-") as folder:
        path = os.path.join(folder, "model.gguf")
        with open(path, "wb") as f:
            f.write(data)
        return ggml_load_model(path, backend=backend, include_optimizer=True)


def _rebuilt(cls: type[Model], state: dict) -> Model:
    model = cls.__new__(cls)
    model.__dict__.update(state)
    return model


def reduce_model(model: Model) -> tuple:
    if model.runtime is not None and model.compiled is not None:
        return model_from_bytes, (model_to_bytes(model), model.compiled.backend)
    state = {k: v for k, v in model.__dict__.items() if k not in ("runtime", "compiled")}
    return _rebuilt, (type(model), {**state, "runtime": None, "compiled": None})


for _cls in (Model, Sequential):
    copyreg.pickle(_cls, reduce_model)
