"""scikit-learn estimators around a function that builds a model: ``GgmlClassifier`` and ``GgmlRegressor``.

They fit, predict and score as scikit-learn's estimators do, so a ggmlpy model goes into a ``Pipeline``,
``cross_val_score`` or ``GridSearchCV``. scikit-learn is optional: this module imports it, and ``ggmlpy``
loads the module the first time one of the two names is used.
"""
from __future__ import annotations

import copy
import inspect
import warnings
from typing import Any, Callable

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.preprocessing import LabelEncoder
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted


try:
    from sklearn.utils.validation import validate_data
except ImportError as exc:  # pragma: no cover - scikit-learn before 1.6
    raise ImportError("GgmlClassifier and GgmlRegressor need scikit-learn >= 1.6 (pip install -U scikit-learn)") \
        from exc

from ...errors import GgmlpyWarning, GgmlTypeError, GgmlValueError
from ...training.callbacks import BuiltinCallback
from ..engine.compile import ggml_compile
from ..engine.fitting import ggml_fit, ggml_predict
from ..network.model import Model


MODEL_PARAM = "model__"  # constructor arguments with this prefix go to the model function (as in SciKeras)
ROUTED = (MODEL_PARAM, "optimizer__", "fit__")  # SciKeras' routing: the model function, ggml_compile, ggml_fit
# the estimator's settings given to ggml_compile
COMPILE_SETTINGS = ("optimizer", "learning_rate", "loss", "backend", "precision")


