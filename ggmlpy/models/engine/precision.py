"""Mixed precision (``ggml_compile(precision=...)``): the precisions by name, and the half-precision casts of the
weights that one graph multiplies (``WeightCasts``, behind ``GraphBuilder.product_weight``)."""
from __future__ import annotations

from collections.abc import Callable, Hashable

from ...backend.device import Device
from ...core.types import GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32, type_name
from ...errors import GgmlValueError
from ...graph.objects import Context, Tensor
from ...ops.layout import ggml_cast
from ..layers.fused import device_computes_half_products


# the type of the matrix products, by ggml_compile's name
PRECISIONS = {"f32": GGML_TYPE_F32, "bf16": GGML_TYPE_BF16, "f16": GGML_TYPE_F16}
_ALIASES = {"float32": "f32", "mixed_bfloat16": "bf16", "bfloat16": "bf16", "mixed_float16": "f16", "float16": "f16"}


def precision_name(value: object, fn: str) -> str:
    """``precision`` as one of ``PRECISIONS``' names (any case; Keras' policy names too; None: "f32")."""
    if value is None:
        return "f32"
    name = _ALIASES.get(value.lower(), value.lower()) if isinstance(value, str) else None
    if name not in PRECISIONS:
        raise GgmlValueError(f"{fn}: precision must be 'f32', 'bf16' or 'f16' (or Keras' 'float32', "
                             f"'mixed_bfloat16', 'mixed_float16'), got {value!r}")
    return name


class WeightCasts:
    """The casts of one graph's weights to the compiled product type ``compute_type``, one per weight and shape,
    where ``device`` computes that type's products (else the F32 weights, and ``note`` says why)."""

    def __init__(self, ctx: Context, device: Device, compute_type: int, note: Callable[[str], None]) -> None:
        self.ctx, self.device, self.compute_type, self.note = ctx, device, compute_type, note
        self._made: dict[Hashable, Tensor] = {}

    @property
    def active(self) -> bool:
        """Whether the graph's products compute in a half type."""
        return self.compute_type != GGML_TYPE_F32 and device_computes_half_products(self.device, self.compute_type)

    def of(self, weight: Tensor, key: Hashable) -> Tensor:
        """``weight`` (F32) as its product takes it: itself, or its cast (made once per ``key``)."""
        if self.compute_type == GGML_TYPE_F32:
            return weight
        if not self.active:
            self.note(f"{self.device.name} does not compute {type_name(self.compute_type).upper()} products: they "
                      "run in F32")
            return weight
        if key not in self._made:
            self._made[key] = ggml_cast(self.ctx, weight, self.compute_type)
        return self._made[key]
