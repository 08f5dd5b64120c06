"""ggmlR's Keras-like model layer: build models from layers, compile, fit, evaluate, predict, step by
hand with ``ggml_trainer``, and save to GGUF. Every public name is re-exported by ``ggmlpy``.

Modules by concern: ``layers``/``conv``/``norm``/``sequence``/``attention`` (what each layer computes), ``graph``
(models as graphs of nodes), ``api`` (ggmlR's building functions), ``weights`` (a model's weights in ggml), ``runtime``
(graphs, predictor, optimizer state), ``compile``,
``data`` (the sample-major data rule), ``fit`` (training and inference), ``metrics``, ``trainer``,
``saving``, ``pickling`` (pickle and deepcopy through GGUF bytes), ``placement`` (where a step runs),
``preprocessing`` (Keras' to_categorical and pad_sequences).
"""
from __future__ import annotations

from . import builders as api
from . import placement_report as placement
from . import trainer
from .engine import compile
from .engine import fitting as fit
from .io import pickling, saving


MODULES = [api, compile, fit, trainer, saving, placement]
REGISTRATIONS = [pickling]  # imported for its copyreg entries: models pickle and deep-copy