class _GgmlEstimator(BaseEstimator):
    """What the classifier and the regressor share: building, compiling, fitting and predicting."""

    _loss = "mse"

    def __init__(self, model: Callable[..., Any] | None = None, epochs: int = 10, batch_size: int = 32,
                 optimizer: str = "adam", learning_rate: float = 1e-3, validation_split: float = 0.0,
                 callbacks: Any = None, backend: str = "cpu", verbose: int = 0, random_state: int | None = None,
                 loss: Any = None, precision: str = "f32", **model_params: Any) -> None:
        self.model, self.epochs, self.batch_size = model, epochs, batch_size
        self.optimizer, self.learning_rate, self.validation_split = optimizer, learning_rate, validation_split
        self.callbacks, self.backend, self.verbose, self.random_state = callbacks, backend, verbose, random_state
        self.loss, self.precision = loss, precision
        # stored as given and checked by fit (scikit-learn's rule: __init__ and set_params do not validate)
        self._extra_params = dict(model_params)
        for key, value in model_params.items():
            setattr(self, key, value)

    # ---- scikit-learn's parameter protocol, with the model function's arguments
    @classmethod
    def _own_params(cls) -> list[str]:
        return [p for p in inspect.signature(_GgmlEstimator.__init__).parameters
                if p not in ("self", "model_params")]

    def get_params(self, deep: bool = True) -> dict:
        """The estimator's parameters, as scikit-learn's ``get_params`` (what ``clone``, ``GridSearchCV`` and
        ``repr`` read).

        Arguments:
            deep: scikit-learn's flag for the parameters of nested estimators; there are none here (the model
                function is one parameter), so True and False give the same dict.

        Value: a dict of the constructor's arguments (``model``, ``epochs``, ``batch_size``, ``optimizer``,
        ``learning_rate``, ``validation_split``, ``callbacks``, ``backend``, ``verbose``, ``random_state``,
        ``loss``, ``precision``), each extra keyword given to the constructor or ``set_params``, and the
        ``model__<arg>`` arguments that go to the model function (SciKeras' routing).
        """
        params = {name: getattr(self, name) for name in self._own_params()}
        params.update({k: getattr(self, k) for k in self._extra_params})
        params.update({k: v for k, v in vars(self).items() if k.startswith(ROUTED)})
        return params

    def set_params(self, **params: Any) -> _GgmlEstimator:
        """Set parameters, as scikit-learn's ``set_params`` (``GridSearchCV`` sets each candidate's this way).

        Arguments:
            **params: the constructor's arguments by name, and ``model__<arg>=value`` for the model function's
                arguments (a new one may be added). Nothing is checked here (scikit-learn's rule): ``fit``
                checks the values, and names an unknown argument that is not ``model__`` prefixed. The model
                is rebuilt on the next ``fit``.

        Value: the estimator itself.
        """
        own = set(self._own_params())
        for key, value in params.items():
            if key not in own:
                self._extra_params[key] = value  # checked by fit, as the constructor's
            setattr(self, key, value)
        return self

    # ---- building and training
    def _build(self, X: np.ndarray, n_outputs: int) -> Model:
        input_shape = tuple(X.shape[1:])
        unknown = sorted(k for k in self._extra_params if not k.startswith(ROUTED))
        if unknown:
            raise GgmlTypeError(f"{type(self).__name__}: unknown argument(s) {unknown}; the estimator's own are "
                                f"{sorted(self._own_params())}, and SciKeras' prefixes route the others: "
                                f"'{MODEL_PARAM}' to the model function (model__units=32 calls model(..., units=32)), "
                                "'optimizer__' to ggml_compile (optimizer__momentum=0.9), 'fit__' to ggml_fit "
                                "(fit__shuffle=False)")
        if not callable(self.model):
            raise GgmlTypeError(f"{type(self).__name__}: model must be a function that builds a ggmlpy model "
                                f"(compiled or not), got {self.model!r}")
        kwargs = {k[len(MODEL_PARAM):]: v for k, v in self.get_params().items() if k.startswith(MODEL_PARAM)}
        accepts = inspect.signature(self.model).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepts.values())
        meta = self._meta(X, n_outputs)
        for name, value in ((self._outputs_name, n_outputs), ("input_shape", input_shape), ("meta", meta)):
            if name in accepts or takes_any and name != "meta":
                kwargs.setdefault(name, value)
        built = self.model(**kwargs)
        if not isinstance(built, Model):
            raise GgmlTypeError(f"{type(self).__name__}: the model function returned {type(built).__name__}, not a "
                                "ggmlpy model (ggml_model_sequential(...) or ggml_model(inputs, outputs))")
        if built.compiled is None:
            settings = {"learning_rate": self.learning_rate, **self._routed("optimizer__", ggml_compile)}
            built = ggml_compile(built, optimizer=self.optimizer, loss=self.loss or self._loss, backend=self.backend,
                                 precision=self.precision, **settings)
        else:
            defaults = inspect.signature(_GgmlEstimator.__init__).parameters
            unused = [k for k in COMPILE_SETTINGS if getattr(self, k) != defaults[k].default] + \
                [k for k in self.get_params() if k.startswith("optimizer__")]
            if unused:
                warnings.warn(f"{type(self).__name__}: the model function returned a compiled model, so the "
                              f"estimator's compile settings {', '.join(unused)} are not used (its own compile's "
                              "are); return the model uncompiled to have them applied", GgmlpyWarning, stacklevel=4)
        return built

    def _fit(self, X: np.ndarray, y: np.ndarray, n_outputs: int,
             sample_weight: npt.ArrayLike | None = None) -> _GgmlEstimator:
        # ggmlpy's weight initialisers and shuffles draw from numpy's global generator: with a random_state it is
        # seeded for this fit and given back as it was (the caller's random stream goes on undisturbed)
        before = np.random.get_state() if self.random_state is not None else None
        if before is not None:
            np.random.seed(self.random_state)
        try:
            return self._fit_seeded(X, y, n_outputs, sample_weight)
        finally:
            if before is not None:
                np.random.set_state(before)

    def _fit_seeded(self, X: np.ndarray, y: np.ndarray, n_outputs: int,
                    sample_weight: npt.ArrayLike | None) -> _GgmlEstimator:
        if sample_weight is not None:
            sample_weight = _checked_weights(sample_weight, X.shape[0], type(self).__name__)
        self.sample_shape_ = tuple(X.shape[1:])
        self.model_ = self._build(X, n_outputs)
        y = self._labels_for(self.model_, y, n_outputs)
        batch = max(1, min(int(self.batch_size), X.shape[0]))
        # each fit starts ggmlpy's built-in callbacks afresh (a fit must not depend on the one before, nor mutate
        # the estimator's parameters); the user's own callbacks are passed as they are
        callbacks = self.callbacks
        if isinstance(callbacks, (list, tuple)):  # anything else: ggml_fit says what it takes
            callbacks = [copy.deepcopy(c) if isinstance(c, BuiltinCallback) else c for c in callbacks]
        self.history_ = ggml_fit(self.model_, X, y, **{
            "epochs": self.epochs, "batch_size": batch, "verbose": self.verbose,
            "validation_split": self.validation_split, "callbacks": callbacks, "sample_weight": sample_weight,
            **self._routed("fit__", ggml_fit)})
        return self

    def _meta(self, X: np.ndarray, n_outputs: int) -> dict[str, object]:
        """SciKeras' ``meta`` for a build function that takes it: what ``fit`` learnt of the data."""
        return {"n_features_in_": self.n_features_in_, "X_shape_": X.shape, "X_dtype_": X.dtype,
                "n_outputs_": n_outputs}

    def _routed(self, prefix: str, fn: Callable[..., object]) -> dict[str, Any]:
        """The arguments given with SciKeras' ``prefix`` (``optimizer__``, ``fit__``), without it, for ``fn``
        (``ggml_compile``, ``ggml_fit``), which must take them."""
        routed = {k[len(prefix):]: v for k, v in self.get_params().items() if k.startswith(prefix)}
        takes = [name for name in inspect.signature(fn).parameters if name not in ("model", "x", "y")]
        unknown = sorted(k for k in routed if k not in takes)
        if unknown:
            raise GgmlTypeError(f"{type(self).__name__}: {', '.join(prefix + k for k in unknown)}: '{prefix}' routes "
                                f"arguments to {fn.__name__}, which has no argument {', '.join(map(repr, unknown))}; "
                                f"its arguments are {', '.join(takes)}")
        return routed

    def _labels_for(self, model: Model, y: np.ndarray, n_outputs: int) -> np.ndarray:
        """``y`` as the compiled model's loss takes it (a regressor's as given)."""
        return y

    def _predict_raw(self, X: Any) -> np.ndarray:
        """The model's outputs for ``X``, one row per sample."""
        check_is_fitted(self, "model_")
        # the features' count, and their names where fit had a DataFrame (reordered columns are refused)
        X = validate_data(self, X, reset=False, allow_nd=True, dtype=np.float32)
        if tuple(X.shape[1:]) != self.sample_shape_:
            raise GgmlValueError(f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                                 f"{self.n_features_in_} features as input (samples of shape {tuple(X.shape[1:])}; "
                                 f"fit had {self.sample_shape_})")
        out = np.asarray(ggml_predict(self.model_, X, batch_size=max(1, int(self.batch_size))))
        return out.reshape(X.shape[0], -1)

    def __sklearn_tags__(self):  # scikit-learn >= 1.6
        tags = super().__sklearn_tags__()
        tags.non_deterministic = self.random_state is None
        return tags


