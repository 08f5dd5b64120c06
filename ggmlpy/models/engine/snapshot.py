"""Snapshots of a model's weights (``Snapshot``): a frozen copy that predicts and can be restored."""
from __future__ import annotations

from ...errors import GgmlStateError, GgmlTypeError
from ..network.model import Model
from ..network.parameters import ParamStore
from .runtime import Predictor


class Snapshot:
    """A frozen copy of a model's weights (and batch-norm statistics) at one moment. ``ggml_predict``
    takes it like a model; ``trainer.restore`` puts its weights back; ``ggml_snapshot_free`` frees it."""

    def __init__(self, model: Model, params: ParamStore) -> None:
        self.model = model
        self._params: ParamStore | None = params
        self._predictor: Predictor | None = Predictor(model, params)

    @property
    def params(self) -> ParamStore:
        if self._params is None:
            raise GgmlStateError("this snapshot has been freed")
        if not self._params.backend.alive:
            raise GgmlStateError("this snapshot's backend went with the model's runtime (the model was compiled "
                                 "again or its layers changed after the snapshot); take a new snapshot")
        return self._params

    def predictor(self) -> Predictor:
        _ = self.params  # raises once freed, or once the backend is gone
        assert self._predictor is not None  # freed together with the params
        return self._predictor

    def free(self) -> None:
        if self._params is None:
            return
        if self._predictor is not None:  # made and freed with the params
            self._predictor.free()
        self._params.free()
        self._params = self._predictor = None

    @property
    def alive(self) -> bool:
        return self._params is not None

    def __repr__(self) -> str:
        return f"<Snapshot of '{self.model.name}'{'' if self.alive else ' (freed)'}>"


def ggml_snapshot_free(snapshot: Snapshot | None) -> None:
    """Free a snapshot's weights. ``None`` and a second free do nothing; a freed snapshot raises
    ``RuntimeError`` when used."""
    if snapshot is None:
        return
    if not isinstance(snapshot, Snapshot):
        raise GgmlTypeError(f"ggml_snapshot_free: expected a snapshot, got {type(snapshot).__name__}")
    snapshot.free()
