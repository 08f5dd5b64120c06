"""Recurrent layers: LSTM and GRU with Keras' semantics, unrolled over the time steps.

A sample is ``(steps, features)``: the ggml tensor ``[F, T, N]``. The layer first lays the input
out time-major (``[F, N, T]``) and projects every step at once with one matrix product, so each
step reads a contiguous block of that projection; the recurrence then adds ``h U`` per step. ggml
differentiates the unrolled graph (views, matrix products, sigmoid/tanh), so training needs no
backward pass of its own. On a device that computes them (the CPU; Vulkan: patches/0049) the whole recurrence is
one op each way (``ggml_lstm_seq``, ``ggml_gru_seq``: patches/0035, 0037) or, on the CPU with a padding mask or
recurrent dropout, each step's gates are one op (``ggml_lstm_cell``, ``ggml_gru_cell``: 0031) instead of a dozen
element-wise ones; elsewhere (CUDA; Vulkan with a mask or recurrent dropout) they stay element-wise, ops the device
runs itself. Graph size grows linearly with the
number of steps; ggmlpy sizes the graphs from the model (patches/0005), so a 100-step LSTM trains.

Weights in the user's (Keras') orientation (``ggml_get_weights``):

* lstm: ``kernel`` (features, 4 units), ``recurrent_kernel`` (units, 4 units), ``bias`` (4 units,);
  gates in Keras' order input, forget, cell, output; the forget gate's bias starts at 1;
* gru (Keras' ``reset_after=True``, its default): ``kernel`` (features, 3 units),
  ``recurrent_kernel`` (units, 3 units), ``bias`` (2, 3 units) = (input bias, recurrent bias); gates
  in Keras' order update, reset, candidate.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TYPE_CHECKING

import numpy as np

from ...core.args import bool_arg, is_real, positive_int_arg
from ...errors import GgmlValueError
from ...graph.introspect import ggml_is_contiguous
from ...graph.objects import Tensor
from ...ops.elementwise import ggml_add, ggml_cont, ggml_mul, ggml_sigmoid, ggml_sub, ggml_tanh
from ...ops.layout import ggml_permute, ggml_reshape_2d, ggml_reshape_3d, ggml_view_1d, ggml_view_2d, ggml_view_3d
from ...ops.linalg import ggml_mul_mat
from ...ops.recurrent import ggml_gru_cell, ggml_gru_seq, ggml_lstm_cell, ggml_lstm_seq
from ...ops.reduce import ggml_concat, ggml_repeat
from . import fused
from .initializers import check_initializer
from .layer import Builder, Layer, LayerOptions
from .masking import carry_over, step_of, time_major_mask
from .weight import ParamSpec, Weight


if TYPE_CHECKING:
    from typing_extensions import Unpack


F32 = 4  # bytes per value: the model layer computes in float32
def _dense(ctx: Any, t: Tensor) -> Tensor:
    return t if ggml_is_contiguous(t) else ggml_cont(ctx, t)


def _rows(g: Builder, t: Tensor, first: int, count: int) -> Tensor:
    """Rows ``first .. first + count`` of the ne[0] axis of a 2-D ``[R, N]`` tensor (a strided view)."""
    return ggml_view_2d(g.ctx, t, count, t.shape[1], t.shape[0] * F32, first * F32)


def _stack_steps(g: Builder, hs: list[Tensor]) -> Tensor:
    """``[H, N]`` per step -> ``[H, T, N]``, joined as a balanced tree of concats (T log T copies)."""
    parts = [ggml_reshape_3d(g.ctx, h, h.shape[0], h.shape[1], 1) for h in hs]
    while len(parts) > 1:
        parts = [ggml_concat(g.ctx, parts[i], parts[i + 1], 2) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return _time_major_to_samples(g, parts[0])


def _time_major_to_samples(g: Builder, seq: Tensor) -> Tensor:
    """``[H, N, T]`` -> ``[H, T, N]`` (the model layer's sample-major sequences)."""
    return ggml_cont(g.ctx, ggml_permute(g.ctx, seq, 0, 2, 1, 3))


class Recurrent(Layer, abstract=True):
    """What LSTM and GRU share: the unrolled recurrence, its options and weights; a subclass gives the step."""
    ARG_DOCS = {"dropout": "the fraction of the inputs dropped in training, in [0, 1) (one mask for the whole "
                           "sequence, as Keras; one per gate with recurrent_dropout)."}
    gates = 1
    n_states = 1               # the state a step carries: (h,) for a GRU, (h, c) for an LSTM
    many_inputs = "either"     # a sequence, or [sequence, *initial states] (Keras' initial_state)
    mask_support = "consume"  # padding steps keep the state (masking.py)
    kernel = Weight(initializer_arg="kernel_initializer", regularizer="kernel_regularizer", user_axes=(1, 0),
                    quantizable="product")
    recurrent_kernel = Weight(initializer_arg="recurrent_initializer", regularizer="recurrent_regularizer",
                              user_axes=(1, 0))
    bias = Weight(initializer_arg="bias_initializer", regularizer="bias_regularizer")

    def __init__(self, units: int, return_sequences: bool = False, go_backwards: bool = False, dropout: float = 0.0,
                 recurrent_dropout: float = 0.0, return_state: bool = False,
                 kernel_initializer: str = "glorot_uniform", recurrent_initializer: str = "orthogonal",
                 bias_initializer: str = "zeros", **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.units = positive_int_arg(None, "units", units)
        self.kernel_initializer = check_initializer(kernel_initializer, "kernel_initializer")
        self.recurrent_initializer = check_initializer(recurrent_initializer, "recurrent_initializer")
        self.bias_initializer = check_initializer(bias_initializer, "bias_initializer")
        for name, value in (("return_sequences", return_sequences), ("go_backwards", go_backwards),
                            ("return_state", return_state)):
            if not isinstance(value, bool):
                raise GgmlValueError(f"{name} must be True or False, got {value!r}")
        self.return_sequences, self.go_backwards, self.return_state = return_sequences, go_backwards, return_state
        for name, rate in (("dropout", dropout), ("recurrent_dropout", recurrent_dropout)):
            if not is_real(rate) or not 0 <= rate < 1:
                raise GgmlValueError(f"{self.kind} {name} must be a rate in [0, 1), got {rate!r}")
        self.dropout, self.recurrent_dropout = float(dropout), float(recurrent_dropout)

    def dropout_seeds(self) -> int:
        """Masks drawn per training step, as Keras draws them: one for the inputs, or one per gate for the inputs
        and one per gate for the recurrent state when there is recurrent dropout (Keras' implementation 1)."""
        per_gate = self.gates if self.recurrent_dropout else 1
        return (per_gate if self.dropout else 0) + (self.gates if self.recurrent_dropout else 0)

    def _masks(self, g: Builder, rate: float, rows: int, count: int) -> list:
        """``count`` inverted-dropout masks ``[rows, N]`` for a training step (none in inference): the same at
        every step of the sequence, as Keras' recurrent dropout."""
        if not rate or not g.training:
            return []
        ones = g.constant(np.ones((g.batch, rows), np.float32))
        masks = [g.dropout(ones, rate) for _ in range(count)]
        if count == 1:
            return masks
        # with a mask per gate, each gate's rows of a product are picked by a 0/1 column (made once per call)
        picks = []
        for k in range(count):
            pick = np.zeros((1, self.gates * self.units), np.float32)
            pick[0, k * self.units:(k + 1) * self.units] = 1.0
            picks.append(g.constant(pick))
        return list(zip(masks, picks))

    def _by_gate(self, g: Builder, times: Callable[[Tensor], Tensor], rows: int, x: Tensor, masks: list) -> Tensor:
        """``times(x)`` (a weight's product ``W^T x``), each gate's block with its own mask on ``x`` (one mask: all
        gates; several: pairs of a mask and its gate's 0/1 row picker, from ``_masks``)."""
        ctx = g.ctx

        def flat(t: Tensor) -> Tensor:  # [rows, ...] as a matrix: the weight's gradient needs no broadcast
            return t if t.shape[2] == 1 else ggml_reshape_2d(ctx, t, rows, t.nelements() // rows)
        if not masks:
            return times(flat(x))
        if len(masks) == 1:
            return times(flat(ggml_mul(ctx, x, masks[0])))
        # gate k's rows of the whole product with its own mask, picked by a 0/1 column: no view of the weight
        # (a view at k * units rows can start off the 16-byte alignment GPU matrix products need)
        out: Tensor | None = None
        for m, pick in masks:
            part = ggml_mul(ctx, times(flat(ggml_mul(ctx, x, m))), pick)
            out = part if out is None else ggml_add(ctx, out, part)
        assert out is not None  # two or more masks here
        return out

    def recurrent(self, g: Builder, h: Tensor, masks: list) -> Tensor:
        """The recurrent product ``U^T h`` of a step, through the recurrent dropout masks."""
        u = g.param(self, self.recurrent_kernel)
        return self._by_gate(g, lambda t: ggml_mul_mat(g.ctx, u, t), self.units, h, masks)

    def output_shape(self, shapes):
        if len(shapes[0]) != 2:
            raise GgmlValueError(f"{self.kind} '{self.name}' takes sequences of shape (steps, features), got "
                                 f"samples of shape {shapes[0]} (use return_sequences=True on a recurrent layer "
                                 "before it, or reshape the data)")
        states = ("h", "c")[:self.n_states]
        if len(shapes) > 1 and (len(shapes) != 1 + self.n_states or
                                any(tuple(s) != (self.units,) for s in shapes[1:])):
            raise GgmlValueError(f"{self.kind} '{self.name}' takes a sequence, or [sequence, "
                                 f"{', '.join('initial ' + s for s in states)}] with each state of shape "
                                 f"({self.units},) (Keras' initial_state), got inputs of shapes {list(shapes)}")
        steps = shapes[0][0] if self.return_sequences else 1
        if self.return_state:  # the output and the final states, packed along the steps (state_outputs splits)
            return (steps + self.n_states, self.units)
        return (steps, self.units) if self.return_sequences else (self.units,)

    def make_params(self, shapes):
        features, width = shapes[0][1], self.gates * self.units
        return [self.kernel.spec((features, width), (features, width)),
                self.recurrent_kernel.spec((self.units, width), (self.units, width)), self.bias_spec()]

    def graph_tensors(self, shapes):
        return 64 + 24 * shapes[0][0]

    def forward(self, g, xs, shapes):
        out, state = self.run(g, xs, shapes, self.go_backwards, False, g.input_mask)
        if not self.return_state:
            return out
        ctx, u, n = g.ctx, self.units, g.batch
        packed = out if self.return_sequences else ggml_reshape_3d(ctx, out, u, 1, n)
        for s in state:
            packed = ggml_concat(ctx, packed, ggml_reshape_3d(ctx, s, u, 1, n), 1)
        return packed

    @property
    def passes_mask(self) -> bool:
        # Keras' rule (also with go_backwards): the sequence output keeps the mask; with return_state the packed
        # output carries it to its sequence part (RecurrentPart), the states none
        return self.return_sequences

    def run(self, g: Builder, xs: list, shapes: list, backwards: bool, in_time_order: bool,
            mask: Tensor | None = None) -> tuple:
        """(the output, the final state): the recurrence over the steps of ``xs[0]`` from the initial state
        ``xs[1:]`` (zeros when not given), last to first when ``backwards`` (Keras' go_backwards); a sequence
        output lists the steps as processed, or in the input's order with ``in_time_order`` (Bidirectional).
        ``mask`` (``[1, T, N]``): over a padding step the state is carried over, as Keras does."""
        steps, features = shapes[0]
        ctx, n, width = g.ctx, g.batch, self.gates * self.units
        time_major = ggml_cont(ctx, ggml_permute(ctx, xs[0], 0, 2, 1, 3))     # [F, T, N] -> [F, N, T]
        masks = self._masks(g, self.dropout, features, self.gates if self.recurrent_dropout else 1)
        masks = [(ggml_reshape_3d(ctx, m[0], features, n, 1), m[1]) if isinstance(m, tuple) else
                 ggml_reshape_3d(ctx, m, features, n, 1) for m in masks]      # the same mask at every step
        proj = self._by_gate(g, lambda t: g.product(self, self.kernel, t), features, time_major, masks)
        proj = ggml_add(ctx, proj, self.input_bias(g))                             # [G, N * T]
        rec_masks = self._masks(g, self.recurrent_dropout, self.units, self.gates)
        state, outputs = (tuple(xs[1:]) if len(xs) > 1 else None), []
        unfit = [why for why, bad in (("padding mask", mask is not None), ("recurrent dropout", bool(rec_masks)),
                                      ("go_backwards sequence output in processing order",
                                       backwards and self.return_sequences and not in_time_order)) if bad]
        if not unfit:
            whole = self.whole_sequence(g, proj, state, steps, backwards)
            if whole is not None:   # the recurrence as one op: the sequence in time order and the final state
                seq, state = whole
                return (_time_major_to_samples(g, seq) if self.return_sequences else state[0]), state
        if self.SEQUENCE_OP and (steps > 1 or state is not None) and \
                fused.device_computes(g.params.backend.device, self.SEQUENCE_OP):
            why = (f"the op takes no {' or '.join(unfit)}" if unfit else
                   f"this device's kernel does not take {self.units} units over {steps} steps")
            g.note(f"{self.kind} '{self.name}': its {steps} steps are built one by one, not as one "
                   f"{self.SEQUENCE_OP.upper()} op (which this device computes): {why}")
        mask_tn = time_major_mask(g, mask) if mask is not None else None
        for t in (reversed(range(steps)) if backwards else range(steps)):
            x_t = ggml_view_2d(ctx, proj, width, n, width * F32, t * width * n * F32)   # contiguous [G, N]
            new = self.step(g, x_t, state, rec_masks)
            if mask_tn is not None:
                m = step_of(g, mask_tn, t)
                new = tuple(carry_over(g, a, None if state is None else b, m)
                            for a, b in zip(new, state or (None,) * len(new)))
            state = new
            outputs.append(state[0])
        if backwards and in_time_order:
            outputs.reverse()
        assert state is not None  # a sequence has at least one step
        return (_stack_steps(g, outputs) if self.return_sequences else state[0]), state

    # ---- what LSTM and GRU define
    def bias_spec(self) -> ParamSpec:
        raise NotImplementedError

    def input_bias(self, g: Builder) -> Tensor:
        raise NotImplementedError

    SEQUENCE_OP: str | None = None   # the fused op of the whole recurrence (layers/fused.py), where there is one

    def _sequence_op_fits(self, g: Builder, steps: int) -> bool:
        """Whether the device computes this layer's whole-sequence op at this size."""
        return self.SEQUENCE_OP is not None and fused.device_computes_sequence(
            g.params.backend.device, self.SEQUENCE_OP, self.units, g.batch, steps)

    def whole_sequence(self, g: Builder, proj: Tensor, state: tuple | None, steps: int,
                       backwards: bool) -> tuple | None:
        """The whole recurrence in one op, where the layer and the device have one: ``(h [U, N, T] in time order,
        the final state)`` from the projections ``proj`` ``[G, N * T]``; None to unroll it step by step."""
        return None

    def step(self, g: Builder, x_t: Tensor, state: tuple | None, rec_masks: Any = ()) -> tuple:
        """One time step from the projected input ``x_t`` ``[G, N]``: the new state, hidden output first; the
        recurrent product goes through ``recurrent`` (and its dropout masks)."""
        raise NotImplementedError


class LSTM(Recurrent):
    """Long short-term memory over sequences (steps, features), as Keras' LSTM (tanh, sigmoid gates,
    forget-gate bias 1, zero initial state): the last step's hidden state (units,), or every step's (steps,
    units) with ``return_sequences=True``. Unrolled over the steps; ggml differentiates it.

    Example:
        >>> model = g.ggml_layer_lstm(model, 32, input_shape=(100, 3))
    """
    kind = "lstm"
    SEQUENCE_OP = "lstm_seq"
    gates = 4
    n_states = 2

    ARG_DOCS = {**Recurrent.ARG_DOCS,
                "unit_forget_bias": "True (Keras' default): the forget gate's bias starts at 1, the others' from "
                                    "bias_initializer."}

    def __init__(self, units: int, return_sequences: bool = False, go_backwards: bool = False, dropout: float = 0.0,
                 recurrent_dropout: float = 0.0, return_state: bool = False,
                 kernel_initializer: str = "glorot_uniform", recurrent_initializer: str = "orthogonal",
                 bias_initializer: str = "zeros", unit_forget_bias: bool = True, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(units, return_sequences, go_backwards, dropout, recurrent_dropout, return_state,
                         kernel_initializer, recurrent_initializer, bias_initializer, **kw)
        self.unit_forget_bias = bool_arg(None, "unit_forget_bias", unit_forget_bias)

    def bias_spec(self):
        if self.unit_forget_bias:
            return self.bias.spec((4 * self.units,), init=f"unit_forget_bias:{self.bias_initializer}")
        return self.bias.spec((4 * self.units,))

    def input_bias(self, g):
        return g.param(self, self.bias)

    def whole_sequence(self, g, proj, state, steps, backwards):
        # one step from a zero state never reads the recurrent kernel: the unrolled step leaves it out of the
        # graph (no gradient, no optimizer state), where the op would hold it without a gradient
        if (steps == 1 and state is None) or not self._sequence_op_fits(g, steps):
            return None
        ctx, u, n = g.ctx, self.units, g.batch
        x = ggml_reshape_3d(ctx, _dense(ctx, proj), 4 * u, n, steps)
        h0, c0 = (None, None) if state is None else (_dense(ctx, state[0]), _dense(ctx, state[1]))
        seq = ggml_lstm_seq(ctx, x, g.param(self, self.recurrent_kernel), h0, c0, reverse=backwards)
        plane, last = u * n * F32, (0 if backwards else steps - 1)   # the last step processed
        h = ggml_view_3d(ctx, seq, u, n, steps, u * F32, plane, 0)
        return h, (ggml_view_2d(ctx, seq, u, n, u * F32, last * plane),
                   ggml_view_2d(ctx, seq, u, n, u * F32, (steps + last) * plane))

    def step(self, g, x_t, state, rec_masks=()):
        ctx, u = g.ctx, self.units
        if fused.device_computes(g.params.backend.device, "lstm_cell"):
            rec = None if state is None else _dense(ctx, self.recurrent(g, state[0], rec_masks))
            cell = ggml_lstm_cell(ctx, _dense(ctx, x_t), rec, None if state is None else _dense(ctx, state[1]))
            n = x_t.shape[1]
            return (ggml_view_2d(ctx, cell, u, n, u * F32, 0), ggml_view_2d(ctx, cell, u, n, u * F32, u * n * F32))
        z = x_t if state is None else ggml_add(ctx, x_t, self.recurrent(g, state[0], rec_masks))
        sig, tanh = ggml_sigmoid(ctx, z), ggml_tanh(ctx, z)   # whole [4U, N]: two ops, not four
        i, f, o = _rows(g, sig, 0, u), _rows(g, sig, u, u), _rows(g, sig, 3 * u, u)
        c = ggml_mul(ctx, i, _rows(g, tanh, 2 * u, u))
        if state is not None:
            c = ggml_add(ctx, ggml_mul(ctx, f, state[1]), c)
        return ggml_mul(ctx, o, ggml_tanh(ctx, c)), c


class GRU(Recurrent):
    """Gated recurrent unit over sequences (steps, features), as Keras' GRU (reset_after=True, zero initial
    state): the last step's hidden state (units,), or every step's (steps, units) with
    ``return_sequences=True``.

    Example:
        >>> model = g.ggml_layer_gru(model, 32, return_sequences=True, input_shape=(50, 8))
    """
    kind = "gru"
    SEQUENCE_OP = "gru_seq"
    gates = 3

    def bias_spec(self):
        return self.bias.spec((3 * self.units, 2))   # numpy (2, 3U): Keras' orientation

    def input_bias(self, g):
        return ggml_view_1d(g.ctx, g.param(self, self.bias), 3 * self.units, 0)

    def _recurrent_bias(self, g):
        u = self.units
        return ggml_view_2d(g.ctx, g.param(self, self.bias), 3 * u, 1, 3 * u * F32, 3 * u * F32)   # [3U, 1]

    def whole_sequence(self, g, proj, state, steps, backwards):
        # as the LSTM's: one step from a zero state never reads the recurrent kernel
        if (steps == 1 and state is None) or not self._sequence_op_fits(g, steps):
            return None
        ctx, u, n = g.ctx, self.units, g.batch
        x = ggml_reshape_3d(ctx, _dense(ctx, proj), 3 * u, n, steps)
        seq = ggml_gru_seq(ctx, x, g.param(self, self.recurrent_kernel), self._recurrent_bias(g),
                           None if state is None else _dense(ctx, state[0]), reverse=backwards)
        plane, last = u * n * F32, (0 if backwards else steps - 1)   # the last step processed
        last_state = ggml_view_2d(ctx, seq, u, n, u * F32, last * plane)
        return ggml_view_3d(ctx, seq, u, n, steps, u * F32, plane, 0), (last_state,)

    def step(self, g, x_t, state, rec_masks=()):
        ctx, u = g.ctx, self.units
        rec_bias = self._recurrent_bias(g)
        if state is None:   # h = 0: the recurrent term is its bias alone (broadcast over the batch)
            h_proj = rec_bias
        else:
            h_proj = ggml_add(ctx, self.recurrent(g, state[0], rec_masks), rec_bias)
        if fused.device_computes(g.params.backend.device, "gru_cell"):
            if state is None:
                h_proj = ggml_repeat(ctx, h_proj, x_t)
            return (ggml_gru_cell(ctx, _dense(ctx, x_t), _dense(ctx, h_proj),
                                  None if state is None else _dense(ctx, state[0])),)
        zr = ggml_sigmoid(ctx, ggml_add(ctx, _rows(g, x_t, 0, 2 * u), _rows(g, h_proj, 0, 2 * u)))
        z, r = _rows(g, zr, 0, u), _rows(g, zr, u, u)
        cand = ggml_tanh(ctx, ggml_add(ctx, _rows(g, x_t, 2 * u, u),
                                               ggml_mul(ctx, r, _rows(g, h_proj, 2 * u, u))))
        if state is None:
            return (ggml_sub(ctx, cand, ggml_mul(ctx, z, cand)),)        # (1 - z) * cand
        return (ggml_add(ctx, cand, ggml_mul(ctx, z, ggml_sub(ctx, state[0], cand))),)


class RecurrentPart(Layer):
    """One part of a recurrent layer's output with ``return_state``: the output (the sequence, or the last
    step), or one final state. The recurrent layer packs them along the steps; ``state_outputs`` makes the
    nodes of the parts (Keras' ``[output, state_h, state_c]``)."""
    kind = "recurrent_part"
    builder_functions = False  # made by the recurrent layer's return_state, not by users
    mask_support = "consume"  # the sequence part passes the mask on (passes_mask), a state takes none

    def __init__(self, first: int, count: int, sequence: bool, **kw: Unpack[LayerOptions]) -> None:
        super().__init__(**kw)
        self.first, self.count, self.sequence = int(first), positive_int_arg(None, "count", count), bool(sequence)

    def output_shape(self, shapes):
        return (self.count, shapes[0][1]) if self.sequence else (shapes[0][1],)

    @property
    def passes_mask(self) -> bool:
        return self.sequence

    def forward(self, g, xs, shapes):
        ctx, (rows, u), n = g.ctx, shapes[0], g.batch
        part = ggml_cont(ctx, ggml_view_3d(ctx, xs[0], u, self.count, n, u * F32, u * rows * F32, self.first * u * F32))
        return part if self.sequence else ggml_reshape_2d(ctx, part, u, n)


def state_outputs(layer: Recurrent, packed: Any, apply: Any) -> list:
    """The nodes ``[output, state_h(, state_c)]`` of a recurrent layer applied with ``return_state`` (its node
    ``packed``), each a ``RecurrentPart`` applied by ``apply(part, node)``."""
    steps = packed.shape[0] - layer.n_states
    assert layer.name is not None  # named when it was applied
    stem = layer.name[:31]  # the parts' names stay within a layer name's 40 characters
    parts = [RecurrentPart(0, steps, layer.return_sequences, name=f"{stem}_output")]
    parts += [RecurrentPart(steps + k, 1, False, name=f"{stem}_state_{s}")
              for k, s in enumerate(("h", "c")[:layer.n_states])]
    return [apply(part, packed) for part in parts]
