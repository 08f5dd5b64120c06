"""A layer written by the user with ggmlpy ops: the Python counterpart of subclassing ``keras.layers.Layer``.

The user gives the forward pass as a function of ggml tensors, the layer's weights by name and shape, and
(when it changes) the output shape; ggml's autodiff gives the gradients, and the weights are created,
initialised, trained, saved by ``ggml_save_weights`` and read by ``ggml_get_weights`` as any layer's.
"""
from __future__ import annotations

import inspect
import math
import re
from typing import Any, Callable, TYPE_CHECKING

from ...core.args import is_int
from ...errors import GgmlTypeError, GgmlValueError
from ...graph.objects import Tensor
from .layer import Layer, LayerOptions, natural_ne, sample_shape
from .weight import ParamSpec


if TYPE_CHECKING:
    from typing_extensions import Unpack


INITIALIZERS = ("glorot", "zeros", "ones")
_WEIGHT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,20}$")


class CustomLayer(Layer):
    """A layer whose forward pass is ``forward(ctx, x, weights)``: see ``ggml_custom_layer``, the shortcut to
    a ``Layer`` subclass of one's own (which saves, loads and pickles; this one's function is code)."""
    kind = "custom"
    builder_functions = False  # ggml_custom_layer (builders.py) makes it from a function
    savable = False  # its forward is code: ggml_save_model and pickling refuse it
    takes_int = "either"   # its forward may read int32 token ids (Keras' TokenAndPositionEmbedding) or floats

    def __init__(self, forward: Callable[..., Any], weights: dict | None = None, output_shape: Any = None,
                 fn: str = "ggml_custom_layer", **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        if not callable(forward):
            raise GgmlTypeError(f"{fn}: forward must be a function forward(ctx, x, weights) -> tensor, got "
                                f"{type(forward).__name__}")
        try:
            inspect.signature(forward).bind(None, None, {})
        except TypeError:
            raise GgmlTypeError(f"{fn}: forward is called as forward(ctx, x, weights), but its signature is "
                                f"{inspect.signature(forward)}") from None
        except ValueError:  # a builtin: its call will tell
            pass
        self.forward_fn = forward
        self.weight_shapes = _weight_shapes(weights or {}, fn)
        if output_shape is not None and not callable(output_shape):
            if isinstance(output_shape, (tuple, list)) and None in output_shape:
                raise GgmlValueError(f"{fn}: output_shape {tuple(output_shape)!r} leaves a size open (None): the "
                                     "output's sizes follow from the input's, so give output_shape as a function of "
                                     "the input sample's shape, called with the data's sizes (for (None, 4) steps to "
                                     "8 features: output_shape=lambda s: (s[0], 8))")
            output_shape = sample_shape(output_shape, f"{fn}: output_shape")
        self.output_shape_of = output_shape

    def config(self) -> dict:  # for repr and summaries; saving refuses the layer (savable)
        return {"forward": getattr(self.forward_fn, "__qualname__", repr(self.forward_fn)),
                "weights": {k: list(ne) for k, (ne, _) in self.weight_shapes.items()}}

    def output_shape(self, shapes):
        given = self.output_shape_of
        if given is None:
            return shapes[0]
        shape = given(shapes[0]) if callable(given) else given
        return sample_shape(shape, f"custom layer '{self.name}': output_shape")

    def make_params(self, shapes):
        specs = []
        for name, (ne, init) in self.weight_shapes.items():
            fans = (ne[0], math.prod(ne[1:])) if len(ne) > 1 else (ne[0], ne[0])
            specs.append(ParamSpec(name, ne, init, fans))
        return specs

    def forward(self, g, xs, shapes):
        weights = {name: g.param(self, name) for name in self.weight_shapes}
        y = self.forward_fn(g.ctx, xs[0], weights)
        if not isinstance(y, Tensor):
            raise GgmlTypeError(f"custom layer '{self.name}': forward returned {type(y).__name__}, not a tensor (the "
                                "result of a ggmlpy op on x and the weights)")
        want = natural_ne(self.output_shape(shapes), g.batch)
        got = tuple(y.shape[:len(want)])
        if got != want or any(n != 1 for n in y.shape[len(want):]):
            raise GgmlValueError(f"custom layer '{self.name}': forward returned a tensor of ggml shape {y.shape}; "
                                 f"for samples of shape {self.output_shape(shapes)} it must be {want} (ggml's order: "
                                 "the sample's axes reversed, then the batch); give output_shape= if the layer "
                                 "changes the shape")
        return y


def _weight_shapes(weights: Any, fn: str) -> dict[str, tuple[tuple[int, ...], str]]:
    if not isinstance(weights, dict):
        raise GgmlTypeError(f"{fn}: weights must be a dict {{name: ne}} (or {{name: (ne, initializer)}}), got "
                            f"{type(weights).__name__}")
    specs = {}
    for name, value in weights.items():
        if not isinstance(name, str) or not _WEIGHT_NAME.match(name):
            raise GgmlValueError(f"{fn}: weight name {name!r} must be an identifier of at most 21 characters (it "
                                 "becomes '<layer>.<name>' in saved files)")
        ne, init = value, None
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], str):
            ne, init = value
        if is_int(ne):
            ne = (ne,)
        if not isinstance(ne, (tuple, list)) or not 1 <= len(ne) <= 4 or not all(is_int(d) and d >= 1 for d in ne):
            raise GgmlValueError(f"{fn}: weight '{name}' needs a shape of 1 to 4 ints >= 1 in ggml's order (ne0 "
                                 f"first), got {value!r}")
        ne = tuple(int(d) for d in ne)
        init = init or ("glorot" if len(ne) > 1 else "zeros")
        if init not in INITIALIZERS:
            raise GgmlValueError(f"{fn}: weight '{name}': unknown initializer {init!r}; expected one of "
                                 f"{', '.join(INITIALIZERS)}")
        specs[name] = (ne, init)
    return specs