class GgmlClassifier(ClassifierMixin, _GgmlEstimator):
    """A scikit-learn classifier around a function that builds a ggmlpy model.

    ``fit(X, y)`` calls ``model(**model_args)`` for a fresh model, compiles it when the function did not
    (sparse categorical cross-entropy, ``optimizer``, ``learning_rate``, ``backend``) and trains it with
    ``ggml_fit``; labels can be any values scikit-learn accepts (strings too): they are encoded as 0..K-1 and
    ``classes_`` keeps them. The function gets ``n_classes`` and ``input_shape`` (one sample's shape) when it
    has parameters of those names, and ``model__<name>=value`` arguments of the estimator as ``name=value``,
    so ``GridSearchCV`` can tune them. The model must end in a softmax over ``n_classes`` units (or one
    sigmoid unit for two classes, compiled by the function with binary cross-entropy). A function that compiles
    its model with categorical cross-entropy (``ggml_compile``'s default) gets the labels one-hot.

    Arguments:
        model: the function that builds the model.
        epochs, batch_size, validation_split, callbacks, verbose: as for ``ggml_fit`` (``batch_size`` is capped
            at the number of samples). ggmlpy's built-in callbacks start afresh at every fit (and in every clone,
            so ``GridSearchCV`` can share them); your own are passed as they are.
        optimizer, learning_rate, backend, loss, precision: as for ``ggml_compile``, for a model the function
            left uncompiled (``loss`` None: sparse categorical cross-entropy for the classifier, MSE for the
            regressor; ``precision="bf16"``: mixed precision).
        random_state: an int seeds numpy's generator for each fit (ggmlpy's initialisers and shuffles draw from
            it), so two fits give the same model on the CPU, and gives it back as it was (the caller's random
            stream is not disturbed); None (the default) does not.
        model__<name>, optimizer__<name>, fit__<name>: SciKeras' routing: arguments of the model function (which
            may also take ``meta``, SciKeras' dict: ``n_features_in_``, ``X_shape_``, ``X_dtype_``,
            ``n_outputs_``, and a classifier's ``n_classes_``, ``classes_``, ``target_type_``), of
            ``ggml_compile`` (``optimizer__learning_rate``, ``optimizer__momentum``) and of ``ggml_fit``
            (``fit__shuffle``).

    Attributes after ``fit``: ``model_`` (the compiled model), ``history_`` (the fit's history),
    ``classes_``, ``n_features_in_``.

    Example:
        >>> def build(units=16, n_classes=2, input_shape=(4,)):
        ...     m = g.ggml_model_sequential()
        ...     m = g.ggml_layer_dense(m, units, activation="relu", input_shape=input_shape)
        ...     return g.ggml_layer_dense(m, n_classes, activation="softmax")
        >>> clf = g.GgmlClassifier(build, epochs=20, model__units=32).fit(X, y)
        >>> clf.predict(X[:3]), clf.score(X, y)
        >>> GridSearchCV(g.GgmlClassifier(build), {"model__units": [8, 32]}, cv=3).fit(X, y)
    """

    _loss = "sparse_categorical_crossentropy"
    _outputs_name = "n_classes"

    def _meta(self, X: np.ndarray, n_outputs: int) -> dict[str, object]:
        return {**super()._meta(X, 1), "n_classes_": n_outputs, "classes_": self.classes_,
                "target_type_": "binary" if n_outputs == 2 else "multiclass"}

    def fit(self, X: Any, y: Any, sample_weight: npt.ArrayLike | None = None) -> GgmlClassifier:
        """Train a fresh model on ``X`` (samples first) and the labels ``y``, each sample's loss weighted by
        ``sample_weight`` (an array of N non-negative numbers, or None); returns the estimator. A DataFrame's
        column names are kept (``feature_names_in_``) and checked at predict, as scikit-learn's estimators do."""
        X, y = validate_data(self, X, y, reset=True, allow_nd=True, dtype=np.float32)
        check_classification_targets(y)  # continuous values are refused ("Unknown label type")
        self._encoder = LabelEncoder().fit(y)
        self.classes_ = self._encoder.classes_
        if len(self.classes_) < 2:
            raise GgmlValueError(f"GgmlClassifier.fit: y has one class ({self.classes_[0]!r}); a classifier needs "
                                 "at least two")
        return self._fit(X, self._encoder.transform(y).astype(np.int64), len(self.classes_), sample_weight)

    def _labels_for(self, model: Model, y: np.ndarray, n_outputs: int) -> np.ndarray:
        # a function that compiled its model with categorical cross-entropy (ggml_compile's default loss) gets
        # one-hot rows, as SciKeras gives; class ids otherwise (sparse cross-entropy, binary cross-entropy)
        head = model.compiled.heads[0]
        if len(model.compiled.heads) == 1 and head.loss == "categorical_crossentropy" and not head.sparse:
            return np.eye(n_outputs, dtype=np.float32)[y]
        return y

    def predict_proba(self, X: Any) -> np.ndarray:
        """The probability of each class, ``(N, n_classes)`` in the order of ``classes_``."""
        check_is_fitted(self, "classes_")
        p = self._predict_raw(X)
        if p.shape[1] == 1 and len(self.classes_) == 2:  # one sigmoid unit: P(class 1)
            p = np.concatenate([1 - p, p], axis=1)
        if p.shape[1] != len(self.classes_):
            raise GgmlValueError(f"GgmlClassifier: the model has {p.shape[1]} outputs for {len(self.classes_)} "
                                 "classes; end it in a softmax over n_classes units")
        return p

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class of each sample, as the labels ``fit`` was given."""
        p = self.predict_proba(X)  # first: it raises NotFittedError before classes_ exists
        return self.classes_[np.argmax(p, axis=1)]


def _checked_weights(sample_weight: npt.ArrayLike, n: int, who: str) -> np.ndarray:
    """``sample_weight`` as scikit-learn's estimators take it: N finite numbers >= 0, not all 0."""
    w = np.asarray(sample_weight, dtype=np.float64)
    if w.shape != (n,):
        raise GgmlValueError(f"{who}.fit: sample_weight must hold one weight per sample, shape ({n},); got shape "
                             f"{w.shape}")
    if not np.isfinite(w).all() or (w < 0).any():
        raise GgmlValueError(f"{who}.fit: sample_weight must be finite numbers >= 0")
    if not w.any():
        raise GgmlValueError(f"{who}.fit: every sample weight is zero: there is nothing to fit")
    return w.astype(np.float32)


class GgmlRegressor(RegressorMixin, _GgmlEstimator):
    """A scikit-learn regressor around a function that builds a ggmlpy model.

    As ``GgmlClassifier``, with mean squared error for a model the function left uncompiled; the function gets
    ``n_outputs`` (1 for a 1-D ``y``) and ``input_shape``. ``predict`` returns ``(N,)`` for a 1-D ``y``, else
    ``(N, n_outputs)``, in float64 as scikit-learn's regressors (the model computes in float32); ``score`` is
    R^2.

    Arguments:
        model: the function that builds the model; the other arguments as for ``GgmlClassifier``.

    Example:
        >>> def build(n_outputs=1, input_shape=(3,)):
        ...     m = g.ggml_model_sequential()
        ...     m = g.ggml_layer_dense(m, 16, activation="tanh", input_shape=input_shape)
        ...     return g.ggml_layer_dense(m, n_outputs)
        >>> reg = g.GgmlRegressor(build, epochs=50, learning_rate=0.01).fit(X, y)
        >>> reg.score(X, y)
    """

    _loss = "mse"
    _outputs_name = "n_outputs"

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # y of shape (N, k): a model with k outputs
        return tags

    def fit(self, X: Any, y: Any, sample_weight: npt.ArrayLike | None = None) -> GgmlRegressor:
        """Train a fresh model on ``X`` (samples first) and the targets ``y``, each sample's loss weighted by
        ``sample_weight`` (an array of N non-negative numbers, or None); returns the estimator. A DataFrame's
        column names are kept (``feature_names_in_``) and checked at predict, as scikit-learn's estimators do."""
        X, y = validate_data(self, X, y, reset=True, allow_nd=True, dtype=np.float32, multi_output=True,
                             y_numeric=True)
        y = np.asarray(y, dtype=np.float32)
        self._y_1d = y.ndim == 1
        y2 = y.reshape(len(y), -1)
        return self._fit(X, y2, y2.shape[1], sample_weight)

    def predict(self, X: Any) -> np.ndarray:
        """The model's output for each sample."""
        out = self._predict_raw(X).astype(np.float64)  # scikit-learn's regressors predict float64
        return out[:, 0] if self._y_1d else out
